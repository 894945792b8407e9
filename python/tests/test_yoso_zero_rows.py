"""YOSO's zero rows are decided by the angle between a query and the keys, not by the head dim (plots/README.md,
YOSO Figure 8: stories260K's zero rows). A controlled synthetic case: every key is the same unit vector k̂ and every
query sits at angle θ from it, q_i = cos θ·k̂ + sin θ·w_i (w_i a random unit vector ⊥ k̂). A τ-bit SimHash puts a
query and a key in one bucket with probability (1 − θ/π)^τ whatever p is, so a row collides with no key in any of
m hashes — an all-zero output row — with probability (1 − (1 − θ/π)^τ)^m. The observed share of zero rows must
match that at p = 8 and p = 64 alike (40 trials of 64 rows each; the trials are the replicates).
"""
import math

import numpy as np
import pytest

import attnprobe


def zero_row_share(p: int, theta: float, m: int, tau: int = 8, trials: int = 40, n: int = 64):
    """Mean and standard error over trials of the share of yoso's output rows that are exactly zero."""
    rng = np.random.default_rng(3)
    k_hat = np.zeros(p)
    k_hat[0] = 1.0
    w = rng.standard_normal((n, p))
    w[:, 0] = 0.0
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    q = math.cos(theta) * k_hat + math.sin(theta) * w
    k, v = np.tile(k_hat, (n, 1)), rng.standard_normal((n, p))
    shares = [np.all(attnprobe.estimate(f"yoso(m={m},tau={tau})", q, k, v, trial=t) == 0, axis=1).mean()
              for t in range(trials)]
    return float(np.mean(shares)), float(np.std(shares, ddof=1) / math.sqrt(trials))


@pytest.mark.parametrize("theta", [math.pi / 8, math.pi / 4, math.pi / 2])
def test_zero_rows_follow_the_angle_not_the_head_dim(theta):
    m, tau = 8, 8
    want = (1 - (1 - theta / math.pi) ** tau) ** m  # 0.034, 0.430, 0.969
    (low_p, se_low), (high_p, se_high) = zero_row_share(8, theta, m), zero_row_share(64, theta, m)
    # Observed: p = 8: 0.037 ± 0.007, 0.444 ± 0.017, 0.975 ± 0.003; p = 64: 0.035 ± 0.006, 0.432 ± 0.015,
    # 0.973 ± 0.003 — within 2 standard errors of the formula, and of each other.
    print(f"theta {theta:.3f}: formula {want:.3f}, p=8 {low_p:.3f} ± {se_low:.3f}, p=64 {high_p:.3f} ± {se_high:.3f}")
    assert abs(low_p - want) <= 4 * se_low + 1e-3
    assert abs(high_p - want) <= 4 * se_high + 1e-3
    assert abs(low_p - high_p) <= 4 * math.hypot(se_low, se_high) + 1e-3
