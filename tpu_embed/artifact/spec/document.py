"""The whole spec: `Spec`, its `defaults` section, the checks across sections, what is derived from it, and
its conversions (the normalized form and fingerprint, `ModelConfig`, TF's feature configs, the layout)."""

from __future__ import annotations

import os
from typing import Annotated, Any, Dict, List, Literal, Mapping, Optional, Sequence, Tuple

import yaml
from pydantic import Field, PlainValidator, PrivateAttr, model_validator

from tpu_embed.artifact import io as tio
from tpu_embed.artifact.spec.fields import NullIsDefault, PosInt, SpecModel, Str, field, section_keys
from tpu_embed.artifact.spec.normalized import fingerprint_of, normalize
from tpu_embed.artifact.spec.sections import (
    CategoricalSpec,
    DenseSpec,
    InputsSpec,
    LabelSpec,
    LimitsSpec,
    OptimizerSpec,
    PartitionSpec,
    PoliciesSpec,
    ShardsSpec,
    ShuffleSpec,
    TableSpec,
    TrainingSpec,
    no_limits,
    topology_of,
)
from tpu_embed.artifact.spec.spec_error import SpecError, unknown_key
from tpu_embed.artifact.spec.validation import validate
from tpu_embed.artifact.spec.vocabulary_sections import VOCABULARIES, FrequencyVocabulary, vocabulary_type
from tpu_embed.core import optimizers
from tpu_embed.core.model import FeatureConfig, ModelConfig, OptimizerConfig, TableConfig, to_tf_feature_config
from tpu_embed.core.topology import Topology
from tpu_embed.sparsecore.layout import SparseCoreLayout, layout_of

SPEC_VERSION = 1


class _Defaults(SpecModel):
    categorical: Annotated[Dict[str, Any], NullIsDefault] = Field(default_factory=dict)
    table: Annotated[Dict[str, Any], NullIsDefault] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_keys(self) -> "_Defaults":
        vocab = self.categorical.get("vocabulary")
        for key, d, allowed in (
                ("categorical", self.categorical, set(section_keys(CategoricalSpec)) - {"name", "column", "table"}),
                ("categorical.vocabulary", vocab if isinstance(vocab, Mapping) else {},
                 {k for c in VOCABULARIES.values() for k in section_keys(c)}),
                ("table", self.table, set(section_keys(TableSpec)) - {"name"})):
            for k in d:
                if k not in allowed:
                    raise unknown_key(f"{key}.{k}", sorted(allowed))
        return self


def _merge(defaults: Mapping, entry: Mapping) -> dict:
    out = dict(defaults)
    for k, v in entry.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def _with_defaults(defaults: Mapping, entry: Any) -> Any:
    """`defaults.categorical` under an entry; vocabulary defaults only where they apply to its vocabulary type."""
    entry = {"name": entry} if isinstance(entry, str) else entry
    if not isinstance(entry, Mapping):
        return entry
    vocab = defaults.get("vocabulary")
    if isinstance(vocab, Mapping) and isinstance(entry.get("vocabulary"), Mapping):
        kind = VOCABULARIES.get(vocabulary_type(_merge(vocab, entry["vocabulary"])) or "")
        if kind is not None:
            defaults = {**defaults, "vocabulary": {k: v for k, v in vocab.items() if k in kind.model_fields}}
    return _merge(defaults, entry)


class Spec(SpecModel):
    version: Literal[1] = field(SPEC_VERSION, fix=f"use version: {SPEC_VERSION}.")
    inputs: InputsSpec = field(fix="add `inputs: {format: csv, patterns: [data/*.csv]}`.")
    label: Optional[LabelSpec] = None
    dense: Annotated[Tuple[DenseSpec, ...], NullIsDefault] = field((), fix="e.g. dense: [{name: I1, fill: 0.0}].")
    defaults: Annotated[_Defaults, NullIsDefault] = Field(default_factory=_Defaults, repr=False)
    optimizer: OptimizerSpec = None  # for tables without their own
    categorical: Tuple[CategoricalSpec, ...] = field(
        min_length=1, fix="e.g. categorical: [{name: C1, vocabulary: {type: frequency}}].")
    tables: Annotated[Tuple[TableSpec, ...], NullIsDefault] = field((), fix="e.g. tables: [{name: C1, dim: 16}].")
    topology: Annotated[Topology, PlainValidator(topology_of)] = Field(default_factory=lambda: topology_of(None))
    global_batch_size: PosInt = field(fix="set global_batch_size to a positive integer.")
    profile_data_directory: Optional[Annotated[str, Field(strict=True)]] = "profiles"
    # Other chip counts (same global batch) the profile also computes figures for; not fingerprinted (the shards
    # do not depend on it).  Each one re-partitions every step, so none by default.
    profile_candidate_chip_counts: Annotated[Tuple[PosInt, ...], NullIsDefault] = field(
        (), fix="a list of chip counts, e.g. [8, 16]; `tpu-embed plan --spec` can then plan those topologies.")
    limits: Annotated[LimitsSpec, NullIsDefault] = Field(default_factory=no_limits)
    policies: Annotated[PoliciesSpec, NullIsDefault] = Field(default_factory=PoliciesSpec)
    shuffle: Optional[ShuffleSpec] = None  # None: (input file, record) order
    epochs: PosInt = field(1, fix="a positive integer (epochs > 1 needs `shuffle`).")
    training: Annotated[TrainingSpec, NullIsDefault] = Field(default_factory=TrainingSpec)
    shards: Annotated[ShardsSpec, NullIsDefault] = Field(default_factory=ShardsSpec)
    partition: Annotated[PartitionSpec, NullIsDefault] = Field(default_factory=PartitionSpec)
    name: Annotated[str, Field(strict=True)] = "spec"
    # The previous artifact of the lineage (vocabulary modes append / frozen), relative to the spec file;
    # `--base` overrides it. Not fingerprinted: like `inputs`, it says where data lives.
    base: Optional[Str] = field(None, fix="the path of the previous day's artifact directory, or null.")
    _base_dir: str = PrivateAttr(".")
    _source_path: Optional[str] = PrivateAttr(None)

    @model_validator(mode="before")
    @classmethod
    def _apply_defaults(cls, raw: Any) -> Any:
        defaults = raw.get("defaults") if isinstance(raw, Mapping) else None
        if not isinstance(defaults, Mapping):
            return raw  # nothing to merge, or the `defaults` field reports what is wrong
        cat, table = defaults.get("categorical"), defaults.get("table")
        raw = dict(raw)
        if isinstance(cat, Mapping) and isinstance(raw.get("categorical"), list):
            raw["categorical"] = [_with_defaults(cat, e) for e in raw["categorical"]]
        if isinstance(table, Mapping) and isinstance(raw.get("tables"), list):
            raw["tables"] = [_merge(table, t) if isinstance(t, Mapping) else t for t in raw["tables"]]
        return raw

    @model_validator(mode="after")
    def _cross_check(self) -> "Spec":
        seen: Dict[str, str] = {}  # feature name -> section
        for section, names, fix in (
                ("dense", [d.name for d in self.dense], "give every feature a unique name."),
                ("categorical", [f.name for f in self.categorical],
                 "give every feature a unique name (use `column:` to read one column twice).")):
            for i, name in enumerate(names):
                if name in seen:
                    raise SpecError(f"{section}[{i}].name", f"duplicate {section} feature {name!r}." if
                                    seen[name] == section else f"{name!r} is also a dense feature.",
                                    fix if seen[name] == section else "rename one of them.")
                seen[name] = section
        object.__setattr__(self, "tables", self._used_tables())  # still validating: the only assignment
        chips, scs = self.topology.num_chips, self.topology.num_sc_per_chip
        if self.global_batch_size % chips:
            raise SpecError("global_batch_size", f"{self.global_batch_size} is not divisible by topology.num_chips="
                            f"{chips}.", f"use a multiple of {chips * scs}.")
        if self.per_chip_batch_size % scs:
            raise SpecError("global_batch_size", f"the per-chip batch {self.per_chip_batch_size} is not divisible by "
                            f"num_sc_per_chip={scs} (SparseCores split a chip's batch evenly).",
                            f"use a multiple of {chips * scs}.")
        if self.shards.layout != "tensorflow" and scs not in (2, 4):
            raise SpecError("shards.layout", f"jax-tpu-embedding supports 2 or 4 SparseCores per device, not "
                            f"topology.num_sc_per_chip={scs}.", "set num_sc_per_chip to 4 (TPU v5p) or 2 (v6e), or "
                            "use layout: tensorflow.")
        if self.label is not None and self.label.column in {f.column for f in self.categorical}:
            raise SpecError("label.column", "the label column is also a categorical feature's column.")
        first: Dict[str, CategoricalSpec] = {}
        for i, f in enumerate(self.categorical):
            f0 = first.setdefault(f.table, f)
            if f.vocabulary != f0.vocabulary:
                raise SpecError(f"categorical[{i}].vocabulary", f"features {f0.name!r} and {f.name!r} share table "
                                f"{f.table!r} but not their vocabulary settings.",
                                "give features of one table the same vocabulary block (they share one vocabulary).")
            if f.embedding_lookup_device != f0.embedding_lookup_device:
                raise SpecError(f"categorical[{i}].embedding_lookup_device", f"features of table {f.table!r} "
                                "disagree on the lookup device.",
                                "use the same embedding_lookup_device for all features of a table.")
        if not self.sparse_core_features:
            raise SpecError("categorical", "no feature is looked up on SparseCore.",
                            "set embedding_lookup_device: tpu_embedding_core on at least one feature.")
        if self.epochs > 1 and self.shuffle is None:
            raise SpecError("epochs", f"epochs: {self.epochs} without `shuffle` would write the same steps "
                            f"{self.epochs} times.", "add `shuffle: {seed: 0}` (each epoch is shuffled differently), "
                            "or set epochs: 1 and repeat the dataset when training (`input_fn(...).repeat()`).")
        return self

    def _used_tables(self) -> Tuple[TableSpec, ...]:
        """One table per `table:` name in order of first use; undeclared ones from `defaults.table`."""
        given: Dict[str, int] = {}
        for i, t in enumerate(self.tables):
            if t.name in given:
                raise SpecError(f"tables[{i}].name", f"duplicate table {t.name!r}.", "declare each table once.")
            given[t.name] = i
        used = list(dict.fromkeys(f.table for f in self.categorical))
        for name, i in given.items():
            if name not in used:
                raise SpecError(f"tables[{i}].name", f"table {name!r} is used by no categorical feature.",
                                "remove it or set `table:` on a feature.")
        out = []
        for name in used:
            key = f"tables[{given[name]}]" if name in given else f"defaults.table (for table {name!r})"
            t = self.tables[given[name]] if name in given else validate(
                TableSpec, {"name": name, **self.defaults.table}, key)
            if t.optimizer is None and self.optimizer is None:
                raise SpecError(f"{key}.optimizer", f"table {name!r} has no optimizer and the spec has no "
                                "`optimizer`.", "add a top-level `optimizer: {type: adagrad, learning_rate: 0.05}`.")
            out.append(t)
        return tuple(out)

    # -- derived ------------------------------------------------------------

    @property
    def base_dir(self) -> str:
        """The directory relative input patterns resolve against."""
        return self._base_dir

    @property
    def source_path(self) -> Optional[str]:
        return self._source_path

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

    def _resolve(self, p: str) -> str:
        if tio.is_absolute(p):
            return p
        return tio.join(self.base_dir, p) if tio.is_url(self.base_dir) else os.path.normpath(
            os.path.join(self.base_dir, p))

    def input_patterns(self) -> List[str]:
        return [self._resolve(p) for p in self.inputs.patterns]

    def base_artifact(self) -> Optional[str]:
        """`base`, resolved against the spec file's directory (None: no base)."""
        return None if self.base is None else self._resolve(self.base)

    def lineage_groups(self) -> Dict[str, List[CategoricalSpec]]:
        """The `vocabulary_groups` of mode append or frozen (those a base artifact continues)."""
        return {k: fs for k, fs in self.vocabulary_groups().items() if fs[0].vocabulary.mode != "rebuild"}

    def required_columns(self) -> List[str]:
        cols = [self.label.column] if self.label is not None else []
        cols += [d.column for d in self.dense]
        for f in self.categorical:
            cols += [f.column, f.weight_column] if f.weight_column else [f.column]
        return list(dict.fromkeys(cols))

    def table_vocabulary_size(self, table: str, vocab_sizes: Mapping[str, int]) -> int:
        """Rows of `table`: vocabulary size + OOV buckets, or the bucket count."""
        f = next(f for f in self.categorical if f.table == table)
        if not isinstance(f.vocabulary, FrequencyVocabulary):
            return f.vocabulary.num_buckets
        key = self.vocabulary_key(f)
        if key not in vocab_sizes:
            raise KeyError(f"No vocabulary size for {key!r}: run `tpu-embed vocab` first and pass the sizes from "
                           "its manifest (tpu_embed.artifact.manifest.read_manifest(artifact_dir).vocabulary_sizes).")
        return max(1, int(vocab_sizes[key]) + f.vocabulary.num_oov_buckets)

    # -- normalization and fingerprint ---------------------------------------

    def to_dict(self) -> dict:
        """The normalized spec: every default filled in, lists in spec order (manifests and fingerprints).

        Keys added to the format later are left out while they hold the value that means "not used"
        (`tpu_embed.artifact.spec.normalized.COMPATIBILITY_RULES`): a spec that does not use them keeps the
        normalized form and fingerprint it had before they existed.
        """
        d = self._every_key()
        normalize(d)
        return d

    def _every_key(self) -> dict:
        """Every key of the spec with its value, in the order of the normalized spec."""
        d = self.model_dump(mode="json", exclude={"defaults", "topology", "limits"})
        limits = self.limits.model_dump(mode="json")
        for k in ("max_ids_per_table", "max_unique_ids_per_table"):
            limits[k] = dict(sorted(limits[k].items()))
        return {"version": SPEC_VERSION, "name": self.name, "inputs": d["inputs"], "label": d["label"],
                "dense": d["dense"], "categorical": d["categorical"], "tables": d["tables"],
                "optimizer": d["optimizer"], "topology": self.topology.to_dict(),
                "global_batch_size": self.global_batch_size, "profile_data_directory": self.profile_data_directory,
                "profile_candidate_chip_counts": list(self.profile_candidate_chip_counts),
                "limits": limits if self.limits.given else None, "policies": d["policies"],
                "training": d["training"], "shards": d["shards"], "base": self.base, "shuffle": d["shuffle"],
                "epochs": self.epochs, "partition": d["partition"]}

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None, width=110)

    @property
    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of `to_dict()` without where the data lives.

        `inputs` (where the data lives and how it is encoded: patterns, format, csv
        options), `base` (where the previous artifact of a lineage lives: the manifest's `lineage` records
        which one it was), `name`, `profile_data_directory`, `profile_candidate_chip_counts`, `training` and
        `shards` (how the shard files are stored; every option decodes to the same tensors) are left out: the
        same spec run on another copy of the data -- CSV or Parquet or TFRecord --
        (or by the training job, which does not read raw data) has the same fingerprint.
        """
        return fingerprint_of(self.to_dict())

    def with_inputs(self, patterns: Sequence[str], base_dir: Optional[str] = None) -> "Spec":
        """A copy reading other files (e.g. `--input` on the command line)."""
        patterns = [patterns] if isinstance(patterns, str) else patterns
        spec = self.model_copy(update={"inputs": self.inputs.model_copy(update={"patterns": tuple(patterns)})})
        spec._base_dir = base_dir if base_dir is not None else os.getcwd()
        return spec

    # -- conversions -----------------------------------------------------------

    def optimizer_parameters(self, table: TableSpec):
        """The seed API parameter object (tpu_embed.core.optimizers) of a table."""
        d = table.optimizer or self.optimizer
        return None if d is None else optimizers.optimizer_from_dict(optimizer_kwargs(d))

    def output_shape(self, feature: CategoricalSpec) -> List[int]:
        b = self.per_chip_batch_size
        return [b, feature.sequence_length] if feature.sequence_length > 0 else [b]

    def model(self, vocab_sizes: Mapping[str, int]) -> ModelConfig:
        """The SparseCore features as a `tpu_embed.core.model.ModelConfig` (no TensorFlow import).

        Features in sorted name order (how TF flattens the dict `to_feature_config`
        returns); features of one table share one `TableConfig`, whose optimizer is
        the table's (or the spec's) with the table's `learning_rate` if it has one.
        `vocab_sizes` maps vocabulary keys to sizes (`read_manifest(artifact_dir).vocabulary_sizes`).
        """
        tables: Dict[str, TableConfig] = {}
        features = []
        for f in sorted(self.sparse_core_features, key=lambda f: f.name):
            if f.table not in tables:
                tables[f.table] = self.table_config(f.table, vocab_sizes)
            features.append(FeatureConfig(f.name, tables[f.table], tuple(self.output_shape(f)), f.sequence_length))
        return ModelConfig(tuple(features), self.topology)

    def table_config(self, name: str, vocab_sizes: Mapping[str, int]) -> TableConfig:
        """Table `name` as a `tpu_embed.core.model.TableConfig`: rows from the vocabulary, the table's (or the
        spec's) optimizer with the table's `learning_rate` if it has one (tensor-core tables too)."""
        t = self.table(name)
        opt = OptimizerConfig.from_dict(optimizer_kwargs(t.optimizer or self.optimizer or {}))
        opt = opt if t.learning_rate is None else opt.with_learning_rate(t.learning_rate)
        return TableConfig(t.name, self.table_vocabulary_size(t.name, vocab_sizes), t.dim, t.combiner, opt)

    def to_feature_config(self, vocab_sizes: Mapping[str, int]) -> Dict[str, Any]:
        """{feature: tf.tpu.experimental.embedding.FeatureConfig} of `model(vocab_sizes)`, for TPUEmbeddingV2."""
        return to_tf_feature_config(self.model(vocab_sizes))

    def layout(self, vocab_sizes: Mapping[str, int]) -> SparseCoreLayout:
        """The SparseCore stacking of `model(vocab_sizes)` (`tpu_embed.sparsecore.layout_of`; numpy only)."""
        return layout_of(self.model(vocab_sizes))


def vocabulary_filename(feature: str) -> str:
    return f"{feature}.txt"


def optimizer_kwargs(d: Mapping[str, Any]) -> dict:
    """A spec optimizer `{type: kind, **parameters}` as the seed API's `{"optimizer": kind, **parameters}`."""
    d = dict(d)
    return {"optimizer": d.pop("type"), **d}
