#!/usr/bin/python3
"""tools/dump_qkv.py on a tiny random model: the dump it writes is accepted by `attnprobe info`,
and exact attention computed from the dump equals the module's own attention output.

Run by CTest as `test_dump_qkv.py ATTNPROBE_BINARY`; exits 77 (reported as skipped) when torch or
h5py is not installed (Debian: python3-torch, python3-h5py).
"""
import math
import os
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
    import torch
except ImportError as error:
    print(f"SKIPPED: {error} (install python3-torch and python3-h5py)")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tools"))
import dump_qkv  # noqa: E402
from train_charlm import CharLM  # noqa: E402


def main():
    binary = sys.argv[1]
    torch.manual_seed(0)
    layers, heads, head_dim, n, batch = 2, 3, 8, 37, 2
    model = CharLM(vocab_size=20, layers=layers, heads=heads, head_dim=head_dim).eval()
    tokens = torch.randint(0, 20, (batch, n))

    # The module's own attention outputs (per head, before the output projection).
    contexts = {}
    hooks = [model.blocks[i].attn.context.register_forward_hook(
        lambda _m, _i, out, i=i: contexts.__setitem__(i, out.detach().double().numpy())) for i in range(layers)]
    specs = [dump_qkv.LayerSpec(q=f"blocks.{i}.attn.rotary:0", k=f"blocks.{i}.attn.rotary:1", v=f"blocks.{i}.attn.v")
             for i in range(layers)]
    captured = dump_qkv.capture(model, lambda: model(tokens), specs, heads=heads)
    for h in hooks:
        h.remove()

    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tiny.h5")
        dump_qkv.write(captured, path, scale=1 / math.sqrt(head_dim), model="tiny", source="random", dtype="float32")
        info = subprocess.run([binary, "info", path], capture_output=True, text=True)
        print(info.stdout)
        if info.returncode != 0 or "all values finite" not in info.stdout:
            print("FAILED: attnprobe info rejected the dump:", info.stderr)
            failures += 1
        evaluation = subprocess.run([binary, "eval", path, "-e", "softmax", "-q"], capture_output=True, text=True)
        if evaluation.returncode != 0:
            print("FAILED: attnprobe eval:", evaluation.stderr)
            failures += 1
        with h5py.File(path) as f:
            for i in range(layers):
                g = f[f"layer_{i:02d}"]
                q, k, v = (g[name][()].astype(np.float64) for name in ("q", "k", "v"))
                if q.shape != (batch, heads, n, head_dim):
                    print(f"FAILED: layer {i} q has shape {q.shape}")
                    failures += 1
                    continue
                logits = g.attrs["scale"] * q @ k.transpose(0, 1, 3, 2)
                weights = np.exp(logits - logits.max(-1, keepdims=True))
                weights /= weights.sum(-1, keepdims=True)
                error = np.abs(weights @ v - contexts[i]).max()
                # float32 model arithmetic vs float64 from the float32 dump: observed 1.5e-7, 2.2e-7.
                print(f"layer {i}: max |exact attention from dump - module's attention| = {error:.2e}")
                if not error < 1e-5:
                    print("FAILED: the dump does not reproduce the module's attention")
                    failures += 1
    failures += check_decode_dumps(binary)
    print(f"{3 + layers - failures} passed, {failures} failed")
    return 1 if failures else 0


def check_decode_dumps(binary):
    """write(last=W) of a causal grouped-query model: the last W query rows with the whole cache, in each
    container; attnprobe measures those rows (queries=dump, n = the cache), and softmax over keys 0..t at
    the bottom-right positions t = N - W + i, computed from the dump, is the model's own attention output
    of those rows. Returns the number of failures."""
    torch.manual_seed(1)
    heads, kv_heads, head_dim, n, batch, last = 4, 2, 8, 41, 2, 5
    model = CharLM(vocab_size=20, layers=1, heads=heads, head_dim=head_dim, kv_heads=kv_heads, causal=True).eval()
    tokens = torch.randint(0, 20, (batch, n))
    contexts = {}
    hook = model.blocks[0].attn.context.register_forward_hook(
        lambda _m, _i, out: contexts.__setitem__(0, out.detach().double().numpy()))
    spec = dump_qkv.LayerSpec(q="blocks.0.attn.rotary:0", k="blocks.0.attn.rotary:1", v="blocks.0.attn.v")
    captured = dump_qkv.capture(model, lambda: model(tokens), [spec], heads=heads, kv_heads=kv_heads)
    hook.remove()
    want = contexts[0][:, :, -last:]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in ("hdf5", "safetensors", "npz"):
            path = os.path.join(tmp, f"decode.{fmt}")
            dump_qkv.write(captured, path, scale=1 / math.sqrt(head_dim), causal=1, dtype="float32", fmt=fmt,
                           last=last)
            csv = os.path.join(tmp, f"decode-{fmt}.csv")
            run = subprocess.run([binary, "eval", path, "-e", "softmax", "-e", "vmean", "--metrics", "spec_rel", "-q",
                                  "-o", csv], capture_output=True, text=True)
            if run.returncode != 0:
                print(f"FAILED: attnprobe eval of the {fmt} decode dump:", run.stderr)
                failures += 1
                continue
            with open(csv) as f:
                rows = [line.split(",") for line in f.read().splitlines()[1:]]
            # n = the cache (41 keys), mask causal, queries = the dump's own rows.
            if not rows or any(r[4] != str(n) or r[6] != "causal" or r[7] != "dump" for r in rows):
                print(f"FAILED: the {fmt} decode dump's rows are not n={n}, causal, dump: {rows[:2]}")
                failures += 1
        with h5py.File(os.path.join(tmp, "decode.hdf5")) as f:
            g = f["layer_00"]
            q, k, v = (g[name][()].astype(np.float64) for name in ("q", "k", "v"))
        group = heads // kv_heads
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        logits = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head_dim)  # [B, H, W, N]
        positions = n - last + np.arange(last)
        logits[..., np.arange(n)[None, :] > positions[:, None]] = -np.inf
        weights = np.exp(logits - logits.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        outputs = {"numpy": weights @ v}
        try:  # attnprobe's own exact decode of each slice, where the Python package is built (PYTHONPATH)
            import attnprobe
            outputs["attnprobe"] = np.stack([np.stack([
                attnprobe.exact(*attnprobe.load(os.path.join(tmp, "decode.hdf5"), 0, h, b)[:4], mask="causal")
                for h in range(heads)]) for b in range(batch)])
        except ImportError:
            print("note: the attnprobe Python package is not on PYTHONPATH; checked the dump with numpy only")
        for name, output in outputs.items():
            error = np.abs(output - want).max() / np.abs(want).max()
            # float32 model arithmetic vs float64 from the float32 dump: observed 1.4e-7 for both.
            print(f"decode dump (last {last} of {n}): max relative |{name} exact attention - module's| = {error:.2e}")
            if not (q.shape == (batch, heads, last, head_dim) and error <= 1e-5):
                print(f"FAILED: {name} on the decode dump ({q.shape}) does not reproduce the module's last rows")
                failures += 1
    return failures


if __name__ == "__main__":
    sys.exit(main())
