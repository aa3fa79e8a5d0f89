"""ProfileCollector: lookup statistics over a stream of global batches, Beam-style.

    collector = ProfileCollector(feature_config, Topology(8, 4))
    acc = collector.create_accumulator()
    for step, batch in enumerate(global_batches):
        acc = collector.add_step(acc, batch, step=step)
    profile = collector.extract_output(collector.merge_accumulators([acc, other]))

The four methods are exactly a `beam.CombineFn`'s; the collector itself holds
only plain data (`ModelConfig`, chip counts), so it pickles to workers.
`add_step` mutates and returns the accumulator (Beam allows that);
`merge_accumulators` returns a new one and leaves its inputs alone.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from profiles.counting import candidate_table_counts, dedup_table, one_chip_model, stack_counts
from profiles.idcounts import IdCounts
from profiles.profile import CandidateStatus, Profile, ProfileAccumulator
from profiles.stats import FeatureStats, PartitionStats, ShardLoad, TableStats, deep_copy
from profiles.step_counts import StepCounts, count_steps
from profiles.step_series import DEFAULT_SERIES_STEPS
from profiles.units import CandidateUnavailable, GlobalConfig, rescaled
from tpu_embed.core.model import ModelConfig, from_tf_feature_config
from tpu_embed.core.topology import Topology
from tpu_embed.sparsecore import FeatureIds, layout_of

# The profiled topology only.  What-if figures for other chip counts are asked for by name (the jobs'
# `--candidate-chip-counts`, the spec's `profile_candidate_chip_counts`): each one re-partitions every step, and
# nine of them (1..256) made the statistics cost several times the rest of a `tpu-embed run`.
DEFAULT_CANDIDATE_CHIP_COUNTS: Tuple[int, ...] = ()
# Steps a job's profile adds per `add_steps` call: the per-call cost of ~30 statistics x ~20 numpy calls is paid
# once per group (on the quoted workload of benchmarks/run_throughput.py the statistics take a quarter less CPU
# time in groups of 16 than of 8); 16 steps of 4096 examples hold ~26 MB of ids.
STEPS_PER_CALL = 16


class StepInput(NamedTuple):
    """One step for `ProfileCollector.add_steps`: `add_step`'s arguments."""

    global_ids: Mapping[str, FeatureIds]
    oov_counts: Optional[Mapping[str, int]] = None
    step: Optional[int] = None


def step_numbers(acc: ProfileAccumulator, steps: Sequence[StepInput]) -> List[int]:
    """The index of each of `steps` added to `acc`: its `step`, or where none is given, its place after the
    accumulator's steps."""
    return [acc.steps + g if s.step is None else int(s.step) for g, s in enumerate(steps)]


class ProfileCollector:
    def __init__(self, feature_config: Any, topology: Optional[Topology] = None, *,
                 candidate_chip_counts: Sequence[int] = DEFAULT_CANDIDATE_CHIP_COUNTS,
                 series_steps: int = DEFAULT_SERIES_STEPS, oov_ids_in_batch: bool = True,
                 frequency_ids: Optional[Mapping[str, np.ndarray]] = None):
        """`feature_config`: a `tpu_embed.core.model.ModelConfig`, or TF feature configs + `topology` as for
        `tpu_embed.sparsecore.stack_tables` (output_shape = the per-chip batch shape).
        `candidate_chip_counts`: other chip counts (same SCs per chip, same global batch) to compute
        per-partition figures for in the same pass (default: none, the profiled topology only); those
        that cannot run the batch are recorded as skipped, with the reason.  `series_steps`: how many
        per-step maxima to keep for plots (quantiles always use every step).
        `oov_ids_in_batch`: True if the out-of-vocabulary lookups counted in `oov_counts` are in the batch
        (mapped to OOV buckets), False if they were dropped upstream; it sets the OOV rate's denominator.
        `frequency_ids`: {table: ids[i], the frequency-order id of the table's id i} for tables whose ids are
        balanced (`partition: {ids: balanced}`; ids past the array keep theirs: the OOV buckets); the main
        topology's stacks are then also counted with those ids (`PartitionStats.frequency_order`)."""
        model = from_tf_feature_config(feature_config, topology)
        self.model = model
        self.frequency_ids = {str(t): np.asarray(ids, np.int64) for t, ids in (frequency_ids or {}).items()}
        unknown = sorted(set(self.frequency_ids) - {t.name for t in model.tables})
        if unknown:
            raise ValueError(f"frequency_ids for tables {unknown} that the model does not have")
        self._one_chip = one_chip_model(model)  # the main topology's counts in one core call per table
        self.series_steps = int(series_steps)
        self.oov_ids_in_batch = bool(oov_ids_in_batch)
        main = model.topology.num_chips
        self.candidates: Dict[int, CandidateStatus] = {}
        self._candidate_models: Dict[int, ModelConfig] = {}
        for c in sorted(set(int(c) for c in candidate_chip_counts) | {main}):
            if c == main:
                self.candidates[c] = CandidateStatus(c, "main")
                continue
            if c < 1:
                raise ValueError(f"candidate chip count {c} must be >= 1")
            try:
                cm = rescaled(model, c)
                layout_of(cm)  # stacking must work too
            except (CandidateUnavailable, ValueError) as e:
                self.candidates[c] = CandidateStatus(c, "skipped", str(e))
                continue
            self.candidates[c] = CandidateStatus(c, "profiled")
            self._candidate_models[c] = cm

    # ------------------------------------------------------------ CombineFn protocol

    def create_accumulator(self) -> ProfileAccumulator:
        m = self.model
        g = GlobalConfig.of(m)
        tables = {}
        for t in m.tables:
            # The S values whose shard loads `extract_output` fills in from the id counts (zeros until then).
            loads = {g.num_sparse_cores: ShardLoad.empty(g.num_sparse_cores)}
            for cm in self._candidate_models.values():
                s = cm.topology.num_sparse_cores
                loads.setdefault(s, ShardLoad.empty(s))
            tables[t.name] = TableStats(
                steps=0, features={f.name: FeatureStats() for f in m.table_features(t.name)}, id_counts=IdCounts(),
                shard_load=loads,
                # Per-table series are not kept: plots show stacks, and files stay small.
                partitions=PartitionStats.empty(g.num_chips, g.num_sc_per_chip, heat_map=True, per_partition=True),
                candidates={c: PartitionStats.empty(c, g.num_sc_per_chip) for c in self._candidate_models})
        stacks = {name: PartitionStats.empty(g.num_chips, g.num_sc_per_chip, heat_map=True,
                                             series_steps=self.series_steps, per_partition=True, step_balance=True)
                  for name in layout_of(m).stacks}
        if self.frequency_ids:
            for ps in stacks.values():
                ps.frequency_order = PartitionStats.empty(g.num_chips, g.num_sc_per_chip, heat_map=True,
                                                          step_balance=True)
        cand = {c: {name: PartitionStats.empty(c, g.num_sc_per_chip) for name in layout_of(cm).stacks}
                for c, cm in self._candidate_models.items()}
        return ProfileAccumulator(m.key, 0, tables, stacks, cand)

    def add_step(self, acc: ProfileAccumulator, global_ids: Mapping[str, FeatureIds],
                 oov_counts: Optional[Mapping[str, int]] = None, step: Optional[int] = None, *,
                 validate: bool = True) -> ProfileAccumulator:
        """Add one training step.

        `global_ids`: {feature path: FeatureIds(rows, ids, weights)} with *global* rows (chip c owns
        rows [c*n, (c+1)*n), n = the feature's per-chip samples), ids already mapped to the table's
        vocabulary.  `oov_counts`: optional {feature path: ids of this step that were out of
        vocabulary (mapped to an OOV bucket or dropped upstream)}.  `step`: the global step index;
        pass it when several workers profile one stream (it keys the per-step series used for plots).
        `validate=False`: the caller has checked what `_validate` checks (the shard job's steps: their ids went
        through the CSR packer, which refuses ids outside a table and unsorted rows).
        """
        return self.add_steps(acc, [StepInput(global_ids, oov_counts, step)], validate=validate)

    def add_steps(self, acc: ProfileAccumulator, steps: Sequence["StepInput"], *,
                  validate: bool = True) -> ProfileAccumulator:
        """`add_step` of each of `steps` in order, the numpy work of all of them at once (a step's own figures,
        its maxima, series and balance, stay its own): the same accumulator as adding them one by one, at a
        fraction of the calls (the profile of a job adds its steps in groups of `STEPS_PER_CALL`)."""
        if not steps:
            return acc
        if validate:
            for s in steps:
                self._validate(s.global_ids, s.oov_counts)
        numbers = step_numbers(acc, steps)
        gids = [s.global_ids for s in steps]
        counted = count_steps(self.model, self._one_chip, gids, self.frequency_ids,
                              {t.name: acc.tables[t.name].id_counts for t in self.model.tables})
        self._add_lookups(acc, [s.oov_counts for s in steps], counted)
        self._add_main_partitions(acc, counted, numbers)
        if self._candidate_models:
            for g, n in zip(gids, numbers):
                self._add_candidate_partitions(acc, g, n)
        acc.steps += len(steps)
        return acc

    def _add_lookups(self, acc: ProfileAccumulator, oov_counts: Sequence[Optional[Mapping[str, int]]],
                     counted: Sequence[StepCounts]) -> None:
        """Per feature and table: valency, OOV (the id counts are `count_steps`'; shard loads follow from them:
        `extract_output`). Every figure is a sum over steps."""
        m = self.model
        g = m.topology
        G = len(counted)
        for t in m.tables:
            ts = acc.tables[t.name]
            ts.steps += G
            for f in m.table_features(t.name):
                fs = ts.features[f.name]
                fs.examples += f.examples * g.num_chips * G
                lookups = [c.lookups[f.name] for c in counted]
                fs.ids += sum(lookups)
                valency = counted[0].valency[f.name]
                for c in counted[1:]:
                    other = c.valency[f.name]
                    if other.size > valency.size:
                        valency, other = other, valency
                    valency = valency.copy()
                    valency[:other.size] += other
                fs.ids_per_example.add_counts(valency)
                for n, oov in zip(lookups, oov_counts):
                    if oov is not None and f.name in oov:
                        fs.oov_ids += int(oov[f.name])
                        fs.oov_reported_ids += n + (0 if self.oov_ids_in_batch else int(oov[f.name]))

    def _add_main_partitions(self, acc: ProfileAccumulator, counted: Sequence[StepCounts],
                             numbers: Sequence[int]) -> None:
        """Main topology: tables alone, then stacks (all added at once); per stack the step's hottest id (after
        dedup) for the balance floor."""
        m = self.model
        layout = layout_of(m)
        stacks = list(layout.stacks)
        members = [[i for i, t in enumerate(m.tables) if layout.tables[t.name].stack == n] for n in stacks]
        # Per step: the tables' hottest ids (not used: a table alone keeps no balance), then each stack's.
        hottest = np.array([np.concatenate([c.hottest, [c.hottest[ix].max() for ix in members]]) for c in counted])
        PartitionStats.add_steps_dense([acc.tables[t.name].partitions for t in m.tables] +
                                       [acc.stacks[n] for n in stacks],
                                       np.stack([np.concatenate([c.table_ids, c.stack_ids]) for c in counted]),
                                       np.stack([np.concatenate([c.table_unique, c.stack_unique]) for c in counted]),
                                       numbers, hottest)
        if self.frequency_ids and all(acc.stacks[n].frequency_order is not None for n in stacks):
            # The same steps with frequency-order ids: a table's (sample, id) pairs are the same pairs relabelled,
            # so only their destinations (and which ids are equal) change.
            PartitionStats.add_steps_dense([acc.stacks[n].frequency_order for n in stacks],  # type: ignore[misc]
                                           np.stack([c.frequency_stack_ids for c in counted]),  # type: ignore[misc]
                                           np.stack([c.frequency_stack_unique for c in counted]),  # type: ignore[misc]
                                           numbers, hottest[:, len(m.tables):])

    def _add_candidate_partitions(self, acc: ProfileAccumulator, global_ids: Mapping[str, FeatureIds],
                                  step: int) -> None:
        """Candidate chip counts: one dedup per table, then a vectorised count per candidate."""
        m = self.model
        deduped = {t.name: dedup_table(m, t.name, global_ids) for t in m.tables}
        for c, cm in self._candidate_models.items():
            counts = {t.name: candidate_table_counts(cm, t.name, deduped[t.name]) for t in m.tables}
            stacked = stack_counts(layout_of(cm), counts)
            PartitionStats.add_step_many([acc.tables[n].candidates[c] for n in counts] +
                                         [acc.candidate_stacks[c][n] for n in stacked],
                                         list(counts.values()) + list(stacked.values()), step)

    def merge_accumulators(self, accumulators: Iterable[ProfileAccumulator]) -> ProfileAccumulator:
        out = self.create_accumulator()
        for a in accumulators:
            out.merge_from(a)
        return out

    def extract_output(self, acc: ProfileAccumulator, *, consume: bool = False) -> Profile:
        """The profile of `acc`. It does not alias `acc` (a deep copy), unless `consume`: the caller hands `acc`
        over and never uses it again (the job's merged partials), and the profile takes its statistics."""
        out = acc if consume else deep_copy(acc)
        for t in self.model.tables:  # each S's mod/div loads, from the exact per-id counts (one pass per table)
            ts = out.tables[t.name]
            ids, counts = ts.id_counts.arrays()
            ts.shard_load = {s: ShardLoad.of_id_counts(ids, counts, s, t.vocabulary_size) for s in ts.shard_load}
        return Profile(self.model, dict(self.candidates), out)

    # ------------------------------------------------------------ validation

    def _validate(self, global_ids: Mapping[str, FeatureIds], oov_counts) -> None:
        m = self.model
        g = m.topology
        paths = [f.name for f in m.features]
        missing = [p for p in paths if p not in global_ids]
        extra = [p for p in global_ids if p not in set(paths)]
        if missing or extra:
            raise ValueError(f"global batch: missing features {missing}, unexpected features {extra}; "
                             f"pass {{feature path: FeatureIds}} for exactly {paths}.")
        for f in m.features:
            fid = global_ids[f.name]
            if not isinstance(fid, FeatureIds):
                raise TypeError(f"feature {f.name!r}: expected tpu_embed.sparsecore.FeatureIds, got "
                                f"{type(fid).__name__}.")
            if fid.rows.shape != fid.ids.shape:
                raise ValueError(f"feature {f.name!r}: rows and ids differ in length.")
            if not fid.ids.size:
                continue
            n = f.samples * g.num_chips
            if np.any(fid.rows[1:] < fid.rows[:-1]):
                raise ValueError(f"feature {f.name!r}: global rows must be sorted (non-decreasing).")
            if fid.rows[0] < 0 or fid.rows[-1] >= n:
                raise ValueError(f"feature {f.name!r}: global rows must be in [0, {n}) ({g.num_chips} chips x "
                                 f"{f.samples} samples per chip); got {int(fid.rows[0])}..{int(fid.rows[-1])}.")
            vocab = f.table.vocabulary_size
            lo, hi = int(fid.ids.min()), int(fid.ids.max())
            if lo < 0 or hi >= vocab:
                raise ValueError(f"feature {f.name!r}: id {lo if lo < 0 else hi} is outside the vocabulary "
                                 f"[0, {vocab}) of table {f.table.name!r}. Map ids through the vocabulary first "
                                 "(out-of-vocabulary ids to an OOV bucket) and report them in oov_counts.")
        if oov_counts is not None:
            unknown = sorted(set(oov_counts) - set(paths))
            if unknown:
                raise ValueError(f"oov_counts has unknown features {unknown}; features are {paths}.")
            for k, v in oov_counts.items():
                if int(v) < 0:
                    raise ValueError(f"oov_counts[{k!r}] = {v} must be >= 0.")

