"""The bad-input promises of docs/reference/reliability.md on every input format: CSV, TFRecord and Parquet.

The same rows are written in each format as a producer would write them: CSV text; TFRecord with each value's
own kind (a float in float_list, an integer in int64_list, text in bytes_list: a key's kind may change between
records); Parquet with a typed column where every value of the column has one type, else a string column. Each
run goes through the real jobs (`runner.run_all`), and must give the same dead letters (reason, the column or
feature named; record numbers are CSV lines, 0-based record indexes otherwise), the same counters, the counts
adding up (`accounting.assert_counts_add_up`) and, where the run succeeds, the CSV run's vocabulary files and
shard bytes.
"""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines import runner
from pipelines.jobs import JobConfig
from pipelines.mapping.ids import PolicyError
from pipelines.read.records import DataError
from tests.reliability.accounting import assert_counts_add_up
from tests.reliability.artifacts import artifact_bytes
from tests.reliability.inputs import make_spec, tfrecord_file

FORMATS = ["csv", "tfrecord", "parquet"]
EXT = {"csv": "csv", "tfrecord": "tfrecord", "parquet": "parquet"}


def text(v) -> str:
    return repr(float(v)) if isinstance(v, float) else v.decode("latin-1") if isinstance(v, bytes) else str(v)


def write_rows(d, fmt, rows, keys):
    """Rows ({key: value, list of values or None}) as `d/in.<fmt>`; returns the path."""
    path = str(d / f"in.{EXT[fmt]}")
    if fmt == "csv":
        def cell(v):
            return "" if v is None else "|".join(text(x) for x in v) if isinstance(v, list) else text(v)
        lines = [",".join(keys)] + [",".join(cell(r.get(k)) for k in keys) for r in rows]
        with open(path, "w") as fh:
            fh.write("\n".join(lines) + "\n")
    elif fmt == "tfrecord":
        import tensorflow as tf
        payloads = []
        for r in rows:
            e = tf.train.Example()
            for k in keys:
                v = r.get(k)
                if v is None:
                    continue  # a blank: the key is missing
                vals = v if isinstance(v, list) else [v]
                f = e.features.feature[k]
                if vals and all(isinstance(x, float) for x in vals):
                    f.float_list.value.extend(vals)
                elif vals and all(isinstance(x, int) for x in vals):
                    f.int64_list.value.extend(vals)
                else:
                    f.bytes_list.value.extend([x if isinstance(x, bytes) else text(x).encode() for x in vals])
            payloads.append(e.SerializeToString())
        with open(path, "wb") as fh:
            fh.write(tfrecord_file(payloads))
    else:
        cols = {}
        for k in keys:
            vs = [r.get(k) for r in rows]
            flat = [x for v in vs if v is not None for x in (v if isinstance(v, list) else [v])]
            if flat and all(isinstance(x, float) for x in flat):
                t, conv = pa.float64(), float
            elif flat and all(isinstance(x, int) for x in flat):
                t, conv = pa.int64(), int
            elif any(isinstance(x, bytes) for x in flat):
                t, conv = pa.binary(), (lambda x: x if isinstance(x, bytes) else text(x).encode())
            else:
                t, conv = pa.string(), text
            if any(isinstance(v, list) for v in vs):
                cols[k] = pa.array([None if v is None else [conv(x) for x in (v if isinstance(v, list) else [v])]
                                    for v in vs], pa.list_(t))
            else:
                cols[k] = pa.array([None if v is None else conv(v) for v in vs], t)
        pq.write_table(pa.table(cols), path)
    return path


def record_of(fmt, i):
    """The dead-letter record number of row i: CSV's line (header = line 1), else the 0-based index."""
    return i + 2 if fmt == "csv" else i


KEYS = ("label", "x", "cat", "w", "id")
CATEGORICAL = [
    {"name": "cat", "delimiter": "|", "weight_column": "w", "vocabulary": {"top_k": 3, "num_oov_buckets": 0}},
    {"name": "cat_oov", "column": "cat", "delimiter": "|", "vocabulary": {"top_k": 3, "num_oov_buckets": 1}},
    {"name": "id", "vocabulary": {"type": "identity", "num_buckets": 10}},
]


def good_rows(n):
    return [{"label": float(i % 2), "x": 0.5 * i, "cat": ["a", "b", "c"][:1 + i % 3],
             "w": [1.0, 2.0, 0.5][:1 + i % 3], "id": i % 10} for i in range(n)]


def run_rows(tmp_path, fmt, rows, keys=KEYS, **over):
    d = tmp_path / fmt
    d.mkdir()
    path = write_rows(d, fmt, rows, keys)
    spec = make_spec(d, fmt, **{"categorical": CATEGORICAL, "policies": {"tail": "pad"}, **over})
    out = str(d / "out")
    runner.run_all(JobConfig(spec=spec, output=out))
    return path, out


_CSV_RUNS: dict = {}


def assert_same_as_csv(fmt, out, tmp_path_factory, name, rows, keys=KEYS, **over):
    """The run in `out` wrote the vocabulary files and shard bytes of the CSV run of these rows (that run: the
    csv case's own, else run once per name)."""
    if fmt == "csv":
        _CSV_RUNS[name] = artifact_bytes(out)
    elif name not in _CSV_RUNS:
        _, csv_out = run_rows(tmp_path_factory.mktemp(name), "csv", rows, keys, **over)
        _CSV_RUNS[name] = artifact_bytes(csv_out)
    assert artifact_bytes(out) == _CSV_RUNS[name]


def letters_of(letters):
    return [(x["record"], x["reason"]) for x in letters]


# ---------------------------------------------------------------- values that do not parse, blanks, mismatches

def text_rows():
    rows = good_rows(16)
    for i, r in {1: {"label": "abc"}, 2: {"label": None}, 3: {"x": "abc"}, 4: {"x": " 7 "},
                 5: {"cat": ["a", "b"], "w": [1.0]}, 6: {"id": "abc"}, 7: {"id": "99999999999999999999"},
                 8: {"id": "3.0"}, 9: {"id": " 4 "}, 10: {"cat": ["a"], "w": ["x"]}}.items():
        rows[i].update(r)
    return rows


@pytest.mark.parametrize("fmt", FORMATS)
def test_numbers_as_text_that_do_not_parse_blank_labels_and_weight_mismatches(tmp_path, tmp_path_factory, fmt):
    """Text where numbers go (TFRecord: bytes_list in records where the other records hold floats or integers;
    Parquet: string columns): what parses is used, 'abc' is an unparsable_number, a blank label without fill a
    missing_value, values and weights of different lengths a weight_mismatch, identity ids that are not integers
    in range are counted, a weight that is not a number is a NaN weight (dropped, counted)."""
    rows = text_rows()
    path, out = run_rows(tmp_path, fmt, rows)
    m, letters = assert_counts_add_up(out)
    assert letters_of(letters) == [(record_of(fmt, 1), "unparsable_number"), (record_of(fmt, 2), "missing_value"),
                                   (record_of(fmt, 3), "unparsable_number"), (record_of(fmt, 5), "weight_mismatch")]
    assert {x["file"] for x in letters} == {path}
    details = [x["detail"] for x in letters]
    assert "label column 'label'" in details[0] and "abc" in details[0]
    assert "label column 'label' is blank and has no fill" in details[1]
    assert "dense column 'x'" in details[2] and "abc" in details[2]
    assert details[3] == "feature 'cat': 2 values in 'cat' but 1 weights in 'w'"
    assert m.counts.examples_written == 12
    ids = m.counts.ids
    assert ids["id"] == {"values": 12, "ids": 9, "invalid_ids_dropped": 3}  # 'abc', 10**20, '3.0'; ' 4 ' is 4
    assert ids["cat"]["nan_weights_dropped"] == 1 and ids["cat"]["values"] == 21
    assert_same_as_csv(fmt, out, tmp_path_factory, "text", rows)


def typed_rows():
    rows = good_rows(16)
    for i, r in {1: {"label": None}, 2: {"x": float("inf")}, 3: {"x": float("nan")},
                 4: {"cat": ["c"], "w": [float("nan")]}, 5: {"id": 12}, 6: {"id": -1},
                 7: {"cat": ["d", "e", "f", "g"], "w": [1.0] * 4}, 8: {"cat": ["a", "b"], "w": [1.0]}}.items():
        rows[i].update(r)
    return rows


@pytest.mark.parametrize("fmt", FORMATS)
def test_typed_values_non_finite_out_of_range_and_out_of_vocabulary(tmp_path, tmp_path_factory, fmt):
    """Typed values (TFRecord float_list / int64_list, Parquet float64 / int64 columns): a non-finite dense value
    is an unparsable_number, a NaN weight is dropped and counted, ids outside [0, num_buckets) are counted, OOV
    tokens are dropped and counted without OOV buckets and mapped to the OOV bucket with one."""
    rows = typed_rows()
    path, out = run_rows(tmp_path, fmt, rows)
    m, letters = assert_counts_add_up(out)
    assert letters_of(letters) == [(record_of(fmt, 1), "missing_value"), (record_of(fmt, 2), "unparsable_number"),
                                   (record_of(fmt, 3), "unparsable_number"), (record_of(fmt, 8), "weight_mismatch")]
    assert all("dense column 'x'" in x["detail"] for x in letters[1:3])
    ids = m.counts.ids
    assert ids["cat"] == {"values": 23, "ids": 18, "oov": 4, "oov_dropped": 4, "nan_weights_dropped": 1}
    assert ids["cat_oov"] == {"values": 23, "ids": 23, "oov": 4}
    assert ids["id"] == {"values": 12, "ids": 10, "invalid_ids_dropped": 2}
    assert m.counts.examples_written == 12
    assert_same_as_csv(fmt, out, tmp_path_factory, "typed", rows)


@pytest.mark.parametrize("fmt", FORMATS)
def test_integers_beyond_2_to_the_53_in_numeric_columns(tmp_path, tmp_path_factory, fmt):
    """int64 labels, dense values and weights beyond 2**53 (not exact as float64) are numbers as their decimal
    text in a CSV cell is: rounded to the nearest float64, then float32 (TFRecord int64_list and Parquet int64
    columns stopped the run with ArrowInvalid 'Integer value ... not in range')."""
    big = [(1 << 53) + 1, -(1 << 53) - 3, (1 << 62) + 12345, (1 << 63) - 1, 3, 0, -(1 << 63), 10 ** 17 + 1]
    rows = [{"label": i % 2, "x": big[i], "cat": ["a"], "w": [big[-1 - i]], "id": i} for i in range(8)]
    path, out = run_rows(tmp_path, fmt, rows, policies={"tail": "pad", "nan_weights": "error"})
    m, letters = assert_counts_add_up(out)
    assert letters == [] and m.counts.examples_written == 8
    assert_same_as_csv(fmt, out, tmp_path_factory, "big", rows, policies={"tail": "pad", "nan_weights": "error"})


# ---------------------------------------------------------------- policies that stop the run, and label.fill

@pytest.mark.parametrize("fmt", FORMATS)
def test_invalid_id_with_error_policy_names_file_record_and_value(tmp_path, fmt):
    rows = good_rows(8)
    rows[5]["id"] = 12
    with pytest.raises(PolicyError) as e:
        run_rows(tmp_path, fmt, rows, policies={"invalid_ids": "error"})
    path = str(tmp_path / fmt / f"in.{EXT[fmt]}")
    msg = str(e.value)
    assert re.search(rf"feature 'id' .*{re.escape(path)} record {record_of(fmt, 5)}: value '?12'? is not an "
                     r"integer id in \[0, 10\)", msg), msg
    assert "policies.invalid_ids: drop" in msg
    assert_counts_add_up(str(tmp_path / fmt / "out"), job="vocab")


@pytest.mark.parametrize("fmt", FORMATS)
def test_nan_weight_with_error_policy_names_file_and_record(tmp_path, fmt):
    rows = good_rows(8)
    rows[5]["w"] = [float("nan")] * len(rows[5]["cat"])
    with pytest.raises(PolicyError) as e:
        run_rows(tmp_path, fmt, rows, policies={"nan_weights": "error"})
    path = str(tmp_path / fmt / f"in.{EXT[fmt]}")
    assert f"feature 'cat' (input file #0): {path} record {record_of(fmt, 5)}: weight is NaN" in str(e.value)
    assert "policies.nan_weights: drop | zero" in str(e.value)


@pytest.mark.parametrize("fmt", FORMATS)
def test_label_fill_zeroed_nan_weights_float_ids_and_truncated_sequences(tmp_path, tmp_path_factory, fmt):
    """Blank labels take label.fill (no letter); nan_weights: zero keeps the value with weight 0 (counted); float
    ids (float_list, a float64 column, '3.0' in CSV) are invalid ids; sequences longer than sequence_length are
    cut and counted."""
    rows = good_rows(8)
    for r in rows:
        r["fid"] = float(r["id"])
        r["cat"] = ["a", "b", "c"]
        r["w"] = [1.0, 0.5, 2.0]
    rows[2]["label"] = rows[5]["label"] = None
    rows[3]["w"] = [1.0, float("nan"), 2.0]
    over = dict(label={"column": "label", "fill": 0.5}, policies={"tail": "pad", "nan_weights": "zero"},
                categorical=CATEGORICAL + [
                    {"name": "fid", "vocabulary": {"type": "identity", "num_buckets": 10}},
                    {"name": "seq", "column": "cat", "delimiter": "|", "sequence_length": 2,
                     "vocabulary": {"num_oov_buckets": 1}}])
    keys = KEYS + ("fid",)
    _, out = run_rows(tmp_path, fmt, rows, keys, **over)
    m, letters = assert_counts_add_up(out)
    assert letters == [] and m.counts.examples_written == 8
    ids = m.counts.ids
    assert ids["cat"]["nan_weights_zeroed"] == 1 and ids["cat"]["ids"] == 24
    assert ids["fid"] == {"values": 8, "ids": 0, "invalid_ids_dropped": 8}
    assert ids["seq"]["truncated_sequence"] == 8 and ids["seq"]["ids"] == 16
    assert_same_as_csv(fmt, out, tmp_path_factory, "fill", rows, keys, **over)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_record_invalid_fails_naming_file_record_and_reason(tmp_path, fmt):
    rows = good_rows(6)
    for r in rows:
        r["label"] = None
    with pytest.raises(DataError) as e:
        run_rows(tmp_path, fmt, rows)
    path = str(tmp_path / fmt / f"in.{EXT[fmt]}")
    assert (f"no valid record in 1 input file(s) (6 records read, all dead-lettered; 0 whole file(s) refused). "
            f"First: {path} record {record_of(fmt, 0)}: missing_value: label column 'label' is blank") in str(e.value)
    _, letters = assert_counts_add_up(str(tmp_path / fmt / "out"), job="vocab")
    assert letters_of(letters) == [(record_of(fmt, i), "missing_value") for i in range(6)]


# ---------------------------------------------------------------- binary formats only

@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
def test_bytes_that_are_not_utf8_and_dense_lists(tmp_path, fmt):
    """TFRecord and Parquet binary values are bytes as they are (CSV dead-letters them, test_bad_input.py):
    a token that is not UTF-8 is a token, an identity id that is not UTF-8 an invalid id (counted); a dense
    column with two values in a record is a wrong_type letter naming the column."""
    rows = good_rows(8)
    rows[2]["id"] = b"\xff"
    rows[3]["id"] = b"5"
    rows[4]["cat"], rows[4]["w"] = [b"\xfe\xff"], [1.0]
    rows[6]["x"] = [1.0, 2.0]
    rows = [dict(r, x=r["x"] if isinstance(r["x"], list) else [r["x"]]) for r in rows]
    path, out = run_rows(tmp_path, fmt, rows)
    m, letters = assert_counts_add_up(out)
    assert letters_of(letters) == [(6, "wrong_type")]
    assert letters[0]["detail"] == "dense column 'x' has 2 values, expected one" and letters[0]["file"] == path
    assert m.counts.ids["id"] == {"values": 7, "ids": 6, "invalid_ids_dropped": 1}
    # b"\xfe\xff" is a token (out of the top 3: the OOV bucket); record 6 is dead-lettered, its values not counted
    assert m.counts.ids["cat_oov"] == {"values": 13, "ids": 13, "oov": 1}


@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
def test_an_input_without_records_fails_naming_the_file(tmp_path, fmt):
    d = tmp_path / fmt
    d.mkdir()
    if fmt == "tfrecord":
        path = d / "in.tfrecord"
        path.write_bytes(b"")
        match = rf"{re.escape(str(path))} whole file: empty_file"
    else:
        path = d / "in.parquet"
        pq.write_table(pa.table({k: pa.array([], pa.float64()) for k in KEYS}), str(path))
        match = rf"\({re.escape(str(path))}\) hold no records \(an empty data set\)"
    with pytest.raises(DataError, match=match):
        runner.run_all(JobConfig(spec=make_spec(d, fmt, categorical=CATEGORICAL), output=str(d / "out")))
