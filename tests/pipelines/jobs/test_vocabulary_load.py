"""The shard job's vocabularies as it loads them (`pipelines.jobs.map_to_ids.vocabulary_tokens`): the lines of the
file as `pipelines.mapping.vocabulary.read_vocabulary_file` reads them, in id order."""

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.jobs import map_to_ids
from pipelines.mapping import vocabulary as pvocab


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), max_size=40), st.booleans())
def test_a_vocabulary_file_loads_as_its_lines(tokens, trailing_break):
    data = b"\n".join(tokens) + (b"\n" if trailing_break else b"")
    want = pa.array(pvocab.read_vocabulary_file(data), pa.large_binary())
    got = map_to_ids.vocabulary_tokens(data)
    assert got.type == pa.large_binary() and got.equals(want)


def test_the_files_the_vocabulary_job_writes_load_as_written():
    for tokens in ([b"b", b"a\xff", b"10"], []):  # [] is written as TFT's one dummy token
        data = pvocab.vocabulary_file_bytes(tokens)
        assert map_to_ids.vocabulary_tokens(data).to_pylist() == pvocab.read_vocabulary_file(data)
    assert map_to_ids.vocabulary_tokens(b"").to_pylist() == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b"")), max_size=40),
       st.sampled_from([pa.large_binary(), pa.binary()]), st.integers(0, 3), st.booleans())
def test_a_vocabulary_file_is_its_tokens_one_a_line_from_a_list_or_arrow(tokens, kind, lo, chunked):
    """`vocabulary_file_bytes` of the tokens as a list, an Arrow array (sliced, of either binary type) or a chunked
    one (the vocabulary job's): each token then '\\n', TFT's dummy token for none."""
    want = b"".join(t + b"\n" for t in tokens[lo:]) if tokens[lo:] else pvocab.TFT_EMPTY_VOCABULARY_TOKEN + b"\n"
    arr = pa.array(tokens, kind).slice(lo)
    if chunked:
        arr = pa.chunked_array([arr.slice(0, 2), arr.slice(2)], kind)
    assert pvocab.vocabulary_file_bytes(tokens[lo:]) == want
    assert pvocab.vocabulary_file_bytes(arr) == want
