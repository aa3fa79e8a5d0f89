"""Run the jobs: Beam options (with an in-process runner pinned locally), vocab, shard, profile, run."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import logging
import os
import sys
import types
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import beam_overheads, dask_compat, jobs, paths, process_memory, tft_output_writer
from pipelines.jobs import JobConfig, ShardPass, VocabPass, collect_profile, manifest_writer
from pipelines.jobs.global_batches import INPUT_CHANGED, InputChangedError
from pipelines.read import chunk_sizes, records, splits
from pipelines.read import spill as read_spill
from pipelines.read.records import InputFile
from pipelines.sharding import planned_limits
from pipelines.sharding import runs as shard_runs
from pipelines.user_errors import UserError, job_note
from tpu_embed.artifact import io as tio
from tpu_embed.artifact import lineage
from tpu_embed.artifact.manifest import Manifest, ManifestError, ManifestNotFoundError, read_manifest

log = logging.getLogger("tpu_embed.pipelines")


def pipeline_options(beam_args: Sequence[str] = ()) -> PipelineOptions:
    """PipelineOptions from pass-through flags; without --runner, DirectRunner in process (`local_runner`).

    `--direct_num_workers=N` (N > 1) without a running mode selects
    `multi_processing`.  Flags for other runners (Dataflow, Flink, Spark) pass through.
    """
    return PipelineOptions(list(_resolved_options(tuple(beam_args), _options_classes())[0]))


def option_values(beam_args: Sequence[str] = ()) -> Mapping[str, Any]:
    """Every option's value (`get_all_options(drop_default=False)`) of `pipeline_options(beam_args)`: read-only."""
    return _resolved_options(tuple(beam_args), _options_classes())[1]


def _options_classes() -> int:
    """How many options classes are defined: importing a runner's module (Dask's) defines its own, and Beam's
    parse then knows their flags too."""
    count, todo = 0, [PipelineOptions]
    while todo:
        subclasses = todo.pop().__subclasses__()
        count += len(subclasses)
        todo += subclasses
    return count


@functools.lru_cache(maxsize=32)
def _resolved_options(beam_args: Tuple[str, ...], _classes: int) -> Tuple[Tuple[str, ...], Mapping[str, Any]]:
    """(the flags `pipeline_options` parses, every option's value), for flags and the options classes defined
    (`_options_classes`): Beam parses the flags with a parser of every options class (~7 ms); a run asks a dozen
    times for the same flags."""
    args = list(beam_args)
    flags = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    if "--runner" not in flags:
        args.append("--runner=DirectRunner")
    values = PipelineOptions(args).get_all_options(drop_default=False)
    runner = str(values.get("runner") or "")
    if runner in ("DirectRunner", "BundleBasedDirectRunner", "") and "--direct_running_mode" not in flags:
        workers = int(values.get("direct_num_workers") or 1)
        args.append("--direct_running_mode=" + ("multi_processing" if workers > 1 else "in_memory"))
        values = PipelineOptions(args).get_all_options(drop_default=False)
    return tuple(args), types.MappingProxyType(values)


def local_runner(opts: PipelineOptions):
    """The runner for `--runner=DirectRunner`: Beam's FnApiRunner, built as the DirectRunner builds it.

    Beam's DirectRunner (2.77) first tries the Prism runner for any pipeline Prism supports, which
    downloads a binary from GitHub and runs the job there; without a network it logs the failure and
    falls back. The jobs skip that step and run in this process (or its worker processes) every time.
    """
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle
    encoded = JobServiceHandle.encode_pipeline_options(opts.get_all_options())
    return fn_runner.FnApiRunner(provision_info=fn_runner.ExtendedProvisionInfo(
        beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)))


DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"

Build = Callable[[beam.Pipeline], Any]  # adds a job's transforms to a pipeline


def dask_args(beam_args: Sequence[str]) -> Tuple[List[str], Optional[int]]:
    """`--runner=dask` -> Beam's DaskRunner; takes out our `--dask_workers=N` (also `--dask-workers N`)."""
    args: List[str] = []
    workers = None
    it = iter(beam_args)
    for a in it:
        name, eq, val = a.partition("=")
        if name in ("--dask_workers", "--dask-workers"):
            workers = int(val if eq else next(it))
        elif name == "--runner":
            val = val if eq else next(it, "")
            args.append("--runner=" + (DASK_RUNNER if val.lower() in ("dask", "daskrunner") else val))
        else:
            args.append(a)
    return args, workers


def _run_dask(build: Build, args: List[str], workers: Optional[int]):
    """Beam's DaskRunner on a LocalCluster of `workers` processes, or on --dask_client_address's cluster.

    Each Create element is its own Dask partition unless --dask_npartitions/--dask_partition_size is
    given (Beam's default puts up to 128 input files in one partition, read by one worker).
    """
    import distributed
    joins = any(a.startswith(("--dask_client_address", "--dask_scheduler_file")) for a in args)
    if joins and workers is not None:
        raise UserError("--dask_workers starts a local cluster; it cannot be combined with "
                        "--dask_client_address / --dask_scheduler_file (that cluster has its own workers)")
    if not any(a.startswith(("--dask_npartitions", "--dask_partition_size")) for a in args):
        args = args + ["--dask_partition_size=1"]
    cluster = None
    set_threads = not joins and "TPU_EMBED_THREADS" not in os.environ
    if set_threads:
        os.environ["TPU_EMBED_THREADS"] = "1"  # one thread per worker process, as multi_processing
    try:
        if not joins:
            n = workers or len(os.sched_getaffinity(0))
            cluster = distributed.LocalCluster(n_workers=n, processes=True, threads_per_worker=1,
                                               dashboard_address=None)
            args = args + [f"--dask_client_address={cluster.scheduler_address}"]
        p = beam.Pipeline(options=pipeline_options(args))
        build(p)
        with dask_compat.fixed_translations():
            result = p.run()
        try:
            result.wait_until_finish()
        finally:
            result.client.close()  # type: ignore[attr-defined]  # DaskRunner's result; Beam's never closes it
    finally:
        if cluster is not None:
            cluster.close()
        if set_threads:
            os.environ.pop("TPU_EMBED_THREADS", None)
    return result


# The interpreter's GIL switch interval while a job runs in this process (Python's default: 5 ms).
GIL_SWITCH_INTERVAL_S = 0.001


@contextlib.contextmanager
def _gil_switch_interval(seconds: float):
    """While a job runs in this process, a thread that holds the GIL gives it up after `seconds` to a thread that
    waits for it, instead of Python's 5 ms.

    The job's threads take turns at the GIL many times a step: the build, the statistics and the run writer each
    call native code that releases it and need it back when that returns, while the worker's thread runs Beam
    and the mapping. With 5 ms each return can wait up to 5 ms for the thread that holds it: on the quoted
    workload of benchmarks/run_throughput.py a `run` is ~2 % shorter at 1 ms (docs/benchmarks.md)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _run(build: Build, beam_args: Sequence[str], job: str = "Beam", reads_input: bool = True):
    """Build and run one pipeline; a failure carries a note naming `job` (`user_errors.job_note`). `reads_input`:
    the pipeline reads input files (not a shard job replaying the vocabulary job's read)."""
    try:
        return _run_pipeline(build, beam_args, reads_input)
    except Exception as e:
        e.add_note(job_note(job))
        raise


def _run_pipeline(build: Build, beam_args: Sequence[str], reads_input: bool = True):
    args, dask_workers = dask_args(beam_args)
    values = option_values(args)
    if values.get("runner") == DASK_RUNNER:
        return _run_dask(build, args, dask_workers)
    if dask_workers is not None:
        raise UserError("--dask_workers needs --runner=dask")
    opts = pipeline_options(args)
    direct = values.get("runner") == "DirectRunner"
    # Worker processes already use the cores; the packer's own threads would oversubscribe them.
    # Workers inherit the environment at start; an explicit TPU_EMBED_THREADS wins.
    multi = values.get("direct_running_mode") == "multi_processing"
    in_process = _bundles_in_process(values)  # every pickle Beam makes is read by this process
    set_threads = multi and "TPU_EMBED_THREADS" not in os.environ
    # The objects of the interpreter and Beam outlive the job: the collector's full passes, triggered by what
    # the job allocates, skip them while it builds and runs the pipeline (a full pass over them during the
    # construction of `run`'s first pipeline: ~0.1 s; at 2 M examples 0.35 -> 0.25 s of collections in the
    # worker's threads, where they hold the GIL).
    gc.freeze()
    try:
        with beam_overheads.signatures_computed_once(), beam_overheads.option_views_made_once(), \
                beam_overheads.dofn_specs_computed_once(), \
                beam_overheads.pickles_compressed_lightly() if in_process else contextlib.nullcontext():
            p = beam.Pipeline(runner=local_runner(opts) if direct else None, options=opts)
            build(p)
            if set_threads:
                os.environ["TPU_EMBED_THREADS"] = "1"
            with beam_overheads.state_sampling_period(beam_overheads.STATE_SAMPLING_MS) if direct \
                    else contextlib.nullcontext(), \
                    process_memory.one_malloc_arena() if in_process and reads_input else contextlib.nullcontext(), \
                    process_memory.freed_memory_reused() if in_process else contextlib.nullcontext(), \
                    _gil_switch_interval(GIL_SWITCH_INTERVAL_S) if direct else contextlib.nullcontext():
                result = p.run()
                result.wait_until_finish()
    finally:
        gc.unfreeze()
        if set_threads:
            os.environ.pop("TPU_EMBED_THREADS", None)
    return result


def _first_dead_letters(output: str, m: Manifest, reasons=None, limit: int = 1) -> List[dict]:
    import json
    out: List[dict] = []
    for f in m.files:
        if f.kind != "dead_letter":
            continue
        for line in tio.read_bytes(tio.join(output, f.path)).splitlines():
            d = json.loads(line)
            if reasons is None or d["reason"] in reasons:
                out.append(d)
                if len(out) >= limit:
                    return out
    return out



def check_outcome(cfg: JobConfig, m: Manifest, job: str) -> None:
    """Refuse to succeed silently: lost framing (unless policies.lost_framing: dead_letter), no valid
    record at all, or (shard) no example written raise `DataError` naming file, record and fix."""
    c = dict(m.jobs[job].counts)
    dead = dict(c.get("dead_letter", {}))
    where = f"dead letters in {tio.join(cfg.output, 'dead_letter')}/"
    lost = sum(dead.get(r, 0) for r in records.FRAMING_REASONS)
    if lost and cfg.spec.policies.lost_framing == "error":
        first = _first_dead_letters(cfg.output, m, ("framing_lost",))
        what = records.describe_letter(first[0]) if first else "framing lost"
        raise records.DataError(
            f"{what} ({lost} record(s) lost with it; {where}). "
            "Fix: repair or re-create the file, or set policies.lost_framing: dead_letter to dead-letter the rest "
            "of such files, count it, and go on.")
    read, valid = int(c.get("records_read", 0)), int(c.get("records_valid", 0))
    if valid == 0:
        first = _first_dead_letters(cfg.output, m)
        ninputs = len(m.jobs[job].inputs)
        if not first:
            raise records.DataError(
                f"the {ninputs} input file(s) ({records.some_files([i.path for i in m.jobs[job].inputs])}) hold no "
                "records (an empty data set): nothing to count or write. Fix: add records to them (a CSV file needs "
                "lines after its header), or point inputs.patterns / --input at files that hold records.")
        raise records.DataError(
            f"no valid record in {ninputs} input file(s) ({read} records read, all dead-lettered; "
            f"{int(c.get('files_dead_lettered', 0))} whole file(s) refused). First: "
            f"{records.describe_letter(first[0])}. All in {where}. Fix the input or the spec.")
    if job != "vocab" and m.counts is not None and m.counts.examples_written == 0:
        raise records.DataError(
            f"0 examples written: the {valid} valid example(s) do not fill one global batch of "
            f"{cfg.spec.global_batch_size} and tail: {cfg.tail_policy} drops them "
            f"(counts.examples_dropped.tail = {m.counts.examples_dropped.get('tail', 0)}). Fix: --tail pad "
            "(or policies.tail: pad), a smaller global_batch_size, or more data.")


WHOLE_FILES = 1 << 62  # a split size no file reaches


def runs_in_process(beam_args: Sequence[str] = ()) -> bool:
    """Whether the jobs' bundles run in this process: the DirectRunner in memory or in threads (not its
    worker processes, not another runner)."""
    return _bundles_in_process(option_values(dask_args(beam_args)[0]))


def _bundles_in_process(values: Mapping[str, Any]) -> bool:
    """`runs_in_process` of parsed option values."""
    return values.get("runner") == "DirectRunner" and values.get("direct_running_mode") in ("in_memory",
                                                                                            "multi_threading")


def split_bytes_for(cfg: JobConfig, beam_args: Sequence[str] = ()) -> int:
    """The split size the jobs read with: `cfg.split_bytes` if given, else whole files where one worker reads
    everything (the DirectRunner with one worker: splits would only add the CSV split scan and a cold start of
    the read at every split), else `splits.DEFAULT_SPLIT_BYTES`. Outputs do not depend on it
    (tests/pipelines/read/test_splits.py)."""
    if cfg.split_bytes is not None:
        return cfg.split_bytes
    opts = option_values(dask_args(beam_args)[0])
    one_worker = opts.get("runner") == "DirectRunner" and int(opts.get("direct_num_workers") or 1) == 1
    return WHOLE_FILES if one_worker else splits.DEFAULT_SPLIT_BYTES


def runner_name(beam_args: Sequence[str] = ()) -> str:
    """The --runner the jobs run on (a class path for Dask)."""
    return str(option_values(dask_args(beam_args)[0]).get("runner") or "")


def lineage_seed_for(cfg: JobConfig) -> Optional[Dict[str, Any]]:
    """What the vocabulary job of `cfg` continues (`VocabPass.lineage`) for the vocabularies of mode append / frozen:
    the base artifact (`cfg.base`, else the spec's `base`) opened and checked against the spec
    (`tpu_embed.artifact.lineage.open_base`), and the day; None where the spec has no such vocabulary. Refused in
    one line: a base or a day for a spec with no such vocabulary, mode frozen without a base."""
    spec = cfg.spec
    where = cfg.base_artifact
    groups = spec.lineage_groups()
    if not groups:
        if where is not None or cfg.day is not None:
            given = "--base" if cfg.base else ("--day" if where is None else "the spec's `base`")
            raise UserError(f"{given}: no vocabulary of this spec has mode append or frozen, so there is no lineage "
                            "to continue. Set `vocabulary: {mode: append}` (docs/how-to/daily-retraining.md), or "
                            "leave out the base.")
        return None
    base = lineage.open_base(where, spec, cfg.output) if where is not None else None
    if base is None:
        frozen = sorted(k for k, fs in groups.items() if fs[0].vocabulary.mode == "frozen")
        if frozen:
            raise lineage.LineageError(f"vocabularies {frozen} have mode frozen, which keeps a base's vocabulary as "
                                       "it is: pass --base DIR (the previous day's artifact), or start the lineage "
                                       "with mode: append.")
    day = lineage.next_day(base, cfg.day)
    path = None
    if base is not None and not (tio.is_url(base.directory) or tio.is_url(cfg.output)):
        path = os.path.relpath(base.directory, cfg.output)  # the manifest does not depend on where both are
    return lineage.lineage_seed(base, day, path)


def _kept_read_memory(cfg: JobConfig, beam_args: Sequence[str]) -> int:
    """Of a kept read, the bytes that may stay in memory: `cfg.read_memory_bytes` where the pass that replays it
    runs in this process, else 0 (all of it in spill files)."""
    return cfg.read_memory_bytes if runs_in_process(beam_args) else 0


def run_vocab(cfg: JobConfig, beam_args: Sequence[str] = (), keep_read: bool = False) -> Manifest:
    """The vocabulary job. Every vocabulary job records its chunks' sizes (`chunk_sizes`): `run`'s shard job takes
    them, a later `tpu-embed shard` reads them (`run_shard`). `keep_read`: also keep the read for `run`'s shard
    job to replay (`pipelines.read.spill`)."""
    cfg = paths.for_workers(cfg, runner_name(beam_args))
    seed = lineage_seed_for(cfg)
    files = splits.list_input_files(cfg.spec.input_patterns())
    if not cfg.spec.vocabulary_groups():
        # Nothing to count: still write a manifest with the spec.
        manifest_writer.update_manifest(cfg.output, "vocab", manifest_writer.job_json(cfg, files, "vocab"), stats={},
                                  files=[], extra={"vocabularies": {}})
        return read_manifest(cfg.output)
    split = split_bytes_for(cfg, beam_args)
    vocab_pass = VocabPass(lineage=seed, keep_read=keep_read,
                           read_memory_bytes=_kept_read_memory(cfg, beam_args) if keep_read else 0)
    _run(lambda p: jobs.build_vocab_pipeline(p, cfg, files, split, vocab_pass), beam_args, "vocabulary")
    m = read_manifest(cfg.output)
    check_outcome(cfg, m, "vocab")
    return m


def vocab_sizes_for(cfg: JobConfig) -> Dict[str, int]:
    vdir = cfg.vocab_dir or cfg.output
    groups = cfg.spec.vocabulary_groups()
    if not groups:
        return {}
    try:
        m: Optional[Manifest] = read_manifest(vdir)
    except ManifestNotFoundError:
        m = None
    if m is None or m.vocabularies is None:
        raise FileNotFoundError(f"{vdir} has no vocabulary manifest: pass --vocab DIR naming the artifact whose "
                                f"vocabularies to use, or run `tpu-embed vocab --spec ... --output {vdir}` first (or "
                                "`tpu-embed run`).")
    if m.spec_fingerprint != cfg.spec.fingerprint:
        # ManifestError: a one-line user error that exits 1, as a missing vocabulary manifest does (exit 2 is
        # for how the command was called).
        raise ManifestError(f"the vocabularies in {vdir} were made for spec {m.spec_fingerprint[:12]}…, not "
                            f"this spec ({cfg.spec.fingerprint[:12]}…). Re-run `tpu-embed vocab` with this spec.")
    sizes = m.vocabulary_sizes
    missing = sorted(set(groups) - set(sizes))
    if missing:
        raise ManifestError(f"{vdir}/manifest.json has no vocabularies for {missing}; re-run `tpu-embed vocab`.")
    return {k: sizes[k] for k in groups}


def run_shard(cfg: JobConfig, beam_args: Sequence[str] = (), handed: Optional[ShardPass] = None) -> Manifest:
    """The shard (or profile) job. Cutting steps from a stream needs every chunk's size
    (`pipelines.read.chunk_sizes`): `run` hands them over (`handed`, with its kept read); else those the
    vocabulary job recorded for the same read are used, and where there are none (other input files, another
    chunking or split size) the job reads the input in a first pass that records them and keeps the read, which
    the second pass replays (`pipelines.read.spill`), as `run` does. Memory stays bounded either way."""
    cfg = paths.for_workers(cfg, runner_name(beam_args))
    files = splits.list_input_files(cfg.spec.input_patterns())
    sizes = vocab_sizes_for(cfg)
    split = split_bytes_for(cfg, beam_args)
    if handed is not None and handed.hands_anything:
        return _shard(cfg, handed, files, sizes, split, beam_args)
    key = chunk_sizes.read_key(cfg, files, split)
    recorded = chunk_sizes.read(cfg.vocab_dir or cfg.output, key)
    if recorded is not None:
        try:
            return _shard(cfg, ShardPass(chunk_sizes=recorded), files, sizes, split, beam_args)
        except Exception as e:  # noqa: BLE001 - which runner raised it (and how it wrapped it) varies
            if not _input_changed(e):
                raise
            log.warning("the input changed since the vocabulary job read it (%s); reading it again to record "
                        "its chunks", str(e).splitlines()[0][:300])
    return _two_pass_shard(cfg, files, sizes, split, key, beam_args)


def _input_changed(e: BaseException) -> bool:
    """Whether `e` (as the runner raised it) is the shard job's `InputChangedError`."""
    seen = set()
    cause: Optional[BaseException] = e
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, InputChangedError) or INPUT_CHANGED in str(cause):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _two_pass_shard(cfg: JobConfig, files: Sequence[InputFile], sizes: Dict[str, int], split: int, key: dict,
                    beam_args: Sequence[str]) -> Manifest:
    """The read first (its chunks' sizes recorded, the read kept), then the shard job replaying it."""
    memory = _kept_read_memory(cfg, beam_args)
    read_spill.remove(cfg.output)  # a killed run's
    try:
        _run(lambda p: jobs.build_read_pipeline(p, cfg, files, split, memory),
             beam_args, "shard" if cfg.write_shards else "profile")
        known = chunk_sizes.take(cfg.output, key, chunk_sizes.READ_PASS_FILENAME)
        if known is None:  # the first pass wrote it moments ago
            raise RuntimeError(f"{chunk_sizes.path(cfg.output, chunk_sizes.READ_PASS_FILENAME)} is missing or "
                               "from another read: the output directory changed while the job ran; re-run it.")
        return _shard(cfg, ShardPass(chunk_sizes=known, replay_read=True), files, sizes, split, beam_args)
    finally:
        read_spill.remove(cfg.output)


def _shard(cfg: JobConfig, handed: ShardPass, files: Sequence[InputFile], sizes: Dict[str, int], split: int,
           beam_args: Sequence[str]) -> Manifest:
    handed = dataclasses.replace(handed, partials_in_memory=runs_in_process(beam_args))
    try:
        _run(lambda p: jobs.build_shard_pipeline(p, cfg, files, sizes, split, handed), beam_args,
             "shard" if cfg.write_shards else "profile", reads_input=not handed.replay_read)
    finally:
        shard_runs.remove(cfg.output)  # a failed job's runs and partial profiles (a finished job removed its own)
        collect_profile.remove_partials(cfg.output)
    m = read_manifest(cfg.output)
    check_outcome(cfg, m, "shard" if cfg.write_shards else "profile")
    planned_limits.finalize(cfg, sizes)  # no pinned limits: record the plan of this pass's profile
    return read_manifest(cfg.output)


def run_profile(cfg: JobConfig, beam_args: Sequence[str] = ()) -> Manifest:
    """The shard job writing the profile and no shards."""
    return run_shard(dataclasses.replace(cfg, write_shards=False, write_profile=True), beam_args)


def run_all(cfg: JobConfig, beam_args: Sequence[str] = ()) -> Manifest:
    """Vocabulary job, then shards + profile in one read of the data (and, with `cfg.transform_output`, the
    artifact's tf.Transform output: `pipelines.tft_output_writer`).

    The vocabulary job records every chunk's size (`pipelines.read.chunk_sizes`, taken here: `run` leaves no
    record), so the shard job streams its chunks; with `cfg.reuse_read` it also keeps what it
    read and parsed, and the shard job replays that instead of reading the input again
    (`pipelines.read.spill`): up to `cfg.read_memory_bytes` of it in this process's memory where both jobs
    run in this process (`runs_in_process`), the rest in spill files."""
    cfg = paths.for_workers(cfg, runner_name(beam_args))
    reuse = cfg.reuse_read and bool(cfg.spec.vocabulary_groups())  # else the vocabulary job reads nothing
    read_spill.remove(cfg.output)  # a killed run's
    # Started first: a graph not in the cache is built in a child process while the jobs run.
    graph = tft_output_writer.start(cfg.spec, cfg.base_artifact) if cfg.transform_output else None
    try:
        run_vocab(cfg, beam_args, keep_read=reuse)
        known = chunk_sizes.take(cfg.output, chunk_sizes.read_key(cfg, splits.list_input_files(
            cfg.spec.input_patterns()), split_bytes_for(cfg, beam_args)))
        m = run_shard(cfg, beam_args, ShardPass(chunk_sizes=known, replay_read=reuse))
        if graph is not None:
            m = tft_output_writer.write(cfg.output, cfg.spec, graph)
        return m
    finally:
        tft_output_writer.cancel(graph)  # a failed run's child, if it still builds
        read_spill.remove(cfg.output)
