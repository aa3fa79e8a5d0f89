"""`tf.train.Example` in the protobuf wire format, written and read by hand (numpy, no TensorFlow).

    encode_example({key: ("bytes" | "int64" | "float", values)}) -> bytes   # keys sorted: equal content, equal bytes
    decode_example(data) -> {key: (kind, values)}                         # any tf.train.Example, packed or not

`varint` and `length_delimited` are the two wire-format primitives (also used to write test and demo
inputs); `reference_encode_example` is the plain, message-by-message encoder `encode_example` is tested
against. `read_varint`, `fields` and `int64_list` are the reader's parts, for any protobuf message: the
jax records' in-place parser (`tpu_embed.jax.input`) and the checkpoint index reader
(`tpu_embed.training.remap.bundle`) use them too.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Mapping, Tuple

import numpy as np


def varint(n: int) -> bytes:
    """A protobuf base-128 varint (negative ints as their 64-bit two's complement)."""
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


_SMALL_VARINTS = [bytes([i]) for i in range(128)] + [bytes([i & 0x7F | 0x80, i >> 7]) for i in range(128, 1 << 14)]


def _varint(n: int) -> bytes:
    """`varint`, looked up for the tags and lengths below 2^14 that make most of a record's framing."""
    return _SMALL_VARINTS[n] if 0 <= n < 16384 else varint(n)


def _packed_varints(values) -> bytes:
    """The varints of `values` one after another (a record's partition counts and sizes: mostly small)."""
    return b"".join(map(_varint, map(int, values)))


def length_delimited(field: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint((field << 3) | 2) + _varint(len(payload)) + payload


def _feature_parts(value) -> Tuple[List[Any], int]:
    """(the byte chunks of one tf.train.Feature message, their total length): framed without copying the
    values (a bytes value may be any bytes-like object of its bytes, e.g. a memoryview of an array)."""
    kind, v = value
    if kind != "bytes":  # numbers: packed into one small message, as `_feature_bytes` writes them
        whole = _feature_bytes(value)
        return [whole], len(whole)
    inner: List[Any] = []
    n = 0
    for x in v:
        head = b"\x0a" + _varint(len(x))  # BytesList.value (field 1, length-delimited)
        inner += (head, x)
        n += len(head) + len(x)
    head = b"\x0a" + _varint(n)  # Feature.bytes_list (field 1)
    return [head] + inner, len(head) + n


def encode_example(features: Mapping[str, Tuple[str, Any]]) -> bytes:
    """A serialized tf.train.Example from {key: ("bytes"|"int64"|"float", values)}, keys sorted.

    Each message's length is known before its bytes are written, so the values are copied once, into
    the result (`reference_encode_example`, which nests `length_delimited`, copied a step's ~1 MB of
    arrays four times); the same bytes (tests/tpu_embed/artifact/test_shards.py)."""
    entries: List[Any] = []
    total = 0
    for k in sorted(features):
        key = length_delimited(1, k.encode("utf-8"))  # Features.feature entry: key (1), value (2)
        parts, n = _feature_parts(features[k])
        value_head = b"\x12" + _varint(n)
        size = len(key) + len(value_head) + n
        entry_head = b"\x0a" + _varint(size)  # Features.feature (field 1)
        entries += [entry_head, key, value_head] + parts
        total += len(entry_head) + size
    return b"".join([b"\x0a" + _varint(total)] + entries)  # Example.features (field 1)


def _feature_bytes(value) -> bytes:
    kind, v = value
    if kind == "bytes":
        inner = b"".join(length_delimited(1, x) for x in v)
        return length_delimited(1, inner)
    if kind == "int64":
        packed = _packed_varints(v)
        return length_delimited(3, length_delimited(1, packed) if packed else b"")
    if kind == "float":
        packed = np.asarray(v, dtype="<f4").tobytes()
        return length_delimited(2, length_delimited(1, packed) if packed else b"")
    raise ValueError(kind)


def reference_encode_example(features: Mapping[str, Tuple[str, Any]]) -> bytes:
    """`encode_example` the plain way, message by message (the reference it is tested against)."""
    entries = b"".join(
        length_delimited(1, length_delimited(1, k.encode("utf-8")) + length_delimited(2, _feature_bytes(features[k])))
        for k in sorted(features))
    return length_delimited(1, entries)


def read_varint(buf, pos: int) -> Tuple[int, int]:
    """(the protobuf varint at byte `pos` of `buf`, the position after it); `buf`: bytes or a memoryview. A
    varint cut off by the end of `buf` is a ValueError. One-byte varints (tags, short lengths) take the
    short path: they are most of a record's."""
    try:
        b = buf[pos]
        if b < 0x80:
            return b, pos + 1
        result, shift = b & 0x7F, 7
        pos += 1
        while True:
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result, pos
            shift += 7
    except IndexError:
        raise ValueError("truncated varint") from None


def fields(buf) -> Iterator[Tuple[int, int, Any]]:
    """(field number, wire type, value) of each field of the protobuf message `buf` (bytes or a memoryview), in
    order: a varint (wire type 0) as an int, the others as slices of `buf` (a memoryview's slices copy
    nothing)."""
    pos, n = 0, len(buf)
    while pos < n:
        tag, pos = read_varint(buf, pos)
        wire = tag & 7
        if wire == 2:
            length, pos = read_varint(buf, pos)
            yield tag >> 3, 2, buf[pos:pos + length]
            pos += length
        elif wire == 0:
            v, pos = read_varint(buf, pos)
            yield tag >> 3, 0, v
        elif wire == 5:
            yield tag >> 3, 5, buf[pos:pos + 4]
            pos += 4
        elif wire == 1:
            yield tag >> 3, 1, buf[pos:pos + 8]
            pos += 8
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def int64_list(lst) -> List[int]:
    """The values of an Int64List message (packed or not), as signed ints."""
    out: List[int] = []
    for _, _, x in fields(lst):
        if isinstance(x, int):
            out.append(x - (1 << 64) if x >= 1 << 63 else x)
        else:
            p = 0
            while p < len(x):
                v, p = read_varint(x, p)
                out.append(v - (1 << 64) if v >= 1 << 63 else v)
    return out


def decode_example(data: bytes) -> Dict[str, Tuple[str, Any]]:
    """Inverse of `encode_example` (handles any tf.train.Example, packed or not)."""
    out: Dict[str, Tuple[str, Any]] = {}
    for f, _, features in fields(data):
        if f != 1:
            continue
        for f2, _, entry in fields(features):
            if f2 != 1:
                continue
            key, value = None, b""
            for f3, _, x in fields(entry):
                if f3 == 1:
                    key = x.decode("utf-8")
                elif f3 == 2:
                    value = x
            if key is None:  # a map entry without a key: nothing to name it by
                continue
            for kind_field, _, lst in fields(value):
                if kind_field == 1:
                    out[key] = ("bytes", [x for _, _, x in fields(lst)])
                elif kind_field == 2:
                    vals = []
                    for _, _, x in fields(lst):
                        vals.extend(np.frombuffer(x, "<f4").tolist())
                    out[key] = ("float", vals)
                elif kind_field == 3:
                    out[key] = ("int64", int64_list(lst))
            if key not in out:
                out[key] = ("bytes", [])
    return out

