"""An artifact's raw -> id mapping as tf.Transform output: a directory `tft.TFTransformOutput` reads.

    tpu_embed.serving.write_transform_output("build/criteo")  # -> build/criteo/transform_output
    tft_output = tft.TFTransformOutput("build/criteo/transform_output")
    layer = tft_output.transform_features_layer()           # in a TFX Trainer, or any Keras model
    out = layer({"C1": sparse_strings, "I1": ..., ...})     # the raw features of `tft_output.raw_feature_spec()`
    out["C1"]            # tf.SparseTensor int64 [batch, None]: the ids the shards hold for these rows

`tpu-embed run` writes it into every artifact (`transform_output/`; `--no-transform-output` leaves it out).
The directory is laid out as tensorflow-transform lays out its own (`tft_beam.WriteTransformFn`):

* `transform_fn/`: a SavedModel whose "transform_signature" maps the raw features to the transformed ones
  (`tpu_embed.serving.mapping.map_raw`), the vocabulary files as its assets;
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

This module does not import TensorFlow. The graph of `transform_fn` depends on the spec alone
(`tpu_embed.serving.transform_graph`, which says how): `TransformGraph` takes it from a cache
(`cache_directory()`) or from a base artifact's transform output, or builds it once in a child process with
TensorFlow; writing an artifact's
transform output then puts the sha256 of each of its vocabulary files into the graph's table names, copies
the files as assets and writes the schemas, a few file writes. The same artifact gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata as importlib_metadata
from typing import Dict, List, Mapping, Optional

from tpu_embed.artifact import io as tio
from tpu_embed.artifact.load import load_artifact
from tpu_embed.artifact.manifest import ManifestError, read_manifest
from tpu_embed.artifact.spec import Spec
from tpu_embed.serving.rules import MappingPlan, check_vocabulary_files

__all__ = ["DIRECTORY", "TransformGraph", "TransformOutputError", "VALID", "WEIGHTS_SUFFIX", "cache_directory",
           "schema_texts", "transformed_names", "vocabulary_marker", "write_transform_output"]

VALID = "__valid__"
WEIGHTS_SUFFIX = "__weights"
DIRECTORY = "transform_output"  # its place in an artifact
CACHE_ENV = "TPU_EMBED_CACHE_DIR"
MARKER_PREFIX = "tpu_embed_vocabulary_"
GRAPH_RECORD = "transform_fn/assets.extra/tpu_embed_transform_graph.json"
# The sources the graph is made from: a change to any of them is another graph (another cache entry).
_GRAPH_SOURCES = ("rules.py", "columns.py", "feature_layout.py", "token_ids.py", "mapping.py", "number_text.py",
                  "transform_graph.py", "tft_output.py")
_NICE = 19  # the child that builds a graph takes what CPU a job leaves

log = logging.getLogger("tpu_embed.serving")


class TransformOutputError(RuntimeError):
    """The transform output could not be written (its one-line message says why and what to do)."""


def vocabulary_marker(index: int) -> str:
    """The shared name of the `index`-th vocabulary table (vocabulary keys sorted) in a spec's graph: replaced,
    byte for byte, by `MARKER_PREFIX` + the sha256 of the artifact's file (64 hex digits, as the index here)."""
    return f"{MARKER_PREFIX}{index:064x}"


def transformed_names(plan: MappingPlan) -> List[str]:
    """The transformed features' names, checked distinct."""
    names = [f.name for f in plan.features] + [f.name + WEIGHTS_SUFFIX for f in plan.features if f.weight_column]
    names += [d.name for d in plan.dense] + [VALID]
    seen = set()
    for n in names:
        if n in seen:
            raise TransformOutputError(f"transformed feature name {n!r} is used twice: rename the feature or dense "
                                       f"input whose name ends in {WEIGHTS_SUFFIX!r} or is {VALID!r}, or run with "
                                       "--no-transform-output.")
        seen.add(n)
    return names


# ---------------------------------------------------------------- the graph: cached, or built in a child

def cache_directory() -> str:
    """Where built graphs are kept: $TPU_EMBED_CACHE_DIR (a local directory or an object store's, e.g. one that
    every machine that launches the jobs shares), else $XDG_CACHE_HOME/tpu_embed, else ~/.cache/tpu_embed."""
    if os.environ.get(CACHE_ENV):
        return os.environ[CACHE_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tpu_embed")


def _version(package: str) -> str:
    try:
        return importlib_metadata.version(package)
    except importlib_metadata.PackageNotFoundError:
        return "absent"


def graph_key(spec: Spec) -> str:
    """sha256 of what a spec's graph is made from: its plan without vocabularies, the sources that build it and
    the versions of TensorFlow and tensorflow-transform."""
    here = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    h.update(MappingPlan.structure(spec).fingerprint().encode())
    for name in _GRAPH_SOURCES:
        with open(os.path.join(here, name), "rb") as fh:
            h.update(hashlib.sha256(fh.read()).digest())
    h.update(f"tensorflow {_version('tensorflow')} tensorflow-transform {_version('tensorflow-transform')}".encode())
    return h.hexdigest()


class TransformGraph:
    """The `transform_fn` graph of a spec (saved_model.pb's bytes): from the cache, else from the transform output
    of `base` (an earlier artifact of the spec, e.g. the previous day of a lineage) when a graph of the same key
    wrote it, else built by `python -m tpu_embed.serving.transform_graph` in a child process started here, at
    the lowest CPU priority, so that a job goes on beside it (`result()` waits for it). A graph that did not come
    from the cache is put there; a cache that cannot be written is logged and left."""

    def __init__(self, spec: Spec, base: Optional[str] = None):
        transformed_names(MappingPlan.structure(spec))  # refused here, before a job that would write it runs
        self.spec = spec
        self.key = graph_key(spec)
        self.path = tio.join(cache_directory(), "transform_graphs", self.key, "saved_model.pb")
        self._proc: Optional[subprocess.Popen] = None
        self._work: Optional[str] = None
        self._data: Optional[bytes] = None
        self.source = "cache"  # "cache" | "base" | "built"
        if tio.exists(self.path):
            return
        self._data = graph_of_artifact(base, spec, self.key) if base is not None else None
        if self._data is not None:
            self.source = "base"
            self._keep(self._data)
        else:
            self.source = "built"
            self._start()

    @property
    def cached(self) -> bool:
        return self.source == "cache"

    def _keep(self, data: bytes) -> None:
        try:
            tio.write_atomic(self.path, data)
        except OSError as e:  # a read-only home, a full disk: the run goes on without the cache
            log.warning("transform graph not cached at %s (%s); the next run of this spec builds it again",
                        self.path, e)

    def _start(self) -> None:
        self._work = tempfile.mkdtemp(prefix="tpu_embed_transform_graph_")
        spec_path = os.path.join(self._work, "spec.yaml")
        with open(spec_path, "w", encoding="utf-8") as fh:
            fh.write(self.spec.to_yaml())
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), TF_CPP_MIN_LOG_LEVEL="2")
        code = ("import os, runpy, sys\n"
                f"if hasattr(os, 'nice'): os.nice({_NICE})\n"
                "sys.argv = ['transform_graph'] + sys.argv[1:]\n"
                "runpy.run_module('tpu_embed.serving.transform_graph', run_name='__main__')\n")
        with open(os.path.join(self._work, "log"), "wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", code, spec_path, os.path.join(self._work, "graph")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self._work)

    def result(self) -> bytes:
        """The graph's bytes (waits for the child that builds it; then kept in the cache)."""
        if self._proc is not None:
            status = self._proc.wait()
            work, self._proc = str(self._work), None
            try:
                built = os.path.join(work, "graph", "saved_model.pb")
                if status != 0 or not os.path.exists(built):
                    with open(os.path.join(work, "log"), "rb") as fh:
                        lines = [x for x in fh.read().decode("utf-8", "replace").splitlines() if x.strip()]
                    raise TransformOutputError(
                        f"building the transform graph failed (exit status {status}): "
                        f"{lines[-1].strip() if lines else 'no output'}")
                with open(built, "rb") as fh:
                    data = fh.read()
                _check_markers(data, len(MappingPlan.structure(self.spec).vocabulary_files))
                self._data = data
                self._keep(data)
                return data
            finally:
                shutil.rmtree(work, ignore_errors=True)
        if self._data is not None:
            return self._data
        return tio.read_bytes(self.path)

    def cancel(self) -> None:
        """Stop the child (a job that failed does not need the graph)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None
            shutil.rmtree(str(self._work), ignore_errors=True)


def graph_of_artifact(artifact_dir: str, spec: Spec, key: str) -> Optional[bytes]:
    """The graph of `spec` as the transform output of the artifact at `artifact_dir` holds it, its tables' names
    put back to the markers; None where that output is missing, was written from a graph of another key, or its
    tables' names cannot be told apart (two vocabulary files with the same bytes)."""
    root = tio.join(artifact_dir, DIRECTORY)
    try:
        record = json.loads(tio.read_bytes(tio.join(root, GRAPH_RECORD)))
        if record.get("graph") != key:
            return None
        sha = {f.path: f.sha256 for f in read_manifest(artifact_dir).files if f.kind == "transform_output"}
        graph = tio.read_bytes(tio.join(root, "transform_fn", "saved_model.pb"))
        if hashlib.sha256(graph).hexdigest() != sha.get(f"{DIRECTORY}/transform_fn/saved_model.pb"):
            return None
    except (OSError, ValueError, ManifestError):
        return None
    structure = MappingPlan.structure(spec)
    assets = [f"{DIRECTORY}/transform_fn/assets/{os.path.basename(structure.vocabulary_files[k])}"
              for k in sorted(structure.vocabulary_files)]
    names = [MARKER_PREFIX + str(sha.get(a)) for a in assets]
    if len(set(names)) != len(names) or any(graph.count(n.encode()) != 1 for n in names):
        return None
    for i, name in enumerate(names):
        graph = graph.replace(name.encode(), vocabulary_marker(i).encode())
    return graph


def _check_markers(graph: bytes, vocabularies: int) -> None:
    for i in range(vocabularies):
        n = graph.count(vocabulary_marker(i).encode())
        if n != 1:
            raise TransformOutputError(f"the transform graph holds vocabulary marker {i} {n} times, not once: "
                                       f"delete {cache_directory()}/transform_graphs and run again.")


# ---------------------------------------------------------------- schemas

def schema_texts(plan: MappingPlan, rows: Mapping[str, int]) -> Dict[str, str]:
    """{"metadata": raw schema, "transformed_metadata": transformed schema}, as text protos, as
    tensorflow-transform's `schema_utils.schema_from_feature_spec` makes them from the feature specs (raw:
    VarLen strings; ids: VarLen int64 with the domain [0, rows); weights: VarLen float32; dense: float32 []; valid:
    int64 [] in [0, 1])."""
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2

    def var_len(name: str, kind: int, domain=None):
        f = schema_pb2.Feature(name=name, type=kind)
        if domain is not None:
            f.int_domain.CopyFrom(domain)
        return f

    def fixed(name: str, kind: int, domain=None):
        f = schema_pb2.Feature(name=name, type=kind, presence=schema_pb2.FeaturePresence(min_fraction=1.0),
                               shape=schema_pb2.FixedShape())
        if domain is not None:
            f.int_domain.CopyFrom(domain)
        return f

    raw = {c: var_len(c, schema_pb2.BYTES) for c in plan.columns}
    transformed = {}
    for f in plan.features:
        transformed[f.name] = var_len(f.name, schema_pb2.INT, schema_pb2.IntDomain(
            min=0, max=max(rows[f.name] - 1, 0), is_categorical=True))
        if f.weight_column:
            transformed[f.name + WEIGHTS_SUFFIX] = var_len(f.name + WEIGHTS_SUFFIX, schema_pb2.FLOAT)
    for d in plan.dense:
        transformed[d.name] = fixed(d.name, schema_pb2.FLOAT)
    transformed[VALID] = fixed(VALID, schema_pb2.INT, schema_pb2.IntDomain(min=0, max=1, is_categorical=True))
    out = {}
    for directory, features in (("metadata", raw), ("transformed_metadata", transformed)):
        schema = schema_pb2.Schema(feature=[features[k] for k in sorted(features)])
        out[directory] = text_format.MessageToString(schema)
    return out


def _rows(plan: MappingPlan) -> Dict[str, int]:
    """{feature: how many ids it can give} (frequency: the vocabulary's size and its OOV buckets)."""
    return {f.name: (int(f.vocabulary_size or 0) + f.num_oov_buckets) if f.kind == "frequency"
            else int(f.num_buckets or 0) for f in plan.features}


# ---------------------------------------------------------------- the directory

def transform_output_files(artifact_dir: str, spec: Spec, vocabulary_sizes: Mapping[str, int],
                           transform_graph: TransformGraph) -> Dict[str, bytes]:
    """{path relative to the transform output: bytes} of an artifact (its spec, its manifest's vocabulary sizes,
    its vocabulary files, checked against its manifest as training checks them: `ArtifactDamagedError`) from its
    spec's graph."""
    check_vocabulary_files(artifact_dir, read_manifest(artifact_dir), spec)
    graph = transform_graph.result()
    structure = MappingPlan.structure(spec)
    plan = MappingPlan.from_spec(spec, vocabulary_sizes, "")
    files: Dict[str, bytes] = {}
    assets = {}
    _check_markers(graph, len(structure.vocabulary_files))
    for i, key in enumerate(sorted(structure.vocabulary_files)):
        rel = structure.vocabulary_files[key]  # vocab/<file>
        data = tio.read_bytes(tio.join(artifact_dir, rel))
        capacity = next(f.vocabulary_size for f in structure.features if f.vocabulary_key == key)
        lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
        if capacity is None and lines != vocabulary_sizes[key]:
            # The graph takes the table's size (the file's lines) as the first OOV id.
            raise TransformOutputError(f"{tio.join(artifact_dir, rel)} has {lines} lines but the manifest says "
                                       f"vocabulary {key!r} has {vocabulary_sizes[key]}: the artifact is damaged; "
                                       f"run the vocabulary job again.")
        graph = graph.replace(vocabulary_marker(i).encode(),
                              (MARKER_PREFIX + hashlib.sha256(data).hexdigest()).encode())
        name = os.path.basename(rel)
        files[f"transform_fn/assets/{name}"] = data
        assets[key] = name
    files["transform_fn/saved_model.pb"] = graph
    for directory, text in schema_texts(plan, _rows(plan)).items():
        files[f"{directory}/schema.pbtxt"] = text.encode("utf-8")
    files["transformed_metadata/asset_map"] = json.dumps(assets, sort_keys=True).encode("utf-8")
    # Beside the SavedModel, where its loaders do not look: the graph's key, so a later run of the spec with this
    # artifact as its base takes the graph from here (`graph_of_artifact`).
    files[GRAPH_RECORD] = json.dumps({"graph": transform_graph.key}, sort_keys=True).encode("utf-8")
    return files


def write_transform_output(artifact_dir: str, path: Optional[str] = None,
                           graph: Optional[TransformGraph] = None) -> str:
    """Write an artifact's transform output at `path` (default: `artifact_dir`/transform_output; local or an
    object store), replacing what is there. `graph`: its spec's `TransformGraph` if one was started already.
    Returns `path`. A vocabulary file that is not as the manifest lists it (size, sha256) raises
    `tpu_embed.artifact.verify.ArtifactDamagedError` and nothing is written."""
    artifact = load_artifact(artifact_dir, verify="none")
    check_vocabulary_files(artifact_dir, artifact.manifest, artifact.spec)  # before a graph is built for it
    path = path or tio.join(artifact_dir, DIRECTORY)
    graph = graph or TransformGraph(artifact.spec)
    files = transform_output_files(artifact_dir, artifact.spec, artifact.manifest.vocabulary_sizes, graph)
    tio.delete_tree(path)
    for rel, data in sorted(files.items()):
        tio.write_atomic(tio.join(path, *rel.split("/")), data)
    return path
