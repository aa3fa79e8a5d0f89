"""The demo's serving check: the trained model exported as one SavedModel scores the held-out rows' raw
tf.train.Examples, as a server would, with the shards' AUC."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import time
from typing import List, Sequence

import numpy as np

from pipelines.demo.dlrm_training import Trained, auc, model_dense
from pipelines.demo.options import DemoError
from tpu_embed.artifact import tfrecord
from tpu_embed.artifact.spec import load_spec
from tpu_embed.core import quiet


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
