"""jax-tpu-embedding's SparseCore layout: its table stacking and its CSR packing, in numpy.

    jl = jax_layout(model)                      # jax's auto_stack_tables of a tpu_embed.core.model.ModelConfig
    batches = pack_host(jl, host_features)      # {stack: JaxHostBatch}, one host's local devices
    arrays = batches[stack].buffers(coo_buffer_size_per_device, has_leading_dimension=False)
        # (row_pointers, embedding_ids, sample_ids, gains): what preprocess_sparse_dense_matmul_input returns

This is jax-tpu-embedding 0.2.0 (`nn/table_stacking.py`, `nn/embedding.py` and its C++
`PreprocessSparseDenseMatmulInput`; 0.1.0 lays out the same arrays), transcribed:

* Stacking (`auto_stack_tables`, default arguments): tables in the order they first appear among the
  features (`ModelConfig.features`, jax's `jax.tree.leaves` of a dict of feature specs keyed by feature
  name), grouped by (width rounded up to 8, optimizer, combiner; 0.2.0 also by quantization config, which
  tpu_embed's tables leave unset); a group is split first-fit so that no
  stack's activations (padded width x samples per SparseCore x 4 bytes) exceed 2 MiB; each table's rows
  are padded to a multiple of 8 x all SparseCores; a stack's name is its tables' names joined with `_`,
  cut at 50 characters plus "..." and 12 hex digits of its sha256 when longer. Per table: a row offset
  per shard and a rotation of `num_sc_per_device` more than the previous table's; per feature
  (`FeatureIdTransformation`): `row_offset` = the global samples of the stack's earlier features,
  `col_offset` = row offset per shard x all SparseCores, `col_shift` = rotation.
* Packing, per local device and per stack ("split then stack"): each feature's host batch is cut in
  contiguous blocks per device, each block in `num_sc_per_device` slices; SparseCore s of a device gets
  slice s of every feature of the stack, features in row-offset order, so its sample ids are
  `row_offset / all SparseCores + row in slice`. Gains per sample: sum `w`, mean `w / sum(w)`, sqrtn
  `w / sqrt(sum(w^2))`, float32 sums left to right (1 / n and 1 / sqrt(n) without weights), with denormals
  flushed to zero of their sign as jax's preprocessing threads compute (`tpu_embed.sparsecore.denormals`).
  The column rewrite is TF's; ids are sorted per local SparseCore by (destination SparseCore, column, sample, input
  order), equal (sample, column) pairs merged by adding their gains left to right; embedding id =
  column >> log2(all SparseCores). Per local SparseCore, per destination: the ids, the row pointer (the
  end, relative to the SparseCore's segment), then padding to a multiple of 8 (ids and sample ids
  2**31-1, gains NaN); row pointers padded to max(all SparseCores, 8) per SparseCore with the aligned end.
  The device's COO buffer holds one equal segment per local SparseCore; jax leaves a segment's tail past
  its aligned end unwritten, `buffers` fills it with the padding values.

`pack_host` is vectorised; `tpu_embed.sparsecore.jax_layout_reference.pack_host_reference` is a per-id
transcription of the C++ loops that it is tested against (tests/tpu_embed/sparsecore/test_jax_layout.py). Both
are checked bit for bit against the installed jax-tpu-embedding (tests/conformance/test_jax_layout_conformance.py).
Ids are never dropped here: `limits` only checks (a `LimitExceededError` names the stack and how far to raise the
limit), and every statistic jax reports is returned (`JaxHostBatch.stats`).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tpu_embed.core.model import ModelConfig, TableConfig
from tpu_embed.sparsecore import denormals
from tpu_embed.sparsecore.csr import merge_runs
from tpu_embed.sparsecore.csr_types import LimitExceededError

ACTIVATION_MEM_BYTES_LIMIT = 2048 * 1024  # auto_stack_tables' activation_mem_bytes_limit default
NUM_SC_PER_DEVICE = (2, 4)  # jax's NUM_SC_PER_DEVICE_MAP values: the SparseCores per device it accepts
PAD_ID = (1 << 31) - 1  # jax's constants.PADDING_VALUE (INT_MAX): ids and sample ids of padding entries
ALIGN = 8  # TPU_VECTOR_REGISTER_ALIGNMENT_SIZE
_SHORT_NAME = 50
_HASH_DIGITS = 12


def round_up(n, m: int):
    return (n + (m - 1)) // m * m


@dataclasses.dataclass(frozen=True)
class JaxTable:
    name: str
    vocabulary_size: int
    dim: int
    padded_vocabulary_size: int  # rows rounded up to 8 x all SparseCores
    padded_dim: int
    row_offset_in_shard: int
    shard_rotation: int


@dataclasses.dataclass(frozen=True)
class JaxFeature:
    name: str
    table: str
    samples_per_sc: int  # samples of this feature on one SparseCore (its global samples / all SparseCores)
    row_offset: int  # jax's FeatureIdTransformation.row_offset: global samples of the stack's earlier features
    col_offset: int
    col_shift: int
    sequence_length: int  # > 0: one sample per (example, position)


@dataclasses.dataclass(frozen=True)
class JaxStack:
    name: str
    tables: Tuple[JaxTable, ...]
    features: Tuple[JaxFeature, ...]  # in row-offset order (the order jax packs them)
    combiner: str
    optimizer_group: str
    embedding_dim: int  # padded width
    vocabulary_size: int  # stacked rows: sum of padded table rows
    total_sample_count: int  # global samples over the stack's features
    batch_size_per_sc: int  # samples of one SparseCore: sum of the features' samples_per_sc


@dataclasses.dataclass(frozen=True)
class JaxLayout:
    """jax-tpu-embedding's stacking of a model: what `auto_stack_tables` + `prepare_feature_specs_for_training`
    put on its FeatureSpecs, as plain data. `stacks` in stacking order."""

    num_devices: int  # global devices (chips)
    num_sc_per_device: int
    num_hosts: int
    stacks: Tuple[JaxStack, ...]

    @property
    def num_scs(self) -> int:
        return self.num_devices * self.num_sc_per_device

    @property
    def local_devices(self) -> int:
        return self.num_devices // self.num_hosts

    @property
    def row_pointers_size_per_device(self) -> int:
        """jax's `compute_row_pointers_size_per_device` (minibatching off)."""
        return max(self.num_scs, ALIGN) * self.num_sc_per_device

    def stack(self, name: str) -> JaxStack:
        for s in self.stacks:
            if s.name == name:
                return s
        raise KeyError(f"No jax stack {name!r}; stacks are {[s.name for s in self.stacks]}")

    def theoretical_coo_buffer_size(self, max_ids_per_partition: int) -> int:
        """jax's `compute_theoretical_max_coo_buffer_size` (minibatching off)."""
        return round_up(int(max_ids_per_partition), ALIGN) * self.num_sc_per_device * self.num_scs

    def to_json(self) -> dict:
        return {"num_devices": self.num_devices, "num_sc_per_device": self.num_sc_per_device,
                "num_hosts": self.num_hosts,
                "stacks": [{"name": s.name, "combiner": s.combiner, "embedding_dim": s.embedding_dim,
                            "vocabulary_size": s.vocabulary_size, "total_sample_count": s.total_sample_count,
                            "batch_size_per_sc": s.batch_size_per_sc,
                            "tables": [dataclasses.asdict(t) for t in s.tables],
                            "features": [dataclasses.asdict(f) for f in s.features]}
                           for s in self.stacks]}


def stack_name(table_names: Sequence[str], short: bool = True) -> str:
    """jax's `_get_stack_name`."""
    name = "_".join(table_names)
    if not short or len(name) <= _SHORT_NAME:
        return name
    return name[:_SHORT_NAME] + "..." + hashlib.sha256(name.encode("utf-8")).hexdigest()[:_HASH_DIGITS]


def check_topology(num_chips: int, num_sc_per_chip: int, num_hosts: int = 1) -> None:
    """ValueError (one line, with the fix) if jax-tpu-embedding cannot lay out this topology."""
    if num_sc_per_chip not in NUM_SC_PER_DEVICE:
        raise ValueError(f"jax-tpu-embedding supports {' or '.join(map(str, NUM_SC_PER_DEVICE))} SparseCores per "
                         f"device, not {num_sc_per_chip}: set topology.num_sc_per_chip to 4 (TPU v5p) or 2 (v6e).")
    S = num_chips * num_sc_per_chip
    if S & (S - 1):
        raise ValueError(f"jax-tpu-embedding needs a power-of-two number of SparseCores, not {S} "
                         f"({num_chips} chips x {num_sc_per_chip}).")
    if num_chips % num_hosts:
        raise ValueError(f"{num_chips} chips do not split evenly over {num_hosts} hosts.")


def jax_layout(model: ModelConfig, *, short_stack_names: bool = True,
               activation_mem_bytes_limit: int = ACTIVATION_MEM_BYTES_LIMIT) -> JaxLayout:
    """jax-tpu-embedding's `auto_stack_tables` of `model` (cached per model)."""
    return _jax_layout(model, short_stack_names, int(activation_mem_bytes_limit))


@functools.lru_cache(maxsize=64)
def _jax_layout(model: ModelConfig, short: bool, mem_limit: int) -> JaxLayout:
    topo = model.topology
    check_topology(topo.num_chips, topo.num_sc_per_chip, topo.num_hosts)
    S = topo.num_chips * topo.num_sc_per_chip
    # Tables in order of first appearance among the features (jax: a dict built from the feature leaves).
    tables: Dict[str, TableConfig] = {}
    for f in model.features:
        tables.setdefault(f.table.name, f.table)
    padded_dim = {n: round_up(t.dim, 8) for n, t in tables.items()}
    padded_vocab = {n: round_up(t.vocabulary_size, 8 * S) for n, t in tables.items()}
    global_samples = {f.name: f.samples * topo.num_chips for f in model.features}
    sc_samples: Dict[str, int] = collections.defaultdict(int)
    for f in model.features:
        sc_samples[f.table.name] += global_samples[f.name] // S
    act_bytes = {n: padded_dim[n] * sc_samples[n] * 4 for n in tables}

    groups: Dict[Tuple[int, str, str], List[str]] = {}
    for n, t in tables.items():
        groups.setdefault((padded_dim[n], t.optimizer_group, t.combiner), []).append(n)
    split: List[List[str]] = []
    for group in groups.values():
        parts: List[List[str]] = []
        for n in group:
            for part in parts:
                if sum(act_bytes[m] for m in part) + act_bytes[n] <= mem_limit:
                    part.append(n)
                    break
            else:
                parts.append([n])
        split.extend(parts)

    stacks = []
    for group in split:
        name = stack_name(group, short)
        placed, offset, rotation = [], 0, 0
        for n in group:
            t = tables[n]
            placed.append(JaxTable(n, t.vocabulary_size, t.dim, padded_vocab[n], padded_dim[n], offset, rotation))
            offset += padded_vocab[n] // S
            rotation = (rotation + topo.num_sc_per_chip) % S
        by_table = {t.name: t for t in placed}
        feats, row = [], 0
        for f in model.features:
            if f.table.name not in by_table:
                continue
            jt = by_table[f.table.name]
            feats.append(JaxFeature(f.name, jt.name, global_samples[f.name] // S, row, jt.row_offset_in_shard * S,
                                    jt.shard_rotation, f.max_sequence_length if len(f.output_shape) > 1 else 0))
            row += global_samples[f.name]
        first = tables[group[0]]
        stacks.append(JaxStack(
            name, tuple(placed), tuple(feats), first.combiner, first.optimizer_group, max(padded_dim[n] for n in group),
            sum(padded_vocab[n] for n in group), row, sum(f.samples_per_sc for f in feats)))
    names = [s.name for s in stacks]
    if len(set(names)) != len(names):
        raise ValueError(f"jax's stack names collide: {names}; rename the tables.")
    return JaxLayout(topo.num_chips, topo.num_sc_per_chip, topo.num_hosts, tuple(stacks))


# ---------------------------------------------------------------- packing

@dataclasses.dataclass(frozen=True)
class HostFeature:
    """One feature's samples on one host: `row_splits` [samples + 1] into `ids` (and `weights`, or None)."""

    row_splits: np.ndarray
    ids: np.ndarray
    weights: Optional[np.ndarray] = None


@dataclasses.dataclass
class JaxHostBatch:
    """One stack's packed CSR for a host's local devices, as its meaningful parts.

    `row_pointers` [local devices, row_pointers_size_per_device] int32 (complete: jax writes all of them);
    `embedding_ids`, `sample_ids`, `gains`: every (device, local SparseCore) segment's prefix up to its
    aligned end (padding entries between partitions included), concatenated in (device, SparseCore) order;
    `segment_sizes` [devices, SCs per device] their lengths. `stats`: jax's SparseDenseMatmulInputStats
    for this stack (`max_ids_per_partition` / `max_unique_ids_per_partition` [devices x all SCs],
    `required_buffer_size` [devices x SCs per device], `dropped_ids`).
    """

    row_pointers: np.ndarray
    embedding_ids: np.ndarray
    sample_ids: np.ndarray
    gains: np.ndarray
    segment_sizes: np.ndarray
    max_ids_per_partition: np.ndarray
    max_unique_ids_per_partition: np.ndarray
    required_buffer_size: np.ndarray
    dropped_ids: int = 0

    @property
    def required_buffer_size_per_device(self) -> int:
        """The least COO buffer per device that holds every segment (jax's buffer is split in equal segments)."""
        nsc = self.segment_sizes.shape[1]
        return int(self.segment_sizes.max(initial=0)) * nsc

    def buffers(self, coo_buffer_size_per_device: Optional[int] = None, has_leading_dimension: bool = False
                ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(row_pointers, embedding_ids, sample_ids, gains) shaped as jax returns them: [devices, size] with
        `has_leading_dimension`, else flat. A buffer smaller than a segment is an error (jax would drop ids)."""
        L, nsc = self.segment_sizes.shape
        size = self.required_buffer_size_per_device if coo_buffer_size_per_device is None \
            else int(coo_buffer_size_per_device)
        if size % nsc or size // nsc < int(self.segment_sizes.max(initial=0)):
            raise ValueError(f"a COO buffer of {size} per device does not hold this step's segments "
                             f"({int(self.segment_sizes.max(initial=0))} per SparseCore x {nsc}); jax would drop ids. "
                             f"Use at least {self.required_buffer_size_per_device} (the stack's "
                             "suggested_coo_buffer_size_per_device).")
        per_sc = size // nsc
        eid = np.full((L * nsc, per_sc), PAD_ID, np.int32)
        sid = np.full((L * nsc, per_sc), PAD_ID, np.int32)
        g = np.full((L * nsc, per_sc), np.nan, np.float32)
        sizes = self.segment_sizes.reshape(-1)
        mask = np.arange(per_sc) < sizes[:, None]
        eid[mask], sid[mask], g[mask] = self.embedding_ids, self.sample_ids, self.gains
        rp = self.row_pointers
        eid, sid, g = eid.reshape(L, size), sid.reshape(L, size), g.reshape(L, size)
        if not has_leading_dimension:
            return rp.reshape(-1), eid.reshape(-1), sid.reshape(-1), g.reshape(-1)
        return rp, eid, sid, g


def _row_gains(combiner: str, splits: np.ndarray, weights: Optional[np.ndarray]) -> np.ndarray:
    """Per id, the gain of jax's ProcessCooTensors: w / divisor of its sample (float32, sums left to right,
    denormals flushed as jax's preprocessing threads do: `tpu_embed.sparsecore.denormals`)."""
    n = int(splits[-1])
    lengths = np.diff(splits)
    if combiner == "sum":  # w / 1.0f: a subnormal weight becomes zero of its sign
        return np.ones(n, np.float32) if weights is None else denormals.flush(weights).copy()
    if weights is None:  # 1 / n, or 1 / sqrt(n), per sample
        cnt = lengths.astype(np.float32)
        with np.errstate(divide="ignore"):
            per = np.float32(1) / (cnt if combiner == "mean" else np.sqrt(cnt))
        return np.repeat(per.astype(np.float32), lengths)
    w = denormals.flush(weights)
    starts = splits[:-1]
    acc = np.zeros(lengths.size, np.float32)
    for j in range(int(lengths.max(initial=0))):
        rows = np.flatnonzero(lengths > j)
        x = w[starts[rows] + j]
        if combiner == "mean":
            acc[rows] = denormals.add(acc[rows], x)
        else:  # C++: float sum += std::pow(w, 2) (a double): the square is exact, the sum rounded to float
            acc[rows] = denormals.to_float32(acc[rows].astype(np.float64) + x.astype(np.float64) ** 2)
    div = acc if combiner == "mean" else np.sqrt(acc)  # the root of a normal float32 (or 0) is normal
    return denormals.divide(w, np.repeat(div, lengths))


def _check_host_feature(f: JaxFeature, hf: HostFeature, samples: int) -> Tuple[np.ndarray, np.ndarray]:
    splits = np.asarray(hf.row_splits, np.int64)
    ids = np.asarray(hf.ids, np.int64)
    if splits.size != samples + 1:
        raise ValueError(f"Feature {f.name!r}: {splits.size - 1} samples on this host, jax's layout has {samples} "
                         "(samples per SparseCore x SparseCores per device x local devices).")
    if splits[0] != 0 or splits[-1] != ids.size or np.any(np.diff(splits) < 0):
        raise ValueError(f"Feature {f.name!r}: row_splits do not describe its {ids.size} ids.")
    if hf.weights is not None and np.asarray(hf.weights).size != ids.size:
        raise ValueError(f"Feature {f.name!r}: {np.asarray(hf.weights).size} weights for {ids.size} ids.")
    return splits, ids


def pack_host(layout: JaxLayout, features: Mapping[str, HostFeature],
              limits: Optional[Mapping[str, Tuple[int, int]]] = None) -> Dict[str, JaxHostBatch]:
    """{stack: JaxHostBatch} of one host's batch: jax's preprocessing of its local devices, vectorised.

    `features`: every feature of the layout, the host's samples in order (device-major, contiguous blocks).
    `limits`: {stack: (max_ids_per_partition, max_unique_ids_per_partition)} to check; exceeding one raises
    `LimitExceededError` (jax would abort, or drop ids with allow_id_dropping).
    """
    out = {}
    for st in layout.stacks:
        out[st.name] = _pack_stack(layout, st, features)
        if limits and st.name in limits:
            _check_limits(st.name, out[st.name], *limits[st.name])
    return out


def _check_limits(name: str, b: JaxHostBatch, max_ids: int, max_unique: int) -> None:
    got_ids = int(b.max_ids_per_partition.max(initial=0))
    got_unique = int(b.max_unique_ids_per_partition.max(initial=0))
    if got_ids > max_ids or got_unique > max_unique:
        raise LimitExceededError(
            f"jax stack {name!r}: {got_ids} ids / {got_unique} unique ids in one partition exceed "
            f"max_ids_per_partition={max_ids} / max_unique_ids_per_partition={max_unique}; raise them to at least "
            f"{got_ids} / {got_unique}.")


def _pack_stack(layout: JaxLayout, st: JaxStack, features: Mapping[str, HostFeature]) -> JaxHostBatch:
    """One stack's `JaxHostBatch`: its ids extracted, sorted and merged, then laid out in buffers."""
    L, nsc, S = layout.local_devices, layout.num_sc_per_device, layout.num_scs
    seg, row, col, gain = _extract_coo(st, features, L * nsc, S)
    seg, dest, token, row, gain = _sort_and_merge(seg, row, col, gain, S, st.batch_size_per_sc, L * nsc)
    return _fill_buffers(seg, dest, token, row, gain, L, nsc, S)


def _extract_coo(st: JaxStack, features: Mapping[str, HostFeature], segs: int, S: int
                 ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(segment, sample row, rewritten column, gain) of every id of the stack, feature by feature in input order;
    a segment is a (device, local SparseCore) slice of each feature's samples."""
    weighted = any(features[f.name].weights is not None for f in st.features)
    parts_seg, parts_row, parts_col, parts_gain = [], [], [], []
    for f in st.features:
        hf = features[f.name]
        n_f = f.samples_per_sc
        splits, ids = _check_host_feature(f, hf, n_f * segs)
        w = None
        if weighted:
            w = np.ones(ids.size, np.float32) if hf.weights is None else np.asarray(hf.weights, np.float32)
        lengths = np.diff(splits)
        sample = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
        parts_seg.append(sample // n_f)  # (device, local SC): slice index of the sample
        parts_row.append(sample % n_f + f.row_offset // S)
        parts_col.append(((ids + f.col_shift) & (S - 1)) + (ids & ~(S - 1)) + f.col_offset)
        parts_gain.append(_row_gains(st.combiner, splits, w))
    seg = np.concatenate(parts_seg) if parts_seg else np.zeros(0, np.int64)
    row = np.concatenate(parts_row) if parts_row else np.zeros(0, np.int64)
    col = np.concatenate(parts_col) if parts_col else np.zeros(0, np.int64)
    gain = np.concatenate(parts_gain) if parts_gain else np.zeros(0, np.float32)
    return seg, row, col, gain


def _sort_and_merge(seg: np.ndarray, row: np.ndarray, col: np.ndarray, gain: np.ndarray, S: int, bps: int,
                    segs: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(segment, destination SparseCore, token, sample row, gain) of the ids sorted by (segment, destination,
    token, sample), ties in input order (jax's index order), equal entries merged by adding their gains."""
    log2s = S.bit_length() - 1
    n = col.size
    dest = col & (S - 1)
    token = col >> log2s
    # One stable sort by (segment, destination, token, sample): ties keep input order (jax's index order).
    rbits = max(int(bps).bit_length(), 1)
    tbits = max(int(token.max(initial=0)).bit_length(), 1)
    sbits = max(int(segs).bit_length(), 1)
    if sbits + log2s + tbits + rbits <= 63:
        key = (((seg << log2s | dest) << tbits | token) << rbits) | row
        order = np.argsort(key, kind="stable")
        key = key[order]
        same = key[1:] == key[:-1] if n > 1 else np.zeros(0, bool)
    else:
        order = np.lexsort((row, token, dest, seg))
        cols = np.stack([seg[order], dest[order], token[order], row[order]])
        same = np.all(cols[:, 1:] == cols[:, :-1], axis=0) if n > 1 else np.zeros(0, bool)
    seg, dest, token, row, gain = seg[order], dest[order], token[order], row[order], gain[order]
    if same.any():
        first, gain = merge_runs(gain, same, n, add=denormals.add)
        seg, dest, token, row = seg[first], dest[first], token[first], row[first]
    return seg, dest, token, row, gain


def _fill_buffers(seg: np.ndarray, dest: np.ndarray, token: np.ndarray, row: np.ndarray, gain: np.ndarray,
                  L: int, nsc: int, S: int) -> JaxHostBatch:
    """The sorted entries laid out as jax's buffers: per segment and destination the entries, then padding to a
    multiple of 8; row pointers at each partition's end; and jax's statistics of the partitions."""
    segs = L * nsc
    k = int(seg.size)
    part = seg * S + dest
    counts = np.bincount(part, minlength=segs * S).reshape(segs, S)
    new_col = np.ones(k, bool)
    if k > 1:
        new_col[1:] = (part[1:] != part[:-1]) | (token[1:] != token[:-1])
    unique = np.bincount(part[new_col], minlength=segs * S).reshape(segs, S)

    padded = round_up(counts, ALIGN)
    starts = np.cumsum(padded, axis=1) - padded  # within each segment
    rp_width = max(S, ALIGN)
    rp = np.empty((segs, rp_width), np.int32)
    rp[:, :S] = starts + counts
    seg_size = padded.sum(axis=1)
    rp[:, S:] = seg_size[:, None]
    seg_start = np.cumsum(seg_size) - seg_size
    total = int(seg_size.sum())
    part_first = np.cumsum(counts.reshape(-1)) - counts.reshape(-1)  # first sorted entry of each partition
    pos = (seg_start[seg] + starts.reshape(-1)[part] + (np.arange(k) - part_first[part]))
    eid = np.full(total, PAD_ID, np.int32)
    sid = np.full(total, PAD_ID, np.int32)
    g = np.full(total, np.nan, np.float32)
    eid[pos], sid[pos], g[pos] = token, row, gain
    return JaxHostBatch(
        row_pointers=rp.reshape(L, nsc * rp_width), embedding_ids=eid, sample_ids=sid, gains=g,
        segment_sizes=seg_size.reshape(L, nsc),
        max_ids_per_partition=counts.reshape(L, nsc, S).max(axis=1).reshape(-1).astype(np.int32),
        max_unique_ids_per_partition=unique.reshape(L, nsc, S).max(axis=1).reshape(-1).astype(np.int32),
        required_buffer_size=seg_size.astype(np.int32))


def host_samples(layout: JaxLayout, feature: JaxFeature) -> int:
    """Samples of `feature` on one host."""
    return feature.samples_per_sc * layout.num_sc_per_device * layout.local_devices


def feature_order(layout: JaxLayout) -> List[JaxFeature]:
    return [f for st in layout.stacks for f in st.features]
