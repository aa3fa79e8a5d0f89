"""The shard job (`tpu-embed shard | profile`, the second half of `run`): read (or replay the vocabulary
job's read), map to ids, form the global batches, build the shard files and the profile, then the manifest.

`build_read_pipeline` is its first pass where no vocabulary job recorded the read's chunk sizes
(`runner.run_shard`): the read kept for the second pass and every chunk's size recorded."""

from __future__ import annotations

import typing
from typing import Dict, List, Optional, Sequence

import apache_beam as beam

from pipelines.jobs.build_shards import BuildShards
from pipelines.jobs.collect_profile import (
    CollectProfile,
    ProfileWindow,
    base_profile,
    profile_collector,
    profile_file_infos,
)
from pipelines.jobs.dead_letters import WriteDeadLetters
from pipelines.jobs.global_batches import FormGlobalBatches
from pipelines.jobs.job_config import JobConfig
from pipelines.jobs.manifest_writer import job_json, write_manifest
from pipelines.jobs.map_to_ids import MapToIds
from pipelines.jobs.pass_plan import ShardPass
from pipelines.jobs.read_examples import ReadExamples, RecordChunkSizes
from pipelines.mapping import balanced_ids
from pipelines.output import FileInfo
from pipelines.read import chunk_sizes
from pipelines.read import spill as read_spill
from pipelines.read.records import InputFile
from pipelines.sharding import packing_limits as shard_limits
from tpu_embed.artifact.shard_format_choice import shard_format_for


def _batching_extra(info: dict) -> dict:
    return {"batching": {k: v for k, v in info.items() if k != "offsets"}}


def _profile_extra(paths: List[str], directory: str, window: Optional[ProfileWindow] = None) -> dict:
    return {"profile": {"directory": directory, "files_written": len(paths),
                        **(window.manifest_fields() if window is not None else {})}}


def build_read_pipeline(p: beam.Pipeline, cfg: JobConfig, files: Sequence[InputFile], split_bytes: Optional[int],
                        read_memory_bytes: int):
    """Read, keep the read (`pipelines.read.spill`, up to `read_memory_bytes` in this process) and record every
    chunk's size under `chunk_sizes.READ_PASS_FILENAME`. `split_bytes` as for `build_vocab_pipeline`."""
    split = cfg.read_split_bytes(split_bytes)
    read = p | "Read" >> ReadExamples(cfg.spec, files, cfg.strict, cfg.chunk_rows, split,
                                      spill=read_spill.spill_dir(cfg.output), spill_memory_bytes=read_memory_bytes)
    return read["chunks"] | "ChunkSizes" >> RecordChunkSizes(cfg.output, chunk_sizes.read_key(cfg, files, split),
                                                             chunk_sizes.READ_PASS_FILENAME)


def build_shard_pipeline(p: beam.Pipeline, cfg: JobConfig, files: Sequence[InputFile], vocab_sizes: Dict[str, int],
                         split_bytes: Optional[int] = None, handed: Optional[ShardPass] = None):
    """`split_bytes` as for `build_vocab_pipeline`. `handed`: what the first pass hands this one, the chunks'
    sizes and the kept read (None: neither)."""
    handed = handed or ShardPass()
    spec = cfg.spec
    layout = spec.layout(vocab_sizes)
    limits = shard_limits.resolve_limits(spec, layout, cfg.plan, auto=cfg.write_shards and cfg.write_profile)
    fmt = shard_format_for(spec, layout, limits)
    read = p | "Read" >> ReadExamples(spec, files, cfg.strict, cfg.chunk_rows, cfg.read_split_bytes(split_bytes),
                                      replay=read_spill.spill_dir(cfg.output) if handed.replay_read else None)
    dead_files = read["dead"] | "DeadLetters" >> WriteDeadLetters(cfg.output, files, cfg.dead_letter_limit)
    mapped = read["chunks"] | "Ids" >> MapToIds(spec, cfg.vocab_dir or cfg.output, vocab_sizes)
    batches = mapped["blocks"] | "Batches" >> FormGlobalBatches(spec.global_batch_size, len(spec.dense),
                                                                cfg.tail_policy,
                                                                spec.shuffle.seed if spec.shuffle else None,
                                                                spec.epochs, handed.chunk_sizes)
    # Balanced ids (`partition: {ids: balanced}`): the profile also counts every step in frequency order.
    freq = (balanced_ids.load_frequency_ids(spec, cfg.vocab_dir or cfg.output)
            if cfg.write_profile and spec.partition.balanced_ids else None)
    built = ((batches["whole"], batches["steps"]), batches["info"]) | "Shards" >> BuildShards(
        spec, vocab_sizes, limits, cfg.output, cfg.steps_per_file, cfg.write_shards, cfg.write_profile,
        cfg.candidate_chip_counts, frequency_ids=freq, partials_in_memory=handed.partials_in_memory)
    extras = [batches["info"] | "BatchInfo" >> beam.Map(_batching_extra).with_output_types(typing.Any)]
    file_pcolls = [dead_files, built["files"]]
    job = "shard" if cfg.write_shards else "profile"
    if cfg.write_profile:
        pdir = cfg.resolved_profile_dir()
        if pdir is None:
            raise ValueError("no profile directory: set profile_data_directory in the spec or pass --profile-dir.")
        # A day of a lineage merges its profile into its base's (`collect_profile.base_profile`).
        window = base_profile(cfg.vocab_dir or cfg.output, pdir,
                              profile_collector(spec, vocab_sizes, cfg.candidate_chip_counts, warn_skipped=True,
                                                frequency_ids=freq))
        paths = built["profile"] | "Profile" >> CollectProfile(spec, vocab_sizes, pdir, cfg.candidate_chip_counts,
                                                               window.base_directory if window else None,
                                                               frequency_ids=freq)
        file_pcolls.append(paths | "ProfileFileInfo" >> beam.FlatMap(profile_file_infos, cfg.output)
                           .with_output_types(FileInfo))
        extras.append(paths | "ProfileInfo" >> beam.Map(_profile_extra, pdir, window).with_output_types(typing.Any))
    job_cfg = job_json(cfg, files, job)
    job_cfg.update({"layout": layout.to_dict(), "limits": limits.to_json(), "format": fmt.to_json(),
                    "vocab_sizes": vocab_sizes})
    return write_manifest(p, cfg.output, job, job_cfg, [read["stats"], mapped["stats"], built["stats"]],
                          file_pcolls, extras)
