"""The same rows as CSV, as TFRecord of tf.train.Example and as Parquet give the same artifact.

Rows are drawn as values (strings, integers, float32-exact floats, lists of them, weights, blanks) and written
in each format the ways producers write them: CSV text (integers in decimal, floats as
`repr(float(np.float32(v)))`, lists joined by the feature's delimiter, blanks empty); TFRecord with one value
kind per key (bytes_list, int64_list or float_list; numbers also as their text in bytes_list; a blank cell a
missing key, a blank inside a list an empty bytes value, a blank integer left out with its weight, a blank
weight NaN); Parquet with typed columns (string, int32 / int64 / uint64, float32 / float64, list and large_list
columns; a blank a null or an empty string, a blank weight a null or NaN). Each is run through the real job
(`runner.run_all`) with one spec holding every vocabulary kind (frequency, top_k, frequency_threshold, OOV
buckets, a vocabulary two features share, identity with and without default_value, hashing; weights, sequences,
delimiters, a tensor-core feature), and the files under vocab/ and shards/ must be the same bytes, the
manifests' vocabularies, sizes, layout and counts the same. The serving mapping (`tpu_embed.serving`) is
checked against one such artifact: the TFRecord examples and the CSV cells map to the ids the shards hold.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pipelines import runner
from pipelines.jobs import JobConfig
from pipelines.read.records import DataError
from tests.reliability.artifacts import artifact_bytes
from tpu_embed.artifact import tfrecord
from tpu_embed.artifact.spec import parse_spec

I64 = (-(1 << 63), (1 << 63) - 1)
SPECIAL_INTS = [0, 7, 42, -15, 1722, 1 << 53, (1 << 53) + 1, -(1 << 53) - 1, I64[0], I64[1], 10 ** 18]
STRINGS = ["a", "b", "cc", "7", "-15", "1722", "\u00e9t\u00e9", "x y", " 5 ", "3.0", "\u0661", "nan"]
BLANK = None

# column -> ("str" | "int" | "float" | "weight", is a list column)
COLUMNS = {"x": ("float", False), "s": ("str", False), "i": ("int", False), "f": ("float", False),
           "m": ("str", True), "mw": ("weight", True), "q": ("int", True), "qw": ("weight", True)}
WEIGHTS_OF = {"m": "mw", "q": "qw"}


def raw_spec(nan_weights: str = "drop") -> dict:
    freq = {"type": "frequency"}
    return {
        "label": {"column": "label"},
        "dense": [{"name": "x", "fill": -1.5}],
        "categorical": [
            {"name": "s_freq", "column": "s", "vocabulary": freq},
            {"name": "s_top", "column": "s", "vocabulary": {"top_k": 2, "num_oov_buckets": 3}},
            {"name": "s_thr", "column": "s", "vocabulary": {"frequency_threshold": 2, "num_oov_buckets": 0}},
            {"name": "s_hash", "column": "s", "vocabulary": {"type": "hashing", "num_buckets": 17}},
            # a vocabulary two features share (strings and integers counted together)
            {"name": "s_mixed", "column": "s", "table": "mixed", "vocabulary": freq},
            {"name": "i_mixed", "column": "i", "table": "mixed", "vocabulary": freq},
            {"name": "i_freq", "column": "i", "vocabulary": freq},
            {"name": "i_top", "column": "i", "vocabulary": {"top_k": 3, "frequency_threshold": 1,
                                                            "num_oov_buckets": 2}},
            {"name": "i_thr", "column": "i", "vocabulary": {"frequency_threshold": 2, "num_oov_buckets": 0}},
            {"name": "i_id", "column": "i", "vocabulary": {"type": "identity", "num_buckets": 50}},
            {"name": "i_id_default", "column": "i",
             "vocabulary": {"type": "identity", "num_buckets": 50, "default_value": 49}},
            {"name": "i_hash", "column": "i", "vocabulary": {"type": "hashing", "num_buckets": 97}},
            {"name": "f_freq", "column": "f", "vocabulary": freq},
            {"name": "f_hash", "column": "f", "vocabulary": {"type": "hashing", "num_buckets": 13}},
            {"name": "f_id", "column": "f", "vocabulary": {"type": "identity", "num_buckets": 10,
                                                           "default_value": 3}},
            {"name": "m_w", "column": "m", "delimiter": "|", "weight_column": "mw",
             "vocabulary": {"num_oov_buckets": 2}},
            {"name": "m_hash", "column": "m", "delimiter": "|", "vocabulary": {"type": "hashing", "num_buckets": 11}},
            {"name": "m_tc", "column": "m", "delimiter": "|", "embedding_lookup_device": "tpu_tensor_core",
             "tensor_core_width": 2, "vocabulary": {"top_k": 3}},
            {"name": "q_seq", "column": "q", "delimiter": "|", "sequence_length": 2,
             "vocabulary": {"type": "identity", "num_buckets": 20}},
            {"name": "q_seq_freq", "column": "q", "delimiter": "|", "sequence_length": 3, "vocabulary": freq},
            {"name": "q_w", "column": "q", "delimiter": "|", "weight_column": "qw",
             "vocabulary": {"type": "hashing", "num_buckets": 31}},
            {"name": "q_wf", "column": "q", "delimiter": "|", "weight_column": "qw", "vocabulary": freq},
        ],
        "defaults": {"table": {"dim": 4, "combiner": "sum"}},
        "optimizer": {"type": "sgd", "learning_rate": 0.1},
        "topology": {"num_chips": 1, "num_sc_per_chip": 2},
        "global_batch_size": 4,
        "policies": {"invalid_ids": "drop", "nan_weights": nan_weights, "tail": "pad"},
    }


# ---------------------------------------------------------------- values

def f32(v: float) -> float:
    return float(np.float32(v))


ints = st.one_of(st.sampled_from(SPECIAL_INTS), st.integers(0, 60), st.integers(*I64))
# Integers beyond int64 (Parquet uint64; text elsewhere): rarely, in the scalar column only.
wide_ints = st.one_of(ints, ints, ints, st.sampled_from([1 << 63, (1 << 64) - 1]))
floats = st.one_of(st.sampled_from([0.0, -0.0, 1.0, 3.0, -2.5, 0.1, 1e20, 16777217.0]),
                   st.floats(width=32, allow_nan=True, allow_infinity=True)).map(f32)
weights = st.one_of(st.sampled_from([0.5, 1.0, 2.0, 0.1, 3.25, 4.0]),
                    st.floats(0.125, 100.0, width=32)).map(f32)


def scalar(values):
    return st.one_of(st.none(), values)


@st.composite
def weighted_list(draw, values):
    """(values, weights) of a list cell: each value may be BLANK, each weight BLANK (NaN); or (None, None)."""
    if draw(st.integers(0, 5)) == 0:
        return None, None
    vs = draw(st.lists(st.one_of(values, values, values, st.none()), min_size=1, max_size=4))
    ws = draw(st.lists(st.one_of(weights, weights, weights, st.none()), min_size=len(vs), max_size=len(vs)))
    return vs, ws


@st.composite
def rows(draw, min_rows=4, max_rows=9):
    out = []
    for _ in range(draw(st.integers(min_rows, max_rows))):
        m, mw = draw(weighted_list(st.sampled_from(STRINGS)))
        q, qw = draw(weighted_list(ints))
        out.append({"label": draw(st.sampled_from([0.0, 1.0, 0.0, 1.0, None])), "x": draw(scalar(floats)),
                    "s": draw(scalar(st.sampled_from(STRINGS))), "i": draw(scalar(wide_ints)),
                    "f": draw(scalar(floats)), "m": m, "mw": mw, "q": q, "qw": qw})
    return out


def text(v) -> str:
    """A value as CSV text: integers in decimal, floats as the repr of the float32 value widened."""
    if v is None:
        return ""
    if isinstance(v, float):
        return "nan" if v != v else repr(f32(v))
    return str(v)


# ---------------------------------------------------------------- writers

def write_csv(path, rows_):
    import csv
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, quoting=csv.QUOTE_ALL, lineterminator="\n")
        w.writerow(["label"] + list(COLUMNS))
        for r in rows_:
            cells = [text(r["label"])]
            for c, (_, is_list) in COLUMNS.items():
                v = r[c]
                cells.append(text(v) if not is_list else ("" if v is None else "|".join(text(x) for x in v)))
            w.writerow(cells)


def tfrecord_kinds(rows_, choose) -> dict:
    """{column: bytes | int64 | float}: numbers as their kind (integers beyond int64 as text) or as their text."""
    out = {"label": choose(["float", "int64"])}
    for c, (kind, is_list) in COLUMNS.items():
        if kind == "str":
            out[c] = "bytes"
        elif kind == "int":
            vals = [x for r in rows_ for x in ((r[c] or []) if is_list else [r[c]]) if x is not None]
            out[c] = choose(["int64", "bytes"]) if all(I64[0] <= v <= I64[1] for v in vals) else "bytes"
        elif kind == "weight":  # integral weights may be int64 lists too
            vals = [x for r in rows_ for x in (r[c] or [])]
            whole = all(x is not None and x == int(x) for x in vals)
            out[c] = choose(["float", "bytes"] + (["int64"] if whole else []))
        else:
            out[c] = choose(["float", "bytes"])
    return out


def example_of(r, kinds, choose) -> bytes:
    import tensorflow as tf

    def feature(kind, vs):
        if kind == "int64":
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in vs]))
        if kind == "float":
            return tf.train.Feature(float_list=tf.train.FloatList(value=[float("nan") if v is None else v
                                                                         for v in vs]))
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[text(v).encode() for v in vs]))

    feats = {}
    for c, kind in kinds.items():
        v = r[c]
        if c in WEIGHTS_OF.values():
            continue
        if v is None:  # a blank cell: no key, or (lists) empty lists
            if c in WEIGHTS_OF and choose([False, True]):
                feats[c] = feature(kind, [])
                feats[WEIGHTS_OF[c]] = feature(kinds[WEIGHTS_OF[c]], [])
            continue
        if c not in WEIGHTS_OF:
            feats[c] = feature(kind, [v])
            continue
        if v is None and kind == "bytes" and choose([False, True]):  # a blank scalar as an empty value
            feats[c] = feature(kind, [""])
            continue
        vs, ws = v, r[WEIGHTS_OF[c]]
        if kind == "int64":  # no blank int64: a blank value is left out with its weight (both are no value)
            keep = [k for k, x in enumerate(vs) if x is not None]
            vs, ws = [vs[k] for k in keep], [ws[k] for k in keep]
        feats[c] = feature(kind, vs)
        feats[WEIGHTS_OF[c]] = feature(kinds[WEIGHTS_OF[c]], ws)  # a blank weight: NaN, or empty bytes
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


def write_tfrecord(path, rows_, choose, kinds=None):
    kinds = kinds or tfrecord_kinds(rows_, choose)
    examples = [example_of(r, kinds, choose) for r in rows_]
    with open(path, "wb") as fh:
        fh.write(tfrecord.encode_file(examples))
    return kinds, examples


def parquet_types(rows_, choose) -> dict:
    out = {"label": choose([pa.float64(), pa.int64(), pa.bool_()])}
    for c, (kind, is_list) in COLUMNS.items():
        vals = [x for r in rows_ for x in ((r[c] or []) if is_list else [r[c]]) if x is not None]
        if kind == "str":
            t = choose([pa.string(), pa.large_string(), pa.binary()]
                       + ([] if is_list else [pa.dictionary(pa.int32(), pa.string())]))
        elif kind == "int":
            choices = [pa.int64()] if all(I64[0] <= v <= I64[1] for v in vals) else []
            choices.append(pa.string())
            if all(-(1 << 31) <= v < (1 << 31) for v in vals):
                choices.append(pa.int32())
            if all(0 <= v < (1 << 64) for v in vals):
                choices.append(pa.uint64())
            t = choose(choices)
        elif kind == "float":
            t = choose([pa.float32(), pa.float64(), pa.string()])
        else:  # weights: numbers (integral ones as integers too) or their text
            whole = all(x == int(x) for x in vals)
            t = choose([pa.float32(), pa.float64(), pa.string()] + ([pa.int64()] if whole else []))
        if is_list:
            t = choose([pa.list_, pa.large_list])(t)
        out[c] = t
    return out


def write_parquet(path, rows_, choose, types=None):
    types = types or parquet_types(rows_, choose)
    cols = {}
    for c, t in types.items():
        is_list = pa.types.is_list(t) or pa.types.is_large_list(t)
        vt = t.value_type if is_list else t
        vt = vt.value_type if pa.types.is_dictionary(vt) else vt
        as_text = pa.types.is_string(vt) or pa.types.is_large_string(vt) or pa.types.is_binary(vt)

        def value(v, vt=vt, as_text=as_text, c=c):
            if v is None:  # a blank: null, or an empty string (text), or NaN (weights)
                if as_text and choose([False, True]):
                    return ""
                if c in WEIGHTS_OF.values() and not pa.types.is_integer(vt) and choose([False, True]):
                    return "nan" if as_text else float("nan")
                return None
            if as_text and not isinstance(v, str):
                return text(v)
            return bool(v) if pa.types.is_boolean(vt) else int(v) if pa.types.is_integer(vt) else v

        if not is_list:
            cols[c] = pa.array([value(r[c]) for r in rows_], t)
        else:
            cols[c] = pa.array([None if r[c] is None else [value(x) for x in r[c]] for r in rows_], t)
    pq.write_table(pa.table(cols), path, row_group_size=choose([64, 3]))
    return types


# ---------------------------------------------------------------- runs and comparison

def run(d, fmt, name, nan_weights="drop"):
    spec = parse_spec({**raw_spec(nan_weights), "inputs": {"format": fmt, "patterns": [name]}}, base_dir=d)
    out = os.path.join(d, f"out_{fmt}")
    runner.run_all(JobConfig(spec=spec, output=out))
    return spec, out


def manifest_facts(out) -> dict:
    """What of the manifest does not depend on where the input came from."""
    with open(os.path.join(out, "manifest.json")) as fh:
        m = json.load(fh)
    keep = {k: m[k] for k in ("counts", "vocab_sizes", "vocabularies", "features", "layout", "stacks",
                              "batch_sizes", "shards", "limits")}
    keep["files"] = [f for f in m["files"] if f["path"] != "spec.yaml" and f["kind"] != "dead_letter"]
    keep["job_counts"] = {j: v["counts"] for j, v in m["jobs"].items()}
    keep["dead_letters"] = dead_letters(out, m)
    return keep


def dead_letters(out, m) -> list:
    """[(record index, reason)] of the dead letters (a CSV record's number is its line: the header is line 1 and
    no value written here holds a line break)."""
    got = []
    for f in m["files"]:
        if f["kind"] == "dead_letter":
            with open(os.path.join(out, f["path"])) as fh:
                for line in fh:
                    x = json.loads(line)
                    got.append((x["record"] - 2 if x["file"].endswith(".csv") else x["record"], x["reason"],
                                x["detail"]))
    return sorted(got)


def assert_same_artifacts(outs: dict):
    (first, a), *others = outs.items()
    files = artifact_bytes(a)
    assert any(p.startswith("vocab/") for p in files) and any(p.startswith("shards/") for p in files)
    facts = manifest_facts(a)
    for fmt, b in others:
        got = artifact_bytes(b)
        assert sorted(got) == sorted(files), (first, fmt)
        for p in files:
            if got[p] != files[p]:
                detail = (files[p].decode(errors="replace").split("\n"), got[p].decode(errors="replace").split("\n")
                          ) if p.startswith("vocab/") else ""
                raise AssertionError(f"{p}: {first} and {fmt} differ {detail}")
        other = manifest_facts(b)
        assert [x[:2] for x in other.pop("dead_letters")] == [x[:2] for x in facts["dead_letters"]], (
            first, fmt, facts["dead_letters"])
        for k in other:
            assert other[k] == facts[k], (k, first, fmt)


def write_all(d, rows_, choose):
    write_csv(os.path.join(d, "in.csv"), rows_)
    kinds, examples = write_tfrecord(os.path.join(d, "in.tfrecord"), rows_, choose)
    write_parquet(os.path.join(d, "in.parquet"), rows_, choose)
    return kinds, examples


def run_all_formats(d, nan_weights="drop"):
    """{format: artifact}, or None when every format's run found no valid record (no label, non-finite dense
    values: dead letters) and failed alike."""
    outs, failed = {}, {}
    for fmt in ("csv", "tfrecord", "parquet"):
        try:
            outs[fmt] = run(d, fmt, f"in.{fmt}", nan_weights)[1]
        except DataError as e:
            failed[fmt] = str(e)
    if not failed:
        return outs
    assert not outs and all("all dead-lettered" in e for e in failed.values()), failed
    return None


# Each example runs the jobs three times: a few by default, more with TPU_EMBED_CROSS_FORMAT_EXAMPLES.
N = min(int(os.environ.get("TPU_EMBED_HYPOTHESIS_EXAMPLES", "100")),
        int(os.environ.get("TPU_EMBED_CROSS_FORMAT_EXAMPLES", "5")))


@settings(deadline=None, max_examples=N, database=None, suppress_health_check=list(HealthCheck),
          phases=[Phase.explicit, Phase.generate])
@given(rows_=rows(), data=st.data(), nan_weights=st.sampled_from(["drop", "zero"]))
def test_csv_tfrecord_and_parquet_give_the_same_artifact(tmp_path_factory, rows_, data, nan_weights):
    d = str(tmp_path_factory.mktemp("xf"))
    write_all(d, rows_, lambda options: data.draw(st.sampled_from(options)))
    outs = run_all_formats(d, nan_weights)
    if outs is not None:
        assert_same_artifacts(outs)


# ---------------------------------------------------------------- the integers of issue 42, and serving

ISSUE_INTS = [1722, 42, -15, 0, (1 << 53) + 1, I64[0], I64[1], 42]
ISSUE_ROWS = [  # every integer value kind of TFRecord and Parquet (int64_list, int64 / int32 lists) at once
    {"label": 1.0, "x": 0.5, "s": s, "i": i, "f": f, "m": ["a", None, "b"], "mw": [0.5, 1.0, 2.0],
     "q": [i % 20, None, 3], "qw": [1.0, 4.0, 0.25]}
    for s, i, f in zip(["a", "b", "a", "cc", "7", "a", "b", "42"], ISSUE_INTS,
                       [0.1, 3.0, -2.5, 0.1, 1e20, -0.0, 16777217.0, 3.0], strict=True)]


def first_choice(options):
    return options[0]


def test_issue_integers_give_their_decimal_text_in_every_format_and_serving_maps_them_alike(tmp_path):
    """int64_list (TFRecord) and int64 columns (Parquet) of the issue's integers: the vocabulary holds their full
    decimal text (the old `as_tokens` kept each one's first character: `1 4 - 0 9 9 2`), hashing and identity
    agree with CSV, and `tpu_embed.serving` maps the TFRecord examples and the CSV cells to the shards' ids."""
    import tensorflow as tf

    from tests.tpu_embed.serving.shards import assert_serves_the_shards
    from tpu_embed.serving import RawFeatureMapping

    d = str(tmp_path)
    write_csv(os.path.join(d, "in.csv"), ISSUE_ROWS)
    kinds, examples = write_tfrecord(os.path.join(d, "in.tfrecord"), ISSUE_ROWS, first_choice)
    assert kinds["i"] == kinds["q"] == "int64" and kinds["f"] == kinds["mw"] == "float"
    types = write_parquet(os.path.join(d, "in.parquet"), ISSUE_ROWS, first_choice)
    assert types["i"] == pa.int64() and types["q"] == pa.list_(pa.int64())
    outs = {}
    for fmt in ("tfrecord", "parquet", "csv"):
        outs[fmt] = run(d, fmt, f"in.{fmt}")[1]
        with open(os.path.join(outs[fmt], "vocab", "i_freq.txt")) as fh:
            assert fh.read().split("\n") == ["42", "9223372036854775807", "9007199254740993", "1722", "0",
                                             "-9223372036854775808", "-15", ""], fmt
    assert_same_artifacts(outs)

    art = outs["tfrecord"]
    spec = parse_spec({**raw_spec(), "inputs": {"format": "tfrecord", "patterns": ["in.tfrecord"]}}, base_dir=d)
    mapping = RawFeatureMapping.from_artifact(art)
    out = mapping.map_examples(tf.constant(examples))
    assert out["valid"].numpy().all()
    assert assert_serves_the_shards(spec, art, out) == len(ISSUE_ROWS)
    # the serving ids of the integer features are the shards' (checked above) and not the first digits' ids
    vocab = open(os.path.join(art, "vocab", "i_freq.txt")).read().split("\n")
    assert out["ids"]["i_freq"].to_list() == [[vocab.index(str(i))] for i in ISSUE_INTS]

    with open(os.path.join(d, "in.csv"), newline="", encoding="utf-8") as fh:
        import csv
        records = list(csv.DictReader(fh))
    raw = mapping({c: tf.constant([r[c] for r in records]) for c in mapping.columns})
    assert raw["valid"].numpy().all()
    assert_serves_the_shards(spec, outs["csv"], raw)
