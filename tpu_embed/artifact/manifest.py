"""manifest.json, typed: the contract between the offline jobs and the training side.

    m = read_manifest(artifact_dir)      # the one reader; ManifestError with the path and the fix
    m.vocabulary_sizes                   # {vocabulary key: size}
    m.shard_format, m.shard_files(host)  # what input_fn reads
    m.to_json(), m.to_bytes()            # the dict / the exact bytes on disk

The jobs (`pipelines.jobs.manifest_writer`) build the JSON, validate it against
`Manifest` and write it through `tpu_embed.artifact.io`; the bytes are
`json.dumps(d, indent=1, sort_keys=True) + "\\n"` (`manifest_bytes`), so the
same content always gives the same bytes.  Reading and writing back a
manifest keeps exactly the keys it had (`to_json` dumps what was set).

Versioning: `schema_version` is 1.  A manifest with a higher version was
written by a newer tpu_embed and is refused (upgrade, or regenerate).  Keys
this version does not know are kept and written back unchanged, so a
later release may add keys without a new schema version; it bumps the
version when a key changes meaning.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from tpu_embed.artifact import io as tio
from tpu_embed.artifact.shard_format import ShardFormat
from tpu_embed.core.topology import Topology

SCHEMA_VERSION = 1
KIND = "tpu_embed.artifact"
FILENAME = "manifest.json"

FileKind = Literal["vocabulary", "shard", "dead_letter", "spec", "profile", "plan", "token_counts", "transform_output",
                   "frequency_ids"]


class ManifestError(ValueError):
    """A manifest that is missing, unreadable, foreign or of an unknown schema; the message names the fix."""


class ManifestNotFoundError(ManifestError, FileNotFoundError):
    """The artifact directory has no manifest.json."""


class _Section(BaseModel):
    # Frozen; unknown keys are kept (see the module docstring).
    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)


class TopologyInfo(_Section):
    num_chips: int
    num_sc_per_chip: int
    num_hosts: int

    def to_topology(self) -> Topology:
        return Topology(num_chips=self.num_chips, num_sc_per_chip=self.num_sc_per_chip, num_hosts=self.num_hosts)


class BatchSizes(_Section):
    global_: int = Field(alias="global")
    per_host: int
    per_chip: int
    chips_per_host: int


class InputInfo(_Section):
    path: str
    bytes: int


class LimitsInfo(_Section):
    """The SparseCore limits the shards are packed with: what the shard job packs with, and what it records."""
    source: str  # "tf-defaults" | "spec" | "plan:<path>" | "cli"
    max_ids_per_chip_per_sample: int
    max_ids_per_table: Dict[str, int]
    max_unique_ids_per_table: Dict[str, int]
    allow_id_dropping: bool

    def to_json(self) -> dict:
        """As written in the manifest: the stacks of each table of limits in sorted order."""
        return {"source": self.source, "max_ids_per_chip_per_sample": self.max_ids_per_chip_per_sample,
                "max_ids_per_table": dict(sorted(self.max_ids_per_table.items())),
                "max_unique_ids_per_table": dict(sorted(self.max_unique_ids_per_table.items())),
                "allow_id_dropping": self.allow_id_dropping}


class JobInfo(_Section):
    """How one job (vocab, shard, profile) ran; `counts` are its Beam counters, nested by '/'."""
    job: str
    inputs: List[InputInfo]
    strict: bool
    counts: Dict[str, Any] = {}
    engine: Optional[str] = None  # vocab
    tail_policy: Optional[str] = None  # shard / profile
    steps_per_file: Optional[int] = None
    vocab_dir: Optional[str] = None
    plan: Optional[str] = None
    limits: Optional[LimitsInfo] = None
    vocab_sizes: Optional[Dict[str, int]] = None
    # {column: the tf.train.Feature kinds of its values in the records the job read} (`Manifest.value_kinds`)
    value_kinds: Optional[Dict[str, List[str]]] = None


class VocabularyInfo(_Section):
    key: str
    features: List[str]
    size: int
    empty_vocabulary_dummy: bool
    num_oov_buckets: int
    top_k: Optional[int] = None
    frequency_threshold: Optional[int] = None
    tokens_counted: int
    distinct_tokens: int
    tokens_covered: int
    coverage: float
    files: List[str]
    # Vocabulary modes append / frozen (tpu_embed.artifact.lineage); absent for rebuild. `size` (the rows the
    # model is built with before the OOV buckets, and the first OOV id) is then the capacity when one is given.
    mode: Optional[str] = None
    capacity: Optional[int] = None
    tokens: Optional[int] = None  # tokens in use: the lines of the vocabulary file (the dummy not counted)
    base_tokens: Optional[int] = None  # of them, the base's (same ids)
    new_tokens: Optional[int] = None  # admitted this day (the next ids)
    not_admitted_tokens: Optional[int] = None  # counted here, not in the vocabulary (OOV)
    not_admitted_count: Optional[int] = None  # their occurrences
    capacity_overflow_tokens: Optional[int] = None  # of them, those that qualified but found the capacity full
    capacity_overflow_count: Optional[int] = None
    counts_file: Optional[str] = None  # vocab/<key>.counts.parquet: token, id, count, last_day
    # `partition: {ids: balanced}` (pipelines.mapping.balanced_ids): how the ids were assigned: `order`
    # (balanced, or frequency with `why`), the `layout` and `stack` balanced for, `num_sparse_cores`, the table's
    # `rotation`, `fixed_ids` (a base's, kept), `frequency_ids` (the file: per id, its frequency-order id) and
    # `stack_lookups_balance` (busiest destination / mean over the counted lookups, both orders).
    ids: Optional[Dict[str, Any]] = None


class LineageBase(_Section):
    path: str  # the base's directory relative to this artifact's (a URL as given)
    day: int
    vocabulary_fingerprint: str


class LineageInfo(_Section):
    """The lineage of an artifact with append / frozen vocabularies (`tpu_embed.artifact.lineage`)."""
    id: str  # the first day's vocabulary_fingerprint[:32], inherited along the lineage
    day: int
    vocabulary_fingerprint: str  # sha256 of this day's vocabulary and token-count files (and day, base, spec)
    base: Optional[LineageBase] = None  # None: the first day
    table_rows_changed: List[str] = []  # vocabulary keys whose table rows differ from the base's


class StackInfo(_Section):
    tables: List[str]
    features: List[str]
    sample_count: int
    padded_dim: int


class Counts(_Section):
    records_read: int
    records_invalid: int
    files_read: int
    dead_letters: Dict[str, int]
    examples_valid: int
    examples_written: int
    examples_dropped: Dict[str, int]  # {"tail", "invalid_records"}
    examples_padding: int
    steps: int
    ids: Dict[str, Dict[str, int]]  # per feature: values, ids, oov, ... dropped
    ids_dropped_by_limits: Dict[str, int]


class TensorCoreFeatureFormat(_Section):
    name: str
    weighted: bool
    width: int


class StackFormat(_Section):
    name: str
    row_pointers_buffer: int
    ids_buffer: int
    gains: Optional[str] = None  # shard format 2: "stored" | "omitted_if_unit"
    sample_ids: Optional[str] = None  # shard format 2: "int32" | "uint16" | "uint8"
    token_ids: Optional[str] = None  # shard format 2: "int32" | "uint16" | "uint8"
    padding: Optional[str] = None  # shard format 2: "stored" | "omitted"
    samples: Optional[int] = None  # shard format 2: the stack's samples per chip


class ShardFormatInfo(_Section):
    version: int
    num_hosts: int
    chips_per_host: int
    host_batch_size: int
    dense_features: List[str]
    tensor_core_features: List[TensorCoreFeatureFormat]
    stacks: List[StackFormat]
    compression: Optional[str] = None  # shard format 2: "none" | "GZIP" | "ZLIB"
    keys: Optional[str] = None  # shard format 2: "names" | "short"


class ShardsInfo(_Section):
    format: ShardFormatInfo
    steps: int
    tail_policy: str
    steps_per_file: int


class ShuffleInfo(_Section):
    """`tpu_embed.core.permutation`'s algorithm and the spec's seed: enough to recompute every example's position."""
    algorithm: str
    version: int
    rounds: int
    seed: int


class BatchingInfo(_Section):
    """How examples became steps (`pipelines.jobs.global_batches.FormGlobalBatches`); `steps` = epochs x
    steps_per_epoch."""
    examples: int  # valid examples, one epoch
    steps: int
    epochs: int = 1
    steps_per_epoch: int
    tail_policy: str
    tail_dropped_per_epoch: int
    tail_padding_per_epoch: int
    shuffle: Optional[ShuffleInfo] = None  # None: (input file, record) order


class ProfileInfo(_Section):
    directory: str  # relative to the artifact directory when inside it
    files_written: int
    # A day of a lineage: the days whose steps the profile covers (its base's merged with its own), the base
    # whose profile was merged (None: not merged) and, where it was not, why.
    days: Optional[List[int]] = None
    base: Optional[str] = None
    not_merged: Optional[str] = None


class FileEntry(_Section):
    path: str  # relative to the artifact directory when inside it
    sha256: str
    bytes: int
    kind: FileKind
    records: Optional[int] = None
    feature: Optional[str] = None  # vocabulary
    host: Optional[int] = None  # shard
    first_step: Optional[int] = None
    last_step: Optional[int] = None
    input: Optional[str] = None  # dead_letter: the input file
    total: Optional[int] = None  # dead_letter: letters counted (records: letters written)


class FeatureInfo(_Section):
    table: str
    vocabulary_type: str
    device: str
    sequence_length: int
    dim: int
    table_vocabulary_size: int
    vocabulary_key: Optional[str] = None
    vocabulary_file: Optional[str] = None
    vocabulary_size: Optional[int] = None
    counts: Optional[Dict[str, int]] = None


class Manifest(_Section):
    """An artifact directory's manifest.json (schema 1).

    Sections written by the vocab job: `vocabularies`; by the shard/profile
    jobs: `layout`, `stacks`, `limits`, `vocab_sizes`, `counts`, `batching`,
    `profile` and (shard) `shards`.  The others are always there.
    """

    schema_version: int
    kind: str
    spec_fingerprint: str
    spec_name: str
    topology: TopologyInfo
    batch_sizes: BatchSizes
    jobs: Dict[str, JobInfo]
    files: List[FileEntry]
    features: Dict[str, FeatureInfo]
    vocabularies: Optional[Dict[str, VocabularyInfo]] = None
    layout: Optional[Dict[str, Any]] = None  # tpu_embed.sparsecore layout's to_dict()
    stacks: Optional[Dict[str, StackInfo]] = None
    limits: Optional[LimitsInfo] = None
    vocab_sizes: Optional[Dict[str, int]] = None
    counts: Optional[Counts] = None
    shards: Optional[ShardsInfo] = None
    profile: Optional[ProfileInfo] = None
    batching: Optional[BatchingInfo] = None
    lineage: Optional[LineageInfo] = None  # vocabulary modes append / frozen
    # {column: the tf.train.Feature kinds ("bytes_list", "float_list", "int64_list") its values had in the records
    # the jobs read}, over every job's `value_kinds`: CSV cells are text (bytes_list), a Parquet column the kind of
    # its Arrow type, a TFRecord key the kinds its Features held (a key whose kinds differ within one batch of
    # the reader is read as text: bytes_list). A column that held no value is not listed. Serving parses a column
    # of one kind as that kind (`tpu_embed.serving.examples`); None (written before the jobs recorded it): any kind.
    value_kinds: Optional[Dict[str, List[str]]] = None

    _source: str = PrivateAttr(default="<manifest>")

    # ------------------------------------------------------------ construction

    @classmethod
    def from_json(cls, data: Any, source: str = "<manifest>") -> "Manifest":
        """Validate a parsed manifest.json; ManifestError (naming `source`) if it is not one this version reads."""
        _check_header(data, source)
        try:
            m = cls.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            raise ManifestError(
                f"{source} does not match manifest schema {SCHEMA_VERSION}: {where}: {first['msg']} "
                f"({e.error_count()} problem(s)). The file was edited or damaged: regenerate it with "
                "`tpu-embed run` (or vocab/shard).") from None
        m._source = source
        return m

    @property
    def source(self) -> str:
        """Where this manifest was read from (for messages)."""
        return self._source

    # ------------------------------------------------------------ training side

    @property
    def vocabulary_sizes(self) -> Dict[str, int]:
        """{vocabulary key: size} of the frequency vocabularies (what `Spec.layout` etc. take)."""
        if self.vocabularies is None:
            raise ManifestError(f"{self.source} has no vocabularies: run `tpu-embed vocab` (or `tpu-embed run`) "
                                "with this directory as --output, or pass the directory that has them.")
        return {k: int(v.size) for k, v in self.vocabularies.items()}

    @property
    def shard_format(self) -> ShardFormat:
        """The `tpu_embed.artifact.shard_format.ShardFormat` of the shards."""
        return ShardFormat.from_json(self._require_shards().format.model_dump(mode="json", by_alias=True),
                                     source=self.source)

    def _require_shards(self) -> ShardsInfo:
        if self.shards is None:
            raise ManifestError(f"{self.source} has no shards: run `tpu-embed shard` or `tpu-embed run` (not "
                                "`tpu-embed profile` or `vocab`) with this directory as --output.")
        return self.shards

    def shard_files(self, host_index: int = 0) -> List[FileEntry]:
        """The host's shard files in step order."""
        hosts = self._require_shards().format.num_hosts
        if not 0 <= host_index < hosts:
            raise ValueError(f"host_index {host_index} is outside [0, {hosts}) hosts of this artifact.")
        files = [f for f in self.files if f.kind == "shard" and f.host == host_index]
        return sorted(files, key=lambda f: f.first_step if f.first_step is not None else -1)

    def files_of(self, kind: str) -> List[FileEntry]:
        return [f for f in self.files if f.kind == kind]

    # ------------------------------------------------------------ JSON

    def to_json(self) -> dict:
        """The manifest as the JSON dict it was made from (keys that were set, by their JSON names)."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)

    def to_bytes(self) -> bytes:
        return manifest_bytes(self.to_json())

    # Read-only dict view, for code written against the JSON (m["counts"]["steps"]).
    def __getitem__(self, key: str) -> Any:
        return self.to_json()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_json().get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self.to_json()


def manifest_bytes(d: dict) -> bytes:
    """The bytes of manifest.json for a manifest dict (the one encoding; deterministic)."""
    return json.dumps(d, indent=1, sort_keys=True).encode("utf-8") + b"\n"


def manifest_path(artifact_dir: str) -> str:
    return tio.join(artifact_dir, FILENAME)


def _check_header(data: Any, source: str) -> None:
    if not isinstance(data, dict):
        raise ManifestError(f"{source} is not a tpu_embed manifest (a JSON {type(data).__name__}, not an object). "
                            "Point at an artifact directory written by `tpu-embed run` (or vocab/shard).")
    if data.get("kind") != KIND:
        raise ManifestError(f"{source} is not a tpu_embed artifact manifest (kind {data.get('kind')!r}, expected "
                            f"{KIND!r}). Point at an artifact directory written by `tpu-embed run` (or vocab/shard).")
    v = data.get("schema_version")
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ManifestError(f"{source} has an unknown schema_version {v!r} (this tpu_embed reads {SCHEMA_VERSION}). "
                            "Regenerate the artifacts with `tpu-embed run`.")
    if v > SCHEMA_VERSION:
        raise ManifestError(f"{source} has schema_version {v}: it was written by a newer tpu_embed (this version "
                            f"reads {SCHEMA_VERSION}). Upgrade tpu_embed, or regenerate the artifacts with this "
                            "version.")


def parse_manifest(raw: bytes, source: str) -> Manifest:
    """Decode manifest.json bytes.

    Args:
      raw: the file's bytes.
      source: where they were read, for messages.

    Returns:
      The `Manifest`.

    Raises:
      ManifestError: bad UTF-8, empty, bad or truncated JSON, a foreign kind or an unknown schema version.
    """
    fix = "Regenerate it: re-run `tpu-embed run` (or vocab/shard) with this --output."
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestError(f"{source} is not UTF-8 text (byte {e.start}): the file is corrupt. {fix}") from None
    if not text.strip():
        raise ManifestError(f"{source} is empty (an interrupted copy?). {fix}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string"):  # the text ends mid-value
            raise ManifestError(f"{source} is truncated: its JSON ends after {len(raw)} bytes in the middle of a "
                                f"value ({e.msg}). {fix}") from None
        raise ManifestError(f"{source} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}). "
                            f"{fix}") from None
    return Manifest.from_json(data, source)


def read_manifest(artifact_dir: str) -> Manifest:
    """The manifest of an artifact directory: the one place it is read.

    Args:
      artifact_dir: the artifact directory (local path or object-store URL such as gs://...).

    Returns:
      The `Manifest`.

    Raises:
      ManifestNotFoundError: the directory has no manifest.json.
      ManifestError: manifest.json is a directory or cannot be decoded (see `parse_manifest`).
    """
    path = manifest_path(artifact_dir)
    try:
        raw = tio.read_bytes(path)
    except FileNotFoundError:
        raise ManifestNotFoundError(
            f"{artifact_dir} has no {FILENAME}: it is not an artifact directory (yet). Run `tpu-embed run` (or "
            f"vocab/shard) with --output {artifact_dir}, or point at the directory you gave as --output.") from None
    except IsADirectoryError:
        raise ManifestError(f"{path} is a directory, not a manifest file.") from None
    return parse_manifest(raw, path)
