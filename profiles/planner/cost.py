"""The cost model `tpu-embed plan --propose` ranks placements by (docs/explanation/partitioning.md).

No TPU is measured here: the model counts what a step asks of the SparseCores, from the recorded steps
(`profiles.planner.whatif.evaluate`).  Per step and per stack (one SparseCore kernel each, the stacks' kernels one
after another, each ending in an exchange between all SparseCores):

* the busiest destination SparseCore's ids (`busiest_ids`) and unique ids (`busiest_rows`: the rows it gathers);
* its traffic: ids x `ID_ENTRY_BYTES` (token id, sample id, gain it reads) + rows x padded width x
  `ROW_ELEMENT_BYTES` (rows it gathers) - the busiest destination by that sum;
* a step's SparseCore figure is the sum over stacks (each kernel waits for its busiest SparseCore);

plus the buffer memory per SparseCore of the limits that hold every step (`estimate`'s memory model: partition
staging, and TensorFlow's CSR buffer or jax's COO buffer), and for tables moved to the TensorCore what they add
there per chip and step: their looked-up rows and their dense gradient (the whole table, all-reduced).

Ranking: the least traffic per step, then the fewest kernels, then the least buffer memory (`PlacementCost.rank`).

Limits (so the memory, and the configuration written): exact where the recorded steps are every step of the
profile; else the profile's exact maxima where it counted that stack (its own stacking, or one table alone: a
table's largest cell does not depend on its rotation), else the sum of the member tables' maxima, which no step
can exceed (`limits_from` says which).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple

from profiles.planner.estimate import ID_ENTRY_BYTES, ROW_ELEMENT_BYTES, csr_buffer_bytes, staging_bytes
from profiles.planner.placements import Candidate, tensor_core_table_bytes, tensor_core_widths
from profiles.planner.propose import buffer_multiple, per_sample
from profiles.planner.whatif import ReplaySteps, StackLoad, StackShape, evaluate, over_mean
from profiles.profile import Profile
from profiles.stats import PartitionStats
from tpu_embed.sparsecore import layout_of

__all__ = ["ID_ENTRY_BYTES", "ROW_ELEMENT_BYTES", "StackCost", "TensorCoreCost", "PlacementCost", "placement_cost"]


@dataclasses.dataclass(frozen=True)
class StackLimits:
    max_ids: int
    max_unique_ids: int
    chip_buffer_slots: int  # TensorFlow: the fullest chip's id buffer
    sc_buffer_slots: int  # jax: the fullest SparseCore's COO segment
    limits_from: str  # 'exact' | 'profiled' | 'bound-from-tables'


@dataclasses.dataclass(frozen=True)
class StackCost:
    """One stack of a placement: per-step means over the recorded steps and the limits that hold every step."""

    name: str
    tables: Tuple[str, ...]
    rotations: Tuple[int, ...]
    padded_dim: int
    sample_count: int
    busiest_ids: float
    busiest_rows: float
    busiest_traffic: float  # bytes
    mean_ids: float
    floor_ids: float
    limits: StackLimits

    @property
    def balance(self) -> float:
        return over_mean(self.busiest_ids, self.mean_ids)

    @property
    def floor(self) -> float:
        return over_mean(self.floor_ids, self.mean_ids)


@dataclasses.dataclass(frozen=True)
class TensorCoreCost:
    """A table moved to the TensorCore: per chip and step."""

    table: str
    widths: Dict[str, int]  # feature -> tensor_core_width
    table_bytes: int  # a copy on every chip; its dense gradient all-reduced every step
    lookup_bytes: int  # the rows its features look up on one chip (samples x width x values x 4 B)

    @property
    def bytes_per_step(self) -> int:
        return self.table_bytes + self.lookup_bytes


@dataclasses.dataclass(frozen=True)
class PlacementCost:
    candidate: Candidate
    stacks: Tuple[StackCost, ...]
    tensor_core: Tuple[TensorCoreCost, ...]
    steps: int  # recorded steps evaluated
    max_ids_per_chip_per_sample: int  # TensorFlow's one chip-wide buffer setting for these limits
    memory_bytes_per_sc: int

    @property
    def label(self) -> str:
        return self.candidate.label

    @property
    def kernels(self) -> int:
        return len(self.stacks)

    @property
    def busiest_ids(self) -> float:
        return sum(s.busiest_ids for s in self.stacks)

    @property
    def busiest_rows(self) -> float:
        return sum(s.busiest_rows for s in self.stacks)

    @property
    def gathered_bytes(self) -> float:
        return sum(s.busiest_rows * s.padded_dim * ROW_ELEMENT_BYTES for s in self.stacks)

    @property
    def traffic_bytes(self) -> float:
        return sum(s.busiest_traffic for s in self.stacks)

    @property
    def balance(self) -> float:
        return over_mean(self.busiest_ids, sum(s.mean_ids for s in self.stacks))

    @property
    def floor(self) -> float:
        return over_mean(sum(s.floor_ids for s in self.stacks), sum(s.mean_ids for s in self.stacks))

    @property
    def tensor_core_bytes(self) -> int:
        return sum(t.bytes_per_step for t in self.tensor_core)

    def rank(self) -> Tuple[float, int, int]:
        return (round(self.traffic_bytes, 6), self.kernels, self.memory_bytes_per_sc)


# ---------------------------------------------------------------- limits

def _from_stats(stats: PartitionStats) -> Tuple[int, int, int, int]:
    return (stats.step_max_ids.max, stats.step_max_unique_ids.max, stats.step_max_chip_buffer.max,
            stats.step_max_sc_buffer.max)


def stack_limits(shape: StackShape, load: StackLoad, profile: Profile, steps_are_profile: bool) -> StackLimits:
    """The limits of one stack at the profiled topology and batch (see the module docstring)."""
    if steps_are_profile:
        assert load.sc_max_buffer is not None
        return StackLimits(load.max_ids, load.max_unique_ids, load.max_chip_buffer, int(load.sc_max_buffer.max()),
                           "exact")
    acc = profile.accumulator
    if len(shape.tables) == 1:
        return StackLimits(*_from_stats(acc.tables[shape.tables[0]].partitions), "profiled")
    layout = layout_of(profile.model)
    for name, st in layout.stacks.items():
        if tuple(st.tables) == shape.tables and \
                tuple(layout.tables[t].rotation for t in st.tables) == shape.rotations:
            return StackLimits(*_from_stats(acc.stacks[name]), "profiled")
    parts = [_from_stats(acc.tables[t].partitions) for t in shape.tables]
    ids, unique, chip, sc = (sum(p[i] for p in parts) for i in range(4))
    return StackLimits(ids, unique, chip, sc, "bound-from-tables")


def steps_are_profile(replay: ReplaySteps, profile: Profile) -> bool:
    """The recorded steps are every step the profile counted (not a sample, not one day of a merged window)."""
    return replay.source.exact and replay.source.steps_seen == profile.steps


# ---------------------------------------------------------------- one placement

def placement_cost(candidate: Candidate, replay: ReplaySteps, profile: Profile,
                   loads: Optional[Dict[str, StackLoad]] = None) -> PlacementCost:
    """`candidate` under the cost model, over the recorded steps of `replay` (of `profile`)."""
    placement = candidate.placement
    exact = steps_are_profile(replay, profile)
    if loads is None:
        loads = evaluate(placement, replay, per_partition=exact)
    topo = placement.model.topology
    stacks = []
    for shape in placement.stacks:
        load = loads[shape.name]
        n = max(load.steps, 1)
        stacks.append(StackCost(shape.name, shape.tables, shape.rotations, shape.padded_dim, shape.sample_count,
                                load.busiest_ids / n, load.busiest_rows / n, load.busiest_traffic / n,
                                load.mean_ids / n, load.floor_ids / n, stack_limits(shape, load, profile, exact)))
    value = max((per_sample(max(s.limits.chip_buffer_slots, 1), s.sample_count, 1) for s in stacks), default=1)
    mult = buffer_multiple(s.sample_count for s in stacks)
    value = -(-value // mult) * mult
    memory = 0
    for s in stacks:
        memory += staging_bytes(s.limits.max_ids, s.limits.max_unique_ids, s.padded_dim)
        memory += (csr_buffer_bytes(value, s.sample_count, topo.num_sc_per_chip) if candidate.api == "tensorflow"
                   else s.limits.sc_buffer_slots * ID_ENTRY_BYTES)
    model = profile.model
    tc = []
    for table in placement.tensor_core:
        widths = tensor_core_widths(profile, table)
        t = model.table(table)
        lookups = sum(model.feature(f).samples * w for f, w in widths.items())
        tc.append(TensorCoreCost(table, widths, tensor_core_table_bytes(t), lookups * t.dim * ROW_ELEMENT_BYTES))
    steps = min((load.steps for load in loads.values()), default=0)
    return PlacementCost(candidate, tuple(stacks), tuple(tc), steps, value, memory)
