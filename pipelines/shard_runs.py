"""Shard files written in two passes, so that no worker or runner holds a shard file's records.

A shard file holds `steps_per_file` consecutive steps of one host, and its steps are built wherever
their examples are (in several bundles, on several workers, in any order). Grouping the records
themselves by shard file made the runner hold every record of the job at once (the DirectRunner
keeps a GroupByKey's whole input: 20 GB at 10 M examples). Instead:

1. Where steps are built, `RunWriter` appends each step's TFRecord frame to a buffer per shard file
   and, past `FLUSH_BYTES` and at the end of the bundle, writes each buffer in step order as one *run*
   under `<output>/.tmp-shard-runs/` (a unique name per flush: a retried bundle writes new runs and its
   lost ones are never referenced). Only a `Run` (path + (step, offset, length) per record) goes
   through the GroupByKey by shard file.
2. The shard file's writer streams the records of all its runs in step order (`frames_in_step_order`)
   into the file: the same bytes as before, whatever the bundles, workers or arrival order.
3. When every shard file is written (and, for a failed job, when it ends) `remove` deletes the
   runs directory: nothing a reader accepts ever points into it.

Peak disk is the shards' size twice (runs + files) until step 3.
"""

from __future__ import annotations

import collections
import dataclasses
import uuid
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

from pipelines.background import Behind
from tpu_embed import io as tio
from tpu_embed.shards import tfrecord_frame

RUNS_DIR = ".tmp-shard-runs"
FLUSH_BYTES = 64 << 20  # per writer: bounds a bundle's buffered records; runs stay few and large
_OPEN_RUNS = 16  # run files kept open while a shard file is assembled

FileKey = Tuple[int, int]  # (host, file number)


@dataclasses.dataclass(frozen=True)
class Run:
    path: str
    records: Tuple[Tuple[int, int, int], ...]  # (step, offset, length) of each framed record, by step


def runs_dir(output: str) -> str:
    return tio.join(output, RUNS_DIR)


class RunWriter:
    """Buffers framed records per shard file and writes them out as runs (see the module docstring)."""

    def __init__(self, output: str, flush_bytes: Optional[int] = None):
        self.output, self.flush_bytes = output, FLUSH_BYTES if flush_bytes is None else flush_bytes
        self._buffers: Dict[FileKey, List[Tuple[int, bytes]]] = collections.defaultdict(list)
        self._size = 0
        self._writes = Behind()

    def add(self, key: FileKey, step: int, record: bytes) -> List[Tuple[FileKey, Run]]:
        """Buffer one step's record; the runs written if the buffer became full (else [])."""
        frame = tfrecord_frame(record)
        self._buffers[key].append((step, frame))
        self._size += len(frame)
        return self.flush() if self._size >= self.flush_bytes else []

    def flush(self) -> List[Tuple[FileKey, Run]]:
        """Write every buffer as one run each (behind: `close` waits for the writes); their (shard file, Run)s."""
        out = []
        for key in sorted(self._buffers):
            items = sorted(self._buffers[key], key=lambda t: t[0])
            host, file_no = key
            path = tio.join(runs_dir(self.output), f"{host:05d}-{file_no:05d}-{uuid.uuid4().hex}.run")
            records, offset = [], 0
            for step, frame in items:
                records.append((step, offset, len(frame)))
                offset += len(frame)
            self._writes.run(tio.write_atomic, path, [frame for _, frame in items], durable=False)
            out.append((key, Run(path, tuple(records))))
        self._buffers.clear()
        self._size = 0
        return out

    def close(self) -> List[Tuple[FileKey, Run]]:
        """Flush, and wait until every run is written: call before the bundle ends (its Runs name the files)."""
        out = self.flush()
        self._writes.close()
        return out


def frames_in_step_order(runs: Iterable[Run]) -> Iterator[bytes]:
    """The framed records of a shard file's runs, in step order, read one at a time.

    ValueError if a step appears twice (a runner delivered a bundle's output twice)."""
    entries = sorted((step, run.path, offset, length) for run in runs for step, offset, length in run.records)
    for a, b in zip(entries, entries[1:]):
        if a[0] == b[0]:
            raise ValueError(f"step {a[0]} was built twice ({a[1]}, {b[1]}): the runner delivered one bundle's "
                             "output twice; re-run the job.")
    handles: "collections.OrderedDict[str, object]" = collections.OrderedDict()
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
