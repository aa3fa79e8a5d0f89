"""`remap`: a checkpoint trained on artifact A's ids, written out with its tables on artifact B's ids.

The steps: both artifacts' row mappings (`row_mapping`), the checkpoint's embedding variables found and
checked (`checkpoint.locate`), every table moved in row chunks (`checkpoint.remap_checkpoint`) through
TF's bundle files (`bundle`), and a `RemapReport`.  New rows' default seed: `artifact_seed`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any, Callable, Dict, Mapping, Optional

from tpu_embed.artifact import io as tio
from tpu_embed.artifact.load import Artifact
from tpu_embed.training.remap import checkpoint as ckpt
from tpu_embed.training.remap.bundle import BundleError, BundleReader, BundleWriter
from tpu_embed.training.remap.remap_report import RemapReport, TableReport
from tpu_embed.training.remap.row_mapping import RemapError, RowMapping, load, row_mappings

_STATE_LINE = re.compile(r'^model_checkpoint_path:\s*"(.*)"\s*$', re.M)


def resolve_checkpoint(path: str) -> str:
    """A checkpoint prefix from a prefix or a directory holding TF's `checkpoint` state file (its latest)."""
    if tio.exists(f"{path}.index"):
        return path
    state = tio.join(path, "checkpoint")
    if tio.exists(state):
        m = _STATE_LINE.search(tio.read_text(state))
        if m:
            latest = m.group(1).encode("utf-8").decode("unicode_escape")
            return latest if tio.is_absolute(latest) else tio.join(path, latest)
    raise RemapError(f"{path} is not a checkpoint: no {path}.index and no {state} naming one. Pass the prefix "
                     "tf.train.Checkpoint.save returned (e.g. DIR/ckpt-3) or the directory it saved into.")


def artifact_seed(artifact: Artifact) -> str:
    """The default seed of new rows when remapping onto `artifact`: "artifact:" + a sha256 over its spec
    fingerprint, its vocabulary sizes and the (path, sha256) of every vocabulary and token-count file its
    manifest lists (the sha256s `load` checks against the files).

    Those are what the artifact's row ids mean: another day's vocabularies give another seed, a re-run of
    the jobs on the same data (or a re-shard) the same one.
    """
    m = artifact.manifest
    files = sorted((f.kind, f.path, f.sha256) for f in m.files if f.kind in ("vocabulary", "token_counts"))
    what = {"spec_fingerprint": m.spec_fingerprint, "vocabulary_sizes": dict(sorted(m.vocabulary_sizes.items())),
            "files": files}
    text = json.dumps(what, sort_keys=True, separators=(",", ":"))
    return "artifact:" + hashlib.sha256(b"tpu_embed.remap.seed/1\n" + text.encode("utf-8")).hexdigest()


def _slot_values(spec, table: str, vocab_sizes: Mapping[str, int]) -> Dict[str, float]:
    opt = spec.table_config(table, vocab_sizes).optimizer
    if opt is None:
        return {}
    p = dict(opt.params)
    if opt.kind == "adagrad":
        return {"accumulators": float(p["initial_accumulator"])}
    if opt.kind == "ftrl":
        return {"accumulators": float(p["initial_accumulator_value"]), "linears": 0.0}
    if opt.kind == "adam":
        return {"momenta": 0.0, "velocities": 0.0}
    return {}


def remap(from_artifact: str, to_artifact: str, checkpoint: str, output: str, *, prefix: Optional[str] = None,
          layout: Optional[str] = None, seed: Optional[int] = None, initializers: Optional[Mapping[str, Any]] = None,
          chunk_rows: int = ckpt.DEFAULT_CHUNK_ROWS, overwrite: bool = False, spill_dir: Optional[str] = None,
          progress: Optional[Callable[[int, int], None]] = None) -> RemapReport:
    """Write `output`, the checkpoint `checkpoint` (trained on artifact `from_artifact`'s ids) with its tables
    and their optimizer slots moved to artifact `to_artifact`'s ids.

    Args:
      from_artifact: artifact directory A, whose ids the checkpoint was trained on.
      to_artifact: artifact directory B, of the same spec's features and tables as A; their vocabularies,
        top_k / frequency_threshold, topology and batch sizes may differ.
      checkpoint: a checkpoint prefix (`tf.train.Checkpoint.save`'s return value) or the directory whose
        `checkpoint` file names the latest one.
      output: the new checkpoint's prefix (writes `output.index` and `output.data-00000-of-00001`).
      prefix: where the embedding's variables are in the checkpoint, found when not given.
      layout: how they are laid out ("host_embedding": `HostEmbedding`, or "tpu_embedding": per-table
        `TPUEmbeddingForServing` / `TPUEmbeddingV2`), found when not given.
      seed: seeds the default initializer of new rows (TF's TableConfig default, a truncated normal)
        together with the table's name. None (default): artifact B's fingerprint (`artifact_seed(B)`) does,
        so a re-run gives the same bytes and another day's remap other values; an int gives the same
        values for that seed and table whatever the artifacts.
      initializers: `{table: number or fn(shape, dtype)}` for new rows instead of the default.
      chunk_rows: rows per chunk; memory is a few chunks of the widest table, plus two int64 per row
        of the table being moved.
      overwrite: replace an existing checkpoint at `output`.
      spill_dir: where the spill files go while a table moves (default: the system's temporary directory);
        they take up to the size of one table's tensor and are deleted as they are read.
      progress: `fn(done, total)` after every chunk (rows read and written over every tensor).

    Returns a `RemapReport`. Raises `RemapError` (one line naming the fix) for artifacts of other specs,
    a checkpoint of another artifact's shapes, a missing table, a changed dim or optimizer.
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}.")
    a, b = load(from_artifact), load(to_artifact)
    mappings = row_mappings(a, b)
    used_seed: ckpt.Seed = artifact_seed(b) if seed is None else int(seed)
    source = resolve_checkpoint(checkpoint)
    _check_output(output, source, overwrite)
    try:
        reader = BundleReader(source)
    except BundleError as e:
        raise RemapError(str(e)) from None
    with reader:
        sparse_core = tuple(sorted({f.table.name for f in a.model.features}))
        located = ckpt.locate(reader, mappings, sparse_core, layout=layout, prefix=prefix)
        tables = _table_slots(reader, located, b, initializers or {})
        unknown = sorted(set(initializers or {}) - set(mappings))
        if unknown:
            raise ValueError(f"initializers for unknown tables {unknown} (the tables: {sorted(mappings)}).")
        moved = {n: mappings[n] for n in located.tables}
        others = _write(reader, output, located, moved, tables, used_seed, chunk_rows, spill_dir, progress)
    reports = {}
    for name, tv in located.tables.items():
        p = mappings[name]
        reports[name] = TableReport(name, p.kind, p.rows_a, p.rows_b, p.kept_tokens, p.new, p.dropped,
                                    p.num_oov_buckets, tuple(sorted(tv.slots)), p.identity)
    defaulted = any(mappings[n].new and not mappings[n].identity and tables[n].initializer is None for n in moved)
    return RemapReport(source, output, located.layout, located.prefix, reports, located.absent, others,
                       str(used_seed) if defaulted else "")


def _check_output(output: str, source: str, overwrite: bool) -> None:
    """Refuse an output that is a directory, the input checkpoint itself, or an existing one without `overwrite`."""
    if not tio.is_url(output) and os.path.isdir(output):
        raise RemapError(f"--output {output} is a directory; pass a checkpoint prefix in it, e.g. {output}/ckpt-0.")
    if os.path.abspath(output) == os.path.abspath(source) if not tio.is_url(output) else output == source:
        raise RemapError(f"the output {output} is the input checkpoint; write the remapped one beside it.")
    if tio.exists(f"{output}.index") and not overwrite:
        raise RemapError(f"{output}.index exists; pass overwrite=True (tpu-embed remap --overwrite) to replace it.")


def _table_slots(reader: BundleReader, located: ckpt.Located, b: Artifact,
                 initializers: Mapping[str, Any]) -> Dict[str, ckpt.TableSlots]:
    """Each located table's initializer and slots' initial values (B's optimizer), its slots checked against it."""
    tables: Dict[str, ckpt.TableSlots] = {}
    for name, tv in located.tables.items():
        values = _slot_values(b.spec, name, b.manifest.vocabulary_sizes)
        extra = sorted(set(tv.slots) - set(values))
        if extra:
            opt = b.spec.table_config(name, b.manifest.vocabulary_sizes).optimizer
            kind = opt.kind if opt is not None else "none"
            raise RemapError(f"{reader.prefix}: table {name!r} has slot variables {extra}, which artifact B's "
                             f"optimizer ({kind}) does not have: the checkpoint was trained with another "
                             "optimizer. Keep the optimizer's type between A and B.")
        tables[name] = ckpt.TableSlots(initializers.get(name), values)
    return tables


def _write(reader: BundleReader, output: str, located: ckpt.Located, moved: Mapping[str, RowMapping],
           tables: Mapping[str, ckpt.TableSlots], seed: ckpt.Seed, chunk_rows: int, spill_dir: Optional[str],
           progress: Optional[Callable[[int, int], None]]) -> int:
    """Write the remapped checkpoint at `output` (removed again on an error); returns how many other variables
    were copied as they are."""
    total = sum((p.rows_a + p.rows_b) * (1 + len(located.tables[n].slots)) for n, p in moved.items())
    done = [0]

    def tick(n: int) -> None:
        done[0] += n
        if progress is not None:
            progress(done[0], total)

    writer = BundleWriter(output)
    try:
        ckpt.remap_checkpoint(reader, writer, located, moved, tables, seed=seed, chunk_rows=chunk_rows,
                              spill_dir=spill_dir, progress=tick)
        writer.finish(reader.header)
    except BaseException:
        writer.abort()
        raise
    ours = {k for tv in located.tables.values() for k in ckpt.variable_keys(tv)}
    return len([k for k in reader.entries if k not in ours])
