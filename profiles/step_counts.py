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
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

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
# The kernel's memory follows the vocabularies: a scratch slot of 16 bytes per row of the largest table (one per
# thread) and a dense id count of 8 bytes per row of every table. Models within these limits (64 MB of scratch,
# 128 MB of counts) are counted natively; a larger one by numpy, whose memory follows the ids looked up.
NATIVE_MAX_TABLE_ROWS = 1 << 22
NATIVE_MAX_MODEL_ROWS = 1 << 24


def native_available() -> bool:
    """Whether the extension is loaded (`native_counts` also says whether a model is within its limits)."""
    return _native is not None


@dataclasses.dataclass(frozen=True)
class StepCounts:
    """One step's statistics, dense over the main topology's cells (cell (chip * nsc + local SC) * S +
    destination, as `CellCounts.cells`).

    `table_ids`, `table_unique`: [tables, cells] (the model's tables in order), each table laid out alone
    (`core_table_counts`); `stack_ids`, `stack_unique`: [stacks, cells] (the layout's stacks in order,
    `stack_counts`); `frequency_stack_ids`, `frequency_stack_unique`: the stacks with the balanced tables'
    frequency-order ids (`relabelled_stack_counts`), or None without frequency ids; `hottest`: [tables], each
    table's hottest id's lookups; `valency`: per feature, histogram[k] = examples with k ids; `lookups`: per
    feature, its ids."""

    table_ids: np.ndarray
    table_unique: np.ndarray
    stack_ids: np.ndarray
    stack_unique: np.ndarray
    frequency_stack_ids: Optional[np.ndarray]
    frequency_stack_unique: Optional[np.ndarray]
    hottest: np.ndarray
    valency: Dict[str, np.ndarray]
    lookups: Dict[str, int]


def count_steps(model: ModelConfig, one_chip: ModelConfig, steps: Sequence[Mapping[str, FeatureIds]],
                frequency_ids: Mapping[str, np.ndarray], id_counts: Mapping[str, IdCounts]) -> List[StepCounts]:
    """`StepCounts` of each of `steps` ({feature: FeatureIds with global rows}, ids checked to be in their
    table), and every raw lookup added to `id_counts[table]`. `one_chip`: `counting.one_chip_model(model)`.
    `frequency_ids`: {table: frequency-order id of each id} of balanced tables (empty: none).

    A step may also say what its rows are made from, `example_lengths(feature) -> (ids per example, ids,
    sequence length)` (as `pipelines.sharding.batches.GlobalIds` does): the kernel then counts from those."""
    if _native is None or not native_counts(model):
        return count_steps_reference(model, one_chip, steps, frequency_ids, id_counts)
    inputs = [_kernel_inputs(model, s) for s in steps]
    if any(i is None for i in inputs):
        return count_steps_reference(model, one_chip, steps, frequency_ids, id_counts)
    return [_count_step_native(model, s, i, frequency_ids, id_counts)  # type: ignore[arg-type]
            for s, i in zip(steps, inputs)]


def native_counts(model: ModelConfig) -> bool:
    """Whether `count_steps` counts `model`'s steps natively (the extension is there, the tables within the
    kernel's memory limits)."""
    rows = [t.vocabulary_size for t in model.tables]
    return _native is not None and max(rows, default=0) <= NATIVE_MAX_TABLE_ROWS and sum(rows) <= NATIVE_MAX_MODEL_ROWS


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


def stack_cells(model: ModelConfig, table_cells: np.ndarray) -> np.ndarray:
    """[stacks, cells] of [tables, cells]: each member's cells rolled by its rotation (destination d to
    (d + rotation) mod S), summed per stack (`counting.stack_counts`, dense)."""
    plan = _stacking(model)
    if table_cells.shape[1] != plan.num_cells:
        raise ValueError(f"table cells of shape {table_cells.shape}: expected (tables, {plan.num_cells})")
    # One gather takes every table's cells rolled, the tables in stack order; one reduceat sums each stack's.
    return np.add.reduceat(table_cells.reshape(-1)[plan.gather], plan.first_member, axis=0)


@dataclasses.dataclass(frozen=True)
class _Stacking:
    num_cells: int
    gather: np.ndarray  # [tables, cells]: flat indices of the tables' rolled cells, the tables in stack order
    first_member: np.ndarray  # [stacks]: each stack's first row of `gather`


_stackings: Dict[int, Tuple[ModelConfig, _Stacking]] = {}


def _stacking(model: ModelConfig) -> _Stacking:
    got = _stackings.get(id(model))
    if got is not None and got[0] is model:
        return got[1]
    layout = layout_of(model)
    topo = model.topology
    S = topo.num_sparse_cores
    num_cells = topo.num_chips * topo.num_sc_per_chip * S
    stacks = list(layout.stacks)
    stack_of = np.array([stacks.index(layout.tables[t.name].stack) for t in model.tables], np.int64)
    rot = np.array([layout.tables[t.name].rotation for t in model.tables], np.int64)
    order = np.argsort(stack_of, kind="stable")
    # rolled[t, c * S + d] = cells[t, c * S + (d - rotation[t]) mod S]
    cell = np.arange(num_cells)
    source = (cell // S * S)[None, :] + ((cell % S)[None, :] - rot[:, None]) % S
    gather = (np.arange(len(rot))[:, None] * num_cells + source)[order]
    first = np.searchsorted(stack_of[order], np.arange(len(stacks)))
    plan = _Stacking(num_cells, gather, first)
    if len(_stackings) >= 32:  # a process profiles a few models: keep the cache small
        _stackings.clear()
    _stackings[id(model)] = (model, plan)
    return plan


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
    T, num_cells = len(model.tables), chips * nsc * S
    tables = [([inputs[f.name] for f in model.table_features(t.name)], t.vocabulary_size,
               id_counts[t.name].counting_array(t.vocabulary_size), frequency_ids.get(t.name))
              for t in model.tables]
    ids, unique = np.zeros((T, num_cells), np.int64), np.zeros((T, num_cells), np.int64)
    freq_ids, freq_unique = (np.zeros_like(ids), np.zeros_like(ids)) if frequency_ids else (None, None)
    features = [f for t in model.tables for f in model.table_features(t.name)]
    hist = np.zeros((len(features), HISTOGRAM_SIZE), np.int64)
    hottest, overflowed = _native.count_step(tables, S, chips * nsc, _scratch_for(max(t[1] for t in tables)),
                                             ids, unique, freq_ids, freq_unique, hist, HISTOGRAM_SIZE)
    valency = {f.name: hist[i] for i, f in enumerate(features)}
    for i in overflowed:
        f = features[i]
        valency[f.name] = _valency(global_ids[f.name], f.samples_per_example, f.examples * chips)
    frequency: Tuple[Optional[np.ndarray], Optional[np.ndarray]] = (None, None)
    if freq_ids is not None and freq_unique is not None:
        frequency = (stack_cells(model, freq_ids), stack_cells(model, freq_unique))
    return StepCounts(table_ids=ids, table_unique=unique, stack_ids=stack_cells(model, ids),
                      stack_unique=stack_cells(model, unique), frequency_stack_ids=frequency[0],
                      frequency_stack_unique=frequency[1], hottest=np.asarray(hottest, np.int64), valency=valency,
                      lookups={name: int(i[1].size) for name, i in inputs.items()})


# ---------------------------------------------------------------- reference

def _valency(fid: FeatureIds, samples_per_example: int, examples: int) -> np.ndarray:
    """histogram[k] = examples of the step with k ids (before equal pairs are merged)."""
    return np.bincount(np.bincount(fid.rows // samples_per_example, minlength=examples))


def _dense(counts: Sequence[CellCounts]) -> Tuple[np.ndarray, np.ndarray]:
    ids, unique = zip(*(c.dense() for c in counts))
    return np.stack([a.reshape(-1) for a in ids]), np.stack([a.reshape(-1) for a in unique])


def count_steps_reference(model: ModelConfig, one_chip: ModelConfig, steps: Sequence[Mapping[str, FeatureIds]],
                          frequency_ids: Mapping[str, np.ndarray], id_counts: Mapping[str, IdCounts]
                          ) -> List[StepCounts]:
    """`count_steps` with numpy: the core's own counter per table, `stack_counts` of its counts, one sort for
    every step's hottest ids."""
    layout = layout_of(model)
    chips = model.topology.num_chips
    out = []
    for global_ids, hottest in zip(steps, hottest_per_table_steps(model, steps)):
        cells = core_table_counts(global_ids, model, one_chip)
        stacked = stack_counts(layout, cells)
        freq = relabelled_stack_counts(model, global_ids, frequency_ids) if frequency_ids else None
        valency = {f.name: _valency(global_ids[f.name], f.samples_per_example, f.examples * chips)
                   for f in model.features}
        lookups = {f.name: int(global_ids[f.name].ids.size) for f in model.features}
        table_ids, table_unique = _dense([cells[t.name] for t in model.tables])
        stack_ids, stack_unique = _dense([stacked[n] for n in layout.stacks])
        freq_ids, freq_unique = _dense([freq[n] for n in layout.stacks]) if freq is not None else (None, None)
        out.append(StepCounts(table_ids=table_ids, table_unique=table_unique, stack_ids=stack_ids,
                              stack_unique=stack_unique, frequency_stack_ids=freq_ids,
                              frequency_stack_unique=freq_unique,
                              hottest=np.array([hottest[t.name] for t in model.tables], np.int64), valency=valency,
                              lookups=lookups))
    for t in model.tables:
        ids = [s[f.name].ids for s in steps for f in model.table_features(t.name)]
        id_counts[t.name].add(np.concatenate(ids) if ids else np.zeros(0, np.int64))
    return out
