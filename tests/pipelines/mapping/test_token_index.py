"""TokenIndex (native/_token_index.c, the vocabulary's hash table built once) against its reference,
`pyarrow.compute.index_in` (pipelines.token_index.reference_lookup)."""

from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines import token_index
from pipelines.token_index import TokenIndex, reference_lookup
from tests.helpers import native as helpers_native

# Short tokens from a small alphabet (many collisions of content, lengths 0..17 across the 8-byte words).
tokens = st.lists(st.binary(max_size=17).map(lambda b: bytes(c % 3 + 97 for c in b)), max_size=60)
arrow_types = st.sampled_from([pa.large_binary(), pa.binary(), pa.string(), pa.large_string()])


@pytest.mark.native("token_index")
@settings(max_examples=300)
@given(tokens, tokens, arrow_types, st.data())
def test_native_lookup_equals_index_in(vocab, queries, qtype, data):
    """Any vocabulary (duplicates too: the first wins, as with index_in), any query array type, sliced
    arrays (offsets not at 0), tokens absent or empty."""
    v = pa.array(vocab, pa.large_binary())
    q = pa.array([x.decode() if qtype in (pa.string(), pa.large_string()) else x for x in vocab[:5] + queries], qtype)
    lo = data.draw(st.integers(0, len(q)))
    q = q.slice(lo)
    vlo = data.draw(st.integers(0, len(v)))
    v = v.slice(vlo)
    index = TokenIndex(v)
    assert index._table is not None and len(index) == len(v)
    got = index.lookup(q)
    want = reference_lookup(v, q)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.int64


def _slot_twins(lengths, tries: int = 1 << 19):
    """Two tokens, one of each length (or two of one), that a table of up to 2048 slots cannot tell apart by
    their slots alone: the same first 8 bytes, the same start slot and the same tag (hash bits 40..63 and
    the length up to 255; pipelines/native/token_table.h). Found by trying tails (printable: CSV values too)."""
    seen = {}
    for i in range(tries):
        for n in lengths:
            t = b"abcdefgh" + b"%08x" % i + b"x" * (n - 16)
            h = token_index._native.hash(t)
            key = (h >> 40, h & 2047, min(n, 255))
            if key in seen and (len(lengths) == 1 or len(seen[key]) != n):
                return seen[key], t
            seen.setdefault(key, t)
    raise AssertionError("no tokens alike in their slot")


@pytest.mark.native("token_index")
@pytest.mark.parametrize("lengths", [(16,), (300, 301)], ids=["same length", "lengths past 255"])
def test_tokens_alike_in_their_slot_are_told_apart(lengths):
    """Lookup, counting, dictionary encoding and the CSV reader's encoding tell apart tokens whose slots agree
    (then the stored bytes, or beyond 255 bytes the lengths, decide)."""
    from pipelines.read import csv_reader
    a, b = _slot_twins(lengths)
    assert a != b and a[:8] == b[:8]
    v = pa.array([a], pa.large_binary())
    q = pa.array([b, a, b], pa.large_binary())
    np.testing.assert_array_equal(TokenIndex(v).lookup(q), [-1, 0, -1])
    assert _as_dict(token_index.TokenCounter().add(q)) == {a: 1, b: 2}
    want = token_index.reference_dictionary_encode(q)
    assert token_index.dictionary_encode(q).equals(want)
    _, encoded = csv_reader._plain_table(b"\n".join(q.to_pylist()) + b"\n", ["t"], ["t"], ",", 3, {"t": None})
    assert encoded["t"][2].equals(want)


@pytest.mark.native("token_index")
def test_a_large_vocabulary_many_chunks():
    rng = np.random.default_rng(7)
    v = pa.array(np.char.mod("%x", rng.permutation(200_000) * 7919).astype(object), pa.large_binary())
    index = TokenIndex(v)
    for _ in range(3):
        q = pa.array(np.char.mod("%x", rng.integers(0, 400_000, 20_000) * 7919).astype(object), pa.large_binary())
        np.testing.assert_array_equal(index.lookup(q), reference_lookup(v, q))


def test_nulls_and_no_native_take_the_reference():
    v = pa.array([b"a", b"b"], pa.large_binary())
    q = pa.array([b"b", None, b"c", b"a"], pa.large_binary())
    np.testing.assert_array_equal(TokenIndex(v).lookup(q), [1, -1, -1, 0])
    with mock.patch.object(token_index, "_native", None):
        index = TokenIndex(v)
        assert index._table is None
        np.testing.assert_array_equal(index.lookup(q.drop_null()), [1, -1, 0])


@pytest.mark.native("token_index")
def test_bad_buffers_are_refused():
    with pytest.raises(ValueError, match="power of two"):
        token_index._native.build(np.array([0, 1], np.int64), np.frombuffer(b"a", np.uint8),
                                  np.zeros((3, 2), np.uint64))
    with pytest.raises(ValueError, match="outside"):
        token_index._native.build(np.array([0, 5], np.int64), np.frombuffer(b"a", np.uint8),
                                  np.zeros((4, 2), np.uint64))


# ---------------------------------------------------------------- TokenCounter

def _as_dict(counter) -> dict:
    toks, counts = counter.items()
    assert toks.type == pa.large_binary() and counts.dtype == np.int64 and len(toks) == counts.size == len(counter)
    got = dict(zip(toks.to_pylist(), counts.tolist()))
    assert len(got) == len(toks)  # distinct
    return got


def _fill(batches):
    c = token_index.TokenCounter()
    for toks, qtype, lo, weights in batches:
        q = pa.array([t.decode() if qtype in (pa.string(), pa.large_string()) else t for t in toks], qtype).slice(lo)
        c.add(q, None if weights is None else np.array(weights[lo:], np.int64))
    return c


batch = st.tuples(tokens, arrow_types, st.integers(0, 3)).flatmap(lambda t: st.tuples(
    st.just(t[0]), st.just(t[1]), st.just(min(t[2], len(t[0]))),
    st.none() | st.lists(st.integers(0, 5), min_size=len(t[0]), max_size=len(t[0]))))


@settings(max_examples=300, deadline=None)
@given(st.lists(batch, max_size=6), st.lists(batch, max_size=3))
def test_counter_counts_like_collections_counter_native_and_reference(batches, others):
    """Any tokens (empty, repeated, long), any array type, sliced arrays, with and without counts, merged
    counters and pickled ones: the native counter, the pyarrow reference and collections.Counter agree."""
    import collections
    import pickle
    want = collections.Counter()
    for toks, _, lo, weights in batches + others:
        for i, t in enumerate(toks[lo:]):
            want[t] += 1 if weights is None else weights[lo + i]
    modes = [token_index._native, None] if helpers_native.available("token_index") else [None]
    for native in modes:
        with mock.patch.object(token_index, "_native", native):
            c = _fill(batches)
            merged = pickle.loads(pickle.dumps(c)).merge(_fill(others))
            assert _as_dict(merged) == want


@pytest.mark.native("token_index")
def test_a_pickled_counter_is_restored_at_its_size_in_one_pass(monkeypatch):
    """A combine's accumulators cross its GroupByKey pickled: restored, the counter holds the same tokens in
    the same order with the same counts, counts on as the original does, and was not re-grown token by
    token to get there; its table is built when it is first added to, not to be read."""
    import pickle
    rng = np.random.default_rng(5)
    ids = rng.zipf(1.3, 50_000) % 20_000
    toks = pa.array(np.char.mod("t%x", ids).astype(object), pa.large_binary())
    c = token_index.TokenCounter().add(toks.slice(7))
    data = pickle.dumps(c)
    grown = []
    monkeypatch.setattr(token_index.TokenCounter, "_grow", lambda self, n: grown.append(n))
    built = []
    real_build = token_index._native.build
    monkeypatch.setattr(token_index._native, "build", lambda *a: built.append(1) or real_build(*a))
    restored = pickle.loads(data)
    assert grown == []
    for a, b in zip(restored.items(), c.items()):
        assert np.array_equal(np.asarray(a), np.asarray(b)) if isinstance(a, np.ndarray) else a.equals(b)
    assert built == [] and len(restored) == len(c)  # only read: its table is not built
    monkeypatch.undo()
    more = pa.array([b"t1", b"new", b"t2", b"new"], pa.large_binary())
    assert _as_dict(restored.add(more)) == _as_dict(c.add(more))


@pytest.mark.native("token_index")
def test_counter_grows_past_its_first_arrays_and_keeps_first_seen_order():
    rng = np.random.default_rng(3)
    ids = rng.zipf(1.2, 300_000) % 100_000
    toks = pa.array(np.char.mod("%x", ids).astype(object), pa.large_binary())
    c = token_index.TokenCounter()
    for i in range(0, len(toks), 40_000):
        c.add(toks.slice(i, 40_000))
    got_tokens, got_counts = c.items()
    first = np.sort(np.unique(ids, return_index=True)[1])
    assert got_tokens.to_pylist() == [b"%x" % x for x in ids[first]]
    np.testing.assert_array_equal(got_counts, np.bincount(ids)[ids[first]])


def test_counter_drops_nulls_and_refuses_mismatched_counts():
    c = token_index.TokenCounter().add(pa.array([b"a", None, b"a"]), np.array([1, 5, 2], np.int64))
    assert _as_dict(c) == {b"a": 3}
    with pytest.raises(ValueError, match="2 counts for 3 tokens"):
        c.add(pa.array([b"a", b"b", b"c"]), np.array([1, 2], np.int64))


@pytest.mark.native("token_index")
def test_counter_bad_state_is_refused():
    c = token_index.TokenCounter()
    off, data = np.array([0, 1], np.int64), np.frombuffer(b"a", np.uint8)
    with pytest.raises(ValueError, match="does not match"):
        token_index._native.count(c._offsets, c._data, c._slots, c._counts, np.array([0, 5], np.int64),
                                  off, data, np.zeros(0, np.int64), 0)
    with pytest.raises(ValueError, match="outside"):
        token_index._native.count(c._offsets, c._data, c._slots, c._counts, c._state,
                                  np.array([0, 9], np.int64), data, np.zeros(0, np.int64), 0)


# ---------------------------------------------------------------- dictionary encoding

@settings(max_examples=300, deadline=None)
@given(tokens, arrow_types, st.data())
def test_dictionary_encode_equals_pyarrow_and_decodes_to_the_tokens(toks, qtype, data):
    """Native and reference encodings are the same array (first-seen order), of DICTIONARY_TYPE, whatever
    the input type or slice, and decode to the tokens."""
    q = pa.array([t.decode() if qtype in (pa.string(), pa.large_string()) else t for t in toks], qtype)
    q = q.slice(data.draw(st.integers(0, len(q))))
    want = token_index.reference_dictionary_encode(q)
    modes = [token_index._native, None] if helpers_native.available("token_index") else [None]
    for native in modes:
        with mock.patch.object(token_index, "_native", native):
            got = token_index.dictionary_encode(q)
        assert got.type == token_index.DICTIONARY_TYPE and got.equals(want)
        assert token_index.plain(got).to_pylist() == [t if isinstance(t, bytes) else t.encode() for t in q.to_pylist()]
        assert len(got.dictionary) == len(set(q.to_pylist()))
        assert token_index.dictionary_encode(got) is got


@settings(max_examples=200, deadline=None)
@given(tokens, tokens, st.data())
def test_encoded_tokens_count_and_look_up_as_the_plain_ones(vocab, toks, data):
    """Counting and looking up an encoded array (also one filtered after encoding, whose dictionary then holds
    tokens no value uses, and one of several arrays' dictionaries) gives what the plain tokens give: no token
    is counted 0 times."""
    q = pa.array(toks, pa.large_binary())
    keep = data.draw(st.lists(st.booleans(), min_size=len(toks), max_size=len(toks)))
    enc = token_index.dictionary_encode(q).filter(pa.array(keep, pa.bool_()))
    plain = q.filter(pa.array(keep, pa.bool_()))
    both = token_index.concat_encoded([enc, token_index.dictionary_encode(q)])
    index = TokenIndex(pa.array(vocab, pa.large_binary()))
    np.testing.assert_array_equal(index.lookup(enc), index.lookup(plain))
    np.testing.assert_array_equal(index.lookup(both), index.lookup(pa.concat_arrays([plain, q])))
    assert token_index.plain(both).equals(pa.concat_arrays([plain, q]))
    modes = [token_index._native, None] if helpers_native.available("token_index") else [None]
    for native in modes:
        with mock.patch.object(token_index, "_native", native):
            assert _as_dict(token_index.TokenCounter().add(enc)) == _as_dict(token_index.TokenCounter().add(plain))
            assert _as_dict(token_index.TokenCounter().add(both)) == \
                _as_dict(token_index.TokenCounter().add(pa.concat_arrays([plain, q])))


def test_dictionary_encode_refuses_nulls():
    with pytest.raises(ValueError, match="must not be null"):
        token_index.dictionary_encode(pa.array([b"a", None]))


@pytest.mark.native("token_index")
def test_native_codes_buffer_too_small_is_refused():
    off, data = np.array([0, 1, 2], np.int64), np.frombuffer(b"ab", np.uint8)
    c = token_index.TokenCounter()
    with pytest.raises(ValueError, match="fewer codes"):
        token_index._native.count(c._offsets, c._data, c._slots, c._counts, c._state,
                                  off, data, np.zeros(0, np.int64), 0, np.zeros(1, np.int32))


@settings(max_examples=300, deadline=None)
@given(tokens, st.data())
def test_drop_empty_equals_encoding_the_nonempty_tokens(toks, data):
    """Dropping the empty token after encoding (the parser's blank values) gives the array that encoding the
    non-empty values alone gives, and the mask of the kept values; None when no value is empty."""
    q = pa.array(toks, pa.large_binary()).slice(data.draw(st.integers(0, len(toks))))
    values = q.to_pylist()
    nonempty = np.array([len(t) > 0 for t in values], bool)
    got, kept = token_index.drop_empty(token_index.dictionary_encode(q))
    assert got.equals(token_index.dictionary_encode(q.filter(pa.array(nonempty, pa.bool_()))))
    assert got.type == token_index.DICTIONARY_TYPE
    if nonempty.all():
        assert kept is None
    else:
        np.testing.assert_array_equal(kept, nonempty)


# Distinct tokens that share their first 8 bytes or differ only past them, hold zero bytes (as the zero padding of
# the sort's 8-byte heads does) and run from 0 to 20 bytes; counts with ties, zeros, negatives and large values.
_order_heads = st.sampled_from([b"", b"abcdefgh", b"abcdefg", b"\x00" * 8, b"\xff\x00"])
_order_tails = st.binary(max_size=12).map(lambda b: bytes((0, 1, 97, 255)[c % 4] for c in b))
_order_tokens = st.lists(st.tuples(_order_heads, _order_tails).map(lambda t: t[0] + t[1]), max_size=80, unique=True)
_order_counts = st.sampled_from([0, 1, 1, 2, 3, 65536, 2 ** 40, -5, 2 ** 62])


@pytest.mark.native("token_index")
@settings(max_examples=300)
@given(_order_tokens, st.data())
def test_native_vocabulary_order_equals_pyarrows_sort(toks, data):
    """`token_index.vocabulary_order` (the radix-sorted native order) is pyarrow's sort_indices by count
    descending, then token descending, on any distinct tokens and counts, sliced arrays too."""
    import pyarrow.compute as pc
    counts = np.array(data.draw(st.lists(_order_counts, min_size=len(toks), max_size=len(toks))), np.int64)
    lo = data.draw(st.integers(0, len(toks)))
    arr = pa.array(toks, pa.large_binary()).slice(lo)
    counts = counts[lo:]
    want = pc.sort_indices(pa.table({"token": arr, "count": pa.array(counts)}),
                           sort_keys=[("count", "descending"), ("token", "descending")]).to_numpy()
    got = token_index.vocabulary_order(arr, counts)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.int64


def test_vocabulary_order_refuses_bad_buffers_and_falls_back_without_native():
    if helpers_native.available("token_index"):
        with pytest.raises(ValueError, match="one count and one output per token"):
            token_index._native.order(np.zeros(3, np.int64), np.zeros(0, np.uint8), np.zeros(1, np.int64),
                                      np.zeros(2, np.int64))
        with pytest.raises(ValueError, match="token offsets decrease"):
            token_index._native.order(np.array([0, 2, 1], np.int64), np.zeros(2, np.uint8), np.zeros(2, np.int64),
                                      np.zeros(2, np.int64))
    from pipelines.mapping import vocabulary as pvocab
    table = pa.table({"token": pa.array([b"b", b"a", b"c"], pa.large_binary()), "count": pa.array([2, 2, 5])})
    with mock.patch.object(token_index, "_native", None):
        assert token_index.vocabulary_order(table.column("token").combine_chunks(), np.array([2, 2, 5])) is None
        assert pvocab.vocabulary_order(table).tolist() == [2, 0, 1]
    assert pvocab.vocabulary_order(table).tolist() == [2, 0, 1]
