"""Serving under faults and odd inputs: a vocabulary file damaged after the artifact was written is refused by
every serving entry (the mapping, the export, the tf.Transform output) as training refuses it; the exported
SavedModel gives an empty batch empty outputs and an Example with no features alone what it gets beside others;
the `raw` signature refuses columns of unequal length naming them. One export of the MovieLens example is shared
by the tests (exporting is the slow part)."""

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from tests.helpers.jobs import cli as cli_main
from tpu_embed import HostEmbedding
from tpu_embed.artifact.verify import ArtifactDamagedError
from tpu_embed.serving import MappingPlan, RawFeatureMapping, export_saved_model, write_transform_output
from tpu_embed.training.dlrm import dlrm

pytestmark = pytest.mark.slow  # the example specs' jobs (session fixture) and one export

VOCAB = os.path.join("vocab", "genres.txt")


def _model(spec):
    return dlrm(len(spec.dense), {f.name: spec.table(f.table).dim for f in spec.categorical}, seed=1)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, example_artifacts):
    """(spec, artifact copy, loaded SavedModel, columns of `raw`): MovieLens' artifact with a DLRM over
    HostEmbedding's initial tables, exported once and loaded."""
    spec, src = example_artifacts["movielens"]
    d = str(tmp_path_factory.mktemp("faults") / "artifact")
    shutil.copytree(src, d)
    emb = HostEmbedding.from_artifact(d, seed=1)
    path = export_saved_model(d, emb, _model(spec), str(tmp_path_factory.mktemp("faults_export") / "model"))
    return spec, d, tf.saved_model.load(path), MappingPlan.from_artifact(d).columns  # the order map_raw takes


def _example(features) -> bytes:
    feats = {}
    for k, v in features.items():
        if isinstance(v, int):
            feats[k] = tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))
        elif isinstance(v, float):
            feats[k] = tf.train.Feature(float_list=tf.train.FloatList(value=[v]))
        else:
            feats[k] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode()]))
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


FULL = {"user_id": 3299, "movie_id": 235, "genres": "Comedy|Romance", "gender": "F", "age": 1, "occupation": 1,
        "zip": "06811", "title": "Toy Story (1995)", "timestamp": 968035345.0}
# The row as the training data held it: CSV cells, text (the manifest's value_kinds: bytes_list everywhere)
FULL_TEXT = {k: str(int(v)) if isinstance(v, (int, float)) else v for k, v in FULL.items()}


# ---------------------------------------------------------------- a damaged vocabulary

def _one_line(e: BaseException, path: str) -> str:
    msg = str(e)
    assert "\n" not in msg and path in msg, msg
    assert "sha256" in msg and "Re-run `tpu-embed run`" in msg, msg
    return msg


def test_swapped_vocabulary_lines_are_refused_by_every_serving_entry(exported, tmp_path, capsys):
    """Two lines of vocab/genres.txt swapped (same size, tokens mapped to each other's rows): training refuses the
    artifact, and so do the mapping, the export (nothing written) and both ways of writing the transform output."""
    spec, src, _, _ = exported
    d = str(tmp_path / "artifact")
    shutil.copytree(src, d)
    path = os.path.join(d, VOCAB)
    with open(path, "rb") as fh:
        lines = fh.read().split(b"\n")
    assert lines[0] != lines[1]
    lines[0], lines[1] = lines[1], lines[0]
    with open(path, "wb") as fh:
        fh.write(b"\n".join(lines))
    with pytest.raises(ArtifactDamagedError) as training:
        HostEmbedding.from_artifact(d)
    _one_line(training.value, path)
    with pytest.raises(ArtifactDamagedError) as e:
        RawFeatureMapping.from_artifact(d)
    assert str(e.value) == str(training.value)  # the one check, the same words
    with pytest.raises(ArtifactDamagedError) as e:
        MappingPlan.from_artifact(d)
    _one_line(e.value, path)
    out = str(tmp_path / "model")
    with pytest.raises(ArtifactDamagedError) as e:
        export_saved_model(d, {t.name: tf.zeros([1, t.dim]) for t in spec.tables}, _model(spec), out)
    _one_line(e.value, path)
    assert not os.path.exists(out)
    with pytest.raises(ArtifactDamagedError) as e:
        write_transform_output(d, str(tmp_path / "transform_output"))
    _one_line(e.value, path)
    assert not os.path.exists(tmp_path / "transform_output")
    before = {f: os.path.getmtime(os.path.join(d, "transform_output", f)) for f in ("transform_fn/saved_model.pb",)}
    assert cli_main(["transform-output", d]) != 0  # the artifact's own, as `tpu-embed run` writes it
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and path in err[0] and "sha256" in err[0], err
    assert {f: os.path.getmtime(os.path.join(d, "transform_output", f)) for f in before} == before


def test_a_vocabulary_file_the_manifest_does_not_list_is_refused(exported, tmp_path):
    import json
    _, src, _, _ = exported
    d = str(tmp_path / "artifact")
    shutil.copytree(src, d)
    with open(os.path.join(d, "manifest.json")) as fh:
        m = json.load(fh)
    m["files"] = [f for f in m["files"] if f["path"] != "vocab/genres.txt"]
    with open(os.path.join(d, "manifest.json"), "w") as fh:
        json.dump(m, fh)
    with pytest.raises(ArtifactDamagedError, match="vocabulary 'genres' is mapped with this file but") as e:
        RawFeatureMapping.from_artifact(d)
    assert "\n" not in str(e.value) and os.path.join(d, VOCAB) in str(e.value)


# ---------------------------------------------------------------- empty batches, empty Examples

def test_an_empty_batch_gets_empty_outputs(exported):
    _, _, loaded, columns = exported
    outs = [loaded.signatures["serving_default"](examples=tf.constant([], tf.string)),
            loaded.signatures["raw"](**{c: tf.constant([], tf.string) for c in columns})]
    for out in outs:
        assert out["predictions"].dtype == tf.float32 and out["predictions"].shape == [0]
        assert out["valid"].dtype == tf.bool and out["valid"].shape == [0]


@pytest.mark.parametrize("signature", ["serving_default", "examples_any_kind"])
def test_an_example_with_no_features_alone_gets_what_it_gets_beside_others(exported, signature):
    _, _, loaded, _ = exported
    serve = loaded.signatures[signature]
    full = _example(FULL_TEXT)
    empty_with_no_entries = tf.train.Example(features=tf.train.Features()).SerializeToString()
    beside = serve(examples=tf.constant([full, b"", empty_with_no_entries]))
    assert beside["valid"].numpy().all()
    p = beside["predictions"].numpy()
    assert p[1] == p[2] and p[0] != p[1]
    for batch in ([b""], [empty_with_no_entries], [b"", b""], [b"", empty_with_no_entries]):
        alone = serve(examples=tf.constant(batch))
        np.testing.assert_allclose(alone["predictions"].numpy(), [p[1]] * len(batch), rtol=1e-6, err_msg=batch)
        assert alone["valid"].numpy().tolist() == [True] * len(batch)
    # the same rows through the raw signature: every column blank
    _, _, _, columns = exported
    blank = loaded.signatures["raw"](**{c: tf.constant([""]) for c in columns})
    np.testing.assert_allclose(blank["predictions"].numpy(), [p[1]], rtol=1e-6)


# ---------------------------------------------------------------- values of another kind than the training data's

def test_a_value_of_another_kind_is_refused_by_serving_default_and_read_by_examples_any_kind(exported):
    """MovieLens was read from CSV (every value text: `value_kinds` bytes_list). `serving_default` parses each key
    as that kind: an int64 value fails the call in one line naming the key, the Example and both kinds (never an
    id of another token); `examples_any_kind` reads it as the offline TFRecord reader would, as its decimal text."""
    _, _, loaded, _ = exported
    serve, any_kind = loaded.signatures["serving_default"], loaded.signatures["examples_any_kind"]
    as_text = serve(examples=tf.constant([_example(FULL_TEXT)]))
    ints = dict(FULL_TEXT, user_id=3299, age=1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"Key: (user_id|age), Index: 1\.  Data types don't "
                                                             r"match\. Expected type: string, Actual type: int64"):
        serve(examples=tf.constant([_example(FULL_TEXT), _example(ints)]))
    got = any_kind(examples=tf.constant([_example(ints), _example(FULL_TEXT)]))
    p = got["predictions"].numpy()
    assert p[0] == p[1]  # the int64 Example and the text one: the same ids, the same prediction
    np.testing.assert_allclose(p, [as_text["predictions"].numpy()[0]] * 2, rtol=1e-6)
    assert got["valid"].numpy().all()


# ---------------------------------------------------------------- raw columns of unequal length

def test_raw_columns_of_unequal_length_are_refused_naming_them(exported):
    _, d, loaded, columns = exported
    raw = {c: tf.constant(["1", "2"]) for c in columns}
    raw["genres"] = tf.constant(["Comedy"])
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        loaded.signatures["raw"](**raw)
    ref = next(c for c in columns if c != "genres")
    assert (f"raw columns of unequal length: genres has 1 rows, where {ref} has 2: give every column one entry per "
            f"row of the batch (a blank string for no value)." in str(e.value)), str(e.value)
    raw["zip"] = tf.constant(["1", "2", "3"])
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"genres has 1 rows, zip has 3 rows, where {ref} has 2"):
        loaded.signatures["raw"](**raw)
    # eagerly, the mapping refuses them when called (a ValueError of one line)
    with pytest.raises(ValueError, match=f"^raw columns of unequal length: genres has 1 rows, zip has 3 rows, where "
                                         f"{ref} has 2: give every column") as e:
        RawFeatureMapping.from_artifact(d)(raw)
    assert "\n" not in str(e.value)
    # the most common length is the batch's: one odd column first is named, not the others
    raw = {c: tf.constant(["1", "2"]) for c in columns}
    raw[columns[0]] = tf.constant(["1", "2", "3"])
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"unequal length: {columns[0]} has 3 rows, where "
                                                             f"{columns[1]} has 2:"):
        loaded.signatures["raw"](**raw)
