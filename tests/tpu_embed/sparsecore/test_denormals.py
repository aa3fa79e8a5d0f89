"""tpu_embed.sparsecore.denormals: float32 arithmetic with x86's flush-to-zero and denormals-are-zero (what
TensorFlow's kernels and jax-tpu-embedding's preprocessing threads compute; the conformance tests check the gains
against TF and jax themselves)."""

from __future__ import annotations

import numpy as np

from tpu_embed.sparsecore import denormals as D

MIN = np.float32(2.0 ** -126)


def bits(x) -> list:
    return np.asarray(x, np.float32).view(np.uint32).tolist()


def test_flush_keeps_the_sign_and_every_value_that_is_not_subnormal():
    x = np.array([1e-40, -1e-40, 1e-45, MIN, -MIN, 0.0, -0.0, 1.0, np.inf, np.nan], np.float32)
    assert bits(D.flush(x)) == bits([0.0, -0.0, 0.0, MIN, -MIN, 0.0, -0.0, 1.0, np.inf, np.nan])


def test_to_float32_flushes_after_rounding_as_x86_does():
    # Just below 2**-126: rounded to 24 bits it is 2**-126 (kept, as cvtsd2ss with FTZ gives 0x00800000) ...
    just_below = np.ldexp(1.0 - 2.0 ** -26, -126)
    # ... one float32 ulp below it stays below, and is flushed (gradual underflow would keep 0x007fffff).
    ulp_below = np.ldexp(1.0 - 2.0 ** -23, -126)
    got = D.to_float32(np.array([just_below, -just_below, ulp_below, -ulp_below, 1e-300]))
    assert bits(got) == [0x00800000, 0x80800000, 0, 0x80000000, 0]
    rng = np.random.default_rng(0)
    normal = rng.standard_normal(1000) * 10.0 ** rng.integers(-30, 30, 1000)
    assert bits(D.to_float32(normal)) == bits(normal.astype(np.float32))


def test_add_and_divide_read_subnormals_as_zero_and_write_zero_below_the_smallest_normal():
    a = np.array([1.5 * MIN, -1.5 * MIN, 1e-40, 1.0, 2.0], np.float32)
    b = np.array([-MIN, MIN, 1e-40, 1e-40, 3.0], np.float32)
    assert bits(D.add(a, b)) == bits([0.0, -0.0, 0.0, 1.0, 5.0])  # IEEE: +-0.5 * 2**-126, 2e-40
    q = D.divide(np.array([MIN, -MIN, 1e-40, 1e-40, 6.0], np.float32),
                 np.array([2.0, 2.0, 1e-40, 1.0, 3.0], np.float32))
    assert bits(q) == [0, 0x80000000, 0xFFC00000, 0, 0x40000000]  # 0 / 0: x86's default NaN, as jax writes it
    rng = np.random.default_rng(1)
    x, y = (rng.uniform(-2, 2, 1000).astype(np.float32) for _ in range(2))
    assert bits(D.divide(x, y)) == bits(x / y) and bits(D.add(x, y)) == bits(x + y)


def test_multiply_reads_subnormals_as_zero_and_flushes_products_below_the_smallest_normal():
    a = np.array([1e-40, -1e-40, 2.0 ** -63, 2.0 ** -64, 1.5 * MIN, 3.0, 1e30], np.float32)
    b = np.array([1.0, 1.0, 2.0 ** -63, -(2.0 ** -64), 0.5, 0.5, 1e30], np.float32)
    assert bits(D.multiply(a, b)) == bits([0.0, -0.0, MIN, -0.0, 0.0, 1.5, np.inf])
    rng = np.random.default_rng(2)
    x, y = (rng.standard_normal(1000).astype(np.float32) for _ in range(2))
    assert bits(D.multiply(x, y)) == bits(x * y)


def test_is_tiny_looks_for_nonzero_values_below_the_bound():
    assert not D.is_tiny(np.array([0.0, -0.0, MIN, -MIN, np.inf, np.nan, 1.0], np.float32))
    assert D.is_tiny(np.array([0.0, -1e-45], np.float32)) and D.is_tiny(np.float32(1e-40))
    assert not D.is_tiny(np.array([2.0 ** -63, 0.0], np.float32), 2.0 ** -63)
    assert D.is_tiny(np.array([2.0 ** -64], np.float32), 2.0 ** -63) and not D.is_tiny(np.zeros(0, np.float32))
