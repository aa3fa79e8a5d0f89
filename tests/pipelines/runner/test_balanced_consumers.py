"""Balanced ids are a relabelling of frequency order's, and every consumer of an artifact treats them as one:

* serving: `tpu_embed.serving.RawFeatureMapping` of a balanced artifact maps the raw rows to the shards' ids, and
  its tf.Transform output does too (they read the vocabulary files, which list the tokens in id order);
* remap: a checkpoint trained on the frequency-ordered artifact, remapped onto the balanced one of the same data
  (and back), has every token's row and optimizer slots where that token's id is: no row is new or dropped;
* training: `HostEmbedding` on the balanced shards, its rows initialised per token as on the frequency-ordered
  ones, gives the same losses step by step (sums in another order: float32 rounding only).
"""

from __future__ import annotations

import csv
import hashlib
import os

import numpy as np
import pytest
import tensorflow as tf
import yaml

import tpu_embed
from pipelines import runner
from pipelines.jobs import JobConfig
from pipelines.mapping import vocabulary as pvocab
from tests.helpers import ROOT
from tests.tpu_embed.serving.shards import assert_serves_the_shards, from_transformed
from tpu_embed import HostEmbedding
from tpu_embed.artifact.manifest import read_manifest
from tpu_embed.artifact.spec import load_spec

pytestmark = pytest.mark.slow  # the jobs, TensorFlow


def _spec(tmp, example: str, ids: str) -> str:
    with open(os.path.join(ROOT, "examples", example, "spec.yaml")) as f:
        d = yaml.safe_load(f)
    d["inputs"]["patterns"] = [os.path.join(ROOT, "data", os.path.basename(d["inputs"]["patterns"][0]))]
    if ids == "balanced":
        d["partition"] = {"ids": "balanced"}
    path = os.path.join(tmp, f"{example}-{ids}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(d, f)
    return path


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("consumers"))
    out = {}
    for example in ("criteo", "movielens"):
        for ids in ("frequency", "balanced"):
            d = os.path.join(tmp, f"{example}-{ids}")
            spec = load_spec(_spec(tmp, example, ids))
            runner.run_all(JobConfig(spec=spec, output=d, transform_output=ids == "balanced"))
            out[example, ids] = (spec, d)
    return out


def token_ids(d: str, spec) -> dict:
    """{table: {token: id}} of an artifact's frequency vocabularies."""
    out = {}
    for feats in spec.vocabulary_groups().values():
        tokens = pvocab.read_vocabulary_file(open(os.path.join(d, "vocab", f"{feats[0].name}.txt"), "rb").read())
        out[feats[0].table] = {t: i for i, t in enumerate(tokens)}
    return out


@pytest.mark.parametrize("example", ["criteo", "movielens"])
def test_serving_maps_raw_rows_to_the_shards_ids(artifacts, example):
    from tpu_embed.serving import RawFeatureMapping
    spec, d = artifacts[example, "balanced"]
    assert any((v.ids or {}).get("order") == "balanced" for v in read_manifest(d).vocabularies.values())
    with open(spec.input_patterns()[0], newline="", encoding="utf-8") as fh:
        records = list(csv.DictReader(fh))
    mapping = RawFeatureMapping.from_artifact(d)
    raw = {c: tf.constant([r[c] for r in records]) for c in mapping.columns}
    out = mapping(raw)
    assert out["valid"].numpy().all()
    assert assert_serves_the_shards(spec, d, out) > 0
    import tensorflow_transform as tft
    layer = tft.TFTransformOutput(os.path.join(d, "transform_output")).transform_features_layer()
    transformed = layer({c: tf.RaggedTensor.from_tensor(v[:, None]).to_sparse() for c, v in raw.items()})
    assert_serves_the_shards(spec, d, from_transformed(transformed, spec))


def _train(d: str, steps=None, save: str = ""):
    emb = HostEmbedding.from_artifact(d, seed=1)
    for i, record in enumerate(tpu_embed.input_fn(d)):
        if steps is not None and i >= steps:
            break
        acts, pres = emb.dequeue(record)
        emb.apply_gradients({k: tf.ones_like(v) * 0.3 for k, v in acts.items()}, pres)
    return emb, tf.train.Checkpoint(embedding=emb).save(save) if save else None


@pytest.mark.parametrize("example", ["criteo", "movielens"])
def test_remap_between_frequency_and_balanced_keeps_every_row(artifacts, example, tmp_path):
    from tpu_embed.training.remap import remap
    spec, a = artifacts[example, "frequency"]
    _, b = artifacts[example, "balanced"]
    ids_a, ids_b = token_ids(a, spec), token_ids(b, spec)
    assert any(ids_a[t] != ids_b[t] for t in ids_a)  # the ids really moved
    for src, dst, ids_src, ids_dst in ((a, b, ids_a, ids_b), (b, a, ids_b, ids_a)):
        emb, path = _train(src, save=str(tmp_path / f"{os.path.basename(src)}" / "ckpt"))
        out = str(tmp_path / f"to-{os.path.basename(dst)}" / "ckpt-0")
        report = remap(src, dst, path, out)
        for r in report.tables.values():
            assert r.new == 0 and r.dropped == 0 and r.rows_a == r.rows_b, r
        moved = HostEmbedding.from_artifact(dst, seed=9)
        moved.build()
        tf.train.Checkpoint(embedding=moved).restore(out).assert_consumed()
        for table, by_token in ids_src.items():
            for var, before in emb.variables_by_table[table].items():
                x, y = before.numpy(), moved.variables_by_table[table][var].numpy()
                assert x.shape == y.shape
                rows_src = np.array([by_token[t] for t in by_token])
                rows_dst = np.array([ids_dst[table][t] for t in by_token])
                np.testing.assert_array_equal(y[rows_dst], x[rows_src], err_msg=f"{table}/{var}")
                n = len(by_token)  # the OOV buckets follow the tokens in both
                np.testing.assert_array_equal(y[n:], x[n:], err_msg=f"{table}/{var} OOV")
        for table in set(emb.variables_by_table) - set(ids_src):  # identity, hashing: the same ids
            for var, before in emb.variables_by_table[table].items():
                np.testing.assert_array_equal(moved.variables_by_table[table][var].numpy(), before.numpy())


def _row_values(table: str, key: str, dim: int) -> np.ndarray:
    """A row's initial values from the table and the token (or OOV bucket / identity id) it belongs to."""
    seed = int.from_bytes(hashlib.sha256(f"{table}\0{key}".encode("utf-8", "surrogateescape")).digest()[:8], "little")
    return np.random.default_rng(seed).normal(0, 0.1, dim).astype(np.float32)


def _initialised(d: str, spec) -> HostEmbedding:
    emb = HostEmbedding.from_artifact(d, seed=1)
    emb.build()
    ids = token_ids(d, spec)
    for table, variables in emb.variables_by_table.items():
        p = variables["parameters"]
        rows, dim = p.shape
        by_id = {i: t.hex() for t, i in ids.get(table, {}).items()}
        p.assign(np.stack([_row_values(table, by_id.get(i, f"#{i}"), dim) for i in range(rows)]))
    return emb


@pytest.mark.parametrize("example", ["criteo", "movielens"])
def test_host_embedding_losses_are_those_of_frequency_order(artifacts, example):
    """A linear model on the activations, trained a step at a time on each artifact's shards (the same examples in
    the same steps), its embedding rows initialised per token: the same loss at every step."""
    spec, a = artifacts[example, "frequency"]
    _, b = artifacts[example, "balanced"]
    losses = {}
    for name, d in (("frequency", a), ("balanced", b)):
        emb = _initialised(d, spec)
        out = []
        for record in tpu_embed.input_fn(d):
            acts, pres = emb.dequeue(record)
            w = {k: tf.constant(_row_values("w", k, int(v.shape[-1]))) for k, v in acts.items()}
            with tf.GradientTape() as tape:
                tape.watch(acts)
                logit = tf.add_n([tf.reduce_sum(tf.reshape(acts[k], [tf.shape(acts[k])[0], -1, w[k].shape[0]])
                                                * w[k], axis=[1, 2]) for k in sorted(acts)])
                loss = tf.reduce_mean(tf.square(logit - record["label"]) * record["mask"])
            emb.apply_gradients(tape.gradient(loss, acts), pres)
            out.append(float(loss))
        losses[name] = np.array(out)
    assert losses["frequency"].size == read_manifest(a).counts.steps and losses["frequency"].size > 3
    np.testing.assert_allclose(losses["balanced"], losses["frequency"], rtol=2e-5, atol=1e-7)
    assert np.unique(losses["frequency"]).size > 1  # trained: the steps' losses differ
