"""The output directory of a `tpu-embed` job: claimed before any job runs, written atomically, finished after.

    with claim(output, command, overwrite) as run:   # the lock, the overwrite rule, invalidating the old manifest
        ...the jobs...
        manifest = run.finish()                      # sweep, check every listed file, mark the manifest finished
    write_atomic(output, rel, chunks)                # a file of the artifact, and its `FileInfo` for the manifest

Design (no mix of old and new files, nothing half-written or unfinished accepted, no two runs at once):

* One job command at a time per output. `claim` holds a marker file, `RUN_MARKER` (.tpu-embed-run.lock:
  the command, pid, host, start), from before the directory is looked at until the command ends. Local
  paths: it is locked with `fcntl.flock` (released by the kernel when the process dies, SIGKILL included);
  a second command finds it locked and is refused in one line naming the first (pid, host) and the fix.
  Object stores (gs://, s3://: see `tpu_embed.artifact.io`) have no lock and no create-if-absent through
  fsspec: the marker is written, read back, and checked again when the run finishes, so a second run that
  starts while the first runs is refused (naming it), two that start within the same moment are told
  apart by the read back (best effort, not a lock), and one that lost its marker to another run fails
  before it marks its artifact finished. Where a local filesystem has no flock (some network mounts), the
  object-store rules apply.
* While the marker is there, every manifest the jobs write carries `unfinished` (the marker's facts;
  `tpu_embed.artifact.verify.check_finished`): `load_artifact`, `input_fn` and `tpu-embed inspect` refuse
  it. The manifest is written last by every job, atomically, and lists only files already written.
  `finish` deletes what the manifest does not list (as below), checks that every listed file exists with
  its size, rewrites the manifest without `unfinished`, then removes the marker.
  A run killed at any point (SIGKILL) or failed therefore leaves either no manifest or an unfinished one,
  and its marker.
* A directory holding a marker (not locked) or an unfinished manifest holds what an unfinished run left:
  the next command takes it over without --overwrite (as --overwrite would). A failed run leaves its
  marker (saying "failed"), so the fixed re-run needs no --overwrite either.
* `--overwrite` first *invalidates* the old artifact: `run` / `vocab` delete the old manifest.json,
  `shard` rewrites it without its shard sections (keeping the vocabularies it was given), so that an
  interrupted overwrite leaves a directory no reader accepts as complete (never an old manifest over
  some new files).
* Without `--overwrite`, `run` and `vocab` refuse a directory that holds an artifact or other files, and
  `shard` one that already has shards. After the job has written its manifest, with --overwrite or on a
  take-over, every file under the output that the new manifest does not list (stale `part-…-of-…` shards
  of another file count, profiles of another spec, `.tmp-…` leftovers of a killed run, an old plan.json)
  is deleted; input files (if they lie inside the output) and the vocabulary job's record of its read
  (for `shard`) are not, nor the files of a directory that never held an artifact: those there when a
  command first claimed it (a user's notes.txt; the marker keeps their names through a failed run and
  its take-over) stay. Without either, only the `.tmp-…` files of tpu-embed's writers (`TMP_PREFIX`,
  e.g. a Dask worker killed while it wrote spec.yaml, whose task ran again elsewhere) are deleted.
* Writability is checked up front (a probe file written and deleted), so a read-only location
  fails in one line before the vocabulary job runs.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import json
import os
import socket
import time
import uuid
from typing import Iterable, List, Literal, Optional, Tuple

from tpu_embed.artifact import io as tio
from tpu_embed.artifact import verify as tverify
from tpu_embed.artifact.manifest import Manifest, ManifestError, manifest_bytes, manifest_path, read_manifest
from tpu_embed.artifact.verify import RUN_MARKER, UNFINISHED_KEY

SHARD_KINDS = ("shard", "profile", "plan")
SHARD_KEYS = ("layout", "stacks", "limits", "vocab_sizes", "counts", "shards", "profile")


class OutputError(Exception):
    """The output location cannot be used as asked; the message names it and the fix."""


@dataclasses.dataclass
class FileInfo:
    """A file of the artifact as the manifest lists it."""
    path: str  # relative to the artifact directory
    sha256: str
    bytes: int
    records: Optional[int] = None
    extra: Optional[dict] = None

    def to_json(self) -> dict:
        d = {"path": self.path, "sha256": self.sha256, "bytes": self.bytes}
        if self.records is not None:
            d["records"] = self.records
        if self.extra:
            d.update(self.extra)
        return d


def write_atomic(base: str, rel: str, chunks, records: Optional[int] = None, extra=None) -> FileInfo:
    """Write `chunks` (bytes or an iterable of bytes) to base/rel atomically (`tpu_embed.artifact.io.write_atomic`)."""
    written = tio.write_atomic(tio.join(base, rel), chunks)
    assert written.sha256 is not None  # a durable write's
    return FileInfo(rel, written.sha256, written.bytes, records, extra)


def move_into_place(src: str, base: str, rel: str, sha256: str, size: int, records: Optional[int] = None,
                    extra=None) -> FileInfo:
    """A finished transient file `src` (its sha256 and size known) as base/rel (`tpu_embed.artifact.io.move`).

    A retried bundle may find `src` gone and the file in place: accepted when its bytes hash the same."""
    dst = tio.join(base, rel)
    if not tio.exists(src) and tio.exists(dst):
        if tio.sha256_of(dst) != sha256:
            raise IOError(f"{src} is gone and {dst} is not the file it held: the output directory changed while "
                          "the job ran; re-run it.")
    else:
        tio.move(src, dst)
    return FileInfo(rel, sha256, size, records, extra)


def _files_under(output: str) -> List[str]:
    """Every file under `output` (full paths), hidden ones too."""
    if tio.is_url(output):
        return list(tio.glob(tio.join(output, "**")))
    out = []
    for root, _dirs, names in os.walk(output):
        out += [os.path.join(root, n) for n in names]
    return sorted(out)


def check_writable(output: str) -> None:
    probe = tio.join(output, f".tpu-embed-write-check-{uuid.uuid4().hex}")
    try:
        tio.makedirs(output)
        tio.write_atomic(probe, b"ok")
        tio.delete(probe)
    except Exception as e:  # noqa: BLE001 - see below
        # Object-store clients raise their own errors too (gcsfs: HttpError for 401 / 5xx, ValueError for some
        # 400s), not only OSError: for a URL any failure of the probe means the location cannot be written.
        if not (isinstance(e, OSError) or tio.is_url(output)):
            raise
        raise OutputError(f"--output {output} is not writable ({_why(e, output)}); nothing was run. Fix: choose "
                          "a writable --output (or fix its permissions / mount).") from None


def _why(e: Exception, output: str) -> str:
    """Why the probe write failed, in a few words (never the store's API endpoint alone)."""
    if isinstance(e, OSError) and e.errno == errno.EROFS:
        return "read-only file system"
    if tio.is_url(output) and isinstance(e, FileNotFoundError):
        # An upload answered 404 (gcsfs: FileNotFoundError(<the upload endpoint URL>)): no such bucket.
        scheme, rest = output.split("://", 1)
        return f"bucket {scheme}://{rest.split('/', 1)[0]} does not exist"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    msg = " ".join(str(e).split()).strip(" ,")  # gcsfs's HttpError reads "<message>, <status>"
    return msg if isinstance(e, OSError) else f"{type(e).__name__}: {msg}".rstrip(": ")


WRITE_CHECK_PREFIX = ".tpu-embed-write-check-"  # `check_writable`'s probe (of this run or another)
TMP_PREFIX = ".tmp-"  # the temporary files and directories of tpu-embed's writers (`tio.write_atomic`, runs, spills)
# The vocabulary job's record of its read (`pipelines.read.chunk_sizes` writes it under this name): not part of the
# artifact, `sweep` leaves it for a later `tpu-embed shard`.
READ_RECORD = ".tpu-embed-chunk-sizes.json"


def _rel(output: str, path: str) -> str:
    """`path` (under `output`) relative to it, '/'-separated."""
    if tio.is_url(output):
        return tio.relpath(path, output) or path
    return os.path.relpath(path, output).replace(os.sep, "/")


def _control(rel: str) -> bool:
    """A control file of a job command (the run marker, a write probe, also while another run's probe is being
    written under its temporary name): not part of what the directory holds."""
    if "/" in rel:
        return False
    name = rel
    if name.startswith(TMP_PREFIX):  # `.tmp-<32 hex>-<name>`, as tio.write_atomic names it
        name = name[len(TMP_PREFIX) + 33:]
    return rel == RUN_MARKER or name.startswith(WRITE_CHECK_PREFIX)


def _contents(output: str) -> List[str]:
    """What the directory holds: every file under it but the control files (full paths)."""
    return [p for p in _files_under(output) if not _control(_rel(output, p))]


def _temporary(rel: str) -> bool:
    """A temporary file of tpu-embed's writers (or one in such a directory): a killed writer's if it remains."""
    return any(x.startswith(TMP_PREFIX) for x in rel.split("/"))


def _some(output: str, paths: List[str], n: int = 3) -> str:
    names = [_rel(output, p) for p in paths[:n]]
    return ", ".join(names) + (f" and {len(paths) - n} more" if len(paths) > n else "")


def _existing(output: str) -> Optional[Manifest]:
    try:
        return read_manifest(output)
    except ManifestError:
        return None


def _unfinished(m: Optional[Manifest]) -> bool:
    return m is not None and (m.model_extra or {}).get(UNFINISHED_KEY) is not None


@dataclasses.dataclass
class _State:
    """What an output directory holds, as `claim` / `prepare` judge it."""
    files: List[str]  # full paths, control files left out
    has_manifest: bool
    manifest: Optional[Manifest]  # None: none, or damaged

    def foreign(self, output: str) -> List[str]:
        """The files (relative paths) of a directory that never held an artifact: none if it has a manifest."""
        return [] if self.has_manifest else [_rel(output, p) for p in self.files]


def _look(output: str) -> _State:
    has = tio.exists(manifest_path(output))
    return _State(_contents(output), has, _existing(output) if has else None)


def _check(output: str, command: str, overwrite: bool, state: _State, take_over: bool) -> None:
    """The overwrite rule: OutputError (nothing changed) if the command may not write there."""
    if take_over or overwrite:
        return
    if command in ("run", "vocab") and state.files:
        if state.has_manifest:
            raise OutputError(f"--output {output} already holds an artifact: pass --overwrite to replace it (files the "
                              "new manifest does not list are deleted), or choose another --output.")
        raise OutputError(f"--output {output} already holds {len(state.files)} file(s) that are no artifact "
                          f"({_some(output, state.files)}): choose an empty or new --output, or pass --overwrite to "
                          "write the artifact beside them (they are kept).")
    if command == "shard":
        m = state.manifest
        if (m is not None and m.shards is not None) or any("/shards/" in "/" + _rel(output, p) for p in state.files):
            raise OutputError(f"--output {output} already has shards: pass --overwrite to replace them, or choose "
                              "another --output (with --vocab pointing at the vocabularies).")


def _invalidate(output: str, command: str, state: _State) -> None:
    """Make the old artifact one no reader accepts before anything of the new one is written."""
    if command in ("run", "vocab"):
        if state.has_manifest:
            tio.delete(manifest_path(output))
    elif command == "shard":
        m = state.manifest
        if m is not None:
            d = m.to_json()
            for k in SHARD_KEYS:
                d.pop(k, None)
            for j in ("shard", "profile"):
                d.get("jobs", {}).pop(j, None)
            d["files"] = [f for f in d.get("files", []) if f.get("kind") not in SHARD_KINDS]
            Manifest.from_json(d, manifest_path(output))
            tio.write_atomic(manifest_path(output), manifest_bytes(d))
        elif state.has_manifest:
            tio.delete(manifest_path(output))  # damaged: nothing in it can be kept


def prepare(output: str, command: str, overwrite: bool, take_over: bool = False) -> List[str]:
    """Before a job, without a claim (`claim` does this holding the directory): writability, the overwrite rule,
    and (with --overwrite or `take_over`, or over an unfinished manifest) invalidating the old manifest.
    Returns the files (relative paths) `sweep` must keep: those of a directory that never held an artifact."""
    check_writable(output)
    state = _look(output)
    take_over = take_over or _unfinished(state.manifest)
    _check(output, command, overwrite, state, take_over)
    if overwrite or take_over:
        _invalidate(output, command, state)
    return state.foreign(output)


def sweep(output: str, keep: Iterable[str] = (), temporary_only: bool = False) -> List[str]:
    """Delete every file under `output` that the manifest does not list (but manifest.json, input files, the
    vocabulary job's record of its read, the control files and `keep`: relative paths);
    `temporary_only`: only the `.tmp-…` files of tpu-embed's writers. Returns the deleted paths."""
    m = read_manifest(output)
    keep_paths = {os.path.normpath(p) if not tio.is_url(p) else p for p in
                  [tio.join(output, f.path) if not tio.is_absolute(f.path) else f.path for f in m.files]
                  + [manifest_path(output), tio.join(output, READ_RECORD)]
                  + [i.path for j in m.jobs.values() for i in j.inputs]}
    if not tio.is_url(output):
        keep_paths |= {os.path.abspath(p) for p in keep_paths}
    kept = set(keep)
    deleted = []
    for p in _files_under(output):
        key = p if tio.is_url(p) else os.path.normpath(p)
        if key in keep_paths or (not tio.is_url(p) and os.path.abspath(p) in keep_paths):
            continue
        rel = _rel(output, p)
        if _control(rel) or rel in kept or (temporary_only and not _temporary(rel)):
            continue
        tio.delete(p)
        deleted.append(p)
    if not tio.is_url(output):  # empty directories left behind (old hosts' shard folders, `.tmp-…` ones)
        kept_dirs = {d for k in kept for d in _parents(k)}
        for root, _, _ in sorted(os.walk(output), key=lambda t: -len(t[0])):
            rel = _rel(output, root)
            if (root != output and not os.listdir(root) and rel not in kept_dirs
                    and (not temporary_only or _temporary(rel))):
                os.rmdir(root)
    return deleted


def _parents(rel: str) -> List[str]:
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


# ---------------------------------------------------------------- one job command at a time

_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, TypeError, ValueError, OverflowError):
        return True  # someone else's process, or no pid to ask about: assume it runs
    return True


def _gone(info: dict) -> bool:
    """Whether the run a marker names (on an output with no lock) is known not to run any more: it said it
    failed, or it ran on this host and its process is gone."""
    return str(info.get("state", "")).startswith("failed") or (
        info.get("host") == socket.gethostname() and info.get("pid") is not None and not _alive(info["pid"]))


def marker_command(command: str) -> str:
    """How a run marker (and an unfinished manifest) names the command that claimed the directory."""
    return f"tpu-embed {command}"


class Claim:
    """A job command's hold on its output directory (`claim`)."""

    def __init__(self, output: str, command: str, overwrite: bool):
        self.output, self.command, self.overwrite = output, command, overwrite
        self.path = tio.join(output, RUN_MARKER)
        self.info = {"command": marker_command(command), "pid": os.getpid(), "host": socket.gethostname(),
                     "started": _now(), "token": uuid.uuid4().hex, "state": "running"}
        self.keep: List[str] = []  # files of a directory that never held an artifact (`sweep` keeps them)
        self.replacing = False  # --overwrite or a take-over: `finish` deletes what the new manifest does not list
        self._fd: Optional[int] = None  # the locked marker (local paths with flock)
        self._held = False
        self._finished = False

    # ------------------------------------------------------------ the marker

    def _write_marker(self, **changes) -> None:
        self.info.update(changes)
        data = json.dumps(dict(self.info, keep=self.keep), sort_keys=True).encode("utf-8") + b"\n"
        if self._fd is not None:  # in place: old bytes, a mix (unreadable: an unfinished run) or new, never empty
            os.pwrite(self._fd, data, 0)
            os.ftruncate(self._fd, len(data))
            os.fsync(self._fd)
        else:
            tio.write_atomic(self.path, data)

    def _lock(self) -> Tuple[bool, Optional[dict]]:
        """Lock the marker (local paths with flock): (True, the previous run's marker or None if there was none),
        or OutputError naming the run that holds it; (False, None) where the filesystem cannot lock."""
        import fcntl
        while True:
            fd = os.open(tio.local_path(self.path), os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                info = _holder(fd)
                os.close(fd)
                raise OutputError(
                    f"--output {self.output} is being written by another run, {tverify.describe_run(info)}, which "
                    f"holds {self.path}: two runs into one output are refused. Wait for it to finish, or choose "
                    "another --output.") from None
            except OSError as e:
                os.close(fd)
                if e.errno in _NO_FLOCK:
                    return False, None  # no locks here: the object-store rules
                raise
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(tio.local_path(self.path)))
            except FileNotFoundError:
                same = False
            if not same:  # removed (by the run that held it) after it was opened: open the current one
                os.close(fd)
                continue
            self._fd = fd
            raw = _read_fd(fd)
            return True, (tverify.parse_run_marker(raw) if raw else None)

    def _marked(self) -> Optional[dict]:
        """Without a lock (object stores): the previous run's marker (None if none), or OutputError if that run
        may still be writing."""
        prev = tverify.read_run_marker(self.output)
        if prev is None or _gone(prev):
            return prev
        if prev.get("host") == socket.gethostname() and prev.get("pid") is not None:  # alive (not gone), here
            raise OutputError(
                f"--output {self.output} is being written by another run, {tverify.describe_run(prev)}, whose "
                f"marker is {self.path}: two runs into one output are refused. Wait for it to finish, or choose "
                "another --output.")
        if not self.overwrite:
            raise OutputError(
                f"--output {self.output} holds the marker of another run, {tverify.describe_run(prev)} "
                f"({self.path}), which may still be writing it: {self.output} cannot be locked, so whether that "
                "run still runs is not known. Wait for it to finish; if it no longer runs (killed), pass "
                "--overwrite to take the output over.")
        return prev

    # ------------------------------------------------------------ claim, finish, release

    def __enter__(self) -> "Claim":
        check_writable(self.output)
        locked, prev = (False, None) if tio.is_url(self.output) else self._lock()
        self._held = True
        try:
            if not locked:
                prev = self._marked()
            state = _look(self.output)
            if prev is not None and prev.get("state") == "finishing" and state.manifest is not None \
                    and not _unfinished(state.manifest):
                prev = None  # that run finished its artifact and was stopped before it removed its marker
            take_over = prev is not None or _unfinished(state.manifest)
            _check(self.output, self.command, self.overwrite, state, take_over)
        except BaseException:
            self._release(remove=locked and prev is None)  # refused: the directory as it was
            raise
        if prev is not None:  # what the unfinished run kept is kept (its own files were all written by it)
            self.keep = sorted(k for k in prev.get("keep") or [] if isinstance(k, str))
        else:
            self.keep = state.foreign(self.output)
        self.replacing = self.overwrite or take_over
        try:
            self._write_marker()  # before anything is invalidated: from here on the directory is an unfinished run's
            if self._fd is None and (tverify.read_run_marker(self.output) or {}).get("token") != self.info["token"]:
                self._held = False  # another run wrote its marker at the same moment: it goes on, this one stops
                raise OutputError(f"--output {self.output}: another run claimed it at the same moment "
                                  f"({self.path}). Wait for it to finish, or choose another --output.")
            if self.replacing:
                _invalidate(self.output, self.command, state)
        except BaseException as e:
            self.__exit__(type(e), e, e.__traceback__)
            raise
        return self

    def _still_ours(self) -> None:
        if self._fd is None and (tverify.read_run_marker(self.output) or {}).get("token") != self.info["token"]:
            raise OutputError(f"--output {self.output}: another run took it over while this one ran (its marker "
                              f"{self.path} is not this run's): this run's artifact is not marked finished. Re-run "
                              "when the other run has finished.")

    def finish(self) -> Manifest:
        """After the jobs: delete what tpu-embed wrote that the manifest does not list (`.tmp-…` files of a
        killed writer too), check that every listed file exists with its size, rewrite the manifest without
        `unfinished`, remove the marker. Returns the finished manifest."""
        out = self.output
        self._still_ours()
        sweep(out, self.keep, temporary_only=not self.replacing)
        m = read_manifest(out)
        tverify.check_files(out, m, "size", hash_small=False)
        self._write_marker(state="finishing")
        d = m.to_json()
        if d.pop(UNFINISHED_KEY, None) is not None:
            m = Manifest.from_json(d, manifest_path(out))
            tio.write_atomic(manifest_path(out), manifest_bytes(d))
        self._release(remove=True)
        self._finished = True
        return m

    def _release(self, remove: bool) -> None:
        if not self._held and self._fd is None:
            return
        try:
            if remove:
                tio.delete(self.path)  # still locked: a run waiting on this file re-opens the path
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self._held = False

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        if self._finished or not self._held:
            return False
        try:
            if exc is not None and (self._fd is not None or (tverify.read_run_marker(self.output) or {}).get(
                    "token") == self.info["token"]):
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
                self._write_marker(state=f"failed: {first}")
        except Exception:  # noqa: BLE001 - the run's own error is the one to report
            pass
        finally:
            self._release(remove=False)  # the marker stays: the next run takes the directory over
        return False


def claim(output: str, command: str, overwrite: bool) -> Claim:
    """`with claim(output, command, overwrite) as run: ...; run.finish()`: see the module docstring."""
    return Claim(output, command, overwrite)


HOLDER_WAIT_S = 5.0  # how long a refused run waits for the holder's marker to name it


def _holder(fd: int) -> dict:
    """The fields of the run that holds the lock on marker `fd`. A run locks the marker before it writes its
    fields (it first checks the directory), so until then the file is empty or still names the run before it:
    read again until it names a live run, for at most `HOLDER_WAIT_S` ({} after that: "a tpu-embed job")."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while True:
        info = tverify.parse_run_marker(_read_fd(fd))
        if info and not _gone(info):
            return info
        if time.monotonic() >= deadline:
            return {}
        time.sleep(0.02)


def _read_fd(fd: int) -> bytes:
    out = b""
    while True:
        chunk = os.pread(fd, 1 << 16, len(out))
        if not chunk:
            return out
        out += chunk
