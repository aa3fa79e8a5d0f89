"""Shard format 2: compression (none / GZIP / ZLIB), compact encodings, version rules, shuffled step order.

Every option must give `input_fn` (and `decode_record`) exactly the tensors of version 1's records:
same structure, dtypes, static shapes and values (gains compared as float32 bits).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import ROOT, jobs
from tests.helpers.plain_reference import assert_shards_decode_to_raw_rows
from tpu_embed.artifact import example_wire, shard_records, tfrecord
from tpu_embed.artifact.manifest import LimitsInfo, manifest_bytes, read_manifest
from tpu_embed.artifact.shard_format import FORMAT_VERSION, ID_DTYPES, ShardFormat
from tpu_embed.artifact.shard_format_choice import shard_format_for
from tpu_embed.artifact.spec import SpecError, load_spec, parse_spec
from tpu_embed.sparsecore import CsrBatch
from tpu_embed.sparsecore.layout import layout_of
from tpu_embed.training.input import input_fn, step_order
from tpu_embed.training.shard_parse import parse_fn

MOVIELENS = os.path.join(ROOT, "examples", "movielens", "spec.yaml")  # 2 hosts, per-chip batch 8: padding omitted
CRITEO = os.path.join(ROOT, "examples", "criteo", "spec.yaml")
MOVIELENS_V1 = os.path.join(ROOT, "tests", "fixtures", "movielens_v1_artifact")  # shard format version 1


def _spec(path, **changes):
    spec = load_spec(path)
    raw = dict(spec.to_dict(), **changes)
    raw["inputs"] = dict(raw["inputs"], patterns=spec.input_patterns())
    return parse_spec(raw, base_dir=os.path.dirname(path))


def _run(spec, out, *args, **kw):
    return jobs.run(spec, out, args, **kw)


@pytest.fixture(scope="module")
def movielens(tmp_path_factory):
    """The movielens example (2 hosts, padding omitted) as none / GZIP / ZLIB artifacts."""
    d = tmp_path_factory.mktemp("movielens")
    return {c: _run(_spec(MOVIELENS, shards={"compression": c}), str(d / c), steps_per_file=5)
            for c in tfrecord.COMPRESSIONS}


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    """The Criteo example at global batch 64 on one chip (padding stored, uint16/uint8 ids)."""
    d = tmp_path_factory.mktemp("criteo")
    top = {"num_chips": 1, "num_sc_per_chip": 4, "num_hosts": 1}
    return {"none": _run(_spec(CRITEO, topology=top, global_batch_size=64), str(d / "none"))}


# ---------------------------------------------------------------- helpers

def flat(element):
    import tensorflow as tf
    return tf.nest.flatten(element, expand_composites=True)


def assert_same_tensors(a, b):
    import tensorflow as tf
    tf.nest.assert_same_structure(a, b, expand_composites=True)
    for x, y in zip(flat(a), flat(b)):
        assert x.dtype == y.dtype and x.shape == y.shape, (x.dtype, y.dtype, x.shape, y.shape)
        xn, yn = x.numpy(), y.numpy()
        if xn.dtype.kind == "f":
            xn, yn = xn.view(np.int32), yn.view(np.int32)
        np.testing.assert_array_equal(xn, yn)


def assert_same_records(a, b):
    """Two `decode_record` dicts hold the same arrays (gains as float32 bits)."""
    assert a.keys() == b.keys()
    for k in ("step", "host"):
        assert a[k] == b[k]
    for k in ("label", "mask", "dense"):
        np.testing.assert_array_equal(a[k], b[k])
    assert len(a["sparse_core"]) == len(b["sparse_core"])
    for ca, cb in zip(a["sparse_core"], b["sparse_core"]):
        assert ca.keys() == cb.keys()
        for stack in ca:
            assert ca[stack].keys() == cb[stack].keys()
            for k, v in ca[stack].items():
                w = cb[stack][k]
                if isinstance(v, np.ndarray):
                    assert v.dtype == w.dtype, (stack, k)
                    np.testing.assert_array_equal(v.view(np.int32) if v.dtype == np.float32 else v,
                                                  w.view(np.int32) if w.dtype == np.float32 else w)
                else:
                    assert v == w, (stack, k)


def assert_same_steps(a: str, fmt_a: ShardFormat, b: str, fmt_b: ShardFormat) -> None:
    """Artifacts `a` and `b` (their records decoded as `fmt_a` and `fmt_b`) hold the same records and give the
    same `input_fn` elements, host by host."""
    for h in range(fmt_a.num_hosts):
        ra = [shard_records.decode_record(r, fmt_a) for p in shard_records.shard_files(a, h)
              for r in tfrecord.read_records(p)]
        rb = [shard_records.decode_record(r, fmt_b) for p in shard_records.shard_files(b, h)
              for r in tfrecord.read_records(p)]
        assert len(ra) == len(rb) > 0
        for x, y in zip(ra, rb):
            assert_same_records(x, y)
        for x, y in zip(elements(a, host_index=h), elements(b, host_index=h)):
            assert_same_tensors(x, y)


def v1_format(fmt: ShardFormat) -> ShardFormat:
    return dataclasses.replace(fmt, version=1, compression="none", encodings=(), keys="names", samples=())


def elements(art, **kw):
    return list(input_fn(art, **kw))


# ---------------------------------------------------------------- compression

@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_compression_round_trips_through_input_fn(movielens, compression):
    import tensorflow as tf
    plain, packed = movielens["none"], movielens[compression]
    m = read_manifest(packed)
    assert m.shard_format.compression == compression and m.shard_format.version == 2
    for h in range(m.shard_format.num_hosts):
        files = shard_records.shard_files(packed, h, m)
        assert len(files) == 3  # 13 steps, 5 per file
        # TF's own reader with compression_type reads the records the uncompressed artifact holds
        got = [x.numpy() for x in tf.data.TFRecordDataset(files, compression_type=compression)]
        want = [r for p in shard_records.shard_files(plain, h) for r in tfrecord.read_records(p)]
        assert got == want
        assert [r for p in files for r in tfrecord.read_records(p)] == want  # numpy reader, format sniffed
        assert [r for p in files for r in tfrecord.read_records(p, compression)] == want
        with open(files[0], "rb") as fh:
            head = fh.read(2)
        assert head == (b"\x1f\x8b" if compression == "GZIP" else b"\x78\x9c")
        a, b = elements(plain, host_index=h), elements(packed, host_index=h)
        assert len(a) == len(b) == m.shards.steps
        for x, y in zip(a, b):
            assert_same_tensors(x, y)
        for x, y in zip(a, elements(packed, host_index=h, reader="io")):  # fsspec stream, decompressed
            assert_same_tensors(x, y)
    plain_bytes = sum(f.bytes for f in read_manifest(plain).files_of("shard"))
    assert sum(f.bytes for f in m.files_of("shard")) < plain_bytes / 2


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_compressed_files_are_tf_writer_bytes(movielens, tmp_path, compression):
    """The job's files equal what tf.io.TFRecordWriter with TFRecordOptions writes for the same records."""
    import tensorflow as tf
    art = movielens[compression]
    for f in read_manifest(art).files_of("shard"):
        path = os.path.join(art, f.path)
        theirs = str(tmp_path / os.path.basename(path))
        with tf.io.TFRecordWriter(theirs, tf.io.TFRecordOptions(compression_type=compression)) as w:
            for rec in tfrecord.read_records(path):
                w.write(rec)
        assert open(theirs, "rb").read() == open(path, "rb").read(), f.path
    if compression == "GZIP":  # no file name, no time: flags 0, mtime 0
        data = open(path, "rb").read()
        assert data[:10] == tfrecord.GZIP_HEADER and data[3] == 0 and data[4:8] == b"\0\0\0\0"


def test_compressed_shards_decode_to_raw_rows(movielens):
    """The end-to-end decode (every step, chip, feature, example against the raw rows) on GZIP shards."""
    assert_shards_decode_to_raw_rows(load_spec(MOVIELENS), movielens["GZIP"], "movielens")
    assert_shards_decode_to_raw_rows(load_spec(MOVIELENS), movielens["ZLIB"], "movielens")


def test_damaged_compressed_shard_is_refused(movielens, tmp_path):
    from tpu_embed.artifact.verify import ArtifactDamagedError
    art = str(tmp_path / "gz")
    shutil.copytree(movielens["GZIP"], art)
    path = shard_records.shard_files(art, 0)[0]
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x01
    open(path, "wb").write(bytes(data))
    with pytest.raises(Exception, match=r"ArtifactDamagedError: .*part-00000-of-00003.tfrecord: not a valid GZIP"):
        elements(art)
    with pytest.raises(ValueError, match="GZIP"):
        tfrecord.read_records(path)
    with pytest.raises(ArtifactDamagedError):
        from tpu_embed.artifact import verify
        entry = read_manifest(art).shard_files(0)[0]
        verify.verify_shard_bytes(path, bytes(data), entry, "size", "GZIP")


# ---------------------------------------------------------------- compact encodings

@pytest.mark.parametrize("which", ["movielens", "criteo"])
def test_compact_records_decode_like_version_1(movielens, criteo, tmp_path, which):
    """The job's compact records (narrow ids, omitted unit gains, omitted or stored padding) give the same
    tensors as the same steps written with version 1's encoding under a version-1 manifest."""
    art = (movielens if which == "movielens" else criteo)["none"]
    fmt = read_manifest(art).shard_format
    padding = {e.padding for _, e in fmt.encodings}
    assert padding == ({"omitted"} if which == "movielens" else {"stored"})
    assert all(e.sample_ids in ("uint8", "uint16") and e.gains == "omitted_if_unit" for _, e in fmt.encodings)
    old = shard_records.reencode_artifact(art, str(tmp_path / "v1"), v1_format(fmt))
    assert read_manifest(old).shard_format.version == 1 and "keys" not in read_manifest(old)["shards"]["format"]
    old_bytes = sum(f.bytes for f in read_manifest(old).files_of("shard"))
    assert sum(f.bytes for f in read_manifest(art).files_of("shard")) < 0.6 * old_bytes
    assert_same_steps(art, fmt, old, v1_format(fmt))
    # the job's encoding is reproduced by encode_step_record from the decoded records
    same = shard_records.reencode_artifact(art, str(tmp_path / "again"), fmt)
    for f in read_manifest(art).files_of("shard"):
        assert open(os.path.join(art, f.path), "rb").read() == open(os.path.join(same, f.path), "rb").read()


def _random_batches(seed: int, allow_dropping: bool):
    """CSR of random multivalent / weighted / duplicate-id batches of a 3-stack model on 2 chips x 4 SCs."""
    from tpu_embed.sparsecore import RaggedIds, preprocess_with_layout
    raw = {"inputs": {"format": "csv", "patterns": ["x.csv"]},
           "categorical": [{"name": "a", "vocabulary": {"type": "identity", "num_buckets": 300}},
                           {"name": "b", "vocabulary": {"type": "identity", "num_buckets": 70000}},
                           {"name": "w", "vocabulary": {"type": "identity", "num_buckets": 50},
                            "weight_column": "ww"},
                           {"name": "s", "vocabulary": {"type": "identity", "num_buckets": 40},
                            "sequence_length": 3}],
           "tables": [{"name": "a", "dim": 8, "combiner": "sum"}, {"name": "b", "dim": 8, "combiner": "mean"},
                      {"name": "w", "dim": 16, "combiner": "sqrtn"}, {"name": "s", "dim": 32}],
           "optimizer": {"type": "sgd", "learning_rate": 0.1},
           "topology": {"num_chips": 2, "num_sc_per_chip": 4}, "global_batch_size": 64}
    spec = parse_spec(raw)
    layout = spec.layout({})
    rng = np.random.default_rng(seed)
    per_chip = spec.per_chip_batch_size
    chips = []
    for _ in range(2):
        feats, weights = {}, {}
        for f in layout.features:
            lengths = rng.integers(0, 5, per_chip * (3 if f.path == "s" else 1))
            if f.path == "s":
                lengths = np.minimum(lengths, 1)
            vocab = f.vocabulary_size
            values = rng.integers(0, min(vocab, 6) if rng.random() < 0.5 else vocab, int(lengths.sum()))
            feats[f.path] = RaggedIds(values.astype(np.int64), np.concatenate([[0], np.cumsum(lengths)]))
            weights[f.path] = (rng.random(values.size).astype(np.float32) if f.path == "w" else None)
        big = {s: 10 ** 6 for s in layout.stacks}
        chips.append(preprocess_with_layout(feats, layout, weights=weights,
                                            max_ids_per_chip_per_sample=2 if allow_dropping else 16,
                                            max_ids_per_table=big, max_unique_ids_per_table=big,
                                            allow_id_dropping=allow_dropping))
    return spec, layout, chips


@pytest.mark.parametrize("seed,dropping", [(0, False), (1, True), (2, False)])
@pytest.mark.parametrize("padding", ["stored", "omitted"])
def test_encodings_round_trip_random_csr(seed, dropping, padding):
    """Duplicate ids (gains 2.0), weights, mean / sqrtn gains, sequence features and dropped ids: every
    encoding decodes (numpy and tf.data) to version 1's arrays."""
    spec, layout, chips = _random_batches(seed, dropping)
    if dropping:
        assert any(b.dropped_ids for chip in chips for b in chip.values())
    limits = LimitsInfo(max_ids_per_chip_per_sample=2 if dropping else 16, max_ids_per_table={},
                                 max_unique_ids_per_table={}, allow_id_dropping=dropping, source="test")
    fmt = shard_format_for(spec, layout, limits)
    fmt = dataclasses.replace(fmt, encodings=tuple((s, dataclasses.replace(e, padding=padding))
                                                   for s, e in fmt.encodings))
    dtypes = {s: (e.sample_ids, e.token_ids) for s, e in fmt.encodings}
    assert dtypes == {"a_b": ("uint8", "uint16"), "w": ("uint8", "uint8"), "s": ("uint8", "uint8")}
    hb = spec.per_host_batch_size
    common = dict(step=7, host=0, label=np.arange(hb, dtype=np.float32), mask=np.ones(hb, np.float32),
                  dense=np.zeros((hb, 0), np.float32), tensor_core={}, chips=chips)
    new, old = shard_records.encode_step_record(**common, fmt=fmt), shard_records.encode_step_record(**common)
    assert len(new) < len(old)
    assert_same_records(shard_records.decode_record(new, fmt), shard_records.decode_record(old, v1_format(fmt)))
    for c, chip in enumerate(chips):  # v1 decode = the packer's own prefixes
        for s, b in chip.items():
            d = shard_records.decode_record(old, v1_format(fmt))["sparse_core"][c][s]
            np.testing.assert_array_equal(d["sorted_sample_ids"], b.sorted_sample_ids[:b.ids_unpadded_size])
    gains_kept = sum(k.endswith("/g") for k in example_wire.decode_example(new))
    assert 0 < gains_kept < len(chips) * len(layout.stacks)  # sum without duplicates: omitted; mean: stored
    assert_same_tensors(parse_fn(fmt)(new), parse_fn(v1_format(fmt))(old))


def test_narrow_ids_that_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="does not fit the shard format's uint8"):
        shard_records.narrow_ids(np.array([3, 255], np.int32), "uint8", "ids")
    assert shard_records.narrow_ids(np.array([3, shard_records.PAD_VALUE], np.int32), "uint8").tolist() == [3, 255]
    assert shard_records.widen_ids(np.array([3, 255], np.uint8), "uint8").tolist() == [3, shard_records.PAD_VALUE]
    from tpu_embed.sparsecore import PAD_VALUE
    assert shard_records.PAD_VALUE == PAD_VALUE


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["uint8", "uint16"]),
       st.lists(st.one_of(st.integers(-3, 300), st.integers(65530, 65540), st.integers(-(1 << 31), (1 << 31) - 2),
                          st.just(shard_records.PAD_VALUE)), max_size=40))
def test_narrow_ids_is_the_where_and_cast_it_stands_for(dtype_name, values):
    """PAD_VALUE -> the type's maximum, ids in [0, maximum) kept, anything else refused: as the plain
    definition (a mask of the padding, a check of the other ids, `np.where`) gives it."""
    a = np.array(values, np.int32)
    top = int(np.iinfo(ID_DTYPES[dtype_name]).max)
    real = a[a != shard_records.PAD_VALUE]
    if real.size and (real.min() < 0 or real.max() >= top):
        with pytest.raises(ValueError, match=f"does not fit the shard format's {dtype_name}"):
            shard_records.narrow_ids(a, dtype_name)
        return
    got = shard_records.narrow_ids(a, dtype_name)
    assert got.dtype == ID_DTYPES[dtype_name]
    np.testing.assert_array_equal(got, np.where(a == shard_records.PAD_VALUE, top, a))
    np.testing.assert_array_equal(shard_records.widen_ids(got, dtype_name), a)


_PAD = shard_records.PAD_VALUE


@st.composite
def _prefixes(draw):
    """One chip's CSR prefix of any shape: ids in and out of each width's range, padding where both ids are padding,
    or not (a mismatch), gains of 1.0 and float32(PAD_VALUE) at the padding, or not."""
    n = draw(st.integers(0, 40))
    ids = st.one_of(st.integers(0, 300), st.integers(65530, 65540), st.integers(-(1 << 31), _PAD - 1), st.just(_PAD))
    sample = np.array(draw(st.lists(ids, min_size=n, max_size=n)), np.int32)
    token = np.array(draw(st.lists(ids, min_size=n, max_size=n)), np.int32)
    if draw(st.booleans()):  # the packer's prefixes: padding in both at the same entries
        token = np.where(sample == _PAD, _PAD, np.where(token == _PAD, 0, token)).astype(np.int32)
    gains = np.where(sample == _PAD, np.float32(_PAD), np.float32(1)).astype(np.float32)
    if n and draw(st.booleans()):
        gains[draw(st.integers(0, n - 1))] = draw(st.sampled_from([0.5, 2.0, float(_PAD), 1.0]))
    return sample, token, gains


@pytest.mark.native("csr")
@settings(max_examples=400, deadline=None)
@given(_prefixes(), st.sampled_from(["int32", "uint16", "uint8"]), st.sampled_from(["int32", "uint16", "uint8"]),
       st.sampled_from(["omitted_if_unit", "stored"]), st.booleans())
def test_native_stack_features_are_the_numpy_rule(prefix, sample_ids, token_ids, gains, version_1):
    """A batch stored with its padding: the native pass (`csr.narrow_stack_native`) gives the features, bytes for
    bytes, of the numpy rule (`narrow_ids`, `unit_gains`, the padding check), and where a check fails the
    rule's own error."""
    from tpu_embed.artifact.shard_format import V1_ENCODING, StackEncoding
    from tpu_embed.sparsecore import csr
    sample, token, g = prefix
    n = sample.size
    b = CsrBatch(stack="s", row_pointers=np.array([n], np.int32), sorted_sample_ids=sample, sorted_token_ids=token,
                 sorted_gains=g, sample_count=4, num_minibatches_per_physical_sparse_core=1,
                 row_pointers_unpadded_size=1, ids_unpadded_size=n, row_pointers_buffer_size=8,
                 ids_buffer_size=max(8, n), dropped_ids=0, ids_per_partition=None, unique_ids_per_partition=None)
    enc = V1_ENCODING if version_1 else StackEncoding(sample_ids=sample_ids, token_ids=token_ids, gains=gains,
                                                      padding="stored")
    fmt = ShardFormat(1, 1, 4, (), (), (("s", 16, 64),), encodings=(("s", enc),))

    def features():
        try:
            feats = shard_records._stack_features(fmt, 3, 0, "s", b)
        except ValueError as e:
            return str(e)
        return example_wire.encode_example(feats)

    native = features()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(csr, "narrow_stack_native", lambda *a: None)
        assert features() == native


def test_tf_default_size_buffers_decode_the_same(criteo):
    """Buffers far larger than the data take parse_fn's per-chip path: still version 1's tensors."""
    from tpu_embed.artifact.load import load_artifact
    from tpu_embed.sparsecore import buffer_sizes
    art = criteo["none"]
    fmt = read_manifest(art).shard_format
    layout = layout_of(load_artifact(art).model)
    big = dataclasses.replace(fmt, stacks=tuple((s, rp, buffer_sizes(layout.stacks[s], layout.topology, 64).ids)
                                                for s, rp, _ in fmt.stacks))
    recs = [r for p in shard_records.shard_files(art, 0) for r in tfrecord.read_records(p)]
    for rec in recs:
        old = shard_records.encode_step_record(
            **{k: v for k, v in _as_encode_args(shard_records.decode_record(rec, fmt)).items()})
        assert_same_tensors(parse_fn(big)(rec), parse_fn(v1_format(big))(old))


def _as_encode_args(r):
    return dict(step=r["step"], host=r["host"], label=r["label"], mask=r["mask"], dense=r["dense"],
                tensor_core={n: (t["lengths"], t["ids"], t["weights"]) for n, t in r["tensor_core"].items()},
                chips=[{s: types.SimpleNamespace(**x) for s, x in chip.items()} for chip in r["sparse_core"]])


# ---------------------------------------------------------------- versions

def test_newer_format_version_is_refused(movielens, tmp_path):
    art = str(tmp_path / "newer")
    shutil.copytree(movielens["none"], art)
    path = os.path.join(art, "manifest.json")
    d = json.load(open(path))
    d["shards"]["format"]["version"] = FORMAT_VERSION + 1
    open(path, "wb").write(manifest_bytes(d))
    msg = (rf"{path}: shard format version {FORMAT_VERSION + 1} is not supported by this tpu_embed \(it "
           r"reads versions 1, 2\): the shards were written by a newer tpu_embed. Upgrade tpu_embed")
    with pytest.raises(ValueError, match=msg):
        input_fn(art)
    with pytest.raises(ValueError, match=msg):
        assert read_manifest(art).shard_format
    d["shards"]["format"].update(version=2, compression="lz4")
    open(path, "wb").write(manifest_bytes(d))
    with pytest.raises(ValueError, match="shard format version 2: compression must be one of .*upgrade tpu_embed"):
        input_fn(art)


def test_version_1_artifact_reads_as_the_same_steps_written_today(movielens):
    """An artifact written by the last version-1 writer (tests/fixtures/README.md says how) on the movielens
    example, read with today's reader: a version-1 format, and every record and `input_fn` element the same as
    today's job gives for the same spec, data and steps per file."""
    old, new = MOVIELENS_V1, movielens["none"]
    fmt_old, fmt_new = read_manifest(old).shard_format, read_manifest(new).shard_format
    assert fmt_old.version == 1 and fmt_new.version == FORMAT_VERSION
    assert fmt_old == v1_format(fmt_new)
    assert_same_steps(new, fmt_new, old, fmt_old)


# ---------------------------------------------------------------- determinism

@pytest.mark.slow
def test_compressed_bytes_do_not_depend_on_workers(tmp_path):
    spec = _spec(MOVIELENS, shards={"compression": "gzip"})
    a = _run(spec, str(tmp_path / "one"), chunk_rows=37, steps_per_file=5)
    b = _run(spec, str(tmp_path / "two"), "--direct_num_workers=2", "--direct_running_mode=multi_processing",
             chunk_rows=37, steps_per_file=5)
    files = sorted(os.path.relpath(os.path.join(r, x), a) for r, _, xs in os.walk(a) for x in xs)
    assert files == sorted(os.path.relpath(os.path.join(r, x), b) for r, _, xs in os.walk(b) for x in xs)
    for p in files:
        assert open(os.path.join(a, p), "rb").read() == open(os.path.join(b, p), "rb").read(), p
    assert read_manifest(a).shard_format.compression == "GZIP"


def test_same_input_same_compressed_bytes(movielens, tmp_path):
    again = _run(_spec(MOVIELENS, shards={"compression": "GZIP"}), str(tmp_path / "again"), steps_per_file=5)
    for f in read_manifest(movielens["GZIP"]).files:
        assert open(os.path.join(again, f.path), "rb").read() == open(
            os.path.join(movielens["GZIP"], f.path), "rb").read(), f.path


# ---------------------------------------------------------------- spec

def test_spec_compression_key():
    base = {"inputs": {"format": "csv", "patterns": ["x.csv"]}, "categorical": ["C1"],
            "tables": [{"name": "C1", "dim": 8}], "optimizer": {"type": "sgd", "learning_rate": 0.1},
            "global_batch_size": 8}
    plain = parse_spec(base)
    assert plain.shards.compression == "none" and plain.to_dict()["shards"] == {"compression": "none"}
    for written, canonical in (("gzip", "GZIP"), ("Zlib", "ZLIB"), ("NONE", "none"), (None, "none")):
        s = parse_spec(dict(base, shards={"compression": written}))
        assert s.shards.compression == canonical
        assert s.fingerprint == plain.fingerprint  # how the files are stored is not part of the fingerprint
        assert parse_spec(s.to_dict()).shards == s.shards
    with pytest.raises(SpecError, match=r"spec key 'shards.compression': 'lz4' is not supported. Fix: use none, "
                                        r"GZIP or ZLIB"):
        parse_spec(dict(base, shards={"compression": "lz4"}))


# ---------------------------------------------------------------- shuffled step order

def test_shuffled_step_order(movielens):
    art = movielens["none"]
    m = read_manifest(art)
    steps = m.shards.steps
    plain = {int(e["step"]): e for e in elements(art)}
    ds = input_fn(art, num_epochs=3, shuffle_steps=11)
    order = [int(e["step"]) for e in ds]
    epochs = [order[i * steps:(i + 1) * steps] for i in range(3)]
    for e, got in enumerate(epochs):
        assert sorted(got) == list(range(steps))  # every step exactly once per epoch
        assert got == step_order(steps, 11, e).tolist()
    assert len({tuple(x) for x in epochs}) == 3  # another order each epoch
    assert [int(e["step"]) for e in ds] == order  # the same orders when iterated again
    assert [int(e["step"]) for e in input_fn(art, num_epochs=3, shuffle_steps=11)] == order
    assert [int(e["step"]) for e in input_fn(art, num_epochs=1, shuffle_steps=12)] != epochs[0]
    for e in input_fn(art, shuffle_steps=11):  # the elements are the steps' own
        assert_same_tensors(e, plain[int(e["step"])])


def test_shuffled_step_order_is_the_same_on_every_host(movielens):
    for c in ("none", "GZIP"):
        art = movielens[c]
        per_host = [[(int(e["step"]), int(e["host"])) for e in input_fn(art, host_index=h, num_epochs=2,
                                                                       shuffle_steps=5)]
                    for h in range(read_manifest(art).shard_format.num_hosts)]
        assert [s for s, _ in per_host[0]] == [s for s, _ in per_host[1]]
        assert {h for _, h in per_host[1]} == {1}


def test_shuffled_reading_of_compressed_and_unverified_shards(movielens):
    ref = {int(e["step"]): e for e in elements(movielens["none"], host_index=1)}
    for c in ("GZIP", "ZLIB"):
        for verify in ("none", "sha256"):
            got = elements(movielens[c], host_index=1, shuffle_steps=3, verify=verify)
            assert [int(e["step"]) for e in got] == step_order(len(ref), 3, 0).tolist()
            for e in got:
                assert_same_tensors(e, ref[int(e["step"])])
    with pytest.raises(ValueError, match="shuffle_steps must be None or an integer seed"):
        input_fn(movielens["none"], shuffle_steps=-1)


@pytest.mark.parametrize("which", ["movielens", "criteo"])
def test_prefix_longer_than_the_buffer_is_refused(movielens, criteo, which):
    """decode_raw(fixed_length) would cut a longer prefix silently: parse_fn checks the sizes first."""
    import tensorflow as tf
    art = (movielens if which == "movielens" else criteo)["none"]
    fmt = read_manifest(art).shard_format
    small = dataclasses.replace(fmt, stacks=tuple((s, rp, 8) for s, rp, _ in fmt.stacks))
    rec = tfrecord.read_records(shard_records.shard_files(art, 0)[0])[0]
    with pytest.raises(tf.errors.InvalidArgumentError, match="a CSR prefix is longer than the format"):
        list(tf.data.Dataset.from_tensors(rec).map(parse_fn(small)))
