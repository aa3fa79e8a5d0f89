"""The shard record format: one `tf.train.Example` per training step per host.

Written by `pipelines.shard`, read back by `decode_record` (numpy, no
TensorFlow), `parse_fn` (a `tf.data` map function that restores TF's
full-size CSR buffers for `TPUEmbeddingV2.dequeue`) and `input_fn`.

Features of a record (arrays are raw little-endian bytes in a bytes_list of
one element, so they parse with one `tf.io.decode_raw`):

    step                      int64   global step index
    host                      int64   host index
    label                     float32 [host_batch]
    mask                      float32 [host_batch]  1 real example, 0 tail padding
    dense                     float32 [host_batch * num_dense], row-major
    tc/<feature>/lengths      int32   [host_batch]   tensor-core features: values per example
    tc/<feature>/ids          int64   [sum(lengths)]
    tc/<feature>/weights      float32 [sum(lengths)] (weighted features only)
    sc/<chip>/<stack>/row_pointers        int32   [row_pointers_unpadded_size]
    sc/<chip>/<stack>/sorted_sample_ids   int32   [ids_unpadded_size]
    sc/<chip>/<stack>/sorted_token_ids    int32   [ids_unpadded_size]
    sc/<chip>/<stack>/sorted_gains        float32 [ids_unpadded_size]
    sc/<chip>/<stack>/sizes   int64 [row_pointers_unpadded_size, ids_unpadded_size, sample_count,
                                     num_minibatches_per_physical_sparse_core, dropped_ids]

`<chip>` is the chip's index on its host (0 .. chips_per_host-1); the global
chip is host * chips_per_host + chip.  Only the meaningful prefixes are
stored; `parse_fn` pads them back to TF's static buffer sizes (zeros, where
TF leaves uninitialised memory).  Encoding is hand-written protobuf with keys
in sorted order, so equal content gives equal bytes.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

FORMAT_VERSION = 1
SIZES_FIELDS = ("row_pointers_unpadded_size", "ids_unpadded_size", "sample_count",
                "num_minibatches_per_physical_sparse_core", "dropped_ids")
CSR_ARRAYS = (("row_pointers", np.int32), ("sorted_sample_ids", np.int32), ("sorted_token_ids", np.int32),
              ("sorted_gains", np.float32))


@dataclasses.dataclass(frozen=True)
class ShardFormat:
    """What a reader needs to know about the records of an artifact (stored in manifest.json)."""

    num_hosts: int
    chips_per_host: int
    host_batch_size: int
    dense_features: Tuple[str, ...]
    tensor_core_features: Tuple[Tuple[str, bool, int], ...]  # (name, weighted, width)
    stacks: Tuple[Tuple[str, int, int], ...]  # (stack, row_pointers buffer size, ids buffer size)
    version: int = FORMAT_VERSION

    def to_json(self) -> dict:
        return {"version": self.version, "num_hosts": self.num_hosts, "chips_per_host": self.chips_per_host,
                "host_batch_size": self.host_batch_size, "dense_features": list(self.dense_features),
                "tensor_core_features": [{"name": n, "weighted": w, "width": k}
                                         for n, w, k in self.tensor_core_features],
                "stacks": [{"name": s, "row_pointers_buffer": r, "ids_buffer": i} for s, r, i in self.stacks]}

    @classmethod
    def from_json(cls, d: Mapping) -> "ShardFormat":
        if int(d.get("version", 0)) != FORMAT_VERSION:
            raise ValueError(f"shard format version {d.get('version')} is not supported by this tpu_embed "
                             f"(expects {FORMAT_VERSION}); regenerate the shards or upgrade tpu_embed.")
        return cls(int(d["num_hosts"]), int(d["chips_per_host"]), int(d["host_batch_size"]),
                   tuple(d["dense_features"]),
                   tuple((t["name"], bool(t["weighted"]), int(t["width"])) for t in d["tensor_core_features"]),
                   tuple((s["name"], int(s["row_pointers_buffer"]), int(s["ids_buffer"])) for s in d["stacks"]))


# ---------------------------------------------------------------- protobuf wire format

def varint(n: int) -> bytes:
    """A protobuf base-128 varint (negative ints as their 64-bit two's complement)."""
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def length_delimited(field: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return varint((field << 3) | 2) + varint(len(payload)) + payload


def _feature_bytes(value) -> bytes:
    kind, v = value
    if kind == "bytes":
        inner = b"".join(length_delimited(1, x) for x in v)
        return length_delimited(1, inner)
    if kind == "int64":
        packed = b"".join(varint(int(x)) for x in v)
        return length_delimited(3, length_delimited(1, packed) if packed else b"")
    if kind == "float":
        packed = np.asarray(v, dtype="<f4").tobytes()
        return length_delimited(2, length_delimited(1, packed) if packed else b"")
    raise ValueError(kind)


def encode_example(features: Mapping[str, Tuple[str, Any]]) -> bytes:
    """A serialized tf.train.Example from {key: ("bytes"|"int64"|"float", values)}, keys sorted."""
    entries = b"".join(
        length_delimited(1, length_delimited(1, k.encode("utf-8")) + length_delimited(2, _feature_bytes(features[k])))
        for k in sorted(features))
    return length_delimited(1, entries)


def _read_varint(buf: bytes, pos: int) -> Tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes):
    pos, n = 0, len(buf)
    while pos < n:
        tag, pos = _read_varint(buf, pos)
        field, wire = tag >> 3, tag & 7
        if wire == 2:
            length, pos = _read_varint(buf, pos)
            yield field, buf[pos:pos + length]
            pos += length
        elif wire == 0:
            v, pos = _read_varint(buf, pos)
            yield field, v
        elif wire == 5:
            yield field, buf[pos:pos + 4]
            pos += 4
        elif wire == 1:
            yield field, buf[pos:pos + 8]
            pos += 8
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def decode_example(data: bytes) -> Dict[str, Tuple[str, Any]]:
    """Inverse of `encode_example` (handles any tf.train.Example, packed or not)."""
    out: Dict[str, Tuple[str, Any]] = {}
    for f, features in _fields(data):
        if f != 1:
            continue
        for f2, entry in _fields(features):
            if f2 != 1:
                continue
            key, value = None, b""
            for f3, x in _fields(entry):
                if f3 == 1:
                    key = x.decode("utf-8")
                elif f3 == 2:
                    value = x
            if key is None:  # a map entry without a key: nothing to name it by
                continue
            for kind_field, lst in _fields(value):
                if kind_field == 1:
                    out[key] = ("bytes", [x for _, x in _fields(lst)])
                elif kind_field == 2:
                    vals = []
                    for _, x in _fields(lst):
                        vals.extend(np.frombuffer(x, "<f4").tolist())
                    out[key] = ("float", vals)
                elif kind_field == 3:
                    vals = []
                    for _, x in _fields(lst):
                        if isinstance(x, int):
                            vals.append(x - (1 << 64) if x >= 1 << 63 else x)
                        else:
                            p = 0
                            while p < len(x):
                                v, p = _read_varint(x, p)
                                vals.append(v - (1 << 64) if v >= 1 << 63 else v)
                    out[key] = ("int64", vals)
            if key not in out:
                out[key] = ("bytes", [])
    return out


# ---------------------------------------------------------------- records

def _raw(a: np.ndarray, dtype) -> Tuple[str, List[bytes]]:
    return "bytes", [np.ascontiguousarray(a, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()]


def encode_step_record(*, step: int, host: int, label: np.ndarray, mask: np.ndarray, dense: np.ndarray,
                       tensor_core: Mapping[str, Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]],
                       chips: Sequence[Mapping[str, Any]]) -> bytes:
    """One host's record of one step. `chips[c]` is `{stack: CsrBatch}` for the host's chip c."""
    feats: Dict[str, Tuple[str, Any]] = {
        "step": ("int64", [int(step)]),
        "host": ("int64", [int(host)]),
        "label": _raw(label, np.float32),
        "mask": _raw(mask, np.float32),
        "dense": _raw(dense.reshape(-1), np.float32),
    }
    for name, (lengths, ids, weights) in tensor_core.items():
        feats[f"tc/{name}/lengths"] = _raw(lengths, np.int32)
        feats[f"tc/{name}/ids"] = _raw(ids, np.int64)
        if weights is not None:
            feats[f"tc/{name}/weights"] = _raw(weights, np.float32)
    for c, batches in enumerate(chips):
        for stack, b in batches.items():
            p = f"sc/{c}/{stack}/"
            r, n = int(b.row_pointers_unpadded_size), int(b.ids_unpadded_size)
            feats[p + "row_pointers"] = _raw(b.row_pointers[:r], np.int32)
            feats[p + "sorted_sample_ids"] = _raw(b.sorted_sample_ids[:n], np.int32)
            feats[p + "sorted_token_ids"] = _raw(b.sorted_token_ids[:n], np.int32)
            feats[p + "sorted_gains"] = _raw(b.sorted_gains[:n], np.float32)
            feats[p + "sizes"] = ("int64", [r, n, int(b.sample_count),
                                            int(b.num_minibatches_per_physical_sparse_core), int(b.dropped_ids)])
    return encode_example(feats)


def decode_record(data: bytes, fmt: ShardFormat) -> Dict[str, Any]:
    """numpy view of one record: {"step", "host", "label", "mask", "dense", "tensor_core", "sparse_core"}."""
    ex = decode_example(data)

    def arr(key, dtype):
        return np.frombuffer(ex[key][1][0], dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)

    b = fmt.host_batch_size
    out: Dict[str, Any] = {
        "step": int(ex["step"][1][0]), "host": int(ex["host"][1][0]),
        "label": arr("label", np.float32), "mask": arr("mask", np.float32),
        "dense": arr("dense", np.float32).reshape(b, len(fmt.dense_features)),
        "tensor_core": {}, "sparse_core": [],
    }
    for name, weighted, _ in fmt.tensor_core_features:
        out["tensor_core"][name] = {
            "lengths": arr(f"tc/{name}/lengths", np.int32), "ids": arr(f"tc/{name}/ids", np.int64),
            "weights": arr(f"tc/{name}/weights", np.float32) if weighted else None}
    for c in range(fmt.chips_per_host):
        chip = {}
        for stack, _, _ in fmt.stacks:
            p = f"sc/{c}/{stack}/"
            d = {name: arr(p + name, dt) for name, dt in CSR_ARRAYS}
            d.update(dict(zip(SIZES_FIELDS, (int(x) for x in ex[p + "sizes"][1]))))
            chip[stack] = d
        out["sparse_core"].append(chip)
    return out


def iter_tfrecords(data: bytes):
    """(offset, payload) of every record of a TFRecord file's bytes; ValueError on corruption."""
    import google_crc32c
    pos, n = 0, len(data)
    while pos < n:
        if pos + 12 > n:
            raise ValueError(f"truncated record header at byte {pos}")
        length, = struct.unpack_from("<Q", data, pos)
        len_crc, = struct.unpack_from("<I", data, pos + 8)
        if _mask_crc(google_crc32c.value(data[pos:pos + 8])) != len_crc:
            raise ValueError(f"corrupt record length at byte {pos}")
        start = pos + 12
        end = start + length
        if end + 4 > n:
            raise ValueError(f"truncated record at byte {pos}")
        payload = data[start:end]
        crc, = struct.unpack_from("<I", data, end)
        if _mask_crc(google_crc32c.value(payload)) != crc:
            raise ValueError(f"corrupt record data at byte {pos}")
        yield pos, payload
        pos = end + 4


def iter_tfrecord_stream(fh, name: str = "<stream>"):
    """Payloads of the TFRecords read from a binary file object, one record in memory at a time.

    Checks the CRCs like `iter_tfrecords`; ValueError naming `name` and the byte offset on corruption.
    """
    import google_crc32c
    pos = 0
    while True:
        header = fh.read(12)
        if not header:
            return
        if len(header) < 12:
            raise ValueError(f"{name}: truncated record header at byte {pos}")
        length, = struct.unpack_from("<Q", header, 0)
        len_crc, = struct.unpack_from("<I", header, 8)
        if _mask_crc(google_crc32c.value(header[:8])) != len_crc:
            raise ValueError(f"{name}: corrupt record length at byte {pos}")
        body = fh.read(length + 4)
        if len(body) < length + 4:
            raise ValueError(f"{name}: truncated record at byte {pos}")
        payload = body[:length]
        crc, = struct.unpack_from("<I", body, length)
        if _mask_crc(google_crc32c.value(payload)) != crc:
            raise ValueError(f"{name}: corrupt record data at byte {pos}")
        yield payload
        pos += 12 + length + 4


def _mask_crc(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_frame(payload: bytes) -> bytes:
    """One TFRecord: length, masked crc32c of the length, payload, masked crc32c of the payload."""
    import google_crc32c
    header = struct.pack("<Q", len(payload))
    return (header + struct.pack("<I", _mask_crc(google_crc32c.value(header))) + payload
            + struct.pack("<I", _mask_crc(google_crc32c.value(payload))))


def read_records(path: str) -> List[bytes]:
    """Every record of a TFRecord file, local or in an object store (numpy-only reader, checks CRCs)."""
    from tpu_embed import io as tio
    return [payload for _, payload in iter_tfrecords(tio.read_bytes(path))]


# ---------------------------------------------------------------- tf.data

def parse_fn(fmt: ShardFormat):
    """A `tf.data` map function: serialized record -> tensors, CSR buffers restored to full size."""
    import tensorflow as tf

    spec: Dict[str, Any] = {"step": tf.io.FixedLenFeature([], tf.int64), "host": tf.io.FixedLenFeature([], tf.int64)}
    for k in ("label", "mask", "dense"):
        spec[k] = tf.io.FixedLenFeature([], tf.string)
    for name, weighted, _ in fmt.tensor_core_features:
        spec[f"tc/{name}/lengths"] = tf.io.FixedLenFeature([], tf.string)
        spec[f"tc/{name}/ids"] = tf.io.FixedLenFeature([], tf.string)
        if weighted:
            spec[f"tc/{name}/weights"] = tf.io.FixedLenFeature([], tf.string)
    for c in range(fmt.chips_per_host):
        for stack, _, _ in fmt.stacks:
            p = f"sc/{c}/{stack}/"
            for name, _ in CSR_ARRAYS:
                spec[p + name] = tf.io.FixedLenFeature([], tf.string)
            spec[p + "sizes"] = tf.io.FixedLenFeature([len(SIZES_FIELDS)], tf.int64)
    b = fmt.host_batch_size
    nd = len(fmt.dense_features)

    def pad_to(x, n):
        return tf.pad(x, [[0, n - tf.shape(x)[0]]])

    def parse(serialized):
        ex = tf.io.parse_single_example(serialized, spec)
        out = {"step": ex["step"], "host": ex["host"],
               "label": tf.ensure_shape(tf.io.decode_raw(ex["label"], tf.float32), [b]),
               "mask": tf.ensure_shape(tf.io.decode_raw(ex["mask"], tf.float32), [b]),
               "dense": tf.reshape(tf.io.decode_raw(ex["dense"], tf.float32), [b, nd])}
        tc = {}
        for name, weighted, _ in fmt.tensor_core_features:
            lengths = tf.cast(tf.io.decode_raw(ex[f"tc/{name}/lengths"], tf.int32), tf.int64)
            ids = tf.io.decode_raw(ex[f"tc/{name}/ids"], tf.int64)
            tc[name] = tf.RaggedTensor.from_row_lengths(ids, lengths)
            if weighted:
                w = tf.io.decode_raw(ex[f"tc/{name}/weights"], tf.float32)
                tc[name + "/weights"] = tf.RaggedTensor.from_row_lengths(w, lengths)
        out["tensor_core"] = tc
        chips = []
        for c in range(fmt.chips_per_host):
            chip = {}
            for stack, rp_buf, ids_buf in fmt.stacks:
                p = f"sc/{c}/{stack}/"
                sizes = tf.cast(ex[p + "sizes"], tf.int32)
                chip[stack] = {
                    "row_pointers": tf.ensure_shape(pad_to(tf.io.decode_raw(ex[p + "row_pointers"], tf.int32),
                                                           rp_buf), [rp_buf]),
                    "sorted_sample_ids": tf.ensure_shape(
                        pad_to(tf.io.decode_raw(ex[p + "sorted_sample_ids"], tf.int32), ids_buf), [ids_buf]),
                    "sorted_token_ids": tf.ensure_shape(
                        pad_to(tf.io.decode_raw(ex[p + "sorted_token_ids"], tf.int32), ids_buf), [ids_buf]),
                    "sorted_gains": tf.ensure_shape(
                        pad_to(tf.io.decode_raw(ex[p + "sorted_gains"], tf.float32), ids_buf), [ids_buf]),
                    "row_pointers_unpadded_size": sizes[0], "ids_unpadded_size": sizes[1],
                    "sample_count": sizes[2], "num_minibatches_per_physical_sparse_core": sizes[3],
                    "dropped_ids": sizes[4],
                }
            chips.append(chip)
        out["sparse_core"] = tuple(chips)
        return out

    return parse


def dequeue_inputs(chip: Mapping[str, Mapping[str, Any]], sample_counts: Optional[Mapping[str, int]] = None):
    """{stack: (PartitionedCsrFormatTensor, row_pointers_unpadded_size, ids_unpadded_size)} for one chip.

    That is the structure `TPUEmbeddingV2` builds in `enqueue` and consumes in
    `dequeue`. `sample_count` must be a Python int there: it is taken from
    `sample_counts` (the manifest's stacks) when given, else from the record.
    """
    import tensorflow as tf
    from tensorflow.python.tpu.tpu_embedding_v3 import PartitionedCsrFormatTensor
    out = {}
    for stack, d in chip.items():
        sc = sample_counts[stack] if sample_counts is not None else d["sample_count"]
        out[stack] = (PartitionedCsrFormatTensor(
            row_pointers=d["row_pointers"], sorted_sample_ids=d["sorted_sample_ids"],
            sorted_token_ids=d["sorted_token_ids"], sorted_gains=d["sorted_gains"], sample_count=sc,
            num_minibatches_per_physical_sparse_core=tf.cast(d["num_minibatches_per_physical_sparse_core"], tf.int32)),
            d["row_pointers_unpadded_size"], d["ids_unpadded_size"])
    return out


def shard_files(artifact_dir: str, host_index: int = 0, manifest=None) -> List[str]:
    """Paths of the host's shard files in step order (`manifest`: the artifact's, if already read)."""
    from tpu_embed import io as tio
    from tpu_embed.manifest import read_manifest
    from tpu_embed.manifest import Manifest
    if manifest is None:
        m = read_manifest(artifact_dir)
    elif isinstance(manifest, Manifest):
        m = manifest
    else:  # the manifest's JSON dict (callers written before the typed Manifest)
        m = Manifest.from_json(manifest, tio.join(artifact_dir, "manifest.json"))
    return [tio.join(artifact_dir, f.path) for f in m.shard_files(host_index)]


READERS = ("auto", "tensorflow", "io")


def _tensorflow_reads(path: str) -> bool:
    """True if TensorFlow's own filesystems read `path` (local files, and gs:// in the standard wheel)."""
    import tensorflow as tf
    from tpu_embed import io as tio
    proto = tio.protocol(path)
    return proto == "" or proto in tf.io.gfile.get_registered_schemes()


def input_fn(artifact_dir: str, *, host_index: int = 0, num_epochs: Optional[int] = 1,
             prefetch: int = 2, num_parallel_calls: Optional[int] = None, expected_fingerprint: Optional[str] = None,
             reader: str = "auto", verify: str = "size"):
    """`tf.data.Dataset` of this host's steps, in step order: one element per training step.

    Each element is the dict `parse_fn` makes; `element["sparse_core"][c]`
    is chip c's `{stack: {...}}`, `dequeue_inputs(...)` turns it into what
    `TPUEmbeddingV2.dequeue` takes.  `expected_fingerprint`: the training
    spec's `Spec.fingerprint`; a mismatch raises instead of training on
    shards made for another spec.

    The manifest is read through `tpu_embed.io` (local or any object store).
    The records are read by:

    * `reader="tensorflow"`: `tf.data.TFRecordDataset` over the paths, i.e.
      TensorFlow's own filesystems (local files; gs:// through TF's GCS
      filesystem, which has its own credentials and retries);
    * `reader="io"`: `tpu_embed.io` (fsspec: gs:// through gcsfs, s3://,
      memory://, ...), records streamed from each file and CRC-checked, fed
      to tf.data with `Dataset.from_generator` (serialized records; one file
      read at a time, in step order);
    * `reader="auto"` (default): "tensorflow" when TF has a filesystem for
      the paths' scheme (`tf.io.gfile.get_registered_schemes()`: local, gs://),
      else "io".

    Either way the same `parse_fn` runs as a parallel `map`
    (`num_parallel_calls`, default AUTOTUNE, deterministic order).

    `verify` ("none" | "size" | "sha256", see `tpu_embed.verify`): at load,
    the host's shard files exist with the listed sizes and cover every step;
    each file's record CRCs (and, "sha256", its hash) are checked as it is
    first opened, so damage is refused naming the file and step
    (`ArtifactDamagedError`) before any record of that file is used.
    """
    import tensorflow as tf
    from tpu_embed import verify as tverify
    from tpu_embed.manifest import read_manifest
    if reader not in READERS:
        raise ValueError(f"reader must be one of {READERS}, got {reader!r}")
    tverify.check_level(verify)
    manifest = read_manifest(artifact_dir)
    if expected_fingerprint is not None and manifest.spec_fingerprint != expected_fingerprint:
        raise ValueError(f"{artifact_dir} was made for spec {manifest.spec_fingerprint}, not "
                         f"{expected_fingerprint}: regenerate the shards with this spec.")
    fmt = manifest.shard_format
    files = shard_files(artifact_dir, host_index, manifest)
    entries = manifest.shard_files(host_index)
    if verify != "none":
        tverify.check_shard_steps(manifest, host_index)
        tverify.check_files(artifact_dir, manifest, "size", kinds=("shard",), host=host_index)  # sha256: lazily
    if reader == "auto":
        reader = "tensorflow" if all(_tensorflow_reads(f) for f in files) else "io"
    if reader == "tensorflow":
        if verify == "none":
            ds = tf.data.TFRecordDataset(files)
        else:  # each file verified as it is first opened, then read by TF
            ds = tverify.checked_shard_paths(artifact_dir, entries, verify).flat_map(tf.data.TFRecordDataset)
    else:
        ds = tf.data.Dataset.from_generator(lambda: _stream_records(files),
                                            output_signature=tf.TensorSpec([], tf.string))
    ds = ds.map(parse_fn(fmt), num_parallel_calls=num_parallel_calls or tf.data.AUTOTUNE, deterministic=True)
    if num_epochs != 1:
        ds = ds.repeat(num_epochs)
    return ds.prefetch(prefetch)


def _stream_records(files: Sequence[str]):
    from tpu_embed import io as tio
    for path in files:
        with tio.open_read(path) as fh:
            yield from iter_tfrecord_stream(fh, path)
