"""Fast SparseCore CSR packing: the same output as `csr_reference`, vectorised.

Every feature of a stack is concatenated first, so the work per stack is a
fixed number of numpy calls whatever the number of features.  The one sort
is an `np.sort` of packed int64 keys (local SC | destination SC | token |
position), which is several times faster than `np.argsort`.  float32 sums
that TF does sequentially (combiner weights, merged duplicates) are done
sequentially too, one position-within-segment at a time, because numpy's
pairwise reductions round differently.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

from tpu_embed.sparsecore.csr_types import PAD_VALUE, XLA_PAD, CsrBatch, StackLimits, buffer_sizes
from tpu_embed.sparsecore.inputs import FeatureIds
from tpu_embed.sparsecore.layout import SparseCoreLayout, StackLayout, round_up

_COMBINER_CODE = {"sum": 0, "mean": 1, "sqrtn": 2}
_PAD_GAIN = np.float32(PAD_VALUE)


def sequential_segment_sum(values: np.ndarray, seg_of: np.ndarray, seg_first: np.ndarray) -> np.ndarray:
    """float32 sums of contiguous segments, added left to right as a C loop would.

    `seg_of[i]` is the segment of element i (non-decreasing), `seg_first[s]` the
    index of segment s's first element.
    """
    out = values[seg_first].copy()
    n = values.size
    if n == seg_first.size:
        return out
    offset = np.arange(n, dtype=np.int64) - seg_first[seg_of]
    rest = np.flatnonzero(offset)
    rest_off = offset[rest]
    order = np.argsort(rest_off, kind="stable")
    rest = rest[order]
    bounds = np.searchsorted(rest_off[order], np.arange(1, int(rest_off.max()) + 2))
    for k in range(bounds.size - 1):
        idx = rest[bounds[k]:bounds[k + 1]]
        seg = seg_of[idx]
        out[seg] = out[seg] + values[idx]
    return out


def _runs(same_as_prev: np.ndarray, n: int):
    """Segments of equal neighbours: (first index of each run, run of each element)."""
    starts = np.empty(n, dtype=bool)
    starts[0] = True
    np.logical_not(same_as_prev, out=starts[1:])
    first = np.flatnonzero(starts)
    run_of = np.cumsum(starts, dtype=np.int64) - 1
    return first, run_of


class _Sorted:
    """A stack's ids for one chip after combiner, rotation, sort and dedup."""

    __slots__ = ("hi", "srow", "gain", "tbits", "ids_pp", "uniq_pp")


def sort_stack(stack: StackLayout, layout: SparseCoreLayout, feature_ids: Dict[str, FeatureIds]) -> _Sorted:
    topo = layout.topology
    nsc, S = topo.num_sc_per_chip, topo.num_sparse_cores
    log2s = S.bit_length() - 1
    mask = S - 1
    feats = layout.stack_features(stack.name)
    parts = [feature_ids[f.path] for f in feats]
    counts = np.array([p.ids.size for p in parts], dtype=np.int64)
    n = int(counts.sum())

    # Global sample index inside the stack's per-chip samples.
    offsets = np.array([f.sample_offset for f in feats], dtype=np.int64)
    grow = np.concatenate([p.rows + o for p, o in zip(parts, offsets)]) if n else np.zeros(0, np.int64)
    ids = np.concatenate([p.ids for p in parts]) if n else np.zeros(0, np.int64)
    weighted = any(p.weights is not None for p in parts)
    if weighted:
        w = np.concatenate([p.weights if p.weights is not None else np.ones(p.ids.size, np.float32)
                            for p in parts])
    else:
        w = None

    codes = np.array([_COMBINER_CODE[f.combiner] for f in feats], dtype=np.int8)
    sizes_f = np.array([f.sample_count for f in feats], dtype=np.int64)

    # 1. Merge adjacent duplicates (same sample, same id), as ConvertToList...CooTensors does.
    if n > 1:
        adj = (grow[1:] == grow[:-1]) & (ids[1:] == ids[:-1])
        has_adj = bool(adj.any())
    else:
        has_adj = False
    if has_adj:
        first, run_of = _runs(adj, n)
        wf = w if w is not None else np.ones(n, np.float32)
        mw = sequential_segment_sum(wf, run_of, first)
        mrow, mid = grow[first], ids[first]
    else:
        mw, mrow, mid = (w.copy() if w is not None else None), grow, ids

    # 2. Combiner gains: per sample, over all ids before merging.
    if codes.max(initial=0) > 0 and n:
        row_code = np.repeat(codes, sizes_f)
        total_samples = stack.sample_count
        if w is None:
            cnt = np.bincount(grow, minlength=total_samples).astype(np.float32)  # exact
            s1 = s2 = cnt
        else:
            rfirst, row_run = _runs(grow[1:] == grow[:-1], n)
            present = grow[rfirst]
            s1 = np.zeros(total_samples, np.float32)
            s2 = np.zeros(total_samples, np.float32)
            if (codes == 1).any():
                s1[present] = sequential_segment_sum(w, row_run, rfirst)
            if (codes == 2).any():
                s2[present] = sequential_segment_sum(w * w, row_run, rfirst)
        scale = np.ones(total_samples, np.float32)
        with np.errstate(divide="ignore"):
            m = row_code == 1
            scale[m] = np.where(s1[m] == 0, np.float32(0), np.float32(1) / s1[m])
            m = row_code == 2
            scale[m] = np.where(s2[m] == 0, np.float32(0), np.float32(1) / np.sqrt(s2[m]))
        base = mw if mw is not None else np.ones(mrow.size, np.float32)
        gains = base * scale[mrow]
    else:
        gains = mw if mw is not None else np.ones(mrow.size, np.float32)

    # 3. Local SparseCore, sample id within it, and the rotated/offset column.
    m_n = mrow.size
    if has_adj:
        feat_of = np.searchsorted(offsets, mrow, side="right") - 1
    else:
        feat_of = np.repeat(np.arange(len(feats), dtype=np.int64), counts)
    per_sc = sizes_f // nsc
    local = mrow - offsets[feat_of]
    pf = per_sc[feat_of]
    sc = local // pf
    srow = local - sc * pf + (offsets // nsc)[feat_of]
    shift = np.array([f.col_shift for f in feats], dtype=np.int64)[feat_of]
    coloff = np.array([f.col_offset for f in feats], dtype=np.int64)[feat_of]
    col = ((mid + shift) & mask) + (mid & ~mask) + coloff

    # 4. One sort by (local SC, destination SC, token, position).
    token = col >> log2s
    dest = col & mask
    tbits = max(int(token.max(initial=0)).bit_length(), 1)
    ibits = max(int(m_n).bit_length(), 1)
    scbits = max((nsc - 1).bit_length(), 1)
    if scbits + log2s + tbits + ibits <= 63:
        hi = (((sc << log2s) | dest) << tbits) | token
        keys = np.sort((hi << ibits) | np.arange(m_n, dtype=np.int64))
        pos = keys & ((1 << ibits) - 1)
        hi = keys >> ibits
    else:  # astronomically large stacks: fall back to a lexsort
        pos = np.lexsort((np.arange(m_n), token, dest, sc))
        hi = (((sc[pos] << log2s) | dest[pos]) << tbits) | token[pos]
    srow_s = srow[pos]
    gain_s = gains[pos]

    # 5. Equal (sample, column) pairs are now adjacent: merge them by adding gains.
    if m_n > 1:
        dup = (hi[1:] == hi[:-1]) & (srow_s[1:] == srow_s[:-1])
        if dup.any():
            first, run_of = _runs(dup, m_n)
            gain_s = sequential_segment_sum(gain_s, run_of, first)
            hi, srow_s = hi[first], srow_s[first]
    k = hi.size
    seg = hi >> tbits  # local SC * S + destination SC
    new_col = np.empty(k, dtype=bool)
    if k:
        new_col[0] = True
        np.not_equal(hi[1:], hi[:-1], out=new_col[1:])
    ids_pp = np.bincount(seg, minlength=nsc * S).reshape(nsc, S)
    uniq_pp = np.bincount(seg[new_col], minlength=nsc * S).reshape(nsc, S)
    out = _Sorted()
    out.hi, out.srow, out.gain, out.tbits, out.ids_pp, out.uniq_pp = hi, srow_s, gain_s, tbits, ids_pp, uniq_pp
    return out


def count_partitions(stack: StackLayout, layout: SparseCoreLayout, feature_ids: Dict[str, FeatureIds]):
    """(ids, unique ids) per (local SC, destination SC) after dedup: [num_sc_per_chip, S] each."""
    srt = sort_stack(stack, layout, feature_ids)
    return srt.ids_pp, srt.uniq_pp


def preprocess_stack(stack: StackLayout, layout: SparseCoreLayout, feature_ids: Dict[str, FeatureIds],
                     limits: StackLimits) -> CsrBatch:
    topo = layout.topology
    nsc, S = topo.num_sc_per_chip, topo.num_sparse_cores
    srt = sort_stack(stack, layout, feature_ids)
    hi, srow_s, gain_s, tbits, ids_pp, uniq_pp = srt.hi, srt.srow, srt.gain, srt.tbits, srt.ids_pp, srt.uniq_pp
    k = hi.size
    seg = hi >> tbits
    for s in range(nsc):
        limits.check(stack.name, s, ids_pp[s], uniq_pp[s])

    # 6. CSR: per local SC, per destination SC, ids then padding to 8.
    sizes = buffer_sizes(stack, topo, limits.max_ids_per_chip_per_sample)
    cap = sizes.ids
    c = ids_pp.reshape(-1).astype(np.int64)
    padded = (c + (XLA_PAD - 1)) & ~(XLA_PAD - 1)
    start = np.cumsum(padded) - padded
    start_eff = np.minimum(start, cap)
    kept = np.minimum(c, cap - start_eff)
    rp_eff = start_eff + kept
    dropped = int(k - kept.sum())
    if dropped:
        limits.check_buffer(stack.name, cap, total_after=int(start[-1] + padded[-1]))
    ends = (rp_eff + (XLA_PAD - 1)) & ~(XLA_PAD - 1)
    ids_unpadded = int(ends[-1]) if ends.size else 0

    rp_block = round_up(S, XLA_PAD)
    row_pointers = np.zeros(sizes.row_pointers, np.int32)
    rp_view = row_pointers[:nsc * rp_block].reshape(nsc, rp_block)
    rp_view[:, :S] = rp_eff.reshape(nsc, S)
    rp_view[:, S:] = ends.reshape(nsc, S)[:, -1:]

    sample_ids = np.zeros(cap, np.int32)
    token_ids = np.zeros(cap, np.int32)
    out_gains = np.zeros(cap, np.float32)
    sample_ids[:ids_unpadded] = PAD_VALUE
    token_ids[:ids_unpadded] = PAD_VALUE
    out_gains[:ids_unpadded] = _PAD_GAIN
    seg_first = np.cumsum(c) - c
    rank = np.arange(k, dtype=np.int64) - seg_first[seg]
    dst = start_eff[seg] + rank
    if dropped:
        keep = rank < kept[seg]
        dst, srow_s, hi, gain_s = dst[keep], srow_s[keep], hi[keep], gain_s[keep]
    sample_ids[dst] = srow_s
    token_ids[dst] = hi & ((1 << tbits) - 1)
    out_gains[dst] = gain_s
    return CsrBatch(
        stack=stack.name, row_pointers=row_pointers, sorted_sample_ids=sample_ids,
        sorted_token_ids=token_ids, sorted_gains=out_gains, sample_count=stack.sample_count,
        num_minibatches_per_physical_sparse_core=1, row_pointers_unpadded_size=nsc * rp_block,
        ids_unpadded_size=ids_unpadded, dropped_ids=dropped, ids_per_partition=ids_pp,
        unique_ids_per_partition=uniq_pp)
