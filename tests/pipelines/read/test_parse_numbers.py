"""pipelines.read.parse.parse_floats: the native one-pass parser of plain decimal integers gives the general way's
values, blank and bad masks bit for bit, and hands anything else to the general way."""

from __future__ import annotations

import re
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.mapping import ids
from pipelines.read import csv_scan, parse

plain = st.builds(lambda sign, digits: sign + digits, st.sampled_from(["", "-", "+"]),
                  st.text("0123456789", min_size=1, max_size=15))
other = st.one_of(st.text("0123456789", min_size=16, max_size=20), st.sampled_from(
    ["1.5", "-0.0", "1e3", " 7", "7 ", "\t", " ", "-", "+", "nan", "inf", "0x10", "1_0", "abc", "٣", "+-1"]))


def _general(values: pa.Array):
    with mock.patch.object(csv_scan, "_csv_native", None):
        return parse.parse_floats(values)


def _same(got, want):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g.view(np.uint8), w.view(np.uint8))  # -0.0 too


pytestmark = pytest.mark.native("csv")


@settings(max_examples=300)
@given(st.lists(st.one_of(plain, st.just("")), max_size=40), st.integers(0, 3))
def test_plain_integers_parse_natively_as_the_general_way(values, cut):
    arr = pa.array(values, pa.large_string())[min(cut, len(values)):]  # a slice: the array's offset counts
    assert parse._plain_decimals(arr) is not None  # every value is plain: the native way takes it
    _same(parse.parse_floats(arr), _general(arr))


@settings(max_examples=300)
@given(st.lists(st.one_of(plain, st.just(""), other), min_size=1, max_size=40))
def test_any_other_value_goes_the_general_way_with_the_same_result(values):
    arr = pa.array(values, pa.large_string())
    plain_only = all(v == "" or re.fullmatch(r"[+-]?[0-9]{1,15}", v) for v in values)
    assert (parse._plain_decimals(arr) is not None) == plain_only
    _same(parse.parse_floats(arr), _general(arr))


def test_values_and_masks():
    arr = pa.array(["12", "", "-0", "+007", "999999999999999"], pa.large_string())
    values, blank, bad = parse.parse_floats(arr)
    assert values.tolist() == [12.0, 0.0, -0.0, 7.0, 999999999999999.0] and np.signbit(values[2])
    assert blank.tolist() == [False, True, False, False, False] and not bad.any()
    values, blank, bad = parse.parse_floats(pa.array(["1", "x", " 2 "], pa.large_string()))  # general way
    assert values.tolist() == [1.0, 0.0, 2.0] and bad.tolist() == [False, True, False] and not blank.any()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(plain, st.just(""), other), min_size=1, max_size=30), st.sampled_from([None, 0.0, -2.5]))
def test_a_column_of_one_value_per_row_parses_as_a_list_column(values, fill):
    """`_scalar_float`'s way for a column of one value per row (a CSV column: each row's value is its own) gives
    what its way for list columns (the first value of each row) gives: the same floats, and the same rows
    dead-lettered with the same reasons and details, blanks filled or missing."""
    from pipelines.read.records import RawBatch
    n = len(values)
    scalar = pa.array(values, pa.large_string())
    listed = pa.array([[v] for v in values] + [[]], pa.list_(pa.large_string()))  # a row of no value: list way
    results = []
    for col, rows in ((scalar, n), (listed, n + 1)):
        raw = RawBatch(0, "x.csv", 0, np.arange(rows, dtype=np.int64), {"d": col})
        probs = parse._Problems(raw)
        out = parse._scalar_float(raw, "d", fill, "dense", probs)
        results.append((out[:n], probs.bad[:n], {r: v for r, v in probs.letters.items() if r < n}))
    (a, bad_a, letters_a), (b, bad_b, letters_b) = results
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    assert np.array_equal(bad_a, bad_b) and letters_a == letters_b


def _python_int(token: str):
    try:
        x = int(token)
    except ValueError:
        return None
    return x if -(1 << 63) <= x < (1 << 63) else None


@settings(max_examples=300)
@given(st.lists(st.one_of(plain, st.just(""), other, st.sampled_from(["0X1f", "-0x10", "0b11", "0o7"])), min_size=1,
                max_size=20))
def test_identity_ids_are_pythons_int_of_each_token_whatever_else_its_batch_holds(tokens):
    """`ids.parse_ints` (the offline identity ids) is `int(token)` within int64, as serving's `parse_int64`: hex
    text ("0x10") is no integer, also in a batch that Arrow's cast would take whole."""
    values, ok = ids.parse_ints(pa.array(tokens, pa.large_string()))
    want = [_python_int(t) for t in tokens]
    assert ok.tolist() == [w is not None for w in want]
    assert values.tolist() == [w if w is not None else 0 for w in want]
