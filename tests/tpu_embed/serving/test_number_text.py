"""tpu_embed.serving.number_text's Unicode tables are this interpreter's: the digits int() and float() accept and the
whitespace they strip (the offline jobs parse with Python's rules, serving with these tables)."""

from __future__ import annotations

import sys
import unicodedata

import numpy as np

from tpu_embed.serving import number_text

ZEROS = [c for c in range(sys.maxunicode + 1) if unicodedata.decimal(chr(c), None) == 0]


def test_the_unicode_tables_are_this_python_s():
    assert list(number_text.DECIMAL_ZEROS) == ZEROS, unicodedata.unidata_version
    assert sorted(number_text.UNICODE_SPACES) == [c for c in range(sys.maxunicode + 1) if chr(c).isspace()]


def test_every_run_of_decimal_digits_parses_as_int_does():
    texts = ["".join(chr(z + d) for d in (1, 0, 9)) for z in ZEROS]
    values, ok = number_text.parse_int64(texts)
    assert np.all(ok.numpy()) and values.numpy().tolist() == [int(t) for t in texts] == [109] * len(texts)
