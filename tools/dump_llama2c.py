#!/usr/bin/python3
"""Dump the per-layer Q/K/V of a llama2.c checkpoint (e.g. ../shared/data/models/stories260K.bin) to an
attnprobe dump, grouped-query K/V kept with their own heads (not repeated), and optionally the model's own
per-head attention output as the reference attnprobe's exact causal attention must reproduce.

The checkpoint (llama2.c's legacy format): 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
vocab_size (negative: the classifier is not the token embedding), seq_len), then float32 weights in this
order: token_embedding [vocab, dim], rms_att [L, dim], wq [L, dim, dim], wk [L, kv_dim, dim],
wv [L, kv_dim, dim], wo [L, dim, dim], rms_ffn [L, dim], w1 [L, hidden, dim], w2 [L, dim, hidden],
w3 [L, hidden, dim], rms_final [dim], freq_cis real and imag [seq_len * head_size / 2] each (unused),
wcls [vocab, dim] if unshared. Matrices are [out, in] (y = W x).

The forward pass (Llama 2, as llama2.c's run.c computes it), all in float64 with torch:
  x = embedding[token];  per layer:  h = rmsnorm(x) * rms_att;  q = wq h, k = wk h, v = wv h;
  RoPE on q and k: each pair (2i, 2i+1) of a head rotated by pos * 10000^(-2i / head_size);
  per query head h (kv head g = h // (H / Hkv)): o = softmax(q k^T / sqrt(head_size), keys j <= i) v;
  x += wo concat(o);  x += w2 (silu(w1 h') * w3 h') with h' = rmsnorm(x) * rms_ffn;
  logits = wcls (rmsnorm(x) * rms_final).   rmsnorm(x) = x / sqrt(mean(x^2) + 1e-5).

Tokens: by default a sequence sampled from the model itself (temperature 1, torch generator seeded with
--seed) starting from BOS = 1, seq_len tokens long (BOS tokens it samples are kept: the next story
starts); or --tokens FILE (whitespace-separated integer ids). --decode TOKENIZER prints the text with a
llama2.c tokenizer file (int32 max_token_length, then per token: float32 score, int32 length, bytes).

    /usr/bin/python3 tools/dump_llama2c.py ../shared/data/models/stories260K.bin -o stories.safetensors \\
        --reference-out stories-reference.npy --decode ../shared/data/models/tok512.bin

Output: q [1, H, N, P], k and v [1, Hkv, N, P] per layer through the package's attnprobe.write_dump
(--format safetensors|hdf5|npz, --dtype bfloat16|float16|float32|float64), scale 1/sqrt(head_size), causal = 1.
Needs the attnprobe package on the path (PYTHONPATH=build/python, or installed).
--reference-out: a float64 .npy [L, 1, H, N, P], the per-head attention output computed inside the
forward pass (before wo), from the float64 q/k/v (not from the rounded dump).
Cost: the sampling runs N forward passes over growing prefixes (O(N^2) tokens; ~10 s for stories260K).
"""
import argparse
import math
import os
import struct
import sys

import numpy as np

try:
    from attnprobe import containers  # the package's dump writers (docs/dumps.md)
except ImportError as error:
    sys.exit(f"dump_llama2c: cannot import the attnprobe package ({error}): build it (cmake -DATTNPROBE_PYTHON=ON) "
             "and run with PYTHONPATH=build/python, or install it with cmake --install")

BOS = 1


class Llama2c:
    """A llama2.c checkpoint's configuration and float64 torch weights."""

    def __init__(self, path):
        import torch

        with open(path, "rb") as f:
            raw = f.read()
        dim, hidden, layers, heads, kv_heads, vocab, seq_len = struct.unpack("<7i", raw[:28])
        self.shared = vocab > 0
        vocab = abs(vocab)
        if dim % heads or heads % kv_heads:
            raise ValueError(f"{path}: dim {dim}, {heads} heads, {kv_heads} kv heads do not fit together")
        self.dim, self.hidden, self.layers, self.heads, self.kv_heads = dim, hidden, layers, heads, kv_heads
        self.vocab, self.seq_len, self.head_size = vocab, seq_len, dim // heads
        kv_dim = kv_heads * self.head_size
        shapes = [("embedding", (vocab, dim)), ("rms_att", (layers, dim)), ("wq", (layers, dim, dim)),
                  ("wk", (layers, kv_dim, dim)), ("wv", (layers, kv_dim, dim)), ("wo", (layers, dim, dim)),
                  ("rms_ffn", (layers, dim)), ("w1", (layers, hidden, dim)), ("w2", (layers, dim, hidden)),
                  ("w3", (layers, hidden, dim)), ("rms_final", (dim,)),
                  ("freq_cis", (2, seq_len * self.head_size // 2))]
        if not self.shared:
            shapes.append(("wcls", (vocab, dim)))
        floats = np.frombuffer(raw, dtype="<f4", offset=28)
        need = sum(math.prod(shape) for _, shape in shapes)
        if floats.size != need:
            raise ValueError(f"{path}: {floats.size} float32 weights after the header, {need} expected for "
                             f"dim {dim}, hidden {hidden}, {layers} layers, {heads}/{kv_heads} heads, vocab {vocab}")
        self.w = {}
        at = 0
        for name, shape in shapes:
            count = math.prod(shape)
            self.w[name] = torch.from_numpy(floats[at:at + count].astype(np.float64).reshape(shape))
            at += count
        if self.shared:
            self.w["wcls"] = self.w["embedding"]

    def rope(self, x):
        """Rotates each head's pairs (2i, 2i+1) by angle pos * 10000^(-2i / head_size), as run.c does.
        x [heads, N, head_size] float64 -> same shape."""
        import torch

        n, p = x.shape[1], self.head_size
        freq = 1.0 / (10000.0 ** (torch.arange(0, p, 2, dtype=torch.float64) / p))  # [p/2]
        angle = torch.arange(n, dtype=torch.float64)[:, None] * freq[None, :]  # [N, p/2]
        cos, sin = angle.cos(), angle.sin()
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)

    def forward(self, tokens, capture=None):
        """tokens: list of N ids -> logits [N, vocab] float64. capture (a list) receives per layer a dict
        q [H, N, P] (after RoPE), k [Hkv, N, P] (after RoPE), v [Hkv, N, P], out [H, N, P] (the per-head
        causal attention output before wo)."""
        import torch

        def rmsnorm(x, weight):
            return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5) * weight

        n, p, w = len(tokens), self.head_size, self.w
        x = w["embedding"][torch.tensor(tokens, dtype=torch.long)]  # [N, dim]
        future = torch.ones(n, n, dtype=torch.bool).triu(1)  # key j > query i
        group = self.heads // self.kv_heads
        for layer in range(self.layers):
            h = rmsnorm(x, w["rms_att"][layer])
            q = self.rope((h @ w["wq"][layer].T).view(n, self.heads, p).transpose(0, 1))
            k = self.rope((h @ w["wk"][layer].T).view(n, self.kv_heads, p).transpose(0, 1))
            v = (h @ w["wv"][layer].T).view(n, self.kv_heads, p).transpose(0, 1)
            kr, vr = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)  # query head h -> h // group
            scores = (q @ kr.transpose(-1, -2)) / math.sqrt(p)
            out = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ vr  # [H, N, P]
            if capture is not None:
                capture.append({"q": q, "k": k, "v": v, "out": out})
            x = x + out.transpose(0, 1).reshape(n, self.dim) @ w["wo"][layer].T
            h = rmsnorm(x, w["rms_ffn"][layer])
            x = x + (torch.nn.functional.silu(h @ w["w1"][layer].T) * (h @ w["w3"][layer].T)) @ w["w2"][layer].T
        return rmsnorm(x, w["rms_final"]) @ w["wcls"].T

    def sample(self, length, seed):
        """length tokens: BOS then length-1 sampled at temperature 1 with a seeded torch generator."""
        import torch

        generator = torch.Generator().manual_seed(seed)
        tokens = [BOS]
        while len(tokens) < length:
            logits = self.forward(tokens)[-1]
            tokens.append(int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)))
        return tokens


def read_tokenizer(path, vocab):
    """A llama2.c tokenizer file -> list of byte strings, one per token id."""
    with open(path, "rb") as f:
        raw = f.read()
    at, pieces = 4, []  # int32 max_token_length first
    for _ in range(vocab):
        _score, length = struct.unpack_from("<fi", raw, at)
        pieces.append(raw[at + 8:at + 8 + length])
        at += 8 + length
    return pieces


def decode(tokens, pieces):
    """Text of a token sequence as llama2.c prints it (a leading space dropped after BOS; <0xNN> bytes)."""
    out = []
    for prev, token in zip([None] + tokens[:-1], tokens):
        piece = pieces[token]
        if prev == BOS and piece.startswith(b" "):
            piece = piece[1:]
        if piece.startswith(b"<0x") and piece.endswith(b">") and len(piece) == 6:
            piece = bytes([int(piece[3:5], 16)])
        out.append(piece)
    return b"".join(out).decode("utf-8", errors="replace")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a llama2.c checkpoint (.bin), e.g. ../shared/data/models/stories260K.bin")
    parser.add_argument("-o", "--output", required=True, help="the dump to write")
    parser.add_argument("--format", default="safetensors", choices=containers.FORMATS)
    parser.add_argument("--dtype", default="bfloat16", choices=containers.DTYPES,
                        help="stored type (bfloat16 only in safetensors)")
    parser.add_argument("--tokens", default=None, help="a file of whitespace-separated token ids instead of sampling")
    parser.add_argument("--length", type=int, default=0, help="tokens to sample (default: the model's seq_len)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling generator")
    parser.add_argument("--reference-out", default=None,
                        help="also write the model's per-head attention output [L, 1, H, N, P] as float64 .npy")
    parser.add_argument("--tokens-out", default=None, help="also write the token ids used (one line)")
    parser.add_argument("--decode", default=None, help="a llama2.c tokenizer file: print the text of the tokens")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args()
    if args.dtype == "bfloat16" and args.format != "safetensors":
        parser.error("--dtype bfloat16 needs --format safetensors (HDF5 and numpy have no bfloat16)")

    import torch

    torch.set_num_threads(args.threads)
    model = Llama2c(args.checkpoint)
    if args.tokens:
        with open(args.tokens) as f:
            tokens = [int(t) for t in f.read().split()]
        bad = [t for t in tokens if not 0 <= t < model.vocab]
        if not tokens or bad or len(tokens) > model.seq_len:
            sys.exit(f"dump_llama2c: {args.tokens}: {len(tokens)} tokens (1..{model.seq_len} needed), "
                     f"out of range: {bad[:5]}")
        source = f"{len(tokens)} tokens from {args.tokens}"
    else:
        length = args.length or model.seq_len
        tokens = model.sample(length, args.seed)
        source = f"{length} tokens sampled from the model (BOS first, temperature 1, torch seed {args.seed})"
    if args.tokens_out:
        with open(args.tokens_out, "w") as f:
            f.write(" ".join(map(str, tokens)) + "\n")
    if args.decode:
        print(decode(tokens, read_tokenizer(args.decode, model.vocab)))

    captured = []
    with torch.no_grad():
        model.forward(tokens, captured)
    scale = 1 / math.sqrt(model.head_size)
    layers = [containers.Layer(q=c["q"][None].numpy(), k=c["k"][None].numpy(), v=c["v"][None].numpy(),
                               scale=scale, causal=1) for c in captured]
    name = os.path.basename(args.checkpoint)
    containers.write_dump(args.output, layers, format=args.format, dtype=args.dtype,
                          model=f"llama2.c checkpoint {name} ({model.layers} layers, {model.heads} query heads, "
                                f"{model.kv_heads} kv heads, head dim {model.head_size}, RoPE, causal); "
                                f"float64 forward pass of tools/dump_llama2c.py",
                          source=source)
    if args.reference_out:
        with open(args.reference_out, "wb") as f:  # a file object: numpy would append .npy to another name
            np.save(f, np.stack([c["out"][None].numpy() for c in captured]))
    print(f"dump_llama2c: wrote {args.output} ({args.format}, {args.dtype}): {model.layers} layers x {model.heads} "
          f"heads ({model.kv_heads} kv) x {len(tokens)} tokens, head dim {model.head_size}, causal, scale {scale:.6g}"
          + (f"; reference {args.reference_out}" if args.reference_out else ""), file=sys.stderr)


if __name__ == "__main__":
    main()
