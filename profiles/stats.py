"""Mergeable statistics: what a profile accumulates, step by step.

Every class here is plain data (ints, dicts, numpy arrays, `Histogram`,
`IdCounts`), picklable, and has `merge_from` that is exact, associative and
commutative: integer sums, element-wise array sums, histogram count sums,
per-id count sums.  The one exception to plain summation is `StepSeries`
(per-step maxima kept for plots, profiles/step_series.py), whose merge is a
union keyed by step index; see its docstring.  Equality is equality of the
canonical JSON form (`profiles.jsonio.JsonEq`).
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from profiles.counting import CellCounts
from profiles.histogram import Histogram
from profiles.idcounts import ENCODING, IdCounts, pack_ids, unpack_ids
from profiles.jsonio import JsonEq
from profiles.step_series import StepSeries
from tpu_embed.sparsecore.padding import XLA_PAD, round_up  # every (local SC, dest SC) id segment pads to it


def deep_copy(obj):
    """A deep copy of plain statistics; pickle is much faster than copy.deepcopy on dicts of tuples."""
    return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _add_arrays(a: Optional[np.ndarray], b: Optional[np.ndarray]) -> Optional[np.ndarray]:
    if a is None:
        return None if b is None else b.copy()
    if b is None:
        return a
    return _sum_arrays(a, b)


def _sum_arrays(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.shape != b.shape:
        raise ValueError(f"cannot merge statistics of different shapes {a.shape} and {b.shape}")
    return a + b


def _max_arrays(a: Optional[np.ndarray], b: Optional[np.ndarray]) -> Optional[np.ndarray]:
    """Element-wise maximum; None (not kept) unless both sides kept the array."""
    if a is None or b is None:
        return None
    if a.shape != b.shape:
        raise ValueError(f"cannot merge statistics of different shapes {a.shape} and {b.shape}")
    return np.maximum(a, b)


def _per_partition_from_json(d: Optional[Mapping], chips: int, nsc: int) -> Tuple[Optional[np.ndarray], ...]:
    if d is None:  # profiles written before these were kept, or of a candidate topology
        return None, None, None
    if d.get("encoding") != ENCODING:
        raise ValueError(f"per-partition maxima: unknown encoding {d.get('encoding')!r}")
    S = chips * nsc
    return (unpack_ids(d["partition_max_ids"]).reshape(chips, S),
            unpack_ids(d["partition_max_unique_ids"]).reshape(chips, S),
            unpack_ids(d["sc_max_buffer"]).reshape(chips, nsc))


def _arr(x) -> Optional[np.ndarray]:
    return None if x is None else np.asarray(x, np.int64)


def _list(a: Optional[np.ndarray]):
    return None if a is None else a.tolist()


@dataclasses.dataclass(eq=False)
class PartitionStats(JsonEq):
    """One table or stack on one topology: what every (chip, local SC, destination SC) received.

    Per step the profiler sees, for each cell, the ids after dedup and the
    unique ids: exactly what TF's GetStatsFromListOfSparseCoreCooTensors
    maximises and what `max_ids_per_table` / `max_unique_ids_per_table`
    bound.  Kept: histograms of the per-step maxima (over chips, SCs and
    destinations) -> quantiles over steps; histograms of every cell value ->
    what a limit would cut; the id buffer each chip and each SC needs (sum
    over its (local SC, destination SC) segments of round_up(ids, XLA_PAD)), as the
    per-step maximum -> max_ids_per_chip_per_sample, and for every chip ->
    what a smaller buffer would drop; per destination SC loads -> balance;
    per (local SC, destination SC) totals (main topology only) -> heat map.
    """

    num_chips: int
    num_sc_per_chip: int
    num_sparse_cores: int
    steps: int = 0
    ids: int = 0  # total ids after dedup, all cells, all steps
    unique_ids: int = 0
    step_max_ids: Histogram = dataclasses.field(default_factory=Histogram)
    step_max_unique_ids: Histogram = dataclasses.field(default_factory=Histogram)
    cell_ids: Histogram = dataclasses.field(default_factory=Histogram)  # every cell of every step
    cell_unique_ids: Histogram = dataclasses.field(default_factory=Histogram)
    step_max_chip_buffer: Histogram = dataclasses.field(default_factory=Histogram)  # id slots, one buffer per chip
    chip_buffer: Histogram = dataclasses.field(default_factory=Histogram)  # every chip of every step
    step_max_sc_buffer: Histogram = dataclasses.field(default_factory=Histogram)  # id slots of one local SC
    dest_ids: Optional[np.ndarray] = None  # [S] ids per destination SC, summed over steps
    step_max_dest_ids: int = 0  # sum over steps of the busiest destination's ids
    sc_dest_ids: Optional[np.ndarray] = None  # [nsc, S] summed over chips and steps (heat map)
    series: Optional[StepSeries] = None
    # Per partition as jax-tpu-embedding's FDO stats count them (main topology only): over every step and the
    # chip's local SCs, the most ids / unique ids a (chip, destination SC) pair received, and the most id slots
    # each (chip, local SC) needed.  Merged by element-wise maximum.
    partition_max_ids: Optional[np.ndarray] = None  # [chips, S]
    partition_max_unique_ids: Optional[np.ndarray] = None  # [chips, S]
    sc_max_buffer: Optional[np.ndarray] = None  # [chips, nsc]
    # Balance per step (main topology; None where not counted). The floor no assignment of ids can beat: a step's
    # busiest destination receives at least its hottest id's lookups (one id lives on one SparseCore) and at least
    # the mean; summed over steps as max(S x hottest, ids) (integers; / ids = the floor of the balance).  The worst
    # step: the largest busiest-destination / mean of one step, and the largest floor of one step.  Merged by sums
    # and maxima.
    step_floor_ids: Optional[int] = None
    worst_step_balance: Optional[float] = None
    worst_step_floor: Optional[float] = None
    # The same stack had its tables' ids been in frequency order (an artifact with `partition: {ids: balanced}`:
    # its profile counts each step both ways, from the same ids); None otherwise.
    frequency_order: Optional["PartitionStats"] = None

    @classmethod
    def empty(cls, num_chips: int, num_sc_per_chip: int, *, heat_map: bool = False,
              series_steps: Optional[int] = None, per_partition: bool = False,
              step_balance: bool = False) -> "PartitionStats":
        """`step_balance`: count the per-step balance figures (floor, worst step); the collector asks for them on
        the main topology's stacks."""
        S = num_chips * num_sc_per_chip
        out = cls(num_chips, num_sc_per_chip, S, dest_ids=np.zeros(S, np.int64),
                  sc_dest_ids=np.zeros((num_sc_per_chip, S), np.int64) if heat_map else None,
                  series=StepSeries(series_steps) if series_steps else None)
        if step_balance:
            out.step_floor_ids, out.worst_step_balance, out.worst_step_floor = 0, 0.0, 0.0
        if per_partition:
            out.partition_max_ids = np.zeros((num_chips, S), np.int64)
            out.partition_max_unique_ids = np.zeros((num_chips, S), np.int64)
            out.sc_max_buffer = np.zeros((num_chips, num_sc_per_chip), np.int64)
        return out

    @property
    def has_per_partition(self) -> bool:
        return (self.partition_max_ids is not None and self.partition_max_unique_ids is not None
                and self.sc_max_buffer is not None)

    def add_step(self, c: CellCounts, step: int, hottest: Optional[int] = None) -> None:
        PartitionStats.add_step_many([self], [c], step, None if hottest is None else [hottest])

    @staticmethod
    def add_step_many(stats: Sequence["PartitionStats"], counts: Sequence[CellCounts], step: int,
                      hottest: Optional[Sequence[Optional[int]]] = None) -> None:
        """stats[i].add_step(counts[i], step) for every i (one topology): `add_steps_many` of one step."""
        PartitionStats.add_steps_many(stats, [counts], [step], None if hottest is None else [hottest])

    @staticmethod
    def add_steps_many(stats: Sequence["PartitionStats"], counts: Sequence[Sequence[CellCounts]],
                       steps: Sequence[int], hottest: Optional[Sequence[Optional[Sequence[Optional[int]]]]] = None
                       ) -> None:
        """stats[i].add_step(counts[g][i], steps[g], hottest[g][i]) for every step g, in order, then every i (one
        topology): the numpy work of all of them at once, the arrays of each statistic's steps added together.

        Per statistic: ids and unique ids summed and maximised over cells; every cell's values into the cell
        histograms (cells without ids as zeros); per local SC and per chip the id buffer (the cells' ids padded
        to XLA_PAD, summed); per destination SC the ids; the heat map's (local SC, destination) ids; where the
        statistic counts them, the step's balance, and with `hottest` (per step and statistic: the lookups of
        the step's hottest id, after dedup) its floor. Sums, histograms and maxima do not depend on how steps
        are grouped, so adding G steps at once equals adding them one by one (tests/profiles/test_stats.py).
        """
        if not stats or not steps:
            return
        G, k = len(steps), len(stats)
        if len(counts) != G or (hottest is not None and len(hottest) != G):
            raise ValueError("one list of cell counts (and of hottest ids) per step")
        chips, nsc, S = stats[0].num_chips, stats[0].num_sc_per_chip, stats[0].num_sparse_cores
        for step_counts in counts:
            for ps, c in zip(stats, step_counts, strict=True):
                if (ps.num_chips, ps.num_sc_per_chip) != (chips, nsc) or \
                        (c.num_chips, c.num_sc_per_chip) != (chips, nsc):
                    raise ValueError("cell counts of another topology")
        # Statistic-major (row i * G + g): each statistic's steps are consecutive rows, its cells one run.
        f = _StepCells.of([counts[g][i] for i in range(k) for g in range(G)], chips, nsc, S,
                          heat_map=any(ps.sc_dest_ids is not None for ps in stats),
                          per_partition=any(ps.has_per_partition for ps in stats))
        PartitionStats._add_cells(stats, f, steps, hottest)

    @staticmethod
    def add_steps_dense(stats: Sequence["PartitionStats"], ids: np.ndarray, unique: np.ndarray,
                        steps: Sequence[int], hottest: Optional[np.ndarray] = None) -> None:
        """`add_steps_many` of dense cell counts: `ids[g, i]` and `unique[g, i]` are statistic i's cells of step
        g (int64 [G, k, num_cells], cell (chip * nsc + local SC) * S + destination), `hottest[g, i]` its
        hottest id's lookups. The same statistics as the `CellCounts` of the nonzero cells (tests/profiles/
        test_stats.py), without a Python object per statistic and step."""
        if not stats or not steps:
            return
        G, k = len(steps), len(stats)
        chips, nsc, S = stats[0].num_chips, stats[0].num_sc_per_chip, stats[0].num_sparse_cores
        if any((ps.num_chips, ps.num_sc_per_chip) != (chips, nsc) for ps in stats):
            raise ValueError("statistics of another topology")
        if ids.shape != (G, k, chips * nsc * S) or unique.shape != ids.shape or \
                (hottest is not None and hottest.shape != (G, k)):
            raise ValueError(f"dense cell counts of shape {ids.shape}: expected ({G}, {k}, {chips * nsc * S})")
        f = _StepCells.of_dense(ids.transpose(1, 0, 2).reshape(k * G, -1),
                                unique.transpose(1, 0, 2).reshape(k * G, -1), chips, nsc, S,
                                heat_map=any(ps.sc_dest_ids is not None for ps in stats),
                                per_partition=any(ps.has_per_partition for ps in stats))
        PartitionStats._add_cells(stats, f, steps, None if hottest is None else hottest.tolist())

    @staticmethod
    def _add_cells(stats: Sequence["PartitionStats"], f: "_StepCells", steps: Sequence[int],
                   hottest: Optional[Sequence[Optional[Sequence[Optional[int]]]]]) -> None:
        """What `add_steps_many` adds of its statistics' cells `f` (row i * G + g: statistic i, step g)."""
        G = len(steps)
        chips, nsc, S = stats[0].num_chips, stats[0].num_sc_per_chip, stats[0].num_sparse_cores
        num_cells = chips * nsc * S
        for i, ps in enumerate(stats):
            r = slice(i * G, (i + 1) * G)
            first, last = f.ends[i * G] - f.sizes[i * G], f.ends[i * G + G - 1]
            ps.steps += G
            ps.ids += int(f.sum_ids[r].sum())
            ps.unique_ids += int(f.sum_uniq[r].sum())
            ps.step_max_ids.add_array(f.max_ids[r])
            ps.step_max_unique_ids.add_array(f.max_uniq[r])
            empty_cells = G * num_cells - int(f.sizes[r].sum())
            ps.cell_ids.add_array(f.ids[first:last])
            ps.cell_ids.add(0, empty_cells)
            ps.cell_unique_ids.add_array(f.uniq[first:last])
            ps.cell_unique_ids.add(0, empty_cells)
            ps.chip_buffer.add_array(f.chip_need[r])
            ps.step_max_sc_buffer.add_array(f.max_sc[r])
            ps.step_max_chip_buffer.add_array(f.max_chip[r])
            dest = f.dest[r].sum(axis=0)
            ps.dest_ids = dest if ps.dest_ids is None else ps.dest_ids + dest
            ps.step_max_dest_ids += int(f.max_dest[r].sum())
            if ps.sc_dest_ids is not None and f.heat is not None:  # a step without ids adds zeros
                ps.sc_dest_ids += f.heat[r].sum(axis=0)
            if ps.series is not None:
                for g, step in enumerate(steps):
                    ps.series.record(step, int(f.max_ids[i * G + g]), int(f.max_uniq[i * G + g]),
                                     int(f.max_chip[i * G + g]))
            if ps.has_per_partition:
                ps._max_per_partition(f.part_ids[r].max(axis=0), f.part_uniq[r].max(axis=0),
                                      f.sc_need[r].reshape(G, chips, nsc).max(axis=0).astype(np.int64))
            for g in range(G):
                if ps.step_floor_ids is None:
                    break
                j = i * G + g
                if f.sum_ids[j]:
                    h = None if hottest is None or hottest[g] is None else hottest[g][i]  # type: ignore[index]
                    ps._add_step_balance(int(f.max_dest[j]), int(f.sum_ids[j]), None if h is None else int(h))

    def _add_step_balance(self, busiest: int, ids: int, hottest: Optional[int]) -> None:
        S = self.num_sparse_cores
        self.worst_step_balance = max(self.worst_step_balance or 0.0, busiest * S / ids)
        if hottest is None:  # no floor this step: the statistic cannot say one any more
            self.step_floor_ids = self.worst_step_floor = None
            return
        floor = max(S * hottest, ids)
        self.step_floor_ids = (self.step_floor_ids or 0) + floor
        self.worst_step_floor = max(self.worst_step_floor or 0.0, floor / ids)

    def _max_per_partition(self, ids: np.ndarray, unique: np.ndarray, sc_buffer: np.ndarray) -> None:
        if self.partition_max_ids is None or self.partition_max_unique_ids is None or self.sc_max_buffer is None:
            return
        np.maximum(self.partition_max_ids, ids, out=self.partition_max_ids)
        np.maximum(self.partition_max_unique_ids, unique, out=self.partition_max_unique_ids)
        np.maximum(self.sc_max_buffer, sc_buffer, out=self.sc_max_buffer)

    def _per_partition_json(self) -> Optional[dict]:
        if self.partition_max_ids is None or self.partition_max_unique_ids is None or self.sc_max_buffer is None:
            return None
        return {"encoding": ENCODING, "partition_max_ids": pack_ids(self.partition_max_ids.reshape(-1)),
                "partition_max_unique_ids": pack_ids(self.partition_max_unique_ids.reshape(-1)),
                "sc_max_buffer": pack_ids(self.sc_max_buffer.reshape(-1))}

    def merge_from(self, other: "PartitionStats") -> None:
        if (self.num_chips, self.num_sc_per_chip) != (other.num_chips, other.num_sc_per_chip):
            raise ValueError(f"cannot merge partition statistics of {other.num_chips}x{other.num_sc_per_chip} "
                             f"into {self.num_chips}x{self.num_sc_per_chip}")
        self.steps += other.steps
        self.ids += other.ids
        self.unique_ids += other.unique_ids
        for f in ("step_max_ids", "step_max_unique_ids", "cell_ids", "cell_unique_ids", "step_max_chip_buffer",
                  "chip_buffer", "step_max_sc_buffer"):
            getattr(self, f).merge_from(getattr(other, f))
        self.dest_ids = _add_arrays(self.dest_ids, other.dest_ids)
        self.step_max_dest_ids += other.step_max_dest_ids
        if self.sc_dest_ids is None or other.sc_dest_ids is None:
            self.sc_dest_ids = None  # heat map only where both sides kept one
        else:
            self.sc_dest_ids = self.sc_dest_ids + other.sc_dest_ids
        if self.series is None or other.series is None:
            self.series = self.series or (None if other.series is None else deep_copy(other.series))
        else:
            self.series.merge_from(other.series)
        for f in ("partition_max_ids", "partition_max_unique_ids", "sc_max_buffer"):
            setattr(self, f, _max_arrays(getattr(self, f), getattr(other, f)))
        counted = self.step_floor_ids is not None and other.step_floor_ids is not None
        self.step_floor_ids = self.step_floor_ids + other.step_floor_ids if counted else None  # type: ignore
        for f in ("worst_step_balance", "worst_step_floor"):
            a, b = getattr(self, f), getattr(other, f)
            setattr(self, f, max(a, b) if counted and a is not None and b is not None else None)
        if self.frequency_order is None or other.frequency_order is None:
            self.frequency_order = None  # both ways only where both sides counted both
        else:
            self.frequency_order.merge_from(other.frequency_order)

    # ------------------------------------------------------------ derived figures

    @property
    def max_ids(self) -> int:
        return self.step_max_ids.max

    @property
    def max_unique_ids(self) -> int:
        return self.step_max_unique_ids.max

    def destination_balance(self) -> float:
        """max / mean of the ids each destination SC received over the whole profile (1.0 = perfect)."""
        if self.dest_ids is None or not self.ids:
            return 1.0
        return float(self.dest_ids.max()) / (self.ids / self.num_sparse_cores)

    def step_destination_balance(self) -> float:
        """Sum over steps of the busiest destination / sum of the mean: the imbalance a step sees."""
        if not self.ids:
            return 1.0
        return self.step_max_dest_ids / (self.ids / self.num_sparse_cores)

    def step_balance_floor(self) -> Optional[float]:
        """The least `step_destination_balance` any assignment of ids could reach on these steps: per step the
        larger of the hottest id's lookups and the mean, summed, / the summed mean (None: not counted)."""
        if self.step_floor_ids is None:
            return None
        return self.step_floor_ids / self.ids if self.ids else 1.0

    def summary(self) -> dict:
        qs = ("p50", "p99", "p99.9", "max")
        return {
            "steps": self.steps,
            "ids": self.ids,
            "unique_ids": self.unique_ids,
            "max_ids_per_partition": {q: self.step_max_ids.quantile(q) for q in qs},
            "max_unique_ids_per_partition": {q: self.step_max_unique_ids.quantile(q) for q in qs},
            "chip_id_buffer": {q: self.step_max_chip_buffer.quantile(q) for q in qs},
            "sc_id_buffer": {q: self.step_max_sc_buffer.quantile(q) for q in qs},
            "mean_ids_per_partition": self.cell_ids.mean,
            "destination_balance": self.destination_balance(),
            "step_destination_balance": self.step_destination_balance(),
            **({"step_balance_floor": self.step_balance_floor(), "worst_step_destination_balance":
                self.worst_step_balance, "worst_step_floor": self.worst_step_floor}
               if self.step_floor_ids is not None else {}),
            **({"frequency_order": self.frequency_order.summary()} if self.frequency_order is not None else {}),
        }

    # ------------------------------------------------------------ JSON

    def to_json(self) -> dict:
        return {
            "num_chips": self.num_chips, "num_sc_per_chip": self.num_sc_per_chip,
            "num_sparse_cores": self.num_sparse_cores, "steps": self.steps, "ids": self.ids,
            "unique_ids": self.unique_ids,
            "step_max_ids": self.step_max_ids.to_json(),
            "step_max_unique_ids": self.step_max_unique_ids.to_json(),
            "cell_ids": self.cell_ids.to_json(), "cell_unique_ids": self.cell_unique_ids.to_json(),
            "step_max_chip_buffer": self.step_max_chip_buffer.to_json(),
            "chip_buffer": self.chip_buffer.to_json(),
            "step_max_sc_buffer": self.step_max_sc_buffer.to_json(),
            "dest_ids": _list(self.dest_ids), "step_max_dest_ids": self.step_max_dest_ids,
            "sc_dest_ids": _list(self.sc_dest_ids),
            "series": None if self.series is None else self.series.to_json(),
            "per_partition": self._per_partition_json(),
            # written only where counted: the files of stacks and candidates that do not count them are unchanged
            **({"step_floor_ids": self.step_floor_ids, "worst_step_balance": self.worst_step_balance,
                "worst_step_floor": self.worst_step_floor} if self.step_floor_ids is not None else {}),
            **({"frequency_order": self.frequency_order.to_json()} if self.frequency_order is not None else {}),
        }

    @classmethod
    def from_json(cls, d: Mapping) -> "PartitionStats":
        part_ids, part_uniq, sc_buffer = _per_partition_from_json(d.get("per_partition"), int(d["num_chips"]),
                                                                  int(d["num_sc_per_chip"]))
        return cls(
            int(d["num_chips"]), int(d["num_sc_per_chip"]), int(d["num_sparse_cores"]), int(d["steps"]),
            int(d["ids"]), int(d["unique_ids"]),
            Histogram.from_json(d["step_max_ids"]), Histogram.from_json(d["step_max_unique_ids"]),
            Histogram.from_json(d["cell_ids"]), Histogram.from_json(d["cell_unique_ids"]),
            Histogram.from_json(d["step_max_chip_buffer"]), Histogram.from_json(d["chip_buffer"]),
            Histogram.from_json(d["step_max_sc_buffer"]),
            _arr(d.get("dest_ids")), int(d["step_max_dest_ids"]), _arr(d.get("sc_dest_ids")),
            None if d.get("series") is None else StepSeries.from_json(d["series"]),
            part_ids, part_uniq, sc_buffer,
            step_floor_ids=None if d.get("step_floor_ids") is None else int(d["step_floor_ids"]),
            worst_step_balance=None if d.get("worst_step_balance") is None else float(d["worst_step_balance"]),
            worst_step_floor=None if d.get("worst_step_floor") is None else float(d["worst_step_floor"]),
            frequency_order=None if d.get("frequency_order") is None else
            PartitionStats.from_json(d["frequency_order"]))


@dataclasses.dataclass(slots=True)
class _StepCells:
    """One step's cell counts of several statistics of one topology, concatenated, and what
    `PartitionStats.add_step_many` adds of them, per statistic (row i: statistic i)."""

    sizes: np.ndarray  # [k] cells with ids per statistic
    ends: np.ndarray  # [k] where each statistic's cells end in `ids` / `uniq`
    ids: np.ndarray  # every cell's ids, statistic after statistic
    uniq: np.ndarray
    sum_ids: np.ndarray  # [k]
    sum_uniq: np.ndarray
    max_ids: np.ndarray  # [k] the largest cell
    max_uniq: np.ndarray
    sc_need: np.ndarray  # [k, chips x nsc] id buffer slots per SparseCore (its cells padded to XLA_PAD)
    chip_need: np.ndarray  # [k, chips]
    max_sc: np.ndarray  # [k]
    max_chip: np.ndarray  # [k]
    dest: np.ndarray  # [k, S] ids per destination SparseCore
    max_dest: np.ndarray  # [k]
    heat: Optional[np.ndarray]  # [k, nsc, S] (local SC, destination) ids; None unless asked for
    part_ids: np.ndarray  # [k, chips, S] the most ids over each chip's local SCs ([k, 0, 0] unless asked for)
    part_uniq: np.ndarray

    @classmethod
    def of(cls, counts: Sequence[CellCounts], chips: int, nsc: int, S: int, *, heat_map: bool,
           per_partition: bool) -> "_StepCells":
        k, scs = len(counts), chips * nsc
        sizes = np.array([c.cells.size for c in counts], np.int64)
        cells = np.concatenate([c.cells for c in counts]).astype(np.int64, copy=False)
        ids = np.concatenate([c.ids for c in counts]).astype(np.int64, copy=False)
        uniq = np.concatenate([c.unique for c in counts]).astype(np.int64, copy=False)
        seg = np.repeat(np.arange(k, dtype=np.int64), sizes)
        # Sums and maxima over each statistic's cells (ids >= 0: an empty statistic's are 0).
        sum_ids = np.bincount(seg, weights=ids, minlength=k).astype(np.int64)
        sum_uniq = np.bincount(seg, weights=uniq, minlength=k).astype(np.int64)
        max_ids, max_uniq = np.zeros(k, np.int64), np.zeros(k, np.int64)
        full = np.flatnonzero(sizes)
        if full.size:
            starts = (np.cumsum(sizes) - sizes)[full]
            max_ids[full] = np.maximum.reduceat(ids, starts)
            max_uniq[full] = np.maximum.reduceat(uniq, starts)
        sc_global = cells // S
        sc_need = np.bincount(seg * scs + sc_global, weights=round_up(ids, XLA_PAD), minlength=k * scs).reshape(k, scs)
        chip_need = sc_need.reshape(k, chips, nsc).sum(axis=2).astype(np.int64)
        max_sc, max_chip = sc_need.max(axis=1).astype(np.int64), chip_need.max(axis=1)
        dest = np.bincount(seg * S + cells % S, weights=ids, minlength=k * S).astype(np.int64).reshape(k, S)
        heat = None
        if heat_map:
            local = seg * (nsc * S) + (sc_global % nsc) * S + cells % S
            heat = np.bincount(local, weights=ids, minlength=k * nsc * S).astype(np.int64).reshape(k, nsc, S)
        part_ids = np.zeros((k, chips, S) if per_partition else (k, 0, 0), np.int64)
        part_uniq = np.zeros_like(part_ids)
        if per_partition:
            part = seg * (chips * S) + (sc_global // nsc) * S + cells % S
            np.maximum.at(part_ids.reshape(-1), part, ids)
            np.maximum.at(part_uniq.reshape(-1), part, uniq)
        return cls(sizes, np.cumsum(sizes), ids, uniq, sum_ids, sum_uniq, max_ids, max_uniq, sc_need, chip_need,
                   max_sc, max_chip, dest, dest.max(axis=1), heat, part_ids, part_uniq)

    @classmethod
    def of_dense(cls, ids: np.ndarray, uniq: np.ndarray, chips: int, nsc: int, S: int, *, heat_map: bool,
                 per_partition: bool) -> "_StepCells":
        """`of` from dense rows (row i: statistic i's cells, [k, chips * nsc * S]); the cells with ids are the
        cells a `CellCounts` lists, in the same order."""
        k, scs = ids.shape[0], chips * nsc
        nz = ids > 0
        sizes = nz.sum(axis=1).astype(np.int64)
        by_sc = ids.reshape(k, scs, S)
        sc_need = round_up(by_sc, XLA_PAD).sum(axis=2)
        chip_need = sc_need.reshape(k, chips, nsc).sum(axis=2)
        dest = by_sc.sum(axis=1)
        by_chip = ids.reshape(k, chips, nsc, S)
        heat = by_chip.sum(axis=1) if heat_map else None
        if per_partition:
            part_ids, part_uniq = by_chip.max(axis=2), uniq.reshape(k, chips, nsc, S).max(axis=2)
        else:
            part_ids = np.zeros((k, 0, 0), np.int64)
            part_uniq = np.zeros_like(part_ids)
        return cls(sizes, np.cumsum(sizes), ids[nz], uniq[nz], ids.sum(axis=1), uniq.sum(axis=1), ids.max(axis=1),
                   uniq.max(axis=1), sc_need, chip_need, sc_need.max(axis=1), chip_need.max(axis=1), dest,
                   dest.max(axis=1), heat, part_ids, part_uniq)


@dataclasses.dataclass(eq=False)
class FeatureStats(JsonEq):
    examples: int = 0
    ids: int = 0  # raw lookups (before any dedup)
    ids_per_example: Histogram = dataclasses.field(default_factory=Histogram)
    oov_ids: int = 0
    oov_reported_ids: int = 0  # lookups of the steps for which an OOV count was passed

    def merge_from(self, o: "FeatureStats") -> None:
        self.examples += o.examples
        self.ids += o.ids
        self.ids_per_example.merge_from(o.ids_per_example)
        self.oov_ids += o.oov_ids
        self.oov_reported_ids += o.oov_reported_ids

    def to_json(self) -> dict:
        return {"examples": self.examples, "ids": self.ids, "ids_per_example": self.ids_per_example.to_json(),
                "oov_ids": self.oov_ids, "oov_reported_ids": self.oov_reported_ids}

    @classmethod
    def from_json(cls, d: Mapping) -> "FeatureStats":
        return cls(int(d["examples"]), int(d["ids"]), Histogram.from_json(d["ids_per_example"]),
                   int(d["oov_ids"]), int(d["oov_reported_ids"]))


@dataclasses.dataclass(eq=False)
class ShardLoad(JsonEq):
    """Raw lookups per shard of S shards under 'mod' (id % S) and 'div' (id // ceil(vocab / S)).

    SparseCore always mod-shards; 'div' is TPUEmbedding v1's default
    `partition_strategy`.  With a frequency-ordered vocabulary (id 0 = most
    frequent, as vocabulary jobs write them) 'div' puts every hot id on
    shard 0, which is why we show both.
    """

    mod: np.ndarray
    div: np.ndarray

    @classmethod
    def empty(cls, S: int) -> "ShardLoad":
        return cls(np.zeros(S, np.int64), np.zeros(S, np.int64))

    def add(self, ids: np.ndarray, vocabulary_size: int) -> None:
        """Add every lookup of `ids` (>= 0)."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        load = ShardLoad.of_id_counts(ids, np.ones(ids.size, np.int64), self.mod.size, vocabulary_size)
        self.mod += load.mod
        self.div += load.div

    @classmethod
    def of_id_counts(cls, ids: np.ndarray, counts: np.ndarray, S: int, vocabulary_size: int) -> "ShardLoad":
        """The load of lookups given as ids (>= 0) and how often each was looked up (an `IdCounts`' arrays, or
        every lookup once): 'mod' shard id % S, 'div' shard id // ceil(vocabulary_size / S)."""
        ids, counts = np.asarray(ids, np.int64), np.asarray(counts, np.int64)
        if ids.size and int(ids.min()) < 0:
            raise ValueError("shard load: ids must be >= 0")
        load = cls.empty(S)
        np.add.at(load.mod, ids % S, counts)
        shard = ids // -(-int(vocabulary_size) // S)
        inside = shard < S  # ids past the vocabulary are not any shard's
        np.add.at(load.div, shard[inside], counts[inside])
        return load

    def merge_from(self, o: "ShardLoad") -> None:
        self.mod = _sum_arrays(self.mod, o.mod)
        self.div = _sum_arrays(self.div, o.div)

    @staticmethod
    def _balance(load: np.ndarray) -> float:
        total = int(load.sum())
        return float(load.max()) / (total / load.size) if total else 1.0

    def summary(self) -> dict:
        return {"num_shards": int(self.mod.size), "mod_balance": self._balance(self.mod),
                "div_balance": self._balance(self.div)}

    def to_json(self) -> dict:
        return {"mod": self.mod.tolist(), "div": self.div.tolist()}

    @classmethod
    def from_json(cls, d: Mapping) -> "ShardLoad":
        return cls(np.asarray(d["mod"], np.int64), np.asarray(d["div"], np.int64))


@dataclasses.dataclass(eq=False)
class TableStats(JsonEq):
    """Everything profiled about one table (laid out alone: rotation 0, see counting.py)."""

    steps: int
    features: Dict[str, FeatureStats]
    id_counts: IdCounts
    shard_load: Dict[int, ShardLoad]  # by number of shards S (main topology and candidates)
    partitions: PartitionStats  # main topology
    candidates: Dict[int, PartitionStats]  # by chip count

    def merge_from(self, o: "TableStats") -> None:
        if set(o.features) != set(self.features):
            raise ValueError("cannot merge statistics of tables with different features")
        self.steps += o.steps
        for k, f in o.features.items():
            self.features[k].merge_from(f)
        self.id_counts.merge_from(o.id_counts)
        for s, load in o.shard_load.items():
            if s in self.shard_load:
                self.shard_load[s].merge_from(load)
            else:
                self.shard_load[s] = deep_copy(load)
        self.partitions.merge_from(o.partitions)
        _merge_candidates(self.candidates, o.candidates)

    def ids_per_example(self) -> Histogram:
        """Over (feature, example) pairs of the table's features."""
        return Histogram.merged(f.ids_per_example for f in self.features.values())

    def to_json(self) -> dict:
        return {"steps": self.steps, "features": {k: v.to_json() for k, v in sorted(self.features.items())},
                "id_counts": self.id_counts.to_json(),
                "shard_load": {str(s): v.to_json() for s, v in sorted(self.shard_load.items())},
                "partitions": self.partitions.to_json(),
                "candidates": {str(c): v.to_json() for c, v in sorted(self.candidates.items())}}

    @classmethod
    def from_json(cls, d: Mapping) -> "TableStats":
        return cls(int(d["steps"]), {k: FeatureStats.from_json(v) for k, v in d["features"].items()},
                   IdCounts.from_json(d["id_counts"]),
                   {int(s): ShardLoad.from_json(v) for s, v in d["shard_load"].items()},
                   PartitionStats.from_json(d["partitions"]),
                   {int(c): PartitionStats.from_json(v) for c, v in d["candidates"].items()})


def _merge_candidates(into: Dict, other: Mapping) -> None:
    for c, st in other.items():
        if c in into:
            into[c].merge_from(st)
        else:
            into[c] = deep_copy(st)


def merge_candidate_stacks(into: Dict[int, Dict[str, PartitionStats]],
                           other: Mapping[int, Mapping[str, PartitionStats]]) -> None:
    for c, stacks in other.items():
        _merge_candidates(into.setdefault(c, {}), stacks)
