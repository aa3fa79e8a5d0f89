"""`run` reads and parses its input once: the vocabulary job keeps what its reader produced for the shard job.

A second read and parse of every input file by the shard job would cost, at 2 M benchmark examples,
about a fifth of `run`'s time (CSV framing, pyarrow's parser, the numbers and the categorical splits).

* The vocabulary job's reader pickles each split's outputs (parsed chunks, dead letters, the split's
  counts), in the order it yields them, into parts of at most `PART_BYTES` under
  `<output>/.tmp-read-spill/`, each written atomically; the last part ends with an end mark.
* The shard job's reader yields them again instead of reading the split: the same chunks, dead
  letters and counts, so every output byte is the one a second read gives (tests/pipelines/read/test_read_spill.py).
* `run` deletes the directory when the shard job ends, also when it fails (and before the vocabulary
  job, a leftover of a killed run). The manifest never lists it; `--overwrite` sweeps it like any
  `.tmp-` leftover.
* Where both jobs run in this process (the in-process DirectRunner with one worker: `runner.run_all`
  decides), a writer given `memory_bytes` keeps a split's items in this process (as they are but for each feature's
  lengths, held in one byte where they fit, `_narrow_lengths`), while
  the items kept by all writers stay under that many bytes (`MEMORY_BYTES` by default; as
  `approx_nbytes` counts them); the split's later items go to its parts. The shard
  job's reader then takes the kept items first (releasing them as it goes), then the parts. At 2 M
  benchmark examples everything fits (~0.8 GB): no compaction, pickling, files or restoring, ~0.9 s of
  CPU in each job (docs/benchmarks.md); at 10 M the first ~2.5 M examples' chunks are kept, the rest
  spilled, so memory stays bounded. `remove` also drops what a directory kept.

The parts are pickles written by this job into its own output directory and read back by the same
job, as Beam's own shuffles are; disk use is about the parsed input's size (twice the CSV for the
benchmark's data) until the shard job ends. A split whose parts are incomplete (e.g. the directory
was changed meanwhile) stops the shard job with the fix: re-run `tpu-embed run`.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import pyarrow as pa

from pipelines.background import Behind
from pipelines.read.parse import FeatureValues, ParsedChunk
from pipelines.token_index import DICTIONARY_TYPE, dictionary_encode, is_encoded
from tpu_embed.artifact import io as tio

SPILL_DIR = ".tmp-read-spill"
PART_BYTES = 64 << 20  # a part's pickles are buffered before the part is written
MEMORY_BYTES = 1 << 30  # what writers keep in memory where both jobs run in one process (`run --read-memory-mb`)


def approx_nbytes(value, depth: int = 0) -> int:
    """About how many bytes `value` holds: its arrays' and bytes' sizes, walked a few levels deep."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, (pa.Array, pa.ChunkedArray, pa.Table, pa.RecordBatch)):
        return int(value.nbytes)
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    if depth >= 4:
        return 8
    if isinstance(value, dict):
        return sum(approx_nbytes(k, depth + 1) + approx_nbytes(v, depth + 1) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(approx_nbytes(v, depth + 1) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(approx_nbytes(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value))
    return 8



@dataclasses.dataclass
class _Kept:
    """A split's first items (with their sizes), kept in this process; `whole`: all of them (no parts)."""
    items: List[Tuple[Any, int]]
    nbytes: int = 0
    whole: bool = False


_kept: Dict[str, Dict[Tuple[int, int], _Kept]] = {}  # spill directory -> (file index, split index) -> items
_kept_bytes = 0
_kept_lock = threading.Lock()


def kept_bytes() -> int:
    """The bytes of items kept in this process (by `approx_nbytes`)."""
    return _kept_bytes


def _keep(directory: str, key: Tuple[int, int], kept: Optional[_Kept]) -> None:
    """Set (or drop, with None) a split's kept items."""
    global _kept_bytes
    with _kept_lock:
        splits = _kept.setdefault(directory, {})
        old = splits.pop(key, None)
        _kept_bytes -= old.nbytes if old is not None else 0
        if kept is not None:
            splits[key] = kept
            _kept_bytes += kept.nbytes


def _reserve(nbytes: int, limit: int) -> bool:
    global _kept_bytes
    with _kept_lock:
        if _kept_bytes + nbytes > limit:
            return False
        _kept_bytes += nbytes
        return True


def _release(nbytes: int) -> None:
    global _kept_bytes
    with _kept_lock:
        _kept_bytes -= nbytes


class _End:
    """The end mark after a split's last item."""


class IncompleteSpillError(RuntimeError):
    pass


def spill_dir(output: str) -> str:
    return tio.join(output, SPILL_DIR)


def _part_path(directory: str, file_index: int, split_index: int, part: int) -> str:
    return tio.join(directory, f"{file_index:06d}-{split_index:06d}-{part:06d}.pkl")


class SpillWriter:
    """One split's items -> its parts (pickled in order, a part written once PART_BYTES are buffered).

    The parts are written behind (`pipelines.background.Behind`): by `writes` if given (shared by a
    bundle's splits; its owner waits for it before the bundle ends), else by the writer's own, which
    `close` waits for. `memory_bytes`: keep the split's first items in this process while all kept items
    stay under that many bytes (see the module docstring; only where the reader runs in this process)."""

    def __init__(self, directory: str, file_index: int, split_index: int, part_bytes: Optional[int] = None,
                 writes: Optional[Behind] = None, memory_bytes: int = 0):
        self.directory, self.file_index, self.split_index = directory, file_index, split_index
        self.part_bytes = PART_BYTES if part_bytes is None else part_bytes
        self._buffer: List[bytes] = []
        self._size = 0
        self._part = 0
        self._own = writes is None
        self._writes = Behind() if writes is None else writes
        self._memory_bytes = memory_bytes
        self._kept: Optional[_Kept] = _Kept([]) if memory_bytes > 0 else None
        _keep(directory, (file_index, split_index), self._kept)  # replaces a retried split's earlier items

    def add(self, item: Any) -> None:
        if self._kept is not None and self._part == 0 and not self._buffer:  # nothing of the split on disk yet
            item = _with_features(item, _narrow_lengths)  # 1 byte a length instead of 8: fresh memory is slow
            nbytes = approx_nbytes(item)
            if _reserve(nbytes, self._memory_bytes):
                self._kept.items.append((item, nbytes))
                self._kept.nbytes += nbytes
                return
        data = pickle.dumps(_compact(item), protocol=pickle.HIGHEST_PROTOCOL)
        self._buffer.append(data)
        self._size += len(data)
        if self._size >= self.part_bytes:
            self._flush()

    def close(self) -> None:
        """Write the last part (and wait until every part is written, unless `writes` was given)."""
        if self._kept is not None and self._part == 0 and not self._buffer:
            self._kept.whole = True  # every item kept: no parts
            return
        self._buffer.append(pickle.dumps(_End, protocol=pickle.HIGHEST_PROTOCOL))
        self._flush()
        if self._own:
            self._writes.close()

    def _flush(self) -> None:
        path = _part_path(self.directory, self.file_index, self.split_index, self._part)
        # Transient (run deletes it): no fsync.
        self._writes.run(tio.write_atomic, path, self._buffer, durable=False)
        self._buffer, self._size = [], 0
        self._part += 1


def replay(directory: str, file_index: int, split_index: int) -> Iterator[Any]:
    """The items one split's writer added, in order: those it kept in this process (each released as it is
    yielded), then those in its parts."""
    with _kept_lock:
        kept = _kept.get(directory, {}).pop((file_index, split_index), None)
    if kept is not None:
        items, kept.items = kept.items[::-1], []
        try:
            while items:
                item, nbytes = items.pop()
                kept.nbytes -= nbytes
                _release(nbytes)
                yield _with_features(item, _widen_lengths)
        finally:  # also when the reader stops early: what it did not take is released
            _release(kept.nbytes)
            kept.nbytes = 0
        if kept.whole:
            return
    part = 0
    while True:
        path = _part_path(directory, file_index, split_index, part)
        if not tio.exists(path):
            raise IncompleteSpillError(
                f"{path} is missing: the vocabulary job's read of input file {file_index} (split {split_index}) is "
                f"incomplete under {directory}. Fix: re-run `tpu-embed run` (and leave its output directory alone "
                "while it runs).")
        stream = io.BytesIO(tio.read_bytes(path))
        while stream.tell() < len(stream.getbuffer()):
            item = pickle.load(stream)
            if item is _End:
                return
            yield _restore(item)
        part += 1


_NARROW_TOKENS = 1 << 31  # token bytes that 32-bit offsets address


def _compact(item):
    """A parsed chunk as it is spilled: each feature's lengths in the narrowest unsigned type that holds them,
    its dictionary codes in the narrowest signed one and its distinct tokens with 32-bit offsets. At 26
    one-token features that is about 3 bytes per value where plain int64 lengths and tokens with int64
    offsets were about 22; `_restore` gives back equal arrays of the parsed types."""
    def narrow(fv: FeatureValues) -> FeatureValues:
        fv = _narrow_lengths(fv)
        tokens = fv.tokens
        if tokens is not None and tokens.type == DICTIONARY_TYPE:
            dictionary = tokens.dictionary
            if dictionary.nbytes < _NARROW_TOKENS:
                dictionary = dictionary.cast(pa.binary())
            m = len(dictionary)
            width = pa.int8() if m <= 1 << 7 else pa.int16() if m <= 1 << 15 else pa.int32()
            tokens = pa.DictionaryArray.from_arrays(tokens.indices.cast(width), dictionary)
        elif tokens is not None and tokens.type == pa.large_binary() and tokens.nbytes < _NARROW_TOKENS:
            tokens = tokens.cast(pa.binary())  # not encoded (not the parser's): 32-bit offsets at least
        return dataclasses.replace(fv, tokens=tokens)

    return _with_features(item, narrow)


def _narrow_lengths(fv: FeatureValues) -> FeatureValues:
    """The feature's lengths in the narrowest unsigned type that holds them (kept in memory and spilled alike: at
    1 M examples of 26 one-token features, 26 MB instead of 208; as many fewer pages the kernel maps and zeroes)."""
    lengths = fv.lengths
    if lengths.size and int(lengths.min()) >= 0:
        return dataclasses.replace(fv, lengths=lengths.astype(np.min_scalar_type(int(lengths.max()))))
    return fv


def _widen_lengths(fv: FeatureValues) -> FeatureValues:
    """Inverse of `_narrow_lengths`: int64, the parser's type."""
    return dataclasses.replace(fv, lengths=fv.lengths.astype(np.int64, copy=False))


def _restore(item):
    """Inverse of `_compact`: lengths int64, tokens `DICTIONARY_TYPE` (the types `pipelines.read.parse` makes)."""
    def widen(fv: FeatureValues) -> FeatureValues:
        tokens = fv.tokens
        if tokens is not None and is_encoded(tokens):
            tokens = dictionary_encode(tokens)  # an encoded array of other widths: to DICTIONARY_TYPE, no re-hash
        elif tokens is not None and tokens.type == pa.binary():
            tokens = tokens.cast(pa.large_binary())
        return dataclasses.replace(_widen_lengths(fv), tokens=tokens)

    return _with_features(item, widen)


def _with_features(item, convert: Callable[[FeatureValues], FeatureValues]):
    """(tag, chunk) with `convert` applied to each of the chunk's features; other items as they are."""
    tag, value = item
    if not isinstance(value, ParsedChunk):
        return item
    return tag, dataclasses.replace(value, features={k: convert(fv) for k, fv in value.features.items()})


def remove(output: str) -> None:
    """Delete the spill directory and drop the items its writers kept in this process."""
    directory = spill_dir(output)
    with _kept_lock:
        splits = _kept.pop(directory, {})
    for kept in splits.values():
        _release(kept.nbytes)
    tio.delete_tree(directory)
