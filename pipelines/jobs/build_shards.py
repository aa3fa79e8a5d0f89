"""Shards: training steps -> per-chip SparseCore CSR records -> shard files, and the partial profiles
(`BuildShards`)."""

from __future__ import annotations

import typing
from typing import Optional, Union

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from pipelines import child_process, output, profile_worker
from pipelines.background import Behind
from pipelines.jobs.coders import BulkElement
from pipelines.jobs.collect_profile import profile_collector, write_partial
from pipelines.jobs.counters import inc_counters
from pipelines.jobs.tagged import split_tagged
from pipelines.sharding import runs as shard_runs
from pipelines.sharding import step_records
from tpu_embed.artifact import tfrecord
from tpu_embed.artifact.spec import Spec
from tpu_embed.sparsecore.layout import SparseCoreLayout

# Steps a bundle's profile may lag (their ids are held meanwhile): in a thread, two groups of
# `profiles.collector.STEPS_PER_CALL` steps being counted while the next is gathered; in a child, the steps sent.
PROFILE_STEPS_BEHIND = 32
# Steps whose records a bundle's build thread may make ahead of the worker writing them: the CSR packing
# (native, without the GIL) of the next steps runs while the worker maps and writes.
BUILD_STEPS_AHEAD = 2


@beam.typehints.with_output_types(BulkElement)
class _BuildStep(beam.DoFn):
    """(step, ExampleBlock) -> ("runs", ((host, file), shard_runs.Run)) | ("profile", collect_profile.PartialFile)
    | ("stats", ...).

    The records go to run files as they are built (`pipelines.sharding.runs`): only their places travel on.
    The records are built by a background thread (`pipelines.background.Behind`), up to `BUILD_STEPS_AHEAD`
    steps ahead, and written by this one in step order. With a `collector`, the bundle's steps are added to
    one partial profile (a `ProfileCollector` accumulator) by another: its numpy work runs while the steps
    are packed and written (native code, without the GIL); the partial is written to a file when the bundle
    ends (`collect_profile.write_partial`; kept in this process's memory instead where `partials_in_memory`)
    and its place emitted.
    """

    def __init__(self, spec: Spec, vocab_sizes, limits, steps_per_file: int, encode: bool, output: str,
                 collector=None, partials_in_memory: bool = False):
        self.spec, self.vocab_sizes, self.limits = spec, vocab_sizes, limits
        self.steps_per_file, self.encode, self.output, self.collector = steps_per_file, encode, output, collector
        self.partials_in_memory = partials_in_memory
        self.layout: Optional[SparseCoreLayout] = None  # from setup
        self.runs: Optional[shard_runs.RunWriter] = None  # a bundle's, from start_bundle
        self.building: Optional[Behind] = None
        self.profiling: Optional[Union[profile_worker.ProfileThread, profile_worker.ProfileProcess]] = None
        self.profile_child: Optional[child_process.Child] = None

    def setup(self):
        self.layout = self.spec.layout(self.vocab_sizes)
        if self.encode:
            step_records.warn_if_no_native_kernel()

    def teardown(self):
        if self.profiling is not None:  # a bundle that failed: its profile's child is not wanted
            self.profiling.abort()
            self.profiling = self.profile_child = None
        if self.profile_child is not None:
            self.profile_child.close()
            self.profile_child = None

    def start_bundle(self):
        self.runs = shard_runs.RunWriter(self.output)
        self.building = Behind(BUILD_STEPS_AHEAD)
        self.profiling = None  # started at the bundle's first step: a bundle without steps starts no child

    def _profiling(self):
        if self.profiling is None:
            if self.profile_child is None and profile_worker.use_child(self.collector.model):
                self.profile_child = child_process.Child()  # one per DoFn instance, bundle after bundle
            self.profiling = profile_worker.start(self.collector, PROFILE_STEPS_BEHIND, self.profile_child)
        return self.profiling

    def process(self, kv):
        step, block = kv
        assert self.building is not None  # start_bundle's
        self.building.run(self._build, step, block)
        for built in self.building.results():
            yield from self._emit(*built)

    def _build(self, step, block):
        return (step,) + step_records.build_step(step, block, self.spec, self.layout, self.limits, encode=self.encode)

    def _emit(self, step, records, gids, oov, counts):
        inc_counters(counts)
        yield "stats", dict(counts)
        assert self.runs is not None  # start_bundle's
        for host, rec in records:
            for written in self.runs.add((host, step // self.steps_per_file), step, rec):
                yield "runs", written
        if self.collector is not None:  # ids the packer took need no second check (`add_step`'s validate)
            self._profiling().add_step(gids, oov, step, validate=not self.encode)

    def finish_bundle(self):
        assert self.building is not None and self.runs is not None  # start_bundle's
        for built in self.building.close():
            for out in self._emit(*built):
                yield GlobalWindows.windowed_value(out)
        self.building = None
        for written in self.runs.close():
            yield GlobalWindows.windowed_value(("runs", written))
        if self.profiling is not None:
            profiling, self.profiling = self.profiling, None
            try:
                partial = profiling.close()
            except BaseException:
                self.profile_child = None  # killed by close: the next bundle starts another
                raise
            if partial.steps:
                yield GlobalWindows.windowed_value(("profile", write_partial(self.output, partial,
                                                                             self.partials_in_memory)))


@beam.typehints.with_output_types(typing.Any)
class _WriteShardFile(beam.DoFn):
    """One shard file from its steps' runs: TFRecord frames in step order, then the spec's
    `shards.compression` over the whole file (`tpu_embed.artifact.tfrecord.compress_chunks`: the bytes TF's
    TFRecordWriter with TFRecordOptions writes; no time or name in a GZIP header, so deterministic).
    Uncompressed and held whole by one run (`shard_runs.Run.is_whole_file`): that run, moved into place.
    Else streamed: one record in memory at a time (on object stores the file is uploaded whole)."""

    def __init__(self, output: str, steps_per_file: int, compression: str = "none"):
        self.output, self.steps_per_file, self.compression = output, steps_per_file, compression

    def process(self, kv, info):
        (host, file_no), runs = kv
        runs = list(runs)
        steps = sorted(step for run in runs for step, _, _ in run.records)
        num_files = max(1, -(-info["steps"] // self.steps_per_file))
        rel = step_records.shard_file_name(host, file_no, num_files)
        extra = {"kind": "shard", "host": host, "first_step": steps[0], "last_step": steps[-1]}
        if self.compression == "none" and len(runs) == 1 and runs[0].is_whole_file():
            yield output.move_into_place(runs[0].path, self.output, rel, runs[0].sha256, runs[0].size,
                                         records=len(steps), extra=extra)
            return
        frames = tfrecord.compress_chunks(shard_runs.frames_in_step_order(runs), self.compression)
        yield output.write_atomic(self.output, rel, frames, records=len(steps), extra=extra)


def _remove_runs(_, files, directory: str):
    """After every shard file is written: the runs are no longer needed (`pipelines.sharding.runs`)."""
    shard_runs.remove(directory)
    return files


class _BuildTagged(beam.PTransform):
    """One stream of steps built (`_BuildStep`): {"runs", "profile", "stats"}."""

    def __init__(self, build: "_BuildStep"):
        super().__init__()
        self.build = build

    def expand(self, steps):
        return split_tagged(steps | "BuildStep" >> beam.ParDo(self.build), ("runs", "profile", "stats"))


class BuildShards(beam.PTransform):
    """((step, ExampleBlock) PCollections, info) -> {"files": FileInfo, "profile": [PCollections of partial
    profiles' files, `collect_profile.PartialFile`], "stats": dicts}.

    Each step stream is built where it arrives (a stream of whole steps stays fused with the read that
    produced it) and its records written to runs there (`pipelines.sharding.runs`); only the runs' places
    meet in one GroupByKey per shard file, whose writer streams them into the file. The runs are deleted
    once every shard file is written, before "files" is complete. Each bundle adds its steps to one
    partial profile as it builds them (`_BuildStep`), written to a file when the bundle ends; `CollectProfile`
    merges the partials and deletes their files.
    """

    def __init__(self, spec: Spec, vocab_sizes, limits, output: str, steps_per_file: int = 1000,
                 write_shards: bool = True, profile: bool = True, candidate_chip_counts=None, frequency_ids=None,
                 partials_in_memory: bool = False):
        """`frequency_ids`: as for `collect_profile.profile_collector` (balanced vocabularies).
        `partials_in_memory`: the bundles and `CollectProfile` run in this process; the partial profiles stay
        in its memory (`collect_profile.write_partial`)."""
        super().__init__()
        self.spec, self.vocab_sizes, self.limits, self.output = spec, vocab_sizes, limits, output
        self.steps_per_file, self.write_shards, self.profile = steps_per_file, write_shards, profile
        self.candidates, self.frequency_ids = candidate_chip_counts, frequency_ids
        self.partials_in_memory = partials_in_memory

    def expand(self, steps_and_info):
        steps, info = steps_and_info
        streams = steps if isinstance(steps, (tuple, list)) else (steps,)
        collector = (profile_collector(self.spec, self.vocab_sizes, self.candidates, frequency_ids=self.frequency_ids)
                     if self.profile else None)
        build = _BuildStep(self.spec, self.vocab_sizes, self.limits, self.steps_per_file, self.write_shards,
                           self.output, collector, self.partials_in_memory)
        built = [stream | f"Build{i}" >> _BuildTagged(build) for i, stream in enumerate(streams)]
        runs = tuple(b["runs"] for b in built) | "AllRuns" >> beam.Flatten()
        stats = tuple(b["stats"] for b in built) | "AllBuildStats" >> beam.Flatten()
        written = (runs | "ByFile" >> beam.GroupByKey()
                   | "WriteFile" >> beam.ParDo(_WriteShardFile(self.output, self.steps_per_file,
                                                               self.spec.shards.compression),
                                               beam.pvalue.AsSingleton(info)))
        files = (steps_and_info[1].pipeline | "RemoveRunsTrigger" >> beam.Create([None])
                 | "RemoveRuns" >> beam.FlatMap(_remove_runs, beam.pvalue.AsList(written), self.output))
        return {"files": files, "profile": tuple(b["profile"] for b in built), "stats": stats}
