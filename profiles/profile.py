"""A profile: the statistics of one model configuration, and views of it per table and stack.

`Profile` = the model configuration it was collected for + the candidate
chip counts considered (with the reason for every skipped one) + a
`ProfileAccumulator` (the mergeable statistics).  `TableProfile` and
`StackProfile` are what one file of the profile directory holds: a spec, the
global configuration it was collected under, statistics, and the stable key
the file is named by.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Iterable, Mapping, Tuple

from profiles.errors import ProfileMismatchError
from profiles.stats import PartitionStats, TableStats, deep_copy, merge_candidate_stacks
from profiles.units import GlobalConfig, StackUnit, TableUnit, rescaled, stack_key, stack_units, table_key, table_units
from tpu_embed.core.canonical import canonical_json
from tpu_embed.core.model import ModelConfig


@dataclasses.dataclass(eq=False)
class ProfileAccumulator:
    """The Beam-mergeable state: plain data, picklable, merged exactly."""

    model_key: str
    steps: int
    tables: Dict[str, TableStats]
    stacks: Dict[str, PartitionStats]  # main topology, by stacked table name
    candidate_stacks: Dict[int, Dict[str, PartitionStats]]  # by chip count, then the candidate's stack name

    def merge_from(self, other: "ProfileAccumulator") -> None:
        if other.model_key != self.model_key:
            raise ProfileMismatchError(
                f"cannot merge statistics of model configuration {other.model_key} into {self.model_key}: "
                "they were collected for different tables, features or topology.")
        self.steps += other.steps
        for name, st in other.tables.items():
            self.tables[name].merge_from(st)
        for name, ps in other.stacks.items():
            self.stacks[name].merge_from(ps)
        merge_candidate_stacks(self.candidate_stacks, other.candidate_stacks)

    def to_json(self) -> dict:
        return {"model_key": self.model_key, "steps": self.steps,
                "tables": {k: v.to_json() for k, v in sorted(self.tables.items())},
                "stacks": {k: v.to_json() for k, v in sorted(self.stacks.items())},
                "candidate_stacks": {str(c): {k: v.to_json() for k, v in sorted(s.items())}
                                     for c, s in sorted(self.candidate_stacks.items())}}

    @classmethod
    def from_json(cls, d: Mapping) -> "ProfileAccumulator":
        return cls(str(d["model_key"]), int(d["steps"]),
                   {k: TableStats.from_json(v) for k, v in d["tables"].items()},
                   {k: PartitionStats.from_json(v) for k, v in d["stacks"].items()},
                   {int(c): {k: PartitionStats.from_json(v) for k, v in s.items()}
                    for c, s in d["candidate_stacks"].items()})

    def __eq__(self, other):
        if not isinstance(other, ProfileAccumulator):
            return NotImplemented
        return canonical_json(self.to_json()) == canonical_json(other.to_json())


@dataclasses.dataclass(frozen=True)
class CandidateStatus:
    num_chips: int
    status: str  # 'main' | 'profiled' | 'skipped'
    reason: str = ""

    def to_json(self) -> dict:
        return {"status": self.status, "reason": self.reason}


@dataclasses.dataclass(eq=False)
class TableProfile:
    table: TableUnit
    global_config: GlobalConfig
    stats: TableStats

    @property
    def key(self) -> str:
        return table_key(self.table, self.global_config)

    @property
    def steps(self) -> int:
        return self.stats.steps


@dataclasses.dataclass(eq=False)
class StackProfile:
    stack: StackUnit
    global_config: GlobalConfig
    stats: PartitionStats

    @property
    def key(self) -> str:
        return stack_key(self.stack, self.global_config)

    @property
    def steps(self) -> int:
        return self.stats.steps

    def summary(self) -> dict:
        return self.stats.summary()


@dataclasses.dataclass(eq=False)
class Profile:
    model: ModelConfig
    candidates: Dict[int, CandidateStatus]
    accumulator: ProfileAccumulator

    def __post_init__(self):
        if self.accumulator.model_key != self.model.key:
            raise ProfileMismatchError("profile statistics belong to another model configuration")

    @property
    def steps(self) -> int:
        return self.accumulator.steps

    @property
    def global_config(self) -> GlobalConfig:
        return GlobalConfig.of(self.model)

    @property
    def tables(self) -> Dict[str, TableProfile]:
        g = self.global_config
        return {t.name: TableProfile(t, g, self.accumulator.tables[t.name]) for t in table_units(self.model)}

    @property
    def stacks(self) -> Dict[str, StackProfile]:
        g = self.global_config
        return {name: StackProfile(spec, g, self.accumulator.stacks[name])
                for name, spec in stack_units(self.model).items()}

    @property
    def covered_chip_counts(self) -> Tuple[int, ...]:
        """The chip counts this profile has figures for: its own, and the candidates it profiled."""
        return tuple(sorted(c for c, st in self.candidates.items() if st.status in ("main", "profiled")))

    def candidate_stacks(self, num_chips: int) -> Dict[str, StackProfile]:
        """The stacks of this model rescaled to `num_chips` (same global batch), with their statistics."""
        if num_chips == self.model.topology.num_chips:
            return self.stacks
        stats = self.accumulator.candidate_stacks.get(num_chips)
        if stats is None:
            status = self.candidates.get(num_chips)
            why = f": {status.reason}" if status and status.reason else ""
            raise KeyError(f"{num_chips} chips was not profiled as a candidate{why}")
        model = rescaled(self.model, num_chips)
        g = GlobalConfig.of(model)
        return {name: StackProfile(spec, g, stats[name]) for name, spec in stack_units(model).items()}

    def merge(self, other: "Profile") -> "Profile":
        """A new profile with the statistics of both (associative, commutative)."""
        return merge_profiles([self, other])

    def __eq__(self, other):
        if not isinstance(other, Profile):
            return NotImplemented
        return (self.model == other.model and self.candidates == other.candidates
                and self.accumulator == other.accumulator)


def merge_profiles(profiles: Iterable[Profile]) -> Profile:
    profiles = list(profiles)
    if not profiles:
        raise ValueError("merge_profiles: nothing to merge")
    first = profiles[0]
    for p in profiles[1:]:
        if p.model.key != first.model.key:
            raise ProfileMismatchError(
                f"cannot merge profiles of different configurations (model {p.model.key} vs {first.model.key}); "
                "merge only runs/hosts of the same tables, features and topology.")
    acc = deep_copy(first.accumulator)  # inputs stay untouched
    for p in profiles[1:]:
        acc.merge_from(p.accumulator)
    candidates = dict(first.candidates)
    for p in profiles[1:]:
        for c, st in p.candidates.items():
            # A candidate profiled in any run stays 'profiled'; statuses are otherwise config-derived.
            if c not in candidates or st.status == "profiled":
                candidates[c] = st
    return Profile(first.model, dict(sorted(candidates.items())), acc)


def merge(*profiles: Profile) -> Profile:
    """Merge the statistics of profiles of one configuration (runs, hosts): associative, commutative."""
    return merge_profiles(profiles)
