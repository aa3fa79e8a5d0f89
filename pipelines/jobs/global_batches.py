"""Global batches: blocks of mapped examples -> the training steps, in (file, record) order or shuffled
(`FormGlobalBatches`).

Each chunk's examples are placed on their own: a chunk's offset in the global order (from every chunk's
size) says which steps and slots its examples go to; a step's pieces are assembled in slot order. So the
bytes of a step do not depend on the runner, the worker count or the pieces' arrival order.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from pipelines.jobs.coders import BulkElement
from pipelines.jobs.tagged import split_tagged
from pipelines.sharding import batches
from tpu_embed.core import permutation


class InputChangedError(RuntimeError):
    """The chunks the shard job read differ from those the vocabulary job recorded."""


INPUT_CHANGED = "the input changed after the vocabulary job"


def input_changed(what: str) -> InputChangedError:
    return InputChangedError(f"{INPUT_CHANGED}: {what}. Fix: re-run `tpu-embed run` on input that does not change "
                             "while it runs.")


def _chunk_size(kv) -> Tuple[Tuple[int, int], int]:
    key, block = kv
    return tuple(key), block.num_examples


class _ChunkStarts:
    """Where each chunk's examples start in the global order (`info["offsets"]`), checked against the sizes
    the vocabulary job recorded, if it did (`recorded`: {(file, first record): examples})."""

    def __init__(self, recorded: Optional[Dict[Tuple[int, int], int]]):
        self.recorded = recorded

    def __call__(self, key, block, info) -> int:
        key = tuple(key)
        start = info["offsets"].get(key)
        expected = None if self.recorded is None else self.recorded.get(key)
        if start is None or (self.recorded is not None and expected != block.num_examples):
            read = "no such chunk" if expected is None else expected
            raise input_changed(f"chunk (file {key[0]}, first record {key[1]}) has {block.num_examples} valid "
                                f"examples, the vocabulary job read {read}")
        return start


def _checked_info(_, seen, known, info: dict) -> dict:
    """The batching info computed from the recorded sizes, once the sizes the job saw (`seen`) match them."""
    seen = sorted(seen)
    if seen != known:
        diff = sorted(set(seen) ^ set(known))[:3]
        raise input_changed(f"the shard job read {len(seen)} chunks with {sum(n for _, n in seen)} valid examples, "
                            f"the vocabulary job {len(known)} with {info['examples']} (first differences, "
                            f"((file, first record), examples): {diff})")
    return info


@beam.typehints.with_output_types(BulkElement)
class _SplitIntoSteps(beam.DoFn):
    """Unshuffled: a chunk's block -> ("pieces", (step, (position in the step, piece))), example k of the
    (file, record) order in slot k % B of step k // B."""

    def __init__(self, starts: _ChunkStarts, batch: int):
        self.starts, self.batch = starts, batch

    def process(self, kv, info):
        key, block = kv
        for step, piece in batches.split_into_steps(block, self.starts(key, block, info), self.batch, info["steps"]):
            yield "pieces", (step, piece)


@beam.typehints.with_output_types(BulkElement)
class _ScatterIntoSteps(beam.DoFn):
    """Shuffled: a chunk's block -> ("pieces", (step, packed piece)) of every epoch: epoch e puts example k at
    position p_e(k) (`tpu_embed.core.permutation`, key `epoch_key(seed, e)`), step e * S + p_e(k) // B."""

    def __init__(self, starts: _ChunkStarts, batch: int, seed: int, epochs: int):
        self.starts, self.batch, self.seed, self.epochs = starts, batch, seed, epochs

    def process(self, kv, info):
        key, block = kv
        start, per_epoch = self.starts(key, block, info), info["steps_per_epoch"]
        for e in range(self.epochs):
            perm = permutation.Permutation(info["examples"], permutation.epoch_key(self.seed, e))
            for step, piece in batches.scatter_into_steps(block, start, self.batch, per_epoch, perm, e * per_epoch):
                yield "pieces", (step, piece)


@beam.typehints.with_output_types(BulkElement)
class _StitchSteps(beam.DoFn):
    """Unshuffled batching with known chunk offsets: ("whole", (step, ExampleBlock)) for every step whose
    examples this bundle holds, ("pieces", (step, (position, piece))) for the rest.

    A step a chunk holds whole is cut out of it; a step that straddles two chunks read in the same bundle
    (consecutive chunks of one split) is assembled here once its last piece arrives. Only the pieces of
    steps that straddle bundles (split or file boundaries) wait until the end of the bundle and go through
    the GroupByKey by step: a few per split, instead of one step per chunk (1/8 of the data at the
    default chunk of 32768 rows and batch 4096, all of it held by the runner).
    """

    def __init__(self, starts: _ChunkStarts, batch: int, num_dense: int):
        self.starts, self.batch, self.num_dense = starts, batch, num_dense
        self.pending: Dict[int, list] = {}

    def start_bundle(self):
        self.pending = {}

    def process(self, kv, info):
        key, block = kv
        batch = self.batch
        for step, (offset, piece) in batches.split_into_steps(block, self.starts(key, block, info), batch,
                                                              info["steps"]):
            if offset == 0 and piece.num_examples == batch:
                yield "whole", (step, piece)
                continue
            got = self.pending.setdefault(step, [])
            got.append((offset, piece))
            if sum(p.num_examples for _, p in got) == batch:  # pieces are disjoint: the step is complete
                del self.pending[step]
                yield "whole", (step, batches.assemble_step(got, batch, self.num_dense))

    def finish_bundle(self):
        for step in sorted(self.pending):
            for piece in self.pending[step]:
                yield GlobalWindows.windowed_value(("pieces", (step, piece)))
        self.pending = {}


@beam.typehints.with_output_types(BulkElement)
class _AssembleStep(beam.DoFn):
    """(step, its pieces) -> (step, ExampleBlock) in slot order. With recorded chunk sizes, pieces that do not
    make up the step mean the input changed after the vocabulary job."""

    def __init__(self, batch: int, num_dense: int, shuffled: bool, recorded: bool):
        self.batch, self.num_dense, self.recorded = batch, num_dense, recorded
        self.assemble = batches.assemble_shuffled_step if shuffled else batches.assemble_step

    def process(self, kv):
        step, pieces = kv
        try:
            yield step, self.assemble(list(pieces), self.batch, self.num_dense)
        except RuntimeError as e:
            if not self.recorded:
                raise
            raise input_changed(f"step {step}'s examples do not match the chunks it recorded ({e})") from None


class FormGlobalBatches(beam.PTransform):
    """((file, chunk), ExampleBlock) -> {"steps": (step, ExampleBlock), "whole": (step, ExampleBlock), "info": dict}.

    Unshuffled (`shuffle_seed` None): example k of the (file, record) order is slot k % B of step k // B.
    Shuffled: epoch e puts example k at position p_e(k) (`tpu_embed.core.permutation`, key
    `epoch_key(seed, e)`): step e * S + p_e(k) // B, slot p_e(k) % B, S the steps per epoch. Each chunk is
    scattered on its own (no global table); a step's pieces are assembled in slot order, so the bytes do
    not depend on the runner, the worker count or the pieces' arrival order.

    `known_sizes` ([((file, chunk), examples)] of every chunk, as `run`'s vocabulary job records them):
    the chunks' offsets are then plain data instead of a side input computed from every mapped block, so
    the runner streams each chunk from the read through the mapping without holding the mapped data
    (with the side input, the DirectRunner held all of it: 6.4 GB at 2 M examples). Unshuffled, every
    step whose examples one bundle reads comes out in "whole", where the chunks were mapped
    (`_StitchSteps`); only the pieces of steps that straddle bundles go through the GroupByKey ("steps").
    The sizes the job sees are checked against
    them before any manifest is written (`InputChangedError`: the input changed after the vocabulary job).
    """

    def __init__(self, batch_size: int, num_dense: int, tail: str, shuffle_seed: Optional[int] = None,
                 epochs: int = 1, known_sizes: Optional[Sequence[Any]] = None):
        super().__init__()
        if epochs < 1 or (epochs > 1 and shuffle_seed is None):
            raise ValueError(f"epochs={epochs}: needs epochs >= 1, and shuffling for more than one epoch")
        self.batch, self.num_dense, self.tail = batch_size, num_dense, tail
        self.shuffle_seed, self.epochs = shuffle_seed, epochs
        self.known_sizes = None if known_sizes is None else sorted((tuple(k), int(n)) for k, n in known_sizes)

    def _info(self, sizes) -> dict:
        batch, seed, epochs = self.batch, self.shuffle_seed, self.epochs
        total = sum(n for _, n in sizes)
        steps, dropped, padded = batches.step_count(total, batch, self.tail)
        info = {"examples": total, "steps": steps, "tail_dropped": dropped, "tail_padding": padded,
                "offsets": batches.chunk_offsets(sizes)}
        if seed is not None:  # totals over the epochs; the per-epoch figures next to them
            info.update(steps=steps * epochs, tail_dropped=dropped * epochs, tail_padding=padded * epochs,
                        epochs=epochs, steps_per_epoch=steps, tail_dropped_per_epoch=dropped,
                        tail_padding_per_epoch=padded, shuffle=permutation.shuffle_info(seed))
        return info

    def expand(self, blocks):
        seed, known = self.shuffle_seed, self.known_sizes
        sizes = blocks | "Sizes" >> beam.Map(_chunk_size).with_output_types(Any)
        if known is None:
            info = (sizes | "AllSizes" >> beam.combiners.ToList()
                    | "Info" >> beam.Map(self._info).with_output_types(Any))
            split_info: Any = beam.pvalue.AsSingleton(info)
        else:
            split_info = static = self._info(known)
            info = (blocks.pipeline | "InfoTrigger" >> beam.Create([None])
                    | "Info" >> beam.Map(_checked_info, beam.pvalue.AsList(sizes), known,
                                         static).with_output_types(Any))
        starts = _ChunkStarts(None if known is None else dict(known))
        splitter: beam.DoFn
        if seed is None and known is not None:
            splitter = _StitchSteps(starts, self.batch, self.num_dense)
        elif seed is None:
            splitter = _SplitIntoSteps(starts, self.batch)
        else:
            splitter = _ScatterIntoSteps(starts, self.batch, seed, self.epochs)
        parts = split_tagged(blocks | "Split" >> beam.ParDo(splitter, split_info), ("whole", "pieces"),
                             bulk=("whole",))
        assemble = _AssembleStep(self.batch, self.num_dense, shuffled=seed is not None, recorded=known is not None)
        steps = (parts["pieces"] | "ByStep" >> beam.GroupByKey()
                 | "Assemble" >> beam.ParDo(assemble))
        return {"steps": steps, "whole": parts["whole"], "info": info}
