"""An artifact directory as the training side sees it: its spec, its manifest and its model, checked.

    a = load_artifact("gs://bucket/criteo")
    a.spec, a.manifest, a.model   # artifact.spec.Spec, artifact.manifest.Manifest, core.model.ModelConfig

The one place that opens an artifact for training (`tpu_embed.training.tpu`,
`tpu_embed.HostEmbedding.from_artifact`).  It refuses, before any step runs,
what would silently train wrong embeddings: a `spec.yaml` edited after
sharding (fingerprint), vocabularies recomputed after sharding (sizes), and a
spec whose SparseCore layout is not the one the shards were packed with, an unfinished artifact (a run
still writing it, killed or failed: `tpu_embed.artifact.verify.check_finished`), and (`verify=`) listed
files that are missing, of another size, or (small files, or "sha256") of other content than the manifest
lists.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Dict, Optional

import yaml

from tpu_embed.artifact import io as tio
from tpu_embed.artifact import verify as tverify
from tpu_embed.artifact.manifest import Manifest, ManifestError, read_manifest
from tpu_embed.artifact.spec import Spec, parse_spec
from tpu_embed.core.model import ModelConfig
from tpu_embed.sparsecore.layout import layout_of


@dataclasses.dataclass(frozen=True)
class Artifact:
    directory: str
    spec: Spec
    manifest: Manifest
    model: ModelConfig  # spec.model(the manifest's vocabulary sizes), checked against the recorded layout

    def require_shards(self) -> None:
        require_shards(self.manifest, self.directory)

    @property
    def ids_dropped_by_limits(self) -> Dict[str, int]:
        """Per stacked table: ids the shard job dropped under `allow_id_dropping` (0 for every stack without
        drops; {} when there are no shards). Per step and chip: `input_fn` elements' `dropped_ids`."""
        return ids_dropped_by_limits(self.manifest)


def ids_dropped_by_limits(m: Manifest) -> Dict[str, int]:
    if m.counts is None or m.stacks is None:
        return {}
    return {s: int(m.counts.ids_dropped_by_limits.get(s, 0)) for s in m.stacks}


def require_shards(m: Manifest, artifact_dir: str) -> None:
    if m.shards is None or m.limits is None or m.stacks is None or m.layout is None:
        raise ManifestError(f"{artifact_dir} has no shards: run `tpu-embed shard` or `tpu-embed run` with this "
                            "directory as --output.")


def load_spec_of(artifact_dir: str, manifest: Optional[Manifest] = None) -> Spec:
    """The `tpu_embed.artifact.spec.Spec` the artifact was made with (its `spec.yaml`), checked against the manifest."""
    m = manifest if manifest is not None else read_manifest(artifact_dir)
    entries = m.files_of("spec")
    path = tio.join(artifact_dir, entries[0].path if entries else "spec.yaml")
    try:
        raw = yaml.safe_load(tio.read_text(path))
    except FileNotFoundError:
        raise ManifestError(f"{path} is missing: the artifact directory is incomplete. Re-run `tpu-embed run` "
                            "(or shard) with this --output.") from None
    spec = parse_spec(raw, base_dir=artifact_dir, source_path=path)
    if spec.fingerprint != m.spec_fingerprint:
        raise ManifestError(f"{path} has fingerprint {spec.fingerprint}, but the manifest says the artifact was "
                            f"made for {m.spec_fingerprint}: spec.yaml was edited. Restore it, or re-run the jobs.")
    return spec


def _vocabulary_sizes(m: Manifest) -> Dict[str, int]:
    sizes = m.vocabulary_sizes
    if m.vocab_sizes is not None and dict(m.vocab_sizes) != sizes:
        raise ManifestError(f"{m.source}: the vocabularies ({sizes}) are not those the shards were packed with "
                            f"({dict(m.vocab_sizes)}): the vocabulary was recomputed after sharding. Re-shard.")
    return sizes


def _check_layout(model: ModelConfig, m: Manifest, artifact_dir: str) -> None:
    """The spec's stacking must be the one the shards were packed with (stacks, offsets, rotations)."""
    if m.stacks is None or m.layout is None:
        return
    ours = layout_of(model)
    recorded = {k: (tuple(v.tables), tuple(v.features), int(v.sample_count)) for k, v in m.stacks.items()}
    mine = {k: (s.tables, s.features, s.sample_count) for k, s in ours.stacks.items()}
    if mine != recorded or json.loads(json.dumps(ours.to_dict())) != m.layout:
        raise ManifestError(f"{artifact_dir}: the spec's SparseCore layout (stacks {sorted(mine)}, offsets, "
                            f"rotations) is not the one the shards were packed with (stacks {sorted(recorded)}). "
                            "The artifact is inconsistent (or made by another tpu_embed): re-run `tpu-embed run`.")


TRAINING_KINDS = ("vocabulary", "shard")  # what "size" checks: the files training reads (spec.yaml: by fingerprint)


def load_artifact(artifact_dir: str, verify: str = "size") -> Artifact:
    """Read and check an artifact: a finished one (else `ArtifactUnfinishedError`, at every level); `verify`
    ("none" | "size" | "sha256", `tpu_embed.artifact.verify`): "size": every file training reads (vocabularies,
    every host's shards; spec.yaml by its fingerprint) exists with the listed size (vocabularies also with the
    listed sha256); "sha256": every file the manifest lists (the transform output, profiles, plan.json, dead
    letters, spec.yaml too) exists with the listed sha256, each read in full; and the shards cover every step,
    else `ArtifactDamagedError` before any step runs."""
    tverify.check_level(verify)
    m = read_manifest(artifact_dir)
    tverify.check_finished(m, artifact_dir)
    if verify != "none":
        tverify.check_files(artifact_dir, m, verify, kinds=TRAINING_KINDS if verify == "size" else None)
        if m.shards is not None:
            for h in range(m.shards.format.num_hosts):
                tverify.check_shard_steps(m, h)
    spec = load_spec_of(artifact_dir, m)
    model = spec.model(_vocabulary_sizes(m))
    _check_layout(model, m, artifact_dir)
    return Artifact(artifact_dir, spec, m, model)
