"""The vocabulary job (`tpu-embed vocab`, the first half of `run`): read, count, write the vocabularies, the
dead letters and (for `run`) every chunk's size, then the manifest."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import apache_beam as beam

from pipelines.jobs.compute_vocabulary import ComputeVocabulary
from pipelines.jobs.config import JobConfig
from pipelines.jobs.dead_letters import WriteDeadLetters
from pipelines.jobs.manifest_writer import job_json, write_manifest
from pipelines.jobs.read_examples import ReadExamples, RecordChunkSizes
from pipelines.read import chunk_sizes
from pipelines.read import spill as read_spill
from pipelines.read.records import InputFile


def _vocabulary_extra(info: dict) -> dict:
    return {"vocabularies": {info["key"]: info}}


def build_vocab_pipeline(p, cfg: JobConfig, files: Sequence[InputFile], split_bytes: Optional[int] = None):
    """`split_bytes`: the split size to read with (`runner.split_bytes_for`); None: cfg.split_bytes, else
    the default (`JobConfig.read_split_bytes`)."""
    spec = cfg.spec
    split = cfg.read_split_bytes(split_bytes)
    read = p | "Read" >> ReadExamples(spec, files, cfg.strict, cfg.chunk_rows, split,
                                      spill=read_spill.spill_dir(cfg.output) if cfg.spill_read else None,
                                      spill_memory_bytes=cfg.read_memory_bytes)
    seed = cfg.lineage
    vocab = read["chunks"] | "Vocabulary" >> ComputeVocabulary(
        spec, cfg.output, cfg.vocab_engine, base=seed and seed["base"] and seed["base"]["directory"],
        day=seed["day"] if seed else 0)
    vocab_info = vocab["vocabularies"] | "VocabInfo" >> beam.Map(_vocabulary_extra).with_output_types(Any)
    # Dead letters are written by both jobs (same read, same files): a vocab run that fails on its input
    # leaves them for the user.
    dead_files = read["dead"] | "DeadLetters" >> WriteDeadLetters(cfg.output, files, cfg.dead_letter_limit)
    if cfg.record_chunk_sizes:
        _ = read["chunks"] | "ChunkSizes" >> RecordChunkSizes(cfg.output, chunk_sizes.read_key(cfg, files, split))
    job = job_json(cfg, files, "vocab")
    if seed is not None:
        job["lineage"] = seed  # the manifest's `lineage` (`tpu_embed.artifact.lineage.lineage_section`)
    return write_manifest(p, cfg.output, "vocab", job, [read["stats"]],
                          [vocab["files"], dead_files], [vocab_info])
