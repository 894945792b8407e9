#!/usr/bin/python3
"""Train a small bidirectional character-level transformer (masked-language model) on real text,
so attnprobe has trained Q/K/V at long lengths (up to 4096) of its own to measure.

Corpus: the King James Bible (public domain), printed by Debian's `bible` program from the
bible-kjv-text data (`apt-get install bible-kjv`); verse numbers are stripped, the last 5% of the
text is held out. Model: token embedding -> L pre-norm blocks (multi-head attention with rotary
position embeddings applied to Q and K, so the dumped Q/K carry position; GELU MLP) -> linear head.
15% of the positions are masked and predicted. Seeded; logs the loss; reports held-out bits per
character on masked positions and the unigram baseline (the entropy of the training characters'
frequencies, evaluated on the held-out text).

    apt-get install bible-kjv python3-torch
    /usr/bin/python3 tools/train_charlm.py --head-dim 32 --heads 2 --layers 2 -o data/models/charlm-hd32.pt
    /usr/bin/python3 tools/train_charlm.py --head-dim 64 --heads 2 --layers 2 -o data/models/charlm-hd64.pt

Training is a curriculum over sequence lengths (128 -> 512 -> 1024 -> 4096), most steps short; the
learning rate decays (cosine) only to 30% so the long stages still learn. On 2 CPU cores: ~10 min
(head dim 32) and ~13 min (head dim 64).

--causal trains a causal (GPT-style) next-character model instead (every position predicts the next
character; attention to keys j <= i, computed by blocks of 512 query rows so the masked blocks are never
multiplied); --kv-heads G < --heads gives grouped-query attention (G key/value heads, query head h reads
kv head h // (heads / G)). It reports held-out bits per character over all positions of 512- and
4096-character windows and each head's mean causal attention entropy on the first 2 x 4096 held-out
characters (stored in the checkpoint's metadata). data/models/charlm-causal.pt:

    /usr/bin/python3 tools/train_charlm.py --causal --heads 4 --kv-heads 2 --head-dim 32 --layers 2 \
        --steps 160,60,30,20 --batch 16,4,2,1 -o data/models/charlm-causal.pt
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MASK = "\x00"  # the mask token: never occurs in the text


def load_corpus(path=None):
    """The KJV text, verse numbers and chapter headings stripped, one space between lines."""
    if path:
        with open(path, encoding="utf-8") as f:
            raw = f.read()
    else:
        raw = subprocess.run(["bible", "Gen1:1-Rev22:21"], check=True, capture_output=True, text=True).stdout
    lines = []
    for line in raw.splitlines():
        line = line.strip()
        if not line or re.fullmatch(r"[1-3]? ?[A-Za-z ]+ \d+", line):  # chapter headings "Genesis 1"
            continue
        lines.append(re.sub(r"^\d+\s+", "", line))
    return " ".join(lines)


class Rotary(nn.Module):
    """Rotary position embedding of q and k, [B, H, N, P] each; returns the rotated pair. Its own
    module so that forward hooks (tools/dump_qkv.py) see Q and K exactly as attention uses them."""

    def __init__(self, head_dim, base=10000.0):
        super().__init__()
        self.register_buffer("inv_freq", base ** (-torch.arange(0, head_dim, 2).float() / head_dim), persistent=False)

    def forward(self, q, k):
        n = q.shape[-2]
        angles = torch.arange(n, device=q.device).float()[:, None] * self.inv_freq[None, :]
        cos, sin = angles.cos(), angles.sin()

        def rotate(x):
            x1, x2 = x[..., 0::2], x[..., 1::2]
            return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

        return rotate(q), rotate(k)


CAUSAL_BLOCK = 512  # query rows per block of the causal attention


def causal_attention(q, k, v, scale, block=CAUSAL_BLOCK):
    """softmax(q k^T scale, keys j <= query i) v, by blocks of query rows so that the keys after a
    block are never multiplied (56% of the score entries of full attention at N = 4096, block 512):
    this is what makes the N = 4096 training stage affordable on 2 cores.
    q, k [B, H, N, P], v [B, H, N, Pv] -> [B, H, N, Pv]."""
    n = q.shape[-2]
    out = []
    for start in range(0, n, block):
        stop = min(start + block, n)
        scores = (q[..., start:stop, :] @ k[..., :stop, :].transpose(-1, -2)) * scale  # [B, H, stop-start, stop]
        future = torch.ones(stop - start, stop, dtype=torch.bool, device=q.device).triu(start + 1)  # j > start+i
        out.append(torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v[..., :stop, :])
    return torch.cat(out, dim=-2)


class Attention(nn.Module):
    """Multi-head attention with rotary Q/K. kv_heads < heads is grouped-query attention: k and v
    have kv_heads heads, query head h reads kv head h // (heads // kv_heads) (Llama's repeat_kv).
    causal: query i attends to keys j <= i. Shapes: x [B, N, d_model] -> [B, N, d_model]."""

    def __init__(self, d_model, heads, head_dim, kv_heads=None, causal=False):
        super().__init__()
        kv_heads = kv_heads or heads
        if heads % kv_heads:
            raise ValueError(f"{heads} query heads do not split into groups of {kv_heads} kv heads")
        self.heads, self.kv_heads, self.head_dim, self.causal = heads, kv_heads, head_dim, causal
        self.q = nn.Linear(d_model, heads * head_dim)
        self.k = nn.Linear(d_model, kv_heads * head_dim)
        self.v = nn.Linear(d_model, kv_heads * head_dim)
        self.rotary = Rotary(head_dim)
        self.context = nn.Identity()  # per-head softmax(QK^T s)V, [B, H, N, P]: a hook point for tests
        self.out = nn.Linear(heads * head_dim, d_model)

    def forward(self, x):
        b, n, _ = x.shape
        split = lambda t, h: t.view(b, n, h, self.head_dim).transpose(1, 2)
        q, k = self.rotary(split(self.q(x), self.heads), split(self.k(x), self.kv_heads))
        v = split(self.v(x), self.kv_heads)
        if self.kv_heads != self.heads:  # [B, Hkv, N, P] -> [B, H, N, P], kv head g serves query heads g*r..g*r+r-1
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        if self.causal:
            context = self.context(causal_attention(q, k, v, 1 / math.sqrt(self.head_dim)))
        else:
            weights = torch.softmax((q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim), dim=-1)
            context = self.context(weights @ v)
        return self.out(context.transpose(1, 2).reshape(b, n, -1))


class Block(nn.Module):
    def __init__(self, d_model, heads, head_dim, kv_heads=None, causal=False):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = Attention(d_model, heads, head_dim, kv_heads, causal)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class CharLM(nn.Module):
    """tokens [B, N] -> logits [B, N, vocab]; d_model = heads * head_dim."""

    def __init__(self, vocab_size, layers, heads, head_dim, kv_heads=None, causal=False):
        super().__init__()
        d_model = heads * head_dim
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, head_dim, kv_heads, causal) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def load_checkpoint(path):
    state = torch.load(path, map_location="cpu")
    meta = state["meta"]
    model = CharLM(len(meta["vocab"]), meta["layers"], meta["heads"], meta["head_dim"],
                   meta.get("kv_heads", meta["heads"]), meta.get("causal", False))
    model.load_state_dict({k: v.float() for k, v in state["weights"].items()})
    return model, meta["vocab"], meta


def masked_batch(data, length, batch, generator, mask_id, rate=0.15):
    starts = torch.randint(0, len(data) - length, (batch,), generator=generator)
    tokens = torch.stack([data[s:s + length] for s in starts])
    mask = torch.rand(tokens.shape, generator=generator) < rate
    inputs = tokens.masked_fill(mask, mask_id)
    return inputs, tokens, mask


def next_char_batch(data, length, batch, generator):
    """Causal mode: inputs [B, N] and the next characters [B, N] as targets."""
    starts = torch.randint(0, len(data) - length - 1, (batch,), generator=generator)
    chunks = torch.stack([data[s:s + length + 1] for s in starts])
    return chunks[:, :-1], chunks[:, 1:]


def causal_bits_per_char(model, data, length, batches, seed=1234):
    """Held-out next-character cross-entropy in bits, averaged over every position 0..length-1 of
    seeded windows (so n = 4096 includes the long-context positions n = 512 cannot see)."""
    generator = torch.Generator().manual_seed(seed)
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for _ in range(batches):
            inputs, targets = next_char_batch(data, length, 2, generator)
            logits = model(inputs)
            total += F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").item()
            count += targets.numel()
    model.train()
    return total / count / math.log(2)


def attention_entropy(model, tokens):
    """Mean Shannon entropy (nats) of each head's causal attention rows, per layer: [[layer 0 heads], ...].
    tokens [B, N]; from the rotated Q/K the dump holds (kv heads repeated to the query heads), in float64,
    averaged over the B*N query rows (row i has i+1 keys)."""
    store = {}
    handles = [block.attn.rotary.register_forward_hook(lambda _m, _i, out, li=li: store.__setitem__(li, out))
               for li, block in enumerate(model.blocks)]
    model.eval()
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        for h in handles:
            h.remove()
        model.train()
    result = []
    for li, block in enumerate(model.blocks):
        q, k = (t.double() for t in store[li])  # [B, H, N, P], [B, Hkv, N, P]
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        n, total = q.shape[-2], 0.0
        for start in range(0, n, CAUSAL_BLOCK):
            stop = min(start + CAUSAL_BLOCK, n)
            scores = (q[..., start:stop, :] @ k[..., :stop, :].transpose(-1, -2)) / math.sqrt(q.shape[-1])
            future = torch.ones(stop - start, stop, dtype=torch.bool).triu(start + 1)
            logp = torch.log_softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            total = total + -(logp.exp() * logp.masked_fill(future, 0)).sum(-1).sum(-1)  # [B, H]
        result.append([float(x) for x in (total / n).mean(0)])
    return result


def bits_per_char(model, data, length, batches, mask_id, seed=1234):
    """Held-out cross-entropy on masked positions, in bits, with fixed (seeded) batches and masks."""
    generator = torch.Generator().manual_seed(seed)
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for _ in range(batches):
            inputs, targets, mask = masked_batch(data, length, 8, generator, mask_id)
            logits = model(inputs)
            total += F.cross_entropy(logits[mask], targets[mask], reduction="sum").item()
            count += int(mask.sum())
    model.train()
    return total / count / math.log(2)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=None,
                        help="key/value heads (grouped-query attention; divides --heads); default --heads")
    parser.add_argument("--causal", action="store_true",
                        help="a causal (GPT-style) next-character model instead of the masked-language model")
    parser.add_argument("--steps", default="800,200,200,150", help="steps at lengths 128,512,1024,4096")
    parser.add_argument("--batch", default="32,8,4,1", help="batch size at each length")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--corpus", default=None, help="a text file instead of the `bible` program's output")
    parser.add_argument("--held-out-text", default=None, help="also write the held-out text here (for dump_qkv.py)")
    parser.add_argument("-o", "--output", required=True, help="checkpoint file (.pt)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    text = load_corpus(args.corpus)
    vocab = [MASK] + sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    data = torch.tensor([index[c] for c in text], dtype=torch.long)
    split = int(len(data) * 0.95)
    train, held = data[:split], data[split:]
    if args.held_out_text:
        with open(args.held_out_text, "w", encoding="utf-8") as f:
            f.write(text[split:])

    counts = torch.bincount(train, minlength=len(vocab)).double() + 1  # add-one: every character has mass
    probs = counts / counts.sum()
    unigram_bits = -(torch.log2(probs[held])).mean().item()

    kv_heads = args.kv_heads or args.heads
    model = CharLM(len(vocab), args.layers, args.heads, args.head_dim, kv_heads, args.causal)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    lengths = [128, 512, 1024, 4096]
    steps = [int(s) for s in args.steps.split(",")]
    batches = [int(b) for b in args.batch.split(",")]
    total = sum(steps)
    generator = torch.Generator().manual_seed(args.seed)
    print(f"corpus: {len(text)} characters, vocab {len(vocab) - 1}, held-out {len(held)}; "
          f"model: {sum(p.numel() for p in model.parameters())} parameters", flush=True)
    done, start = 0, time.time()
    for length, count, batch in zip(lengths, steps, batches):
        for _ in range(count):
            # Cosine decay to a floor of 30%: the long-sequence stages come last and must still learn
            # (decaying to 0 left the model untrained beyond ~1024 tokens: 5.6 bits/char at 4096).
            lr = args.lr * (0.3 + 0.7 * 0.5 * (1 + math.cos(math.pi * done / total)))
            for group in optimizer.param_groups:
                group["lr"] = lr
            if args.causal:
                inputs, targets = next_char_batch(train, length, batch, generator)
                loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
            else:
                inputs, targets, mask = masked_batch(train, length, batch, generator, index[MASK])
                loss = F.cross_entropy(model(inputs)[mask], targets[mask])
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            done += 1
            if done % 100 == 0 or done == total:
                print(f"step {done}/{total} length {length} loss {loss.item() / math.log(2):.3f} bits "
                      f"lr {lr:.2e} {time.time() - start:.0f} s", flush=True)

    train_seconds = time.time() - start
    meta = {"vocab": vocab, "layers": args.layers, "heads": args.heads, "head_dim": args.head_dim,
            "seed": args.seed, "steps": steps, "lengths": lengths, "batch": batches,
            "corpus": "King James Bible (public domain), Debian bible-kjv-text via the bible program"}
    if args.causal:
        # Same number of scored characters at both lengths as the MLM's masked counts, roughly: 16 x 2 x 512
        # and 2 x 2 x 4096 positions. Entropy: the dump's two sequences (the first 2 x 4096 held-out characters).
        held_bits = causal_bits_per_char(model, held, 512, 16)
        held_bits_long = causal_bits_per_char(model, held, 4096, 2)
        entropy = attention_entropy(model, held[:2 * 4096].view(2, 4096))
        meta.update({"kv_heads": kv_heads, "causal": True, "attention_entropy_nats": entropy})
    else:
        held_bits = bits_per_char(model, held, 512, 20, index[MASK])
        held_bits_long = bits_per_char(model, held, 4096, 2, index[MASK])
        if kv_heads != args.heads:
            meta["kv_heads"] = kv_heads
    meta.update({"held_out_bits_per_char_512": held_bits, "held_out_bits_per_char_4096": held_bits_long,
                 "unigram_bits_per_char": unigram_bits, "train_seconds": train_seconds})
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    torch.save({"meta": meta, "weights": {k: v.half() for k, v in model.state_dict().items()}}, args.output)
    print(json.dumps({k: v for k, v in meta.items() if k != "vocab"}, indent=1))
    print(f"held-out: {held_bits:.3f} bits/char at n = 512, {held_bits_long:.3f} at 4096; unigram {unigram_bits:.3f}")
    if args.causal:
        for li, heads in enumerate(meta["attention_entropy_nats"]):
            print(f"attention entropy layer {li}: " + ", ".join(f"head {h} {e:.2f}" for h, e in enumerate(heads))
                  + " nats")


if __name__ == "__main__":
    main()
