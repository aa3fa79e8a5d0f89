"""The steps the what-if figures are computed from: every profiled step's ids where that is affordable, else a
systematic sample of them, kept in the same pass as the profile.

Other chip counts, SparseCores per chip, global batch sizes and stackings change which SparseCore each id goes to,
so their per-step figures need the steps' ids, not the profile's totals.  `WhatIfCollector` (a `ProfileCollector`
that also keeps them) records, per step, every feature's global rows and ids as the profile receives them;
`profiles.planner.whatif` re-partitions them for any configuration when a plan asks.

Steps are kept in *blocks* of `BLOCK_STEPS` consecutive steps (so that global batches of 2 and 4 times the
profiled one can be put together from them).  While the ids kept stay within `budget_ids` every step is kept and
the figures are exact; beyond, only the blocks whose index is a multiple of `stride` stay, `stride` doubling until
they fit (at least block 0 stays).  Merging is a union then the same rule, so the kept steps depend only on the
steps added, not on how the work was split: associative and commutative.  Where two accumulators kept the same
step index (callers that do not pass `step=`), the one whose ids compare smaller is kept.

File: `whatif-<model key>.json` in the profile directory (profiles/SCHEMA.md): the rows and ids of each kept step,
packed as the profile's id counts are.  The budget is a cost, not a statistic: files of one model written with
other budgets are still read.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from typing import Dict, Mapping, Optional, Tuple

import numpy as np

from profiles.collector import ProfileCollector, step_numbers
from profiles.errors import CorruptProfileError, ProfileMismatchError, SchemaVersionError
from profiles.idcounts import ENCODING, pack_ids, unpack_ids
from profiles.jsonio import atomic_write_text, dumps_readable, read_json
from profiles.profile import Profile, ProfileAccumulator
from tpu_embed.artifact import io as tio
from tpu_embed.core.model import ModelConfig
from tpu_embed.sparsecore.csr import native_threads

BLOCK_STEPS = 4
# Ids kept by default: ~16 MiB in memory (int64 ids, int32 rows), a few MiB in the file.  The example specs and
# anything up to ~2 million looked-up ids are kept whole (exact figures); the demo's 244 steps of ~80,000 ids each
# are sampled.
DEFAULT_BUDGET_IDS = 1 << 21
FILE_KIND = "whatif"
FILE_VERSION = 1
_FIX = "Re-run the profile job (`tpu-embed run` or `tpu-embed profile`) to write it again."

StepIds = Dict[str, Tuple[np.ndarray, np.ndarray]]  # feature name -> (global rows int32, ids int64)


def _ids_of(step: StepIds) -> int:
    return sum(int(ids.size) for _, ids in step.values())


def _order_key(step: StepIds) -> bytes:
    return b"".join(rows.tobytes() + ids.tobytes() for _, (rows, ids) in sorted(step.items()))


@dataclasses.dataclass(eq=False)
class WhatIfSteps:
    """The kept steps of one model configuration (see the module docstring)."""

    budget_ids: int = DEFAULT_BUDGET_IDS
    stride: int = 1  # a power of two: blocks whose index is a multiple of it are kept
    steps_seen: int = 0  # every step added, kept or not
    steps: Dict[int, StepIds] = dataclasses.field(default_factory=dict)
    ids_kept: int = 0

    @property
    def exact(self) -> bool:
        """Every step added is kept."""
        return len(self.steps) == self.steps_seen

    def keeps(self, step: int) -> bool:
        return (int(step) // BLOCK_STEPS) % self.stride == 0

    def add(self, step: int, global_ids: Mapping[str, object]) -> None:
        """Add one step: {feature name: FeatureIds (global rows, ids)}, as `ProfileCollector.add_step` takes it."""
        self.steps_seen += 1
        if not self.keeps(step):
            return
        kept = {name: (np.asarray(f.rows, np.int32).copy(), np.asarray(f.ids, np.int64).copy())  # type: ignore
                for name, f in global_ids.items()}
        self._put(int(step), kept)
        self._fit()

    def _put(self, step: int, ids: StepIds) -> None:
        old = self.steps.get(step)
        if old is not None:
            if _order_key(old) <= _order_key(ids):
                return
            self.ids_kept -= _ids_of(old)
        self.steps[step] = ids
        self.ids_kept += _ids_of(ids)

    def _fit(self) -> None:
        while self.ids_kept > self.budget_ids and any(s >= BLOCK_STEPS * self.stride for s in self.steps):
            self.stride *= 2
            self._drop_unkept()

    def _drop_unkept(self) -> None:
        for s in [s for s in self.steps if not self.keeps(s)]:
            self.ids_kept -= _ids_of(self.steps.pop(s))

    def merge_from(self, other: "WhatIfSteps") -> None:
        self.steps_seen += other.steps_seen
        self.budget_ids = min(self.budget_ids, other.budget_ids)
        if other.stride > self.stride:
            self.stride = other.stride
            self._drop_unkept()
        for s, ids in other.steps.items():
            if self.keeps(s):
                self._put(s, ids)
        self._fit()

    def sampling(self) -> str:
        """How the kept steps were chosen, in words: what every figure from them states beside it."""
        if self.exact:
            return f"all {self.steps_seen} steps"
        return (f"{len(self.steps)} of {self.steps_seen} steps (every {self.stride}th block of {BLOCK_STEPS} "
                "consecutive steps)")

    # ------------------------------------------------------------ file

    def to_json(self, model_key: str, features) -> dict:
        order = sorted(self.steps)
        names = list(features)
        lengths = np.array([[self.steps[s][n][1].size if n in self.steps[s] else 0 for n in names] for s in order],
                           np.int64).reshape(len(order), len(names))
        rows = [self.steps[s][n][0] for s in order for n in names if n in self.steps[s]]
        ids = [self.steps[s][n][1] for s in order for n in names if n in self.steps[s]]
        cat = lambda parts: np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        all_rows = cat(rows)
        deltas = np.diff(all_rows, prepend=np.int64(0)) if all_rows.size else all_rows  # sorted within a feature
        # The two large arrays deflated in pieces side by side (zlib releases the GIL), at the end of the shard job
        # when nothing else runs: the quoted workload's 1.5 M kept ids and rows 0.13 s one after the other.
        with concurrent.futures.ThreadPoolExecutor(native_threads()) as pool:
            packed_rows, packed_ids = pack_ids(deltas, pool), pack_ids(cat(ids), pool)
        return {"schema_version": FILE_VERSION, "kind": FILE_KIND, "model_key": model_key,
                "written_by": "tpu_embed profiles", "encoding": ENCODING, "block_steps": BLOCK_STEPS,
                "budget_ids": self.budget_ids, "stride": self.stride, "steps_seen": self.steps_seen,
                "features": names, "steps": order, "lengths": pack_ids(lengths.reshape(-1)),
                "rows": packed_rows, "ids": packed_ids}

    @classmethod
    def from_json(cls, d: Mapping, path: str) -> "WhatIfSteps":
        try:
            names = [str(n) for n in d["features"]]
            order = [int(s) for s in d["steps"]]
            if d.get("encoding") != ENCODING or int(d["block_steps"]) != BLOCK_STEPS:
                raise ValueError(f"encoding {d.get('encoding')!r}, block_steps {d.get('block_steps')!r}")
            lengths = unpack_ids(d["lengths"]).reshape(len(order), len(names))
            rows, ids = np.cumsum(unpack_ids(d["rows"])), unpack_ids(d["ids"])
            if rows.size != ids.size or ids.size != int(lengths.sum()):
                raise ValueError("rows, ids and lengths disagree")
            out = cls(int(d["budget_ids"]), int(d["stride"]), int(d["steps_seen"]))
            ends = np.cumsum(lengths.reshape(-1))
            starts = ends - lengths.reshape(-1)
            k = 0
            for s in order:
                step = {}
                for n in names:
                    step[n] = (rows[starts[k]:ends[k]].astype(np.int32), ids[starts[k]:ends[k]].copy())
                    k += 1
                out._put(s, step)
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptProfileError(f"what-if steps {path}: a field is missing or malformed ({e}). {_FIX}") from None
        return out


def what_if_path(directory: str, model_key: str) -> str:
    return tio.join(os.fspath(directory), f"{FILE_KIND}-{model_key}.json")


def write_what_if_steps(directory: str, profile: Profile) -> Optional[str]:
    """Write the kept steps of `profile` (a `WhatIfCollector`'s) to `directory`; None if it kept none."""
    steps = getattr(profile.accumulator, "what_if", None)
    if steps is None:
        return None
    path = what_if_path(directory, profile.model.key)
    atomic_write_text(path, dumps_readable(steps.to_json(profile.model.key, [f.name for f in profile.model.features])))
    return path


def read_what_if_steps(directory: str, model: ModelConfig) -> Optional[WhatIfSteps]:
    """The kept steps of `model`'s profile in `directory`, or None where the profile job kept none."""
    path = what_if_path(directory, model.key)
    if not tio.exists(path):
        return None
    d = read_json(path, "What-if steps", _FIX)
    if not isinstance(d, dict) or d.get("kind") != FILE_KIND:
        raise CorruptProfileError(f"what-if steps {path}: not a what-if steps file (kind != {FILE_KIND!r}). {_FIX}")
    if d.get("schema_version") != FILE_VERSION:
        raise SchemaVersionError(f"what-if steps {path}: schema_version {d.get('schema_version')!r}, this version "
                                 f"reads {FILE_VERSION}. {_FIX}")
    if d.get("model_key") != model.key or list(d.get("features", [])) != [f.name for f in model.features]:
        raise ProfileMismatchError(f"what-if steps {path} belong to model {d.get('model_key')!r}, not {model.key}. "
                                   f"{_FIX}")
    return WhatIfSteps.from_json(d, path)


def steps_of(profile: Profile) -> Optional[WhatIfSteps]:
    """The kept steps an in-memory profile carries (a `WhatIfCollector`'s), else None."""
    return getattr(profile.accumulator, "what_if", None)


# ---------------------------------------------------------------- collection

@dataclasses.dataclass(eq=False)
class WhatIfAccumulator(ProfileAccumulator):
    """A `ProfileAccumulator` with the kept steps (`what_if`); its statistics and their JSON are the profile's."""

    what_if: WhatIfSteps = dataclasses.field(default_factory=WhatIfSteps)

    def merge_from(self, other: ProfileAccumulator) -> None:
        super().merge_from(other)
        theirs = getattr(other, "what_if", None)
        if theirs is not None:
            self.what_if.merge_from(theirs)


class WhatIfCollector(ProfileCollector):
    """`ProfileCollector` that also keeps the steps the what-if figures come from (`WhatIfSteps`).

    `budget_ids`: ids kept before steps are sampled (default `DEFAULT_BUDGET_IDS`)."""

    def __init__(self, *args, budget_ids: int = DEFAULT_BUDGET_IDS, **kwargs):
        super().__init__(*args, **kwargs)
        if int(budget_ids) < 1:
            raise ValueError(f"budget_ids must be >= 1, got {budget_ids}")
        self.budget_ids = int(budget_ids)

    def create_accumulator(self) -> WhatIfAccumulator:
        acc = super().create_accumulator()
        return WhatIfAccumulator(**{f.name: getattr(acc, f.name) for f in dataclasses.fields(ProfileAccumulator)},
                                 what_if=WhatIfSteps(self.budget_ids))

    def add_steps(self, acc, steps, **kwargs):
        numbers = step_numbers(acc, steps)  # before they are added: where no step is given, acc.steps moves on
        out = super().add_steps(acc, steps, **kwargs)
        kept = getattr(out, "what_if", None)
        if kept is not None:  # an accumulator of this collector
            for n, s in zip(numbers, steps):
                kept.add(n, s.global_ids)
        return out
