"""`profiles.idcounts.pack_ids`: an array deflated in pieces on a pool is one zlib stream that any zlib reads back as
the array, whose bytes do not depend on the pool, and the same stream as without a pool where it is one piece."""

from __future__ import annotations

import base64
import concurrent.futures
import zlib

import numpy as np
import pytest

from profiles.idcounts import PACK_PIECE_BYTES, pack_ids, unpack_ids

PIECE = PACK_PIECE_BYTES // 8  # int64 values per piece


@pytest.mark.parametrize("n", [0, 1, PIECE - 1, PIECE, PIECE + 1, 2 * PIECE, 3 * PIECE + 5])
def test_pieces_deflated_on_a_pool_read_back_as_the_array(n):
    rng = np.random.default_rng(n)
    a = np.concatenate([rng.zipf(1.2, n // 2) % 500_000, np.zeros(n - n // 2, np.int64)]).astype(np.int64)
    rng.shuffle(a)
    alone = pack_ids(a)
    with concurrent.futures.ThreadPoolExecutor(1) as one, concurrent.futures.ThreadPoolExecutor(4) as four:
        packed = [pack_ids(a, one), pack_ids(a, four)]
    assert packed[0] == packed[1]  # the bytes are the pieces', whatever the threads
    for p in packed:
        assert np.array_equal(unpack_ids(p), a)
        raw = base64.b64decode(p)
        assert raw[:2] == zlib.compress(b"", 1)[:2]  # the header zlib writes at level 1
        assert zlib.decompress(raw) == a.astype("<i8").tobytes()  # zlib checks the stream's Adler-32
    if n * 8 <= PACK_PIECE_BYTES:
        assert packed[0] == alone  # one piece: zlib.compress itself
    else:
        assert packed[0] != alone


def test_a_corrupt_piece_is_refused_by_zlib():
    a = np.arange(3 * PIECE, dtype=np.int64) % 1000
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        raw = bytearray(base64.b64decode(pack_ids(a, pool)))
    raw[-1] ^= 1  # the Adler-32 of the whole data
    with pytest.raises(zlib.error):
        zlib.decompress(bytes(raw))
