"""The text of a value of each kind a reader meets (bytes, integers, floats), and the value kinds of TFRecord records.

One rule for every format, the one a CSV cell holding the value would have:

* bytes and strings: themselves;
* integers: their decimal text (`-15`, `123456789`; Arrow's cast);
* floats: `repr()` of the value widened to float64 (`3.0`, `1e+16`, float32 0.1 -> `0.10000000149011612`).

The categorical parse (`pipelines.read.parse`) takes a float column's tokens from `float_text`; the TFRecord reader
turns a key whose value kind differs between the records of one batch into text with `list_as_text`, so that
categorical features see the same tokens and dense, weight and identity columns parse the same numbers
(`tpu_embed.serving` takes any kind per key by the same rule).
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import pyarrow as pa
import pyarrow.compute as pc

KINDS = ("bytes_list", "float_list", "int64_list")  # tf.train.Feature's kinds, as its oneof names them


def int_text(values: pa.Array) -> pa.Array:
    """Integer values -> their decimal text (large_binary); nulls stay null."""
    return pc.cast(pc.cast(values, pa.int64()), pa.large_string()).cast(pa.large_binary())


def float_text(values: pa.Array) -> pa.Array:
    """Float values -> `repr()` of each value widened to float64 (large_binary); nulls stay null."""
    return pa.array([None if v is None else repr(float(v)).encode() for v in values.to_pylist()], pa.large_binary())


def value_text(values: pa.Array) -> pa.Array:
    """Flat values of any kind (bytes, strings, integers, floats) -> their text (large_binary)."""
    t = values.type
    if pa.types.is_large_binary(t):
        return values
    if pa.types.is_integer(t):
        return int_text(values)
    if pa.types.is_floating(t):
        return float_text(values)
    if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
        return values.cast(pa.large_binary())
    raise TypeError(f"no text rule for values of type {t}")


def list_as_text(col: pa.Array) -> pa.Array:
    """A list column of bytes, integers or floats -> large_list<large_binary> of their text: the same rows,
    the same values per row, null rows null."""
    if pa.types.is_large_list(col.type) and pa.types.is_large_binary(col.type.value_type):
        return col
    offsets = col.offsets.cast(pa.int64())
    mask = col.is_null() if col.null_count else None
    return pa.LargeListArray.from_arrays(offsets, value_text(col.values), mask=mask)


# ---------------------------------------------------------------- the kinds of a tf.train.Example's keys

_PROBE = None


def _probe_class():
    """A message class reading a serialized tf.train.Example as far as its keys and each key's kind: the same
    wire format (Example.features = 1, Features.feature = 1: map<string, Feature>, Feature's oneof kind:
    bytes_list = 1, float_list = 2, int64_list = 3) with each list left as bytes (not decoded). proto2, so a
    key that is not UTF-8 is read as TensorFlow reads it. Built once, without TensorFlow."""
    global _PROBE
    if _PROBE is None:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
        fd = descriptor_pb2.FileDescriptorProto(name="tpu_embed_example_kinds.proto", package="tpu_embed_kinds",
                                                syntax="proto2")
        F = descriptor_pb2.FieldDescriptorProto
        feature = fd.message_type.add(name="Feature")
        feature.oneof_decl.add(name="kind")
        for number, name in enumerate(KINDS, 1):
            feature.field.add(name=name, number=number, type=F.TYPE_BYTES, label=F.LABEL_OPTIONAL, oneof_index=0)
        features = fd.message_type.add(name="Features")
        entry = features.nested_type.add(name="FeatureEntry")
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
        entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                        type_name=".tpu_embed_kinds.Feature")
        features.field.add(name="feature", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                           type_name=".tpu_embed_kinds.Features.FeatureEntry")
        example = fd.message_type.add(name="Example")
        example.field.add(name="features", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                          type_name=".tpu_embed_kinds.Features")
        pool = descriptor_pool.DescriptorPool()
        pool.Add(fd)
        _PROBE = message_factory.GetMessageClass(pool.FindMessageTypeByName("tpu_embed_kinds.Example"))
    return _PROBE


def record_kinds(payloads: Sequence[bytes], keys: Sequence[str]) -> List[Optional[Tuple[Optional[str], ...]]]:
    """Per serialized tf.train.Example, the kind of each of `keys` (an item of KINDS; None where the key is
    missing or its Feature has no kind), or None for a payload that is not an Example."""
    from google.protobuf.message import DecodeError
    example = _probe_class()
    out: List[Optional[Tuple[Optional[str], ...]]] = []
    parse = example.FromString
    for p in payloads:
        try:
            get = parse(p).features.feature.get
        except DecodeError:
            out.append(None)
            continue
        out.append(tuple([None if (v := get(k)) is None else v.WhichOneof("kind") for k in keys]))
    return out


# ---------------------------------------------------------------- the kinds the records held (for serving)

COUNTER_PREFIX = "value_kinds/"  # counters "value_kinds/<column>/<kind>": records whose column held that kind


def kind_of_type(t: pa.DataType) -> Optional[str]:
    """The tf.train.Feature kind (an item of KINDS) a reader column's type stands for, a list type by its values':
    bytes and strings `bytes_list`, integers `int64_list`, floats `float_list`; None for no values (type null)
    or another type."""
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t = t.value_type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
        return "bytes_list"
    if pa.types.is_integer(t):
        return "int64_list"
    if pa.types.is_floating(t):
        return "float_list"
    return None


def kind_counts(columns: Mapping[str, pa.Array], rows: int, text: Sequence[str] = ()) -> Dict[str, int]:
    """{"value_kinds/<column>/<kind>": records holding a value} of one batch of `rows` records a reader gave:
    `columns` by their types (`kind_of_type`), the `text` columns (CSV: every cell is text, whatever type the
    reader gave it) as `bytes_list` in every record."""
    out = {f"{COUNTER_PREFIX}{c}/bytes_list": rows for c in text}
    for c, col in columns.items():
        kind = kind_of_type(col.type)
        if c not in text and kind is not None and len(col) > col.null_count:
            out[f"{COUNTER_PREFIX}{c}/{kind}"] = len(col) - col.null_count
    return out


def recorded_kinds(counters: Mapping[str, int]) -> Dict[str, List[str]]:
    """{column: its kinds, sorted} from counters of `kind_counts` (a column's name may hold '/')."""
    out: Dict[str, set] = {}
    for key, n in counters.items():
        if key.startswith(COUNTER_PREFIX) and n:
            column, kind = key[len(COUNTER_PREFIX):].rsplit("/", 1)
            out.setdefault(column, set()).add(kind)
    return {c: sorted(k) for c, k in sorted(out.items())}
