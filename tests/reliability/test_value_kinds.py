"""A TFRecord key whose value kind changes between records (bytes_list, int64_list, float_list) reads as the same
data with one kind per key, and as the same rows in CSV: an integer and its decimal text are the same token, a
float's token is the repr of its float64 value (docs/reference/reliability.md, docs/how-to/serve.md).

The rows are drawn once (seeded) and written four ways: CSV text; TFRecord with one kind per key (bytes for the
categorical column, int64 for the identity ids, floats for the numbers); TFRecord whose kinds are drawn per
record (so they change inside a batch); TFRecord whose kinds are drawn per batch (one kind per key in each
batch, another in the next). Every run must give the same vocabulary files, shard bytes and counts, for a
frequency feature with a weight column, an identity feature, a hashing feature and a dense column.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

from pipelines import runner
from pipelines.jobs import JobConfig
from pipelines.read import tfrecord_reader
from pipelines.read.records import DeadLetter, InputFile, InputSplit, RawBatch
from tests.reliability.accounting import assert_counts_add_up
from tests.reliability.artifacts import artifact_bytes
from tests.reliability.inputs import make_spec, tfrecord_file

CHUNK = 8  # records per decoded batch (and per block of rows drawn with one kind per key)
ROWS = 96
STRINGS = ["a", "b", "x y", "7x"]
INTS = [0, 7, 42, -15, 1722, 123456789, 10 ** 18, (1 << 53) + 1, -(1 << 63)]
# float32-exact (a float_list holds float32); 7.0 and 42.0 beside the integers 7 and 42 (other tokens)
FLOATS = [0.5, 3.0, -2.25, 2.0 ** 70, 2.0 ** -20, float(np.float32(1e16)), float(np.float32(0.1)), 7.0, 42.0]
WEIGHTS = [0.5, 1.0, 2.0, 0.25, 3.0]

CATEGORICAL = [
    {"name": "cat", "column": "cat", "delimiter": "|", "weight_column": "w", "vocabulary": {"num_oov_buckets": 1}},
    {"name": "cat_hash", "column": "cat", "delimiter": "|", "vocabulary": {"type": "hashing", "num_buckets": 13}},
    {"name": "id", "column": "id", "vocabulary": {"type": "identity", "num_buckets": 10}},
]


def spec_for(tmp_path, fmt):
    return make_spec(tmp_path, fmt, categorical=CATEGORICAL, dense=[{"name": "x", "fill": -1.0}],
                     policies={"tail": "pad"})


def draw_rows(seed=7):
    """Rows of python values; the categorical and dense values of a row are all of one class (str / int / float),
    and so are those of each block of CHUNK rows, so that each can be written with one kind per key per batch."""
    rng = random.Random(seed)
    rows = []
    for b in range(ROWS // CHUNK):
        cls = ["str", "int", "float"][b % 3]
        for _ in range(CHUNK):
            k = rng.randint(0, 3)  # 0: the key is missing
            cat = [rng.choice({"str": STRINGS, "int": INTS, "float": FLOATS}[cls]) for _ in range(k)]
            w = [rng.choice(WEIGHTS) for _ in cat]
            x = rng.choice([3, 1722, -15, 0] if cls == "int" else FLOATS)
            rows.append({"label": float(rng.randint(0, 1)), "x": x,
                         "cat": cat or None, "w": w or None, "id": rng.choice([0, 3, 9, 10, -1, 7])})
    return rows


def text(v) -> str:
    """A value's text: what a CSV cell holds (integers in decimal, floats their repr)."""
    return repr(float(v)) if isinstance(v, float) else str(v)


def write_csv(tmp_path, rows):
    lines = ["label,x,cat,w,id"]
    for r in rows:
        cells = [text(r["label"]), text(r["x"]), "|".join(text(v) for v in r["cat"] or []),
                 "|".join(text(v) for v in r["w"] or []), text(r["id"])]
        lines.append(",".join(cells))
    (tmp_path / "in.csv").write_text("\n".join(lines) + "\n")


def feature(values, kind):
    import tensorflow as tf
    if kind == "bytes":
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[text(v).encode() for v in values]))
    if kind == "int":
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))
    return tf.train.Feature(float_list=tf.train.FloatList(value=[float(v) for v in values]))


def kinds_for(values, rng):
    """The kinds `values` can be written as: text always; int64 where every value is an integer, float where
    every value is a float; one drawn by `rng`, or the list if rng is None."""
    out = ["bytes"]
    if all(isinstance(v, int) for v in values):
        out.append("int")
    if all(isinstance(v, float) for v in values):
        out.append("float")
    return rng.choice(out) if rng is not None else out


def example(r, kinds):
    import tensorflow as tf
    feats = {}
    for key in ("label", "x", "cat", "w", "id"):
        v = r[key]
        if v is None:
            continue  # a blank cell: the key is missing
        feats[key] = feature(v if isinstance(v, list) else [v], kinds[key])
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


def write_tfrecord(tmp_path, rows, how, seed=11):
    """how: 'one' (one kind per key), 'record' (kinds drawn per record), 'batch' (drawn per batch of CHUNK).
    Returns each record's {key: kind written}."""
    rng = random.Random(seed)
    payloads, written = [], []
    block: dict = {}
    for i, r in enumerate(rows):
        if how == "one":
            kinds = {"label": "float", "x": "float", "cat": "bytes", "w": "float", "id": "int"}
        elif how == "record":
            kinds = {k: kinds_for(r[k] if isinstance(r[k], list) else [r[k]], rng) for k in r if r[k] is not None}
        else:
            if i % CHUNK == 0:  # a kind every record of the block can be written as, drawn per key
                block = {}
                for k in ("label", "x", "cat", "w", "id"):
                    vals = [v for rr in rows[i:i + CHUNK] if rr[k] is not None
                            for v in (rr[k] if isinstance(rr[k], list) else [rr[k]])]
                    block[k] = rng.choice(kinds_for(vals, None)) if vals else "bytes"
            kinds = block
        payloads.append(example(r, kinds))
        written.append({k: kinds[k] for k in r if r[k] is not None})
    (tmp_path / "in.tfrecord").write_bytes(tfrecord_file(payloads))
    return written


def run(tmp_path, fmt, name):
    out = str(tmp_path / name)
    runner.run_all(JobConfig(spec=spec_for(tmp_path, fmt), output=out, chunk_rows=CHUNK))
    return out


def summary(out):
    m, letters = assert_counts_add_up(out)
    return m.counts.examples_written, dict(m.counts.ids), letters


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The CSV run and the one-kind TFRecord run of the drawn rows (identical to each other)."""
    d = tmp_path_factory.mktemp("ref")
    rows = draw_rows()
    write_csv(d, rows)
    csv_out = run(d, "csv", "csv_out")
    write_tfrecord(d, rows, "one")
    one_out = run(d, "tfrecord", "one_out")
    ref = artifact_bytes(csv_out)
    assert any(p.startswith("vocab/") for p in ref) and any(p.startswith("shards/") for p in ref)
    assert artifact_bytes(one_out) == ref
    assert summary(one_out) == summary(csv_out)
    vocab = open(os.path.join(csv_out, "vocab", "cat.txt"), "rb").read().split(b"\n")
    # integers' full decimal text and floats' repr are tokens (not cut, not reformatted)
    assert {b"1722", b"-15", b"1000000000000000000", b"9007199254740993", b"-9223372036854775808", b"7", b"7.0",
            b"0.10000000149011612", b"1.0000000272564224e+16", b"9.5367431640625e-07"} <= set(vocab)
    return rows, ref, summary(csv_out)


@pytest.mark.parametrize("how", ["record", "batch"])
def test_mixed_value_kinds_read_as_one_kind_per_key_and_as_csv(tmp_path, reference, how):
    rows, ref, ref_summary = reference
    written = write_tfrecord(tmp_path, rows, how)
    keys = ("cat", "x", "id", "w")
    per_batch = [{k: {r[k] for r in written[i:i + CHUNK] if k in r} for k in keys}
                 for i in range(0, len(written), CHUNK)]
    if how == "record":  # kinds change inside batches: most batches have a key of two kinds or more
        assert sum(any(len(s) > 1 for s in b.values()) for b in per_batch) >= len(per_batch) // 2
    else:  # one kind per key in each batch, and keys whose kind differs between batches
        assert all(len(s) <= 1 for b in per_batch for s in b.values())
        for k in keys:
            assert len(set().union(*(b[k] for b in per_batch))) > 1
    out = run(tmp_path, "tfrecord", "out")
    assert artifact_bytes(out) == ref
    assert summary(out) == ref_summary


def _read(path, columns, chunk_rows):
    f = InputFile(0, str(path), os.path.getsize(path))
    items = []
    for item in tfrecord_reader.read_tfrecord(InputSplit(f, 0, 1, 0, f.size), columns, chunk_rows=chunk_rows):
        items += item.run() if hasattr(item, "run") else [item]
    return items


def test_a_batch_of_mixed_kinds_with_malformed_records_and_kinds_of_keys_not_read(tmp_path):
    """Malformed records among mixed kinds are dead letters, as in a batch of one kind; the other records keep
    their order and record numbers; a key not read may change kind too; a Feature with no kind is no value."""
    import tensorflow as tf

    def ex(**kw):
        e = tf.train.Example()
        for k, (kind, vals) in kw.items():
            f = e.features.feature[k]
            f.SetInParent()
            if kind:
                getattr(f, kind).SetInParent()
                getattr(f, kind).value.extend(vals)
        return e.SerializeToString()
    payloads = [ex(c=("int64_list", [1722, -15]), x=("float_list", [0.5]), unread=("int64_list", [1])),
                ex(c=("bytes_list", [b"a"]), x=("bytes_list", [b"2"]), unread=("bytes_list", [b"z"])),
                b"\xff\xfe not an Example",
                ex(c=("float_list", [0.1, 3.0]), x=("int64_list", [(1 << 53) + 1])),
                ex(c=(None, []), x=("float_list", [1.5])),
                ex(),
                ex(unread=("float_list", [1.0]), x=("float_list", [2.5]), c=("int64_list", [])),
                b"\x0a\x03\x0a\x01"]  # Features cut short
    path = tmp_path / "in.tfrecord"
    path.write_bytes(tfrecord_file(payloads))
    items = _read(path, ["c", "x", "label"], chunk_rows=100)
    letters = [x for x in items if isinstance(x, DeadLetter)]
    batches = [x for x in items if isinstance(x, RawBatch)]
    assert [(x.record, x.reason) for x in letters] == [(2, "malformed_record"), (7, "malformed_record")]
    assert "record 2 is not a tf.train.Example" in letters[0].detail and "Fix:" in letters[0].detail
    assert len(batches) == 1
    b = batches[0]
    assert b.record_numbers.tolist() == [0, 1, 3, 4, 5, 6]
    assert b.columns["c"].to_pylist() == [[b"1722", b"-15"], [b"a"], [b"0.10000000149011612", b"3.0"], None,
                                          None, []]
    assert b.columns["x"].to_pylist() == [[b"0.5"], [b"2"], [b"9007199254740993"], [b"1.5"], None, [b"2.5"]]
    assert b.columns["label"].null_count == 6
    # batches of two records: [0, 1] of two kinds (text), [2, 3] one record left, [4, 5] no kind, [6, 7] floats
    items = _read(path, ["unread"], chunk_rows=2)
    assert [x.record for x in items if isinstance(x, DeadLetter)] == [2, 7]
    got = [v for x in items if isinstance(x, RawBatch) for v in x.columns["unread"].to_pylist()]
    assert got == [[b"1"], [b"z"], None, None, None, [1.0]]


def test_a_key_not_read_may_change_kind(tmp_path):
    """Only the keys read matter: another key of several kinds leaves them as decoded (floats stay floats)."""
    import tensorflow as tf
    payloads = []
    for i in range(6):
        e = tf.train.Example()
        e.features.feature["x"].float_list.value.append(i + 0.5)
        if i % 2:
            e.features.feature["other"].int64_list.value.append(i)
        else:
            e.features.feature["other"].bytes_list.value.append(b"o")
        payloads.append(e.SerializeToString())
    path = tmp_path / "in.tfrecord"
    path.write_bytes(tfrecord_file(payloads))
    (b,) = _read(path, ["x"], chunk_rows=100)
    assert b.record_numbers.tolist() == list(range(6)) and b.columns["x"].to_pylist() == [[i + 0.5] for i in range(6)]


def test_a_key_with_no_value_kind_in_every_record_of_a_batch_is_no_value(tmp_path):
    """tfx_bsl decodes a key whose Feature has no kind in every record of a batch as a column of type null; the
    reader gives it as no value (as a missing key), not as a column of the wrong type."""
    import tensorflow as tf
    payloads = []
    for i in range(8):
        e = tf.train.Example()
        e.features.feature["label"].float_list.value.append(float(i % 2))
        e.features.feature["x"].float_list.value.append(float(i))
        e.features.feature["cat"].SetInParent()  # no kind
        e.features.feature["w"].SetInParent()
        e.features.feature["id"].int64_list.value.append(i % 10)
        payloads.append(e.SerializeToString())
    (tmp_path / "in.tfrecord").write_bytes(tfrecord_file(payloads))
    out = run(tmp_path, "tfrecord", "out")
    written, ids, letters = summary(out)
    assert letters == [] and written == 8 and ids["cat"]["values"] == 0 and ids["id"]["ids"] == 8
