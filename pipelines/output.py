"""The output directory of a `tpu-embed` job: checked before any job runs, written atomically, cleaned after.

    prepare(output, command, overwrite)   # before: writable? refuses an existing artifact without --overwrite
    write_atomic(output, rel, chunks)      # a file of the artifact, and its `FileInfo` for the manifest
    sweep(output)                          # after, with --overwrite: delete what the new manifest does not list

Design (no mix of old and new files, nothing half-written accepted):

* The manifest is written last by every job, atomically; readers accept only files it lists, with
  the listed sizes (`tpu_embed.artifact.verify`).
* `--overwrite` first *invalidates* the old artifact: `run` / `vocab` delete the old manifest.json,
  `shard` rewrites it without its shard sections (keeping the vocabularies it was given), so that an
  interrupted overwrite leaves a directory no reader accepts as complete (never an old manifest
  over some new files). After the job has written its manifest, every file under the output that
  the new manifest does not list (stale `part-…-of-…` shards of another file count, profiles of
  another spec, `.tmp-…` leftovers of a killed run, an old plan.json) is deleted; input files
  (if they lie inside the output) and the vocabulary job's record of its read (for `shard`) are not.
* Without `--overwrite`, `run` and `vocab` refuse a non-empty output directory, and `shard` one that
  already has shards.
* Writability is checked up front (a probe file written and deleted), so a read-only location
  fails in one line before the vocabulary job runs.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import uuid
from typing import List, Optional

from pipelines.sharding import chunk_sizes
from tpu_embed.artifact import io as tio
from tpu_embed.artifact.manifest import Manifest, ManifestError, manifest_bytes, manifest_path, read_manifest

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


def _existing(output: str) -> Optional[Manifest]:
    try:
        return read_manifest(output)
    except ManifestError:
        return None


def prepare(output: str, command: str, overwrite: bool) -> None:
    """Before the job: writability, the overwrite rule, and (with --overwrite) invalidating the old manifest."""
    check_writable(output)
    files = _files_under(output)
    m = _existing(output)
    if command in ("run", "vocab"):
        if files and not overwrite:
            what = "an artifact" if m is not None else f"{len(files)} file(s)"
            raise OutputError(f"--output {output} already holds {what}: pass --overwrite to replace it (files the "
                              "new manifest does not list are deleted), or choose another --output.")
        if overwrite and tio.exists(manifest_path(output)):
            tio.delete(manifest_path(output))
    elif command == "shard":
        has_shards = (m is not None and m.shards is not None) or any(
            "/shards/" in p.replace(os.sep, "/") for p in files)
        if has_shards and not overwrite:
            raise OutputError(f"--output {output} already has shards: pass --overwrite to replace them, or choose "
                              "another --output (with --vocab pointing at the vocabularies).")
        if overwrite and m is not None:
            d = m.to_json()
            for k in SHARD_KEYS:
                d.pop(k, None)
            for j in ("shard", "profile"):
                d.get("jobs", {}).pop(j, None)
            d["files"] = [f for f in d.get("files", []) if f.get("kind") not in SHARD_KINDS]
            Manifest.from_json(d, manifest_path(output))
            tio.write_atomic(manifest_path(output), manifest_bytes(d))
        elif overwrite and tio.exists(manifest_path(output)):
            tio.delete(manifest_path(output))  # damaged: nothing in it can be kept


def sweep(output: str) -> List[str]:
    """Delete every file under `output` the manifest does not list (but manifest.json, input files and the
    vocabulary job's record of its read)."""
    m = read_manifest(output)
    # The vocabulary job's record of its read (`pipelines.sharding.chunk_sizes`) stays for a later `tpu-embed shard`.
    keep = {os.path.normpath(p) if not tio.is_url(p) else p for p in
            [tio.join(output, f.path) if not tio.is_absolute(f.path) else f.path for f in m.files]
            + [manifest_path(output), chunk_sizes.path(output)] + [i.path for j in m.jobs.values() for i in j.inputs]}
    if not tio.is_url(output):
        keep |= {os.path.abspath(p) for p in keep}
    deleted = []
    for p in _files_under(output):
        key = p if tio.is_url(p) else os.path.normpath(p)
        if key in keep or (not tio.is_url(p) and os.path.abspath(p) in keep):
            continue
        tio.delete(p)
        deleted.append(p)
    if not tio.is_url(output):  # empty directories left behind (old hosts' shard folders)
        for root, _, _ in sorted(os.walk(output), key=lambda t: -len(t[0])):
            if root != output and not os.listdir(root):
                os.rmdir(root)
    return deleted
