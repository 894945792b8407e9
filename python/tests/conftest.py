"""Fixtures shared by the package's tests.

``sdpa``: torch.nn.functional.scaled_dot_product_attention, with a plain-torch stand-in installed for the test where
torch has none (Debian's torch 1.13), so the tests of capture() and substitute() that wrap it run on every torch.
"""
import math

import pytest

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the package needs no torch; the tests that do are skipped
    torch = None


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """torch 2's scaled_dot_product_attention in plain torch (bool masks: True takes part; float masks add)."""
    scores = (query @ key.transpose(-2, -1)) * (scale if scale is not None else 1 / math.sqrt(query.shape[-1]))
    if is_causal:
        n, m = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(n, m, dtype=torch.bool).triu(1), float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    return F.dropout(torch.softmax(scores, dim=-1), dropout_p) @ value


@pytest.fixture
def sdpa(monkeypatch):
    """F.scaled_dot_product_attention, the polyfill where torch has none (test-only; undone after the test)."""
    if torch is None:
        pytest.skip("torch is not installed (Debian: python3-torch)")
    if not hasattr(F, "scaled_dot_product_attention"):
        monkeypatch.setattr(F, "scaled_dot_product_attention", _sdpa, raising=False)
    return F.scaled_dot_product_attention


@pytest.fixture(scope="module")
def sdpa_module():
    """The ``sdpa`` fixture for fixtures of module scope (a model trained once per module)."""
    if torch is None:
        pytest.skip("torch is not installed (Debian: python3-torch)")
    with pytest.MonkeyPatch.context() as patch:
        if not hasattr(F, "scaled_dot_product_attention"):
            patch.setattr(F, "scaled_dot_product_attention", _sdpa, raising=False)
        yield F.scaled_dot_product_attention
