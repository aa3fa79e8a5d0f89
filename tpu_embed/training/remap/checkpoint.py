"""A checkpoint's embedding tables and optimizer slots moved to another vocabulary's rows, in row chunks.

Where the tables are.  Both per-table layouts name a table's variables by the table's name under the
embedding object's path `P` (TF escapes "." as ".." and "/" as ".S" in checkpoint keys):

* `HostEmbedding` (`tf.train.Checkpoint(embedding=emb)`): `P/tables/T` and `P/slots/T/SLOT`;
* `tf.tpu.experimental.embedding.TPUEmbeddingForServing`, and TPUEmbeddingV2's per-table form that TF
  reshards from on restore (its checkpoint adapter): `P/T` and `P/T.SSLOT` (the variable "T/SLOT");

each followed by `/.ATTRIBUTES/VARIABLE_VALUE`.  `locate` finds the one layout and `P` under which
every table is there with A's shape (or takes them as given).  Every other variable of the checkpoint
(the dense model, its optimizer, counters, the object graph) is copied byte for byte.

How a tensor moves (`remap_tensor`), with memory bounded by the chunk, not the table:

1. A's tensor is read in order, `chunk_rows` rows at a time, its CRC checked as it streams; each
   kept row goes, with its B row number, to the spill file of the B chunk it lands in;
2. B's tensor is written in order, one chunk at a time: the chunk's kept rows from its spill file,
   its new rows from the initializer (the table) or the slot's initial value (a slot).

So the work is linear in the rows (two sequential passes, the spill files on local disk) whatever the
vocabularies did to the order.  An identity mapping copies the tensor's bytes as they are.

New rows of a table take the table's initializer.  The default is TensorFlow's `TableConfig`
default, a truncated normal (mean 0, stddev 1/sqrt(dim), redrawn beyond 2 stddev), drawn with
numpy's Philox generator keyed by sha256(`seed`, table, block of 65536 B rows): a row's value depends
on the seed, the table and the new rows of its block, not on `chunk_rows`.  `seed` is an int (an
explicit `seed=` / `--seed`) or a string; `remap` passes, when no seed is given, the target
artifact's fingerprint (`tpu_embed.training.remap.artifact_seed`), so two days' remaps draw other
values and a re-run of one remap the same bytes.  A number is a constant; a callable
`fn(shape, dtype)` (e.g. a `tf.keras.initializers` object) is called per chunk with the chunk's new
rows' shape.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import tempfile
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import google_crc32c
import numpy as np

from tpu_embed.artifact.tfrecord import mask_crc32c
from tpu_embed.training.remap import bundle
from tpu_embed.training.remap.bundle import BundleReader, BundleWriter, Entry
from tpu_embed.training.remap.row_mapping import NEW, RemapError, RowMapping

SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
# Slot names per optimizer, as tf.tpu.experimental.embedding names them (tpu_embed.training.host_optimizers'
# SLOT_NAMES, written out here so that a remap does not import TensorFlow; a test checks they agree).
SLOT_NAMES: Dict[str, Tuple[str, ...]] = {
    "sgd": (), "adagrad": ("accumulators",), "adam": ("momenta", "velocities"), "ftrl": ("accumulators", "linears")}
ALL_SLOTS = tuple(sorted({s for names in SLOT_NAMES.values() for s in names}))
LAYOUTS = ("host_embedding", "tpu_embedding")
INIT_BLOCK = 65536  # rows per seeded block of the default initializer
DEFAULT_CHUNK_ROWS = 131072


def escape(name: str) -> str:
    """A name as TF writes it in a checkpoint key (trackable/base.py: "." -> "..", "/" -> ".S")."""
    return name.replace(".", "..").replace("/", ".S")


def parameters_key(layout: str, prefix: str, table: str) -> bytes:
    path = f"tables/{escape(table)}" if layout == "host_embedding" else escape(table)
    return f"{prefix}/{path}{SUFFIX}".encode("utf-8")


def slot_key(layout: str, prefix: str, table: str, slot: str) -> bytes:
    path = f"slots/{escape(table)}/{escape(slot)}" if layout == "host_embedding" else escape(f"{table}/{slot}")
    return f"{prefix}/{path}{SUFFIX}".encode("utf-8")


@dataclasses.dataclass(frozen=True)
class TableVariables:
    """A table's variables in the checkpoint: its parameters and the slots it has."""

    table: str
    parameters: Entry
    slots: Dict[str, Entry]


@dataclasses.dataclass(frozen=True)
class Located:
    layout: str  # "host_embedding" | "tpu_embedding"
    prefix: str  # the embedding object's path in the checkpoint
    tables: Dict[str, TableVariables]
    absent: Tuple[str, ...]  # optional tables (tensor-core) the checkpoint does not hold


def _prefixes(reader: BundleReader, layout: str, table: str) -> List[str]:
    tail = parameters_key(layout, "", table)  # "/<path>/.ATTRIBUTES/VARIABLE_VALUE"
    return [k[:-len(tail)].decode("utf-8", "backslashreplace") for k in reader.entries if k.endswith(tail)]


def locate(reader: BundleReader, mappings: Mapping[str, RowMapping], required: Tuple[str, ...],
           layout: Optional[str] = None, prefix: Optional[str] = None) -> Located:
    """The variables of every table of `mappings` in the checkpoint (`required` ones must be there).

    Without `layout` / `prefix`, the (layout, prefix) pairs under which every required table's
    parameters exist are found; there must be exactly one.
    """
    if any(k.endswith(b"_sparse_core_table_layouts" + SUFFIX.encode()) or k == b"_sparse_core_table_layouts"
           for k in reader.entries) and not any(k.endswith(parameters_key("tpu_embedding", "", t))
                                                for t in required for k in reader.entries):
        raise RemapError(f"{reader.prefix} holds SparseCore-stacked tables (TPUEmbeddingV2 trained on TPU); remap "
                         "reads per-table checkpoints. Restore it into a TPUEmbeddingForServing built on artifact "
                         "A (TF unstacks it on restore), save that, and remap the saved checkpoint.")
    layouts = [layout] if layout else list(LAYOUTS)
    for name in layouts:
        if name not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {name!r}.")
    candidates = []
    for name in layouts:
        found = None
        for t in required:
            here = {prefix} if prefix is not None else set(_prefixes(reader, name, t))
            if prefix is not None and parameters_key(name, prefix, t) not in reader.entries:
                here = set()
            found = here if found is None else found & here
        candidates += [(name, p) for p in sorted(found or ())]
    # HostEmbedding's `P/tables/T` is also the per-table form at prefix `P/tables`: the HostEmbedding reading wins.
    candidates = [(n, p) for n, p in candidates
                  if not (n == "tpu_embedding" and p.endswith("/tables") and ("host_embedding", p[:-7]) in candidates)]
    if not candidates:
        t = required[0]
        looked = " or ".join(f"'{parameters_key(n, prefix if prefix is not None else '<prefix>', t).decode()}'"
                             for n in layouts)
        sample = ", ".join(sorted(k.decode("utf-8", "backslashreplace") for k in reader.entries)[:4])
        raise RemapError(f"{reader.prefix} has no variables of table {t!r} (looked for {looked}; it holds "
                         f"{len(reader.entries)} variables: {sample}, ...): it is not a checkpoint of an embedding "
                         "built on artifact A's tables. Pass the checkpoint of a HostEmbedding or "
                         "TPUEmbeddingForServing built on A (or --prefix where its embedding is).")
    if len(candidates) > 1:
        shown = ", ".join(f"{p!r} ({n})" for n, p in candidates)
        raise RemapError(f"{reader.prefix} holds the tables of more than one embedding: {shown}. Say which with "
                         "prefix= (tpu-embed remap --prefix P).")
    layout, prefix = candidates[0]
    tables: Dict[str, TableVariables] = {}
    absent = []
    for name, mapping in mappings.items():
        entry = reader.entries.get(parameters_key(layout, prefix, name))
        if entry is None:
            absent.append(name)
            continue
        _check_entry(reader, entry, mapping, "table")
        slots = {}
        for s in ALL_SLOTS:
            e = reader.entries.get(slot_key(layout, prefix, name, s))
            if e is not None:
                _check_entry(reader, e, mapping, f"slot {s!r} of table")
                slots[s] = e
        tables[name] = TableVariables(name, entry, slots)
    return Located(layout, prefix, tables, tuple(absent))


def _check_entry(reader: BundleReader, entry: Entry, mapping: RowMapping, what: str) -> None:
    where = f"{reader.prefix}: {what} {mapping.table!r} ({entry.name})"
    if entry.sliced:
        raise RemapError(f"{where} is saved in slices (a partitioned or sharded variable); remap reads whole "
                         "per-table variables. Save it from an unpartitioned HostEmbedding or "
                         "TPUEmbeddingForServing.")
    if entry.dtype not in bundle.DTYPES:
        raise RemapError(f"{where} is {entry.dtype_name}; remap moves float32 and float64 tables.")
    if len(entry.shape) != 2 or entry.shape[1] != mapping.dim:
        raise RemapError(f"{where} has shape {list(entry.shape)} but artifact A's table has dim {mapping.dim}: the "
                         "checkpoint was not trained on artifact A's spec. Pass the artifact it was trained on as A.")
    if entry.shape[0] != mapping.rows_a:
        hint = " (it has B's row count: was it trained on B already?)" if entry.shape[0] == mapping.rows_b else ""
        raise RemapError(f"{where} has {entry.shape[0]} rows but artifact A's table has {mapping.rows_a}{hint}: the "
                         "checkpoint was not trained on artifact A's vocabulary. Pass the artifact it was trained "
                         "on as A.")


# ---------------------------------------------------------------- initial values of new rows

Initializer = Callable[[int, int, np.dtype], Optional[Tuple[np.ndarray, np.ndarray]]]


def _truncated_normal(rng: np.random.Generator, shape: Tuple[int, int]) -> np.ndarray:
    x = rng.standard_normal(shape)
    bad = np.abs(x) > 2.0
    while bad.any():
        x[bad] = rng.standard_normal(int(bad.sum()))
        bad = np.abs(x) > 2.0
    return x


Seed = Union[int, str]  # an explicit seed, or a string such as artifact_seed's "artifact:<sha256>"


def _block_key(seed: Seed, table: str, block: int) -> int:
    # An int seed keys as its decimal digits, a string as itself: "artifact:..." never equals a number's key.
    text = f"{int(seed)}" if isinstance(seed, (int, np.integer)) else str(seed)
    return int.from_bytes(hashlib.sha256(f"{text}/{table}/{block}".encode()).digest()[:16], "little")


def default_values(mapping: RowMapping, seed: Seed) -> Callable[[int, int], Tuple[np.ndarray, np.ndarray]]:
    """(new B rows in [r0, r1), their float64 values): TF's TableConfig default initializer, seeded per block."""
    stddev = 1.0 / math.sqrt(mapping.dim)

    def values(r0: int, r1: int) -> Tuple[np.ndarray, np.ndarray]:
        rows, vals = [], []
        for block in range(r0 // INIT_BLOCK, (r1 - 1) // INIT_BLOCK + 1):
            b0 = block * INIT_BLOCK
            new = np.flatnonzero(mapping.source[b0:min(b0 + INIT_BLOCK, mapping.rows_b)] == NEW) + b0
            if not new.size:
                continue
            rng = np.random.Generator(np.random.Philox(key=_block_key(seed, mapping.table, block)))
            v = _truncated_normal(rng, (new.size, mapping.dim)) * stddev
            inside = (new >= r0) & (new < r1)
            rows.append(new[inside])
            vals.append(v[inside])
        if not rows:
            return np.zeros(0, np.int64), np.zeros((0, mapping.dim))
        return np.concatenate(rows), np.concatenate(vals)
    return values


def given_values(mapping: RowMapping, init: Any) -> Callable[[int, int], Tuple[np.ndarray, np.ndarray]]:
    """The same for a constant or a callable `init(shape, dtype)` (called once per chunk)."""
    def values(r0: int, r1: int) -> Tuple[np.ndarray, np.ndarray]:
        new = np.flatnonzero(mapping.source[r0:r1] == NEW) + r0
        if callable(init):
            v = np.asarray(init((int(new.size), mapping.dim), dtype="float32"), np.float64) if new.size else \
                np.zeros((0, mapping.dim))
            if v.shape != (new.size, mapping.dim):
                raise RemapError(f"table {mapping.table!r}: its initializer returned shape {list(v.shape)} for "
                                 f"{[int(new.size), mapping.dim]}.")
        else:
            v = np.full((new.size, mapping.dim), float(init))
        return new, v
    return values


# ---------------------------------------------------------------- one tensor

def remap_tensor(reader: BundleReader, entry: Entry, mapping: RowMapping, dest: np.ndarray,
                 values: Callable[[int, int], Tuple[np.ndarray, np.ndarray]], writer: BundleWriter,
                 chunk_rows: int, spill_dir: str, progress: Callable[[int], None]) -> None:
    """Write `entry`'s tensor with B's rows: kept rows from A (by `dest`, A row -> B row), new rows from `values`."""
    dtype = bundle.DTYPES[entry.dtype]
    row_bytes = mapping.dim * dtype.itemsize
    n_chunks = max(1, -(-mapping.rows_b // chunk_rows))
    spills = [os.path.join(spill_dir, f"{i}.bin") for i in range(n_chunks)]
    with contextlib.ExitStack() as stack:
        files: Dict[int, Any] = {}
        crc = 0
        for a0 in range(0, mapping.rows_a, chunk_rows):
            n = min(chunk_rows, mapping.rows_a - a0)
            raw = reader.read(entry, a0 * row_bytes, n * row_bytes)
            crc = google_crc32c.extend(crc, raw)
            d = dest[a0:a0 + n]
            keep = np.flatnonzero(d >= 0)
            if keep.size:
                rows = np.frombuffer(raw, np.uint8).reshape(n, row_bytes)
                d = d[keep]
                order = np.argsort(d // chunk_rows, kind="stable")
                d, keep = d[order], keep[order]
                bounds = np.searchsorted(d // chunk_rows, np.arange(n_chunks + 1))
                for c in np.flatnonzero(np.diff(bounds)):
                    lo, hi = bounds[c], bounds[c + 1]
                    fh = files.get(int(c))
                    if fh is None:
                        fh = files[int(c)] = stack.enter_context(open(spills[c], "wb"))
                    fh.write(np.int64(hi - lo).tobytes() + d[lo:hi].tobytes() + rows[keep[lo:hi]].tobytes())
            del raw
            progress(n)
        if mask_crc32c(crc) != entry.crc32c:
            raise RemapError(f"{reader.prefix}: {entry.name} is corrupt (its data does not match its CRC32C). Use "
                             "another copy of the checkpoint.")

    def chunks() -> Iterator[np.ndarray]:
        for c in range(n_chunks):
            r0, r1 = c * chunk_rows, min(mapping.rows_b, (c + 1) * chunk_rows)
            out = np.empty((r1 - r0, row_bytes), np.uint8)
            filled = 0
            if os.path.exists(spills[c]):
                with open(spills[c], "rb") as fh:
                    while True:
                        head = fh.read(8)
                        if not head:
                            break
                        k = int(np.frombuffer(head, np.int64)[0])
                        d = np.frombuffer(fh.read(8 * k), np.int64)
                        out[d - r0] = np.frombuffer(fh.read(k * row_bytes), np.uint8).reshape(k, row_bytes)
                        filled += k
                os.unlink(spills[c])
            rows, vals = values(r0, r1)
            if filled + rows.size != r1 - r0:
                raise AssertionError(f"{entry.name}: rows {r0}..{r1} filled {filled} + {rows.size} new")
            if rows.size:
                out[rows - r0] = np.ascontiguousarray(vals, dtype).view(np.uint8).reshape(rows.size, row_bytes)
            yield out
            progress(r1 - r0)
    writer.add(entry.key, entry.dtype, (mapping.rows_b, mapping.dim), chunks())


# ---------------------------------------------------------------- the whole checkpoint

@dataclasses.dataclass(frozen=True)
class TableSlots:
    """What a table's remap needs besides its mapping: its initializer and the initial value of every slot."""

    initializer: Any  # None (TF's default), a number, or fn(shape, dtype)
    slot_values: Dict[str, float]  # slot -> initial value (B's optimizer)


def remap_checkpoint(reader: BundleReader, writer: BundleWriter, located: Located, mappings: Mapping[str, RowMapping],
                     tables: Mapping[str, TableSlots], *, seed: Seed = 0, chunk_rows: int = DEFAULT_CHUNK_ROWS,
                     spill_dir: Optional[str] = None, progress: Optional[Callable[[int], None]] = None) -> None:
    """Every variable of `reader` into `writer`: the located tables' parameters and slots remapped, the rest copied."""
    tick = progress or (lambda n: None)
    by_key: Dict[bytes, Tuple[str, Optional[str]]] = {}
    for name, tv in located.tables.items():
        by_key[tv.parameters.key] = (name, None)
        for s, e in tv.slots.items():
            by_key[e.key] = (name, s)
    dests: Dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory(prefix="tpu-embed-remap-", dir=spill_dir) as tmp:
        for key in sorted(reader.entries):
            entry = reader.entries[key]
            if key not in by_key:
                writer.copy(entry, reader)
                continue
            name, slot = by_key[key]
            mapping = mappings[name]
            if mapping.identity:
                writer.copy(entry, reader)
                tick(mapping.rows_a + mapping.rows_b)
                continue
            if name not in dests:
                dests[name] = mapping.destination()
            spec = tables[name]
            if slot is None:
                values = default_values(mapping, seed) if spec.initializer is None else \
                    given_values(mapping, spec.initializer)
            else:
                values = given_values(mapping, spec.slot_values[slot])
            remap_tensor(reader, entry, mapping, dests[name], values, writer, chunk_rows, tmp, tick)
            if all(k in writer.written for k in variable_keys(located.tables[name])):
                dests.pop(name, None)  # every tensor of the table is done: its inverse mapping is not needed again


def variable_keys(tv: TableVariables) -> List[bytes]:
    """The checkpoint keys of a table's parameters and its slots."""
    return [tv.parameters.key] + [e.key for e in tv.slots.values()]
