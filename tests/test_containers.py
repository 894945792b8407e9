#!/usr/bin/python3
"""Container round trips from Python (issue 14): the Q/K/V (and dy) that tools/dump_qkv.py captures from
a tiny random model, written in float32 as HDF5, safetensors and .npz (the package's attnprobe.write_dump), give
identical `attnprobe eval` CSVs; a grouped-query dump (H = 4, Hkv = 2) gives the same CSV as the dump
with K/V repeated to 4 heads; a bfloat16 safetensors dump is accepted and its bits widen exactly.

Run by CTest as `test_containers.py ATTNPROBE_BINARY` with the package on PYTHONPATH; exits 77 (skipped)
without torch, h5py (Debian: python3-torch, python3-h5py) or the package.
"""
import csv
import io
import math
import os
import subprocess
import sys
import tempfile

try:
    import h5py  # noqa: F401  (the HDF5 writer needs it)
    import numpy as np
    import torch
except ImportError as error:
    print(f"SKIPPED: {error} (install python3-torch and python3-h5py)")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tools"))  # the tools under test, not the package (PYTHONPATH)
try:
    from attnprobe import containers as dump_containers
except ImportError as error:
    print(f"SKIPPED: the attnprobe Python package is not on PYTHONPATH ({error})")
    sys.exit(77)
import dump_qkv  # noqa: E402
from train_charlm import CharLM  # noqa: E402


def eval_csv(binary, path, out):
    """`attnprobe eval` rows with the dump column blanked (it holds the file name)."""
    result = subprocess.run([binary, "eval", path, "-e", "softmax", "-e", "yoso(m=8)", "-e", "vmean",
                             "--trials", "2", "-q", "-o", out], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"attnprobe eval {path}: {result.stderr}")
    with open(out) as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        row.pop("dump", None)
    return rows


def main():
    binary = sys.argv[1]
    failures, checks = 0, 0

    def check(ok, what):
        nonlocal failures, checks
        checks += 1
        if not ok:
            failures += 1
            print("FAILED:", what)

    torch.manual_seed(0)
    layers, heads, head_dim, n, batch = 2, 3, 8, 29, 2
    model = CharLM(vocab_size=20, layers=layers, heads=heads, head_dim=head_dim)
    tokens = torch.randint(0, 20, (batch, n))
    specs = [dump_qkv.LayerSpec(q=f"blocks.{i}.attn.rotary:0", k=f"blocks.{i}.attn.rotary:1",
                                v=f"blocks.{i}.attn.v", out=f"blocks.{i}.attn.context") for i in range(layers)]
    loss = lambda: torch.nn.functional.cross_entropy(model(tokens).reshape(-1, 20), tokens.reshape(-1))
    captured = dump_qkv.capture(model, loss, specs, heads=heads)
    check(all(layer.dy is not None and layer.dy.shape == (batch, heads, n, head_dim) for layer in captured),
          "dy captured with shape [B, H, N, Pv]")
    check(all(np.abs(layer.dy).max() > 0 for layer in captured), "dy is not all zero")

    with tempfile.TemporaryDirectory() as tmp:
        rows = {}
        for fmt in dump_containers.FORMATS:
            path = os.path.join(tmp, f"tiny-{fmt}.dump")  # no telling extension: the reader sniffs magic bytes
            dump_qkv.write(captured, path, scale=1 / math.sqrt(head_dim), model="tiny", source="random",
                           dtype="float32", fmt=fmt)
            info = subprocess.run([binary, "info", path], capture_output=True, text=True)
            check(info.returncode == 0 and "all values finite" in info.stdout, f"attnprobe info {fmt}: {info.stderr}")
            rows[fmt] = eval_csv(binary, path, os.path.join(tmp, f"{fmt}.csv"))
        check(len(rows["hdf5"]) > 0, "eval wrote rows")
        check(rows["hdf5"] == rows["safetensors"], "safetensors eval CSV equals the HDF5 one")
        check(rows["hdf5"] == rows["npz"], "npz eval CSV equals the HDF5 one")

        # Grouped-query attention: H = 4 query heads over Hkv = 2 kv heads vs the same K/V repeated.
        rng = np.random.default_rng(7)
        q = rng.standard_normal((1, 4, 33, 8)).astype(np.float32)
        k = rng.standard_normal((1, 2, 33, 8)).astype(np.float32)
        v = rng.standard_normal((1, 2, 33, 5)).astype(np.float32)
        grouped = os.path.join(tmp, "gqa.safetensors")
        repeated = os.path.join(tmp, "repeated.h5")
        dump_containers.write_dump(grouped, [dump_containers.Layer(q=q, k=k, v=v, causal=1)], format="safetensors",
                                   dtype="float32")
        dump_containers.write_dump(repeated, [dump_containers.Layer(q=q, k=np.repeat(k, 2, axis=1),
                                                                    v=np.repeat(v, 2, axis=1), causal=1)],
                                   format="hdf5", dtype="float32")
        info = subprocess.run([binary, "info", grouped, "--no-check"], capture_output=True, text=True)
        check(info.returncode == 0 and " 4 " in info.stdout and " 2 " in info.stdout, f"info shows H, Hkv: {info}")
        check(eval_csv(binary, grouped, os.path.join(tmp, "g.csv")) ==
              eval_csv(binary, repeated, os.path.join(tmp, "r.csv")), "grouped and repeated K/V give the same CSV")

        # bfloat16: round to nearest even (as torch does), then widening back is exact.
        bf16 = os.path.join(tmp, "tiny-bf16.safetensors")
        dump_qkv.write(captured, bf16, fmt="safetensors", dtype="bfloat16")
        info = subprocess.run([binary, "info", bf16], capture_output=True, text=True)
        check(info.returncode == 0 and "bfloat16" in info.stdout, f"info of the bf16 dump: {info.stderr}")
        x = captured[0].q
        via_torch = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
        check(np.array_equal(dump_containers.bfloat16_to_float32(dump_containers.bfloat16_bits(x)), via_torch),
              "bf16 bits widen to torch's bfloat16 values")
    print(f"{checks - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
