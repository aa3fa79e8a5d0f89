"""Vocabulary modes append and frozen: a base vocabulary's ids kept, the next ids for new tokens (Beam-free).

Rules (docs/how-to/daily-retraining.md; the files: `tpu_embed.artifact.lineage`):

* **append**: the base's tokens keep their ids 0..B-1, whether or not they are seen again. The tokens this run
  counted that are not in the base and pass `frequency_threshold` (count >= threshold, as `tft.vocabulary`)
  are ordered as `tft.vocabulary` orders a vocabulary (count descending, then token bytes descending) and get
  the next ids B, B+1, ... while there is room: `top_k` caps the whole vocabulary (base tokens included; the
  base's tokens are kept even beyond it), `capacity` the rows reserved for tokens. Tokens that qualified but
  found the capacity full are counted (`capacity_overflow_*`) and map to the OOV buckets.
* **frozen**: the base's vocabulary as it is; every other token is out of vocabulary (counted).
* **append without a base** (the first day of a lineage): the same rules with an empty base: without
  `capacity`, exactly the vocabulary `rebuild` makes.

Counts are this run's occurrences (a base token not seen here: 0); `last_day` is this run's day for a token
seen here, else the base's.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.mapping import vocabulary as pvocab


@dataclasses.dataclass
class ModeResult:
    table: pa.Table  # Table(token, id, count, last_day): the vocabulary in id order, then the other tokens counted
    tokens: int  # in use (rows with id >= 0)
    base_tokens: int
    new_tokens: int
    not_admitted_tokens: int
    not_admitted_count: int
    capacity_overflow_tokens: int
    capacity_overflow_count: int

    @property
    def vocabulary(self):
        """The tokens in id order (a list of bytes)."""
        return self.table.column("token").slice(0, self.tokens).to_pylist()


def _tft_order(counts: pa.Table) -> pa.Table:
    if not counts.num_rows:
        return counts
    return counts.take(pc.sort_indices(counts, sort_keys=[("count", "descending"), ("token", "descending")]))


def apply_mode(counts: pa.Table, base: Optional[pa.Table], *, mode: str, day: int, top_k: Optional[int] = None,
               frequency_threshold: Optional[int] = None, capacity: Optional[int] = None) -> ModeResult:
    """`counts`: Table(token, count) of this run's writable tokens (`pvocab.counts_table`); `base`:
    Table(token, last_day) of the base's vocabulary in id order, or None (the first day)."""
    if mode not in ("append", "frozen"):
        raise ValueError(f"apply_mode: mode must be append or frozen, got {mode!r}")
    tokens = pvocab.plain(pa.array(counts.column("token").combine_chunks(), pa.large_binary()))
    run_counts = pa.array(counts.column("count").combine_chunks(), pa.int64())
    if base is None:
        base = pa.table({"token": pa.array([], pa.large_binary()), "last_day": pa.array([], pa.int64())})
    base_tokens = pvocab.plain(base.column("token").combine_chunks())
    nb = len(base_tokens)
    if capacity is not None and nb > capacity:
        raise ValueError(f"capacity {capacity} is below the base's {nb} tokens")
    # This run's count of each base token (0: not seen) and where each counted token is in the base.
    at = pc.index_in(base_tokens, value_set=tokens)
    seen = at.is_valid().to_numpy(zero_copy_only=False)
    base_counts = np.zeros(nb, np.int64)
    if seen.any():
        base_counts[seen] = run_counts.to_numpy()[at.fill_null(0).to_numpy()[seen]]
    base_days = np.where(seen, day, base.column("last_day").to_numpy()).astype(np.int64)
    in_base = pc.is_in(tokens, value_set=base_tokens) if nb else pa.array(np.zeros(len(tokens), bool))
    others = pa.table({"token": tokens, "count": run_counts}).filter(pc.invert(in_base))
    others = _tft_order(others)
    admitted = 0
    overflow = 0
    if mode == "append":
        t = frequency_threshold
        qualified = others.num_rows if not (t and t > 1) else int(pc.sum(pc.greater_equal(
            others.column("count"), t)).as_py() or 0)  # `others` is in count order: the qualified come first
        room = qualified if top_k is None else min(qualified, max(0, top_k - nb))
        admitted = room if capacity is None else min(room, capacity - nb)
        overflow = room - admitted
    new = others.slice(0, admitted)
    rest = others.slice(admitted)
    overflow_count = int(pc.sum(rest.slice(0, overflow).column("count")).as_py() or 0) if overflow else 0
    n = nb + admitted
    table = pa.table({
        "token": pa.concat_arrays([base_tokens, pvocab.plain(new.column("token").combine_chunks()),
                                   pvocab.plain(rest.column("token").combine_chunks())]),
        "id": pa.array(np.concatenate([np.arange(n, dtype=np.int64), np.full(rest.num_rows, -1, np.int64)])),
        "count": pa.array(np.concatenate([base_counts, new.column("count").to_numpy(),
                                          rest.column("count").to_numpy()]).astype(np.int64)),
        "last_day": pa.array(np.concatenate([base_days, np.full(others.num_rows, day, np.int64)])),
    })
    return ModeResult(table, n, nb, admitted, rest.num_rows, int(pc.sum(rest.column("count")).as_py() or 0),
                      overflow, overflow_count)
