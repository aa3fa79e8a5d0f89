"""The value kinds the reader records (`pipelines.read.value_kinds`): the kind of each column type a reader hands
over, the counters a batch adds, and the kinds read back from the counters (what serving parses by:
tests/tpu_embed/serving/test_value_kinds.py)."""

import pyarrow as pa

from pipelines.read import value_kinds


def test_kinds_of_reader_columns():
    assert value_kinds.kind_of_type(pa.large_list(pa.large_binary())) == "bytes_list"
    assert value_kinds.kind_of_type(pa.list_(pa.float32())) == "float_list"
    assert value_kinds.kind_of_type(pa.large_list(pa.int64())) == "int64_list"
    assert value_kinds.kind_of_type(pa.float64()) == "float_list"  # a Parquet column
    assert value_kinds.kind_of_type(pa.dictionary(pa.int32(), pa.string())) == "bytes_list"
    assert value_kinds.kind_of_type(pa.null()) is None  # a key no record of the batch holds
    cols = {"a/b": pa.array([[1], None, [2]], pa.large_list(pa.int64())), "n": pa.nulls(3),
            "t": pa.array([1, 2, 3])}
    counts = value_kinds.kind_counts(cols, 3, text=["t"])
    assert counts == {"value_kinds/a/b/int64_list": 2, "value_kinds/t/bytes_list": 3}
    assert value_kinds.recorded_kinds({**counts, "value_kinds/a/b/bytes_list": 1, "records_read": 3}) == {
        "a/b": ["bytes_list", "int64_list"], "t": ["bytes_list"]}
