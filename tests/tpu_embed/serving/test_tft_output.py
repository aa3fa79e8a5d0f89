"""tf.Transform users: the transform output of an artifact, loaded with tensorflow-transform
(`tft.TFTransformOutput(...).transform_features_layer()`), gives the ids, weights and dense values the shards
hold for the example specs' rows, fed as TFX parses them (`raw_feature_spec()`: VarLen strings). `tpu-embed run`
writes it into the artifact (listed in the manifest); its graph, built once per spec in a child process and
cached, gives the same bytes whichever process built it, and each artifact's tables their own resources."""

import csv
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from tests.helpers import SPECS
from tests.helpers.jobs import cli as cli_main
from tests.tpu_embed.serving.shards import assert_serves_the_shards, from_transformed
from tpu_embed.artifact.load import load_artifact
from tpu_embed.artifact.manifest import read_manifest
from tpu_embed.artifact.spec import load_spec
from tpu_embed.serving import write_transform_output
from tpu_embed.serving.rules import MappingPlan
from tpu_embed.serving.tft_output import TransformGraph, schema_texts

pytestmark = pytest.mark.slow  # the example specs' jobs


def _example(row, columns) -> bytes:
    feats = {c: tf.train.Feature(bytes_list=tf.train.BytesList(value=[row[c].encode()]))
             for c in columns if row[c] != ""}
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


def _records(spec, path=None):
    with open(path or spec.input_patterns()[0], newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _check_serves(path, spec, d, records=None):
    """The transform output at `path`, read by tensorflow-transform, gives the artifact `d`'s shards' entries."""
    import tensorflow_transform as tft
    tft_output = tft.TFTransformOutput(path)
    raw_spec = tft_output.raw_feature_spec()
    records = _records(spec) if records is None else records
    parsed = tf.io.parse_example(tf.constant([_example(r, raw_spec) for r in records]), raw_spec)
    mapped = from_transformed(tft_output.transform_features_layer()(parsed), spec)
    assert mapped["valid"].numpy().all()
    n = assert_serves_the_shards(spec, d, mapped)
    for f in spec.categorical:
        assert tft_output.num_buckets_for_transformed_feature(f.name) > 0
    for key in spec.vocabulary_groups():
        assert tft_output.vocabulary_file_by_name(key) is not None, key
    return n


def _files(d):
    return {os.path.relpath(os.path.join(r, x), d): open(os.path.join(r, x), "rb").read()
            for r, _, xs in os.walk(d) for x in xs}


@pytest.mark.parametrize("name,via", [("criteo", "run"), ("criteo", "api"), ("movielens", "cli")])
def test_transform_features_layer_gives_the_shards_ids(example_artifacts, name, via, tmp_path, capsys):
    spec, d = example_artifacts[name]
    path = str(tmp_path / "transform_output")
    if via == "run":  # what `tpu-embed run` wrote into the artifact
        path = os.path.join(d, "transform_output")
    elif via == "api":
        assert write_transform_output(d, path) == path
    else:  # `tpu-embed transform-output ARTIFACT --output DIR`
        assert cli_main(["transform-output", d, "--output", path]) == 0
        assert capsys.readouterr().out.strip() == f"transform output: {path} (tft.TFTransformOutput reads it)"
    n = _check_serves(path, spec, d)
    print(f"\n[serving] {name} ({via}): transform_features_layer on {n} examples gives the shards' entries")


@pytest.mark.parametrize("name", ["criteo", "movielens"])
def test_run_lists_the_transform_output_in_the_manifest_and_writing_it_again_gives_the_same_bytes(
        example_artifacts, name, tmp_path):
    spec, d = example_artifacts[name]
    listed = {f.path for f in read_manifest(d).files if f.kind == "transform_output"}
    written = {"transform_output/" + p for p in _files(os.path.join(d, "transform_output"))}
    assert listed == written and "transform_output/transform_fn/saved_model.pb" in listed
    assert "transform_output/transform_fn/assets.extra/tpu_embed_transform_graph.json" in listed
    assert len([p for p in listed if "/assets/" in p]) == len(spec.vocabulary_groups())
    load_artifact(d, verify="sha256")  # every listed file's sha256
    again = write_transform_output(d, str(tmp_path / "again"))
    assert _files(again) == _files(os.path.join(d, "transform_output"))


def test_the_command_refuses_a_directory_without_an_artifact_in_one_line(tmp_path, capsys):
    assert cli_main(["transform-output", str(tmp_path / "nothing")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tpu-embed transform-output: "), err


def test_the_command_writes_the_artifacts_own_and_lists_it(example_artifacts, tmp_path, capsys):
    import shutil
    _, src = example_artifacts["movielens"]
    d = str(tmp_path / "copy")
    shutil.copytree(src, d)
    before = _files(os.path.join(d, "transform_output"))
    shutil.rmtree(os.path.join(d, "transform_output"))
    assert cli_main(["transform-output", d]) == 0
    assert _files(os.path.join(d, "transform_output")) == before
    load_artifact(d, verify="sha256")


def test_schemas_are_tensorflow_transforms_own(example_artifacts):
    """The schemas, written without TensorFlow, equal tensorflow-transform's `schema_from_feature_spec` of the
    feature specs the module docstring states."""
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tensorflow_transform.tf_metadata import schema_utils
    for name, (_, d) in example_artifacts.items():
        plan = MappingPlan.from_artifact(d)
        rows = {f.name: 7 + i for i, f in enumerate(plan.features)}
        texts = schema_texts(plan, rows)
        raw = {c: tf.io.VarLenFeature(tf.string) for c in plan.columns}
        feats, domains = {}, {}
        for f in plan.features:
            feats[f.name] = tf.io.VarLenFeature(tf.int64)
            domains[f.name] = schema_pb2.IntDomain(min=0, max=rows[f.name] - 1, is_categorical=True)
            if f.weight_column:
                feats[f.name + "__weights"] = tf.io.VarLenFeature(tf.float32)
        for dp in plan.dense:
            feats[dp.name] = tf.io.FixedLenFeature([], tf.float32)
        feats["__valid__"] = tf.io.FixedLenFeature([], tf.int64)
        domains["__valid__"] = schema_pb2.IntDomain(min=0, max=1, is_categorical=True)
        assert texts["metadata"] == text_format.MessageToString(schema_utils.schema_from_feature_spec(raw)), name
        assert texts["transformed_metadata"] == text_format.MessageToString(
            schema_utils.schema_from_feature_spec(feats, domains)), name


def test_a_graph_built_in_another_process_and_cache_is_the_same_bytes(example_artifacts, tmp_path, monkeypatch):
    spec, _ = example_artifacts["criteo"]
    first = TransformGraph(spec)
    first_bytes = first.result()
    assert TransformGraph(spec).cached
    monkeypatch.setenv("TPU_EMBED_CACHE_DIR", str(tmp_path / "cache"))
    fresh = TransformGraph(spec)
    assert not fresh.cached
    assert fresh.result() == first_bytes
    assert TransformGraph(spec).cached


def test_the_cache_can_be_an_object_store_shared_by_machines(example_artifacts, monkeypatch):
    """TPU_EMBED_CACHE_DIR=gs://...: a graph built on one machine (here: the local cache's, put there by a build)
    is found there by the next, the same bytes (GCS emulator on loopback)."""
    from tests.helpers.object_store import BUCKET, gcs_emulator
    spec, _ = example_artifacts["movielens"]
    local = TransformGraph(spec).result()
    with gcs_emulator():
        monkeypatch.setenv("TPU_EMBED_CACHE_DIR", f"gs://{BUCKET}/tpu_embed_cache")
        first = TransformGraph(spec)
        assert not first.cached and first.result() == local
        second = TransformGraph(spec)
        assert second.cached and second.path.startswith("gs://") and second.result() == local


def test_two_days_in_one_process_each_map_with_their_own_vocabularies(tmp_path):
    """Two artifacts of one spec with other vocabularies (MovieLens's rows in two halves) share one cached graph;
    loaded in one process (as a server holding two days' models), each gives its own shards' ids."""
    from tests.helpers import jobs
    spec = load_spec(SPECS["movielens"])
    rows = _records(spec)
    with open(spec.input_patterns()[0], newline="", encoding="utf-8") as fh:
        header = next(csv.reader(fh))
    days = []
    for i, part in enumerate((rows[: len(rows) // 2], rows[len(rows) // 2:])):
        path = str(tmp_path / f"day{i}.csv")
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, header)
            w.writeheader()
            w.writerows(part)
        day_spec = spec.with_inputs([path])
        d = str(tmp_path / f"artifact{i}")
        jobs.run(day_spec, d, transform_output=True)
        days.append((day_spec, d, part))
    files = [_files(os.path.join(d, "transform_output")) for _, d, _ in days]
    assert sorted(files[0]) == sorted(files[1])
    assert [p for p in files[0] if "/assets/" in p and files[0][p] != files[1][p]]  # other vocabularies
    graphs = [f["transform_fn/saved_model.pb"] for f in files]
    assert graphs[0] != graphs[1] and len(graphs[0]) == len(graphs[1])  # the tables' names, same length
    import tensorflow_transform as tft
    layers = [tft.TFTransformOutput(os.path.join(d, "transform_output")).transform_features_layer()
              for _, d, _ in days]  # both loaded before either runs
    for (day_spec, d, part), layer in zip(days, layers):
        raw_spec = tft.TFTransformOutput(os.path.join(d, "transform_output")).raw_feature_spec()
        parsed = tf.io.parse_example(tf.constant([_example(r, raw_spec) for r in part]), raw_spec)
        assert_serves_the_shards(day_spec, d, from_transformed(layer(parsed), day_spec))


def test_a_lineage_with_capacities_serves_each_days_shards(tmp_path):
    """Vocabularies of mode append under capacities (the first OOV id is the capacity, not the file's lines), two
    days, each over the previous: each day's transform output gives that day's shards' ids for its rows."""
    from tests.helpers import lineage_days
    outs = lineage_days.build(str(tmp_path), parts=2, transform_output=True)
    for k, d in enumerate(outs, 1):
        spec = load_artifact(d, verify="none").spec
        assert spec.vocabulary_groups()
        n = _check_serves(os.path.join(d, "transform_output"), spec, d, _records(spec, str(tmp_path / f"day{k}.csv")))
        assert n > 0
    # Tokens no day has seen: their OOV ids start at the capacity, as `RawFeatureMapping` (the manifest's sizes)
    # makes them.
    import tensorflow_transform as tft

    from tpu_embed.serving import RawFeatureMapping
    d = outs[0]
    spec = load_artifact(d, verify="none").spec
    raw = {"user_id": ["1", "2"], "title": ["a", "b"], "timestamp": ["1", "2"], "genres": ["Drama|not-a-genre", ""],
           "zip": ["unseen-zip-1", "unseen-zip-2"], "occupation": ["99", "7"]}
    layer = tft.TFTransformOutput(os.path.join(d, "transform_output")).transform_features_layer()
    got = from_transformed(layer({c: tf.RaggedTensor.from_tensor(tf.constant(v)[:, None]).to_sparse()
                                  for c, v in raw.items()}), spec)
    want = RawFeatureMapping.from_artifact(d)({c: tf.constant(v) for c, v in raw.items()})
    for f in spec.categorical:
        assert got["ids"][f.name].to_list() == want["ids"][f.name].to_list(), f.name
    assert min(got["ids"]["zip"].flat_values.numpy()) >= 160  # zip's capacity


def test_a_day_takes_the_graph_from_its_base_where_no_cache_has_it(tmp_path, monkeypatch, caplog):
    """A machine without the cache (a fresh launcher): the day over a base takes the graph from the base's
    transform output (its tables' names put back), the same bytes as a build; another key, or no transform
    output, is not taken. A cache that cannot be written is logged and the run goes on."""
    from tests.helpers import lineage_days
    from tpu_embed.serving.tft_output import graph_key, graph_of_artifact
    outs = lineage_days.build(str(tmp_path), parts=2, transform_output=True)
    spec = load_artifact(outs[1], verify="none").spec
    monkeypatch.setenv("TPU_EMBED_CACHE_DIR", str(tmp_path / "empty"))
    built = TransformGraph(spec)
    assert built.source == "built"
    want = built.result()
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("TPU_EMBED_CACHE_DIR", str(blocked))
    with caplog.at_level("WARNING", logger="tpu_embed.serving"):
        from_base = TransformGraph(spec, base=outs[0])
    assert from_base.source == "base" and from_base.result() == want
    assert "transform graph not cached at" in caplog.text
    assert graph_of_artifact(outs[0], spec, graph_key(spec)) == want
    assert graph_of_artifact(outs[0], spec, "another key") is None
    assert graph_of_artifact(str(tmp_path / "day1.csv"), spec, graph_key(spec)) is None  # no artifact there


def test_a_graph_that_cannot_be_built_fails_the_run_in_one_line(tmp_path, monkeypatch):
    """TensorFlow broken in the child: `tpu-embed run` writes the shards and says in one line what failed."""
    fake = tmp_path / "broken"
    fake.mkdir()
    (fake / "tensorflow.py").write_text("raise ImportError('this TensorFlow is broken')\n")
    monkeypatch.setenv("TPU_EMBED_CACHE_DIR", str(tmp_path / "cache"))
    out = str(tmp_path / "artifact")
    # criteo: no hashing feature, so the run itself does not import TensorFlow
    proc = subprocess.run([sys.executable, "-m", "pipelines.cli", "run", "--spec", SPECS["criteo"],
                           "--output", out], capture_output=True, text=True, cwd=str(tmp_path),
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake), _root()])))
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"tpu-embed run: {out}: the shards are written but not transform_output/: "
                             "building the transform graph failed (exit status 1): ImportError: this TensorFlow "
                             "is broken"), err
    assert any(f.kind == "shard" for f in read_manifest(out).files)
    assert not os.path.exists(os.path.join(out, "transform_output"))


def test_a_transformed_name_used_twice_is_refused_before_the_jobs_run(tmp_path, capsys):
    """A feature named `__valid__` (the transform output's own column): refused in one line before anything is
    read or written."""
    import yaml
    raw = yaml.safe_load(open(SPECS["movielens"]))
    raw["categorical"][0].update(name="__valid__", column="user_id")  # a spec the jobs would otherwise run
    raw["tables"][0]["name"] = "__valid__"
    raw["inputs"]["patterns"] = [os.path.join(os.path.dirname(SPECS["movielens"]), p)
                                 for p in raw["inputs"]["patterns"]]
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "artifact"
    assert cli_main(["run", "--spec", str(spec_path), "--output", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tpu-embed run: transformed feature name '__valid__' is used twice: rename the feature or dense "
                   "input whose name ends in '__weights' or is '__valid__', or run with --no-transform-output."], err
    assert not (out / "manifest.json").exists()


def _root():
    from tests.helpers import ROOT
    return ROOT
