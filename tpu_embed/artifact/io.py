"""One IO layer for every artifact: local paths and object stores (gs://, s3://, ...) alike.

Everything tpu_embed reads or writes goes through here: the jobs' input
files, vocabularies, shards, dead letters, manifest.json, the spec copy,
profiles, plans and reports, and the training side's reads of manifests
and shards.

    join(base, *parts)       exists(path)          read_bytes(path) / read_text(path)
    glob(pattern)            list_files(pattern)   open_read(path)  (streaming)
    sha256_of(path)          sha256_bytes(data)    (hex digests: of a file, of bytes in memory)
    write_atomic(path, data[, durable=False]) -> Written(path, sha256, bytes)
    open_write(path)  (streaming, a job's transient files)    move(src, dst)
    delete(path)             delete_tree(path)     relpath(path, base)   is_url(path) / protocol(path)

Why fsspec (+ gcsfs for gs://).  Beam's `FileSystems` made the core depend
on Apache Beam and behaves differently for local paths (plain `os` calls
were mixed in, which is how `--output gs://...` became `./gs:/...`).
TensorFlow's `tf.io.gfile` would pull TensorFlow into the jobs' workers and
the profiles.  fsspec is a small pure-Python library that works the same in
the numpy-only core, on Beam workers (instances are re-created after a fork)
and on the training side; one `url -> filesystem` mapping covers gs://
(gcsfs), s3:// (s3fs), memory:// and the rest.  For gs:// we construct
`gcsfs.core.GCSFileSystem` (the JSON API over HTTP) rather than the gRPC
"extended" class gcsfs registers by default: the latter first asks the
Storage Control gRPC API for the bucket type, which emulators do not serve
(60 s timeout on every call); zonal ("Rapid") buckets, which need gRPC, are
therefore not supported.  `STORAGE_EMULATOR_HOST` is honoured: when it is
set, gs:// goes to that endpoint with anonymous credentials (emulators do
not check them); otherwise Google's default credentials are used.

Atomic writes (readers see the old content or the new, never a part):
  * local paths: a temporary file `.tmp-<uuid>-<name>` in the same directory,
    flushed and fsync'ed, then `os.replace` (atomic within one filesystem,
    hence the same directory); the temporary file is removed on any failure.
  * object stores: the whole object is sent in one upload (`pipe`): an object
    becomes visible only when its upload completes (GCS: one simple upload
    below 50 MiB, else one resumable upload that the store commits at its
    last chunk and that gcsfs cancels on failure), so there is no temporary
    name and no rename (renames are copies on object stores).
Every write returns the sha256 and size of what was written (the manifest's
file list records them).  `durable=False` is for a job's own intermediates
(shard runs, the read spill), which it deletes itself and which a crashed
job re-creates: still atomic, but no fsync and no sha256 (`Written.sha256`
is None); at 2 M examples these cost ~3 s of a 35 s `run`.

`open_write` streams a job's transient file under a name of its own (not atomic: the job refers to it only
once it is closed); `move` puts such a file in place of an artifact: locally an fsync then `os.replace`
(atomic), on object stores a copy inside the store then a delete (the copy appears whole).

Listing: `glob` / `list_files` return full paths (with the scheme for
object stores) sorted by path, files only; `**` matches across directories.
"""

from __future__ import annotations

import dataclasses
import glob as _glob
import hashlib
import os
import re
import shutil
import threading
import uuid
from typing import IO, Any, Dict, Iterable, List, Optional, Tuple, Union

Data = Union[bytes, bytearray, memoryview, Iterable[bytes]]

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
_GLOB_CHARS = re.compile(r"[*?\[]")


class DiskFullError(OSError):
    """A write failed for lack of space (ENOSPC, EDQUOT) or a file size limit (EFBIG); names the path."""


_FULL = {28: "no space left on device", 122: "disk quota exceeded", 27: "file too large for this location"}


def _disk_full(e: OSError, path: str, n: int) -> OSError:
    if e.errno not in _FULL or isinstance(e, DiskFullError):
        return e
    return DiskFullError(e.errno, f"writing {path} failed after {n} bytes: {_FULL[e.errno]}. Nothing was "
                                  "accepted: free space (or write elsewhere) and re-run with --overwrite.")


@dataclasses.dataclass(frozen=True)
class Written:
    """What `write_atomic` wrote."""
    path: str
    sha256: Optional[str]  # None for durable=False writes
    bytes: int


@dataclasses.dataclass(frozen=True)
class FileStat:
    path: str
    size: int


# ---------------------------------------------------------------- paths

def protocol(path: str) -> str:
    """'gs', 's3', 'memory', ... for URLs; '' for local paths (and file://)."""
    m = _URL.match(os.fspath(path))
    if not m or m.group(1).lower() == "file":
        return ""
    return m.group(1).lower()


def is_url(path: str) -> bool:
    """True for object-store / remote URLs (anything with a scheme but file://)."""
    return protocol(path) != ""


def local_path(path: str) -> str:
    """A local path or file:// URL as the path the operating system opens."""
    path = os.fspath(path)
    return path[len("file://"):] if path.startswith("file://") else path


def is_absolute(path: str) -> bool:
    return is_url(path) or os.path.isabs(local_path(path))


def join(base: str, *parts: str) -> str:
    """`base/part/...`: os.path.join for local paths, '/' for URLs (no leading-slash surprises)."""
    base = os.fspath(base)
    if is_url(base):
        out = base.rstrip("/")
        for p in parts:
            p = p.strip("/")
            if p:
                out = out + "/" + p
        return out
    return os.path.join(base, *parts)


def dirname(path: str) -> str:
    """The parent: os.path.dirname for local paths; for URLs the prefix before the last '/' (a bucket
    root is its own parent)."""
    m = _URL.match(path)
    if m is None or not is_url(path):
        return os.path.dirname(path)
    rest = path[m.end():].rstrip("/")
    return path[:m.end()] + (rest.rpartition("/")[0] if "/" in rest else rest)


def basename(path: str) -> str:
    if is_url(path):
        return path.rstrip("/").rpartition("/")[2]
    return os.path.basename(path)


def relpath(path: str, base: str) -> Optional[str]:
    """`path` relative to `base` when it lies inside it, else None (local paths compared absolutely)."""
    if is_url(path) or is_url(base):
        base = base.rstrip("/")
        if path.rstrip("/") == base:
            return "."
        return path[len(base) + 1:] if path.startswith(base + "/") else None
    rel = os.path.relpath(os.path.abspath(local_path(path)), os.path.abspath(local_path(base)))
    return None if rel == ".." or rel.startswith(".." + os.sep) else rel


# ---------------------------------------------------------------- filesystems

_FS_LOCK = threading.Lock()
_FS_CACHE: Dict[Tuple[int, str, str], Any] = {}


def _emulator_host() -> str:
    host = os.environ.get("STORAGE_EMULATOR_HOST", "")
    if host in ("", "default"):
        return ""
    return host if host.startswith(("http://", "https://")) else "http://" + host


def filesystem(path: str):
    """(fsspec filesystem, path as that filesystem names it) for a URL."""
    proto = protocol(path)
    if not proto:
        raise ValueError(f"{path!r} is a local path; the IO layer handles those with os calls.")
    endpoint = _emulator_host() if proto in ("gs", "gcs") else ""
    key = (os.getpid(), proto, endpoint)
    with _FS_LOCK:
        fs = _FS_CACHE.get(key)
        if fs is None:
            fs = _FS_CACHE[key] = _make_filesystem(proto, endpoint)
    return fs, fs._strip_protocol(path)


def _make_filesystem(proto: str, endpoint: str):
    if proto in ("gs", "gcs"):
        try:
            from gcsfs.core import GCSFileSystem  # imported for gs:// only: it pulls in google-auth and aiohttp
        except ImportError:  # pragma: no cover - gcsfs is a dependency
            raise ImportError("gs:// paths need gcsfs: pip install gcsfs") from None
        # No listings cache: other processes (Beam workers) write to the same prefixes.
        kwargs: Dict[str, Any] = {"use_listings_cache": False}
        if endpoint:
            kwargs.update(endpoint_url=endpoint, token="anon")
        return GCSFileSystem(**kwargs)
    import fsspec  # imported for object stores only (local paths use os)
    try:
        try:
            return fsspec.filesystem(proto, use_listings_cache=False)
        except TypeError:
            return fsspec.filesystem(proto)
    except (ImportError, ValueError) as e:
        raise ValueError(f"no filesystem for {proto}:// paths ({e}). Install the fsspec implementation for it "
                         f"(e.g. s3fs for s3://).") from None


def _full(fs, p: str, proto: str) -> str:
    full = fs.unstrip_protocol(p)
    # Keep the caller's scheme (fsspec says 'gs://' for the 'gcs' alias) and 'memory://x', not 'memory:///x'.
    m = _URL.match(full)
    rest = full[m.end():] if m else full
    return f"{proto}://{rest.lstrip('/')}"


# ---------------------------------------------------------------- reading

def exists(path: str) -> bool:
    if not is_url(path):
        return os.path.exists(local_path(path))
    fs, p = filesystem(path)
    return bool(fs.exists(p))


def isfile(path: str) -> bool:
    if not is_url(path):
        return os.path.isfile(local_path(path))
    fs, p = filesystem(path)
    return bool(fs.isfile(p))


def read_bytes(path: str) -> bytes:
    """The whole file. FileNotFoundError (naming the path) if there is none."""
    if not is_url(path):
        with open(local_path(path), "rb") as fh:
            return fh.read()
    fs, p = filesystem(path)
    try:
        return bytes(fs.cat_file(p))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist") from None


def read_text(path: str, encoding: str = "utf-8") -> str:
    return read_bytes(path).decode(encoding)


def open_read(path: str) -> IO[bytes]:
    """A binary file object for streaming reads (use as a context manager)."""
    if not is_url(path):
        return open(local_path(path), "rb")
    fs, p = filesystem(path)
    try:
        return fs.open(p, "rb")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist") from None


def sha256_bytes(data) -> str:
    """The sha256 (hex) of bytes in memory (any bytes-like object)."""
    return hashlib.sha256(data).hexdigest()


def sha256_of(path: str) -> str:
    """The sha256 (hex) of a file's bytes (local or any object store), read in blocks."""
    h = hashlib.sha256()
    with open_read(path) as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def size(path: str) -> int:
    if not is_url(path):
        return os.path.getsize(local_path(path))
    fs, p = filesystem(path)
    return int(fs.size(p))


def list_files(pattern: str) -> List[FileStat]:
    """Files matching a glob pattern (or the one file it names), sorted by path, with their sizes."""
    if not is_url(pattern):
        local = local_path(pattern)
        paths = _glob.glob(local, recursive=True) if _GLOB_CHARS.search(local) else [local]
        return [FileStat(p, os.path.getsize(p)) for p in sorted(paths) if os.path.isfile(p)]
    proto = protocol(pattern)
    fs, p = filesystem(pattern)
    fs.invalidate_cache()  # listings must see what other processes wrote since
    if _GLOB_CHARS.search(p):
        found = fs.glob(p, detail=True)
    else:
        try:
            info = fs.info(p)
        except FileNotFoundError:
            return []
        found = {p: info}
    # A key ending in '/' is a directory placeholder (the GCS console's "Create folder", `gsutil` and other
    # tools write zero-byte `dir/` objects), not a file: an output "folder" made that way is empty.
    out = [FileStat(_full(fs, name, proto), int(info.get("size") or 0))
           for name, info in found.items() if info.get("type", "file") == "file" and not name.endswith("/")]
    return sorted(out, key=lambda f: f.path)


def glob(pattern: str) -> List[str]:
    """Paths of the files matching `pattern`, sorted."""
    return [f.path for f in list_files(pattern)]


# ---------------------------------------------------------------- writing

def makedirs(path: str) -> None:
    """Create a local directory (and parents); object stores have no directories: no-op."""
    if not is_url(path):
        os.makedirs(local_path(path), exist_ok=True)


def _chunks(data: Data) -> Iterable[bytes]:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return [bytes(data)]
    return data


def write_atomic(path: str, data: Data, *, durable: bool = True) -> Written:
    """Write `data` (bytes, or an iterable of bytes) to `path` atomically; see the module docstring.

    `durable=False`: a transient file of the job itself; no fsync, no checksum (sha256 None)."""
    h = hashlib.sha256() if durable else None
    n = 0
    if not is_url(path):
        local = local_path(path)
        directory = os.path.dirname(os.path.abspath(local))
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}-{os.path.basename(local)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            with os.fdopen(fd, "wb") as fh:
                for c in _chunks(data):
                    fh.write(c)
                    if h is not None:
                        h.update(c)
                    n += len(c)
                if durable:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(tmp, local)
        except BaseException as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(e, OSError) and _disk_full(e, path, n) is not e:
                raise _disk_full(e, path, n) from None
            raise
        return Written(path, h.hexdigest() if h is not None else None, n)
    parts = []
    for c in _chunks(data):
        c = bytes(c)
        if h is not None:
            h.update(c)
        n += len(c)
        parts.append(c)
    fs, p = filesystem(path)
    fs.pipe_file(p, b"".join(parts))
    fs.invalidate_cache(p)
    return Written(path, h.hexdigest() if h is not None else None, n)


def open_write(path: str) -> IO[bytes]:
    """A new file for streaming writes (use as a context manager); a local one that exists is an error
    (FileExistsError), an object is replaced.

    For a job's own transient files under unique names, which it refers to only once they are closed (not
    atomic, no fsync; on object stores the object appears when the file is closed)."""
    if not is_url(path):
        local = local_path(path)
        os.makedirs(os.path.dirname(os.path.abspath(local)), exist_ok=True)
        return open(local, "xb")
    fs, p = filesystem(path)
    return fs.open(p, "wb")


def move(src: str, dst: str, *, durable: bool = True) -> None:
    """Put file `src` at `dst` (replacing it) and remove `src`; both on one store.

    Local paths: `src`'s data fsync'ed first (`durable`), then `os.replace` (atomic; the same filesystem).
    Object stores: a copy inside the store, then `src` deleted (the copy appears whole)."""
    if is_url(src) != is_url(dst) or (is_url(src) and protocol(src) != protocol(dst)):
        raise ValueError(f"move: {src} and {dst} are not on one store")
    if not is_url(src):
        s, d = local_path(src), local_path(dst)
        os.makedirs(os.path.dirname(os.path.abspath(d)), exist_ok=True)
        if durable:
            fd = os.open(s, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(s, d)
        return
    fs, ps = filesystem(src)
    _, pd = filesystem(dst)
    # A copy inside the store, then a delete: not `fs.mv`, whose gcsfs version first tries GCS's moveTo
    # (hierarchical-namespace buckets) and falls back after its retries (~35 s per object on the emulator).
    fs.cp_file(ps, pd)
    fs.rm_file(ps)
    fs.invalidate_cache(ps)
    fs.invalidate_cache(pd)


def write_text_atomic(path: str, text: str, encoding: str = "utf-8") -> Written:
    return write_atomic(path, text.encode(encoding))


def delete(path: str, *, missing_ok: bool = True) -> None:
    """Delete one file."""
    if not is_url(path):
        try:
            os.unlink(local_path(path))
        except FileNotFoundError:
            if not missing_ok:
                raise
        return
    fs, p = filesystem(path)
    try:
        fs.rm_file(p)
    except FileNotFoundError:
        if not missing_ok:
            raise FileNotFoundError(f"{path} does not exist") from None
    fs.invalidate_cache(p)


def delete_tree(path: str) -> None:
    """Delete a directory (a prefix, on object stores) and everything under it; missing: nothing to do."""
    if not is_url(path):
        shutil.rmtree(local_path(path), ignore_errors=False, onerror=_ignore_missing)
        return
    fs, p = filesystem(path)
    names = [f.path for f in list_files(join(path, "**"))]
    if names:
        fs.rm([filesystem(n)[1] for n in names])
    fs.invalidate_cache(p)


def _ignore_missing(_func, _path, exc_info):
    if not issubclass(exc_info[0], FileNotFoundError):
        raise exc_info[1]

