"""Vocabularies: parsed chunks -> exact frequency vocabularies, one file per feature (`ComputeVocabulary`).

The counting and the file format are `pipelines.mapping.vocabulary`'s (Beam-free); here they run as a
CombinePerKey of token counters (the default engine) or as tensorflow-transform's analyzer (`tft`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import typing
from typing import Deque, List, Optional

import apache_beam as beam
import pyarrow as pa
from apache_beam.transforms.window import GlobalWindows

from pipelines.jobs.coders import BulkCoder, BulkElement
from pipelines.jobs.tagged import split_tagged
from pipelines.mapping import balanced_ids
from pipelines.mapping import vocabulary as pvocab
from pipelines.mapping import vocabulary_modes as modes
from pipelines.output import write_atomic
from pipelines.token_index import TokenCounter
from pipelines.user_errors import UserError
from tpu_embed.artifact import io as tio
from tpu_embed.artifact import lineage
from tpu_embed.artifact.manifest import read_manifest
from tpu_embed.artifact.spec import Spec, vocabulary_filename
from tpu_embed.sparsecore.csr import native_threads


@beam.typehints.with_output_types(BulkElement)
class TokenCountCombineFn(beam.CombineFn):
    """Token arrays -> Table(token, count) of the writable tokens (`pvocab.counts_table`).

    The accumulator is a `TokenCounter` (picklable: its distinct tokens and counts). Accumulators and
    outputs are sized without pickling them (`BulkCoder`): Beam samples the size of a combine's outputs."""

    def create_accumulator(self):
        return TokenCounter()

    def get_accumulator_coder(self):
        return BulkCoder()

    def add_input(self, acc, tokens):
        return acc.add(tokens)

    def merge_accumulators(self, accs):
        accs = iter(accs)
        first = next(accs)
        for a in accs:
            first.merge(a)
        return first

    def extract_output(self, acc):
        return pvocab.counts_table(acc)


def _uncounted(key: str, counted: List[str]):
    if key not in counted:
        yield key, pvocab.counts_table(TokenCounter())


@beam.typehints.with_output_types(typing.Any)  # declared: Beam would infer it from the bytecode (~10 ms)
class _WriteVocabulary(beam.DoFn):
    """(key, token counts) -> the vocabulary files of the key's features, and the key's info.

    The keys of a bundle are ordered and written by a pool of threads (`native_threads`): pyarrow's sort and the
    files' writes let go of the GIL (the 26 keys of the quoted workload of benchmarks/run_throughput.py: about
    0.2 s one after the other on one thread). Each key's outputs are emitted in the order the keys came."""

    def __init__(self, spec: Spec, output: str, base: Optional[str] = None, day: int = 0):
        """`base`: the base artifact of the vocabularies of mode append / frozen (None: the first day); `day`:
        this run's day in their lineage (`tpu_embed.artifact.lineage`)."""
        self.spec, self.output, self.base, self.day = spec, output, base, day
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None  # a bundle's, from start_bundle
        self._pending: Deque[concurrent.futures.Future] = collections.deque()

    def start_bundle(self):
        self._pool = concurrent.futures.ThreadPoolExecutor(native_threads(), thread_name_prefix="tpu-embed-vocab")
        self._pending.clear()

    def process(self, kv):
        assert self._pool is not None  # start_bundle's
        self._pending.append(self._pool.submit(lambda: list(self._outputs(kv))))
        while self._pending and self._pending[0].done():
            yield from self._pending.popleft().result()

    def finish_bundle(self):
        try:
            while self._pending:
                for out in self._pending.popleft().result():
                    yield GlobalWindows.windowed_value(out)
        finally:
            self.teardown()

    def teardown(self):
        if self._pool is not None:  # a failed bundle: the keys under way finish; their outputs are not wanted
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._pending.clear()

    def _outputs(self, kv):
        key, counts = kv
        groups = self.spec.vocabulary_groups()
        feats = groups[key]
        v = feats[0].vocabulary
        total = int(pa.compute.sum(counts.column("count")).as_py() or 0)
        if v.mode != "rebuild":
            yield from self._lineage_outputs(key, counts, total)
            return
        table, distinct = pvocab.finalize_table(counts, v.top_k, v.frequency_threshold)
        kept = int(pa.compute.sum(table.column("count")).as_py() or 0)
        yield from _vocab_outputs(self.spec, self.output, key, table.column("token"), kept, distinct, total)

    def _lineage_outputs(self, key, counts, total):
        """Mode append / frozen: the base's ids kept (`pipelines.mapping.vocabulary_modes`), the vocabulary files
        and the key's token-count file (`tpu_embed.artifact.lineage`)."""
        v = self.spec.vocabulary_groups()[key][0].vocabulary
        base = _base_counts(self.base, key)
        r = modes.apply_mode(counts, base, mode=v.mode, day=self.day, top_k=v.top_k,
                             frequency_threshold=v.frequency_threshold, capacity=v.capacity)
        yield from _lineage_files(self.spec, self.output, key, r, r.vocabulary, r.table, counts.num_rows, total)


def _base_counts(base: Optional[str], key: str):
    """The base artifact's token counts of `key` (None: no base, the lineage's first day)."""
    return lineage.BaseArtifact(base, read_manifest(base)).token_counts(key) if base else None


def _lineage_files(spec: Spec, output, key, r, tokens, table, distinct, total, extra=None):
    """The token-count file of a vocabulary of mode append / frozen (`table`: its token counts in id order), its
    vocabulary files (`tokens` in id order) and its info with the mode's figures (`r`: the mode's result)."""
    v = spec.vocabulary_groups()[key][0].vocabulary
    name = "vocab/" + lineage.counts_filename(key)
    yield "files", write_atomic(output, name, lineage.token_counts_bytes(table), records=table.num_rows,
                                extra={"kind": lineage.COUNTS_KIND, "vocabulary_key": key})
    extra = {"mode": v.mode, "capacity": v.capacity, "tokens": r.tokens, "base_tokens": r.base_tokens,
             "new_tokens": r.new_tokens, "not_admitted_tokens": r.not_admitted_tokens,
             "not_admitted_count": r.not_admitted_count, "capacity_overflow_tokens": r.capacity_overflow_tokens,
             "capacity_overflow_count": r.capacity_overflow_count, "counts_file": name, **(extra or {})}
    if v.capacity is not None:
        extra["size"] = v.capacity  # the rows reserved: the same every day; the OOV buckets follow them
    yield from _vocab_outputs(spec, output, key, tokens, r.covered_count, distinct, total, extra)


@beam.typehints.with_output_types(typing.Any)
class _DraftVocabulary(beam.DoFn):
    """(key, token counts) -> (key, `balanced_ids.VocabularyDraft`): the vocabulary before its ids are balanced."""

    def __init__(self, spec: Spec, base: Optional[str] = None, day: int = 0):
        self.spec, self.base, self.day = spec, base, day

    def process(self, kv):
        key, counts = kv
        v = self.spec.vocabulary_groups()[key][0].vocabulary
        base = _base_counts(self.base, key) if v.mode != "rebuild" else None
        yield key, balanced_ids.draft(self.spec, key, counts, base, self.day)


def _assign_ids(drafts, spec: Spec, fixed):
    """[(key, draft without tokens)] of every vocabulary and {table: (ids, lookups)} of the tables whose ids
    nobody chooses -> {key: KeyAssignment} (`balanced_ids.assign`)."""
    return balanced_ids.assign(spec, dict(drafts), fixed)


def _fixed_ids(kv, spec: Spec):
    table, counts = kv
    return table, balanced_ids.fixed_table_ids(spec, table, counts)


@beam.typehints.with_output_types(typing.Any)
class _WriteBalanced(beam.DoFn):
    """(key, draft) and every key's ids -> the key's vocabulary files in balanced id order, its frequency-ids file
    (and under append / frozen its token-count file), and the key's info with the assignment's record."""

    def __init__(self, spec: Spec, output: str):
        self.spec, self.output = spec, output

    def process(self, kv, assignment):
        key, d = kv
        a = assignment[key]
        numbered = balanced_ids.apply(d, a)
        extra = {"ids": a.info}
        if a.info["order"] == "balanced":
            name = a.info["frequency_ids"]
            yield "files", write_atomic(self.output, name, balanced_ids.frequency_ids_bytes(numbered.frequency_ids),
                                        records=int(numbered.frequency_ids.size),
                                        extra={"kind": balanced_ids.FREQUENCY_IDS_KIND, "vocabulary_key": key})
        if d.mode is not None:
            yield from _lineage_files(self.spec, self.output, key, d.mode, numbered.tokens, numbered.table,
                                      d.distinct, d.total, extra)
            return
        yield from _vocab_outputs(self.spec, self.output, key, numbered.tokens, d.kept, d.distinct, d.total, extra)


def _vocab_outputs(spec: Spec, output, key, tokens, kept: int, distinct, total, extra=None):
    """("files", FileInfo) of each feature's vocabulary file (the same tokens), then ("info", the key's info).
    `kept`: the occurrences of the vocabulary's tokens in this run's data."""
    feats = spec.vocabulary_groups()[key]
    v = feats[0].vocabulary
    data = pvocab.vocabulary_file_bytes(tokens)
    infos = []
    for f in feats:
        infos.append(write_atomic(output, "vocab/" + vocabulary_filename(f.name), data, records=max(1, len(tokens)),
                                  extra={"kind": "vocabulary", "feature": f.name}))
    info = {"key": key, "features": [f.name for f in feats], "size": max(1, len(tokens)),
            "empty_vocabulary_dummy": not len(tokens), "num_oov_buckets": v.num_oov_buckets,
            "top_k": v.top_k, "frequency_threshold": v.frequency_threshold,
            "tokens_counted": total, "distinct_tokens": distinct,
            "tokens_covered": kept, "coverage": (kept / total) if total else 1.0,
            "files": ["vocab/" + vocabulary_filename(f.name) for f in feats], **(extra or {})}
    for fi in infos:
        yield "files", fi
    yield "info", info


class ComputeVocabulary(beam.PTransform):
    """ParsedChunk -> {"vocabularies": per-key info dicts, "files": FileInfo} (files written under output/vocab)."""

    def __init__(self, spec: Spec, output: str, engine: str = "combine", base: Optional[str] = None, day: int = 0):
        """`base`, `day`: for the vocabularies of mode append / frozen (`_WriteVocabulary`)."""
        super().__init__()
        if engine not in ("combine", "tft"):
            raise ValueError(f"vocabulary engine must be 'combine' or 'tft', got {engine!r}")
        if engine == "tft" and spec.partition.balanced_ids:
            raise UserError("--vocab-engine tft writes its vocabularies in frequency order (tft.vocabulary chooses "
                            "the ids): `partition: {ids: balanced}` needs the combine engine (the default).")
        if engine == "tft" and spec.lineage_groups():
            raise UserError(f"--vocab-engine tft computes vocabularies from scratch (tft.vocabulary has no base): "
                            f"the vocabularies {sorted(spec.lineage_groups())} of mode append / frozen need the "
                            "combine engine (the default).")
        self.spec, self.output, self.engine, self.base, self.day = spec, output, engine, base, day

    def expand(self, chunks):
        spec = self.spec
        if self.engine == "combine":
            counts = (chunks | "Tokens" >> beam.FlatMap(pvocab.chunk_tokens, spec)
                      | "CountTokens" >> beam.CombinePerKey(TokenCountCombineFn()))
            if spec.partition.balanced_ids:
                return self._expand_balanced(chunks, counts)
            write = _WriteVocabulary(spec, self.output, self.base, self.day)
            written = counts | "Write" >> beam.ParDo(write)  # fused with the combine
            # Every vocabulary key gets a file, also when no record has a token for it (TFT's dummy): the
            # keys the counts lack, found through a side input of the counted keys (the counts themselves
            # stay where they are made; a Flatten of seeds with the token arrays would make the local
            # runner hold every chunk's tokens before the combine saw one).
            counted = beam.pvalue.AsList(counts | "CountedKeys" >> beam.Keys())
            uncounted = (chunks.pipeline | "EveryKey" >> beam.Create(sorted(spec.vocabulary_groups()), reshuffle=False)
                         | "Uncounted" >> beam.FlatMap(_uncounted, counted)
                         | "WriteUncounted" >> beam.ParDo(write))
            out = split_tagged((written, uncounted) | "AllWritten" >> beam.Flatten(), ("info", "files"))
            return {"vocabularies": out["info"], "files": out["files"]}
        return self._expand_tft(chunks)

    def _expand_balanced(self, chunks, counts):
        """`partition: {ids: balanced}`: every key's draft, the ids of all of them assigned in one place
        (`balanced_ids.assign`, from the drafts' counts), then each key's files written in that order."""
        spec = self.spec
        counted = beam.pvalue.AsList(counts | "CountedKeys" >> beam.Keys())
        uncounted = (chunks.pipeline | "EveryKey" >> beam.Create(sorted(spec.vocabulary_groups()), reshuffle=False)
                     | "Uncounted" >> beam.FlatMap(_uncounted, counted))
        drafts = ((counts, uncounted) | "EveryCount" >> beam.Flatten()
                  | "Draft" >> beam.ParDo(_DraftVocabulary(spec, self.base, self.day)))
        # The lookups of the tables whose ids are the data's (identity, hashing): where their stacks start from.
        fixed = (chunks | "FixedTokens" >> beam.FlatMap(balanced_ids.fixed_chunk_tokens, spec)
                 | "CountFixedTokens" >> beam.CombinePerKey(TokenCountCombineFn())
                 | "FixedIds" >> beam.Map(_fixed_ids, spec).with_output_types(typing.Any))
        assignment = (drafts | "CountsOnly" >> beam.MapTuple(lambda k, d: (k, d.without_tokens()))
                      | "AllDrafts" >> beam.combiners.ToList()
                      | "AssignIds" >> beam.Map(_assign_ids, spec, beam.pvalue.AsDict(fixed))
                      .with_output_types(typing.Any))
        written = drafts | "WriteBalanced" >> beam.ParDo(_WriteBalanced(spec, self.output),
                                                         beam.pvalue.AsSingleton(assignment))
        out = split_tagged(written, ("info", "files"))
        return {"vocabularies": out["info"], "files": out["files"]}

    def _expand_tft(self, chunks):
        # tensorflow-transform (and TensorFlow with it) only for the tft engine: seconds to import.
        import tensorflow_transform.beam as tft_beam
        spec = self.spec
        tmp = tio.join(self.output, ".tft_tmp")
        batches = chunks | "ToRecordBatches" >> beam.Map(pvocab.tft_record_batch, spec)
        totals = (chunks | "TokensForInfo" >> beam.FlatMap(pvocab.chunk_tokens, spec)
                  | "CountForInfo" >> beam.CombinePerKey(TokenCountCombineFn()))
        with tft_beam.Context(temp_dir=tmp):
            transform_fn = ((batches, pvocab.tft_tensor_adapter_config(spec))
                            | "AnalyzeDataset" >> tft_beam.AnalyzeDataset(pvocab.tft_preprocessing_fn(spec)))
            written = transform_fn | "WriteTransformFn" >> tft_beam.WriteTransformFn(
                tio.join(self.output, "transform_fn"))
        names = pvocab.tft_vocabulary_names(spec)
        copied = totals | "CopyTftVocabularies" >> beam.FlatMap(_copy_tft_vocabulary, beam.pvalue.AsList(written),
                                                                 spec, self.output, names)
        out = split_tagged(copied, ("info", "files"))
        return {"vocabularies": out["info"], "files": out["files"]}


def _copy_tft_vocabulary(kv, _written, spec: Spec, output: str, names):
    """(key, token counts) -> the vocabulary files of the key from tft's asset (after `_written`: the
    transform_fn is written), with the info of the combine engine."""
    key, counts = kv
    path = tio.join(output, "transform_fn", "transform_fn", "assets", names[key])
    tokens = pvocab.read_vocabulary_file(tio.read_bytes(path))
    if tokens == [pvocab.TFT_EMPTY_VOCABULARY_TOKEN]:
        tokens = []
    lookup = dict(zip(counts.column("token").to_pylist(), counts.column("count").to_pylist()))
    token_counts = [lookup.get(t, 0) for t in tokens]
    total = int(pa.compute.sum(counts.column("count")).as_py() or 0)
    yield from _vocab_outputs(spec, output, key, tokens, int(sum(token_counts)), counts.num_rows, total)
