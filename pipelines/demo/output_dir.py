"""The demo's output directory: what a demo writes there, how an earlier demo's is replaced, one demo at a time.

A demo writes into an empty (or new) directory, or one an earlier demo wrote (its `demo.json`, written first):
then it replaces what a demo writes there (`DEMO_ENTRIES`) and keeps every other file. A directory with files
and no `demo.json` is refused (nothing deleted). One demo at a time per directory: it holds `LOCK` (flock,
released when the process ends, killed or not); a second is refused naming the first.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
from typing import Iterator, List

from pipelines.demo.options import DemoError

MARKER = "demo.json"  # in the output directory: written first, it makes the directory a demo's
DATA_DIR, ARTIFACT_DIR, REPORT_DIR, MODEL_DIR = "data", "artifact", "report", "model"
CHECKPOINT_DIR, SPEC_FILE = "checkpoints", "spec.yaml"
# What a demo writes at the top of its output, every one of them (`--days 2`: artifact-day1, -day2): what the next
# demo replaces.
DEMO_ENTRIES = (MARKER, SPEC_FILE, DATA_DIR, ARTIFACT_DIR, f"{ARTIFACT_DIR}-day1", f"{ARTIFACT_DIR}-day2",
                CHECKPOINT_DIR, MODEL_DIR, REPORT_DIR)
LOCK = ".tpu-embed-demo.lock"  # held while a demo runs


def prepare_output(output: str) -> List[str]:
    """Make `output` ready for a demo: new or empty, or an earlier demo's, whose entries (`DEMO_ENTRIES`) are
    deleted; DemoError (nothing deleted) if it holds files and no demo.json. Returns what was deleted."""
    if os.path.exists(output) and not os.path.isdir(output):
        raise DemoError(f"--output {output} is a file, not a directory. Choose another --output.")
    names = sorted(n for n in os.listdir(output) if n != LOCK) if os.path.isdir(output) else []
    if names and MARKER not in names:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise DemoError(f"--output {output} holds files that `tpu-embed demo` did not write ({shown}; no {MARKER}): "
                        "the demo writes into a new or empty directory, or replaces an earlier demo's. Choose "
                        "another --output.")
    deleted = []
    for name in names:
        if name in DEMO_ENTRIES:
            path = os.path.join(output, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
            deleted.append(name)
    os.makedirs(output, exist_ok=True)
    return deleted


_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


@contextlib.contextmanager
def holding(output: str) -> Iterator[None]:
    """One demo at a time in `output`: `LOCK` locked (fcntl.flock) while the block runs, or DemoError naming the
    demo that holds it. Where the filesystem has no locks, the block runs unlocked."""
    import fcntl
    if os.path.exists(output) and not os.path.isdir(output):
        raise DemoError(f"--output {output} is a file, not a directory. Choose another --output.")
    os.makedirs(output, exist_ok=True)
    path = os.path.join(output, LOCK)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise DemoError(f"--output {output} is being written by another demo ({holder}, holding {path}). Wait "
                            "for it to finish, or choose another --output.") from None
        except OSError as e:
            os.close(fd)
            if e.errno not in _NO_FLOCK:
                raise
            yield  # no locks on this filesystem
            return
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # removed by the demo that held it, after this one opened it: open the current file
    try:
        this_holder = f"pid {os.getpid()} on {socket.gethostname()}".encode("utf-8")
        os.ftruncate(fd, 0)
        os.pwrite(fd, this_holder, 0)
        yield
    finally:
        try:
            os.remove(path)  # still locked: a demo waiting on this file opens the path again
        except FileNotFoundError:
            pass
        os.close(fd)
