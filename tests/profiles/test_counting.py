"""Partition counts: stacks from tables by roll-and-sum, and the vectorised candidate counter,
both against the core's own `partition_counts` on the real layouts."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from profiles import synthetic
from profiles.counting import candidate_table_counts, core_table_counts, dedup_table, stack_counts
from profiles.units import rescaled
from tpu_embed.core.model import from_tf_feature_config
from tpu_embed.core.topology import Topology
from tpu_embed.sparsecore import layout_of, partition_counts, split_global_batch


def _core_stack_counts(global_ids, layout):
    """Dense [chips, nsc, S] per stack, straight from the core on the real (stacked) layout."""
    out = {}
    for ids in split_global_batch(global_ids, layout):
        for name, (i, u) in partition_counts(ids, layout).items():
            out.setdefault(name, ([], []))
            out[name][0].append(i)
            out[name][1].append(u)
    return {k: (np.stack(a), np.stack(b)) for k, (a, b) in out.items()}


@st.composite
def configs(draw):
    n_tables = draw(st.integers(1, 5))
    chips = draw(st.sampled_from([1, 2, 4, 8]))
    nsc = draw(st.sampled_from([1, 2, 4]))
    batch = nsc * draw(st.integers(1, 4)) * 2
    vocab = [draw(st.sampled_from([3, 17, 100, 1000, 70000])) for _ in range(n_tables)]
    seq = {draw(st.integers(0, n_tables - 1)): draw(st.integers(2, 3))} if draw(st.booleans()) else None
    fc = synthetic.feature_config(n_tables, per_chip_batch=batch, vocab_sizes=vocab, dims=[8, 8, 16],
                                  shared=draw(st.integers(0, 2)), sequence=seq)
    seed = draw(st.integers(0, 2**31))
    zipf = draw(st.sampled_from([1.05, 1.3, 2.0]))
    return fc, Topology(chips, nsc), seed, zipf


def _model_and_batch(cfg):
    fc, topo, seed, zipf = cfg
    model = from_tf_feature_config(fc, topo)
    return model, synthetic.global_batch(fc, topo.num_chips, np.random.default_rng(seed), zipf_a=zipf)


def _assert_dense_equal(counts, ids, uniq, name):
    got_ids, got_uniq = counts.dense()
    np.testing.assert_array_equal(got_ids, ids, err_msg=name)
    np.testing.assert_array_equal(got_uniq, uniq, err_msg=name)


@settings(max_examples=40)
@given(configs())
def test_stacks_from_tables_equal_core_on_stacked_layout(cfg):
    model, batch = _model_and_batch(cfg)
    tables = core_table_counts(batch, model)
    derived = stack_counts(layout_of(model), tables)
    expected = _core_stack_counts(batch, layout_of(model))
    assert set(derived) == set(expected)
    for name, (ids, uniq) in expected.items():
        _assert_dense_equal(derived[name], ids, uniq, name)


@settings(max_examples=40)
@given(configs())
def test_one_chip_count_equals_core_chip_by_chip(cfg):
    """Per table, the one-chip count (all S SparseCores local) equals the core run chip by chip."""
    model, batch = _model_and_batch(cfg)
    unstacked = layout_of(model, disable_table_stacking=True)
    expected = _core_stack_counts(batch, unstacked)
    got = core_table_counts(batch, model)
    assert set(got) == {unstacked.stacks[s].tables[0] for s in expected}
    for stack, (ids, uniq) in expected.items():
        table, = unstacked.stacks[stack].tables
        _assert_dense_equal(got[table], ids, uniq, table)


@settings(max_examples=40)
@given(configs(), st.sampled_from([1, 2, 4, 8, 16]))
def test_candidate_counter_equals_core(cfg, chips):
    model, batch = _model_and_batch(cfg)
    try:
        cand = rescaled(model, chips)
    except ValueError:
        return
    core = core_table_counts(batch, cand)
    for t in model.tables:
        got = candidate_table_counts(cand, t.name, dedup_table(model, t.name, batch))
        want = core[t.name]
        np.testing.assert_array_equal(got.cells, want.cells)
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_array_equal(got.unique, want.unique)


def test_feature_config_with_list_paths_round_trips():
    """List-structured feature configs: paths '0'..'11' keep their list order (not the text order) in the model."""
    fc = synthetic.feature_config(12, per_chip_batch=8)
    as_list = [fc[k] for k in sorted(fc)]
    model = from_tf_feature_config(as_list, Topology(2, 4))
    rebuilt = layout_of(model)
    from tpu_embed.sparsecore import stack_tables
    orig = stack_tables(as_list, Topology(2, 4))
    assert [(f.path, f.sample_offset, f.stack) for f in rebuilt.features] == \
        [(f.path, f.sample_offset, f.stack) for f in orig.features]
