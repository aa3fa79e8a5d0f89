"""What a demo runs with (`DemoConfig`) and the error it stops with (`DemoError`)."""

from __future__ import annotations

import dataclasses
from typing import Optional


class DemoError(RuntimeError):
    """A demo that cannot run (output exists, ...): shown as one line by the CLI."""


@dataclasses.dataclass
class DemoConfig:
    num_examples: int = 500_000
    global_batch_size: int = 2048
    num_files: int = 8
    seed: int = 1234
    eval_fraction: float = 0.1  # the last steps of the shards are held out
    max_train_steps: Optional[int] = None  # default: every training step once
    log_every: int = 25
    learning_rate: float = 0.002  # the dense model's Adam; the embeddings use the spec's Adagrad
    days: int = 1  # 2: two days of one lineage (mode append, capacities); day 2 warm-started from day 1
    serving: bool = True  # export the SavedModel and score the held-out raw rows with it (a minute or more)
