"""Readable reference of jax-tpu-embedding's CSR packing: `pack_host_reference`, one id at a time.

A per-id transcription of jax-tpu-embedding's C++ loops (`ExtractCooTensors`, `SortAndGroup`, `FillBuffer`):
the yardstick `tpu_embed.sparsecore.jax_layout.pack_host` (vectorised) is tested against, and small enough to
read next to the C++. float32 arithmetic is done one operation at a time with numpy float32 scalars, with
denormals flushed as jax's preprocessing threads compute (`tpu_embed.sparsecore.denormals`).
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Sequence, Tuple

import numpy as np

from tpu_embed.sparsecore import denormals
from tpu_embed.sparsecore.jax_layout import ALIGN, PAD_ID, HostFeature, JaxHostBatch, JaxLayout, JaxStack

# (column, sample row, gain, extraction index) of one id, as ExtractCooTensors makes it.
Coo = Tuple[int, int, np.float32, int]


def _scalar(op, *args) -> np.float32:
    """A `tpu_embed.sparsecore.denormals` operation on scalars."""
    return np.float32(op(*(np.asarray([a]) for a in args))[0])


def _divisor(combiner: str, ws: Sequence[np.float32]) -> np.float32:
    """The divisor of one sample's gains: 1 (sum), the sum of its weights (mean), or the root of the sum of their
    squares (sqrtn), summed left to right."""
    if combiner == "sum":
        return np.float32(1)
    if combiner == "mean":
        div = np.float32(0)
        for x in ws:
            div = _scalar(denormals.add, div, x)
        return div
    acc = np.float32(0)
    for x in ws:
        x = _scalar(denormals.flush, x)
        acc = _scalar(denormals.to_float32, np.float64(acc) + np.float64(x) * np.float64(x))
    return np.float32(np.sqrt(acc))


def _extract_coo(layout: JaxLayout, st: JaxStack, features: Mapping[str, HostFeature], device: int, sc: int,
                 weighted: bool) -> List[Coo]:
    """ExtractCooTensors: the ids of local SparseCore `sc` of `device`, in extraction order (feature by feature,
    sample by sample), each with its rewritten column, its sample row and its gain."""
    nsc, S = layout.num_sc_per_device, layout.num_scs
    coo: List[Coo] = []
    for f in st.features:
        hf = features[f.name]
        splits = [int(x) for x in hf.row_splits]
        ids = [int(x) for x in hf.ids]
        w = None if hf.weights is None else [np.float32(x) for x in hf.weights]
        n_f = f.samples_per_sc
        row_offset = sc * st.batch_size_per_sc + f.row_offset // S
        start = (device * nsc + sc) * n_f
        for r in range(start, start + n_f):
            vals = ids[splits[r]:splits[r + 1]]
            ws = [np.float32(1)] * len(vals) if w is None else w[splits[r]:splits[r + 1]]
            div = _divisor(st.combiner, ws)
            for v, x in zip(vals, ws):
                c = ((v + f.col_shift) & (S - 1)) + (v & ~(S - 1)) + f.col_offset
                gain = _scalar(denormals.divide, x, div) if (weighted or st.combiner != "sum") \
                    else np.float32(1)
                coo.append((c, r - start + row_offset, gain, len(coo)))
    return coo


def _sort_and_group(coo: List[Coo], S: int) -> List[List]:
    """SortAndGroup: the ids sorted by (destination SC, column >> log2 S, sample row, extraction index), equal
    (column, row) pairs merged by adding their gains left to right. [column, row, gain] each."""
    coo = sorted(coo, key=lambda e: (e[0] & (S - 1), e[0] >> (S.bit_length() - 1), e[1], e[3]))
    grouped: List[List] = []
    for c, r, gain, _ in coo:
        if grouped and grouped[-1][0] == c and grouped[-1][1] == r:
            grouped[-1][2] = _scalar(denormals.add, grouped[-1][2], gain)
        else:
            grouped.append([c, r, gain])
    return grouped


def _fill_buffer(grouped: List[List], S: int, bps: int, max_ids: np.ndarray, max_uniq: np.ndarray
                 ) -> Tuple[List[int], List[int], List[int], List[np.float32]]:
    """FillBuffer: one local SparseCore's (row pointers, embedding ids, sample ids, gains), per destination its
    ids then padding to a multiple of 8; `max_ids` / `max_uniq` [destinations] raised to its partitions'."""
    rp: List[int] = []
    eid: List[int] = []
    sid: List[int] = []
    gs: List[np.float32] = []
    for dest in range(S):
        entries = [e for e in grouped if e[0] & (S - 1) == dest]
        max_ids[dest] = max(max_ids[dest], len(entries))
        max_uniq[dest] = max(max_uniq[dest], len({e[0] for e in entries}))
        for c, r, gain in entries:
            eid.append(c // S)
            sid.append(r % bps)
            gs.append(gain)
        rp.append(len(eid))
        while len(eid) % ALIGN:
            eid.append(PAD_ID)
            sid.append(PAD_ID)
            gs.append(np.float32(np.nan))
    rp += [len(eid)] * max(0, ALIGN - S)
    return rp, eid, sid, gs


def _pack_stack_reference(layout: JaxLayout, st: JaxStack, features: Mapping[str, HostFeature]) -> JaxHostBatch:
    L, nsc, S = layout.local_devices, layout.num_sc_per_device, layout.num_scs
    weighted = any(features[f.name].weights is not None for f in st.features)
    rp_all: List[int] = []
    eid_all: List[int] = []
    sid_all: List[int] = []
    g_all: List[np.float32] = []
    sizes = []
    max_ids = np.zeros((L, S), np.int32)
    max_uniq = np.zeros((L, S), np.int32)
    for d in range(L):
        for s in range(nsc):
            grouped = _sort_and_group(_extract_coo(layout, st, features, d, s, weighted), S)
            rp, eid, sid, gs = _fill_buffer(grouped, S, st.batch_size_per_sc, max_ids[d], max_uniq[d])
            rp_all += rp
            eid_all += eid
            sid_all += sid
            g_all += gs
            sizes.append(len(eid))
    return JaxHostBatch(
        row_pointers=np.asarray(rp_all, np.int32).reshape(L, -1), embedding_ids=np.asarray(eid_all, np.int32),
        sample_ids=np.asarray(sid_all, np.int32), gains=np.asarray(g_all, np.float32),
        segment_sizes=np.asarray(sizes, np.int64).reshape(L, nsc),
        max_ids_per_partition=max_ids.reshape(-1), max_unique_ids_per_partition=max_uniq.reshape(-1),
        required_buffer_size=np.asarray(sizes, np.int32))


def pack_host_reference(layout: JaxLayout, features: Mapping[str, HostFeature]) -> Dict[str, JaxHostBatch]:
    """`tpu_embed.sparsecore.jax_layout.pack_host`, transcribed id by id from jax's C++ loops."""
    return {st.name: _pack_stack_reference(layout, st, features) for st in layout.stacks}
