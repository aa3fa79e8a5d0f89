"""Plain data shared by the CSR packers: the output batch (`CsrBatch`), buffer sizes, per-stack limits."""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional

import numpy as np

from tpu_embed.core.topology import Topology
from tpu_embed.sparsecore.layout import SparseCoreLayout, StackLayout
from tpu_embed.sparsecore.padding import XLA_PAD, round_up

MAX_MINIBATCHES_PER_SC = 64  # TPUEmbeddingV2.max_minibatches_per_sc sizes row_pointers
DEFAULT_MAX_IDS_PER_TABLE = 256  # TPUEmbeddingV2.DEFAULT_MAX_IDS_PER_TABLE
DEFAULT_MAX_UNIQUE_IDS_PER_TABLE = 256
DEFAULT_MAX_IDS_PER_CHIP_PER_SAMPLE = 64


class LimitExceededError(ValueError):
    """A batch does not fit the configured SparseCore limits."""


@dataclasses.dataclass
class CsrBatch:
    """One stacked table's SparseCore input for one chip, as TF's enqueue builds it.

    `row_pointers`, `sorted_sample_ids`, `sorted_token_ids` and `sorted_gains`
    hold exactly the meaningful prefixes TF produces (`row_pointers_unpadded_size`
    and `ids_unpadded_size` long); TF's static buffers are
    `row_pointers_buffer_size` / `ids_buffer_size` long and `full_buffers()` /
    `to_partitioned_csr()` restore them.  Keeping only the prefixes keeps the
    shard job from touching megabytes of padding per batch.
    """

    stack: str
    row_pointers: np.ndarray  # int32
    sorted_sample_ids: np.ndarray  # int32
    sorted_token_ids: np.ndarray  # int32
    sorted_gains: np.ndarray  # float32
    sample_count: int
    num_minibatches_per_physical_sparse_core: int
    row_pointers_unpadded_size: int
    ids_unpadded_size: int
    row_pointers_buffer_size: int
    ids_buffer_size: int
    dropped_ids: int = 0  # ids cut off by allow_id_dropping (counted, never silent)
    # Per (local SparseCore, destination SparseCore): ids and unique ids after
    # dedup, before any dropping; what TF's stats op maximises over.
    ids_per_partition: Optional[np.ndarray] = None
    unique_ids_per_partition: Optional[np.ndarray] = None

    def prefixes(self) -> Dict[str, np.ndarray]:
        n, r = self.ids_unpadded_size, self.row_pointers_unpadded_size
        return {
            "row_pointers": self.row_pointers[:r],
            "sorted_sample_ids": self.sorted_sample_ids[:n],
            "sorted_token_ids": self.sorted_token_ids[:n],
            "sorted_gains": self.sorted_gains[:n],
        }

    def full_buffers(self) -> Dict[str, np.ndarray]:
        """TF's static-size buffers (tails zero, where TF leaves uninitialised memory)."""
        out = {}
        for name, arr in self.prefixes().items():
            size = self.row_pointers_buffer_size if name == "row_pointers" else self.ids_buffer_size
            full = np.zeros(size, arr.dtype)
            full[:arr.size] = arr
            out[name] = full
        return out

    @property
    def max_ids_per_partition(self) -> int:
        p = self.ids_per_partition
        return int(p.max()) if p is not None and p.size else 0

    @property
    def max_unique_ids_per_partition(self) -> int:
        u = self.unique_ids_per_partition
        return int(u.max()) if u is not None and u.size else 0

    def to_partitioned_csr(self):
        """(PartitionedCsrFormatTensor, row_pointers_unpadded_size, ids_unpadded_size) for dequeue()."""
        import tensorflow as tf  # only the training side needs TensorFlow
        from tensorflow.python.tpu.tpu_embedding_v3 import PartitionedCsrFormatTensor
        full = self.full_buffers()
        return (
            PartitionedCsrFormatTensor(
                row_pointers=tf.constant(full["row_pointers"]),
                sorted_sample_ids=tf.constant(full["sorted_sample_ids"]),
                sorted_token_ids=tf.constant(full["sorted_token_ids"]),
                sorted_gains=tf.constant(full["sorted_gains"]),
                sample_count=self.sample_count,
                num_minibatches_per_physical_sparse_core=tf.constant(
                    self.num_minibatches_per_physical_sparse_core, tf.int32)),
            tf.constant(self.row_pointers_unpadded_size, tf.int32),
            tf.constant(self.ids_unpadded_size, tf.int32),
        )


@dataclasses.dataclass(frozen=True)
class BufferSizes:
    row_pointers: int
    ids: int


def buffer_sizes(stack: StackLayout, topology: Topology, max_ids_per_chip_per_sample: int) -> BufferSizes:
    ids = max_ids_per_chip_per_sample * stack.sample_count
    if ids % XLA_PAD:
        raise ValueError(
            f"Stack {stack.name!r}: the id buffer max_ids_per_chip_per_sample * samples = "
            f"{max_ids_per_chip_per_sample} * {stack.sample_count} = {ids} is not a multiple of 8, "
            "which SparseCore requires. Use a max_ids_per_chip_per_sample that is a multiple of 8.")
    rows = MAX_MINIBATCHES_PER_SC * topology.num_sc_per_chip * round_up(topology.num_sparse_cores, XLA_PAD)
    return BufferSizes(row_pointers=rows, ids=ids)


@dataclasses.dataclass(frozen=True)
class StackLimits:
    max_ids_per_partition: int
    max_unique_ids_per_partition: int
    max_ids_per_chip_per_sample: int
    allow_id_dropping: bool

    def check(self, stack: str, sc: int, ids, uniques):
        """Raises `LimitExceededError` if SparseCore `sc` sends more ids (`ids`, one count per destination
        SparseCore) or unique ids (`uniques`) to one SparseCore than the stack's limits allow."""
        for counts, what, option, limit in (
                (ids, "ids", "max_ids_per_table", self.max_ids_per_partition),
                (uniques, "unique ids", "max_unique_ids_per_table", self.max_unique_ids_per_partition)):
            counts = np.asarray(counts)
            if counts.size and int(counts.max()) > limit:
                most, dest = int(counts.max()), int(np.argmax(counts))
                raise LimitExceededError(
                    f"Stack {stack!r}: SparseCore {sc} of the chip sends {most} {what} to SparseCore {dest}, "
                    f"over {option}[{stack!r}] = {limit}. Raise {option}[{stack!r}] to at least {most} "
                    "(`tpu-embed plan` derives it from a profile of the data).")

    def check_buffer(self, stack: str, buffer_ids: int, total_after=None):
        if not self.allow_id_dropping:
            need = f" ({total_after} id slots needed with padding)" if total_after is not None else ""
            raise LimitExceededError(
                f"Stack {stack!r}: the chip's id buffer of {buffer_ids} entries "
                f"(max_ids_per_chip_per_sample = {self.max_ids_per_chip_per_sample}) cannot hold this batch"
                f"{need}. Raise max_ids_per_chip_per_sample, or set allow_id_dropping=True to truncate "
                "(every dropped id is counted in CsrBatch.dropped_ids).")


def stack_limits_of(layout: SparseCoreLayout, max_ids_per_table, max_unique_ids_per_table,
                   max_ids_per_chip_per_sample: int, allow_id_dropping: bool) -> Dict[str, StackLimits]:
    """`{stack: StackLimits}` of a layout from the limits `preprocess` takes (checked; missing stacks: TF's 256)."""
    stacks = list(layout.stacks)
    for what, d in (("max_ids_per_table", max_ids_per_table), ("max_unique_ids_per_table", max_unique_ids_per_table)):
        if d is None:
            continue
        unknown = sorted(set(d) - set(stacks))
        if unknown:
            raise ValueError(
                f"{what} has entries {unknown} that are not stacked tables. Limits are keyed by stacked "
                f"table name; this layout's stacks are {stacks}.")
        for k, v in d.items():
            if int(v) <= 0:
                raise ValueError(f"{what}[{k!r}] must be > 0, got {v}.")
    if int(max_ids_per_chip_per_sample) <= 0:
        raise ValueError(f"max_ids_per_chip_per_sample must be > 0, got {max_ids_per_chip_per_sample}.")
    return {
        s: StackLimits(
            max_ids_per_partition=int((max_ids_per_table or {}).get(s, DEFAULT_MAX_IDS_PER_TABLE)),
            max_unique_ids_per_partition=int((max_unique_ids_per_table or {}).get(s, DEFAULT_MAX_UNIQUE_IDS_PER_TABLE)),
            max_ids_per_chip_per_sample=int(max_ids_per_chip_per_sample),
            allow_id_dropping=bool(allow_id_dropping))
        for s in stacks
    }


# (layout, max_ids_per_table, max_unique_ids_per_table, per sample, dropping, the limits): the last call
_last_limits: Optional[tuple] = None


def stack_limits_remembered(layout: SparseCoreLayout, max_ids_per_table, max_unique_ids_per_table,
                            max_ids_per_chip_per_sample: int, allow_id_dropping: bool) -> Dict[str, StackLimits]:
    """`stack_limits_of`, remembered for the last layout and limits given: `preprocess` takes them with every batch.

    The limit dicts are kept as copies and compared by value, so one changed in place is read (and
    checked) again; the layout by identity (it is immutable)."""
    global _last_limits
    last = _last_limits
    if last is not None and last[0] is layout:
        try:
            if (last[3] == max_ids_per_chip_per_sample and last[4] == allow_id_dropping
                    and last[1] == max_ids_per_table and last[2] == max_unique_ids_per_table):
                return last[5]
        except (TypeError, ValueError):  # values whose comparison is not a bool (arrays): read them again
            pass
    result = stack_limits_of(layout, max_ids_per_table, max_unique_ids_per_table, max_ids_per_chip_per_sample,
                             allow_id_dropping)
    _last_limits = (layout, None if max_ids_per_table is None else dict(max_ids_per_table),
                    None if max_unique_ids_per_table is None else dict(max_unique_ids_per_table),
                    max_ids_per_chip_per_sample, allow_id_dropping, result)
    return result
