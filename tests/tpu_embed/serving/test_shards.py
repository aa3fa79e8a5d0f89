"""The serving layer against the shards themselves: raw rows through `tpu-embed run`'s jobs and decoded back from
the shards, and the same rows through `tpu_embed.serving` (raw strings, or the serialized tf.train.Examples the
job read), give the same entries per example (ids, gains as the CSR holds them, tensor-core ids and weights,
dense values), and the exported SavedModel predicts what the model predicts on the shards' activations.

Example specs (criteo, movielens: every row) and generated specs (every vocabulary kind, OOV buckets, identity
values out of range or not integers, hashing, weights, sequences and tensor-core widths that truncate,
delimiters, blanks, non-ASCII and non-UTF-8 tokens, weight counts that do not match; CSV and TFRecord inputs).
Records the jobs dead-letter are flagged `valid == False` and are the ones missing from the shards. For CSV
inputs, the tf.Transform output the run wrote, read by tensorflow-transform, gives the same entries too."""

import csv
import os

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from tests.tpu_embed.serving.generated import column_kinds, rows, specs, write, write_tfrecord
from tests.tpu_embed.serving.shards import assert_serves_the_shards, from_transformed, shard_steps
from tpu_embed import HostEmbedding
from tpu_embed.serving import RawFeatureMapping, export_saved_model
from tpu_embed.training.dlrm import dlrm

pytestmark = pytest.mark.slow  # `tpu-embed run`'s jobs per spec

# Each case runs the jobs and exports: a few by default, more with TPU_EMBED_SERVING_JOB_EXAMPLES.
N = min(int(os.environ.get("TPU_EMBED_HYPOTHESIS_EXAMPLES", "100")),
        int(os.environ.get("TPU_EMBED_SERVING_JOB_EXAMPLES", "4")))


def _trained_predictions(spec, d):
    """(HostEmbedding, model, predictions of every real example of the shards in order): the model on the
    shards' activations (tables at their initial values: the lookup is what is compared)."""
    emb = HostEmbedding.from_artifact(d, seed=1)
    model = dlrm(len(spec.dense), {f.name: spec.table(f.table).dim for f in spec.categorical}, seed=1)
    want = []
    for step in shard_steps(d):
        dense = tf.constant(np.concatenate([r["dense"] for r in step]))
        p = model({"dense": dense, "embeddings": emb.dequeue(step)[0]}).numpy()
        want.append(p[np.concatenate([r["mask"] for r in step]).astype(bool)])
    want = np.concatenate(want)
    assert np.isfinite(want).all(), want
    return emb, model, want


def _check_export(spec, d, tmp, call):
    """The exported SavedModel (loaded back) on the records gives the model's predictions on the shards."""
    emb, model, want = _trained_predictions(spec, d)
    loaded = tf.saved_model.load(export_saved_model(d, emb, model, os.path.join(tmp, "model")))
    got = call(loaded)
    valid = got["valid"].numpy()
    np.testing.assert_allclose(got["predictions"].numpy()[valid], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["criteo", "movielens"])
def test_example_specs_serve_the_shards(example_artifacts, name):
    spec, d = example_artifacts[name]
    with open(spec.input_patterns()[0], newline="", encoding="utf-8") as fh:
        records = list(csv.DictReader(fh))
    mapping = RawFeatureMapping.from_artifact(d)
    assert mapping.value_kinds == {c: ("bytes_list",) for c in spec.required_columns()}  # CSV cells: text
    out = mapping({c: tf.constant([r[c] for r in records]) for c in mapping.columns})
    assert out["valid"].numpy().all()
    n = assert_serves_the_shards(spec, d, out)
    # The rows as tf.train.Examples (a blank cell: no key), parsed as the kinds the data held and as any kind.
    examples = tf.constant([tf.train.Example(features=tf.train.Features(feature={
        c: tf.train.Feature(bytes_list=tf.train.BytesList(value=[r[c].encode()]))
        for c in mapping.columns if r[c] != ""})).SerializeToString() for r in records])
    for any_kind in (False, True):
        assert_serves_the_shards(spec, d, mapping.map_examples(examples, any_kind=any_kind))
    print(f"\n[serving] {name}: {n} examples, every feature's entries equal to the shards'")


# No shrinking: every case runs the jobs (a failure is reported as drawn).
SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), database=None, max_examples=N,
                phases=[Phase.explicit, Phase.generate])


def test_generated_specs_serve_the_shards(tmp_path_factory):
    seen = {"csv": 0, "tfrecord": 0, "dead": 0, "examples": 0, "all_dead": 0, "transform_output": 0}

    @settings(**SETTINGS)
    @given(st.data())
    def run(data):
        raw_spec = data.draw(specs())
        rows_ = data.draw(rows(raw_spec, min_rows=4, max_rows=12))
        fmt = data.draw(st.sampled_from(["csv", "tfrecord"]))
        d = str(tmp_path_factory.mktemp("generated"))
        if fmt == "csv":
            spec = write(d, raw_spec, rows_)
        else:
            columns = write(d, raw_spec, rows_).required_columns()
            kinds = column_kinds(data.draw, rows_, columns)
            spec, examples = write_tfrecord(d, raw_spec, rows_, kinds)
        from tests.helpers import jobs
        try:
            # CSV cases: the run writes the transform output too (checked below).
            jobs.run(spec, os.path.join(d, "artifact"), transform_output=fmt == "csv")
        except jobs.DataError as e:  # every record dead-lettered: the job makes no artifact to serve
            assert "all dead-lettered" in str(e), e
            seen["all_dead"] += 1
            assume(False)
        art = os.path.join(d, "artifact")
        mapping = RawFeatureMapping.from_artifact(art)
        if fmt == "csv":
            raw = {c: tf.constant([r[c] for r in rows_]) for c in mapping.columns}
            out = mapping(raw)
        else:
            # The kinds the jobs recorded are the ones written (a column without a value: none), and the typed
            # parse they select gives the shards' entries, as the parse of any kind does.
            assert mapping.value_kinds == {c: (f"{k}_list",) for c, k in kinds.items()
                                           if any(r[c] != b"" for r in rows_)}
            out = mapping.map_examples(tf.constant(examples))
            assert_serves_the_shards(spec, art, mapping.map_examples(tf.constant(examples), any_kind=True))
        seen["examples"] += assert_serves_the_shards(spec, art, out)
        seen[fmt] += 1
        seen["dead"] += int((~out["valid"].numpy()).sum())
        if fmt == "csv":
            _check_export(spec, art, d, lambda m: m.signatures["raw"](**raw))
            # tf.Transform's reading of the transform output: the same entries.
            import tensorflow_transform as tft
            tft_output = tft.TFTransformOutput(os.path.join(art, "transform_output"))
            layer = tft_output.transform_features_layer()
            # Every cell one value, blanks included: as the CSV reader reads them (a blank weight cell is one
            # blank weight; no value would be no weight).
            transformed = layer({c: tf.RaggedTensor.from_tensor(v[:, None]).to_sparse() for c, v in raw.items()})
            assert_serves_the_shards(spec, art, from_transformed(transformed, spec))
            seen["transform_output"] += 1
        else:
            _check_export(spec, art, d, lambda m: m.signatures["serving_default"](examples=tf.constant(examples)))

    run()
    print(f"\n[serving] generated specs against their shards: {seen}")
    assert seen["csv"] + seen["tfrecord"] >= N
