"""Mapping dictionary-encoded tokens (what the parser makes: `token_index.dictionary_encode`) gives the same ids,
OOV flags, kept values and counts as mapping the plain tokens, for every vocabulary type and policy: the
per-distinct-token computation spread over the values by their codes is exact."""

import collections

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.mapping import ids as mapping
from pipelines.read.parse import FeatureValues
from pipelines.token_index import dictionary_encode
from tpu_embed.artifact.spec import parse_spec

VOCABS = {
    "freq0": {"num_oov_buckets": 0},
    "freq1": {"num_oov_buckets": 1},
    "freq3": {"num_oov_buckets": 3},
    "hash": {"type": "hashing", "num_buckets": 7},
    "ident": {"type": "identity", "num_buckets": 5},
    "ident_default": {"type": "identity", "num_buckets": 5, "default_value": 0},
}


def _spec(invalid_ids="drop"):
    return parse_spec({
        "inputs": {"format": "csv", "patterns": ["*.csv"]}, "label": {"column": "label"},
        "categorical": [{"name": n, "vocabulary": v, "sequence_length": 0} if n != "freq1" else
                        {"name": n, "vocabulary": v, "weight_column": "w"} for n, v in VOCABS.items()],
        "defaults": {"table": {"dim": 4}}, "optimizer": {"type": "sgd", "learning_rate": 0.1},
        "topology": {"num_chips": 1}, "global_batch_size": 4,
        "policies": {"invalid_ids": invalid_ids, "nan_weights": "drop"}}, base_dir="/tmp")


values = st.sampled_from([b"a", b"b", b"cc", b"1", b"4", b"9", b"-2", b"x1", b"3"])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=12).flatmap(
    lambda lengths: st.tuples(st.just(lengths), st.lists(values, min_size=sum(lengths), max_size=sum(lengths)),
                              st.lists(st.sampled_from([1.0, 0.5, float("nan")]), min_size=sum(lengths),
                                       max_size=sum(lengths)))),
       st.sampled_from(list(VOCABS)), st.booleans())
def test_encoded_and_plain_tokens_map_alike(case, name, filtered):
    lengths, toks, weights = case
    spec = _spec()
    f = next(x for x in spec.categorical if x.name == name)
    plain = FeatureValues(lengths=np.array(lengths, np.int64), tokens=pa.array(toks, pa.large_binary()),
                          weights=np.array(weights, np.float32) if f.weight_column else None)
    encoded = FeatureValues(lengths=plain.lengths, tokens=dictionary_encode(plain.tokens), weights=plain.weights)
    if filtered:  # rows dropped after encoding leave unused tokens in the dictionary
        keep = np.arange(len(lengths)) % 2 == 0
        plain, encoded = plain.take_rows(keep), encoded.take_rows(keep)
    vocab = pa.array([b"b", b"a", b"1"], pa.large_binary())
    got_counts, want_counts = collections.Counter(), collections.Counter()
    got = mapping.map_feature(f, encoded, spec, vocab, got_counts)
    want = mapping.map_feature(f, plain, spec, vocab, want_counts)
    for a in ("lengths", "ids", "weights", "oov"):
        x, y = getattr(got, a), getattr(want, a)
        assert (x is None) == (y is None), a
        assert x is None or (x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True)), a
    assert got_counts == want_counts


def test_an_invalid_encoded_id_names_its_value():
    spec = _spec(invalid_ids="error")
    f = next(x for x in spec.categorical if x.name == "ident")
    fv = FeatureValues(lengths=np.array([2, 1], np.int64), tokens=dictionary_encode(pa.array([b"1", b"x1", b"1"])))
    with pytest.raises(mapping.PolicyError, match=r"feature .ident.: f.csv record 10: value .x1. is not an integer id"):
        mapping.map_feature(f, fv, spec, None, collections.Counter(), records=np.array([10, 11]), path="f.csv")


def test_a_nan_weight_error_names_its_record():
    spec = parse_spec({
        "inputs": {"format": "csv", "patterns": ["*.csv"]}, "label": {"column": "label"},
        "categorical": [{"name": "c", "weight_column": "w", "delimiter": "|"}],
        "defaults": {"table": {"dim": 4}}, "optimizer": {"type": "sgd", "learning_rate": 0.1},
        "topology": {"num_chips": 1}, "global_batch_size": 4, "policies": {"nan_weights": "error"}}, base_dir="/tmp")
    fv = FeatureValues(lengths=np.array([1, 0, 2], np.int64), tokens=dictionary_encode(pa.array([b"a", b"b", b"a"])),
                       weights=np.array([1, 1, np.nan], np.float32))
    with pytest.raises(mapping.PolicyError, match=r"feature 'c': f.csv record 12: weight is NaN"):
        mapping.map_feature(spec.categorical[0], fv, spec, pa.array([b"a"]), collections.Counter(),
                            records=np.array([10, 11, 12]), path="f.csv")


def _frequency_spec(num_oov_buckets: int, sequence_length: int = 0):
    return parse_spec({
        "inputs": {"format": "csv", "patterns": ["*.csv"]}, "label": {"column": "label"},
        "categorical": [{"name": "f", "vocabulary": {"num_oov_buckets": num_oov_buckets},
                         "sequence_length": sequence_length}],
        "defaults": {"table": {"dim": 4}}, "optimizer": {"type": "sgd", "learning_rate": 0.1},
        "topology": {"num_chips": 1}, "global_batch_size": 4}, base_dir="/tmp")


@pytest.mark.native("token_index")
@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=0, max_size=14).flatmap(
    lambda lengths: st.tuples(st.just(lengths), st.lists(values, min_size=sum(lengths), max_size=sum(lengths)))),
       st.sampled_from([0, 1, 3]), st.sampled_from([0, 2]), st.booleans(), st.booleans(), st.sampled_from([None, 40]))
def test_the_native_spread_maps_as_the_numpy_rule(case, buckets, sequence_length, encoded, indexed, oov_base):
    """A frequency feature kept as it is (OOV buckets, no weights, nothing truncated) is mapped by one native pass
    (`token_index.spread_ids`): the same block and counts as the numpy rule (`np.take`, `_per_row`), whatever the
    encoding, the OOV buckets and the first OOV id; the other features take the numpy rule."""
    from pipelines import token_index
    lengths, toks = case
    spec = _frequency_spec(buckets, sequence_length)
    f = spec.categorical[0]
    fv = FeatureValues(lengths=np.array(lengths, np.int64), tokens=pa.array(toks, pa.large_binary()))
    if encoded:
        fv = FeatureValues(lengths=fv.lengths, tokens=dictionary_encode(fv.tokens))
    vocab = pa.array([b"b", b"a", b"1"], pa.large_binary())
    index = token_index.TokenIndex(vocab) if indexed else vocab
    spread_calls = []
    real = mapping.spread_ids

    def counted(*a):
        spread_calls.append(1)
        return real(*a)

    got_counts, want_counts = collections.Counter(), collections.Counter()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(mapping, "spread_ids", counted)
        got = mapping.map_feature(f, fv, spec, index, got_counts, oov_base=oov_base)
        m.setattr(mapping, "spread_ids", lambda *a: None)
        want = mapping.map_feature(f, fv, spec, index, want_counts, oov_base=oov_base)
    for a in ("lengths", "ids", "weights", "oov"):
        x, y = getattr(got, a), getattr(want, a)
        assert (x is None) == (y is None), a
        assert x is None or (x.dtype == y.dtype and np.array_equal(x, y)), a
    assert got_counts == want_counts
    truncated = sequence_length and lengths and max(lengths) > sequence_length
    assert bool(spread_calls) == bool(buckets and not truncated)


@pytest.mark.native("token_index")
def test_the_native_spread_refuses_codes_and_lengths_that_do_not_fit():
    from pipelines import token_index
    ids = np.array([5, -1, 7], np.int64)
    with pytest.raises(ValueError, match="a code outside the distinct tokens"):
        token_index.spread_ids(ids, np.array([0, 3], np.int32), np.array([2], np.int64), 6)
    with pytest.raises(ValueError, match="the lengths do not add up to the values"):
        token_index.spread_ids(ids, np.array([0, 2], np.int32), np.array([1], np.int64), 6)
    with pytest.raises(ValueError, match="the lengths do not add up to the values"):
        token_index.spread_ids(ids, np.array([0, 2], np.int32), np.array([3], np.int64), 6)
    out, oov, n = token_index.spread_ids(ids, np.array([2, 1, 0, 0], np.int64), np.array([1, 0, 3], np.int64), 6)
    assert out.tolist() == [7, -1, 5, 5] and oov.tolist() == [1, 0, 1] and n == 2
