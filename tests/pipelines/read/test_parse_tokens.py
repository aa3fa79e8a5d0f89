"""Categorical values as the parser hands them to vocabularies, hashing and identity ids: integers of any Arrow
integer type are their full decimal text, and nulls of typed columns are the blanks a CSV cell would hold."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipelines.read.parse import FeatureValues, parse_batch
from pipelines.read.records import RawBatch
from tpu_embed.artifact.spec import parse_spec

INTS = [1722, 42, -15, 0, 2 ** 53 + 1, -2 ** 63, 2 ** 63 - 1]


def test_as_tokens_gives_each_integers_full_decimal_text():
    # The old `pa.array(ints.astype(str), pa.large_binary())` gave [b'1', b'4', b'-', b'0', b'9', b'-', b'9'].
    fv = FeatureValues(lengths=np.ones(len(INTS), np.int64), ints=np.array(INTS, np.int64))
    assert fv.as_tokens().to_pylist() == [str(v).encode() for v in INTS]
    assert fv.as_tokens().type == pa.large_binary()
    empty = FeatureValues(lengths=np.zeros(2, np.int64), ints=np.zeros(0, np.int64))
    assert empty.as_tokens().to_pylist() == []


def _spec(**feature):
    return parse_spec({
        "inputs": {"format": "parquet", "patterns": ["in.parquet"]}, "label": {"column": "label"},
        "categorical": [{"name": "c", "vocabulary": {"type": "hashing", "num_buckets": 7}, **feature}],
        "defaults": {"table": {"dim": 4}}, "optimizer": {"type": "sgd", "learning_rate": 0.1},
        "topology": {"num_chips": 1}, "global_batch_size": 4})


def _parse(spec, **columns):
    n = len(next(iter(columns.values())))
    raw = RawBatch(0, "in.parquet", 0, np.arange(n, dtype=np.int64), {"label": pa.array([1.0] * n), **columns})
    chunk, letters = parse_batch(raw, spec)
    return chunk.features["c"], letters


def _rows(fv):
    tokens = [t.decode() for t in fv.as_tokens().to_pylist()]
    starts = np.concatenate([[0], np.cumsum(fv.lengths)])
    return [tokens[starts[k]:starts[k + 1]] for k in range(fv.lengths.size)]


@pytest.mark.parametrize("arrow_type", [pa.int64(), pa.int32(), pa.int8(), pa.uint32(), pa.uint64()])
def test_integer_columns_of_every_type_are_their_decimal_text(arrow_type):
    info = np.iinfo(arrow_type.to_pandas_dtype())
    fits = [v for v in INTS if int(info.min) <= v <= int(info.max)]
    values = fits + ([2 ** 64 - 1, 2 ** 63] if arrow_type == pa.uint64() else [])
    fv, letters = _parse(_spec(), c=pa.array(values + [None], arrow_type))
    assert not letters
    assert _rows(fv) == [[str(v)] for v in values] + [[]]  # a null cell: no value


def test_integer_lists_with_nulls_as_csv_blanks():
    """int64_list / list<int64> values, nulls inside a list and null lists: what the CSV cells '1722|-15',
    '7||3', '' give (a blank is no value, and its weight goes with it)."""
    col = pa.array([[1722, -15], [7, None, 3], None, [None]], pa.list_(pa.int64()))
    fv, letters = _parse(_spec(delimiter="|"), c=col)
    assert not letters and _rows(fv) == [["1722", "-15"], ["7", "3"], [], []]

    w = pa.array([[0.5, 2.0], [1.0, 9.0, 4.0], None, [8.0]], pa.list_(pa.float32()))
    fv, letters = _parse(_spec(delimiter="|", weight_column="w"), c=col, w=w)
    assert not letters and _rows(fv) == [["1722", "-15"], ["7", "3"], [], []]
    np.testing.assert_array_equal(fv.weights, np.float32([0.5, 2.0, 1.0, 4.0]))


def test_nulls_in_string_and_weight_columns_are_csv_blanks():
    """A null string inside a list is the empty field of 'a||b' (dropped with its weight); a null weight is a
    blank weight (NaN: policies.nan_weights decides), in a list or a scalar column; a null scalar value with a
    weight is a blank cell with a weight (no value)."""
    col = pa.array([["a", None, "b"], ["c"], ["d"]], pa.list_(pa.string()))
    w = pa.array([[1.0, 2.0, 3.0], [None], [0.5]], pa.list_(pa.float64()))
    fv, letters = _parse(_spec(delimiter="|", weight_column="w"), c=col, w=w)
    assert not letters and _rows(fv) == [["a", "b"], ["c"], ["d"]]
    np.testing.assert_array_equal(fv.weights, np.float32([1.0, 3.0, np.nan, 0.5]))

    fv, letters = _parse(_spec(weight_column="w"), c=pa.array(["a", None, "b"]), w=pa.array([2.0, 5.0, None]))
    assert not letters and _rows(fv) == [["a"], [], ["b"]]
    np.testing.assert_array_equal(fv.weights, np.float32([2.0, np.nan]))
