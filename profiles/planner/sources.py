"""Where each stack's statistics come from (the first half of "enumerate").

In order of preference:
1. `profiled`: a stack file (or profile) with the same stack parameters and
   exactly the same global configuration;
2. `equivalent`: the same stack under a configuration that differs only in
   hosts or in the sharding-strategy label, which change no statistic (warns);
3. `candidate:<chips>`: the figures a profile of another chip count computed
   for this chip count from the same data and global batch (warns);
4. `bound-from-tables`: a stack never profiled as such (e.g. another model
   stacks these tables differently), but every member table was: per step
   and partition a stack's count is the sum of its members' counts, so the
   sum of the members' maxima bounds it (zero drops guaranteed, memory
   overestimated; warns).
Otherwise MissingProfileError, naming what to profile.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Dict, List, Optional, Tuple

from profiles.errors import (
    ConfigurationMismatchWarning,
    ConservativeBoundWarning,
    MissingProfileError,
    StaleProfileWarning,
)
from profiles.histogram import Histogram
from profiles.planner.types import StackFigures, TableFigures
from profiles.profile import Profile
from profiles.stats import PartitionStats, ShardLoad
from profiles.store import ProfileStore
from profiles.units import (
    GlobalConfig,
    StackUnit,
    TableUnit,
    rescaled,
    rescaled_global,
    rescaled_table,
    stack_units,
    table_unit,
    table_units,
)
from tpu_embed.core.canonical import canonical_json
from tpu_embed.core.model import ModelConfig
from tpu_embed.sparsecore.layout import layout_of


@dataclasses.dataclass(frozen=True)
class _Entry:
    spec_hash: str  # canonical JSON of the spec's hash params
    global_config: GlobalConfig
    stats: PartitionStats
    origin: str  # 'profiled' | 'candidate:<n>'
    spec: object = None
    shard_load: Optional[ShardLoad] = None


class StatisticsIndex:
    """Every table and stack statistic available, from profiles in memory or a profile directory."""

    def __init__(self):
        self.stacks: List[_Entry] = []
        self.tables: List[_Entry] = []
        self.models: List[Profile] = []

    @classmethod
    def from_profiles(cls, profiles: List[Profile]) -> "StatisticsIndex":
        idx = cls()
        for p in profiles:
            idx._add_profile(p)
        return idx

    @classmethod
    def from_store(cls, store: ProfileStore, *, load_all: bool = True) -> "StatisticsIndex":
        idx = cls()
        for entry in store.models():
            try:
                idx._add_profile(store.read(model=entry.key))
            except MissingProfileError as e:
                # Another model whose files were partly removed: its remaining files are still
                # indexed below; say why its candidate figures are unavailable.
                warnings.warn(StaleProfileWarning(f"skipping model {entry.key}: {e}"), stacklevel=3)
        if load_all:  # table and stack files not indexed by any model (or shared by several)
            for tp in store.all_tables():
                idx._add_table(tp.table, tp.global_config, tp.stats)
            for sp in store.all_stacks():
                idx.stacks.append(_Entry(_h(sp.stack), sp.global_config, sp.stats, "profiled", sp.stack))
        return idx

    def _add_profile(self, p: Profile) -> None:
        self.models.append(p)
        g = p.global_config
        for sp in p.stacks.values():
            self.stacks.append(_Entry(_h(sp.stack), g, sp.stats, "profiled", sp.stack))
        for tp in p.tables.values():
            self._add_table(tp.table, g, tp.stats)
        for c in p.accumulator.candidate_stacks:
            try:
                cstacks = p.candidate_stacks(c)
            except (KeyError, ValueError):
                continue
            for sp in cstacks.values():
                self.stacks.append(_Entry(_h(sp.stack), sp.global_config, sp.stats, f"candidate:{c}", sp.stack))

    def _add_table(self, table: TableUnit, g: GlobalConfig, stats) -> None:
        self.tables.append(_Entry(_h(table), g, stats.partitions, "profiled", table,
                                  stats.shard_load.get(g.num_sparse_cores)))
        for c, pst in stats.candidates.items():
            cg = rescaled_global(g, c)
            self.tables.append(_Entry(_h(rescaled_table(table, g, c)), cg, pst, f"candidate:{c}", None,
                                      stats.shard_load.get(cg.num_sparse_cores)))

    # ------------------------------------------------------------ lookups

    @staticmethod
    def _best(entries: List[_Entry], spec_hash: str, g: GlobalConfig) -> Optional[Tuple[_Entry, str]]:
        exact, equivalent = [], []
        for e in entries:
            if e.spec_hash != spec_hash:
                continue
            if e.global_config == g and e.origin == "profiled":
                exact.append(e)
            elif e.global_config.same_statistics_as(g):
                equivalent.append(e)
        pick = lambda es: max(es, key=lambda e: e.stats.steps)  # the most data wins
        if exact:
            return pick(exact), "profiled"
        profiled = [e for e in equivalent if e.origin == "profiled"]
        if profiled:
            return pick(profiled), "equivalent"
        if equivalent:
            e = pick(equivalent)
            return e, e.origin
        return None

    def find_stack(self, spec: StackUnit, g: GlobalConfig):
        return self._best(self.stacks, _h(spec), g)

    def find_table(self, spec: TableUnit, g: GlobalConfig):
        return self._best(self.tables, _h(spec), g)


def _h(spec) -> str:
    return canonical_json(spec.hash_params())


def resolve(target: ModelConfig, index: StatisticsIndex) -> Tuple[Dict[str, StackFigures], Dict[str, TableFigures]]:
    g = GlobalConfig.of(target)
    stacks: Dict[str, StackFigures] = {}
    missing: List[str] = []
    table_fig: Dict[str, TableFigures] = {}
    layout = layout_of(target)
    for t in target.tables:
        found = index.find_table(table_unit(target, t.name), g)
        stack_name = layout.tables[t.name].stack
        if found is None:
            table_fig[t.name] = TableFigures(t.name, stack_name, 0, None, None, "missing")
        else:
            e, origin = found
            table_fig[t.name] = TableFigures(t.name, stack_name, e.stats.steps, e.stats, e.shard_load, origin)
    for name, spec in stack_units(target).items():
        found = index.find_stack(spec, g)
        if found is not None:
            e, origin = found
            if origin != "profiled":
                why = (f"the {e.global_config.num_chips}-chip figures a profile of another chip count computed "
                       "for this topology from the same data" if origin.startswith("candidate") else
                       f"a profile under {e.global_config} (hosts differ; statistics do not)")
                warnings.warn(ConfigurationMismatchWarning(
                    f"stack {name!r}: no profile of this exact configuration ({g}); using {why}."), stacklevel=3)
            stacks[name] = StackFigures.from_stats(spec, g, e.stats, origin)
            continue
        members = [table_fig[t] for t in spec.table_names]
        parts = [m.partitions for m in members if m.partitions is not None]
        if len(parts) == len(members):
            warnings.warn(ConservativeBoundWarning(
                f"stack {name!r} (tables {list(spec.table_names)}) was never profiled as a stack under {g}; its "
                "limits are the sum of its tables' maxima: no drops, but more memory than an exact profile "
                "would need. Profile this exact model to tighten them."), stacklevel=3)
            stacks[name] = _bound(spec, g, parts)
            continue
        missing.append(f"{name} (tables without statistics: "
                       f"{[m.name for m in members if m.partitions is None]})")
    if missing:
        chips, batch = g.num_chips, g.global_batch
        how = (f"Profile {chips} chips: `tpu-embed run` (or `profile`) with `--candidate-chip-counts {chips}`, or "
               f"`profile_candidate_chip_counts: [{chips}]` in the spec, computes its figures in the same pass as "
               f"the spec's own topology, with the same tables, features and global batch ({batch}).")
        source = matching_profile(target, index.models)
        if source is not None and chips not in source.covered_chip_counts:
            raise MissingProfileError(f"The profile has no figures for {chips} chips: it covers "
                                      f"{', '.join(map(str, source.covered_chip_counts))} chip(s) for these "
                                      f"tables. {how}")
        raise MissingProfileError(f"No statistics for stack(s) {missing} under {g}. {how}")
    return stacks, table_fig


def matching_profile(target: ModelConfig, models: List[Profile]) -> Optional[Profile]:
    """The profile of the same tables, features and global batch as `target`, whatever its chip count."""
    def sig(m: ModelConfig):
        return [t.hash_params() for t in table_units(m)], [(f.name, f.output_shape) for f in m.features]
    for p in models:
        try:
            candidate = rescaled(p.model, target.topology.num_chips)
        except ValueError:
            continue
        if sig(candidate) == sig(target) and GlobalConfig.of(candidate).same_statistics_as(GlobalConfig.of(target)):
            return p
    return None


def _bound(spec: StackUnit, g: GlobalConfig, parts: List[PartitionStats]) -> StackFigures:
    steps = min(p.steps for p in parts)
    one = lambda v: Histogram({int(v): steps} if steps else {})
    return StackFigures(
        spec=spec, global_config=g, origin="bound-from-tables", exact=False, steps=steps,
        ids=sum(p.ids for p in parts),
        unique_ids=sum(p.unique_ids for p in parts),
        step_max_ids=one(sum(p.max_ids for p in parts)),
        step_max_unique_ids=one(sum(p.max_unique_ids for p in parts)),
        step_max_chip_buffer=one(sum(p.step_max_chip_buffer.max for p in parts)), chip_buffer=Histogram(),
        cell_ids=Histogram(), cell_unique_ids=Histogram(), destination_balance=None)
