"""pytest of a selection's kept sets below float32 (docs/precision.md, "Selection below float32") against a numpy
ranking written from that section: each score s·q·k is a float64 sum of the rounded inputs, stored through float32
into bf16/f16 (precision_emulation.round_to), ranked by (stored score descending, index ascending); the float32
case ranks the float64 scores of the inputs as stored. The CLI's kept_overlap_f32, score_ties and cut_ties of topk on
real heads (../shared/data, skipped without it) are then the emulation's to 1e-12.

Why the same keys and not nearly: a head-dim-8 dot product of bf16 or f16 values is exact in float64 (products of
8- or 11-bit mantissas, eight of them), so the order of the sum cannot show; only the one multiplication by the
scale rounds, the same way in both.
"""
import os
import subprocess

import numpy as np
import pandas as pd
import pytest

import attnprobe
from precision_emulation import round_to

SOURCE = os.environ.get("ATTNPROBE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BINARY = os.environ.get("ATTNPROBE", os.path.join(SOURCE, "build", "attnprobe"))
SHARED_DATA = os.environ.get("ATTNPROBE_SHARED_DATA", os.path.join(SOURCE, "..", "shared", "data"))
KEEP = 32
ROWS = 64  # --queries last:64 of a 512-token causal slice


def ranking(scores):
    """The indices of scores, best first: score descending, then index ascending (the older key wins a tie)."""
    return np.lexsort((np.arange(len(scores)), -scores))


def emulated_metrics(q, k, scale, precision):
    """kept_overlap_f32, score_ties and cut_ties of topk(k=KEEP) on the last ROWS causal rows, from the definitions."""
    n = len(k)
    q_r = round_to(q.astype(np.float32), precision).astype(np.float64)
    k_r = round_to(k.astype(np.float32), precision).astype(np.float64)
    overlap, tied, ranked, cuts = 0.0, 0, 0, 0
    for t in range(n - ROWS, n):
        seen = t + 1
        exact = scale * (k[:seen].astype(np.float64) @ q[t].astype(np.float64))
        stored = round_to((scale * (k_r[:seen] @ q_r[t])).astype(np.float32), precision).astype(np.float64)
        kept_f32 = set(ranking(exact)[:KEEP].tolist())
        order = ranking(stored)
        kept = set(order[:KEEP].tolist())
        overlap += len(kept & kept_f32) / len(kept | kept_f32)
        _, inverse, counts = np.unique(stored, return_inverse=True, return_counts=True)
        tied += int((counts[inverse] > 1).sum())
        ranked += seen
        cuts += int(stored[order[KEEP - 1]] == stored[order[KEEP]])
    return {"kept_overlap_f32": overlap / ROWS, "score_ties": tied / ranked, "cut_ties": cuts / ROWS}


@pytest.mark.parametrize("layer,head", [(0, 1), (2, 5), (4, 7)])
def test_cli_kept_sets_below_float32_equal_the_emulation(layer, head, tmp_path):
    dump = os.path.join(SHARED_DATA, "stories260K.h5")
    if not os.path.exists(dump):
        pytest.skip(f"{dump} is absent (the shared dumps of ../shared/data/README.md)")
    csv = tmp_path / "eval.csv"
    run = subprocess.run([BINARY, "eval", dump, "-e", f"topk(k={KEEP})", "--layers", str(layer), "--heads", str(head),
                          "--batch", "0", "--mask", "causal", "--queries", f"last:{ROWS}", "--precision", "bf16,f16",
                          "--metrics", "kept_overlap_f32,score_ties,cut_ties", "-q", "-o", str(csv)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    rows = pd.read_csv(csv, float_precision="round_trip")
    q, k, _, scale, _ = attnprobe.load(dump, layer, head, 0)
    for precision in ["bf16", "f16"]:
        want = emulated_metrics(q, k, scale, precision)
        got = rows[rows["precision"] == precision].set_index("metric")["value"]
        for name, value in want.items():
            # Observed on these heads: kept_overlap_f32 0.987-0.993 in bf16 (0.999-1 in f16), score_ties 0.58-0.66
            # (0.12-0.16), cut_ties 0.06-0.16 (0-0.016); letting the newer key win a tie moves layer 2 head 5's bf16
            # overlap from 0.9915 to 0.9886, so the tie rule is what this compares.
            assert abs(got[name] - value) < 1e-12, (precision, name, got[name], value)
        # The case exercises ties: without them the comparison above would be of zeros.
        if precision == "bf16":
            assert want["score_ties"] > 0
