"""What the user asks of a job: the spec, the output, and how to read, batch and write (`JobConfig`).

Frozen: the runner derives what one pass needs beyond it (`pipelines.jobs.pass_plan`) instead of
rewriting it between the passes.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from pipelines.read import spill, splits
from pipelines.read.records import DEFAULT_CHUNK_ROWS
from tpu_embed.artifact import io as tio
from tpu_embed.artifact.spec import Spec


@dataclasses.dataclass(frozen=True)
class JobConfig:
    spec: Spec
    output: str
    vocab_dir: Optional[str] = None  # artifact dir holding vocab/ + manifest.json; default: output
    profile_dir: Optional[str] = None  # default: spec.profile_data_directory, relative to output
    strict: bool = False
    tail: Optional[str] = None  # overrides spec.policies.tail
    plan: Optional[str] = None
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    # Input files larger than this are read by several workers; None: as `runner.split_bytes_for` says.
    split_bytes: Optional[int] = None
    steps_per_file: int = 1000
    vocab_engine: str = "combine"
    write_shards: bool = True
    write_profile: bool = True
    candidate_chip_counts: Optional[Sequence[int]] = None
    dead_letter_limit: int = 0  # 0: all; else at most this many per input file are written (all counted)
    # `run`: the vocabulary job keeps its read (`pipelines.read.spill`) and the shard job replays it
    # (`runner.run_all`, `pass_plan.VocabPass.keep_read`).
    reuse_read: bool = True
    # Of the kept read, the bytes that may stay in this process's memory instead of the spill files; `run_all`
    # uses it where both jobs run in this process, else 0 (`pipelines.read.spill`, "memory_bytes").
    read_memory_bytes: int = spill.MEMORY_BYTES
    # Vocabulary modes append / frozen (`tpu_embed.artifact.lineage`): the previous artifact (None: the spec's
    # `base`, else the first day) and this run's day (None: the base's + 1, else 1). What the vocabulary job
    # makes of them: `pass_plan.VocabPass.lineage`.
    base: Optional[str] = None
    day: Optional[int] = None
    # `runner.run_all` also writes the artifact's tf.Transform output (`pipelines.tft_output_writer`); `tpu-embed
    # run` sets it unless --no-transform-output.
    transform_output: bool = False

    @property
    def base_artifact(self) -> Optional[str]:
        """The previous artifact of the lineage: `base`, else the spec's `base` (None: neither)."""
        return self.base or self.spec.base_artifact()

    @property
    def tail_policy(self) -> str:
        return self.tail or self.spec.policies.tail

    def resolved_profile_dir(self) -> Optional[str]:
        d = self.profile_dir or self.spec.profile_data_directory
        if d is None:
            return None
        if tio.is_absolute(d):
            return d
        return tio.join(self.output, d)

    def read_split_bytes(self, given: Optional[int] = None) -> int:
        """The split size to read with: `given` (`runner.split_bytes_for`), else `split_bytes`, else the default."""
        return given or self.split_bytes or splits.DEFAULT_SPLIT_BYTES
