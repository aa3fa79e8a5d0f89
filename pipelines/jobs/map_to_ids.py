"""Ids: parsed chunks -> blocks of examples with every token mapped to its id (`MapToIds`)."""

from __future__ import annotations

import collections
from typing import Dict, Optional

import apache_beam as beam
import pyarrow as pa

from pipelines.jobs.coders import BulkElement
from pipelines.jobs.counters import inc_counters
from pipelines.jobs.tagged import split_tagged
from pipelines.mapping import ids
from pipelines.mapping import vocabulary as pvocab
from pipelines.read.parse import ParsedChunk
from pipelines.token_index import TokenIndex
from tpu_embed.artifact import io as tio
from tpu_embed.artifact.spec import vocabulary_filename


@beam.typehints.with_output_types(BulkElement)
class _MapToIds(beam.DoFn):
    """A chunk's tokens -> ids through the vocabularies (`pipelines.mapping.ids.map_chunk`), every policy counted."""

    def __init__(self, spec, vocab_dir: str, sizes: Optional[Dict[str, int]] = None):
        self.spec, self.vocab_dir, self.sizes = spec, vocab_dir, sizes
        self.vocabs = None

    def setup(self):
        # Each vocabulary's hash table is built once per worker, not once per chunk.
        self.vocabs = {k: TokenIndex(v) for k, v in load_vocabularies(self.spec, self.vocab_dir).items()}

    def process(self, chunk: ParsedChunk):
        counts = collections.Counter()
        block = ids.map_chunk(chunk, self.spec, self.vocabs, counts, self.sizes)
        inc_counters(counts)
        yield "stats", dict(counts)
        yield "blocks", ((chunk.file_index, chunk.chunk_index), block)


def load_vocabularies(spec, vocab_dir: str) -> Dict[str, pa.Array]:
    """{vocabulary key: its tokens in id order} from the vocabulary files under vocab_dir/vocab."""
    out = {}
    for key, feats in spec.vocabulary_groups().items():
        path = tio.join(vocab_dir, "vocab", vocabulary_filename(feats[0].name))
        try:
            data = tio.read_bytes(path)
        except Exception as e:  # noqa: BLE001
            raise FileNotFoundError(f"vocabulary {path} is missing ({e}); run `tpu-embed vocab` for this spec "
                                    "first, or pass --vocab DIR.") from None
        tokens = pvocab.read_vocabulary_file(data)
        out[key] = pa.array(tokens, pa.large_binary())
    return out


class MapToIds(beam.PTransform):
    """ParsedChunk -> {"blocks": ((file, chunk), ExampleBlock), "stats": counter dicts}."""

    def __init__(self, spec, vocab_dir: str, sizes: Optional[Dict[str, int]] = None):
        """`sizes`: the vocabulary sizes of the manifest, each the first OOV id (a capacity, under one)."""
        super().__init__()
        self.spec, self.vocab_dir, self.sizes = spec, vocab_dir, sizes

    def expand(self, chunks):
        return split_tagged(chunks | "Map" >> beam.ParDo(_MapToIds(self.spec, self.vocab_dir, self.sizes)),
                            ("blocks", "stats"),
                            bulk=("blocks",))
