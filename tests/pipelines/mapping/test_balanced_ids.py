"""Balanced ids for a spec's vocabularies (`pipelines.mapping.balanced_ids`), over random vocabularies and
stackings: a bijection onto [0, V) per vocabulary, the OOV ids where frequency order has them, a base's ids kept
under append (and everything under frozen), capacities kept, and the stacks balanced as the layout stacks them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.mapping import balanced_ids
from pipelines.mapping import vocabulary as pvocab
from tpu_embed.artifact.spec import parse_spec
from tpu_embed.sparsecore.balance import destination_loads

TOKEN = st.binary(min_size=1, max_size=4).filter(lambda b: b"\n" not in b and b"\r" not in b)


def counts_table(counts: dict) -> pa.Table:
    return pa.table({"token": pa.array(list(counts), pa.large_binary()),
                     "count": pa.array(list(counts.values()), pa.int64())})


@st.composite
def specs(draw, modes=("rebuild",)):
    """A spec of 1-5 frequency tables (two or three dims: one or more stacks), maybe an identity table, on a random
    topology and layout, with random vocabulary options."""
    chips = draw(st.sampled_from([1, 2, 4]))
    nsc = draw(st.sampled_from([2, 4]))
    cats, tables = [], []
    for i in range(draw(st.integers(1, 5))):
        mode = draw(st.sampled_from(modes))
        v = {"type": "frequency", "num_oov_buckets": draw(st.integers(0, 3)),
             "top_k": draw(st.one_of(st.none(), st.integers(1, 30))),
             "frequency_threshold": draw(st.one_of(st.none(), st.integers(1, 3)))}
        if mode != "rebuild":
            v["mode"] = mode
            if draw(st.booleans()):
                v["capacity"] = 40
                v["top_k"] = None
        cats.append({"name": f"f{i}", "vocabulary": v})
        tables.append({"name": f"f{i}", "dim": draw(st.sampled_from([8, 16, 24]))})
    if draw(st.booleans()):
        cats.append({"name": "ident", "vocabulary": {"type": "identity", "num_buckets": 50}})
        tables.append({"name": "ident", "dim": 8})
    return parse_spec({
        "inputs": {"format": "csv", "patterns": ["x.csv"]}, "categorical": cats, "tables": tables,
        "optimizer": {"type": "sgd", "learning_rate": 0.1},
        "topology": {"num_chips": chips, "num_sc_per_chip": nsc}, "global_batch_size": 8 * chips * nsc,
        "shards": {"layout": draw(st.sampled_from(["tensorflow", "jax", "both"]))},
        "partition": {"ids": "balanced"}})


def counts_for(draw, spec):
    return {k: draw(st.dictionaries(TOKEN, st.integers(1, 400), max_size=30)) for k in spec.vocabulary_groups()}


def check_numbered(spec, key, d, a, numbered):
    """What every balanced vocabulary keeps of its draft."""
    n = len(d.tokens)
    assert sorted(numbered.tokens) == sorted(d.tokens)  # the same tokens ...
    assert sorted(a.ids.tolist()) == list(range(n))  # ... onto [0, V): a bijection
    assert [numbered.tokens[i] for i in range(n)] == [d.tokens[j] for j in numbered.frequency_ids.tolist()]
    # Ids a base gave keep their place; the draft's size (the first OOV id) is the size written.
    assert numbered.tokens[:d.first_free] == d.tokens[:d.first_free]
    return numbered


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_rebuilt_vocabularies_are_permutations_with_their_oov_ids_in_place(data):
    spec = data.draw(specs())
    counts = counts_for(data.draw, spec)
    drafts = {k: balanced_ids.draft(spec, k, counts_table(c)) for k, c in counts.items()}
    assignment = balanced_ids.assign(spec, {k: d.without_tokens() for k, d in drafts.items()})
    assert set(assignment) == set(drafts)
    for key, d in drafts.items():
        v = spec.vocabulary_groups()[key][0].vocabulary
        tokens, _, _ = pvocab.finalize(counts_table(counts[key]), v.top_k, v.frequency_threshold)
        assert d.tokens == tokens  # the draft is frequency order
        numbered = check_numbered(spec, key, d, assignment[key], balanced_ids.apply(d, assignment[key]))
        # OOV ids: V + bucket, V the vocabulary's size, the same as frequency order's.
        assert d.size == max(1, len(tokens))
        info = assignment[key].info
        assert info["order"] == "balanced" and info["num_sparse_cores"] == spec.topology.num_sparse_cores
        assert info["layout"] == ("jax" if spec.shards.layout == "jax" else "tensorflow")
        assert numbered.table is None


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_append_keeps_every_id_of_its_base_and_frozen_keeps_the_vocabulary(data):
    spec = data.draw(specs(modes=("append", "frozen")))
    day1 = counts_for(data.draw, spec)
    drafts1 = {k: balanced_ids.draft(spec, k, counts_table(c), None, 1) for k, c in day1.items()}
    a1 = balanced_ids.assign(spec, {k: d.without_tokens() for k, d in drafts1.items()})
    base = {k: balanced_ids.apply(d, a1[k]) for k, d in drafts1.items()}
    day2 = counts_for(data.draw, spec)
    drafts2 = {k: balanced_ids.draft(spec, k, counts_table(c), base[k].table, 2) for k, c in day2.items()}
    a2 = balanced_ids.assign(spec, {k: d.without_tokens() for k, d in drafts2.items()})
    for key, d in drafts2.items():
        v = spec.vocabulary_groups()[key][0].vocabulary
        numbered = check_numbered(spec, key, d, a2[key], balanced_ids.apply(d, a2[key]))
        before = base[key].tokens
        assert numbered.tokens[:len(before)] == before  # every token of the base keeps its id
        if v.mode == "frozen":
            assert numbered.tokens == before
        if v.capacity is not None:
            assert d.size == v.capacity  # OOV ids after the capacity, day after day
        t = numbered.table  # the token counts: the vocabulary first, in id order
        assert t.column("token").to_pylist()[:len(numbered.tokens)] == numbered.tokens
        ids = t.column("id").to_numpy()
        assert (ids[:len(numbered.tokens)] == np.arange(len(numbered.tokens))).all() and (
            ids[len(numbered.tokens):] == -1).all()


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_each_vocabulary_is_balanced_in_the_stack_and_rotation_of_the_layout_written(data):
    """The record names the stack and rotation the written layout gives the table (TF's stacking; jax's for
    `shards.layout: jax`), and the loads of each stack are the greedy's on exactly those members and rotations."""
    from tpu_embed.sparsecore.balance import assign_ids
    from tpu_embed.sparsecore.jax_layout import jax_layout
    spec = data.draw(specs())
    counts = counts_for(data.draw, spec)
    drafts = {k: balanced_ids.draft(spec, k, counts_table(c)) for k, c in counts.items()}
    assignment = balanced_ids.assign(spec, drafts)
    sizes = {k: d.size for k, d in drafts.items()}
    if spec.shards.layout == "jax":
        where = {t.name: (s.name, t.shard_rotation) for s in jax_layout(spec.model(sizes)).stacks for t in s.tables}
    else:
        layout = spec.layout(sizes)
        where = {t: (p.stack, p.rotation) for t, p in layout.tables.items()}
    S = spec.topology.num_sparse_cores
    for stack in {name for name, _ in where.values()}:
        members = [t for t, (name, _) in where.items() if name == stack and t in drafts]
        for t in members:
            assert (assignment[t].info["stack"], assignment[t].info["rotation"]) == where[t]
        demands = [balanced_ids._demand(drafts[t], t, where[t][1]) for t in members]
        ids = {t: assignment[t].ids[drafts[t].first_free:] for t in members}
        greedy = assign_ids(demands, S)
        np.testing.assert_array_equal(destination_loads(demands, ids, S), destination_loads(demands, greedy, S))


def test_fixed_tables_count_where_their_ids_are():
    spec = parse_spec({
        "inputs": {"format": "csv", "patterns": ["x.csv"]},
        "categorical": [{"name": "a", "vocabulary": {"type": "frequency"}},
                        {"name": "u", "vocabulary": {"type": "identity", "num_buckets": 10, "default_value": 0}},
                        {"name": "h", "vocabulary": {"type": "hashing", "num_buckets": 7}}],
        "tables": [{"name": n, "dim": 8} for n in "auh"], "optimizer": {"type": "sgd", "learning_rate": 0.1},
        "topology": {"num_chips": 1, "num_sc_per_chip": 4}, "global_batch_size": 8,
        "partition": {"ids": "balanced"}})
    assert set(balanced_ids.fixed_tables(spec)) == {"u", "h"}
    ids, n = balanced_ids.fixed_table_ids(spec, "u", counts_table({b"3": 5, b"x": 2, b"12": 1, b"0": 4}))
    assert ids.tolist() == [0, 3] and n.tolist() == [2 + 1 + 4, 5]  # invalid values to the default value 0
    from pipelines.mapping.ids import fingerprint64_buckets
    ids, n = balanced_ids.fixed_table_ids(spec, "h", counts_table({b"p": 3, b"q": 1}))
    want: dict = {}
    for bucket, c in zip(fingerprint64_buckets(pa.array([b"p", b"q"], pa.large_binary()), 7).tolist(), (3, 1)):
        want[bucket] = want.get(bucket, 0) + c
    assert dict(zip(ids.tolist(), n.tolist())) == want
    # One stack (a, h, u; 1 chip: every rotation 0). A hot identity id on destination 0: the frequency tokens
    # fill the other destinations first, and only a's coldest tokens share destination 0 (two ids each).
    draft = balanced_ids.draft(spec, "a", counts_table({b"t%d" % i: c for i, c in enumerate([50, 40, 30, 20, 10, 5,
                                                                                              1, 1])}))
    a = balanced_ids.assign(spec, {"a": draft}, {"u": (np.array([0]), np.array([1000]))})["a"]
    assert a.info["stack"] == "a_h_u" and a.info["rotation"] == 0
    on_zero = sorted(np.asarray(draft.counts)[a.ids % 4 == 0].tolist())
    assert on_zero == [1, 1]


def test_the_tft_engine_is_refused_in_one_line():
    import pytest

    from pipelines.jobs.compute_vocabulary import ComputeVocabulary
    from pipelines.user_errors import UserError
    spec = parse_spec({"inputs": {"format": "csv", "patterns": ["x.csv"]}, "categorical": ["a"],
                       "tables": [{"name": "a", "dim": 8}], "optimizer": {"type": "sgd", "learning_rate": 0.1},
                       "global_batch_size": 8, "partition": {"ids": "balanced"}})
    with pytest.raises(UserError, match=r"`partition: \{ids: balanced\}` needs the combine engine"):
        ComputeVocabulary(spec, "out", engine="tft")
