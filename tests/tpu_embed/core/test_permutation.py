"""The shuffle's permutation (`tpu_embed.core.permutation`): a bijection (exhaustively for many small n, sampled
without collisions for 10**9 and 2**40), matching a plain-Python transcription of its documented definition,
changing with the seed and the epoch, and spreading sorted data over the steps."""

import numpy as np
import pytest

from tpu_embed.core.permutation import ALGORITHM, MAX_N, ROUNDS, VERSION, Permutation, epoch_key

# ---------------------------------------------------------------- the documented algorithm, in plain Python

U64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def ref_mix64(z):
    z &= U64
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & U64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & U64
    return z ^ (z >> 31)


def ref_splitmix64(s, i):
    return ref_mix64(s + (i + 1) * GAMMA)


def ref_position(n, seed, epoch, x):
    """tpu_embed/core/permutation.py's docstring, transcribed one element at a time."""
    k = ref_splitmix64(seed, epoch)
    keys = [ref_splitmix64(k, r) for r in range(6)]
    h = max(1, -(-max(0, n - 1).bit_length() // 2))
    mask = (1 << h) - 1

    def one_pass(v):
        left, right = v >> h, v & mask
        for key in keys:
            left, right = right, left ^ (ref_mix64(right ^ key) & mask)
        return (left << h) | right

    y = one_pass(x)
    while y >= n:
        y = one_pass(y)
    return y


def test_matches_the_documented_definition():
    assert (ALGORITHM, VERSION, ROUNDS) == ("feistel-splitmix64-cyclewalk", 1, 6)
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 5, 17, 1000, 10 ** 9, 2 ** 40, MAX_N):
        xs = sorted({0, n - 1, *rng.integers(0, n, 20).tolist()})
        for seed in (0, 1, U64):
            for epoch in (0, 3):
                got = Permutation(n, epoch_key(seed, epoch))(np.array(xs, np.int64)).tolist()
                assert got == [ref_position(n, seed, epoch, x) for x in xs], (n, seed, epoch)


# ---------------------------------------------------------------- bijection

SMALL = sorted(set(range(0, 130)) | {2 ** k + d for k in range(1, 17) for d in (-1, 0, 1)}
               | {999, 1000, 1001, 12345, 100003})


def test_bijection_exhaustive_for_small_n():
    for n in SMALL:
        for seed in (0, 12345):
            p = Permutation(n, epoch_key(seed))
            y = p(np.arange(n))
            assert y.dtype == np.int64
            assert np.array_equal(np.sort(y), np.arange(n)), n
            assert np.array_equal(p.inverse(y), np.arange(n)), n
            assert np.array_equal(p(p.inverse(np.arange(n))), np.arange(n)), n


@pytest.mark.parametrize("n", [10 ** 9, 2 ** 40])
def test_bijection_sampled_for_large_n(n):
    rng = np.random.default_rng(n % 1000)
    x = np.unique(np.concatenate([rng.integers(0, n, 300_000), np.arange(n - 50_000, n),
                                  np.arange(0, 50_000)]))
    p = Permutation(n, epoch_key(99))
    y = p(x)
    assert y.min() >= 0 and y.max() < n
    assert np.unique(y).size == x.size  # no two sampled indices collide
    assert np.array_equal(p.inverse(y), x)
    # Chunk-local evaluation (what each worker does) equals evaluating everything at once.
    parts = np.concatenate([p(c) for c in np.array_split(x, 7)])
    assert np.array_equal(parts, y)


def test_seed_and_epoch_change_the_permutation():
    n = 1000
    perms = {(s, e): tuple(Permutation(n, epoch_key(s, e))(np.arange(n)).tolist()) for s in range(8) for e in range(3)}
    assert len(set(perms.values())) == len(perms)
    a, b = np.array(perms[(0, 0)]), np.array(perms[(1, 0)])
    assert np.mean(a == b) < 0.02  # unrelated, not a small edit of each other
    assert perms[(3, 1)] == tuple(Permutation(n, epoch_key(3, 1))(np.arange(n)).tolist())  # and reproducible
    assert epoch_key(3, 0) != epoch_key(3, 1)


def test_spreads_sorted_data_over_the_steps():
    n, B = 10 ** 6, 1000
    steps = Permutation(n, epoch_key(5))(np.arange(n)) // B
    S = n // B
    assert np.mean(steps[1:] == steps[:-1]) < 2.0 / S  # neighbours (e.g. one user's records) rarely share a step
    # The first B examples (one step's worth in input order) hit about as many steps as a random draw would.
    expect = S * (1 - (1 - 1 / S) ** B)
    assert abs(np.unique(steps[:B]).size - expect) < 0.05 * expect
    assert np.bincount(steps, minlength=S).tolist() == [B] * S


def test_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="not supported"):
        Permutation(MAX_N + 1, 0)
    p = Permutation(10, 0)
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        p(np.array([10]))
    with pytest.raises(ValueError):
        p(np.array([-1]))
    with pytest.raises(ValueError):
        epoch_key(-1)
    assert Permutation(0, 1)(np.zeros(0, np.int64)).size == 0
    assert Permutation(1, 1)(np.array([0])).tolist() == [0]
