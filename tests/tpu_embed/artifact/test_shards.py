"""The shard record format: hand-written protobuf equals TF's parsing; numpy decode round trip."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_embed.artifact import example_wire, shard_records, tfrecord
from tpu_embed.artifact.shard_format import ShardFormat
from tpu_embed.sparsecore import CsrBatch
from tpu_embed.training.shard_parse import parse_fn


def test_encode_example_parses_with_tensorflow():
    import tensorflow as tf
    feats = {"b": ("bytes", [b"\x00\x01", b"zz"]), "i": ("int64", [1, -2, 2 ** 40]), "f": ("float", [0.5, -1.25]),
             "e": ("int64", [])}
    data = example_wire.encode_example(feats)
    ex = tf.train.Example.FromString(data)
    assert list(ex.features.feature["b"].bytes_list.value) == [b"\x00\x01", b"zz"]
    assert list(ex.features.feature["i"].int64_list.value) == [1, -2, 2 ** 40]
    assert list(ex.features.feature["f"].float_list.value) == [0.5, -1.25]
    assert example_wire.decode_example(data) == {k: (kind, list(v)) for k, (kind, v) in feats.items()}
    assert example_wire.decode_example(ex.SerializeToString())["i"] == ("int64", [1, -2, 2 ** 40])
    # keys are written sorted: the same content gives the same bytes
    assert example_wire.encode_example(dict(reversed(list(feats.items())))) == data


_values = st.one_of(
    st.tuples(st.just("bytes"), st.lists(st.binary(max_size=300), max_size=4)),
    st.tuples(st.just("int64"), st.lists(st.integers(-2 ** 63, 2 ** 63 - 1), max_size=5)),
    st.tuples(st.just("float"), st.lists(st.floats(width=32, allow_nan=False), max_size=5)),
    # an array's bytes as the record builder passes them: a memoryview, no copy
    st.tuples(st.just("array"), st.lists(st.integers(-2 ** 31, 2 ** 31 - 1), max_size=200)))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=12), _values, max_size=6))
def test_encode_example_equals_its_message_by_message_reference(feats):
    """Framing with the lengths computed first (values copied once) gives the bytes of nesting each
    message in its parent's length-delimited field, for any keys (UTF-8), kinds and sizes (lengths
    across varint widths), and TF parses them."""
    import tensorflow as tf
    given_ = {k: (("bytes", [memoryview(np.asarray(v, np.int32)).cast("B")]) if kind == "array" else (kind, v))
              for k, (kind, v) in feats.items()}
    want = {k: (("bytes", [np.asarray(v, np.int32).tobytes()]) if kind == "array" else (kind, v))
            for k, (kind, v) in feats.items()}
    data = example_wire.encode_example(given_)
    assert data == example_wire.reference_encode_example(want)
    assert tf.train.Example.FromString(data).SerializeToString(deterministic=True) is not None
    assert example_wire.decode_example(data) == {k: (kind, list(v)) for k, (kind, v) in want.items()}


def test_packed_varints_are_the_varints_one_after_another():
    """The table of small varints (records' partition counts and sizes) against `varint` itself: every
    one- and two-byte value, the edges around them and negative / 64-bit values."""
    values = list(range(1 << 14)) + [1 << 14, (1 << 14) + 1, 2 ** 40, 2 ** 63 - 1, -1, -(2 ** 63)]
    assert example_wire._packed_varints(values) == b"".join(example_wire.varint(v) for v in values)
    assert [example_wire._varint(v) for v in values] == [example_wire.varint(v) for v in values]  # the framing's
    assert example_wire._packed_varints(np.array([3, 300, -5], np.int64)) == b"".join(
        map(example_wire.varint, (3, 300, -5)))


def test_the_reader_reads_what_varint_and_tensorflow_write():
    """`read_varint` inverts `varint` (one to ten bytes, negatives as 64-bit two's complement) from bytes and
    memoryviews, a cut-off varint is a ValueError; `fields` gives every wire type of a message TensorFlow
    serializes (a packed Int64List: wire type 2; a varint: 0) as `int64_list` reads it."""
    import tensorflow as tf
    values = [0, 1, 127, 128, 300, 1 << 14, 2 ** 40, 2 ** 63 - 1, -1, -(2 ** 63)]
    data = b"".join(map(example_wire.varint, values))
    for buf in (data, memoryview(data)):
        pos, got = 0, []
        while pos < len(buf):
            v, pos = example_wire.read_varint(buf, pos)
            got.append(v - (1 << 64) if v >= 1 << 63 else v)
        assert got == values
    with pytest.raises(ValueError, match="truncated varint"):
        example_wire.read_varint(example_wire.varint(300)[:1], 0)
    lst = tf.train.Int64List(value=values).SerializeToString()
    assert [(n, w) for n, w, _ in example_wire.fields(lst)] == [(1, 2)]
    assert example_wire.int64_list(lst) == example_wire.int64_list(memoryview(lst)) == values
    unpacked = b"".join(example_wire.varint(0x08) + example_wire.varint(v) for v in values)  # field 1, wire 0
    assert [(n, w) for n, w, _ in example_wire.fields(unpacked)] == [(1, 0)] * len(values)
    assert example_wire.int64_list(unpacked) == values
    with pytest.raises(ValueError, match="wire type 3"):
        list(example_wire.fields(b"\x0b"))


def _buffer_kwargs():
    import dataclasses
    names = {f.name for f in dataclasses.fields(CsrBatch)}
    return {k: v for k, v in (("row_pointers_buffer_size", 16), ("ids_buffer_size", 64)) if k in names}


def test_step_record_round_trip_and_tf_parse():
    b = CsrBatch(stack="s", row_pointers=np.array([2, 8, 8, 8, 0, 0], np.int32),
                 sorted_sample_ids=np.array([0, 1, 7, 7], np.int32), sorted_token_ids=np.array([3, 4, 9, 9], np.int32),
                 sorted_gains=np.array([1, .5, 0, 0], np.float32), sample_count=4,
                 num_minibatches_per_physical_sparse_core=1, row_pointers_unpadded_size=4, ids_unpadded_size=2,
                 **_buffer_kwargs())
    rec = shard_records.encode_step_record(step=3, host=0, label=np.array([1, 0], np.float32),
                                           mask=np.ones(2, np.float32), dense=np.array([[1, 2], [3, 4]], np.float32),
                                           tensor_core={"t": (np.array([1, 0]), np.array([5]), None)}, chips=[{"s": b}])
    fmt = ShardFormat(1, 1, 2, ("x", "y"), (("t", False, 1),), (("s", 16, 64),))
    d = shard_records.decode_record(rec, fmt)
    assert d["step"] == 3 and d["dense"].tolist() == [[1, 2], [3, 4]]
    assert d["sparse_core"][0]["s"]["sorted_token_ids"].tolist() == [3, 4]
    assert d["sparse_core"][0]["s"]["row_pointers"].tolist() == [2, 8, 8, 8]
    assert ShardFormat.from_json(fmt.to_json()) == fmt
    t = parse_fn(fmt)(rec)
    assert t["sparse_core"][0]["s"]["sorted_gains"].shape == (64,)
    assert t["sparse_core"][0]["s"]["row_pointers"].numpy()[:4].tolist() == [2, 8, 8, 8]
    assert int(t["sparse_core"][0]["s"]["ids_unpadded_size"]) == 2
    assert t["tensor_core"]["t"].to_list() == [[5], []]
    framed = tfrecord.frame(rec) * 2
    assert [p for _, p in tfrecord.iter_records(framed)] == [rec, rec]
