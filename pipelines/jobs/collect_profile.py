"""The lookup statistics: partial profiles (one per bundle of `BuildShards`) -> profile files (`CollectProfile`).

A bundle's partial profile is a file (`write_partial`: its accumulator pickled under the output's
`PARTIALS_DIR`), and only its place travels through Beam (`PartialFile`), as a bundle's shard records do
(`pipelines.sharding.runs`): an accumulator holds the exact id counts and the what-if steps (~30 MB on
`benchmarks/run_throughput.py`'s quoted workload), and each of Beam's hops of an element that size (the
in-memory data channel's copies, a combine's pre-combine, its GroupByKey and the coder on each side) cost
about 0.08 s there: the files take about 0.2 s off the end of that job, and ~140 MB off its peak memory.
Where the bundles and the merge run in one process (the in-process DirectRunner: `runner.runs_in_process`),
a partial stays in that process's memory under its place instead (`in_memory`): no pickle, no file.

A day of a lineage (`tpu_embed.artifact.lineage`) merges its profile into its base's (`base_profile`): the
profile then covers the steps of every day since the lineage's first (statistics add up; they cannot be taken
away again), the plan is made from it, and the manifest's `profile.days` lists those days.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import pickle
import threading
import typing
import uuid
from typing import Any, Dict, List, Optional, Tuple

import apache_beam as beam

import profiles
from pipelines.output import FileInfo
from profiles.whatif_steps import WhatIfCollector, write_what_if_steps
from tpu_embed.artifact import io as tio
from tpu_embed.artifact.manifest import ManifestError, read_manifest
from tpu_embed.artifact.spec import Spec

log = logging.getLogger("tpu_embed.pipelines")


def profile_collector(spec: Spec, vocab_sizes, candidate_chip_counts=None, *, warn_skipped: bool = False,
                      frequency_ids=None):
    """The job's `profiles.ProfileCollector`: the one that builds the partial profiles and merges them.

    `candidate_chip_counts`: the other chip counts to profile (`--candidate-chip-counts`); None: the spec's
    `profile_candidate_chip_counts` (none unless given: the spec's topology only). `warn_skipped`: log one
    warning per candidate the collector leaves out (a chip count that cannot run the global batch), with its
    reason; the driver asks for it once per run, so the run says it, not only a later `tpu-embed plan`.
    `frequency_ids`: {table: frequency-order id of each id} of balanced vocabularies
    (`pipelines.mapping.balanced_ids.load_frequency_ids`): the stacks are also counted in frequency order."""
    if candidate_chip_counts is None:
        candidate_chip_counts = spec.profile_candidate_chip_counts
    # It also keeps the steps (all, or a sample beyond a budget) that `tpu-embed plan` re-partitions for other
    # chip counts, SparseCores per chip, batch sizes and stackings (profiles/whatif_steps.py).
    collector = WhatIfCollector(spec.model(vocab_sizes), spec.topology,
                                candidate_chip_counts=tuple(candidate_chip_counts), frequency_ids=frequency_ids)
    if warn_skipped:
        nsc = spec.topology.num_sc_per_chip
        for c, status in sorted(collector.candidates.items()):
            if status.status != "skipped":
                continue
            fix = ("ask for a chip count whose SparseCores are a power of two" if "power of two" in status.reason else
                   f"give a global_batch_size that is a multiple of {c * nsc}, {c} chips x {nsc} SparseCores")
            log.warning("candidate chip count %d is not profiled: %s; `tpu-embed plan` cannot plan %d chips from this "
                        "profile (fix: %s)", c, status.reason, c, fix)
    return collector


PARTIALS_DIR = ".tmp-profile-partials"


@dataclasses.dataclass(frozen=True)
class PartialFile:
    """A bundle's partial profile (a `ProfileCollector` accumulator of `steps` steps), pickled in `path`."""
    path: str
    steps: int


_held: Dict[str, Any] = {}  # the place of a partial kept in this process's memory -> the partial
_held_lock = threading.Lock()


def partials_dir(output: str) -> str:
    return tio.join(output, PARTIALS_DIR)


def write_partial(output: str, partial, in_memory: bool = False) -> PartialFile:
    """Pickle a bundle's partial profile to a file of its own under `partials_dir(output)` (a unique name: a
    retried bundle writes another and its lost one is never read; `remove_partials` deletes them all).
    `in_memory`: the step that merges the partials runs in this process; the partial is kept here under that
    place instead, and no file is written."""
    path = tio.join(partials_dir(output), f"partial-{uuid.uuid4().hex}.pickle")
    if in_memory:
        with _held_lock:
            _held[path] = partial
    else:
        tio.write_atomic(path, pickle.dumps(partial, protocol=pickle.HIGHEST_PROTOCOL), durable=False)
    return PartialFile(path, int(partial.steps))


def _remove_dir(directory: str) -> None:
    """A partials directory deleted, and the partials kept in memory under it dropped."""
    prefix = tio.join(directory, "")
    with _held_lock:
        for path in [p for p in _held if p.startswith(prefix)]:
            del _held[path]
    tio.delete_tree(directory)


def remove_partials(output: str) -> None:
    """Delete the partial profiles' directory and drop the partials this process keeps for `output` (none:
    nothing to do): after the profile is written, and after a failed job."""
    _remove_dir(partials_dir(output))


def _read_partial(path: str):
    with _held_lock:
        held = _held.pop(path, None)
    return held if held is not None else pickle.loads(tio.read_bytes(path))


def merge_partials(collector, files: List[PartialFile]):
    """The accumulator of every partial in `files`, taken one at a time (from this process's memory where
    `write_partial` kept it there, else read from its file). Merging is exact and order-free (sums, exact id
    counts, histograms), so the profile is the same whatever the bundles; a partial of another model
    configuration is refused (`ProfileMismatchError`)."""
    acc = collector.create_accumulator()
    for f in files:
        acc.merge_from(_read_partial(f.path))
    return acc


@dataclasses.dataclass(frozen=True)
class ProfileWindow:
    """Which days a lineage day's profile covers, and the base profile merged into it.

    `base_directory`: the base artifact's profile directory to merge (None: not merged); `days`: the days
    the written profile covers; `base`: the base artifact as the lineage records it; `not_merged`: why the
    base's profile was not merged, where it was not."""
    days: Tuple[int, ...]
    base_directory: Optional[str] = None
    base: Optional[str] = None
    not_merged: Optional[str] = None

    def manifest_fields(self) -> dict:
        out: dict = {"days": list(self.days), "base": self.base if self.base_directory else None}
        if self.not_merged:
            out["not_merged"] = self.not_merged
        return out


def _normal(path: str) -> str:
    """A local path normalized (the lineage records the base as `../day1`); a URL as it is."""
    return path if tio.is_url(path) else os.path.normpath(path)


def _under(directory: str, path: str) -> str:
    return _normal(path if tio.is_absolute(path) else tio.join(directory, path))


def base_profile(vocab_dir: str, profile_dir: str, collector) -> Optional[ProfileWindow]:
    """The profile window of a shard / profile job whose vocabularies are in `vocab_dir`: None where they
    belong to no lineage (mode rebuild). The base's profile is merged when it is there, was collected for the
    same model configuration (tables, their rows, features, topology) and the same candidate chip counts as
    `collector`'s, and is not in this job's own `profile_dir`; otherwise this day's profile covers this day
    (a warning says why)."""
    try:
        lin = read_manifest(vocab_dir).lineage
    except ManifestError:
        return None
    if lin is None:
        return None
    if lin.base is None:
        return ProfileWindow((lin.day,))
    base_path = lin.base.path
    base_dir = _under(vocab_dir, base_path)
    alone = (lin.day,)

    def not_merged(why: str) -> ProfileWindow:
        log.warning("the profile of day %d covers that day only: the profile of its base %s is not merged (%s)",
                    lin.day, base_dir, why)
        return ProfileWindow(alone, base=base_path, not_merged=why)

    try:
        bm = read_manifest(base_dir)
    except ManifestError as e:
        return not_merged(str(e).splitlines()[0])
    if bm.profile is None:
        return not_merged("the base has no profile")
    directory = _under(base_dir, bm.profile.directory)
    if tio.join(directory, "") == tio.join(_normal(profile_dir), ""):
        return not_merged("the base's profile directory is this job's; give each day a profile directory of its "
                          "own (a relative profile_data_directory)")
    key = collector.model.key
    store = profiles.ProfileStore(directory)
    try:
        if not store.models():
            return not_merged(f"its profile files are missing from {directory}")
        if key not in [e.key for e in store.models()]:
            return not_merged("it was collected for another model configuration: the table rows changed (a "
                              "vocabulary without a capacity grew)")
        base = store.read(model=key)
    except profiles.ProfileError as e:
        return not_merged(str(e).splitlines()[0])
    ours = {c: st.status for c, st in collector.candidates.items()}
    theirs = {c: st.status for c, st in base.candidates.items()}
    if ours != theirs:
        return not_merged(f"its candidate chip counts {sorted(theirs)} are not this job's {sorted(ours)}")
    days = tuple(bm.profile.days or (bm.lineage.day if bm.lineage else lin.base.day,))
    return ProfileWindow(days + alone, directory, lin.base.path)


def _write_profile(profile, directory: str, base_directory: Optional[str] = None) -> List[str]:
    """Write `profile`, merged into the base's profile in `base_directory` where given (`ProfileWindow`), and the
    steps its collector kept for the what-if figures (this job's steps: a base's are not merged into them)."""
    # The what-if file is written beside the profile's files: most of its time is zlib, which releases the GIL
    # (at the end of the job, when nothing else runs: 0.1 s of the quoted workload's 0.2 s).
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        writing = pool.submit(write_what_if_steps, directory, profile)
        if base_directory is not None:
            profile = profiles.ProfileStore(base_directory).read(model=profile.model.key).merge(profile)
        paths = profiles.ProfileStore(directory).write(profile)
        what_if = writing.result()
    return sorted(paths + ([what_if] if what_if else []))


def _merge_and_write(files: List[PartialFile], collector, directory: str, base_directory: Optional[str]):
    """Every partial (`files`) merged, its profile written (`_write_profile`), the partials deleted: [the paths
    written]."""
    merged = merge_partials(collector, files)  # this step's own accumulator: the profile may take it over
    paths = _write_profile(collector.extract_output(merged, consume=True), directory, base_directory)
    for d in sorted({tio.dirname(f.path) for f in files}):  # with the partials of failed attempts of bundles
        if tio.basename(d) == PARTIALS_DIR:
            _remove_dir(d)
    return [paths]


class CollectProfile(beam.PTransform):
    """Partial profiles (PCollection(s) of `PartialFile`: BuildShards' "profile") -> paths written by
    profiles.ProfileStore(directory), nothing where no bundle had a step. `candidate_chip_counts` as given to
    BuildShards. Only the partials' places are gathered (a list, `ToListCombineFn`); one step reads, merges
    and writes them."""

    def __init__(self, spec: Spec, vocab_sizes, directory: str, candidate_chip_counts=None,
                 base_directory: Optional[str] = None, frequency_ids=None):
        """`base_directory`: a base profile to merge this one into (`ProfileWindow.base_directory`);
        `frequency_ids` as for `profile_collector`."""
        super().__init__()
        self.spec, self.vocab_sizes, self.directory = spec, vocab_sizes, directory
        self.candidates, self.base_directory = candidate_chip_counts, base_directory
        self.frequency_ids = frequency_ids

    def expand(self, partials):
        collector = profile_collector(self.spec, self.vocab_sizes, self.candidates, frequency_ids=self.frequency_ids)
        streams = partials if isinstance(partials, (tuple, list)) else (partials,)
        return (tuple(streams) | "Partials" >> beam.Flatten()
                | "Gather" >> beam.CombineGlobally(beam.combiners.ToListCombineFn()).without_defaults()
                | "Write" >> beam.FlatMap(_merge_and_write, collector, self.directory, self.base_directory)
                .with_output_types(typing.List[str]))  # not inferred (~20 ms)


def profile_file_infos(paths: List[str], output: str) -> List[FileInfo]:
    """The manifest's entries of the profile files written (relative to `output` where inside it)."""
    out = []
    for path in paths:
        data = tio.read_bytes(path)
        rel = tio.relpath(path, output) if tio.is_url(path) else os.path.relpath(path, output)
        rel = path if rel is None else rel
        out.append(FileInfo(rel, tio.sha256_bytes(data), len(data), None, {"kind": "profile"}))
    return out
