"""`--spec SPEC_OR_LAYOUT`: read the configuration to plan for from a file.

Accepted, recognised by content:
* a profile index `model-<key>.json` or a plan file (they record the model);
* a layout dump, `tpu_embed.sparsecore.SparseCoreLayout.to_dict()` as JSON;
* a small JSON/YAML spec:
      {"topology": {"num_chips": 8, "num_sc_per_chip": 4, "num_hosts": 2},
       "sharding_strategy": "mod",
       "tables": [{"name": "t", "vocabulary_size": 1000, "dim": 16, "combiner": "mean",
                   "optimizer": "adagrad"}],
       "features": [{"name": "f", "table": "t", "output_shape": [128]}]}
  (`optimizer` only groups tables for stacking: equal strings stack together).
The project's full YAML spec is read by a loader the top-level CLI passes
in (`profiles.cli.add_commands(subparsers, spec_loader=...)`).
"""

from __future__ import annotations

import json
import types
from typing import Any, Callable, Optional

from tpu_embed.topology import Topology

from profiles.config import ModelConfig, _OrderedPath

SpecLoader = Callable[[str], Any]  # path -> ModelConfig | (feature_config, Topology)


def load_model_config(path: str, spec_loader: Optional[SpecLoader] = None) -> ModelConfig:
    if spec_loader is not None:
        return _coerce(spec_loader(path), path)
    with open(path, "r", encoding="utf-8") as f:
        text = f.read()
    try:
        d = json.loads(text)
    except json.JSONDecodeError:
        try:
            import yaml
        except ImportError:  # pragma: no cover - pyyaml is a dependency
            raise ValueError(f"{path}: not JSON, and PyYAML is not installed to read YAML.")
        d = yaml.safe_load(text)
    if not isinstance(d, dict):
        raise ValueError(f"{path}: expected a mapping at the top level.")
    kind = d.get("kind")
    if kind == "model" and "model" in d:
        return ModelConfig.from_json(d["model"])
    if kind == "plan" and d.get("model"):
        return ModelConfig.from_json(d["model"])
    if "stacks" in d and "tables" in d and isinstance(d["tables"], dict) and "features" in d:
        return _from_layout_dict(d, path)
    if "tables" in d and "features" in d:
        return _from_simple_spec(d, path)
    raise ValueError(
        f"{path}: not a spec this command understands (a model-*.json profile index, a plan file, a layout dump, "
        "or {topology, tables, features}). For the project's YAML spec, run through the top-level `tpu-embed` "
        "CLI, which knows its loader.")


def _coerce(obj: Any, path: str) -> ModelConfig:
    if isinstance(obj, ModelConfig):
        return obj
    if isinstance(obj, (tuple, list)) and len(obj) == 2 and isinstance(obj[1], Topology):
        return ModelConfig.from_feature_config(obj[0], obj[1])
    raise TypeError(f"{path}: the spec loader returned {type(obj).__name__}; expected a ModelConfig or "
                    "(feature_config, tpu_embed.Topology).")


def _topology(d: dict) -> Topology:
    t = d.get("topology") or {}
    return Topology(int(t["num_chips"]), int(t.get("num_sc_per_chip", 4)), int(t.get("num_hosts", 1)))


def _from_simple_spec(d: dict, path: str) -> ModelConfig:
    tables = {}
    for t in d["tables"]:
        tables[t["name"]] = types.SimpleNamespace(
            name=t["name"], vocabulary_size=int(t["vocabulary_size"]), dim=int(t["dim"]),
            combiner=t.get("combiner", "mean"), optimizer=str(t.get("optimizer", "default")))
    fc = {}
    for f in d["features"]:
        name = f.get("name") or f.get("path")
        if f["table"] not in tables:
            raise ValueError(f"{path}: feature {name!r} uses unknown table {f['table']!r}.")
        fc[name] = types.SimpleNamespace(table=tables[f["table"]], output_shape=list(f["output_shape"]), name=name)
    return ModelConfig.from_feature_config(fc, _topology(d), d.get("sharding_strategy", "mod"))


def _from_layout_dict(d: dict, path: str) -> ModelConfig:
    # A layout does not record optimizers; tables that share a stack share a group, which
    # reproduces the recorded stacking (checked below).
    group = {}
    for i, (sname, st) in enumerate(d["stacks"].items()):
        for t in st["tables"]:
            group[t] = f"stack{i}"
    tables = {name: types.SimpleNamespace(name=name, vocabulary_size=int(t["vocabulary_size"]), dim=int(t["dim"]),
                                          combiner=t["combiner"], optimizer=group[name])
              for name, t in d["tables"].items()}
    feats = sorted(d["features"], key=lambda f: f["index"])
    fc = {_OrderedPath(f["path"], i): types.SimpleNamespace(table=tables[f["table"]],
                                                            output_shape=list(f["output_shape"]), name=f["path"])
          for i, f in enumerate(feats)}
    model = ModelConfig.from_feature_config(fc, _topology(d), d.get("sharding_strategy", "mod"))
    if sorted(model.layout().stacks) != sorted(d["stacks"]):
        raise ValueError(f"{path}: could not reproduce the layout's stacking {sorted(d['stacks'])} from it.")
    return model
