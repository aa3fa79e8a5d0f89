"""Estimate: what each limit option means on the profiled data.

From exact histograms of every partition's count over every step:
`ids_over_limit = sum over v > L of (v - L) * #partitions(v)`.  But TF does
not drop those: its host preprocessing raises on a step where a partition
exceeds max_ids_per_table / max_unique_ids_per_table, even with
allow_id_dropping (checked against TF 2.20's kernels).  So partition figures
are reported as the fraction of steps that would fail.

What TF does drop (allow_id_dropping=True) is what does not fit the chip's id
buffer, `max_ids_per_chip_per_sample * samples` slots holding every
(local SC, destination SC) segment padded to 8.  From the histogram of every
chip's need at every step: the (chip, step) pairs over the capacity are
exactly those that drop ids (capacity and segment starts are multiples of
8), and the slots short bound the ids dropped from above (the difference is
the padding of dropped segments).  For max-based limits both are zero.

Memory is a documented *model* (SCHEMA.md, "Memory model"), not a TPU
measurement: per SparseCore and stack,
  partition staging = max_ids_per_table * 12 B (token id, sample id, gain)
                    + max_unique_ids_per_table * padded_dim * 4 B (gathered rows)
  CSR input buffer  = max_ids_per_chip_per_sample * samples per chip * 12 B / SCs per chip
The point is the comparison with TF's defaults under the same model.
"""

from __future__ import annotations

from profiles.planner.types import Estimate, LimitOption, StackFigures

ID_ENTRY_BYTES = 12  # int32 token id + int32 sample id + float32 gain
ROW_ELEMENT_BYTES = 4  # float32 embedding element


def staging_bytes(max_ids: int, max_unique: int, padded_dim: int) -> int:
    """Partition staging per SparseCore of one stack (the memory model above)."""
    return max_ids * ID_ENTRY_BYTES + max_unique * padded_dim * ROW_ELEMENT_BYTES


def csr_buffer_bytes(max_ids_per_chip_per_sample: int, sample_count: int, num_sc_per_chip: int) -> int:
    """CSR input buffer per SparseCore of one stack (the memory model above)."""
    return max_ids_per_chip_per_sample * sample_count * ID_ENTRY_BYTES // num_sc_per_chip


def partition_bytes_per_sc(fig: StackFigures, max_ids: int, max_unique: int) -> int:
    return staging_bytes(max_ids, max_unique, fig.spec.padded_dim)


def csr_buffer_bytes_per_sc(fig: StackFigures, max_ids_per_chip_per_sample: int) -> int:
    return csr_buffer_bytes(max_ids_per_chip_per_sample, fig.spec.sample_count, fig.global_config.num_sc_per_chip)


def estimate(fig: StackFigures, option: LimitOption, max_ids_per_chip_per_sample: int) -> Estimate:
    L, U = option.max_ids_per_table, option.max_unique_ids_per_table
    steps = max(fig.steps, 1)
    cap = max_ids_per_chip_per_sample * fig.spec.sample_count
    chip_steps = max(fig.chip_buffer.total, 1)
    short = fig.chip_buffer.excess_over(cap)
    return Estimate(
        option=option, max_ids_per_chip_per_sample=max_ids_per_chip_per_sample,
        ids_over_limit=fig.cell_ids.excess_over(L), unique_ids_over_limit=fig.cell_unique_ids.excess_over(U),
        steps_over_max_ids=fig.step_max_ids.count_over(L) / steps,
        steps_over_max_unique_ids=fig.step_max_unique_ids.count_over(U) / steps,
        buffer_capacity_slots=cap,
        steps_over_buffer=fig.step_max_chip_buffer.count_over(cap) / steps,
        chip_steps_over_buffer=fig.chip_buffer.count_over(cap) / chip_steps,
        ids_dropped_at_most=short, drop_rate_at_most=short / fig.ids if fig.ids else 0.0,
        partition_bytes_per_sc=partition_bytes_per_sc(fig, L, U),
        buffer_bytes_per_sc=csr_buffer_bytes_per_sc(fig, max_ids_per_chip_per_sample),
        exact=fig.exact)
