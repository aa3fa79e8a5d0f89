"""TFRecord files: the one codec of the repository (framing, masked CRC32C, compression).

A TFRecord file is a sequence of frames, all integers little-endian:

    uint64 length | uint32 masked crc32c of the 8 length bytes | payload | uint32 masked crc32c of the payload

(`masked_crc32c`; `mask_crc32c` masks a CRC32C computed elsewhere, e.g. as data streams: TensorFlow's
checkpoints store the same masked CRCs).  A compressed file ("GZIP" or "ZLIB", `tf.data.TFRecordDataset`'s
`compression_type`) is one zlib stream over its frames, byte for byte what `tf.io.TFRecordWriter` writes with
`TFRecordOptions(compression_type=...)`.

    frame(payload)                          # one frame's bytes
    compress_chunks(frames, compression)    # a file's bytes from its frames
    encode_file(payloads, compression)      # both at once
    iter_records(data)                      # (offset, payload) of a file's (decompressed) bytes
    index_records(data)                     # [(payload offset, length)] of the same, checked, no payload kept
    iter_stream(fh, name)                   # payloads from a binary file object, one record at a time
    stream_records(path, compression)       # payloads of a file (local or object store), streamed
    read_records(path, compression=None)    # every payload of a file; None: compression from its first bytes
    index_stream(fh, name) / read_payload   # where each record is, then one record by position
    scan_frames(source) / next_frame        # a reader that goes on after damage (input files)

Damage raises `TFRecordError` (a ValueError) naming the file, the problem and the byte offset.
Every reader checks the CRCs unless told `verify=False` (then only the framing: lengths and truncation).
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, Iterable, Iterator, List, Optional, Protocol, Tuple

import google_crc32c
import numpy as np

from tpu_embed.artifact import io as tio

HEADER_BYTES = 12  # uint64 length + uint32 masked crc of it
FOOTER_BYTES = 4  # uint32 masked crc of the payload
FRAME_OVERHEAD = HEADER_BYTES + FOOTER_BYTES

# What is wrong with a frame (TFRecordError.problem).
TRUNCATED_HEADER = "truncated record header"
CORRUPT_LENGTH = "corrupt record length"
TRUNCATED_RECORD = "truncated record"
CORRUPT_DATA = "corrupt record data"

COMPRESSIONS = ("none", "GZIP", "ZLIB")  # TFRecordDataset's compression_type ("none" is its "")

_crc32c = google_crc32c.value
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_HEADER = struct.Struct("<QI")


def mask_crc32c(crc):
    """TFRecord's mask of a CRC32C (an int, or elementwise a uint64 array): rotated right by 15 bits plus a
    constant, so that a CRC over bytes holding CRCs stays well distributed."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def masked_crc32c(data) -> int:
    """TFRecord's checksum of `data` (bytes): its CRC32C, masked."""
    return mask_crc32c(_crc32c(data))


class TFRecordError(ValueError):
    """A damaged TFRecord file: `problem` (one of the constants above) at byte `offset` (where the frame starts,
    in the decompressed stream of a compressed file) of `name`; `index`: the damaged record's (0-based), where
    the reader knows it."""

    def __init__(self, problem: str, offset: int, name: Optional[str] = None, index: Optional[int] = None):
        super().__init__(f"{name + ': ' if name else ''}{problem} at byte {offset}")
        self.problem, self.offset, self.name, self.index = problem, offset, name, index


# ---------------------------------------------------------------- writing

def frame(payload) -> bytes:
    """One TFRecord frame: length, masked crc32c of the length, payload, masked crc32c of the payload."""
    head, tail = frame_parts(payload)
    return head + payload + tail


def frame_parts(payload) -> Tuple[bytes, bytes]:
    """What `frame` puts before and after `payload` (12 and 4 bytes): a writer of large payloads writes the
    three pieces instead of copying the payload into one frame."""
    header = _U64.pack(len(payload))
    return header + _U32.pack(masked_crc32c(header)), _U32.pack(masked_crc32c(payload))


def encode_file(payloads: Iterable[bytes], compression: str = "none") -> bytes:
    """The bytes of a TFRecord file holding `payloads`, compressed as `tf.io.TFRecordWriter` would."""
    return b"".join(compress_chunks((frame(p) for p in payloads), compression))


# ---------------------------------------------------------------- reading

def _frame_length(data, pos: int, n: int, name: Optional[str], index: int, verify: bool) -> int:
    """The payload length of the frame at `pos` of `data` (`n` bytes), its header and extent checked."""
    if pos + HEADER_BYTES > n:
        raise TFRecordError(TRUNCATED_HEADER, pos, name, index)
    length, len_crc = _HEADER.unpack_from(data, pos)
    if verify and mask_crc32c(_crc32c(data[pos:pos + 8])) != len_crc:
        raise TFRecordError(CORRUPT_LENGTH, pos, name, index)
    if pos + FRAME_OVERHEAD + length > n:
        raise TFRecordError(TRUNCATED_RECORD, pos, name, index)
    return length


def _payload(data, pos: int, length: int, name: Optional[str], index: int, verify: bool) -> bytes:
    """The payload of the frame at `pos` of `data`, its CRC checked (a copy: the CRC32C library takes bytes)."""
    start = pos + HEADER_BYTES
    payload = data[start:start + length]
    if verify and mask_crc32c(_crc32c(payload)) != _U32.unpack_from(data, start + length)[0]:
        raise TFRecordError(CORRUPT_DATA, pos, name, index)
    return payload


def iter_records(data, name: Optional[str] = None, *, verify: bool = True) -> Iterator[Tuple[int, bytes]]:
    """(offset, payload) of every record of a (decompressed) TFRecord file's bytes; `TFRecordError` on damage."""
    pos, n, i = 0, len(data), 0
    while pos < n:
        length = _frame_length(data, pos, n, name, i, verify)
        yield pos, _payload(data, pos, length, name, i, verify)
        pos += FRAME_OVERHEAD + length
        i += 1


def index_records(data, name: Optional[str] = None, *, verify: bool = True) -> List[Tuple[int, int]]:
    """[(payload offset, length)] of every record of a (decompressed) TFRecord file's bytes, all checked like
    `iter_records` does, without keeping the payloads (each is freed before the next is read)."""
    table: List[Tuple[int, int]] = []
    pos, n = 0, len(data)
    while pos < n:
        length = _frame_length(data, pos, n, name, len(table), verify)
        _payload(data, pos, length, name, len(table), verify)
        table.append((pos + HEADER_BYTES, length))
        pos += FRAME_OVERHEAD + length
    return table


def _read_header(fh, pos: int, name: Optional[str], verify: bool, index: int) -> Optional[int]:
    """The length of record `index`, whose frame starts at `pos` (the file object's position); None at the end."""
    head = fh.read(HEADER_BYTES)
    if not head:
        return None
    if len(head) < HEADER_BYTES:
        raise TFRecordError(TRUNCATED_HEADER, pos, name, index)
    length, len_crc = _HEADER.unpack_from(head)
    if verify and mask_crc32c(_crc32c(head[:8])) != len_crc:
        raise TFRecordError(CORRUPT_LENGTH, pos, name, index)
    return length


def iter_stream(fh, name: str = "<stream>", *, verify: bool = True) -> Iterator[bytes]:
    """The payloads of the records read from a binary file object (anything with `read(n)`), one record in
    memory at a time; `TFRecordError` naming `name` on damage."""
    pos, i = 0, 0
    u32 = _U32.unpack_from
    while True:
        length = _read_header(fh, pos, name, verify, i)
        if length is None:
            return
        payload = fh.read(length)  # the payload and its CRC read apart: no copy of the payload out of a frame
        footer = fh.read(FOOTER_BYTES) if len(payload) == length else b""
        if len(footer) < FOOTER_BYTES:
            raise TFRecordError(TRUNCATED_RECORD, pos, name, i)
        if verify and mask_crc32c(_crc32c(payload)) != u32(footer, 0)[0]:
            raise TFRecordError(CORRUPT_DATA, pos, name, i)
        yield payload
        pos += FRAME_OVERHEAD + length
        i += 1


def index_stream(fh, name: str = "<stream>", *, verify: bool = True) -> List[Tuple[int, int]]:
    """[(payload offset, length)] of every record of a seekable, uncompressed file object, reading only the
    headers (length CRCs checked); the payloads are checked when read (`read_payload`)."""
    table: List[Tuple[int, int]] = []
    pos = 0
    while True:
        length = _read_header(fh, pos, name, verify, len(table))
        if length is None:
            return table
        table.append((pos + HEADER_BYTES, length))
        pos += FRAME_OVERHEAD + length
        fh.seek(pos)


def read_payload(fh, offset: int, length: int, name: str = "<stream>", *, verify: bool = True) -> bytes:
    """The payload of `length` bytes at `offset` of a seekable file object (an `index_stream` entry), its
    CRC checked; `TFRecordError` (at the frame's offset) if it is truncated or corrupt."""
    fh.seek(offset)
    payload = fh.read(length)  # apart from its CRC, as in `iter_stream`
    footer = fh.read(FOOTER_BYTES) if len(payload) == length else b""
    if len(footer) < FOOTER_BYTES:
        raise TFRecordError(TRUNCATED_RECORD, offset - HEADER_BYTES, name)
    if verify and mask_crc32c(_crc32c(payload)) != _U32.unpack_from(footer, 0)[0]:
        raise TFRecordError(CORRUPT_DATA, offset - HEADER_BYTES, name)
    return payload


def stream_records(path: str, compression: str = "none", *, verify: bool = True) -> Iterator[bytes]:
    """The payloads of a TFRecord file (local or any object store, `tpu_embed.artifact.io`), streamed and
    decompressed; one record in memory at a time."""
    c = canonical_compression(compression)
    with tio.open_read(path) as fh:
        yield from iter_stream(fh if c == "none" else Inflating(fh, c, path), path, verify=verify)


def read_records(path: str, compression: Optional[str] = None, *, verify: bool = True) -> List[bytes]:
    """Every payload of a TFRecord file (local or any object store), read whole.

    `compression`: "none" / "GZIP" / "ZLIB"; None: recognised from the file's first bytes (`sniff_compression`).
    """
    data = tio.read_bytes(path)
    c = sniff_compression(data) if compression is None else canonical_compression(compression)
    return [payload for _, payload in iter_records(decompress(data, c, path), path, verify=verify)]


# ---------------------------------------------------------------- reading on after damage

class RangedSource(Protocol):
    """A file read by ranges: its `size`, and `read(offset, n)` giving bytes [offset, offset + n) (fewer only at
    the end of the file)."""

    size: int

    def read(self, offset: int, n: int) -> bytes: ...


# One unit: the fast loop and the recovery share the buffer, its base and the run's unchecked CRCs.
def scan_frames(src: RangedSource, most: int = 4096, read_bytes: int = 4 << 20) -> Iterator[Tuple[str, int, Any]]:
    """Walk a TFRecord file: ("ok", pos, [payloads]) | ("corrupt", pos, detail) | ("lost", pos, detail) |
    ("after_loss", pos, [payloads]).

    A record whose length field is intact (its CRC matches) but whose data CRC does not is "corrupt":
    that record is bad, the next one starts where the length says. A bad length CRC or a truncated
    record means the framing is "lost" at `pos`; the rest of the file is then scanned for frames
    whose two CRCs both match (`next_frame`; yielded as ("after_loss", pos, [payloads])), so that what
    is lost can be counted; bytes between frames are reported as further ("lost", ...) gaps. Good
    frames come in runs of at most `most` (one event per run, the first one's offset). Memory is one
    read (`read_bytes`) plus the largest record.

    The CRCs of a run are masked and compared together (`_first_bad`), before the buffer moves on and
    at the run's end: a frame at a time, that is most of the cost of reading small records.
    """
    header, u32, crc = _HEADER.unpack_from, _U32.unpack_from, _crc32c
    n = src.size
    buf, base = b"", 0
    pos = 0
    lost = False
    while pos < n:
        start = pos
        good: List[bytes] = []
        raw: List[int] = []  # CRC32C of the length bytes and of the payload of each frame of good[checked:]
        stored: List[int] = []  # the masked CRCs those frames hold
        checked = 0
        broken = False  # the run ends at a frame that is not good
        while pos < n and len(good) < most:  # the fast path: consecutive good frames
            o = pos - base
            if o + HEADER_BYTES > len(buf):  # read on (from pos, if it is past the buffer: after a skipped record)
                if _first_bad(raw, stored) is not None:  # checked below; the buffer still holds those frames
                    broken = True
                    break
                checked, raw, stored = len(good), [], []
                more = max(read_bytes, FRAME_OVERHEAD)
                buf = buf[o:] + src.read(base + len(buf), more) if o < len(buf) else src.read(pos, more)
                base, o = pos, 0
            if pos + HEADER_BYTES > n:
                broken = True
                break
            length, lcrc = header(buf, o)
            end = pos + FRAME_OVERHEAD + length
            if end > n:
                broken = True
                break
            if end - base > len(buf):
                unreadable = _first_bad(raw, stored) is not None or mask_crc32c(crc(buf[o:o + 8])) != lcrc
                if unreadable:  # not a length to read
                    broken = True
                    break
                checked, raw, stored = len(good), [], []
                buf, base = buf[o:] + src.read(base + len(buf), max(read_bytes, end - base - len(buf))), pos
                o = 0
            payload = buf[o + HEADER_BYTES:o + HEADER_BYTES + length]
            raw.append(crc(buf[o:o + 8]))
            raw.append(crc(payload))
            stored.append(lcrc)
            stored.append(u32(buf, o + HEADER_BYTES + length)[0])
            good.append(payload)
            pos = end
        bad = _first_bad(raw, stored)
        if bad is not None:  # the run ends at that frame
            good, broken = good[:checked + bad], True
            pos = start + sum(FRAME_OVERHEAD + len(p) for p in good)
        if good:
            yield ("after_loss" if lost else "ok"), start, good
        if not broken:
            continue
        o = pos - base  # the frame at pos is bad; the buffer holds its header if the file does
        if pos + HEADER_BYTES > n:
            why = TRUNCATED_HEADER
        else:
            length, lcrc = header(buf, o)
            length_ok = masked_crc32c(buf[o:o + 8]) == lcrc
            if length_ok and pos + FRAME_OVERHEAD + length <= n:
                yield "corrupt", pos, f"record data CRC mismatch at byte {pos} ({length} bytes)"
                pos += FRAME_OVERHEAD + length
                continue
            why = TRUNCATED_RECORD if length_ok else CORRUPT_LENGTH
        nxt = next_frame(src, pos + 1, read_bytes)
        yield "lost", pos, f"{why} at byte {pos}; bytes {pos}..{nxt - 1} cannot be read as records"
        lost = True
        pos = nxt


def _first_bad(raw: List[int], stored: List[int]) -> Optional[int]:
    """The index of the first frame whose two CRCs (`raw`: CRC32Cs of its length bytes and payload, two per
    frame) do not match the masked ones it holds (`stored`); None if all do."""
    if not raw:
        return None
    bad = np.flatnonzero(mask_crc32c(np.array(raw, np.uint64)) != np.array(stored, np.uint64))
    return int(bad[0]) // 2 if bad.size else None


def next_frame(src: RangedSource, start: int, window: int = 4 << 20) -> int:
    """The offset of the first frame at or after `start` whose length CRC and data CRC both match (the
    size of the file if there is none). Only offsets whose length fits in the file are checked."""
    n = src.size
    p0 = start
    while p0 + FRAME_OVERHEAD <= n:
        chunk = src.read(p0, window + HEADER_BYTES - 1)
        arr = np.frombuffer(chunk, np.uint8)
        m = arr.size - (HEADER_BYTES - 1)  # offsets p0 .. p0 + m - 1 have their 12 header bytes here
        if m <= 0:
            break
        length = np.zeros(m, np.uint64)
        for k in range(8):
            length |= arr[k:k + m].astype(np.uint64) << np.uint64(8 * k)
        room = np.maximum(n - FRAME_OVERHEAD - (p0 + np.arange(m, dtype=np.int64)), -1)
        cand = np.flatnonzero((room >= 0) & (length <= room.astype(np.uint64)))
        for i in cand.tolist():
            if masked_crc32c(chunk[i:i + 8]) != _U32.unpack_from(chunk, i + 8)[0]:
                continue
            p, ln = p0 + i, int(length[i])
            body = src.read(p + HEADER_BYTES, ln + FOOTER_BYTES)
            if len(body) == ln + FOOTER_BYTES and masked_crc32c(body[:ln]) == _U32.unpack_from(body, ln)[0]:
                return p
        p0 += m
    return n


# ---------------------------------------------------------------- compression (whole files, as TF's writer)

# TF's TFRecordWriter with TFRecordOptions("GZIP" / "ZLIB") deflates the whole framed stream with zlib's
# defaults as TF sets them (ZlibCompressionOptions: level Z_DEFAULT_COMPRESSION = 6, mem_level 9, 15-bit
# window, Z_NO_FLUSH until the end). GZIP: zlib's own header for windowBits 31 -- no file name, mtime 0,
# extra flags 0, OS 3 (Unix) -- written here explicitly, so the bytes do not depend on the platform.
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03"
ZLIB_LEVEL, ZLIB_MEM_LEVEL = 6, 9


def canonical_compression(value: Optional[str]) -> str:
    """"none" | "GZIP" | "ZLIB" from any case ("" and None mean "none"); ValueError otherwise."""
    v = "none" if value in (None, "") else str(value)
    for c in COMPRESSIONS:
        if v.lower() == c.lower():
            return c
    raise ValueError(f"compression must be one of {COMPRESSIONS} (any case), got {value!r}")


def compress_chunks(chunks: Iterable[bytes], compression: str) -> Iterator[bytes]:
    """The bytes of a TFRecord file from its frames: as they are ("none"), or one GZIP / ZLIB stream."""
    c = canonical_compression(compression)
    if c == "none":
        yield from chunks
        return
    z = zlib.compressobj(ZLIB_LEVEL, zlib.DEFLATED, 15 if c == "ZLIB" else -15, ZLIB_MEM_LEVEL)
    crc = size = 0
    if c == "GZIP":
        yield GZIP_HEADER
    for chunk in chunks:
        if c == "GZIP":
            crc, size = zlib.crc32(chunk, crc), size + len(chunk)
        out = z.compress(chunk)
        if out:
            yield out
    tail = z.flush()
    if c == "GZIP":
        tail += struct.pack("<II", crc, size & 0xFFFFFFFF)
    yield tail


def _decompressor(compression: str):
    return zlib.decompressobj(31 if compression == "GZIP" else 15)


def decompress(data: bytes, compression: str, name: str = "<bytes>") -> bytes:
    """Inverse of `compress_chunks` (checks the stream's CRC / Adler-32 and length); ValueError naming `name`."""
    c = canonical_compression(compression)
    if c == "none":
        return data
    d = _decompressor(c)
    try:
        out = d.decompress(data)
    except zlib.error as e:
        raise ValueError(f"{name}: not a valid {c} stream ({e})") from None
    if not d.eof:
        raise ValueError(f"{name}: the {c} stream is truncated after {len(data)} bytes")
    if d.unused_data:
        raise ValueError(f"{name}: {len(d.unused_data)} bytes after the end of the {c} stream")
    return out


class Inflating:
    """A binary file object's decompressed bytes ("GZIP" / "ZLIB"), read(n) at a time (`iter_stream`'s input)."""

    def __init__(self, fh, compression: str, name: str):
        self.fh, self.c, self.name, self.d = fh, compression, name, _decompressor(compression)
        self.buf = b""

    def read(self, n: int) -> bytes:
        while len(self.buf) < n and not self.d.eof:
            chunk = self.fh.read(1 << 20)
            try:
                self.buf += self.d.decompress(chunk) if chunk else b""
            except zlib.error as e:
                raise ValueError(f"{self.name}: not a valid {self.c} stream ({e})") from None
            if not chunk:
                if not self.d.eof:
                    raise ValueError(f"{self.name}: the {self.c} stream is truncated")
                break
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def sniff_compression(data: bytes) -> str:
    """"none" if `data` starts with a TFRecord header whose length CRC checks (or is empty), else "GZIP" /
    "ZLIB" by the stream's magic bytes, else "none" (and the TFRecord reader reports the damage)."""
    if not data or (len(data) >= HEADER_BYTES and masked_crc32c(data[:8]) == _U32.unpack_from(data, 8)[0]):
        return "none"
    if data[:2] == b"\x1f\x8b":
        return "GZIP"
    if len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0:
        return "ZLIB"
    return "none"
