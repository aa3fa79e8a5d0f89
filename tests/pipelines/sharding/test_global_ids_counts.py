"""The shard job hands a step's ids to its profile as `batches.GlobalIds` (ids per example; rows made when read).
The native step counts count from the ids per example without making the rows (`GlobalIds.example_lengths`):
the same statistics as the numpy reference counts from the rows (tests/profiles/test_step_counts.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.sharding.batches import GlobalIds
from tests.helpers import native
from tests.profiles.test_counting import _model_and_batch, configs
from tests.profiles.test_step_counts import _both, _frequency_ids, _plain


def _global_ids(model, rng, chips) -> GlobalIds:
    feats = {}
    for f in model.features:
        examples = f.examples * chips
        longest = f.samples_per_example if f.samples_per_example > 1 else 4
        lengths = rng.integers(0, longest + 1, examples).astype(np.int64)
        ids = (rng.zipf(1.3, int(lengths.sum())) % f.table.vocabulary_size).astype(np.int64)
        feats[f.name] = (lengths, ids, None, f.samples_per_example if f.samples_per_example > 1 else 0)
    return GlobalIds(feats)


@settings(max_examples=40, deadline=None)
@given(configs(), st.integers(1, 3), st.booleans())
def test_steps_given_as_ids_per_example_are_counted_as_their_rows(cfg, n_steps, balanced):
    native.require("step_counts")
    model, _ = _model_and_batch(cfg)
    _, topo, seed, _ = cfg
    rng = np.random.default_rng(seed)
    steps = [_global_ids(model, rng, topo.num_chips) for _ in range(n_steps)]
    got, want, counts = _both(model, steps, _frequency_ids(model, rng) if balanced else {})
    assert [_plain(s) for s in got] == [_plain(s) for s in want]
    assert counts[0] == counts[1]


def test_lengths_that_do_not_add_up_to_the_ids_are_refused():
    from profiles import step_counts
    from profiles.counting import one_chip_model
    from profiles.idcounts import IdCounts
    from tests.profiles.test_step_counts import _one_feature

    native.require("step_counts")
    model, _ = _one_feature([0], [0])
    f = model.features[0]
    examples = f.examples * model.topology.num_chips
    for lengths in ([1] * examples, [3] + [0] * (examples - 1), [-1, 2] + [0] * (examples - 2)):
        step = GlobalIds({f.name: (np.asarray(lengths, np.int64), np.zeros(2, np.int64), None, 0)})
        with pytest.raises(ValueError, match="the lengths of feature 0 do not add up to its 2 ids"):
            step_counts.count_steps(model, one_chip_model(model), [step], {}, {model.tables[0].name: IdCounts()})
