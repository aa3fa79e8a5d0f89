"""The sections of the spec, each a pydantic model: every default is its field's, unknown keys are refused,
and a field's `fix` says how to correct a bad value. The `vocabulary` section is in `vocabulary`; the whole
spec, its `defaults` and its checks across sections in `document`."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Dict, Literal, Mapping, Optional, Tuple

from pydantic import AliasChoices, BeforeValidator, Field, PrivateAttr, model_validator

from tpu_embed.artifact.spec.fields import Count, Float, Name, NullIsDefault, PosInt, SpecModel, Str, field
from tpu_embed.artifact.spec.spec_error import SpecError, unknown_key
from tpu_embed.artifact.spec.validation import validate
from tpu_embed.artifact.spec.vocabulary_sections import FrequencyVocabulary, VocabularySpec
from tpu_embed.core import optimizers
from tpu_embed.core.topology import Topology

OPTIMIZERS = {"sgd": "StochasticGradientDescentParameters", "adagrad": "AdagradParameters",
              "adam": "AdamParameters", "ftrl": "FtrlParameters"}


class CategoricalSpec(SpecModel):
    _shorthand: ClassVar[str] = "name"
    _same_as: ClassVar[Mapping[str, str]] = {"column": "name", "table": "name"}
    name: Name
    column: Str
    table: Name
    vocabulary: VocabularySpec = field(default_factory=FrequencyVocabulary)
    delimiter: Optional[Str] = field(None, fix="e.g. delimiter: '|'.")
    weight_column: Optional[Str] = None
    sequence_length: Count = field(0, fix="0 for a bag of values, > 0 for a sequence feature.")
    embedding_lookup_device: Literal["tpu_embedding_core", "tpu_tensor_core"] = "tpu_embedding_core"
    tensor_core_width: Optional[PosInt] = field(None, fix="the maximum number of values per example.")

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


class DenseSpec(SpecModel):
    _shorthand: ClassVar[str] = "name"
    _same_as: ClassVar[Mapping[str, str]] = {"column": "name"}
    name: Name
    column: Str
    fill: Float = 0.0


class LabelSpec(SpecModel):
    _shorthand: ClassVar[str] = "column"
    column: Str = field(fix="e.g. label: {column: label}.")
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
            raise unknown_key(str(k), list(cls._PARAMS), f"not a parameter of {cls.__name__}")
        if isinstance(v, float) and not math.isfinite(v):
            raise SpecError(k, f"expected a finite number, got {v!r}.")
    try:
        cls(**params)
    except (TypeError, ValueError, ArithmeticError) as e:
        raise SpecError("", f"{cls.__name__} rejects these parameters: {e}",
                        "check the values (learning_rate is required).") from None
    return {"type": d["type"], **params}


OptimizerSpec = Annotated[Optional[Dict[str, Any]], BeforeValidator(_check_optimizer)]


class TableSpec(SpecModel):
    name: Name
    dim: PosInt = field(fix="set the table's dim (or defaults.table.dim).")
    combiner: Literal["mean", "sum", "sqrtn"] = "mean"
    optimizer: OptimizerSpec = None  # None: the spec's optimizer
    learning_rate: Optional[Annotated[float, Field(strict=True, allow_inf_nan=False, gt=0)]] = field(
        None, fix="a positive number (it overrides the optimizer's), or null.")


class _Csv(SpecModel):
    delimiter: Annotated[str, Field(strict=True, min_length=1, max_length=1)] = field(",", fix="e.g. ',' or '\\t'.")


class InputsSpec(SpecModel):
    format: Literal["csv", "tfrecord", "parquet"]
    patterns: Annotated[Tuple[Str, ...], BeforeValidator(lambda v: [v] if isinstance(v, str) else v)] = field(
        min_length=1, fix="e.g. patterns: [data/train-*.csv] (relative to the spec file), or pass --input.")
    csv: Annotated[_Csv, NullIsDefault] = Field(default_factory=_Csv)

    @property
    def csv_delimiter(self) -> str:
        return self.csv.delimiter


StackLimits = Annotated[Dict[Annotated[str, BeforeValidator(str)], PosInt], NullIsDefault, Field(
    json_schema_extra={"fix": "positive integers keyed by stacked table name, e.g. {C1_C2: 512}; "
                              "`tpu-embed inspect` lists the stacks."})]


class LimitsSpec(SpecModel):
    max_ids_per_chip_per_sample: PosInt = field(64, fix="a positive integer (TF's default is 64).")
    max_ids_per_table: StackLimits = Field(default_factory=dict)
    max_unique_ids_per_table: StackLimits = Field(default_factory=dict)
    allow_id_dropping: Annotated[bool, Field(strict=True)] = False
    _given: bool = PrivateAttr(True)

    @property
    def given(self) -> bool:
        """Whether the spec had a `limits` section (else: TF's defaults apply)."""
        return self._given


def no_limits() -> LimitsSpec:
    """The limits of a spec without a `limits` section: TF's defaults, `given` false."""
    limits = LimitsSpec()
    limits._given = False
    return limits


class PoliciesSpec(SpecModel):
    invalid_ids: Literal["drop", "error"] = field("drop", fix="use 'drop' (counts every dropped id) or 'error'.")
    nan_weights: Literal["drop", "zero", "error"] = "drop"
    tail: Literal["drop", "pad"] = "drop"
    # A file whose framing is lost mid-way (TFRecord length CRC / truncation, an unterminated CSV quote,
    # unreadable Parquet pages): error = the job fails naming file and record (default); dead_letter =
    # the rest of the file is dead-lettered, counted, and the job goes on. docs/reference/reliability.md.
    lost_framing: Literal["error", "dead_letter"] = field(
        "error", fix="use 'error' (the job fails on a file whose framing is lost) or 'dead_letter' (the rest of "
                     "that file is dead-lettered and counted).")


class TrainingSpec(SpecModel):
    # TPUEmbeddingV2(pipeline_execution_with_tensor_core=...): embedding updates one step stale.
    # Training only: not part of the fingerprint (the artifacts do not depend on it).
    pipeline_execution_with_tensor_core: Annotated[bool, Field(strict=True)] = field(
        False, fix="true lets SparseCore run ahead of the TensorCore (one-step-stale updates); default false.")


def _compression(v: Any) -> Any:
    """`shards.compression` in any case; TF's spelling ("GZIP", "ZLIB") is canonical, null means none."""
    if v is None:
        return "none"
    if isinstance(v, str):
        return {"none": "none", "gzip": "GZIP", "zlib": "ZLIB"}.get(v.lower(), v)
    return v


class ShardsSpec(SpecModel):
    # How the shard files are stored (tpu_embed.artifact.shard_format, format 2). Not part of the fingerprint: every
    # option decodes to the same tensors.
    compression: Annotated[Literal["none", "GZIP", "ZLIB"], BeforeValidator(_compression)] = field(
        "none", fix="use none, GZIP or ZLIB (any case): tf.data.TFRecordDataset's compression_type.")
    # Whose SparseCore input the records hold: TF's CSR for TPUEmbeddingV2.dequeue, jax-tpu-embedding's arrays
    # (tpu_embed.artifact.jax_records), or both. Not fingerprinted: the TF arrays are the same whichever is chosen.
    layout: Literal["tensorflow", "jax", "both"] = field(
        "tensorflow", fix="use tensorflow (TPUEmbeddingV2), jax (jax-tpu-embedding) or both.")

    @property
    def layouts(self) -> Tuple[str, ...]:
        """The shard format's `layouts` (tpu_embed.artifact.shard_format.LAYOUTS) of this choice."""
        return {"tensorflow": ("tensorflow",), "jax": ("jax",), "both": ("tensorflow", "jax")}[self.layout]


class ShuffleSpec(SpecModel):
    # Examples are permuted before batching by a seeded bijection of their global index
    # (tpu_embed.core.permutation); the seed is fingerprinted (it changes the shards).
    seed: Annotated[int, Field(strict=True, ge=0, lt=2 ** 64)] = field(
        fix="an integer in [0, 2**64), e.g. shuffle: {seed: 0}; another seed gives another order.")


class PartitionSpec(SpecModel):
    # How the vocabulary job numbers a frequency vocabulary's tokens (tpu_embed.sparsecore.balance): frequency
    # order (the hottest token id 0, as tft.vocabulary writes it), or balanced ids, chosen so that every
    # destination SparseCore of a stack receives about the same number of lookups. Fingerprinted when balanced
    # (it changes the ids); a spec without `partition` keeps its fingerprint.
    ids: Literal["frequency", "balanced"] = field(
        "frequency", fix="use frequency (the hottest token id 0, the default) or balanced (ids that spread the "
                         "lookups evenly over the SparseCores).")

    @property
    def balanced_ids(self) -> bool:
        return self.ids == "balanced"


class _TopologySpec(SpecModel):
    num_chips: PosInt = field(1, validation_alias=AliasChoices("num_chips", "chips"))
    num_sc_per_chip: PosInt = field(4, validation_alias=AliasChoices("num_sc_per_chip", "sc_per_chip"))
    num_hosts: PosInt = field(1, validation_alias=AliasChoices("num_hosts", "hosts"))


def topology_of(v: Any) -> Topology:
    """The `topology` section (null: one chip) as a `tpu_embed.core.topology.Topology`."""
    t = validate(_TopologySpec, {} if v is None else v)
    try:
        return Topology(t.num_chips, t.num_sc_per_chip, t.num_hosts)
    except ValueError as e:
        raise SpecError("", str(e), "adjust num_chips / num_sc_per_chip / num_hosts.") from None
