"""`run` reads and parses its input once: the vocabulary job keeps what its reader produced for the shard job.

Without it the shard job reads and parses every input file again: at 2 M benchmark examples about a
fifth of `run`'s time (CSV framing, pyarrow's parser, the numbers and the categorical splits).

* The vocabulary job's reader pickles each split's outputs (parsed chunks, dead letters, the split's
  counts), in the order it yields them, into parts of at most `PART_BYTES` under
  `<output>/.tmp-read-spill/`, each written atomically; the last part ends with an end mark.
* The shard job's reader yields them again instead of reading the split: the same chunks, dead
  letters and counts, so every output byte is the one a second read gives (tests/test_read_spill.py).
* `run` deletes the directory when the shard job ends, also when it fails (and before the vocabulary
  job, a leftover of a killed run). The manifest never lists it; `--overwrite` sweeps it like any
  `.tmp-` leftover.

The parts are pickles written by this job into its own output directory and read back by the same
job, as Beam's own shuffles are; disk use is about the parsed input's size (twice the CSV for the
benchmark's data) until the shard job ends. A split whose parts are incomplete (e.g. the directory
was changed meanwhile) stops the shard job with the fix: re-run `tpu-embed run`.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
from typing import Any, Callable, Iterator, List, Optional

import numpy as np
import pyarrow as pa

from pipelines.background import Behind
from pipelines.parse import FeatureValues, ParsedChunk
from pipelines.token_index import DICTIONARY_TYPE, dictionary_encode, is_encoded
from tpu_embed import io as tio

SPILL_DIR = ".tmp-read-spill"
PART_BYTES = 64 << 20  # a part's pickles are buffered before the part is written


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
    `close` waits for."""

    def __init__(self, directory: str, file_index: int, split_index: int, part_bytes: Optional[int] = None,
                 writes: Optional[Behind] = None):
        self.directory, self.file_index, self.split_index = directory, file_index, split_index
        self.part_bytes = PART_BYTES if part_bytes is None else part_bytes
        self._buffer: List[bytes] = []
        self._size = 0
        self._part = 0
        self._own = writes is None
        self._writes = Behind() if writes is None else writes

    def add(self, item: Any) -> None:
        data = pickle.dumps(_compact(item), protocol=pickle.HIGHEST_PROTOCOL)
        self._buffer.append(data)
        self._size += len(data)
        if self._size >= self.part_bytes:
            self._flush()

    def close(self) -> None:
        """Write the last part (and wait until every part is written, unless `writes` was given)."""
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
    """The items one split's writer added, in order."""
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
        lengths, tokens = fv.lengths, fv.tokens
        if lengths.size and int(lengths.min()) >= 0:
            lengths = lengths.astype(np.min_scalar_type(int(lengths.max())))
        if tokens is not None and tokens.type == DICTIONARY_TYPE:
            dictionary = tokens.dictionary
            if dictionary.nbytes < _NARROW_TOKENS:
                dictionary = dictionary.cast(pa.binary())
            m = len(dictionary)
            width = pa.int8() if m <= 1 << 7 else pa.int16() if m <= 1 << 15 else pa.int32()
            tokens = pa.DictionaryArray.from_arrays(tokens.indices.cast(width), dictionary)
        elif tokens is not None and tokens.type == pa.large_binary() and tokens.nbytes < _NARROW_TOKENS:
            tokens = tokens.cast(pa.binary())  # not encoded (not the parser's): 32-bit offsets at least
        return dataclasses.replace(fv, lengths=lengths, tokens=tokens)

    return _with_features(item, narrow)


def _restore(item):
    """Inverse of `_compact`: lengths int64, tokens `DICTIONARY_TYPE` (the types `pipelines.parse` makes)."""
    def widen(fv: FeatureValues) -> FeatureValues:
        tokens = fv.tokens
        if tokens is not None and is_encoded(tokens):
            tokens = dictionary_encode(tokens)  # an encoded array of other widths: to DICTIONARY_TYPE, no re-hash
        elif tokens is not None and tokens.type == pa.binary():
            tokens = tokens.cast(pa.large_binary())
        return dataclasses.replace(fv, lengths=fv.lengths.astype(np.int64, copy=False), tokens=tokens)

    return _with_features(item, widen)


def _with_features(item, convert: Callable[[FeatureValues], FeatureValues]):
    """(tag, chunk) with `convert` applied to each of the chunk's features; other items as they are."""
    tag, value = item
    if not isinstance(value, ParsedChunk):
        return item
    return tag, dataclasses.replace(value, features={k: convert(fv) for k, fv in value.features.items()})


def remove(output: str) -> None:
    tio.delete_tree(spill_dir(output))
