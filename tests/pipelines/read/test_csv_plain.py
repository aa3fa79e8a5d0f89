"""The native splitter of plain CSV records (native/_csv_native.c `plain_fields`,
`pipelines.read.csv_reader._plain_table`) against pyarrow's reader (`pipelines.read.csv_reader._pyarrow_csv`, the
reference): the same table for any records it takes, and None (pyarrow decides) for any it does not."""

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.read import csv_reader, csv_scan, records, splits
from tests.helpers import ROOT

pytestmark = pytest.mark.native("csv")

DELIMITERS = [",", ";", "\t", "|"]
# Values of text around the delimiters (the delimiter itself only inside quotes), multi-byte UTF-8 too.
CHARS = ["a", "b", "0", "9", " ", "-", ".", "é", "€", "𝄞", "x"]


@st.composite
def plain_csv(draw):
    delimiter = draw(st.sampled_from(DELIMITERS))
    nfields = draw(st.integers(1, 6))
    names = [f"c{i}" for i in range(nfields)]
    nrec = draw(st.integers(1, 25))
    lines = []
    for _ in range(nrec):
        fields = []
        for _ in range(nfields):
            text = "".join(draw(st.lists(st.sampled_from(CHARS), max_size=6)))
            if draw(st.booleans()):  # quoted, as pyarrow and pandas write strings: then the delimiter may be in it
                text = '"' + (text + delimiter if draw(st.booleans()) else text) + '"'
            fields.append(text)
        if nfields == 1 and fields[0] == "":
            fields[0] = '""'  # an empty unquoted single field is an empty line: no record
        lines.append(delimiter.join(fields))
    data = "\n".join(lines) + ("\n" if draw(st.booleans()) else "")
    columns = draw(st.lists(st.sampled_from(names), unique=True, min_size=1))
    return data.encode(), names, columns, delimiter, nrec


def _reference(data, names, columns, delimiter, nrec):
    invalid = []
    table = csv_reader._pyarrow_csv(data, names, columns, delimiter, lambda row: invalid.append(row) or "skip", nrec)
    return table, invalid


@settings(max_examples=400, deadline=None)
@given(plain_csv())
def test_plain_records_split_as_pyarrow_reads_them(case):
    data, names, columns, delimiter, nrec = case
    got = csv_reader._plain_table(data, names, columns, delimiter, nrec)
    want, invalid = _reference(data, names, columns, delimiter, nrec)
    assert not invalid and want.num_rows == nrec
    assert got is not None, data
    table, encoded = got
    assert not encoded and table.schema == want.schema and table.equals(want)


@settings(max_examples=300, deadline=None)
@given(plain_csv(), st.sampled_from(["cr", "inner_quote", "doubled_quote", "after_quote", "short", "long",
                                     "empty_line", "newline_in_quotes", "fewer_records", "more_records"]),
       st.data())
def test_records_needing_the_parser_are_left_to_it(case, flaw, data):
    """A \\r, a quote not around a whole value ("a""b", a"b, "a"b), a record of too few or too many fields,
    an empty line, a line break in a quoted value, or a record count other than the framing's: None, and
    pyarrow's reader (with its letters for malformed records) decides."""
    text, names, columns, delimiter, nrec = case
    lines = text.decode().split("\n")
    if lines[-1] == "":
        lines.pop()
    k = data.draw(st.integers(0, len(lines) - 1))
    line = lines[k]
    if flaw == "cr":
        lines[k] = line + "\r"
    elif flaw == "inner_quote":
        lines[k] = "a" + '"' + "b" + line
    elif flaw == "doubled_quote":
        lines[k] = '"a""b"' + line
    elif flaw == "after_quote":
        lines[k] = '"a"b' + line
    elif flaw == "short":
        if len(names) == 1:
            return
        lines[k] = delimiter.join(["x"] * (len(names) - 1))
    elif flaw == "long":
        lines[k] = line + delimiter + "x"
    elif flaw == "empty_line":
        lines.insert(k, "")
    elif flaw == "newline_in_quotes":
        lines[k] = '"a\nb"' + line
    elif flaw == "fewer_records":
        nrec += 1
    elif flaw == "more_records":
        nrec -= 1
    data_ = ("\n".join(lines) + "\n").encode()
    assert csv_reader._plain_table(data_, names, columns, delimiter, nrec) is None


def test_columns_come_out_in_the_order_asked_and_bytes_as_written():
    data = b'"x",1,"a,b"\n"",2,\xc3\xa9\n'
    got, _ = csv_reader._plain_table(data, ["s", "n", "t"], ["t", "s"], ",", 2)
    assert got.column_names == ["t", "s"]
    assert got.column("t").to_pylist() == ["a,b", "é"] and got.column("s").to_pylist() == ["x", ""]
    assert got.column("t").type == pa.large_string()


def test_a_header_that_names_a_column_twice_or_misses_one_is_left_to_pyarrow():
    assert csv_reader._plain_table(b"1,2\n", ["a", "a"], ["a"], ",", 1) is None
    assert csv_reader._plain_table(b"1,2\n", ["a", "b"], ["c"], ",", 1) is None
    assert csv_reader._plain_table(b"1,2\n", ["a", "b"], ["a"], "::", 1) is None  # a delimiter of more than one byte


def test_bad_arguments_are_refused():
    native = csv_scan.csv_native()
    with pytest.raises(ValueError, match="one int32 per field"):
        native.plain_fields(b"a\n", 2, ord(","), np.zeros(1, np.int32).tobytes(), 1)
    with pytest.raises(ValueError, match="below nfields"):
        native.plain_fields(b"a\n", 1, ord(","), np.array([5], np.int32).tobytes(), 1)
    with pytest.raises(ValueError, match="one other byte"):
        native.plain_fields(b"a\n", 1, ord('"'), np.zeros(1, np.int32).tobytes(), 1)
    with pytest.raises(ValueError, match="one int32 per output column"):
        native.plain_fields(b"a\n", 1, ord(","), np.zeros(1, np.int32).tobytes(), 1, b"")
    with pytest.raises(ValueError, match="a byte, or 256"):
        native.plain_fields(b"a\n", 1, ord(","), np.zeros(1, np.int32).tobytes(), 1,
                            np.array([300], np.int32).tobytes())


# ---------------------------------------------------------------- columns given dictionary-encoded

TOKEN_DELIMITERS = ["|", ";", "a", None]


@settings(max_examples=300, deadline=None)
@given(plain_csv(), st.data())
def test_encoded_columns_are_what_the_parser_makes_of_the_strings(case, data):
    """A column the reader gives dictionary-encoded (split on its one-byte token delimiter, or whole values;
    blank tokens dropped) equals what `parse._categorical` makes of its strings: the same tokens per record
    and the same encoded array (first-seen dictionary, codes)."""
    from pipelines.read import parse
    from pipelines.read.records import RawBatch
    raw_bytes, names, columns, delimiter, nrec = case
    encode = {c: data.draw(st.sampled_from(TOKEN_DELIMITERS)) for c in columns if data.draw(st.booleans())}
    got = csv_reader._plain_table(raw_bytes, names, columns, delimiter, nrec, encode)
    plain, _ = csv_reader._plain_table(raw_bytes, names, columns, delimiter, nrec)
    assert got is not None
    table, encoded = got
    assert set(encoded) == set(encode) and set(table.column_names) == set(columns) - set(encode)
    for c in table.column_names:
        assert table.column(c).equals(plain.column(c))
    strings = RawBatch(0, "x.csv", 0, np.arange(nrec, dtype=np.int64), {c: plain.column(c).chunk(0) for c in columns})
    for c, token_delimiter in encode.items():
        feature = type("F", (), {"name": c, "column": c, "delimiter": token_delimiter, "weight_column": None})
        want = parse._categorical(strings, feature, parse._Problems(strings))
        delim, lengths, tokens = encoded[c]
        assert delim == token_delimiter
        np.testing.assert_array_equal(lengths, want.lengths)
        assert lengths.dtype == np.int64
        assert tokens.equals(want.tokens) and tokens.type == want.tokens.type


def _parser_tokens(plain_table, nrec, column, token_delimiter):
    """What `parse._categorical` makes of a column read as strings (the reference of an encoded column)."""
    from pipelines.read import parse
    from pipelines.read.records import RawBatch
    strings = RawBatch(0, "x.csv", 0, np.arange(nrec, dtype=np.int64), {column: plain_table.column(column).chunk(0)})
    feature = type("F", (), {"name": column, "column": column, "delimiter": token_delimiter, "weight_column": None})
    return parse._categorical(strings, feature, parse._Problems(strings))


@pytest.mark.parametrize("seed", range(4))
def test_encoded_columns_of_large_batches(seed):
    """Batches the size the reader gives: the native splitter encodes a block of records column by column
    (hundreds of records and tokens at a time, tables grown many times over), every field quoted or not,
    multivalent columns of many tokens, tokens of 1 to 20 bytes (shorter than, as long as and longer than a
    slot's 8 stored bytes), blank values and blank tokens, and a short token at the very end of the bytes (the
    last record without a line break): the same tokens and encoded arrays as the parser makes of the strings."""
    rng = np.random.default_rng(seed)
    nrec = int(rng.integers(600, 2500))
    alphabet = np.frombuffer(b"0123456789abcdefXYZ_-.", np.uint8)

    def token(k):
        return bytes(alphabet[rng.integers(0, alphabet.size, k)])

    pools = {  # per column: few distinct tokens (a hot table) or many (tables grown past thousands of slots)
        "few": [token(int(rng.integers(1, 4))) for _ in range(7)],
        "many": [token(int(rng.integers(1, 21))) for _ in range(5000)],
        "eight": [token(8) for _ in range(300)] + [token(9) for _ in range(300)] + [token(7) for _ in range(300)],
    }
    kinds = ["few", "many", "eight", "many|", "few;"]  # "|" and ";": multivalent, split on that byte
    lines = []
    for r in range(nrec):
        fields = [str(r)]
        for kind in kinds:
            pool, sep = pools[kind.rstrip("|;")], kind[-1] if kind[-1] in "|;" else None
            if sep is None:
                value = b"" if rng.random() < 0.15 else pool[int(rng.zipf(1.3)) % len(pool)]
            else:  # 0..40 tokens, some blank ("a||b")
                value = sep.encode().join(b"" if rng.random() < 0.1 else pool[int(rng.integers(len(pool)))]
                                          for _ in range(int(rng.integers(0, 41))))
            fields.append(b'"' + value + b'"' if rng.random() < 0.7 else value)
        lines.append(b",".join(f if isinstance(f, bytes) else f.encode() for f in fields))
    lines[-1] = lines[-1].rsplit(b",", 1)[0] + b',"a"'  # a one-byte token, quoted, the file's last bytes
    data = b"\n".join(lines)
    names = ["id"] + [f"c{i}" for i in range(len(kinds))]
    columns = names[1:]
    encode = {c: (k[-1] if k[-1] in "|;" else None) for c, k in zip(columns, kinds)}
    got = csv_reader._plain_table(data, names, columns, ",", nrec, encode)
    plain, _ = csv_reader._plain_table(data, names, columns, ",", nrec)
    want, invalid = _reference(data, names, columns, ",", nrec)
    assert got is not None and not invalid and plain.equals(want)
    table, encoded = got
    assert set(encoded) == set(columns) and table.num_columns == 0
    for c, token_delimiter in encode.items():
        reference = _parser_tokens(plain, nrec, c, token_delimiter)
        delim, lengths, tokens = encoded[c]
        np.testing.assert_array_equal(lengths, reference.lengths)
        assert tokens.equals(reference.tokens), c
    last = encoded["c4"][2]
    assert last.dictionary[last.indices[-1].as_py()].as_py() == b"a"


def test_a_token_delimiter_of_more_than_one_byte_is_left_as_strings():
    table, encoded = csv_reader._plain_table(b"a::b,x\n", ["s", "t"], ["s", "t"], ",", 1, {"s": "::", "t": None})
    assert list(encoded) == ["t"] and table.column_names == ["s"]


@pytest.mark.parametrize("example", ["criteo", "movielens"])
def test_the_samples_parse_the_same_read_encoded_or_as_strings(example):
    """data/'s real samples (quoted titles with commas, '|' genres, blank Criteo cells) through the
    example specs: every parsed chunk and dead letter is the same either way."""
    import os

    from pipelines.read import parse
    from tpu_embed.artifact.spec import load_spec
    root = ROOT
    spec = load_spec(os.path.join(root, "examples", example, "spec.yaml"))
    encode = parse.encodable_columns(spec)
    assert encode
    for f in splits.list_input_files(spec.input_patterns()):
        both = [[parse.parse_batch(x, spec) if isinstance(x, records.RawBatch) else x
                 for x in splits.read_file("csv", f, spec.required_columns(), chunk_rows=97, encode=e)]
                for e in (None, encode)]
        assert len(both[0]) == len(both[1]) > 1
        assert any(isinstance(x, records.RawBatch) and x.encoded
                   for x in splits.read_file("csv", f, spec.required_columns(), chunk_rows=97, encode=encode))
        for a, b in zip(*both):
            if not isinstance(a, tuple):
                assert a == b
                continue
            (ca, la), (cb, lb) = a, b
            assert la == lb
            np.testing.assert_array_equal(ca.record_numbers, cb.record_numbers)
            np.testing.assert_array_equal(ca.label, cb.label)
            np.testing.assert_array_equal(ca.dense, cb.dense)
            for k, fa in ca.features.items():
                fb = cb.features[k]
                np.testing.assert_array_equal(fa.lengths, fb.lengths)
                assert (fa.tokens is None) == (fb.tokens is None)
                if fa.tokens is not None:
                    assert fa.tokens.equals(fb.tokens), k


def test_encodable_columns_leave_out_columns_read_otherwise():
    from pipelines.read import parse
    from tpu_embed.artifact.spec import parse_spec
    raw = {"name": "t", "inputs": {"format": "csv", "patterns": ["x.csv"]}, "label": {"column": "y"},
           "dense": ["d"],
           "categorical": [{"name": "a", "vocabulary": {"type": "hashing", "num_buckets": 8}},
                           {"name": "b", "delimiter": "|", "vocabulary": {"type": "hashing", "num_buckets": 8}},
                           {"name": "w", "weight_column": "ww", "vocabulary": {"type": "hashing", "num_buckets": 8}},
                           {"name": "b2", "column": "b", "vocabulary": {"type": "hashing", "num_buckets": 8}}],
           "defaults": {"table": {"dim": 4}}, "optimizer": {"type": "sgd", "learning_rate": 0.1},
           "topology": {"num_chips": 1, "num_sc_per_chip": 4, "num_hosts": 1}, "global_batch_size": 8}
    got = parse.encodable_columns(parse_spec(raw))
    assert got == {"a": None}  # b: two delimiters; w: weighted; y, d, ww: not categorical


def test_the_native_helpers_of_the_reader():
    """`is_ascii` (bytes.isascii for any buffer) and `room_after` (the scanner's next buffer: the bytes kept, then
    room for a read) without the GIL."""
    native = csv_scan.csv_native()
    if native is None:
        pytest.skip("the native CSV module is not built")
    for data in (b"", b"abc", b"x" * 200, b"x" * 130 + b"\x80", bytes(range(128)) * 3, "é".encode()):
        for view in (data, memoryview(data)[1:], bytearray(data)):
            assert native.is_ascii(view) == bytes(view).isascii()
    buf = native.room_after(memoryview(b"0123456789")[3:], 5)
    assert isinstance(buf, bytearray) and len(buf) == 12 and bytes(buf[:7]) == b"3456789"
    assert len(native.room_after(b"", 0)) == 0
    with pytest.raises(ValueError):
        native.room_after(b"ab", -1)
