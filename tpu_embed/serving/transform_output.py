"""An artifact's raw -> id mapping as tf.Transform output: a directory `tft.TFTransformOutput` reads.

    tpu_embed.serving.write_transform_output("build/criteo")  # -> build/criteo/transform_output
    tft_output = tft.TFTransformOutput("build/criteo/transform_output")
    layer = tft_output.transform_features_layer()           # in a TFX Trainer, or any Keras model
    out = layer({"C1": sparse_strings, "I1": ..., ...})     # the raw features of `tft_output.raw_feature_spec()`
    out["C1"]            # tf.SparseTensor int64 [batch, None]: the ids the shards hold for these rows

The directory is laid out as tensorflow-transform lays out its own (`tft_beam.WriteTransformFn`):

* `transform_fn/`: a TF2 SavedModel whose `transform_fn` maps the raw features to the transformed ones
  (`tpu_embed.serving.mapping.map_raw`, the vocabulary files as its assets), saved as TFT's
  `saved_transform_io_v2.write_v2_saved_model` saves a preprocessing function;
* `transformed_metadata/schema.pbtxt`: the transformed features, and `transformed_metadata/asset_map`
  ({vocabulary key: asset file}, so `tft_output.vocabulary_file_by_name(key)` finds each vocabulary);
* `metadata/schema.pbtxt`: the raw features (`tft_output.raw_feature_spec()`).

Raw features: every column the spec reads (label excluded) as `tf.io.VarLenFeature(tf.string)`, i.e. a
`tf.SparseTensor` [batch, None] of strings: each value's text as a CSV cell holds it (multivalent values
joined by the feature's delimiter, numbers as text, no value for a blank).

Transformed features:

* `<feature>`: int64 ids, VarLen (`tf.SparseTensor` [batch, None]), with an int domain [0, rows) (so
  `num_buckets_for_transformed_feature` gives the rows the ids index);
* `<feature>__weights`: float32, VarLen like the ids (weighted features);
* `<dense feature>`: float32 [batch];
* `__valid__`: int64 [batch], 0 where the offline jobs would not have used the record (`map_raw`'s `valid`).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict, List, Mapping, Optional

import tensorflow as tf

from tpu_embed.artifact import io as tio
from tpu_embed.artifact.load import load_artifact
from tpu_embed.artifact.spec import Spec, vocabulary_filename
from tpu_embed.serving.mapping import MappingPlan, RawFeatureMapping

__all__ = ["VALID", "WEIGHTS_SUFFIX", "raw_feature_spec", "transformed_features", "write_transform_dir",
           "write_transform_output"]

VALID = "__valid__"
WEIGHTS_SUFFIX = "__weights"
DIRECTORY = "transform_output"  # its place in an artifact


def raw_feature_spec(plan: MappingPlan) -> Dict[str, tf.io.VarLenFeature]:
    return {c: tf.io.VarLenFeature(tf.string) for c in plan.columns}


def _rows(plan: MappingPlan) -> Dict[str, int]:
    """{feature: how many ids it can give} (frequency: the vocabulary's size and its OOV buckets)."""
    out = {}
    for f in plan.features:
        if f.kind == "frequency":
            out[f.name] = int(f.vocabulary_size or 0) + f.num_oov_buckets
        else:
            out[f.name] = int(f.num_buckets or 0)
    return out


def _names(plan: MappingPlan) -> List[str]:
    names = [f.name for f in plan.features] + [f.name + WEIGHTS_SUFFIX for f in plan.features if f.weight_column]
    names += [d.name for d in plan.dense] + [VALID]
    seen = set()
    for n in names:
        if n in seen:
            raise ValueError(f"transformed feature name {n!r} is used twice: rename the feature or dense input "
                             f"whose name ends in {WEIGHTS_SUFFIX!r} or is {VALID!r}.")
        seen.add(n)
    return names


def transformed_features(mapped: Mapping[str, Any], plan: MappingPlan) -> Dict[str, Any]:
    """`map_raw`'s output as the transform's outputs (see the module docstring)."""
    out: Dict[str, Any] = {}
    for f in plan.features:
        out[f.name] = mapped["ids"][f.name].to_sparse()
        if f.weight_column:
            out[f.name + WEIGHTS_SUFFIX] = mapped["weights"][f.name].to_sparse()
    for j, d in enumerate(plan.dense):
        out[d.name] = mapped["dense"][:, j]
    out[VALID] = tf.cast(mapped["valid"], tf.int64)
    return out


def _schemas(plan: MappingPlan):
    """(raw schema, transformed schema) protos, by tensorflow-transform's own conversion."""
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tensorflow_transform.tf_metadata import schema_utils
    rows = _rows(plan)
    spec: Dict[str, Any] = {}
    domains = {}
    for f in plan.features:
        spec[f.name] = tf.io.VarLenFeature(tf.int64)
        domains[f.name] = schema_pb2.IntDomain(min=0, max=max(rows[f.name] - 1, 0), is_categorical=True)
        if f.weight_column:
            spec[f.name + WEIGHTS_SUFFIX] = tf.io.VarLenFeature(tf.float32)
    for d in plan.dense:
        spec[d.name] = tf.io.FixedLenFeature([], tf.float32)
    spec[VALID] = tf.io.FixedLenFeature([], tf.int64)
    domains[VALID] = schema_pb2.IntDomain(min=0, max=1, is_categorical=True)
    return (schema_utils.schema_from_feature_spec(raw_feature_spec(plan)),
            schema_utils.schema_from_feature_spec(spec, domains))


class _TransformModule(tf.Module):
    """What the SavedModel holds: the vocabulary tables (their files become assets) and `transform_fn`."""

    def __init__(self, plan: MappingPlan):
        super().__init__(name="tpu_embed_transform")
        self.mapping = RawFeatureMapping(plan)


def write_transform_dir(spec: Spec, vocabulary_sizes: Mapping[str, int], vocabulary_dir: str, path: str
                        ) -> List[str]:
    """Write the transform output of `spec` with its vocabularies (the manifest's sizes, `vocabulary_dir`/vocab/)
    at `path` (a local directory). Returns the files written, relative to `path`."""
    from tensorflow_transform.saved import saved_transform_io_v2
    from tensorflow_transform.tf_metadata import dataset_metadata, metadata_io
    plan = MappingPlan.from_spec(spec, vocabulary_sizes, vocabulary_dir)
    _names(plan)
    module = _TransformModule(plan)
    signature = {c: tf.SparseTensorSpec([None, None], tf.string) for c in plan.columns}

    def transform_fn(inputs):
        return transformed_features(module.mapping(inputs), plan)

    fn = tf.function(transform_fn, input_signature=[signature], autograph=False)
    saved_transform_io_v2.write_v2_saved_model(module, fn, "transform_fn", os.path.join(path, "transform_fn"))
    raw, transformed = _schemas(plan)
    metadata_io.write_metadata(dataset_metadata.DatasetMetadata(raw), os.path.join(path, "metadata"))
    metadata_io.write_metadata(dataset_metadata.DatasetMetadata(transformed),
                               os.path.join(path, "transformed_metadata"))
    assets = {key: os.path.basename(p) for key, p in sorted(plan.vocabulary_files.items())}
    with tf.io.gfile.GFile(os.path.join(path, "transformed_metadata", "asset_map"), "w") as fh:
        fh.write(json.dumps(assets, sort_keys=True))
    return sorted(os.path.relpath(os.path.join(root, n), path) for root, _, names in os.walk(path) for n in names)


def write_transform_output(artifact_dir: str, path: Optional[str] = None) -> str:
    """Write an artifact's transform output at `path` (default: `artifact_dir`/transform_output; local or an
    object store), replacing what is there. Returns `path`."""
    artifact = load_artifact(artifact_dir, verify="none")
    path = path or tio.join(artifact_dir, DIRECTORY)
    with tempfile.TemporaryDirectory(prefix="tpu_embed_transform_") as tmp:
        # The vocabulary files are read where TensorFlow can read them: a local copy.
        for feats in artifact.spec.vocabulary_groups().values():
            rel = tio.join("vocab", vocabulary_filename(feats[0].name))
            os.makedirs(os.path.join(tmp, "vocab"), exist_ok=True)
            with open(os.path.join(tmp, rel), "wb") as fh:
                fh.write(tio.read_bytes(tio.join(artifact_dir, rel)))
        local = os.path.join(tmp, DIRECTORY)
        files = write_transform_dir(artifact.spec, artifact.manifest.vocabulary_sizes, tmp, local)
        tio.delete_tree(path)
        for rel in files:
            with open(os.path.join(local, rel), "rb") as fh:
                tio.write_atomic(tio.join(path, *rel.split(os.sep)), fh.read())
    return path
