"""The plan file: SparseCore limits derived from a profile, versioned JSON.

The training side needs four things, which `Plan.to_sparse_core_config()`
turns into TF's `SparseCoreEmbeddingConfig`; everything else in the file
(observed figures, expected drops, memory, balance, stacking and topology
comparisons) explains them.  See SCHEMA.md.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Optional, Union

from profiles.errors import CorruptProfileError, SchemaVersionError
from profiles.jsonio import atomic_write_text, dumps_readable, read_json

PLAN_SCHEMA_VERSION = 1


@dataclasses.dataclass
class StackPlan:
    name: str
    tables: List[str]
    sample_count: int
    padded_dim: int
    origin: str  # where the statistics came from (see planner/sources.py)
    steps: int
    max_ids_per_table: int
    max_unique_ids_per_table: int
    required_ids_per_chip_per_sample: int  # what this stack alone needs
    observed: Dict[str, Dict[str, int]]  # {'max_ids'|'max_unique_ids'|'chip_buffer_slots': {p50, p99, p99.9, max}}
    drops: Dict[str, Any]  # expected drops of the chosen limits on the profiled data
    memory: Dict[str, int]  # bytes per SparseCore: planned vs TF defaults (memory model, SCHEMA.md)
    destination_balance: Optional[float]
    options: List[Dict[str, Any]]  # every enumerated option with its estimate

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "StackPlan":
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})


@dataclasses.dataclass
class Plan:
    model_key: str
    global_config: Dict[str, Any]
    policy: Dict[str, Any]
    steps: int
    max_ids_per_table: Dict[str, int]
    max_unique_ids_per_table: Dict[str, int]
    max_ids_per_chip_per_sample: int
    allow_id_dropping: bool
    disable_table_stacking: bool
    stacks: Dict[str, StackPlan]
    tables: Dict[str, Dict[str, Any]]
    stacking: Dict[str, Any]
    topologies: List[Dict[str, Any]]
    memory: Dict[str, Any]
    warnings: List[str]
    model: Optional[Dict[str, Any]] = None  # the ModelConfig planned for (JSON), for reports
    schema_version: int = PLAN_SCHEMA_VERSION
    # Per stack the balance of frequency order and balanced ids, with the floor (profiles.balance_figures); None where
    # the plan was not made from a profile of its own configuration that counted it.
    balance: Optional[Dict[str, Any]] = None
    # Placements compared under the cost model and the configurations chosen (`tpu-embed plan --propose`,
    # profiles.planner.proposal); None without --propose.
    proposal: Optional[Dict[str, Any]] = None
    # Other chip counts, SparseCores per chip and batches from the profile job's recorded steps, each with its
    # sampling (profiles.planner.variants); None where the profile has no recorded steps.
    what_if: Optional[Dict[str, Any]] = None

    # ------------------------------------------------------------ training side

    def sparse_core_kwargs(self) -> dict:
        return {"disable_table_stacking": self.disable_table_stacking,
                "max_ids_per_chip_per_sample": int(self.max_ids_per_chip_per_sample),
                "max_ids_per_table": dict(self.max_ids_per_table),
                "max_unique_ids_per_table": dict(self.max_unique_ids_per_table),
                "allow_id_dropping": bool(self.allow_id_dropping)}

    def to_sparse_core_config(self):
        """TF's SparseCoreEmbeddingConfig with these limits."""
        # Imported here: the plan is read without TensorFlow; only this conversion needs it.
        from tensorflow.python.tpu.tpu_embedding_v3 import SparseCoreEmbeddingConfig
        return SparseCoreEmbeddingConfig(**self.sparse_core_kwargs())

    def preprocess_kwargs(self) -> dict:
        """Keyword arguments for `tpu_embed.sparsecore.preprocess(_with_layout)`."""
        k = self.sparse_core_kwargs()
        k.pop("disable_table_stacking")
        return k

    # ------------------------------------------------------------ JSON

    def to_json(self) -> dict:
        return {
            "schema_version": self.schema_version, "kind": "plan", "model_key": self.model_key,
            "global": self.global_config, "policy": self.policy, "steps": self.steps,
            "sparse_core_config": self.sparse_core_kwargs(),
            "stacks": {k: v.to_json() for k, v in self.stacks.items()},
            "tables": self.tables, "stacking": self.stacking, "topologies": self.topologies,
            "memory": self.memory, "warnings": self.warnings, "model": self.model,
            **({"balance": self.balance} if self.balance is not None else {}),
            **({"proposal": self.proposal} if self.proposal is not None else {}),
            **({"what_if": self.what_if} if self.what_if is not None else {}),
        }

    @classmethod
    def from_json(cls, d: dict, path: str = "<plan>") -> "Plan":
        if not isinstance(d, dict) or d.get("kind") != "plan":
            raise CorruptProfileError(f"{path} is not a tpu_embed plan file (kind != 'plan').")
        if d.get("schema_version") != PLAN_SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{path} has plan schema_version {d.get('schema_version')!r}; this version reads "
                f"{PLAN_SCHEMA_VERSION}. Re-run `tpu-embed plan` with this version.")
        try:
            sc = d["sparse_core_config"]
            return cls(
                model_key=d["model_key"], global_config=d["global"], policy=d["policy"], steps=int(d["steps"]),
                max_ids_per_table={k: int(v) for k, v in sc["max_ids_per_table"].items()},
                max_unique_ids_per_table={k: int(v) for k, v in sc["max_unique_ids_per_table"].items()},
                max_ids_per_chip_per_sample=int(sc["max_ids_per_chip_per_sample"]),
                allow_id_dropping=bool(sc["allow_id_dropping"]),
                disable_table_stacking=bool(sc.get("disable_table_stacking", False)),
                stacks={k: StackPlan.from_json(v) for k, v in d["stacks"].items()},
                tables=d["tables"], stacking=d["stacking"], topologies=d["topologies"], memory=d["memory"],
                warnings=list(d.get("warnings", [])), model=d.get("model"), balance=d.get("balance"),
                proposal=d.get("proposal"), what_if=d.get("what_if"))
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptProfileError(f"{path}: plan file is missing or has a malformed field ({e!r}). "
                                      "Re-run `tpu-embed plan`.") from None

    def write(self, path: str) -> str:
        atomic_write_text(path, dumps_readable(self.to_json()))
        return path


def load_plan(path: Union[str, os.PathLike]) -> Plan:
    """Read a plan file written by `Plan.write` / `tpu-embed plan`."""
    d = read_json(os.fspath(path), "Plan file", "Re-run `tpu-embed plan` to regenerate it.")
    return Plan.from_json(d, os.fspath(path))
