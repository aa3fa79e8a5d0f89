"""One declarative spec (YAML) read by the Beam jobs and by the training library.

    spec = tpu_embed.artifact.spec.load_spec("examples/criteo/spec.yaml")
    spec.fingerprint                      # sha256 of the normalized spec (goes in manifests)
    model = spec.model(vocab_sizes)       # tpu_embed.core.model.ModelConfig (no TensorFlow)
    fc = spec.to_feature_config(vocab_sizes)   # nested tf.tpu.experimental.embedding.FeatureConfig
    layout = spec.layout(vocab_sizes)     # tpu_embed.sparsecore.layout_of(spec.model(vocab_sizes))

The seed API's columns and `EmbeddingConfigSpec` of a spec are built by
`tpu_embed.compat.from_spec`.

A spec file looks like this (every key is documented in docs/reference/spec.md)::

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
    profile_candidate_chip_counts: []  # other chip counts to profile too, e.g. [8, 16]; not fingerprinted
    limits: {max_ids_per_chip_per_sample: 64, max_ids_per_table: {}, max_unique_ids_per_table: {},
             allow_id_dropping: false}
    policies: {invalid_ids: drop, nan_weights: drop, tail: drop, lost_framing: error}
    training: {pipeline_execution_with_tensor_core: false}   # TPUEmbeddingV2 flag; not fingerprinted
    shards: {compression: none,        # none | GZIP | ZLIB (shard files); not fingerprinted
             layout: tensorflow}       # tensorflow | jax | both: whose SparseCore input arrays the records hold
    partition: {ids: frequency}        # or balanced: ids that spread the lookups evenly over the SparseCores

The format is a set of pydantic models: every default is the default of its
field, unknown keys are refused (with the allowed key a misspelled one is
closest to: "did you mean 'top_k'?").  Validation errors are `SpecError`s whose
message names the key (e.g. ``categorical[3].vocabulary.top_k``) and says how
to fix it (the field's ``fix``); `load_spec`'s name the file too, and the line
of the key where the file has it (YAML errors: line and column).

This module needs pydantic and pyyaml; TensorFlow is imported by
`tpu_embed.core.model.to_tf_feature_config`, where `to_feature_config` needs it.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from typing import (
    Annotated,
    Any,
    ClassVar,
    Dict,
    List,
    Literal,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Type,
    Union,
    get_args,
)

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    PrivateAttr,
    Tag,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticUndefined, PydanticUseDefault

from tpu_embed.artifact import io as tio
from tpu_embed.core import optimizers
from tpu_embed.core.canonical import fingerprint as _fingerprint
from tpu_embed.core.model import FeatureConfig, ModelConfig, OptimizerConfig, TableConfig, to_tf_feature_config
from tpu_embed.core.topology import Topology
from tpu_embed.sparsecore.layout import SparseCoreLayout, layout_of

SPEC_VERSION = 1
OPTIMIZERS = {"sgd": "StochasticGradientDescentParameters", "adagrad": "AdagradParameters",
              "adam": "AdamParameters", "ftrl": "FtrlParameters"}


class SpecError(ValueError):
    """A spec is invalid. The message names the key and the fix, and `where` (the file, and its line where
    known) when it came from one: `<file>, line 18: spec key 'global_batch_sise': unknown key; ...`.
    `FILE_KEY` stands for the file as a whole (missing, not YAML): no key is named."""

    FILE_KEY = "<file>"

    def __init__(self, key: str, problem: str, fix: str = "", where: Optional[str] = None):
        self.key, self.problem, self.fix, self.where = key, problem, fix, where
        super().__init__((f"{where}: " if where else "") + (f"spec key '{key}': " if key != self.FILE_KEY else "")
                         + problem + (f" Fix: {fix}" if fix else ""))

    def __reduce__(self):  # Beam sends errors between processes: rebuild from the parts, not the message
        return (SpecError, (self.key, self.problem, self.fix, self.where))


def _unknown_key(key: str, allowed: Sequence[str], problem: str = "unknown key") -> SpecError:
    """`key` (its last part the unknown name) is not among `allowed`: with the allowed key it is closest to
    ("did you mean 'top_k'?"), else every allowed key."""
    name = key.rsplit(".", 1)[-1]
    by_lower = {a.lower(): a for a in allowed}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    if close:
        right = by_lower[close[0]]
        return SpecError(key, f"{problem}; did you mean '{right}'?",
                         f"rename it to {right} (the allowed keys are in docs/reference/spec.md).")
    return SpecError(key, f"{problem}.", f"allowed keys are {sorted(allowed)}.")


# ---------------------------------------------------------------- field types

def _field(default: Any = PydanticUndefined, fix: str = "", **kw: Any) -> Any:
    """A field whose validation errors carry the hint `fix`."""
    return Field(default, json_schema_extra={"fix": fix}, **kw)


def _null_is_default(v: Any) -> Any:
    if v is None:
        raise PydanticUseDefault()
    return v


NullIsDefault = BeforeValidator(_null_is_default)  # `key: null` means the field's default
PosInt = Annotated[int, Field(strict=True, ge=1)]
Count = Annotated[int, Field(strict=True, ge=0)]
Float = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Str = Annotated[str, Field(strict=True, min_length=1)]
Name = Annotated[str, Field(strict=True, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$", json_schema_extra={
    "fix": "use letters, digits, '_', '.', '-' (it becomes a file name and a TF name)."})]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    _shorthand: ClassVar[str] = ""  # a bare string `s` means {_shorthand: s}
    _same_as: ClassVar[Mapping[str, str]] = {}  # {field: the field whose value it defaults to}

    @model_validator(mode="before")
    @classmethod
    def _expand(cls, data: Any) -> Any:
        if cls._shorthand and isinstance(data, str):
            data = {cls._shorthand: data}
        if cls._same_as and isinstance(data, Mapping):
            data = {**{k: data[src] for k, src in cls._same_as.items() if src in data}, **data}
        return data

    def to_dict(self) -> dict:
        return self.model_dump(mode="json")


# ---------------------------------------------------------------- the sections

class FrequencyVocabulary(_Model):
    type: Literal["frequency"] = "frequency"
    top_k: Optional[PosInt] = _field(None, fix="a positive integer, or null for every token.")
    frequency_threshold: Optional[Count] = _field(None, fix="the minimum count (>= 0) a token needs, or null.")
    num_oov_buckets: Count = _field(
        1, fix="0 drops out-of-vocabulary values (counted), N > 0 hashes them into N buckets.")
    # Daily retraining (docs/how-to/daily-retraining.md): rebuild recounts from scratch; append keeps a base
    # artifact's ids and gives new tokens the next ones; frozen keeps the base's vocabulary as it is.
    mode: Literal["rebuild", "append", "frozen"] = _field(
        "rebuild", fix="use rebuild (recount, the default), append (keep the base's ids, add new tokens) or frozen "
                       "(the base's vocabulary as it is).")
    capacity: Optional[PosInt] = _field(
        None, fix="the table rows reserved for tokens (the OOV buckets come after them), or null to let the "
                  "vocabulary grow.")
    num_buckets: ClassVar[None] = None
    default_value: ClassVar[None] = None

    @model_validator(mode="after")
    def _capacity_rules(self) -> "FrequencyVocabulary":
        if self.capacity is not None and self.mode == "rebuild":
            raise SpecError("capacity", "only applies to mode: append or frozen (rows reserved across a lineage).",
                            "set mode: append, or remove capacity (top_k caps a rebuilt vocabulary).")
        if self.capacity is not None and self.top_k is not None and self.top_k > self.capacity:
            raise SpecError("top_k", f"{self.top_k} is more than capacity={self.capacity} (the vocabulary never "
                            "holds more tokens than its capacity).", "lower top_k, or raise capacity.")
        return self

    def to_dict(self) -> dict:
        """Without `mode` and `capacity` when they are the defaults (the normalized form of earlier specs)."""
        d = super().to_dict()
        if d["mode"] == "rebuild" and d["capacity"] is None:
            del d["mode"], d["capacity"]
        return d


class IdentityVocabulary(_Model):
    type: Literal["identity"]
    num_buckets: PosInt = _field(fix="an identity vocabulary needs num_buckets (the table's row count).")
    default_value: Optional[Count] = _field(None, fix="the id for invalid values, or null (policies.invalid_ids).")
    top_k: ClassVar[None] = None
    frequency_threshold: ClassVar[None] = None
    num_oov_buckets: ClassVar[int] = 0
    mode: ClassVar[str] = "rebuild"  # no vocabulary: the ids are stable already
    capacity: ClassVar[None] = None

    @model_validator(mode="after")
    def _default_below_num_buckets(self) -> "IdentityVocabulary":
        if self.default_value is not None and self.default_value >= self.num_buckets:
            raise SpecError("default_value", f"{self.default_value} is not below num_buckets={self.num_buckets}.",
                            f"use an id in [0, {self.num_buckets}).")
        return self


class HashingVocabulary(_Model):
    type: Literal["hashing"]
    num_buckets: PosInt = _field(fix="a hashing vocabulary needs num_buckets (the table's row count).")
    top_k: ClassVar[None] = None
    frequency_threshold: ClassVar[None] = None
    num_oov_buckets: ClassVar[int] = 0
    mode: ClassVar[str] = "rebuild"  # no vocabulary: the ids are stable already
    capacity: ClassVar[None] = None
    default_value: ClassVar[None] = None


VOCABULARIES: Dict[str, Type[BaseModel]] = {
    "frequency": FrequencyVocabulary, "identity": IdentityVocabulary, "hashing": HashingVocabulary}


def _vocabulary_type(v: Any) -> Optional[str]:
    if not isinstance(v, Mapping):
        return getattr(v, "type", None)
    t = v.get("type", FrequencyVocabulary.model_fields["type"].default)
    return t if isinstance(t, str) else repr(t)


VocabularySpec = Annotated[Union[Annotated[FrequencyVocabulary, Tag("frequency")],
                                 Annotated[IdentityVocabulary, Tag("identity")],
                                 Annotated[HashingVocabulary, Tag("hashing")]],
                           Discriminator(_vocabulary_type), NullIsDefault]


class CategoricalSpec(_Model):
    _shorthand: ClassVar[str] = "name"
    _same_as: ClassVar[Mapping[str, str]] = {"column": "name", "table": "name"}
    name: Name
    column: Str
    table: Name
    vocabulary: VocabularySpec = _field(default_factory=FrequencyVocabulary)
    delimiter: Optional[Str] = _field(None, fix="e.g. delimiter: '|'.")
    weight_column: Optional[Str] = None
    sequence_length: Count = _field(0, fix="0 for a bag of values, > 0 for a sequence feature.")
    embedding_lookup_device: Literal["tpu_embedding_core", "tpu_tensor_core"] = "tpu_embedding_core"
    tensor_core_width: Optional[PosInt] = _field(None, fix="the maximum number of values per example.")

    @property
    def on_sparse_core(self) -> bool:
        return self.embedding_lookup_device == "tpu_embedding_core"

    @model_validator(mode="after")
    def _tensor_core_rules(self) -> "CategoricalSpec":
        if self.on_sparse_core and self.tensor_core_width is not None:
            raise SpecError("tensor_core_width", "only applies to embedding_lookup_device: tpu_tensor_core.",
                            "remove it.")
        if not self.on_sparse_core and self.tensor_core_width is None:
            raise SpecError("tensor_core_width", "expected an integer, got None.",
                            "tensor-core features need the maximum number of values per example.")
        if not self.on_sparse_core and self.sequence_length:
            raise SpecError("sequence_length", "tensor-core lookups do not support sequence features.",
                            "set sequence_length: 0 or embedding_lookup_device: tpu_embedding_core.")
        return self


class DenseSpec(_Model):
    _shorthand: ClassVar[str] = "name"
    _same_as: ClassVar[Mapping[str, str]] = {"column": "name"}
    name: Name
    column: Str
    fill: Float = 0.0


class LabelSpec(_Model):
    _shorthand: ClassVar[str] = "column"
    column: Str = _field(fix="e.g. label: {column: label}.")
    fill: Optional[Float] = None  # None: a blank label sends the record to the dead letters


def _check_optimizer(d: Any) -> Any:
    """`{type: kind, **parameters}` (or a bare kind), checked by the seed-API class; keys are relative."""
    if isinstance(d, str):
        d = {"type": d}
    if d is not None and (not isinstance(d, Mapping) or "type" not in d):
        raise SpecError("", f"expected a mapping with a `type`, got {d!r}.",
                        f"e.g. {{type: adagrad, learning_rate: 0.05}}; types: {sorted(OPTIMIZERS)}.")
    if d is None:
        return None
    if not isinstance(d["type"], str) or d["type"] not in OPTIMIZERS:
        raise SpecError("type", f"unknown optimizer {d['type']!r}.", f"use one of {sorted(OPTIMIZERS)}.")
    cls = getattr(optimizers, OPTIMIZERS[d["type"]])
    params = {k: v for k, v in d.items() if k != "type"}
    for k, v in params.items():
        if k not in cls._PARAMS:
            raise _unknown_key(str(k), list(cls._PARAMS), f"not a parameter of {cls.__name__}")
        if isinstance(v, float) and not math.isfinite(v):
            raise SpecError(k, f"expected a finite number, got {v!r}.")
    try:
        cls(**params)
    except (TypeError, ValueError, ArithmeticError) as e:
        raise SpecError("", f"{cls.__name__} rejects these parameters: {e}",
                        "check the values (learning_rate is required).") from None
    return {"type": d["type"], **params}


OptimizerSpec = Annotated[Optional[Dict[str, Any]], BeforeValidator(_check_optimizer)]


class TableSpec(_Model):
    name: Name
    dim: PosInt = _field(fix="set the table's dim (or defaults.table.dim).")
    combiner: Literal["mean", "sum", "sqrtn"] = "mean"
    optimizer: OptimizerSpec = None  # None: the spec's optimizer
    learning_rate: Optional[Annotated[float, Field(strict=True, allow_inf_nan=False, gt=0)]] = _field(
        None, fix="a positive number (it overrides the optimizer's), or null.")


class _Csv(_Model):
    delimiter: Annotated[str, Field(strict=True, min_length=1, max_length=1)] = _field(",", fix="e.g. ',' or '\\t'.")


class InputsSpec(_Model):
    format: Literal["csv", "tfrecord", "parquet"]
    patterns: Annotated[Tuple[Str, ...], BeforeValidator(lambda v: [v] if isinstance(v, str) else v)] = _field(
        min_length=1, fix="e.g. patterns: [data/train-*.csv] (relative to the spec file), or pass --input.")
    csv: Annotated[_Csv, NullIsDefault] = Field(default_factory=_Csv)

    @property
    def csv_delimiter(self) -> str:
        return self.csv.delimiter


StackLimits = Annotated[Dict[Annotated[str, BeforeValidator(str)], PosInt], NullIsDefault, Field(
    json_schema_extra={"fix": "positive integers keyed by stacked table name, e.g. {C1_C2: 512}; "
                              "`tpu-embed inspect` lists the stacks."})]


class LimitsSpec(_Model):
    max_ids_per_chip_per_sample: PosInt = _field(64, fix="a positive integer (TF's default is 64).")
    max_ids_per_table: StackLimits = Field(default_factory=dict)
    max_unique_ids_per_table: StackLimits = Field(default_factory=dict)
    allow_id_dropping: Annotated[bool, Field(strict=True)] = False
    _given: bool = PrivateAttr(True)

    @property
    def given(self) -> bool:
        """Whether the spec had a `limits` section (else: TF's defaults apply)."""
        return self._given


def _no_limits() -> LimitsSpec:
    limits = LimitsSpec()
    limits._given = False
    return limits


class PoliciesSpec(_Model):
    invalid_ids: Literal["drop", "error"] = _field("drop", fix="use 'drop' (counts every dropped id) or 'error'.")
    nan_weights: Literal["drop", "zero", "error"] = "drop"
    tail: Literal["drop", "pad"] = "drop"
    # A file whose framing is lost mid-way (TFRecord length CRC / truncation, an unterminated CSV quote,
    # unreadable Parquet pages): error = the job fails naming file and record (default); dead_letter =
    # the rest of the file is dead-lettered, counted, and the job goes on. docs/reference/reliability.md.
    lost_framing: Literal["error", "dead_letter"] = _field(
        "error", fix="use 'error' (the job fails on a file whose framing is lost) or 'dead_letter' (the rest of "
                     "that file is dead-lettered and counted).")


class TrainingSpec(_Model):
    # TPUEmbeddingV2(pipeline_execution_with_tensor_core=...): embedding updates one step stale.
    # Training only: not part of the fingerprint (the artifacts do not depend on it).
    pipeline_execution_with_tensor_core: Annotated[bool, Field(strict=True)] = _field(
        False, fix="true lets SparseCore run ahead of the TensorCore (one-step-stale updates); default false.")


def _compression(v: Any) -> Any:
    """`shards.compression` in any case; TF's spelling ("GZIP", "ZLIB") is canonical, null means none."""
    if v is None:
        return "none"
    if isinstance(v, str):
        return {"none": "none", "gzip": "GZIP", "zlib": "ZLIB"}.get(v.lower(), v)
    return v


class ShardsSpec(_Model):
    # How the shard files are stored (tpu_embed.artifact.shard_format, format 2). Not part of the fingerprint: every
    # option decodes to the same tensors.
    compression: Annotated[Literal["none", "GZIP", "ZLIB"], BeforeValidator(_compression)] = _field(
        "none", fix="use none, GZIP or ZLIB (any case): tf.data.TFRecordDataset's compression_type.")
    # Whose SparseCore input the records hold: TF's CSR for TPUEmbeddingV2.dequeue, jax-tpu-embedding's arrays
    # (tpu_embed.jax.records), or both. Not fingerprinted: the TF arrays are the same whichever is chosen.
    layout: Literal["tensorflow", "jax", "both"] = _field(
        "tensorflow", fix="use tensorflow (TPUEmbeddingV2), jax (jax-tpu-embedding) or both.")

    @property
    def layouts(self) -> Tuple[str, ...]:
        """The shard format's `layouts` (tpu_embed.artifact.shard_format.LAYOUTS) of this choice."""
        return {"tensorflow": ("tensorflow",), "jax": ("jax",), "both": ("tensorflow", "jax")}[self.layout]


class ShuffleSpec(_Model):
    # Examples are permuted before batching by a seeded bijection of their global index
    # (tpu_embed.core.permutation); the seed is fingerprinted (it changes the shards).
    seed: Annotated[int, Field(strict=True, ge=0, lt=2 ** 64)] = _field(
        fix="an integer in [0, 2**64), e.g. shuffle: {seed: 0}; another seed gives another order.")


class PartitionSpec(_Model):
    # How the vocabulary job numbers a frequency vocabulary's tokens (tpu_embed.sparsecore.balance): frequency
    # order (the hottest token id 0, as tft.vocabulary writes it), or balanced ids, chosen so that every
    # destination SparseCore of a stack receives about the same number of lookups. Fingerprinted when balanced
    # (it changes the ids); a spec without `partition` keeps its fingerprint.
    ids: Literal["frequency", "balanced"] = _field(
        "frequency", fix="use frequency (the hottest token id 0, the default) or balanced (ids that spread the "
                         "lookups evenly over the SparseCores).")

    @property
    def balanced_ids(self) -> bool:
        return self.ids == "balanced"


class _TopologySpec(_Model):
    num_chips: PosInt = _field(1, validation_alias=AliasChoices("num_chips", "chips"))
    num_sc_per_chip: PosInt = _field(4, validation_alias=AliasChoices("num_sc_per_chip", "sc_per_chip"))
    num_hosts: PosInt = _field(1, validation_alias=AliasChoices("num_hosts", "hosts"))


def _topology(v: Any) -> Topology:
    t = _validate(_TopologySpec, {} if v is None else v)
    try:
        return Topology(t.num_chips, t.num_sc_per_chip, t.num_hosts)
    except ValueError as e:
        raise SpecError("", str(e), "adjust num_chips / num_sc_per_chip / num_hosts.") from None


def _keys(cls: Type[BaseModel]) -> List[str]:
    """The keys a section accepts: its field names, or their aliases."""
    return [str(a) for n, f in cls.model_fields.items() for a in getattr(f.validation_alias, "choices", [n])]


class _Defaults(_Model):
    categorical: Annotated[Dict[str, Any], NullIsDefault] = Field(default_factory=dict)
    table: Annotated[Dict[str, Any], NullIsDefault] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_keys(self) -> "_Defaults":
        vocab = self.categorical.get("vocabulary")
        for key, d, allowed in (
                ("categorical", self.categorical, set(_keys(CategoricalSpec)) - {"name", "column", "table"}),
                ("categorical.vocabulary", vocab if isinstance(vocab, Mapping) else {},
                 {k for c in VOCABULARIES.values() for k in _keys(c)}),
                ("table", self.table, set(_keys(TableSpec)) - {"name"})):
            for k in d:
                if k not in allowed:
                    raise _unknown_key(f"{key}.{k}", sorted(allowed))
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
        kind = VOCABULARIES.get(_vocabulary_type(_merge(vocab, entry["vocabulary"])) or "")
        if kind is not None:
            defaults = {**defaults, "vocabulary": {k: v for k, v in vocab.items() if k in kind.model_fields}}
    return _merge(defaults, entry)


# ---------------------------------------------------------------- the spec

class Spec(_Model):
    version: Literal[1] = _field(SPEC_VERSION, fix=f"use version: {SPEC_VERSION}.")
    inputs: InputsSpec = _field(fix="add `inputs: {format: csv, patterns: [data/*.csv]}`.")
    label: Optional[LabelSpec] = None
    dense: Annotated[Tuple[DenseSpec, ...], NullIsDefault] = _field((), fix="e.g. dense: [{name: I1, fill: 0.0}].")
    defaults: Annotated[_Defaults, NullIsDefault] = Field(default_factory=_Defaults, repr=False)
    optimizer: OptimizerSpec = None  # for tables without their own
    categorical: Tuple[CategoricalSpec, ...] = _field(
        min_length=1, fix="e.g. categorical: [{name: C1, vocabulary: {type: frequency}}].")
    tables: Annotated[Tuple[TableSpec, ...], NullIsDefault] = _field((), fix="e.g. tables: [{name: C1, dim: 16}].")
    topology: Annotated[Topology, PlainValidator(_topology)] = Field(default_factory=lambda: _topology(None))
    global_batch_size: PosInt = _field(fix="set global_batch_size to a positive integer.")
    profile_data_directory: Optional[Annotated[str, Field(strict=True)]] = "profiles"
    # Other chip counts (same global batch) the profile also computes figures for; not fingerprinted (the shards
    # do not depend on it).  Each one re-partitions every step, so none by default.
    profile_candidate_chip_counts: Annotated[Tuple[PosInt, ...], NullIsDefault] = _field(
        (), fix="a list of chip counts, e.g. [8, 16]; `tpu-embed plan --spec` can then plan those topologies.")
    limits: Annotated[LimitsSpec, NullIsDefault] = Field(default_factory=_no_limits)
    policies: Annotated[PoliciesSpec, NullIsDefault] = Field(default_factory=PoliciesSpec)
    shuffle: Optional[ShuffleSpec] = None  # None: (input file, record) order
    epochs: PosInt = _field(1, fix="a positive integer (epochs > 1 needs `shuffle`).")
    training: Annotated[TrainingSpec, NullIsDefault] = Field(default_factory=TrainingSpec)
    shards: Annotated[ShardsSpec, NullIsDefault] = Field(default_factory=ShardsSpec)
    partition: Annotated[PartitionSpec, NullIsDefault] = Field(default_factory=PartitionSpec)
    name: Annotated[str, Field(strict=True)] = "spec"
    # The previous artifact of the lineage (vocabulary modes append / frozen), relative to the spec file;
    # `--base` overrides it. Not fingerprinted: like `inputs`, it says where data lives.
    base: Optional[Str] = _field(None, fix="the path of the previous day's artifact directory, or null.")
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
            t = self.tables[given[name]] if name in given else _validate(
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
        """The normalized spec: every default filled in, lists in spec order (manifests and fingerprints)."""
        d = self.model_dump(mode="json", exclude={"defaults", "topology", "limits", "partition"})
        for f in d["categorical"]:  # the vocabulary mode only when not rebuild: older fingerprints are unchanged
            v = f["vocabulary"]
            if v.get("mode") == "rebuild" and v.get("capacity") is None:
                del v["mode"], v["capacity"]
        limits = self.limits.model_dump(mode="json")
        for k in ("max_ids_per_table", "max_unique_ids_per_table"):
            limits[k] = dict(sorted(limits[k].items()))
        return {"version": SPEC_VERSION, "name": self.name, "inputs": d["inputs"], "label": d["label"],
                "dense": d["dense"], "categorical": d["categorical"], "tables": d["tables"],
                "optimizer": d["optimizer"], "topology": self.topology.to_dict(),
                "global_batch_size": self.global_batch_size, "profile_data_directory": self.profile_data_directory,
                # only when given: the normalized form of specs without candidates is unchanged
                **({"profile_candidate_chip_counts": list(self.profile_candidate_chip_counts)}
                   if self.profile_candidate_chip_counts else {}),
                "limits": limits if self.limits.given else None, "policies": d["policies"],
                "training": d["training"],
                # shards.layout only when not the default: the normalized form of earlier specs is unchanged
                "shards": {k: v for k, v in d["shards"].items() if k != "layout" or v != "tensorflow"},
                # only when given: the normalized form of specs without a base is unchanged
                **({"base": self.base} if self.base is not None else {}),
                # shuffle/epochs only when shuffled: the fingerprints of unshuffled specs are unchanged
                **({"shuffle": d["shuffle"], "epochs": self.epochs} if self.shuffle is not None else {}),
                # partition only when its ids are balanced: the normalized form of earlier specs is unchanged
                **({"partition": self.partition.to_dict()} if self.partition.balanced_ids else {})}

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
        d = self.to_dict()
        d.pop("inputs")
        d.pop("name")
        d.pop("profile_data_directory")
        d.pop("profile_candidate_chip_counts", None)
        d.pop("training")
        d.pop("shards")
        d.pop("base", None)
        return _fingerprint(d)

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


# ---------------------------------------------------------------- loading, and pydantic errors as SpecErrors

_PROBLEMS = {  # pydantic error type -> problem (others: pydantic's message)
    "missing": "missing.", "extra_forbidden": "unknown key.", "too_short": "must not be empty.",
    "int_type": "expected an integer, got {input!r}.", "float_type": "expected a finite number, got {input!r}.",
    "finite_number": "expected a finite number, got {input!r}.", "bool_type": "expected true/false, got {input!r}.",
    "string_type": "expected a string, got {input!r}.", "string_too_short": "must not be empty.",
    "string_too_long": "{input!r} must be a single character.",
    "string_pattern_mismatch": "{input!r} is not a valid name.",
    "greater_than_equal": "must be >= {ge}, got {input!r}.", "greater_than": "must be > {gt}, got {input!r}.",
    "literal_error": "{input!r} is not supported.", "tuple_type": "must be a list, got {input!r}.",
    "dict_type": "expected a mapping, got {input!r}.", "model_type": "expected a mapping, got {input!r}.",
    "union_tag_not_found": "expected a mapping, got {input!r}.",
    "union_tag_invalid": "{tag!r} is not a vocabulary type."}


def _models_in(tp: Any) -> List[Any]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for a in get_args(tp) for m in _models_in(a)]


def _locate(root: Any, loc: Tuple[Any, ...]) -> Tuple[str, Any, str]:
    """pydantic's `loc` as a spec key (`categorical[3].vocabulary.top_k`), the innermost model, the nearest fix."""
    key, model, fix, tp = "", root, "", root
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
            continue
        models = _models_in(tp)
        if part in VOCABULARIES and VOCABULARIES[part] in models:  # the tag of the vocabulary union: no key
            model = tp = VOCABULARIES[part]
            continue
        key, model, tp = f"{key}.{part}" if key else str(part), models[0] if models else model, None
        for name, f in model.model_fields.items() if models else ():
            if part == name or part in getattr(f.validation_alias, "choices", ()):
                tp, fix = f.annotation, (f.json_schema_extra or {}).get("fix") or fix
    return key, model, fix


def _spec_error(error: ValidationError, root: Any, prefix: str = "") -> SpecError:
    """The first error of `error` as a SpecError keyed `prefix` + its location, with the field's fix; but an
    unknown key before a missing one (`global_batch_sise` explains a missing `global_batch_size`)."""
    errors = error.errors(include_url=False)
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    e = unknown[0] if unknown and any(e["type"] == "missing" for e in errors) else errors[0]
    where, model, fix = _locate(root, e["loc"])
    key = ".".join(k for k in (prefix, where) if k).replace(".[", "[")
    ctx, kind = e.get("ctx") or {}, e["type"]
    inner = ctx.get("error")
    if isinstance(inner, SpecError):  # raised by a validator, keyed relative to where it ran
        return SpecError(".".join(k for k in (key, inner.key) if k) or "<root>", inner.problem, inner.fix)
    if kind == "extra_forbidden":
        owner = [t for t, c in VOCABULARIES.items() if key.rsplit(".", 1)[-1] in c.model_fields]
        vtype = [t for t, c in VOCABULARIES.items() if c is model]
        if vtype and owner:
            return SpecError(key, f"does not apply to a {vtype[0]} vocabulary.", f"remove it, or set type: {owner[0]}.")
        return _unknown_key(key or "<root>", _keys(model))
    elif kind.startswith("union_tag"):
        key, fix = key + ".type" * (kind == "union_tag_invalid"), f"use one of {list(VOCABULARIES)}."
    elif kind == "literal_error" and not fix:
        fix = f"use one of {ctx.get('expected')}."
    try:
        problem = str(inner) if inner is not None else _PROBLEMS[kind].format(input=e.get("input"), **ctx)
    except (KeyError, IndexError, ValueError):
        problem = e["msg"] + "."
    return SpecError(key or "<root>", problem, fix)


def _validate(model: Any, data: Any, prefix: str = "") -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _spec_error(e, model, prefix) from None


def load_spec(path: str) -> Spec:
    """Read and validate a YAML spec file. Relative input patterns resolve against its directory.

    Args:
      path: the spec file (local path or object-store URL).

    Returns:
      The validated `Spec`.

    Raises:
      SpecError: the file is missing, not valid YAML, or not a valid spec; the message names the
        key and the fix.
    """
    try:
        text = tio.read_text(path)
    except FileNotFoundError:
        raise SpecError(SpecError.FILE_KEY, "the spec file does not exist.", "pass the path of a YAML spec.",
                        where=path) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise _yaml_error(path, e) from None
    where = path if tio.is_url(path) else os.path.abspath(path)
    try:
        return parse_spec(raw, base_dir=tio.dirname(where), source_path=where)
    except SpecError as e:
        line = _line_of(text, e.key)
        raise SpecError(e.key, e.problem, e.fix, where=path + (f", line {line}" if line else "")) from None


def _yaml_error(path: str, e: yaml.YAMLError) -> SpecError:
    """A YAML syntax error as one line naming the file, the line and column, and what the parser expected."""
    mark = getattr(e, "problem_mark", None)
    where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else path
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    context, at = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and at is not None:
        problem += f" ({context} at line {at.line + 1}, column {at.column + 1})"
    return SpecError(SpecError.FILE_KEY, f"not valid YAML: {' '.join(problem.split())}.", "fix the YAML syntax there.",
                     where=where)


_KEY_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _line_of(text: str, key: str) -> Optional[int]:
    """The line (1-based) of spec key `key` (`categorical[3].vocabulary.top_k`) in the YAML `text`: of its deepest
    part the file has (a missing key: its section's), None if not even the first."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for name, index in _KEY_PART.findall(key):
        nxt = None
        if isinstance(node, yaml.MappingNode) and name:
            nxt = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == name), None)
        elif isinstance(node, yaml.SequenceNode) and index and int(index) < len(node.value):
            item = node.value[int(index)]
            nxt = (item, item)
        if nxt is None:
            break
        line, node = nxt[0].start_mark.line + 1, nxt[1]
    return line


def parse_spec(raw: Any, base_dir: str = ".", source_path: Optional[str] = None) -> Spec:
    """Validate a spec given as a dict (the parsed YAML).

    Args:
      raw: the spec as a mapping.
      base_dir: the directory relative input patterns resolve against.
      source_path: the file the spec came from, for messages.

    Returns:
      The validated `Spec`.

    Raises:
      SpecError: not a valid spec; the message names the key and the fix.
    """
    if not isinstance(raw, Mapping):
        raise SpecError("<root>", f"the spec must be a mapping, got {type(raw).__name__}.",
                        "see docs/reference/spec.md for the layout.")
    spec = _validate(Spec, raw)
    spec._base_dir, spec._source_path = base_dir, source_path
    return spec
