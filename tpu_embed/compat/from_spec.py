"""The seed API's objects built from a YAML spec: feature columns and an `EmbeddingConfigSpec`.

    spec = load_spec("examples/criteo/spec.yaml")
    columns = feature_columns(spec, vocab_dir)             # tpu_embed.embedding_column / shared_embedding_columns
    ecs = embedding_config_spec(spec, vocab_dir)           # EmbeddingConfigSpec of those columns

Frequency vocabularies become `categorical_column_with_vocabulary_file`
(the files `tpu-embed vocab` wrote under `vocab_dir`, one per feature),
identity and hashing features `categorical_column_with_identity` (hashing is
applied offline, so the trainer sees bucket ids).  Weighted features are
wrapped in `weighted_categorical_column`, sequence features use the
sequence_* column kinds.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

import tensorflow as tf

from tpu_embed.artifact import io as tio
from tpu_embed.artifact.manifest import read_manifest
from tpu_embed.artifact.spec import CategoricalSpec, Spec, SpecError, optimizer_kwargs, vocabulary_filename
from tpu_embed.compat.config_spec import EmbeddingConfigSpec
from tpu_embed.compat.feature_column import embedding_column, shared_embedding_columns
from tpu_embed.core import optimizers

__all__ = ["embedding_config_spec", "feature_columns"]


def feature_columns(spec: Spec, vocab_dir: Optional[str] = None,
                    vocab_sizes: Optional[Mapping[str, int]] = None) -> List[Any]:
    """The spec's seed-API columns (`embedding_column` / `shared_embedding_columns`), in spec order.

    `vocab_sizes` maps vocabulary keys to sizes; by default the manifest of
    the artifact directory `vocab_dir` lies in.
    """
    if vocab_sizes is None:
        vocab_sizes = read_manifest(tio.dirname(vocab_dir.rstrip("/"))).vocabulary_sizes if vocab_dir else {}

    def categorical(f: CategoricalSpec):
        return _categorical_column(spec, f, vocab_dir, vocab_sizes)

    columns: Dict[str, Any] = {}
    by_table: Dict[str, List[CategoricalSpec]] = {}
    for f in spec.categorical:
        by_table.setdefault(f.table, []).append(f)
    for tname, feats in by_table.items():
        t = spec.table(tname)
        if len(feats) == 1:
            f = feats[0]
            columns[f.name] = embedding_column(categorical(f), t.dim, combiner=t.combiner,
                                               max_sequence_length=f.sequence_length, **_device_kwargs(f))
        else:
            cols = shared_embedding_columns(
                [categorical(f) for f in feats], t.dim, combiner=t.combiner,
                shared_embedding_collection_name=tname,
                max_sequence_lengths=[f.sequence_length for f in feats], **_device_kwargs(feats[0]))
            for f, c in zip(feats, cols, strict=True):
                columns[f.name] = c
    return [columns[f.name] for f in spec.categorical]


def _categorical_column(spec: Spec, f: CategoricalSpec, vocab_dir: Optional[str], vocab_sizes: Mapping[str, int]):
    """The categorical column of one feature: its vocabulary file's or identity, sequence or not, weighted or not."""
    fc = tf.feature_column
    v = f.vocabulary
    seq = f.sequence_length > 0
    if v.type == "frequency":
        if vocab_dir is None:
            raise ValueError("feature_columns needs vocab_dir for frequency vocabularies.")
        if v.capacity is not None:
            # TF's vocabulary-file column puts OOV ids right after the file's lines and refuses a
            # vocabulary_size above their count; under a capacity the OOV ids start at the capacity.
            raise ValueError(f"feature {f.name!r}: its vocabulary reserves capacity={v.capacity} rows, which "
                             "categorical_column_with_vocabulary_file cannot express (OOV ids follow the file's "
                             "lines there). Feed the shards (tpu_embed.input_fn), whose ids are exact, or drop "
                             "the capacity for the feature-column API.")
        path = tio.join(vocab_dir, vocabulary_filename(f.name))
        size = int(vocab_sizes[spec.vocabulary_key(f)])
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


def _device_kwargs(f: CategoricalSpec) -> Dict[str, Any]:
    """The lookup device arguments of the feature's embedding column."""
    if f.embedding_lookup_device == "tpu_tensor_core":
        return {"embedding_lookup_device": "tpu_tensor_core",
                "tensor_core_shape": [None, f.tensor_core_width]}
    return {"embedding_lookup_device": "tpu_embedding_core"}


def embedding_config_spec(spec: Spec, vocab_dir: Optional[str] = None,
                          vocab_sizes: Optional[Mapping[str, int]] = None,
                          profile_data_directory: Optional[str] = None) -> EmbeddingConfigSpec:
    """The seed API's `EmbeddingConfigSpec` of `feature_columns(spec, vocab_dir, vocab_sizes)`.

    The columns form has one spec-wide optimizer: per-table optimizers are
    refused here (use `Spec.to_feature_config`, which honours them).
    """
    per_table = [t.name for t in spec.tables if t.optimizer]
    if per_table:
        raise SpecError(f"tables[{per_table[0]}].optimizer",
                        "EmbeddingConfigSpec's feature_columns form has one optimizer for all tables.",
                        "move the optimizer to the top-level `optimizer` key, or use "
                        "Spec.to_feature_config, which supports per-table optimizers.")
    if spec.optimizer is None:
        raise SpecError("optimizer", "EmbeddingConfigSpec needs optimization parameters.",
                        "add e.g. `optimizer: {type: adagrad, learning_rate: 0.05}`.")
    return EmbeddingConfigSpec(
        feature_columns=feature_columns(spec, vocab_dir, vocab_sizes),
        optimization_parameters=optimizers.optimizer_from_dict(optimizer_kwargs(spec.optimizer)),
        profile_data_directory=profile_data_directory or spec.profile_data_directory)
