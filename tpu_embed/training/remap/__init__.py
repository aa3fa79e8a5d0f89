"""Warm start across vocabularies: a checkpoint trained on artifact A's ids, remapped onto artifact B's ids.

    report = tpu_embed.remap("build/day1", "build/day2", "ckpt/day1/ckpt-6", "ckpt/day2-warm/ckpt-0")
    print(report.summary())
    tf.train.Checkpoint(embedding=HostEmbedding.from_artifact("build/day2")).restore("ckpt/day2-warm/ckpt-0")

Every table's rows *and* its optimizer slots (Adagrad's accumulators, Adam's momenta and velocities,
FTRL's accumulators and linears) move to B's ids: a token in both vocabularies keeps its trained row,
a new token starts from the table's initializer and the slots' initial values (B's optimizer), a
dropped token goes away, the OOV buckets keep their rows, identity and hashing tables are copied as
they are, and a table shared by several features is moved once.  Every other variable of the
checkpoint (the dense model, its optimizer, counters) is copied byte for byte, so the output restores
into the same objects built on artifact B (`tf.train.Checkpoint(...).restore(output)`).

New rows' initial values.  Without `initializers`, a new row takes TF's `TableConfig` default (a
truncated normal, stddev 1/sqrt(dim)) drawn from a generator seeded by *artifact B's fingerprint and
the table's name* (`artifact_seed`: a sha256 over B's spec fingerprint, vocabulary sizes and the path
and sha256 of every vocabulary and token-count file its manifest lists).  So a re-run of the same
remap writes the same bytes, while two days' remaps (other vocabularies) draw other values: one
fixed seed would give the first new rows of every day's remap the same values in the same order.  The
fingerprint covers what B's row ids mean and nothing else: re-sharding B, or rewriting its manifest
for another reason (a transform output added), does not change it.  An explicit `seed=`
(`tpu-embed remap --seed N`) replaces the fingerprint: the values then follow that seed and the
table alone, the same for every target artifact.

The checkpoint may be a `HostEmbedding`'s or a per-table `TPUEmbeddingForServing` /
`TPUEmbeddingV2` one (the form TF reshards onto SparseCores on restore); tables move in row chunks
through spill files, so memory follows `chunk_rows`, not the table.  The parts:
`tpu_embed.training.remap.plan` (which A row every B row takes; numpy, no checkpoint),
`tpu_embed.training.remap.checkpoint` (finding the variables, moving them),
`tpu_embed.training.remap.bundle` (TF's checkpoint files, read and written without TensorFlow).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from tpu_embed.artifact import io as tio
from tpu_embed.artifact.load import Artifact
from tpu_embed.training.remap import checkpoint as ckpt
from tpu_embed.training.remap.bundle import BundleError, BundleReader, BundleWriter
from tpu_embed.training.remap.plan import RemapError, TablePlan, load, table_plans

__all__ = ["remap", "RemapReport", "TableReport", "RemapError", "TablePlan", "table_plans", "resolve_checkpoint",
           "artifact_seed"]


@dataclasses.dataclass(frozen=True)
class TableReport:
    """One table of a remap: rows in A and B, tokens kept / new / dropped, the slots moved with it."""

    table: str
    kind: str  # the vocabulary type of its features: "frequency" | "identity" | "hashing"
    rows_a: int
    rows_b: int
    kept_tokens: int  # frequency tables: tokens in both vocabularies
    new: int  # B rows that start from the initializer
    dropped: int  # A rows no B row takes
    oov_buckets: int  # kept as they are
    slots: Tuple[str, ...]
    copied: bool  # every row stayed where it was (identity and hashing tables, equal vocabularies)


@dataclasses.dataclass(frozen=True)
class RemapReport:
    checkpoint: str  # the input's prefix
    output: str
    layout: str  # "host_embedding" | "tpu_embedding"
    prefix: str  # the embedding's path in the checkpoint
    tables: Dict[str, TableReport]
    absent: Tuple[str, ...]  # tensor-core tables the checkpoint does not hold (nothing to move)
    other_variables: int  # copied as they are
    seed: str = ""  # what seeded the default initializer: "artifact:<sha256>" (B's fingerprint) or the seed given

    def summary(self) -> str:
        lines = [f"remapped {self.checkpoint} -> {self.output} ({self.layout} at {self.prefix!r}; "
                 f"{self.other_variables} other variables copied)"]
        # "initialized": B's rows that start from the initializer (tokens not in A, reserved rows), not "new",
        # which `tpu-embed inspect` says of the tokens a lineage's day added.
        rows = [("table", "kind", "rows A", "rows B", "kept", "initialized", "dropped", "oov", "slots")]
        for t in self.tables.values():
            rows.append((t.table, t.kind + (" (copied)" if t.copied else ""), str(t.rows_a), str(t.rows_b),
                         str(t.kept_tokens), str(t.new), str(t.dropped), str(t.oov_buckets),
                         ", ".join(t.slots) or "-"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += ["  " + "  ".join(c.ljust(w) if i in (0, 1, 8) else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
        if self.seed:
            by = f"artifact B's fingerprint {self.seed[9:21]}" if self.seed.startswith("artifact:") else \
                f"seed {self.seed}"
            lines.append(f"new rows of default-initialized tables: seeded by {by} and the table")
        if self.absent:
            lines.append(f"not in the checkpoint (tensor-core tables, nothing to move): {', '.join(self.absent)}")
        return "\n".join(lines)


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
      from_artifact, to_artifact: artifact directories (A, B) of one spec's features and tables; their
        vocabularies, top_k / frequency_threshold, topology and batch sizes may differ.
      checkpoint: a checkpoint prefix (`tf.train.Checkpoint.save`'s return value) or the directory whose
        `checkpoint` file names the latest one.
      output: the new checkpoint's prefix (writes `output.index` and `output.data-00000-of-00001`).
      prefix, layout: where the embedding's variables are ("host_embedding": `HostEmbedding`, or
        "tpu_embedding": per-table `TPUEmbeddingForServing` / `TPUEmbeddingV2`), found when not given.
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
    plans = table_plans(a, b)
    used_seed: ckpt.Seed = artifact_seed(b) if seed is None else int(seed)
    source = resolve_checkpoint(checkpoint)
    if not tio.is_url(output) and os.path.isdir(output):
        raise RemapError(f"--output {output} is a directory; pass a checkpoint prefix in it, e.g. {output}/ckpt-0.")
    if os.path.abspath(output) == os.path.abspath(source) if not tio.is_url(output) else output == source:
        raise RemapError(f"the output {output} is the input checkpoint; write the remapped one beside it.")
    if tio.exists(f"{output}.index") and not overwrite:
        raise RemapError(f"{output}.index exists; pass overwrite=True (tpu-embed remap --overwrite) to replace it.")
    try:
        reader = BundleReader(source)
    except BundleError as e:
        raise RemapError(str(e)) from None
    with reader:
        sparse_core = tuple(sorted({f.table.name for f in a.model.features}))
        located = ckpt.locate(reader, plans, sparse_core, layout=layout, prefix=prefix)
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
            tables[name] = ckpt.TableSlots((initializers or {}).get(name), values)
        unknown = sorted(set(initializers or {}) - set(plans))
        if unknown:
            raise ValueError(f"initializers for unknown tables {unknown} (the tables: {sorted(plans)}).")
        moved = {n: plans[n] for n in located.tables}
        total = sum((p.rows_a + p.rows_b) * (1 + len(located.tables[n].slots)) for n, p in moved.items())
        done = [0]

        def tick(n: int) -> None:
            done[0] += n
            if progress is not None:
                progress(done[0], total)

        writer = BundleWriter(output)
        try:
            ckpt.remap_checkpoint(reader, writer, located, moved, tables, seed=used_seed, chunk_rows=chunk_rows,
                                  spill_dir=spill_dir, progress=tick)
            writer.finish(reader.header)
        except BaseException:
            writer.abort()
            raise
        ours = {k for tv in located.tables.values() for k in ckpt._keys(tv)}
        others = len([k for k in reader.entries if k not in ours])
    reports = {}
    for name, tv in located.tables.items():
        p = plans[name]
        reports[name] = TableReport(name, p.kind, p.rows_a, p.rows_b, p.kept_tokens, p.new, p.dropped,
                                    p.num_oov_buckets, tuple(sorted(tv.slots)), p.identity)
    defaulted = any(plans[n].new and not plans[n].identity and tables[n].initializer is None for n in moved)
    return RemapReport(source, output, located.layout, located.prefix, reports, located.absent, others,
                       str(used_seed) if defaulted else "")
