"""Per-step partition counts: ids and unique ids per (chip, local SC, destination SC).

Counts are kept sparse, as `CellCounts`: the non-empty cells
`(chip * num_sc_per_chip + local_sc) * S + destination_sc`, sorted, with the
ids (after dedup of equal (sample, id) pairs) and unique ids each receives.
A 256-chip candidate has 256 * 4 * 1024 cells but a step touches only as
many as it has ids.

Why per *table* first, stacks second: within a stack every table keeps its
own column range, so an (sample, column) pair or a unique column belongs to
exactly one table, and a stack's count in a cell is the sum of its members'
counts.  A member's rotation (`col_shift`) only moves its ids to destination
`(d + rotation) mod S`.  So counts of each table laid out alone (rotation 0)
give every stacking's counts by a roll and a sum (`stack_counts`), and the
per-table maxima are rotation-invariant, hence shareable between models that
stack the same table differently.  tests/profiles/test_counting.py checks
this against the core's `partition_counts` on the real stacked layout.

The main topology is counted by the core itself (`partition_counts`, the
implementation the shard job and training use), once per table on the
model seen as one chip with all S SparseCores (`one_chip_model`).
Candidate chip counts use `candidate_table_counts`, a vectorised equivalent
over the whole global batch (one sort per table instead of one per chip),
tested equal to the core.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tpu_embed.core.model import ModelConfig
from tpu_embed.core.topology import Topology
from tpu_embed.sparsecore import FeatureIds, SparseCoreLayout, layout_of, partition_counts


@dataclasses.dataclass(frozen=True)
class CellCounts:
    num_chips: int
    num_sc_per_chip: int
    num_sparse_cores: int  # S
    cells: np.ndarray  # int64, sorted, unique: (chip * nsc + local_sc) * S + dest
    ids: np.ndarray  # int64 ids per cell after dedup
    unique: np.ndarray  # int64 unique ids per cell

    @property
    def num_cells(self) -> int:
        return self.num_chips * self.num_sc_per_chip * self.num_sparse_cores

    def dense(self) -> Tuple[np.ndarray, np.ndarray]:
        """[chips, nsc, S] arrays (for tests and small topologies)."""
        shape = (self.num_chips, self.num_sc_per_chip, self.num_sparse_cores)
        ids = np.zeros(self.num_cells, np.int64)
        uniq = np.zeros(self.num_cells, np.int64)
        ids[self.cells] = self.ids
        uniq[self.cells] = self.unique
        return ids.reshape(shape), uniq.reshape(shape)


def _empty(num_chips, nsc, S) -> CellCounts:
    z = np.zeros(0, np.int64)
    return CellCounts(num_chips, nsc, S, z, z, z)


def _sum_cells(num_chips, nsc, S, cells: np.ndarray, ids: np.ndarray, uniq: np.ndarray) -> CellCounts:
    if not cells.size:
        return _empty(num_chips, nsc, S)
    u, inv = np.unique(cells, return_inverse=True)
    inv = inv.reshape(-1)
    return CellCounts(num_chips, nsc, S, u,
                      np.bincount(inv, weights=ids, minlength=u.size).astype(np.int64),
                      np.bincount(inv, weights=uniq, minlength=u.size).astype(np.int64))


# ---------------------------------------------------------------- main topology (core)

def one_chip_model(model: ModelConfig) -> ModelConfig:
    """`model` as one chip holding the whole global batch, with all S SparseCores as its local SCs.

    The core gives SparseCore l of chip c block l of each feature's per-chip samples (blocks of
    samples / num_sc_per_chip), so global sample r of a feature goes to SparseCore
    r // (samples / num_sc_per_chip) = c * num_sc_per_chip + l, its row there and its destinations
    (id mod S) unchanged.  On this model local SC c * num_sc_per_chip + l is therefore exactly chip
    c's SC l: one count of the global batch per table instead of one per table and chip.
    """
    t = model.topology
    if t.num_chips == 1:
        return model
    feats = tuple(dataclasses.replace(f, output_shape=(f.output_shape[0] * t.num_chips,) + f.output_shape[1:])
                  for f in model.features)
    return ModelConfig(feats, Topology(1, t.num_sparse_cores, 1))


def core_table_counts(global_ids: Mapping[str, FeatureIds], model: ModelConfig,
                      one_chip: Optional[ModelConfig] = None) -> Dict[str, CellCounts]:
    """Per table (laid out alone, rotation 0): counts of every chip of `model`, by the core's own counter.

    Counted on `one_chip` (`one_chip_model(model)`, pass it to reuse it), whose local SC
    c * num_sc_per_chip + l is chip c's SC l, so its cell (local SC) * S + destination is already
    the global cell; tests/profiles/test_counting.py checks this against the core chip by chip.
    """
    topo = model.topology
    nsc, S, chips = topo.num_sc_per_chip, topo.num_sparse_cores, topo.num_chips
    flat = layout_of(one_chip or one_chip_model(model), disable_table_stacking=True)
    assert flat.topology.num_sparse_cores == S and flat.topology.num_chips == 1
    out = {}
    for stack, (ids_pp, uniq_pp) in partition_counts(dict(global_ids), flat).items():
        table, = flat.stacks[stack].tables  # disable_table_stacking: one table per stack
        flat_ids = np.asarray(ids_pp, np.int64).reshape(-1)
        nz = np.flatnonzero(flat_ids)
        out[table] = CellCounts(chips, nsc, S, nz.astype(np.int64), flat_ids[nz],
                                np.asarray(uniq_pp, np.int64).reshape(-1)[nz])
    return out


# ---------------------------------------------------------------- candidates (vectorised)

@dataclasses.dataclass(frozen=True)
class DedupedTable:
    """A table's distinct (feature, global sample, id) triples of one step.

    The core merges equal (sample, id) pairs of a feature before counting;
    which chip/SC a sample lands on changes with the chip count, the pairs
    do not, so this is computed once per step and reused for every candidate.
    """

    feature: np.ndarray  # index into the table's features
    row: np.ndarray  # global sample index of that feature
    id: np.ndarray


def dedup_table(model: ModelConfig, table: str, global_ids: Mapping[str, FeatureIds]) -> DedupedTable:
    fs, rs, ids = [], [], []
    for i, f in enumerate(model.table_features(table)):
        fid = global_ids[f.name]
        if not fid.ids.size:
            continue
        key = _pack2(fid.rows, fid.ids)
        if key is not None:
            u = np.unique(key)
            shift = _bits(int(fid.ids.max()))
            r, d = u >> shift, u & ((1 << shift) - 1)
        else:
            order = np.lexsort((fid.ids, fid.rows))
            r, d = fid.rows[order], fid.ids[order]
            keep = np.ones(r.size, bool)
            keep[1:] = (r[1:] != r[:-1]) | (d[1:] != d[:-1])
            r, d = r[keep], d[keep]
        fs.append(np.full(r.size, i, np.int64))
        rs.append(r.astype(np.int64))
        ids.append(d.astype(np.int64))
    if not fs:
        z = np.zeros(0, np.int64)
        return DedupedTable(z, z, z)
    return DedupedTable(np.concatenate(fs), np.concatenate(rs), np.concatenate(ids))


def candidate_table_counts(candidate: ModelConfig, table: str, dd: DedupedTable) -> CellCounts:
    """Counts of one table laid out alone (rotation 0) on `candidate`'s chips, from deduped triples."""
    g = candidate.topology
    nsc, S, chips = g.num_sc_per_chip, g.num_sparse_cores, g.num_chips
    if not dd.id.size:
        return _empty(chips, nsc, S)
    # Samples per SC of each feature.
    block = np.array([f.samples // nsc for f in candidate.table_features(table)], np.int64)
    sc_global = dd.row // block[dd.feature]  # chip * nsc + local SC: samples split in contiguous blocks
    cell = sc_global * S + (dd.id & (S - 1))  # destination: id mod S (mod sharding, rotation 0)
    # One sort of (cell, id) pairs gives both counts: a cell's ids are its pairs' multiplicities
    # summed, its unique ids the number of its distinct pairs.
    pair = _pack2(cell, dd.id)
    if pair is not None:
        up, mult = np.unique(pair, return_counts=True)
        ucell = up >> _bits(int(dd.id.max()))
    else:
        order = np.lexsort((dd.id, cell))
        c, d = cell[order], dd.id[order]
        first = np.ones(c.size, bool)
        first[1:] = (c[1:] != c[:-1]) | (d[1:] != d[:-1])
        starts = np.flatnonzero(first)
        ucell, mult = c[starts], np.diff(np.append(starts, c.size))
    new_cell = np.ones(ucell.size, bool)
    new_cell[1:] = ucell[1:] != ucell[:-1]
    starts = np.flatnonzero(new_cell)
    cells = ucell[starts]
    ids = np.add.reduceat(mult, starts)
    uniq = np.diff(np.append(starts, ucell.size))
    return CellCounts(chips, nsc, S, cells.astype(np.int64), ids.astype(np.int64), uniq.astype(np.int64))


def _deduped(fid: FeatureIds) -> Tuple[np.ndarray, np.ndarray]:
    """(rows, ids) of a feature's step with equal (sample, id) pairs once; sorted by (row, id) where deduplicated."""
    rows, ids = fid.rows.astype(np.int64, copy=False), fid.ids.astype(np.int64, copy=False)
    if rows.size < 2 or not bool((rows[1:] == rows[:-1]).any()):  # one id per sample at most: nothing repeats
        return rows, ids
    key = _pack2(rows, ids)
    if key is not None:
        key = np.sort(key)
        key = key[np.concatenate([[True], key[1:] != key[:-1]])]
        shift = _bits(int(ids.max()))
        return key >> shift, key & ((1 << shift) - 1)
    order = np.lexsort((ids, rows))
    r, d = rows[order], ids[order]
    keep = np.ones(r.size, bool)
    keep[1:] = (r[1:] != r[:-1]) | (d[1:] != d[:-1])
    return r[keep], d[keep]


def hottest_per_table(model: ModelConfig, global_ids: Mapping[str, FeatureIds]) -> Dict[str, int]:
    """Per table, the lookups of its hottest id in one step after dedup (equal (sample, id) pairs of a feature
    counted once, as the core merges them): the floor of a step's busiest destination."""
    return hottest_per_table_steps(model, [global_ids])[0]


def hottest_per_table_steps(model: ModelConfig, steps: Sequence[Mapping[str, FeatureIds]]) -> List[Dict[str, int]]:
    """`hottest_per_table` of each step: one sort of every step's and table's ids at once (each table's ids
    offset past the previous tables', each step's past the previous steps'); a feature is deduplicated only
    where a sample holds several ids."""
    names = [t.name for t in model.tables]
    base = np.zeros(len(names) + 1, np.int64)
    np.cumsum([t.vocabulary_size for t in model.tables], out=base[1:])
    span = int(base[-1])
    index = {n: i for i, n in enumerate(names)}
    parts = []
    for g, global_ids in enumerate(steps):
        for f in model.features:
            fid = global_ids[f.name]
            if not fid.ids.size:
                continue
            _, ids = _deduped(fid)
            parts.append(ids + (base[index[f.table.name]] + g * span))
    best = np.zeros(len(steps) * len(names), np.int64)
    if parts:
        keys = np.concatenate(parts)
        keys = np.sort(keys.astype(np.uint32) if len(steps) * span <= 1 << 32 else keys)  # uint32 sorts ~3x faster
        starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
        runs = np.diff(np.append(starts, keys.size))
        first = keys[starts].astype(np.int64)
        slot = (first // span) * len(names) + np.searchsorted(base, first % span, side="right") - 1
        np.maximum.at(best, slot, runs)
    return [dict(zip(names, row)) for row in best.reshape(len(steps), len(names)).tolist()]


def relabelled_stack_counts(model: ModelConfig, global_ids: Mapping[str, FeatureIds],
                            new_ids: Mapping[str, np.ndarray]) -> Dict[str, CellCounts]:
    """Each stack's counts on the main topology had every id `i < len(new_ids[table])` of a table been
    `new_ids[table][i]` (the others kept): what `stack_counts` gives of the relabelled steps, for all stacks
    at once (one sort of the step's distinct (table, SparseCore, id) triples, bincounts per cell)."""
    layout = layout_of(model)
    topo = model.topology
    nsc, S, chips = topo.num_sc_per_chip, topo.num_sparse_cores, topo.num_chips
    scs = chips * nsc
    tables = [t.name for t in model.tables]
    index = {n: i for i, n in enumerate(tables)}
    stacks = list(layout.stacks)
    stack_of = np.array([stacks.index(layout.tables[n].stack) for n in tables], np.int64)
    rotation = np.array([layout.tables[n].rotation for n in tables], np.int64)
    base = np.zeros(len(tables) + 1, np.int64)
    np.cumsum([t.vocabulary_size for t in model.tables], out=base[1:])
    t_parts, sc_parts, id_parts = [], [], []
    for f in model.features:
        fid = global_ids[f.name]
        if not fid.ids.size:
            continue
        rows, ids = _deduped(fid)
        perm = new_ids.get(f.table.name)
        if perm is not None and perm.size:
            ids = ids.copy()
            inside = ids < perm.size
            ids[inside] = perm[ids[inside]]
        t_parts.append(np.full(ids.size, index[f.table.name], np.int64))
        sc_parts.append(rows // (f.samples // nsc))  # samples split in contiguous blocks over the SparseCores
        id_parts.append(ids)
    cells_per_stack = scs * S
    out = {}
    if t_parts:
        t, sc, ids = np.concatenate(t_parts), np.concatenate(sc_parts), np.concatenate(id_parts)
        flat = stack_of[t] * cells_per_stack + sc * S + ((ids + rotation[t]) & (S - 1))
        n_ids = np.bincount(flat, minlength=len(stacks) * cells_per_stack)
        key = np.sort((base[t] + ids) * scs + sc)  # distinct (table, SparseCore, id): a cell's unique ids
        key = key[np.concatenate([[True], key[1:] != key[:-1]])]
        q, usc = key // scs, key % scs
        ut = np.searchsorted(base, q, side="right") - 1
        uflat = stack_of[ut] * cells_per_stack + usc * S + ((q - base[ut] + rotation[ut]) & (S - 1))
        n_unique = np.bincount(uflat, minlength=len(stacks) * cells_per_stack)
    for i, name in enumerate(stacks):
        if not t_parts:
            out[name] = _empty(chips, nsc, S)
            continue
        part = slice(i * cells_per_stack, (i + 1) * cells_per_stack)
        cells = np.flatnonzero(n_ids[part])
        out[name] = CellCounts(chips, nsc, S, cells.astype(np.int64), n_ids[part][cells].astype(np.int64),
                               n_unique[part][cells].astype(np.int64))
    return out


# ---------------------------------------------------------------- stacks from tables

def stack_counts(layout: SparseCoreLayout, table_counts: Mapping[str, CellCounts]) -> Dict[str, CellCounts]:
    """Each stack's counts: members' rotation-0 counts rolled by their rotation, summed per cell."""
    topo = layout.topology
    nsc, S, chips = topo.num_sc_per_chip, topo.num_sparse_cores, topo.num_chips
    out = {}
    for name, stack in layout.stacks.items():
        if len(stack.tables) == 1 and layout.tables[stack.tables[0]].rotation == 0:
            out[name] = table_counts[stack.tables[0]]
            continue
        cells, ids, uniq = [], [], []
        for t in stack.tables:
            c = table_counts[t]
            rot = layout.tables[t].rotation
            cells.append((c.cells // S) * S + ((c.cells % S) + rot) % S)
            ids.append(c.ids)
            uniq.append(c.unique)
        out[name] = _sum_cells(chips, nsc, S, np.concatenate(cells), np.concatenate(ids), np.concatenate(uniq))
    return out


# ---------------------------------------------------------------- helpers

def _bits(n: int) -> int:
    return max(int(n).bit_length(), 1)


def _pack2(hi: np.ndarray, lo: np.ndarray):
    """hi << bits(lo) | lo as int64 if it fits in 63 bits, else None."""
    if not lo.size:
        return np.zeros(0, np.int64)
    lb = _bits(int(lo.max()))
    if _bits(int(hi.max())) + lb > 62:
        return None
    return (hi.astype(np.int64) << lb) | lo.astype(np.int64)
