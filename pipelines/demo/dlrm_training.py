"""The demo's model: a DLRM (tpu_embed.training.dlrm) trained with HostEmbedding from the shards, evaluated on the
steps held out, and checkpointed for the next day."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from pipelines import progress
from pipelines.demo.options import DemoConfig, DemoError
from tpu_embed.artifact.manifest import read_manifest
from tpu_embed.artifact.spec import load_spec


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
    steps = int(read_manifest(artifact).counts.steps)  # type: ignore[union-attr]  # a shard job's manifest has counts
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
    ds = iter(input_fn(artifact))
    losses, rate = _train(ds, emb, model, opt, train_steps, cfg, say, restored)
    # Held out: the last steps of the shards (never trained on).
    for _ in range(steps - eval_steps - train_steps):
        next(ds)
    y, s, kept = _evaluate(ds, emb, model, eval_steps)
    head = float(np.mean(losses[:min(10, len(losses))]))
    tail = float(np.mean(losses[-min(10, len(losses)):]))
    result = TrainResult(train_steps, eval_steps, head, tail, losses, rate, log_loss(y, s), auc(y, s), kept)
    return Trained(result, emb, model, opt, (steps - eval_steps) * spec.global_batch_size, y, s)


def _inputs(record, activations):
    """A shard record and its embedding activations as the model takes them."""
    return {"dense": model_dense(record["dense"]), "embeddings": activations}


def _dense_step(model, opt):
    """One step of the dense model on a record's activations: its loss and the activations' gradients."""
    import tensorflow as tf  # the demo's training imports (see train_and_evaluate)

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
    return dense_step


def _train(ds, emb, model, opt, train_steps: int, cfg: DemoConfig, say: Callable[[str], None],
           restored) -> Tuple[List[float], float]:
    """`train_steps` steps from `ds`: the loss of each, and the steps per second after the first (which traces
    the model)."""
    dense_step = _dense_step(model, opt)
    losses: List[float] = []
    window: List[float] = []
    bar = progress.bar(train_steps, "training", unit="step")
    t0 = time.time()
    t_first = None
    for step in range(train_steps):
        record = next(ds)
        activations, preserved = emb.dequeue(record)
        x = _inputs(record, activations)
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
    return losses, rate


def _evaluate(ds, emb, model, eval_steps: int) -> Tuple[np.ndarray, np.ndarray, int]:
    """The labels and logits of the real examples of the next `eval_steps` steps of `ds`, and their count."""
    labels, scores, masks = [], [], []
    for _ in range(eval_steps):
        record = next(ds)
        activations, _ = emb.dequeue(record)
        logits = model(_inputs(record, activations))
        labels.append(record["label"].numpy())
        scores.append(logits.numpy())
        masks.append(record["mask"].numpy())
    y, s, w = (np.concatenate(a) for a in (labels, scores, masks))
    keep = w > 0
    return y[keep], s[keep], int(keep.sum())


def save_checkpoint(trained: Trained, path: str) -> str:
    """The embedding (tables and slots), the dense model and its optimizer: what the next day starts from."""
    import tensorflow as tf
    return tf.train.Checkpoint(embedding=trained.embedding, model=trained.model,
                               optimizer=trained.optimizer).save(path)
