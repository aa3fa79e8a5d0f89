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

The package by job: `sections` and `vocabulary` (the schema's sections, on the
base model and field types of `fields`), `document` (`Spec`: the checks across
sections and the conversions), `normalized` (the normalized form, its
compatibility rules and the fingerprint), `errors` (`SpecError`),
`validation` (pydantic's errors as `SpecError`s) and `loading` (`load_spec`,
`parse_spec`).

It needs pydantic and pyyaml; TensorFlow is imported by
`tpu_embed.core.model.to_tf_feature_config`, where `to_feature_config` needs it.
"""

from tpu_embed.artifact.spec.document import SPEC_VERSION, Spec, optimizer_kwargs, vocabulary_filename
from tpu_embed.artifact.spec.loading import load_spec, parse_spec
from tpu_embed.artifact.spec.sections import (
    OPTIMIZERS,
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
)
from tpu_embed.artifact.spec.spec_error import SpecError
from tpu_embed.artifact.spec.vocabulary_sections import (
    VOCABULARIES,
    FrequencyVocabulary,
    HashingVocabulary,
    IdentityVocabulary,
    VocabularySpec,
)

__all__ = [
    "SPEC_VERSION", "Spec", "optimizer_kwargs", "vocabulary_filename", "SpecError", "load_spec", "parse_spec",
    "OPTIMIZERS", "CategoricalSpec", "DenseSpec", "InputsSpec", "LabelSpec", "LimitsSpec", "OptimizerSpec",
    "PartitionSpec", "PoliciesSpec", "ShardsSpec", "ShuffleSpec", "TableSpec", "TrainingSpec", "VOCABULARIES",
    "FrequencyVocabulary", "HashingVocabulary", "IdentityVocabulary", "VocabularySpec",
]
