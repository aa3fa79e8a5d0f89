"""One declarative spec (YAML) read by the Beam jobs and by the training library.

    spec = tpu_embed.spec.load_spec("examples/criteo/spec.yaml")
    spec.fingerprint                      # sha256 of the normalized spec (goes in manifests)
    fc = spec.to_feature_config(vocab_sizes)   # nested tf.tpu.experimental.embedding.FeatureConfig
    ecs = spec.to_embedding_config_spec(vocab_dir)  # seed API: columns + EmbeddingConfigSpec

A spec file looks like this (every key is documented in docs/pipelines.md)::

    inputs:
      format: csv                      # csv | tfrecord | parquet
      patterns: [../../data/criteo_sample.csv]   # relative to the spec file
    label: {column: label}
    dense:                             # float features, blanks -> fill
      - {name: I1, fill: 0.0}
    categorical:
      - name: genres
        delimiter: "|"                 # multivalent values in one column
        weight_column: null            # a column with one float weight per value
        sequence_length: 0             # > 0: a sequence feature, output_shape [batch, L]
        embedding_lookup_device: tpu_embedding_core   # or tpu_tensor_core (needs tensor_core_width)
        table: genres                  # features naming the same table share it
        vocabulary: {type: frequency, top_k: 1000, frequency_threshold: 1, num_oov_buckets: 1}
                   # or {type: identity, num_buckets: N} or {type: hashing, num_buckets: N}
    tables:
      - {name: genres, dim: 8, combiner: mean, optimizer: {type: adagrad, learning_rate: 0.05}}
    defaults: {categorical: {...}, table: {...}}   # applied to every entry, entries override
    optimizer: {type: adagrad, learning_rate: 0.05}  # default for tables without their own
    topology: {num_chips: 1, num_sc_per_chip: 4, num_hosts: 1}
    global_batch_size: 64
    profile_data_directory: profiles   # relative to the artifact directory
    limits: {max_ids_per_chip_per_sample: 64, max_ids_per_table: {}, max_unique_ids_per_table: {},
             allow_id_dropping: false}
    policies: {invalid_ids: drop, nan_weights: drop, tail: drop}

Validation errors are `SpecError`s whose message names the key (e.g.
``categorical[3].vocabulary.top_k``) and says how to fix it.

This module needs only numpy and pyyaml; TensorFlow is imported by the
methods that build TensorFlow objects.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from tpu_embed.topology import Topology

SPEC_VERSION = 1
FORMATS = ("csv", "tfrecord", "parquet")
VOCAB_TYPES = ("frequency", "identity", "hashing")
DEVICES = ("tpu_embedding_core", "tpu_tensor_core")
COMBINERS = ("mean", "sum", "sqrtn")
OPTIMIZERS = {"sgd": "StochasticGradientDescentParameters", "adagrad": "AdagradParameters",
              "adam": "AdamParameters", "ftrl": "FtrlParameters"}
INVALID_ID_POLICIES = ("drop", "error")
NAN_WEIGHT_POLICIES = ("drop", "zero", "error")
TAIL_POLICIES = ("drop", "pad")
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


class SpecError(ValueError):
    """A spec is invalid. The message names the key and the fix."""

    def __init__(self, key: str, problem: str, fix: str = ""):
        self.key = key
        msg = f"spec key '{key}': {problem}"
        if fix:
            msg += f" Fix: {fix}"
        super().__init__(msg)


# ---------------------------------------------------------------- typed spec

@dataclasses.dataclass(frozen=True)
class VocabularySpec:
    type: str = "frequency"
    top_k: Optional[int] = None
    frequency_threshold: Optional[int] = None
    num_oov_buckets: int = 1
    num_buckets: Optional[int] = None  # identity / hashing
    default_value: Optional[int] = None  # identity: id used for invalid values (None: policy)

    def to_dict(self) -> dict:
        if self.type == "frequency":
            return {"type": self.type, "top_k": self.top_k, "frequency_threshold": self.frequency_threshold,
                    "num_oov_buckets": self.num_oov_buckets}
        if self.type == "identity":
            return {"type": self.type, "num_buckets": self.num_buckets, "default_value": self.default_value}
        return {"type": self.type, "num_buckets": self.num_buckets}


@dataclasses.dataclass(frozen=True)
class CategoricalSpec:
    name: str
    column: str
    table: str
    vocabulary: VocabularySpec
    delimiter: Optional[str] = None
    weight_column: Optional[str] = None
    sequence_length: int = 0
    embedding_lookup_device: str = "tpu_embedding_core"
    tensor_core_width: Optional[int] = None

    @property
    def on_sparse_core(self) -> bool:
        return self.embedding_lookup_device == "tpu_embedding_core"

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["vocabulary"] = self.vocabulary.to_dict()
        return d


@dataclasses.dataclass(frozen=True)
class DenseSpec:
    name: str
    column: str
    fill: float = 0.0


@dataclasses.dataclass(frozen=True)
class LabelSpec:
    column: str
    fill: Optional[float] = None  # None: a blank label sends the record to the dead letters


@dataclasses.dataclass(frozen=True)
class TableSpec:
    name: str
    dim: int
    combiner: str = "mean"
    optimizer: Optional[Mapping[str, Any]] = None  # {"type": "adagrad", ...}; None: the spec's optimizer
    learning_rate: Optional[float] = None

    def to_dict(self) -> dict:
        return {"name": self.name, "dim": self.dim, "combiner": self.combiner,
                "optimizer": dict(self.optimizer) if self.optimizer else None,
                "learning_rate": self.learning_rate}


@dataclasses.dataclass(frozen=True)
class InputsSpec:
    format: str
    patterns: Tuple[str, ...]
    csv_delimiter: str = ","


@dataclasses.dataclass(frozen=True)
class LimitsSpec:
    max_ids_per_chip_per_sample: int = 64
    max_ids_per_table: Mapping[str, int] = dataclasses.field(default_factory=dict)
    max_unique_ids_per_table: Mapping[str, int] = dataclasses.field(default_factory=dict)
    allow_id_dropping: bool = False
    given: bool = False  # whether the spec had a `limits` section


@dataclasses.dataclass(frozen=True)
class PoliciesSpec:
    invalid_ids: str = "drop"
    nan_weights: str = "drop"
    tail: str = "drop"


@dataclasses.dataclass(frozen=True)
class Spec:
    inputs: InputsSpec
    label: Optional[LabelSpec]
    dense: Tuple[DenseSpec, ...]
    categorical: Tuple[CategoricalSpec, ...]
    tables: Tuple[TableSpec, ...]
    optimizer: Optional[Mapping[str, Any]]
    topology: Topology
    global_batch_size: int
    profile_data_directory: Optional[str]
    limits: LimitsSpec
    policies: PoliciesSpec
    name: str = "spec"
    base_dir: str = "."  # directory relative input patterns are resolved against
    source_path: Optional[str] = None

    # -- derived ------------------------------------------------------------

    @property
    def per_chip_batch_size(self) -> int:
        return self.global_batch_size // self.topology.num_chips

    @property
    def per_host_batch_size(self) -> int:
        return self.global_batch_size // self.topology.num_hosts

    def table(self, name: str) -> TableSpec:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)

    def feature(self, name: str) -> CategoricalSpec:
        for f in self.categorical:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def sparse_core_features(self) -> Tuple[CategoricalSpec, ...]:
        return tuple(f for f in self.categorical if f.on_sparse_core)

    @property
    def tensor_core_features(self) -> Tuple[CategoricalSpec, ...]:
        return tuple(f for f in self.categorical if not f.on_sparse_core)

    def vocabulary_key(self, feature: CategoricalSpec) -> str:
        """Features of one table share one frequency vocabulary, computed over all their values."""
        sharing = [f for f in self.categorical if f.table == feature.table]
        return feature.table if len(sharing) > 1 else feature.name

    def vocabulary_groups(self) -> Dict[str, List[CategoricalSpec]]:
        """{vocabulary key: features} for the frequency vocabularies, in spec order."""
        out: Dict[str, List[CategoricalSpec]] = {}
        for f in self.categorical:
            if f.vocabulary.type == "frequency":
                out.setdefault(self.vocabulary_key(f), []).append(f)
        return out

    def input_patterns(self) -> List[str]:
        return [p if _is_absolute(p) else os.path.normpath(os.path.join(self.base_dir, p))
                for p in self.inputs.patterns]

    def required_columns(self) -> List[str]:
        cols = []
        if self.label is not None:
            cols.append(self.label.column)
        cols += [d.column for d in self.dense]
        for f in self.categorical:
            cols.append(f.column)
            if f.weight_column:
                cols.append(f.weight_column)
        return list(dict.fromkeys(cols))

    def table_vocabulary_size(self, table: str, vocab_sizes: Mapping[str, int]) -> int:
        """Rows of `table`: vocabulary size + OOV buckets, or the bucket count."""
        feats = [f for f in self.categorical if f.table == table]
        f = feats[0]
        v = f.vocabulary
        if v.type == "frequency":
            key = self.vocabulary_key(f)
            if key not in vocab_sizes:
                raise KeyError(f"No vocabulary size for {key!r}: run `tpu-embed vocab` first and pass the sizes "
                               "from its manifest (Spec.vocabulary_sizes(artifact_dir)).")
            return max(1, int(vocab_sizes[key]) + v.num_oov_buckets)
        return int(v.num_buckets)

    # -- normalization and fingerprint ---------------------------------------

    def to_dict(self) -> dict:
        """The normalized spec: every default filled in, lists in spec order."""
        return {
            "version": SPEC_VERSION,
            "name": self.name,
            "inputs": {"format": self.inputs.format, "patterns": list(self.inputs.patterns),
                       "csv": {"delimiter": self.inputs.csv_delimiter}},
            "label": None if self.label is None else dataclasses.asdict(self.label),
            "dense": [dataclasses.asdict(d) for d in self.dense],
            "categorical": [f.to_dict() for f in self.categorical],
            "tables": [t.to_dict() for t in self.tables],
            "optimizer": dict(self.optimizer) if self.optimizer else None,
            "topology": self.topology.to_dict(),
            "global_batch_size": self.global_batch_size,
            "profile_data_directory": self.profile_data_directory,
            "limits": {
                "max_ids_per_chip_per_sample": self.limits.max_ids_per_chip_per_sample,
                "max_ids_per_table": dict(sorted(self.limits.max_ids_per_table.items())),
                "max_unique_ids_per_table": dict(sorted(self.limits.max_unique_ids_per_table.items())),
                "allow_id_dropping": self.limits.allow_id_dropping,
            } if self.limits.given else None,
            "policies": dataclasses.asdict(self.policies),
        }

    def to_yaml(self) -> str:
        import yaml
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None, width=110)

    @property
    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of the normalized spec, without where the data lives.

        `inputs.patterns`, `name` and `profile_data_directory` are left out: the same
        spec run on another copy of the data (or by the training job, which does not
        read raw data) has the same fingerprint.
        """
        d = self.to_dict()
        d["inputs"].pop("patterns")
        d.pop("name")
        d.pop("profile_data_directory")
        text = json.dumps(d, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def with_inputs(self, patterns: Sequence[str], base_dir: Optional[str] = None) -> "Spec":
        """A copy reading other files (e.g. `--input` on the command line)."""
        if isinstance(patterns, str):
            patterns = [patterns]
        return dataclasses.replace(self, inputs=dataclasses.replace(self.inputs, patterns=tuple(patterns)),
                                   base_dir=base_dir if base_dir is not None else os.getcwd())

    # -- conversions -----------------------------------------------------------

    def optimizer_parameters(self, table: TableSpec):
        """The seed API parameter object (tpu_embed.optimizers) of a table."""
        from tpu_embed import optimizers as _opt
        d = table.optimizer or self.optimizer
        if d is None:
            return None
        return _opt.optimizer_from_dict(_optimizer_kwargs(d))

    def output_shape(self, feature: CategoricalSpec) -> List[int]:
        b = self.per_chip_batch_size
        return [b, feature.sequence_length] if feature.sequence_length > 0 else [b]

    def to_feature_config(self, vocab_sizes: Mapping[str, int], *, lightweight: bool = False) -> Dict[str, Any]:
        """{feature: tf.tpu.experimental.embedding.FeatureConfig} for the SparseCore features.

        This is what `tpu_embed.sparsecore.stack_tables` and `TPUEmbeddingV2` take:
        output_shape is per chip, `[global_batch // chips]` or `[.., sequence_length]`.
        Features of one table share one `TableConfig` object. `vocab_sizes` maps
        vocabulary keys to their size (from `Spec.vocabulary_sizes(artifact_dir)`).
        `lightweight=True` returns plain objects with the same attributes and no
        TensorFlow import (what the Beam workers use; stacking is identical).
        """
        tables = {}
        out = {}
        for f in self.sparse_core_features:
            if f.table not in tables:
                t = self.table(f.table)
                vocab = self.table_vocabulary_size(t.name, vocab_sizes)
                params = self.optimizer_parameters(t)
                if lightweight:
                    tables[t.name] = LightTable(name=t.name, vocabulary_size=vocab, dim=t.dim,
                                                combiner=t.combiner, optimizer=params)
                else:
                    import tensorflow as tf
                    opt = None if params is None else params.to_tf_optimizer(learning_rate=t.learning_rate)
                    tables[t.name] = tf.tpu.experimental.embedding.TableConfig(
                        vocabulary_size=vocab, dim=t.dim, combiner=t.combiner, optimizer=opt, name=t.name)
            shape = self.output_shape(f)
            if lightweight:
                out[f.name] = LightFeature(table=tables[f.table], output_shape=tuple(shape), name=f.name,
                                           max_sequence_length=f.sequence_length)
            else:
                import tensorflow as tf
                out[f.name] = tf.tpu.experimental.embedding.FeatureConfig(
                    table=tables[f.table], max_sequence_length=f.sequence_length, output_shape=shape,
                    name=f.name)
        if not out:
            raise SpecError("categorical", "no feature is looked up on SparseCore.",
                            "set embedding_lookup_device: tpu_embedding_core on at least one feature.")
        return out

    def layout(self, vocab_sizes: Mapping[str, int]):
        """`tpu_embed.sparsecore.stack_tables` of this spec (numpy only)."""
        from tpu_embed.sparsecore import stack_tables
        return stack_tables(self.to_feature_config(vocab_sizes, lightweight=True), self.topology)

    def to_feature_columns(self, vocab_dir: Optional[str] = None, vocab_sizes: Optional[Mapping[str, int]] = None):
        """Seed-API columns (`tpu_embed.embedding_column` / `shared_embedding_columns`), in spec order.

        Frequency vocabularies become `categorical_column_with_vocabulary_file`
        (the files `tpu-embed vocab` wrote under `vocab_dir`, one per feature),
        identity and hashing features `categorical_column_with_identity`
        (hashing is applied offline, so the trainer sees bucket ids).
        Weighted features are wrapped in `weighted_categorical_column`,
        sequence features use the sequence_* column kinds.
        """
        import tensorflow as tf
        from tpu_embed.feature_column import embedding_column, shared_embedding_columns
        fc = tf.feature_column
        if vocab_sizes is None:
            vocab_sizes = self.vocabulary_sizes(os.path.dirname(vocab_dir.rstrip("/"))) if vocab_dir else {}

        def categorical(f: CategoricalSpec):
            v = f.vocabulary
            seq = f.sequence_length > 0
            if v.type == "frequency":
                if vocab_dir is None:
                    raise ValueError("to_feature_columns needs vocab_dir for frequency vocabularies.")
                path = os.path.join(vocab_dir, vocabulary_filename(f.name))
                size = int(vocab_sizes[self.vocabulary_key(f)])
                make = (fc.sequence_categorical_column_with_vocabulary_file if seq
                        else fc.categorical_column_with_vocabulary_file)
                col = make(f.name, path, vocabulary_size=size, num_oov_buckets=v.num_oov_buckets)
            else:
                make = (fc.sequence_categorical_column_with_identity if seq
                        else fc.categorical_column_with_identity)
                col = make(f.name, num_buckets=int(v.num_buckets))
            if f.weight_column:
                col = fc.weighted_categorical_column(col, weight_feature_key=f.weight_column)
            return col

        def kwargs(f: CategoricalSpec):
            if f.embedding_lookup_device == "tpu_tensor_core":
                return {"embedding_lookup_device": "tpu_tensor_core",
                        "tensor_core_shape": [None, int(f.tensor_core_width)]}
            return {"embedding_lookup_device": "tpu_embedding_core"}

        columns: Dict[str, Any] = {}
        by_table: Dict[str, List[CategoricalSpec]] = {}
        for f in self.categorical:
            by_table.setdefault(f.table, []).append(f)
        for tname, feats in by_table.items():
            t = self.table(tname)
            if len(feats) == 1:
                f = feats[0]
                columns[f.name] = embedding_column(categorical(f), t.dim, combiner=t.combiner,
                                                   max_sequence_length=f.sequence_length, **kwargs(f))
            else:
                cols = shared_embedding_columns(
                    [categorical(f) for f in feats], t.dim, combiner=t.combiner,
                    shared_embedding_collection_name=tname,
                    max_sequence_lengths=[f.sequence_length for f in feats], **kwargs(feats[0]))
                for f, c in zip(feats, cols):
                    columns[f.name] = c
        return [columns[f.name] for f in self.categorical]

    def to_embedding_config_spec(self, vocab_dir: Optional[str] = None,
                                 vocab_sizes: Optional[Mapping[str, int]] = None,
                                 profile_data_directory: Optional[str] = None):
        """The seed API's `EmbeddingConfigSpec` built from `to_feature_columns`.

        The columns path has one spec-wide optimizer: per-table optimizers are
        refused here (use `to_feature_config`, which honours them).
        """
        from tpu_embed.config_spec import EmbeddingConfigSpec
        per_table = [t.name for t in self.tables if t.optimizer]
        if per_table:
            raise SpecError(f"tables[{per_table[0]}].optimizer",
                            "EmbeddingConfigSpec's feature_columns form has one optimizer for all tables.",
                            "move the optimizer to the top-level `optimizer` key, or use "
                            "Spec.to_feature_config, which supports per-table optimizers.")
        if self.optimizer is None:
            raise SpecError("optimizer", "EmbeddingConfigSpec needs optimization parameters.",
                            "add e.g. `optimizer: {type: adagrad, learning_rate: 0.05}`.")
        from tpu_embed import optimizers as _opt
        params = _opt.optimizer_from_dict(_optimizer_kwargs(self.optimizer))
        return EmbeddingConfigSpec(
            feature_columns=self.to_feature_columns(vocab_dir, vocab_sizes),
            optimization_parameters=params,
            profile_data_directory=profile_data_directory or self.profile_data_directory)

    @staticmethod
    def vocabulary_sizes(artifact_dir: str) -> Dict[str, int]:
        """{vocabulary key: size} from an artifact directory's manifest.json."""
        from apache_beam.io.filesystems import FileSystems  # works for gs:// too
        path = artifact_dir.rstrip("/") + "/manifest.json"
        with FileSystems.open(path) as fh:
            manifest = json.loads(fh.read().decode("utf-8"))
        return {k: int(v["size"]) for k, v in manifest["vocabularies"].items()}


def vocabulary_filename(feature: str) -> str:
    return f"{feature}.txt"


@dataclasses.dataclass(frozen=True, eq=False)
class LightTable:
    """Attributes of tf.tpu.experimental.embedding.TableConfig that stacking reads (no TF import)."""
    name: str
    vocabulary_size: int
    dim: int
    combiner: str
    optimizer: Any = None


@dataclasses.dataclass(frozen=True, eq=False)
class LightFeature:
    table: LightTable
    output_shape: Tuple[int, ...]
    name: str
    max_sequence_length: int = 0


def _is_absolute(p: str) -> bool:
    return os.path.isabs(p) or "://" in p


def _optimizer_kwargs(d: Mapping[str, Any]) -> dict:
    d = dict(d)
    kind = d.pop("type")
    return {"optimizer": kind, **d}


# ---------------------------------------------------------------- loading + validation

_TOP_KEYS = {"version", "name", "inputs", "label", "dense", "categorical", "tables", "defaults", "optimizer",
             "topology", "global_batch_size", "profile_data_directory", "limits", "policies"}


def load_spec(path: str) -> Spec:
    """Read and validate a YAML spec file. Relative input patterns resolve against its directory."""
    import yaml
    try:
        with open(path, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh)
    except FileNotFoundError:
        raise SpecError("<file>", f"spec file {path!r} does not exist.", "pass the path of a YAML spec.") from None
    except yaml.YAMLError as e:
        raise SpecError("<file>", f"{path}: not valid YAML ({e}).", "fix the YAML syntax.") from None
    return parse_spec(raw, base_dir=os.path.dirname(os.path.abspath(path)), source_path=os.path.abspath(path))


def parse_spec(raw: Any, base_dir: str = ".", source_path: Optional[str] = None) -> Spec:
    """Validate a spec given as a dict (the parsed YAML)."""
    if not isinstance(raw, Mapping):
        raise SpecError("<root>", f"the spec must be a mapping, got {type(raw).__name__}.",
                        "see docs/pipelines.md for the layout.")
    raw = copy.deepcopy(dict(raw))
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise SpecError(unknown[0], "unknown top-level key.", f"use only {sorted(_TOP_KEYS)}.")
    version = raw.get("version", SPEC_VERSION)
    if version != SPEC_VERSION:
        raise SpecError("version", f"unsupported spec version {version!r}.", f"use version: {SPEC_VERSION}.")

    inputs = _parse_inputs(raw.get("inputs"))
    label = _parse_label(raw.get("label"))
    dense = _parse_dense(raw.get("dense") or [])
    defaults = raw.get("defaults") or {}
    if not isinstance(defaults, Mapping) or set(defaults) - {"categorical", "table"}:
        raise SpecError("defaults", "must be a mapping with optional keys 'categorical' and 'table'.",
                        "e.g. defaults: {categorical: {vocabulary: {num_oov_buckets: 1}}, table: {dim: 16}}.")
    optimizer = _parse_optimizer(raw.get("optimizer"), "optimizer") if raw.get("optimizer") is not None else None
    categorical = _parse_categorical(raw.get("categorical"), defaults.get("categorical") or {})
    tables = _parse_tables(raw.get("tables") or [], defaults.get("table") or {}, categorical, optimizer)
    topology = _parse_topology(raw.get("topology"))
    gbs = raw.get("global_batch_size")
    _int(gbs, "global_batch_size", minimum=1, fix="set global_batch_size to a positive integer.")
    if gbs % topology.num_chips:
        raise SpecError("global_batch_size", f"{gbs} is not divisible by topology.num_chips={topology.num_chips}.",
                        f"use a multiple of {topology.num_chips * topology.num_sc_per_chip}.")
    per_chip = gbs // topology.num_chips
    if per_chip % topology.num_sc_per_chip:
        raise SpecError("global_batch_size",
                        f"the per-chip batch {per_chip} is not divisible by num_sc_per_chip="
                        f"{topology.num_sc_per_chip} (SparseCores split a chip's batch evenly).",
                        f"use a multiple of {topology.num_chips * topology.num_sc_per_chip}.")
    pdd = raw.get("profile_data_directory", "profiles")
    if pdd is not None and not isinstance(pdd, str):
        raise SpecError("profile_data_directory", "must be a path string.", "e.g. profile_data_directory: profiles.")
    limits = _parse_limits(raw.get("limits"))
    policies = _parse_policies(raw.get("policies"))
    name = raw.get("name", "spec")
    if not isinstance(name, str):
        raise SpecError("name", "must be a string.", "e.g. name: criteo.")
    spec = Spec(inputs=inputs, label=label, dense=tuple(dense), categorical=tuple(categorical),
                tables=tuple(tables), optimizer=optimizer, topology=topology, global_batch_size=int(gbs),
                profile_data_directory=pdd, limits=limits, policies=policies, name=name,
                base_dir=base_dir, source_path=source_path)
    _cross_check(spec)
    return spec


def _int(v, key, minimum=None, fix="", allow_none=False):
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise SpecError(key, f"expected an integer, got {v!r}.", fix)
    if minimum is not None and v < minimum:
        raise SpecError(key, f"must be >= {minimum}, got {v}.", fix)
    return v


def _float(v, key, fix=""):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise SpecError(key, f"expected a finite number, got {v!r}.", fix)
    return float(v)


def _keys(d, key, allowed, fix=""):
    if not isinstance(d, Mapping):
        raise SpecError(key, f"expected a mapping, got {type(d).__name__}.", fix)
    unknown = sorted(set(d) - set(allowed))
    if unknown:
        raise SpecError(f"{key}.{unknown[0]}", "unknown key.", f"allowed keys are {sorted(allowed)}.")


def _name(v, key):
    if not isinstance(v, str) or not _NAME_RE.match(v):
        raise SpecError(key, f"{v!r} is not a valid name.",
                        "use letters, digits, '_', '.', '-' (it becomes a file name and a TF name).")
    return v


def _parse_inputs(d) -> InputsSpec:
    if d is None:
        raise SpecError("inputs", "missing.", "add `inputs: {format: csv, patterns: [data/*.csv]}`.")
    _keys(d, "inputs", {"format", "patterns", "csv"})
    fmt = d.get("format")
    if fmt not in FORMATS:
        raise SpecError("inputs.format", f"{fmt!r} is not a supported format.", f"use one of {list(FORMATS)}.")
    pats = d.get("patterns")
    if isinstance(pats, str):
        pats = [pats]
    if not pats or not all(isinstance(p, str) and p for p in pats):
        raise SpecError("inputs.patterns", "must be a non-empty list of file patterns.",
                        "e.g. patterns: [data/train-*.csv] (relative to the spec file), or pass --input.")
    csv = d.get("csv") or {}
    _keys(csv, "inputs.csv", {"delimiter"})
    delim = csv.get("delimiter", ",")
    if not isinstance(delim, str) or len(delim) != 1:
        raise SpecError("inputs.csv.delimiter", f"{delim!r} must be a single character.", "e.g. ',' or '\\t'.")
    return InputsSpec(format=fmt, patterns=tuple(pats), csv_delimiter=delim)


def _parse_label(d) -> Optional[LabelSpec]:
    if d is None:
        return None
    if isinstance(d, str):
        d = {"column": d}
    _keys(d, "label", {"column", "fill"})
    col = d.get("column")
    if not isinstance(col, str) or not col:
        raise SpecError("label.column", "must name the label column.", "e.g. label: {column: label}.")
    fill = d.get("fill")
    return LabelSpec(column=col, fill=None if fill is None else _float(fill, "label.fill"))


def _parse_dense(items) -> List[DenseSpec]:
    if not isinstance(items, list):
        raise SpecError("dense", "must be a list.", "e.g. dense: [{name: I1, fill: 0.0}].")
    out, seen = [], set()
    for i, d in enumerate(items):
        key = f"dense[{i}]"
        if isinstance(d, str):
            d = {"name": d}
        _keys(d, key, {"name", "column", "fill"})
        name = _name(d.get("name"), f"{key}.name")
        if name in seen:
            raise SpecError(f"{key}.name", f"duplicate dense feature {name!r}.", "give every feature a unique name.")
        seen.add(name)
        col = d.get("column", name)
        out.append(DenseSpec(name=name, column=col, fill=_float(d.get("fill", 0.0), f"{key}.fill")))
    return out


def _merge(defaults: Mapping, entry: Mapping) -> dict:
    out = copy.deepcopy(dict(defaults))
    for k, v in entry.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


_CAT_KEYS = {"name", "column", "table", "vocabulary", "delimiter", "weight_column", "sequence_length",
             "embedding_lookup_device", "tensor_core_width"}


def _parse_categorical(items, defaults) -> List[CategoricalSpec]:
    if not items or not isinstance(items, list):
        raise SpecError("categorical", "must be a non-empty list of categorical features.",
                        "e.g. categorical: [{name: C1, vocabulary: {type: frequency}}].")
    _keys(defaults, "defaults.categorical", _CAT_KEYS - {"name", "column", "table"})
    out, seen = [], set()
    for i, d in enumerate(items):
        key = f"categorical[{i}]"
        if isinstance(d, str):
            d = {"name": d}
        _keys(d, key, _CAT_KEYS)
        d = _merge(defaults, d)
        name = _name(d.get("name"), f"{key}.name")
        if name in seen:
            raise SpecError(f"{key}.name", f"duplicate categorical feature {name!r}.",
                            "give every feature a unique name (use `column:` to read one column twice).")
        seen.add(name)
        column = d.get("column", name)
        if not isinstance(column, str) or not column:
            raise SpecError(f"{key}.column", "must be a column name.", "")
        table = _name(d.get("table", name), f"{key}.table")
        delim = d.get("delimiter")
        if delim is not None and (not isinstance(delim, str) or not delim):
            raise SpecError(f"{key}.delimiter", f"{delim!r} must be a non-empty string.", "e.g. delimiter: '|'.")
        wcol = d.get("weight_column")
        if wcol is not None and (not isinstance(wcol, str) or not wcol):
            raise SpecError(f"{key}.weight_column", "must be a column name or null.", "")
        seq = _int(d.get("sequence_length", 0), f"{key}.sequence_length", minimum=0,
                   fix="0 for a bag of values, > 0 for a sequence feature.")
        device = d.get("embedding_lookup_device", "tpu_embedding_core")
        if device not in DEVICES:
            raise SpecError(f"{key}.embedding_lookup_device", f"{device!r} is not supported.",
                            f"use one of {list(DEVICES)}.")
        tcw = d.get("tensor_core_width")
        if device == "tpu_tensor_core":
            _int(tcw, f"{key}.tensor_core_width", minimum=1,
                 fix="tensor-core features need the maximum number of values per example.")
            if seq:
                raise SpecError(f"{key}.sequence_length", "tensor-core lookups do not support sequence features.",
                                "set sequence_length: 0 or embedding_lookup_device: tpu_embedding_core.")
        elif tcw is not None:
            raise SpecError(f"{key}.tensor_core_width", "only applies to embedding_lookup_device: tpu_tensor_core.",
                            "remove it.")
        vocab = _parse_vocab(d.get("vocabulary") or {}, f"{key}.vocabulary")
        out.append(CategoricalSpec(name=name, column=column, table=table, vocabulary=vocab, delimiter=delim,
                                   weight_column=wcol, sequence_length=seq, embedding_lookup_device=device,
                                   tensor_core_width=tcw))
    return out


def _parse_vocab(d, key) -> VocabularySpec:
    _keys(d, key, {"type", "top_k", "frequency_threshold", "num_oov_buckets", "num_buckets", "default_value"})
    t = d.get("type", "frequency")
    if t not in VOCAB_TYPES:
        raise SpecError(f"{key}.type", f"{t!r} is not a vocabulary type.", f"use one of {list(VOCAB_TYPES)}.")
    if t == "frequency":
        extra = sorted({"num_buckets", "default_value"} & set(d))
        if extra:
            raise SpecError(f"{key}.{extra[0]}", "only applies to identity/hashing vocabularies.",
                            "remove it, or set type: identity.")
        top_k = _int(d.get("top_k"), f"{key}.top_k", minimum=1, allow_none=True,
                     fix="a positive integer, or null for every token.")
        thr = _int(d.get("frequency_threshold"), f"{key}.frequency_threshold", minimum=0, allow_none=True,
                   fix="the minimum count (>= 0) a token needs, or null.")
        oov = _int(d.get("num_oov_buckets", 1), f"{key}.num_oov_buckets", minimum=0,
                   fix="0 drops out-of-vocabulary values (counted), N > 0 hashes them into N buckets.")
        return VocabularySpec(type=t, top_k=top_k, frequency_threshold=thr, num_oov_buckets=oov)
    extra = sorted({"top_k", "frequency_threshold", "num_oov_buckets"} & set(d))
    if extra:
        raise SpecError(f"{key}.{extra[0]}", f"does not apply to a {t} vocabulary.",
                        "remove it, or set type: frequency.")
    nb = _int(d.get("num_buckets"), f"{key}.num_buckets", minimum=1,
              fix=f"a {t} vocabulary needs num_buckets (the table's row count).")
    dv = d.get("default_value")
    if t == "hashing" and dv is not None:
        raise SpecError(f"{key}.default_value", "does not apply to hashing.", "remove it.")
    if dv is not None:
        _int(dv, f"{key}.default_value", minimum=0, fix=f"an id in [0, {nb}).")
        if dv >= nb:
            raise SpecError(f"{key}.default_value", f"{dv} is not below num_buckets={nb}.", f"use an id in [0, {nb}).")
    return VocabularySpec(type=t, num_oov_buckets=0, num_buckets=nb, default_value=dv)


def _parse_optimizer(d, key) -> dict:
    if isinstance(d, str):
        d = {"type": d}
    if not isinstance(d, Mapping) or "type" not in d:
        raise SpecError(key, f"expected a mapping with a `type`, got {d!r}.",
                        f"e.g. {{type: adagrad, learning_rate: 0.05}}; types: {sorted(OPTIMIZERS)}.")
    t = d["type"]
    if t not in OPTIMIZERS:
        raise SpecError(f"{key}.type", f"unknown optimizer {t!r}.", f"use one of {sorted(OPTIMIZERS)}.")
    from tpu_embed import optimizers as _opt
    cls = getattr(_opt, OPTIMIZERS[t])
    params = {k: v for k, v in d.items() if k != "type"}
    unknown = sorted(set(params) - set(cls._PARAMS))
    if unknown:
        raise SpecError(f"{key}.{unknown[0]}", f"not a parameter of {cls.__name__}.",
                        f"allowed: {list(cls._PARAMS)}.")
    try:
        cls(**params)
    except (TypeError, ValueError) as e:
        raise SpecError(key, f"{cls.__name__} rejects these parameters: {e}",
                        "check the values (learning_rate is required).") from None
    return {"type": t, **params}


def _parse_tables(items, defaults, categorical, optimizer) -> List[TableSpec]:
    if not isinstance(items, list):
        raise SpecError("tables", "must be a list.", "e.g. tables: [{name: C1, dim: 16}].")
    _keys(defaults, "defaults.table", {"dim", "combiner", "optimizer", "learning_rate"})
    given: Dict[str, Tuple[str, dict]] = {}
    for i, d in enumerate(items):
        key = f"tables[{i}]"
        _keys(d, key, {"name", "dim", "combiner", "optimizer", "learning_rate"})
        name = _name(d.get("name"), f"{key}.name")
        if name in given:
            raise SpecError(f"{key}.name", f"duplicate table {name!r}.", "declare each table once.")
        given[name] = (key, _merge(defaults, d))
    used = list(dict.fromkeys(f.table for f in categorical))
    for name in given:
        if name not in used:
            raise SpecError(f"{given[name][0]}.name", f"table {name!r} is used by no categorical feature.",
                            "remove it or set `table:` on a feature.")
    out = []
    for name in used:
        key, d = given.get(name, (f"defaults.table (for table {name!r})", _merge(defaults, {"name": name})))
        dim = _int(d.get("dim"), f"{key}.dim", minimum=1,
                   fix=f"set dim for table {name!r} (or defaults.table.dim).")
        comb = d.get("combiner", "mean")
        if comb not in COMBINERS:
            raise SpecError(f"{key}.combiner", f"{comb!r} is not a combiner.", f"use one of {list(COMBINERS)}.")
        opt = d.get("optimizer")
        opt = _parse_optimizer(opt, f"{key}.optimizer") if opt is not None else None
        lr = d.get("learning_rate")
        if lr is not None:
            lr = _float(lr, f"{key}.learning_rate", "a positive number")
            if lr <= 0:
                raise SpecError(f"{key}.learning_rate", f"must be > 0, got {lr}.", "")
        if opt is None and optimizer is None:
            raise SpecError(f"{key}.optimizer", f"table {name!r} has no optimizer and the spec has no `optimizer`.",
                            "add a top-level `optimizer: {type: adagrad, learning_rate: 0.05}`.")
        out.append(TableSpec(name=name, dim=dim, combiner=comb, optimizer=opt, learning_rate=lr))
    return out


def _parse_topology(d) -> Topology:
    if d is None:
        d = {"num_chips": 1}
    _keys(d, "topology", {"num_chips", "num_sc_per_chip", "num_hosts", "chips", "sc_per_chip", "hosts"})
    chips = d.get("num_chips", d.get("chips", 1))
    scs = d.get("num_sc_per_chip", d.get("sc_per_chip", 4))
    hosts = d.get("num_hosts", d.get("hosts", 1))
    for k, v in (("num_chips", chips), ("num_sc_per_chip", scs), ("num_hosts", hosts)):
        _int(v, f"topology.{k}", minimum=1, fix="a positive integer.")
    try:
        return Topology(chips, scs, hosts)
    except ValueError as e:
        raise SpecError("topology", str(e), "adjust num_chips / num_sc_per_chip / num_hosts.") from None


def _parse_limits(d) -> LimitsSpec:
    if d is None:
        return LimitsSpec()
    _keys(d, "limits", {"max_ids_per_chip_per_sample", "max_ids_per_table", "max_unique_ids_per_table",
                        "allow_id_dropping"})
    m = _int(d.get("max_ids_per_chip_per_sample", 64), "limits.max_ids_per_chip_per_sample", minimum=1,
             fix="a positive integer (TF's default is 64).")
    out = {}
    for k in ("max_ids_per_table", "max_unique_ids_per_table"):
        v = d.get(k) or {}
        if not isinstance(v, Mapping):
            raise SpecError(f"limits.{k}", "must map stacked table names to limits.",
                            "e.g. {C1_C2: 512}; `tpu-embed inspect` lists the stacks.")
        for s, n in v.items():
            _int(n, f"limits.{k}.{s}", minimum=1, fix="a positive integer.")
        out[k] = {str(s): int(n) for s, n in v.items()}
    drop = d.get("allow_id_dropping", False)
    if not isinstance(drop, bool):
        raise SpecError("limits.allow_id_dropping", f"expected true/false, got {drop!r}.", "")
    return LimitsSpec(max_ids_per_chip_per_sample=m, max_ids_per_table=out["max_ids_per_table"],
                      max_unique_ids_per_table=out["max_unique_ids_per_table"], allow_id_dropping=drop, given=True)


def _parse_policies(d) -> PoliciesSpec:
    if d is None:
        return PoliciesSpec()
    _keys(d, "policies", {"invalid_ids", "nan_weights", "tail"})
    inv = d.get("invalid_ids", "drop")
    if inv not in INVALID_ID_POLICIES:
        raise SpecError("policies.invalid_ids", f"{inv!r} is not a policy.",
                        f"use one of {list(INVALID_ID_POLICIES)} (drop counts every dropped id).")
    nan = d.get("nan_weights", "drop")
    if nan not in NAN_WEIGHT_POLICIES:
        raise SpecError("policies.nan_weights", f"{nan!r} is not a policy.", f"use one of {list(NAN_WEIGHT_POLICIES)}.")
    tail = d.get("tail", "drop")
    if tail not in TAIL_POLICIES:
        raise SpecError("policies.tail", f"{tail!r} is not a policy.", f"use one of {list(TAIL_POLICIES)}.")
    return PoliciesSpec(invalid_ids=inv, nan_weights=nan, tail=tail)


def _cross_check(spec: Spec) -> None:
    names = {}
    for d in spec.dense:
        names[d.name] = "dense"
    for i, f in enumerate(spec.categorical):
        if f.name in names:
            raise SpecError(f"categorical[{i}].name", f"{f.name!r} is also a dense feature.", "rename one of them.")
    if spec.label is not None and spec.label.column in {f.column for f in spec.categorical}:
        raise SpecError("label.column", "the label column is also a categorical feature's column.", "")
    by_table: Dict[str, List[Tuple[int, CategoricalSpec]]] = {}
    for i, f in enumerate(spec.categorical):
        by_table.setdefault(f.table, []).append((i, f))
    for table, feats in by_table.items():
        i0, f0 = feats[0]
        for i, f in feats[1:]:
            if f.vocabulary != f0.vocabulary:
                raise SpecError(f"categorical[{i}].vocabulary",
                                f"features {f0.name!r} and {f.name!r} share table {table!r} but not their "
                                "vocabulary settings.",
                                "give features of one table the same vocabulary block (they share one vocabulary).")
            if f.embedding_lookup_device != f0.embedding_lookup_device:
                raise SpecError(f"categorical[{i}].embedding_lookup_device",
                                f"features of table {table!r} disagree on the lookup device.",
                                "use the same embedding_lookup_device for all features of a table.")
    if not spec.sparse_core_features:
        raise SpecError("categorical", "no feature is looked up on SparseCore.",
                        "set embedding_lookup_device: tpu_embedding_core on at least one feature.")
