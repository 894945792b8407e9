#!/usr/bin/python3
"""Dump the per-head queries, keys and values of a PyTorch model to attnprobe's HDF5 layout.

Forward hooks capture the outputs of the modules that produce Q, K and V: the q/k/v projections
(`nn.Linear` outputs [B, N, H*P], split into H heads) or, for models that rotate Q and K after the
projection (rotary position embeddings), the module that returns the rotated pair (then name the
tuple element: "module.name:0" for Q, ":1" for K). The dump then holds what the attention really
multiplies, so `attnprobe` measures the estimators on the model's own attention.

Layout written (docs/dumps.md): /layer_NN/{q,k,v} [B, H, N, P] (k, v with the model's kv heads),
optional /layer_NN/dy, attributes scale and causal, root attributes model, source and created_by;
in HDF5 (gzip with byte shuffle), safetensors or .npz (--format), float16/32/64 or bfloat16.

Recipe for your own model (Python):

    import dump_qkv                                            # this file (tools/ on sys.path)
    layers = [dump_qkv.LayerSpec(q=f"encoder.layer.{i}.attention.self.query",
                                 k=f"encoder.layer.{i}.attention.self.key",
                                 v=f"encoder.layer.{i}.attention.self.value") for i in range(12)]
    captured = dump_qkv.capture(model, lambda: model(**batch), layers, heads=12)
    dump_qkv.write(captured, "bert.h5", scale=1 / 8, causal=0, model="bert-base-uncased", source="my texts")

  - Hugging Face BERT / RoBERTa: as above (`model.config.num_attention_heads` heads; scale
    1/sqrt(head dim)); ViT: "vit.encoder.layer.{i}.attention.attention.query" / "key" / "value".
  - Rotary models (LLaMA-style, and this project's tools/train_charlm.py): hook the module that
    returns the rotated (q, k), e.g. q="blocks.{i}.attn.rotary:0", k="blocks.{i}.attn.rotary:1",
    v="blocks.{i}.attn.v"; its outputs are already [B, H, N, P].
  - Grouped-query attention: pass kv_heads=H_kv; K/V are written with their H_kv heads (attnprobe maps
    query head h to kv head h // (H / H_kv)), not repeated.
  - Real upstream gradients: name LayerSpec.out, the module whose output is the per-head attention
    output (here "blocks.{i}.attn.context"), and let run() return the loss; dy is its gradient.
  - Containers: write(..., fmt="hdf5" | "safetensors" | "npz"); dtype "bfloat16" in safetensors only
    (tools/dump_containers.py writes all three, without the `safetensors` package).

Command line (for this project's character model):

    /usr/bin/python3 tools/train_charlm.py ... --held-out-text held_out.txt   # writes the held-out split
    /usr/bin/python3 tools/dump_qkv.py --checkpoint data/models/charlm-hd32.pt --text held_out.txt \\
        --length 4096 --sequences 2 -o data/charlm-hd32.h5
    # a decode dump: the last 16 queries of each sequence against its whole cache of 4096 keys:
    /usr/bin/python3 tools/dump_qkv.py --checkpoint data/models/charlm-causal.pt ... --last 16 -o decode.h5
    # the same as safetensors in bfloat16, with real upstream gradients:
    /usr/bin/python3 tools/dump_qkv.py ... --format safetensors --dtype bfloat16 --with-dy -o charlm.safetensors
"""
import argparse
import dataclasses
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dump_containers  # noqa: E402  (tools/dump_containers.py: the three containers)


@dataclasses.dataclass
class LayerSpec:
    q: str  # module name, optionally ":index" to pick an element of a tuple output
    k: str
    v: str
    out: str = ""  # module whose output is the per-head attention output (for dy); "" = no dy


def _resolve(model, spec):
    name, _, index = spec.partition(":")
    module = dict(model.named_modules()).get(name)
    if module is None:
        raise KeyError(f"model has no module '{name}' (see model.named_modules())")
    return module, (int(index) if index else None)


def _to_bhnp(tensor, heads):
    array = tensor.detach().float().cpu().numpy()
    if array.ndim == 4:  # already [B, H, N, P]
        return array
    if array.ndim == 3:  # [B, N, H*P]
        b, n, width = array.shape
        if width % heads:
            raise ValueError(f"last dim {width} does not split into {heads} heads")
        return array.reshape(b, n, heads, width // heads).transpose(0, 2, 1, 3)
    raise ValueError(f"cannot interpret a captured tensor of shape {array.shape}")


def capture(model, run, layers, heads, kv_heads=None, repeat_kv=1):
    """Runs `run()` once with forward hooks on the named modules; returns one dump_containers.Layer per
    layer with float32 numpy arrays q [B, H, N, P], k and v [B, Hkv, N, P|Pv] (Hkv = kv_heads, default
    heads: grouped-query K/V are kept as the model has them; repeat_kv > 1 repeats them to H heads
    instead, for tools that need it).

    When a LayerSpec names `out` (the module whose output is the per-head attention output), `run()`
    must return a scalar loss: it is backpropagated and the gradient of that output is kept as the
    layer's dy [B, H, N, Pv] (the real upstream gradient attnprobe's gradient metrics read)."""
    import torch

    kv_heads = kv_heads or heads
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} kv heads")
    with_dy = any(layer.out for layer in layers)
    store = {}
    handles = []
    for li, layer in enumerate(layers):
        for role in ("q", "k", "v", "out"):
            if not getattr(layer, role):
                continue
            module, index = _resolve(model, getattr(layer, role))

            def hook(_module, _inputs, output, key=(li, role), index=index):
                output = output[index] if index is not None else output
                if key[1] == "out":
                    output.register_hook(lambda grad: store.__setitem__((key[0], "dy"), grad))
                else:
                    store[key] = output

            handles.append(module.register_forward_hook(hook))
    try:
        if with_dy:
            model.zero_grad(set_to_none=True)
            with torch.enable_grad():
                loss = run()
                if not torch.is_tensor(loss) or loss.dim() != 0:
                    raise ValueError("with `out` modules (dy), run() must return the scalar loss to backpropagate")
                loss.backward()
        else:
            with torch.no_grad():
                run()
    finally:
        for h in handles:
            h.remove()
    result = []
    for li, spec in enumerate(layers):
        q = _to_bhnp(store[(li, "q")], heads)
        k = _to_bhnp(store[(li, "k")], kv_heads)
        v = _to_bhnp(store[(li, "v")], kv_heads)
        if repeat_kv > 1:
            k, v = np.repeat(k, repeat_kv, axis=1), np.repeat(v, repeat_kv, axis=1)
        dy = _to_bhnp(store[(li, "dy")], heads) if spec.out else None
        result.append(dump_containers.Layer(q=q, k=k, v=v, dy=dy))
    return result


def write(captured, path, scale=None, causal=0, model="", source="", dtype="float16", lengths=None, fmt="hdf5",
          last=None, window=None):
    """Writes captured layers (dump_containers.Layer, or (q, k, v) tuples) to `path` in container `fmt`
    (hdf5 | safetensors | npz; docs/dumps.md).

    last=W writes a decode dump: the last W query rows (and their dy) with the whole cache of keys and values,
    what W decode steps of a causal model attend to; attnprobe places them at the cache's last W positions.
    window=W (with causal=1) records a sliding-window model's window, which `--mask auto` then applies."""
    layers = []
    for item in captured:
        layer = item if isinstance(item, dump_containers.Layer) else dump_containers.Layer(*item)
        if last is not None:
            if not 1 <= last <= np.asarray(layer.q).shape[2]:
                raise ValueError(f"last={last} must be between 1 and the {np.asarray(layer.q).shape[2]} tokens")
            layer = dataclasses.replace(layer, q=np.asarray(layer.q)[:, :, -last:],
                                        dy=None if layer.dy is None else np.asarray(layer.dy)[:, :, -last:])
        layers.append(dataclasses.replace(layer, scale=scale, causal=int(causal), window=window,
                                          lengths=None if lengths is None else np.asarray(lengths)))
    dump_containers.write(path, layers, fmt=fmt, dtype=dtype, model=model, source=source)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a checkpoint written by tools/train_charlm.py")
    parser.add_argument("--text", required=True, help="text to run the model on (held-out text)")
    parser.add_argument("--length", type=int, default=4096, help="tokens per sequence")
    parser.add_argument("--sequences", type=int, default=2, help="sequences (batch items), consecutive in the text")
    parser.add_argument("--offset", type=int, default=0, help="first character of the first sequence")
    parser.add_argument("--format", default="hdf5", choices=dump_containers.FORMATS,
                        help="container (docs/dumps.md); attnprobe tells them apart by their first bytes")
    parser.add_argument("--dtype", default="float16", choices=dump_containers.DTYPES,
                        help="stored type; bfloat16 only in safetensors")
    parser.add_argument("--with-dy", action="store_true",
                        help="also capture dy, the gradient of the model's training loss (masked-character "
                             "cross-entropy, 15%% of the positions masked with --dy-seed; next-character "
                             "cross-entropy for a --causal checkpoint) with respect to each "
                             "layer's per-head attention output; Q/K/V are then those of the masked input")
    parser.add_argument("--dy-seed", type=int, default=1234, help="seed of the masked positions for --with-dy")
    parser.add_argument("--last", type=int, default=None,
                        help="write a decode dump: the last W query rows of each sequence with its whole cache of "
                             "keys and values (W decode steps; for a --causal checkpoint)")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args()
    if args.dtype == "bfloat16" and args.format != "safetensors":
        parser.error("--dtype bfloat16 needs --format safetensors (HDF5 and numpy have no bfloat16)")

    import torch
    import torch.nn.functional as F
    from train_charlm import load_checkpoint

    model, vocab, meta = load_checkpoint(args.checkpoint)
    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    need = args.offset + args.length * args.sequences
    if len(text) < need:
        sys.exit(f"dump_qkv: {args.text} has {len(text)} characters, {need} needed")
    ids = [[vocab.index(c) if c in vocab else 0 for c in text[args.offset + s * args.length:][:args.length]]
           for s in range(args.sequences)]
    tokens = torch.tensor(ids, dtype=torch.long)
    heads, kv_heads = meta["heads"], meta.get("kv_heads", meta["heads"])
    layers = [LayerSpec(q=f"blocks.{i}.attn.rotary:0", k=f"blocks.{i}.attn.rotary:1", v=f"blocks.{i}.attn.v",
                        out=f"blocks.{i}.attn.context" if args.with_dy else "")
              for i in range(meta["layers"])]
    model.eval()
    causal = bool(meta.get("causal", False))
    if args.with_dy and causal:
        # The causal model's training loss: next-character cross-entropy (the last position has no target).
        run = lambda: F.cross_entropy(model(tokens)[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    elif args.with_dy:
        # The training loss of tools/train_charlm.py: cross-entropy of the masked characters (mask id 0).
        generator = torch.Generator().manual_seed(args.dy_seed)
        masked = torch.rand(tokens.shape, generator=generator) < 0.15
        inputs = tokens.masked_fill(masked, 0)
        run = lambda: F.cross_entropy(model(inputs)[masked], tokens[masked])
    else:
        run = lambda: model(tokens)
    captured = capture(model, run, layers, heads=heads, kv_heads=kv_heads)
    kind = "causal next-character" if causal else "MLM"
    write(captured, args.output, scale=1 / math.sqrt(meta["head_dim"]), causal=int(causal),
          model=f"attnprobe char-level {kind} transformer ({meta['layers']} layers x {heads} heads"
                + (f", {kv_heads} kv heads" if kv_heads != heads else "")
                + f", head dim {meta['head_dim']}, rotary), tools/train_charlm.py",
          source=f"{meta['corpus']}; characters {args.offset}..{need} of the held-out split (the last 5% of the "
                 f"text, never trained on)"
                 + ("; 15% of the characters masked (dy)" if args.with_dy and not causal else ""),
          dtype=args.dtype, fmt=args.format, last=args.last)
    print(f"dump_qkv: wrote {args.output} ({args.format}): {meta['layers']} layers x {heads} heads "
          f"({kv_heads} kv) x {args.sequences} x {args.length} tokens, head dim {meta['head_dim']}, {args.dtype}"
          + (", with dy" if args.with_dy else ""))


if __name__ == "__main__":
    main()
