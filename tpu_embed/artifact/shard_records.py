"""Shard records: one host's `tf.train.Example` of one step, encoded and decoded with numpy (no TensorFlow).

    encode_step_record(step=..., host=..., ..., chips=[{stack: CsrBatch}], fmt=fmt) -> bytes
    decode_record(data, fmt) -> {"step", "host", "label", "mask", "dense", "tensor_core", "sparse_core"}
    reencode_record(data, fmt, new_fmt)      # the same step in another format (e.g. version 1's)
    reencode_artifact(src, dst, new_fmt)     # a copy of a whole artifact with its shards in that format
    shard_files(artifact_dir, host)          # where a host's records are, in step order
    open_by_position(path, entry, ...)       # a shard file opened for reading its records by position

The features and their encodings are described in `tpu_embed.artifact.shard_format`; the files are
TFRecord files (`tpu_embed.artifact.tfrecord.read_records` reads their records).  Narrow ids, omitted
unit gains and omitted padding are undone here, so `decode_record` gives version 1's arrays whatever the
encoding.
"""

from __future__ import annotations

import os
import shutil
import types
from typing import IO, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tpu_embed.artifact import io as tio
from tpu_embed.artifact import tfrecord
from tpu_embed.artifact.example_wire import decode_example, encode_example
from tpu_embed.artifact.manifest import FileEntry, Manifest, manifest_bytes, read_manifest
from tpu_embed.artifact.shard_format import ID_DTYPES, SIZES_FIELDS, V1_ENCODING, ShardFormat
from tpu_embed.artifact.verify import verify_shard_bytes
from tpu_embed.sparsecore import csr
from tpu_embed.sparsecore.padding import PAD_VALUE, XLA_PAD, round_up


def _raw(a: np.ndarray, dtype) -> Tuple[str, List[Any]]:
    # The array's bytes without a copy (`encode_example` copies them once, into the record).
    return "bytes", [np.ascontiguousarray(a, dtype=np.dtype(dtype).newbyteorder("<")).data.cast("B")]


def narrow_ids(a: np.ndarray, dtype_name: str, what: str = "ids") -> np.ndarray:
    """int32 ids -> `dtype_name` ("int32" | "uint16" | "uint8"), PAD_VALUE -> the type's maximum.

    ValueError if a real id does not fit below that maximum (the format's width was chosen from the
    layout's bounds, so this means the layout and the data disagree).
    """
    a = np.asarray(a, np.int32)
    if dtype_name == "int32":
        return a
    dt = ID_DTYPES[dtype_name]
    top = int(np.iinfo(dt).max)
    # As uint32, PAD_VALUE and every id outside [0, top) are >= top: only the padding may be. Then the cast
    # keeps the low bits: an id is itself and PAD_VALUE (all ones below bit 31) the type's maximum.
    if np.count_nonzero(a.view(np.uint32) >= top) != np.count_nonzero(a == PAD_VALUE):
        real = a[a != PAD_VALUE]
        raise ValueError(f"{what}: id {int(real.max()) if int(real.max()) >= top else int(real.min())} does not "
                         f"fit the shard format's {dtype_name} (ids must be in [0, {top}))")
    return a.astype(dt)


def widen_ids(a: np.ndarray, dtype_name: str) -> np.ndarray:
    """Inverse of `narrow_ids`: int32, the type's maximum back to PAD_VALUE."""
    if dtype_name == "int32":
        return np.asarray(a, np.int32)
    top = int(np.iinfo(ID_DTYPES[dtype_name]).max)
    return np.where(a == top, np.int32(PAD_VALUE), a.astype(np.int32))


def unit_gains(sample_ids: np.ndarray) -> np.ndarray:
    """The gains a record without `sorted_gains` stands for: 1.0, and float32(PAD_VALUE) at padding entries."""
    return np.where(np.asarray(sample_ids) == PAD_VALUE, np.float32(PAD_VALUE), np.float32(1)).astype(np.float32)


def partition_counts(row_pointers: np.ndarray) -> np.ndarray:
    """Real entries per partition from TF's row pointers: rp[i] - (rp[i-1] rounded up to a multiple of 8)."""
    rp = np.asarray(row_pointers, np.int64)
    starts = np.concatenate([[0], round_up(rp[:-1], XLA_PAD)]) if rp.size else rp
    return rp - starts


def layout_from_counts(counts: np.ndarray) -> Tuple[np.ndarray, np.ndarray, int]:
    """(row pointers, positions of the real entries, ids_unpadded_size) of TF's layout, from `partition_counts`."""
    c = np.asarray(counts, np.int64)
    padded = round_up(c, XLA_PAD)
    starts = np.cumsum(padded) - padded
    real_before = np.cumsum(c) - c
    positions = np.repeat(starts - real_before, c) + np.arange(int(c.sum()), dtype=np.int64)
    return (starts + c).astype(np.int32), positions, int(padded.sum())


def _stack_features(fmt: Optional[ShardFormat], step: int, c: int, stack: str, b: Any) -> Dict[str, Tuple[str, Any]]:
    """The record features of chip `c`'s batch `b` of `stack`, in `fmt`'s encoding of that stack (version 1's
    without a format)."""
    feats: Dict[str, Tuple[str, Any]] = {}
    enc = fmt.encoding(stack) if fmt is not None else V1_ENCODING
    key = {a: fmt.key(c, stack, a) if fmt is not None else f"sc/{c}/{stack}/{a}"
           for a in ("row_pointers", "counts", "sorted_sample_ids", "sorted_token_ids", "sorted_gains",
                     "sizes")}
    what = f"step {step}, chip {c}, stack {stack}"
    r, n = int(b.row_pointers_unpadded_size), int(b.ids_unpadded_size)
    rp = np.asarray(b.row_pointers[:r], np.int32)
    sample_ids = np.asarray(b.sorted_sample_ids[:n], np.int32)
    token_ids = np.asarray(b.sorted_token_ids[:n], np.int32)
    gains = np.asarray(b.sorted_gains[:n], np.float32)
    narrowed = _narrowed_natively(enc, sample_ids, token_ids, gains) if enc.padding == "stored" else None
    if narrowed is not None:  # one native pass: the bytes of the reference below (tests/tpu_embed/artifact)
        feats[key["row_pointers"]] = _raw(rp, np.int32)
        sample_raw, token_raw, unit = narrowed
    else:
        unit = enc.gains == "omitted_if_unit" and np.array_equal(gains.view(np.int32),
                                                                 unit_gains(sample_ids).view(np.int32))
        if enc != V1_ENCODING and enc.padding == "stored" and not np.array_equal(sample_ids == PAD_VALUE,
                                                                              token_ids == PAD_VALUE):
            raise ValueError(f"{what}: sample and token ids are not PAD_VALUE at the same entries")
        if enc.padding == "omitted":
            counts = partition_counts(rp)
            rp2, positions, n2 = layout_from_counts(counts)
            pad = np.ones(n, bool)
            pad[positions] = False
            if not (np.array_equal(rp2, rp) and n2 == n and np.all(sample_ids[pad] == PAD_VALUE)
                    and np.all(token_ids[pad] == PAD_VALUE) and np.all(gains[pad] == np.float32(PAD_VALUE))
                    and not np.any(sample_ids[positions] == PAD_VALUE)):
                raise ValueError(f"{what}: the CSR prefixes are not in TF's padded layout; they cannot be "
                                 "stored with padding: omitted")
            feats[key["counts"]] = ("int64", counts.tolist())
            sample_ids, token_ids, gains = sample_ids[positions], token_ids[positions], gains[positions]
        else:
            feats[key["row_pointers"]] = _raw(rp, np.int32)
        sample_raw = _raw(narrow_ids(sample_ids, enc.sample_ids, f"{what}: sample ids"), ID_DTYPES[enc.sample_ids])
        token_raw = _raw(narrow_ids(token_ids, enc.token_ids, f"{what}: token ids"), ID_DTYPES[enc.token_ids])
    feats[key["sorted_sample_ids"]] = sample_raw
    feats[key["sorted_token_ids"]] = token_raw
    if not unit:
        feats[key["sorted_gains"]] = _raw(gains, np.float32)
    feats[key["sizes"]] = ("int64", [r, n, int(b.sample_count),
                                     int(b.num_minibatches_per_physical_sparse_core), int(b.dropped_ids)])
    return feats


def _narrowed_natively(enc, sample_ids: np.ndarray, token_ids: np.ndarray, gains: np.ndarray):
    """(sample ids' feature, token ids' feature, unit gains) of a batch stored with its padding, from the native
    kernel's one pass (`csr.narrow_stack_native`); None without the kernel, or where a check fails (the numpy
    rule then raises its error)."""
    got = csr.narrow_stack_native(sample_ids, token_ids, gains, np.dtype(ID_DTYPES[enc.sample_ids]).itemsize,
                                  np.dtype(ID_DTYPES[enc.token_ids]).itemsize, enc.gains == "omitted_if_unit",
                                  enc != V1_ENCODING)
    if got is None or got[0]:
        return None
    _, sample_bytes, token_bytes, unit = got
    return (("bytes", [sample_bytes]) if sample_bytes is not None else _raw(sample_ids, np.int32),
            ("bytes", [token_bytes]) if token_bytes is not None else _raw(token_ids, np.int32), bool(unit))


def encode_step_record(*, step: int, host: int, label: np.ndarray, mask: np.ndarray, dense: np.ndarray,
                       tensor_core: Mapping[str, Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]],
                       chips: Sequence[Mapping[str, Any]], fmt: Optional[ShardFormat] = None,
                       extra: Optional[Mapping[str, Tuple[str, Any]]] = None) -> bytes:
    """One host's record of one step. `chips[c]` is `{stack: CsrBatch}` for the host's chip c.

    `extra`: more features of the record, `{key: (kind, values)}` as `encode_example` takes them (the jax
    layout's arrays, `tpu_embed.artifact.jax_records.encode_jax_features`).

    `fmt`: the format whose keys and `StackEncoding`s to write (narrow ids, omitted unit gains, omitted
    padding); None: version 1's record. ValueError if a batch does not fit the format's encoding.
    """
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
            feats.update(_stack_features(fmt, step, c, stack, b))
    if extra:
        clash = sorted(set(extra) & set(feats))
        if clash:
            raise ValueError(f"step {step}: extra record features {clash} clash with the record's own")
        feats.update(extra)
    return encode_example(feats)


def decode_record(data: bytes, fmt: ShardFormat) -> Dict[str, Any]:
    """numpy view of one record: {"step", "host", "label", "mask", "dense", "tensor_core", "sparse_core"}.

    The CSR arrays are TF's int32 / float32 prefixes whatever the encoding (narrow ids widened, omitted
    gains and padding rebuilt).
    """
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
            enc = fmt.encoding(stack)
            sizes = dict(zip(SIZES_FIELDS, (int(x) for x in ex[fmt.key(c, stack, "sizes")][1])))
            sample_ids = widen_ids(arr(fmt.key(c, stack, "sorted_sample_ids"), ID_DTYPES[enc.sample_ids]),
                                   enc.sample_ids)
            token_ids = widen_ids(arr(fmt.key(c, stack, "sorted_token_ids"), ID_DTYPES[enc.token_ids]), enc.token_ids)
            gkey = fmt.key(c, stack, "sorted_gains")
            gains = arr(gkey, np.float32) if gkey in ex else None
            if gains is None and enc.gains != "omitted_if_unit":
                raise ValueError(f"step {out['step']}: the record has no {gkey} (the format stores the gains)")
            if enc.padding == "omitted":
                rp, positions, n = layout_from_counts(np.asarray(ex[fmt.key(c, stack, "counts")][1], np.int64))
                full = np.full(n, PAD_VALUE, np.int32)
                full[positions] = sample_ids
                sample_ids = full
                full = np.full(n, PAD_VALUE, np.int32)
                full[positions] = token_ids
                token_ids = full
                if gains is not None:
                    full_g = np.full(n, PAD_VALUE, np.float32)
                    full_g[positions] = gains
                    gains = full_g
            else:
                rp = arr(fmt.key(c, stack, "row_pointers"), np.int32)
            d = {"row_pointers": rp, "sorted_sample_ids": sample_ids, "sorted_token_ids": token_ids,
                 "sorted_gains": gains if gains is not None else unit_gains(sample_ids)}
            d.update(sizes)
            chip[stack] = d
        out["sparse_core"].append(chip)
    return out



def reencode_record(data: bytes, fmt: ShardFormat, new: ShardFormat) -> bytes:
    """Record `data` of format `fmt` written again in format `new` (version 1's record when `new.version`
    is 1): the same step, decoded by `decode_record` and encoded by `encode_step_record`."""
    r = decode_record(data, fmt)
    chips = [{s: types.SimpleNamespace(**x) for s, x in chip.items()} for chip in r["sparse_core"]]
    tc = {n: (t["lengths"], t["ids"], t["weights"]) for n, t in r["tensor_core"].items()}
    return encode_step_record(step=r["step"], host=r["host"], label=r["label"], mask=r["mask"], dense=r["dense"],
                              tensor_core=tc, chips=chips, fmt=None if new.version == 1 else new)


def reencode_artifact(src: str, dst: str, new: ShardFormat) -> str:
    """A copy at `dst` of the local artifact `src` whose shard records are re-encoded in format `new`
    (`reencode_record`) and compressed as `new` says; the manifest's format and file entries updated."""
    m = read_manifest(src)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    d = m.to_json()
    for entry in d["files"]:
        if entry["kind"] != "shard":
            continue
        data = tfrecord.encode_file((reencode_record(rec, m.shard_format, new)
                                     for rec in tfrecord.read_records(os.path.join(src, entry["path"]))),
                                    new.compression)
        with open(os.path.join(dst, entry["path"]), "wb") as fh:
            fh.write(data)
        entry["bytes"], entry["sha256"] = len(data), tio.sha256_bytes(data)
    d["shards"]["format"] = new.to_json()
    with open(os.path.join(dst, "manifest.json"), "wb") as fh:
        fh.write(manifest_bytes(d))
    return dst


def shard_files(artifact_dir: str, host_index: int = 0, manifest: Optional[Manifest] = None) -> List[str]:
    """Paths of the host's shard files in step order (`manifest`: the artifact's, if already read)."""
    m = manifest if manifest is not None else read_manifest(artifact_dir)
    return [tio.join(artifact_dir, f.path) for f in m.shard_files(host_index)]


def open_by_position(path: str, entry: FileEntry, compression: str, verify: str,
                     spill_path: Callable[[], str]) -> Tuple[IO[bytes], List[Tuple[int, int]]]:
    """(an open binary file, [(payload offset, length)] of its records): shard file `path` (listed as `entry`)
    ready for `tfrecord.read_payload`, which checks each payload's CRC as it reads it (the shuffled readers of
    `tpu_embed.input_fn` and `tpu_embed.jax.input_iterator` read records in step order this way).

    Uncompressed at `verify` "none": only the record headers are read (`tfrecord.index_stream`), the file is
    read in place. Otherwise the file is read whole once: checked at level `verify` (`verify_shard_bytes`:
    size, record CRCs and, "sha256", its hash) so that damage is refused before any of its records is used,
    decompressed and indexed; an uncompressed file is then read in place, a compressed one from its
    decompressed bytes, written to the local file `spill_path()` names (the caller removes it)."""
    if compression == "none" and verify == "none":
        fh = tio.open_read(path)
        try:
            return fh, tfrecord.index_stream(fh, path)
        except BaseException:
            fh.close()
            raise
    data = tio.read_bytes(path)
    if verify != "none":
        verify_shard_bytes(path, data, entry, verify, compression)
    data = tfrecord.decompress(data, compression, path)
    table = tfrecord.index_records(data, path)
    if compression == "none":
        return tio.open_read(path), table
    local = spill_path()
    with open(local, "wb") as out:
        out.write(data)
    return open(local, "rb"), table


def window_step_owners(days: Sequence) -> Tuple[Dict[int, Tuple[int, int, int]], int]:
    """Where each step of a window (the days' steps one after the other) is stored: {window step: (day, file,
    record in the file)} over the days' shard entries (each day has `directory`, `steps` and `entries`, the shard
    files of one host with their first and last step), and the window's number of steps. ValueError naming the
    day and the step if no shard file holds a step. Readers that read steps by position use it
    (`tpu_embed.input_fn`, `tpu_embed.jax.input_iterator`, with `shuffle_steps`)."""
    owner: Dict[int, Tuple[int, int, int]] = {}
    first = 0
    for d, day in enumerate(days):
        covered = set()
        for i, e in enumerate(day.entries):
            for k in range((e.last_step or 0) - (e.first_step or 0) + 1):
                covered.add((e.first_step or 0) + k)
                owner[first + (e.first_step or 0) + k] = (d, i, k)
        missing = [s for s in range(day.steps) if s not in covered]
        if missing:
            raise ValueError(f"{day.directory}: no shard file holds step {missing[0]} (of {day.steps}); the manifest "
                             "does not list every shard. Re-run `tpu-embed run` (or shard) with this --output.")
        first += day.steps
    return owner, first
