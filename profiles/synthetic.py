"""Synthetic Criteo-like global batches (Zipf ids, multivalent features), deterministic.

For tests, benchmarks and demos: no dataset needed.  Ids are Zipf-distributed
over a frequency-ordered vocabulary (id 0 is the most frequent, as a
vocabulary job writes it), so 'div' partitioning piles hot ids onto shard 0.
"""

from __future__ import annotations

from typing import Dict, Iterator, Mapping, Optional, Sequence

import numpy as np

from profiles.collector import ProfileCollector
from profiles.stats import PartitionStats, TableStats
from tpu_embed.core.model import FeatureConfig, TableConfig
from tpu_embed.core.nest import flatten_with_paths
from tpu_embed.sparsecore import FeatureIds, layout_of
from tpu_embed.sparsecore.padding import XLA_PAD, round_up


def feature_config(num_tables: int = 4, *, per_chip_batch: int = 16, vocab_sizes: Optional[Sequence[int]] = None,
                   dims: Optional[Sequence[int]] = None, combiners: Sequence[str] = ("sum", "mean", "sqrtn"),
                   shared: int = 0, sequence: Optional[Mapping[int, int]] = None, optimizer="sgd") -> dict:
    """{feature name: tpu_embed.core.model.FeatureConfig}.  `shared`: that many extra features look up
    table 0 (shared embedding); `sequence`: {table index: seq_len} for sequence features;
    `optimizer`: an optimizer group label, or one per table (tables stack only within a group)."""
    vocab_sizes = list(vocab_sizes or [1000 * (i + 1) for i in range(num_tables)])
    dims = list(dims or [8 * (1 + i % 3) for i in range(num_tables)])
    optimizers = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
    tables = [TableConfig(f"table_{i:02d}", int(vocab_sizes[i % len(vocab_sizes)]), int(dims[i % len(dims)]),
                          combiners[i % len(combiners)], optimizer_group=str(optimizers[i % len(optimizers)]))
              for i in range(num_tables)]
    fc = {}
    for i, t in enumerate(tables):
        seq = (sequence or {}).get(i)
        shape = [per_chip_batch, seq] if seq else [per_chip_batch]
        fc[f"feature_{i:02d}"] = FeatureConfig(f"feature_{i:02d}", t, tuple(shape), seq or 0)
    for j in range(shared):
        fc[f"shared_{j:02d}"] = FeatureConfig(f"shared_{j:02d}", tables[0], (per_chip_batch,))
    return fc


def _flat(feature_config) -> Dict[str, FeatureConfig]:
    return dict(flatten_with_paths(feature_config))


def global_batch(feature_config, num_chips: int, rng: np.random.Generator, *, zipf_a: float = 1.2,
                 max_valency: int = 4, empty_prob: float = 0.1) -> Dict[str, FeatureIds]:
    """One global batch: {feature path: FeatureIds} with global rows.  Feature i has a valency of
    0..max_valency ids per sample (multivalent), every id Zipf(zipf_a)-distributed, folded into the
    vocabulary."""
    out = {}
    for path, f in _flat(feature_config).items():
        samples = int(np.prod(f.output_shape)) * num_chips
        vocab = int(f.table.vocabulary_size)
        per = rng.integers(1, max_valency + 1, size=samples)
        per[rng.random(samples) < empty_prob] = 0
        rows = np.repeat(np.arange(samples, dtype=np.int64), per)
        ids = ((rng.zipf(zipf_a, size=rows.size) - 1) % vocab).astype(np.int64)
        out[path] = FeatureIds(rows=rows, ids=ids, weights=None)
    return out


def global_batches(feature_config, num_chips: int, steps: int, seed: int = 0, **kw) -> Iterator[Dict[str, FeatureIds]]:
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        yield global_batch(feature_config, num_chips, rng, **kw)


def synthetic_profile(feature_config, topology, steps: int, *, seed: int = 0,
                      candidate_chip_counts: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256)):
    """A Profile whose statistics look like `steps` profiled steps, drawn directly (no batches).

    For planner benchmarks and tests at scale (10^4 steps of 26 tables in well under a second):
    per-step maxima, per-cell counts and buffer needs are drawn from Poisson distributions around
    plausible means, hot-id counts from a Zipf law.  Not a substitute for profiling real data.
    """
    rng = np.random.default_rng(seed)
    collector = ProfileCollector(feature_config, topology, candidate_chip_counts=candidate_chip_counts,
                                 series_steps=steps)
    acc = collector.create_accumulator()
    acc.steps = steps
    model = collector.model
    for t in model.tables:
        _fill_table(acc.tables[t.name], t, model.table_features(t.name), topology.num_chips, steps, rng)
    layout = layout_of(model)
    for name, ps in acc.stacks.items():
        _fill_partitions(ps, layout.stacks[name].sample_count, steps, rng, series=True)
    for c, stacks in acc.candidate_stacks.items():
        cl = layout_of(collector._candidate_models[c])
        for name, ps in stacks.items():
            _fill_partitions(ps, cl.stacks[name].sample_count, steps, rng, series=False)
    return collector.extract_output(acc)


def _fill_table(ts: TableStats, t: TableConfig, feats: Sequence[FeatureConfig], num_chips: int, steps: int,
                rng: np.random.Generator) -> None:
    """One table's statistics: its features' lookups, drawn hot ids, and its partitions on every chip count."""
    ts.steps = steps
    samples = sum(f.samples for f in feats)
    for f in feats:
        fs = ts.features[f.name]
        fs.examples = f.examples * num_chips * steps
        fs.ids_per_example.add_array(rng.integers(0, 5, size=10_000))
        fs.ids = int(fs.examples * 2)
    ids = ((rng.zipf(1.2, size=200_000) - 1) % t.vocabulary_size).astype(np.int64)
    ts.id_counts.add(ids)
    for load in ts.shard_load.values():
        load.add(ids, t.vocabulary_size)
    _fill_partitions(ts.partitions, samples, steps, rng, series=False)
    for c, ps in ts.candidates.items():
        _fill_partitions(ps, samples * num_chips // c, steps, rng, series=False)


def _fill_partitions(ps: PartitionStats, samples: int, steps: int, rng: np.random.Generator, *, series: bool) -> None:
    """Drawn figures of one table or stack on one topology, around ~2.2 ids per sample over its destinations."""
    S, nsc, chips = ps.num_sparse_cores, ps.num_sc_per_chip, ps.num_chips
    mean_cell = max(0.2, 2.2 * samples / S)  # ~2.2 ids per sample spread over S destinations
    cells = rng.poisson(mean_cell, size=(min(steps, 8), nsc * S))
    ps.steps = steps
    step_max = rng.poisson(max(1.0, cells.max(axis=1).mean()), size=steps) + 1
    step_uniq = np.maximum(1, (step_max * rng.uniform(0.5, 0.9, size=steps)).astype(np.int64))
    ps.step_max_ids.add_array(step_max)
    ps.step_max_unique_ids.add_array(step_uniq)
    reps = -(-steps * chips // cells.shape[0])
    ps.cell_ids.counts = {int(v): int(c) * reps for v, c in zip(*np.unique(cells, return_counts=True))}
    ps.cell_unique_ids.counts = {int(v): int(c) * reps for v, c in
                                 zip(*np.unique((cells * 0.8).astype(np.int64), return_counts=True))}
    need = round_up(cells, XLA_PAD).reshape(cells.shape[0], nsc, S).sum(axis=(1, 2))
    chip_need = rng.choice(need, size=steps)
    ps.step_max_chip_buffer.add_array(chip_need)
    ps.chip_buffer.add_array(rng.choice(need, size=min(steps * chips, 10_000)))
    ps.step_max_sc_buffer.add_array(chip_need // nsc)
    ps.ids = int(cells.sum()) * reps
    ps.unique_ids = int(ps.ids * 0.8)
    ps.dest_ids = rng.poisson(ps.ids / S, size=S).astype(np.int64)
    ps.step_max_dest_ids = int(ps.dest_ids.max()) * steps // max(1, steps)
    if ps.sc_dest_ids is not None:
        ps.sc_dest_ids = rng.poisson(ps.ids / (S * nsc), size=(nsc, S)).astype(np.int64)
    if series:  # the stacks', which keep a series (`series_steps=steps`)
        values = dict(zip(range(steps), zip(step_max.tolist(), step_uniq.tolist(), chip_need.tolist())))
        ps.series._values = values  # type: ignore[union-attr]
