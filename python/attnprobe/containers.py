"""Writers of attnprobe's three dump containers (docs/dumps.md): HDF5, safetensors and .npz, and the
captured layer they write.

    >>> import attnprobe
    >>> layer = attnprobe.Layer(q=q, k=k, v=v, scale=0.125, causal=1)   # numpy or torch, [B, H, N, P]
    >>> attnprobe.write_dump("model.safetensors", {"layer_00": layer}, dtype="bfloat16",
    ...                      model="my model", source="my texts")
    >>> layer.write("one-layer.npz")                   # the container from the name's extension
    >>> attnprobe.Layer(q=q, k=k, v=v).slice(head=3).n # one head of batch item 0, for estimate()

A layer holds q [B, H, N, P], k and v [B, Hkv, N, P|Pv] (grouped-query attention: Hkv divides H, query
head h reads kv head h // (H // Hkv); K/V are never repeated), optional dy [B, H, N, Pv] (upstream
gradients of each query head's attention output), optional lengths [B] (valid tokens per batch item), optional
rope_inv_freq [P/2] (the rotary embedding's inverse frequencies, rotate_half pairing), scale and causal.

Containers:
  - hdf5: /layer_NN/{q,k,v,dy,lengths,rope_inv_freq}, layer attributes scale and causal, root attributes model,
    source, created_by (and rope_layout = "half" with rotary frequencies); needs h5py; float16/32/64 (HDF5 has no
    bfloat16).
  - safetensors: written here by hand (no `safetensors` package needed): 8-byte little-endian header
    length, the JSON header (tensors layer_NN.q ... with dtype, shape, data_offsets; `__metadata__` string
    values model, source, created_by, layer_NN.scale, layer_NN.causal, rope_layout), then the raw little-endian bytes;
    float16/32/64 and bfloat16 (rounded to nearest even from float32, through torch when available).
  - npz: numpy's zip of .npy arrays layer_NN.q ..., 0-d arrays layer_NN.scale (float64) and
    layer_NN.causal (int64), 0-d strings model/source/created_by (and rope_layout); stored or deflated
    (compress=True).
Rotary frequencies are stored as float64 whatever ``dtype`` the dump's arrays take: they are not activations.
This module needs numpy only (h5py for HDF5; torch, where installed, for bfloat16 rounding).
"""
import dataclasses
import json
import math
import os
import re
import struct
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

FORMATS = ("hdf5", "safetensors", "npz")
DTYPES = ("float32", "float16", "bfloat16", "float64")
CREATED_BY = "attnprobe (Python package)"
_EXTENSIONS = {".h5": "hdf5", ".hdf5": "hdf5", ".safetensors": "safetensors", ".npz": "npz"}
_LAYER_NAME = re.compile(r"layer_(\d+)")


def as_numpy(x: Any, name: str) -> Optional[np.ndarray]:
    """numpy array of a numpy array or torch tensor (detached, on the CPU, bfloat16 widened to float32)."""
    if x is None or isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":  # numpy has no bfloat16; the widening is exact
            x = x.float()
        return x.numpy()
    if hasattr(x, "__array__"):
        return np.asarray(x)
    raise TypeError(f"{name} must be a numpy array or a torch tensor, got {type(x).__name__}")


def as_frequencies(rope_inv_freq) -> np.ndarray:
    """Rotary inverse frequencies (numpy or torch) as a float64 vector; their count and values are checked where
    they meet a head dim (check_layer, the core's Slice)."""
    array = np.asarray(as_numpy(rope_inv_freq, "rope_inv_freq"), dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"rope_inv_freq must be a vector of P/2 inverse frequencies, got shape {array.shape}")
    return array


@dataclasses.dataclass
class Layer:
    """One attention layer as a dump holds it: what :func:`attnprobe.capture` returns per layer and what
    :func:`write_dump` writes. Arrays are numpy (torch tensors are converted on construction).

    q [B, H, N, P], k [B, Hkv, N, P], v [B, Hkv, N, Pv]: Hkv divides H, query head h reads kv head
    h // (H // Hkv) (grouped-query K/V are kept unrepeated); N of q may be less than k's (a decode dump: the
    last N queries against the whole cache). ``scale`` None means 1/sqrt(P); ``causal`` 1: query i sees keys
    up to its own position. Score shaping (docs/dumps.md, "Score shaping"): ``bias`` an additive bias
    [B|1, H|1, Nq, Nk] (a 1 applies to every batch item or head), ``alibi_slopes`` one ALiBi slope per query
    head [H], ``softcap`` c > 0 (scores c·tanh(S/c)), applied before the bias unless ``bias_before_softcap``.
    ``rope_inv_freq`` [P/2]: the rotary embedding's inverse frequencies when q and k were rotated by Hugging Face's
    ``rotate_half`` pairing (channel f with f + P/2; e.g. ``model.model.rotary_emb.inv_freq``), written with the root
    attribute rope_layout = "half" for ``expected(stats=rope)`` (docs/dumps.md, "Rotary frequencies"); the
    positions are the tokens' indices from 0. ``out`` is the model's own per-head attention output [B, H, N, Pv]
    where capture saw it (never written:
    it is what validation compared against), ``error`` the relative Frobenius error validation measured,
    ``origin`` where the layer was captured (e.g. "scaled_dot_product_attention call 0").

        >>> layer = attnprobe.Layer(q=torch.randn(1, 4, 128, 32), k=..., v=..., causal=1)
        >>> layer.write("layer.h5")
        >>> attnprobe.exact(layer.slice(head=2, batch=0)).shape       # one head, as estimate() takes it
        (128, 32)
    """

    q: np.ndarray  # [B, H, N, P]
    k: np.ndarray  # [B, Hkv, N, P]
    v: np.ndarray  # [B, Hkv, N, Pv]
    scale: Optional[float] = None  # None: 1/sqrt(P)
    causal: int = 0
    dy: Optional[np.ndarray] = None  # [B, H, N, Pv]
    lengths: Optional[np.ndarray] = None  # [B] integers: valid keys per batch item
    window: Optional[int] = None  # with causal = 1: a sliding window of W keys (attribute window)
    q_positions: Optional[np.ndarray] = None  # [Nq] or [B, Nq] integers; None: the last Nq positions
    bias: Optional[np.ndarray] = None  # [B|1, H|1, Nq, Nk]: additive attention bias
    alibi_slopes: Optional[np.ndarray] = None  # [H]: ALiBi slope of each query head
    softcap: Optional[float] = None  # c > 0: scores c·tanh(S/c)
    bias_before_softcap: bool = False
    rope_inv_freq: Optional[np.ndarray] = None  # [P/2]: rotary inverse frequencies (rotate_half pairing)
    out: Optional[np.ndarray] = None  # [B, H, N, Pv]: the model's attention output, for validation only
    error: Optional[float] = None  # relative Frobenius error of exact attention against `out`
    origin: str = ""  # where capture found the layer

    def __post_init__(self):
        for name in ("q", "k", "v", "dy", "lengths", "q_positions", "bias", "alibi_slopes", "rope_inv_freq", "out"):
            setattr(self, name, as_numpy(getattr(self, name), name))

    @property
    def heads(self) -> int:
        return int(self.q.shape[1])

    @property
    def kv_heads(self) -> int:
        return int(self.k.shape[1])

    @property
    def effective_scale(self) -> float:
        return float(self.scale) if self.scale is not None else 1 / math.sqrt(self.q.shape[-1])

    def slice(self, head: int, batch: int = 0):
        """Head ``head`` of batch item ``batch`` as an :class:`attnprobe.Slice` (float64, its kv head by the
        grouped-query rule, the layer's scale and mask), for :func:`attnprobe.exact` and
        :func:`attnprobe.estimate`."""
        from . import Slice

        if not (0 <= head < self.heads and 0 <= batch < self.q.shape[0]):
            raise ValueError(f"head {head}, batch {batch} is outside this layer's {self.heads} heads and "
                             f"{self.q.shape[0]} batch items")
        g = head // (self.heads // self.kv_heads)
        mask = "full" if not self.causal else f"window:{self.window}" if self.window else "causal"
        n = self.q.shape[2] if self.lengths is None else int(self.lengths[batch])
        keys = self.k.shape[2] if self.lengths is None else n
        q = self.q[batch, head, :n] if self.q.shape[2] == self.k.shape[2] else self.q[batch, head]
        positions = None
        if self.q_positions is not None:
            positions = self.q_positions if self.q_positions.ndim == 1 else self.q_positions[batch]
        bias = head_bias(self.bias, batch, head)
        if bias is not None:
            bias = bias[:q.shape[0], :keys]
        return Slice(q, self.k[batch, g, :keys], self.v[batch, g, :keys], self.scale, mask=mask,
                     q_positions=positions, bias=bias, softcap=self.softcap,
                     alibi_slope=None if self.alibi_slopes is None else float(self.alibi_slopes[head]),
                     bias_before_softcap=bool(self.bias_before_softcap), rope_inv_freq=self.rope_inv_freq)

    def last(self, rows: int) -> "Layer":
        """A decode layer: the last ``rows`` query rows (and their dy and out) with the whole cache of keys
        and values, what ``rows`` decode steps of a causal model attend to; attnprobe places them at the
        cache's last positions."""
        n = self.q.shape[2]
        if not 1 <= rows <= n:
            raise ValueError(f"last={rows} must be between 1 and the {n} query rows")
        cut = lambda a: None if a is None else a[:, :, -rows:]  # noqa: E731
        return dataclasses.replace(self, q=self.q[:, :, -rows:], dy=cut(self.dy), out=cut(self.out),
                                   bias=None if self.bias is None else self.bias[:, :, -rows:])

    def write(self, path: Union[str, os.PathLike], format: Optional[str] = None, **options) -> None:
        """Writes this layer alone (as layer_00) to ``path``; options as :func:`write_dump`."""
        write_dump(path, {"layer_00": self}, format=format, **options)


class Layers(dict):
    """A mapping "layer_00" → :class:`Layer` (what :func:`attnprobe.capture` returns), in layer order, that
    writes itself: ``layers.write("model.safetensors")``; ``attnprobe.sweep(layers, ...)`` measures it
    without a file."""

    def write(self, path: Union[str, os.PathLike], format: Optional[str] = None, **options) -> None:
        """:func:`write_dump` of these layers: ``format`` hdf5 | safetensors | npz (default: from the
        extension .h5/.hdf5, .safetensors, .npz), ``dtype`` (default: the arrays' own float type), ``model``,
        ``source``, ``compress``."""
        write_dump(path, self, format=format, **options)

    def last(self, rows: int) -> "Layers":
        """Every layer's :meth:`Layer.last`: a decode dump of the last ``rows`` query rows."""
        return Layers((name, layer.last(rows)) for name, layer in self.items())


def layer_number(name: str) -> int:
    """The number of a layer name "layer_NN" (the dump's group name; docs/dumps.md)."""
    match = _LAYER_NAME.fullmatch(str(name))
    if not match:
        raise ValueError(f"layer name {name!r} is not layer_NN (e.g. 'layer_00'): attnprobe numbers layers by it")
    return int(match.group(1))


def _as_layer(item) -> Layer:
    if isinstance(item, Layer):
        return item
    if isinstance(item, (tuple, list)) and len(item) == 3:
        return Layer(*item)
    raise TypeError(f"expected an attnprobe.Layer or a (q, k, v) tuple, got {type(item).__name__}")


def _named(layers) -> list:
    """(group name, Layer) pairs of a list (numbered 0, 1, ...) or mapping (names kept) of layers; (q, k, v)
    tuples are layers with the default scale and a full mask."""
    if isinstance(layers, Mapping):
        pairs = sorted(((layer_number(k), k, v) for k, v in layers.items()), key=lambda t: t[0])
        numbers = [n for n, _, _ in pairs]
        if len(set(numbers)) != len(numbers):
            raise ValueError(f"two layer names give one number: {sorted(layers)}")
        return [(f"layer_{n:02d}", _as_layer(layer)) for n, _, layer in pairs]
    return [(f"layer_{i:02d}", _as_layer(layer)) for i, layer in enumerate(layers)]


def head_bias(bias: Optional[np.ndarray], batch: int, head: int) -> Optional[np.ndarray]:
    """The [Nq, Nk] bias of one (batch item, query head) of a layer's [B|1, H|1, Nq, Nk] bias (a 1 broadcasts), or
    None without one."""
    if bias is None:
        return None
    return bias[batch if bias.shape[0] > 1 else 0, head if bias.shape[1] > 1 else 0]


def check_layer(layer, index):
    """Raises ValueError unless q/k/v (and dy, lengths) have shapes attnprobe reads, and the layer holds
    nothing a dump cannot carry."""
    q, k, v = (np.asarray(a) for a in (layer.q, layer.k, layer.v))
    if not (q.ndim == k.ndim == v.ndim == 4):
        raise ValueError(f"layer {index}: q, k, v must be [B, H, N, P] (got {q.shape}, {k.shape}, {v.shape})")
    # A decode dump holds the last Nq <= Nk queries with the whole cache (docs/dumps.md, "Queries ≠ keys").
    if k.shape[:3] != v.shape[:3] or k.shape[0] != q.shape[0] or k.shape[2] < q.shape[2] or k.shape[3] != q.shape[3]:
        raise ValueError(f"layer {index}: q {q.shape}, k {k.shape}, v {v.shape} do not fit together")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"layer {index}: {q.shape[1]} query heads are not a multiple of {k.shape[1]} kv heads")
    want = (v.shape[0], q.shape[1], q.shape[2], v.shape[3])  # one upstream gradient per query row and head
    if layer.dy is not None and np.asarray(layer.dy).shape != want:
        raise ValueError(f"layer {index}: dy {np.asarray(layer.dy).shape} must be [B, H, N, Pv] = {want}")
    b, h, nq, nk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    if layer.bias is not None:
        bias = np.asarray(layer.bias)
        if bias.ndim != 4 or bias.shape[2:] != (nq, nk) or bias.shape[0] not in (1, b) or bias.shape[1] not in (1, h):
            raise ValueError(f"layer {index}: bias {bias.shape} must be [B|1, H|1, Nq, Nk] with B = {b}, H = {h}, "
                             f"Nq = {nq}, Nk = {nk}")
        if not np.all(np.isfinite(bias)):
            raise ValueError(f"layer {index}: bias holds non-finite values; mask keys with causal/window, or with a "
                             "large finite negative bias (e.g. -1e30)")
    if layer.alibi_slopes is not None:
        slopes = np.asarray(layer.alibi_slopes)
        if slopes.shape != (h,) or not np.all(np.isfinite(slopes)):
            raise ValueError(f"layer {index}: alibi_slopes {slopes.shape} must be {h} finite slopes, one per query head")
    if layer.softcap is not None and not (math.isfinite(layer.softcap) and layer.softcap >= 0):
        raise ValueError(f"layer {index}: softcap {layer.softcap} must be a positive number (or None)")
    if layer.rope_inv_freq is not None:
        freq, p = np.asarray(layer.rope_inv_freq), q.shape[3]
        if p % 2 or freq.shape != (p // 2,) or not np.issubdtype(freq.dtype, np.floating):
            raise ValueError(f"layer {index}: rope_inv_freq {freq.dtype} {freq.shape} must be {p // 2} floats, one "
                             f"inverse frequency per pair of channels of the head dim {p} (which must be even)")
        if not np.all(np.isfinite(freq) & (freq >= 0) & (freq <= 1e6)):
            raise ValueError(f"layer {index}: rope_inv_freq holds values that are not inverse frequencies (finite, "
                             "0 to 1e6)")


def bfloat16_bits(array):
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest even as torch's .to(torch.bfloat16)."""
    array = np.ascontiguousarray(array, dtype=np.float32)
    try:
        import torch

        return torch.from_numpy(array.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    except ImportError:
        bits = array.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded = np.where(np.isnan(array), 0x7FC0, rounded)
        return rounded.astype(np.uint16)


def bfloat16_to_float32(bits):
    """bfloat16 bit patterns (uint16) -> float32, exactly (the widening attnprobe does)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _shaping_attributes(layer) -> dict:
    """The layer's score-shaping attributes (name → number) that a dump stores, those set only."""
    out = {}
    if layer.softcap:
        out["softcap"] = float(layer.softcap)
    if layer.bias_before_softcap:
        out["bias_before_softcap"] = 1
    return out


def _integers(layer):
    """(member, int64 array) of one layer: lengths and q_positions where given."""
    return [(name, np.asarray(value, dtype=np.int64)) for name, value in
            (("lengths", layer.lengths), ("q_positions", layer.q_positions)) if value is not None]


def _scale(layer):
    return float(layer.scale if layer.scale is not None else 1 / math.sqrt(np.asarray(layer.q).shape[-1]))


def _tensors(layer, dtype):
    """(member, array, stored dtype name) of one layer in write order: q, k, v, dy, bias, alibi_slopes,
    rope_inv_freq (those present). dtype None keeps each array's own float type (float16/32/64; anything else is
    stored as float32); rotary frequencies are float64 always."""
    out = [("q", layer.q), ("k", layer.k), ("v", layer.v)]
    for name in ("dy", "bias", "alibi_slopes"):
        if getattr(layer, name) is not None:
            out.append((name, getattr(layer, name)))
    result = []
    for name, array in out:
        array = np.asarray(array)
        stored = dtype or (array.dtype.name if array.dtype.name in ("float16", "float32", "float64") else "float32")
        result.append((name, array, stored))
    if layer.rope_inv_freq is not None:
        result.append(("rope_inv_freq", np.asarray(layer.rope_inv_freq), "float64"))
    return result


def _rope_layout(named) -> dict:
    """The root attribute that says how rotary frequencies pair channels, when a layer gives them."""
    return {"rope_layout": "half"} if any(layer.rope_inv_freq is not None for _, layer in named) else {}


def _checked(layers) -> list:
    named = _named(layers)
    if not named:
        raise ValueError("no layers to write")
    for name, layer in named:
        check_layer(layer, name)
    return named


def write_hdf5(path, layers, dtype=None, model="", source="", compress=True):
    import h5py

    if dtype == "bfloat16":
        raise ValueError("HDF5 has no bfloat16: write float16/float32, or use format='safetensors'")
    named = _checked(layers)
    with h5py.File(path, "w", track_order=True) as f:
        f.attrs["model"] = model
        f.attrs["source"] = source
        f.attrs["created_by"] = CREATED_BY
        for name, value in _rope_layout(named).items():
            f.attrs[name] = value
        for group_name, layer in named:
            group = f.create_group(group_name, track_order=True)
            group.attrs["scale"] = _scale(layer)
            group.attrs["causal"] = int(layer.causal)
            if layer.window is not None:
                group.attrs["window"] = int(layer.window)
            for name, value in _shaping_attributes(layer).items():
                group.attrs[name] = value
            for name, array, stored in _tensors(layer, dtype):
                options = {}
                if compress and array.ndim == 4:
                    options = dict(chunks=(1, 1, min(array.shape[2], 1024), array.shape[3]), compression="gzip",
                                   compression_opts=9, shuffle=True)
                group.create_dataset(name, data=array.astype(stored), track_times=False, **options)
            for name, array in _integers(layer):
                group.create_dataset(name, data=array, track_times=False)


_SAFETENSORS_DTYPES = {"float16": ("F16", "<f2"), "float32": ("F32", "<f4"), "float64": ("F64", "<f8")}


def write_safetensors(path, layers, dtype=None, model="", source=""):
    named = _checked(layers)
    metadata = {"model": model, "source": source, "created_by": CREATED_BY, **_rope_layout(named)}
    header = {}
    blobs = []
    offset = 0

    def add(name, code, raw):
        nonlocal offset
        header[name] = {"dtype": code, "shape": list(raw.shape), "data_offsets": [offset, offset + raw.nbytes]}
        blobs.append(raw)
        offset += raw.nbytes

    for prefix, layer in named:
        metadata[f"{prefix}.scale"] = repr(_scale(layer))
        metadata[f"{prefix}.causal"] = str(int(layer.causal))
        if layer.window is not None:
            metadata[f"{prefix}.window"] = str(int(layer.window))
        for name, value in _shaping_attributes(layer).items():
            metadata[f"{prefix}.{name}"] = repr(value)
        for name, array, stored in _tensors(layer, dtype):
            if stored == "bfloat16":
                raw = np.ascontiguousarray(bfloat16_bits(array).astype("<u2"))
                add(f"{prefix}.{name}", "BF16", raw)
            else:
                code, numpy_type = _SAFETENSORS_DTYPES[stored]
                add(f"{prefix}.{name}", code, np.ascontiguousarray(array.astype(numpy_type)))
        for name, array in _integers(layer):
            add(f"{prefix}.{name}", "I64", np.ascontiguousarray(array.astype("<i8")))
    header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the reference writer pads
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw.tobytes())


def write_npz(path, layers, dtype=None, model="", source="", compress=True):
    if dtype == "bfloat16":
        raise ValueError("numpy has no bfloat16: write float16/float32, or use format='safetensors'")
    named = _checked(layers)
    arrays = {"model": np.array(model), "source": np.array(source), "created_by": np.array(CREATED_BY)}
    arrays.update((name, np.array(value)) for name, value in _rope_layout(named).items())
    for prefix, layer in named:
        for name, array, stored in _tensors(layer, dtype):
            arrays[f"{prefix}.{name}"] = array.astype(stored)
        arrays[f"{prefix}.scale"] = np.array(_scale(layer), dtype=np.float64)
        arrays[f"{prefix}.causal"] = np.array(int(layer.causal), dtype=np.int64)
        if layer.window is not None:
            arrays[f"{prefix}.window"] = np.array(int(layer.window), dtype=np.int64)
        for name, value in _shaping_attributes(layer).items():
            arrays[f"{prefix}.{name}"] = np.array(value)
        for name, array in _integers(layer):
            arrays[f"{prefix}.{name}"] = array
    with open(path, "wb") as f:  # a file object: numpy would append .npz to a name without it
        (np.savez_compressed if compress else np.savez)(f, **arrays)


def container_of(path: Union[str, os.PathLike], format: Optional[str] = None) -> str:
    """The container to write: ``format`` if given, else the one the name's extension says."""
    if format is None:
        extension = os.path.splitext(os.fspath(path))[1].lower()
        if extension not in _EXTENSIONS:
            raise ValueError(f"cannot tell the container from the name {os.fspath(path)!r}: pass format='hdf5', "
                             "'safetensors' or 'npz' (or name it .h5, .safetensors or .npz)")
        return _EXTENSIONS[extension]
    if format not in FORMATS:
        raise ValueError(f"unknown container {format!r}: use one of {', '.join(FORMATS)}")
    return format


def write_dump(path: Union[str, os.PathLike], layers: Union[Mapping[str, Layer], Sequence[Layer]],
               format: Optional[str] = None, *, dtype: Optional[str] = None, model: str = "", source: str = "",
               compress: bool = True) -> None:
    """Writes ``layers`` to ``path`` as a dump every attnprobe command reads (docs/dumps.md).

    ``layers``: a mapping "layer_NN" → :class:`Layer` (names kept, e.g. :func:`attnprobe.capture`'s result)
    or a list of Layers (numbered layer_00, layer_01, ...). ``format``: "hdf5" (needs h5py), "safetensors"
    or "npz"; default from the extension (.h5/.hdf5, .safetensors, .npz). ``dtype``: None keeps each
    array's float type (float32 stays float32: the dump then reproduces the model's attention to float32
    rounding), or "float16", "float32", "float64", "bfloat16" (safetensors only). ``compress``: gzip for
    HDF5, deflate for npz.

        >>> attnprobe.write_dump("model.npz", [attnprobe.Layer(q=q, k=k, v=v, causal=1)])
        >>> # attnprobe info model.npz; attnprobe eval model.npz -e 'performer(M=64)'
    """
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: use one of {', '.join(DTYPES)} (or None: the arrays' own)")
    fmt = container_of(path, format)
    path = os.fspath(path)
    if fmt == "hdf5":
        write_hdf5(path, layers, dtype, model, source, compress)
    elif fmt == "safetensors":
        write_safetensors(path, layers, dtype, model, source)
    else:
        write_npz(path, layers, dtype, model, source, compress)
