"""pytest of score shaping (docs/dumps.md, "Score shaping"): an additive bias, ALiBi slopes and a logit soft-cap.

exact() against numpy written from the definition; the refusal of estimators that cannot honour shaping; two small
torch models built here with fixed seeds, an ALiBi model (its bias passed to scaled_dot_product_attention as a float
attn_mask, causal, as Hugging Face's Bloom/MPT code does) and a Gemma-2-style soft-capped one (c·tanh(S/c) written
out, captured with hooks), each captured, validated against the model's own attention output, written to the three
containers and read back by the CLI and by load(as_slice=True). Skipped without torch where torch is needed.
"""
import math
import os
import subprocess

import numpy as np
import pandas as pd
import pytest

import attnprobe

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (Debian: python3-torch)")
SOURCE = os.environ.get("ATTNPROBE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BINARY = os.environ.get("ATTNPROBE", os.path.join(SOURCE, "build", "attnprobe"))


def shaped_attention(q, k, v, scale, causal, bias=None, slope=0.0, cap=None, bias_first=False):
    """float64 numpy attention of one head from the definition: S = scale·q kᵀ; b = bias + slope·(j − t_i);
    logits c·tanh(S/c) + b (c·tanh((S + b)/c) when bias_first), or S + b without a cap; queries at the last
    positions (bottom-right)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    n, m = q.shape[0], k.shape[0]
    s = scale * q @ k.T
    t = np.arange(m - n, m)[:, None]
    b = (0.0 if bias is None else np.asarray(bias, np.float64)) + slope * (np.arange(m)[None, :] - t)
    if cap is None:
        logits = s + b
    else:
        logits = cap * np.tanh((s + b) / cap) if bias_first else cap * np.tanh(s / cap) + b
    if causal:
        logits = np.where(np.arange(m)[None, :] > t, -np.inf, logits)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


def relative(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


# ---- exact() and the refusals ---------------------------------------------------------------------------------

@pytest.mark.parametrize("rows", [1, 7, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_exact_with_bias_alibi_and_softcap_matches_the_definition(rows, causal):
    rng = np.random.default_rng(5)
    keys, p = 97, 32
    q, k, v = 1.5 * rng.standard_normal((rows, p)), 1.5 * rng.standard_normal((keys, p)), rng.standard_normal((keys, p))
    bias = 2 * rng.standard_normal((rows, keys))
    scale = 1 / math.sqrt(p)
    for shaping in (dict(bias=bias), dict(alibi_slope=0.25), dict(softcap=2.0),
                    dict(bias=bias, alibi_slope=0.0625, softcap=1.5),
                    dict(bias=bias, softcap=1.5, bias_before_softcap=True)):
        want = shaped_attention(q, k, v, scale, causal, shaping.get("bias"), shaping.get("alibi_slope", 0.0),
                                shaping.get("softcap"), shaping.get("bias_before_softcap", False))
        mask = "causal" if causal else "full"
        got = attnprobe.exact(q, k, v, scale, mask=mask, **shaping)
        assert relative(got, want) < 1e-12  # observed ≤ 9.9e-16
        f32 = attnprobe.exact(q, k, v, scale, mask=mask, dtype=np.float32, **shaping)
        assert relative(f32, want) < 2e-6  # observed ≤ 4.0e-7 (logits of a few units)
        # The same through a Slice, and the softmax estimator (float32) through estimate().
        s = attnprobe.Slice(q, k, v, scale, mask=mask, **shaping)
        assert np.array_equal(attnprobe.exact(s), got)
        assert relative(attnprobe.estimate("softmax", s), want) < 2e-6  # the float32 kernel: as f32 above
        assert relative(attnprobe.exact(q, k, v, scale, mask=mask), want) > 1e-3  # the shaping mattered


def test_a_bias_row_broadcasts_and_bad_shaping_is_refused():
    rng = np.random.default_rng(6)
    q, k, v = rng.standard_normal((4, 8)), rng.standard_normal((10, 8)), rng.standard_normal((10, 8))
    per_key = rng.standard_normal(10)
    assert np.array_equal(attnprobe.exact(q, k, v, bias=per_key),
                          attnprobe.exact(q, k, v, bias=np.tile(per_key, (4, 1))))
    with pytest.raises(ValueError, match="does not broadcast to n_q x n_k"):
        attnprobe.exact(q, k, v, bias=np.zeros((3, 10)))
    with pytest.raises(ValueError, match="must be finite"):
        attnprobe.exact(q, k, v, bias=np.full((4, 10), np.nan))
    with pytest.raises(ValueError, match="softcap=-1"):
        attnprobe.exact(q, k, v, softcap=-1.0)
    with pytest.raises(ValueError, match="ALiBi is a bias by distance"):
        attnprobe.exact(q, k, v, cross=True, alibi_slope=0.5)
    # An estimator that estimates softmax(s·QKᵀ) from q and k alone is refused, naming those that can.
    with pytest.raises(ValueError, match="Estimators that honour it: softmax, topk, topp"):
        attnprobe.estimate("performer(M=8)", q, k, v, alibi_slope=0.5)
    with pytest.raises(ValueError, match="a Slice carries its geometry and score shaping"):
        attnprobe.exact(attnprobe.Slice(q, k, v), softcap=2.0)
    shaped = {e["name"] for e in attnprobe.estimators() if e["shaping"]}
    assert shaped == {"softmax", "topk", "topp"}


# ---- models with shaping ----------------------------------------------------------------------------------------

def alibi_slopes(heads):
    """The ALiBi paper's geometric slopes 2^(−8h/H), h = 1..H."""
    return torch.tensor([2 ** (-8 * (h + 1) / heads) for h in range(heads)])


class AlibiAttention(nn.Module):
    """Causal attention with ALiBi, the bias handed to scaled_dot_product_attention as a float attn_mask (0 or −inf
    for the causal part plus m_h·(j − i)), as Bloom/MPT code does."""

    def __init__(self, d_model=32, heads=4):
        super().__init__()
        self.heads, self.head_dim = heads, d_model // heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, self.heads, self.head_dim).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        distance = torch.arange(n)[None, :] - torch.arange(n)[:, None]  # j − i
        bias = alibi_slopes(self.heads)[:, None, None] * distance[None].float()
        bias = bias.masked_fill(distance[None] > 0, float("-inf"))[None]  # [1, H, N, N]
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.o_proj(context.transpose(1, 2).reshape(b, n, -1))


class SoftcapAttention(nn.Module):
    """Gemma-2-style attention written out: logits c·tanh(S/c), causal, softmax; identity modules mark q, k and the
    per-head output for capture's hooks."""

    def __init__(self, d_model=32, heads=4, cap=2.0):
        super().__init__()
        self.heads, self.head_dim, self.cap = heads, d_model // heads, cap
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.q_out, self.k_out, self.v_out = nn.Identity(), nn.Identity(), nn.Identity()
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, self.heads, self.head_dim).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        q, k, v = self.q_out(q), self.k_out(k), self.v_out(v)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        scores = self.cap * torch.tanh(scores / self.cap)
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        context = torch.softmax(scores, -1) @ v
        return self.o_proj(context.transpose(1, 2).reshape(b, n, -1))


def per_head_output(module, x):
    """The model's own per-head attention output [B, H, N, P] (o_proj's input), float64."""
    seen = []
    handle = module.o_proj.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().double()))
    with torch.no_grad():
        module(x)
    handle.remove()
    o = seen[0]
    return o.view(o.shape[0], o.shape[1], module.heads, -1).transpose(1, 2).numpy()


@needs_torch
@pytest.mark.parametrize("fmt", ["hdf5", "safetensors", "npz"])
def test_alibi_model_captures_its_bias_and_round_trips_through_each_container(sdpa, tmp_path, fmt):
    if fmt == "hdf5":
        pytest.importorskip("h5py")
    torch.manual_seed(7)
    model, x = AlibiAttention().eval(), torch.randn(2, 24, 32)
    want = per_head_output(model, x)
    layers = attnprobe.capture(model, x)
    layer = layers["layer_00"]
    assert layer.causal == 1 and layer.bias is not None and layer.bias.shape == (1, 4, 24, 24)
    # Validation applied the bias: observed 6.8e-8; without it this head is 0.046 off (checked next).
    assert layer.error < 1e-5
    assert relative(shaped_attention(layer.q[1, 2], layer.k[1, 2], layer.v[1, 2], layer.scale, True), want[1, 2]) > 1e-2
    path = tmp_path / f"alibi.{ {'hdf5': 'h5'}.get(fmt, fmt)}"
    layers.write(path)
    # The dump's own exact attention is the model's attention output (observed 6.4e-8 in each container).
    s = attnprobe.load(path, layer=0, head=2, batch=1, as_slice=True)
    assert s.causal and s.bias is not None
    assert relative(attnprobe.exact(s), want[1, 2]) < 1e-5
    with pytest.raises(ValueError, match="as_slice=True"):
        attnprobe.load(path, layer=0, head=2, batch=1)
    csv = tmp_path / "eval.csv"
    run = subprocess.run([BINARY, "eval", str(path), "-e", "softmax", "--metrics", "fro_rel", "-q", "-o", str(csv)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert pd.read_csv(csv)["value"].max() < 1e-5  # float32 against the shaped float64 reference: mean 6.7e-8
    refused = subprocess.run([BINARY, "eval", str(path), "-e", "performer", "-q", "-o", str(tmp_path / "p.csv")],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "an additive bias" in refused.stderr


@needs_torch
def test_softcapped_model_validates_only_with_its_cap_declared(tmp_path):
    torch.manual_seed(8)
    model, x = SoftcapAttention(cap=2.0).eval(), 2 * torch.randn(2, 20, 32)
    want = per_head_output(model, x)
    hooks = [attnprobe.LayerSpec(q="q_out", k="k_out", v="v_out", out="o_proj")]
    with pytest.raises(attnprobe.CaptureError, match=r"soft-cap \(Gemma 2: pass softcap=c\)"):
        attnprobe.capture(model, x, hooks=hooks, heads=4)
    layers = attnprobe.capture(model, x, hooks=hooks, heads=4, softcap=2.0)
    layer = layers["layer_00"]
    assert layer.causal == 1 and layer.softcap == 2.0 and layer.error < 1e-5  # observed 6.8e-8 (0.25 uncapped)
    path = tmp_path / "softcap.safetensors"
    layers.write(path)
    s = attnprobe.load(path, layer=0, head=1, batch=0, as_slice=True)
    assert s.softcap == 2.0 and relative(attnprobe.exact(s), want[0, 1]) < 1e-5
    # A sweep of the captured layers in memory measures the shaped attention, as the CLI does on the file.
    df = attnprobe.sweep(layers, ["softmax"], metrics=["fro_rel"])
    assert len(df) == 8 and df["value"].max() < 1e-5  # observed 9.8e-8
    with pytest.raises(ValueError, match="a soft-cap of 2"):
        attnprobe.sweep(layers, ["performer(M=8)"])
