"""The jobs' counters: sums, and the `max/` counters (the jax stacks' static sizes) kept as maxima."""

from pipelines.jobs.counters import MAX_PREFIX, SumCounters
from tpu_embed.artifact import jax_records as records


def test_sum_counters_sums_and_keeps_maxima_across_bundles():
    k = records.max_counter(0, "coo_buffer_size_per_device")
    assert k.startswith(MAX_PREFIX)
    fn = SumCounters()
    a = fn.add_input(fn.add_input(fn.create_accumulator(), {"steps": 1, k: 64}), {"steps": 1, k: 32})
    b = fn.add_input(fn.create_accumulator(), {"steps": 2, k: 48, "ids": 5})
    got = fn.extract_output(fn.merge_accumulators([a, b]))
    assert dict(got) == {"ids": 5, "steps": 4, k: 64}
    fmt = {"stacks": [{"name": "s0", "coo_buffer_size_per_device": None}, {"name": "s1"}]}
    out = records.with_static_sizes(fmt, dict(got))
    assert out["stacks"][0]["coo_buffer_size_per_device"] == 64 and "coo_buffer_size_per_device" not in out["stacks"][1]
    assert fmt["stacks"][0]["coo_buffer_size_per_device"] is None  # the input is left as it was
