"""Every chunk's valid example count, recorded by the vocabulary job for the shard job.

The shard job must know where each chunk's examples start in the global order before it can cut
steps. Without this record it would learn that from every mapped block (a side input, which makes the
runner hold all the mapped data); with it, the offsets are plain data
(`pipelines.jobs.global_batches.FormGlobalBatches`).

Every vocabulary job writes the record into its output directory (`FILENAME`; a read's own record, not
part of the artifact: the manifest does not list it, and `pipelines.output.sweep` leaves it). `run` takes it
(reads and deletes it) for its shard job; after `tpu-embed vocab` it stays for the `tpu-embed shard` /
`profile` runs that use those vocabularies (`runner.run_shard`). It is used only if it was made by a read
identical to the shard job's (`read_key`): the same spec, input files (path and size), format, chunk rows,
splits and strictness; otherwise the shard job reads the input once to record the sizes itself (keeping the
read for its second pass, as `run` does). The shard job still checks the sizes it sees against it
(`pipelines.jobs.global_batches.InputChangedError`).
"""

from __future__ import annotations

import json
from typing import Any, List, Optional, Sequence, Tuple

from pipelines.output import READ_RECORD
from tpu_embed.artifact import io as tio

FILENAME = READ_RECORD  # the name `pipelines.output.sweep` keeps
READ_PASS_FILENAME = ".tmp-chunk-sizes.json"  # the shard job's own read pass (`runner.run_shard`), taken at once

ChunkSizes = List[Tuple[Tuple[int, int], int]]  # [((file index, first record), valid examples)]


def read_key(cfg, files: Sequence[Any], split_bytes: int) -> dict:
    """What makes two reads cut the same chunks. `split_bytes`: the split size the job reads with
    (`runner.split_bytes_for`); it changes the chunks only where a CSV or Parquet file is larger."""
    fmt = cfg.spec.inputs.format
    split = int(split_bytes) if fmt != "tfrecord" and any(int(f.size) > split_bytes for f in files) else None
    return {"spec": cfg.spec.fingerprint, "format": fmt,
            "inputs": [[f.path, int(f.size)] for f in files], "chunk_rows": int(cfg.chunk_rows),
            "split_bytes": split, "strict": bool(cfg.strict)}


def path(output: str, name: str = FILENAME) -> str:
    return tio.join(output, name)


def write(output: str, key: dict, sizes: ChunkSizes, name: str = FILENAME) -> str:
    body = {"key": key, "chunks": sorted([int(f), int(c), int(n)] for (f, c), n in sizes)}
    tio.write_atomic(path(output, name), json.dumps(body, separators=(",", ":")).encode("utf-8"))
    return path(output, name)


def read(output: str, key: dict, name: str = FILENAME) -> Optional[ChunkSizes]:
    """The recorded sizes if they were made by a read with this `key`, else None (also without a record)."""
    p = path(output, name)
    if not tio.exists(p):
        return None
    try:
        body = json.loads(tio.read_bytes(p))
    except (OSError, ValueError):  # a damaged record is no record: the shard job records the sizes itself
        return None
    if not isinstance(body, dict) or body.get("key") != key:
        return None
    return [((f, c), n) for f, c, n in body["chunks"]]


def take(output: str, key: dict, name: str = FILENAME) -> Optional[ChunkSizes]:
    """`read`, and the record is deleted."""
    try:
        return read(output, key, name)
    finally:
        if tio.exists(path(output, name)):
            tio.delete(path(output, name))
