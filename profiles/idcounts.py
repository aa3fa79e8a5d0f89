"""Exact per-id lookup counts (for hot ids), mergeable and compact.

Vocabularies here are at most a few million ids, so we keep the exact count of
every id seen rather than a heavy-hitters sketch: top-k is then exact, merging
is exact (add counts per id), and memory is 16 bytes per *distinct* id seen
(sorted int64 ids + int64 counts), never per vocabulary entry.

Per-step batches are appended to a pending list and folded in only when the
pending data outgrows the folded arrays, so adding a step costs O(batch log
batch) amortised, not O(distinct ids).  A counter that adds lookups in place
(the native step counts) asks for a dense array (`counting_array`), folded in
when the counts are read.  Pickling folds first.

In JSON the arrays are delta-encoded ids and counts, zlib-compressed, base64.
"""

from __future__ import annotations

import base64
import concurrent.futures
import zlib
from typing import List, Mapping, Optional, Sequence, Tuple

import numpy as np

ENCODING = "zlib-base64-int64le-delta"


def _fold(ids: np.ndarray, counts: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    if not ids.size:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    u, inv = np.unique(ids, return_inverse=True)
    return u.astype(np.int64), np.bincount(inv.reshape(-1), weights=None if counts is None else counts,
                                           minlength=u.size).astype(np.int64)


def _fold_dense(ids: Sequence[np.ndarray], counts: Sequence[Optional[np.ndarray]]
                ) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """`_fold` by counting into a dense array when the ids span a range not much larger than their number.

    Profile ids are vocabulary rows, so this is the usual case: one linear `bincount` pass instead of a
    sort (~20x faster). None when the ids are negative or too sparse (then `_fold` sorts).
    """
    n = sum(a.size for a in ids)
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lo = min(int(a.min()) for a in ids if a.size)
    hi = max(int(a.max()) for a in ids if a.size)
    if lo < 0 or hi >= 4 * n + (1 << 16):
        return None
    raw = [a for a, c in zip(ids, counts) if c is None and a.size]
    dense = np.bincount(np.concatenate(raw), minlength=hi + 1) if raw else np.zeros(hi + 1, np.int64)
    for a, c in zip(ids, counts):
        if c is not None and a.size:  # folded arrays: ids unique, so a plain indexed add is exact
            dense[a] += c
    u = np.flatnonzero(dense)
    return u.astype(np.int64), dense[u]


class IdCounts:
    __slots__ = ("_ids", "_counts", "_pending", "_pending_size", "_encoded", "_dense")

    def __init__(self, ids: Optional[np.ndarray] = None, counts: Optional[np.ndarray] = None):
        self._set(ids, counts)

    def _set(self, ids: Optional[np.ndarray], counts: Optional[np.ndarray]) -> None:
        self._ids = np.zeros(0, np.int64) if ids is None else np.asarray(ids, np.int64)
        self._counts = np.zeros(0, np.int64) if counts is None else np.asarray(counts, np.int64)
        self._pending: List[Tuple[np.ndarray, Optional[np.ndarray]]] = []
        self._pending_size = 0
        self._encoded: Optional[dict] = None  # lazily decoded JSON payload
        self._dense: Optional[np.ndarray] = None  # counts added in place (`counting_array`), not yet folded

    # ------------------------------------------------------------ building

    def add(self, ids: np.ndarray) -> None:
        """Count every occurrence in `ids` (raw lookups, before any dedup)."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        if not ids.size:
            return
        self._pending.append((ids.copy(), None))
        self._pending_size += ids.size
        if self._pending_size > max(self._ids.size, 1 << 16):
            self._compact()

    def counting_array(self, size: int) -> np.ndarray:
        """An int64 array of at least `size` counts, zero until counted: `a[i] += k` counts k lookups of id i.
        Folded in (and let go: the next call makes a new one) when the counts are next read, merged or pickled."""
        if self._dense is None or self._dense.size < size:
            grown = np.zeros(max(int(size), 1), np.int64)
            if self._dense is not None:
                grown[:self._dense.size] = self._dense
            self._dense = grown
        return self._dense

    def merge_from(self, other: "IdCounts") -> None:
        other._decode()
        ids, counts = other._folded()
        if ids.size:
            self._pending.append((ids, counts))
            self._pending_size += ids.size
            self._compact()

    def _decode(self) -> None:
        if self._encoded is not None:
            d, self._encoded = self._encoded, None
            self._ids = np.cumsum(unpack_ids(d["ids"]))
            self._counts = unpack_ids(d["counts"])
            if self._ids.size != self._counts.size:
                raise ValueError("id counts: ids and counts differ in length")

    def _compact(self) -> None:
        self._decode()
        if self._dense is not None:
            u = np.flatnonzero(self._dense)
            if u.size:
                self._pending.append((u.astype(np.int64), self._dense[u]))
                self._pending_size += u.size
            self._dense = None
        if not self._pending:
            return
        parts_ids = [self._ids] + [p[0] for p in self._pending]
        parts_counts: List[Optional[np.ndarray]] = [self._counts, *(p[1] for p in self._pending)]
        folded = _fold_dense(parts_ids, parts_counts)
        if folded is None:
            parts_cnt = [self._counts] + [p[1] if p[1] is not None else np.ones(p[0].size, np.int64)
                                          for p in self._pending]
            folded = _fold(np.concatenate(parts_ids), np.concatenate(parts_cnt))
        self._ids, self._counts = folded
        self._pending, self._pending_size = [], 0

    def _folded(self) -> Tuple[np.ndarray, np.ndarray]:
        self._compact()
        return self._ids, self._counts

    # ------------------------------------------------------------ reading

    @property
    def distinct(self) -> int:
        return int(self._folded()[0].size)

    @property
    def total(self) -> int:
        return int(self._folded()[1].sum())

    def top_k(self, k: int) -> List[Tuple[int, int]]:
        """[(id, count)] of the k most looked-up ids; ties broken by smaller id (deterministic)."""
        ids, counts = self._folded()
        if not ids.size or k <= 0:
            return []
        k = min(k, ids.size)
        # lexsort: primary key descending count, secondary ascending id.
        order = np.lexsort((ids, -counts))[:k]
        return [(int(ids[i]), int(counts[i])) for i in order]

    def arrays(self) -> Tuple[np.ndarray, np.ndarray]:
        return self._folded()

    # ------------------------------------------------------------ plain data

    def __getstate__(self):
        ids, counts = self._folded()
        return {"ids": ids, "counts": counts}

    def __setstate__(self, state):
        self._set(state["ids"], state["counts"])

    def __eq__(self, other):
        if not isinstance(other, IdCounts):
            return NotImplemented
        a, b = self._folded(), other._folded()
        return np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])

    def __repr__(self):
        return f"IdCounts(distinct={self.distinct}, total={self.total})"

    def to_json(self) -> dict:
        if self._encoded is not None and not self._pending and self._dense is None:
            return dict(self._encoded)
        ids, counts = self._folded()
        return {"encoding": ENCODING, "distinct": int(ids.size),
                "ids": pack_ids(np.diff(ids, prepend=np.int64(0)) if ids.size else ids), "counts": pack_ids(counts)}

    @classmethod
    def from_json(cls, d: Mapping) -> "IdCounts":
        if d.get("encoding") != ENCODING:
            raise ValueError(f"id counts: unknown encoding {d.get('encoding')!r} (expected {ENCODING!r})")
        out = cls()
        out._encoded = {"encoding": ENCODING, "distinct": int(d.get("distinct", 0)), "ids": str(d["ids"]),
                        "counts": str(d["counts"])}
        return out


PACK_PIECE_BYTES = 1 << 20  # `pack_ids` with a pool: the bytes deflated apart


def pack_ids(a: np.ndarray, pool: Optional[concurrent.futures.Executor] = None) -> str:
    """`ENCODING` at zlib's fastest level (any level reads back the same): the id counts of 26 tables of 50 to
    53,000 ids (the sizes of the quoted workload of benchmarks/run_throughput.py) pack in ~0.05 s instead of
    ~0.24 s at level 6, ~12 % larger, at the end of the shard job where nothing else runs.

    With `pool`, an array of more than `PACK_PIECE_BYTES` is deflated in pieces side by side (`_deflated_pieces`):
    the what-if steps' 1.5 M ids of that workload in 0.05 s instead of 0.1 s on two cores."""
    data = np.ascontiguousarray(a, "<i8")
    if pool is None or data.nbytes <= PACK_PIECE_BYTES:
        return base64.b64encode(zlib.compress(data, 1)).decode("ascii")
    return base64.b64encode(_deflated_pieces(memoryview(data).cast("B"), pool)).decode("ascii")


def _deflated_pieces(data: memoryview, pool: concurrent.futures.Executor) -> bytes:
    """One zlib stream (RFC 1950, level 1) of `data`, its `PACK_PIECE_BYTES` pieces deflated apart on `pool` (as
    pigz does): each piece but the last ends on a byte boundary with a sync flush, the last ends the stream, and
    the stream's Adler-32 is the whole data's. `zlib.decompress` reads it as any other; its bytes depend on the
    piece size alone, not on the pool (zlib releases the GIL while it deflates)."""
    pieces = [data[i:i + PACK_PIECE_BYTES] for i in range(0, len(data), PACK_PIECE_BYTES)]

    def deflate(k: int) -> bytes:
        c = zlib.compressobj(1, zlib.DEFLATED, -zlib.MAX_WBITS)  # raw deflate: no header, no checksum
        return c.compress(pieces[k]) + c.flush(zlib.Z_FINISH if k == len(pieces) - 1 else zlib.Z_SYNC_FLUSH)

    body = b"".join(pool.map(deflate, range(len(pieces))))
    return _ZLIB_HEADER_LEVEL_1 + body + zlib.adler32(data).to_bytes(4, "big")


_ZLIB_HEADER_LEVEL_1 = b"\x78\x01"  # deflate, 32 KB window, fastest level (what zlib.compress(data, 1) writes)


def unpack_ids(s: str) -> np.ndarray:
    return np.frombuffer(zlib.decompress(base64.b64decode(s.encode("ascii"))), "<i8").astype(np.int64)
