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
