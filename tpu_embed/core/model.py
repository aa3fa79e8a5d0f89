"""The embedding model: frozen, typed table and feature configurations.

One description of the SparseCore embedding model, as jax-tpu-embedding's
`embedding_spec` is: the YAML spec produces it (`Spec.model(vocab_sizes)`),
and stacking (`sparsecore.stack_tables`), preprocessing, statistics,
planning and training consume it.  TensorFlow's
`tf.tpu.experimental.embedding` configurations meet it at the boundary
(`from_tf_feature_config`, `to_tf_feature_config`).

    table = TableConfig("video", vocabulary_size=1000, dim=16, combiner="mean",
                        optimizer=OptimizerConfig.from_dict({"optimizer": "adagrad", "learning_rate": 0.1}))
    model = ModelConfig((FeatureConfig("watched", table, (256,)),), Topology(num_chips=4))
    tpu_embed.sparsecore.layout_of(model)   # the SparseCore stacking, cached

`ModelConfig.features` is the flattened feature order (`tf.nest` order: dict
keys sorted), which fixes sample offsets; feature names are the flattened
paths.  Tables stack by `optimizer_group`, a string of canonical JSON where TF
uses `hash(optimizer)`: equal optimizers give equal strings in every process.

This module needs only the standard library; TensorFlow is imported by the
TF adapters.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from tpu_embed.core import optimizers
from tpu_embed.core.canonical import canonical_json, fingerprint
from tpu_embed.core.nest import flatten_with_paths
from tpu_embed.core.topology import Topology

COMBINERS = ("mean", "sum", "sqrtn")
OPTIMIZER_KINDS = ("sgd", "adagrad", "adam", "ftrl")  # `tpu_embed.core.optimizers` kinds
MODEL_JSON_VERSION = 1


# ---------------------------------------------------------------- optimizers

@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """A table's optimizer: a seed-API kind and its constructor arguments.

    `params` are the keyword arguments of `tpu_embed.core.optimizers`' class for
    `kind` (which validates them), every one of them with defaults filled in,
    sorted by name.  `learning_rate_fn` is a
    zero-argument callable learning rate (TF 2.x's per-table learning-rate
    functions); it replaces `params["learning_rate"]` and compares by identity,
    as TF's optimizers hash it.
    """

    kind: str
    params: Tuple[Tuple[str, Any], ...] = ()
    learning_rate_fn: Optional[Callable[[], Any]] = None

    def __post_init__(self) -> None:
        if self.kind not in OPTIMIZER_KINDS:
            raise ValueError(f"optimizer {self.kind!r} is not one of {list(OPTIMIZER_KINDS)}.")
        # The seed class checks every value (with TF's messages) and fills in the defaults, so
        # equal optimizers have equal params whichever arguments were spelled out.
        full = optimizers.optimizer_from_dict({"optimizer": self.kind, **dict(self.params)}).to_dict()
        full.pop("optimizer")
        object.__setattr__(self, "params", tuple(sorted(full.items())))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], learning_rate_fn: Optional[Callable[[], Any]] = None
                  ) -> "OptimizerConfig":
        """From `{"optimizer": kind, **kwargs}` (the seed API's `to_dict()`)."""
        d = dict(d)
        kind = d.pop("optimizer")
        return cls(kind, tuple(d.items()), learning_rate_fn)

    def to_dict(self) -> Dict[str, Any]:
        return {"optimizer": self.kind, **dict(self.params)}

    @property
    def group(self) -> str:
        """The stacking group: canonical JSON of every parameter (TF: `hash(optimizer)`)."""
        d = self.to_dict()
        if self.learning_rate_fn is not None:
            d["learning_rate"] = _callable_tag(self.learning_rate_fn)
        return canonical_json(d)

    def with_learning_rate(self, learning_rate: float) -> "OptimizerConfig":
        return OptimizerConfig(self.kind, tuple({**dict(self.params), "learning_rate": learning_rate}.items()))

    def parameters(self):
        """The seed-API parameter object (`tpu_embed.core.optimizers`)."""
        return optimizers.optimizer_from_dict(self.to_dict())

    def to_tf(self):
        """The equivalent `tf.tpu.experimental.embedding` optimizer."""
        return self.parameters().to_tf_optimizer(learning_rate=self.learning_rate_fn)

    @classmethod
    def from_tf(cls, optimizer) -> "OptimizerConfig":
        """From a `tf.tpu.experimental.embedding` SGD / Adagrad / Adam / FTRL."""
        fn = optimizer.learning_rate if callable(optimizer.learning_rate) else None
        if fn is not None:  # the seed classes take floats; the callable is kept beside them
            optimizer = copy.copy(optimizer)
            optimizer.learning_rate = 0.0
        return cls.from_dict(optimizers.from_tf_optimizer(optimizer).to_dict(), learning_rate_fn=fn)


def _callable_tag(fn: Any) -> str:
    # Callables have no value to compare: TF hashes them by identity, so does the tag.
    name = getattr(fn, "__qualname__", type(fn).__qualname__)
    return f"<callable {getattr(fn, '__module__', '?')}.{name} at 0x{id(fn):x}>"


def optimizer_group_of(optimizer: Any) -> str:
    """The stacking group of any optimizer object a TableConfig may carry.

    Ours and the seed API's give their parameters; TF's give their attributes
    (TF hashes `tuple(self.__dict__.items())`); other JSON-able values
    themselves; anything else (callables, objects without `__dict__`) is
    identified by its identity, as `hash()` would.
    """
    if optimizer is None:
        return "null"
    if isinstance(optimizer, OptimizerConfig):
        return optimizer.group
    return canonical_json(_group_data(optimizer))


def _group_data(x: Any) -> Any:
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else repr(x)
    if isinstance(x, (list, tuple)):
        return [_group_data(v) for v in x]
    if isinstance(x, Mapping):
        return {str(k): _group_data(v) for k, v in x.items()}
    if hasattr(x, "to_dict") and not callable(x):
        return _group_data(x.to_dict())
    if hasattr(x, "_values") and hasattr(x, "_PARAMS"):  # seed-API parameters
        return {"optimizer": x._KIND, **{k: _group_data(v) for k, v in zip(x._PARAMS, x._values())}}
    if hasattr(x, "__dict__") and not callable(x):
        return {"class": f"{type(x).__module__}.{type(x).__qualname__}",
                **{str(k): _group_data(v) for k, v in vars(x).items()}}
    return _callable_tag(x)


# ---------------------------------------------------------------- tables and features

@dataclasses.dataclass(frozen=True)
class TableConfig:
    """One embedding table (TF: `tf.tpu.experimental.embedding.TableConfig`).

    `optimizer_group` is derived from `optimizer` when not given; it is given
    explicitly where only the grouping is known (a profile's record of a model).
    """

    name: str
    vocabulary_size: int
    dim: int
    combiner: str = "mean"
    optimizer: Optional[OptimizerConfig] = None
    optimizer_group: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("A table has no name; give every TableConfig a unique name.")
        for field in ("vocabulary_size", "dim"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Table {self.name!r}: vocabulary_size and dim must be >= 1, got "
                                 f"{self.vocabulary_size} and {self.dim}.")
        if self.combiner not in COMBINERS:
            raise ValueError(f"Table {self.name!r}: combiner {self.combiner!r} is not one of 'sum', 'mean', "
                             "'sqrtn'.")
        if not self.optimizer_group:
            object.__setattr__(self, "optimizer_group", optimizer_group_of(self.optimizer))


@dataclasses.dataclass(frozen=True)
class FeatureConfig:
    """One input feature looking up a table (TF: `tf.tpu.experimental.embedding.FeatureConfig`).

    `name` is the feature's flattened path; `output_shape` is per chip:
    `(per_chip_batch,)`, or `(per_chip_batch, max_sequence_length)` for a
    sequence feature.
    """

    name: str
    table: TableConfig
    output_shape: Tuple[int, ...]
    max_sequence_length: int = 0

    def __post_init__(self) -> None:
        shape = self.output_shape
        if shape is None or len(tuple(shape)) == 0:
            raise ValueError(
                f"Feature {self.name!r} has no output_shape. SparseCore preprocessing is per chip: set "
                "output_shape to the per-chip batch shape, e.g. [global_batch // num_chips].")
        shape = tuple(int(d) for d in shape)
        if any(d < 1 for d in shape):
            raise ValueError(f"Feature {self.name!r}: output_shape {list(shape)} must be fully defined and positive.")
        object.__setattr__(self, "output_shape", shape)

    @property
    def samples(self) -> int:
        """Samples per chip: `prod(output_shape)`."""
        return math.prod(self.output_shape)

    @property
    def examples(self) -> int:
        return self.output_shape[0]

    @property
    def samples_per_example(self) -> int:
        return math.prod(self.output_shape[1:])


# ---------------------------------------------------------------- the model

@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The SparseCore features, in flattened order, and the topology they run on."""

    features: Tuple[FeatureConfig, ...]
    topology: Topology

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", tuple(self.features))
        if not self.features:
            raise ValueError("feature_config has no features.")
        if not isinstance(self.topology, Topology):
            raise TypeError(f"topology must be a tpu_embed.Topology, got {type(self.topology).__name__}")
        seen: Dict[str, FeatureConfig] = {}
        tables: Dict[str, TableConfig] = {}
        for f in self.features:
            if f.name in seen:
                raise ValueError(f"Two features are both named {f.name!r}; feature names must be unique.")
            seen[f.name] = f
            other = tables.setdefault(f.table.name, f.table)
            if other != f.table:
                raise ValueError(
                    f"Two different tables are both named {f.table.name!r} (features sharing a table must share "
                    "the same TableConfig). Rename one of them.")
            if f.samples % self.topology.num_sc_per_chip:
                raise ValueError(
                    f"Feature {f.name!r}: {f.samples} samples per chip (output_shape {list(f.output_shape)}) is not "
                    f"divisible by {self.topology.num_sc_per_chip} SparseCores per chip. Use a per-chip batch "
                    f"that is a multiple of {self.topology.num_sc_per_chip}.")

    # -- lookups ---------------------------------------------------------------

    # A model is frozen, and the statistics and the packer ask for its tables, its features per table and its
    # hash (every lookup of a cache keyed by it) many times a step: each is computed once per instance and kept
    # in its __dict__, not pickled (a hash of strings differs between processes).
    _CACHED = ("_hash", "_tables", "_table_features")

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash((self.features, self.topology))
        return h

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in self._CACHED}

    @property
    def tables(self) -> Tuple[TableConfig, ...]:
        """Every table once, sorted by name (the order TF stacks them in)."""
        got = self.__dict__.get("_tables")
        if got is None:
            by_name = {f.table.name: f.table for f in self.features}
            got = self.__dict__["_tables"] = tuple(by_name[n] for n in sorted(by_name))
        return got

    def table(self, name: str) -> TableConfig:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(f"No table {name!r}; tables are {[t.name for t in self.tables]}")

    def feature(self, name: str) -> FeatureConfig:
        for f in self.features:
            if f.name == name:
                return f
        raise KeyError(f"No feature {name!r}; features are {[f.name for f in self.features]}")

    def table_features(self, table: str) -> Tuple[FeatureConfig, ...]:
        """The features that look `table` up, in flattened order."""
        per_table = self.__dict__.get("_table_features")
        if per_table is None:
            per_table = {}
            for f in self.features:
                per_table[f.table.name] = per_table.get(f.table.name, ()) + (f,)
            self.__dict__["_table_features"] = per_table
        return per_table.get(table, ())

    @property
    def per_chip_batch(self) -> int:
        return max(f.examples for f in self.features)

    def with_topology(self, topology: Topology, per_chip_batch: Optional[int] = None) -> "ModelConfig":
        """The same features on another topology; `per_chip_batch` rescales every feature's first dimension."""
        feats = self.features
        if per_chip_batch is not None:
            feats = tuple(dataclasses.replace(f, output_shape=(per_chip_batch,) + f.output_shape[1:])
                          for f in feats)
        return ModelConfig(feats, topology)

    # -- JSON -------------------------------------------------------------------

    def to_json(self) -> dict:
        """Plain data: enough to rebuild the model and its stacking (optimizers as their groups)."""
        return {"version": MODEL_JSON_VERSION,
                "topology": self.topology.to_dict(),
                "tables": [{"name": t.name, "vocabulary_size": t.vocabulary_size, "dim": t.dim,
                            "combiner": t.combiner, "optimizer_group": t.optimizer_group,
                            "optimizer": None if t.optimizer is None or t.optimizer.learning_rate_fn
                            else t.optimizer.to_dict()}
                           for t in self.tables],
                "features": [{"name": f.name, "table": f.table.name, "output_shape": list(f.output_shape),
                              "max_sequence_length": f.max_sequence_length} for f in self.features]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ModelConfig":
        if int(d.get("version", 0)) != MODEL_JSON_VERSION:
            raise ValueError(f"model JSON version {d.get('version')!r} is not {MODEL_JSON_VERSION}; it was written "
                             "by another tpu_embed release. Re-create it with this one.")
        tables = {}
        for t in d["tables"]:
            opt = OptimizerConfig.from_dict(t["optimizer"]) if t.get("optimizer") else None
            tables[t["name"]] = TableConfig(str(t["name"]), int(t["vocabulary_size"]), int(t["dim"]),
                                            str(t["combiner"]), opt, str(t["optimizer_group"]))
        feats = tuple(FeatureConfig(str(f["name"]), tables[f["table"]], tuple(int(x) for x in f["output_shape"]),
                                    int(f.get("max_sequence_length", 0)))
                      for f in d["features"])
        return cls(feats, Topology.from_dict(d["topology"]))

    @property
    def key(self) -> str:
        """A short stable identity of the model (sha256 of its JSON)."""
        return fingerprint(self.to_json(), 20)


# ---------------------------------------------------------------- the TF boundary

def from_tf_feature_config(feature_config: Any, topology: Optional[Topology]) -> ModelConfig:
    """A `ModelConfig` from the nested `tf.tpu.experimental.embedding.FeatureConfig`s TPUEmbeddingV2 takes.

    Objects with the same attributes are accepted (`.table`, `.output_shape`;
    tables with `.name`, `.vocabulary_size`, `.dim`, `.combiner`,
    `.optimizer`): their optimizers keep TF's grouping (`optimizer_group_of`).
    A `ModelConfig` is returned as it is (its topology must be `topology`).
    """
    if isinstance(feature_config, ModelConfig):
        if topology is not None and topology != feature_config.topology:
            raise ValueError(f"the ModelConfig is laid out for {feature_config.topology}, not {topology}.")
        return feature_config
    if not isinstance(topology, Topology):
        raise TypeError(f"topology must be a tpu_embed.Topology, got {type(topology).__name__}")
    flat = flatten_with_paths(feature_config)
    if not flat:
        raise ValueError("feature_config has no features.")
    converted: Dict[int, TableConfig] = {}
    features: List[FeatureConfig] = []
    for path, feature in flat:
        table = getattr(feature, "table", None)
        if table is None:
            raise TypeError(f"Feature {path!r}: expected a FeatureConfig with a .table, got {type(feature).__name__}.")
        if id(table) not in converted:
            converted[id(table)] = table if isinstance(table, TableConfig) else _table_from_tf(table)
        shape = getattr(feature, "output_shape", None)
        if shape is not None and not isinstance(shape, (list, tuple)):
            shape = list(shape)  # a tf.TensorShape
        if shape is not None and any(d is None for d in shape):
            raise ValueError(f"Feature {path!r}: output_shape {list(shape)} must be fully defined and positive.")
        features.append(FeatureConfig(path, converted[id(table)], tuple(shape) if shape is not None else (),
                                      int(getattr(feature, "max_sequence_length", 0) or 0)))
    return ModelConfig(tuple(features), topology)


def _table_from_tf(table: Any) -> TableConfig:
    opt = getattr(table, "optimizer", None)
    ours = None
    if isinstance(opt, OptimizerConfig):
        ours = opt
    elif opt is not None and type(opt).__module__.startswith("tensorflow."):
        try:
            ours = OptimizerConfig.from_tf(opt)
        except (TypeError, ValueError):  # e.g. a slot-variable function: keep TF's grouping only
            ours = None
    group = optimizer_group_of(opt)
    if getattr(table, "quantization_config", None) is not None:  # TF also separates stacks by it
        group = canonical_json([group, repr(table.quantization_config)])
    return TableConfig(table.name, int(table.vocabulary_size), int(table.dim),
                       getattr(table, "combiner", "mean"), ours, group)


def to_tf_feature_config(model: ModelConfig) -> Any:
    """`{feature name: tf.tpu.experimental.embedding.FeatureConfig}`, tables shared as in the model.

    A dict flattens in sorted key order; when the model's feature order is not
    its names' sorted order (paths of a list nest), a list in the model's order
    is returned instead, so TF sees the same sample offsets.
    """
    import tensorflow as tf  # optional-dependency boundary: the model itself imports without TensorFlow
    emb = tf.tpu.experimental.embedding
    tables = {t.name: emb.TableConfig(vocabulary_size=t.vocabulary_size, dim=t.dim, combiner=t.combiner,
                                      optimizer=None if t.optimizer is None else t.optimizer.to_tf(), name=t.name)
              for t in model.tables}
    feats = [(f.name, emb.FeatureConfig(table=tables[f.table.name], output_shape=list(f.output_shape),
                                        max_sequence_length=f.max_sequence_length, name=f.name))
             for f in model.features]
    names = [n for n, _ in feats]
    if names == sorted(names):
        return dict(feats)
    return [fc for _, fc in feats]
