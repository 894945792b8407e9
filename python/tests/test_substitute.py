"""pytest of attnprobe.substitute and attnprobe.loss_delta.

Models built here with fixed seeds: the Llama-style causal GQA model of torch_models.py (through the wrapped
scaled_dot_product_attention, and through LayerSpec hooks), trained for a few seconds on a repeated-sequence task
so that its attention matters to its loss, and a causal language model of nn.MultiheadAttention layers. What a
substituted head outputs is read back by attnprobe.capture inside the context and compared, bit for bit, with
attnprobe.estimate on the q, k, v of the CLI's case. Skipped without torch.
"""
import math
import statistics

import numpy as np
import pytest

import attnprobe

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # the package needs no torch
    torch = None

if torch is not None:
    from torch_models import Llama, llama_and_tokens

pytestmark = pytest.mark.skipif(torch is None, reason="torch is not installed (Debian: python3-torch)")

VOCAB = 50


class MHALanguageModel(nn.Module):
    """Embedding, two causal nn.MultiheadAttention layers with residuals, a vocabulary head."""

    def __init__(self, d_model=32, heads=4, layers=2, batch_first=True):
        super().__init__()
        self.batch_first = batch_first
        self.embed = nn.Embedding(VOCAB, d_model)
        self.position = nn.Parameter(torch.randn(64, d_model) * 0.3)
        self.attention = nn.ModuleList(nn.MultiheadAttention(d_model, heads, batch_first=batch_first)
                                       for _ in range(layers))
        self.head = nn.Linear(d_model, VOCAB)

    def forward(self, tokens):
        n = tokens.shape[1]
        x = self.embed(tokens) + self.position[:n]
        mask = torch.ones(n, n, dtype=torch.bool).triu(1)  # True = hidden: causal
        for attention in self.attention:
            y = x if self.batch_first else x.transpose(0, 1)
            out = attention(y, y, y, attn_mask=mask, need_weights=False)[0]
            x = x + (out if self.batch_first else out.transpose(0, 1))
        return self.head(x)


def repeated_sequences(generator, batch, n=40, period=8):
    """Token sequences that repeat a random block of ``period`` tokens: after the first block every next token is
    predictable by attending to the token one period back, so a trained model's loss needs its attention."""
    block = torch.randint(0, VOCAB, (batch, period), generator=generator)
    tokens = block.repeat(1, n // period + 1)[:, :n + 1]
    return tokens[:, :-1], tokens[:, 1:]


def next_token_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def trained(model, steps=300, seed=0):
    """``model`` trained on repeated_sequences (fixed seed), in eval mode."""
    g = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = next_token_loss(model, repeated_sequences(g, 16))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def held_out(count=3, seed=123):
    g = torch.Generator().manual_seed(seed)
    return [repeated_sequences(g, 4) for _ in range(count)]


@pytest.fixture(scope="module")
def trained_llama(sdpa_module):
    torch.manual_seed(0)
    return trained(Llama(vocab=VOCAB))


@pytest.fixture(scope="module")
def trained_mha():
    torch.manual_seed(0)
    return trained(MHALanguageModel())


def logits(model, tokens):
    with torch.no_grad():
        return model(tokens)


def estimate_of(layer, index, head, batch, spec, seed, trial=0):
    """attnprobe.estimate on the captured q, k, v of (layer, head, batch) with the CLI's case for it."""
    g = layer.q.shape[1] // layer.k.shape[1]
    return attnprobe.estimate(spec, layer.q[batch, head], layer.k[batch, head // g], layer.v[batch, head // g],
                              layer.scale, seed=seed, trial=trial, case={"layer": index, "head": head, "batch": batch},
                              mask="causal" if layer.causal else "full")


# ---- the substituted heads are the estimator's, with the CLI's draws ------------------------------------------

@pytest.mark.parametrize("kind", ["sdpa", "mha"])
def test_substituted_heads_equal_estimate_bit_for_bit(sdpa, kind):
    model, tokens = llama_and_tokens() if kind == "sdpa" else (MHALanguageModel().eval(), llama_and_tokens()[1])
    spec, seed, heads = "performer(M=4)", 7, [0, 3]
    before = attnprobe.capture(model, tokens)
    with attnprobe.substitute(model, layer="layer_01", head=heads, estimator=spec, seed=seed) as s:
        # capture inside the context reads what the substituted model computes (validate=False: it differs)
        during = attnprobe.capture(model, tokens, validate=False)
        logits(model, tokens)  # a plain pass: .cases lists its substituted cases
    inside = during["layer_01"]
    # layer_00 is untouched, so layer_01 sees the same q, k, v as without the substitution
    for name in ("q", "k", "v"):
        assert np.array_equal(getattr(before["layer_01"], name), getattr(inside, name))
    assert np.array_equal(before["layer_00"].out, during["layer_00"].out)
    for b in range(tokens.shape[0]):
        for h in range(inside.q.shape[1]):
            if h in heads:
                expected = estimate_of(inside, 1, h, b, spec, seed)
                assert np.array_equal(inside.out[b, h], expected), (b, h)  # bit for bit
            else:
                assert np.array_equal(inside.out[b, h], before["layer_01"].out[b, h]), (b, h)
    mask = "causal"
    n = tokens.shape[1]
    assert s.cases[:2] == [attnprobe.case_id(1, 0, 0, n, spec, mask=mask), attnprobe.case_id(1, 0, 1, n, spec,
                                                                                              mask=mask)]
    assert len(s.cases) == len(heads) * tokens.shape[0]


def test_hooks_path_equals_the_wrapped_path(sdpa):
    model, tokens = llama_and_tokens()
    specs = [attnprobe.LayerSpec(q=f"layers.{i}.q_rot", k=f"layers.{i}.k_rot", v=f"layers.{i}.v_proj",
                                 out=f"layers.{i}.o_proj") for i in range(2)]
    options = dict(layer="all", head=[1, 2], estimator="streaming(sink=2,window=6)", seed=3)
    with attnprobe.substitute(model, **options):
        wrapped = logits(model, tokens)
    with attnprobe.substitute(model, hooks=specs, heads=4, kv_heads=2, **options):
        hooked = logits(model, tokens)
    assert np.array_equal(wrapped.numpy(), hooked.numpy())
    assert not np.array_equal(wrapped.numpy(), logits(model, tokens).numpy())  # the substitution did something


# ---- Δloss -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["sdpa", "mha"])
def test_exact_substitution_leaves_the_loss_to_rounding(sdpa, kind, trained_llama, trained_mha):
    model = trained_llama if kind == "sdpa" else trained_mha
    report = attnprobe.loss_delta(model, held_out(), next_token_loss, layer="all", head="all", estimator="softmax")
    # observed: Δloss 6.0e-8 (sdpa) and 4.0e-8 (mha), float32 rounding of a loss near 0.8
    assert abs(report.deltas[0]) < 1e-5, report
    assert report.interval is None and len(report.losses) == 1


@pytest.mark.parametrize("kind", ["sdpa", "mha"])
def test_degraded_estimator_raises_the_loss_reproducibly(sdpa, kind, trained_llama, trained_mha):
    model = trained_llama if kind == "sdpa" else trained_mha
    batches = held_out()
    options = dict(layer=[0, 1], head="all", estimator="performer(M=4)")
    first = attnprobe.loss_delta(model, batches, next_token_loss, seeds=(0, 1), **options)
    again = attnprobe.loss_delta(model, batches, next_token_loss, seeds=(0,), **options)
    # Observed baseline losses 0.790 (sdpa) and 0.882 (mha): trained, the repeats are predicted (untrained: ln 50 = 3.9).
    assert first.baseline_loss < 2.0, first
    # Observed Δloss +4.455, +4.726 (sdpa) and +2.925, +3.045 (mha) for seeds 0 and 1.
    assert all(d > 0.1 for d in first.deltas), first
    assert again.deltas[0] == first.deltas[0]  # same seed: the same draws, the same loss
    assert first.deltas[0] != first.deltas[1]  # another seed draws anew
    # The 95% interval over two seeds, from the table: mean ± t(0.975, 1 dof) · sd / sqrt(2), t = 12.7062
    # (observed [2.867, 6.314] for sdpa).
    lo, hi = first.interval
    half = 12.706204736 * statistics.stdev(first.deltas) / math.sqrt(2)
    assert lo == pytest.approx(first.mean - half, rel=1e-9) and hi == pytest.approx(first.mean + half, rel=1e-9)
    assert "Δloss" in str(first) and "seed 1" in str(first)


# ---- the model is restored; bad arguments ----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["sdpa", "mha"])
def test_the_model_is_unchanged_after_the_context(sdpa, kind):
    model, tokens = llama_and_tokens() if kind == "sdpa" else (MHALanguageModel().eval(), llama_and_tokens()[1])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    function = F.scaled_dot_product_attention
    before = logits(model, tokens)
    with attnprobe.substitute(model, layer=0, head="all", estimator="vmean"):
        changed = logits(model, tokens)
    after = logits(model, tokens)
    assert not torch.equal(before, changed)
    assert torch.equal(before, after)  # bit for bit
    assert F.scaled_dot_product_attention is function
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    for module in model.modules():
        assert "forward" not in module.__dict__ and not module._forward_hooks and not module._forward_pre_hooks


def test_bad_arguments_say_what_to_do(sdpa):
    model, tokens = llama_and_tokens()
    with pytest.raises(ValueError, match=r"layer_00 has 4 heads \(0..3\)"):
        with attnprobe.substitute(model, layer=0, head=4, estimator="vmean"):
            logits(model, tokens)
    with pytest.raises(ValueError, match=r"ran 2 attention layers .*pick one of those"):
        with attnprobe.substitute(model, layer="layer_05", head=0, estimator="vmean"):
            logits(model, tokens)
    with pytest.raises(ValueError, match=r"layer_01 is causal, and 'informer' has no causal form.*substitute one "
                                         r"of softmax"):
        with attnprobe.substitute(model, layer=1, head=0, estimator="informer"):
            logits(model, tokens)
    with pytest.raises(ValueError, match="unknown estimator 'bogus'"):
        attnprobe.substitute(model, layer=0, head=0, estimator="bogus(M=3)")
    with pytest.raises(ValueError, match="give a layer as an index"):
        attnprobe.substitute(model, layer="first", head=0, estimator="vmean")
    with pytest.raises(ValueError, match="give a head index"):
        attnprobe.substitute(model, layer=0, head=-1, estimator="vmean")
    with pytest.raises(ValueError, match=r"hooks name 1 layers"):
        attnprobe.substitute(model, layer=1, head=0, estimator="vmean", hooks=[attnprobe.LayerSpec(
            q="layers.0.q_rot", k="layers.0.k_rot", v="layers.0.v_proj", out="layers.0.o_proj")])
    # hooks before RoPE: validation (causal=None) refuses them, naming the layer
    pre_rope = [attnprobe.LayerSpec(q=f"layers.{i}.q_proj", k=f"layers.{i}.k_proj", v=f"layers.{i}.v_proj",
                                    out=f"layers.{i}.o_proj") for i in range(2)]
    with pytest.raises(attnprobe.CaptureError, match="layer_00.*before the rotary"):
        with attnprobe.substitute(model, layer=0, head=0, estimator="vmean", hooks=pre_rope, heads=4, kv_heads=2):
            logits(model, tokens)
    with pytest.raises(ValueError, match="seeds is empty"):
        attnprobe.loss_delta(model, [tokens], next_token_loss, layer=0, head=0, estimator="vmean", seeds=())
    # the errors left the model as it was
    assert "forward" not in model.__dict__ and not model._forward_hooks

