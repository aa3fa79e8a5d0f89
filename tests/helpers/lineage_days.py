"""A lineage of days on the MovieLens sample split by its timestamp (the tests of incremental runs and windows).

    d = lineage_days.split(tmp_dir, parts=3)          # day1.csv, day2.csv, day3.csv (older first), and their rows
    spec = lineage_days.spec(["day1.csv"], tmp_dir)    # append vocabularies with capacities: one layout every day
    outs = lineage_days.build(tmp_dir, parts=3)        # day 1 without a base, each later day with the previous as base
    counts = lineage_days.token_counts(header, rows, "genres")  # {token bytes: occurrences} in those rows
"""

from __future__ import annotations

import collections
import csv
import os
from typing import Dict, List, Optional

from pipelines import runner
from pipelines.jobs import JobConfig
from tests.helpers import ROOT
from tpu_embed.artifact.spec import parse_spec

DATA = os.path.join(ROOT, "data", "movielens_sample.csv")

# Every vocabulary of mode append has a capacity, so the table rows and the layout are the same every day.
VOCABULARIES = {
    "genres": {"mode": "append", "capacity": 40},
    "zip": {"mode": "append", "capacity": 160, "num_oov_buckets": 2},
    "occupation": {"mode": "append", "capacity": 24},
}


def split(d: str, parts: int = 3):
    """The sample's rows sorted by timestamp, cut into `parts` days of equal size: (header, [rows of each day]);
    day k's rows are written to d/day{k}.csv."""
    with open(DATA, newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], sorted(rows[1:], key=lambda r: int(r[3]))
    n = len(body)
    out = []
    for i in range(parts):
        part = body[i * n // parts:(i + 1) * n // parts]
        with open(os.path.join(d, f"day{i + 1}.csv"), "w", newline="") as f:
            csv.writer(f, lineterminator="\n").writerows([header] + part)
        out.append(part)
    return header, out


def token_counts(header: List[str], rows: List[List[str]], name: str) -> collections.Counter:
    """{token (bytes): occurrences} of CSV column `name` in `rows`, counted plainly (genres split on "|", blanks
    left out): what the vocabulary jobs' counts are checked against."""
    col = header.index(name)
    c: collections.Counter = collections.Counter()
    for r in rows:
        for t in (r[col].split("|") if name == "genres" else [r[col]]):
            if t:
                c[t.encode()] += 1
    return c


def spec(patterns: List[str], base_dir: str, vocabularies: Optional[Dict[str, dict]] = None, **extra):
    categorical = [{"name": "user_id", "vocabulary": {"type": "identity", "num_buckets": 6041}},
                   {"name": "title", "vocabulary": {"type": "hashing", "num_buckets": 100}}]
    for name, v in (VOCABULARIES if vocabularies is None else vocabularies).items():
        categorical.append({"name": name, "vocabulary": v, **({"delimiter": "|"} if name == "genres" else {})})
    return parse_spec({"inputs": {"format": "csv", "patterns": patterns}, "label": "rating", "dense": ["timestamp"],
                       "categorical": categorical, "defaults": {"table": {"dim": 8}},
                       "optimizer": {"type": "adagrad", "learning_rate": 0.05},
                       "topology": {"num_chips": 2, "num_sc_per_chip": 4}, "global_batch_size": 16,
                       "policies": {"tail": "pad"}, **extra}, base_dir=base_dir)


def build(d: str, parts: int = 3, **cfg) -> List[str]:
    """Split the sample into `parts` days under `d` and run each day over its own file, each with the previous
    day's artifact as its base: the artifacts d/out1, d/out2, ..."""
    split(d, parts)
    outs: List[str] = []
    for k in range(1, parts + 1):
        out = os.path.join(d, f"out{k}")
        runner.run_all(JobConfig(spec=spec([f"day{k}.csv"], d), output=out, base=outs[-1] if outs else None, **cfg))
        outs.append(out)
    return outs
