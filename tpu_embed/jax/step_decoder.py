"""One jax step record -> the arrays of a `tpu_embed.jax.input.JaxStep`, in numpy (`StepDecoder`).

`parse_record` reads a record's features in place (no copy of its arrays); `StepDecoder.decode` copies each
COO array once, from the record into its buffer of the artifact's (or the caller's) static size.
"""

from __future__ import annotations

from typing import Any, Container, Dict, Mapping, Optional, Tuple

import numpy as np

from tpu_embed.artifact.example_wire import fields, int64_list
from tpu_embed.artifact.jax_records import key as record_key
from tpu_embed.sparsecore.jax_layout import ALIGN, PAD_ID, round_up

# ---------------------------------------------------------------- the record, parsed in place

def parse_record(data, keys: Optional[Container[str]] = None) -> Dict[str, Any]:
    """{key: value} of a step record (a serialized tf.train.Example): a bytes feature as a memoryview of `data`
    (its first value: the records store each array as one raw value), an int64 feature as a list of ints, a
    float feature as a float32 array. Nothing of `data` is copied. `keys`: only these keys (the others are
    skipped before their values are read: the decoder does not read the steps' statistics)."""
    out: Dict[str, Any] = {}
    for f, _, features in fields(memoryview(data)):
        if f != 1:
            continue
        for f2, _, entry in fields(features):
            if f2 != 1:
                continue
            name, value = None, None
            for f3, _, x in fields(entry):
                if f3 == 1:
                    name = bytes(x).decode("utf-8")
                elif f3 == 2:
                    value = x
            if name is None or (keys is not None and name not in keys):
                continue
            out[name] = None
            for kind, _, lst in fields(value if value is not None else memoryview(b"")):
                if kind == 1:
                    vals = [x for _, _, x in fields(lst)]
                    out[name] = vals[0] if vals else memoryview(b"")
                elif kind == 2:
                    out[name] = np.concatenate([np.frombuffer(x, "<f4") for _, _, x in fields(lst)] or
                                               [np.zeros(0, np.float32)]).astype(np.float32)
                elif kind == 3:
                    out[name] = int64_list(lst)
    return out


# ---------------------------------------------------------------- decoding one step

class StepDecoder:
    """A step record -> the arrays of a `JaxStep` (numpy), for one artifact's format."""

    def __init__(self, fmt, coo_buffer_sizes: Mapping[str, Optional[int]], has_leading_dimension: bool):
        fj = fmt.jax
        self.L, self.nsc = int(fj["local_devices"]), int(fj["num_sc_per_device"])
        self.rp_size = int(fj["row_pointers_size_per_device"])
        self.stacks = [s["name"] for s in fj["stacks"]]
        self.sizes = dict(coo_buffer_sizes)
        self.lead = has_leading_dimension
        self.hb = int(fmt.host_batch_size)
        self.nd = len(fmt.dense_features)
        self.tc = tuple(fmt.tensor_core_features)
        self.keys = frozenset(["step", "label", "mask", "dense"]
                              + [record_key(i, a) for i in range(len(self.stacks)) for a in ("rp", "eid", "sid", "g")]
                              + [f"tc/{n}/{a}" for n, _, _ in self.tc for a in ("lengths", "ids", "weights")])

    def _check_size(self, stack: str, size: int, seg: np.ndarray, step: int) -> int:
        if size % self.nsc or size // self.nsc < int(seg.max(initial=0)):
            need = round_up(int(seg.max(initial=0)), ALIGN) * self.nsc
            raise ValueError(f"step {step}, jax stack {stack!r}: a COO buffer of {size} per device does not hold the "
                             f"step's ids ({int(seg.max(initial=0))} per SparseCore x {self.nsc}; jax would drop "
                             f"ids): give at least {need} (the stack's suggested_coo_buffer_size_per_device, from "
                             "`tpu-embed plan --format jax-fdo`).")
        return size

    def decode(self, data) -> Tuple[int, Dict[str, Any]]:
        """(step, arrays) of one record: "sparse" (row pointers, embedding ids, sample ids, gains: {stack: array};
        num_minibatches), "label", "mask", "dense", "tensor_core"."""
        ex = parse_record(data, self.keys)
        step = int(ex["step"][0])
        rps, eids, sids, gains = {}, {}, {}, {}
        for i, name in enumerate(self.stacks):
            rps[name], eids[name], sids[name], gains[name] = self._stack(ex, i, name, step)
        minibatches: np.ndarray = np.full((self.L, 1) if self.lead else (self.L,), 1)
        return step, {"sparse": (rps, eids, sids, gains, minibatches), **self._host_arrays(ex)}

    def _stack(self, ex: Mapping[str, Any], i: int, name: str, step: int
               ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(row pointers, embedding ids, sample ids, gains) of stack `i`: each segment's entries copied once from
        the record into its COO buffer, the buffer's tail filled with the padding values."""
        L, nsc, S = self.L, self.nsc, self.L * self.nsc
        k_rp = record_key(i, "rp")
        if k_rp not in ex:
            raise ValueError(f"step {step}: the record has no {k_rp}: it holds no jax arrays for stack {name!r}")
        rp = np.frombuffer(ex[k_rp], "<i4").astype(np.int32)  # a copy: small, and the caller's to keep
        blocks = rp.reshape(S, -1)
        seg = round_up(blocks[:, -1].astype(np.int64), ALIGN)  # each (device, SparseCore) segment's length
        eid_src = np.frombuffer(ex[record_key(i, "eid")], "<i4")
        sid_src = np.frombuffer(ex[record_key(i, "sid")], "<i4")
        g_mv = ex.get(record_key(i, "g"))
        g_src = None if g_mv is None else np.frombuffer(g_mv, "<f4")
        total = int(seg.sum())
        if eid_src.size != total or sid_src.size != total or (g_src is not None and g_src.size != total):
            raise ValueError(f"step {step}, jax stack {name!r}: the record's arrays do not match its row pointers "
                             f"({eid_src.size} ids for {total}): a damaged record")
        size = self.sizes.get(name)
        if size is None:
            size = int(seg.max(initial=0)) * nsc
        per_sc = self._check_size(name, int(size), seg, step) // nsc
        eid = np.empty((S, per_sc), np.int32)
        sid = np.empty((S, per_sc), np.int32)
        g = np.empty((S, per_sc), np.float32)
        off = 0
        for k, n in enumerate(seg.tolist()):
            eid[k, :n] = eid_src[off:off + n]
            sid[k, :n] = sid_src[off:off + n]
            eid[k, n:] = PAD_ID
            sid[k, n:] = PAD_ID
            if g_src is not None:
                g[k, :n] = g_src[off:off + n]
                g[k, n:] = np.nan
            off += n
        if g_src is None:  # unit gains are left out of the record: 1.0 on real entries, NaN on padding
            np.copyto(g, np.float32(1))
            g[sid == PAD_ID] = np.nan
        shape = (L, -1) if self.lead else (-1,)
        return rp.reshape(shape), eid.reshape(shape), sid.reshape(shape), g.reshape(shape)

    def _host_arrays(self, ex: Mapping[str, Any]) -> Dict[str, Any]:
        """The host's "label", "mask", "dense" and "tensor_core" arrays of a record."""
        hb = self.hb
        label = np.frombuffer(ex["label"], "<f4").astype(np.float32)
        mask = np.frombuffer(ex["mask"], "<f4").astype(np.float32)
        dense = np.frombuffer(ex["dense"], "<f4").astype(np.float32).reshape(hb, self.nd)
        tc = {}
        for name, weighted, width in self.tc:
            lengths = np.frombuffer(ex[f"tc/{name}/lengths"], "<i4").astype(np.int64)
            values = np.frombuffer(ex[f"tc/{name}/ids"], "<i8")
            w = np.frombuffer(ex[f"tc/{name}/weights"], "<f4") if weighted else None
            ids, wts = _padded(lengths, values, w, hb, int(width))
            tc[name] = (ids, wts)
        return {"label": label, "mask": mask, "dense": dense, "tensor_core": tc}


def _padded(lengths: np.ndarray, values: np.ndarray, weights: Optional[np.ndarray], rows: int, width: int
            ) -> Tuple[np.ndarray, np.ndarray]:
    """Ragged values [rows, lengths] as [rows, width] int32 ids (0 after a row's values, cut at `width`) and
    float32 weights (the weight, or 1, on a value; 0 after), as `tpu_embed.training.input.per_chip_dataset`."""
    ids = np.zeros((rows, width), np.int32)
    wts = np.zeros((rows, width), np.float32)
    starts = np.cumsum(lengths) - lengths
    col = np.arange(width)
    keep = col[None, :] < lengths[:, None]
    src = (starts[:, None] + col[None, :])[keep]
    ids[keep] = values[src].astype(np.int32)
    wts[keep] = 1.0 if weights is None else weights[src]
    return ids, wts
