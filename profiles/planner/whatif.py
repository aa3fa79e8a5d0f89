"""What-if: the profiled steps re-partitioned for another configuration, without reading the data again.

A configuration is a `Placement`: a SparseCore model (topology, per-chip batch) and its stacked tables (members
in order, each with its rotation), plus the tables it leaves to the TensorCore.  `evaluate` sends every kept step's
ids (`profiles.whatif_steps.WhatIfSteps`) where that configuration sends them and returns, per stacked table, the
figures the planner and the cost model use (`StackLoad`).  Exact when every step was kept; otherwise the figures
are those of the kept sample, which `WhatIfSteps.sampling()` states.

How a step is counted, as the core counts it (tests/profiles/planner/test_whatif.py checks it against the profile's own
counts of the same steps, for stacks, chip counts, SparseCores per chip and batch sizes):

* a feature's (global sample, id) pairs count once (the core merges equal pairs);
* sample `r` of a feature goes to SparseCore `r // (samples per chip / SparseCores per chip)` (chip-major blocks),
  its id to destination `(id + rotation) mod S`;
* per (source SparseCore, destination) cell: its ids, and its unique ids (rows gathered);
* per chip: the id buffer, the sum over its cells of the ids rounded up to 8.

A global batch of `B / k` splits each kept step into `k` steps of consecutive examples; one of `m * B` puts `m`
consecutive kept steps together (the kept blocks of `BLOCK_STEPS` steps allow m = 2 and 4).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from profiles.planner.estimate import ID_ENTRY_BYTES, ROW_ELEMENT_BYTES
from profiles.units import CandidateUnavailable
from profiles.whatif_steps import BLOCK_STEPS, WhatIfSteps
from tpu_embed.core.model import ModelConfig
from tpu_embed.core.topology import Topology, is_power_of_two
from tpu_embed.sparsecore import layout_of
from tpu_embed.sparsecore.padding import XLA_PAD

# Cells counted densely (np.bincount) up to this many per step; beyond, the non-empty cells are sorted.
_DENSE_CELLS = 1 << 22


@dataclasses.dataclass(frozen=True)
class StackShape:
    """One stacked table of a placement."""

    name: str
    tables: Tuple[str, ...]  # stack order
    rotations: Tuple[int, ...]  # col_shift per member: destination of its id 0
    padded_dim: int
    sample_count: int  # samples per chip over the stack's features


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a model's tables live: SparseCore stacks of `model` (its topology and batch), TensorCore tables."""

    label: str
    model: ModelConfig  # the SparseCore features only
    stacks: Tuple[StackShape, ...]
    tensor_core: Tuple[str, ...] = ()  # tables looked up on the TensorCore instead

    @property
    def num_sc_per_chip(self) -> int:
        return self.model.topology.num_sc_per_chip


def tf_placement(model: ModelConfig, label: str = "tf-default", *, disable_table_stacking: bool = False,
                 tensor_core: Sequence[str] = ()) -> Placement:
    """TensorFlow's stacking of `model` (`tpu_embed.sparsecore.layout_of`)."""
    layout = layout_of(model, disable_table_stacking=disable_table_stacking)
    return Placement(label, model, tuple(
        StackShape(s.name, s.tables, tuple(layout.tables[t].rotation for t in s.tables), s.padded_dim, s.sample_count)
        for s in layout.stacks.values()), tuple(tensor_core))


def over_mean(total: float, mean: float) -> float:
    """A load over the mean destination's load (balance: the busiest; floor: the hottest id's), 1.0 where no id
    was looked up: the one definition the planner's balance and floor figures use."""
    return total / mean if mean else 1.0


@dataclasses.dataclass
class StackLoad:
    """One stacked table over the steps evaluated (`evaluate`).

    Sums over steps (`busiest_*`, `mean_ids`, `floor_ids`) divided by `steps` are per-step means."""

    steps: int = 0
    ids: int = 0  # ids after dedup, all cells
    unique_ids: int = 0
    max_ids: int = 0  # the largest cell: max_ids_per_table
    max_unique_ids: int = 0  # max_unique_ids_per_table
    max_chip_buffer: int = 0  # id slots of the fullest chip buffer (max_ids_per_chip_per_sample x samples)
    busiest_ids: int = 0  # sum over steps of the busiest destination SparseCore's ids
    busiest_rows: int = 0  # sum over steps of the most rows one destination gathers (its cells' unique ids)
    # Sum over steps of the busiest destination's traffic under the cost model (profiles.planner.cost): its ids x
    # ID_ENTRY_BYTES (token id, sample id, gain read) + its rows x padded width x ROW_ELEMENT_BYTES (rows gathered).
    busiest_traffic: int = 0
    mean_ids: float = 0.0  # sum over steps of the mean destination's ids
    floor_ids: float = 0.0  # sum over steps of max(hottest single id's ids, mean): no id assignment goes below
    worst_balance: float = 0.0  # the largest busiest / mean of one step
    partition_max_ids: Optional[np.ndarray] = None  # [chips, S] (jax's FDO figures), when asked for
    partition_max_unique_ids: Optional[np.ndarray] = None
    sc_max_buffer: Optional[np.ndarray] = None  # [chips, SCs per chip]

    @property
    def balance(self) -> float:
        """Busiest destination over the mean, summed over steps (1.0: every SparseCore equally busy)."""
        return over_mean(self.busiest_ids, self.mean_ids)

    @property
    def floor(self) -> float:
        """The balance no assignment of ids can beat: the hottest id lives on one SparseCore."""
        return over_mean(self.floor_ids, self.mean_ids)


# ---------------------------------------------------------------- configurations

def variant(model: ModelConfig, num_chips: int, num_sc_per_chip: int, global_batch: int) -> ModelConfig:
    """`model`'s features on `num_chips` x `num_sc_per_chip` SparseCores with a global batch of `global_batch`
    examples.  Raises CandidateUnavailable (why) where that cannot run."""
    S = num_chips * num_sc_per_chip
    if not is_power_of_two(S):
        raise CandidateUnavailable(f"{num_chips} chips x {num_sc_per_chip} SparseCores is not a power of two")
    if global_batch % num_chips:
        raise CandidateUnavailable(f"global batch {global_batch} is not divisible by {num_chips} chips")
    per_chip = global_batch // num_chips
    for f in model.features:
        if per_chip * f.samples_per_example % num_sc_per_chip:
            raise CandidateUnavailable(
                f"feature {f.name!r}: {per_chip * f.samples_per_example} samples per chip do not split over "
                f"{num_sc_per_chip} SparseCores")
    t = model.topology
    hosts = t.num_hosts if num_chips % t.num_hosts == 0 else 1
    return model.with_topology(Topology(num_chips, num_sc_per_chip, hosts), per_chip)


def global_batch(model: ModelConfig) -> int:
    return model.per_chip_batch * model.topology.num_chips


# ---------------------------------------------------------------- steps, ready to re-partition

@dataclasses.dataclass(frozen=True)
class _BatchStep:
    """The deduped ids of `substeps` consecutive steps of one global batch, sorted by (table, id, example)."""

    substeps: int
    table: np.ndarray  # index into model.tables
    id: np.ndarray
    row: np.ndarray  # the feature's sample index within these substeps' examples
    feature: np.ndarray  # index into model.features
    new_key: np.ndarray  # bool: the first entry of its (table, id)
    hot: np.ndarray  # [tables, substeps]: the most entries one id of the table has in a substep


class ReplaySteps:
    """The kept steps of `model`'s profile, deduped and sorted once, for every global batch asked for."""

    def __init__(self, model: ModelConfig, steps: WhatIfSteps):
        self.model, self.source = model, steps
        self.batch = global_batch(model)
        self._tables = {t.name: i for i, t in enumerate(model.tables)}
        self._spe = np.array([f.samples_per_example for f in model.features], np.int64)
        self._table_of_feature = np.array([self._tables[f.table.name] for f in model.features], np.int64)
        self._base = {s: self._dedup(ids) for s, ids in sorted(steps.steps.items())}
        self._cache: Dict[int, List[_BatchStep]] = {}

    @property
    def sampling(self) -> str:
        return self.source.sampling()

    def _dedup(self, step) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(table, id, row, feature) of one kept step, each feature's (row, id) pairs once."""
        parts = []
        for i, f in enumerate(self.model.features):
            rows, ids = step.get(f.name, (np.zeros(0, np.int32), np.zeros(0, np.int64)))
            if not ids.size:
                continue
            r, d = _unique_pairs(rows.astype(np.int64), ids)
            parts.append((np.full(r.size, self._table_of_feature[i]), d, r, np.full(r.size, i)))
        if not parts:
            z = np.zeros(0, np.int64)
            return z, z, z, z
        table, ids, rows, feature = (np.concatenate([p[k] for p in parts]).astype(np.int64) for k in range(4))
        return table, ids, rows, feature

    def steps_for(self, batch: int) -> List[_BatchStep]:
        """The kept steps as steps of a global batch of `batch` examples (`batch` = B / k or B x m)."""
        if batch not in self._cache:
            B = self.batch
            if batch <= B:
                if B % batch:
                    raise CandidateUnavailable(f"global batch {batch} does not divide the profiled {B}")
                k = B // batch
                self._cache[batch] = [self._sorted(t, i, r, f, k, batch) for t, i, r, f in self._base.values()]
            else:
                if batch % B or batch // B not in (2, 4):
                    raise CandidateUnavailable(f"global batch {batch}: only 2 and 4 times the profiled {B} are put "
                                               f"together from kept blocks of {BLOCK_STEPS} steps")
                m = batch // B
                out = []
                steps = sorted(self._base)
                for first in steps:
                    if first % m or any(first + i not in self._base for i in range(m)):
                        continue
                    parts = [self._base[first + i] for i in range(m)]
                    shift = [i * B * self._spe[p[3]] for i, p in enumerate(parts)]
                    out.append(self._sorted(np.concatenate([p[0] for p in parts]),
                                            np.concatenate([p[1] for p in parts]),
                                            np.concatenate([p[2] + s for p, s in zip(parts, shift)]),
                                            np.concatenate([p[3] for p in parts]), 1, batch))
                self._cache[batch] = out
        return self._cache[batch]

    def _sorted(self, table, ids, row, feat, substeps: int, batch: int) -> _BatchStep:
        example = row // self._spe[feat] if row.size else row
        order = _order(table, ids, example)
        table, ids, row, feat, example = table[order], ids[order], row[order], feat[order], example[order]
        new_key = np.ones(ids.size, bool)
        new_key[1:] = (table[1:] != table[:-1]) | (ids[1:] != ids[:-1])
        sub = example // batch
        new_run = new_key.copy()
        new_run[1:] |= sub[1:] != sub[:-1]
        hot = np.zeros((len(self._tables), substeps), np.int64)
        if ids.size:
            starts = np.flatnonzero(new_run)
            lengths = np.diff(np.append(starts, ids.size))
            np.maximum.at(hot, (table[starts], sub[starts]), lengths)
        return _BatchStep(substeps, table, ids, row, feat, new_key, hot)


def _bits(a: np.ndarray) -> int:
    return max(int(a.max()).bit_length(), 1) if a.size else 1


def _order(table: np.ndarray, ids: np.ndarray, example: np.ndarray) -> np.ndarray:
    """`np.lexsort((example, ids, table))`: equal entries in their order.  One argsort of the keys packed with
    each entry's position (unique keys, so any sort is stable) where they fit 63 bits, several times faster."""
    n = ids.size
    eb, ib, tb, pb = _bits(example), _bits(ids), _bits(table), max(int(n - 1).bit_length(), 1)
    if n == 0 or eb + ib + tb + pb > 63:
        return np.lexsort((example, ids, table))
    key = (((table << ib | ids) << eb | example) << pb) | np.arange(n, dtype=np.int64)
    return np.argsort(key)


def _unique_pairs(rows: np.ndarray, ids: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    lb = max(int(ids.max()).bit_length(), 1)
    if max(int(rows.max()).bit_length(), 1) + lb <= 62:
        u = np.sort((rows << lb) | ids)  # then distinct: np.unique hashes first, ~20 times slower here
        keep = np.ones(u.size, bool)
        np.not_equal(u[1:], u[:-1], out=keep[1:])
        u = u[keep]
        return u >> lb, u & ((1 << lb) - 1)
    order = np.lexsort((ids, rows))
    r, d = rows[order], ids[order]
    keep = np.ones(r.size, bool)
    keep[1:] = (r[1:] != r[:-1]) | (d[1:] != d[:-1])
    return r[keep], d[keep]


# ---------------------------------------------------------------- evaluation

def evaluate(placement: Placement, replay: ReplaySteps, *, per_partition: bool = False) -> Dict[str, StackLoad]:
    """Every stacked table of `placement` over the kept steps (see the module docstring)."""
    model = placement.model
    topo = model.topology
    chips, nsc = topo.num_chips, topo.num_sc_per_chip
    S = chips * nsc
    batch = global_batch(model)
    steps = replay.steps_for(batch)
    base = replay.model
    tables = replay._tables
    stack_of = np.full(len(tables), -1, np.int64)
    rotation = np.zeros(len(tables), np.int64)
    for i, st in enumerate(placement.stacks):
        for t, r in zip(st.tables, st.rotations):
            stack_of[tables[t]], rotation[tables[t]] = i, r
    per_chip = batch // chips
    block = np.array([per_chip * f.samples_per_example // nsc for f in base.features], np.int64)
    aligned = per_chip % nsc == 0  # examples per SparseCore whole: a sample's SparseCore follows its example
    nst = len(placement.stacks)
    out = [StackLoad() for _ in range(nst)]
    if per_partition:
        for load in out:
            load.partition_max_ids = np.zeros((chips, S), np.int64)
            load.partition_max_unique_ids = np.zeros((chips, S), np.int64)
            load.sc_max_buffer = np.zeros((chips, nsc), np.int64)
    members = [np.array([tables[t] for t in st.tables], np.int64) for st in placement.stacks]
    row_bytes = np.array([st.padded_dim * ROW_ELEMENT_BYTES for st in placement.stacks], np.int64)
    for bs in steps:
        _add_step(out, bs, stack_of, rotation, block, aligned, members, row_bytes, nst, chips, nsc, per_partition)
    return {st.name: load for st, load in zip(placement.stacks, out)}


def _cells(bs: _BatchStep, stack_of, rotation, block, aligned: bool, nst: int, nsrc: int, S: int
           ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The non-empty cells (stack, source SparseCore of a substep, destination) of one batch step, as flat indices,
    with their ids and unique ids (a (table, id) counted once per source SparseCore)."""
    stk = stack_of[bs.table]
    keep = stk >= 0
    stk, ids, row, feat, new_key, table = stk[keep], bs.id[keep], bs.row[keep], bs.feature[keep], \
        bs.new_key[keep], bs.table[keep]
    src = row // block[feat]
    dest = (ids + rotation[table]) & (S - 1)
    if aligned:
        first = new_key.copy()
        first[1:] |= src[1:] != src[:-1]
    else:  # a sample's SparseCore is not its example's: sort by (source, table, id) to find the unique ones
        order = np.lexsort((ids, table, src))
        first = np.zeros(ids.size, bool)
        s, t, d = src[order], table[order], ids[order]
        f = np.ones(ids.size, bool)
        f[1:] = (s[1:] != s[:-1]) | (t[1:] != t[:-1]) | (d[1:] != d[:-1])
        first[order] = f
    cell = (stk * nsrc + src) * S + dest
    ncell = nst * nsrc * S
    if ncell <= _DENSE_CELLS:
        c_ids = np.bincount(cell, minlength=ncell)
        c_uq = np.bincount(cell[first], minlength=ncell)
        cells = np.flatnonzero(c_ids)
        c_ids, c_uq = c_ids[cells], c_uq[cells]
    else:
        cells, inv = np.unique(cell, return_inverse=True)
        inv = inv.reshape(-1)
        c_ids = np.bincount(inv, minlength=cells.size)
        c_uq = np.bincount(inv[first], minlength=cells.size)
    return cells, c_ids.astype(np.int64), c_uq.astype(np.int64)


def _add_step(out: List[StackLoad], bs: _BatchStep, stack_of, rotation, block, aligned: bool, members, row_bytes,
              nst: int, chips: int, nsc: int, per_partition: bool) -> None:
    """Adds one batch step's figures to `out` (one `StackLoad` per stack of the placement)."""
    S, K = chips * nsc, bs.substeps
    nsrc = K * chips * nsc  # source SparseCores of every substep, in order
    cells, c_ids, c_uq = _cells(bs, stack_of, rotation, block, aligned, nst, nsrc, S)
    # Cell coordinates: (stack, substep, chip, local SC, destination).
    st_of = cells // (nsrc * S)
    gsrc = (cells // S) % nsrc
    sub, chip, local = gsrc // (chips * nsc), (gsrc // nsc) % chips, gsrc % nsc
    d = cells % S
    G = nst * K
    g = st_of * K + sub
    max_ids = np.zeros(G, np.int64)
    max_uq = np.zeros(G, np.int64)
    np.maximum.at(max_ids, g, c_ids)
    np.maximum.at(max_uq, g, c_uq)
    padded = -(-c_ids // XLA_PAD) * XLA_PAD
    chip_buf = np.bincount(g * chips + chip, weights=padded, minlength=G * chips).reshape(G, chips).max(axis=1)
    dest_ids = np.bincount(g * S + d, weights=c_ids, minlength=G * S).reshape(G, S)
    dest_rows = np.bincount(g * S + d, weights=c_uq, minlength=G * S).reshape(G, S)
    total = dest_ids.sum(axis=1)
    busiest = dest_ids.max(axis=1)
    traffic = (dest_ids * ID_ENTRY_BYTES + dest_rows * np.repeat(row_bytes, K)[:, None]).max(axis=1) \
        if G else np.zeros(0)
    mean = total / S
    hot = np.stack([bs.hot[m].max(axis=0) if m.size else np.zeros(K, np.int64) for m in members]).reshape(G) \
        if members else np.zeros(0, np.int64)
    ids_g = np.bincount(g, weights=c_ids, minlength=G)
    uq_g = np.bincount(g, weights=c_uq, minlength=G)
    for i in range(nst):
        load, sl = out[i], slice(i * K, (i + 1) * K)
        load.steps += K
        load.ids += int(ids_g[sl].sum())
        load.unique_ids += int(uq_g[sl].sum())
        load.max_ids = max(load.max_ids, int(max_ids[sl].max()))
        load.max_unique_ids = max(load.max_unique_ids, int(max_uq[sl].max()))
        load.max_chip_buffer = max(load.max_chip_buffer, int(chip_buf[sl].max()))
        load.busiest_ids += int(busiest[sl].sum())
        load.busiest_rows += int(dest_rows[sl].max(axis=1).sum())
        load.busiest_traffic += int(traffic[sl].sum())
        load.mean_ids += float(mean[sl].sum())
        load.floor_ids += float(np.maximum(hot[sl], mean[sl]).sum())
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(mean[sl] > 0, busiest[sl] / np.where(mean[sl] > 0, mean[sl], 1), 1.0)
        load.worst_balance = max(load.worst_balance, float(ratio.max()))
    if per_partition:
        _max_per_partition(out, st_of, chip, local, d, g, c_ids, c_uq, padded, K, chips, nsc)


def _max_per_partition(out: List[StackLoad], st_of, chip, local, d, g, c_ids, c_uq, padded, K: int, chips: int,
                       nsc: int) -> None:
    """jax's FDO figures of one batch step (cells by stack, chip, local SparseCore and destination) into `out`."""
    nst, S = len(out), chips * nsc
    G = nst * K
    pm_ids = np.zeros((nst, chips, S), np.int64)
    pm_uq = np.zeros((nst, chips, S), np.int64)
    np.maximum.at(pm_ids, (st_of, chip, d), c_ids)
    np.maximum.at(pm_uq, (st_of, chip, d), c_uq)
    sc_buf = np.bincount((g * chips + chip) * nsc + local, weights=padded, minlength=G * chips * nsc)
    sc_buf = sc_buf.reshape(nst, K, chips, nsc).max(axis=1).astype(np.int64)
    for i in range(nst):
        load = out[i]
        assert load.partition_max_ids is not None and load.partition_max_unique_ids is not None
        assert load.sc_max_buffer is not None
        np.maximum(load.partition_max_ids, pm_ids[i], out=load.partition_max_ids)
        np.maximum(load.partition_max_unique_ids, pm_uq[i], out=load.partition_max_unique_ids)
        np.maximum(load.sc_max_buffer, sc_buf[i], out=load.sc_max_buffer)


def chip_value(loads: Dict[str, StackLoad], placement: Placement) -> int:
    """max_ids_per_chip_per_sample that holds every evaluated step of every stack (`propose.per_sample`'s rule)."""
    from profiles.planner.propose import buffer_multiple, per_sample
    shapes = {s.name: s for s in placement.stacks}
    need = max((per_sample(max(loads[n].max_chip_buffer, 1), shapes[n].sample_count, 1) for n in loads), default=1)
    m = buffer_multiple(s.sample_count for s in placement.stacks)
    return int(math.ceil(need / m) * m)
