"""A DLRM trains on CPU from the Criteo sample's shards with HostEmbedding; checkpoints restore; the serving export
predicts like the trained model on held-out raw examples (raw CSV rows, not the shards)."""

import os

import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import SPECS, jobs
from tests.helpers.plain_reference import plain_ids, plain_vocabulary, raw_rows
from tpu_embed import HostEmbedding
from tpu_embed.artifact import shard_records, tfrecord
from tpu_embed.artifact.manifest import read_manifest
from tpu_embed.artifact.spec import load_spec
from tpu_embed.training.dlrm import dlrm

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    spec = load_spec(SPECS["criteo"])
    d = str(tmp_path_factory.mktemp("criteo_dlrm"))
    jobs.run(spec, d)
    m = read_manifest(d)
    records = [shard_records.decode_record(r, m.shard_format)
               for path in shard_records.shard_files(d, 0, m) for r in tfrecord.read_records(path)]
    return spec, d, records


def _new(d, spec):
    emb = HostEmbedding.from_artifact(d, seed=3)
    emb.build()
    model = dlrm(len(spec.dense), {f.name: spec.table(f.table).dim for f in spec.sparse_core_features}, seed=3)
    return emb, model


def _logits(model, record, activations):
    return model({"dense": tf.constant(record["dense"]), "embeddings": activations})


def _train_step(emb, model, opt, record):
    activations, preserved = emb.dequeue(record)
    with tf.GradientTape() as tape:
        tape.watch(activations)
        logits = _logits(model, record, activations)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=record["label"], logits=logits))
    grads = tape.gradient(loss, (model.trainable_variables, activations))
    opt.apply_gradients(zip(grads[0], model.trainable_variables))
    emb.apply_gradients(grads[1], preserved)
    return float(loss)


def test_dlrm_trains_restores_and_serves(criteo, tmp_path):
    spec, d, records = criteo
    assert len(records) == 6 and all(r["mask"].all() for r in records)
    train, held_out = records[:-1], records[-1]
    emb, model = _new(d, spec)
    import tf_keras as keras
    opt = keras.optimizers.Adagrad(learning_rate=0.05)
    epochs = [np.mean([_train_step(emb, model, opt, r) for r in train]) for _ in range(25)]
    assert epochs[-1] < 0.6 * epochs[0], epochs  # it learns (200 rows: it can memorise them)

    want = _logits(model, held_out, emb.dequeue(held_out)[0]).numpy()

    # Checkpoint: tables (per table, unstacked) and the model restore into fresh objects.
    path = tf.train.Checkpoint(embedding=emb, model=model).save(os.path.join(tmp_path, "ckpt"))
    emb2, model2 = _new(d, spec)
    _logits(model2, held_out, emb2.dequeue(held_out)[0])  # create the model's variables
    assert not np.allclose(_logits(model2, held_out, emb2.dequeue(held_out)[0]).numpy(), want)
    tf.train.Checkpoint(embedding=emb2, model=model2).restore(path).assert_existing_objects_matched()
    np.testing.assert_array_equal(_logits(model2, held_out, emb2.dequeue(held_out)[0]).numpy(), want)
    for name, table in emb.embedding_tables.items():
        np.testing.assert_array_equal(table.numpy(), emb2.embedding_tables[name].numpy(), err_msg=name)

    # Serving on CPU: TPUEmbeddingForServing on the held-out step's *raw* rows (CSV -> vocabulary ids).
    serving = emb.to_serving()
    batch = spec.global_batch_size
    rows = raw_rows(spec)[5 * batch:6 * batch]  # the sixth step: file order, one host (tail dropped after it)
    vocabs = {k: plain_vocabulary(spec, k) for k in spec.vocabulary_groups()}
    features = {}
    for f in spec.sparse_core_features:
        ids = [plain_ids(spec, f, row, vocabs) for row in rows]
        features[f.name] = tf.ragged.constant(ids, dtype=tf.int64, ragged_rank=1)
    looked_up = serving.embedding_lookup(features, {name: None for name in features})
    got = _logits(model, held_out, looked_up).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(held_out["label"], np.array([float(r["label"]) for r in rows], np.float32))
