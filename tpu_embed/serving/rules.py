"""The raw -> id rules of a spec with its vocabularies, TensorFlow-free: what `mapping.map_raw` applies.

`MappingPlan.from_spec(spec, sizes, directory)` takes every constant from the spec and the manifest's
vocabulary sizes; with `sizes=None` it takes the spec alone (`MappingPlan.structure`): a frequency vocabulary's
first OOV id is then its capacity, or its table's size (the lines of its file) when the graph runs, so one graph
serves every day of a lineage (`tpu_embed.serving.transform_graph`).

`load_for_serving(artifact_dir)` (and `MappingPlan.from_artifact`, `RawFeatureMapping.from_artifact`,
`export_saved_model`, `write_transform_output`) checks the vocabulary files it maps with as training's
`load_artifact` checks them (`tpu_embed.artifact.verify.check_file`: listed size and sha256), so a vocabulary
edited or damaged after the shards were written is refused (`ArtifactDamagedError`, one line naming the file)
instead of mapping tokens to other rows than the shards hold.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Dict, List, Mapping, Optional, Tuple

from tpu_embed.artifact import io as tio
from tpu_embed.artifact import verify as tverify
from tpu_embed.artifact.load import Artifact, load_artifact
from tpu_embed.artifact.manifest import Manifest
from tpu_embed.artifact.spec import Spec, vocabulary_filename

__all__ = ["DensePlan", "FeaturePlan", "MappingPlan", "check_vocabulary_files", "load_for_serving"]


@dataclasses.dataclass(frozen=True)
class FeaturePlan:
    """How one categorical feature's raw values become ids (every constant from the spec and the manifest)."""

    name: str
    column: str
    kind: str  # "frequency" | "identity" | "hashing"
    delimiter: Optional[str]
    weight_column: Optional[str]
    truncate: int  # sequence_length, or tensor_core_width; 0: keep every value
    num_buckets: Optional[int]  # identity / hashing
    default_value: Optional[int]  # identity
    num_oov_buckets: int  # frequency
    vocabulary_key: Optional[str]  # frequency: the vocabulary (features of one table share one)
    # frequency: the first OOV id (the manifest's size: the file's lines, or a capacity); None: the vocabulary
    # table's size when the graph runs (its file's lines, which is the manifest's size without a capacity)
    vocabulary_size: Optional[int]
    invalid_ids: str  # policies.invalid_ids
    nan_weights: str  # policies.nan_weights
    sequence_length: int
    on_sparse_core: bool
    table: str


@dataclasses.dataclass(frozen=True)
class DensePlan:
    name: str
    column: str
    fill: float


@dataclasses.dataclass(frozen=True)
class MappingPlan:
    """The raw -> id rules of a spec with its vocabularies: what `map_raw` applies.

    `vocabulary_files`: {vocabulary key: path of its file}; `columns`: every column read (label excluded)."""

    features: Tuple[FeaturePlan, ...]
    dense: Tuple[DensePlan, ...]
    vocabulary_files: Mapping[str, str]
    # The CSV reader dead-letters a record with bytes that are not UTF-8 in a column the spec reads (CSV is read
    # as UTF-8 text); TFRecord and Parquet binary values are bytes as they are.
    utf8_text: bool = False

    @property
    def columns(self) -> List[str]:
        cols = [d.column for d in self.dense]
        for f in self.features:
            cols += [f.column] + ([f.weight_column] if f.weight_column else [])
        return list(dict.fromkeys(cols))

    @property
    def text_columns(self) -> List[str]:
        """Columns read only as categorical values, with no delimiter or one that no number's text (decimal
        integer, float repr) contains: their values can be taken as token texts whatever their kind."""
        numeric = {d.column for d in self.dense} | {f.weight_column for f in self.features if f.weight_column}
        out = []
        for c in dict.fromkeys(f.column for f in self.features):
            delims = {f.delimiter for f in self.features if f.column == c}
            if c not in numeric and all(d is None or not set(d) & set("0123456789+-.eEinfa") for d in delims):
                out.append(c)
        return out

    @classmethod
    def from_spec(cls, spec: Spec, vocabulary_sizes: Optional[Mapping[str, int]], vocabulary_dir: str
                  ) -> "MappingPlan":
        """From a spec, its vocabulary sizes (`Manifest.vocabulary_sizes`; None: see the module docstring) and
        the directory holding `vocab/`."""
        feats = []
        files: Dict[str, str] = {}
        for f in spec.categorical:
            v = f.vocabulary
            key = spec.vocabulary_key(f) if v.type == "frequency" else None
            if key is not None and key not in files:
                first = spec.vocabulary_groups()[key][0].name
                files[key] = tio.join(vocabulary_dir, "vocab", vocabulary_filename(first))
            if key is None:
                size = None
            elif vocabulary_sizes is None:
                size = getattr(v, "capacity", None)
            else:
                size = int(vocabulary_sizes[key])
            feats.append(FeaturePlan(
                name=f.name, column=f.column, kind=v.type, delimiter=f.delimiter, weight_column=f.weight_column,
                truncate=f.sequence_length if f.sequence_length > 0 else (f.tensor_core_width or 0),
                num_buckets=v.num_buckets, default_value=v.default_value, num_oov_buckets=v.num_oov_buckets,
                vocabulary_key=key, vocabulary_size=size,
                invalid_ids=spec.policies.invalid_ids, nan_weights=spec.policies.nan_weights,
                sequence_length=f.sequence_length, on_sparse_core=f.on_sparse_core, table=f.table))
        dense = tuple(DensePlan(d.name, d.column, float(d.fill)) for d in spec.dense)
        return cls(tuple(feats), dense, files, utf8_text=spec.inputs.format == "csv")

    @classmethod
    def structure(cls, spec: Spec) -> "MappingPlan":
        """The plan of the spec alone (no vocabulary sizes; vocabulary files at `vocab/<file>`)."""
        return cls.from_spec(spec, None, "")

    @classmethod
    def from_artifact(cls, artifact_dir: str) -> "MappingPlan":
        """The plan of an artifact, its vocabulary files checked (`load_for_serving`)."""
        return load_for_serving(artifact_dir)[1]

    def fingerprint(self) -> str:
        """sha256 of everything the plan holds (its rules, sizes and file names)."""
        text = json.dumps(dataclasses.asdict(self), sort_keys=True, default=str)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_vocabulary_files(artifact_dir: str, manifest: Manifest, spec: Spec) -> None:
    """Every vocabulary file the manifest lists, as training's `load_artifact` checks it (size and sha256,
    `tpu_embed.artifact.verify.check_files`), and each file the spec's mapping reads among them; else
    `ArtifactDamagedError`, one line naming the file."""
    tverify.check_files(artifact_dir, manifest, "size", kinds=("vocabulary",))
    listed = {f.path for f in manifest.files_of("vocabulary")}
    for key, rel in sorted(MappingPlan.structure(spec).vocabulary_files.items()):  # vocab/<file>
        if rel not in listed:
            raise tverify.ArtifactDamagedError(
                f"{tio.join(artifact_dir, rel)}: vocabulary {key!r} is mapped with this file but {manifest.source} "
                f"does not list it, so it cannot be checked: the manifest is not this artifact's. Restore the "
                f"artifact's manifest.json, or re-run `tpu-embed run` with this --output (and --overwrite).")


def load_for_serving(artifact_dir: str) -> Tuple[Artifact, MappingPlan]:
    """(the artifact, its `MappingPlan`): the manifest and spec checked as training checks them (shards not
    needed), and the vocabulary files the plan maps with checked against the manifest (`check_vocabulary_files`)."""
    a = load_artifact(artifact_dir, verify="none")
    check_vocabulary_files(artifact_dir, a.manifest, a.spec)
    return a, MappingPlan.from_spec(a.spec, a.manifest.vocabulary_sizes, artifact_dir)
