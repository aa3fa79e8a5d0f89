"""Splittable reads: the same records, record numbers, dead letters and output bytes for any split size
and any number of workers (docs/explanation/reads.md).

Reader level (fast): every format read split by split, for split sizes from 1 byte to the whole file,
equals the whole-file read; CSV record framing equals a byte-at-a-time model of pyarrow's parser; reads
are streamed (bounded) and work through fsspec (memory://, gs:// on the local fake GCS server).
Job level (slow): `run` with tiny, medium and whole-file splits, 1 worker and 2 processes, gives
byte-identical vocabularies, shards, profiles, manifest and dead letters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.read import csv_reader, csv_scan, records, source
from pipelines.read import splits as psplits
from tests.helpers.object_store import gcs_emulator
from tests.reliability.accounting import assert_counts_add_up
from tests.reliability.inputs import example_bytes, make_spec, mutations, tfrecord_file

COLUMNS = ["label", "x", "cat", "id"]


# ---------------------------------------------------------------- inputs

def csv_quoted(n: int = 150) -> bytes:
    """Quoted values with line breaks and "" escapes, CRLF / LF / lone CR line ends, empty lines, a malformed
    row, bytes that are not UTF-8, an unparsable number and, at the end, an unterminated quote."""
    out = [b"label,x,cat,id\r\n"]
    for i in range(n):
        end = (b"\r\n", b"\n", b"\r")[i % 3]
        if i % 7 == 0:
            out.append(b'%d,%d,"t%d|multi\nline ""q""|u%d",%d' % (i % 2, i, i % 11, i % 4, i % 10) + end)
        elif i % 17 == 0:
            out.append(b"%d,%d,t%d" % (i % 2, i, i) + end)  # 3 columns: malformed
        elif i % 19 == 0:
            out.append(b"%d,%d,t\xff%d,%d" % (i % 2, i, i, i % 10) + end)  # not UTF-8 in a read column
        elif i % 23 == 0:
            out.append(b"%d,x%d,t%d,%d" % (i % 2, i, i, i % 10) + end)  # unparsable number
        else:
            out.append(b"%d,%d.5,t%d|u%d,%d" % (i % 2, i, i % 13, i % 5, i % 10) + end)
        if i % 29 == 0:
            out.append(b"\n\r\n")  # empty lines
    out.append(b'1,2,"never closed\n0,3,a,4\n')
    return b"".join(out)


def csv_plain(n: int = 120) -> bytes:
    return ("label,x,cat,id\n" + "".join(f"{i % 2},{i},t{i % 9},{i % 10}\n" for i in range(n))).encode()


def parquet_bytes(n: int = 160, row_group_size: int = 16) -> bytes:
    buf = io.BytesIO()
    table = pa.table({"label": [None if i == 40 else float(i % 2) for i in range(n)],
                      "x": ["x" if i == 77 else str(i) for i in range(n)],
                      "cat": [[f"t{i % 7}", f"u{i % 3}"] if i % 5 else [] for i in range(n)],
                      "id": [i % 10 for i in range(n)]})
    pq.write_table(table, buf, row_group_size=row_group_size)
    return buf.getvalue()


def tfrecord_bytes(n: int = 150) -> bytes:
    """A record that is not an Example (33), a data CRC mismatch (50), a damaged length (120: framing lost,
    the frames after it found by scanning) and a truncated header at the end."""
    payloads = [example_bytes(label=float(i % 2), x=float(i), cat=(b"t%d" % (i % 7),), ident=(i % 10,))
                for i in range(n)]
    payloads[33] = b"not an example"
    data = bytearray(tfrecord_file(payloads))
    if n > 50:
        data[len(tfrecord_file(payloads[:50])) + 20] ^= 1
    if n > 120:
        data[len(tfrecord_file(payloads[:120])) + 2] ^= 1
    return bytes(data) + b"\x07" * 9


@contextlib.contextmanager
def read_bytes(n: int):
    """The readers' block size set to n (every block boundary case in small files)."""
    old = source.READ_BYTES
    source.READ_BYTES = n
    try:
        yield
    finally:
        source.READ_BYTES = old


def write(tmp_path, name: str, data: bytes) -> records.InputFile:
    path = tmp_path / name
    path.write_bytes(data)
    return records.InputFile(0, str(path), len(data))


# ---------------------------------------------------------------- reading split by split

def _norm(items):
    rows, letters = [], []
    for it in items:
        if isinstance(it, records.DeadLetter):
            letters.append((it.record, it.reason, it.detail))
            continue
        assert np.all(np.diff(it.record_numbers) > 0)
        cols = [it.columns[c].to_pylist() for c in COLUMNS]
        rows += [(int(r),) + tuple(repr(c[i]) for c in cols) for i, r in enumerate(it.record_numbers)]
    return rows, sorted(letters)


def read_splits(fmt: str, f: records.InputFile, split_bytes: int, states: bool = True, chunk_rows: int = 7):
    splits = psplits.plan_splits(fmt, [f], split_bytes)
    known = {}
    if fmt == "csv" and states:
        known = csv_scan.csv_split_states([(s.index, csv_scan.csv_split_summary(s, ",")) for s in splits if not s.last])
    items = []
    for s in splits:
        items += list(psplits.read_split(fmt, s, COLUMNS, chunk_rows=chunk_rows, csv_state=known.get(s.index)))
    return _norm(items)


# Each input format, CSV with and without quoted fields.
EVERY_FORMAT = pytest.mark.parametrize(
    "fmt,make", [("csv", csv_quoted), ("csv", csv_plain), ("parquet", parquet_bytes), ("tfrecord", tfrecord_bytes)],
    ids=["csv_quoted", "csv_plain", "parquet", "tfrecord"])


@EVERY_FORMAT
def test_every_split_size_reads_the_same_records_and_letters(tmp_path, fmt, make):
    f = write(tmp_path, "in." + fmt, make())
    whole = _norm(psplits.read_file(fmt, f, COLUMNS, chunk_rows=7))
    rows, letters = whole
    numbers = [r[0] for r in rows] + [x[0] for x in letters]
    assert rows and len(numbers) == len(set(numbers))  # each record once: a row or one letter
    for split_bytes in (1, 5, 64, 300, 1000, f.size // 3, f.size):
        assert read_splits(fmt, f, split_bytes) == whole, split_bytes
    with read_bytes(13):  # streaming in tiny blocks
        assert _norm(psplits.read_file(fmt, f, COLUMNS, chunk_rows=7)) == whole
        assert read_splits(fmt, f, 100) == whole
    if fmt == "csv":  # without the summaries of the splits before, a split scans the bytes before it itself
        assert read_splits(fmt, f, 300, states=False) == whole
    if fmt == "parquet":
        assert len(psplits.plan_splits(fmt, [f], 300)) > 5 and pq.ParquetFile(f.path).metadata.num_row_groups == 10


def _run_deferred(items):
    """`read_split(deferred=True)`'s items with each `Deferred` run in place (as the jobs' threads run them)."""
    for item in items:
        if isinstance(item, records.Deferred):
            yield from item.run()
        else:
            yield item


@EVERY_FORMAT
def test_deferred_batches_give_the_same_records_and_letters(tmp_path, fmt, make):
    """Each batch's decoding as a `Deferred` (the jobs run them on threads of their own): the same items, in order."""
    f = write(tmp_path, "in." + fmt, make())
    whole = _norm(psplits.read_file(fmt, f, COLUMNS, chunk_rows=7))
    for split_bytes in (5, 300, f.size):
        got = [x for s in psplits.plan_splits(fmt, [f], split_bytes)
               for x in psplits.read_split(fmt, s, COLUMNS, chunk_rows=7, deferred=True)]
        assert fmt == "parquet" or any(isinstance(x, records.Deferred) for x in got)
        assert _norm(_run_deferred(got)) == whole, split_bytes


def test_csv_dead_letters_name_the_lines_where_records_start(tmp_path):
    data = csv_quoted(40)
    f = write(tmp_path, "in.csv", data)
    rows, letters = _norm(psplits.read_file("csv", f, COLUMNS))
    reasons = {(r, why) for r, why, _ in letters}
    expect = _model_record_lines(data)  # record i of csv_quoted starts on line expect[i]
    assert expect[:4] == [2, 6, 7, 8]  # record 0: 2 lines (a quoted line break), then 2 empty lines
    assert sorted([r[0] for r in rows] + [x[0] for x in letters]) == expect
    assert (expect[17], "malformed_record") in reasons and (expect[19], "invalid_utf8") in reasons
    assert (expect[23], "unparsable_number") not in reasons  # a parse letter (parse_batch), not the reader's
    last = [x for x in letters if x[1] == "framing_lost"]
    assert len(last) == 1 and last[0][0] == expect[-1] and "lines %d..%d" % (expect[-1], expect[-1] + 1) in last[0][2]


def test_a_split_boundary_inside_a_quoted_value_with_line_breaks(tmp_path):
    """The documented case: a record's quoted value holds line breaks; a split starting inside it does not
    take the value's later lines for records (the split before reads the record to its end)."""
    body = b'1,1,"a\n0,2,b,3\n1,3,c,4",5\n0,4,d,6\n'
    data = b"label,x,cat,id\n" + body
    f = write(tmp_path, "in.csv", data)
    whole = _norm(psplits.read_file("csv", f, COLUMNS))
    assert [r[:4] for r in whole[0]] == [(2, "'1'", "'1'", repr("a\n0,2,b,3\n1,3,c,4")), (5, "'0'", "'4'", "'d'")]
    for split_bytes in range(1, len(data) + 1):
        assert read_splits("csv", f, split_bytes) == whole
        assert read_splits("csv", f, split_bytes, states=False) == whole


# ---------------------------------------------------------------- CSV framing = pyarrow's

def _model_records(data: bytes):
    """A byte-at-a-time model of pyarrow's CSV framing: [(offset, line)] of every non-empty record after the
    header, and whether a quote is open at the end."""
    n, i = len(data), 0
    state, rec_start, line, start_line, out = "R", 0, 1, 1, []
    while i < n:
        c = data[i]
        crlf = c == 13 and i + 1 < n and data[i + 1] == 10
        brk = c == 10 or (c == 13 and not crlf)
        if crlf:
            i += 1
            continue
        if state == "QQ":  # a quote inside a quoted value: "" or the closing one
            if c == 0x22:
                state, i = "Q", i + 1
                continue
            state = "F"
        if state == "Q":
            state = "QQ" if c == 0x22 else "Q"
            line += brk
            i += 1
            continue
        if state == "R":
            if brk:
                line, i = line + 1, i + 1
                rec_start, start_line = i, line
                continue
            out.append((rec_start, start_line))
            state = "S"
        if brk:
            state, line = "R", line + 1
            rec_start, start_line = i + 1, line
        elif state == "S":
            state = "Q" if c == 0x22 else "S" if c == ord(",") else "F"
        elif c == ord(","):
            state = "S"
        i += 1
    return out[1:], state == "Q"


def _model_record_lines(data: bytes):
    return [line for _, line in _model_records(data)[0]]


@settings(max_examples=300)
@given(st.lists(st.sampled_from(list(b'ab,"\n\r ')), max_size=80).map(bytes), st.integers(1, 90),
       st.integers(1, 40))
def test_csv_framing_matches_pyarrow_and_a_byte_model(tmp_path_factory, body, split_bytes, block):
    import pyarrow.csv as pacsv
    data = b"label,x,cat,id\n" + body
    d = tmp_path_factory.mktemp("framing")
    f = write(d, "in.csv", data)
    rows, letters = _norm(psplits.read_file("csv", f, COLUMNS))
    starts, unterminated = _model_records(data)
    lines = [line for _, line in starts]
    assert sorted([r[0] for r in rows] + [x[0] for x in letters]) == lines
    if not unterminated:  # pyarrow reads as many rows (valid or not) as the model has records
        bad = []
        t = pacsv.read_csv(io.BytesIO(data), parse_options=pacsv.ParseOptions(
            newlines_in_values=True, invalid_row_handler=lambda r: bad.append(r) or "skip"),
            convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in COLUMNS}))
        assert t.num_rows + len(bad) == len(lines)
    else:
        assert letters and letters[-1][1] == "framing_lost" and letters[-1][0] == lines[-1]
    assert read_splits("csv", f, split_bytes) == (rows, letters)
    with read_bytes(block):
        assert read_splits("csv", f, split_bytes) == (rows, letters)


@settings(max_examples=150)
@given(mutations(tfrecord_bytes(60)), st.integers(1, 200))
def test_damaged_tfrecord_reads_the_same_in_any_block_size(tmp_path_factory, damaged, block):
    f = write(tmp_path_factory.mktemp("tfr"), "in.tfrecord", damaged)
    whole = _norm(psplits.read_file("tfrecord", f, COLUMNS, chunk_rows=7))
    with read_bytes(block):
        assert _norm(psplits.read_file("tfrecord", f, COLUMNS, chunk_rows=7)) == whole
    deferred = psplits.read_split("tfrecord", psplits.whole_file(f), COLUMNS, chunk_rows=7, deferred=True)
    assert _norm(_run_deferred(deferred)) == whole


def _frame_events(events):
    """scan_frames' events with the good frames' payloads one by one (runs may group them differently)."""
    out = []
    for kind, pos, x in events:
        if kind == "ok":
            out += [("ok", payload) for payload in x]
        else:
            out.append((kind, pos, x))
    return out


@settings(max_examples=150)
@given(st.one_of(mutations(tfrecord_bytes(60)), st.just(tfrecord_bytes(200)), st.just(tfrecord_file([b"x" * 9000]))),
       st.integers(1, 200), st.integers(1, 9))
def test_native_tfrecord_frames_give_the_events_of_scan_frames(tmp_path_factory, data, block, most):
    """The reader's native framing (good frames checked natively, then scan_frames from the first bad one) gives
    what scan_frames gives over the whole file: the same payloads, letters and byte offsets."""
    from pipelines.read import tfrecord_reader
    from tpu_embed.artifact import tfrecord
    if csv_scan.csv_native() is None:
        pytest.skip("the native module is not built")
    f = write(tmp_path_factory.mktemp("tfr"), "in.tfrecord", data)
    with read_bytes(block), open(f.path, "rb") as fh:
        want = _frame_events(tfrecord.scan_frames(source.Source(fh), most, source.READ_BYTES))
        assert _frame_events(tfrecord_reader._frames(source.Source(fh), most)) == want


# ---------------------------------------------------------------- streaming, object stores

def test_reads_are_streamed_in_bounded_blocks(tmp_path, monkeypatch):
    """Memory does not grow with the file: no read asks for much more than READ_BYTES (here 256)."""
    from tpu_embed.artifact import io as tio
    sizes = []

    class Counting:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.fh.close()

        def seek(self, *a):
            return self.fh.seek(*a)

        def tell(self):
            return self.fh.tell()

        def read(self, n=-1):
            sizes.append(n)
            return self.fh.read(n)

        def readinto(self, b):
            sizes.append(len(b))
            return self.fh.readinto(b)

    for fmt, data in (("csv", csv_quoted(600)), ("tfrecord", tfrecord_bytes(300))):
        f = write(tmp_path, "in." + fmt, data)
        whole = _norm(psplits.read_file(fmt, f, COLUMNS, chunk_rows=50))
        monkeypatch.setattr(source, "READ_BYTES", 256)
        monkeypatch.setattr(csv_reader, "CSV_BATCH_BYTES", 1024)
        monkeypatch.setattr(source, "open_input", lambda path: Counting(tio.open_read(path)))
        sizes.clear()
        assert _norm(psplits.read_file(fmt, f, COLUMNS, chunk_rows=50)) == whole
        assert read_splits(fmt, f, 4000, chunk_rows=50) == whole  # CSV: with the summaries of the splits
        assert len(data) > 40 * 256 and 0 < max(sizes) <= 2 * 256 + 64, (fmt, len(data), max(sizes))
        monkeypatch.undo()


def test_splits_through_fsspec_memory_filesystem(tmp_path):
    from tpu_embed.artifact import io as tio
    for fmt, data in (("csv", csv_quoted()), ("parquet", parquet_bytes())):
        local = write(tmp_path, "in." + fmt, data)
        url = f"memory://splits-test/in.{fmt}"
        tio.write_atomic(url, data)
        remote = psplits.list_input_files([url])[0]
        assert remote.size == len(data)
        whole = _norm(psplits.read_file(fmt, local, COLUMNS, chunk_rows=7))
        assert read_splits(fmt, remote, 500) == whole
        tio.delete(url)


def test_splits_on_the_fake_gcs_server(tmp_path):
    from tpu_embed.artifact import io as tio
    with gcs_emulator("splits-test"):
        for fmt, data in (("csv", csv_quoted()), ("parquet", parquet_bytes())):
            local = write(tmp_path, "in." + fmt, data)
            url = f"gs://splits-test/data/in.{fmt}"
            tio.write_atomic(url, data)
            remote = psplits.list_input_files([url])[0]
            assert read_splits(fmt, remote, 700) == _norm(psplits.read_file(fmt, local, COLUMNS, chunk_rows=7))


# ---------------------------------------------------------------- the jobs

def _tree(d):
    return {os.path.relpath(os.path.join(r, x), d): open(os.path.join(r, x), "rb").read()
            for r, _, xs in os.walk(d) for x in xs}


MULTI = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
JOB_CASES = {
    # format: (files, [(split bytes, Beam args)] each compared with whole files on 1 worker)
    "csv": ({"a_quoted.csv": csv_quoted(), "b_plain.csv": csv_plain()}, [(230, []), (230, MULTI), (1000, [])]),
    "parquet": ({"a.parquet": parquet_bytes(), "b.parquet": parquet_bytes(48, 10)}, [(900, MULTI)]),
    "tfrecord": ({"a.tfrecord": tfrecord_bytes(), "b.tfrecord": tfrecord_bytes(60)}, [(100, MULTI)]),
}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", sorted(JOB_CASES))
def test_job_outputs_are_byte_identical_for_any_split_size_and_workers(tmp_path, fmt):
    from pipelines import runner
    from pipelines.jobs import JobConfig
    files, variants = JOB_CASES[fmt]
    data = tmp_path / "data"
    data.mkdir()
    for name, content in files.items():
        (data / name).write_bytes(content)
    spec = make_spec(data, fmt, policies={"lost_framing": "dead_letter"})

    def run(name, split_bytes, args, reuse_read=True):
        out = str(tmp_path / name)
        runner.run_all(JobConfig(spec=spec, output=out, chunk_rows=7, steps_per_file=5, split_bytes=split_bytes,
                                 reuse_read=reuse_read), args)
        return out

    ref = run("whole", 1 << 30, [], reuse_read=False)  # the shard job reads the input again
    m, letters = assert_counts_add_up(ref)
    assert letters and m.counts.examples_written > 0
    expect = _tree(ref)
    assert any(p.startswith("shards/") for p in expect) and any(p.startswith("profiles/") for p in expect)
    for k, (split_bytes, args) in enumerate(variants):
        assert any(s.count > 1 for s in psplits.plan_splits(fmt, psplits.list_input_files(spec.input_patterns()),
                                                       split_bytes)) or fmt == "tfrecord"
        got = _tree(run(f"v{k}", split_bytes, args))
        assert sorted(got) == sorted(expect), (split_bytes, args)
        for p in expect:
            assert got[p] == expect[p], (p, split_bytes, args)


def _assert_native_scan_agrees(b, lo, hi, q, bof, after, both, records):
    """csv_scan._scan's native way gives its numpy way's breaks, record flags (unless not asked for) and states."""
    native = csv_scan._scan(b, lo, hi, q, bof, 44, after, both, records)
    with mock.patch.object(csv_scan, "_csv_native", None):
        reference = csv_scan._scan(b, lo, hi, q, bof, 44, after, both)
    assert np.array_equal(native[0], reference[0])
    assert np.array_equal(native[1], reference[1]) if records else native[1] is None
    for start in ((0, 1) if both else (q,)):
        assert native[2 + start] == reference[2 + start], start


@pytest.mark.native("csv")
@settings(max_examples=500)
@given(st.lists(st.sampled_from(list(b'ab,"\n\r')), min_size=1, max_size=60).map(bytes), st.data())
def test_the_native_csv_scan_agrees_with_the_numpy_one(body, data):
    """csv_scan._scan with the native scanner (native/_csv_native.c) gives what its numpy way gives, for any start
    state, file start and range that does not cut a run of quote characters (the readers' precondition)."""
    b = np.frombuffer(body, np.uint8)
    lo = data.draw(st.integers(0, len(body) - 1))
    hi = data.draw(st.integers(lo + 1, len(body)))
    runs_cut = [p for p in (lo, hi) if 0 < p < len(body) and body[p - 1] == body[p] == 0x22]
    if runs_cut or (hi < len(body) and body[hi - 1] == 0x0D):  # the callers never scan such ranges
        return
    after = body[hi] if hi < len(body) else -1
    q, both, records = data.draw(st.integers(0, 1)), data.draw(st.booleans()), data.draw(st.booleans())
    bof = data.draw(st.sampled_from([0, 3, -1]))
    if 0 < bof < len(body) and body[bof - 1] == 0x22:  # the first field follows a byte-order mark, never a quote
        return
    _assert_native_scan_agrees(b, lo, hi, q, bof, after, both, records)


def _csv_field(text: bytes, quoted: bool) -> bytes:
    return b'"' + text.replace(b'"', b'""') + b'"' if quoted else text


def _written_rows(min_fields: int, max_fields: int, max_rows: int):
    """Rows of (text, quoted) fields; texts may hold delimiters, quotes and line breaks (kept only if quoted)."""
    field = st.tuples(st.lists(st.sampled_from(list(b'ab,"\n')), max_size=6).map(bytes), st.booleans())
    return st.lists(st.lists(field, min_size=min_fields, max_size=max_fields), min_size=1, max_size=max_rows)


def _written_csv(rows, eol: bytes) -> bytes:
    """What a writer makes of `rows`: quoted fields with quotes doubled, unquoted ones without , " or \\n."""
    return b"".join(b",".join(_csv_field(t if q else t.replace(b'"', b"").replace(b",", b"").replace(b"\n", b""), q)
                              for t, q in row) + eol for row in rows)


@pytest.mark.native("csv")
@settings(max_examples=300)
@given(_written_rows(1, 5, 12), st.sampled_from([b"\n", b"\r\n"]), st.data())
def test_the_native_csv_scan_agrees_with_the_numpy_one_on_written_csv(rows, eol, data):
    """What writers produce (every value quoted or not, quotes doubled, line breaks inside quoted values):
    the native scanner's fast parity way (taken when the range has no \\r), and its resynchronising state
    machine for a range read from the wrong quote state (records=False), agree with the numpy way too."""
    body = _written_csv(rows, eol)
    b = np.frombuffer(body, np.uint8)
    # Ranges start after a line break or a delimiter and end before one, as the readers' reads do.
    cuts = [0] + [i + 1 for i, c in enumerate(body) if c in b",\n"]
    lo = data.draw(st.sampled_from([c for c in cuts if c < len(body)]))
    hi = data.draw(st.sampled_from([c for c in cuts if c > lo] + [len(body)]))
    if hi < len(body) and body[hi - 1] == 0x0D:
        return
    q, both, records = data.draw(st.integers(0, 1)), data.draw(st.booleans()), data.draw(st.booleans())
    bof = data.draw(st.sampled_from([0, -1]))
    after = body[hi] if hi < len(body) else -1
    _assert_native_scan_agrees(b, lo, hi, q, bof, after, both, records)


@pytest.mark.native("csv")
@settings(max_examples=300)
@given(st.lists(st.sampled_from(list(b'aaaab,,"\n')), min_size=60, max_size=700).map(bytes),
       _written_rows(2, 6, 40), st.data())
def test_the_native_csv_scan_agrees_with_the_numpy_one_on_long_ranges(noise, rows, data):
    """Ranges of hundreds of bytes, so the native scanner's 64-byte blocks (bit masks), their borders and the
    bytes after the last block are all met: random bytes without \r (stray quotes: its early stop), and
    written CSV whose every 64-byte block carries the quote parity into the next."""
    body = data.draw(st.sampled_from([noise, _written_csv(rows, b"\n")]))
    cuts = [0] + [i + 1 for i, c in enumerate(body) if c in b",\n"]
    lo = data.draw(st.sampled_from([c for c in cuts if c < len(body)]))
    hi = data.draw(st.sampled_from([c for c in cuts if c > lo] + [len(body)]))
    if any(0 < p < len(body) and body[p - 1] == body[p] == 0x22 for p in (lo, hi)):
        return  # the callers never cut a run of quote characters
    q, both, records = data.draw(st.integers(0, 1)), data.draw(st.booleans()), data.draw(st.booleans())
    after = body[hi] if hi < len(body) else -1
    _assert_native_scan_agrees(np.frombuffer(body, np.uint8), lo, hi, q, data.draw(st.sampled_from([0, -1])),
                               after, both, records)


@settings(max_examples=200)
@given(_written_rows(3, 3, 10), st.sampled_from([b"\n", b"\r\n"]), st.booleans())
def test_pyarrow_told_no_newlines_in_values_only_when_true(rows, eol, terminated):
    """Records framed by the scan parse to the same table whether or not pyarrow is told their count (which
    lets it assume no line break inside a value when the line breaks are exactly the records' ends)."""
    body = _written_csv(rows, eol)
    if not terminated:
        body = body[:-len(eol)]
    if not body or body.startswith(b"\n") or body.startswith(b"\r"):
        return  # an empty first line is not a record
    names = ["a", "b", "c"]
    got = csv_reader._pyarrow_csv(body, names, names, ",", lambda row: "skip", len(rows))
    want = csv_reader._pyarrow_csv(body, names, names, ",", lambda row: "skip")
    assert got.equals(want)
    assert got.num_rows == len(rows)


def test_the_default_split_size_is_whole_files_only_where_one_worker_reads_everything(tmp_path):
    from pipelines import runner
    from pipelines.jobs import JobConfig
    spec = make_spec(tmp_path, "csv")
    cfg = JobConfig(spec=spec, output=str(tmp_path / "o"))
    assert runner.split_bytes_for(cfg, []) == runner.WHOLE_FILES  # in-process DirectRunner
    assert runner.split_bytes_for(cfg, ["--direct_num_workers=1"]) == runner.WHOLE_FILES
    for args in (["--direct_num_workers=2"], ["--runner=dask", "--dask_workers=2"],
                 ["--runner=DataflowRunner"], ["--runner=PortableRunner", "--job_endpoint=embed"]):
        assert runner.split_bytes_for(cfg, args) == psplits.DEFAULT_SPLIT_BYTES, args
    given = dataclasses.replace(cfg, split_bytes=4096)
    assert runner.split_bytes_for(given, ["--direct_num_workers=2"]) == 4096
    assert runner.split_bytes_for(given, []) == 4096
