"""ProfileStore: the profile_data_directory.  One JSON file per table, per stack, per model.

    <dir>/table-<key>.json   one table's statistics   key = sha256(table params + global config)
    <dir>/stack-<key>.json   one stacked table's      key = sha256(stack params + global config)
    <dir>/model-<key>.json   index of one model: its full configuration, its table/stack keys,
                             the candidate-topology figures of its stacks

Several models can share a directory: a table (or stack) with the same
parameters under the same global configuration has the same key, so its
file is reused; anything else has another key, so a model never picks up a
foreign file.  Every file records what it was hashed from and `read`
re-derives the key, so a renamed or hand-edited file is refused.  See
profiles/SCHEMA.md for the format.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from profiles.errors import (
    CorruptProfileError,
    MissingProfileError,
    ProfileError,
    ProfileMismatchError,
    SchemaVersionError,
    StaleProfileWarning,
)
from profiles.jsonio import atomic_write_text, dumps_readable, read_json
from profiles.profile import CandidateStatus, Profile, ProfileAccumulator, StackProfile, TableProfile
from profiles.stats import PartitionStats, TableStats, deep_copy
from profiles.summary import table_summary
from profiles.units import GlobalConfig, StackUnit, TableUnit, stack_key, stack_units, table_key, table_unit
from tpu_embed.artifact import io as tio
from tpu_embed.core.model import ModelConfig, from_tf_feature_config

SCHEMA_VERSION = 2
WRITE_THREADS = 8  # table and stack files written at once by `ProfileStore.write`
WRITTEN_BY = "tpu_embed profiles"
_FIX = ("Delete it and re-run the profile job (`tpu-embed profile`), or point --profiles at another "
        "directory.")

# What a table file and a stack file hold: the unit's class, how its key is derived, its statistics' class.
_UNIT_FILES: Dict[str, Tuple[Any, Callable[[Any, GlobalConfig], str], Any]] = {
    "table": (TableUnit, table_key, TableStats), "stack": (StackUnit, stack_key, PartitionStats)}


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    key: str
    path: str
    steps: int
    tables: Tuple[str, ...]
    global_config: GlobalConfig


class ProfileStore:
    def __init__(self, directory: str):
        self.directory = str(directory)

    # ------------------------------------------------------------ paths

    def _path(self, kind: str, key: str) -> str:
        return tio.join(self.directory, f"{kind}-{key}.json")

    def table_path(self, key: str) -> str:
        return self._path("table", key)

    def stack_path(self, key: str) -> str:
        return self._path("stack", key)

    def model_path(self, key: str) -> str:
        return self._path("model", key)

    # ------------------------------------------------------------ writing

    def write(self, profile: Profile, *, merge_existing: bool = False) -> List[str]:
        """Write every table, stack and the model index of `profile`; returns the paths.

        With `merge_existing`, statistics already in the directory under the
        same keys are merged in first (several runs or hosts, one directory).
        Each file is replaced atomically; the model index is written last.
        """
        if merge_existing:
            try:
                existing = self.read(model=profile.model.key)
            except MissingProfileError:
                existing = None
            if existing is not None:
                profile = existing.merge(profile)
            else:
                profile = self._merge_shared_files(profile)
        writes = ([functools.partial(self._write_table, tp) for tp in profile.tables.values()]
                  + [functools.partial(self._write_stack, sp) for sp in profile.stacks.values()])
        # Most of a file's time is its fsync (or upload), which releases the GIL: the table and stack files are
        # written by a few threads, the model index after all of them.
        with concurrent.futures.ThreadPoolExecutor(min(WRITE_THREADS, max(1, len(writes)))) as pool:
            paths = list(pool.map(lambda write: write(), writes))
        paths.append(self._write_model(profile))
        return paths

    def merge(self, profile: Profile) -> List[str]:
        """Merge `profile` into what the directory already holds (`write(..., merge_existing=True)`)."""
        return self.write(profile, merge_existing=True)

    def merge_from(self, other: "ProfileStore") -> List[str]:
        """Merge every model profile of another directory (e.g. one per host) into this one."""
        paths = []
        for entry in other.models():
            paths += self.merge(other.read(model=entry.key))
        return paths

    def _merge_shared_files(self, profile: Profile) -> Profile:
        # No index of this model yet, but tables/stacks may be shared with another model's files.
        acc = deep_copy(profile.accumulator)
        for kind, units, merged in (("table", profile.tables, acc.tables), ("stack", profile.stacks, acc.stacks)):
            for name, unit_profile in units.items():
                found = self._read_unit(kind, unit_profile.key)
                if found is not None:
                    stats = found[2]
                    stats.merge_from(unit_profile.stats)
                    merged[name] = stats
        return Profile(profile.model, profile.candidates, acc)

    def _header(self, kind: str, key: str) -> dict:
        return {"schema_version": SCHEMA_VERSION, "kind": kind, "key": key, "written_by": WRITTEN_BY}

    def _write_file(self, kind: str, key: str, fields: dict) -> str:
        d = self._header(kind, key)
        d.update(fields)
        path = self._path(kind, key)
        atomic_write_text(path, dumps_readable(d))
        return path

    def _write_table(self, tp: TableProfile) -> str:
        return self._write_file("table", tp.key, {
            "table": tp.table.to_json(), "global": tp.global_config.to_json(), "steps": tp.steps,
            "summary": _jsonable(table_summary(tp)), "statistics": tp.stats.to_json()})

    def _write_stack(self, sp: StackProfile) -> str:
        return self._write_file("stack", sp.key, {
            "stack": sp.stack.to_json(), "global": sp.global_config.to_json(), "steps": sp.steps,
            "summary": _jsonable(sp.summary()), "statistics": sp.stats.to_json()})

    def _write_model(self, p: Profile) -> str:
        m = p.model
        cands = {}
        for c, status in sorted(p.candidates.items()):
            entry = status.to_json()
            if c in p.accumulator.candidate_stacks:
                entry["stacks"] = {k: v.to_json() for k, v in sorted(p.accumulator.candidate_stacks[c].items())}
            cands[str(c)] = entry
        return self._write_file("model", m.key, dict(
            model=m.to_json(), steps=p.steps,
            tables={t.name: table_key(table_unit(m, t.name), p.global_config) for t in m.tables},
            stacks={name: stack_key(spec, p.global_config) for name, spec in stack_units(m).items()},
            candidates=cands))

    # ------------------------------------------------------------ reading

    def models(self) -> List[ModelEntry]:
        out = []
        for path in self._glob("model"):
            d = self._load(path, "model")
            m = ModelConfig.from_json(d["model"])
            out.append(ModelEntry(d["key"], path, int(d["steps"]), tuple(t.name for t in m.tables),
                                  GlobalConfig.of(m)))
        return out

    def read(self, model: Optional[str] = None) -> Profile:
        """The profile of one model: `model` = its key (or a unique key prefix); None if the
        directory holds exactly one model."""
        entries = self.models()
        if model is None:
            if not entries:
                raise MissingProfileError(
                    f"{self.directory} holds no model-*.json profile index. Run the profile job "
                    "(`tpu-embed profile`) with this directory as its profile_data_directory.")
            if len(entries) > 1:
                listing = "; ".join(f"{e.key}: {len(e.tables)} tables, {e.global_config.num_chips} chips, "
                                    f"{e.steps} steps" for e in entries)
                raise ProfileError(
                    f"{self.directory} holds profiles of {len(entries)} models ({listing}). Choose one with "
                    "model=KEY (CLI: --model KEY) or pass the model's spec (--spec).")
            entry = entries[0]
        else:
            matches = [e for e in entries if e.key.startswith(model)]
            if len(matches) != 1:
                raise MissingProfileError(
                    f"{self.directory}: {'no' if not matches else 'several'} model profile(s) match {model!r}; "
                    f"models here: {[e.key for e in entries]}.")
            entry = matches[0]
        return self._read_model(entry.path)

    def read_for(self, model, topology=None) -> Profile:
        """The profile of exactly this configuration: a ModelConfig, or TF feature_config + Topology."""
        if not isinstance(model, ModelConfig) and topology is None:
            raise TypeError("read_for(feature_config, topology): the topology is needed to find the profile.")
        model = from_tf_feature_config(model, topology)
        path = self.model_path(model.key)
        if not tio.exists(path):
            raise MissingProfileError(
                f"{path} does not exist: no profile of this exact configuration ({len(model.tables)} tables, "
                f"{model.topology.num_chips} chips) in {self.directory}. Run the profile job for it, "
                "or plan from another configuration's candidate figures (`profiles.plan(..., spec=...)`).")
        return self._read_model(path)

    def _read_model(self, path: str) -> Profile:
        d = self._load(path, "model")
        model = ModelConfig.from_json(d["model"])
        self._check_key(path, d, model.key, "model configuration")
        tables, stacks = {}, {}
        g = GlobalConfig.of(model)
        for t in model.tables:
            unit = table_unit(model, t.name)
            tp = self.read_table(unit, g)
            if tp is None:
                raise MissingProfileError(
                    f"{path} lists table {t.name!r}, but its file {self.table_path(table_key(unit, g))} "
                    f"is missing. {_FIX}")
            tables[t.name] = tp.stats
        for name, spec in stack_units(model).items():
            sp = self.read_stack(spec, g)
            if sp is None:
                raise MissingProfileError(
                    f"{path} lists stack {name!r}, but its file "
                    f"{self.stack_path(stack_key(spec, g))} "
                    f"is missing. {_FIX}")
            stacks[name] = sp.stats
        steps = int(d["steps"])
        stale = sorted({s.steps for s in tables.values()} | {s.steps for s in stacks.values()} | {steps})
        if len(stale) > 1:
            warnings.warn(StaleProfileWarning(
                f"{path}: the model's files cover different numbers of steps {stale} (files shared with or "
                "overwritten by another run). Figures are per file; re-run the profile job to align them."),
                stacklevel=3)
        candidates, cstacks = {}, {}
        for c, entry in d.get("candidates", {}).items():
            c = int(c)
            candidates[c] = CandidateStatus(c, str(entry["status"]), str(entry.get("reason", "")))
            if entry.get("stacks") is not None:
                cstacks[c] = {k: PartitionStats.from_json(v) for k, v in entry["stacks"].items()}
        acc = ProfileAccumulator(model.key, steps, tables, stacks, cstacks)
        return Profile(model, dict(sorted(candidates.items())), acc)

    def read_table(self, table: TableUnit, global_config: GlobalConfig) -> Optional[TableProfile]:
        """This table's statistics under this global configuration, or None if never profiled."""
        found = self._read_unit("table", table_key(table, global_config))
        return None if found is None else TableProfile(table, global_config, found[2])

    def read_stack(self, stack: StackUnit, global_config: GlobalConfig) -> Optional[StackProfile]:
        """This stack's statistics under this global configuration, or None if never profiled."""
        found = self._read_unit("stack", stack_key(stack, global_config))
        return None if found is None else StackProfile(stack, global_config, found[2])

    def all_tables(self) -> List[TableProfile]:
        return [TableProfile(*self._read_unit_file(path, "table")) for path in self._glob("table")]

    def all_stacks(self) -> List[StackProfile]:
        return [StackProfile(*self._read_unit_file(path, "stack")) for path in self._glob("stack")]

    def _glob(self, kind: str) -> List[str]:
        return tio.glob(tio.join(self.directory, f"{kind}-*.json"))

    def _read_unit(self, kind: str, key: str) -> Optional[tuple]:
        """(unit, global configuration, statistics) of the table or stack file of `key`, or None if absent."""
        path = self._path(kind, key)
        if not tio.exists(path):
            return None
        return self._read_unit_file(path, kind, key)

    def _read_unit_file(self, path: str, kind: str, key: Optional[str] = None) -> tuple:
        unit_class, key_of, stats_class = _UNIT_FILES[kind]
        d = self._load(path, kind)
        spec, g = unit_class.from_json(d[kind]), GlobalConfig.from_json(d["global"])
        self._check_key(path, d, key_of(spec, g), f"{kind} parameters and global configuration")
        if key is not None and d["key"] != key:
            raise ProfileMismatchError(f"{path} holds {kind} key {d['key']}, not {key}. {_FIX}")
        return spec, g, stats_class.from_json(d["statistics"])

    # ------------------------------------------------------------ validation

    def _load(self, path: str, kind: str) -> dict:
        d = read_json(path, "Profile file", _FIX)
        if not isinstance(d, dict) or "schema_version" not in d:
            raise CorruptProfileError(f"{path} is not a tpu_embed profile file (no schema_version field). {_FIX}")
        if d["schema_version"] != SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{path} has schema_version {d['schema_version']!r}; this version of tpu_embed reads profile "
                f"schema {SCHEMA_VERSION} (see profiles/SCHEMA.md). Re-run the profile job with this version, or "
                "use the tpu_embed release that wrote the file.")
        if d.get("kind") != kind:
            raise CorruptProfileError(f"{path} is a {d.get('kind')!r} file, expected {kind!r}: the file name and "
                                      f"content disagree. {_FIX}")
        name_key = tio.basename(path)[len(kind) + 1:-len(".json")]
        if d.get("key") != name_key:
            raise ProfileMismatchError(
                f"{path}: the file is named for key {name_key} but records key {d.get('key')!r} (renamed or "
                f"copied by hand?). A model would pick up statistics of another configuration. {_FIX}")
        required = {"table": ("table", "global", "statistics"), "stack": ("stack", "global", "statistics"),
                    "model": ("model", "steps", "tables", "stacks")}[kind]
        missing = [k for k in required if k not in d]
        if missing:
            raise CorruptProfileError(f"{path} lacks field(s) {missing} required by schema {SCHEMA_VERSION}. {_FIX}")
        return d

    @staticmethod
    def _check_key(path: str, d: dict, derived: str, what: str) -> None:
        if d["key"] != derived:
            raise ProfileMismatchError(
                f"{path}: the {what} recorded in the file hash to {derived}, not to its key {d['key']} "
                f"(the file was edited, or written by an incompatible hashing). {_FIX}")


def _jsonable(x):
    """Summaries may hold numpy scalars and NaN-free floats only; make them plain."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x
