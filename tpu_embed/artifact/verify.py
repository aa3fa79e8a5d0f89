"""What the training side checks of an artifact's files before (and while) it reads them.

    check_files(artifact_dir, manifest, level="size")     # at load: every listed file (or a subset)
    check_shard_steps(manifest, host_index)               # the host's files cover steps 0..steps-1
    verify_shard_bytes(path, data, entry, level)          # at first open of a shard file (lazy): framing, CRCs
    checked_shard_paths(artifact_dir, entries, level)     # the same, as a tf.data dataset of the paths

Levels (`verify=` of `tpu_embed.input_fn`, `load_artifact`, `HostEmbedding.from_artifact` via
`load_artifact`):

* ``"none"``   the manifest's own checks only (schema, kind, version, fingerprint, layout, finished).
* ``"size"``   (default) at load: every file training reads (vocabularies, shards) exists and has
  the size the manifest lists; the vocabulary files are also hashed and compared with the
  manifest's sha256 (a vocabulary edited after sharding, even to the same size, is refused).
  spec.yaml is checked by its fingerprint (a comment may change); plan.json is informational
  (training uses the manifest's limits, and a `plan=` passed to training is compared with them);
  the host's shard files cover steps 0..steps-1 without gaps (a shard missing from the list).
  Each shard file's record CRCs are checked as the file is first opened (Python, crc32c), so a
  corrupted record is refused naming the file, step and byte before any record of that file
  is used (TF's own CRC check would raise a bare ``DataLossError: corrupted record at N``).
* ``"sha256"`` as "size", plus every file the manifest lists (the transform output, profiles,
  plan.json, dead letters and spec.yaml too) exists with the listed sha256 (`load_artifact`), and
  each shard file's sha256 is compared with the manifest's as it is first opened (any change at
  all, also one that keeps the TFRecord framing valid).

Unfinished artifacts: while a `tpu-embed` job command writes an output directory it holds a marker file
there (`RUN_MARKER`, `pipelines.output.claim`), and every manifest it writes meanwhile carries the
`unfinished` key (who writes it: command, pid, host, start); the last step of the command checks every
listed file, rewrites the manifest without the key and removes the marker. A manifest with the key is
refused at every level (`check_finished`): a run that is still writing, was killed (SIGKILL at any
point) or failed never leaves an artifact that a reader takes as complete.

The per-file checks read each shard file once more when it is opened (from the page cache, for
local files, right before TensorFlow reads it); docs/benchmarks.md ("Verification cost") has the measured
cost per step.
"""

from __future__ import annotations

import json
from typing import Iterable, List, Optional

from tpu_embed.artifact import io as tio
from tpu_embed.artifact import tfrecord
from tpu_embed.artifact.manifest import FileEntry, Manifest, ManifestError

LEVELS = ("none", "size", "sha256")
SMALL_KINDS = ("vocabulary",)  # always hashed at load (small; an edit changes which row a token gets)
_VOCAB_NOTE = " (a vocabulary edited after sharding would map tokens to other rows)"
_CRC_PROBLEMS = (tfrecord.CORRUPT_LENGTH, tfrecord.CORRUPT_DATA)
_FIX = "Re-run `tpu-embed run` (or shard) with this --output (and --overwrite), or restore the directory."


RUN_MARKER = ".tpu-embed-run.lock"  # in an output directory while a job command writes it (and after it died)
UNFINISHED_KEY = "unfinished"  # in every manifest written while the marker is there; the finished one has none
SIZE_EXEMPT = ("spec", "plan")  # at level "size": only their existence (spec.yaml: by its fingerprint)


class ArtifactDamagedError(ManifestError):
    """A file the manifest lists is missing, of another size or content, or holds a corrupt record."""


class ArtifactUnfinishedError(ArtifactDamagedError):
    """The manifest is one a job command wrote before it finished (it is still writing, was killed or failed)."""


def read_run_marker(artifact_dir: str) -> Optional[dict]:
    """The marker of a job command writing (or that died writing) `artifact_dir`: what it says of that run
    ({} if it is empty or unreadable: a run killed while it wrote it), or None if there is none."""
    try:
        raw = tio.read_bytes(tio.join(artifact_dir, RUN_MARKER))
    except (FileNotFoundError, IsADirectoryError):
        return None
    return parse_run_marker(raw)


def parse_run_marker(raw: bytes) -> dict:
    """A run marker's bytes as its fields ({} if they are not a JSON object: a run killed while it wrote them)."""
    try:
        d = json.loads(raw.decode("utf-8"))
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def describe_run(info: Optional[dict]) -> str:
    """`tpu-embed run` (pid 12, host h, started 2025-01-01T10:00:00Z), from a run marker's fields."""
    info = info or {}
    facts = [f"{k} {info[k]}" for k in ("pid", "host") if info.get(k) is not None]
    if info.get("started"):
        facts.append(f"started {info['started']}")
    what = f"`{info['command']}`" if info.get("command") else "a tpu-embed job"
    return what + (f" ({', '.join(facts)})" if facts else "")


def check_finished(m: Manifest, artifact_dir: Optional[str] = None) -> None:
    """`ArtifactUnfinishedError` if `m` was written by a job command that has not finished (`UNFINISHED_KEY`)."""
    info = (m.model_extra or {}).get(UNFINISHED_KEY)
    if info is None:
        return
    where = artifact_dir if artifact_dir is not None else tio.dirname(m.source)
    raise unfinished_error(where, info if isinstance(info, dict) else None)


def unfinished_error(where: str, info: Optional[dict], what: str = "an unfinished artifact") -> ArtifactUnfinishedError:
    """The one-line refusal of a directory that a job command (`info`: its run marker's fields) has not finished."""
    return ArtifactUnfinishedError(
        f"{where} is {what}: {describe_run(info)} has not finished writing it (it is still running, or it was "
        "killed or failed). Wait for that run, or re-run the same command with this --output (no --overwrite "
        "needed).")


def check_level(level: str) -> str:
    if level not in LEVELS:
        raise ValueError(f"verify must be one of {LEVELS}, got {level!r}")
    return level


def path_of(artifact_dir: str, entry: FileEntry) -> str:
    return entry.path if tio.is_absolute(entry.path) else tio.join(artifact_dir, entry.path)


def _what(entry: FileEntry) -> str:
    if entry.kind == "shard":
        return f"shard file (host {entry.host}, steps {entry.first_step}..{entry.last_step})"
    return f"{entry.kind} file"


def check_file(artifact_dir: str, entry: FileEntry, level: str = "size", *, hash_small: bool = True,
               fix: str = _FIX) -> None:
    """Existence and size (and, for the small kinds or level "sha256", content) of one listed file; at level
    "size", of spec.yaml and plan.json their existence only (`SIZE_EXEMPT`). `hash_small=False`: the small
    kinds are not hashed at level "size" (existence and size only). `fix`: the advice that ends the message
    (default: re-make or restore the artifact)."""
    if level == "none":
        return
    path = path_of(artifact_dir, entry)
    try:
        size = tio.size(path)
    except (FileNotFoundError, OSError):
        size = None
    if size is None:
        raise ArtifactDamagedError(f"{path}: the manifest lists this {_what(entry)} but it is missing: the "
                                   f"artifact is incomplete (an interrupted run or copy?). {fix}")
    if level == "size" and entry.kind in SIZE_EXEMPT:
        return
    if size != entry.bytes:
        raise ArtifactDamagedError(f"{path}: {_what(entry)} has {size} bytes, the manifest lists {entry.bytes}: it "
                                   f"was truncated, replaced or rewritten after the manifest. {fix}")
    if level == "sha256" or (hash_small and entry.kind in SMALL_KINDS):
        digest = tio.sha256_of(path)
        if digest != entry.sha256:
            raise ArtifactDamagedError(
                f"{path}: {_what(entry)} has sha256 {digest[:16]}…, the manifest lists {entry.sha256[:16]}…: it was "
                f"edited or damaged after the artifact was written{_VOCAB_NOTE if entry.kind == 'vocabulary' else ''}"
                f". {fix}")


def check_files(artifact_dir: str, m: Manifest, level: str = "size", *, kinds: Optional[Iterable[str]] = None,
                host: Optional[int] = None, hash_small: bool = True) -> None:
    """`check_file` for every listed file (of `kinds`; shards of `host` only when given)."""
    check_level(level)
    if level == "none":
        return
    kinds = set(kinds) if kinds is not None else None
    for f in m.files:
        if kinds is not None and f.kind not in kinds:
            continue
        if host is not None and f.kind == "shard" and f.host != host:
            continue
        check_file(artifact_dir, f, level, hash_small=hash_small)


def check_listed(artifact_dir: str, m: Manifest, host: Optional[int] = None) -> None:
    """The manifest is finished and every file it lists (shards: of `host` only, when given) exists with its
    size (spec.yaml, plan.json: exists); nothing is hashed (`tpu-embed inspect`'s check, and the last step of
    a job command's: `pipelines.output.Claim.finish`)."""
    check_finished(m, artifact_dir)
    check_files(artifact_dir, m, "size", host=host, hash_small=False)


def check_shard_steps(m: Manifest, host_index: int) -> None:
    """The manifest is finished (`check_finished`) and the host's shard files hold steps 0..shards.steps-1, each
    once, in file order."""
    check_finished(m)
    if m.shards is None:
        return
    if m.limits is not None and m.limits.source.startswith("unbounded"):
        raise ArtifactDamagedError(
            f"{m.source}: the shard job did not finish: its limits were never planned (limits.source "
            f"{m.limits.source!r}; the run was interrupted between writing the shards and plan.json). {_FIX}")
    files = m.shard_files(host_index)
    nxt = 0
    for f in files:
        if f.first_step != nxt or f.last_step is None or (f.records is not None and
                                                          f.records != f.last_step - f.first_step + 1):
            raise ArtifactDamagedError(
                f"{m.source}: host {host_index}'s shard files do not cover the steps without a gap: expected a file "
                f"starting at step {nxt}, found {f.path} (steps {f.first_step}..{f.last_step}, {f.records} "
                f"records). A shard file is missing from the manifest. {_FIX}")
        nxt = f.last_step + 1
    if nxt != m.shards.steps:
        raise ArtifactDamagedError(
            f"{m.source}: host {host_index}'s shard files hold steps 0..{nxt - 1}, the manifest says "
            f"{m.shards.steps} steps: a shard file is missing from the manifest. {_FIX}")


def verify_shard_bytes(path: str, data: bytes, entry: FileEntry, level: str = "size",
                       compression: str = "none") -> None:
    """Framing and record CRCs of a shard file's bytes (and sha256 at level "sha256"); names file, step, byte.

    `compression` (the shard format's): size and sha256 are the file's; the stream is then decompressed
    (its own CRC / Adler-32 checked) and the framing checked in the decompressed bytes.
    """
    if level == "none":
        return
    if len(data) != entry.bytes:
        raise ArtifactDamagedError(f"{path}: {_what(entry)} has {len(data)} bytes, the manifest lists {entry.bytes}: "
                                   f"it changed after the artifact was loaded. {_FIX}")
    if level == "sha256":
        digest = tio.sha256_bytes(data)
        if digest != entry.sha256:
            raise ArtifactDamagedError(f"{path}: {_what(entry)} has sha256 {digest[:16]}…, the manifest lists "
                                       f"{entry.sha256[:16]}…: its content changed. {_FIX}")
    if compression != "none":
        try:
            data = tfrecord.decompress(data, compression, path)
        except ValueError as e:
            raise ArtifactDamagedError(f"{e}: the shard file is damaged; no record of it was used. {_FIX}") from None
    try:
        records = len(tfrecord.index_records(data))
    except tfrecord.TFRecordError as e:
        i = e.index or 0
        problem = e.problem + (" (CRC mismatch)" if e.problem in _CRC_PROBLEMS else "")
        where = (f"byte {e.offset}" if compression == "none" else
                 f"byte {e.offset} of the decompressed {compression} stream")
        raise ArtifactDamagedError(f"{path}: step {(entry.first_step or 0) + i} (record {i} of the file, {where}): "
                                   f"{problem}. The shard file is damaged; no record of it was used. {_FIX}") from None
    if entry.records is not None and records != entry.records:
        raise ArtifactDamagedError(f"{path}: {records} records, the manifest lists {entry.records}. {_FIX}")


def checked_shard_paths(artifact_dir: str, entries: List[FileEntry], level: str, compression: str = "none"):
    """A `tf.data.Dataset` of the shard paths that verifies each file as it is first opened (lazily).

    A verified file is remembered (by path, size and mtime where available) and not read again in
    later epochs.
    """
    import tensorflow as tf  # TensorFlow boundary: the checks above run without it
    by_path = {path_of(artifact_dir, e): e for e in entries}
    done = set()

    def check(p):
        path = p.numpy().decode("utf-8")
        if path not in done:
            verify_shard_bytes(path, tio.read_bytes(path), by_path[path], level, compression)
            done.add(path)
        return p

    paths = list(by_path)
    ds = tf.data.Dataset.from_tensor_slices(tf.constant(paths, tf.string))
    if level == "none":
        return ds
    return ds.map(lambda p: tf.ensure_shape(tf.py_function(check, [p], tf.string), []))
