"""What a profile is *of*: tables, features, stacks and the global configuration.

Plain frozen dataclasses, recorded inside every profile file, so that planning
and reporting need nothing but the profile directory (no spec, no TensorFlow).
`ModelConfig.feature_config()` rebuilds a feature configuration the core's
`stack_tables` accepts, which reproduces the original stacking exactly: tables
keep their names, sizes and combiners, features their paths, order and output
shapes, and tables keep their *optimizer group* (TF stacks only tables whose
optimizers hash equal) as a label.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
from typing import Any, Dict, Mapping, Tuple

from tpu_embed.sparsecore import SparseCoreLayout, stack_tables
from tpu_embed.sparsecore.layout import flatten_with_paths
from tpu_embed.topology import Topology, is_power_of_two

from profiles.hashing import stable_key

SHARDING_STRATEGIES = ("mod", "div")


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    path: str  # joined string path in the flattened feature structure (as tf.nest makes it)
    table: str
    output_shape: Tuple[int, ...]  # per chip, e.g. (per_chip_batch,) or (per_chip_batch, seq_len)

    @property
    def samples(self) -> int:
        return math.prod(self.output_shape)

    @property
    def examples(self) -> int:
        return self.output_shape[0]

    @property
    def samples_per_example(self) -> int:
        return math.prod(self.output_shape[1:])

    def hash_params(self) -> dict:
        return {"path": self.path, "output_shape": list(self.output_shape)}

    def to_json(self) -> dict:
        return {"path": self.path, "table": self.table, "output_shape": list(self.output_shape)}

    @classmethod
    def from_json(cls, d: Mapping) -> "FeatureSpec":
        return cls(str(d["path"]), str(d["table"]), tuple(int(x) for x in d["output_shape"]))


@dataclasses.dataclass(frozen=True)
class TableSpec:
    name: str
    vocabulary_size: int
    dim: int
    combiner: str
    features: Tuple[FeatureSpec, ...]  # the features that look this table up, flattened order
    # Stacking groups tables by hash(optimizer) (plus quantization); the label
    # keeps that grouping without keeping the optimizer object.  Not hashed:
    # statistics do not depend on the optimizer.
    optimizer_group: str = "g0"
    optimizer: str = ""  # human-readable description only

    def hash_params(self) -> dict:
        # TF: "named by hashing table parameters (name, number of features)"; we
        # hash everything that changes the statistics.
        return {"name": self.name, "vocabulary_size": self.vocabulary_size, "dim": self.dim,
                "combiner": self.combiner, "features": [f.hash_params() for f in self.features]}

    def to_json(self) -> dict:
        return {"name": self.name, "vocabulary_size": self.vocabulary_size, "dim": self.dim,
                "combiner": self.combiner, "features": [f.to_json() for f in self.features],
                "optimizer_group": self.optimizer_group, "optimizer": self.optimizer}

    @classmethod
    def from_json(cls, d: Mapping) -> "TableSpec":
        return cls(str(d["name"]), int(d["vocabulary_size"]), int(d["dim"]), str(d["combiner"]),
                   tuple(FeatureSpec.from_json(f) for f in d["features"]),
                   str(d.get("optimizer_group", "g0")), str(d.get("optimizer", "")))


@dataclasses.dataclass(frozen=True)
class GlobalConfig:
    sharding_strategy: str  # 'mod' | 'div' (SparseCore itself always mod-shards)
    num_chips: int
    num_sc_per_chip: int
    num_hosts: int
    per_chip_batch: int  # examples per chip (the largest output_shape[0] over features)

    def __post_init__(self):
        if self.sharding_strategy not in SHARDING_STRATEGIES:
            raise ValueError(f"sharding_strategy must be one of {SHARDING_STRATEGIES}, got "
                             f"{self.sharding_strategy!r}.")

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
        return cls(str(d["sharding_strategy"]), int(d["num_chips"]), int(d["num_sc_per_chip"]),
                   int(d["num_hosts"]), int(d["per_chip_batch"]))

    def same_statistics_as(self, other: "GlobalConfig") -> bool:
        """Hosts and the sharding-strategy label do not change what SparseCore sees."""
        return (self.num_chips, self.num_sc_per_chip, self.per_chip_batch) == (
            other.num_chips, other.num_sc_per_chip, other.per_chip_batch)


@dataclasses.dataclass(frozen=True)
class StackSpec:
    name: str
    tables: Tuple[TableSpec, ...]  # stack order
    rotations: Tuple[int, ...]  # col_shift per member: destination SC of the member's id 0
    padded_dim: int
    sample_count: int  # per chip, over all features of the stack

    def hash_params(self) -> dict:
        return {"name": self.name, "tables": [t.hash_params() for t in self.tables],
                "rotations": list(self.rotations)}

    @property
    def table_names(self) -> Tuple[str, ...]:
        return tuple(t.name for t in self.tables)

    def to_json(self) -> dict:
        return {"name": self.name, "tables": [t.to_json() for t in self.tables],
                "rotations": list(self.rotations), "padded_dim": self.padded_dim,
                "sample_count": self.sample_count}

    @classmethod
    def from_json(cls, d: Mapping) -> "StackSpec":
        return cls(str(d["name"]), tuple(TableSpec.from_json(t) for t in d["tables"]),
                   tuple(int(r) for r in d["rotations"]), int(d["padded_dim"]), int(d["sample_count"]))


class CandidateUnavailable(ValueError):
    """A candidate chip count cannot run this model's batch; the message says why."""


def table_key(table: TableSpec, global_config: GlobalConfig) -> str:
    return stable_key({"kind": "table", "table": table.hash_params(), "global": global_config.to_json()})


def stack_key(stack: StackSpec, global_config: GlobalConfig) -> str:
    return stable_key({"kind": "stack", "stack": stack.hash_params(), "global": global_config.to_json()})


class _OrderedPath(str):
    """A dict key that sorts by recorded position, not by text.

    `flatten_with_paths` visits dict keys sorted; list indices recorded as
    path text ('f/10' < 'f/2') would otherwise come back in another order and
    change sample offsets.  Equality and hashing stay those of the text.
    """

    def __new__(cls, text: str, position: int):
        obj = super().__new__(cls, text)
        obj.position = position
        return obj

    def __lt__(self, other):
        return self.position < getattr(other, "position", -1)

    def __gt__(self, other):
        return self.position > getattr(other, "position", -1)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    features: Tuple[FeatureSpec, ...]  # flattened order
    tables: Tuple[TableSpec, ...]  # sorted by name
    global_config: GlobalConfig

    # ---------------------------------------------------------------- construction

    @classmethod
    def from_feature_config(cls, feature_config: Any, topology: Topology,
                            sharding_strategy: str = "mod") -> "ModelConfig":
        from tpu_embed.sparsecore.layout import optimizer_group, quantization_repr  # the core's grouping
        flat = flatten_with_paths(feature_config)
        if not flat:
            raise ValueError("feature_config has no features.")
        layout = stack_tables(feature_config, topology)  # validates everything, as training will
        table_objs: Dict[str, Any] = {}
        for _, f in flat:
            table_objs.setdefault(f.table.name, f.table)
        groups: Dict[tuple, str] = {}
        labels: Dict[str, str] = {}
        for name in sorted(table_objs):
            t = table_objs[name]
            gkey = (optimizer_group(t), quantization_repr(t))
            labels[name] = groups.setdefault(gkey, f"g{len(groups)}")
        features = tuple(FeatureSpec(p.path, p.table, tuple(p.output_shape)) for p in layout.features)
        tables = tuple(
            TableSpec(name=name, vocabulary_size=int(table_objs[name].vocabulary_size),
                      dim=int(table_objs[name].dim), combiner=layout.tables[name].combiner,
                      features=tuple(f for f in features if f.table == name),
                      optimizer_group=labels[name],
                      optimizer=_describe_optimizer(getattr(table_objs[name], "optimizer", None)))
            for name in sorted(table_objs))
        g = GlobalConfig(sharding_strategy, topology.num_chips, topology.num_sc_per_chip, topology.num_hosts,
                         max(f.examples for f in features))
        model = cls(features, tables, g)
        # The rebuilt configuration must stack exactly like the original one.
        rebuilt = model.layout()
        stacking = lambda lay: [(s.name, s.tables) for s in lay.stacks.values()]
        if stacking(rebuilt) != stacking(layout):
            raise AssertionError("internal: rebuilt feature config stacks differently from the original")
        return model

    def feature_config(self):
        """A nest of SimpleNamespace FeatureConfigs that `stack_tables` lays out like the original."""
        tables = {t.name: types.SimpleNamespace(name=t.name, vocabulary_size=t.vocabulary_size, dim=t.dim,
                                                combiner=t.combiner, optimizer=t.optimizer_group)
                  for t in self.tables}
        if len(self.features) == 1 and self.features[0].path == "":
            f = self.features[0]
            return types.SimpleNamespace(table=tables[f.table], output_shape=list(f.output_shape), name=f.path)
        return {_OrderedPath(f.path, i): types.SimpleNamespace(table=tables[f.table], output_shape=list(f.output_shape),
                                                               name=f.path)
                for i, f in enumerate(self.features)}

    # ---------------------------------------------------------------- derived

    def topology(self) -> Topology:
        return self.global_config.topology()

    def table(self, name: str) -> TableSpec:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(f"No table {name!r}; tables are {[t.name for t in self.tables]}")

    def layout(self, disable_table_stacking: bool = False) -> SparseCoreLayout:
        return _layout(self, disable_table_stacking)

    def stack_specs(self) -> Dict[str, StackSpec]:
        layout = self.layout()
        by_name = {t.name: t for t in self.tables}
        return {s.name: StackSpec(s.name, tuple(by_name[t] for t in s.tables),
                                  tuple(layout.tables[t].rotation for t in s.tables), s.padded_dim, s.sample_count)
                for s in layout.stacks.values()}

    @property
    def key(self) -> str:
        return stable_key({"kind": "model", "model": self.to_json()})

    def table_key(self, name: str) -> str:
        return table_key(self.table(name), self.global_config)

    def stack_key(self, name: str) -> str:
        return stack_key(self.stack_specs()[name], self.global_config)

    def rescaled(self, num_chips: int) -> "ModelConfig":
        """The same model and *global* batch on `num_chips` chips (same SCs per chip).

        Raises CandidateUnavailable with the reason when that is impossible.
        """
        g = self.global_config
        nsc = g.num_sc_per_chip
        if num_chips == g.num_chips:
            return self
        if not is_power_of_two(num_chips * nsc):
            raise CandidateUnavailable(f"{num_chips} chips x {nsc} SparseCores is not a power of two")
        feats = []
        for f in self.features:
            global_examples = f.examples * g.num_chips
            if global_examples % num_chips:
                raise CandidateUnavailable(
                    f"feature {f.path!r}: global batch {global_examples} is not divisible by {num_chips} chips")
            shape = (global_examples // num_chips,) + tuple(f.output_shape[1:])
            if math.prod(shape) % nsc:
                raise CandidateUnavailable(
                    f"feature {f.path!r}: per-chip samples {math.prod(shape)} (output_shape {list(shape)}) "
                    f"not divisible by {nsc} SparseCores per chip")
            feats.append(FeatureSpec(f.path, f.table, shape))
        feats = tuple(feats)
        tables = tuple(dataclasses.replace(t, features=tuple(f for f in feats if f.table == t.name))
                       for t in self.tables)
        return ModelConfig(feats, tables, rescaled_global(g, num_chips))

    # ---------------------------------------------------------------- JSON

    def to_json(self) -> dict:
        return {"features": [f.to_json() for f in self.features],
                "tables": [{k: v for k, v in t.to_json().items() if k != "features"} for t in self.tables],
                "global": self.global_config.to_json()}

    @classmethod
    def from_json(cls, d: Mapping) -> "ModelConfig":
        features = tuple(FeatureSpec.from_json(f) for f in d["features"])
        tables = tuple(
            TableSpec(name=str(t["name"]), vocabulary_size=int(t["vocabulary_size"]), dim=int(t["dim"]),
                      combiner=str(t["combiner"]), features=tuple(f for f in features if f.table == t["name"]),
                      optimizer_group=str(t.get("optimizer_group", "g0")), optimizer=str(t.get("optimizer", "")))
            for t in d["tables"])
        return cls(features, tables, GlobalConfig.from_json(d["global"]))


def rescaled_global(g: GlobalConfig, num_chips: int) -> GlobalConfig:
    """The global configuration with the same global batch on `num_chips` chips.

    Hosts keep their chips per host where possible (hosts do not change any statistic)."""
    cph = g.num_chips // g.num_hosts
    hosts = num_chips // cph if num_chips % cph == 0 and num_chips >= cph else 1
    return GlobalConfig(g.sharding_strategy, num_chips, g.num_sc_per_chip, hosts,
                        g.per_chip_batch * g.num_chips // num_chips)


def rescaled_table(t: TableSpec, g: GlobalConfig, num_chips: int) -> TableSpec:
    """A table's spec with its features' per-chip shapes for `num_chips` chips (same global batch)."""
    feats = tuple(FeatureSpec(f.path, f.table, (f.examples * g.num_chips // num_chips,) + tuple(f.output_shape[1:]))
                  for f in t.features)
    return dataclasses.replace(t, features=feats)


@functools.lru_cache(maxsize=256)
def _layout(model: ModelConfig, disable_table_stacking: bool) -> SparseCoreLayout:
    return stack_tables(model.feature_config(), model.topology(), disable_table_stacking=disable_table_stacking)


def _describe_optimizer(opt) -> str:
    if opt is None:
        return ""
    if isinstance(opt, str):
        return opt
    lr = getattr(opt, "learning_rate", None)
    name = type(opt).__name__
    return f"{name}(learning_rate={lr})" if isinstance(lr, (int, float)) else name
