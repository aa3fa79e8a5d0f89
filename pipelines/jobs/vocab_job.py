"""The vocabulary job (`tpu-embed vocab`, the first half of `run`): read, count, write the vocabularies, the
dead letters and every chunk's size (for the shard job), then the manifest."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import apache_beam as beam

from pipelines.jobs.compute_vocabulary import ComputeVocabulary
from pipelines.jobs.dead_letters import WriteDeadLetters
from pipelines.jobs.job_config import JobConfig
from pipelines.jobs.manifest_writer import job_json, write_manifest
from pipelines.jobs.pass_plan import VocabPass
from pipelines.jobs.read_examples import ReadExamples, RecordChunkSizes
from pipelines.read import chunk_sizes
from pipelines.read import spill as read_spill
from pipelines.read.records import InputFile


def _vocabulary_extra(info: dict) -> dict:
    return {"vocabularies": {info["key"]: info}}


def build_vocab_pipeline(p: beam.Pipeline, cfg: JobConfig, files: Sequence[InputFile],
                         split_bytes: Optional[int] = None, vocab_pass: Optional[VocabPass] = None):
    """`split_bytes`: the split size to read with (`runner.split_bytes_for`); None: cfg.split_bytes, else
    the default (`JobConfig.read_split_bytes`). `vocab_pass`: the lineage, and whether to keep the read (None:
    no lineage, the read not kept)."""
    vocab_pass = vocab_pass or VocabPass()
    spec = cfg.spec
    split = cfg.read_split_bytes(split_bytes)
    read = p | "Read" >> ReadExamples(spec, files, cfg.strict, cfg.chunk_rows, split,
                                      spill=read_spill.spill_dir(cfg.output) if vocab_pass.keep_read else None,
                                      spill_memory_bytes=vocab_pass.read_memory_bytes)
    seed = vocab_pass.lineage
    vocab = read["chunks"] | "Vocabulary" >> ComputeVocabulary(
        spec, cfg.output, cfg.vocab_engine, base=seed["base"]["directory"] if seed and seed["base"] else None,
        day=seed["day"] if seed else 0)
    vocab_info = vocab["vocabularies"] | "VocabInfo" >> beam.Map(_vocabulary_extra).with_output_types(Any)
    # Dead letters are written by both jobs (same read, same files): a vocab run that fails on its input
    # leaves them for the user.
    dead_files = read["dead"] | "DeadLetters" >> WriteDeadLetters(cfg.output, files, cfg.dead_letter_limit)
    # Every chunk's size, for the shard job: `run`'s takes it, a later `tpu-embed shard` reads it (`runner.run_shard`).
    _ = read["chunks"] | "ChunkSizes" >> RecordChunkSizes(cfg.output, chunk_sizes.read_key(cfg, files, split))
    job = job_json(cfg, files, "vocab")
    if seed is not None:
        job["lineage"] = seed  # the manifest's `lineage` (`tpu_embed.artifact.lineage.lineage_section`)
    return write_manifest(p, cfg.output, "vocab", job, [read["stats"]],
                          [vocab["files"], dead_files], [vocab_info])
