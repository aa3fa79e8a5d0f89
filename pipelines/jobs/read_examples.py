"""Reading: input files -> parsed chunks, dead letters and the read's counters (`ReadExamples`)."""

from __future__ import annotations

import collections
import typing
from typing import Any, List, Optional, Sequence, Tuple

import apache_beam as beam

from pipelines.background import Behind, mapped, prefetched
from pipelines.jobs.coders import BulkElement
from pipelines.jobs.counters import inc_counters
from pipelines.jobs.tagged import split_tagged
from pipelines.read import chunk_sizes, csv_scan, parse, splits, value_kinds
from pipelines.read import spill as read_spill
from pipelines.read.parse import ParsedChunk
from pipelines.read.records import (
    DEFAULT_CHUNK_ROWS,
    DeadLetter,
    Deferred,
    InputFile,
    InputSplit,
    RawBatch,
    StrictModeError,
)
from tpu_embed.artifact.spec import Spec
from tpu_embed.sparsecore.csr import native_threads


@beam.typehints.with_output_types(BulkElement)
class _ReadAndParse(beam.DoFn):
    """One input split -> ("chunks", ParsedChunk) | ("dead", DeadLetter) | ("stats", counts).

    A chunk's `chunk_index` is the record number of its first record: unique within the file and in
    (file, record) order whatever the splits, which is the order global batches follow.
    """

    def __init__(self, spec: Spec, strict: bool, chunk_rows: int, spill: Optional[str] = None,
                 replay: Optional[str] = None, spill_memory_bytes: int = 0):
        self.spec = spec
        self.strict = strict
        self.chunk_rows = chunk_rows
        self.spill, self.replay = spill, replay  # directories of `pipelines.read.spill`
        self.spill_memory_bytes = spill_memory_bytes
        self.spill_writes: Optional[Behind] = None  # the bundle's spill part writes
        self.encode = parse.encodable_columns(spec)  # columns the CSV reader may give dictionary-encoded
        self.text_columns = spec.required_columns() if spec.inputs.format == "csv" else []  # every cell is text

    def process(self, split: InputSplit, csv_states=()):
        if self.replay is not None:  # the vocabulary job's read of this split, as it was yielded
            for tag, value in prefetched(read_spill.replay(self.replay, split.file.index, split.index)):
                if tag == "stats":
                    inc_counters(value)
                yield tag, value
            return
        if self.spill is None:
            yield from self._read(split, csv_states)
            return
        writer = read_spill.SpillWriter(self.spill, split.file.index, split.index, writes=self.spill_writes,
                                        memory_bytes=self.spill_memory_bytes)
        for item in self._read(split, csv_states):
            writer.add(item)
            yield item
        writer.close()

    def start_bundle(self):
        self.spill_writes = None if self.spill is None else Behind()

    def finish_bundle(self):
        if self.spill_writes is not None:  # every split's parts are written before the bundle ends
            self.spill_writes.close()
            self.spill_writes = None

    def _read(self, split: InputSplit, csv_states):
        counts = collections.Counter(files_read=int(split.index == 0))
        state = dict(csv_states).get((split.file.index, split.index)) if csv_states else None
        held: List[DeadLetter] = []  # --strict: reader letters wait for the batch they precede

        def stop(letters):
            first = min(letters, key=lambda d: d.record)
            raise StrictModeError(f"--strict: {first.describe()}")

        for item, parsed in self._parsed(split, state):
            if isinstance(item, DeadLetter):
                if self.strict:
                    held.append(item)
                    continue
                counts[f"dead_letter/{item.reason}"] += 1
                if item.record >= 0:  # one record, read and dead-lettered
                    counts["records_read"] += 1
                    counts["records_dead_lettered"] += 1
                else:  # a whole file (its records are not counted: they could not be read)
                    counts["files_dead_lettered"] += 1
                yield "dead", item
                continue
            if parsed is None:
                continue
            chunk, letters = parsed
            if self.strict and (letters or held):
                stop(letters + held)
            counts["records_read"] += item.num_rows
            counts.update(value_kinds.kind_counts(item.columns, item.num_rows, self.text_columns))  # for serving
            for dl in letters:
                counts[f"dead_letter/{dl.reason}"] += 1
                counts["records_dead_lettered"] += 1
                yield "dead", dl
            counts["records_valid"] += chunk.num_rows
            yield "chunks", chunk
        if held:
            stop(held)
        inc_counters(counts)
        yield "stats", dict(counts)

    def _parsed(self, split: InputSplit, csv_state):
        """(reader item, (chunk, letters) parsed from it, or None), in order: the reader's framing (file reads,
        the CSV scan, TFRecord frames) one thread ahead, each batch's decoding (the native CSV split,
        pyarrow's CSV reader, tfx_bsl's Example decoder) and parse on `read_threads` threads beside it."""
        spec = self.spec
        items = prefetched(splits.read_split(spec.inputs.format, split, spec.required_columns(),
                                             csv_delimiter=spec.inputs.csv_delimiter, chunk_rows=self.chunk_rows,
                                             strict=self.strict, csv_state=csv_state, encode=self.encode,
                                             deferred=True))
        for done in mapped(self._decode_and_parse, items, read_threads()):
            yield from done

    def _decode_and_parse(self, item) -> List[Tuple[Any, Optional[Tuple[ParsedChunk, List[DeadLetter]]]]]:
        out = []
        for x in item.run() if isinstance(item, Deferred) else [item]:
            parsed = None
            if isinstance(x, RawBatch) and x.num_rows:
                parsed = parse.parse_batch(x, self.spec, int(x.record_numbers[0]))
            out.append((x, parsed))
        return out


def read_threads() -> int:
    """Threads that decode and parse a split's batches: the native packer's thread count (`native_threads`:
    TPU_EMBED_THREADS, which multi-process runners set to 1, else the CPUs this process may use)."""
    return native_threads()


def _chunk_size(chunk: ParsedChunk):
    return (chunk.file_index, chunk.chunk_index), chunk.num_rows


def _write_chunk_sizes(_, sizes, output: str, key: dict, name: str) -> str:
    return chunk_sizes.write(output, key, sizes, name)


class RecordChunkSizes(beam.PTransform):
    """ParsedChunk -> the read's record of every chunk's valid examples (`pipelines.read.chunk_sizes`), written
    under `output` once every chunk is read: the record's path."""

    def __init__(self, output: str, key: dict, name: str = chunk_sizes.FILENAME):
        super().__init__()
        self.output, self.key, self.name = output, key, name

    def expand(self, chunks):
        sizes = chunks | "Sizes" >> beam.Map(_chunk_size).with_output_types(typing.Any)
        return (chunks.pipeline | "Trigger" >> beam.Create([None])
                | "Write" >> beam.Map(_write_chunk_sizes, beam.pvalue.AsList(sizes), self.output, self.key,
                                      self.name).with_output_types(str))


def _csv_summary(split: InputSplit, delimiter: str):
    if split.count > 1 and not split.last:
        yield split.file.index, (split.index, csv_scan.csv_split_summary(split, delimiter))


def _csv_states(kv):
    index, summaries = kv
    for k, state in csv_scan.csv_split_states(summaries).items():
        yield (index, k), state


class ReadExamples(beam.PTransform):
    """PBegin -> {"chunks": ParsedChunk, "dead": DeadLetter, "stats": counter dicts}.

    `spill`: also keep each split's outputs in that directory (up to `spill_memory_bytes` of them in this
    process's memory); `replay`: yield the outputs kept there instead of reading (`pipelines.read.spill`:
    `run`'s shard job replays its vocabulary job's read).

    Files larger than `split_bytes` are read as several splits, by as many workers (`splits.plan_splits`):
    the same records, record numbers, chunks' order and dead letters for any split size. CSV splits
    after the first start at the quote state and line count the splits before them end with: one
    vectorised pass over those splits first ("CsvScan", in parallel), then the reads.
    """

    def __init__(self, spec: Spec, files: Sequence[InputFile], strict: bool = False,
                 chunk_rows: int = DEFAULT_CHUNK_ROWS, split_bytes: int = splits.DEFAULT_SPLIT_BYTES,
                 spill: Optional[str] = None, replay: Optional[str] = None, spill_memory_bytes: int = 0):
        super().__init__()
        self.spec, self.files, self.strict, self.chunk_rows = spec, list(files), strict, chunk_rows
        self.split_bytes = split_bytes
        self.spill, self.replay, self.spill_memory_bytes = spill, replay, spill_memory_bytes

    def expand(self, pbegin):
        fmt = self.spec.inputs.format
        planned = splits.plan_splits(fmt, self.files, self.split_bytes)
        spread = (pbegin | "Files" >> beam.Create(planned, reshuffle=False)  # "Spread" is the one reshuffle
                  | "Spread" >> beam.Reshuffle())
        read = _ReadAndParse(self.spec, self.strict, self.chunk_rows, self.spill, self.replay, self.spill_memory_bytes)
        if fmt == "csv" and any(s.count > 1 for s in planned) and self.replay is None:
            states = (spread | "CsvScan" >> beam.FlatMap(_csv_summary, self.spec.inputs.csv_delimiter)
                      | "CsvScanByFile" >> beam.GroupByKey()
                      | "CsvStates" >> beam.FlatMap(_csv_states))
            out = spread | "ReadParse" >> beam.ParDo(read, beam.pvalue.AsList(states))
        else:
            out = spread | "ReadParse" >> beam.ParDo(read)
        return split_tagged(out, ("chunks", "dead", "stats"), bulk=("chunks",))
