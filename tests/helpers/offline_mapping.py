"""The shard job's own reading, parsing and mapping of a CSV file (`pipelines.read` +
`pipelines.mapping.ids.map_chunk`): the reference the serving mapping's tests compare against, without those tests
importing `pipelines`."""

import collections
import os

import numpy as np
import pyarrow as pa

from pipelines.mapping.ids import PolicyError, map_chunk
from pipelines.mapping.vocabulary import read_vocabulary_file, vocabulary_file_bytes
from pipelines.read import parse, splits
from pipelines.read import records as precords
from pipelines.token_index import TokenIndex

__all__ = ["PolicyError", "map_csv", "read_vocabulary_file", "vocabulary_file_bytes"]


def map_csv(spec, d, vocab_tokens, capacity=0):
    """`d`/in.csv read, parsed and mapped by the shard job's code with vocabularies of `vocab_tokens` ({group:
    tokens in id order}; `capacity` rows beyond each file's): (valid rows, dead rows, their ExampleBlock, or the
    PolicyError that stops the job, or None where the reader dead-letters every record)."""
    path = os.path.join(d, "in.csv")
    f = precords.InputFile(0, path, os.path.getsize(path))
    items = list(splits.read_file("csv", f, spec.required_columns(), chunk_rows=1000))
    batches = [x for x in items if isinstance(x, precords.RawBatch)]
    letters = [x for x in items if isinstance(x, precords.DeadLetter)]
    assert len(batches) <= 1, items
    if not batches:  # every record a dead letter of the reader (e.g. not UTF-8)
        return np.zeros(0, np.int64), set(range(len(letters))), None
    chunk, bad = parse.parse_batch(batches[0], spec)
    dead = {x.record for x in letters + bad}
    vocabs = {k: TokenIndex(pa.array(read_vocabulary_file(vocabulary_file_bytes(vocab_tokens[k])),
                                     pa.large_binary())) for k in spec.vocabulary_groups()}
    # Record numbers say where a record is in the file; the rows are the records in that order.
    order = {r: i for i, r in enumerate(sorted(set(chunk.record_numbers.tolist()) | dead))}
    valid_rows = np.asarray([order[r] for r in chunk.record_numbers.tolist()], np.int64)
    dead = {order[r] for r in dead}
    try:
        sizes = {k: len(v) + capacity for k, v in vocabs.items()} if capacity else None
        block = map_chunk(chunk, spec, vocabs, collections.Counter(), sizes)
    except PolicyError as e:
        return valid_rows, dead, e
    return valid_rows, dead, block
