"""Blocks of examples, deterministic global batches, and the per-host / per-chip split.

An `ExampleBlock` holds n consecutive examples as flat numpy arrays (labels,
dense, a mask, and per feature: values per example, ids, weights, OOV count
per example).  Global batches are formed over the examples ordered by
(input file, record): example k of the dataset is example k % B of step
k // B.  A global batch's rows are split per host, then per chip, as
contiguous blocks (host h owns examples [h*B/H, (h+1)*B/H), chip c owns
[c*b, (c+1)*b)), which is how TPUStrategy splits a global batch.

With `shuffle` in the spec, example k goes to position p(k) of its epoch instead
(p a seeded bijection, `tpu_embed.core.permutation`): step p(k) // B, slot p(k) % B
(`scatter_into_steps`, `assemble_shuffled_step`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tpu_embed.sparsecore import FeatureIds


@dataclasses.dataclass
class FeatureBlock:
    lengths: np.ndarray  # int64 [n]: values per example
    ids: np.ndarray  # int64 [sum(lengths)]
    weights: Optional[np.ndarray]  # float32 [sum(lengths)] or None (all ones)
    oov: np.ndarray  # int32 [n]: values of the example that were out of vocabulary

    def slice(self, a: int, b: int) -> "FeatureBlock":
        starts = self.starts()
        lo, hi = starts[a], starts[b]
        return FeatureBlock(self.lengths[a:b], self.ids[lo:hi],
                            None if self.weights is None else self.weights[lo:hi], self.oov[a:b])

    def starts(self) -> np.ndarray:
        """int64 [n + 1]: where each example's values start in `ids`, and their end (kept: do not change it)."""
        # Cached: slicing a large block step by step would otherwise redo this sum per slice
        # (quadratic: 18 of 62 s of the 2 M-example single-process benchmark).
        s = self.__dict__.get("_starts_cache")
        if s is None or s.size != self.lengths.size + 1:
            s = np.zeros(self.lengths.size + 1, dtype=np.int64)
            np.cumsum(self.lengths, out=s[1:])
            self.__dict__["_starts_cache"] = s
        return s

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_starts_cache"}

    def take(self, rows: np.ndarray) -> "FeatureBlock":
        """The examples `rows` (int64 indices), in that order."""
        starts = self.starts()
        lengths = self.lengths[rows]
        total = int(lengths.sum())
        new_starts = np.zeros(rows.size + 1, np.int64)
        np.cumsum(lengths, out=new_starts[1:])
        src = np.repeat(starts[:-1][rows] - new_starts[:-1], lengths) + np.arange(total, dtype=np.int64)
        return FeatureBlock(lengths, self.ids[src], None if self.weights is None else self.weights[src],
                            self.oov[rows])

    @staticmethod
    def concat(parts: Sequence["FeatureBlock"]) -> "FeatureBlock":
        weighted = any(p.weights is not None for p in parts)
        return FeatureBlock(
            np.concatenate([p.lengths for p in parts]).astype(np.int64, copy=False),
            np.concatenate([p.ids for p in parts]).astype(np.int64, copy=False),
            np.concatenate([p.weights if p.weights is not None else np.ones(p.ids.size, np.float32)
                            for p in parts]).astype(np.float32, copy=False) if weighted else None,
            np.concatenate([p.oov for p in parts]).astype(np.int32, copy=False))

    @staticmethod
    def empty(n: int, weighted: bool) -> "FeatureBlock":
        return FeatureBlock(np.zeros(n, np.int64), np.zeros(0, np.int64),
                            np.zeros(0, np.float32) if weighted else None, np.zeros(n, np.int32))


@dataclasses.dataclass
class ExampleBlock:
    label: np.ndarray  # float32 [n]
    dense: np.ndarray  # float32 [n, D]
    mask: np.ndarray  # float32 [n]: 1 for real examples, 0 for tail padding
    features: Dict[str, FeatureBlock]

    @property
    def num_examples(self) -> int:
        return int(self.label.size)

    def slice(self, a: int, b: int) -> "ExampleBlock":
        return ExampleBlock(self.label[a:b], self.dense[a:b], self.mask[a:b],
                            {k: v.slice(a, b) for k, v in self.features.items()})

    def take(self, rows: np.ndarray) -> "ExampleBlock":
        """The examples `rows` (int64 indices), in that order."""
        return ExampleBlock(self.label[rows], self.dense[rows], self.mask[rows],
                            {k: v.take(rows) for k, v in self.features.items()})

    @staticmethod
    def concat(parts: Sequence["ExampleBlock"]) -> "ExampleBlock":
        if len(parts) == 1:
            return parts[0]
        names = list(parts[0].features)
        return ExampleBlock(np.concatenate([p.label for p in parts]),
                            np.concatenate([p.dense for p in parts]),
                            np.concatenate([p.mask for p in parts]),
                            {k: FeatureBlock.concat([p.features[k] for p in parts]) for k in names})

    @staticmethod
    def padding(n: int, num_dense: int, like: "ExampleBlock") -> "ExampleBlock":
        return ExampleBlock(np.zeros(n, np.float32), np.zeros((n, num_dense), np.float32), np.zeros(n, np.float32),
                            {k: FeatureBlock.empty(n, v.weights is not None) for k, v in like.features.items()})


# ---------------------------------------------------------------- global batches

def chunk_offsets(sizes: Sequence[Tuple[Tuple[int, int], int]]) -> Dict[Tuple[int, ...], int]:
    """{(file, chunk): first global example index} from every chunk's example count."""
    out: Dict[Tuple[int, ...], int] = {}
    pos = 0
    for key, n in sorted(sizes):
        out[tuple(key)] = pos
        pos += int(n)
    return out


def step_count(total: int, batch: int, tail: str) -> Tuple[int, int, int]:
    """(steps, examples dropped, padding examples) for `total` examples under the tail policy."""
    full, rest = divmod(total, batch)
    if tail == "pad" and rest:
        return full + 1, 0, batch - rest
    return full, rest, 0


def split_into_steps(block: ExampleBlock, start: int, batch: int, steps: int
                     ) -> Iterator[Tuple[int, Tuple[int, ExampleBlock]]]:
    """(step, (position in the step, piece)) for the examples of a block starting at global `start`.

    Examples at or past `steps * batch` (the dropped tail) are not emitted.
    """
    n = block.num_examples
    pos = 0
    while pos < n:
        g = start + pos
        step, offset = divmod(g, batch)
        if step >= steps:
            return
        take = min(batch - offset, n - pos)
        yield step, (offset, block.slice(pos, pos + take))
        pos += take


def assemble_step(pieces: Sequence[Tuple[int, ExampleBlock]], batch: int, num_dense: int) -> ExampleBlock:
    """The global batch from its pieces (ordered by position); a short last step is padded."""
    pieces = sorted(pieces, key=lambda p: p[0])
    expect = 0
    for offset, piece in pieces:
        if offset != expect:
            raise RuntimeError(f"internal error: step pieces do not tile the batch (gap at {expect}, next {offset})")
        expect += piece.num_examples
    blocks = [p for _, p in pieces]
    if expect < batch:
        blocks.append(ExampleBlock.padding(batch - expect, num_dense, blocks[0]))
    return ExampleBlock.concat(blocks)


# ---------------------------------------------------------------- shuffled global batches

@dataclasses.dataclass
class PackedPiece:
    """Examples of one step from one chunk, with their slots, in a few flat arrays.

    A shuffled chunk is cut into up to one piece per step, so pieces can be small; an ExampleBlock
    would cost four arrays per feature to send through the GroupByKey, this costs ten in all. Per
    example: slot, label, dense row, mask and, per feature (in `names` order), its value count and OOV
    count; the ids (and weights) example-major: example 0's ids of every feature in order, then
    example 1's, ... Weights of unweighted features are ones; `weights` is None if no feature is weighted.
    """
    slots: np.ndarray  # int64 [n]
    label: np.ndarray  # float32 [n]
    dense: np.ndarray  # float32 [n, D]
    mask: np.ndarray  # float32 [n]
    names: Tuple[str, ...]
    weighted: Tuple[bool, ...]
    lengths: np.ndarray  # int64 [n, F]
    oov: np.ndarray  # int32 [n, F]
    ids: np.ndarray  # int64 [lengths.sum()]
    weights: Optional[np.ndarray]  # float32 [lengths.sum()]

    @property
    def num_examples(self) -> int:
        return int(self.slots.size)

    @staticmethod
    def pack(block: ExampleBlock, slots: np.ndarray) -> "PackedPiece":
        names = tuple(block.features)
        n, nf = block.num_examples, len(names)
        lengths = np.empty((n, nf), np.int64)
        oov = np.empty((n, nf), np.int32)
        for f, k in enumerate(names):
            lengths[:, f] = block.features[k].lengths
            oov[:, f] = block.features[k].oov
        flat = np.zeros(n * nf + 1, np.int64)
        np.cumsum(lengths.ravel(), out=flat[1:])
        total = int(flat[-1])
        weighted = tuple(block.features[k].weights is not None for k in names)
        ids = np.empty(total, np.int64)
        weights = np.ones(total, np.float32) if any(weighted) else None
        for f, k in enumerate(names):
            fb = block.features[k]
            dest = np.repeat(flat[f:n * nf:nf] - fb.starts()[:-1], fb.lengths) + np.arange(fb.ids.size)
            ids[dest] = fb.ids
            if fb.weights is not None and weights is not None:
                weights[dest] = fb.weights
        return PackedPiece(np.asarray(slots, np.int64), block.label, block.dense, block.mask, names, weighted,
                           lengths, oov, ids, weights)

    def split(self, bounds: Sequence[int]) -> List["PackedPiece"]:
        """The examples [bounds[i], bounds[i+1]) as pieces (views)."""
        row = np.zeros(self.num_examples + 1, np.int64)
        np.cumsum(self.lengths.sum(axis=1), out=row[1:])
        out = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            lo, hi = int(row[a]), int(row[b])
            out.append(PackedPiece(self.slots[a:b], self.label[a:b], self.dense[a:b], self.mask[a:b], self.names,
                                   self.weighted, self.lengths[a:b], self.oov[a:b], self.ids[lo:hi],
                                   None if self.weights is None else self.weights[lo:hi]))
        return out


def scatter_into_steps(block: ExampleBlock, start: int, batch: int, steps: int,
                       positions: Callable[[np.ndarray], np.ndarray], first_step: int = 0
                       ) -> Iterator[Tuple[int, PackedPiece]]:
    """(step, piece) for a block starting at global `start`, under a permutation of the examples.

    `positions` maps global example indices to positions in the epoch (`tpu_embed.core.permutation`):
    example g goes to step `first_step + p // batch`, slot `p % batch` (p = positions(g)); positions at or
    past `steps * batch` (the dropped tail) are not emitted. Each piece holds the block's examples of one
    step in slot order.
    """
    n = block.num_examples
    if n == 0:
        return
    pos = positions(np.arange(start, start + n, dtype=np.int64))
    rows = np.flatnonzero(pos < steps * batch)
    order = np.argsort(pos[rows], kind="stable")
    rows, pos = rows[order], pos[rows][order]
    step_of = pos // batch
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(step_of)) + 1, [rows.size]]).tolist()
    # One gather and one packing for the whole block, then views per step.
    packed = PackedPiece.pack(block.take(rows), pos % batch)
    for a, piece in zip(bounds[:-1], packed.split(bounds)):
        yield first_step + int(step_of[a]), piece


def assemble_shuffled_step(pieces: Sequence[PackedPiece], batch: int, num_dense: int) -> ExampleBlock:
    """The global batch from scattered pieces, in slot order; a short last step is padded.

    The result depends only on which example has which slot, not on the pieces' order or grouping;
    it is the ExampleBlock `ExampleBlock.concat` of the examples in slot order would give.
    """
    names = pieces[0].names
    nf = len(names)
    slots = np.concatenate([p.slots for p in pieces])
    n = slots.size
    order = np.argsort(slots, kind="stable")
    if not np.array_equal(slots[order], np.arange(n)):
        raise RuntimeError("internal error: shuffled step pieces do not tile the batch")
    lengths_in = np.concatenate([p.lengths for p in pieces])
    lengths, oov = lengths_in[order], np.concatenate([p.oov for p in pieces])[order]
    weighted = [any(p.weighted[f] for p in pieces) for f in range(nf)]
    ids_in = np.concatenate([p.ids for p in pieces])
    w_in = np.concatenate([p.weights if p.weights is not None else np.ones(p.ids.size, np.float32)
                           for p in pieces]) if any(weighted) else None
    # Rows into slot order (example-major), then each feature's ids together in example order.
    row_in = np.zeros(n + 1, np.int64)
    np.cumsum(lengths_in.sum(axis=1), out=row_in[1:])
    tot = lengths.sum(axis=1)
    row = np.zeros(n + 1, np.int64)
    np.cumsum(tot, out=row[1:])
    src = np.repeat(row_in[:-1][order] - row[:-1], tot) + np.arange(int(row[-1]), dtype=np.int64)
    by_feature = np.argsort(np.repeat(np.tile(np.arange(nf), n), lengths.ravel()), kind="stable")
    src = src[by_feature]
    ids, w = ids_in[src], None if w_in is None else w_in[src]
    fstart = np.zeros(nf + 1, np.int64)
    np.cumsum(lengths.sum(axis=0), out=fstart[1:])
    features = {}
    for f, k in enumerate(names):
        lo, hi = int(fstart[f]), int(fstart[f + 1])
        features[k] = FeatureBlock(np.ascontiguousarray(lengths[:, f]), ids[lo:hi],
                                   w[lo:hi] if weighted[f] and w is not None else None,
                                   np.ascontiguousarray(oov[:, f]))
    block = ExampleBlock(np.concatenate([p.label for p in pieces])[order],
                         np.concatenate([p.dense for p in pieces])[order],
                         np.concatenate([p.mask for p in pieces])[order], features)
    if n < batch:
        block = ExampleBlock.concat([block, ExampleBlock.padding(batch - n, num_dense, block)])
    return block


def global_feature_ids(block: ExampleBlock, feature: str, sequence_length: int) -> FeatureIds:
    """Global rows for one feature: example i -> row i, or rows i*L + position for sequences."""
    fb = block.features[feature]
    return _feature_ids(fb.lengths, fb.ids, fb.weights, sequence_length)


def _feature_ids(lengths: np.ndarray, ids: np.ndarray, weights: Optional[np.ndarray],
                 sequence_length: int) -> FeatureIds:
    n = lengths.size
    ex = np.repeat(np.arange(n, dtype=np.int64), lengths)
    if sequence_length > 0:
        starts = np.zeros(n + 1, np.int64)
        np.cumsum(lengths, out=starts[1:])
        pos = np.arange(ids.size, dtype=np.int64) - starts[ex]
        rows = ex * sequence_length + pos
    else:
        rows = ex
    return FeatureIds(rows=rows, ids=ids, weights=weights)


class GlobalIds(Mapping[str, FeatureIds]):
    """A step's `global_feature_ids` of each feature, each made when it is first read.

    The shard job hands a step's ids to its profile statistics (often in a child process: it is pickled
    there) while the step's CSR is packed from the values per example directly (`pipelines.sharding.step_records`); the
    rows per id are made where the statistics need them. Pickles the values, not the rows."""

    def __init__(self, features: Mapping[str, Tuple[np.ndarray, np.ndarray, Optional[np.ndarray], int]]):
        self._features = dict(features)  # {name: (lengths, ids, weights, sequence_length)}
        self._made: Dict[str, FeatureIds] = {}

    @staticmethod
    def of(block: ExampleBlock, sequence_lengths: Mapping[str, int]) -> "GlobalIds":
        return GlobalIds({name: (block.features[name].lengths, block.features[name].ids,
                                 block.features[name].weights, length)
                          for name, length in sequence_lengths.items()})

    def example_lengths(self, name: str) -> Tuple[np.ndarray, np.ndarray, int]:
        """(ids per example, ids, sequence length) of a feature: what its rows are made from
        (`profiles.step_counts` counts from them without making the rows)."""
        lengths, ids, _, sequence_length = self._features[name]
        return lengths, ids, sequence_length

    def __getitem__(self, name: str) -> FeatureIds:
        got = self._made.get(name)
        if got is None:
            got = self._made[name] = _feature_ids(*self._features[name])
        return got

    def __iter__(self):
        return iter(self._features)

    def __len__(self) -> int:
        return len(self._features)

    def __reduce__(self):
        return GlobalIds, (self._features,)
