"""TensorFlow checkpoints (the V2 "tensor bundle" format) read and written in row chunks, without TensorFlow.

A checkpoint `PREFIX` is `PREFIX.index` (a LevelDB-style table: key -> `BundleEntryProto`, the key ""
holding the `BundleHeaderProto`) and `PREFIX.data-0000i-of-0000N` (every tensor's bytes, one after the
other; a numeric tensor is its little-endian row-major buffer, checked by the entry's masked CRC32C).
This is what `tensorflow/core/util/tensor_bundle/tensor_bundle.cc` writes and `tf.train.load_checkpoint`
reads.

Why not TensorFlow's own reader: `CheckpointReader.get_tensor` and `RestoreV2` hand back whole tensors
(a slice of a tensor stored whole is read whole, then cut), so a table of 10^7 rows would be held in
memory several times over; and importing TensorFlow alone costs ~650 MB of resident memory.  Here a
tensor is read from any byte range of its data file and written chunk by chunk, its CRC computed as
it streams.

`BundleReader(prefix)`: `entries` (key -> `Entry`), `read(entry, start, length)`, `copy_to(writer)`.
`BundleWriter(prefix)`: `copy(entry, reader)` (bytes and CRC as they are), `add(key, dtype, shape,
chunks)` (a tensor streamed from numpy chunks), `finish(header)`: the data file, then the index, each
written under a temporary name and moved into place (TF's own writer does the same), so a reader
never sees half a checkpoint.
"""

from __future__ import annotations

import dataclasses
import struct
import uuid
from typing import IO, Any, Dict, Iterable, Iterator, List, Optional, Tuple

import google_crc32c
import numpy as np

from tpu_embed.artifact import io as tio
from tpu_embed.artifact.example_wire import fields as read_fields
from tpu_embed.artifact.example_wire import read_varint, varint
from tpu_embed.artifact.tfrecord import mask_crc32c

HEADER_KEY = b""
_TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_BYTES = 48  # two block handles padded to 40 bytes, then the 8-byte magic
_BLOCK_TRAILER = 5  # compression type byte + masked crc32c

# tensorflow/core/framework/types.proto: the dtypes whose tensors are plain buffers this module remaps.
DTYPES: Dict[int, np.dtype] = {1: np.dtype("<f4"), 2: np.dtype("<f8")}
DTYPE_NAMES = {1: "float32", 2: "float64", 3: "int32", 7: "string", 9: "int64", 14: "bfloat16", 19: "float16"}
DT_FLOAT = 1


class BundleError(ValueError):
    """A checkpoint that is missing, damaged, or in a form this reader does not read."""


# ---------------------------------------------------------------- protobuf wire format (the few fields used)
# Masked CRC32C, varints and the field reader are tpu_embed.artifact's (tfrecord, example_wire).

Field = Tuple[int, int, Any]  # (number, wire type, int value or bytes)


def _encode(fields: Iterable[Field]) -> bytes:
    out = bytearray()
    for number, wire, value in fields:
        out += varint(number << 3 | wire)
        if wire == 0:
            out += varint(int(value))
        elif wire == 2:
            out += varint(len(value)) + bytes(value)
        else:
            out += bytes(value)
    return bytes(out)


# ---------------------------------------------------------------- entries

@dataclasses.dataclass(frozen=True)
class Entry:
    """One `BundleEntryProto`: where a tensor's bytes are and what they hold."""

    key: bytes
    dtype: int
    shape: Tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c: int  # masked
    sliced: bool  # a partitioned tensor's full entry (its slices are entries of their own)
    fields: Tuple[Field, ...]  # every field as read, re-encoded with a new place when copied

    @property
    def name(self) -> str:
        return self.key.decode("utf-8", "backslashreplace")

    @property
    def dtype_name(self) -> str:
        return DTYPE_NAMES.get(self.dtype, f"dtype {self.dtype}")

    @staticmethod
    def parse(key: bytes, value: bytes) -> "Entry":
        d: Dict[str, Any] = {"dtype": 0, "shape": (), "shard_id": 0, "offset": 0, "size": 0, "crc32c": 0}
        sliced = False
        fields = tuple(read_fields(value))
        for number, _, v in fields:
            if number == 1:
                d["dtype"] = v
            elif number == 2:
                dims = []
                for n, _, dim in read_fields(v):
                    if n == 2:
                        size = next((s for m, _, s in read_fields(dim) if m == 1), 0)
                        dims.append(int(size) - (1 << 64) if int(size) >= 1 << 63 else int(size))
                d["shape"] = tuple(dims)
            elif number == 3:
                d["shard_id"] = v
            elif number == 4:
                d["offset"] = v
            elif number == 5:
                d["size"] = v
            elif number == 6:
                d["crc32c"] = struct.unpack("<I", v)[0]
            elif number == 7:
                sliced = True
        return Entry(key, sliced=sliced, fields=fields, **d)

    def placed(self, offset: int) -> bytes:
        """This entry's proto bytes, its data now at `offset` of shard 0."""
        kept = [f for f in self.fields if f[0] not in (3, 4)]
        return _encode(kept + [(4, 0, offset)] if offset else kept)


def entry_bytes(dtype: int, shape: Tuple[int, ...], offset: int, size: int, crc32c: int) -> bytes:
    dims = b"".join(_encode([(2, 2, _encode([(1, 0, int(s))]))]) for s in shape)
    fields: List[Field] = [(1, 0, dtype), (2, 2, dims)]
    if offset:
        fields.append((4, 0, offset))
    if size:
        fields.append((5, 0, size))
    fields.append((6, 5, struct.pack("<I", crc32c)))
    return _encode(fields)


def header_bytes(header: bytes) -> bytes:
    """The header of a one-shard bundle, keeping the endianness and version of `header`."""
    return _encode([(1, 0, 1)] + [f for f in read_fields(header) if f[0] != 1])


# ---------------------------------------------------------------- the index table (LevelDB's format)

def _block(data: bytes, handle: Tuple[int, int], path: str) -> bytes:
    offset, size = handle
    raw = data[offset:offset + size + _BLOCK_TRAILER]
    if len(raw) != size + _BLOCK_TRAILER:
        raise BundleError(f"{path} is truncated (a block ends past the file)")
    kind, crc = raw[size], struct.unpack("<I", raw[size + 1:])[0]
    if mask_crc32c(google_crc32c.extend(google_crc32c.value(raw[:size]), raw[size:size + 1])) != crc:
        raise BundleError(f"{path} is corrupt (a block's CRC does not match)")
    if kind != 0:
        raise BundleError(f"{path} has compressed blocks (type {kind}); TensorFlow writes checkpoint indexes "
                          "uncompressed: re-save the checkpoint with tf.train.Checkpoint")
    return raw[:size]


def _block_entries(block: bytes) -> Iterator[Tuple[bytes, bytes]]:
    restarts = struct.unpack("<I", block[-4:])[0]
    end = len(block) - 4 * (restarts + 1)
    pos, key = 0, b""
    while pos < end:
        shared, pos = read_varint(block, pos)
        unshared, pos = read_varint(block, pos)
        length, pos = read_varint(block, pos)
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        yield key, block[pos:pos + length]
        pos += length


def _handle(buf: bytes, pos: int = 0) -> Tuple[Tuple[int, int], int]:
    offset, pos = read_varint(buf, pos)
    size, pos = read_varint(buf, pos)
    return (offset, size), pos


def read_table(data: bytes, path: str) -> Iterator[Tuple[bytes, bytes]]:
    if len(data) < _FOOTER_BYTES:
        raise BundleError(f"{path} is not a checkpoint index (too short)")
    footer = data[-_FOOTER_BYTES:]
    lo, hi = struct.unpack("<II", footer[-8:])
    if (hi << 32 | lo) != _TABLE_MAGIC:
        raise BundleError(f"{path} is not a checkpoint index (bad magic number)")
    _, pos = _handle(footer)
    index_handle, _ = _handle(footer, pos)
    for _, handle in _block_entries(_block(data, index_handle, path)):
        yield from _block_entries(_block(data, _handle(handle)[0], path))


def _block_bytes(entries: List[Tuple[bytes, bytes]]) -> bytes:
    """A block of sorted entries, every entry a restart point (no key prefix sharing)."""
    out, restarts = bytearray(), []
    for key, value in entries:
        restarts.append(len(out))
        out += varint(0) + varint(len(key)) + varint(len(value)) + key + value
    if not restarts:
        restarts = [0]
    out += b"".join(struct.pack("<I", r) for r in restarts) + struct.pack("<I", len(restarts))
    return bytes(out)


def table_bytes(entries: List[Tuple[bytes, bytes]]) -> bytes:
    """A LevelDB table of `entries` (sorted by key), uncompressed, as TF's TableBuilder lays one out."""
    out = bytearray()

    def put(block: bytes) -> Tuple[int, int]:
        handle = (len(out), len(block))
        crc = mask_crc32c(google_crc32c.extend(google_crc32c.value(block), b"\x00"))
        out.extend(block + b"\x00" + struct.pack("<I", crc))
        return handle

    data = put(_block_bytes(entries))
    meta = put(_block_bytes([]))
    last = entries[-1][0] if entries else b""
    index = put(_block_bytes([(last, varint(data[0]) + varint(data[1]))]))
    handles = varint(meta[0]) + varint(meta[1]) + varint(index[0]) + varint(index[1])
    out += handles.ljust(40, b"\x00") + struct.pack("<II", _TABLE_MAGIC & 0xFFFFFFFF, _TABLE_MAGIC >> 32)
    return bytes(out)


# ---------------------------------------------------------------- reading

def data_path(prefix: str, shard: int, shards: int) -> str:
    return f"{prefix}.data-{shard:05d}-of-{shards:05d}"


class BundleReader:
    """The entries of checkpoint `prefix` and byte ranges of their data (local paths or object stores)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        path = f"{prefix}.index"
        try:
            data = tio.read_bytes(path)
        except FileNotFoundError:
            raise BundleError(f"{path} does not exist: {prefix} is not a checkpoint prefix (pass the prefix "
                              "tf.train.Checkpoint.save returned, e.g. DIR/ckpt-3, or the directory holding "
                              "the `checkpoint` file)") from None
        self.entries: Dict[bytes, Entry] = {}
        self.header = b""
        try:
            for key, value in read_table(data, path):
                if key == HEADER_KEY:
                    self.header = value
                else:
                    self.entries[key] = Entry.parse(key, value)
            header = dict((n, v) for n, _, v in read_fields(self.header))
        except BundleError:
            raise
        except ValueError as e:  # the protobuf reader's: a truncated varint, an unknown wire type
            raise BundleError(f"{path} is corrupt ({e})") from None
        self.num_shards = int(header.get(1, 1))
        if int(header.get(2, 0)) != 0:
            raise BundleError(f"{path} is a big-endian checkpoint; only little-endian ones are read")
        self._files: Dict[int, IO[bytes]] = {}

    def __enter__(self) -> "BundleReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()
        self._files.clear()

    def read(self, entry: Entry, start: int, length: int) -> bytes:
        """`length` bytes of `entry`'s data from byte `start`."""
        fh = self._files.get(entry.shard_id)
        if fh is None:
            path = data_path(self.prefix, entry.shard_id, self.num_shards)
            try:
                fh = self._files[entry.shard_id] = tio.open_read(path)
            except FileNotFoundError:
                raise BundleError(f"{path} is missing: the checkpoint {self.prefix} is incomplete") from None
        fh.seek(entry.offset + start)
        data = fh.read(length)
        if len(data) != length:
            raise BundleError(f"{data_path(self.prefix, entry.shard_id, self.num_shards)} is truncated "
                              f"({entry.name} ends past the file)")
        return data

    def chunks(self, entry: Entry, chunk_bytes: int = 64 << 20) -> Iterator[bytes]:
        for start in range(0, entry.size, chunk_bytes):
            yield self.read(entry, start, min(chunk_bytes, entry.size - start))


# ---------------------------------------------------------------- writing

class BundleWriter:
    """A one-shard checkpoint written tensor by tensor; `finish` puts it in place (data, then index)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self._final = data_path(prefix, 0, 1)
        self._tmp = tio.join(tio.dirname(self._final), f".tmp-{uuid.uuid4().hex}-{tio.basename(self._final)}")
        self._fh: Optional[IO[bytes]] = tio.open_write(self._tmp)
        self._size = 0
        self._entries: Dict[bytes, bytes] = {}

    def _write(self, data) -> None:
        assert self._fh is not None, "the writer is finished"
        self._fh.write(data)
        self._size += len(data)

    @property
    def written(self):
        """The keys of the tensors written so far."""
        return self._entries.keys()

    def copy(self, entry: Entry, reader: BundleReader) -> None:
        """`entry` as it is (any dtype, its CRC unchanged)."""
        offset = self._size
        for chunk in reader.chunks(entry):
            self._write(chunk)
        self._entries[entry.key] = entry.placed(offset if entry.size or not entry.sliced else 0)

    def add(self, key: bytes, dtype: int, shape: Tuple[int, ...], chunks: Iterable[np.ndarray]) -> None:
        """A numeric tensor from its row-major chunks (C-contiguous arrays of its dtype)."""
        offset, crc = self._size, 0
        for chunk in chunks:
            buf = np.ascontiguousarray(chunk).tobytes()  # google_crc32c takes bytes only
            crc = google_crc32c.extend(crc, buf)
            self._write(buf)
        size = self._size - offset
        want = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype].itemsize
        if size != want:
            raise AssertionError(f"{key!r}: wrote {size} bytes for shape {shape}, expected {want}")
        self._entries[key] = entry_bytes(dtype, shape, offset, size, mask_crc32c(crc))

    def finish(self, header: bytes) -> None:
        assert self._fh is not None, "the writer is finished"
        self._fh.close()
        self._fh = None
        tio.move(self._tmp, self._final)
        index = table_bytes([(HEADER_KEY, header_bytes(header))] + sorted(self._entries.items()))
        tio.write_atomic(f"{self.prefix}.index", index)

    def abort(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        tio.delete(self._tmp)
