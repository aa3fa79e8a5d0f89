"""`tpu-embed demo`: raw data to a trained model in one command (a few minutes on 2 cores).

    1. data      a synthetic Criteo-like data set (pipelines/demo_data.py), TFRecord of tf.train.Example
    2. jobs      vocabularies (balanced ids: `partition: {ids: balanced}`), then shards + profile in one pass, then
                 the plan of that profile (local Beam)
    3. plan      per stacked table: limits against TF's defaults, memory, drops, load balance; and the balance of
                 frequency order against the balanced ids, the same steps counted both ways
    4. train     a DLRM (tpu_embed.training.dlrm) with HostEmbedding from the shards; held-out AUC
    5. serving   the model exported as one SavedModel (tpu_embed.serving.export_saved_model), which scores the
                 held-out rows' raw tf.train.Examples: its AUC against the shards' (skipped with serving=False)
    6. report    the profile report (HTML + PNG) and a summary

With `days=2` (`--days 2`) the data is two days of one lineage, every vocabulary `mode: append` under a
capacity: day 1 runs, trains and is checkpointed; day 2 runs with day 1 as its base, restores the checkpoint
as it is and trains on, beside a cold start of the same steps (held-out log loss and AUC of both); the warm
model is the one exported.

`run_demo(output, ...)` is the whole thing;
`tpu-embed demo --output DIR [--examples N] [--days 1|2] [--no-serving]`.

The output directory: the demo writes into an empty (or new) directory, or one an earlier demo wrote (its
`demo.json`, written first): then it replaces what a demo writes there (`DEMO_ENTRIES`: data/, spec.yaml,
the artifacts, checkpoints/, model/, report/, demo.json) and keeps every other file, so a second `make demo`
runs as the first. A directory with files and no `demo.json` is refused (nothing deleted). One demo at a
time per directory: it holds `LOCK` (flock, released when the process ends, killed or not); a second is
refused naming the first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import glob
import json
import os
import shutil
import socket
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np

from pipelines import demo_data, progress, quiet, runner, transform_output
from pipelines.jobs import JobConfig
from pipelines.lineage_report import lineage_lines
from pipelines.sharding.planned_limits import PLAN_FILE
from profiles import load_plan
from profiles.balance import balance_lines
from profiles.display import short_stack_name
from profiles.report import write_report
from tpu_embed.artifact import tfrecord
from tpu_embed.artifact.manifest import read_manifest
from tpu_embed.artifact.spec import load_spec

MARKER = "demo.json"  # in the output directory: written first, it makes the directory a demo's
DATA_DIR, ARTIFACT_DIR, REPORT_DIR, MODEL_DIR = "data", "artifact", "report", "model"
CHECKPOINT_DIR, SPEC_FILE = "checkpoints", "spec.yaml"
# What a demo writes at the top of its output, every one of them (`--days 2`: artifact-day1, -day2): what the next
# demo replaces.
DEMO_ENTRIES = (MARKER, SPEC_FILE, DATA_DIR, ARTIFACT_DIR, f"{ARTIFACT_DIR}-day1", f"{ARTIFACT_DIR}-day2",
                CHECKPOINT_DIR, MODEL_DIR, REPORT_DIR)
LOCK = ".tpu-embed-demo.lock"  # held while a demo runs


class DemoError(RuntimeError):
    """A demo that cannot run (output exists, ...): shown as one line by the CLI."""


@dataclasses.dataclass
class DemoConfig:
    num_examples: int = 500_000
    global_batch_size: int = 2048
    num_files: int = 8
    seed: int = 1234
    eval_fraction: float = 0.1  # the last steps of the shards are held out
    max_train_steps: Optional[int] = None  # default: every training step once
    log_every: int = 25
    learning_rate: float = 0.002  # the dense model's Adam; the embeddings use the spec's Adagrad
    days: int = 1  # 2: two days of one lineage (mode append, capacities); day 2 warm-started from day 1
    serving: bool = True  # export the SavedModel and score the held-out raw rows with it (a minute or more)


# ---------------------------------------------------------------- output directory

def prepare_output(output: str) -> List[str]:
    """Make `output` ready for a demo: new or empty, or an earlier demo's, whose entries (`DEMO_ENTRIES`) are
    deleted; DemoError (nothing deleted) if it holds files and no demo.json. Returns what was deleted."""
    if os.path.exists(output) and not os.path.isdir(output):
        raise DemoError(f"--output {output} is a file, not a directory. Choose another --output.")
    names = sorted(n for n in os.listdir(output) if n != LOCK) if os.path.isdir(output) else []
    if names and MARKER not in names:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise DemoError(f"--output {output} holds files that `tpu-embed demo` did not write ({shown}; no {MARKER}): "
                        "the demo writes into a new or empty directory, or replaces an earlier demo's. Choose "
                        "another --output.")
    deleted = []
    for name in names:
        if name in DEMO_ENTRIES:
            path = os.path.join(output, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
            deleted.append(name)
    os.makedirs(output, exist_ok=True)
    return deleted


_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


@contextlib.contextmanager
def holding(output: str) -> Iterator[None]:
    """One demo at a time in `output`: `LOCK` locked (fcntl.flock) while the block runs, or DemoError naming the
    demo that holds it. Where the filesystem has no locks, the block runs unlocked."""
    import fcntl
    if os.path.exists(output) and not os.path.isdir(output):
        raise DemoError(f"--output {output} is a file, not a directory. Choose another --output.")
    os.makedirs(output, exist_ok=True)
    path = os.path.join(output, LOCK)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise DemoError(f"--output {output} is being written by another demo ({holder}, holding {path}). Wait "
                            "for it to finish, or choose another --output.") from None
        except OSError as e:
            os.close(fd)
            if e.errno not in _NO_FLOCK:
                raise
            yield  # no locks on this filesystem
            return
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # removed by the demo that held it, after this one opened it: open the current file
    try:
        this_holder = f"pid {os.getpid()} on {socket.gethostname()}".encode("utf-8")
        os.ftruncate(fd, 0)
        os.pwrite(fd, this_holder, 0)
        yield
    finally:
        try:
            os.remove(path)  # still locked: a demo waiting on this file opens the path again
        except FileNotFoundError:
            pass
        os.close(fd)


# ---------------------------------------------------------------- plan table

TF_DEFAULTS = (256, 256, 64)


def plan_lines(plan, stack_tables: Dict[str, List[str]]) -> List[str]:
    """The plan as a table: per stacked table the limits against TF's defaults, memory, drops, balance."""
    rows = [("stack", "tables", "max_ids_per_table", "max_unique_ids", "KiB/SC planned", "KiB/SC TF defaults",
             "drop rate", "balance")]
    for name, s in plan.stacks.items():
        rows.append((short_stack_name(name, stack_tables.get(name) or s.tables), str(len(s.tables)),
                     f"{s.max_ids_per_table} (TF {TF_DEFAULTS[0]})",
                     f"{s.max_unique_ids_per_table} (TF {TF_DEFAULTS[1]})",
                     f"{s.memory['planned_bytes_per_sc'] / 1024:.1f}",
                     f"{s.memory['tf_default_bytes_per_sc'] / 1024:.1f}",
                     f"{s.drops['drop_rate_at_most']:.3g}",
                     "-" if s.destination_balance is None else f"{s.destination_balance:.2f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = ["  " + "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
           for r in rows]
    m = plan.memory
    out.append(f"  max_ids_per_chip_per_sample = {plan.max_ids_per_chip_per_sample} (TF {TF_DEFAULTS[2]}); "
               f"allow_id_dropping = {plan.allow_id_dropping}")
    saved = m["tf_default_bytes_per_sc"] - m["planned_bytes_per_sc"]
    out.append(f"  buffer memory per SparseCore: {m['planned_bytes_per_sc'] / 1024:.1f} KiB planned vs "
               f"{m['tf_default_bytes_per_sc'] / 1024:.1f} KiB with TF's defaults "
               f"({'saves' if saved >= 0 else 'needs'} {abs(saved) / 1024:.1f} KiB)")
    over = [n for n, s in plan.stacks.items() if s.max_ids_per_table > TF_DEFAULTS[0]
            or s.max_unique_ids_per_table > TF_DEFAULTS[1]]
    if over:
        out.append(f"  with TF's defaults {len(over)} stacked table(s) would fail a step: the limits were measured, "
                   "not guessed")
    out.append("  balance = busiest destination SparseCore / mean over the whole run (1.00 is perfect)")
    return out


# ---------------------------------------------------------------- training

def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U, ties averaged)."""
    labels = np.asarray(labels, np.float64)
    scores = np.asarray(scores, np.float64)
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(scores.size, np.float64)
    s = scores[order]
    r = np.arange(1, scores.size + 1, dtype=np.float64)
    # average ranks of ties
    bounds = np.flatnonzero(np.diff(s)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [s.size]])
    avg = (r[starts] + r[ends - 1]) / 2.0
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


@dataclasses.dataclass
class TrainResult:
    train_steps: int
    eval_steps: int
    first_loss: float
    last_loss: float
    losses: List[float]
    steps_per_second: float
    eval_loss: float
    eval_auc: float
    eval_examples: int


@dataclasses.dataclass
class Trained:
    """A trained model and what its held-out evaluation saw (the serving check scores the same rows)."""
    result: TrainResult
    embedding: Any  # tpu_embed.HostEmbedding
    model: Any  # tpu_embed.training.dlrm
    optimizer: Any  # the dense model's Adam
    eval_first_example: int  # the held-out examples are the day's input records from this one on, in order
    eval_labels: np.ndarray
    eval_scores: np.ndarray  # the model's logits on the held-out shards


def model_dense(dense):
    """The dense features as the model takes them: count features on a log scale (training and serving)."""
    import tensorflow as tf
    return tf.math.log1p(tf.maximum(tf.cast(dense, tf.float32), 0.0))


def log_loss(labels: np.ndarray, logits: np.ndarray) -> float:
    s, y = np.asarray(logits, np.float64), np.asarray(labels, np.float64)
    return float(np.mean(np.maximum(s, 0) - s * y + np.log1p(np.exp(-np.abs(s)))))


def train_and_evaluate(artifact: str, cfg: DemoConfig, say: Callable[[str], None] = print,
                       warm_start: Optional[str] = None) -> Trained:
    """Train tpu_embed.training.dlrm with HostEmbedding on the first steps of the shards, evaluate on the rest.

    `warm_start`: a checkpoint of an earlier day (`save_checkpoint`) restored before training: the embedding
    tables with their Adagrad slots, the dense model and its optimizer. Its tables must have this artifact's
    rows (an `append` lineage under capacities; else `tpu-embed remap` it first)."""
    # TensorFlow (and tpu_embed's training side, built on it) only where the demo trains: seconds to import.
    import tensorflow as tf
    import tf_keras as keras

    from tpu_embed import HostEmbedding
    from tpu_embed.training.dlrm import dlrm
    from tpu_embed.training.input import input_fn

    spec = load_spec(os.path.join(artifact, "spec.yaml"))
    m = read_manifest(artifact)
    steps = int(m.counts.steps)  # type: ignore[union-attr]  # a shard job's manifest has counts
    eval_steps = max(1, int(round(steps * cfg.eval_fraction)))
    train_steps = steps - eval_steps
    if cfg.max_train_steps is not None:
        train_steps = min(train_steps, cfg.max_train_steps)
    if train_steps < 1:
        raise DemoError(f"{artifact} has {steps} steps: too few to train and hold some out.")
    emb = HostEmbedding.from_artifact(artifact, seed=cfg.seed)
    emb.build()
    model = dlrm(len(spec.dense), {f.name: spec.table(f.table).dim for f in spec.sparse_core_features},
                 seed=cfg.seed)
    opt = keras.optimizers.Adam(learning_rate=cfg.learning_rate)
    restored = None
    if warm_start is not None:
        restored = tf.train.Checkpoint(embedding=emb, model=model, optimizer=opt).restore(warm_start)

    def inputs(record, activations):
        return {"dense": model_dense(record["dense"]), "embeddings": activations}

    @tf.function(reduce_retracing=True)
    def dense_step(dense, label, mask, activations):
        with tf.GradientTape() as tape:
            tape.watch(activations)
            logits = model({"dense": dense, "embeddings": activations})
            per = tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits)
            loss = tf.reduce_sum(per * mask) / tf.maximum(tf.reduce_sum(mask), 1.0)
        grads = tape.gradient(loss, (model.trainable_variables, activations))
        opt.apply_gradients(zip(grads[0], model.trainable_variables))
        return loss, grads[1]

    ds = iter(input_fn(artifact))
    losses: List[float] = []
    window: List[float] = []
    bar = progress.bar(train_steps, "training", unit="step")
    t0 = time.time()
    t_first = None
    for step in range(train_steps):
        record = next(ds)
        activations, preserved = emb.dequeue(record)
        x = inputs(record, activations)
        loss, act_grads = dense_step(x["dense"], record["label"], record["mask"], activations)
        emb.apply_gradients(act_grads, preserved)
        loss = float(loss)
        losses.append(loss)
        window.append(loss)
        if step == 0:
            t_first = time.time()  # the first step traces the model
            if restored is not None:  # every variable there is now (the model's, Adam's slots) came from it
                restored.assert_existing_objects_matched()
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4f}")
        if (step + 1) % cfg.log_every == 0 or step + 1 == train_steps:
            rate = step / (time.time() - t_first) if step else 0.0  # type: ignore[operator]  # set at step 0
            say(f"  step {step + 1:4d}/{train_steps}  loss {np.mean(window):.4f}  ({rate:.1f} steps/s)")
            window = []
    bar.close()
    elapsed = time.time() - (t_first or t0)
    rate = (train_steps - 1) / elapsed if train_steps > 1 and elapsed > 0 else 0.0
    emb.flush()

    # Held out: the last steps of the shards (never trained on).
    for _ in range(steps - eval_steps - train_steps):
        next(ds)
    labels, scores, masks = [], [], []
    for _ in range(eval_steps):
        record = next(ds)
        activations, _ = emb.dequeue(record)
        x = inputs(record, activations)
        logits = model(x)
        labels.append(record["label"].numpy())
        scores.append(logits.numpy())
        masks.append(record["mask"].numpy())
    y, s, w = (np.concatenate(a) for a in (labels, scores, masks))
    keep = w > 0
    y, s = y[keep], s[keep]
    head = float(np.mean(losses[:min(10, len(losses))]))
    tail = float(np.mean(losses[-min(10, len(losses)):]))
    result = TrainResult(train_steps, eval_steps, head, tail, losses, rate, log_loss(y, s), auc(y, s),
                         int(keep.sum()))
    return Trained(result, emb, model, opt, (steps - eval_steps) * spec.global_batch_size, y, s)


def save_checkpoint(trained: Trained, path: str) -> str:
    """The embedding (tables and slots), the dense model and its optimizer: what the next day starts from."""
    import tensorflow as tf
    return tf.train.Checkpoint(embedding=trained.embedding, model=trained.model,
                               optimizer=trained.optimizer).save(path)


# ---------------------------------------------------------------- serving

@dataclasses.dataclass
class ServingCheck:
    path: str
    examples: int
    auc_shards: float
    auc_saved_model: float
    max_abs_difference: float  # between the two paths' logits, example by example
    export_seconds: float
    score_seconds: float


def held_out_records(patterns: Sequence[str], first: int, count: int) -> List[bytes]:
    """Serialized tf.train.Examples `first` .. `first + count - 1` of the input, in the shards' order (the files
    sorted by path, records in file order; the demo's data has no dead letters)."""
    paths = sorted(p for pattern in patterns for p in glob.glob(pattern))
    out: List[bytes] = []
    seen = 0
    for path in paths:
        records = tfrecord.read_records(path)
        lo, hi = max(first - seen, 0), min(first + count - seen, len(records))
        if lo < hi:
            out.extend(records[lo:hi])
        seen += len(records)
        if len(out) == count:
            break
    return out


def held_out_examples(artifact: str, trained: Trained, inputs: Sequence[str]) -> List[bytes]:
    """The raw tf.train.Examples of the rows `trained` held out, from `inputs` (the artifact's input files),
    checked against the held-out shards: as many, with the same labels in the same order."""
    import tensorflow as tf

    spec = load_spec(os.path.join(artifact, "spec.yaml"))
    n = trained.eval_labels.size
    records = held_out_records(inputs, trained.eval_first_example, n)
    if len(records) != n:
        raise DemoError(f"{list(inputs)} hold {len(records)} records from record {trained.eval_first_example} on, "
                        f"not the {n} held-out examples of {artifact}'s shards: the serving check cannot compare "
                        "them.")
    label = spec.label.column  # type: ignore[union-attr]  # the demo's spec has a label
    labels = tf.io.parse_example(records, {label: tf.io.FixedLenFeature([], tf.float32)})
    if not np.array_equal(labels[label].numpy(), trained.eval_labels):
        raise DemoError(f"the held-out input records of {artifact} do not line up with its held-out shards "
                        "(labels differ): the serving check cannot compare them.")
    return records


def export_and_score(artifact: str, trained: Trained, records: Sequence[bytes], path: str,
                     batch_size: int = 4096) -> ServingCheck:
    """Export the trained model with `tpu_embed.serving.export_saved_model` and score the held-out rows' raw
    tf.train.Examples (`held_out_examples`) with the SavedModel's `serving_default`, as a server would; the AUC
    must be the shards'."""
    import tensorflow as tf

    from tpu_embed.serving import export_saved_model

    t = time.time()
    export_saved_model(artifact, trained.embedding, trained.model, path,
                       model_inputs=lambda mapped, acts: {"dense": model_dense(mapped["dense"]), "embeddings": acts})
    export_seconds = time.time() - t
    t = time.time()
    serve = tf.saved_model.load(path).signatures["serving_default"]
    scores, valid = [], []
    for i in range(0, len(records), batch_size):
        # The first call logs, from C++, that oneDNN falls back to Eigen for int64 ops on this CPU (an E-level
        # line that TF_CPP_MIN_LOG_LEVEL does not hide); the call's errors still raise.
        with quiet.muted_stderr() if i == 0 else contextlib.nullcontext():
            out = serve(examples=tf.constant(list(records[i:i + batch_size])))
        scores.append(out["logits"].numpy())  # the model's output: the shards' eval_scores are logits too
        valid.append(out["valid"].numpy())
    s, ok = np.concatenate(scores), np.concatenate(valid)
    if not ok.all():
        raise DemoError(f"the SavedModel marked {int((~ok).sum())} held-out records invalid that the shards kept.")
    return ServingCheck(path, len(records), trained.result.eval_auc, auc(trained.eval_labels, s),
                        float(np.max(np.abs(s - trained.eval_scores))), export_seconds, time.time() - t)


def serving_lines(check: ServingCheck) -> List[str]:
    return [f"      SavedModel {check.path} ({check.export_seconds:.1f} s); serving_default on the "
            f"{check.examples:,} held-out raw tf.train.Examples ({check.score_seconds:.1f} s):",
            f"      AUC {check.auc_saved_model:.4f} from the SavedModel, {check.auc_shards:.4f} from the shards "
            f"(largest logit difference {check.max_abs_difference:.2g})"]


# ---------------------------------------------------------------- the demo

class _Steps:
    """`[i/n] text` headings."""

    def __init__(self, total: int):
        self.total, self.done = total, 0

    def __call__(self, text: str) -> str:
        self.done += 1
        return f"[{self.done}/{self.total}] {text}"


def _write_spec(output: str, patterns: Sequence[str], cfg: DemoConfig, name: str = SPEC_FILE,
                capacities: Optional[Dict[str, int]] = None) -> str:
    path = os.path.join(output, name)
    with open(path, "w") as fh:
        fh.write(demo_data.spec_text(patterns, path, cfg.global_batch_size, capacities))
    return path


def _run_jobs(spec, artifact: str, examples: int, beam_args, say, times: dict, key: str,
              base: Optional[str] = None):
    spec = load_spec(spec) if isinstance(spec, str) else spec
    job = JobConfig(spec=spec, output=artifact, base=base)
    graph = transform_output.start(spec, base)  # as `tpu-embed run`: built beside the jobs unless cached
    try:
        t = time.time()
        with progress.records("  vocabularies", examples):
            runner.run_vocab(job, beam_args)
        times[f"{key}vocab"] = time.time() - t
        say(f"      vocabularies: {times[f'{key}vocab']:.1f} s")
        t = time.time()
        with progress.records("  shards + profile", examples):
            m = runner.run_shard(job, beam_args)
        assert m.counts is not None  # a shard job's manifest has counts
        times[f"{key}shard"] = time.time() - t
        say(f"      shards + profile + plan: {times[f'{key}shard']:.1f} s; {m.counts.examples_written:,} examples in "
            f"{m.counts.steps} steps of {spec.global_batch_size} on {spec.topology.num_chips} chips x "
            f"{spec.topology.num_sc_per_chip} SparseCores")
        t = time.time()
        m = transform_output.write(artifact, spec, graph)
        times[f"{key}transform_output"] = time.time() - t
        say(f"      tf.Transform output: {times[f'{key}transform_output']:.1f} s more ({artifact}/transform_output)")
        return m
    finally:
        transform_output.cancel(graph)  # a failed job's: the child stops


def _say_plan(artifact: str, m, say) -> None:
    plan = load_plan(os.path.join(artifact, PLAN_FILE))
    stacks = {k: list(v.tables) for k, v in (m.stacks or {}).items()}
    for line in plan_lines(plan, stacks):
        say(line)
    for line in balance_lines(plan.balance, stacks):  # frequency order -> balanced ids, with the floor
        say(line)


def _result_line(r: TrainResult) -> str:
    return (f"      loss {r.first_loss:.4f} -> {r.last_loss:.4f} over {r.train_steps} steps "
            f"({r.steps_per_second:.1f} steps/s); held out: {r.eval_examples:,} examples, "
            f"log loss {r.eval_loss:.4f}, AUC {r.eval_auc:.3f}")


def _train_summary(r: TrainResult) -> dict:
    return {k: v for k, v in dataclasses.asdict(r).items() if k != "losses"}


def run_demo(output: str, *, cfg: Optional[DemoConfig] = None, beam_args=(),
             say: Callable[[str], None] = print) -> dict:
    """Everything `tpu-embed demo` does; returns what it produced (also written to OUTPUT/demo.json). An earlier
    demo's output in `output` is replaced (see the module docstring)."""
    cfg = cfg or DemoConfig()
    if cfg.days not in (1, 2):
        raise DemoError(f"--days {cfg.days}: the demo runs 1 day, or a lineage of 2 (--days 2).")
    with holding(output):
        return _run_demo(output, cfg, beam_args, say)


def _run_demo(output: str, cfg: DemoConfig, beam_args, say: Callable[[str], None]) -> dict:
    t_start = time.time()
    if prepare_output(output):
        say(f"(replacing the earlier demo in {output})")
    with open(os.path.join(output, MARKER), "w") as fh:
        json.dump({"status": "running", "config": dataclasses.asdict(cfg)}, fh)
    run = _run_two_days if cfg.days == 2 else _run_one_day
    summary = run(output, cfg, beam_args, say)
    report_dir = os.path.join(output, REPORT_DIR)
    html = summary["report"]
    pngs = sorted(f for f in os.listdir(report_dir) if f.endswith(".png"))
    total = time.time() - t_start
    summary = {"status": "done", "config": dataclasses.asdict(cfg), **summary}
    summary["seconds"] = {k: round(v, 1) for k, v in dict(summary["seconds"], total=total).items()}
    with open(os.path.join(output, MARKER), "w") as fh:
        json.dump(summary, fh, indent=1)

    artifact = summary["artifact"]
    say("")
    say(f"Done in {total:.0f} s. Produced:")
    produced = [(summary["data"], "the raw data"), (summary["spec"], "its spec")]
    if cfg.days == 2:
        produced += [(summary["days"][0]["artifact"], "day 1's artifact: vocab/, shards/, profiles/, "
                      "transform_output/, plan.json, manifest.json"), (summary["days"][0]["checkpoint"],
                                                                       "day 1's checkpoint")]
    produced.append((artifact, ("day 2's artifact" if cfg.days == 2 else "the artifact") +
                     ": vocab/, shards/, profiles/, transform_output/, plan.json, manifest.json"))
    if summary["serving"] is not None:
        produced.append((summary["serving"]["path"], "the SavedModel (serving_default: serialized tf.train.Examples)"))
    produced.append((html, f"the profile report ({len(pngs)} plots)"))
    width = max(len(p) for p, _ in produced)
    for path, what in produced:
        say(f"  {path.ljust(width)}  {what}")
    exe = command_as_typed()
    say("Next:")
    say(f"  {exe} inspect {artifact}")
    say(f"  open {html}")
    if cfg.days == 1:
        say(f"  {exe} demo --days 2 --output build/demo2   # two days: append, restore, train on")
    say(f"  {exe} run --spec examples/criteo/spec.yaml --output build/criteo   # the same on your own spec")
    return summary


def command_as_typed() -> str:
    """How the user can type `tpu-embed` again: the bare name where it is on PATH as this very script, else the
    script's path as run (`make demo` runs `.venv/bin/tpu-embed`, whose folder is not on PATH)."""
    script = sys.argv[0] if sys.argv and os.path.basename(sys.argv[0]) == "tpu-embed" else None
    if script is None:
        return "tpu-embed"
    on_path = shutil.which("tpu-embed")
    if on_path and os.path.realpath(on_path) == os.path.realpath(script):
        return "tpu-embed"
    return os.path.relpath(script) if not os.path.relpath(script).startswith("..") else script


def _run_one_day(output: str, cfg: DemoConfig, beam_args, say) -> dict:
    step = _Steps(5 + int(cfg.serving))
    data_dir, artifact, report_dir = (os.path.join(output, d) for d in (DATA_DIR, ARTIFACT_DIR, REPORT_DIR))
    times: Dict[str, float] = {}

    say(step(f"data: {cfg.num_examples:,} synthetic Criteo-like examples (13 dense, 26 categorical with Zipf "
             "skew, 2 multivalent, 1 weighted, 1 sequence feature)"))
    t = time.time()
    with progress.bar(cfg.num_examples, "  generating", unit="examples") as bar:
        paths = demo_data.write_dataset(data_dir, cfg.num_examples, seed=cfg.seed, num_files=cfg.num_files,
                                        progress=bar.update)
    spec_path = _write_spec(output, [f"{DATA_DIR}/part-*.tfrecord"], cfg)
    times["data"] = time.time() - t
    size = sum(os.path.getsize(p) for p in paths)
    say(f"      {len(paths)} TFRecord files, {size / 2**20:.0f} MiB in {data_dir} ({times['data']:.1f} s); "
        f"spec: {spec_path}")

    say(step("jobs (Apache Beam, local runner): vocabularies, then shards + profile in one pass, then the plan"))
    m = _run_jobs(spec_path, artifact, cfg.num_examples, beam_args, say, times, "")

    say(step(f"plan ({os.path.join(artifact, PLAN_FILE)}; recorded in manifest.json and used for the shards)"))
    _say_plan(artifact, m, say)

    say(step(f"training a DLRM on CPU with HostEmbedding from the shards (held out: the last "
             f"{cfg.eval_fraction:.0%} of the steps)"))
    t = time.time()
    trained = train_and_evaluate(artifact, cfg, say)
    times["train"] = time.time() - t
    say(_result_line(trained.result))

    check = _serving_step(artifact, trained, load_spec(spec_path).input_patterns(), output, cfg, times, say, step,
                          "serving: the model exported as one SavedModel (raw tf.train.Examples in, logits and "
                          "probabilities out), scored on the held-out rows")

    say(step("profile report"))
    t = time.time()
    html = write_report(os.path.join(artifact, "profiles"), os.path.join(artifact, PLAN_FILE), report_dir)
    times["report"] = time.time() - t
    return {"data": data_dir, "spec": spec_path, "artifact": artifact, "plan": os.path.join(artifact, PLAN_FILE),
            "report": html, "seconds": times, "train": _train_summary(trained.result),
            "serving": check and dataclasses.asdict(check)}


def _run_two_days(output: str, cfg: DemoConfig, beam_args, say) -> dict:
    step = _Steps(7 + int(cfg.serving))
    data_dir, report_dir = os.path.join(output, DATA_DIR), os.path.join(output, REPORT_DIR)
    artifacts = [os.path.join(output, f"{ARTIFACT_DIR}-day{d}") for d in (1, 2)]
    checkpoint_prefix = os.path.join(output, CHECKPOINT_DIR, "day1", "ckpt")
    per_day = cfg.num_examples // 2
    times: Dict[str, float] = {}

    capacities = demo_data.append_capacities(per_day)
    say(step(f"data: {cfg.num_examples:,} synthetic Criteo-like examples as two days of {per_day:,} (the same "
             "hidden effects per token; each day brings new tokens)"))
    t = time.time()
    with progress.bar(cfg.num_examples, "  generating", unit="examples") as bar:
        paths = demo_data.write_days(data_dir, cfg.num_examples, 2, seed=cfg.seed, num_files=cfg.num_files,
                                     progress=bar.update)
    spec_path = _write_spec(output, [f"{DATA_DIR}/day1/part-*.tfrecord"], cfg, capacities=capacities)
    times["data"] = time.time() - t
    say(f"      {sum(len(p) for p in paths)} TFRecord files in {data_dir}/day1 and day2 ({times['data']:.1f} s); "
        f"spec: {spec_path}: every vocabulary `mode: append` with a capacity (e.g. C3 {capacities['C3']:,} rows, "
        f"history {capacities['history']:,}), so the tables keep their shapes from day to day")

    say(step("day 1 jobs: vocabularies (the lineage's first day), shards + profile, plan"))
    m1 = _run_jobs(spec_path, artifacts[0], per_day, beam_args, say, times, "day1_")
    for line in _vocabulary_lines(m1, artifacts[0]):
        say(line)

    say(step(f"day 1 plan ({os.path.join(artifacts[0], PLAN_FILE)})"))
    _say_plan(artifacts[0], m1, say)

    say(step(f"day 1 training (held out: the last {cfg.eval_fraction:.0%} of the steps), then a checkpoint"))
    t = time.time()
    day1 = train_and_evaluate(artifacts[0], cfg, say)
    checkpoint = save_checkpoint(day1, checkpoint_prefix)
    times["day1_train"] = time.time() - t
    say(_result_line(day1.result))
    say(f"      checkpoint: {checkpoint} (tables with their Adagrad slots, the DLRM and its Adam)")

    say(step(f"day 2 jobs with --base {artifacts[0]}: day-1 tokens keep their ids, new ones take the free rows"))
    # The same spec on day 2's files (`tpu-embed run --spec S --input 'data/day2/*' --base artifact-day1`).
    spec2 = load_spec(spec_path).with_inputs([os.path.abspath(os.path.join(data_dir, "day2", "part-*.tfrecord"))])
    m2 = _run_jobs(spec2, artifacts[1], per_day, beam_args, say, times, "day2_", base=artifacts[0])
    for line in _vocabulary_lines(m2, artifacts[1]):
        say(line)

    say(step("day 2 training: warm (day 1's checkpoint restored as it is) against cold (fresh tables and "
             "model, same seed and steps)"))
    t = time.time()
    say("  warm start:")
    warm = train_and_evaluate(artifacts[1], cfg, say, warm_start=checkpoint)
    say(_result_line(warm.result))
    say("  cold start:")
    cold = train_and_evaluate(artifacts[1], cfg, say)
    say(_result_line(cold.result))
    times["day2_train"] = time.time() - t
    w, c = warm.result, cold.result
    say(f"      held out on day 2 after {w.train_steps} steps: log loss {w.eval_loss:.4f} warm vs "
        f"{c.eval_loss:.4f} cold, AUC {w.eval_auc:.3f} warm vs {c.eval_auc:.3f} cold")

    check = _serving_step(artifacts[1], warm, spec2.input_patterns(), output, cfg, times, say, step,
                          "serving: day 2's warm model exported as one SavedModel, scored on day 2's held-out raw rows")

    say(step("profile report (day 2)"))
    t = time.time()
    html = write_report(os.path.join(artifacts[1], "profiles"), os.path.join(artifacts[1], PLAN_FILE), report_dir)
    times["report"] = time.time() - t
    return {"data": data_dir, "spec": spec_path, "artifact": artifacts[1],
            "plan": os.path.join(artifacts[1], PLAN_FILE), "report": html, "seconds": times,
            "train": _train_summary(w),
            "days": [{"artifact": artifacts[0], "checkpoint": checkpoint, "train": _train_summary(day1.result)},
                     {"artifact": artifacts[1], "warm": _train_summary(w), "cold": _train_summary(c)}],
            "serving": check and dataclasses.asdict(check)}


def _serving_step(artifact: str, trained: Trained, inputs: Sequence[str], output: str, cfg: DemoConfig,
                  times: dict, say, step: _Steps, heading: str) -> Optional[ServingCheck]:
    # The held-out raw rows are found and checked against the shards even when the export is skipped (cheap).
    records = held_out_examples(artifact, trained, inputs)
    if not cfg.serving:
        return None  # not a step: `step` counted it only with serving
    say(step(heading))
    t = time.time()
    check = export_and_score(artifact, trained, records, os.path.join(output, MODEL_DIR))
    times["serving"] = time.time() - t
    for line in serving_lines(check):
        say(line)
    return check


def _vocabulary_lines(m, artifact: str) -> List[str]:
    """The lineage line, and the vocabularies that took new tokens or found their capacity full (every one:
    `tpu-embed inspect`)."""
    lines = lineage_lines(m)
    shown = sorted((x for x in lines[1:] if " 0 new)" not in x or "over capacity" in x),
                   key=lambda x: "over capacity" not in x)  # a full capacity first
    out = ["      " + x.strip() for x in lines[:1]] + ["      " + x for x in shown[:8]]
    if len(lines) - 1 > len(out) - 1:
        out.append(f"        ... and {len(lines) - len(out)} more: tpu-embed inspect {artifact}")
    return out


def main(output: str, num_examples: Optional[int], beam_args=(), days: int = 1, serving: bool = True) -> int:
    cfg = DemoConfig(days=days, serving=serving)
    if num_examples is not None:
        cfg.num_examples = num_examples
    run_demo(output, cfg=cfg, beam_args=beam_args)
    sys.stdout.flush()
    return 0
