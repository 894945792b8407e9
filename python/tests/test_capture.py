"""pytest of attnprobe.capture, the package's dump writers and sweeps of arrays in memory.

Small torch models built here with fixed seeds: nn.MultiheadAttention (batch_first both ways, full and causal), and
a Llama-style model (RoPE applied as a function, grouped-query attention H = 4, Hkv = 2, causal) captured (a) by
wrapping scaled_dot_product_attention, (b) by LayerSpec hooks on modules that output the rotated q/k, and
(c) refused when the hooks sit on q_proj/k_proj (before RoPE). Each round trip is checked against the model's
attention output recorded by the test itself, not by capture; written dumps are read back by the CLI.
Debian's torch 1.13 has no F.scaled_dot_product_attention: the ``sdpa`` fixture (conftest.py) installs a plain-torch
one there, so the wrapping path runs on every torch. Skipped without torch (the no-torch import test still runs).
"""
import math
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import attnprobe

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # the Python package itself needs no torch
    torch = None

if torch is not None:
    from torch_models import Llama, LlamaAttention, llama_and_tokens, rotate  # noqa: F401

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (Debian: python3-torch)")
SOURCE = os.environ.get("ATTNPROBE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BINARY = os.environ.get("ATTNPROBE", os.path.join(SOURCE, "build", "attnprobe"))


# ---- the models -------------------------------------------------------------------------------------------------

def attention_outputs(model, run):
    """The per-head attention output of every layer ([B, H, N, P], float64), recorded at o_proj's input by the
    test itself: the reference the round trips compare with."""
    outputs = {}
    handles = [layer.o_proj.register_forward_pre_hook(
        lambda _m, args, i=i: outputs.__setitem__(i, args[0].detach().double())) for i, layer in
        enumerate(model.layers)]
    with torch.no_grad():
        run()
    for h in handles:
        h.remove()
    return {i: o.view(o.shape[0], o.shape[1], model.layers[i].heads, -1).transpose(1, 2).numpy()
            for i, o in outputs.items()}


def softmax_attention(q, k, v, scale, causal):
    """float64 numpy attention of [B, H, N, P] q against [B, Hkv, M, P] k and v (grouped by repeat_kv)."""
    group = q.shape[1] // k.shape[1]
    k, v = (np.repeat(np.asarray(x, np.float64), group, axis=1) for x in (k, v))
    logits = scale * np.asarray(q, np.float64) @ k.transpose(0, 1, 3, 2)
    if causal:
        n, m = logits.shape[-2:]
        logits[..., np.arange(m)[None, :] > np.arange(n)[:, None] + (m - n)] = -np.inf
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)) @ v


def relative(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def llama_specs(model, pre_rope=False):
    return [attnprobe.LayerSpec(q=f"layers.{i}.q_proj" if pre_rope else f"layers.{i}.q_rot",
                                k=f"layers.{i}.k_proj" if pre_rope else f"layers.{i}.k_rot",
                                v=f"layers.{i}.v_proj", out=f"layers.{i}.o_proj") for i in range(len(model.layers))]


# ---- the Llama-style model --------------------------------------------------------------------------------------

@needs_torch
def test_llama_by_sdpa_wrapping_round_trips_post_rope_and_unrepeated(sdpa):
    model, tokens = llama_and_tokens()
    want = attention_outputs(model, lambda: model(tokens))
    layers = attnprobe.capture(model, tokens)
    assert list(layers) == ["layer_00", "layer_01"]
    assert F.scaled_dot_product_attention is sdpa  # put back after the forward pass
    for i, (name, layer) in enumerate(layers.items()):
        assert layer.q.shape == (2, 4, 40, 12) and layer.k.shape == (2, 2, 40, 12)  # GQA kept unrepeated
        assert layer.q.dtype == np.float32 and layer.causal == 1 and layer.bias is None
        assert layer.scale == pytest.approx(1 / math.sqrt(12)) and "scaled_dot_product_attention" in layer.origin
        error = relative(softmax_attention(layer.q, layer.k, layer.v, layer.scale, True), want[i])
        # float32 model arithmetic against float64 from its float32 q, k, v: observed 7.6e-8 and 7.4e-8 (seed 0).
        print(f"{name}: relative Frobenius error {error:.2e}, capture's own {layer.error:.2e}")
        assert error < 1e-5 and layer.error < 1e-5
    # Naming the heads checks them: the repeated k/v are 2 kv heads; 4 is no repeat of 1 or 3 heads.
    named = attnprobe.capture(model, tokens, heads=4, kv_heads=2)
    assert np.array_equal(named["layer_01"].k, layers["layer_01"].k)
    with pytest.raises(attnprobe.CaptureError, match="not 3 kv heads"):
        attnprobe.capture(model, tokens, kv_heads=3)
    with pytest.raises(attnprobe.CaptureError, match="heads/kv_heads says 8"):
        attnprobe.capture(model, tokens, heads=8)


@needs_torch
def test_llama_by_hooks_after_rope_equals_the_wrapped_capture(sdpa):
    model, tokens = llama_and_tokens()
    want = attention_outputs(model, lambda: model(tokens))
    wrapped = attnprobe.capture(model, tokens)
    hooked = attnprobe.capture(model, tokens, hooks=llama_specs(model), heads=4, kv_heads=2)
    for i, name in enumerate(hooked):
        layer = hooked[name]
        # causal=None with hooks: validation picked the mask that reproduces the model (causal here).
        assert layer.causal == 1 and layer.k.shape == (2, 2, 40, 12)
        for member in ("q", "k", "v"):  # the same tensors, by either route
            assert np.array_equal(getattr(layer, member), getattr(wrapped[name], member)), member
        error = relative(softmax_attention(layer.q, layer.k, layer.v, layer.scale, True), want[i])
        print(f"{name}: hooks after RoPE, relative error {error:.2e}")  # observed 7.6e-8, 7.4e-8
        assert error < 1e-5


@needs_torch
def test_llama_capture_keeps_the_rotary_frequencies_given_for_expected_stats_rope(sdpa, tmp_path):
    # The model rotates q and k by 10000^(-2f/12) (rotate_half pairing, positions from 0): given to capture, the
    # frequencies go with every layer (one vector for all, or one per layer), are written with the layers, and
    # expected(stats=rope) sweeps them; its rows after a prompt are what the CLI gives from the written file.
    model, tokens = llama_and_tokens()
    freq = torch.tensor(10000.0) ** (-torch.arange(0, 12, 2).float() / 12)
    layers = attnprobe.capture(model, tokens, rope_inv_freq=freq)
    for layer in layers.values():
        assert layer.rope_inv_freq.dtype == np.float64 and np.array_equal(layer.rope_inv_freq, freq.double().numpy())
    per_layer = attnprobe.capture(model, tokens, rope_inv_freq=[freq, freq / 2])
    assert np.array_equal(per_layer["layer_01"].rope_inv_freq, (freq / 2).double().numpy())
    with pytest.raises(ValueError, match="gives 3 vectors for the 2 layers captured"):
        attnprobe.capture(model, tokens, rope_inv_freq=[freq] * 3)
    with pytest.raises(ValueError, match="must be 6 floats"):
        attnprobe.capture(model, tokens, rope_inv_freq=freq[:4])
    layers.write(tmp_path / "llama.safetensors")
    spec = "expected(budget=8,sink=2,future=8,stats=rope)"
    mine = attnprobe.sweep(layers, [spec], queries="last:8", mask="causal", trials=1, metrics="spec_rel")
    out = tmp_path / "llama.csv"
    subprocess.run([BINARY, "sweep", str(tmp_path / "llama.safetensors"), "-e", spec, "--queries", "last:8", "--mask",
                    "causal", "--trials", "1", "--metrics", "spec_rel", "-q", "-o", str(out)], check=True)
    theirs = attnprobe.read_csv(out)
    assert len(mine) == 2 * 4 * 2 and np.array_equal(mine["value"].to_numpy(), theirs["value"].to_numpy())


@needs_torch
def test_llama_hooks_before_rope_are_refused_naming_the_layer(sdpa):
    model, tokens = llama_and_tokens()
    with pytest.raises(attnprobe.CaptureError) as caught:
        attnprobe.capture(model, tokens, hooks=llama_specs(model, pre_rope=True), heads=4, kv_heads=2)
    message = str(caught.value)
    print(message)
    assert caught.value.layer == "layer_00" and message.startswith("layer_00")
    assert "before the rotary position embedding" in message and "validate=False" in message
    # Pre-RoPE q/k give attention far from the model's: observed 0.19 (seed 0).
    assert caught.value.error > 1e-2
    # validate=False keeps it (the user's call), with the mask given since nothing measured it.
    kept = attnprobe.capture(model, tokens, hooks=llama_specs(model, pre_rope=True), heads=4, kv_heads=2,
                             causal=True, validate=False)
    assert kept["layer_00"].error is None and kept["layer_00"].causal == 1


@needs_torch
def test_capture_diagnoses_a_wrong_scale_and_a_wrong_mask(sdpa):
    model, tokens = llama_and_tokens()
    with pytest.raises(attnprobe.CaptureError, match=r"layer_00 .*Likely cause: the scale: with scale 1/sqrt\(P\)"):
        attnprobe.capture(model, tokens, scale=1.0)
    with pytest.raises(attnprobe.CaptureError, match="Likely cause: the mask: with a causal mask"):
        attnprobe.capture(model, tokens, hooks=llama_specs(model), heads=4, kv_heads=2, causal=False)


@needs_torch
def test_capture_keeps_a_bias_and_refuses_dropout_and_an_empty_model(sdpa):
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    bias = torch.randn(8, 8)  # an additive bias (relative buckets, ALiBi): kept as the layer's bias
    layers = attnprobe.capture(nn.Identity(), lambda m: F.scaled_dot_product_attention(q, k, v, attn_mask=bias))
    assert layers["layer_00"].causal == 0 and np.array_equal(layers["layer_00"].bias[0, 0], bias.double().numpy())
    causal = torch.zeros(8, 8).masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), float("-inf"))
    layers = attnprobe.capture(nn.Identity(), lambda m: F.scaled_dot_product_attention(q, k, v, attn_mask=causal))
    assert layers["layer_00"].causal == 1  # a 0/-inf float mask is the causal mask
    with pytest.raises(attnprobe.CaptureError, match="model.eval"):
        attnprobe.capture(nn.Identity(), lambda m: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1))
    with pytest.raises(attnprobe.CaptureError, match="found no attention"):
        attnprobe.capture(nn.Linear(4, 4), torch.randn(2, 4))


# ---- nn.MultiheadAttention --------------------------------------------------------------------------------------

@needs_torch
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_multihead_attention_round_trips(batch_first, causal):
    torch.manual_seed(2)
    embed, heads, n, batch = 32, 4, 24, 3
    mha = nn.MultiheadAttention(embed, heads, batch_first=batch_first).eval()
    x = torch.randn(batch, n, embed) if batch_first else torch.randn(n, batch, embed)
    mask = torch.ones(n, n, dtype=torch.bool).triu(1) if causal else None  # True: may not attend
    outputs = []
    handle = mha.register_forward_hook(lambda _m, _i, out: outputs.append(out[0].detach().double()))
    layers = attnprobe.capture(mha, lambda m: m(x, x, x, attn_mask=mask))
    handle.remove()
    layer = layers["layer_00"]
    assert layer.q.shape == (batch, heads, n, embed // heads) and layer.causal == int(causal)
    assert "MultiheadAttention" in layer.origin
    # The module's own final output: exact attention of the captured heads through out_proj, computed here.
    context = softmax_attention(layer.q, layer.k, layer.v, layer.scale, causal)  # [B, H, N, P]
    merged = context.transpose(0, 2, 1, 3).reshape(batch, n, embed)
    w, b = (t.detach().double().numpy() for t in (mha.out_proj.weight, mha.out_proj.bias))
    final = merged @ w.T + b
    want = outputs[0].numpy() if batch_first else outputs[0].numpy().transpose(1, 0, 2)
    error = relative(final, want)
    # observed 1.3e-7 .. 1.8e-7 over the four settings (seed 2); capture's own 9.9e-8 .. 1.3e-7.
    print(f"batch_first={batch_first} causal={causal}: relative error {error:.2e}, capture's {layer.error:.2e}")
    assert error < 1e-5 and layer.error < 1e-5


@needs_torch
def test_multihead_attention_in_a_model_and_its_refusals():
    torch.manual_seed(3)
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True), 2).eval()
    layers = attnprobe.capture(encoder, torch.randn(2, 10, 16))
    assert [layer.origin for layer in layers.values()] == ["nn.MultiheadAttention 'layers.0.self_attn'",
                                                          "nn.MultiheadAttention 'layers.1.self_attn'"]
    assert all(layer.error < 1e-5 for layer in layers.values())  # observed 8.1e-8 and 8.4e-8
    mha = nn.MultiheadAttention(16, 2, batch_first=True).eval()
    x = torch.randn(2, 10, 16)
    padding = torch.zeros(2, 10, dtype=torch.bool)
    padding[1, 7:] = True
    with pytest.raises(attnprobe.CaptureError, match="key_padding_mask"):
        attnprobe.capture(mha, lambda m: m(x, x, x, key_padding_mask=padding))
    with pytest.raises(attnprobe.CaptureError, match="bias"):
        attnprobe.capture(mha, lambda m: m(x, x, x, attn_mask=torch.randn(10, 10)))


# ---- writing and sweeping ----------------------------------------------------------------------------------------

@needs_torch
@pytest.mark.parametrize("fmt", ["hdf5", "safetensors", "npz"])
def test_written_dumps_are_read_by_the_cli(sdpa, tmp_path, fmt):
    if fmt == "hdf5":
        pytest.importorskip("h5py")
    model, tokens = llama_and_tokens()
    layers = attnprobe.capture(model, tokens)
    path = tmp_path / f"llama.{ {'hdf5': 'h5'}.get(fmt, fmt)}"
    layers.write(path, model="tiny llama", source="random tokens")
    info = subprocess.run([BINARY, "info", str(path)], capture_output=True, text=True)
    assert info.returncode == 0 and "all values finite" in info.stdout, info.stderr
    csv = tmp_path / "eval.csv"
    run = subprocess.run([BINARY, "eval", str(path), "-e", "softmax", "--metrics", "fro_rel", "-q", "-o", str(csv)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    rows = pd.read_csv(csv)
    assert len(rows) == 2 * 4 * 2 and set(rows["mask"]) == {"causal"} and set(rows["n"]) == {40}
    # The float32 kernel against the float64 reference on the dump: observed at most 9.1e-8 in each container.
    print(f"{fmt}: max fro_rel of softmax {rows['value'].max():.2e}")
    assert rows["value"].max() < 1e-5
    # The dump's own exact attention (attnprobe.load, float64) is the model's attention output.
    want = attention_outputs(model, lambda: model(tokens))
    q, k, v, scale, causal = attnprobe.load(path, layer=1, head=3, batch=1)
    # Observed 7.6e-8 in each container.
    assert causal and relative(attnprobe.exact(q, k, v, scale, causal=True), want[1][1, 3]) < 1e-5


@needs_torch
def test_sweep_of_captured_layers_equals_the_cli_on_the_written_file(sdpa, tmp_path):
    model, tokens = llama_and_tokens()
    layers = attnprobe.capture(model, tokens)
    path = tmp_path / "llama.safetensors"
    layers.write(path)
    specs = ["performer(M=16)", "softmax", "vmean"]
    memory = attnprobe.sweep(layers, specs, trials=3, seed=5, lengths=[16, 40], threads=2)
    csv = tmp_path / "cli.csv"
    args = [BINARY, "sweep", str(path), "--trials", "3", "--seed", "5", "--lengths", "16,40", "-q", "-o", str(csv)]
    subprocess.run(args + [a for s in specs for a in ("-e", s)], check=True, capture_output=True)
    cli = attnprobe.read_csv(csv)
    assert set(memory["dump"]) == {"memory"} and set(cli["dump"]) == {"llama.safetensors"}
    left, right = memory.drop(columns="dump"), cli.drop(columns="dump")
    assert len(left) == len(right) > 0
    pd.testing.assert_frame_equal(left.reset_index(drop=True), right.reset_index(drop=True), check_exact=True)


def test_sweep_of_arrays_in_memory_equals_the_cli(tmp_path):
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 2, 32, 8)) for _ in range(3))  # float64, kept float64
    source = {"layer_00": (q, k, v), "layer_02": attnprobe.Layer(q=q[:, :, -4:], k=k, v=v, causal=1)}
    memory = attnprobe.sweep(source, ["performer(M=8)"], trials=2, seed=1, metrics="spec_rel,fro_rel",
                             name="arrays")
    path = tmp_path / "arrays.npz"
    attnprobe.write_dump(path, source)
    csv = tmp_path / "cli.csv"
    subprocess.run([BINARY, "sweep", str(path), "-e", "performer(M=8)", "--trials", "2", "--seed", "1", "--metrics",
                    "spec_rel,fro_rel", "-q", "-o", str(csv)], check=True, capture_output=True)
    cli = attnprobe.read_csv(csv)
    assert set(memory["dump"]) == {"arrays"} and sorted(set(memory["layer"])) == [0, 2]
    pd.testing.assert_frame_equal(memory.drop(columns="dump"), cli.drop(columns="dump"), check_exact=True)
    # A Slice is a source too: one head, its own scale and mask.
    one = attnprobe.Slice(q[0, 1], k[0, 1], v[0, 1], 0.3, mask="causal")
    rows = attnprobe.sweep({"layer_05": one}, ["softmax"], metrics="fro_rel")
    assert list(rows["layer"]) == [5] and list(rows["mask"]) == ["causal"]
    # With output, the arrays are kept beside the CSV, which the CLI can resume from.
    out = tmp_path / "kept.csv"
    attnprobe.sweep(source, ["vmean"], output=out, metrics="fro_rel")
    assert os.path.exists(f"{out}.dump.safetensors")
    with pytest.raises(FileExistsError):
        attnprobe.sweep(source, ["vmean"], output=tmp_path / "kept.csv", metrics="fro_rel")
    with pytest.raises(ValueError, match="differ"):
        attnprobe.sweep({"layer_00": (q + 1, k, v)}, ["vmean"], output=out, resume=True, metrics="fro_rel")


def test_import_attnprobe_needs_no_torch():
    code = ("import sys; sys.modules['torch'] = None\nimport attnprobe\ntry:\n    attnprobe.capture(None, None)\n"
            "except ImportError:\n    print('capture needs torch')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(attnprobe.__file__))})
    assert run.returncode == 0 and run.stdout.strip() == "capture needs torch", run.stderr
