"""Readable reference implementation of SparseCore CSR packing.

A direct, per-id transcription of TensorFlow's three host kernels
(`ConvertToListOfSparseCoreCooTensors`, `SortListOfSparseCoreCooTensors`,
`ConvertToSparseCoreCsrWrappedCooTensor`).  It is slow on purpose: it is the
yardstick the fast implementation (`csr.py`) is tested against, and it is
small enough to read next to TF's C++.  float32 arithmetic is done one
operation at a time on numpy float32 scalars, in TF's order, with denormals
flushed as TF's kernels compute (`tpu_embed.sparsecore.denormals`): a gain only
copied keeps its bits.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np

from tpu_embed.sparsecore import denormals
from tpu_embed.sparsecore.csr_types import CsrBatch, StackLimits, buffer_sizes
from tpu_embed.sparsecore.inputs import FeatureIds
from tpu_embed.sparsecore.layout import FeaturePlacement, SparseCoreLayout, StackLayout
from tpu_embed.sparsecore.padding import PAD_VALUE, XLA_PAD, round_up

f32 = np.float32


def _flushed(op, *args) -> np.float32:
    """A `tpu_embed.sparsecore.denormals` operation on scalars."""
    return f32(op(*(np.asarray([a]) for a in args))[0])


def feature_to_coo(fid: FeatureIds, feat: FeaturePlacement, stack: StackLayout, num_sc_per_chip: int,
                   num_sparse_cores: int) -> List[List[tuple]]:
    """One feature -> per local SparseCore list of (row, col, gain).  TF: ConvertToList...CooTensors."""
    per_sc = feat.sample_count // num_sc_per_chip
    row_offset_per_sc = feat.sample_offset // num_sc_per_chip
    mask = num_sparse_cores - 1
    rescale: List[Any] = [f32(0)] * feat.sample_count
    merged: List[list] = []  # (row, id, gain) after merging *adjacent* duplicates
    for i in range(fid.ids.size):
        row, col = int(fid.rows[i]), int(fid.ids[i])
        w = f32(1) if fid.weights is None else f32(fid.weights[i])
        if feat.combiner == "mean":
            rescale[row] = _flushed(denormals.add, rescale[row], w)
        elif feat.combiner == "sqrtn":
            rescale[row] = _flushed(denormals.add, rescale[row], _flushed(denormals.multiply, w, w))
        if merged and merged[-1][0] == row and merged[-1][1] == col:
            merged[-1][2] = _flushed(denormals.add, merged[-1][2], w)
        else:
            merged.append([row, col, w])
    if feat.combiner != "sum":
        for r in range(feat.sample_count):
            x = rescale[r]  # a flushed sum: never subnormal
            if x == 0:
                rescale[r] = f32(0)
            elif feat.combiner == "mean":
                rescale[r] = _flushed(denormals.to_float32, 1.0 / float(x))
            else:
                rescale[r] = _flushed(denormals.to_float32, 1.0 / float(np.sqrt(x)))
    out: List[List[tuple]] = [[] for _ in range(num_sc_per_chip)]
    for row, col, gain in merged:
        sc = row // per_sc
        new_row = row % per_sc + row_offset_per_sc
        new_col = ((col + feat.col_shift) & mask) + (col & ~mask) + feat.col_offset
        g = gain if feat.combiner == "sum" else _flushed(denormals.multiply, gain, rescale[row])
        out[sc].append((new_row, new_col, g))
    return out


def sort_and_dedup(coos_in_feature_order: List[List[tuple]], num_sparse_cores: int):
    """One local SparseCore's COO of a stack -> per destination SparseCore sorted (sample, token, gain).

    TF: SortListOfSparseCoreCooTensors.  Entries are ordered by column, then by
    position (features concatenated in order); equal (sample, column) pairs,
    which are then adjacent, merge by adding gains.
    """
    flat = [e for coo in coos_in_feature_order for e in coo]
    order = sorted(range(len(flat)), key=lambda i: (flat[i][1], i))
    log2 = num_sparse_cores.bit_length() - 1
    per_dest: List[list] = [[] for _ in range(num_sparse_cores)]
    ids = [0] * num_sparse_cores
    uniques = [0] * num_sparse_cores
    prev_row: Optional[int] = None
    prev_col: Optional[int] = None
    last: List[Any] = []
    for i in order:
        row, col, gain = flat[i]
        dest = col & (num_sparse_cores - 1)
        if row == prev_row and col == prev_col:
            last[2] = _flushed(denormals.add, last[2], gain)
            continue
        ids[dest] += 1
        if col != prev_col:
            uniques[dest] += 1
        last = [row, col >> log2, gain]
        per_dest[dest].append(last)
        prev_row, prev_col = row, col
    return per_dest, ids, uniques


def preprocess_stack_reference(stack: StackLayout, layout: SparseCoreLayout,
                               feature_ids: Dict[str, FeatureIds], limits: StackLimits) -> CsrBatch:
    topo = layout.topology
    nsc, S = topo.num_sc_per_chip, topo.num_sparse_cores
    per_feature = [feature_to_coo(feature_ids[f.path], f, stack, nsc, S) for f in layout.stack_features(stack.name)]
    sizes = buffer_sizes(stack, topo, limits.max_ids_per_chip_per_sample)
    row_pointers = np.zeros(sizes.row_pointers, np.int32)
    sample_ids = np.zeros(sizes.ids, np.int32)
    token_ids = np.zeros(sizes.ids, np.int32)
    gains = np.zeros(sizes.ids, np.float32)
    ids_pp = np.zeros((nsc, S), np.int64)
    uniq_pp = np.zeros((nsc, S), np.int64)
    g = 0  # global index into the id buffers
    rp = 0
    packed = total = 0
    rp_block = round_up(S, XLA_PAD)
    for sc in range(nsc):
        per_dest, ids, uniques = sort_and_dedup([coo[sc] for coo in per_feature], S)
        ids_pp[sc], uniq_pp[sc] = ids, uniques
        limits.check(stack.name, sc, ids, uniques)
        for dest in range(S):
            entries = per_dest[dest]
            total += len(entries)
            n = len(entries)
            if g + n > sizes.ids:
                limits.check_buffer(stack.name, sizes.ids, total_after=None)
                n = min(sizes.ids - g, n)
            for k in range(n):
                sample_ids[g + k], token_ids[g + k], gains[g + k] = entries[k]
            g += n
            packed += n
            row_pointers[rp] = g
            pad = round_up(g, XLA_PAD) - g
            sample_ids[g:g + pad] = PAD_VALUE
            token_ids[g:g + pad] = PAD_VALUE
            gains[g:g + pad] = np.float32(PAD_VALUE)
            g += pad
            rp += 1
        row_pointers[rp:sc * rp_block + rp_block] = g
        rp = (sc + 1) * rp_block
    return CsrBatch(
        stack=stack.name, row_pointers=row_pointers[:nsc * rp_block], sorted_sample_ids=sample_ids[:g],
        sorted_token_ids=token_ids[:g], sorted_gains=gains[:g], sample_count=stack.sample_count,
        num_minibatches_per_physical_sparse_core=1, row_pointers_unpadded_size=nsc * rp_block,
        ids_unpadded_size=g, row_pointers_buffer_size=sizes.row_pointers, ids_buffer_size=sizes.ids,
        dropped_ids=total - packed, ids_per_partition=ids_pp, unique_ids_per_partition=uniq_pp)
