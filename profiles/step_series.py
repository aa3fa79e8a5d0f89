"""The per-step maxima a stack's statistics keep for plots (`PartitionStats.series`): ids, unique ids and chip
id-buffer slots of each step.

Quantiles never come from here but from the exact histograms of `profiles.stats`, which cover every step.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Tuple

import numpy as np

from profiles.idcounts import ENCODING, pack_ids, unpack_ids
from profiles.jsonio import JsonEq

DEFAULT_SERIES_STEPS = 10_000


def _max3(a: Tuple[int, int, int], b: Tuple[int, int, int]) -> Tuple[int, int, int]:
    return max(a[0], b[0]), max(a[1], b[1]), max(a[2], b[2])


class StepSeries(JsonEq):
    """Per-step maxima (ids, unique ids, chip id-buffer slots), for "limit vs observed" plots.

    Keyed by step index so that merging is a union: associative and
    commutative.  If two accumulators saw the same step index (callers that do
    not pass `step=` get a per-accumulator counter), the element-wise maximum
    is kept.  Only the `limit` smallest step indices are kept, which is also
    merge-order independent.  Quantiles never come from here: they come from
    the exact histograms, which cover every step.  In JSON the four columns
    are packed like id counts (10^4 steps of 26 stacks would otherwise be a
    million JSON numbers to parse); decoding is lazy.
    """

    def __init__(self, limit: int = DEFAULT_SERIES_STEPS, values: Optional[Dict[int, Tuple[int, int, int]]] = None):
        self._set(limit, values)

    def _set(self, limit: int, values: Optional[Dict[int, Tuple[int, int, int]]]) -> None:
        self.limit = int(limit)
        self._values = dict(values) if values else {}
        self._packed: Optional[dict] = None

    @property
    def values(self) -> Dict[int, Tuple[int, int, int]]:
        if self._packed is not None:
            d, self._packed = self._packed, None
            steps = np.cumsum(unpack_ids(d["steps"]))
            cols = [unpack_ids(d[k]) for k in ("max_ids", "max_unique_ids", "max_chip_buffer")]
            self._values = dict(zip(steps.tolist(), zip(*(c.tolist() for c in cols))))
        return self._values

    def record(self, step: int, ids: int, unique: int, buffer: int) -> None:
        step = int(step)
        values = self.values
        if len(values) >= self.limit and step > max(values):
            return
        old = values.get(step)
        v = (int(ids), int(unique), int(buffer))
        values[step] = v if old is None else _max3(old, v)
        self._trim()

    def merge_from(self, other: "StepSeries") -> None:
        self.limit = min(self.limit, other.limit)
        values = self.values
        for step, v in other.values.items():
            old = values.get(step)
            values[step] = v if old is None else _max3(old, v)
        self._trim()

    def _trim(self):
        if len(self._values) > self.limit:
            keep = sorted(self._values)[: self.limit]
            self._values = {k: self._values[k] for k in keep}

    def arrays(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        values = self.values
        steps = np.array(sorted(values), np.int64)
        vals = np.array([values[s] for s in steps.tolist()], np.int64).reshape(-1, 3)
        return steps, vals[:, 0], vals[:, 1], vals[:, 2]

    def to_json(self) -> dict:
        if self._packed is not None:
            return dict(self._packed)
        steps, ids, uniq, buf = self.arrays()
        return {"limit": self.limit, "encoding": ENCODING, "length": int(steps.size),
                "steps": pack_ids(np.diff(steps, prepend=np.int64(0)) if steps.size else steps),
                "max_ids": pack_ids(ids), "max_unique_ids": pack_ids(uniq), "max_chip_buffer": pack_ids(buf)}

    @classmethod
    def from_json(cls, d: Mapping) -> "StepSeries":
        if d.get("encoding") != ENCODING:
            raise ValueError(f"step series: unknown encoding {d.get('encoding')!r}")
        out = cls(int(d["limit"]))
        out._packed = dict(d)
        return out

    def __getstate__(self):
        return {"limit": self.limit, "values": self.values}

    def __setstate__(self, state):
        self._set(state["limit"], state["values"])
