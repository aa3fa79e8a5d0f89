"""One step's lookup statistics per table: what `ProfileCollector.add_steps` counts of each step.

Per table: the main topology's cells (`counting.core_table_counts`: the table laid out alone, rotation 0),
with frequency-order ids where the table's ids are balanced, the step's hottest id after equal (sample, id)
pairs of a feature are merged (`counting.hottest_per_table_steps`), and per feature how many examples hold
k ids; every raw lookup is added to the table's `IdCounts`.

Two implementations, tested equal (tests/profiles/test_step_counts.py):
* native (`native/_step_counts.c`, built by the install): one pass over a table's ids per step, without
  sorting and without the GIL (a profile thread runs beside the job's other threads);
* the numpy reference (`count_steps_reference`), from profiles/counting.py's functions, used where the
  extension is not built or `TPU_EMBED_NATIVE=0`, and for arrays the kernel does not take (not integers).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from profiles.counting import (
    CellCounts,
    core_table_counts,
    hottest_per_table_steps,
    relabelled_stack_counts,
    stack_counts,
)
from profiles.idcounts import IdCounts
from tpu_embed.core.model import ModelConfig
from tpu_embed.sparsecore import FeatureIds, layout_of

_native: Any = None
if os.environ.get("TPU_EMBED_NATIVE", "1") != "0":
    try:
        from profiles import _step_counts as _native  # type: ignore[attr-defined,no-redef]  # a C extension
    except ImportError:  # pragma: no cover - installed with TPU_EMBED_NATIVE=optional, the build failed
        pass

# Examples with this many ids of one feature or more are counted by numpy (the kernel's histogram is fixed).
HISTOGRAM_SIZE = 64


def native_available() -> bool:
    return _native is not None


@dataclasses.dataclass(frozen=True)
class StepCounts:
    """One step's statistics. `cells`: per table, its cells on the main topology (`core_table_counts`);
    `stacks`: per stack, its cells (`stack_counts` of `cells`); `frequency_stacks`: per stack, the cells with
    the balanced tables' frequency-order ids (`relabelled_stack_counts`), or None without frequency ids;
    `hottest`: per table, its hottest id's lookups; `valency`: per feature, histogram[k] = examples with k ids;
    `lookups`: per feature, its ids."""

    cells: Dict[str, CellCounts]
    stacks: Dict[str, CellCounts]
    frequency_stacks: Optional[Dict[str, CellCounts]]
    hottest: Dict[str, int]
    valency: Dict[str, np.ndarray]
    lookups: Dict[str, int]


def count_steps(model: ModelConfig, one_chip: ModelConfig, steps: Sequence[Mapping[str, FeatureIds]],
                frequency_ids: Mapping[str, np.ndarray], id_counts: Mapping[str, IdCounts]) -> List[StepCounts]:
    """`StepCounts` of each of `steps` ({feature: FeatureIds with global rows}, ids checked to be in their
    table), and every raw lookup added to `id_counts[table]`. `one_chip`: `counting.one_chip_model(model)`.
    `frequency_ids`: {table: frequency-order id of each id} of balanced tables (empty: none).

    A step may also say what its rows are made from, `example_lengths(feature) -> (ids per example, ids,
    sequence length)` (as `pipelines.sharding.batches.GlobalIds` does): the kernel then counts from those."""
    if _native is None:
        return count_steps_reference(model, one_chip, steps, frequency_ids, id_counts)
    inputs = [_kernel_inputs(model, s) for s in steps]
    if any(i is None for i in inputs):
        return count_steps_reference(model, one_chip, steps, frequency_ids, id_counts)
    return [_count_step_native(model, s, i, frequency_ids, id_counts)  # type: ignore[arg-type]
            for s, i in zip(steps, inputs)]


def _kernel_inputs(model: ModelConfig, global_ids: Mapping[str, FeatureIds]) -> Optional[Dict[str, tuple]]:
    """Per feature, the kernel's (rows or lengths, ids, ...) tuple; None where an array is not integers."""
    topo = model.topology
    nsc, chips = topo.num_sc_per_chip, topo.num_chips
    lengths_of = getattr(global_ids, "example_lengths", None)
    out = {}
    for f in model.features:
        tail: tuple = (f.samples // nsc, f.samples_per_example, f.examples * chips)
        if lengths_of is not None:
            first, ids, sequence_length = lengths_of(f.name)
            tail += (int(sequence_length),)
        else:
            fid = global_ids[f.name]
            first, ids = fid.rows, fid.ids
        first, ids = np.asarray(first), np.asarray(ids)
        if first.dtype.kind not in "iu" or ids.dtype.kind not in "iu":
            return None
        out[f.name] = (np.ascontiguousarray(first, np.int64), np.ascontiguousarray(ids, np.int64)) + tail
    return out


# ---------------------------------------------------------------- native

_scratch = threading.local()  # per thread: the kernel's stamp slots, reused call after call


def _scratch_for(vocabulary_size: int) -> np.ndarray:
    have = getattr(_scratch, "slots", None)
    if have is None or have.size < 4 * (vocabulary_size + 1):
        have = _scratch.slots = np.zeros(4 * (vocabulary_size + 1), np.uint32)
    return have


def _count_step_native(model: ModelConfig, global_ids: Mapping[str, FeatureIds], inputs: Mapping[str, tuple],
                       frequency_ids: Mapping[str, np.ndarray], id_counts: Mapping[str, IdCounts]) -> StepCounts:
    topo = model.topology
    nsc, S, chips = topo.num_sc_per_chip, topo.num_sparse_cores, topo.num_chips
    num_cells = chips * nsc * S
    cells: Dict[str, CellCounts] = {}
    freq_cells: Dict[str, CellCounts] = {}
    hottest: Dict[str, int] = {}
    valency: Dict[str, np.ndarray] = {}
    for t in model.tables:
        feats = model.table_features(t.name)
        perm = frequency_ids.get(t.name)
        ids_cells, uniq_cells = np.zeros(num_cells, np.int64), np.zeros(num_cells, np.int64)
        pids, puniq = (np.zeros(num_cells, np.int64), np.zeros(num_cells, np.int64)) if perm is not None else \
            (None, None)
        hist = np.zeros(len(feats) * HISTOGRAM_SIZE, np.int64)
        hot, overflowed = _native.count_table(
            [inputs[f.name] for f in feats], t.vocabulary_size, S, chips * nsc, _scratch_for(t.vocabulary_size),
            id_counts[t.name].counting_array(t.vocabulary_size), perm, ids_cells, uniq_cells, pids, puniq,
            hist, HISTOGRAM_SIZE)
        hottest[t.name] = int(hot)
        cells[t.name] = _cell_counts(chips, nsc, S, ids_cells, uniq_cells)
        if pids is not None and puniq is not None:
            freq_cells[t.name] = _cell_counts(chips, nsc, S, pids, puniq)
        per_feature = hist.reshape(len(feats), HISTOGRAM_SIZE)
        for i, f in enumerate(feats):
            valency[f.name] = _valency(global_ids[f.name], f.samples_per_example, f.examples * chips) \
                if i in overflowed else per_feature[i]
    layout = layout_of(model)
    frequency_stacks = None
    if frequency_ids:
        frequency_stacks = stack_counts(layout, {t.name: freq_cells.get(t.name, cells[t.name]) for t in model.tables})
    lookups = {name: int(i[1].size) for name, i in inputs.items()}
    return StepCounts(cells, stack_counts(layout, cells), frequency_stacks, hottest, valency, lookups)


def _cell_counts(chips: int, nsc: int, S: int, ids: np.ndarray, unique: np.ndarray) -> CellCounts:
    nz = np.flatnonzero(ids)
    return CellCounts(chips, nsc, S, nz.astype(np.int64), ids[nz], unique[nz])


# ---------------------------------------------------------------- reference

def _valency(fid: FeatureIds, samples_per_example: int, examples: int) -> np.ndarray:
    """histogram[k] = examples of the step with k ids (before equal pairs are merged)."""
    return np.bincount(np.bincount(fid.rows // samples_per_example, minlength=examples))


def count_steps_reference(model: ModelConfig, one_chip: ModelConfig, steps: Sequence[Mapping[str, FeatureIds]],
                          frequency_ids: Mapping[str, np.ndarray], id_counts: Mapping[str, IdCounts]
                          ) -> List[StepCounts]:
    """`count_steps` with numpy: the core's own counter per table, one sort for every step's hottest ids."""
    layout = layout_of(model)
    chips = model.topology.num_chips
    out = []
    for global_ids, hottest in zip(steps, hottest_per_table_steps(model, steps)):
        cells = core_table_counts(global_ids, model, one_chip)
        freq = relabelled_stack_counts(model, global_ids, frequency_ids) if frequency_ids else None
        valency = {f.name: _valency(global_ids[f.name], f.samples_per_example, f.examples * chips)
                   for f in model.features}
        lookups = {f.name: int(global_ids[f.name].ids.size) for f in model.features}
        out.append(StepCounts(cells, stack_counts(layout, cells), freq, hottest, valency, lookups))
    for t in model.tables:
        ids = [s[f.name].ids for s in steps for f in model.table_features(t.name)]
        id_counts[t.name].add(np.concatenate(ids) if ids else np.zeros(0, np.int64))
    return out
