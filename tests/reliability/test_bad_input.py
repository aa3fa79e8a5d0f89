"""Bad input through the jobs: a clear error naming feature/file/record/fix, or a counted drop under an
explicit policy; after every run the counts add up (accounting.assert_counts_add_up)."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines import runner
from pipelines.jobs import JobConfig
from pipelines.read.records import DataError
from tests.reliability.accounting import assert_counts_add_up
from tests.reliability.inputs import example_bytes, make_spec, tfrecord_file


def run(tmp_path, spec, **cfg):
    out = str(tmp_path / "out")
    runner.run_all(JobConfig(spec=spec, output=out, **cfg))
    return out


def write(tmp_path, name, data):
    p = tmp_path / name
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return str(p)


def error_text(excinfo):
    return str(excinfo.value)


# ---------------------------------------------------------------- TFRecord damage

def test_flipped_bit_in_record_10_dead_letters_that_record_only(tmp_path, examples_200):
    data = bytearray(tfrecord_file(examples_200))
    pos = sum(12 + len(p) + 4 for p in examples_200[:10]) + 12 + 5  # inside record 10's payload
    data[pos] ^= 0x04
    write(tmp_path, "in.tfrecord", bytes(data))
    out = run(tmp_path, make_spec(tmp_path, "tfrecord"))
    m, letters = assert_counts_add_up(out)
    assert [(x["record"], x["reason"]) for x in letters] == [(10, "corrupt_record")]
    assert m.counts.records_read == 200 and m.counts.examples_written == 196  # 199 valid, tail 3 dropped


def _corrupt_length(examples):
    data = bytearray(tfrecord_file(examples))
    pos = sum(12 + len(p) + 4 for p in examples[:10])  # record 10's length field
    data[pos] ^= 0x01
    return bytes(data)


def test_corrupt_length_field_fails_the_run_naming_file_record_and_fix(tmp_path, examples_200):
    path = write(tmp_path, "in.tfrecord", _corrupt_length(examples_200))
    with pytest.raises(DataError) as e:
        run(tmp_path, make_spec(tmp_path, "tfrecord"))
    msg = error_text(e)
    assert path in msg and "record 10" in msg and "framing lost" in msg and "policies.lost_framing" in msg
    assert "190 record(s) lost" in msg
    assert_counts_add_up(str(tmp_path / "out"), job="vocab")  # the dead letters are written before failing


@pytest.mark.slow
def test_corrupt_length_field_with_dead_letter_policy_counts_the_rest(tmp_path, examples_200):
    write(tmp_path, "in.tfrecord", _corrupt_length(examples_200))
    out = run(tmp_path, make_spec(tmp_path, "tfrecord", policies={"lost_framing": "dead_letter"}))
    m, letters = assert_counts_add_up(out)
    reasons = [x["reason"] for x in letters]
    assert reasons.count("framing_lost") == 1 and reasons.count("after_framing_loss") == 189
    assert m.counts.records_read == 200 and m.counts.examples_written == 8 and m.counts.examples_dropped["tail"] == 2


@pytest.mark.slow
def test_truncated_tfrecord_fails_by_default(tmp_path, examples_200):
    write(tmp_path, "in.tfrecord", tfrecord_file(examples_200[:20])[:-7])
    with pytest.raises(DataError, match=r"record 19: framing_lost: .*truncated record"):
        run(tmp_path, make_spec(tmp_path, "tfrecord"))


# ---------------------------------------------------------------- the only input is bad

@pytest.mark.parametrize("name,data,fmt,match", [
    ("header_only.csv", "label,x,cat,id\n", "csv", r"hold no records \(an empty data set\)"),
    ("zero.csv", "", "csv", r"whole file: empty_file"),
    ("nolabel.csv", "x,cat,id\n1,a,3\n", "csv",
     r"nolabel.csv whole file: missing_columns: column 'label' is missing \(the file has 3 columns\)"),
    ("unterminated.csv", 'label,x,cat,id\n1,1,"a,3\n0,2,b,4\n', "csv",
     r"unterminated.csv record 2: framing_lost: unterminated quote.*line 2.*Fix: close the quote"),
    ("junk.tfrecord", None, "tfrecord",
     r"junk.tfrecord record 0: malformed_record: record 0 is not a tf.train.Example"),
])
def test_only_input_bad_names_the_real_cause(tmp_path, name, data, fmt, match):
    if data is None:
        data = tfrecord_file([b"\xff\xfe not a proto", b"\x08\x96\x01"])
    write(tmp_path, name, data)
    with pytest.raises(DataError, match=match):
        run(tmp_path, make_spec(tmp_path, fmt))
    assert_counts_add_up(str(tmp_path / "out"), job="vocab")


def test_empty_data_set_and_single_example_tail_policies(tmp_path):
    write(tmp_path, "one.csv", "label,x,cat,id\n1,2,a,3\n")
    with pytest.raises(DataError, match=r"0 examples written: the 1 valid example\(s\) do not fill .* --tail pad"):
        run(tmp_path, make_spec(tmp_path))
    m, _ = assert_counts_add_up(str(tmp_path / "out"))
    assert m.counts.examples_dropped["tail"] == 1
    out = run(tmp_path, make_spec(tmp_path, policies={"tail": "pad"}))
    m, _ = assert_counts_add_up(out)
    assert (m.counts.examples_written, m.counts.examples_padding, m.counts.steps) == (1, 3, 1)


# ---------------------------------------------------------------- CSV rows

def test_non_utf8_byte_dead_letters_the_row_with_its_line(tmp_path):
    path = write(tmp_path, "in.csv", b"label,x,cat,id\n1,1,a,1\n0,2,b\xff,2\n1,3,c,3\n0,4,d,4\n1,5,e,5\n")
    out = run(tmp_path, make_spec(tmp_path))
    m, letters = assert_counts_add_up(out)
    assert [(x["file"], x["record"], x["reason"]) for x in letters] == [(path, 3, "invalid_utf8")]
    assert "column 'cat'" in letters[0]["detail"] and "UTF-8" in letters[0]["detail"]
    assert m.counts.examples_written == 4


def test_dead_letter_record_is_the_line_where_the_record_starts(tmp_path):
    text = ('label,x,cat,id\n'
            '1,1,"a,b",1\n'                 # line 2: comma inside quotes
            '0,2,"multi\nline\nvalue",2\n'  # lines 3-5: one record
            '\n'                            # line 6: empty, not a record
            '1,abc,c,3\n'                   # line 7: unparsable number
            '0,4,"x ""q"" y",4,extra\n'     # line 8: too many columns
            '1,5,"e\n",5\n'                 # lines 9-10
            ',6,f,6\n')                     # line 11: blank label
    write(tmp_path, "in.csv", text)
    out = run(tmp_path, make_spec(tmp_path, policies={"tail": "pad"}))
    m, letters = assert_counts_add_up(out)
    assert [(x["record"], x["reason"]) for x in letters] == [
        (7, "unparsable_number"), (8, "malformed_record"), (11, "missing_value")]


@pytest.mark.slow
def test_blank_and_missing_labels_follow_label_fill(tmp_path):
    write(tmp_path, "a.csv", "label,x,cat,id\n,1,a,1\n1,2,b,2\n  ,3,c,3\n0,4,d,4\n")
    out = run(tmp_path, make_spec(tmp_path, label={"column": "label", "fill": 0.0}))
    m, letters = assert_counts_add_up(out)
    assert letters == [] and m.counts.examples_written == 4
    out2 = str(tmp_path / "out2")
    runner.run_all(JobConfig(spec=make_spec(tmp_path, policies={"tail": "pad"}), output=out2))
    m, letters = assert_counts_add_up(out2)
    assert [(x["record"], x["reason"]) for x in letters] == [(2, "missing_value"), (4, "missing_value")]
    # a TFRecord without the label feature: every record is a missing_value dead letter (no fill)
    for p in tmp_path.glob("*.csv"):
        p.unlink()
    import tensorflow as tf
    ex = tf.train.Example()
    ex.features.feature["cat"].bytes_list.value.append(b"a")
    write(tmp_path, "nolabel.tfrecord", tfrecord_file([ex.SerializeToString()] * 4))
    out3 = str(tmp_path / "out3")
    runner.run_all(JobConfig(spec=make_spec(tmp_path, "tfrecord", label={"column": "label", "fill": 1.0}),
                             output=out3))
    m, letters = assert_counts_add_up(out3)
    assert m.counts.examples_written == 4 and letters == []


@pytest.mark.slow
def test_tokens_empty_spaces_newlines_and_non_utf8_bytes(tmp_path):
    # CSV: empty tokens are "no value"; spaces are part of the token; a token with a newline is OOV.
    write(tmp_path, "a.csv", 'label,x,cat,id\n1,1,a||b,1\n0,2, a ,2\n1,3,"x\ny",3\n0,4,,4\n')
    out = run(tmp_path, make_spec(tmp_path))
    m, letters = assert_counts_add_up(out)
    vocab = open(os.path.join(out, "vocab", "cat.txt"), "rb").read().split(b"\n")[:-1]
    assert sorted(vocab) == [b" a ", b"a", b"b"] and letters == []
    assert m.counts.ids["cat"]["values"] == 4 and m.counts.ids["cat"]["oov"] == 1
    # TFRecord: bytes tokens need not be UTF-8
    for p in tmp_path.glob("*.csv"):
        p.unlink()
    write(tmp_path, "b.tfrecord", tfrecord_file([example_bytes(cat=(b"\xff\xfe",)), example_bytes(cat=(b"",)),
                                                 example_bytes(cat=(b"ok",)), example_bytes(cat=(b"\xff\xfe",))]))
    out2 = str(tmp_path / "out2")
    runner.run_all(JobConfig(spec=make_spec(tmp_path, "tfrecord"), output=out2))
    m, letters = assert_counts_add_up(out2)
    vocab = open(os.path.join(out2, "vocab", "cat.txt"), "rb").read().split(b"\n")[:-1]
    assert vocab == [b"\xff\xfe", b"ok"] and m.counts.ids["cat"]["values"] == 3


# ---------------------------------------------------------------- identity ids

IDS = ["1", "12", "-1", "3.0", "abc", "99999999999999999999", "9"]


def test_invalid_identity_ids_are_counted_and_shown(tmp_path, capsys):
    rows = "".join(f"1,{i},a,{v}\n" for i, v in enumerate(IDS))
    write(tmp_path, "a.csv", "label,x,cat,id\n" + rows + "0,9,b,2\n")
    out = run(tmp_path, make_spec(tmp_path))
    m, letters = assert_counts_add_up(out)
    assert letters == [] and m.counts.ids["id"]["invalid_ids_dropped"] == 5 and m.counts.ids["id"]["ids"] == 3
    from pipelines.cli import summary
    assert "values dropped/changed by policies: id.invalid_ids_dropped 5" in summary(m, out)


def test_invalid_identity_ids_error_policy_names_file_record_value(tmp_path):
    path = write(tmp_path, "a.csv", "label,x,cat,id\n1,0,a,1\n1,0,a,2\n1,0,a,99999999999999999999\n1,0,a,3\n")
    with pytest.raises(Exception) as e:
        run(tmp_path, make_spec(tmp_path, policies={"invalid_ids": "error"}))
    msg = str(e.value)
    assert f"{path} record 4: value '99999999999999999999' is not an integer id in [0, 10)" in msg
    assert "feature 'id'" in msg and "policies.invalid_ids: drop" in msg


def test_float_ids_are_invalid_in_csv_and_parquet_alike(tmp_path):
    write(tmp_path, "a.csv", "label,x,cat,id\n1,0,a,3.0\n1,0,a,3\n0,1,b,4.5\n0,1,b,2\n")
    out = run(tmp_path, make_spec(tmp_path))
    csv_ids = assert_counts_add_up(out)[0].counts.ids["id"]
    pq.write_table(pa.table({"label": [1.0, 1.0, 0.0, 0.0], "x": [0.0, 0.0, 1.0, 1.0], "cat": ["a", "a", "b", "b"],
                             "id": [3.0, 3.0, 4.5, 2.0]}), str(tmp_path / "a.parquet"))
    out2 = str(tmp_path / "out2")
    runner.run_all(JobConfig(spec=make_spec(tmp_path, "parquet"), output=out2))
    pq_ids = assert_counts_add_up(out2)[0].counts.ids["id"]
    assert csv_ids["invalid_ids_dropped"] == 2  # '3.0' and '4.5'
    assert pq_ids["invalid_ids_dropped"] == 4   # every value of a float column (3.0 is not id 3)


# ---------------------------------------------------------------- Parquet with the wrong column types

@pytest.mark.slow
def test_parquet_wrong_column_types(tmp_path):
    pq.write_table(pa.table({
        "label": ["1", "0", "abc", "1", "0"],                       # strings of numbers parse; 'abc' does not
        "x": [1.0, 2.0, 3.0, 4.0, 5.0],
        "cat": [[1.5, 2.0], [3.0], [], None, [1.5]],                 # a list of floats: tokens '1.5', '2.0', ...
        "id": pa.array([{"a": 1}] * 5, pa.struct([("a", pa.int64())])),  # a struct: wrong type
    }), str(tmp_path / "a.parquet"))
    with pytest.raises(DataError, match=r"record 0: wrong_type: categorical column 'id' has type struct"):
        run(tmp_path, make_spec(tmp_path, "parquet"))
    assert_counts_add_up(str(tmp_path / "out"), job="vocab")
    pq.write_table(pa.table({
        "label": ["1", "0", "abc", "1", "0"], "x": [1.0, 2.0, 3.0, 4.0, 5.0],
        "cat": [[1.5, 2.0], [3.0], [], None, [1.5]], "id": [1, 2, 3, 4, 5]}), str(tmp_path / "a.parquet"))
    out = str(tmp_path / "out2")
    runner.run_all(JobConfig(spec=make_spec(tmp_path, "parquet"), output=out))
    m, letters = assert_counts_add_up(out)
    assert [(x["record"], x["reason"]) for x in letters] == [(2, "unparsable_number")]
    vocab = open(os.path.join(out, "vocab", "cat.txt"), "rb").read().split(b"\n")[:-1]
    assert vocab == [b"1.5", b"3.0", b"2.0"]


# ---------------------------------------------------------------- sequences and SparseCore limits

def test_sequence_longer_than_sequence_length_is_truncated_and_counted(tmp_path):
    write(tmp_path, "a.csv", "label,x,cat,id\n1,0,a|b|c|d|e,1\n1,0,a,1\n0,0,a|b|c,1\n0,0,,1\n")
    spec = make_spec(tmp_path, categorical=[
        {"name": "cat", "delimiter": "|", "sequence_length": 2, "vocabulary": {"num_oov_buckets": 1}},
        {"name": "id", "vocabulary": {"type": "identity", "num_buckets": 10}}])
    out = run(tmp_path, spec)
    m, _ = assert_counts_add_up(out)
    assert m.counts.ids["cat"]["truncated_sequence"] == 4 and m.counts.ids["cat"]["ids"] == 5


def _many_ids(tmp_path):
    # example 0 has 40 distinct ids of one feature, the others one each
    many = "|".join(f"t{i}" for i in range(40))
    write(tmp_path, "a.csv", f"label,x,cat,id\n1,0,{many},1\n1,0,t1,1\n0,0,t2,1\n0,0,t3,1\n")


def test_over_limit_example_with_pinned_limits_names_step_stack_and_limit(tmp_path):
    _many_ids(tmp_path)
    spec = make_spec(tmp_path, limits={"max_ids_per_chip_per_sample": 8, "max_ids_per_table": {}})
    with pytest.raises(Exception) as e:
        run(tmp_path, spec)
    msg = str(e.value)
    assert "step 0, chip 0" in msg and "max_ids_per_chip_per_sample = 8" in msg and "allow_id_dropping" in msg


@pytest.mark.slow
def test_over_limit_example_with_id_dropping_is_counted(tmp_path):
    _many_ids(tmp_path)
    spec = make_spec(tmp_path, limits={"max_ids_per_chip_per_sample": 8, "allow_id_dropping": True})
    out = run(tmp_path, spec)
    m, _ = assert_counts_add_up(out)
    assert sum(m.counts.ids_dropped_by_limits.values()) > 0


# ---------------------------------------------------------------- flags

def test_mistyped_flag_is_refused_with_did_you_mean(tmp_path, capsys):
    from pipelines.cli import main
    with pytest.raises(SystemExit) as e:
        main(["run", "--spec", "s.yaml", "--output", str(tmp_path), "--stirct"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unknown flag --stirct" in err and "Did you mean --strict?" in err
    with pytest.raises(SystemExit):
        main(["run", "--spec", "s.yaml", "--output", str(tmp_path), "--str"])  # no abbreviations
    from pipelines.flags import check_pass_through
    assert check_pass_through(["--runner=DataflowRunner", "--project", "p", "--region=r", "--temp_location=gs://b/t",
                               "--direct_num_workers=2", "--setup_file=./setup.py", "--dask_workers=2",
                               "--flink_master=localhost:8081"], ["--strict"]) is None


def test_an_empty_data_set_names_its_files_and_the_fix(tmp_path):
    """Header-only inputs: the error names the files (the first three, then how many more) and says what to do.
    (An empty file is a whole-file dead letter, named as the first of them.)"""
    one = write(tmp_path, "header_only.csv", "label,x,cat,id\n")
    with pytest.raises(DataError) as e:
        run(tmp_path, make_spec(tmp_path))
    assert f"the 1 input file(s) ({one}) hold no records (an empty data set)" in error_text(e)
    assert "Fix: add records to them" in error_text(e) and "inputs.patterns / --input" in error_text(e)
    many = tmp_path / "many"
    many.mkdir()
    paths = [write(many, f"part-{i}.csv", "label,x,cat,id\n") for i in range(5)]
    with pytest.raises(DataError) as e:
        run(many, make_spec(many))
    assert f"the 5 input file(s) ({', '.join(sorted(paths)[:3])} and 2 more) hold no records" in error_text(e)
