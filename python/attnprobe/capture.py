"""attnprobe.capture: the q, k and v a live PyTorch model's attention multiplies, checked against the model's own
attention output, as :class:`attnprobe.Layer` objects that write any dump container or sweep in memory.

    >>> import attnprobe, torch
    >>> layers = attnprobe.capture(model.eval(), tokens)          # finds SDPA calls and nn.MultiheadAttention
    >>> layers["layer_00"].q.shape, layers["layer_00"].error      # [B, H, N, P]; validation's error
    ((1, 8, 256, 64), 2.1e-07)
    >>> layers.write("model.safetensors")                         # attnprobe info / eval / sweep read it
    >>> df = attnprobe.sweep(layers, ["performer(M=64)"], trials=4)

How attention is found (``hooks=None``):
  - every call of ``torch.nn.functional.scaled_dot_product_attention`` during the forward pass is one layer,
    numbered in call order: its q, k, v exactly as passed (after RoPE, as the model computed them), its
    ``is_causal``, ``attn_mask`` and ``scale``, and its output (validation's reference). Code that bound the
    function to another name before the call (``from torch.nn.functional import scaled_dot_product_attention``
    at import time) is not seen: name its modules with ``hooks``. K/V repeated to the query heads before the call
    (Llama's ``repeat_kv``) are stored once per kv head.
  - every ``nn.MultiheadAttention`` module: capture splits its packed in-projection itself (q, k, v per head,
    ``batch_first`` either way) and reads the per-head attention output before ``out_proj`` by running the
    module's own forward once more with ``out_proj`` set to the identity.
With ``hooks=[LayerSpec(q=..., k=..., v=..., out=...)]``: forward hooks on the named modules, one LayerSpec
per layer (see :class:`LayerSpec`).
Torch is imported only when capture runs; ``import attnprobe`` needs no torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from typing import Any, Callable, List, Mapping, Optional, Sequence

import numpy as np

from .containers import Layer, Layers, as_frequencies, as_numpy, check_layer, head_bias

TOLERANCE = 1e-3  # relative Frobenius error above which a capture is refused (float32 models land near 1e-7)

_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_MHA_ARGS = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask", "average_attn_weights",
             "is_causal")


class CaptureError(RuntimeError):
    """A captured layer is not what the model's attention computed (``layer``: its name, e.g. "layer_03";
    ``error``: the relative Frobenius error of exact attention of the captured q, k, v against the model's own
    attention output, or None when the capture could not be made), or the model's attention cannot be written as
    a dump (an additive bias, padding, dropout). The message says the likely cause and what to do."""

    def __init__(self, message: str, layer: Optional[str] = None, error: Optional[float] = None):
        super().__init__(message)
        self.layer, self.error = layer, error


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """The modules of one attention layer, for ``capture(..., hooks=[LayerSpec(...), ...])``.

    ``q``, ``k``, ``v``: names (as in ``model.named_modules()``) of the modules whose outputs are what attention
    multiplies: q ``[B, N, H·P]`` (or ``[B, H, N, P]``), k and v ``[B, N, Hkv·P]`` (or ``[B, Hkv, N, P]``); add
    ":i" to take element i of a module that returns a tuple (a rotary module returning (q, k): ":0", ":1").
    For a rotary model these must be the modules after RoPE: hooks on ``q_proj``/``k_proj`` see q and k before
    it, and validation refuses them. ``out``: the module whose *input* is the per-head attention output before
    the output projection (``o_proj`` in Llama code), what validation compares against; "" for none.

        >>> spec = attnprobe.LayerSpec(q="layers.0.attn.rope:0", k="layers.0.attn.rope:1",
        ...                            v="layers.0.attn.v_proj", out="layers.0.attn.o_proj")
    """

    q: str
    k: str
    v: str
    out: str = ""


def capture(model, inputs, *, hooks: Optional[Sequence[LayerSpec]] = None, heads: Optional[int] = None,
            kv_heads: Optional[int] = None, scale: Optional[float] = None, causal: Optional[bool] = None,
            softcap: Optional[float] = None, validate: bool = True, gradients: bool = False,
            rope_inv_freq=None) -> Layers:
    """Runs ``model`` once on ``inputs`` and returns what its attention multiplied, layer by layer.

    ``inputs``: a tensor (``model(inputs)``), a tuple of positional arguments (``model(*inputs)``), a dict of
    keyword arguments (``model(**inputs)``) or a callable ``f(model)`` that runs the forward pass.
    ``hooks``: None finds attention by itself (module docstring), or one :class:`LayerSpec` per layer.
    ``heads`` and ``kv_heads``: H and Hkv, needed to split ``[B, N, H·P]`` hook outputs (kv_heads defaults to
    heads); with ``hooks=None`` they are checked against what the model passed. Grouped-query K/V keep their Hkv
    heads (query head h reads kv head h // (H / Hkv)).
    ``scale``, ``causal``: override what the model's calls say (``hooks=None``); with hooks, ``scale``
    defaults to 1/sqrt(P) and ``causal=None`` takes whichever of full or causal attention reproduces the
    model's output (validate=False then needs it given).
    ``validate``: exact attention (float64) of each captured layer against the model's own attention output;
    a relative Frobenius error above 1e-3 raises :class:`CaptureError` naming the layer, the error and the
    likely cause (q/k before RoPE, the scale, the mask, a soft-cap not declared).
    ``softcap``: the model's logit soft-cap c (scores c·tanh(S/c), Gemma 2), which no call shows: declared here, it
    is applied in validation and written with the layers (attribute ``softcap``).
    ``gradients``: also keep ``dy``, the gradient of the scalar loss that ``inputs(model)`` returns with respect
    to each layer's attention output (the gradient metrics read it; not for nn.MultiheadAttention).
    ``rope_inv_freq``: the rotary embedding's inverse frequencies [P/2] (``rotate_half`` pairing, Hugging Face's
    ``model.model.rotary_emb.inv_freq``), one vector for every layer or a list of one per captured layer (models
    whose layers use different bases); kept with each layer and written with the root attribute rope_layout =
    "half", for ``expected(stats=rope)``. Not checked against the model (the captured q and k are rotated already):
    give the frequencies the model rotates by, with the inputs starting at position 0.

    Returns :class:`attnprobe.Layers`, a mapping "layer_00" → :class:`attnprobe.Layer` (q, k, v as numpy
    ``[B, H, N, P]`` in the model's float type, bfloat16 widened to float32; ``scale``, ``causal``, ``bias``
    (the finite part of an additive float ``attn_mask``: ALiBi, relative position buckets; [B|1, H|1, N, M] float64,
    or None), ``softcap``, ``out`` the model's attention output, ``error`` validation's error, ``origin``), with
    ``.write(path, format=...)``. A padding mask and attention dropout (training mode: call ``model.eval()``)
    raise :class:`CaptureError`.

        >>> layers = attnprobe.capture(llama.eval(), input_ids)               # SDPA calls, post-RoPE
        >>> layers = attnprobe.capture(llama.eval(), input_ids, rope_inv_freq=llama.model.rotary_emb.inv_freq)
        >>> layers = attnprobe.capture(model, batch, hooks=[attnprobe.LayerSpec(
        ...     q=f"layers.{i}.rope:0", k=f"layers.{i}.rope:1", v=f"layers.{i}.v_proj",
        ...     out=f"layers.{i}.o_proj") for i in range(4)], heads=8, kv_heads=2)
        >>> layers.write("llama.h5")
    """
    import torch

    if heads is not None and heads < 1 or kv_heads is not None and kv_heads < 1:
        raise ValueError(f"heads and kv_heads must be positive, got {heads} and {kv_heads}")
    if heads is not None and kv_heads is not None and heads % kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} kv heads")
    if softcap is not None and not (isinstance(softcap, (int, float)) and math.isfinite(softcap) and softcap > 0):
        raise ValueError(f"softcap={softcap!r}: the model's cap c > 0 (scores c*tanh(S/c)), or None")
    if hooks is not None:
        records = _capture_hooks(torch, model, inputs, list(hooks), heads, kv_heads, gradients)
    else:
        records = _capture_auto(torch, model, inputs, gradients)
    frequencies = _frequencies_per_layer(rope_inv_freq, len(records))
    layers = Layers()
    for index, record in enumerate(records):
        name = f"layer_{index:02d}"
        layers[name] = _finish(torch, name, record, heads, kv_heads, scale, causal, softcap, validate,
                               hooks is not None)
        if frequencies is not None:
            layers[name].rope_inv_freq = frequencies[index]
            check_layer(layers[name], name)
    return layers


def _frequencies_per_layer(rope_inv_freq, count: int) -> Optional[list]:
    """capture()'s ``rope_inv_freq`` as one float64 vector per captured layer, or None."""
    if rope_inv_freq is None:
        return None
    if isinstance(rope_inv_freq, (list, tuple)):
        if len(rope_inv_freq) != count:
            raise ValueError(f"rope_inv_freq gives {len(rope_inv_freq)} vectors for the {count} layers captured: give "
                             "one per layer, or one vector for all of them")
        vectors = list(rope_inv_freq)
    else:
        vectors = [rope_inv_freq] * count
    return [as_frequencies(x) for x in vectors]


# ---- running the model ------------------------------------------------------------------------------------------

def _run(model, inputs):
    """One forward pass of ``model`` on ``inputs`` as capture() takes them (module docstring)."""
    import torch

    if torch.is_tensor(inputs):
        return model(inputs)
    if isinstance(inputs, tuple):
        return model(*inputs)
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if callable(inputs):
        return inputs(model)
    raise TypeError(f"inputs must be a tensor, a tuple of arguments, a dict of keyword arguments or a callable "
                    f"f(model), got {type(inputs).__name__}")


@contextlib.contextmanager
def _unfused(torch, avoid_fast_path: bool):
    """No gradients, and (``avoid_fast_path``) torch kept from running nn.MultiheadAttention and
    nn.TransformerEncoderLayer as one fused kernel that never calls the module's forward: switched off where
    torch can (torch.backends.mha), else by leaving autograd on, which that path refuses (the graph is dropped
    unused)."""
    mha = getattr(torch.backends, "mha", None)
    if avoid_fast_path and hasattr(mha, "set_fastpath_enabled"):
        before = mha.get_fastpath_enabled()
        mha.set_fastpath_enabled(False)
        try:
            with torch.no_grad():
                yield
        finally:
            mha.set_fastpath_enabled(before)
    else:
        with torch.enable_grad() if avoid_fast_path else torch.no_grad():
            yield


def _has_mha(torch, model) -> bool:
    return any(isinstance(m, torch.nn.MultiheadAttention) for m in model.modules())


def _forward(torch, model, inputs, gradients: bool, avoid_fast_path: bool = False):
    """Runs the forward pass (and the loss's backward with gradients), unfused (see _unfused)."""
    if not gradients:
        with _unfused(torch, avoid_fast_path):
            _run(model, inputs)
        return
    with torch.enable_grad():
        loss = _run(model, inputs)
        if not torch.is_tensor(loss) or loss.dim() != 0:
            raise ValueError("gradients=True: inputs must be a callable f(model) that returns the scalar loss to "
                             "backpropagate")
        loss.backward()


@dataclasses.dataclass
class _Record:
    origin: str
    q: Any = None  # torch tensors as captured
    k: Any = None
    v: Any = None
    out: Any = None  # the model's per-head attention output [B, H, N, Pv], or a hook's raw tensor
    scale: Optional[float] = None
    causal: Optional[bool] = None
    dy: Any = None
    calls: dict = dataclasses.field(default_factory=dict)  # hooks: how often each role's module ran
    bias: Optional[np.ndarray] = None  # [B|1, H|1, N, M] float64: the finite part of a float attn_mask


def _arguments(names: Sequence[str], args: tuple, kwargs: dict) -> dict:
    bound = dict(zip(names, args))
    bound.update(kwargs)
    return bound


class _Interception:
    """What _intercept saw: ``ran`` (names of nn.Transformer*Layer modules whose forward ran), ``mha_seen``
    (names of nn.MultiheadAttention modules whose forward ran) and ``has_sdpa`` (torch has
    scaled_dot_product_attention to wrap)."""

    def __init__(self, has_sdpa: bool):
        self.ran, self.mha_seen, self.has_sdpa, self.inside_mha = set(), set(), has_sdpa, 0

    def check_unfused(self) -> None:
        """A transformer layer that ran without its attention's forward ran torch's fused kernel: its attention
        was neither seen nor replaced, and the layer numbering is off."""
        for name in sorted(self.ran):
            attention = (name + "." if name else "") + "self_attn"
            if attention not in self.mha_seen:
                raise CaptureError(f"the transformer layer '{name}' ran as torch's fused kernel, which never calls "
                                   "its self_attn, so its attention was not seen: let its parameters require grad "
                                   "(or use a torch with torch.backends.mha.set_fastpath_enabled) and run again")
        self.ran.clear()
        self.mha_seen.clear()


@contextlib.contextmanager
def _intercept(torch, model, on_sdpa: Callable, on_mha: Callable):
    """Routes every attention of ``model`` through callbacks while the block runs, and restores the model and
    torch exactly afterwards: ``on_sdpa(original, bound_arguments, args, kwargs)`` replaces each call of
    torch.nn.functional.scaled_dot_product_attention (not those nn.MultiheadAttention makes itself), and
    ``on_mha(module, name, original_forward, args, kwargs)`` each nn.MultiheadAttention.forward. Both return
    what the call returns. capture() records through it; substitute() replaces heads through it. Yields an
    :class:`_Interception`."""
    F = torch.nn.functional
    original_sdpa = getattr(F, "scaled_dot_product_attention", None)
    seen = _Interception(original_sdpa is not None)

    def sdpa(*args, **kwargs):
        if seen.inside_mha:  # nn.MultiheadAttention's own SDPA call belongs to that module's layer
            return original_sdpa(*args, **kwargs)
        return on_sdpa(original_sdpa, _arguments(_SDPA_ARGS, args, kwargs), args, kwargs)

    def mha_forward(module, name, original, *args, **kwargs):
        seen.mha_seen.add(name)
        seen.inside_mha += 1
        try:
            return on_mha(module, name, original, args, kwargs)
        finally:
            seen.inside_mha -= 1

    patched, handles = [], []
    try:
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.MultiheadAttention):
                patched.append((module, module.__dict__.get("forward")))
                module.forward = functools.partial(mha_forward, module, name, module.forward)
            if isinstance(module, (torch.nn.TransformerEncoderLayer, torch.nn.TransformerDecoderLayer)):
                handles.append(module.register_forward_pre_hook(lambda _m, _a, name=name: seen.ran.add(name)))
        if original_sdpa is not None:
            F.scaled_dot_product_attention = sdpa
        yield seen
    finally:
        if original_sdpa is not None:
            F.scaled_dot_product_attention = original_sdpa
        for module, own in patched:
            if own is None:
                del module.forward
            else:
                module.forward = own
        for handle in handles:
            handle.remove()


def _no_attention_error(torch, has_sdpa: bool) -> CaptureError:
    where = "" if has_sdpa else f" (torch {torch.__version__} has no scaled_dot_product_attention)"
    return CaptureError("found no attention: the forward pass called no torch.nn.functional."
                        f"scaled_dot_product_attention{where} and ran no nn.MultiheadAttention. Name the modules "
                        "of each layer with hooks=[attnprobe.LayerSpec(q=..., k=..., v=..., out=...)]")


def _capture_auto(torch, model, inputs, gradients: bool) -> List[_Record]:
    records: List[_Record] = []

    def on_sdpa(original, a, args, kwargs):
        output = original(*args, **kwargs)
        records.append(_sdpa_record(torch, len(records), a, output, gradients))
        return output

    def on_mha(module, name, original, args, kwargs):
        index = len(records)
        if gradients:
            raise CaptureError(f"layer_{index:02d} (nn.MultiheadAttention '{name}'): gradients=True cannot reach "
                               "nn.MultiheadAttention's per-head output (it is never a tensor of its own); capture "
                               "dy with hooks on a model that exposes it", f"layer_{index:02d}")
        result, record, _ = _mha_parts(torch, module, name, index, original, args, kwargs)
        records.append(record)
        return result

    with _intercept(torch, model, on_sdpa, on_mha) as seen:
        _forward(torch, model, inputs, gradients, avoid_fast_path=_has_mha(torch, model))
    seen.check_unfused()
    if not records:
        raise _no_attention_error(torch, seen.has_sdpa)
    return records


def _sdpa_record(torch, index: int, a: dict, output, gradients: bool) -> _Record:
    origin = f"scaled_dot_product_attention call {index}"
    if float(a.get("dropout_p", 0.0) or 0.0) > 0:
        raise CaptureError(f"layer_{index:02d} ({origin}): dropout_p={a['dropout_p']}: attention dropout is on, so "
                           "the model's output is random. Call model.eval() (or pass dropout_p=0) before capture",
                           f"layer_{index:02d}")
    q, k, v = a["query"], a["key"], a["value"]
    if q.dim() == 3:  # [H, N, P]: one batch item
        q, k, v, output = q[None], k[None], v[None], output[None]
    if q.dim() != 4:
        raise CaptureError(f"layer_{index:02d} ({origin}): q has shape {tuple(a['query'].shape)}; capture reads "
                           "[B, H, N, P] or [H, N, P]", f"layer_{index:02d}")
    n, m = q.shape[2], k.shape[2]
    causal, bias = _mask_kind(torch, a.get("attn_mask"), n, m, allowed_when_true=True,
                              where=f"layer_{index:02d} ({origin})")
    if a.get("is_causal"):
        if n != m:
            raise CaptureError(f"layer_{index:02d} ({origin}): is_causal=True with {n} queries and {m} keys: torch "
                               "aligns that mask top-left, attnprobe bottom-right (decode). Capture the prefill, "
                               "where queries and keys are the same tokens", f"layer_{index:02d}")
        causal = True
    record = _Record(origin, q, k, v, output, a.get("scale"), causal, bias=bias)
    if gradients and output.requires_grad:
        output.register_hook(lambda grad: setattr(record, "dy", grad))
    return record


def _mha_parts(torch, module, name, index, original, args, kwargs):
    """Runs nn.MultiheadAttention's own forward (``original``) and returns (its result unchanged, the layer's
    _Record: q, k, v and the per-head output before out_proj as [B, H, N, P], and ``layout``, which takes a
    per-head output [B, H, N, P] back to the [B, N, E] / [N, B, E] / [N, E] that out_proj reads)."""
    a = _arguments(_MHA_ARGS, args, kwargs)
    where = f"layer_{index:02d} (nn.MultiheadAttention '{name}')"
    if module.training and module.dropout > 0:
        raise CaptureError(f"{where}: dropout={module.dropout} in training mode makes the output random: call "
                           "model.eval() before capture", f"layer_{index:02d}")
    if module.bias_k is not None or module.add_zero_attn:
        raise CaptureError(f"{where}: add_bias_kv/add_zero_attn append keys that are not projections of the input; "
                           "a dump cannot say so", f"layer_{index:02d}")
    padding = a.get("key_padding_mask")
    if padding is not None and bool((padding != 0).any()):
        raise CaptureError(f"{where}: key_padding_mask hides keys: capture sequences without padding (one at a "
                           "time, or equal lengths)", f"layer_{index:02d}")
    result = original(*args, **kwargs)
    # The per-head output before out_proj, computed by the module's own code: out_proj as the identity.
    with torch.no_grad():
        weight, bias = module.out_proj.weight, module.out_proj.bias
        saved = weight.detach().clone(), None if bias is None else bias.detach().clone()
        try:
            weight.copy_(torch.eye(weight.shape[0], dtype=weight.dtype, device=weight.device))
            if bias is not None:
                bias.zero_()
            context = original(*args, **kwargs)[0]
        finally:
            weight.copy_(saved[0])
            if bias is not None:
                bias.copy_(saved[1])
    with torch.no_grad():
        F = torch.nn.functional
        e, h = module.embed_dim, module.num_heads
        p = e // h
        if module._qkv_same_embed_dim:
            wq, wk, wv = module.in_proj_weight.chunk(3)
        else:
            wq, wk, wv = module.q_proj_weight, module.k_proj_weight, module.v_proj_weight
        bq, bk, bv = (None, None, None) if module.in_proj_bias is None else module.in_proj_bias.chunk(3)
        unbatched = a["query"].dim() == 2

        def batch_first(x):  # -> [B, N, features]; unbatched inputs are [N, features] whatever batch_first says
            return x[None] if unbatched else x if module.batch_first else x.transpose(0, 1)

        def heads_of(x):  # [B, N, H·P] -> [B, H, N, P]
            return x.reshape(x.shape[0], x.shape[1], h, -1).transpose(1, 2)

        q = heads_of(F.linear(batch_first(a["query"]), wq, bq))
        k = heads_of(F.linear(batch_first(a["key"]), wk, bk))
        v = heads_of(F.linear(batch_first(a["value"]), wv, bv))
        out = heads_of(batch_first(context))
    mask = a.get("attn_mask")
    causal, bias = _mask_kind(torch, mask, q.shape[2], k.shape[2], allowed_when_true=False, where=where)
    if bias is not None:
        raise CaptureError(f"{where}: a float attn_mask with values other than 0 and -inf (an attention bias) on "
                           "nn.MultiheadAttention: capture biases where the model calls scaled_dot_product_attention, "
                           "or name the modules with hooks", where.split(" ")[0])
    if mask is None and a.get("is_causal"):
        causal = q.shape[2] == k.shape[2] or None
        if causal is None:
            raise CaptureError(f"{where}: is_causal=True with a different number of queries and keys",
                               f"layer_{index:02d}")

    def layout(heads):  # [B, H, N, P] -> what out_proj reads in this call
        x = heads.transpose(1, 2).reshape(heads.shape[0], heads.shape[2], -1)
        return x[0] if unbatched else x if module.batch_first else x.transpose(0, 1)

    return result, _Record(f"nn.MultiheadAttention '{name}'", q, k, v, out, 1 / math.sqrt(p), causal), layout


def _mask_kind(torch, mask, n: int, m: int, allowed_when_true: bool, where: str) -> tuple:
    """(causal, bias) of an attention mask: causal True for a causal pattern of hidden keys (query i sees keys
    j <= i + m - n, bottom-right), False for none; bias the finite values of a float mask (hidden keys set to 0)
    as float64 [B|1, H|1, n, m], or None when they are all 0. Hidden keys in any other pattern (padding, a window,
    one per batch item) are a CaptureError."""
    if mask is None:
        return False, None
    x = mask.detach().cpu()
    bias = None
    if x.dtype == torch.bool:
        allowed = x.numpy() if allowed_when_true else ~x.numpy()
    else:
        values = x.float().numpy() if x.dtype == torch.bfloat16 else x.numpy()
        floor = float(torch.finfo(x.dtype).min) / 2  # Hugging Face writes "masked" as finfo(dtype).min
        hidden = np.isneginf(values) | (values <= floor)
        allowed = ~hidden
        if not np.all(hidden | (values == 0)):
            # An additive bias (ALiBi, relative position buckets): kept as the dump's layer_NN/bias.
            finite = np.where(hidden, 0.0, values.astype(np.float64))
            finite = finite.reshape((1,) * (4 - finite.ndim) + finite.shape)
            bias = np.ascontiguousarray(np.broadcast_to(finite, finite.shape[:2] + (n, m)))
    allowed = np.broadcast_to(allowed, allowed.shape[:-2] + (n, m)).reshape(-1, n, m)
    causal_pattern = np.arange(m)[None, :] <= np.arange(n)[:, None] + (m - n)
    if np.all(allowed):
        return False, bias
    if np.all(allowed == causal_pattern[None]):
        return True, bias
    raise CaptureError(f"{where}: the attention mask is neither full nor causal (padding, a window or a pattern "
                       "per batch item): capture sequences without padding, one at a time, or pass the mask as "
                       "is_causal=True where it is causal", where.split(" ")[0])


# ---- forward hooks ----------------------------------------------------------------------------------------------

def _resolve(model, spec: str):
    name, _, index = spec.partition(":")
    modules = dict(model.named_modules())
    if name not in modules:
        near = [n for n in modules if n and n.split(".")[-1] == name.split(".")[-1]][:4]
        raise KeyError(f"model has no module {name!r}" + (f" (modules with that last name: {near})" if near else
                                                          " (see model.named_modules())"))
    return modules[name], (int(index) if index else None)


def _capture_hooks(torch, model, inputs, specs: List[LayerSpec], heads, kv_heads, gradients) -> List[_Record]:
    if not specs:
        raise ValueError("hooks=[] names no layer: give one LayerSpec per layer, or hooks=None")
    records = [_Record(f"hooks q={s.q!r}, k={s.k!r}, v={s.v!r}" + (f", out={s.out!r}" if s.out else ""))
               for s in specs]
    handles = []

    def keep(record, role, value):
        record.calls[role] = record.calls.get(role, 0) + 1
        setattr(record, role, value)

    try:
        for record, spec in zip(records, specs):
            for role in ("q", "k", "v"):
                module, index = _resolve(model, getattr(spec, role))

                def hook(_module, _inputs, output, record=record, role=role, index=index):
                    keep(record, role, output[index] if index is not None else output)

                handles.append(module.register_forward_hook(hook))
            if spec.out:
                module, _ = _resolve(model, spec.out)

                def pre_hook(_module, args, record=record):
                    keep(record, "out", args[0])
                    if gradients and args[0].requires_grad:
                        args[0].register_hook(lambda grad: setattr(record, "dy", grad))

                handles.append(module.register_forward_pre_hook(pre_hook))
        _forward(torch, model, inputs, gradients)
    finally:
        for handle in handles:
            handle.remove()
    for i, (record, spec) in enumerate(zip(records, specs)):
        for role in ("q", "k", "v") + (("out",) if spec.out else ()):
            calls = record.calls.get(role, 0)
            if calls != 1:
                raise CaptureError(f"layer_{i:02d}: module {getattr(spec, role)!r} ({role}) ran {calls} times in the "
                                   "forward pass; capture needs exactly one call per layer (run one forward pass, "
                                   "and name a module of this layer only)", f"layer_{i:02d}")
        if not heads and record.q.dim() == 3:
            raise ValueError(f"layer_{i:02d}: q is [B, N, H·P] = {tuple(record.q.shape)}: pass heads=H to split it")
    return records


def _split(x, heads: Optional[int], what: str, where: str):
    """[B, N, heads·P] -> [B, heads, N, P]; [B, H, N, P] as is."""
    if x.dim() == 4:
        if heads is not None and x.shape[1] != heads:
            raise CaptureError(f"{where}: {what} has {x.shape[1]} heads ({tuple(x.shape)} read as [B, H, N, P]), "
                               f"but heads/kv_heads says {heads}", where.split(" ")[0])
        return x
    if x.dim() == 3 and not heads:
        raise ValueError(f"{where}: {what} is [B, N, H·P] = {tuple(x.shape)}: pass heads=H (and kv_heads=Hkv for "
                         "grouped-query k and v) to split it")
    if x.dim() != 3:
        raise CaptureError(f"{where}: {what} has shape {tuple(x.shape)}; capture reads [B, N, H·P] or [B, H, N, P]",
                           where.split(" ")[0])
    if x.shape[-1] % heads:
        raise CaptureError(f"{where}: {what}'s last dimension {x.shape[-1]} does not split into {heads} heads",
                           where.split(" ")[0])
    return x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(1, 2)


# ---- from a record to a validated layer -------------------------------------------------------------------------

def _unrepeat(torch, k, v, kv_heads: Optional[int], where: str):
    """K/V repeated to the query heads before the call (repeat_kv) -> their Hkv distinct heads."""
    h = k.shape[1]
    if kv_heads is not None and kv_heads == h:
        return k, v
    candidates = [kv_heads] if kv_heads is not None else [g for g in range(1, h) if h % g == 0]
    for g in candidates:
        if h % g:
            break
        r = h // g
        ks, vs = k[:, ::r], v[:, ::r]
        if torch.equal(ks.repeat_interleave(r, dim=1), k) and torch.equal(vs.repeat_interleave(r, dim=1), v):
            return ks, vs
    if kv_heads is not None:
        raise CaptureError(f"{where}: k and v have {h} heads that are not {kv_heads} kv heads repeated "
                           f"{h // kv_heads if h % kv_heads == 0 else '?'} times each: check kv_heads",
                           where.split(" ")[0])
    return k, v


def _owned(x) -> Optional[np.ndarray]:
    """A numpy copy of a captured tensor (the writers' conversion; copied: the model may reuse its buffers)."""
    return None if x is None else np.array(as_numpy(x, "a captured tensor"))


def _exact_layer(q, k, v, scale: float, causal: bool, bias=None, softcap=None) -> np.ndarray:
    """Float64 exact attention of every (batch item, head): [B, H, N, Pv], by attnprobe's own reference, with the
    layer's bias [B|1, H|1, N, M] and soft-cap where given."""
    from . import exact

    b, h, n, _ = q.shape
    group = h // k.shape[1]
    out = np.empty((b, h, n, v.shape[-1]))
    for i in range(b):
        for j in range(h):
            out[i, j] = exact(q[i, j], k[i, j // group], v[i, j // group], scale, mask="causal" if causal else "full",
                              bias=head_bias(bias, i, j), softcap=softcap)
    return out


def _relative(estimate: np.ndarray, reference: np.ndarray) -> float:
    reference = reference.astype(np.float64)
    return float(np.linalg.norm(estimate - reference) / max(np.linalg.norm(reference), 1e-300))


def _finish(torch, name, record: _Record, heads, kv_heads, scale, causal, softcap, validate, hooked) -> Layer:
    where = f"{name} ({record.origin})"
    q = _split(record.q, heads, "q", where)
    kv = (kv_heads or heads) if hooked else None  # SDPA's k/v may arrive repeated: _unrepeat checks kv_heads
    k, v = _split(record.k, kv, "k", where), _split(record.v, kv, "v", where)
    if not hooked:
        k, v = _unrepeat(torch, k, v, kv_heads, where)
    h, g = q.shape[1], k.shape[1]
    if h % g or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1] or k.shape[:3] != v.shape[:3] \
            or q.shape[2] > k.shape[2]:
        raise CaptureError(f"{where}: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} (as [B, H, N, P]) "
                           "do not fit together: check heads/kv_heads and the modules named", name)
    out = None if record.out is None else _split(record.out, h, "out", where)
    dy = None if record.dy is None else _split(record.dy, h, "dy", where)
    qn, kn, vn, outn = (_owned(x) for x in (q, k, v, out))
    p = qn.shape[-1]
    used_scale = float(scale if scale is not None else record.scale if record.scale is not None else 1 / math.sqrt(p))
    masks = [bool(causal)] if causal is not None else [bool(record.causal)] if record.causal is not None else None
    error = None
    if validate:
        if outn is None:
            raise CaptureError(f"{where}: nothing to validate against: name LayerSpec.out (the module whose input is "
                               "the per-head attention output, e.g. o_proj), or pass validate=False", name)
        if outn.shape != (qn.shape[0], h, qn.shape[2], vn.shape[-1]):
            raise CaptureError(f"{where}: the attention output {outn.shape} is not [B, H, N, Pv] = "
                               f"{(qn.shape[0], h, qn.shape[2], vn.shape[-1])}: check LayerSpec.out", name)
        q64, k64, v64 = (x.astype(np.float64) for x in (qn, kn, vn))
        shaping = dict(bias=record.bias, softcap=softcap)
        errors = {c: _relative(_exact_layer(q64, k64, v64, used_scale, c, **shaping), outn)
                  for c in (masks or [False, True])}
        chosen = min(errors, key=errors.get)
        error = errors[chosen]
        if error > TOLERANCE:
            raise CaptureError(_diagnosis(where, error, q64, k64, v64, outn, used_scale, chosen, masks is None,
                                          hooked, shaping), name, error)
        masks = [chosen]
    elif masks is None:
        raise ValueError(f"{where}: with hooks and validate=False, say causal=True or causal=False (validation would "
                         "have told them apart)")
    return Layer(q=qn, k=kn, v=vn, scale=used_scale, causal=int(masks[0]), dy=_owned(dy), out=outn,
                 bias=record.bias, softcap=softcap, error=error, origin=record.origin)


def _diagnosis(where, error, q, k, v, out, scale, causal, mask_tried, hooked, shaping) -> str:
    """The refusal's message: the error, and the cause a cheap experiment points to."""
    text = (f"{where}: exact attention of the captured q, k, v is {error:.3g} (relative Frobenius) from the model's "
            f"own attention output (tolerance {TOLERANCE:g}; scale {scale:.6g}, "
            f"{'causal' if causal else 'full'} mask). ")
    if not mask_tried:
        other = _relative(_exact_layer(q, k, v, scale, not causal, **shaping), out)
        if other <= TOLERANCE:
            return text + (f"Likely cause: the mask: with a {'full' if causal else 'causal'} mask the error is "
                           f"{other:.2g}; pass causal={not causal}.")
    p = q.shape[-1]
    for candidate, label in ((1 / math.sqrt(p), "1/sqrt(P)"), (1.0, "1"), (1 / p, "1/P")):
        if not math.isclose(candidate, scale):
            other = _relative(_exact_layer(q, k, v, candidate, causal, **shaping), out)
            if other <= TOLERANCE:
                return text + (f"Likely cause: the scale: with scale {label} = {candidate:.6g} the error is "
                               f"{other:.2g}; pass scale={candidate:.9g}.")
    causes = ["q and k captured before the rotary position embedding (hooks on q_proj/k_proj): name the modules "
              "whose outputs are the rotated q and k, or let capture wrap scaled_dot_product_attention (hooks=None)"
              if hooked else "q and k are not what the softmax multiplied",
              "a logit soft-cap (Gemma 2: pass softcap=c)" if shaping["softcap"] is None else
              f"a soft-cap other than the softcap={shaping['softcap']:g} given",
              "an additive attention bias (ALiBi, relative position buckets) added outside "
              "scaled_dot_product_attention's attn_mask, which capture cannot see"]
    if hooked:
        causes.append("LayerSpec.out is not the per-head attention output before the output projection, or "
                      "heads/kv_heads split the tensors wrongly")
    return text + "Likely causes: " + "; ".join(causes) + ". Pass validate=False to keep the capture anyway."
