"""`parse_fn`: the `tf.data` map function of shard records (serialized record -> tensors, TF's buffer sizes).

Whatever the record's encoding (`tpu_embed.artifact.shard_format`: narrow ids, omitted unit gains,
omitted padding), the tensors are version 1's: each chip's CSR prefixes zero-padded to TF's static
buffer sizes, as `TPUEmbeddingV2.dequeue` takes them.  TensorFlow is imported when the function is
built; the helpers take the module as their `tf` argument.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Set, Tuple

import numpy as np

from tpu_embed.artifact.shard_format import ID_DTYPES, SIZES_FIELDS, V1_ENCODING, ShardFormat
from tpu_embed.sparsecore.padding import PAD_VALUE, XLA_PAD, round_up

LOOSE_IDS_PER_SAMPLE = 8  # an ids buffer above this many per sample is "loose" (see parse_fn)


def parse_fn(fmt: ShardFormat):
    """A `tf.data` map function: serialized record -> tensors, CSR buffers restored to full size.

    Built for few graph nodes (tf.data optimizes and instantiates the function for every iterator, at a
    cost that grows with its size) and few passes over the buffers:

    * one `ParseSingleExample` op (all required keys share one empty default);
    * the sizes of every chip and stack are checked against the buffers (one assert: `fixed_length`
      would silently cut a longer prefix), cast and split once;
    * a stack whose padding is stored is decoded for all chips at once: the chips' strings are stacked
      and one `decode_raw(..., fixed_length=buffer)` per array zero-pads every prefix to TF's static
      buffer size in the same copy, giving [chips, buffer] tensors that are widened (narrow ids), given
      their unit gains where those were omitted (no control flow: a select per chip), then unstacked;
      when the ids buffer is far larger than the data (over `LOOSE_IDS_PER_SAMPLE` ids per sample, e.g.
      TF's default limits) narrow ids and unit gains are made per chip on the stored prefix, then padded;
    * the stacks whose padding is omitted (small batches) are rebuilt together: row pointers from the
      partition counts, real entries scattered into buffers of PAD_VALUE (prefix) and zeros.
    """
    import tensorflow as tf  # TensorFlow boundary: the numpy side of the artifact imports without it

    keys = _record_keys(fmt)
    cells = keys.cells
    nsizes = len(SIZES_FIELDS)

    def parse(serialized):
        ex = _parse_example(tf, keys, serialized)
        out = _batch_tensors(tf, fmt, ex)
        chips: List[Dict[str, Any]] = [{} for _ in range(fmt.chips_per_host)]
        if not cells:
            out["sparse_core"] = tuple(chips)
            return out
        sizes_mat = _checked_sizes(tf, keys, ex)
        sizes = tf.unstack(tf.reshape(sizes_mat, [-1]))

        def sizes_of(i):
            return dict(zip(SIZES_FIELDS, sizes[i * nsizes:(i + 1) * nsizes]))

        for stack, members in keys.stored_groups:
            for i, d in zip(members, _decode_stored(tf, ex, cells, members, sizes_mat)):
                chips[cells[i][0]][stack] = {**d, **sizes_of(i)}
        for i, cell in enumerate(cells):
            if cell[1] in keys.loose:
                chips[cell[0]][cell[1]] = {**_decode_loose(tf, ex, cell), **sizes_of(i)}
        if keys.omitted:
            for i, d in zip(keys.omitted, _rebuild_padding(tf, ex, [cells[i] for i in keys.omitted],
                                                           tf.gather(sizes_mat[:, 1], keys.omitted))):
                chips[cells[i][0]][cells[i][1]] = {**d, **sizes_of(i)}
        out["sparse_core"] = tuple(chips)
        return out

    return parse


@dataclasses.dataclass(frozen=True)
class _RecordKeys:
    """Where a record of `fmt` keeps what: its feature keys and how each chip's stack is stored."""

    required: List[str]  # string keys every record has
    optional: List[str]  # string keys a record may leave out (omitted unit gains)
    cells: List[Tuple[Any, ...]]  # (chip, stack, row pointers buffer, ids buffer, encoding, {array: key})
    size_keys: List[str]
    omitted: List[int]  # the cells whose padding is omitted
    count_keys: List[str]  # their partition counts: int64 lists, read as sparse values
    loose: Set[str]  # stacks widened per chip on the stored prefix (see parse_fn)
    stored_groups: List[Tuple[str, List[int]]]  # the other stacks with stored padding: (stack, its cells)
    buffers: List[List[int]]  # per cell: [row pointers buffer, ids buffer]


def _record_keys(fmt: ShardFormat) -> _RecordKeys:
    required: List[str] = ["label", "mask", "dense"]
    for name, weighted, _ in fmt.tensor_core_features:
        required += [f"tc/{name}/lengths", f"tc/{name}/ids"] + ([f"tc/{name}/weights"] if weighted else [])
    optional: List[str] = []
    cells = []
    for c in range(fmt.chips_per_host):
        for stack, rp_buf, ids_buf in fmt.stacks:
            enc = fmt.encoding(stack)
            keys = {a: fmt.key(c, stack, a) for a in ("row_pointers", "counts", "sorted_sample_ids",
                                                      "sorted_token_ids", "sorted_gains", "sizes")}
            cells.append((c, stack, rp_buf, ids_buf, enc, keys))
            required += ([] if enc.padding == "omitted" else [keys["row_pointers"]]) + [
                keys["sorted_sample_ids"], keys["sorted_token_ids"]]
            (optional if enc.gains == "omitted_if_unit" else required).append(keys["sorted_gains"])
    omitted = [i for i, cell in enumerate(cells) if cell[4].padding == "omitted"]
    samples = dict(fmt.samples)
    # Narrow ids or omitted gains in an ids buffer much larger than the data (e.g. TF's default limits):
    # widened per chip on the stored prefix, then padded, instead of over [chips, buffer].
    loose = {stack for stack, _, ids_buf in fmt.stacks if fmt.encoding(stack) not in (V1_ENCODING,)
             and fmt.encoding(stack).padding == "stored" and stack in samples
             and ids_buf > LOOSE_IDS_PER_SAMPLE * samples[stack]}
    stored_groups = [(stack, [i for i, cell in enumerate(cells) if cell[1] == stack]) for stack, _, _ in fmt.stacks
                     if fmt.encoding(stack).padding == "stored" and stack not in loose]
    return _RecordKeys(required, optional, cells, [cell[5]["sizes"] for cell in cells], omitted,
                       [cells[i][5]["counts"] for i in omitted], loose, stored_groups,
                       [[cell[2], cell[3]] for cell in cells])


def _parse_example(tf, keys: _RecordKeys, serialized) -> Dict[str, Any]:
    """The record's features by key, in one `ParseSingleExample` op."""
    no_default = tf.zeros([0], tf.string)
    empty = tf.constant("")
    no_int = tf.zeros([0], tf.int64)
    required, optional, size_keys, count_keys = keys.required, keys.optional, keys.size_keys, keys.count_keys
    dense_keys = ["step", "host"] + required + optional + size_keys
    parsed = tf.raw_ops.ParseSingleExample(
        serialized=serialized, dense_defaults=[no_int, no_int] + [no_default] * len(required)
        + [empty] * len(optional) + [no_int] * len(size_keys), num_sparse=len(count_keys), sparse_keys=count_keys,
        dense_keys=dense_keys, sparse_types=[tf.int64] * len(count_keys),
        dense_shapes=[[], []] + [[]] * (len(required) + len(optional)) + [[len(SIZES_FIELDS)]] * len(size_keys))
    ex = dict(zip(dense_keys, parsed.dense_values))
    ex.update(zip(count_keys, parsed.sparse_values))
    return ex


def _batch_tensors(tf, fmt: ShardFormat, ex: Mapping[str, Any]) -> Dict[str, Any]:
    """Everything of the record but its SparseCore CSR: step, host, labels, mask, dense and tensor-core features."""
    b = fmt.host_batch_size
    out = {"step": ex["step"], "host": ex["host"],
           "label": tf.ensure_shape(tf.io.decode_raw(ex["label"], tf.float32), [b]),
           "mask": tf.ensure_shape(tf.io.decode_raw(ex["mask"], tf.float32), [b]),
           "dense": tf.reshape(tf.io.decode_raw(ex["dense"], tf.float32), [b, len(fmt.dense_features)])}
    tc = {}
    for name, weighted, _ in fmt.tensor_core_features:
        lengths = tf.cast(tf.io.decode_raw(ex[f"tc/{name}/lengths"], tf.int32), tf.int64)
        tc_ids = tf.io.decode_raw(ex[f"tc/{name}/ids"], tf.int64)
        tc[name] = tf.RaggedTensor.from_row_lengths(tc_ids, lengths)
        if weighted:
            w = tf.io.decode_raw(ex[f"tc/{name}/weights"], tf.float32)
            tc[name + "/weights"] = tf.RaggedTensor.from_row_lengths(w, lengths)
    out["tensor_core"] = tc
    return out


def _checked_sizes(tf, keys: _RecordKeys, ex: Mapping[str, Any]):
    """Every cell's sizes as an int32 [cells, sizes] matrix, once each prefix is checked to fit its buffers."""
    sizes64 = tf.stack([ex[k] for k in keys.size_keys])
    check = tf.raw_ops.Assert(  # no control flow: runs in tf.data's single-threaded executor too
        condition=tf.reduce_all(sizes64[:, :2] <= tf.constant(keys.buffers, tf.int64)),
        data=[tf.constant("shard record: a CSR prefix is longer than the format's buffer (row pointers, ids): "
                          "the manifest does not match the shards")])
    with tf.control_dependencies([check]):
        return tf.cast(sizes64, tf.int32)


def _decode_stored(tf, ex, cells, members: List[int], sizes_mat) -> List[Dict[str, Any]]:
    """One stack with stored padding on every chip at once ([chips, buffer] tensors): per member cell, its arrays."""
    _, _, rp_buf, ids_buf, enc, _ = cells[members[0]]

    def stacked(array):
        return tf.stack([ex[cells[i][5][array]] for i in members])
    rp_all = tf.io.decode_raw(stacked("row_pointers"), tf.int32, fixed_length=4 * rp_buf)
    # sample and token ids are PAD_VALUE at the same entries (the padding): found once
    xs = _decode_ids(tf, stacked("sorted_sample_ids"), enc.sample_ids, ids_buf)
    is_pad = tf.equal(xs, _pad_of(enc.sample_ids)) if enc != V1_ENCODING else None
    sid_all = _widen(tf, xs, enc.sample_ids, is_pad)
    tid_all = _widen(tf, _decode_ids(tf, stacked("sorted_token_ids"), enc.token_ids, ids_buf), enc.token_ids,
                     is_pad)
    raw_gains = stacked("sorted_gains")
    g_all = tf.io.decode_raw(raw_gains, tf.float32, fixed_length=4 * ids_buf)
    if enc.gains == "omitted_if_unit":  # chips without gains: 1.0 in the prefix, PAD_VALUE at padding
        n_all = tf.gather(sizes_mat[:, 1], members)
        unit = tf.where(is_pad, float(PAD_VALUE), tf.cast(tf.range(ids_buf)[None, :] < n_all[:, None],
                                                          tf.float32))
        g_all = tf.where(tf.strings.length(raw_gains)[:, None] > 0, g_all, unit)
    return [{"row_pointers": rp, "sorted_sample_ids": sid, "sorted_token_ids": tid, "sorted_gains": g}
            for rp, sid, tid, g in zip(tf.unstack(rp_all), tf.unstack(sid_all), tf.unstack(tid_all),
                                       tf.unstack(g_all))]


def _pad_of(dtype_name: str) -> int:
    """How PAD_VALUE is stored in ids of `dtype_name`: itself, or the narrow type's maximum."""
    return PAD_VALUE if dtype_name == "int32" else int(np.iinfo(ID_DTYPES[dtype_name]).max)


def _decode_ids(tf, raw, dtype_name: str, n: int):
    """Stored ids (strings of `dtype_name`, not widened) zero-padded to n entries."""
    dt = ID_DTYPES[dtype_name]
    return tf.io.decode_raw(raw, tf.as_dtype(dt), fixed_length=n * np.dtype(dt).itemsize)


def _widen(tf, x, dtype_name: str, is_pad):
    """Decoded ids as int32: `is_pad` (where the ids are padding) becomes PAD_VALUE."""
    if dtype_name == "int32" or is_pad is None:
        return x
    return tf.where(is_pad, PAD_VALUE, tf.cast(x, tf.int32))


def _decode_loose(tf, ex, cell):
    """One chip's stack with stored padding, widened on its stored prefix, then zero-padded to the buffers."""
    _, _, rp_buf, ids_buf, enc, keys = cell

    def padded(x):
        return tf.ensure_shape(tf.pad(x, [[0, ids_buf - tf.shape(x)[0]]]), [ids_buf])
    xs = tf.io.decode_raw(ex[keys["sorted_sample_ids"]], tf.as_dtype(ID_DTYPES[enc.sample_ids]))
    xt = tf.io.decode_raw(ex[keys["sorted_token_ids"]], tf.as_dtype(ID_DTYPES[enc.token_ids]))
    is_pad = tf.equal(xs, PAD_VALUE if enc.sample_ids == "int32" else int(np.iinfo(ID_DTYPES[enc.sample_ids]).max))
    raw_gains = ex[keys["sorted_gains"]]
    gains = tf.io.decode_raw(raw_gains, tf.float32)
    if enc.gains == "omitted_if_unit":  # no gains stored: 1.0, PAD_VALUE at the padding entries
        gains = tf.concat([gains, tf.where(is_pad[tf.strings.length(raw_gains) // 4:], float(PAD_VALUE), 1.0)], 0)
    return {"row_pointers": tf.io.decode_raw(ex[keys["row_pointers"]], tf.int32, fixed_length=4 * rp_buf),
            "sorted_sample_ids": padded(xs if enc.sample_ids == "int32" else
                                        tf.where(is_pad, PAD_VALUE, tf.cast(xs, tf.int32))),
            "sorted_token_ids": padded(xt if enc.token_ids == "int32" else
                                       tf.where(is_pad, PAD_VALUE, tf.cast(xt, tf.int32))),
            "sorted_gains": padded(gains)}


def _rebuild_padding(tf, ex, cells, n):
    """The stacks stored with padding omitted (`cells`: (chip, stack, row pointers buffer, ids buffer,
    encoding, keys), all with the same number of row pointers) -> TF's full buffers, all at once.

    `n`: their ids_unpadded_size. Partition i of a cell starts at the exclusive cumulative sum of the
    counts rounded up to multiples of 8; the real entries of every cell are scattered, in one op per
    array, into the cells' buffers laid end to end (PAD_VALUE in each prefix, zeros after it).
    """
    bufs = [cell[3] for cell in cells]
    offsets = np.cumsum([0] + bufs[:-1])
    counts = tf.cast(tf.stack([ex[cell[5]["counts"]] for cell in cells]), tf.int32)  # [cells, row pointers]
    padded = round_up(counts, XLA_PAD)
    starts = tf.cumsum(padded, axis=1, exclusive=True)
    check = tf.raw_ops.Assert(condition=tf.reduce_all(tf.equal(tf.reduce_sum(padded, axis=1), n)), data=[
        tf.constant("shard record: the partition counts do not add up to ids_unpadded_size")])
    flat = tf.reshape(counts, [-1])
    ends = tf.cumsum(flat)  # real entry j belongs to the first partition whose cumulative count exceeds j
    real = tf.range(ends[-1])
    first = tf.reshape(starts + tf.constant(offsets, tf.int32)[:, None], [-1]) - ends + flat
    positions = (real + tf.gather(first, tf.searchsorted(ends, real, side="right")))[:, None]
    slot_cell = np.repeat(np.arange(len(cells)), bufs)
    with tf.control_dependencies([check]):
        in_prefix = tf.constant(np.arange(sum(bufs)) - offsets[slot_cell], tf.int32) < tf.gather(n, slot_cell)
    real_per_cell = tf.unstack(tf.reduce_sum(counts, axis=1))
    gains = []
    for cell, m in zip(cells, real_per_cell):  # omitted gains: the real entries' are 1.0
        raw = ex[cell[5]["sorted_gains"]]
        gains += [tf.io.decode_raw(raw, tf.float32), tf.ones([m - tf.strings.length(raw) // 4], tf.float32)]

    def scattered(base, parts):
        return tf.split(tf.tensor_scatter_nd_update(base, positions, tf.concat(parts, 0)), bufs)
    pad_ids = tf.where(in_prefix, PAD_VALUE, 0)
    sids = scattered(pad_ids, [tf.cast(tf.io.decode_raw(ex[c[5]["sorted_sample_ids"]],
                                                        tf.as_dtype(ID_DTYPES[c[4].sample_ids])), tf.int32)
                               for c in cells])
    tids = scattered(pad_ids, [tf.cast(tf.io.decode_raw(ex[c[5]["sorted_token_ids"]],
                                                        tf.as_dtype(ID_DTYPES[c[4].token_ids])), tf.int32)
                               for c in cells])
    gs = scattered(tf.where(in_prefix, float(PAD_VALUE), 0.0), gains)
    rps = tf.unstack(starts + counts)
    return [{"row_pointers": tf.ensure_shape(tf.pad(rp, [[0, cell[2] - tf.shape(rp)[0]]]), [cell[2]]),
             "sorted_sample_ids": sid, "sorted_token_ids": tid, "sorted_gains": g}
            for cell, rp, sid, tid, g in zip(cells, rps, sids, tids, gs)]
