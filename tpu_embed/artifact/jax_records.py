"""jax-tpu-embedding's input arrays in the shard records, encoded and decoded with numpy (no TensorFlow, no jax).

    fmt_jax = jax_format(layout)                 # the manifest's shards.format["jax"] (ShardFormat.jax)
    features = encode_jax_features(batches, fmt_jax)   # {key: (kind, values)} added to a host's step record
    decode_step(record, fmt_jax)                 # {stack: (row_pointers, embedding_ids, sample_ids, gains)}

A step record (one `tf.train.Example` per host per step, `tpu_embed.artifact.shard_records`) of an artifact
whose `shards.layout` is `jax` or `both` holds, per jax stack (i: its index in `fmt_jax["stacks"]`, the
order of jax's stacking):

    jax/<i>/rp    int32   [local devices x row_pointers_size_per_device]  every row pointer jax writes
    jax/<i>/eid   int32   [sum of segment sizes]  embedding ids of each (device, local SparseCore) segment,
                                                  up to its aligned end (padding entries 2**31-1 included)
    jax/<i>/sid   int32   [same]                  sample ids (within the SparseCore), padding 2**31-1
    jax/<i>/g     float32 [same]                  gains, padding NaN; left out when every real gain is 1.0
    jax/<i>/st    int64 list: dropped ids, then jax's statistics of the step: max_ids_per_partition
                  [local devices x all SCs], max_unique_ids_per_partition [same], required_buffer_size
                  [local devices x SCs per device]

Arrays are raw little-endian bytes in a bytes_list of one element. A segment's size is its last row
pointer rounded up to 8 (`segment_sizes`), so the arrays need no other bookkeeping. `decode_step` rebuilds
exactly what `embedding.preprocess_sparse_dense_matmul_input` returns for the host (its `lhs_*` dicts),
with the tail of each segment's buffer, which jax leaves unwritten, filled with the padding values.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from tpu_embed.artifact.example_wire import decode_example
from tpu_embed.sparsecore.jax_layout import ALIGN, PAD_ID, JaxHostBatch, JaxLayout, round_up

KEY_PREFIX = "jax"
ARRAYS = ("rp", "eid", "sid", "g", "st")


def jax_format(layout: JaxLayout) -> dict:
    """The manifest's description of the jax records (`ShardFormat.jax`): jax's stacking and static sizes; each
    stack's COO buffer size per device and largest partitions are null here and filled by the shard job with
    their maxima over the run (`with_static_sizes`)."""
    d = layout.to_json()
    d["local_devices"] = layout.local_devices
    d["row_pointers_size_per_device"] = layout.row_pointers_size_per_device
    for s in d["stacks"]:
        s.update(dict.fromkeys(STATIC_SIZES))
    return d


def key(index: int, array: str) -> str:
    return f"{KEY_PREFIX}/{index}/{array}"


# What the shard job records of each jax stack, as the maximum over every step and host (the jobs' counters
# of that name, `max/jax/<i>/<name>`): `coo_buffer_size_per_device` is the static COO buffer per device that
# holds every step (so `decode_step` gives one shape for the whole artifact, what `jax.jit` needs), the two
# others the largest partition of any step (the limits that drop nothing).
STATIC_SIZES = ("coo_buffer_size_per_device", "max_ids_per_partition", "max_unique_ids_per_partition")


def max_counter(index: int, name: str) -> str:
    """The shard job's counter of stack `index`'s maximum `name` (one of `STATIC_SIZES`)."""
    return f"max/{KEY_PREFIX}/{index}/{name}"


def with_static_sizes(fmt_jax: Mapping, maxima: Mapping[str, int]) -> dict:
    """`fmt_jax` with each stack's `STATIC_SIZES` from the job's counters (`max_counter`); a stack no step
    reached keeps null."""
    d = dict(fmt_jax)
    d["stacks"] = [dict(s, **{n: maxima[max_counter(i, n)] for n in STATIC_SIZES if max_counter(i, n) in maxima})
                   for i, s in enumerate(fmt_jax["stacks"])]
    return d


def _raw(a: np.ndarray, dtype) -> Tuple[str, List[Any]]:
    return "bytes", [np.ascontiguousarray(a, dtype=np.dtype(dtype).newbyteorder("<")).data.cast("B")]


def encode_jax_features(batches: Mapping[str, JaxHostBatch], fmt_jax: Mapping) -> Dict[str, Tuple[str, Any]]:
    """The record features of one host's step (`JaxHostBatch` per stack, from
    `tpu_embed.sparsecore.jax_layout.pack_host`)."""
    out: Dict[str, Tuple[str, Any]] = {}
    for i, s in enumerate(fmt_jax["stacks"]):
        b = batches[s["name"]]
        out[key(i, "rp")] = _raw(b.row_pointers.reshape(-1), np.int32)
        out[key(i, "eid")] = _raw(b.embedding_ids, np.int32)
        out[key(i, "sid")] = _raw(b.sample_ids, np.int32)
        real = b.sample_ids != PAD_ID
        if not np.all(b.gains[real] == np.float32(1)):
            out[key(i, "g")] = _raw(b.gains, np.float32)
        out[key(i, "st")] = ("int64", [int(b.dropped_ids)] + b.max_ids_per_partition.tolist()
                             + b.max_unique_ids_per_partition.tolist() + b.required_buffer_size.tolist())
    return out


def segment_sizes(row_pointers: np.ndarray, fmt_jax: Mapping) -> np.ndarray:
    """[local devices, SCs per device]: each segment's prefix length, its last row pointer rounded up to 8."""
    L, nsc = int(fmt_jax["local_devices"]), int(fmt_jax["num_sc_per_device"])
    blocks = np.asarray(row_pointers, np.int64).reshape(L * nsc, -1)
    return round_up(blocks[:, -1], ALIGN).reshape(L, nsc)


def _parsed(record: Union[bytes, Mapping]) -> Mapping:
    return decode_example(record) if isinstance(record, (bytes, bytearray, memoryview)) else record


def _array(ex: Mapping, k: str, dtype) -> np.ndarray:
    kind, values = ex[k]
    return np.frombuffer(values[0], dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)


def decode_batches(record: Union[bytes, Mapping], fmt_jax: Mapping) -> Dict[str, JaxHostBatch]:
    """{stack: JaxHostBatch} of one record (`record`: its bytes, or `decode_example` of them)."""
    ex = _parsed(record)
    L, nsc = int(fmt_jax["local_devices"]), int(fmt_jax["num_sc_per_device"])
    S = int(fmt_jax["num_devices"]) * nsc
    out = {}
    for i, s in enumerate(fmt_jax["stacks"]):
        if key(i, "rp") not in ex:
            raise ValueError(f"the record has no {key(i, 'rp')}: it holds no jax arrays for stack {s['name']!r} "
                             "(the artifact's shards.layout is not jax or both).")
        rp = _array(ex, key(i, "rp"), np.int32).reshape(L, -1)
        eid = _array(ex, key(i, "eid"), np.int32)
        sid = _array(ex, key(i, "sid"), np.int32)
        if key(i, "g") in ex:
            g = _array(ex, key(i, "g"), np.float32)
        else:
            g = np.where(sid == PAD_ID, np.float32(np.nan), np.float32(1)).astype(np.float32)
        st = np.asarray(ex[key(i, "st")][1], np.int64)
        sizes = segment_sizes(rp, fmt_jax)
        if int(sizes.sum()) != eid.size or eid.size != sid.size or sid.size != g.size:
            raise ValueError(f"jax stack {s['name']!r}: the record's arrays ({eid.size}, {sid.size}, {g.size} "
                             f"entries) do not match its row pointers ({int(sizes.sum())}): a damaged record.")
        a, b = 1, 1 + L * S
        out[s["name"]] = JaxHostBatch(
            row_pointers=rp, embedding_ids=eid, sample_ids=sid, gains=g, segment_sizes=sizes,
            max_ids_per_partition=st[a:b].astype(np.int32),
            max_unique_ids_per_partition=st[b:b + L * S].astype(np.int32),
            required_buffer_size=st[b + L * S:].astype(np.int32), dropped_ids=int(st[0]))
    return out


def decode_step(record: Union[bytes, Mapping], fmt_jax: Mapping, *, has_leading_dimension: bool = False,
                coo_buffer_sizes: Optional[Mapping[str, int]] = None
                ) -> Dict[str, Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """{stack: (row_pointers, embedding_ids, sample_ids, gains)} of one host's step, as jax-tpu-embedding's
    `preprocess_sparse_dense_matmul_input` returns them for the host's local devices (int32, int32, int32,
    float32; [devices, size] with `has_leading_dimension`, else flat).

    `coo_buffer_sizes`: {stack: COO buffer size per device} (the stacks' `suggested_coo_buffer_size_per_device`,
    e.g. from `tpu-embed plan --format jax-fdo`), else the format's recorded size, else the least that holds
    this step (which may differ from step to step: give static sizes under `jax.jit`). A size too small for the
    step is a ValueError (jax would drop ids).
    """
    out = {}
    for name, b in decode_batches(record, fmt_jax).items():
        size = (coo_buffer_sizes or {}).get(name)
        if size is None:
            size = next(s for s in fmt_jax["stacks"] if s["name"] == name).get("coo_buffer_size_per_device")
        out[name] = b.buffers(size, has_leading_dimension)
    return out


def num_minibatches(fmt_jax: Mapping, has_leading_dimension: bool = False) -> np.ndarray:
    """The `num_minibatches` jax's PreprocessedInput carries without minibatching: 1 per local device."""
    L = int(fmt_jax["local_devices"])
    a = np.full(L, 1)
    return a.reshape(L, 1) if has_leading_dimension else a
