#!/usr/bin/python3
"""Dump the per-head queries, keys and values of this project's character models (tools/train_charlm.py) as an
attnprobe dump: a thin command line over the Python package's capture (attnprobe.capture, validated against the
model's own attention output) and writers (attnprobe.write_dump). Your own model needs no script: see
docs/python.md and the README's "Your own model in five minutes":

    import attnprobe
    layers = attnprobe.capture(model.eval(), batch)      # SDPA calls and nn.MultiheadAttention, validated
    layers.write("my-model.safetensors")                 # or .h5, .npz; attnprobe info/eval/sweep read it

Needs the package on the path (a build with -DATTNPROBE_PYTHON=ON: PYTHONPATH=build/python, or installed).

Command line (for this project's character model):

    /usr/bin/python3 tools/train_charlm.py ... --held-out-text held_out.txt   # writes the held-out split
    PYTHONPATH=build/python /usr/bin/python3 tools/dump_qkv.py --checkpoint data/models/charlm-hd32.pt \\
        --text held_out.txt --length 4096 --sequences 2 -o data/charlm-hd32.h5
    # a decode dump: the last 16 queries of each sequence against its whole cache of 4096 keys:
    ... tools/dump_qkv.py --checkpoint data/models/charlm-causal.pt ... --last 16 -o decode.h5
    # the same as safetensors in bfloat16, with real upstream gradients:
    ... tools/dump_qkv.py ... --format safetensors --dtype bfloat16 --with-dy -o charlm.safetensors

The functions below (LayerSpec, capture, write) keep this file's earlier Python API for scripts that import it;
they call the package.
"""
import argparse
import math
import sys

import numpy as np

try:
    import attnprobe
    from attnprobe import containers
except ImportError as error:
    sys.exit(f"dump_qkv: cannot import the attnprobe package ({error}): build it (cmake -DATTNPROBE_PYTHON=ON) and "
             "run with PYTHONPATH=build/python, or install it with cmake --install")

LayerSpec = attnprobe.LayerSpec


def capture(model, run, layers, heads, kv_heads=None, repeat_kv=1):
    """attnprobe.capture with forward hooks on `layers` (LayerSpec; `out`, where named, must be a module whose input
    is the per-head attention output, and then `run()` returns the loss whose gradient becomes dy), unvalidated
    as before; returns a list of attnprobe.Layer (repeat_kv > 1 repeats K/V to the query heads)."""
    with_dy = any(layer.out for layer in layers)
    captured = attnprobe.capture(model, lambda _model: run(), hooks=layers, heads=heads, kv_heads=kv_heads,
                                 causal=False, validate=False, gradients=with_dy)
    result = list(captured.values())
    if repeat_kv > 1:
        for layer in result:
            layer.k, layer.v = np.repeat(layer.k, repeat_kv, axis=1), np.repeat(layer.v, repeat_kv, axis=1)
    return result


def write(captured, path, scale=None, causal=0, model="", source="", dtype="float16", lengths=None, fmt="hdf5",
          last=None, window=None):
    """attnprobe.write_dump of captured layers (attnprobe.Layer, or (q, k, v) tuples) with one scale, causal flag,
    window and lengths for all; last=W writes the decode dump of the last W query rows (attnprobe.Layer.last)."""
    layers = []
    for item in captured:
        layer = containers._as_layer(item)
        if last is not None:
            layer = layer.last(last)
        layers.append(containers.dataclasses.replace(layer, scale=scale, causal=int(causal), window=window,
                                                     lengths=None if lengths is None else np.asarray(lengths)))
    attnprobe.write_dump(path, layers, format=fmt, dtype=dtype, model=model, source=source)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a checkpoint written by tools/train_charlm.py")
    parser.add_argument("--text", required=True, help="text to run the model on (held-out text)")
    parser.add_argument("--length", type=int, default=4096, help="tokens per sequence")
    parser.add_argument("--sequences", type=int, default=2, help="sequences (batch items), consecutive in the text")
    parser.add_argument("--offset", type=int, default=0, help="first character of the first sequence")
    parser.add_argument("--format", default="hdf5", choices=containers.FORMATS,
                        help="container (docs/dumps.md); attnprobe tells them apart by their first bytes")
    parser.add_argument("--dtype", default="float16", choices=containers.DTYPES,
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
    # The rotary module returns the rotated (q, k) that attention multiplies; attn.out's input is the per-head
    # attention output before the output projection: what validation compares with, and where dy is taken.
    layers = [LayerSpec(q=f"blocks.{i}.attn.rotary:0", k=f"blocks.{i}.attn.rotary:1", v=f"blocks.{i}.attn.v",
                        out=f"blocks.{i}.attn.out") for i in range(meta["layers"])]
    model.eval()
    causal = bool(meta.get("causal", False))
    if args.with_dy and causal:
        # The causal model's training loss: next-character cross-entropy (the last position has no target).
        run = lambda m: F.cross_entropy(m(tokens)[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())  # noqa: E731
    elif args.with_dy:
        # The training loss of tools/train_charlm.py: cross-entropy of the masked characters (mask id 0).
        generator = torch.Generator().manual_seed(args.dy_seed)
        masked = torch.rand(tokens.shape, generator=generator) < 0.15
        inputs = tokens.masked_fill(masked, 0)
        run = lambda m: F.cross_entropy(m(inputs)[masked], tokens[masked])  # noqa: E731
    else:
        run = tokens
    try:
        captured = attnprobe.capture(model, run, hooks=layers, heads=heads, kv_heads=kv_heads,
                                     scale=1 / math.sqrt(meta["head_dim"]), causal=causal, gradients=args.with_dy)
    except attnprobe.CaptureError as error:
        sys.exit(f"dump_qkv: {error}")
    if args.last is not None:
        captured = captured.last(args.last)
    kind = "causal next-character" if causal else "MLM"
    captured.write(args.output, format=args.format, dtype=args.dtype,
                   model=f"attnprobe char-level {kind} transformer ({meta['layers']} layers x {heads} heads"
                         + (f", {kv_heads} kv heads" if kv_heads != heads else "")
                         + f", head dim {meta['head_dim']}, rotary), tools/train_charlm.py",
                   source=f"{meta['corpus']}; characters {args.offset}..{need} of the held-out split (the last 5% of "
                          f"the text, never trained on)"
                          + ("; 15% of the characters masked (dy)" if args.with_dy and not causal else ""))
    worst = max(layer.error for layer in captured.values())
    print(f"dump_qkv: wrote {args.output} ({args.format}): {meta['layers']} layers x {heads} heads "
          f"({kv_heads} kv) x {args.sequences} x {args.length} tokens, head dim {meta['head_dim']}, {args.dtype}"
          + (", with dy" if args.with_dy else "") + f"; validated: exact attention within {worst:.2g} of the model's")


if __name__ == "__main__":
    main()
