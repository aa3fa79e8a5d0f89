"""Two days of the MovieLens sample as two artifacts of one spec, for the remap tests.

Day 1 is rows 1-100 of data/movielens_sample.csv, day 2 rows 61-200: their frequency vocabularies differ in
order and content (kept, moved, dropped and new tokens). The spec has a table of every optimizer the product
supports, a table shared by two features, OOV buckets, an identity, a hashing and a tensor-core feature.
"""

from __future__ import annotations

import os

from tests.helpers import ROOT

SPEC = """\
name: remap_days
inputs: {format: csv, patterns: [day1.csv]}
label: {column: rating}
dense: [{name: timestamp, fill: 0.0}]
categorical:
  - {name: user_id, vocabulary: {type: identity, num_buckets: 6041}}
  - {name: genres, delimiter: "|", vocabulary: {type: frequency, num_oov_buckets: 2}}
  - {name: age, table: people, vocabulary: {type: frequency, num_oov_buckets: 3}}
  - {name: occupation, table: people, vocabulary: {type: frequency, num_oov_buckets: 3}}
  - {name: zip, vocabulary: {type: frequency, num_oov_buckets: 1}}
  - {name: title, vocabulary: {type: hashing, num_buckets: 50}}
  - {name: gender, vocabulary: {type: frequency, num_oov_buckets: 1},
     embedding_lookup_device: tpu_tensor_core, tensor_core_width: 1}
tables:
  - {name: user_id, dim: 8}
  - {name: genres, dim: 8, optimizer: {type: adam, learning_rate: 0.01}}
  - {name: people, dim: 4, optimizer: {type: ftrl, learning_rate: 0.1, initial_accumulator_value: 0.2}}
  - {name: zip, dim: 8, optimizer: {type: sgd, learning_rate: 0.1}}
  - {name: title, dim: 4}
  - {name: gender, dim: 4}
optimizer: {type: adagrad, learning_rate: 0.05, initial_accumulator: 0.3}
topology: {num_chips: 1, num_sc_per_chip: 4, num_hosts: 1}
global_batch_size: 8
"""
DAYS = {"day1": (1, 100), "day2": (61, 200)}  # data rows (1-based, inclusive) of each day


def write_inputs(directory: str, spec_text: str = SPEC) -> str:
    """The two days' CSV files and the spec in `directory`; returns the spec's path."""
    with open(os.path.join(ROOT, "data", "movielens_sample.csv"), encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    for day, (first, last) in DAYS.items():
        with open(os.path.join(directory, f"{day}.csv"), "w", encoding="utf-8") as fh:
            fh.write("\n".join([lines[0]] + lines[first:last + 1]) + "\n")
    path = os.path.join(directory, "spec.yaml")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(spec_text)
    return path


def build_day(spec_path: str, day: str, output: str, shards: bool = False) -> str:
    """Day `day`'s artifact: the vocabularies (and with `shards`, the shards too) by the real jobs."""
    from pipelines import runner
    from pipelines.jobs import JobConfig
    from tpu_embed.artifact.spec import load_spec
    spec = load_spec(spec_path)
    spec = spec.with_inputs([os.path.join(os.path.dirname(spec_path), f"{day}.csv")])
    (runner.run_all if shards else runner.run_vocab)(JobConfig(spec=spec, output=output))
    return output
