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

needs_native = pytest.mark.skipif(token_index._native is None,
                                  reason="the native token index is not built (setup.py builds it in place)")

# Short tokens from a small alphabet (many collisions of content, lengths 0..17 across the 8-byte words).
tokens = st.lists(st.binary(max_size=17).map(lambda b: bytes(c % 3 + 97 for c in b)), max_size=60)
arrow_types = st.sampled_from([pa.large_binary(), pa.binary(), pa.string(), pa.large_string()])


@needs_native
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


@needs_native
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


@needs_native
def test_bad_buffers_are_refused():
    with pytest.raises(ValueError, match="power of two"):
        token_index._native.build(np.array([0, 1], np.int64), np.frombuffer(b"a", np.uint8),
                                  np.zeros(3, np.int32), np.zeros(1, np.uint64))
    with pytest.raises(ValueError, match="outside"):
        token_index._native.build(np.array([0, 5], np.int64), np.frombuffer(b"a", np.uint8),
                                  np.zeros(4, np.int32), np.zeros(1, np.uint64))
