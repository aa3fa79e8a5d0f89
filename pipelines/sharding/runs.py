"""Shard files from runs, so that no worker or runner holds a shard file's records.

A shard file holds `steps_per_file` consecutive steps of one host, and its steps are built wherever
their examples are (in several bundles, on several workers, in any order). Grouping the records
themselves by shard file made the runner hold every record of the job at once (the DirectRunner
keeps a GroupByKey's whole input: 20 GB at 10 M examples). Instead:

1. Where steps are built, `RunWriter` streams each step's TFRecord frame, by a background thread, into
   one *run* per shard file and bundle under `<output>/.tmp-shard-runs/` (a unique name: a retried
   bundle writes new runs and its lost ones are never referenced), hashing it as it goes. Only a `Run`
   (path, (step, offset, length) per record, sha256, size) goes through the GroupByKey by shard file.
2. A shard file that one run holds whole, in step order (one bundle built all its steps, as a worker
   that reads the input in order does), is that run moved into place (`Run.is_whole_file`, `tio.move`):
   no second copy of its bytes, no second hash. Otherwise the shard file's writer streams the records of
   all its runs in step order (`frames_in_step_order`) into the file. The same bytes either way,
   whatever the bundles, workers or arrival order.
3. When every shard file is written (and, for a failed job, when it ends) `remove` deletes the
   runs directory: nothing a reader accepts ever points into it.

Peak disk is the shards' size twice (runs + files) until step 3 where runs are merged, once where they
are moved.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
import uuid
from typing import IO, Dict, Iterable, Iterator, List, Optional, Tuple

from pipelines.background import Behind
from tpu_embed.artifact import io as tio
from tpu_embed.artifact import tfrecord

RUNS_DIR = ".tmp-shard-runs"
FLUSH_BYTES: Optional[int] = None  # a run ends past this many bytes; None: one run per shard file and bundle
_OPEN_RUNS = 16  # run files kept open while a shard file is assembled
# A local run's data is synced to disk every this many bytes by the writer's thread, beside the build: the
# fsync before a run is moved into place (`tio.move`) then waits for the last part only (a 560 MB run:
# ~0.15 s at the end of the job otherwise).
SYNC_BYTES = 64 << 20

FileKey = Tuple[int, int]  # (host, file number)


@dataclasses.dataclass(frozen=True)
class Run:
    path: str
    records: Tuple[Tuple[int, int, int], ...]  # (step, offset, length) of each framed record, as written
    sha256: Optional[str] = None  # of the run's bytes
    size: int = 0

    def is_whole_file(self) -> bool:
        """Whether the run's bytes are its records in step order, each step once: a shard file's bytes."""
        at, last = 0, None
        for step, offset, length in self.records:
            if offset != at or (last is not None and step <= last):
                return False
            at, last = at + length, step
        return self.sha256 is not None and at == self.size


def runs_dir(output: str) -> str:
    return tio.join(output, RUNS_DIR)


class _Open:
    """A run being written (by the writer's thread only)."""

    def __init__(self, path: str):
        self.path, self.fh = path, tio.open_write(path)
        self.hash, self.size = hashlib.sha256(), 0
        self.records: List[Tuple[int, int, int]] = []  # (step, offset, length) of each frame
        self.synced = 0 if not tio.is_url(path) else None  # bytes synced to disk (None: an object store)

    def append(self, step: int, record: bytes) -> None:
        """Write `record` framed (`tfrecord.frame`), its payload not copied into the frame."""
        head, tail = tfrecord.frame_parts(record)
        for piece in (head, record, tail):
            self.fh.write(piece)
            self.hash.update(piece)
        length = len(head) + len(record) + len(tail)
        self.records.append((step, self.size, length))
        self.size += length
        if self.synced is not None and self.size - self.synced >= SYNC_BYTES:
            self.fh.flush()
            os.fdatasync(self.fh.fileno())
            self.synced = self.size

    def close(self) -> Run:
        self.fh.close()
        return Run(self.path, tuple(self.records), self.hash.hexdigest(), self.size)


class RunWriter:
    """Streams framed records into one run per shard file (see the module docstring).

    The frames are written, in the order added, by a background thread (`Behind`: at most a few frames
    wait for it). `flush_bytes` (default `FLUSH_BYTES`): a run ends once it holds this many bytes and the
    shard file's next records start another (None: one run per shard file; tests make many)."""

    def __init__(self, output: str, flush_bytes: Optional[int] = None):
        self.output, self.flush_bytes = output, FLUSH_BYTES if flush_bytes is None else flush_bytes
        self._open: Dict[FileKey, _Open] = {}
        self._writes = Behind()

    def add(self, key: FileKey, step: int, record: bytes) -> List[Tuple[FileKey, Run]]:
        """Queue one step's record; the runs that ended meanwhile (else [])."""
        self._writes.run(self._append, key, step, record)  # framed by the writer's thread
        return self._ended(self._writes.results())

    def close(self) -> List[Tuple[FileKey, Run]]:
        """End every run and wait until all are written: call before the bundle ends (its Runs name the files).
        A failed write raises here (or at `add`); the runs then stay unreferenced until `remove`."""
        try:
            self._writes.run(self._end_all)
            return self._ended(self._writes.close())
        finally:
            for run in self._open.values():  # after a failure: do not leave files open
                run.fh.close()
            self._open.clear()

    def _append(self, key: FileKey, step: int, record: bytes) -> List[Tuple[FileKey, Run]]:
        run = self._open.get(key)
        if run is None:
            host, file_no = key
            name = f"{host:05d}-{file_no:05d}-{uuid.uuid4().hex}.run"
            run = self._open[key] = _Open(tio.join(runs_dir(self.output), name))
        run.append(step, record)
        if self.flush_bytes is not None and run.size >= self.flush_bytes:
            return [(key, self._open.pop(key).close())]
        return []

    def _end_all(self) -> List[Tuple[FileKey, Run]]:
        ended = [(key, self._open[key].close()) for key in sorted(self._open)]
        self._open.clear()
        return ended

    @staticmethod
    def _ended(results) -> List[Tuple[FileKey, Run]]:
        return [item for ended in results for item in ended]


def frames_in_step_order(runs: Iterable[Run]) -> Iterator[bytes]:
    """The framed records of a shard file's runs, in step order, read one at a time.

    ValueError if a step appears twice (a runner delivered a bundle's output twice)."""
    entries = sorted((step, run.path, offset, length) for run in runs for step, offset, length in run.records)
    for a, b in zip(entries, entries[1:]):
        if a[0] == b[0]:
            raise ValueError(f"step {a[0]} was built twice ({a[1]}, {b[1]}): the runner delivered one bundle's "
                             "output twice; re-run the job.")
    handles: "collections.OrderedDict[str, IO[bytes]]" = collections.OrderedDict()
    try:
        for _step, path, offset, length in entries:
            fh = handles.get(path)
            if fh is None:
                if len(handles) >= _OPEN_RUNS:
                    handles.popitem(last=False)[1].close()
                fh = handles[path] = tio.open_read(path)
            handles.move_to_end(path)
            fh.seek(offset)
            data = fh.read(length)
            if len(data) != length:
                raise IOError(f"{path}: run file ends at {offset + len(data)}, expected a record of {length} bytes "
                              f"at {offset}; it was changed or deleted while the job ran.")
            yield data
    finally:
        for fh in handles.values():
            fh.close()


def remove(output: str) -> None:
    """Delete the runs directory and everything in it (missing: nothing to do)."""
    tio.delete_tree(runs_dir(output))
