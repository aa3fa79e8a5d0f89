"""Plain data passed between the planner's stages (sources -> enumerate -> estimate -> propose -> partition)."""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

from profiles.histogram import Histogram
from profiles.stats import PartitionStats, ShardLoad
from profiles.step_series import StepSeries
from profiles.units import GlobalConfig, StackUnit


@dataclasses.dataclass(frozen=True)
class Policy:
    """How limits are derived from the observed figures.

    `quantile` sizes the chip id buffer (max_ids_per_chip_per_sample): below
    'max', ids beyond it are dropped (allow_id_dropping) on the steps over it
    - a drop budget.  `partition_quantile` sizes max_ids_per_table and
    max_unique_ids_per_table; it defaults to 'max' because TF *raises* on a
    step over those limits (see errors.LimitOverflowWarning).  `headroom`
    multiplies every observed figure.
    """

    quantile: str = "max"
    headroom: float = 1.0
    partition_quantile: str = "max"
    min_steps: int = 100  # fewer profiled steps => InsufficientDataWarning


@dataclasses.dataclass(frozen=True)
class StackFigures:
    """What the planner needs of one stack, whatever the statistics' origin.

    `exact` is False for a bound derived from member tables: only its maximum
    means anything (quantiles of a bound are not quantiles of the data).
    """

    spec: StackUnit
    global_config: GlobalConfig
    origin: str  # 'profiled' | 'equivalent' | 'candidate:<chips>' | 'bound-from-tables'
    exact: bool
    steps: int
    ids: int
    unique_ids: int
    step_max_ids: Histogram
    step_max_unique_ids: Histogram
    step_max_chip_buffer: Histogram
    chip_buffer: Histogram
    cell_ids: Histogram
    cell_unique_ids: Histogram
    destination_balance: Optional[float]
    series: Optional[StepSeries] = None
    sc_dest_ids: Optional[object] = None  # [nsc, S] heat map, main topology only

    @classmethod
    def from_stats(cls, spec: StackUnit, g: GlobalConfig, stats: PartitionStats, origin: str) -> "StackFigures":
        return cls(spec, g, origin, True, stats.steps, stats.ids, stats.unique_ids, stats.step_max_ids,
                   stats.step_max_unique_ids, stats.step_max_chip_buffer, stats.chip_buffer, stats.cell_ids,
                   stats.cell_unique_ids, stats.destination_balance(), stats.series, stats.sc_dest_ids)


@dataclasses.dataclass(frozen=True)
class TableFigures:
    name: str
    stack: str
    steps: int
    partitions: Optional[PartitionStats]  # the table alone at the target configuration, if profiled
    shard_load: Optional[ShardLoad]  # raw lookups per shard at the target S, 'mod' and 'div'
    origin: str


@dataclasses.dataclass(frozen=True)
class LimitOption:
    """One candidate setting of a stack's limits (enumerate stage)."""

    label: str
    max_ids_per_table: int
    max_unique_ids_per_table: int
    chip_buffer_slots: int  # id slots the chip's buffer must hold (sum of roundup8 over its SCs' segments)


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Consequences of one option on the profiled data (estimate stage).

    Partition limits: steps over them *fail* in TF (error, not drop).
    Buffer: ids over it are dropped with allow_id_dropping; counted per chip.
    """

    option: LimitOption
    max_ids_per_chip_per_sample: int  # the buffer setting this estimate assumes
    ids_over_limit: int  # ids beyond max_ids_per_table, summed over partitions and steps
    unique_ids_over_limit: int
    steps_over_max_ids: float  # fraction of steps some partition exceeds max_ids_per_table: TF raises
    steps_over_max_unique_ids: float
    buffer_capacity_slots: int
    steps_over_buffer: float  # fraction of steps some chip's buffer overflows: ids dropped
    chip_steps_over_buffer: float  # fraction of (chip, step) pairs that overflow
    ids_dropped_at_most: int  # slots short, over every chip and step: >= ids actually dropped
    drop_rate_at_most: float
    partition_bytes_per_sc: int  # memory model, see SCHEMA.md
    buffer_bytes_per_sc: int
    exact: bool  # False when figures are bounds

    @property
    def failure_free(self) -> bool:
        return not self.ids_over_limit and not self.unique_ids_over_limit


@dataclasses.dataclass(frozen=True)
class Proposal:
    """The chosen option per stack and the one chip-wide id buffer setting (propose stage)."""

    chosen: Dict[str, Estimate]
    options: Dict[str, List[Estimate]]
    max_ids_per_chip_per_sample: int
    required_per_stack: Dict[str, int]  # the smallest max_ids_per_chip_per_sample each stack alone needs
    buffer_multiple: int  # max_ids_per_chip_per_sample is a multiple of this (ids buffer % 8 == 0)
    allow_id_dropping: bool
