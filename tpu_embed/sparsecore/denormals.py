"""float32 arithmetic with denormals flushed to zero (x86's FTZ and DAZ), as both frameworks' preprocessing computes.

TensorFlow's SparseCore preprocessing kernels run on threads with the CPU's flush-to-zero and
denormals-are-zero modes set, and so does jax-tpu-embedding's preprocessing (the workers of
a `tsl::thread::ThreadPool`): every float operation on a gain (a combiner sum, a weight times or divided by
its sample's scale, duplicate ids' gains added) reads a subnormal operand as zero of its sign, and writes
zero of its sign where the result, rounded to float32 as if the exponent were unbounded, is below the
smallest normal 2**-126 (x86 detects tininess after rounding). A value only copied keeps its bits, subnormal
or not. numpy computes with gradual underflow; these functions give the flushed results, bit for bit:

* `flush(x)`: subnormal float32 values become zero of their sign (what DAZ reads, and a copy through
  `w / 1.0f`);
* `to_float32(x)`: a float64 value rounded to float32 as an FTZ conversion does;
* `add(a, b)`, `multiply(a, b)`, `divide(a, b)`: float32 `a + b`, `a * b`, `a / b` with DAZ and FTZ;
* `is_tiny(x, bound)`: whether a nonzero value of float32 `x` is below `bound` in magnitude (the fast paths'
  test for when flushing can matter).
"""

from __future__ import annotations

import numpy as np

_EXPONENT = np.uint32(0x7F800000)
_SIGN = np.uint32(0x80000000)
_MIN_NORMAL = 2.0 ** -126
_SCALE = 2.0 ** 100  # brings a result near 2**-126 into float32's normal range, where rounding is unbounded


def flush(x) -> np.ndarray:
    """float32 `x` with every subnormal value replaced by zero of its sign."""
    x = np.asarray(x, np.float32)
    bits = x.view(np.uint32)
    sub = ((bits & _EXPONENT) == 0) & ((bits & ~_SIGN) != 0)
    if not sub.any():
        return x
    return np.where(sub, (bits & _SIGN).view(np.float32), x)


def to_float32(x) -> np.ndarray:
    """float64 `x` rounded to float32 with flush-to-zero: zero of its sign where the rounded value (exponent
    unbounded) is below 2**-126, else the nearest float32."""
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore"):
        out = x.astype(np.float32)
    near = np.abs(x) < 2 * _MIN_NORMAL  # NaN compares false
    if near.any():
        scaled = (x[near] * _SCALE).astype(np.float32)  # exact scaling, then a 24-bit rounding
        tiny = np.abs(scaled) < np.float32(_MIN_NORMAL * _SCALE)
        zero = np.copysign(np.float32(0), scaled).astype(np.float32)
        out[near] = np.where(tiny, zero, scaled * np.float32(1 / _SCALE))
    return out


def add(a, b) -> np.ndarray:
    """float32 `a + b` with DAZ and FTZ. The sum of two normal float32 values (or zeros) is a multiple of 2**-149:
    where it is below 2**-126 numpy's result is exact, and FTZ makes it zero."""
    return flush(np.add(flush(a), flush(b), dtype=np.float32))


def multiply(a, b) -> np.ndarray:
    """float32 `a * b` with DAZ and FTZ (the product of two float32 values is exact in float64)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return to_float32(flush(a).astype(np.float64) * flush(b).astype(np.float64))


def is_tiny(x, bound: float = _MIN_NORMAL) -> bool:
    """Whether float32 `x` holds a nonzero value below `bound` (a power of two, at most 2**127) in magnitude."""
    bits = np.asarray(x, np.float32).view(np.uint32) << np.uint32(1)  # the sign shifted out, zero stays zero
    limit = np.uint32(np.float32(bound).view(np.uint32) << np.uint32(1))
    bits -= np.uint32(1)  # zero wraps to the largest value
    return bool((bits < limit - np.uint32(1)).any())


def divide(a, b) -> np.ndarray:
    """float32 `a / b` with DAZ and FTZ (the quotient rounded once: float64 holds it well enough)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return to_float32(flush(a).astype(np.float64) / flush(b).astype(np.float64))
