"""The exported SavedModel predicts on held-out raw rows what the trained model predicts on those rows' shards,
in a process where tpu_embed cannot be imported and with `saved_model_cli run`; the vocabularies travel as
assets (the artifact is gone when the SavedModel is loaded)."""

import csv
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import ROOT
from tpu_embed import HostEmbedding
from tpu_embed.artifact import shard_records, tfrecord
from tpu_embed.artifact.manifest import read_manifest
from tpu_embed.serving import export_saved_model
from tpu_embed.training.dlrm import dlrm

pytestmark = pytest.mark.slow  # the example specs' jobs, training and a TensorFlow process per check

HELD_OUT = {"criteo": 5, "movielens": 11}  # the step held out of training: full, not the padded tail


def _model_inputs(mapped, activations):
    """The DLRM's input with the dense values log-scaled (MovieLens' timestamps, ~1e9, would overflow it): the
    same function in training and in the export (`model_inputs=`)."""
    d = mapped["dense"]
    return {"dense": tf.math.sign(d) * tf.math.log1p(tf.abs(d)), "embeddings": dict(activations)}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, example_artifacts):
    """{name: (spec, artifact dir, raw rows of the held-out step, the trained model's predictions on its shards,
    export path)}: a DLRM trained a few steps on each example spec's shards with HostEmbedding, then exported
    (from a copy of the artifact, which the tests delete)."""
    out = {}
    for name, held in HELD_OUT.items():
        spec = example_artifacts[name][0]
        d = str(tmp_path_factory.mktemp(name) / "artifact")
        shutil.copytree(example_artifacts[name][1], d)
        m = read_manifest(d)
        hosts = [[shard_records.decode_record(r, m.shard_format) for p in shard_records.shard_files(d, h, m)
                  for r in tfrecord.read_records(p)] for h in range(spec.topology.num_hosts)]
        steps = [[hosts[h][s] for h in range(len(hosts))] for s in range(len(hosts[0]))]
        emb = HostEmbedding.from_artifact(d, seed=1)
        model = dlrm(len(spec.dense), {f.name: spec.table(f.table).dim for f in spec.categorical}, seed=1)
        import tf_keras as keras
        opt = keras.optimizers.Adagrad(learning_rate=0.05)
        for s, step in enumerate(steps[:3]):
            if s == held:
                continue
            acts, preserved = emb.dequeue(step)
            dense = tf.constant(np.concatenate([r["dense"] for r in step]))
            label = tf.constant(np.concatenate([r["label"] for r in step]))
            with tf.GradientTape() as tape:
                tape.watch(acts)
                logits = model(_model_inputs({"dense": dense}, acts))
                loss = tf.reduce_mean(tf.square(logits - label))
            grads = tape.gradient(loss, (model.trainable_variables, acts))
            opt.apply_gradients(zip(grads[0], model.trainable_variables))
            emb.apply_gradients(grads[1], preserved)
        step = steps[held]
        assert all(r["mask"].all() for r in step)
        dense = tf.constant(np.concatenate([r["dense"] for r in step]))
        want = model(_model_inputs({"dense": dense}, emb.dequeue(step)[0])).numpy()
        assert np.isfinite(want).all() and np.ptp(want) > 0, want
        B = spec.global_batch_size
        with open(spec.input_patterns()[0], newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))[held * B:(held + 1) * B]  # file order, no dead letters
        path = export_saved_model(d, emb, model, str(tmp_path_factory.mktemp(name + "_export") / "model"),
                                  model_inputs=_model_inputs)
        out[name] = (spec, d, rows, want, path)
    return out


def _example(spec, row, ints: bool = False) -> bytes:
    """A raw CSV row as a tf.train.Example: text as bytes (the kind the CSV data held), with `ints` integer text as
    int64 lists; blanks left out."""
    feats = {}
    for c in spec.required_columns():
        v = row[c]
        if v == "":
            continue
        if ints and v.lstrip("-").isdigit():
            feats[c] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v)]))
        else:
            feats[c] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode()]))
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


_CLEAN = """
import sys, json
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path[:] = [p for p in sys.path if p not in ("", "{root}")]
for name in ("tpu_embed", "pipelines", "profiles"):
    try:
        __import__(name)
    except ModuleNotFoundError:
        pass
    else:
        raise SystemExit(name + " is importable")
import numpy as np, tensorflow as tf
for args in json.load(open(sys.argv[1])):
    loaded = tf.saved_model.load(args["path"])
    ex = loaded.signatures["serving_default"](examples=tf.constant([bytes.fromhex(e) for e in args["examples"]]))
    ints = loaded.signatures["examples_any_kind"](examples=tf.constant([bytes.fromhex(e) for e in args["ints"]]))
    raw = loaded.signatures["raw"](**{{c: tf.constant(v) for c, v in args["raw"].items()}})
    np.savez(args["out"], examples=ex["predictions"].numpy(), ints=ints["predictions"].numpy(),
             raw=raw["predictions"].numpy(),
             valid=np.concatenate([ex["valid"].numpy(), ints["valid"].numpy(), raw["valid"].numpy()]))
"""


def test_exported_models_predict_as_trained_without_tpu_embed(trained, tmp_path):
    """Both example specs' exports, in one process (one TensorFlow import)."""
    calls = []
    for name, (spec, d, rows, _, path) in sorted(trained.items()):
        moved = str(tmp_path / name)
        shutil.copytree(path, moved)  # no path of the export or the artifact is needed once written
        shutil.rmtree(d, ignore_errors=True)
        columns = [c for c in spec.required_columns() if c != spec.label.column]
        calls.append({"path": moved, "examples": [_example(spec, r).hex() for r in rows],
                      "ints": [_example(spec, r, ints=True).hex() for r in rows],
                      "raw": {c: [r[c] for r in rows] for c in columns}, "out": str(tmp_path / f"{name}.npz")})
    (tmp_path / "args.json").write_text(json.dumps(calls))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-I", "-c", _CLEAN.format(root=ROOT), str(tmp_path / "args.json")],
                          cwd=str(tmp_path), capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name, (_, _, rows, want, _) in sorted(trained.items()):
        got = np.load(tmp_path / f"{name}.npz")
        assert got["valid"].all()
        np.testing.assert_allclose(got["examples"], want, rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(got["ints"], want, rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(got["raw"], want, rtol=1e-5, atol=1e-6, err_msg=name)
        print(f"\n[serving] {name}: {len(rows)} held-out rows, the export's predictions (serving_default, "
              f"examples_any_kind with integers as int64 and raw) "
              f"equal the trained model's on their shards; max |diff| "
              f"{float(np.abs(got['examples'] - want).max()):.2e}")


def test_saved_model_cli_runs_the_raw_signature(trained, tmp_path):
    spec, _, rows, want, path = trained["movielens"]
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    columns = [c for c in spec.required_columns() if c != spec.label.column]
    exprs = ";".join(f"{c}={json.dumps([r[c] for r in rows[:4]])}" for c in columns)
    proc = subprocess.run([cli, "run", "--dir", path, "--tag_set", "serve", "--signature_def", "raw",
                           "--input_exprs", exprs, "--outdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    np.testing.assert_allclose(np.load(tmp_path / "predictions.npy"), want[:4], rtol=1e-5, atol=1e-6)
    assert np.load(tmp_path / "valid.npy").all()
