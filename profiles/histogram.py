"""Exact histograms of small non-negative integers: mergeable, exact quantiles.

Everything the profiler counts per step (ids per example, ids per partition,
buffer slots) is a small integer, so a {value: count} map is both exact and
small; merging adds counts, which is associative and commutative, and the
quantiles of a merged histogram are exactly those of the concatenated data.
No sketch error to reason about.

Quantiles use the nearest-rank ("inverted CDF") definition: the q-quantile is
the smallest observed value v with #{x <= v} >= ceil(q * n).  It is always an
observed value, so a limit set to it is met by at least a q fraction of steps.
"""

from __future__ import annotations

import functools
from fractions import Fraction
from typing import Dict, Iterable, List, Mapping, Optional, Union

import numpy as np

QuantileLike = Union[str, float, Fraction]


_BAD_QUANTILE = "quantile {q!r}: expected 'max', 'pNN[.N]' (e.g. p99.9) or a number in (0, 1]."


@functools.lru_cache(maxsize=256)  # a profile's summaries ask for the same few quantiles of every histogram
def parse_quantile(q: QuantileLike) -> Fraction:
    """'max' -> 1, 'p99.9' -> 999/1000, 'p50' -> 1/2, 0.99 -> 99/100 (exactly, no float rounding)."""
    if isinstance(q, Fraction):
        value = q
    elif isinstance(q, str):
        text = q.strip().lower()
        if text in ("max", "p100", "1", "1.0"):
            return Fraction(1)
        if text.startswith("p"):
            try:
                value = Fraction(text[1:]) / 100
            except ValueError:
                raise ValueError(_BAD_QUANTILE.format(q=q)) from None
        else:
            try:
                value = Fraction(text)
            except ValueError:
                raise ValueError(_BAD_QUANTILE.format(q=q)) from None
    else:
        value = Fraction(str(float(q)))
    if not (0 < value <= 1):
        raise ValueError(f"quantile {q!r} must be in (0, 1] (or 'max', 'p50', 'p99.9', ...).")
    return value


def quantile_label(q: QuantileLike) -> str:
    v = parse_quantile(q)
    if v == 1:
        return "max"
    pct = v * 100
    return "p" + (str(pct.numerator) if pct.denominator == 1 else f"{float(pct):g}")


class Histogram:
    """{value: count}.  `add_array` buffers its arrays and folds them in one pass when the buffer is
    large or the histogram is read: the profiler adds hundreds of small arrays per step, and a
    bincount + dict update per array cost more than the counting itself."""

    _FOLD_AT = 1 << 16  # buffered values

    __slots__ = ("_counts", "_pending", "_pending_size")

    def __init__(self, counts: Optional[Dict[int, int]] = None):
        self._counts: Dict[int, int] = {} if counts is None else counts
        self._pending: List[np.ndarray] = []
        self._pending_size = 0

    @property
    def counts(self) -> Dict[int, int]:
        if self._pending:
            self._fold()
        return self._counts

    @counts.setter
    def counts(self, value: Dict[int, int]) -> None:
        self._counts, self._pending, self._pending_size = value, [], 0

    def __getstate__(self):
        return self.counts

    def __setstate__(self, state) -> None:
        self._counts, self._pending, self._pending_size = state, [], 0

    def __repr__(self) -> str:
        return f"Histogram({self.counts!r})"

    # ------------------------------------------------------------ building

    def add(self, value: int, n: int = 1) -> None:
        value, n = int(value), int(n)
        if value < 0:
            raise ValueError(f"Histogram values must be >= 0, got {value}")
        if n:
            self._counts[value] = self._counts.get(value, 0) + n

    def add_counts(self, counts: np.ndarray) -> None:
        """Add `counts[v]` occurrences of each value v (a histogram as `np.bincount` gives it)."""
        counts = np.asarray(counts).reshape(-1)
        nz = np.flatnonzero(counts)
        if nz.size and counts[nz].min() < 0:
            raise ValueError("Histogram counts must be >= 0")
        mine = self._counts
        for v, c in zip(nz.tolist(), counts[nz].tolist()):
            mine[v] = mine.get(v, 0) + c

    def add_array(self, values: np.ndarray) -> None:
        values = np.asarray(values).reshape(-1)
        if not values.size:
            return
        if values.min() < 0:
            raise ValueError("Histogram values must be >= 0")
        self._pending.append(values.astype(np.int64, copy=False))
        self._pending_size += values.size
        if self._pending_size >= self._FOLD_AT:
            self._fold()

    def _fold(self) -> None:
        values = np.concatenate(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending, self._pending_size = [], 0
        hi = int(values.max())
        if hi <= 4 * values.size + 64:  # small values: bincount is a single pass
            binc = np.bincount(values)
            nz = np.flatnonzero(binc)
            pairs = zip(nz.tolist(), binc[nz].tolist())
        else:
            u, c = np.unique(values, return_counts=True)
            pairs = zip(u.tolist(), c.tolist())
        counts = self._counts
        for v, c in pairs:
            counts[v] = counts.get(v, 0) + c

    def merge_from(self, other: "Histogram") -> None:
        counts = self._counts
        for v, c in other.counts.items():
            counts[v] = counts.get(v, 0) + c

    @staticmethod
    def merged(parts: Iterable["Histogram"]) -> "Histogram":
        out = Histogram()
        for p in parts:
            out.merge_from(p)
        return out

    # ------------------------------------------------------------ reading

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def sum(self) -> int:
        return sum(v * c for v, c in self.counts.items())

    @property
    def max(self) -> int:
        return max(self.counts) if self.counts else 0

    @property
    def min(self) -> int:
        return min(self.counts) if self.counts else 0

    @property
    def mean(self) -> float:
        n = self.total
        return self.sum / n if n else 0.0

    def quantile(self, q: QuantileLike) -> int:
        """Nearest-rank quantile (see module doc); 0 for an empty histogram."""
        q = parse_quantile(q)
        n = self.total
        if not n:
            return 0
        rank = max(1, -(-q.numerator * n // q.denominator))  # ceil(q * n), in integers
        seen = 0
        for v in sorted(self.counts):
            seen += self.counts[v]
            if seen >= rank:
                return v
        return self.max

    def count_over(self, limit: int) -> int:
        """How many observations exceed `limit`."""
        return sum(c for v, c in self.counts.items() if v > limit)

    def excess_over(self, limit: int) -> int:
        """Sum of (value - limit) over observations above `limit` (what a limit would cut off)."""
        return sum((v - limit) * c for v, c in self.counts.items() if v > limit)

    def sorted_items(self):
        return sorted(self.counts.items())

    # ------------------------------------------------------------ JSON

    def to_json(self) -> dict:
        items = self.sorted_items()
        return {"values": [v for v, _ in items], "counts": [c for _, c in items]}

    @classmethod
    def from_json(cls, d: Mapping) -> "Histogram":
        values, counts = d["values"], d["counts"]
        if len(values) != len(counts):
            raise ValueError("histogram: 'values' and 'counts' differ in length")
        if all(type(v) is int for v in values) and all(type(c) is int and c > 0 for c in counts):
            return cls(dict(zip(values, counts)))  # the common case: plain JSON ints
        return cls({int(v): int(c) for v, c in zip(values, counts) if int(c)})

    def __eq__(self, other):
        if not isinstance(other, Histogram):
            return NotImplemented
        return {k: v for k, v in self.counts.items() if v} == {k: v for k, v in other.counts.items() if v}
