#!/usr/bin/python3
"""Dump the per-head queries, keys and values of a PyTorch model to attnprobe's HDF5 layout.

Forward hooks capture the outputs of the modules that produce Q, K and V: the q/k/v projections
(`nn.Linear` outputs [B, N, H*P], split into H heads) or, for models that rotate Q and K after the
projection (rotary position embeddings), the module that returns the rotated pair (then name the
tuple element: "module.name:0" for Q, ":1" for K). The dump then holds what the attention really
multiplies, so `attnprobe` measures the estimators on the model's own attention.

Layout written (docs/dumps.md): /layer_NN/{q,k,v} [B, H, N, P], attributes scale and causal,
root attributes model, source and created_by; float16 or float32, gzip with byte shuffle.

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
  - Grouped-query attention: repeat K/V to the query heads before writing (pass repeat_kv=H/H_kv).

Command line (for this project's character model):

    /usr/bin/python3 tools/train_charlm.py ... --held-out-text held_out.txt   # writes the held-out split
    /usr/bin/python3 tools/dump_qkv.py --checkpoint data/models/charlm-hd32.pt --text held_out.txt \\
        --length 4096 --sequences 2 -o data/charlm-hd32.h5
"""
import argparse
import dataclasses
import math
import os
import sys

import numpy as np


@dataclasses.dataclass
class LayerSpec:
    q: str  # module name, optionally ":index" to pick an element of a tuple output
    k: str
    v: str


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


def capture(model, run, layers, heads, repeat_kv=1):
    """Runs `run()` once with forward hooks on the named modules; returns [(q, k, v), ...] per layer
    as float32 numpy arrays [B, H, N, P]."""
    import torch

    store = {}
    handles = []
    for li, layer in enumerate(layers):
        for role in ("q", "k", "v"):
            module, index = _resolve(model, getattr(layer, role))

            def hook(_module, _inputs, output, key=(li, role), index=index):
                store[key] = output[index] if index is not None else output

            handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()
    result = []
    for li in range(len(layers)):
        q = _to_bhnp(store[(li, "q")], heads)
        k = _to_bhnp(store[(li, "k")], heads // repeat_kv if repeat_kv > 1 else heads)
        v = _to_bhnp(store[(li, "v")], heads // repeat_kv if repeat_kv > 1 else heads)
        if repeat_kv > 1:
            k, v = np.repeat(k, repeat_kv, axis=1), np.repeat(v, repeat_kv, axis=1)
        result.append((q, k, v))
    return result


def write(captured, path, scale=None, causal=0, model="", source="", dtype="float16", lengths=None):
    """Writes captured [(q, k, v), ...] to `path` in attnprobe's layout."""
    import h5py

    with h5py.File(path, "w", track_order=True) as f:
        f.attrs["model"] = model
        f.attrs["source"] = source
        f.attrs["created_by"] = "attnprobe tools/dump_qkv.py"
        for li, (q, k, v) in enumerate(captured):
            group = f.create_group(f"layer_{li:02d}", track_order=True)
            p = q.shape[-1]
            group.attrs["scale"] = float(scale if scale is not None else 1 / math.sqrt(p))
            group.attrs["causal"] = int(causal)
            for name, array in (("q", q), ("k", k), ("v", v)):
                chunk = (1, 1, min(array.shape[2], 1024), array.shape[3])
                group.create_dataset(name, data=array.astype(dtype), chunks=chunk, compression="gzip",
                                     compression_opts=9, shuffle=True, track_times=False)
            if lengths is not None:
                group.create_dataset("lengths", data=np.asarray(lengths, dtype=np.int64), track_times=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a checkpoint written by tools/train_charlm.py")
    parser.add_argument("--text", required=True, help="text to run the model on (held-out text)")
    parser.add_argument("--length", type=int, default=4096, help="tokens per sequence")
    parser.add_argument("--sequences", type=int, default=2, help="sequences (batch items), consecutive in the text")
    parser.add_argument("--offset", type=int, default=0, help="first character of the first sequence")
    parser.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args()

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
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
    layers = [LayerSpec(q=f"blocks.{i}.attn.rotary:0", k=f"blocks.{i}.attn.rotary:1", v=f"blocks.{i}.attn.v")
              for i in range(meta["layers"])]
    model.eval()
    captured = capture(model, lambda: model(tokens), layers, heads=meta["heads"])
    write(captured, args.output, scale=1 / math.sqrt(meta["head_dim"]), causal=0,
          model=f"attnprobe char-level MLM transformer ({meta['layers']} layers x {meta['heads']} heads, "
                f"head dim {meta['head_dim']}, rotary), tools/train_charlm.py",
          source=f"{meta['corpus']}; characters {args.offset}..{need} of the held-out split (the last 5% of the "
                 f"text, never trained on)", dtype=args.dtype)
    print(f"dump_qkv: wrote {args.output}: {meta['layers']} layers x {meta['heads']} heads x {args.sequences} x "
          f"{args.length} tokens, head dim {meta['head_dim']}, {args.dtype}")


if __name__ == "__main__":
    main()
