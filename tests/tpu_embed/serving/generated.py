"""Random specs and raw CSV rows for the serving equivalence tests: every vocabulary kind, OOV buckets, identity
values out of range or not integers, default values and both invalid-id policies, hashing, weights (blank,
unparsable, non-finite) under each NaN policy, sequences and tensor-core widths that truncate, delimiters of one
or more characters, blanks, non-ASCII and non-UTF-8 tokens, and weight counts that do not match (dead letters)."""

from __future__ import annotations

import os
import re

from hypothesis import strategies as st

from tpu_embed.artifact.spec import parse_spec

TOKENS = [b"a", b"b", b"cc", b"1", b"0", b"7", b"12", b"-3", b"+4", b" 5 ", b"1_0", b"0x10", b"3.0", b"1e3",
          "\u00e9t\u00e9".encode(), "\u0661\u0662".encode(), b"\xff\xfe", b"x y", b"", b"99999999999999999999"]
WEIGHTS = [b"1", b"0.5", b"2", b"", b"x", b"nan", b"inf", b"1e400", b" 3 ", b"-1", b"1_5", b"\xff"]
DENSE = [b"", b"1", b"-2.5", b" 7 ", b"1e3", b"4", b"1_0.5", "\u0661".encode(), b"x", b"inf"]


@st.composite
def categorical(draw, i: int):
    kind = draw(st.sampled_from(["frequency", "identity", "hashing"]))
    if kind == "frequency":
        vocab = {"type": "frequency", "num_oov_buckets": draw(st.sampled_from([0, 1, 3]))}
        if draw(st.booleans()):
            vocab["top_k"] = draw(st.integers(1, 4))
    elif kind == "identity":
        vocab = {"type": "identity", "num_buckets": draw(st.integers(1, 20))}
        if draw(st.booleans()):
            vocab["default_value"] = draw(st.integers(0, vocab["num_buckets"] - 1))
    else:
        vocab = {"type": "hashing", "num_buckets": draw(st.integers(1, 50))}
    f = {"name": f"f{i}", "vocabulary": vocab, "delimiter": draw(st.sampled_from([None, "|", ";;", " "]))}
    if draw(st.booleans()):
        f["weight_column"] = f"w{i}"
    shape = draw(st.sampled_from(["bag", "bag", "sequence", "tensor_core"]))
    if shape == "sequence":
        f["sequence_length"] = draw(st.integers(1, 3))
    elif shape == "tensor_core":
        f.update(embedding_lookup_device="tpu_tensor_core", tensor_core_width=draw(st.integers(1, 3)))
    return f


@st.composite
def specs(draw, policies=("drop",)):
    n = draw(st.integers(1, 4))
    feats = [draw(categorical(i)) for i in range(n)]
    if all(f.get("embedding_lookup_device") == "tpu_tensor_core" for f in feats):
        feats[0].pop("embedding_lookup_device")
        feats[0].pop("tensor_core_width")
    return {
        "name": "generated", "inputs": {"format": "csv", "patterns": ["in.csv"]}, "label": {"column": "label"},
        "dense": [{"name": "x", "fill": draw(st.sampled_from([0.0, -1.5]))}], "categorical": feats,
        "defaults": {"table": {"dim": 4, "combiner": draw(st.sampled_from(["mean", "sum", "sqrtn"]))}},
        "optimizer": {"type": "sgd", "learning_rate": 0.1},
        "topology": {"num_chips": 1, "num_sc_per_chip": 2}, "global_batch_size": 4,
        "policies": {"invalid_ids": draw(st.sampled_from(list(policies))),
                     "nan_weights": draw(st.sampled_from(["drop", "zero"] + (["error"] if "error" in policies
                                                                            else []))), "tail": "pad"}}


@st.composite
def rows(draw, raw_spec, min_rows=1, max_rows=12):
    """[{column: bytes}]: the CSV cells of each row."""
    out = []
    for _ in range(draw(st.integers(min_rows, max_rows))):
        r = {"label": draw(st.sampled_from([b"0", b"1"])), "x": draw(st.sampled_from(DENSE))}
        for f in raw_spec["categorical"]:
            d = f.get("delimiter")
            k = draw(st.integers(0, 4 if d else 1))
            tokens = [draw(st.sampled_from(TOKENS)) for _ in range(k)]
            r[f["name"]] = d.encode().join(tokens) if d else (tokens[0] if tokens else b"")
            if "weight_column" in f:
                # Mostly as many weights as values (before blanks are dropped); sometimes not (a dead letter).
                m = len(tokens) if d else 1
                if draw(st.integers(0, 5)) == 0:
                    m = draw(st.integers(0, 3))
                ws = [draw(st.sampled_from(WEIGHTS)) for _ in range(m)]
                r[f["weight_column"]] = d.encode().join(ws) if d else (ws[0] if ws else b"")
        out.append(r)
    return out


def csv_bytes(rows_, columns) -> bytes:
    def q(v: bytes) -> bytes:
        return b'"' + v.replace(b'"', b'""') + b'"'
    lines = [b",".join(c.encode() for c in columns)]
    lines += [b",".join(q(r[c]) for c in columns) for r in rows_]
    return b"\n".join(lines) + b"\n"


def write(tmp: str, raw_spec, rows_):
    spec = parse_spec(raw_spec, base_dir=tmp)
    columns = spec.required_columns()
    with open(os.path.join(tmp, "in.csv"), "wb") as fh:
        fh.write(csv_bytes(rows_, columns))
    return spec


_INT = re.compile(rb"-?[0-9]{1,18}")
_FLOAT = re.compile(rb"-?[0-9]+\.[0-9]+|-?[0-9]+e[0-9]+")


def column_kinds(draw, rows_, columns):
    """{column: "bytes" | "int64" | "float"}: a column whose every non-blank cell is a plain integer (or a
    plain float) may be written as int64 (float) lists; each column has one kind in every Example."""
    out = {}
    for c in columns:
        cells = [r[c] for r in rows_ if r[c] != b""]
        kinds = ["bytes"]
        if cells and all(_INT.fullmatch(v) for v in cells):
            kinds.append("int64")
        if cells and all(_INT.fullmatch(v) or _FLOAT.fullmatch(v) for v in cells):
            kinds.append("float")
        out[c] = draw(st.sampled_from(kinds))
    return out


def example_bytes(row, kinds) -> bytes:
    """One row as a serialized tf.train.Example: each non-blank cell one value of its column's kind."""
    import tensorflow as tf
    feats = {}
    for c, kind in kinds.items():
        v = row[c]
        if v == b"":
            continue
        if kind == "int64":
            feats[c] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v)]))
        elif kind == "float":
            feats[c] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(v)]))
        else:
            feats[c] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


def write_tfrecord(tmp: str, raw_spec, rows_, kinds):
    """The rows as tf.train.Examples in `in.tfrecord` (the spec's input); returns (spec, serialized rows)."""
    from tpu_embed.artifact import tfrecord
    raw_spec = dict(raw_spec, inputs={"format": "tfrecord", "patterns": ["in.tfrecord"]})
    spec = parse_spec(raw_spec, base_dir=tmp)
    examples = [example_bytes(r, kinds) for r in rows_]
    with open(os.path.join(tmp, "in.tfrecord"), "wb") as fh:
        fh.write(tfrecord.encode_file(examples))
    return spec, examples


def one_value_feature(v):
    """A tf.train.Feature holding one value of its own kind: bytes in bytes_list, an int in int64_list, else a
    float in float_list."""
    import tensorflow as tf

    if isinstance(v, bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))
    if isinstance(v, int):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))
    return tf.train.Feature(float_list=tf.train.FloatList(value=[v]))
