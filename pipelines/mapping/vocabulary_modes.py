"""Vocabulary modes append and frozen: a base vocabulary's ids kept, the next ids for new tokens (Beam-free).

Rules (docs/how-to/daily-retraining.md; the files: `tpu_embed.artifact.lineage`):

* **counts are merged**: a token's count is the base's count plus this run's (its occurrences over every day
  of the lineage so far), its `last_day` this run's day if seen here, else the base's. The base's token-count
  file holds every token counted on an earlier day, in the vocabulary or not, so an incremental run counts
  only its own day's data and still knows the lineage's counts.
* **append**: the base's tokens keep their ids 0..B-1, whether or not they are seen again. Every other token
  of the lineage (counted today or on an earlier day and left out then) that passes `frequency_threshold` by
  its merged count (count >= threshold, as `tft.vocabulary`) is ordered as `tft.vocabulary` orders a
  vocabulary, by merged count (count descending, then token bytes descending), and gets the next ids B, B+1,
  ... while there is room: a token seen a little every day is admitted once its total passes the threshold,
  and when the room is short the tokens most frequent over the lineage come first. `top_k` caps the whole
  vocabulary (base tokens included; the base's tokens are kept even beyond it), `capacity` the rows reserved
  for tokens. Tokens that qualified but found the capacity full map to the OOV buckets.
* **frozen**: the base's vocabulary as it is; every other token is out of vocabulary.
* **append without a base** (the first day of a lineage): the same rules with an empty base: without
  `capacity`, exactly the vocabulary `rebuild` makes.

The figures of a run (`ModeResult`: tokens not admitted, over capacity, covered) are about this run's data,
the occurrences its shards map: tokens seen here that map to the OOV buckets, and their occurrences here.
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
    not_admitted_tokens: int  # tokens of this run's data out of the vocabulary
    not_admitted_count: int  # their occurrences in this run's data
    capacity_overflow_tokens: int  # of those, the ones that qualified but found the capacity full
    capacity_overflow_count: int
    covered_count: int  # occurrences in this run's data of the vocabulary's tokens

    @property
    def vocabulary(self):
        """The tokens in id order (a list of bytes)."""
        return self.table.column("token").slice(0, self.tokens).to_pylist()


def _tft_order(t: pa.Table) -> pa.Table:
    if not t.num_rows:
        return t
    return t.take(pc.sort_indices(t, sort_keys=[("count", "descending"), ("token", "descending")]))


def _int64(col) -> np.ndarray:
    return np.asarray(pa.array(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col, pa.int64())
                      .to_numpy(zero_copy_only=False), np.int64)


def _sum(a: np.ndarray) -> int:
    return int(a.sum()) if len(a) else 0


def apply_mode(counts: pa.Table, base: Optional[pa.Table], *, mode: str, day: int, top_k: Optional[int] = None,
               frequency_threshold: Optional[int] = None, capacity: Optional[int] = None) -> ModeResult:
    """`counts`: Table(token, count) of this run's writable tokens (`pvocab.counts_table`); `base`: the base's
    token counts, Table(token, id, count, last_day) with its vocabulary first in id order and every other
    token it counted after it (id -1) (`tpu_embed.artifact.lineage.BaseArtifact.token_counts`), or None (the
    first day)."""
    if mode not in ("append", "frozen"):
        raise ValueError(f"apply_mode: mode must be append or frozen, got {mode!r}")
    tokens = pvocab.plain(pa.array(counts.column("token").combine_chunks(), pa.large_binary()))
    run = _int64(counts.column("count"))
    if base is None:
        base = pa.table({"token": pa.array([], pa.large_binary()), "id": pa.array([], pa.int64()),
                         "count": pa.array([], pa.int64()), "last_day": pa.array([], pa.int64())})
    base_tokens = pvocab.plain(pa.array(base.column("token").combine_chunks(), pa.large_binary()))
    base_ids = _int64(base.column("id"))
    nb = int((base_ids >= 0).sum())
    if capacity is not None and nb > capacity:
        raise ValueError(f"capacity {capacity} is below the base's {nb} tokens")
    # This run's count of each token the base counted (0: not seen here), and the tokens new to the lineage.
    at = pc.index_in(base_tokens, value_set=tokens)
    seen = at.is_valid().to_numpy(zero_copy_only=False)
    run_of_base = np.zeros(len(base_tokens), np.int64)
    if seen.any():
        run_of_base[seen] = run[_int64(at.fill_null(0))[seen]]
    fresh = np.ones(len(tokens), bool)
    if len(base_tokens):
        fresh = ~pc.is_in(tokens, value_set=base_tokens).to_numpy(zero_copy_only=False)
    merged = pa.table({
        "token": pa.concat_arrays([base_tokens, tokens.filter(pa.array(fresh))]),
        "count": pa.array(np.concatenate([_int64(base.column("count")) + run_of_base, run[fresh]])),
        "run": pa.array(np.concatenate([run_of_base, run[fresh]])),
        "last_day": pa.array(np.concatenate([np.where(seen, day, _int64(base.column("last_day"))),
                                             np.full(int(fresh.sum()), day, np.int64)]).astype(np.int64)),
    })
    vocab = merged.slice(0, nb)
    others = _tft_order(merged.slice(nb))
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
    n = nb + admitted
    rest_run = _int64(rest.column("run"))
    over_run = rest_run[:overflow]
    table = pa.table({
        "token": pa.concat_arrays([pvocab.plain(pa.array(x.column("token").combine_chunks(), pa.large_binary()))
                                   for x in (vocab, new, rest)]),
        "id": pa.array(np.concatenate([np.arange(n, dtype=np.int64), np.full(rest.num_rows, -1, np.int64)])),
        "count": pa.array(np.concatenate([_int64(x.column("count")) for x in (vocab, new, rest)])),
        "last_day": pa.array(np.concatenate([_int64(x.column("last_day")) for x in (vocab, new, rest)])),
    })
    covered = _sum(_int64(vocab.column("run"))) + _sum(_int64(new.column("run")))
    return ModeResult(table, n, nb, admitted, int((rest_run > 0).sum()), _sum(rest_run), int((over_run > 0).sum()),
                      _sum(over_run), covered)
