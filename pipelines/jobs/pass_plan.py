"""What one pass of a job is given beyond the user's options (`JobConfig`), decided by the runner once.

A job runs in one or two passes over its input: `run` is the vocabulary pass then the shard pass; `tpu-embed
shard` alone is the shard pass, preceded by its own read pass where no vocabulary job recorded its read
(`runner.run_shard`). The first pass records every chunk's valid examples (`pipelines.read.chunk_sizes`)
and may keep what it read and parsed (`pipelines.read.spill`); the shard pass is handed both (`ShardPass`),
so it cuts steps without a side input over the mapped data and replays the read instead of reading again.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

from pipelines.read.chunk_sizes import ChunkSizes


@dataclasses.dataclass(frozen=True)
class VocabPass:
    """How the vocabulary job runs (`build_vocab_pipeline`)."""

    # Vocabulary modes append / frozen: the day and the base (`tpu_embed.artifact.lineage.lineage_seed`,
    # `runner.lineage_seed_for`); None where no vocabulary continues a lineage.
    lineage: Optional[Dict[str, Any]] = None
    # Keep the read for the shard pass to replay; of it, the bytes that may stay in this process's memory
    # (the rest in spill files).
    keep_read: bool = False
    read_memory_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class ShardPass:
    """What the first pass hands the shard pass (`build_shard_pipeline`)."""

    # Every chunk's valid examples (`pipelines.jobs.global_batches.FormGlobalBatches`); None: the shard job
    # learns the offsets from a side input over every mapped block.
    chunk_sizes: Optional[ChunkSizes] = None
    replay_read: bool = False  # the first pass kept its read: the shard pass replays it instead of reading
    # The shard pass's bundles and its profile's merge run in this process (`runner.runs_in_process`): a bundle's
    # partial profile stays in memory, not pickled to a file (`collect_profile.write_partial`).
    partials_in_memory: bool = False

    @property
    def hands_anything(self) -> bool:
        return self.chunk_sizes is not None or self.replay_read
