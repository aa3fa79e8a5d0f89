"""profiles.jsonio.dumps_readable: the JSON of the profile's files, lists of scalars on one line."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiles.jsonio import dumps_readable

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70),
                     st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
_json = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                     max_leaves=30)


@settings(max_examples=200, deadline=None)
@given(_json)
def test_readable_json_reads_back_as_written(data):
    text = dumps_readable(data)
    assert text.endswith("\n") and json.loads(text) == data


def test_readable_json_keeps_lists_of_scalars_on_one_line():
    data = {"a": [1, 2.5, None], "b": {"c": [[1], "x\u00e9"], "d": {}}, "e": []}
    assert dumps_readable(data) == (
        '{\n "a": [1, 2.5, null],\n "b": {\n  "c": [\n   [1],\n   "x\\u00e9"\n  ],\n  "d": {}\n },\n "e": []\n}\n')


@pytest.mark.parametrize("bad", [math.nan, [1.0, math.inf], {"a": {"b": -math.inf}}])
def test_readable_json_refuses_nan_and_infinity_as_json_does(bad):
    with pytest.raises(ValueError, match="JSON compliant"):
        dumps_readable(bad)
