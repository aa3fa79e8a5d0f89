"""What a profile file is *of*: units of `tpu_embed.core.model`, and the context they were counted in.

The model itself is `tpu_embed.core.model.ModelConfig`.  Statistics are kept per
table and per stacked table, so files are keyed by:

* `TableUnit`: a table and the features that look it up (what its counts depend on);
* `StackUnit`: a stacked table's member units and their rotations;
* `GlobalConfig`: the topology and per-chip batch they were counted under.

Keys are `tpu_embed.core.canonical.fingerprint`s of that plain data, so a file is
reused by every model that shares the unit and refused by every other.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Mapping, Tuple

from tpu_embed.core.canonical import fingerprint
from tpu_embed.core.model import FeatureConfig, ModelConfig, TableConfig
from tpu_embed.core.topology import Topology, is_power_of_two
from tpu_embed.sparsecore.layout import layout_of

KEY_HEX_CHARS = 20  # 80 bits keep names short; every file records its unit and is re-keyed on read


@dataclasses.dataclass(frozen=True)
class GlobalConfig:
    num_chips: int
    num_sc_per_chip: int
    num_hosts: int
    per_chip_batch: int  # examples per chip (the largest output_shape[0] over features)

    @classmethod
    def of(cls, model: ModelConfig) -> "GlobalConfig":
        t = model.topology
        return cls(t.num_chips, t.num_sc_per_chip, t.num_hosts, model.per_chip_batch)

    @property
    def num_sparse_cores(self) -> int:
        return self.num_chips * self.num_sc_per_chip

    @property
    def global_batch(self) -> int:
        return self.per_chip_batch * self.num_chips

    def topology(self) -> Topology:
        return Topology(self.num_chips, self.num_sc_per_chip, self.num_hosts)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping) -> "GlobalConfig":
        return cls(int(d["num_chips"]), int(d["num_sc_per_chip"]), int(d["num_hosts"]), int(d["per_chip_batch"]))

    def same_statistics_as(self, other: "GlobalConfig") -> bool:
        """Hosts do not change what SparseCore sees."""
        return (self.num_chips, self.num_sc_per_chip, self.per_chip_batch) == (
            other.num_chips, other.num_sc_per_chip, other.per_chip_batch)


@dataclasses.dataclass(frozen=True)
class TableUnit:
    table: TableConfig
    features: Tuple[FeatureConfig, ...]  # the features looking the table up, flattened order

    @property
    def name(self) -> str:
        return self.table.name

    @property
    def vocabulary_size(self) -> int:
        return self.table.vocabulary_size

    @property
    def dim(self) -> int:
        return self.table.dim

    def hash_params(self) -> dict:
        # Everything that changes the statistics; not the optimizer (it changes only the stacking).
        t = self.table
        return {"name": t.name, "vocabulary_size": t.vocabulary_size, "dim": t.dim, "combiner": t.combiner,
                "features": [{"name": f.name, "output_shape": list(f.output_shape)} for f in self.features]}

    def to_json(self) -> dict:
        return dict(self.hash_params(), optimizer_group=self.table.optimizer_group)

    @classmethod
    def from_json(cls, d: Mapping) -> "TableUnit":
        t = TableConfig(str(d["name"]), int(d["vocabulary_size"]), int(d["dim"]), str(d["combiner"]),
                        optimizer_group=str(d["optimizer_group"]))
        return cls(t, tuple(FeatureConfig(str(f["name"]), t, tuple(int(x) for x in f["output_shape"]))
                            for f in d["features"]))


@dataclasses.dataclass(frozen=True)
class StackUnit:
    name: str
    tables: Tuple[TableUnit, ...]  # stack order
    rotations: Tuple[int, ...]  # col_shift per member: destination SC of the member's id 0
    padded_dim: int
    sample_count: int  # per chip, over all features of the stack

    @property
    def table_names(self) -> Tuple[str, ...]:
        return tuple(t.name for t in self.tables)

    def hash_params(self) -> dict:
        return {"name": self.name, "tables": [t.hash_params() for t in self.tables],
                "rotations": list(self.rotations)}

    def to_json(self) -> dict:
        return {"name": self.name, "tables": [t.to_json() for t in self.tables], "rotations": list(self.rotations),
                "padded_dim": self.padded_dim, "sample_count": self.sample_count}

    @classmethod
    def from_json(cls, d: Mapping) -> "StackUnit":
        return cls(str(d["name"]), tuple(TableUnit.from_json(t) for t in d["tables"]),
                   tuple(int(r) for r in d["rotations"]), int(d["padded_dim"]), int(d["sample_count"]))


class CandidateUnavailable(ValueError):
    """A candidate chip count cannot run this model's batch; the message says why."""


def table_unit(model: ModelConfig, name: str) -> TableUnit:
    return TableUnit(model.table(name), model.table_features(name))


def table_units(model: ModelConfig) -> Tuple[TableUnit, ...]:
    return tuple(table_unit(model, t.name) for t in model.tables)


def stack_units(model: ModelConfig) -> Dict[str, StackUnit]:
    layout = layout_of(model)
    return {s.name: StackUnit(s.name, tuple(table_unit(model, t) for t in s.tables),
                              tuple(layout.tables[t].rotation for t in s.tables), s.padded_dim, s.sample_count)
            for s in layout.stacks.values()}


def table_key(table: TableUnit, global_config: GlobalConfig) -> str:
    return fingerprint({"kind": "table", "table": table.hash_params(), "global": global_config.to_json()},
                       KEY_HEX_CHARS)


def stack_key(stack: StackUnit, global_config: GlobalConfig) -> str:
    return fingerprint({"kind": "stack", "stack": stack.hash_params(), "global": global_config.to_json()},
                       KEY_HEX_CHARS)


def rescaled(model: ModelConfig, num_chips: int) -> ModelConfig:
    """The same model and *global* batch on `num_chips` chips (same SCs per chip).

    Raises CandidateUnavailable with the reason when that is impossible.
    """
    t = model.topology
    nsc = t.num_sc_per_chip
    if num_chips == t.num_chips:
        return model
    if not is_power_of_two(num_chips * nsc):
        raise CandidateUnavailable(f"{num_chips} chips x {nsc} SparseCores is not a power of two")
    feats = []
    for f in model.features:
        global_examples = f.examples * t.num_chips
        if global_examples % num_chips:
            raise CandidateUnavailable(
                f"feature {f.name!r}: global batch {global_examples} is not divisible by {num_chips} chips")
        shape = (global_examples // num_chips,) + f.output_shape[1:]
        feature = dataclasses.replace(f, output_shape=shape)
        if feature.samples % nsc:
            raise CandidateUnavailable(
                f"feature {f.name!r}: per-chip samples {feature.samples} (output_shape {list(shape)}) "
                f"not divisible by {nsc} SparseCores per chip")
        feats.append(feature)
    return ModelConfig(tuple(feats), rescaled_global(GlobalConfig.of(model), num_chips).topology())


def rescaled_global(g: GlobalConfig, num_chips: int) -> GlobalConfig:
    """The global configuration with the same global batch on `num_chips` chips.

    Hosts keep their chips per host where possible (hosts do not change any statistic)."""
    cph = g.num_chips // g.num_hosts
    hosts = num_chips // cph if num_chips % cph == 0 and num_chips >= cph else 1
    return GlobalConfig(num_chips, g.num_sc_per_chip, hosts, g.per_chip_batch * g.num_chips // num_chips)


def rescaled_table(t: TableUnit, g: GlobalConfig, num_chips: int) -> TableUnit:
    """A table unit with its features' per-chip shapes for `num_chips` chips (same global batch)."""
    return dataclasses.replace(t, features=tuple(
        dataclasses.replace(f, output_shape=(f.examples * g.num_chips // num_chips,) + f.output_shape[1:])
        for f in t.features))
