"""The transform graph of a spec, built from the spec alone: the `transform_fn` SavedModel of its transform output.

    python -m tpu_embed.serving.transform_graph SPEC_YAML OUT_DIR    # -> OUT_DIR/saved_model.pb

`tpu_embed.serving.tft_output` runs this in a child process (a job that writes an artifact does not
import TensorFlow) and keeps the graph in its cache; it writes each artifact's transform output from it
without TensorFlow. What makes one graph serve every artifact of a spec:

* it is a TF1 SavedModel as tensorflow-transform writes its own (`saved_transform_io.
  write_saved_transform_from_session`: tag "transform", signature "transform_signature"; `tft.TFTransformOutput`
  loads it under TF2 as well): one GraphDef, no function names or object ids that change from process to
  process, so the same spec gives the same bytes;
* a frequency vocabulary's first OOV id is its capacity, or its table's size when the graph runs (the lines of
  its file: the manifest's size where there is no capacity), not a constant of one day;
* each vocabulary table's shared name is a marker (`tft_output.vocabulary_marker`) of the same length as
  the sha256 the writer puts in its place: tables over different files never share a resource in a process
  that loads two days' graphs (TensorFlow would refuse the second day's data), tables over equal files do;
* the vocabulary files are the assets `vocab/<file>` (empty here); the writer puts the artifact's files there.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any, Dict, Mapping

import tensorflow as tf
import yaml

from tpu_embed.artifact.spec import Spec, parse_spec
from tpu_embed.serving import tft_output as out
from tpu_embed.serving.mapping import map_raw, vocabulary_tables
from tpu_embed.serving.rules import MappingPlan

__all__ = ["build", "transformed_features"]


def transformed_features(mapped: Mapping[str, Any], plan: MappingPlan) -> Dict[str, Any]:
    """`map_raw`'s output as the transform's outputs (`tft_output`'s module docstring)."""
    features: Dict[str, Any] = {}
    for f in plan.features:
        features[f.name] = mapped["ids"][f.name].to_sparse()
        if f.weight_column:
            features[f.name + out.WEIGHTS_SUFFIX] = mapped["weights"][f.name].to_sparse()
    for j, d in enumerate(plan.dense):
        features[d.name] = mapped["dense"][:, j]
    features[out.VALID] = tf.cast(mapped["valid"], tf.int64)
    return features


def build(spec: Spec, directory: str) -> None:
    """Write the transform graph of `spec` at `directory` (a new local directory; its saved_model.pb is what
    the writer uses). Paths inside the graph are relative to the current directory, which gets `vocab/`."""
    from tensorflow_transform.saved import saved_transform_io
    plan = MappingPlan.structure(spec)
    out.transformed_names(plan)
    keys = sorted(plan.vocabulary_files)
    for key in keys:  # the builder copies each asset from its path: empty stand-ins of the day's files
        os.makedirs(os.path.dirname(plan.vocabulary_files[key]), exist_ok=True)
        open(plan.vocabulary_files[key], "wb").close()
    with tf.Graph().as_default():
        inputs = {c: tf.compat.v1.sparse_placeholder(tf.string, [None, None]) for c in plan.columns}
        tables = vocabulary_tables(plan, {key: out.vocabulary_marker(i) for i, key in enumerate(keys)})
        outputs = transformed_features(map_raw(inputs, plan, tables), plan)
        with tf.compat.v1.Session() as session:
            saved_transform_io.write_saved_transform_from_session(session, inputs, outputs, directory)


def main(argv) -> int:
    if len(argv) != 2:
        print("usage: python -m tpu_embed.serving.transform_graph SPEC_YAML OUT_DIR", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as fh:
        spec = parse_spec(yaml.safe_load(fh), source_path=argv[0])
    directory = os.path.abspath(argv[1])
    with tempfile.TemporaryDirectory(prefix="tpu_embed_transform_graph_") as work:
        os.chdir(work)  # the graph names its assets `vocab/<file>`, not this directory
        build(spec, directory)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
