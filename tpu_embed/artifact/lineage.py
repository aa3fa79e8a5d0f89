"""Lineages of artifacts: vocabularies that keep their ids from one day to the next (modes append / frozen).

    base = open_base("build/day1", spec)          # the previous artifact, checked against this spec
    base.tokens("C1"), base.last_days("C1")       # its vocabulary in id order, each token's last day seen
    read_token_counts("build/day2", "C1")         # pyarrow Table(token, id, count, last_day)
    check_same_lineage(["build/day1", "build/day2"])
    dirs, manifests = window(["build/day1", "build/day2"])   # what a reader (input_fn, jax's input_iterator)
                                                   # reads: one artifact, or a window of days (check_window)

A vocabulary of mode `append` or `frozen` writes, beside its vocabulary file(s), one token-count file per
vocabulary key, `vocab/<key>.counts.parquet` (`counts_filename`): a Parquet table with the columns

* `token` (large_binary), `id` (int64), `count` (int64), `last_day` (int64);
* first the vocabulary's tokens in id order (`id` = 0, 1, ...: the lines of the vocabulary file), then every
  other token counted in the lineage (`id` = -1: out of vocabulary), ordered as `tft.vocabulary` orders
  (count descending, then token bytes descending);
* `count`: occurrences over the lineage: the base's count plus those in this artifact's data (the first
  day: its data only), so a day's run counts its own data and still holds every day's counts;
  `last_day`: the last day the token was seen (this day if counted here, else the base's);
* a token counted on an earlier day and not in the vocabulary stays in the file (id -1) with its count.

A day is an integer: by default the artifact's index in its lineage (1 for the first day, the base's day + 1
after it); `--day N` numbers days otherwise (e.g. days since an epoch, so that a skipped day leaves a gap),
increasing along the lineage.

The manifest's `lineage` section (`tpu_embed.artifact.manifest.LineageInfo`) records the day, the
vocabulary fingerprint (a sha256 over the day, the base's fingerprint, the spec's fingerprint and the
sha256 of every vocabulary and token-count file), the base (its path, day and vocabulary fingerprint) and
the lineage id (the first day's fingerprint, inherited). Artifacts of one lineage share the id; each names
its base's fingerprint, so a chain can be checked link by link.

Needs pyarrow, no TensorFlow and no Beam.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tpu_embed.artifact import io as tio
from tpu_embed.artifact import verify
from tpu_embed.artifact.load import load_spec_of
from tpu_embed.artifact.manifest import Manifest, ManifestError, read_manifest
from tpu_embed.artifact.shard_format import ShardFormat
from tpu_embed.core.canonical import fingerprint as _fingerprint

COUNTS_SUFFIX = ".counts.parquet"
COUNTS_KIND = "token_counts"
COUNTS_SCHEMA = pa.schema([("token", pa.large_binary()), ("id", pa.int64()), ("count", pa.int64()),
                           ("last_day", pa.int64())])
FIRST_DAY = 1
LINEAGE_ID_CHARS = 32

ArtifactDirs = Union[str, Sequence[str]]  # one artifact, or a window of days of one lineage (oldest first)


class LineageError(ManifestError):
    """A base artifact that this run cannot continue, or artifacts of different lineages; one line with the fix."""


# The files of a base that a run reads or relies on, checked against the base's manifest before a job runs
# (`check_base_files`): its vocabulary and token-count files always (the new day's ids continue them, and a
# serving model of the base's day maps with them); its transform output and its profile where they are there
# (the run takes its graph from the one and merges the other; without them it builds the graph and leaves the
# profile unmerged, as the manifest then says).
BASE_KINDS = ("vocabulary", COUNTS_KIND)
BASE_KINDS_WHERE_PRESENT = ("transform_output", "profile")
_BASE_FIX = ("A base must be as its day's run wrote it: restore it from a copy, or re-make that day (its "
             "`tpu-embed run` with --overwrite) and pass it again.")


def counts_filename(key: str) -> str:
    """The token-count file of vocabulary key `key`, under the artifact's `vocab/`."""
    return f"{key}{COUNTS_SUFFIX}"


def token_counts_bytes(table: pa.Table) -> bytes:
    """The bytes of a token-count file: `table` (columns as `COUNTS_SCHEMA`) as Parquet, written the same way
    every time (one row group, zstd, no statistics), so the same rows give the same bytes."""
    table = table.cast(COUNTS_SCHEMA)
    sink = pa.BufferOutputStream()  # not a Python file object: Arrow's threads would call back into Python
    pq.write_table(table, sink, compression="zstd", use_dictionary=False, write_statistics=False,
                   row_group_size=max(1, table.num_rows), version="2.6")
    return sink.getvalue().to_pybytes()


def parse_token_counts(data: bytes, source: str = "<token counts>") -> pa.Table:
    try:
        # ParquetFile.read, not pq.read_table: read_table scans through Arrow's dataset layer, whose readahead
        # starts Arrow's thread pools even with use_threads=False, and a pool worker alive when the process
        # exits can abort it ("terminate called without an active exception", exit 134).
        table = pq.ParquetFile(pa.BufferReader(data), pre_buffer=False).read(use_threads=False)
    except (pa.ArrowInvalid, OSError) as e:
        raise ManifestError(f"{source} is not a token-count file ({e}): the artifact is damaged; re-run the "
                            "job that wrote it.") from None
    if table.schema.remove_metadata() != COUNTS_SCHEMA:
        raise ManifestError(f"{source} has columns {table.schema.names}, not {COUNTS_SCHEMA.names}: it was not "
                            "written by this tpu_embed.")
    return table


def read_token_counts(artifact_dir: str, key: str) -> pa.Table:
    """The token-count file of `key` in an artifact: Table(token, id, count, last_day), vocabulary rows first."""
    path = tio.join(artifact_dir, "vocab", counts_filename(key))
    try:
        data = tio.read_bytes(path)
    except FileNotFoundError:
        raise ManifestError(f"{path} is missing: the artifact is incomplete (or its vocabulary {key!r} has mode "
                            "rebuild, which records no counts).") from None
    return parse_token_counts(data, path)


def vocabulary_fingerprint(files: Sequence[Mapping], spec_fingerprint: str, day: int,
                           base_fingerprint: Optional[str]) -> str:
    """sha256 over the day, the base's fingerprint, the spec's and every vocabulary and token-count file
    (path and sha256; manifest file entries)."""
    entries = sorted((f["path"], f["sha256"]) for f in files if f.get("kind") in ("vocabulary", COUNTS_KIND))
    return _fingerprint({"spec": spec_fingerprint, "day": day, "base": base_fingerprint,
                         "files": [list(e) for e in entries]})


def lineage_seed(base: Optional["BaseArtifact"], day: int, path: Optional[str] = None) -> dict:
    """What the vocabulary job needs of its lineage: the day and the base (its
    directory, the path recorded for it, its day, fingerprint, lineage id and vocabulary sizes)."""
    if base is None:
        return {"day": day, "base": None}
    lin = base.lineage
    return {"day": day, "base": {"directory": base.directory, "path": path or base.directory, "day": lin.day,
                                 "vocabulary_fingerprint": lin.vocabulary_fingerprint, "id": lin.id,
                                 "sizes": base.manifest.vocabulary_sizes}}


def lineage_section(seed: Mapping, files: Sequence[Mapping], spec_fingerprint: str, sizes: Mapping[str, int]) -> dict:
    """The manifest's `lineage` from the vocabulary job's seed (`lineage_seed`), the files it wrote and its
    vocabulary sizes (the rows before the OOV buckets)."""
    base = seed.get("base")
    fp = vocabulary_fingerprint(files, spec_fingerprint, seed["day"], base and base["vocabulary_fingerprint"])
    changed = [] if base is None else sorted(k for k in sizes if base["sizes"].get(k) != sizes[k])
    return {"id": base["id"] if base else fp[:LINEAGE_ID_CHARS], "day": seed["day"], "vocabulary_fingerprint": fp,
            "base": None if base is None else {k: base[k] for k in ("path", "day", "vocabulary_fingerprint")},
            "table_rows_changed": changed}


# ---------------------------------------------------------------- the base of a run

def _signature(spec_dict: Mapping) -> Dict[str, list]:
    """What a base and its successor must agree on: each feature's table and vocabulary type (with its OOV
    buckets / bucket count), and the tables' widths. Optimizers, thresholds, top_k and the mode may change."""
    def vocab(v):
        return [v["type"], v.get("num_oov_buckets") if v["type"] == "frequency" else v.get("num_buckets")]
    return {"features": [[f["name"], f["table"], *vocab(f["vocabulary"])] for f in spec_dict["categorical"]],
            "tables": [[t["name"], t["dim"]] for t in spec_dict["tables"]]}


def _first_difference(a: Mapping, b: Mapping) -> str:
    for part in ("features", "tables"):
        ia, ib = {x[0]: x for x in a[part]}, {x[0]: x for x in b[part]}
        for name in sorted(set(ia) | set(ib)):
            if ia.get(name) != ib.get(name):
                return f"{part[:-1]} {name!r}: base {ia.get(name)}, this spec {ib.get(name)}"
    return "the order of the features"


@dataclasses.dataclass(frozen=True)
class BaseArtifact:
    """The previous artifact of a lineage, as a run with `--base` reads it."""
    directory: str
    manifest: Manifest

    @property
    def lineage(self):
        assert self.manifest.lineage is not None
        return self.manifest.lineage

    def counts(self, key: str) -> pa.Table:
        """Its token counts of `key` (`read_token_counts`), checked against its manifest."""
        m = self.manifest
        entry = next((f for f in m.files if f.path == f"vocab/{counts_filename(key)}"), None)
        if entry is None:
            raise LineageError(f"base {self.directory}: its manifest lists no vocab/{counts_filename(key)}: the "
                               f"vocabulary {key!r} was not made with mode append or frozen there.")
        data = tio.read_bytes(tio.join(self.directory, entry.path))
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise LineageError(f"base {self.directory}: {entry.path} is not the file its manifest lists (sha256 "
                               "differs): the base artifact was changed or damaged. Restore it.")
        return parse_token_counts(data, tio.join(self.directory, entry.path))

    def token_counts(self, key: str) -> pa.Table:
        """Its token counts of `key` (`counts`), checked to hold its vocabulary's tokens first in id order and
        every other token after them (id -1)."""
        t = self.counts(key)
        n = int((self.manifest.vocabularies or {})[key].tokens or 0)
        ids = t.column("id").to_numpy()
        if n > t.num_rows or (ids[:n] != np.arange(n)).any() or (ids[n:] != -1).any():
            raise LineageError(f"base {self.directory}: vocab/{counts_filename(key)} does not hold the "
                               f"{n} tokens of its vocabulary in id order: the base artifact is damaged.")
        return t

    def vocabulary(self, key: str) -> pa.Table:
        """Table(token, last_day) of its vocabulary of `key`, in id order."""
        n = int((self.manifest.vocabularies or {})[key].tokens or 0)
        return self.token_counts(key).slice(0, n).select(["token", "last_day"])


def open_base(directory: str, spec, output: Optional[str] = None) -> BaseArtifact:
    """The base artifact of a run of `spec`, refused in one line (LineageError) when this run cannot continue
    it: no manifest, made with mode rebuild (no lineage), a file it relies on missing or not as its manifest
    lists it (`check_base_files`), another set of features / tables / OOV buckets,
    vocabulary keys of mode append or frozen that were not append or frozen there, a capacity below its
    tokens, or the run's own output directory."""
    if output is not None and tio.join(directory, "") == tio.join(output, ""):
        raise LineageError(f"--base {directory} is the run's --output: a day's artifact goes to a directory of its "
                           "own (the base must stay as it is).")
    try:
        m = read_manifest(directory)
    except ManifestError as e:
        raise LineageError(f"--base {directory}: {e}") from None
    if m.lineage is None or not m.vocabularies:
        raise LineageError(f"--base {directory} has no lineage: its vocabularies were made with mode rebuild (or "
                           "it has none). Make the first day with mode: append (and the capacity you want), then "
                           "pass that artifact as --base.")
    check_base_files(directory, m)
    base_spec = _base_spec_dict(directory, m)
    ours, theirs = _signature(spec.to_dict()), _signature(base_spec)
    if ours != theirs:
        raise LineageError(f"--base {directory} was made for other features or tables "
                           f"({_first_difference(theirs, ours)}): ids cannot continue across them. Use a base of "
                           "this spec's lineage, or start a new lineage without --base.")
    for key, feats in spec.lineage_groups().items():
        info = m.vocabularies.get(key)
        if info is None or info.mode is None:
            raise LineageError(f"--base {directory}: its vocabulary {key!r} was made with mode rebuild, so it "
                               f"records no counts to continue; run this spec's mode {feats[0].vocabulary.mode} "
                               "without --base to start a lineage.")
        cap = feats[0].vocabulary.capacity
        if cap is not None and int(info.tokens or 0) > cap:
            raise LineageError(f"vocabulary {key!r}: capacity {cap} is below the {info.tokens} tokens of the base "
                               f"{directory}: append keeps every base token. Raise capacity to at least "
                               f"{info.tokens}.")
    return BaseArtifact(directory, m)


def check_base_files(directory: str, m: Manifest) -> None:
    """The base's files of `BASE_KINDS` (and those of `BASE_KINDS_WHERE_PRESENT` that are there), each checked
    against the sha256 and size its manifest lists, as training checks an artifact's
    (`tpu_embed.artifact.verify.check_file`); LineageError in one line naming the file otherwise (its cause the
    `ArtifactDamagedError`). A profile outside the base's directory (an absolute or shared profile directory,
    which later runs may write) is left to the profile job, which merges it only where it fits."""
    for entry in m.files:
        if entry.kind in BASE_KINDS_WHERE_PRESENT:
            if entry.kind == "profile" and (tio.is_absolute(entry.path) or entry.path.startswith("..")):
                continue
            if not tio.exists(verify.path_of(directory, entry)):
                continue
        elif entry.kind not in BASE_KINDS:
            continue
        try:
            verify.check_file(directory, entry, "sha256", fix=_BASE_FIX)
        except verify.ArtifactDamagedError as e:
            raise LineageError(f"--base {directory} is damaged: {e}") from e


def _base_spec_dict(directory: str, m: Manifest) -> dict:
    try:
        return load_spec_of(directory, m).to_dict()  # its spec.yaml, checked against its manifest
    except ManifestError as e:
        raise LineageError(f"--base {directory}: {e}") from None


def next_day(base: Optional[BaseArtifact], day: Optional[int]) -> int:
    """The day of a run: `day` if given (after the base's), else the base's day + 1, else `FIRST_DAY`."""
    if base is None:
        if day is not None and day < 0:
            raise LineageError(f"--day {day}: days are integers >= 0.")
        return FIRST_DAY if day is None else day
    if day is None:
        return base.lineage.day + 1
    if day <= base.lineage.day:
        raise LineageError(f"--day {day} is not after the base's day {base.lineage.day} ({base.directory}): days "
                           "increase along a lineage.")
    return day


def check_same_lineage(artifact_dirs: Sequence[str]) -> List[Manifest]:
    """The manifests of artifacts that must belong to one lineage (a window of days, a remap between two
    days), in the order given; LineageError when one has no lineage or another lineage id, or when their
    days do not increase."""
    out: List[Manifest] = []
    for d in artifact_dirs:
        m = read_manifest(d)
        if m.lineage is None:
            raise LineageError(f"{d} belongs to no lineage (its vocabularies were made with mode rebuild): its ids "
                               "are not comparable with another day's.")
        if out:
            first, prev = out[0].lineage, out[-1].lineage
            assert first is not None and prev is not None
            if m.lineage.id != first.id:
                raise LineageError(f"{d} is of lineage {m.lineage.id[:12]}…, {artifact_dirs[0]} of lineage "
                                   f"{first.id[:12]}…: artifacts of unrelated lineages give the same token "
                                   "different ids. Use days of one lineage.")
            if m.lineage.day <= prev.day:
                raise LineageError(f"{d} (day {m.lineage.day}) does not come after {artifact_dirs[len(out) - 1]} "
                                   f"(day {prev.day}): give the days in order.")
        out.append(m)
    return out


# ---------------------------------------------------------------- windows of days

def _is_vocabulary_prefix(older_dir: str, older: Manifest, newest_dir: str, newest: Manifest, key: str) -> bool:
    """Whether the vocabulary file of `key` in `older` is the start of the one in `newest` (an empty vocabulary,
    whose file holds a dummy line, is the start of any): the first bytes of the newest day's file, as many as
    the older file has, hashed against the sha256 the older manifest lists for it."""
    info = (older.vocabularies or {})[key]
    if info.empty_vocabulary_dummy:
        return True
    entry = next((f for f in older.files if f.path == info.files[0]), None)
    if entry is None:
        raise LineageError(f"{older_dir}: its manifest lists no {info.files[0]}: the artifact is incomplete.")
    with tio.open_read(tio.join(newest_dir, (newest.vocabularies or {})[key].files[0])) as fh:
        head = fh.read(entry.bytes)
    return len(head) == entry.bytes and hashlib.sha256(head).hexdigest() == entry.sha256


def _layout_difference(a: Manifest, b: Manifest) -> Optional[str]:
    """What differs between two artifacts' models and layouts (None: nothing a reader of both depends on)."""
    for key in sorted(set(a.vocab_sizes or {}) | set(b.vocab_sizes or {})):
        ra, rb = (a.vocab_sizes or {}).get(key), (b.vocab_sizes or {}).get(key)
        if ra != rb:
            return f"the table rows of vocabulary {key!r} differ ({ra} and {rb})"
    for name, x, y in (("topology", a.topology, b.topology), ("batch sizes", a.batch_sizes, b.batch_sizes),
                       ("stacks", a.stacks, b.stacks), ("layout", a.layout, b.layout)):
        if x != y:
            return f"their {name} differ"
    return None


def check_window(artifact_dirs: Sequence[str]) -> List[Manifest]:
    """The manifests of a window of days read together (`tpu_embed.training.input.input_fn([...])`), oldest
    first, after checking that one model reads them all: one lineage, days in order (`check_same_lineage`),
    shards written, the same table rows, topology, batch sizes and layout (under a capacity they are), and
    every vocabulary of an older day a prefix of the newest day's (its ids valid in the newest day's
    tables: append keeps them). LineageError in one line otherwise."""
    if isinstance(artifact_dirs, str) or not artifact_dirs:
        raise LineageError("a window is a non-empty list of artifact directories, oldest day first.")
    ms = check_same_lineage(artifact_dirs)
    for d, m in zip(artifact_dirs, ms):
        if m.shards is None:
            raise LineageError(f"{d} has no shards (a vocabulary or profile run): a window reads the shards of "
                               "every day. Run `tpu-embed run` (or shard) for it.")
    newest_dir, newest = artifact_dirs[-1], ms[-1]
    vocabularies = newest.vocabularies or {}
    last = newest.lineage.day if newest.lineage else None
    for d, m in zip(artifact_dirs[:-1], ms[:-1]):
        day = m.lineage.day if m.lineage else None
        why = _layout_difference(m, newest)
        if why is not None:
            raise LineageError(f"{d} (day {day}) and {newest_dir} (day {last}): {why}, so "
                               "one model cannot read both: give the vocabularies a capacity (the table rows then "
                               "stay the same every day) or read the days apart.")
        for key in sorted(vocabularies):
            if key not in (m.vocabularies or {}):
                raise LineageError(f"{d} has no vocabulary {key!r}, {newest_dir} has: not one model.")
            if not _is_vocabulary_prefix(d, m, newest_dir, newest, key):
                mode = vocabularies[key].mode or "rebuild"
                raise LineageError(f"vocabulary {key!r} of {d} (day {day}) is not a prefix of the one of "
                                   f"{newest_dir} (day {last}; mode {mode}): its ids mean other tokens "
                                   "there. A window needs mode append or frozen on every vocabulary (or the same "
                                   "vocabulary every day).")
    return ms


def window(artifact_dirs: ArtifactDirs) -> Tuple[List[str], List[Manifest]]:
    """The directories and manifests of what a reader reads (`tpu_embed.input_fn`, `tpu_embed.jax.input_iterator`):
    one artifact, or a window of days (a list, checked by `check_window`)."""
    if isinstance(artifact_dirs, (str, os.PathLike)):
        return [str(artifact_dirs)], [read_manifest(str(artifact_dirs))]
    dirs = [str(d) for d in artifact_dirs]
    if len(dirs) == 1:
        return dirs, [read_manifest(dirs[0])]
    return dirs, check_window(dirs)


def _format_shape(fmt: ShardFormat) -> tuple:
    return (fmt.num_hosts, fmt.chips_per_host, fmt.host_batch_size, tuple(fmt.dense_features),
            tuple(fmt.tensor_core_features), tuple(s for s, _, _ in fmt.stacks), tuple(fmt.layouts))


def check_window_formats(dirs: Sequence[str], formats: Sequence[ShardFormat]) -> None:
    """LineageError unless the days' shards are written for the same hosts, chips, batch, features, stacks and
    layouts as the newest day's (the last): what one reader of the window's records needs."""
    newest = formats[-1]
    for d, f in zip(dirs, formats):
        if _format_shape(f) != _format_shape(newest):
            raise LineageError(f"{d}: its shards are written for other hosts, batches, features or stacks than "
                               f"{dirs[-1]}'s: one model cannot read both. Re-shard the days with one spec.")
