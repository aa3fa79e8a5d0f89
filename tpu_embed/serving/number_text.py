"""The offline jobs' number rules as TensorFlow ops: text to int64 ids, text to float64, floats to their text.

The offline jobs (`pipelines.read.parse`, `pipelines.mapping.ids`) parse with Arrow and fall back to Python's
`int()` / `float()`; both accept the same strings for the values that matter, so the rules are Python's:

* `parse_int64(text)`: what `int(text.decode("utf-8"))` accepts (surrounding whitespace, a sign, decimal
  digits of any script, `_` between digits), as int64; text that is not an integer, is not UTF-8, or does
  not fit in int64 is not ok.
* `parse_float64(text)`: `float()` after stripping Unicode whitespace; blank text is blank, text that is
  not a number or is not finite (`inf`, `nan`, `1e400`) is bad (both give 0.0).
* `float_text(x)`: `repr(float(x))` (`3.0`, `1e+16`, `0.1`), the token a float value of a categorical column
  stands for.

Every function is plain TensorFlow (no Python per value): it runs inside a `tf.function` and a SavedModel.
"""

from __future__ import annotations

from typing import Optional, Tuple

import tensorflow as tf

# Python's str.isspace() (and Arrow's utf8_trim_whitespace: the same set); tests check both.
UNICODE_SPACES = (0x9, 0xA, 0xB, 0xC, 0xD, 0x1C, 0x1D, 0x1E, 0x1F, 0x20, 0x85, 0xA0, 0x1680,
                  *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000)
# The zero of every run of Unicode decimal digits (unicodedata.decimal(c) == 0; each run is 0..9), Unicode 15
# (Python 3.12's unicodedata, what int() accepts; tests/tpu_embed/serving/test_number_text.py checks it).
DECIMAL_ZEROS = (0x30, 0x660, 0x6F0, 0x7C0, 0x966, 0x9E6, 0xA66, 0xAE6, 0xB66, 0xBE6, 0xC66, 0xCE6, 0xD66, 0xDE6,
                 0xE50, 0xED0, 0xF20, 0x1040, 0x1090, 0x17E0, 0x1810, 0x1946, 0x19D0, 0x1A80, 0x1A90, 0x1B50, 0x1BB0,
                 0x1C40, 0x1C50, 0xA620, 0xA8D0, 0xA900, 0xA9D0, 0xA9F0, 0xAA50, 0xABF0, 0xFF10, 0x104A0, 0x10D30,
                 0x11066, 0x110F0, 0x11136, 0x111D0, 0x112F0, 0x11450, 0x114D0, 0x11650, 0x116C0, 0x11730, 0x118E0,
                 0x11950, 0x11C50, 0x11D50, 0x11DA0, 0x11F50, 0x16A60, 0x16AC0, 0x16B50, 0x1D7CE, 0x1D7D8, 0x1D7E2,
                 0x1D7EC, 0x1D7F6, 0x1E140, 0x1E2F0, 0x1E4F0, 0x1E950, 0x1FBF0)

_ASCII_SPACE = r"[ \t\n\x0b\x0c\r]"  # Python's Py_ISSPACE: what int()/float() strip once the text is ASCII
_DIGITS = r"[0-9](?:_?[0-9])*"  # a digit part: '_' only between digits
_INT = rf"{_ASCII_SPACE}*[+-]?{_DIGITS}{_ASCII_SPACE}*"
_FINITE = rf"[+-]?(?:{_DIGITS}\.?|(?:{_DIGITS})?\.{_DIGITS})(?:[eE][+-]?{_DIGITS})?"
_INT64_MAX = (1 << 63) - 1
# What `tf.strings.to_number` reads as `float()` does: ASCII digits (no '_'), whitespace it skips around them.
_PLAIN = r"[ \t\n\x0b\x0c\r]*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[ \t\n\x0b\x0c\r]*"


def _ascii_form(text: tf.Tensor) -> tf.Tensor:
    """CPython's `_PyUnicode_TransformDecimalAndSpaceToASCII` on UTF-8 text: a Unicode space becomes ' ', a
    decimal digit its ASCII digit, ASCII stays, anything else (also bytes that are not UTF-8) becomes '?'
    (which no number contains). `text`: a 1-D string tensor."""
    cps = tf.strings.unicode_decode(text, "UTF-8", errors="replace", replacement_char=0xFFFD)
    cp = cps.flat_values
    offset = cp[:, None] - tf.constant(DECIMAL_ZEROS, tf.int32)[None, :]
    is_digit = (offset >= 0) & (offset <= 9)
    digit = tf.reduce_max(tf.where(is_digit, offset, -1), axis=1)
    space = tf.reduce_any(tf.equal(cp[:, None], tf.constant(UNICODE_SPACES[10:], tf.int32)[None, :]), axis=1)
    out = tf.where(cp < 127, cp, tf.where(space, 0x20, tf.where(digit >= 0, 0x30 + digit, 0x3F)))
    return tf.strings.unicode_encode(cps.with_flat_values(out), "UTF-8")


def all_ascii(text: tf.Tensor) -> tf.Tensor:
    """bool scalar: every byte of every string of `text` (1-D) is ASCII (< 0x80), found from their bytes joined."""
    return tf.reduce_max(tf.cast(tf.io.decode_raw(tf.strings.reduce_join(text), tf.uint8), tf.int32)) < 0x80


def _ascii_or_form(text: tf.Tensor, ascii: Optional[tf.Tensor]) -> tf.Tensor:
    """`_ascii_form(text)`, which is `text` itself where every byte is ASCII (`ascii`: that scalar, or None to
    find it): the decoding is paid only by a batch with other bytes. (`_ascii_form` turns 0x7F into '?': no number
    holds either.)"""
    ascii = all_ascii(text) if ascii is None else ascii
    return tf.cond(ascii, lambda: text, lambda: _ascii_form(text))


def _strip_unicode_space(ascii_text: tf.Tensor) -> tf.Tensor:
    """`ascii_text` (an `_ascii_form`) without leading and trailing Unicode whitespace (Arrow's trim)."""
    return tf.strings.regex_replace(ascii_text, r"^[ \t\n\x0b\x0c\r\x1c-\x1f]+|[ \t\n\x0b\x0c\r\x1c-\x1f]+$", "")


def parse_int64(text: tf.Tensor, ascii: Optional[tf.Tensor] = None) -> Tuple[tf.Tensor, tf.Tensor]:
    """(int64 values, ok) of a 1-D string tensor, as Python's `int(t.decode("utf-8"))` within int64 (not ok: 0).
    `ascii`: whether every byte of `text` is ASCII (`all_ascii`), if known."""
    text = tf.convert_to_tensor(text, tf.string)
    a = _ascii_or_form(text, ascii)
    ok = tf.strings.regex_full_match(a, _INT)
    a = tf.where(ok, a, "0")
    negative = tf.strings.regex_full_match(a, rf"{_ASCII_SPACE}*-.*")
    digits = tf.strings.regex_replace(a, r"[^0-9]", "")
    digits = tf.strings.regex_replace(digits, r"^0+([0-9])", r"\1")  # no leading zeros: the length is the size
    n = tf.strings.length(digits)
    fits = n <= 19
    digits = tf.where(fits, digits, "0")
    # Up to 19 digits: a high part of up to 10 digits and a low part of 9, each safe to convert.
    n = tf.strings.length(digits)
    split = tf.maximum(n - 9, 0)
    high_text = tf.where(split > 0, tf.strings.substr(digits, tf.zeros_like(split), split), "0")
    high = tf.strings.to_number(high_text, tf.int64)
    low = tf.strings.to_number(tf.strings.substr(digits, split, n - split), tf.int64)
    limit_high = tf.constant(_INT64_MAX // 10**9, tf.int64)
    fits &= (high < limit_high) | (tf.equal(high, limit_high) & (low <= _INT64_MAX % 10**9))
    magnitude = tf.where(fits, high, 0) * 10**9 + tf.where(fits, low, 0)
    # -2**63 fits int64 but is never a valid id: negative values are only kept as what they are, when they fit.
    value = tf.where(negative, -magnitude, magnitude)
    ok &= fits
    return tf.where(ok, value, tf.zeros_like(value)), ok


def parse_float64(text: tf.Tensor, ascii: Optional[tf.Tensor] = None, plain: Optional[tf.Tensor] = None
                  ) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(float64 values, blank, bad) of a 1-D string tensor, as `pipelines.read.parse.parse_floats` (values 0.0
    where blank or bad; bad: not a number, or not finite). `ascii`: whether every byte of `text` is ASCII
    (`all_ascii`), if known; `plain`: `plain_or_empty(text)`, if known.

    Numbers as CSV files and tf.train.Examples mostly hold them (ASCII digits, a sign, a point, an exponent,
    ASCII whitespace around, no '_') and empty strings are read by `tf.strings.to_number` after one regular
    expression over them all (`plain_or_empty`); a batch with any other text (other whitespace or digits, '_',
    not a number) is read by the whole rule."""
    text = tf.convert_to_tensor(text, tf.string)
    empty = tf.equal(text, "")

    def plain_numbers():
        value = tf.strings.to_number(tf.where(empty, "0", text), tf.float64)
        ok = ~empty & tf.math.is_finite(value)
        return tf.where(ok, value, tf.zeros_like(value)), empty, ~empty & ~ok

    def any_text():
        a = _strip_unicode_space(_ascii_or_form(text, ascii))
        blank = tf.equal(a, "")
        ok = tf.strings.regex_full_match(a, _FINITE)
        value = tf.strings.to_number(tf.where(ok, tf.strings.regex_replace(a, "_", ""), "0"), tf.float64)
        ok &= tf.math.is_finite(value)
        return tf.where(ok, value, tf.zeros_like(value)), blank, ~blank & ~ok

    return tf.cond(plain_or_empty(text) if plain is None else plain, plain_numbers, any_text)


def plain_or_empty(text: tf.Tensor) -> tf.Tensor:
    """bool scalar: every string of `text` is empty or a plain number (`_PLAIN`: which is ASCII, and which
    `tf.strings.to_number` reads as `float()` does). One match over the strings joined by ',' (which no plain
    number holds), whose ','s are counted: as many as the joins, so that no string held one."""
    joined = tf.strings.reduce_join(text, separator=",")
    commas = tf.reduce_sum(tf.cast(tf.equal(tf.cast(tf.io.decode_raw(joined, tf.uint8), tf.int32), 44), tf.int32))
    joins = tf.maximum(tf.size(text) - 1, 0)
    return tf.equal(commas, joins) & tf.strings.regex_full_match(joined, f"(?:{_PLAIN})?(?:,(?:{_PLAIN})?)*")


def float_text(x: tf.Tensor) -> tf.Tensor:
    """`repr(float(v))` of every value of a 1-D float tensor: the shortest digits that read back as the same
    float64 (the correctly rounded ones, tried from 1 to 17 digits), written as Python writes them."""
    x = tf.cast(x, tf.float64)
    finite = tf.math.is_finite(x)
    safe = tf.where(finite, x, tf.zeros_like(x))
    candidates = tf.stack([tf.strings.as_string(tf.abs(safe), precision=p, scientific=True) for p in range(17)])
    back = tf.strings.to_number(candidates, tf.float64)
    first = tf.argmax(tf.cast(tf.equal(back, tf.abs(safe)[None, :]), tf.int32), axis=0, output_type=tf.int32)
    chosen = tf.gather(tf.transpose(candidates), first[:, None], batch_dims=1)[:, 0]  # "d.ddde+XX"
    parts = tf.strings.split(chosen, "e").to_tensor(shape=[None, 2])
    mantissa, exponent = parts[:, 0], tf.strings.to_number(parts[:, 1], tf.int32)
    digits = tf.strings.regex_replace(mantissa, r"\.", "")
    digits = tf.strings.regex_replace(digits, r"([0-9])0+$", r"\1")  # "1e+02", not "1.0e+02": never, but cheap
    p = tf.strings.length(digits)
    zeros = tf.fill(tf.shape(digits), "0" * 24)
    at0 = tf.zeros_like(p)
    # Fixed notation for -4 <= exponent < 16, else scientific (Python's 'r' format).
    e_pos = exponent + 1  # digits before the point
    whole_only = tf.strings.join([digits, tf.strings.substr(zeros, at0, tf.maximum(e_pos - p, 0)), ".0"])
    split = tf.strings.join([tf.strings.substr(digits, at0, tf.maximum(e_pos, 0)), ".",
                             tf.strings.substr(digits, tf.clip_by_value(e_pos, 0, p), tf.maximum(p - e_pos, 0))])
    small = tf.strings.join(["0.", tf.strings.substr(zeros, at0, tf.maximum(-e_pos, 0)), digits])
    fixed = tf.where(e_pos >= p, whole_only, tf.where(e_pos > 0, split, small))
    rest = tf.strings.substr(digits, tf.minimum(at0 + 1, p), tf.maximum(p - 1, 0))
    sci_mantissa = tf.where(p > 1, tf.strings.join([tf.strings.substr(digits, at0, at0 + 1), ".", rest]), digits)
    exp_text = tf.strings.as_string(tf.abs(exponent), width=2, fill="0")
    sci = tf.strings.join([sci_mantissa, "e", tf.where(exponent < 0, "-", "+"), exp_text])
    body = tf.where((exponent >= -4) & (exponent < 16), fixed, sci)
    body = tf.where(tf.equal(safe, 0.0), "0.0", body)
    sign = tf.where(_signbit(x), "-", "")
    text = tf.strings.join([sign, body])
    special = tf.where(tf.math.is_nan(x), "nan", tf.where(x > 0, "inf", "-inf"))
    return tf.where(finite, text, special)


def _signbit(x: tf.Tensor) -> tf.Tensor:
    """The sign bit of float64 values (so -0.0 is '-0.0', as Python writes it)."""
    return tf.not_equal(tf.bitwise.right_shift(tf.bitcast(x, tf.int64), 63), 0)
