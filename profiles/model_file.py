"""`--spec SPEC_OR_LAYOUT`: read the model to plan for from a file.

Accepted, recognised by content:
* a profile index `model-<key>.json` or a plan file (they record the model);
* a layout dump, `tpu_embed.sparsecore.SparseCoreLayout.to_dict()` as JSON;
* a small JSON/YAML model:
      {"topology": {"num_chips": 8, "num_sc_per_chip": 4, "num_hosts": 2},
       "tables": [{"name": "t", "vocabulary_size": 1000, "dim": 16, "combiner": "mean",
                   "optimizer": "adagrad"}],
       "features": [{"name": "f", "table": "t", "output_shape": [128]}]}
  (`optimizer` only groups tables for stacking: equal strings stack together).
The project's full YAML spec is read by a loader the top-level CLI passes in
(`pipelines.cli.plan_report.add_commands(subparsers, spec_loader=...)`): it is called with
the file and the profile directory (where the vocabulary sizes can be found) and
returns None for a file it does not read, which then goes through the formats above.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, Iterable, Optional

import yaml

from tpu_embed.artifact import io
from tpu_embed.core.model import FeatureConfig, ModelConfig, TableConfig, from_tf_feature_config
from tpu_embed.core.topology import Topology
from tpu_embed.sparsecore.layout import layout_of

# (path, profile directory or None) -> ModelConfig | (feature_config, Topology) | None (not a file it reads)
SpecLoader = Callable[[str, Optional[str]], Any]


def load_model_config(path: str, spec_loader: Optional[SpecLoader] = None,
                      profile_dir: Optional[str] = None) -> ModelConfig:
    obj = spec_loader(path, profile_dir) if spec_loader is not None else None
    if obj is not None:
        if isinstance(obj, (tuple, list)) and len(obj) == 2 and isinstance(obj[1], Topology):
            return from_tf_feature_config(obj[0], obj[1])
        if isinstance(obj, ModelConfig):
            return obj
        raise TypeError(f"{path}: the spec loader returned {type(obj).__name__}; expected a ModelConfig or "
                        "(feature_config, tpu_embed.Topology).")
    text = io.read_text(path)
    try:
        d = json.loads(text)
    except json.JSONDecodeError:
        d = yaml.safe_load(text)
    if not isinstance(d, dict):
        raise ValueError(f"{path}: expected a mapping at the top level.")
    if d.get("kind") in ("model", "plan") and d.get("model"):
        return ModelConfig.from_json(d["model"])
    if "stacks" in d and isinstance(d.get("tables"), dict) and "features" in d:
        return _from_layout_dict(d, path)
    if "tables" in d and "features" in d:
        groups = {t["name"]: str(t.get("optimizer", "default")) for t in d["tables"]}
        return _model(d, d["tables"], d["features"], groups, path)
    raise ValueError(
        f"{path}: not a spec this command understands (a model-*.json profile index, a plan file, a layout dump, "
        "or {topology, tables, features}). For the project's YAML spec, run through the top-level `tpu-embed` "
        "CLI, which knows its loader.")


def _model(d: dict, tables: Iterable[dict], features: Iterable[dict], groups: Dict[str, str], path: str
           ) -> ModelConfig:
    by_name = {t["name"]: TableConfig(str(t["name"]), int(t["vocabulary_size"]), int(t["dim"]),
                                      t.get("combiner", "mean"), optimizer_group=groups[t["name"]])
               for t in tables}
    feats = []
    for f in features:
        name = f.get("name") or f.get("path")
        if not name:
            raise ValueError(f"{path}: a feature has neither a name nor a path.")
        if f["table"] not in by_name:
            raise ValueError(f"{path}: feature {name!r} uses unknown table {f['table']!r}.")
        feats.append(FeatureConfig(str(name), by_name[f["table"]], tuple(f["output_shape"])))
    t = d.get("topology") or {}
    return ModelConfig(tuple(feats), Topology(int(t["num_chips"]), int(t.get("num_sc_per_chip", 4)),
                                              int(t.get("num_hosts", 1))))


def _from_layout_dict(d: dict, path: str) -> ModelConfig:
    # A layout does not record optimizers; tables that share a stack share a group, which
    # reproduces the recorded stacking (checked below).
    groups = {t: f"stack{i}" for i, st in enumerate(d["stacks"].values()) for t in st["tables"]}
    tables = [dict(t, name=name) for name, t in d["tables"].items()]
    features = sorted(d["features"], key=lambda f: f["index"])
    model = _model(d, tables, features, groups, path)
    if sorted(layout_of(model).stacks) != sorted(d["stacks"]):
        raise ValueError(f"{path}: could not reproduce the layout's stacking {sorted(d['stacks'])} from it.")
    return model
