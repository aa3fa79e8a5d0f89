"""The serving mapping (TensorFlow ops) against the offline jobs' own code on the same raw rows: generated specs
and CSV rows through `pipelines.read` + `pipelines.mapping.ids.map_chunk` (the shard job's mapping) give the ids,
weights, dense values and dead letters that `tpu_embed.serving.map_raw` gives from the rows' raw strings, and from
the rows as serialized tf.train.Examples; under `error` policies the job stops where serving flags the record."""

import os

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import offline_mapping
from tests.tpu_embed.serving.generated import TOKENS, one_value_feature, rows, specs, write
from tpu_embed.serving import MappingPlan, RawFeatureMapping

N = int(os.environ.get("TPU_EMBED_HYPOTHESIS_EXAMPLES", "100"))
SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), database=None)
VOCAB = [b"b", b"a", b"7", "\u00e9t\u00e9".encode(), b"1_0"]


def _mapping(spec, d, vocab_tokens, capacity=0):
    os.makedirs(os.path.join(d, "vocab"), exist_ok=True)
    sizes = {}
    for key, feats in spec.vocabulary_groups().items():
        data = offline_mapping.vocabulary_file_bytes(vocab_tokens[key])
        with open(os.path.join(d, "vocab", f"{feats[0].name}.txt"), "wb") as fh:
            fh.write(data)
        sizes[key] = len(offline_mapping.read_vocabulary_file(data)) + capacity  # a capacity: rows beyond the file's
    return RawFeatureMapping(MappingPlan.from_spec(spec, sizes, d))


def _example(row, columns) -> bytes:
    feats = {c: tf.train.Feature(bytes_list=tf.train.BytesList(value=[row[c]])) for c in columns}
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


def _check(spec, d, rows_, vocab_tokens, capacity=0):
    valid_rows, dead, offline = offline_mapping.map_csv(spec, d, vocab_tokens, capacity)
    mapping = _mapping(spec, d, vocab_tokens, capacity)
    raw = {c: tf.constant([r[c] for r in rows_]) for c in mapping.columns}
    outs = [mapping(raw), mapping.map_examples(tf.constant([_example(r, mapping.columns) for r in rows_]))]
    for out in outs:
        valid = out["valid"].numpy()
        if isinstance(offline, offline_mapping.PolicyError):
            # The job stops on this chunk: serving flags at least one of its records, and every dead letter.
            assert not valid[valid_rows].all(), str(offline)
            assert not valid[sorted(dead)].any()
            continue
        assert sorted(np.flatnonzero(~valid).tolist()) == sorted(dead), (dead, valid)
        if offline is None:
            continue
        np.testing.assert_array_equal(out["dense"].numpy()[valid_rows], offline.dense)
        for f in spec.categorical:
            fb = offline.features[f.name]
            ids = out["ids"][f.name]
            np.testing.assert_array_equal(ids.row_lengths().numpy()[valid_rows], fb.lengths, err_msg=f.name)
            got = tf.gather(ids, valid_rows).flat_values.numpy()
            np.testing.assert_array_equal(got, fb.ids, err_msg=f.name)
            if f.weight_column:
                w = tf.gather(out["weights"][f.name], valid_rows).flat_values.numpy()
                np.testing.assert_array_equal(w, fb.weights, err_msg=f.name)


def _vocab_tokens(spec):
    return {k: VOCAB[:len(k) % 4 + 1] for k in spec.vocabulary_groups()}


def test_generated_specs_map_as_the_offline_code(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("mapping"))
    tried = [0]

    @settings(max_examples=N, **SETTINGS)
    @given(specs(policies=("drop", "error")).flatmap(lambda raw: st.tuples(st.just(raw), rows(raw))))
    def run(case):
        raw_spec, rows_ = case
        tried[0] += 1
        spec = write(d, raw_spec, rows_)
        _check(spec, d, rows_, _vocab_tokens(spec))

    run()
    print(f"\n[serving] generated specs against the offline mapping: {tried[0]} specs")
    assert tried[0] >= min(N, 20)


@pytest.mark.parametrize("capacity", [0, 10])
def test_every_token_maps_as_offline(tmp_path, capacity):
    """Every token of the generated rows, alone, under each vocabulary kind (one spec, fixed rows); with a
    capacity (vocabulary modes append / frozen) the manifest's size, not the file's lines, is the first OOV
    id."""
    raw_spec = {
        "name": "t", "inputs": {"format": "csv", "patterns": ["in.csv"]}, "label": {"column": "label"},
        "categorical": [{"name": "freq", "vocabulary": {"num_oov_buckets": 3}},
                        {"name": "ident", "column": "freq", "vocabulary": {"type": "identity", "num_buckets": 13}},
                        {"name": "hash", "column": "freq", "vocabulary": {"type": "hashing", "num_buckets": 17}}],
        "defaults": {"table": {"dim": 4}}, "optimizer": {"type": "sgd", "learning_rate": 0.1},
        "topology": {"num_chips": 1, "num_sc_per_chip": 1}, "global_batch_size": 1}
    rows_ = [{"label": b"1", "freq": t} for t in TOKENS]
    spec = write(str(tmp_path), raw_spec, rows_)
    _check(spec, str(tmp_path), rows_, {"freq": VOCAB}, capacity)


@pytest.mark.parametrize("vocab", [VOCAB, VOCAB + [b"\xff\xfe"]], ids=["utf8", "not_utf8"])
def test_a_token_of_a_vocabulary_is_utf8_only_where_the_vocabulary_is(tmp_path, vocab):
    """Serving takes a token found in a vocabulary whose file is UTF-8 text as UTF-8 without looking at its bytes
    (a CSV spec's vocabularies are: the reader dead-letters records that are not). A vocabulary holding a token
    that is not UTF-8 (taken from another artifact): the CSV record with that token is a dead letter all the
    same. One frequency feature, so no other rule looks at the token."""
    raw_spec = {
        "name": "t", "inputs": {"format": "csv", "patterns": ["in.csv"]}, "label": {"column": "label"},
        "categorical": [{"name": "freq", "vocabulary": {"num_oov_buckets": 1}}],
        "defaults": {"table": {"dim": 4}}, "optimizer": {"type": "sgd", "learning_rate": 0.1},
        "topology": {"num_chips": 1, "num_sc_per_chip": 1}, "global_batch_size": 1}
    rows_ = [{"label": b"1", "freq": t} for t in TOKENS]
    spec = write(str(tmp_path), raw_spec, rows_)
    _check(spec, str(tmp_path), rows_, {"freq": vocab})


def _varint(n: int) -> bytes:
    out = b""
    while True:
        out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
        n >>= 7
        if not n:
            return out


def test_parse_examples_takes_every_kind_and_the_last_of_a_repeated_key():
    """An Example's `features` map written with a key twice (serialized Features concatenated: their entries
    in order) holds the later value, as protobuf reads a map: the entry parsed is the last one, of whichever
    kind, and text columns give each kind's token text."""
    from tpu_embed.serving.mapping import parse_examples

    def ex(*parts):
        payload = b"".join(
            tf.train.Features(feature={k: one_value_feature(v) for k, v in kw.items()}).SerializeToString()
            for kw in parts)
        return b"\x0a" + _varint(len(payload)) + payload

    rows = [ex(dict(a=b"x", b=3, c=0.5), dict(a=7)), ex(dict(b=b"y", c=2.0)), ex(),
            ex(dict(a=1e16, c=-4), dict(c=b"z"), dict(b=12))]
    for r in rows:  # protobuf reads them as the test expects
        tf.train.Example.FromString(r)
    assert tf.train.Example.FromString(rows[0]).features.feature["a"].int64_list.value == [7]
    got = parse_examples(tf.constant(rows), ["a", "b", "c"], text_columns=["a"])
    # A FloatList holds float32: the token is the repr of that value widened (as the offline reader's).
    assert got["a"].strings.to_list() == [[b"7"], [], [], [repr(float(np.float32(1e16))).encode()]]
    b, c = got["b"], got["c"]
    assert b.ints.to_list() == [[3], [], [], [12]] and b.strings.to_list() == [[], [b"y"], [], []]
    assert c.floats.to_list() == [[0.5], [2.0], [], []] and c.strings.to_list() == [[], [], [], [b"z"]]
    assert c.ints.to_list() == [[], [], [], []]
