"""A profile as jax-tpu-embedding's FDO statistics: the files its `NPZFileFDOClient` loads.

jax-tpu-embedding (0.2.0) learns its SparseCore limits online: every process records the statistics that
`embedding.preprocess_sparse_dense_matmul_input` returns per step, publishes them as
`fdo_stats_<process>_<timestamp>.npz`, and `NPZFileFDOClient.load()` takes, per key, the element-wise maximum
over the newest file of each process; `embedding.update_preprocessing_parameters` then sets, per stacked
table, `max_ids_per_partition` = the maximum of `<stack>_max_ids`, `max_unique_ids_per_partition` = that of
`<stack>_max_unique_ids`, and `suggested_coo_buffer_size_per_device` = the maximum of
`<stack>_required_buffer_size` times the SparseCores per device.

What jax counts, read from its C++ (`StatsPerHost`, `GroupAndDeduplicateCooTensorsForLocalSparseCore`):

* a process's features are its local batch; each feature's rows are split in contiguous blocks over the
  local devices, then over each device's SparseCores, exactly as TensorFlow splits a chip's samples (the
  shards' hosts own consecutive chips, and consecutive examples within them);
* ids become columns `((id + col_shift) & (S-1)) + (id & ~(S-1)) + col_offset` and go to SparseCore
  `column & (S-1)` (S = all SparseCores), with TF's rotation of one device per table in a stack;
* equal (sample, column) pairs count once; `<stack>_max_ids` is `[local devices x S]`, row-major: for every
  (local device, destination SparseCore) the most ids any of the device's SparseCores sends there; the
  unique ids likewise; `<stack>_required_buffer_size` is `[local devices x SCs per device]`: per SparseCore,
  the sum over destinations of its ids rounded up to 8.

That is a profile's cell (chip, local SC, destination SC), so the profile's per-partition maxima
(`PartitionStats.partition_max_ids`, ..., kept over every step) are jax's figures for a stacking whose stacks
have the same tables in the same order as the profile's: `tpu_embed` (TensorFlow's stacking, which jax can
reproduce with `table_stacking.stack_tables` and the same names: see `tpu_embed.jax.limits.stack_tables`),
`none` (every table its own stack, named by the table, as `embedding.prepare_feature_specs_for_training`
leaves unstacked tables) or `jax` (`auto_stack_tables`, as `tpu_embed.sparsecore.jax_layout.jax_layout` computes it),
whose stacks the profile counted where they are one table or a profiled stack's tables in its order.

An artifact whose shards have the jax layout (`artifact_jax_fdo_stats`) records in its manifest, per jax stack
it was written with, the maxima of jax's statistics over every step and host (`tpu_embed.artifact.jax_records
.STATIC_SIZES`): exactly the limits `update_preprocessing_parameters` makes of those steps' statistics. Its
FDO files cover every stack of its own stacking: a stack the profile counted over the artifact's own steps
(the same maxima) gets the profile's per-partition arrays; any other the manifest's maxima, in every
partition (`JaxStack.source` says which; jax's update takes the maximum, so the limits are the same exact
figures, the spread over partitions is not recorded).

Besides the NPZ files, `tpu_embed_jax_fdo.json` records the layout the figures hold for (stacks, tables,
rotations, features and their global samples, topology), which `tpu_embed.jax.limits.apply_limits` checks
against the user's feature specs; jax's client reads only `fdo_stats*.npz`.
"""

from __future__ import annotations

import dataclasses
import io
import json
import time
import zipfile
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from profiles.errors import ProfileError
from profiles.jsonio import dumps_readable
from profiles.profile import Profile
from profiles.stats import PartitionStats
from tpu_embed.artifact import io as tio
from tpu_embed.core.model import ModelConfig
from tpu_embed.core.topology import Topology
from tpu_embed.jax.limits import FORMAT, SIDECAR, SUFFIX_MAX_IDS, SUFFIX_MAX_UNIQUE_IDS, SUFFIX_REQUIRED_BUFFER_SIZE
from tpu_embed.sparsecore import layout_of

STACKINGS = ("tpu_embed", "none", "jax")
VERSION = 1
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed: the same statistics give the same bytes


@dataclasses.dataclass(frozen=True)
class JaxStack:
    """One of jax's stacked tables: its layout and the profile's per-partition maxima for it."""

    name: str
    tables: Tuple[dict, ...]  # {name, vocabulary_size, padded_vocabulary_size, dim, combiner, row_offset_in_shard,
    #                           shard_rotation}, in stack order
    features: Tuple[dict, ...]  # {name, table, global_samples}, flattened feature order
    max_ids: np.ndarray  # [chips, S]
    max_unique_ids: np.ndarray  # [chips, S]
    required_buffer_size: np.ndarray  # [chips, SCs per chip]
    source: str = "profile"  # "profile": its per-partition maxima; "manifest": the artifact's recorded maxima in
    #                          every partition (`artifact_jax_fdo_stats`)

    def limits(self, num_sc_per_chip: int) -> Dict[str, int]:
        """What `embedding.update_preprocessing_parameters` sets from these statistics."""
        return {"max_ids_per_partition": int(self.max_ids.max()),
                "max_unique_ids_per_partition": int(self.max_unique_ids.max()),
                "suggested_coo_buffer_size_per_device": int(self.required_buffer_size.max()) * num_sc_per_chip}


@dataclasses.dataclass(frozen=True)
class JaxFdoStats:
    """jax-tpu-embedding's FDO statistics of one profile under one stacking."""

    model: ModelConfig
    stacking: str
    steps: int
    stacks: Dict[str, JaxStack]
    artifact: Optional[dict] = None  # {directory, spec_fingerprint[, window]} of `artifact_jax_fdo_stats`'s artifact
    #                                  (the newest day of a window, and the window's days)

    @property
    def num_hosts(self) -> int:
        return self.model.topology.num_hosts

    def host_arrays(self, host: int) -> Dict[str, np.ndarray]:
        """What process `host` would publish: per stack, its local devices' rows, flattened row-major, int32
        (the dtype of jax's statistics)."""
        t = self.model.topology
        if not 0 <= host < t.num_hosts:
            raise ValueError(f"host {host} is not in 0..{t.num_hosts - 1}")
        rows = slice(host * t.chips_per_host, (host + 1) * t.chips_per_host)
        out: Dict[str, np.ndarray] = {}
        for name, s in self.stacks.items():
            out[name + SUFFIX_MAX_IDS] = _int32(s.max_ids[rows])
            out[name + SUFFIX_MAX_UNIQUE_IDS] = _int32(s.max_unique_ids[rows])
            out[name + SUFFIX_REQUIRED_BUFFER_SIZE] = _int32(s.required_buffer_size[rows])
        return out

    def limits(self) -> Dict[str, Dict[str, int]]:
        nsc = self.model.topology.num_sc_per_chip
        return {name: s.limits(nsc) for name, s in self.stacks.items()}

    def to_json(self, files: List[str]) -> dict:
        t = self.model.topology
        return {
            "format": FORMAT, "version": VERSION, "model_key": self.model.key, "steps": self.steps,
            "stacking": self.stacking,
            "topology": {"num_chips": t.num_chips, "num_sc_per_chip": t.num_sc_per_chip, "num_hosts": t.num_hosts},
            "global_device_count": t.num_chips, "local_device_count": t.chips_per_host,
            "num_sc_per_device": t.num_sc_per_chip, "num_sparse_cores": t.num_sparse_cores,
            "files": list(files), "artifact": self.artifact,
            "stacks": {name: {"tables": list(s.tables), "features": list(s.features),
                              "limits": s.limits(t.num_sc_per_chip), "source": s.source}
                       for name, s in self.stacks.items()},
        }


def _int32(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, np.int64).reshape(-1)
    if a.size and int(a.max()) > np.iinfo(np.int32).max:
        raise ProfileError(f"a per-partition figure ({int(a.max())}) does not fit jax's int32 statistics")
    return a.astype(np.int32)


def jax_fdo_stats(profile: Profile, stacking: str = "tpu_embed") -> JaxFdoStats:
    """jax's FDO statistics of `profile` for `stacking` ('tpu_embed': the profile's own stacks; 'none': one
    stack per table).  Raises `ProfileError` where a figure cannot be exact."""
    if stacking not in STACKINGS:
        raise ValueError(f"stacking {stacking!r}: expected one of {', '.join(STACKINGS)}")
    model = profile.model
    topo = model.topology
    if profile.steps == 0:
        raise ProfileError("the profile covers no steps: there is nothing to give jax-tpu-embedding")
    nsc = topo.num_sc_per_chip
    for f in model.features:
        if f.samples % nsc:
            raise ProfileError(
                f"feature {f.name!r}: its {f.samples} samples per chip do not split evenly over {nsc} SparseCores, "
                "as jax-tpu-embedding's preprocessing requires")
    if stacking == "jax":
        return JaxFdoStats(model, stacking, profile.steps, _jax_auto_stacks(profile))
    layout = layout_of(model, disable_table_stacking=stacking == "none")
    acc = profile.accumulator
    stacks: Dict[str, JaxStack] = {}
    for name, st in layout.stacks.items():
        tables = [layout.tables[t] for t in st.tables]
        combiners = {tp.combiner for tp in tables}
        if len(combiners) > 1:
            members = ", ".join(f"{tp.name}: {tp.combiner}" for tp in tables)
            raise ProfileError(
                f"stack {name!r} mixes combiners ({members}) and jax-tpu-embedding stacks only tables of one "
                f"combiner: use the 'jax' stacking ({_JAX_FROM_ARTIFACT}) or 'none' (one stack per table)")
        stats = acc.tables[st.tables[0]].partitions if stacking == "none" else acc.stacks[name]
        stacks[name] = _stack(
            name, stats,
            tuple({"name": tp.name, "vocabulary_size": tp.vocabulary_size,
                   "padded_vocabulary_size": tp.padded_vocabulary_size, "dim": tp.dim, "padded_dim": tp.padded_dim,
                   "combiner": tp.combiner, "row_offset_in_shard": tp.shard_row_offset,
                   "shard_rotation": tp.rotation} for tp in tables),
            tuple({"name": f.path, "table": f.table, "global_samples": f.sample_count * topo.num_chips}
                  for f in layout.stack_features(name)))
    return JaxFdoStats(model, stacking, profile.steps, stacks)


def _stack(name: str, stats: PartitionStats, tables: Tuple[dict, ...], features: Tuple[dict, ...]) -> JaxStack:
    _check_per_partition(name, stats)
    assert stats.partition_max_ids is not None and stats.partition_max_unique_ids is not None
    assert stats.sc_max_buffer is not None
    if not stats.partition_max_ids.any():
        raise ProfileError(
            f"stacked table {name!r} received no ids in the {stats.steps} profiled steps: its exact limits are 0, "
            "on which jax-tpu-embedding's preprocessing aborts (a COO buffer of 0); profile data that looks it up")
    return JaxStack(name=name, tables=tables, features=features, max_ids=stats.partition_max_ids.copy(),
                    max_unique_ids=stats.partition_max_unique_ids.copy(),
                    required_buffer_size=stats.sc_max_buffer.copy())


# Where the figures of jax's own stacking come from when the profile did not count a stack.
_JAX_FROM_ARTIFACT = ("`--artifact DIR` of an artifact with `shards: {layout: jax}`, whose manifest records every "
                      "stack of jax's stacking")


def _profiled(profile: Profile, members: Tuple[str, ...], rotations: List[int]) -> Optional[PartitionStats]:
    """The profile's per-step counts of a jax stack of these tables at these rotations, where it counted them: one
    table at rotation 0 (the table's own), or a profiled stack with the same tables in the same order (hence the
    same rotations and row offsets); else None."""
    tf_layout = layout_of(profile.model)
    tf_name = next((name for name, st in tf_layout.stacks.items() if tuple(st.tables) == members), None)
    if len(members) == 1 and rotations == [0]:
        return profile.accumulator.tables[members[0]].partitions
    if tf_name is not None and rotations == [tf_layout.tables[t].rotation for t in members]:
        return profile.accumulator.stacks[tf_name]
    return None


def _jax_auto_stacks(profile: Profile) -> Dict[str, JaxStack]:
    """jax's `auto_stack_tables` (`tpu_embed.sparsecore.jax_layout.jax_layout`), each stack from the profile's counts
    (`_profiled`); a stack the profile did not count is refused."""
    from tpu_embed.sparsecore.jax_layout import jax_layout
    model = profile.model
    S = model.topology.num_sparse_cores
    out: Dict[str, JaxStack] = {}
    for js in jax_layout(model).stacks:
        members = tuple(t.name for t in js.tables)
        stats = _profiled(profile, members, [t.shard_rotation for t in js.tables])
        if stats is None:
            raise ProfileError(
                f"jax's auto-stacked table {js.name!r} ({', '.join(members)}) is no stack the profile counted (its "
                f"stacks follow TensorFlow's grouping and order): use {_JAX_FROM_ARTIFACT}, or the 'none' stacking")
        out[js.name] = _stack(
            js.name, stats,
            tuple({"name": t.name, "vocabulary_size": t.vocabulary_size,
                   "padded_vocabulary_size": t.padded_vocabulary_size, "dim": t.dim, "padded_dim": t.padded_dim,
                   "combiner": js.combiner, "row_offset_in_shard": t.row_offset_in_shard,
                   "shard_rotation": t.shard_rotation} for t in js.tables),
            tuple({"name": f.name, "table": f.table, "global_samples": f.samples_per_sc * S} for f in js.features))
    return out


def artifact_jax_fdo_stats(artifact_dir: Union[str, Sequence[str]], profile: Optional[Profile] = None
                           ) -> JaxFdoStats:
    """jax's FDO statistics for the stacking the jax shards of `artifact_dir` were written with (the stacks its
    manifest records, `shards.format.jax`), every stack exact: the profile's per-partition arrays where `profile`
    (of the artifact's model) counted the stack over the artifact's own steps, i.e. with the maxima the manifest
    records; else the manifest's maxima in every partition.  Raises `ProfileError` for an artifact without the
    jax layout, a profile of another model, and a stack no step looked up (its exact limits are 0).

    `artifact_dir` may be a window of days of one lineage, oldest first (as `tpu_embed.jax.input_iterator`
    reads one, checked as it checks it): each stack's maxima are then the largest of the days'
    (`tpu_embed.jax.input.window_jax_format`), and the profile counts the window's steps where it covers
    exactly those days (a lineage day's profile merged with its bases')."""
    from tpu_embed.artifact.lineage import window  # reads manifests and the spec, not the shards
    from tpu_embed.artifact.load import load_artifact
    from tpu_embed.artifact.manifest import ManifestError
    from tpu_embed.jax.input import window_jax_format

    try:
        dirs, manifests = window(artifact_dir)
        fj = window_jax_format(dirs, manifests) if len(dirs) > 1 else manifests[0].shard_format.jax
    except ManifestError as e:
        raise ProfileError(str(e)) from None
    where = dirs[-1] if len(dirs) == 1 else f"the window {dirs[0]} .. {dirs[-1]}"
    art = load_artifact(dirs[-1], verify="none")
    if fj is None:
        raise ProfileError(
            f"{where}: its shards hold no jax-tpu-embedding arrays, so no stacking of jax's was recorded: "
            "plan from its profile alone (--profiles, without --artifact), or add `shards: {layout: jax}` to the "
            "spec and run `tpu-embed run` again")
    model, topo = art.model, art.model.topology
    if profile is not None and profile.model.key != model.key:
        raise ProfileError(
            f"the profile is of another configuration ({profile.model.key}) than {where} ({model.key}): "
            "give --profiles the artifact's own profile directory, or none")
    steps = sum(int(m.shards.steps) if m.shards is not None else 0 for m in manifests)
    own = profile if profile is not None and profile.steps == steps else None  # covers the artifact's steps alone
    stacks = {st["name"]: _artifact_stack(st, topo, own, where, steps) for st in fj["stacks"]}
    recorded_by: Dict[str, Any] = {"directory": dirs[-1], "spec_fingerprint": art.manifest.spec_fingerprint}
    if len(dirs) > 1:
        recorded_by["window"] = list(dirs)
    return JaxFdoStats(model, "jax", steps, stacks, artifact=recorded_by)


def _artifact_stack(st: Mapping[str, Any], topo: Topology, own: Optional[Profile], where: str, steps: int
                    ) -> JaxStack:
    """One jax stack an artifact's manifest records (`st`): the profile's per-partition arrays where `own` counted
    it with the maxima the manifest records, else those maxima in every partition."""
    name = st["name"]
    S, nsc = topo.num_sparse_cores, topo.num_sc_per_chip
    tables = tuple({"name": t["name"], "vocabulary_size": t["vocabulary_size"],
                    "padded_vocabulary_size": t["padded_vocabulary_size"], "dim": t["dim"],
                    "padded_dim": t["padded_dim"], "combiner": st["combiner"],
                    "row_offset_in_shard": t["row_offset_in_shard"], "shard_rotation": t["shard_rotation"]}
                   for t in st["tables"])
    features = tuple({"name": f["name"], "table": f["table"], "global_samples": int(f["samples_per_sc"]) * S}
                     for f in st["features"])
    recorded: Tuple[Any, ...] = (st.get("max_ids_per_partition"), st.get("max_unique_ids_per_partition"),
                                 st.get("coo_buffer_size_per_device"))
    counted = None
    if own is not None:
        counted = _profiled(own, tuple(t["name"] for t in tables), [int(t["shard_rotation"]) for t in tables])
    if counted is not None and counted.has_per_partition and recorded == _maxima(counted, nsc):
        return _stack(name, counted, tables, features)
    if None in recorded:
        raise ProfileError(
            f"{where}: its manifest records no maxima of jax stack {name!r} (its shards cover no step)"
            f"{'' if counted is None else ' and the profile counts other steps'}: run `tpu-embed run` over "
            "data for it again")
    max_ids, max_unique, coo = (int(x) for x in recorded)
    if max_ids == 0:
        raise ProfileError(
            f"stacked table {name!r} received no ids in the {steps} steps of {where}: its exact limits "
            "are 0, on which jax-tpu-embedding's preprocessing aborts (a COO buffer of 0); shard data that "
            "looks it up")
    return JaxStack(
        name=name, tables=tables, features=features,
        max_ids=np.full((topo.num_chips, S), max_ids, np.int64),
        max_unique_ids=np.full((topo.num_chips, S), max_unique, np.int64),
        required_buffer_size=np.full((topo.num_chips, nsc), coo // nsc, np.int64), source="manifest")


def _maxima(stats: PartitionStats, nsc: int) -> Tuple[Optional[int], ...]:
    """(max_ids_per_partition, max_unique_ids_per_partition, suggested_coo_buffer_size_per_device) of the counts,
    as the manifest records them for a jax stack."""
    assert stats.partition_max_ids is not None and stats.partition_max_unique_ids is not None
    assert stats.sc_max_buffer is not None
    return (int(stats.partition_max_ids.max()), int(stats.partition_max_unique_ids.max()),
            int(stats.sc_max_buffer.max()) * nsc)


def _check_per_partition(name: str, stats: PartitionStats) -> None:
    if not stats.has_per_partition:
        raise ProfileError(
            f"the profile of {name!r} keeps no per-partition maxima (it was written before tpu_embed kept "
            "them, or merged with such a profile): re-run the profile job")


# ---------------------------------------------------------------- files

def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """`numpy.savez`'s format (what `numpy.load` reads), with fixed zip times and sorted keys: deterministic."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for key in sorted(arrays):
            entry = io.BytesIO()
            np.lib.format.write_array(entry, np.ascontiguousarray(arrays[key]), allow_pickle=False)
            zf.writestr(zipfile.ZipInfo(key + ".npy", date_time=_ZIP_TIME), entry.getvalue())
    return buf.getvalue()


def fdo_stats(source: Union[Profile, str, None], stacking: str = "tpu_embed", *, model: Optional[str] = None,
              artifact: Union[str, Sequence[str], None] = None) -> JaxFdoStats:
    """The statistics `write_jax_fdo` writes.

    `source`: a `Profile`, a profile directory (`model`: its key or prefix when it holds several), or None.
    Without `artifact`: `jax_fdo_stats(profile, stacking)`.  With `artifact` (an artifact directory, or a window
    of days, oldest first): for the 'jax' stacking, `artifact_jax_fdo_stats` of it, with the profile (`source`,
    else the (newest) artifact's own profile directory where it has one) for the per-partition arrays of the
    stacks it counted; for another stacking, the profile (`source`, else the artifact's), which must be of the
    artifact's model."""
    newest = None if artifact is None else artifact if isinstance(artifact, str) else list(artifact)[-1]
    if isinstance(source, Profile):
        profile: Optional[Profile] = source
    else:
        directory = source if source is not None else (artifact_profile_directory(newest) if newest else None)
        profile = None
        if directory is not None:
            from profiles.store import ProfileStore  # the store's reader only where a directory is given
            profile = ProfileStore(str(directory)).read(model=model)
    if artifact is not None and stacking == "jax":
        return artifact_jax_fdo_stats(artifact, profile)
    if profile is None:
        raise ProfileError(
            f"{newest}: no profile to plan the {stacking!r} stacking from (its spec has no profile_data_directory, "
            "or the directory is gone): give --profiles DIR, or use the 'jax' stacking, which its manifest covers"
            if newest is not None else "no profile given: give --profiles DIR (or --artifact DIR)")
    if newest is not None:
        from tpu_embed.artifact.load import load_artifact
        key = load_artifact(newest, verify="none").model.key
        if profile.model.key != key:
            raise ProfileError(f"the profile is of another configuration ({profile.model.key}) than {newest} "
                               f"({key}): give --profiles the artifact's own profile directory")
    return jax_fdo_stats(profile, stacking)


def artifact_profile_directory(artifact_dir: str) -> Optional[str]:
    """The profile directory an artifact's manifest records (joined to the artifact when relative), where it
    exists; else None."""
    from tpu_embed.artifact.manifest import read_manifest
    info = read_manifest(artifact_dir).profile
    if info is None:
        return None
    d = info.directory if tio.is_absolute(info.directory) else tio.join(artifact_dir, info.directory)
    return d if tio.exists(d) else None


def write_jax_fdo(source: Union[Profile, str, None, JaxFdoStats], output_dir: str, *, stacking: str = "tpu_embed",
                  model: Optional[str] = None, timestamp_ns: Optional[int] = None,
                  artifact: Union[str, Sequence[str], None] = None) -> Tuple[JaxFdoStats, List[str]]:
    """Write `fdo_stats_<host>_<timestamp>.npz` per host of the profile's topology, then `tpu_embed_jax_fdo.json`,
    into `output_dir`; returns the statistics and the paths written.

    `source`, `stacking`, `model`, `artifact`: as for `fdo_stats` (or `source` the `JaxFdoStats` to write).  Each
    file is written atomically.  The files this function wrote there before (listed by the earlier
    `tpu_embed_jax_fdo.json`) are removed after the new ones are in place; any other `fdo_stats*.npz` there is
    refused, since jax's client would merge it with these.
    """
    stats = source if isinstance(source, JaxFdoStats) else fdo_stats(source, stacking, model=model,
                                                                      artifact=artifact)
    previous = _previous_files(output_dir)
    ts = time.time_ns() if timestamp_ns is None else int(timestamp_ns)
    tio.makedirs(output_dir)
    paths, names = [], []
    for host in range(stats.num_hosts):
        name = f"fdo_stats_{host}_{ts}.npz"
        path = tio.join(output_dir, name)
        tio.write_atomic(path, npz_bytes(stats.host_arrays(host)))
        paths.append(path)
        names.append(name)
    sidecar = tio.join(output_dir, SIDECAR)
    tio.write_text_atomic(sidecar, dumps_readable(stats.to_json(names)))
    paths.append(sidecar)
    for name in previous:
        if name not in names:
            tio.delete(tio.join(output_dir, name))
    return stats, paths


def _previous_files(output_dir: str) -> List[str]:
    """The FDO files of an earlier `write_jax_fdo` there; refuses a directory with anyone else's."""
    present = sorted(tio.basename(p) for p in tio.glob(tio.join(output_dir, "fdo_stats*.npz")))
    ours: List[str] = []
    sidecar = tio.join(output_dir, SIDECAR)
    if tio.exists(sidecar):
        try:
            ours = list(json.loads(tio.read_text(sidecar)).get("files", []))
        except (ValueError, AttributeError):
            ours = []
    foreign = [n for n in present if n not in ours]
    if foreign:
        raise ProfileError(
            f"{output_dir} already holds FDO statistics tpu_embed did not write ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}): jax's client would merge them with these; "
            "write to an empty directory")
    return ours
