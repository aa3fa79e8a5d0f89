"""The SavedModel's outputs: a binary classifier's `logits` and `probabilities` (named, beside `predictions`, the
model's output as it is, and `valid`), from a model of logits or of probabilities; a model of other values gives
`predictions` only. The `raw` signature takes every column (a SavedModel signature has no optional inputs): one
without values is given as blanks, which maps as the Example without that key. One export of the Criteo example
is shared by the tests (exporting is the slow part); the other models are checked eagerly, without saving."""

import csv
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from tpu_embed import HostEmbedding
from tpu_embed.serving import MappingPlan, export_saved_model
from tpu_embed.serving.export import ServingModel
from tpu_embed.training.dlrm import dlrm

pytestmark = pytest.mark.slow  # the example specs' jobs (session fixture) and one export


def _model(spec):
    return dlrm(len(spec.dense), {f.name: spec.table(f.table).dim for f in spec.categorical}, seed=1)


def _log_dense(mapped, activations):  # Criteo's counts on a log scale, so that the logits spread
    return {"dense": tf.math.log1p(tf.maximum(mapped["dense"], 0.0)), "embeddings": dict(activations)}


@pytest.fixture(scope="module")
def exported(tmp_path_factory, example_artifacts):
    """(spec, artifact copy, its tables, loaded SavedModel, raw columns, 6 CSV rows): Criteo's artifact with a DLRM
    over HostEmbedding's initial tables, exported once (model_output: the default, logits) and loaded."""
    spec, src = example_artifacts["criteo"]
    d = str(tmp_path_factory.mktemp("outputs") / "artifact")
    shutil.copytree(src, d)
    tables = HostEmbedding.from_artifact(d, seed=1).embedding_tables
    path = export_saved_model(d, tables, _model(spec), str(tmp_path_factory.mktemp("outputs_export") / "model"),
                              model_inputs=_log_dense)
    with open(spec.input_patterns()[0], newline="", encoding="utf-8") as fh:
        rows = [r for _, r in zip(range(6), csv.DictReader(fh))]
    return spec, d, tables, tf.saved_model.load(path), MappingPlan.from_artifact(d).columns, rows


def _examples(rows, columns, leave_out=()):
    return tf.constant([tf.train.Example(features=tf.train.Features(feature={
        c: tf.train.Feature(bytes_list=tf.train.BytesList(value=[row[c].encode()]))
        for c in columns if c not in leave_out and row[c] != ""})).SerializeToString() for row in rows])


def _raw(rows, columns):
    return {c: tf.constant([row[c] for row in rows]) for c in columns}


def test_both_signatures_return_logits_and_probabilities(exported):
    _, _, _, loaded, columns, rows = exported
    for out in (loaded.signatures["serving_default"](examples=_examples(rows, columns)),
                loaded.signatures["raw"](**_raw(rows, columns))):
        assert set(out) == {"logits", "probabilities", "predictions", "valid"}
        logits, p = out["logits"].numpy(), out["probabilities"].numpy()
        assert logits.dtype == p.dtype == np.float32 and logits.shape == p.shape == (len(rows),)
        assert np.ptp(logits) > 0 and ((p > 0) & (p < 1)).all()
        np.testing.assert_allclose(p, 1 / (1 + np.exp(-logits.astype(np.float64))), rtol=1e-6)
        np.testing.assert_array_equal(out["predictions"].numpy(), logits)  # the model's output, as before
        assert out["valid"].numpy().all()
    sig = loaded.signatures["serving_default"].structured_outputs
    assert {k: (v.dtype, v.shape.as_list()) for k, v in sig.items()} == {
        "logits": (tf.float32, [None]), "probabilities": (tf.float32, [None]), "predictions": (tf.float32, [None]),
        "valid": (tf.bool, [None])}


def test_a_model_of_probabilities_gets_its_logits(exported):
    spec, d, tables, _, columns, rows = exported
    base = _model(spec)

    def probabilities(x):
        return tf.math.sigmoid(base(x))

    want = ServingModel(d, tables, base, _log_dense).examples(_examples(rows, columns))
    got = ServingModel(d, tables, probabilities, _log_dense, model_output="probabilities").examples(
        _examples(rows, columns))
    np.testing.assert_allclose(got["probabilities"].numpy(), want["probabilities"].numpy(), rtol=1e-6)
    np.testing.assert_allclose(got["logits"].numpy(), want["logits"].numpy(), rtol=1e-3, atol=1e-5)
    np.testing.assert_array_equal(got["predictions"].numpy(), got["probabilities"].numpy())
    # certain predictions (0 and 1) give finite logits
    sure = ServingModel(d, tables, lambda x: tf.cast(tf.range(tf.shape(x["dense"])[0]) % 2, tf.float32), _log_dense,
                        model_output="probabilities").examples(_examples(rows, columns))
    assert np.isfinite(sure["logits"].numpy()).all() and (np.sign(sure["logits"].numpy()) == [-1, 1] * 3).all()


def test_a_model_of_other_values_returns_predictions_only(exported):
    spec, d, tables, _, columns, rows = exported
    out = ServingModel(d, tables, _model(spec), _log_dense, model_output="values").examples(_examples(rows, columns))
    assert set(out) == {"predictions", "valid"}
    with pytest.raises(ValueError, match=r"^model_output='ratings': say what the model returns, one of \['logits', "
                                         r"'probabilities', 'values'\]") as e:
        ServingModel(d, tables, _model(spec), _log_dense, model_output="ratings")
    assert "\n" not in str(e.value)


def test_raw_takes_every_column_and_blanks_are_no_value(exported):
    """A signature has no optional inputs: a call without a column is refused naming it; the column given as
    blanks maps as Examples without that key (what serving_default does with a missing key)."""
    _, _, _, loaded, columns, rows = exported
    raw = _raw(rows, columns)
    del raw["C3"]
    with pytest.raises(TypeError, match="missing required argument.*C3"):
        loaded.signatures["raw"](**raw)
    raw["C3"] = tf.constant([""] * len(rows))
    blank = loaded.signatures["raw"](**raw)
    absent = loaded.signatures["serving_default"](examples=_examples(rows, columns, leave_out=("C3",)))
    full = loaded.signatures["serving_default"](examples=_examples(rows, columns))
    np.testing.assert_allclose(blank["logits"].numpy(), absent["logits"].numpy(), rtol=1e-6)
    assert not np.allclose(blank["logits"].numpy(), full["logits"].numpy())  # C3 mattered: it is no value now
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "how-to", "serve.md")).read()
    assert "no optional inputs" in doc
