"""Fast SparseCore CSR packing: the same output as `csr_reference`, two ways.

* native: the C kernel in `native/_csr_native.c` (built at install time when a
  compiler is present) does the per-id work, one thread per local SparseCore.
* numpy (the fallback): every feature of a stack is concatenated first, so the
  work per stack is a fixed number of numpy calls whatever the number of
  features.  The one sort is an `np.sort` of packed int64 keys (local SC |
  destination SC | token | position), several times faster than `np.argsort`.
  float32 sums that TF does sequentially (combiner weights, merged duplicates)
  are done sequentially too, because numpy's pairwise reductions round
  differently.

Both flush denormals as TF's kernels do (flush-to-zero and denormals-are-zero:
`tpu_embed.sparsecore.denormals`).  The C kernel sets the CPU's modes; numpy
computes with gradual underflow, which gives the same bits while no operand or
result is subnormal: it switches to the flushing operations when a weight is
that small, or its square, or when a scale, a gain or a merged sum comes out below
2**-126.
"""

from __future__ import annotations

import importlib
import operator
import os
from itertools import repeat
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from tpu_embed.sparsecore import denormals
from tpu_embed.sparsecore.csr_types import BufferSizes, CsrBatch, StackLimits, buffer_sizes
from tpu_embed.sparsecore.inputs import (
    FeatureIds,
    bad_row_splits,
    dense_count_mismatch,
    id_out_of_range,
    native_entries,
    to_feature_ids,
    weight_not_finite,
)
from tpu_embed.sparsecore.layout import SparseCoreLayout, StackLayout
from tpu_embed.sparsecore.padding import PAD_VALUE, XLA_PAD, round_up

_COMBINER_CODE = {"sum": 0, "mean": 1, "sqrtn": 2}
_TINY_WEIGHT = 2.0 ** -63  # below it a weight's square is subnormal
_PAD_GAIN = np.float32(PAD_VALUE)


def merge_runs(values, same_as_prev: np.ndarray, n: int, add=np.add):
    """Merge runs of equal neighbours, adding their float32 values left to right.

    `same_as_prev[i]` says element i+1 equals element i.  Returns (index of
    each run's first element, float32 sum per run); `values=None` means all
    ones, whose sums are exact counts.  The sums are sequential, as TF's C++
    loops add, because numpy's pairwise reductions would round differently.
    Only the few non-first elements are touched. `add(a, b)`: the float32
    addition (with denormals flushed: `tpu_embed.sparsecore.denormals.add`).
    """
    nf = np.flatnonzero(same_as_prev) + 1  # elements that merge into an earlier one
    starts = np.ones(n, dtype=bool)
    starts[nf] = False
    first = np.flatnonzero(starts)
    run_of_nf = nf - np.arange(1, nf.size + 1)  # each earlier non-first shifts the run index by one
    if values is None:
        out = np.bincount(run_of_nf, minlength=first.size).astype(np.float32)
        out += np.float32(1)
        return first, out
    out = values[first]
    # A non-first element's level is its position in its streak of consecutive non-firsts:
    # level 0 is added first, then level 1, ... so each run is summed left to right.
    brk = np.empty(nf.size, dtype=bool)
    if nf.size:
        brk[0] = True
        np.not_equal(nf[1:], nf[:-1] + 1, out=brk[1:])
    idx = np.arange(nf.size)
    level = idx - np.maximum.accumulate(np.where(brk, idx, 0))
    top = int(level.max(initial=-1))
    if top == 0:
        out[run_of_nf] = add(out[run_of_nf], values[nf])
    else:
        for k in range(top + 1):
            sel = level == k
            out[run_of_nf[sel]] = add(out[run_of_nf[sel]], values[nf[sel]])
    return first, out


_ARANGE = np.arange(1 << 16, dtype=np.int64)


def _arange(n: int) -> np.ndarray:
    """A read-only view of 0..n-1, grown on demand (saves an allocation per call)."""
    global _ARANGE
    if n > _ARANGE.size:
        _ARANGE = np.arange(max(n, 2 * _ARANGE.size), dtype=np.int64)
    return _ARANGE[:n]


class _StackTables:
    """Batch-independent per-stack lookups, computed once per layout."""

    def __init__(self, stack: StackLayout, layout: SparseCoreLayout):
        topo = layout.topology
        nsc, S = topo.num_sc_per_chip, topo.num_sparse_cores
        feats = layout.stack_features(stack.name)
        self.feats = feats
        self.paths = [f.path for f in feats]
        self.index = [f.index for f in feats]  # positions in the layout's flattened features
        self.offsets = np.array([f.sample_offset for f in feats], dtype=np.int64)
        self.log2s = S.bit_length() - 1
        self.shift = np.array([f.col_shift for f in feats], dtype=np.int64)
        self.col_token_offset = np.array([f.col_offset >> self.log2s for f in feats], dtype=np.int64)
        # Tokens are below the stack's rows per SparseCore shard: a static key width.
        self.tbits = max(int(stack.total_padded_vocabulary >> self.log2s).bit_length(), 1)
        self.scbits = max((nsc - 1).bit_length(), 1)
        self.vocab = np.array([f.vocabulary_size for f in feats], dtype=np.int64)
        sizes = np.array([f.sample_count for f in feats], dtype=np.int64)
        codes = np.array([_COMBINER_CODE[f.combiner] for f in feats], dtype=np.int8)
        self.all_sum = not codes.any()
        self.row_code = np.repeat(codes, sizes)  # int8, contiguous: also what the C kernel reads
        # For every sample g of the stack: its local SparseCore and its sample id there.
        local = np.arange(stack.sample_count, dtype=np.int64) - np.repeat(self.offsets, sizes)
        per_sc = np.repeat(sizes // nsc, sizes)
        self.sc_of = local // per_sc
        self.srow_of = (local - self.sc_of * per_sc + np.repeat(self.offsets // nsc, sizes)).astype(np.int32)
        self.stack, self.topology = stack, topo
        self._buffer_sizes: Dict[int, BufferSizes] = {}

    def buffer_sizes(self, max_ids_per_chip_per_sample: int) -> BufferSizes:
        """`buffer_sizes` of the stack, remembered per max_ids_per_chip_per_sample."""
        sizes = self._buffer_sizes.get(max_ids_per_chip_per_sample)
        if sizes is None:
            sizes = buffer_sizes(self.stack, self.topology, max_ids_per_chip_per_sample)
            self._buffer_sizes[max_ids_per_chip_per_sample] = sizes
        return sizes


def _stack_tables(stack: StackLayout, layout: SparseCoreLayout) -> _StackTables:
    # Cached on the (immutable) layout itself, so the cache lives and dies with it.
    cache = layout.__dict__.get("_csr_tables")
    if cache is None:
        cache = {}
        object.__setattr__(layout, "_csr_tables", cache)
    t = cache.get(stack.name)
    if t is None:
        t = cache[stack.name] = _StackTables(stack, layout)
    return t


class _Sorted:
    """A stack's ids for one chip after combiner, rotation, sort and dedup."""

    __slots__ = ("hi", "srow", "gain", "tbits", "ids_pp", "uniq_pp")
    hi: np.ndarray
    srow: np.ndarray
    gain: np.ndarray
    tbits: int
    ids_pp: np.ndarray
    uniq_pp: np.ndarray


# The C kernel (tpu_embed/sparsecore/native), built at install time (required unless TPU_EMBED_NATIVE=optional);
# numpy below is the fallback.
# TPU_EMBED_NATIVE=0 (read at import) forces the fallback, e.g. to test a worker without the kernel.
_csr_native: Any = None
if os.environ.get("TPU_EMBED_NATIVE", "1") != "0":
    try:
        _csr_native = importlib.import_module("tpu_embed.sparsecore._csr_native")
    except ImportError:  # pragma: no cover - exercised on machines without a compiler
        pass


def native_available() -> bool:
    return _csr_native is not None


def narrow_stack_native(sample_ids: np.ndarray, token_ids: np.ndarray, gains: np.ndarray, sample_width: int,
                        token_width: int, want_unit: bool, check_padding: bool) -> Optional[tuple]:
    """The kernel's pass over one chip's CSR prefix (int32 ids, float32 gains) as a shard record stores it:
    (status, sample ids' bytes | None, token ids' bytes | None, unit gains), or None without the kernel. Its rule
    is `tpu_embed.artifact.shard_records`' (`narrow_ids`, `unit_gains`, `_stack_features`' padding check): ids of
    width 1 or 2 bytes little-endian with PAD_VALUE as the type's maximum (4: None, the ids as they are); status
    1, 2, 3: the padding check, a sample id, a token id failed (the reference raises the error)."""
    if _csr_native is None:
        return None
    return _csr_native.narrow_stack(np.ascontiguousarray(sample_ids, np.int32),
                                    np.ascontiguousarray(token_ids, np.int32), np.ascontiguousarray(gains, np.float32),
                                    int(sample_width), int(token_width), int(bool(want_unit)), int(bool(check_padding)))


# Fewer ids per call: packed by the calling thread alone.  Waking the pool costs more than it saves on
# small batches (profile counting calls the kernel once per table and chip: a step is many small calls).
PARALLEL_MIN_IDS = 16384


def native_threads() -> int:
    """Worker threads of the native packer: TPU_EMBED_THREADS, else the CPUs this process may use.

    Local SparseCores are packed in parallel.  Multi-process runners (Beam's
    multi_processing mode, Dataflow with several workers per VM) should set
    TPU_EMBED_THREADS=1 to avoid oversubscribing cores.
    """
    env = os.environ.get("TPU_EMBED_THREADS")
    if env:
        return max(1, int(env))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _native_entry(f: FeatureIds) -> tuple:
    return (_i64(f.rows), _i64(f.ids), None if f.weights is None else _f32(f.weights), None)


# The kernel's statuses for an input it does not take: a row out of range or order, bad row_splits or a dense
# input without one id per sample, lengths that differ, a buffer it does not read as it is.
_INPUT_STATUSES = (3, 7, 8, 10)


def _native_call(stack: StackLayout, layout: SparseCoreLayout, parts: Sequence[Optional[tuple]],
                 limits: Optional[StackLimits] = None, id_buffer: int = 0,
                 normalise: Optional[Callable[[int], tuple]] = None):
    """`parts`: per feature of the stack, in its order, (rows | None, ids, weights | None, row_splits | None).

    Without `limits` only the per-partition counts are computed.  `normalise(f)`, when given, returns
    feature f's entry as `to_feature_ids` makes it (or raises its error); it replaces entries that are
    None and those the kernel does not take as they are, and the stack is packed again."""
    if _csr_native is None:
        raise RuntimeError("the native CSR kernel is not built (no C compiler at install time?); "
                           "use implementation='numpy'")
    topo = layout.topology
    tab = _stack_tables(stack, layout)
    if normalise is not None and not all(map(operator.is_not, parts, repeat(None))):  # (`in` compares by ==)
        parts = [normalise(f) if p is None else p for f, p in enumerate(parts)]
    if limits is None:
        max_ids = max_uniq = id_buffer = 1 << 62
        allow = 1
    else:
        max_ids, max_uniq = limits.max_ids_per_partition, limits.max_unique_ids_per_partition
        allow = int(limits.allow_id_dropping)
    while True:
        res = _csr_native.pack_stack(
            parts, tab.offsets, tab.shift, tab.col_token_offset, tab.vocab, tab.srow_of, tab.row_code,
            topo.num_sc_per_chip, tab.log2s, tab.tbits, native_threads(), PARALLEL_MIN_IDS, int(limits is None),
            max_ids, max_uniq, id_buffer, allow, PAD_VALUE)
        if res[0] in (1, 2):
            raise _bad_value(res, tab)
        if res[0] not in _INPUT_STATUSES:
            return res
        bad = res[1] if res[0] == 10 else [res[1]]
        if normalise is None:
            raise _bad_input(res, tab, parts)
        # The readable path raises the descriptive error; an input it accepts is packed in its form.
        parts = list(parts)
        for f in bad:
            parts[f] = normalise(f)
        normalise = None


def _size(a) -> int:
    return int(np.asarray(a).size)


def _counts(res, topo):
    shape = (topo.num_sc_per_chip, topo.num_sparse_cores)
    return (np.frombuffer(res[1], dtype=np.int64).reshape(shape),
            np.frombuffer(res[2], dtype=np.int64).reshape(shape))


def _i64(a):
    return a if (a.dtype == np.int64 and a.flags.c_contiguous) else np.ascontiguousarray(a, dtype=np.int64)


def _f32(a):
    return a if (a.dtype == np.float32 and a.flags.c_contiguous) else np.ascontiguousarray(a, dtype=np.float32)


def _bad_value(res, tab) -> ValueError:
    kind, f, pos, value = res
    feat = tab.feats[f]
    if kind == 1:
        return id_out_of_range(feat.path, value, feat.vocabulary_size, pos)
    return weight_not_finite(feat.path, np.float32(value), pos)


def _bad_input(res, tab, parts) -> Exception:
    if res[0] == 10:
        feat = tab.feats[res[1][0]]
        return TypeError(f"Feature {feat.path!r}: the native packer takes C-contiguous int32/int64 ids, rows and "
                         "row_splits and float32 weights; pass numpy arrays of those types.")
    kind, f, pos = res[:3]
    feat = tab.feats[f]
    if kind == 7:
        n = _size(parts[f][1])
        return bad_row_splits(feat.path, n) if pos == 0 else dense_count_mismatch(feat.path, n, feat.sample_count)
    if kind == 8:
        return ValueError(f"Feature {feat.path!r}: {'rows' if pos == 0 else 'weights'} and ids differ in length.")
    return ValueError(f"Feature {feat.path!r}: row {res[3]} (position {pos}) is outside "
                      f"its {feat.sample_count} samples per chip or out of order; rows must be sorted.")


def sort_stack(stack: StackLayout, layout: SparseCoreLayout, feature_ids: Dict[str, FeatureIds]) -> _Sorted:
    """numpy: the stack's ids for one chip after combiner, rotation, sort and dedup."""
    topo = layout.topology
    nsc, S = topo.num_sc_per_chip, topo.num_sparse_cores
    tab = _stack_tables(stack, layout)
    log2s, mask = tab.log2s, S - 1
    parts = [feature_ids[p] for p in tab.paths]
    counts = np.fromiter((p.ids.size for p in parts), dtype=np.int64, count=len(parts))
    n = int(counts.sum())

    # Global sample index g inside the stack's per-chip samples, and the raw ids.
    grow = np.concatenate([p.rows + o for p, o in zip(parts, tab.offsets)])
    ids = np.concatenate([p.ids for p in parts])
    w = None
    if any(p.weights is not None for p in parts):
        w = np.concatenate([p.weights if p.weights is not None else np.ones(p.ids.size, np.float32)
                            for p in parts])

    # Column rewrite, split into destination SparseCore and token (col >> log2 S):
    # col_offset is a multiple of 8*S, so it only moves the token.
    dest = (ids + np.repeat(tab.shift, counts)) & mask
    token = (ids >> log2s) + np.repeat(tab.col_token_offset, counts)

    # Below 2**-63 a weight or its square is subnormal: the flushing arithmetic throughout. Otherwise no weight,
    # square, combiner sum or adjacent merge is subnormal (a nonzero sum of such weights is a multiple of 2**-86),
    # and only the scales, the gains and the merges of gains are checked.
    flushing = w is not None and denormals.is_tiny(w, _TINY_WEIGHT)

    # 1. Merge adjacent duplicates (same sample, same id), as ConvertToList...CooTensors does.
    if n > 1:
        adj = grow[1:] == grow[:-1]
        adj &= ids[1:] == ids[:-1]
        has_adj = bool(adj.any())
    else:
        has_adj = False
    if has_adj:
        first, mw = merge_runs(w, adj, n, add=denormals.add if flushing else np.add)
        mrow, dest, token = grow[first], dest[first], token[first]
    else:
        mw, mrow = w, grow

    # 2. Combiner gains: per sample, over all its ids before merging.
    gains = _combiner_gains(tab, stack.sample_count, n, grow, w, mw, mrow, flushing)
    if gains is None:  # a scale or gain below 2**-126
        flushing = True
        gains = _combiner_gains(tab, stack.sample_count, n, grow, w, mw, mrow, flushing)
        assert gains is not None  # the flushing computation always answers

    # 3. One sort by (local SC, destination SC, token, position).
    hi, pos = _sort_keys(tab, mrow, dest, token, log2s)
    return _merged(tab, hi, mrow[pos], gains[pos], nsc, S, flushing if w is not None else None)


def _merged(tab: _StackTables, hi: np.ndarray, g_s: np.ndarray, gain_s: np.ndarray, nsc: int, S: int,
            flushing: Optional[bool]) -> _Sorted:
    """The sorted ids (`hi`: keys without position, `g_s`: their samples, `gain_s`: their gains) with equal
    (sample, column) pairs merged, and the ids and unique ids per (local SC, destination SC).

    `flushing`: True, gains are added with denormals flushed; False, numpy's sums are kept unless one is
    subnormal; None (gains of unweighted ids: positive, at least 2**-31), numpy's sums."""
    tbits = tab.tbits
    m_n = hi.size

    # 4. Equal (sample, column) pairs are now adjacent: merge them by adding gains.
    if m_n > 1:
        dup = hi[1:] == hi[:-1]
        dup &= g_s[1:] == g_s[:-1]
        if dup.any():
            sums: list = []

            def add(a, b):  # numpy's, remembering its sums: the only values here that can be subnormal
                sums.append(np.add(a, b))
                return sums[-1]

            first, merged = merge_runs(gain_s, dup, m_n, add=denormals.add if flushing else add)
            if flushing is False and any(denormals.is_tiny(x) for x in sums):
                first, merged = merge_runs(gain_s, dup, m_n, add=denormals.add)
            gain_s = merged
            hi, g_s = hi[first], g_s[first]
    k = hi.size
    seg = hi >> tbits  # local SC * S + destination SC
    new_col = np.empty(k, dtype=bool)
    if k:
        new_col[0] = True
        np.not_equal(hi[1:], hi[:-1], out=new_col[1:])
    out = _Sorted()
    out.hi, out.srow, out.gain, out.tbits = hi, tab.srow_of[g_s], gain_s, tbits
    out.ids_pp = np.bincount(seg, minlength=nsc * S).reshape(nsc, S)
    out.uniq_pp = np.bincount(seg[new_col], minlength=nsc * S).reshape(nsc, S)
    return out


def _combiner_gains(tab: _StackTables, sample_count: int, n: int, grow: np.ndarray, w: Optional[np.ndarray],
                    mw: Optional[np.ndarray], mrow: np.ndarray, flushing: bool) -> Optional[np.ndarray]:
    """float32 gain of each merged id (`mrow`: its sample): its weight (`mw`, 1 without weights) times its
    sample's combiner scale (sum: 1, mean: 1 / sum of the sample's weights, sqrtn: 1 / sqrt of their squares'
    sum; 0 for a sum of 0), over the sample's `n` ids before merging (`grow`, `w`).

    `flushing`: with denormals flushed as TF's kernels compute (a 'sum' sample's gains are copied, so they
    keep their bits). Without it, None where a scale or a weighted gain is subnormal (numpy's would differ)."""
    if tab.all_sum or n == 0:
        return mw if mw is not None else np.ones(mrow.size, np.float32)
    if flushing:  # only with weights
        assert w is not None and mw is not None
        return _flushed_combiner_gains(tab, sample_count, n, grow, w, mw, mrow)
    if w is None:
        s1 = s2 = np.bincount(grow, minlength=sample_count).astype(np.float32)  # exact counts
    else:
        s1 = np.zeros(sample_count, np.float32)
        s2 = np.zeros(sample_count, np.float32)
        same_row = grow[1:] == grow[:-1]
        if (tab.row_code == 1).any():
            rfirst, sums = merge_runs(w, same_row, n)
            s1[grow[rfirst]] = sums
        if (tab.row_code == 2).any():
            rfirst, sums = merge_runs(w * w, same_row, n)
            s2[grow[rfirst]] = sums
    scale = np.ones(sample_count, np.float32)
    with np.errstate(divide="ignore"):
        m = tab.row_code == 1
        scale[m] = np.where(s1[m] == 0, np.float32(0), np.float32(1) / s1[m])
        m = tab.row_code == 2
        scale[m] = np.where(s2[m] == 0, np.float32(0), np.float32(1) / np.sqrt(s2[m]))
    if w is not None and denormals.is_tiny(scale[tab.row_code == 1]):  # a mean sample's sum above 2**126
        return None
    gains = scale[mrow]
    if mw is not None:
        gains *= mw
        if w is not None and denormals.is_tiny(gains):
            return None
    return gains


def _flushed_combiner_gains(tab: _StackTables, sample_count: int, n: int, grow: np.ndarray, w: np.ndarray,
                            mw: np.ndarray, mrow: np.ndarray) -> np.ndarray:
    """`_combiner_gains` with denormals flushed, as TF's kernels compute: each sum starts from 0 (a lone
    subnormal weight adds as zero), scales are 1.0 / x (and 1.0 / sqrt(x)) in double rounded to float32 with
    flush-to-zero, weighted gains are products, and a 'sum' sample's gains are copied."""
    s1 = np.zeros(sample_count, np.float32)
    s2 = np.zeros(sample_count, np.float32)
    same_row = grow[1:] == grow[:-1]
    if (tab.row_code == 1).any():
        rfirst, sums = merge_runs(w, same_row, n, add=denormals.add)
        s1[grow[rfirst]] = denormals.flush(sums)
    if (tab.row_code == 2).any():
        rfirst, sums = merge_runs(denormals.multiply(w, w), same_row, n, add=denormals.add)
        s2[grow[rfirst]] = sums
    scale = np.ones(sample_count, np.float64)
    with np.errstate(divide="ignore"):
        m = tab.row_code == 1
        scale[m] = np.where(s1[m] == 0, 0.0, 1.0 / s1[m].astype(np.float64))
        m = tab.row_code == 2
        scale[m] = np.where(s2[m] == 0, 0.0, 1.0 / np.sqrt(s2[m]).astype(np.float64))
    gains = denormals.multiply(mw, denormals.to_float32(scale)[mrow])
    summed = tab.row_code[mrow] == 0
    gains[summed] = mw[summed]
    return gains


def _sort_keys(tab: _StackTables, mrow: np.ndarray, dest: np.ndarray, token: np.ndarray, log2s: int
               ) -> Tuple[np.ndarray, np.ndarray]:
    """(sorted keys (local SC, destination SC, token) without the position, the position of each): one sort
    of the keys packed in an int64 with the position as the last bits, or a lexsort where they do not fit."""
    m_n, tbits = mrow.size, tab.tbits
    ibits = max(int(m_n).bit_length(), 1)
    if tab.scbits + log2s + tbits + ibits <= 63:
        hi = tab.sc_of[mrow] << log2s
        hi |= dest
        hi <<= tbits
        hi |= token
        keys = hi << ibits
        keys |= _arange(m_n)
        keys.sort()
        return keys >> ibits, keys & ((1 << ibits) - 1)
    # astronomically large stacks: fall back to a lexsort
    sc = tab.sc_of[mrow]
    pos = np.lexsort((np.arange(m_n), token, dest, sc))
    return (((sc[pos] << log2s) | dest[pos]) << tbits) | token[pos], pos


def count_partitions(stack: StackLayout, layout: SparseCoreLayout, feature_ids: Dict[str, FeatureIds],
                     native: Optional[bool] = None):
    """(ids, unique ids) per (local SC, destination SC) after dedup: [num_sc_per_chip, S] each."""
    if native is None:
        native = _csr_native is not None
    if native:
        # Only the stack's features: a chip's batch holds every table's (the profile counts table by table).
        parts = [_native_entry(feature_ids[p]) for p in _stack_tables(stack, layout).paths]
        return _counts(_native_call(stack, layout, parts), layout.topology)
    srt = sort_stack(stack, layout, feature_ids)
    return srt.ids_pp, srt.uniq_pp


def preprocess_stack_native(stack: StackLayout, layout: SparseCoreLayout, entries: Dict[str, tuple],
                            limits: StackLimits) -> CsrBatch:
    """The native packer on `entries` ({path: (rows | None, ids, weights | None, row_splits | None)}, int64
    ids, rows and row_splits, float32 weights): the form the shard job builds its chips' batches in."""
    parts = [entries[p] for p in _stack_tables(stack, layout).paths]
    return _batch_of(stack, layout, parts, limits)


def preprocess_stack_inputs(stack: StackLayout, layout: SparseCoreLayout, inputs: Sequence[Any],
                            weights: Optional[Sequence[Any]], limits: StackLimits) -> CsrBatch:
    """The native packer on one chip's batch as the caller passed it.

    `inputs` and `weights` hold every feature of the layout, flattened (`weights` None, or a feature's
    None: no weights): dense, ragged or
    sparse; numpy arrays, TF tensors, `RaggedIds`/`SparseIds`.  Their buffers reach the kernel without a
    copy or a conversion (`inputs.native_entries`); a feature the kernel does not take as it is goes through
    `to_feature_ids`, the readable normalisation, which raises the error naming the feature or converts it.
    """
    tab = _stack_tables(stack, layout)
    parts = native_entries(inputs, weights, tab.index)

    def normalise(f: int) -> tuple:
        feat = tab.feats[f]
        return _native_entry(to_feature_ids(
            inputs[feat.index], None if weights is None else weights[feat.index], path=feat.path,
            sample_count=feat.sample_count,
            vocabulary_size=feat.vocabulary_size))

    return _batch_of(stack, layout, parts, limits, normalise)


def _batch_of(stack: StackLayout, layout: SparseCoreLayout, parts: Sequence[Optional[tuple]], limits: StackLimits,
              normalise: Optional[Callable[[int], tuple]] = None) -> CsrBatch:
    topo = layout.topology
    sizes = _stack_tables(stack, layout).buffer_sizes(limits.max_ids_per_chip_per_sample)
    res = _native_call(stack, layout, parts, limits, sizes.ids, normalise)
    if res[0] in (4, 5):
        ids_pp, uniq_pp = _counts((None, res[4], res[5]), topo)
        limits.check(stack.name, res[1], ids_pp[res[1]], uniq_pp[res[1]])
        raise AssertionError("native limit check disagrees with StackLimits.check")  # pragma: no cover
    if res[0] == 6:
        limits.check_buffer(stack.name, sizes.ids, total_after=res[1])
        raise AssertionError("native buffer check disagrees with StackLimits")  # pragma: no cover
    ids_pp, uniq_pp = _counts(res, topo)
    rp = np.frombuffer(res[3], np.int32)
    return CsrBatch(
        stack=stack.name, row_pointers=rp, sorted_sample_ids=np.frombuffer(res[4], np.int32),
        sorted_token_ids=np.frombuffer(res[5], np.int32), sorted_gains=np.frombuffer(res[6], np.float32),
        sample_count=stack.sample_count, num_minibatches_per_physical_sparse_core=1,
        row_pointers_unpadded_size=rp.size, ids_unpadded_size=int(res[7]),
        row_pointers_buffer_size=sizes.row_pointers, ids_buffer_size=sizes.ids, dropped_ids=int(res[8]),
        ids_per_partition=ids_pp, unique_ids_per_partition=uniq_pp)


def preprocess_stack(stack: StackLayout, layout: SparseCoreLayout, feature_ids: Dict[str, FeatureIds],
                     limits: StackLimits, native: Optional[bool] = None) -> CsrBatch:
    if native is None:
        native = _csr_native is not None
    if native:
        return _batch_of(stack, layout, [_native_entry(feature_ids[p]) for p in _stack_tables(stack, layout).paths],
                         limits)
    topo = layout.topology
    nsc, S = topo.num_sc_per_chip, topo.num_sparse_cores
    srt = sort_stack(stack, layout, feature_ids)
    hi, srow_s, gain_s, tbits, ids_pp, uniq_pp = srt.hi, srt.srow, srt.gain, srt.tbits, srt.ids_pp, srt.uniq_pp
    k = hi.size
    if ids_pp.max(initial=0) > limits.max_ids_per_partition or \
            uniq_pp.max(initial=0) > limits.max_unique_ids_per_partition:
        for s in range(nsc):  # TF checks SparseCore by SparseCore; report the first over the limit
            limits.check(stack.name, s, ids_pp[s], uniq_pp[s])

    # 5. CSR: per local SC, per destination SC, ids then padding to 8.
    sizes = buffer_sizes(stack, topo, limits.max_ids_per_chip_per_sample)
    cap = sizes.ids
    c = ids_pp.reshape(-1).astype(np.int64)
    padded = round_up(c, XLA_PAD)
    start = np.cumsum(padded) - padded
    start_eff = np.minimum(start, cap)
    kept = np.minimum(c, cap - start_eff)
    rp_eff = start_eff + kept
    dropped = int(k - kept.sum())
    if dropped:
        limits.check_buffer(stack.name, cap, total_after=int(start[-1] + padded[-1]))
    ends = round_up(rp_eff, XLA_PAD)
    ids_unpadded = int(ends[-1]) if ends.size else 0

    rp_block = round_up(S, XLA_PAD)
    row_pointers = np.empty(nsc * rp_block, np.int32)
    rp_view = row_pointers.reshape(nsc, rp_block)
    rp_view[:, :S] = rp_eff.reshape(nsc, S)
    rp_view[:, S:] = ends.reshape(nsc, S)[:, -1:]

    seg = hi >> tbits
    sample_ids = np.full(ids_unpadded, PAD_VALUE, np.int32)
    token_ids = np.full(ids_unpadded, PAD_VALUE, np.int32)
    out_gains = np.full(ids_unpadded, _PAD_GAIN, np.float32)
    seg_first = np.cumsum(c) - c
    rank = _arange(k) - seg_first[seg]
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
        ids_unpadded_size=ids_unpadded, row_pointers_buffer_size=sizes.row_pointers, ids_buffer_size=cap,
        dropped_ids=dropped, ids_per_partition=ids_pp, unique_ids_per_partition=uniq_pp)
