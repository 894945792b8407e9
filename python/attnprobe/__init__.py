"""attnprobe: how far randomized estimators of softmax attention are from exact attention.

The same library as the ``attnprobe`` command line, from Python: the same estimators, random
draws, metrics, CSV schema and regression gate, and your own estimator measured beside them.

    >>> import attnprobe
    >>> q, k, v, scale, causal = attnprobe.load("data/synth-demo.h5", layer=0, head=0, batch=0, length=256)
    >>> exact = attnprobe.exact(q, k, v, scale)                   # float64 n x pv
    >>> approx = attnprobe.estimate("performer(M=64)", q, k, v, scale, seed=0)
    >>> attnprobe.metrics(exact, approx)["spec_rel"]
    >>> df = attnprobe.sweep("data/synth-demo.h5", ["performer(M=64)"], lengths=[256], trials=4,
    ...                      custom={"mine": my_estimator})       # rows with spec "py:mine" too
    >>> attnprobe.check(attnprobe.summarize(df), "baseline.csv").passed
    >>> step = attnprobe.estimate("performer(M=64)", q[-16:], k, v, scale, mask="causal")  # decode:
    >>> step.shape                                          # the last 16 queries against all 256 keys
    (16, 32)

Matrices are 2-D, one token per row (q: n_q x p, k: n_k x p, v: n_k x pv; n_q = n_k for
self-attention, fewer for a decode step, see exact()), numpy arrays of any float dtype or torch
tensors (CPU tensors are read without a copy). Errors: ``ValueError`` for usage (a bad spec,
option or shape), ``attnprobe.InputError`` (an ``OSError``) for files, both with the CLI's messages.
Functions: estimators, load, exact, estimate, reference, metrics, sweep, summarize, compare, check,
read_csv, write_csv, case_id, random_key; from a torch model: capture (with LayerSpec, CaptureError), the
dump writers write_dump, Layer, Layers, and substitute / loss_delta (an estimator in place of chosen heads, and
the change in loss it causes):

    >>> layers = attnprobe.capture(model.eval(), tokens)   # validated against the model's attention output
    >>> layers.write("model.safetensors")                  # for the CLI; or sweep it in memory:
    >>> df = attnprobe.sweep(layers, ["performer(M=64)"], trials=4)

See docs/python.md.
"""

from __future__ import annotations

import atexit
import io
import json
import math
import numbers
import os
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Optional, Sequence, Union

import numpy as np

from . import _core
from . import custom as _custom
from ._core import InputError
from .containers import Layer, Layers, as_frequencies, write_dump

__version__ = _core.__version__

# A sweep still running on a (daemon) thread when the interpreter exits is stopped after its running
# trials, and waited for, before Python finalizes: a thread inside the library then would be ended
# mid-call (Python 3.11 ends threads that ask for the GIL during finalization).
atexit.register(_core.stop_sweeps_at_exit)

__all__ = [
    "InputError", "EstimatorError", "CheckReport", "EstimateWithReference", "Slice", "estimators", "load", "exact", "estimate", "reference",
    "metrics", "sweep", "summarize", "compare", "check", "report", "read_csv", "write_csv", "case_id", "random_key", "metric_names", "round_to",
    "capture", "CaptureError", "LayerSpec", "Layer", "Layers", "write_dump", "substitute", "Substitution",
    "loss_delta", "LossDelta",
]



class EstimatorError(RuntimeError):
    """A custom estimator of :func:`sweep` failed: it raised, or returned a non-array, the wrong shape or
    NaN/Inf. ``case`` is the canonical case id (``layer=..;head=..;batch=..;n=..;spec=py:NAME``);
    ``trial`` and ``seed`` say which call. Rows of slices finished before it stay in ``output``."""

    def __init__(self, message: str, case: str, trial: Optional[int], seed: int):
        super().__init__(message)
        self.case, self.trial, self.seed = case, trial, seed


# ---- inputs -------------------------------------------------------------------------------------------

def _as_array(x: Any, name: str) -> np.ndarray:
    """numpy view of an array-like: torch tensors (detached; moved to the CPU; bfloat16 → float32),
    DLPack producers, ``__array__`` objects. No copy where the layout allows."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach") and hasattr(x, "numpy"):  # a torch tensor
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if str(t.dtype) == "torch.bfloat16":  # numpy has no bfloat16
            t = t.float()
        return t.numpy()
    if hasattr(x, "__dlpack__") and hasattr(np, "from_dlpack"):
        try:
            return np.from_dlpack(x)
        except (TypeError, BufferError, RuntimeError):
            pass
    if hasattr(x, "__array__"):
        return np.asarray(x)
    raise TypeError(f"{name} must be a numpy array or a torch tensor, got {type(x).__name__}")


def _matrices(q, k, v):
    return _as_array(q, "q"), _as_array(k, "k"), _as_array(v, "v")


def _mask_text(causal: bool, mask: Optional[str]) -> str:
    """The mask of a call: ``mask`` ("full", "causal" or "window:W"), with ``causal=True`` as the shorthand for
    "causal"; both given must agree."""
    if mask is None:
        return "causal" if causal else "full"
    if not isinstance(mask, str):
        raise TypeError(f"mask must be 'full', 'causal' or 'window:W', got {mask!r}")
    if causal and mask != "causal":
        raise ValueError(f"causal=True and mask={mask!r} contradict each other: give one of them")
    return mask


def _positions(q_positions) -> Optional[list]:
    """``q_positions`` as a list of ints (the C++ side checks their count, order and range against q and k),
    refusing what is not a 1-D array of integers."""
    if q_positions is None:
        return None
    a = np.asarray(q_positions) if isinstance(q_positions, (list, tuple, range)) else _as_array(q_positions,
                                                                                                   "q_positions")
    if a.ndim != 1:
        raise ValueError(f"q_positions must be 1-D (one position per query row), got shape {a.shape}")
    if a.dtype.kind == "f" and np.isnan(a).any():
        raise ValueError(f"q_positions[{int(np.flatnonzero(np.isnan(a))[0])}] is NaN: positions are the key "
                         "indices of the query rows' tokens (integers)")
    if a.dtype.kind not in "iu" and a.size:
        raise TypeError(f"q_positions must hold integers (key indices, e.g. np.arange(n_k - n_q, n_k)), got dtype "
                        f"{a.dtype}")
    positions = [int(x) for x in a]
    huge = next((i for i, x in enumerate(positions) if abs(x) >= 2**62), None)
    if huge is not None:  # beyond int64, which the core takes; no cache has that many keys
        raise ValueError(f"q_positions[{huge}] = {positions[huge]} is not a key position (0..n_k - 1)")
    return positions


def _real(value, what: str) -> float:
    if value is None:
        return 0.0
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what} must be a number, got {value!r}")
    return float(value)


def _shaping(q, k, bias, softcap, alibi_slope, bias_before_softcap) -> tuple:
    """(bias, softcap, alibi_slope, bias_before_softcap) as the core takes them: ``bias`` broadcast to
    n_q x n_k (a [n_k] row applies to every query; a leading axis of one is dropped), None and 0 for none."""
    if bias is not None:
        bias = _as_array(bias, "bias")
        rows, keys = _rows_and_keys(q, k)
        while bias.ndim > 2 and bias.shape[0] == 1:
            bias = bias[0]
        try:
            bias = np.broadcast_to(bias, (rows, keys))
        except ValueError:
            raise ValueError(f"bias has shape {bias.shape}, which does not broadcast to n_q x n_k = ({rows}, {keys}) "
                             "(one value per query row and key, for one head)") from None
    if not isinstance(bias_before_softcap, (bool, np.bool_)):
        raise TypeError(f"bias_before_softcap must be True or False, got {bias_before_softcap!r}")
    return bias, _real(softcap, "softcap"), _real(alibi_slope, "alibi_slope"), bool(bias_before_softcap)


def _geometry(causal: bool, mask: Optional[str], q_positions, cross: bool, q=None, k=None, bias=None, softcap=None,
              alibi_slope=None, bias_before_softcap: bool = False) -> tuple:
    """(mask text, positions, cross, bias, softcap, alibi_slope, bias_before_softcap) as the core takes them."""
    if not isinstance(cross, (bool, np.bool_)):
        raise TypeError(f"cross must be True or False, got {cross!r}")
    return (_mask_text(bool(causal), mask), _positions(q_positions), bool(cross),
            *_shaping(q, k, bias, softcap, alibi_slope, bias_before_softcap))


def _slice_geometry(causal: bool, mask: Optional[str], q_positions, cross: bool, *shaping) -> None:
    if causal or mask is not None or q_positions is not None or cross or any(
            x is not None and x is not False for x in shaping):
        raise ValueError("a Slice carries its geometry and score shaping: build it with Slice(q, k, v, scale, "
                         "mask=..., q_positions=..., cross=..., bias=..., softcap=..., alibi_slope=...) and leave "
                         "those out of the call")


_INT31, _UINT32, _UINT64 = 2**31 - 1, 2**32 - 1, 2**64 - 1


def _integer(value, what: str, lo: int, hi: int) -> int:
    """``value`` as an int in lo..hi, else a ValueError saying what is allowed: a float (1.5, or 2.0)
    or a bool is refused rather than truncated, a number out of range rather than wrapped."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{what} must be an integer in {lo}..{hi}, got {value!r}")
    if not lo <= int(value) <= hi:
        raise ValueError(f"{what} must be in {lo}..{hi}, got {int(value)}")
    return int(value)


def _threads(threads: int) -> int:
    return _integer(threads, "threads (0 = all cores)", 0, 1024)  # the CLI's --threads range


def _seed(seed: int) -> int:
    return _integer(seed, "seed", 0, _UINT64)


def _trial(trial: int) -> int:
    return _integer(trial, "trial", 0, _UINT32)


def _device(device: str) -> str:
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r}: use 'cpu' or 'cuda'")
    if device != "cpu":  # refused here in Python's words; the core's messages name --device
        built, problem = _core.device_status(device)
        if not built:
            raise ValueError(f"device={device!r}: this build of attnprobe has no {device} backend (rebuild "
                             "with -DATTNPROBE_CUDA=ON where nvcc is installed); use device='cpu'")
        if problem:
            raise InputError(f"device={device!r}: {problem}; use device='cpu', or run where a GPU is visible")
    return device


class Slice(_core.Slice):
    """One slice (q, k, v, scale) converted once into what estimators read (float64 and float32
    copies), for many calls on it: ``estimate(spec, Slice(q, k, v, scale), ...)`` then costs what
    ``attnprobe bench`` times, without the per-call conversion (~1 ms at 4096 x 64). Pass it as ``q``
    to :func:`estimate`, :func:`exact` and :func:`reference` (leave k, v, scale and the geometry out).
    The geometry and score-shaping arguments are :func:`exact`'s (``causal``, ``mask``, ``q_positions``,
    ``cross``, ``bias``, ``softcap``, ``alibi_slope``, ``bias_before_softcap``). Attributes: ``n`` (query
    rows), ``keys``, ``p``, ``pv``, ``scale``, ``mask`` ("full", "causal" or "window:W"), ``causal``,
    ``cross``, ``q_positions`` (each row's key position; None for
    cross-attention), ``bias`` (n_q x n_k or None), ``softcap``, ``alibi_slope`` (0: none), ``rope_inv_freq``,
    and ``q``, ``k``, ``v`` (float64 copies).

    ``rope_inv_freq``: the rotary embedding's P/2 inverse frequencies (Hugging Face's ``rotary_emb.inv_freq``,
    ``rotate_half`` pairing: channel f with f + P/2), for the estimators that undo the rotation of the (already
    rotated) q and k, ``expected(stats=rope)``; positions are the keys' indices from 0 (docs/dumps.md, "Rotary
    frequencies"). That estimator compresses the prompt's query rows, which a decode Slice does not hold: sweep a
    whole causal Slice with ``queries="last:W"`` (the last example).

        >>> s = attnprobe.Slice(q, k, v, scale)
        >>> estimates = [attnprobe.estimate("performer(M=64)", s, trial=t) for t in range(100)]
        >>> step = attnprobe.Slice(q[-16:], k, v, scale, mask="causal")   # 16 queries, 4096 keys
        >>> step.n, step.keys, step.q_positions[0]
        (16, 4096, 4080)
        >>> rotary = attnprobe.Slice(q, k, v, mask="causal", rope_inv_freq=model.rotary_emb.inv_freq)
        >>> attnprobe.sweep({"layer_00": rotary}, ["expected(stats=rope)"], queries="last:16", trials=1)
    """

    def __init__(self, q, k, v, scale: Optional[float] = None, causal: bool = False, *, mask: Optional[str] = None,
                 q_positions=None, cross: bool = False, bias=None, softcap: Optional[float] = None,
                 alibi_slope: Optional[float] = None, bias_before_softcap: bool = False, rope_inv_freq=None):
        q, k, v = _matrices(q, k, v)
        super().__init__(q, k, v, None if scale is None else float(scale),
                         *_geometry(causal, mask, q_positions, cross, q, k, bias, softcap, alibi_slope,
                                    bias_before_softcap),
                         rope_inv_freq=None if rope_inv_freq is None else as_frequencies(rope_inv_freq))


def _slice_only(q, k, v, scale) -> bool:
    if not isinstance(q, _core.Slice):
        return False
    if k is not None or v is not None or scale is not None:
        raise ValueError("with a Slice, leave k, v and scale out: the slice carries them")
    return True


# ---- the registry, dumps, one slice -------------------------------------------------------------------

def estimators() -> list:
    """The registered estimators, as ``attnprobe list`` shows them: a list of dicts with ``name``,
    ``family``, ``summary``, ``params`` (each: name, kind — int, real, choice or text —, default, min/max or choices, help),
    ``defaults``, ``spec`` (the default's canonical spec), ``target`` (what it estimates, the
    reference of ``reference="auto"``), ``samples_knob`` (or None), ``random``, ``causal``,
    ``weights``, ``causal_weights`` (its causal form states its weights too), ``kept_keys`` (it states the
    keys each row reads, so ``metrics="selection"`` applies), ``prompt`` (it compresses the cache once from
    the prompt's query rows, so it measures decode rows only: ``queries="last:W"``), ``anchored`` (its decode
    rows keep state fixed at the prompt boundary, so they differ from the whole slice's rows), ``shaping`` (it
    honours a bias, ALiBi and a soft-cap: ``exact``'s ``bias``/``alibi_slope``/``softcap``), ``backward`` (its
    backward form for the gradient metrics: "out", "yoso" or "" for none), ``causal_backward`` (that
    backward covers its causal form too), ``devices``, ``causal_devices`` (the devices whose
    version has the causal form: ``device="cuda"`` with ``causal=True`` needs "cuda" here) and
    ``variants`` (the settings the baseline gate runs).

        >>> [e["spec"] for e in attnprobe.estimators() if e["family"] == "random-features"]
        ['lara(C=64,proposal=segment,weights=decoupled,beta=1,mode=sample,noise=scaled)', 'performer(M=64,ortho=1)', 'ra(S=1,variant=unbiased,noise=scaled)']
    """
    return _core.estimators()


def _dump_options(q_path=None, k_path=None, v_path=None, layout=None, num_heads=0):
    return _core.dump_options(q_path or "", k_path or "", v_path or "", layout or "",
                              _integer(num_heads or 0, "num_heads (0 = from the file)", 0, _INT31))


def load(dump: Union[str, os.PathLike], layer: int, head: int, batch: int = 0, length: Optional[int] = None, *,
         q_path: Optional[str] = None, k_path: Optional[str] = None, v_path: Optional[str] = None,
         layout: Optional[str] = None, num_heads: int = 0, as_slice: bool = False):
    """One slice of a dump: ``(q, k, v, scale, causal)``, or with ``as_slice=True`` a :class:`Slice` carrying
    the layer's geometry and score shaping too (its mask is the full one unless the dump's rows are decode rows;
    a layer with a bias, ALiBi slopes or a soft-cap is read only this way: the tuple cannot carry them).

    q, k (n x p) and v (n x pv) are float64 numpy arrays exactly as the CLI reads them (the first
    ``length`` tokens of batch item ``batch``; default its full valid length); ``scale`` is the
    layer's attribute or 1/sqrt(p); ``causal`` is the layer's attribute (informational: attention is
    measured full). ``q_path``/``k_path``/``v_path``, ``layout`` and ``num_heads`` are the CLI's
    --q-path/--k-path/--v-path, --layout and --num-heads (docs/dumps.md).

        >>> q, k, v, scale, causal = attnprobe.load("data/synth-demo.h5", 0, 1, 0, length=128)
        >>> q.shape, scale
        ((128, 32), 0.17677669529663687)
    """
    return _core.load(os.fspath(dump), _integer(layer, "layer", 0, _INT31), _integer(head, "head", 0, _INT31),
                      _integer(batch, "batch", 0, _INT31),
                      None if length is None else _integer(length, "length", 1, 2**62),
                      _dump_options(q_path, k_path, v_path, layout, num_heads), bool(as_slice))


def exact(q, k=None, v=None, scale: Optional[float] = None, causal: bool = False, *, mask: Optional[str] = None,
          q_positions=None, cross: bool = False, bias=None, softcap: Optional[float] = None,
          alibi_slope: Optional[float] = None, bias_before_softcap: bool = False, dtype=np.float64,
          precision: Optional[str] = None, threads: int = 0) -> np.ndarray:
    """Exact attention softmax(scale * q kᵀ) v, n_q x pv.

    ``dtype=np.float64`` (default) is the reference every metric compares against (row blocks,
    max-subtracted); ``np.float32`` the blocked online-softmax kernel the ``softmax`` estimator uses.
    ``precision`` names it instead: ``"f64"``, ``"f32"``, or ``"bf16"``/``"f16"``: exact attention as a
    GPU computes it in that dtype (FlashAttention-2's forward: inputs rounded, scores, row sums and P·V in
    float32, P and the output rounded; docs/precision.md), a float32 array of values representable in it —
    R_ℓ of the sweep's ``--precision`` metrics. f16 overflow gives inf/NaN rows, not an error.
    ``scale`` defaults to 1/sqrt(p). The result does not depend on ``threads`` (0 = all cores).

    Geometry (the CLI's ``--mask`` and ``--queries``): q has n_q rows, k and v n_k ≥ n_q rows. Query
    row i is the token at key position t_i: ``q_positions`` (strictly increasing, each < n_k), by
    default the last ones, t_i = n_k − n_q + i (bottom-right alignment; self-attention when n_q = n_k).
    ``mask="full"`` sees every key, ``"causal"`` keys 0..t_i (``causal=True`` says the same),
    ``"window:W"`` keys t_i−W+1..t_i. ``cross=True``: cross-attention, queries without positions (any
    n_k ≥ 1; only ``mask="full"``).

    Score shaping (what the model does to the scores S = scale * q kᵀ besides the mask; docs/dumps.md):
    ``bias`` adds one value per (query row, key) (T5's relative buckets, a learned bias; anything that
    broadcasts to n_q x n_k, finite); ``alibi_slope=m`` adds m·(j − t_i) to key j's score (ALiBi; the model's
    m·j differs by a constant per row, which the softmax ignores); ``softcap=c`` makes the scores c·tanh(S/c)
    (Gemma 2), before the bias unless ``bias_before_softcap=True``. Only estimators that honour shaping run on
    such inputs (``estimators()``' ``shaping`` field: softmax); the others raise ValueError.

        >>> out = attnprobe.exact(q, k, v, scale)
        >>> q, k, v, scale, _ = attnprobe.load(dump, layer=0, head=0, length=4096)   # p = pv = 64
        >>> step = attnprobe.exact(q[-16:], k, v, scale, mask="causal")   # one decode step: 16 queries
        >>> step.shape                                                     # against a 4096-key cache
        (16, 64)
        >>> in_bf16 = attnprobe.exact(q, k, v, scale, precision="bf16")        # as a bf16 kernel computes it
        >>> np.linalg.norm(in_bf16 - out) / np.linalg.norm(out)                # the rounding floor, ~3e-3
    """
    dt = np.dtype(dtype)
    if dt not in (np.dtype(np.float64), np.dtype(np.float32)):
        raise ValueError(f"dtype must be float64 or float32, got {dt}")
    if precision is None:
        precision = "f64" if dt == np.float64 else "f32"
    elif dt != np.float64:
        raise ValueError("give dtype or precision, not both (precision='f32' is dtype=np.float32)")
    precision = _precision(precision)
    shaping = (bias, softcap, alibi_slope, bias_before_softcap)
    if _slice_only(q, k, v, scale):
        _slice_geometry(causal, mask, q_positions, cross, *shaping)
        return _core.exact_slice(q, precision, _threads(threads))
    q, k, v = _matrices(q, k, v)
    return _core.exact(q, k, v, None if scale is None else float(scale),
                       *_geometry(causal, mask, q_positions, cross, q, k, *shaping), precision, _threads(threads))


_PRECISIONS = ("f64", "f32", "bf16", "f16")


def _precision(precision) -> str:
    if precision not in _PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(_PRECISIONS)}, got {precision!r}")
    return precision


def round_to(x, precision: str) -> np.ndarray:
    """``x`` as float32, each element rounded to ``precision`` ("f32", "bf16" or "f16"; round to nearest even,
    f16 overflowing to ±inf beyond 65504, its subnormals kept): what ``--precision`` does to the inputs.

        >>> attnprobe.round_to([1.0 + 2**-8, 70000.0], "bf16")    # array([1., 70144.], dtype=float32)
        >>> attnprobe.round_to([1.0 + 2**-8, 70000.0], "f16")     # array([1.0039062, inf], dtype=float32)
    """
    return _core.round_to(np.asarray(x, dtype=np.float32), _precision(precision))


_CASE_FIELDS = ("layer", "head", "batch")


def _case_fields(case, keys: int, rows: int, mask: str) -> tuple:
    """(layer, head, batch) of ``case``, refusing a case of another slice: its ``n`` (the keys), ``mask`` or
    ``queries`` (all: as many rows as keys; last:W: W rows) disagreeing with the call's."""
    if case is None:
        return 0, 0, 0
    if isinstance(case, Mapping) or hasattr(case, "get"):
        get = case.get
    else:
        raise TypeError("case must be a mapping with layer, head, batch (and optionally n), e.g. a sweep row")
    missing = [f for f in _CASE_FIELDS if get(f, None) is None]
    if missing:
        raise ValueError(f"case lacks {', '.join(missing)}: give layer, head, batch (and optionally n)")
    if get("n", None) is not None and _integer(get("n"), "case n", 1, 2**62) != keys:
        raise ValueError(f"case has n={int(get('n'))} but k has {keys} rows: n is the number of keys, so pass "
                         "k and v of that length")
    if get("mask", None) is not None and get("mask") != mask:
        raise ValueError(f"case has mask={get('mask')} but the call's mask is {mask}: pass mask={get('mask')!r}")
    queries = get("queries", None)
    if queries is not None and queries != "dump":
        want = keys if queries == "all" else int(str(queries).split(":")[-1])
        if want != rows:
            raise ValueError(f"case has queries={queries} but q has {rows} rows: pass q[-{want}:] for last:{want}, "
                             "all of q for all")
    return tuple(_integer(get(f), f"case {f}", 0, _INT31) for f in _CASE_FIELDS)


def _rows_and_keys(q, k) -> tuple:
    return (q.shape[0] if q.ndim == 2 else -1), (k.shape[0] if k.ndim == 2 else -1)


class EstimateWithReference(NamedTuple):
    """:func:`estimate` with ``return_reference=True``: the estimate (float32), the reference a sweep compares it
    with under ``--reference auto`` (float64) and that reference's canonical spec (``softmax``, or e.g. yoso's
    ``yoso-e(...)``: its target)."""

    estimate: np.ndarray
    reference: np.ndarray
    reference_spec: str


def estimate(spec: str, q, k=None, v=None, scale: Optional[float] = None, causal: bool = False, seed: int = 0,
             trial: int = 0, case=None, *, mask: Optional[str] = None, q_positions=None, cross: bool = False,
             bias=None, softcap: Optional[float] = None, alibi_slope: Optional[float] = None,
             bias_before_softcap: bool = False, threads: int = 0, device: str = "cpu", precision: str = "f32",
             return_reference: bool = False):
    """One estimate (float32, n_q x pv) of estimator ``spec`` (e.g. ``"yoso(m=32,tau=8)"``, see
    :func:`estimators`), with the random draws of (``seed``, case, ``trial``).

    ``case`` is the case the draws belong to: a mapping with ``layer``, ``head``, ``batch`` (and
    optionally ``n``, the number of keys, ``mask`` and ``queries``, which must be the call's), e.g. a
    row of a :func:`sweep` DataFrame; then the result is bit for bit what ``attnprobe sweep --seed SEED``
    computed for that case and trial. ``case=None`` means layer 0, head 0, batch 0. ``threads`` (0 =
    all cores) never changes the result; ``device="cuda"`` runs the estimator's CUDA version where one
    exists. ``q`` may be a :class:`Slice` (then leave k, v, scale and the geometry out): converted
    once, it is the fastest way to call many estimates on one slice.

    The geometry arguments ``causal``, ``mask``, ``q_positions`` and ``cross`` and the score shaping
    (``bias``, ``softcap``, ``alibi_slope``, ``bias_before_softcap``) are :func:`exact`'s. A
    mask other than full runs the estimator's form for it, and fewer query rows than keys its decode
    form; an estimator without the form raises ValueError naming those that have one
    (``estimators()``' ``forms`` and ``decode`` fields). The draws of the last W rows are the whole
    slice's (the sweep's ``--queries last:W``), so a decode step's rows equal the same rows of the
    whole slice's estimate.

    ``precision="bf16"`` or ``"f16"`` computes it as the sweep's ``--precision`` does: inputs rounded to it, the
    intermediates the estimator declares rounded (``estimators()``' ``rounding`` field), the output rounded; the
    same draws as in f32, so ``estimate(..., precision="bf16") - estimate(...)`` is the rounding alone.

        >>> q, k, v, scale, _ = attnprobe.load("data/synth-demo.h5", 1, 0, 0, length=256)
        >>> est = attnprobe.estimate("performer(M=64)", q, k, v, scale, seed=0, trial=3,
        ...                          case={"layer": 1, "head": 0, "batch": 0})
        >>> attnprobe.metrics(attnprobe.exact(q, k, v, scale), est)["spec_rel"]   # = the CSV's value
        >>> # One decode step: 16 queries against a 4096-key cache (a --queries last:16 row's draws).
        >>> step = attnprobe.estimate("performer(M=64)", q[-16:], k, v, scale, mask="causal", seed=0)

    ``return_reference=True`` returns ``(estimate, reference, reference_spec)`` (:class:`EstimateWithReference`):
    the reference is what the CLI measures this estimator against (``--reference auto``: its target, which is not
    exact attention for every estimator: yoso's is yoso-e), so ``metrics(reference, estimate)`` is the CSV's
    number. Comparing yoso with :func:`exact` instead measures something else:

        >>> est, ref, ref_spec = attnprobe.estimate("yoso(m=32)", q, k, v, scale, return_reference=True)
        >>> ref_spec                                    # 'yoso-e(tau=8,input=l2,grad=exact)'
        >>> attnprobe.metrics(ref, est)["spec_rel"]     # the CLI's value for this case
    """
    shaping = dict(bias=bias, softcap=softcap, alibi_slope=alibi_slope, bias_before_softcap=bias_before_softcap)
    if return_reference:
        target = _core.target(str(spec))
        return EstimateWithReference(
            estimate(spec, q, k, v, scale, causal, seed, trial, case, mask=mask, q_positions=q_positions,
                     cross=cross, threads=threads, device=device, precision=precision, **shaping),
            reference(target, q, k, v, scale, causal, mask=mask, q_positions=q_positions, cross=cross,
                      threads=threads, **shaping),
            target)
    if _slice_only(q, k, v, scale):
        _slice_geometry(causal, mask, q_positions, cross, *shaping.values())
        layer, head, batch = _case_fields(case, q.keys, q.n, q.mask)
        return _core.estimate_slice(str(spec), q, _seed(seed), _trial(trial), layer, head, batch, _threads(threads),
                                    _device(device), _precision(precision))
    q, k, v = _matrices(q, k, v)
    geometry = _geometry(causal, mask, q_positions, cross, q, k, *shaping.values())
    rows, keys = _rows_and_keys(q, k)
    layer, head, batch = _case_fields(case, keys, rows, geometry[0])
    return _core.estimate(str(spec), q, k, v, None if scale is None else float(scale), *geometry, _seed(seed),
                          _trial(trial), layer, head, batch, _threads(threads), _device(device),
                          _precision(precision))


def reference(spec: str, q, k=None, v=None, scale: Optional[float] = None, causal: bool = False, *,
              mask: Optional[str] = None, q_positions=None, cross: bool = False, bias=None,
              softcap: Optional[float] = None, alibi_slope: Optional[float] = None, bias_before_softcap: bool = False,
              threads: int = 0) -> np.ndarray:
    """What a sweep compares against when ``spec`` is the reference (a deterministic estimator, e.g.
    ``"softmax"`` or ``"yoso-e(tau=8)"``): its float64 evaluation, n_q x pv. ``reference("softmax", ...)``
    equals ``exact(...)``; the geometry and score-shaping arguments are :func:`exact`'s.

        >>> ref = attnprobe.reference("softmax", q[-16:], k, v, scale, mask="causal")   # a decode step's
    """
    shaping = (bias, softcap, alibi_slope, bias_before_softcap)
    if _slice_only(q, k, v, scale):
        _slice_geometry(causal, mask, q_positions, cross, *shaping)
        return _core.reference_slice(str(spec), q, _threads(threads))
    q, k, v = _matrices(q, k, v)
    return _core.reference(str(spec), q, k, v, None if scale is None else float(scale),
                           *_geometry(causal, mask, q_positions, cross, q, k, *shaping), _threads(threads))


def metric_names() -> list:
    """The metric names, in CSV order: spec, spec_rel, fro, fro_rel, mse, nmse, maxabs, angle, zero_rows."""
    return _core.metric_names()


def metrics(reference, estimate, names: Union[None, str, Sequence[str]] = None) -> dict:
    """The error metrics of ``estimate`` against ``reference`` (both n x pv) as a dict, with the same
    definitions and numbers as the CSV (docs/metrics.md): the reference in float64, the estimate in
    float32 (an estimator's output; a float64 estimate is rounded to float32 first, as the CSV's are).
    ``names``: a list or comma-separated string of metric names; default all.

        >>> q, k, v, scale, _ = attnprobe.load("data/synth-demo.h5", 0, 1, 0, length=128)
        >>> est = attnprobe.estimate("performer(M=64)", q, k, v, scale, seed=0)
        >>> attnprobe.metrics(attnprobe.exact(q, k, v, scale), est, ["spec_rel", "angle"])
        {'spec_rel': 1.15941083454588, 'angle': 0.7832525269337348}
    """
    if names is not None and not isinstance(names, str) and not isinstance(names, Iterable):
        raise TypeError(f"names must be a list of metric names or a comma-separated string, got {names!r}")
    text = "all" if names is None else names if isinstance(names, str) else ",".join(str(n) for n in names)
    return dict(_core.metrics(_as_array(reference, "reference"), _as_array(estimate, "estimate"), text))


def case_id(layer: int, head: int, batch: int, n: int, spec: str, causal: bool = False, *,
            mask: Optional[str] = None, queries: str = "all", precision: str = "f32") -> str:
    """The canonical case id: ``layer=L;head=H;batch=B;n=N;spec=CANONICAL`` (n: the keys), plus ``;mask=causal``
    or ``;mask=window:W``, ``;queries=last:W`` and ``;precision=bf16`` where not full, all and f32, as the
    sweep's. The draws are keyed without the queries and precision parts."""
    return _core.case_id(int(layer), int(head), int(batch), int(n), str(spec), _mask_text(bool(causal), mask),
                         str(queries), _precision(precision))


def random_key(seed: int, case: str, trial: int) -> int:
    """The 64-bit Philox key of (seed, case id, trial) (docs/randomness.md); a custom estimator's seed."""
    return _core.random_key(_seed(seed), str(case), _trial(trial))


# ---- DataFrames ⇄ the CSV schema ------------------------------------------------------------------------

_TEXT_COLUMNS = {"dump": str, "estimator": str, "spec": str, "reference": str, "metric": str}
_REAL_COLUMNS = {"value", "mean", "std", "stderr", "median", "min", "max"}
_COORDINATES = {"layer", "head", "batch", "n"}


def _frame(text: str):
    import pandas as pd

    # round_trip: pandas' default float parser can be one unit in the last place off.
    return pd.read_csv(io.StringIO(text), dtype=_TEXT_COLUMNS, keep_default_na=False, float_precision="round_trip",
                       na_values={c: ["nan"] for c in _REAL_COLUMNS} | {"samples": [""]})


def read_csv(path: Union[str, os.PathLike]):
    """A trial or summary CSV (from the CLI or :func:`sweep`) as a DataFrame, read exactly as
    :func:`sweep` builds its own (text columns as str, empty ``samples`` as NaN, ``nan`` values as NaN).
    Refused, as by the CLI's readers: an empty file (``attnprobe.InputError``), a CSV without the
    schema's columns (``ValueError`` naming them and the file's own), and a negative value of a metric
    attnprobe computes (a damaged or hand-edited file; ``attnprobe.InputError`` with the row)."""
    path = os.fspath(path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if not text.strip():
        raise InputError(f"'{path}' is empty: it has no CSV header")
    df = _with_later_columns(_frame(text))
    _core.validate_rows(*_rows(df, f"'{path}'"))
    return df


def _with_later_columns(df):
    """A table written before the mask, queries or precision columns existed, with them: full, all and f32, as the
    CLI reads such files (a copy when one is added; the table itself otherwise)."""
    added = None
    for column, after, value in (("mask", "p", "full"), ("queries", "mask", "all"), ("precision", "queries", "f32")):
        frame = added if added is not None else df
        if column not in frame.columns and after in frame.columns:
            added = frame.copy() if added is None else added
            added.insert(list(added.columns).index(after) + 1, column, value)
    return df if added is None else added


def write_csv(table, path: Union[str, os.PathLike]) -> None:
    """Writes trial rows or a summary (a DataFrame in either schema) as the CLI writes its CSVs:
    the schema's columns in order, numbers as the shortest text that reads back exactly, empty
    ``samples`` for estimators without a knob. ``read_csv(path)`` gives the table back.

        >>> attnprobe.write_csv(attnprobe.summarize(df), "baseline.csv")   # commit it; gate with check()
    """
    import csv

    summary, fields = _rows(table)
    with open(os.fspath(path), "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(_core.column_names(summary))
        writer.writerows(fields)


def _layout(df, what: str = "the DataFrame") -> bool:
    """True for a summary DataFrame, False for trial rows; ValueError naming missing columns otherwise
    (``what`` names the table in the message: the DataFrame, or the CSV it was read from)."""
    columns = set(df.columns)
    summary = "mean" in columns and "value" not in columns
    missing = [c for c in _core.column_names(summary) if c not in columns]
    if missing:
        raise ValueError(f"{what} is not an attnprobe {'summary' if summary else 'trial'} table: it lacks the "
                         f"column(s) {', '.join(missing)} (its columns: {', '.join(map(str, df.columns))})")
    return summary


def _real_text(x) -> str:
    """The CSV's number format (format_real in C++): the shortest text that reads back exactly, 'nan',
    'inf', '-inf', and integral values without '.0' (fmt's "{}" writes 2.0 as "2"; Python's repr as "2.0")."""
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


def _field(column: str):
    if column in _REAL_COLUMNS:
        return _real_text
    if column == "samples":
        return lambda x: "" if x is None or (isinstance(x, float) and math.isnan(x)) or x == "" else str(int(x))
    if column in _COORDINATES:
        return lambda x: x if isinstance(x, str) else str(int(x))
    if column in ("p", "trial", "count", "seed"):
        return lambda x: str(int(x))
    return str


def _rows(table, what: str = "the DataFrame") -> tuple:
    """(is_summary, rows as lists of text fields in the schema's column order) of a DataFrame or a CSV path."""
    import pandas as pd

    if isinstance(table, (str, os.PathLike)):
        table = read_csv(table)
    if not isinstance(table, pd.DataFrame):
        raise TypeError(f"expected a pandas DataFrame or a CSV path, got {type(table).__name__}")
    table = _with_later_columns(table)
    summary = _layout(table, what)
    columns = [table[c].map(_field(c)).tolist() for c in _core.column_names(summary)]
    return summary, [list(r) for r in zip(*columns)]


# ---- sweeps ------------------------------------------------------------------------------------------------

def _list_text(value, what: str) -> str:
    if value is None:
        return "all"
    if isinstance(value, str):
        return value
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return ",".join(str(int(x)) for x in value)


def _int_list(value, what: str) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return list(_core.parse_int_list(value, what))
    return [_integer(x, what, 1, 2**62) for x in ([value] if isinstance(value, numbers.Integral) else value)]


# How much row i of a custom estimate may move when the tokens after it are replaced, relative to the row's
# norm: float32 rounding of a mathematically causal function (a global shift that cancels) moves it ~1e-7;
# a function that ignores causal=True moves it by O(1).
_CAUSAL_TOLERANCE = 1e-4


def _custom_wrapper(entry: _custom.CustomEstimator, seed: int, trials: int) -> Callable:
    """The callable the C++ runner calls for a setting of estimator py:NAME: calls fn(q, k, v, scale, causal,
    seed, **params) with the setting's parameters (read back from its canonical spec) and returns a
    C-contiguous float32 n x pv array, or raises EstimatorError naming the case. Every causal call is also
    run with the tokens from the middle on replaced: rows before them must not move (the leak harness our
    own causal forms pass, with a rounding tolerance). Every call, not the first: a function may leak at
    some lengths, heads or seeds only; the check doubles a causal call's cost."""
    fn = entry.fn
    keywords = {}  # canonical spec -> its keyword arguments, read once per setting

    def fail(what, where, cause=None):
        key, layer, head, batch, n, causal, spec = where  # the call's case, as the runner passed it
        case = _core.case_id(layer, head, batch, n, spec, "causal" if causal else "full", "all", "f32")
        trial = next((t for t in range(trials) if _core.random_key(seed, case, t) == key), None)
        error = EstimatorError(f"custom estimator '{spec}' {what} on case {case}, trial {trial} "
                               f"(its seed argument was {key})", case, trial, key)
        raise error from cause

    def checked(q, k, v, scale, where):  # fn's result as a float32 n x pv array, or EstimatorError
        key, causal, spec = where[0], where[5], where[6]
        if spec not in keywords:
            keywords[spec] = entry.keywords(spec)
        try:
            out = fn(q, k, v, scale, causal, key, **keywords[spec])
        except Exception as e:  # noqa: BLE001 - any failure of the user's code is reported with its case
            fail(f"raised {type(e).__name__}: {e}", where, e)
        if not (isinstance(out, np.ndarray) or hasattr(out, "detach") or hasattr(out, "__array__")
                or hasattr(out, "__dlpack__")):
            fail(f"returned a {type(out).__name__}, not a numpy array or torch tensor", where)
        try:
            array = _as_array(out, "the result")
        except Exception as e:  # noqa: BLE001
            fail(f"returned something that is not an array ({e})", where, e)
        if array.shape != v.shape:
            fail(f"returned shape {tuple(array.shape)}, expected {tuple(v.shape)} (n x pv)", where)
        if array.dtype.kind not in "fiu":
            fail(f"returned dtype {array.dtype}, expected floating point", where)
        result = np.ascontiguousarray(array, dtype=np.float32)
        if not np.isfinite(result).all():
            bad = np.argwhere(~np.isfinite(result))[0]
            fail(f"returned a non-finite value ({result[tuple(bad)]} at row {bad[0]}, column {bad[1]}; "
                 f"in float32)", where)
        return result

    def call(q, k, v, scale, causal, key, layer, head, batch, n, spec):
        where = (key, layer, head, batch, n, causal, spec)
        result = checked(q, k, v, scale, where)
        if causal and q.shape[0] >= 2:
            # Tokens cut.. replaced: their rows reversed and doubled, values negated too, so that order-free
            # statistics of the later tokens (a largest norm, a mean) change as well as the tokens themselves.
            cut = q.shape[0] // 2
            q2, k2, v2 = q.copy(), k.copy(), v.copy()
            q2[cut:], k2[cut:], v2[cut:] = 2 * q[cut:][::-1], 2 * k[cut:][::-1], -2 * v[cut:]
            other = checked(q2, k2, v2, scale, where)
            moved = (np.linalg.norm((other[:cut] - result[:cut]).astype(np.float64), axis=1) /
                     np.maximum(np.linalg.norm(result[:cut].astype(np.float64), axis=1), 1e-30))
            if moved.max() > _CAUSAL_TOLERANCE:
                row = int(moved.argmax())
                fail(f"is not causal: row {row} moved by {moved[row]:.3g} of its norm when the tokens from {cut} on "
                     f"were replaced (same seed). Under causal=True query i may attend to keys 0..i only; mask "
                     f"the later keys, or sweep with mask='full' (a function that draws from a generator not "
                     f"seeded by its seed argument fails this check too)", where)
        return result

    return call


def _memory_layer(key, value) -> Layer:
    """One layer of an in-memory sweep source as a :class:`Layer`."""
    if isinstance(value, Layer):
        return value
    if isinstance(value, _core.Slice):
        if value.cross:
            raise ValueError(f"{key}: a cross-attention Slice cannot be swept yet (its queries have no positions)")
        mask = value.mask
        window = int(mask.split(":")[1]) if mask.startswith("window:") else None
        positions = np.asarray(value.q_positions, dtype=np.int64)
        default = np.arange(value.keys - value.n, value.keys)
        bias = value.bias
        return Layer(q=value.q[None, None], k=value.k[None, None], v=value.v[None, None], scale=value.scale,
                     causal=int(mask != "full"), window=window,
                     q_positions=None if np.array_equal(positions, default) else positions,
                     bias=None if bias is None else bias[None, None], softcap=value.softcap or None,
                     alibi_slopes=np.array([value.alibi_slope]) if value.alibi_slope else None,
                     bias_before_softcap=value.bias_before_softcap, rope_inv_freq=value.rope_inv_freq)
    if isinstance(value, (tuple, list)) and len(value) == 3:
        q, k, v = (_as_array(x, f"{key}[{i}]") for i, x in enumerate(value))
        if not q.ndim == k.ndim == v.ndim or q.ndim not in (2, 3, 4):
            raise ValueError(f"{key}: q, k, v must all be [B, H, N, P], [H, N, P] or [N, P], got shapes {q.shape}, "
                             f"{k.shape}, {v.shape}")
        grow = (None,) * (4 - q.ndim)
        return Layer(q=q[grow], k=k[grow], v=v[grow])
    raise TypeError(f"{key}: expected (q, k, v), an attnprobe.Layer or an attnprobe.Slice, got {type(value).__name__}")


def _sweep_memory(source: Mapping, name: str, output, resume: bool, overwrite: bool, specs, **options):
    """sweep() of arrays in memory: written once as a safetensors dump (their own float types, so the numbers are
    the arrays'), swept by the same code as a file, the ``dump`` column set to ``name``."""
    import tempfile

    if not isinstance(name, str) or not name or "," in name or "\n" in name or "/" in name:
        raise ValueError(f"name={name!r}: a non-empty label without commas, slashes or newlines (the dump column)")
    layers = {str(key): _memory_layer(key, value) for key, value in source.items()}
    if not layers:
        raise ValueError("the source mapping holds no layers")
    if output is not None:
        path = os.fspath(output) + ".dump.safetensors"
        if os.path.exists(path) and not (resume or overwrite):
            raise FileExistsError(f"{path} exists (the dump of an earlier in-memory sweep): pass resume=True to go on "
                                  "with it, overwrite=True to replace it, or another output")
        if resume and os.path.exists(path):
            with tempfile.TemporaryDirectory() as tmp:  # resuming against other arrays is refused, as the CLI's is
                fresh = os.path.join(tmp, "fresh")
                write_dump(fresh, layers, format="safetensors")
                with open(fresh, "rb") as a, open(path, "rb") as b:
                    if a.read() != b.read():
                        raise ValueError(f"resume=True, but the arrays differ from those of {path}: the rows in "
                                         f"{os.fspath(output)} measure other data; use overwrite=True")
        else:
            write_dump(path, layers, format="safetensors")
        return sweep(path, specs, output=output, resume=resume, overwrite=overwrite, **options)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, name)
        write_dump(path, layers, format="safetensors")
        df = sweep(path, specs, **options)
    df["dump"] = name
    return df


def sweep(source, estimators: Union[str, Sequence[str]] = (), *,
          samples=None, layers="all", heads="all", batch="all", lengths=None, trials: int = 8, seed: int = 0,
          threads: int = 0, device: str = "cpu", reference: str = "auto", metrics="all",
          custom: Optional[Mapping[str, Callable]] = None, output: Optional[Union[str, os.PathLike]] = None,
          resume: bool = False, overwrite: bool = False, shard: Optional[str] = None, mask: str = "auto",
          queries="all", precision="f32", q_path: Optional[str] = None,
          k_path: Optional[str] = None, v_path: Optional[str] = None, layout: Optional[str] = None,
          num_heads: int = 0, name: str = "memory"):
    """Runs ``attnprobe sweep`` in-process and returns its trial rows as a pandas DataFrame.

    Same options, same rows, same numbers as the CLI: every estimator spec x samples value x
    layer x head x batch item x length x trial, each estimate compared with its reference (the
    estimator's target, or ``reference``), one row per (case, trial, metric) with the columns
    ``dump,layer,head,batch,n,p,mask,queries,precision,estimator,spec,samples,reference,trial,seed,metric,value``.

    Arguments (the CLI's options; lists may be Python lists or the CLI's text, e.g. "64..1024:x2"):
      source      a dump path: HDF5, safetensors or .npz (docs/dumps.md); q_path/k_path/v_path, layout, num_heads
                  as the CLI's. Or arrays in memory: a mapping "layer_00" → (q, k, v), :class:`Layer` or
                  :class:`Slice` (capture()'s result is one): q [B, H, N, P] (or [H, N, P], [N, P]), k and v
                  with Hkv heads; a tuple's scale is 1/sqrt(P) and its mask full (``mask="causal"`` measures it
                  causally), a Layer's and a Slice's are their own. The rows equal the CLI's on the same arrays
                  written to a file (safetensors, their own float type), with ``dump`` = ``name``; with
                  ``output`` that file is kept beside the CSV as OUTPUT.dump.safetensors (the ``dump`` column),
                  so run.json, ``--resume`` and the CLI find it
      estimators  spec strings, e.g. ["vmean", "yoso(m=32,tau=8)"] (attnprobe.estimators() lists them)
      samples     values of each estimator's samples knob (m, d, M, S, C, L); None: the spec's own
      layers, heads, batch   "all", an int, a list, or text such as "0..3"
      lengths     prefix lengths; None: each batch item's full valid length
      trials      trials per random setting (deterministic estimators run once); seed: the key seed
      threads     worker threads (0 = all cores): the rows do not depend on it
      device      "cpu" or "cuda"; reference: "auto", "softmax" or any deterministic spec
      metrics     "all", or names (list or "spec,angle")
      custom      {"name": fn}: your own estimators, run beside the built-ins as spec "py:name"; with
                  parameters {"name": (fn, {"k": [16, 32]}, {"samples": "k", "deterministic": True})}: one
                  setting per combination, spec "py:name(k=16)", fn(..., seed, k=16) (docs/python.md)
      output      also write the CSV (and NAME.csv.run.json) there, flushed per slice; an existing file
                  is refused unless resume=True (keep its finished trials) or overwrite=True. run.json
                  records the plan as the CLI's does, so ``attnprobe merge``, ``summarize`` and
                  ``sweep --resume`` take the file like one the CLI wrote
      mask        "auto" (each layer's causal and window attributes), "full", "causal" or "window:W", as
                  the CLI's --mask
      queries     the query rows of each case, an axis: "all" (self-attention) or "last:W" (the last W rows
                  of each length against all its keys: W decode steps), a list or text such as
                  ["all", "last:16"] or "all,last:16", as the CLI's --queries; ``n`` stays the keys
      precision   what each case is computed in, an axis: "f32", "bf16", "f16", a list or "f32,bf16", as the
                  CLI's --precision; metrics="all,precision" adds the split of the error into approximation
                  and rounding (approx_err, round_floor, round_excess, fa_ratio, nonfinite_rows), and
                  metrics="selection" a selection's kept set as its rounded scores choose it beside
                  kept_overlap_f32, score_ties, cut_ties (docs/precision.md)
      shard       "I/N": only shard I (0-based) of N, dealt as the CLI's ``--shard`` (the same units on
                  every machine); ``attnprobe merge`` joins it with the other shards, CLI or Python

    Your own estimator: ``fn(q, k, v, scale, causal, seed)`` gets one slice (q, k: n x p, v: n x pv,
    float64 numpy arrays; ``causal`` is True for a causal case (``mask="causal"``, or a causal layer
    under "auto"): query i may then attend to keys 0..i only; ``seed`` is the 64-bit key of (sweep seed,
    case, trial), so reruns and filtered reruns repeat) and returns n x pv (numpy or torch). Draw with a
    local generator, e.g. ``torch.Generator().manual_seed(seed)`` or ``np.random.default_rng(seed)``.
    Every causal call is checked for a leak (it runs twice): run again with the tokens from the middle on
    replaced, its earlier rows must stay put (to 1e-4 of their norm), else :class:`EstimatorError`
    says the function is not causal (a function that ignores ``causal`` would otherwise be measured
    against the causal reference).
    Custom calls run one at a time; built-ins run on all threads beside them. A function that raises
    or returns a non-array, a wrong shape or NaN/Inf raises :class:`EstimatorError` naming the case;
    rows of the slices finished before it stay in ``output``.

    Ctrl-C (KeyboardInterrupt) stops the sweep within ~0.1 s plus the trials already running, which
    finish; with ``output`` their rows are written and run.json records the interruption, so the
    same call with ``resume=True`` computes only what is missing. Without ``output`` nothing is kept.

    Example (one Performer of your own, beside the built-in, gated against a baseline)::

        import attnprobe, torch

        def my_performer(q, k, v, scale, causal, seed, features=64):
            g = torch.Generator().manual_seed(seed % 2**63)
            q, k, v = (torch.from_numpy(x) for x in (q, k, v))
            w = torch.randn(features, q.shape[1], generator=g, dtype=q.dtype)
            def phi(x):
                x = x * scale ** 0.5
                return torch.exp(x @ w.T - (x * x).sum(1, keepdim=True) / 2) / features ** 0.5
            qf, kf = phi(q), phi(k)
            return (qf @ (kf.T @ v)) / (qf @ kf.sum(0)).unsqueeze(1)

        df = attnprobe.sweep("data/synth-demo.h5", ["performer(M=64)"], custom={"mine": my_performer},
                             layers=0, lengths=[256], trials=8, seed=0)
        summary = attnprobe.summarize(df)            # mean, stderr, ... per case and metric
        report = attnprobe.check(df, "my_baseline.csv")
        assert report.passed, report

    Equivalent CLI: ``attnprobe sweep data/synth-demo.h5 -e 'performer(M=64)' --layers 0 --lengths 256
    --trials 8 --seed 0 -o out.csv`` (the CLI cannot run Python estimators).
    """
    if resume and overwrite:
        raise ValueError("resume and overwrite exclude each other")
    if isinstance(source, Mapping):
        if any(x is not None for x in (q_path, k_path, v_path, layout)) or num_heads:
            raise ValueError("q_path, k_path, v_path, layout and num_heads read a file; arrays in memory are "
                             "[B, H, N, P] (or [H, N, P], [N, P]) already")
        return _sweep_memory(source, name, output, resume, overwrite, specs=estimators, custom=custom,
                             samples=samples, layers=layers, heads=heads, batch=batch, lengths=lengths, trials=trials,
                             seed=seed, threads=threads, device=device, reference=reference, metrics=metrics,
                             shard=shard, mask=mask, queries=queries, precision=precision)
    specs = [estimators] if isinstance(estimators, str) else list(estimators)
    entries = _custom.parse_custom(custom or {})
    specs += [spec for entry in entries for spec in entry.specs()]
    args = _core.SweepArgs()
    args.dump = os.fspath(source)
    args.options = _dump_options(q_path, k_path, v_path, layout, num_heads)
    args.estimators = specs
    args.samples = _int_list(samples, "samples")
    args.layers, args.heads, args.batch = (_list_text(layers, "layers"), _list_text(heads, "heads"),
                                           _list_text(batch, "batch"))
    args.lengths = _int_list(lengths, "lengths")
    args.trials = _integer(trials, "trials", 1, _INT31)
    args.seed = _seed(seed)
    args.threads = _threads(threads)
    args.device = _device(device)
    args.reference = str(reference)
    args.metrics = metrics if isinstance(metrics, str) else ",".join(metrics)
    args.output = "" if output is None else os.fspath(output)
    args.mode = "resume" if resume else "overwrite" if overwrite else "create"
    args.shard = "" if shard is None else str(shard)
    args.mask = str(mask)
    args.queries = queries if isinstance(queries, str) else ",".join(map(str, queries))
    args.precision = precision if isinstance(precision, str) else ",".join(map(str, precision))
    args.command_line = ["python:attnprobe.sweep", args.dump] + [f"-e {s}" for s in specs] + [
        f"--samples {args.samples}", f"--layers {args.layers}", f"--heads {args.heads}", f"--batch {args.batch}",
        f"--lengths {args.lengths}", f"--trials {args.trials}", f"--seed {args.seed}", f"--reference {args.reference}",
        f"--metrics {args.metrics}", f"--mask {args.mask}", f"--queries {args.queries}",
        f"--precision {args.precision}"] + ([f"--shard {args.shard}"] if args.shard else [])
    declared = {entry.name: entry.declaration(_custom_wrapper(entry, args.seed, args.trials)) for entry in entries}
    text = _core.sweep(args, declared)
    return read_csv(args.output) if text is None else _frame(text)


# ---- summaries and the gate ----------------------------------------------------------------------------------

def summarize(rows, over: Union[None, str, Sequence[str]] = None):
    """Per (case, metric) statistics of trial rows, as ``attnprobe summarize``: a DataFrame with
    ``...,metric,count,mean,std,stderr,median,min,max`` (std with n-1, stderr = std/sqrt(count)).

    ``rows``: a DataFrame from :func:`sweep`/:func:`read_csv` or a CSV path. ``over``: columns among
    layer, head, batch, n to pool (they become "all"; each slice's mean counts once) — a summary
    DataFrame can be pooled further this way.

        >>> attnprobe.summarize(df, over=["layer", "head", "batch"])
    """
    summary, fields = _rows(rows)
    cols = [] if over is None else [c.strip() for c in over.split(",")] if isinstance(over, str) else list(over)
    return _frame(_core.summarize(summary, fields, cols))


def compare(rows, a: str, b: str):
    """Two settings paired over heads, as ``attnprobe summarize --compare A B`` (docs/csv.md): a DataFrame with one
    row per (dump, n, mask, queries, reference, metric) and the columns a, b, heads, slices, mean_a, mean_b, diff
    (mean over heads of A − B), ci_low, ci_high (95% bootstrap interval over heads), a_better, b_better, ties,
    sign_p (exact two-sided sign test), median_ratio, mc_stderr (the trials' Monte-Carlo stderr of diff) and
    head_sd (the heads' spread). The head (dump, layer, head) is the replicate; its batch items are averaged.

    ``rows``: trial rows or per-case summaries (a DataFrame from :func:`sweep`/:func:`read_csv`/:func:`summarize`
    without ``over``, or a CSV path). ``a``, ``b``: specs; a registered estimator's is made canonical, so defaults
    may be left out (``"topk(k=64)"``); a ``py:`` spec is matched as written.

        >>> cmp = attnprobe.compare(df, "skeinformer(d=32)", "nystrom(L=32)")
        >>> cmp[cmp.metric == "spec_rel"][["heads", "diff", "ci_low", "ci_high", "a_better", "sign_p"]]
    """
    import pandas as pd

    summary, fields = _rows(rows)
    text = _core.compare(summary, fields, str(a), str(b))
    return pd.read_csv(io.StringIO(text), dtype=_TEXT_COLUMNS | {"a": str, "b": str}, keep_default_na=False,
                       float_precision="round_trip", na_values={c: ["nan"] for c in (
                           "mean_a", "mean_b", "diff", "ci_low", "ci_high", "sign_p", "median_ratio", "mc_stderr",
                           "head_sd")})


class CheckReport:
    """The result of :func:`check`: ``passed`` (no regression and no missing case), the counts
    ``regressions``, ``missing``, ``improvements``, ``new``, ``compared``, the ``comparisons``
    DataFrame (verdict, case columns, metric, base_mean, base_se, new_mean, new_se, z, threshold;
    regressions and missing cases first), ``options`` and ``json`` (what ``check --json`` writes)."""

    def __init__(self, text: str):
        import pandas as pd

        data = json.loads(text)
        self.json = text
        self.options = data["options"]
        self.failed = bool(data["failed"])
        self.passed = not self.failed
        self.compared, self.regressions, self.missing = data["compared"], data["regressions"], data["missing"]
        self.improvements, self.new = data["improvements"], data["new"]
        self.comparisons = pd.DataFrame(data["comparisons"])

    def failures(self):
        """The comparisons that fail the gate (regressions and missing cases)."""
        if self.comparisons.empty:
            return self.comparisons
        return self.comparisons[self.comparisons["verdict"].isin(["regression", "missing"])]

    def __str__(self) -> str:
        o = self.options
        lines = [f"check: {self.compared} comparisons, {self.regressions} regressions, {self.missing} missing cases, "
                 f"{self.improvements} improvements, {self.new} new (z = {o['z']}, atol = {o['atol']}, "
                 f"rtol = {o['rtol']})"]
        for _, c in self.failures().iterrows():
            lines.append(f"  {c['verdict']}: L{c['layer']} H{c['head']} B{c['batch']} n={c['n']} {c['spec']} vs "
                         f"{c['reference']} {c['metric']}: baseline {c['base_mean']:.4g} ± {c['base_se']:.2g}, new "
                         + ("(missing)" if c["verdict"] == "missing" else f"{c['new_mean']:.4g} ± {c['new_se']:.2g}"))
        lines.append("check: passed" if self.passed else "check: FAILED")
        return "\n".join(lines)

    __repr__ = __str__


def check(new, baseline, z: float = 4.0, atol: float = 1e-9, rtol: float = 1e-3,
          metrics: Union[None, str, Sequence[str]] = None) -> CheckReport:
    """The regression gate of ``attnprobe check``: for every case and metric of ``baseline``, a
    regression is ``mean_new - mean_base > z*sqrt(se_new² + se_base²) + atol + rtol*|mean_base|``
    (every metric is an error, larger is worse, except ``topk_recall``, larger is better: there the
    difference is ``mean_base - mean_new``); a baseline case missing from ``new`` fails. Every metric
    attnprobe computes can be gated (per trial, per case, weights, gradients), and the inputs are
    validated as ``attnprobe check`` validates its files.

    ``new`` and ``baseline``: trial rows or summaries, as DataFrames or CSV paths (trial rows are
    summarised first). ``metrics`` gates only those. Returns a :class:`CheckReport`; ``.passed`` is
    what CI asserts (the CLI's exit code 0).

        >>> report = attnprobe.check(df, "data/baselines/my-estimator.csv")
        >>> assert report.passed, report
    """
    names = [] if metrics is None else [m.strip() for m in metrics.split(",")] if isinstance(metrics, str) \
        else list(metrics)
    new_summary, new_rows = _rows(new)
    base_summary, base_rows = _rows(baseline)
    return CheckReport(_core.check(new_summary, new_rows, base_summary, base_rows, float(z), float(atol), float(rtol),
                                   names))


def report(run, baseline=None, output: Union[None, str, os.PathLike] = None,
           metrics: Union[None, str, Sequence[str]] = None, diagnostics: Union[None, str, os.PathLike] = None,
           z: float = 4.0, atol: float = 1e-9, rtol: float = 1e-3) -> str:
    """The HTML page of ``attnprobe report`` (docs/report.md): the run's tables, error against length and samples
    with 95% intervals over slices, a layer x head map per setting, the fronts over keys read, bias against variance,
    and with ``baseline`` the gate's verdict case by case (``z``, ``atol``, ``rtol`` as :func:`check`). One
    self-contained file: no network is needed to view it.

    ``run`` and ``baseline``: trial rows or summaries, as DataFrames or CSV paths (a path's ``run.json`` is shown).
    ``metrics``: those to draw (default: those of spec_rel, angle, row_tv, mass_recall present, at most three).
    ``diagnostics``: the CSV of ``attnprobe diagnose``, drawn beside the per-head maps. Returns the page's text and
    writes it to ``output`` when given.

        >>> df = attnprobe.sweep("model.h5", ["vmean", "performer"], lengths=[256, 1024], trials=4)
        >>> attnprobe.report(df, output="report.html")
    """
    names = [] if metrics is None else [m.strip() for m in metrics.split(",")] if isinstance(metrics, str) \
        else list(metrics)
    run_csv = os.fspath(run) if isinstance(run, (str, os.PathLike)) else ""
    summary, rows = _rows(run)
    base_summary, base_rows, base_name = False, [], ""
    if baseline is not None:
        base_name = os.fspath(baseline) if isinstance(baseline, (str, os.PathLike)) else "the baseline DataFrame"
        base_summary, base_rows = _rows(baseline)
    page = _core.report(summary, rows, run_csv, base_summary, base_rows, base_name,
                        "" if diagnostics is None else os.fspath(diagnostics), names, float(z), float(atol),
                        float(rtol))
    if output is not None:
        with open(output, "w", encoding="utf-8") as out:
            out.write(page)
    return page


from .capture import CaptureError, LayerSpec, capture  # noqa: E402  (needs exact() above; torch only when called)
from .substitute import LossDelta, Substitution, loss_delta, substitute  # noqa: E402  (needs estimate() above)
