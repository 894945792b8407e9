#!/usr/bin/python3
"""Writers of attnprobe's three dump containers (docs/dumps.md): HDF5, safetensors and .npz.

Importable by any dumper (tools/dump_qkv.py, other model readers):

    import dump_containers
    layers = [dump_containers.Layer(q=q, k=k, v=v, scale=0.125, causal=1)]   # numpy float32 [B, H, N, P]
    dump_containers.write("model.safetensors", layers, fmt="safetensors", dtype="bfloat16",
                          model="my model", source="my texts")

Each layer holds q [B, H, N, P], k and v [B, Hkv, N, P|Pv] (grouped-query attention: Hkv divides H, query
head h reads kv head h // (H // Hkv); K/V are never repeated), optional dy [B, H, N, Pv] (upstream
gradients of each query head's attention output), optional lengths [B] (valid tokens per batch item), scale and causal.

Containers:
  - hdf5: /layer_NN/{q,k,v,dy,lengths}, layer attributes scale and causal, root attributes model, source,
    created_by; needs h5py; float16/32/64 (HDF5 has no bfloat16).
  - safetensors: written here by hand (no `safetensors` package needed): 8-byte little-endian header
    length, the JSON header (tensors layer_NN.q ... with dtype, shape, data_offsets; `__metadata__` string
    values model, source, created_by, layer_NN.scale, layer_NN.causal), then the raw little-endian bytes;
    float16/32/64 and bfloat16 (rounded to nearest even from float32, through torch when available).
  - npz: numpy's zip of .npy arrays layer_NN.q ..., 0-d arrays layer_NN.scale (float64) and
    layer_NN.causal (int64), 0-d strings model/source/created_by; stored or deflated (compress=True).
"""
import dataclasses
import json
import math
import struct
from typing import Optional

import numpy as np

FORMATS = ("hdf5", "safetensors", "npz")
DTYPES = ("float32", "float16", "bfloat16", "float64")
CREATED_BY = "attnprobe tools/dump_containers.py"


@dataclasses.dataclass
class Layer:
    q: np.ndarray  # [B, H, N, P]
    k: np.ndarray  # [B, Hkv, N, P]
    v: np.ndarray  # [B, Hkv, N, Pv]
    scale: Optional[float] = None  # None: 1/sqrt(P)
    causal: int = 0
    dy: Optional[np.ndarray] = None  # [B, H, N, Pv]
    lengths: Optional[np.ndarray] = None  # [B] integers: valid keys per batch item
    window: Optional[int] = None  # with causal = 1: a sliding window of W keys (attribute window)
    q_positions: Optional[np.ndarray] = None  # [Nq] or [B, Nq] integers; None: the last Nq positions


def check_layer(layer, index):
    """Raises ValueError unless q/k/v (and dy, lengths) have shapes attnprobe reads."""
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


def _integers(layer):
    """(member, int64 array) of one layer: lengths and q_positions where given."""
    return [(name, np.asarray(value, dtype=np.int64)) for name, value in
            (("lengths", layer.lengths), ("q_positions", layer.q_positions)) if value is not None]


def _scale(layer):
    return float(layer.scale if layer.scale is not None else 1 / math.sqrt(np.asarray(layer.q).shape[-1]))


def _tensors(layer):
    """(member, array) of one layer in write order: q, k, v, dy (floating), lengths (int64)."""
    out = [("q", layer.q), ("k", layer.k), ("v", layer.v)]
    if layer.dy is not None:
        out.append(("dy", layer.dy))
    return out


def write_hdf5(path, layers, dtype="float16", model="", source="", compress=True):
    import h5py

    if dtype == "bfloat16":
        raise ValueError("HDF5 has no bfloat16: write float16/float32, or use --format safetensors")
    with h5py.File(path, "w", track_order=True) as f:
        f.attrs["model"] = model
        f.attrs["source"] = source
        f.attrs["created_by"] = CREATED_BY
        for li, layer in enumerate(layers):
            check_layer(layer, li)
            group = f.create_group(f"layer_{li:02d}", track_order=True)
            group.attrs["scale"] = _scale(layer)
            group.attrs["causal"] = int(layer.causal)
            if layer.window is not None:
                group.attrs["window"] = int(layer.window)
            for name, array in _tensors(layer):
                array = np.asarray(array)
                options = {}
                if compress:
                    options = dict(chunks=(1, 1, min(array.shape[2], 1024), array.shape[3]), compression="gzip",
                                   compression_opts=9, shuffle=True)
                group.create_dataset(name, data=array.astype(dtype), track_times=False, **options)
            for name, array in _integers(layer):
                group.create_dataset(name, data=array, track_times=False)


_SAFETENSORS_DTYPES = {"float16": ("F16", "<f2"), "float32": ("F32", "<f4"), "float64": ("F64", "<f8")}


def write_safetensors(path, layers, dtype="float16", model="", source=""):
    metadata = {"model": model, "source": source, "created_by": CREATED_BY}
    header = {}
    blobs = []
    offset = 0

    def add(name, code, raw):
        nonlocal offset
        header[name] = {"dtype": code, "shape": list(raw.shape), "data_offsets": [offset, offset + raw.nbytes]}
        blobs.append(raw)
        offset += raw.nbytes

    for li, layer in enumerate(layers):
        check_layer(layer, li)
        prefix = f"layer_{li:02d}"
        metadata[f"{prefix}.scale"] = repr(_scale(layer))
        metadata[f"{prefix}.causal"] = str(int(layer.causal))
        if layer.window is not None:
            metadata[f"{prefix}.window"] = str(int(layer.window))
        for name, array in _tensors(layer):
            if dtype == "bfloat16":
                raw = np.ascontiguousarray(bfloat16_bits(array).astype("<u2"))
                add(f"{prefix}.{name}", "BF16", raw)
            else:
                code, numpy_type = _SAFETENSORS_DTYPES[dtype]
                add(f"{prefix}.{name}", code, np.ascontiguousarray(np.asarray(array).astype(numpy_type)))
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


def write_npz(path, layers, dtype="float16", model="", source="", compress=True):
    if dtype == "bfloat16":
        raise ValueError("numpy has no bfloat16: write float16/float32, or use --format safetensors")
    arrays = {"model": np.array(model), "source": np.array(source), "created_by": np.array(CREATED_BY)}
    for li, layer in enumerate(layers):
        check_layer(layer, li)
        prefix = f"layer_{li:02d}"
        for name, array in _tensors(layer):
            arrays[f"{prefix}.{name}"] = np.asarray(array).astype(dtype)
        arrays[f"{prefix}.scale"] = np.array(_scale(layer), dtype=np.float64)
        arrays[f"{prefix}.causal"] = np.array(int(layer.causal), dtype=np.int64)
        if layer.window is not None:
            arrays[f"{prefix}.window"] = np.array(int(layer.window), dtype=np.int64)
        for name, array in _integers(layer):
            arrays[f"{prefix}.{name}"] = array
    with open(path, "wb") as f:  # a file object: numpy would append .npz to a name without it
        (np.savez_compressed if compress else np.savez)(f, **arrays)


def write(path, layers, fmt="hdf5", dtype="float16", model="", source="", compress=True):
    """Writes `layers` (a list of Layer) to `path` in container `fmt` (hdf5 | safetensors | npz)."""
    if fmt == "hdf5":
        write_hdf5(path, layers, dtype, model, source, compress)
    elif fmt == "safetensors":
        write_safetensors(path, layers, dtype, model, source)
    elif fmt == "npz":
        write_npz(path, layers, dtype, model, source, compress)
    else:
        raise ValueError(f"unknown container '{fmt}': use one of {', '.join(FORMATS)}")
