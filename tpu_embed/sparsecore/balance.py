"""Load-balanced ids: which id each token of a stack's tables gets, so that every destination SparseCore of the
stack receives about the same number of lookups.

SparseCore mod-shards a stacked table: a lookup of id `i` of a member table with rotation `r` (its `col_shift`)
goes to destination SparseCore `(i + r) mod S`, S = chips x SparseCores per chip (the row offset of the table in
the stack is a multiple of S and moves nothing). A step waits for its busiest SparseCore, and the limits
`max_ids_per_table` / `max_unique_ids_per_table` are sized by it. A frequency-ordered vocabulary gives the hottest
tokens of every table ids 0, 1, 2, ..., so consecutive SparseCores, whose traffic differs by orders of magnitude.

The ids of a table are a bijection of its tokens onto a range of ids: each destination holds a fixed number of
the range's ids (its residue class), whatever the order. Only which tokens go to which class is free, and
`assign_ids` chooses it for all tables of a stack at once:

* largest count first (ties: the tables in the given order, then the tokens in the given order), each token goes
  to the destination with the least load so far among those where its table still has a free id (ties: the
  lowest destination): greedy LPT scheduling with one capacity per (table, destination);
* ids that stay where they are (a base vocabulary's ids under `mode: append`, the OOV buckets after the tokens,
  tables whose ids nobody chooses) are loads the stack starts from (`TableDemand.fixed_ids` / `fixed_counts`);
* within a class, tokens take its ids in ascending order, largest count first, so the hottest tokens still have
  the smallest ids of their class.

Tokens of equal count are placed together: a run of `m` equal tokens of one table fills the least-loaded
destinations as the one-by-one greedy would (the `m` smallest of the loads each destination would have after
0, 1, 2, ... more of them), so the cost follows the number of distinct counts, not of tokens.

Counts are lookups over the data the vocabulary was counted on; a step sees a sample of them, so a step's
balance is that of the data plus the step's noise. numpy only; no TensorFlow, no Beam.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Sequence

import numpy as np

_EMPTY = np.zeros(0, np.int64)


@dataclasses.dataclass(frozen=True)
class TableDemand:
    """One table of a stack as the assignment sees it.

    `counts[k]`: the lookups of the k-th token to place (in the vocabulary job's order); the tokens take the ids
    `first_id .. first_id + len(counts) - 1`. `fixed_ids` / `fixed_counts`: ids of the table that keep their
    place (a base vocabulary's ids, the OOV buckets) and their lookups. `rotation`: the table's `col_shift` in
    its stack (the destination of its id 0)."""

    name: str
    rotation: int
    counts: np.ndarray
    first_id: int = 0
    fixed_ids: np.ndarray = dataclasses.field(default_factory=lambda: _EMPTY)
    fixed_counts: np.ndarray = dataclasses.field(default_factory=lambda: _EMPTY)

    def __post_init__(self):
        for name in ("counts", "fixed_ids", "fixed_counts"):
            object.__setattr__(self, name, np.asarray(getattr(self, name), np.int64).reshape(-1))
        if self.fixed_ids.size != self.fixed_counts.size:
            raise ValueError(f"table {self.name!r}: fixed_ids and fixed_counts differ in length")
        if self.counts.size and int(self.counts.min()) < 0 or self.fixed_counts.size and int(
                self.fixed_counts.min()) < 0:
            raise ValueError(f"table {self.name!r}: counts must be >= 0")
        if self.first_id < 0 or self.fixed_ids.size and int(self.fixed_ids.min()) < 0:
            raise ValueError(f"table {self.name!r}: ids must be >= 0")


def destination_capacity(first_id: int, n: int, rotation: int, num_sparse_cores: int) -> np.ndarray:
    """[S] how many of the ids `first_id .. first_id + n - 1` of a table rotated by `rotation` each destination
    holds: `n // S`, one more for the `n % S` destinations that follow the first id's."""
    S = int(num_sparse_cores)
    cap = np.full(S, n // S, np.int64)
    cap[(int(first_id) + int(rotation) + np.arange(n % S)) % S] += 1
    return cap


def destination_loads(tables: Sequence[TableDemand], ids: Mapping[str, np.ndarray],
                      num_sparse_cores: int) -> np.ndarray:
    """[S] lookups each destination receives: every table's fixed ids and its tokens at `ids[name]`."""
    S = int(num_sparse_cores)
    load = np.zeros(S, np.int64)
    for t in tables:
        load += np.bincount((t.fixed_ids + t.rotation) % S, weights=t.fixed_counts, minlength=S).astype(np.int64)
        load += np.bincount((np.asarray(ids[t.name], np.int64) + t.rotation) % S, weights=t.counts,
                            minlength=S).astype(np.int64)
    return load


def assign_ids(tables: Sequence[TableDemand], num_sparse_cores: int) -> Dict[str, np.ndarray]:
    """{table: ids[k], the id of its k-th token}: each table's tokens onto its ids `first_id .. first_id + n - 1`
    (a bijection), balanced over the stack's destinations as the module docstring says. Deterministic."""
    S = int(num_sparse_cores)
    if S < 1:
        raise ValueError(f"num_sparse_cores must be >= 1, got {num_sparse_cores}")
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        raise ValueError(f"a stack lists a table twice: {names}")
    load = destination_loads(tables, {t.name: _EMPTY for t in tables}, S) if tables else np.zeros(S, np.int64)
    loads: List[int] = load.tolist()
    free = [destination_capacity(t.first_id, t.counts.size, t.rotation, S).tolist() for t in tables]
    sizes = np.array([t.counts.size for t in tables], np.int64)
    counts = np.concatenate([t.counts for t in tables]) if tables else _EMPTY
    owner = np.repeat(np.arange(len(tables), dtype=np.int64), sizes)
    order = np.argsort(-counts, kind="stable")  # count descending; ties: table order, then token order
    dest = np.empty(counts.size, np.int64)
    c_sorted, o_sorted = counts[order], owner[order]
    # Runs of equal (count, table) in that order: placed together.
    if counts.size:
        change = np.flatnonzero((c_sorted[1:] != c_sorted[:-1]) | (o_sorted[1:] != o_sorted[:-1])) + 1
        starts = np.concatenate([[0], change]).tolist()
        ends = np.concatenate([change, [counts.size]]).tolist()
    else:
        starts, ends = [], []
    c_runs, o_runs = c_sorted[starts].tolist() if starts else [], o_sorted[starts].tolist() if starts else []
    for a, b, c, t in zip(starts, ends, c_runs, o_runs):
        room = free[t]
        if b - a == 1:  # one token: the least-loaded destination with a free id
            best = -1
            for d in range(S):
                if room[d] and (best < 0 or loads[d] < loads[best]):
                    best = d
            room[best] -= 1
            loads[best] += c
            dest[order[a]] = best
            continue
        k = _fill(loads, room, c, b - a)
        for d in np.flatnonzero(k).tolist():
            room[d] -= int(k[d])
            loads[d] += c * int(k[d])
        dest[order[a:b]] = np.repeat(np.arange(S, dtype=np.int64), k)
    # Ids: within each (table, destination), the class's ids in ascending order, in placement order.
    rank = np.empty(counts.size, np.int64)
    rank[order] = np.arange(counts.size, dtype=np.int64)
    out: Dict[str, np.ndarray] = {}
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    for i, t in enumerate(tables):
        lo, hi = int(offsets[i]), int(offsets[i + 1])
        where, placed = dest[lo:hi], rank[lo:hi]
        by = np.lexsort((placed, where))
        first_of = np.searchsorted(where[by], np.arange(S))  # where each destination's tokens start in `by`
        nth = np.arange(hi - lo, dtype=np.int64) - first_of[where[by]]
        lowest = t.first_id + (where[by] - t.rotation - t.first_id) % S  # the class's lowest id in the range
        ids = np.empty(hi - lo, np.int64)
        ids[by] = lowest + nth * S
        out[t.name] = ids
    return out


def _fill(load: List[int], room: List[int], c: int, m: int) -> np.ndarray:
    """[S] how many of `m` tokens of count `c` each destination takes when they are placed one by one on the
    least-loaded destination with room (ties: the lowest): the `m` smallest of the pairs
    (load[d] + c * j, d), j < room[d].

    With base = the least load among destinations with room, load[d] = base + r[d] + c * a[d] (0 <= r[d] < c),
    so pair j of destination d is (base + r[d] + c * (a[d] + j), d): the pairs come in rounds k = a[d] + j, each
    round in (r[d], d) order. The rounds that fill are counted by walking where destinations start (a[d]) and
    stop (a[d] + room[d]) taking one per round; the last round is shared out in (r[d], d) order."""
    S = len(load)
    out = np.zeros(S, np.int64)
    avail = [d for d in range(S) if room[d] > 0]
    if c == 0:  # any place is as good: the lowest destinations with room
        for d in avail:
            out[d] = min(room[d], m)
            m -= int(out[d])
        return out
    base = min(load[d] for d in avail)
    a = {d: (load[d] - base) // c for d in avail}
    events: Dict[int, int] = {}  # round -> change of the number of destinations taking one per round
    for d in avail:
        events[a[d]] = events.get(a[d], 0) + 1
        events[a[d] + room[d]] = events.get(a[d] + room[d], 0) - 1
    points = sorted(events)
    taken, active, last = 0, 0, 0  # tokens placed before round `points[i]`, destinations active, that round
    for i, p in enumerate(points):
        active += events[p]
        nxt = points[i + 1] if i + 1 < len(points) else p
        if active and taken + active * (nxt - p) >= m:
            last = p + (m - taken - 1) // active  # the round the m-th token is placed in
            taken += active * (last - p)
            break
        taken += active * (nxt - p)
    for d in avail:
        out[d] = min(max(last - a[d], 0), room[d])  # its rounds before the last
    share = sorted((((load[d] - base) % c, d) for d in avail if a[d] <= last < a[d] + room[d]))
    for _, d in share[:m - taken]:
        out[d] += 1
    return out
