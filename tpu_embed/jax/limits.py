"""Exact SparseCore limits for jax-tpu-embedding's feature specs, from `tpu-embed plan --format jax-fdo`.

    tpu-embed plan --profiles ARTIFACT/profiles --format jax-fdo --output FDO_DIR   # a stacking of the profile's
    tpu-embed plan --artifact ARTIFACT --format jax-fdo --output FDO_DIR   # the stacking of the artifact's jax shards

writes the exact per-partition maxima (of the profile, or of the artifact's manifest where the profile did not
count a stack) as jax-tpu-embedding's FDO statistics (`fdo_stats_<process>_<time>.npz`, what its
`NPZFileFDOClient` loads) and `tpu_embed_jax_fdo.json`, the layout they hold for.  Then, with
jax-tpu-embedding's `FeatureSpec`s of the same tables and features (or `tpu_embed.jax.specs.feature_specs`,
which makes an artifact's and applies the limits):

    from tpu_embed.jax import limits
    limits.stack_tables(feature_specs, FDO_DIR)   # the stacks the figures are for, by jax's own stacker
    limits.apply_limits(feature_specs, FDO_DIR)   # max_ids_per_partition, max_unique_ids_per_partition,
                                                  # suggested_coo_buffer_size_per_device per stacked table

`apply_limits` sets what `embedding.update_preprocessing_parameters` sets from `NPZFileFDOClient(FDO_DIR)
.load()`, after checking that the specs are stacked as the figures were counted (stack names, member tables,
their row offsets and rotations, each feature's table and global samples, SparseCores per device); a
mismatch is refused, since the figures would then not be exact.  A plain mapping `{stack: StackLimits or
dict}` is set as given.

jax is imported inside the functions that take feature specs; reading the figures needs numpy alone.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Union

import numpy as np

SIDECAR = "tpu_embed_jax_fdo.json"
FORMAT = "tpu_embed jax-fdo"
# The suffixes of jax-tpu-embedding's `SparseDenseMatmulInputStats` fields in an FDO file.
SUFFIX_MAX_IDS = "_max_ids"
SUFFIX_MAX_UNIQUE_IDS = "_max_unique_ids"
SUFFIX_REQUIRED_BUFFER_SIZE = "_required_buffer_size"
_FDO_FILE = re.compile(r"fdo_stats_(\d+)_(\d+)\.npz$")


@dataclasses.dataclass(frozen=True)
class StackLimits:
    """One stacked table's limits, as jax-tpu-embedding's `StackedTableSpec` names them."""

    max_ids_per_partition: int
    max_unique_ids_per_partition: int
    suggested_coo_buffer_size_per_device: Optional[int] = None

    @classmethod
    def of(cls, value: Union["StackLimits", Mapping[str, Any]]) -> "StackLimits":
        if isinstance(value, StackLimits):
            return value
        buf = value.get("suggested_coo_buffer_size_per_device")
        return cls(int(value["max_ids_per_partition"]), int(value["max_unique_ids_per_partition"]),
                   None if buf is None else int(buf))


Source = Union[str, "os.PathLike[str]", Mapping[str, Union[StackLimits, Mapping[str, Any]]]]


def read_layout(fdo_dir: Union[str, "os.PathLike[str]"]) -> dict:
    """`tpu_embed_jax_fdo.json` of a directory written by `tpu-embed plan --format jax-fdo`."""
    path = os.path.join(os.fspath(fdo_dir), SIDECAR)
    try:
        with open(path, encoding="utf-8") as fh:
            layout = json.load(fh)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist: write the directory with `tpu-embed plan --format jax-fdo "
                                "--output DIR`, or pass the limits as a mapping") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not the JSON `tpu-embed plan --format jax-fdo` writes ({e})") from None
    if not isinstance(layout, dict) or layout.get("format") != FORMAT:
        raise ValueError(f"{path} is not a layout record of `tpu-embed plan --format jax-fdo`")
    return layout


def read_limits(fdo_dir: Union[str, "os.PathLike[str]"], num_sc_per_device: Optional[int] = None
                ) -> Dict[str, StackLimits]:
    """Per stacked table, the limits jax derives from the FDO files in `fdo_dir`.

    As `NPZFileFDOClient.load` + `update_preprocessing_parameters`: the newest file of each process, the
    element-wise maximum over processes, then the maximum of `<stack>_max_ids` / `<stack>_max_unique_ids`, and
    the maximum of `<stack>_required_buffer_size` times the SparseCores per device (`num_sc_per_device`, else
    the one `tpu_embed_jax_fdo.json` records)."""
    d = os.fspath(fdo_dir)
    if num_sc_per_device is None:
        num_sc_per_device = int(read_layout(d)["num_sc_per_device"])
    newest: Dict[int, tuple] = {}
    for name in os.listdir(d):
        m = _FDO_FILE.fullmatch(name)
        if m:
            proc, ts = int(m.group(1)), int(m.group(2))
            if proc not in newest or ts > newest[proc][0]:
                newest[proc] = (ts, name)
    if not newest:
        raise FileNotFoundError(f"{d} holds no fdo_stats_<process>_<time>.npz file")
    stats: Dict[str, np.ndarray] = {}
    for _, name in newest.values():
        with np.load(os.path.join(d, name), allow_pickle=False) as npz:
            for key in npz.files:
                v = np.asarray(npz[key])
                stats[key] = v if key not in stats else np.maximum(stats[key], v)
    out: Dict[str, StackLimits] = {}
    for key in sorted(stats):
        if not key.endswith(SUFFIX_MAX_IDS) or key.endswith(SUFFIX_MAX_UNIQUE_IDS):
            continue
        stack = key[:-len(SUFFIX_MAX_IDS)]
        uniq = stats.get(stack + SUFFIX_MAX_UNIQUE_IDS)
        if uniq is None:
            raise ValueError(f"{d}: {key} has no {stack + SUFFIX_MAX_UNIQUE_IDS} beside it")
        buf = stats.get(stack + SUFFIX_REQUIRED_BUFFER_SIZE)
        out[stack] = StackLimits(int(np.max(stats[key])), int(np.max(uniq)),
                                 None if buf is None else int(np.max(buf)) * int(num_sc_per_device))
    return out


def stack_tables(feature_specs: Any, fdo_dir: Union[str, "os.PathLike[str]"]) -> None:
    """Stack unstacked jax-tpu-embedding `FeatureSpec`s (a list or any nest, in place) as the figures in
    `fdo_dir` were counted, with jax-tpu-embedding's own stacker: for the 'tpu_embed' stacking every stack of
    several tables by `table_stacking.stack_tables` (its members in the recorded order, the recorded name); for
    'jax', `embedding.auto_stack_tables` (which depends on the order of the specs: list them as the model's
    features, a dict keyed by feature name does); then `embedding.prepare_feature_specs_for_training` for the
    rest (one stack per table, named by it)."""
    from jax_tpu_embedding.sparsecore.lib.nn import embedding, table_stacking

    layout = read_layout(fdo_dir)
    devices, nsc = int(layout["global_device_count"]), int(layout["num_sc_per_device"])
    if layout["stacking"] == "jax":
        embedding.auto_stack_tables(feature_specs, global_device_count=devices, num_sc_per_device=nsc)
    elif layout["stacking"] == "tpu_embed":
        for name, st in layout["stacks"].items():
            tables = [t["name"] for t in st["tables"]]
            if len(tables) > 1:
                table_stacking.stack_tables(feature_specs, tables, global_device_count=devices,
                                            num_sc_per_device=nsc, stack_name=name)
    embedding.prepare_feature_specs_for_training(feature_specs, global_device_count=devices, num_sc_per_device=nsc)


def apply_limits(feature_specs: Any, source: Source, *, num_sc_per_device: Optional[int] = None
                 ) -> Dict[str, StackLimits]:
    """Set `max_ids_per_partition`, `max_unique_ids_per_partition` and `suggested_coo_buffer_size_per_device` on
    the `StackedTableSpec` of every stacked `FeatureSpec` in `feature_specs` (in place, as
    `embedding.update_preprocessing_parameters` does); returns the limits set, per stack.

    `source`: a directory written by `tpu-embed plan --format jax-fdo` (its stacking is checked against the
    specs first), or a mapping {stack name: StackLimits or a dict of those three keys}."""
    import jax

    leaves = jax.tree.leaves(feature_specs)
    unstacked = [f.name for f in leaves if not f.table_spec.is_stacked()]
    if unstacked:
        raise ValueError(f"feature specs {unstacked[:3]} are not stacked yet: call tpu_embed.jax.limits."
                         "stack_tables (or jax's prepare_feature_specs_for_training) first")
    if isinstance(source, Mapping):
        limits = {str(k): StackLimits.of(v) for k, v in source.items()}
    else:
        layout = read_layout(source)
        check_layout(leaves, layout, num_sc_per_device)
        limits = read_limits(source, num_sc_per_device or int(layout["num_sc_per_device"]))
    stacks = {f.table_spec.stacked_table_spec.stack_name for f in leaves}
    missing = sorted(stacks - set(limits))
    if missing:
        raise ValueError(f"no limits for the stacked tables {missing[:3]} (limits are given for {sorted(limits)[:5]})")
    for f in leaves:
        sts = f.table_spec.stacked_table_spec
        lim = limits[sts.stack_name]
        buf = lim.suggested_coo_buffer_size_per_device
        f.table_spec.stacked_table_spec = dataclasses.replace(
            sts, max_ids_per_partition=lim.max_ids_per_partition,
            max_unique_ids_per_partition=lim.max_unique_ids_per_partition,
            suggested_coo_buffer_size_per_device=sts.suggested_coo_buffer_size_per_device if buf is None else buf)
    return {s: limits[s] for s in sorted(stacks)}


def check_layout(feature_specs: List[Any], layout: Mapping[str, Any], num_sc_per_device: Optional[int] = None
                 ) -> None:
    """Raise ValueError, naming the first difference, unless stacked `feature_specs` (a flat list) are stacked
    as `layout` (`tpu_embed_jax_fdo.json`) records: the same stacks with the same tables at the same row
    offsets and rotations, and the same features, each on its table with the same global samples."""
    nsc = int(layout["num_sc_per_device"])
    if num_sc_per_device is not None and int(num_sc_per_device) != nsc:
        raise ValueError(f"the figures are for {nsc} SparseCores per device, not {num_sc_per_device}")
    S = int(layout["num_sparse_cores"])
    want_stacks = layout["stacks"]
    seen: Dict[str, set] = {}
    for f in feature_specs:
        ts = f.table_spec
        stack = ts.stacked_table_spec.stack_name
        where = f"feature {f.name!r} (stacked table {stack!r})"
        if stack not in want_stacks:
            raise ValueError(f"{where}: the figures hold no stacked table of that name; theirs are "
                             f"{sorted(want_stacks)[:5]} ({layout['stacking']} stacking)")
        st = want_stacks[stack]
        table = next((t for t in st["tables"] if t["name"] == ts.name), None)
        if table is None:
            raise ValueError(f"{where}: table {ts.name!r} is not in that stack of the figures, whose tables are "
                             f"{[t['name'] for t in st['tables']]}")
        s = ts.setting_in_stack
        got = (s.row_offset_in_shard, s.shard_rotation, s.padded_vocab_size, ts.vocabulary_size)
        want = (table["row_offset_in_shard"], table["shard_rotation"], table["padded_vocabulary_size"],
                table["vocabulary_size"])
        if tuple(int(x) for x in got) != tuple(int(x) for x in want):
            raise ValueError(f"{where}: table {ts.name!r} has (row offset in shard, rotation, padded vocabulary, "
                             f"vocabulary) {got}, the figures were counted with {want}")
        idt = f.id_transformation
        if (int(idt.col_offset), int(idt.col_shift)) != (int(table["row_offset_in_shard"]) * S,
                                                        int(table["shard_rotation"])):
            raise ValueError(f"{where}: its id transformation (col_offset {idt.col_offset}, col_shift "
                             f"{idt.col_shift}) is not the stack's placement of table {ts.name!r}")
        feat = next((x for x in st["features"] if x["name"] == f.name), None)
        if feat is None:
            raise ValueError(f"{where}: the figures have no feature of that name in the stack; theirs are "
                             f"{[x['name'] for x in st['features']][:5]}")
        samples = math.prod(int(d) for d in f.output_shape[:-1])
        if feat["table"] != ts.name or samples != int(feat["global_samples"]):
            raise ValueError(f"{where}: looks up {ts.name!r} with {samples} samples per global batch; the figures "
                             f"were counted for {feat['table']!r} with {feat['global_samples']}")
        seen.setdefault(stack, set()).add(f.name)
    for stack, st in want_stacks.items():
        want_features = {x["name"] for x in st["features"]}
        if seen.get(stack, set()) != want_features:
            lacking = sorted(want_features - seen.get(stack, set()))
            raise ValueError(f"stacked table {stack!r}: the figures count the features {lacking[:3]} too, which the "
                             "feature specs lack")
