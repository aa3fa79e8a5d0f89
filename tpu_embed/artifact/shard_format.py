"""The shard format: what a reader needs to know of an artifact's records (`ShardFormat`, in the manifest).

One `tf.train.Example` per training step per host, written by `pipelines.sharding.step_records` with
`tpu_embed.artifact.shard_records.encode_step_record` in the format `tpu_embed.artifact.shard_format_choice`
chooses for the spec, read back by `shard_records.decode_record`
(numpy, no TensorFlow) and by `tpu_embed.training.input` (`parse_fn`, a `tf.data` map function that
restores TF's full-size CSR buffers for `TPUEmbeddingV2.dequeue`, and `input_fn`).

Features of a record (arrays are raw little-endian bytes in a bytes_list of
one element, so they parse with one `tf.io.decode_raw`):

    step                      int64   global step index
    host                      int64   host index
    label                     float32 [host_batch]
    mask                      float32 [host_batch]  1 real example, 0 tail padding
    dense                     float32 [host_batch * num_dense], row-major
    tc/<feature>/lengths      int32   [host_batch]   tensor-core features: values per example
    tc/<feature>/ids          int64   [sum(lengths)]
    tc/<feature>/weights      float32 [sum(lengths)] (weighted features only)
    sc/<chip>/<stack>/row_pointers        int32   [row_pointers_unpadded_size]
    sc/<chip>/<stack>/sorted_sample_ids   int32   [ids_unpadded_size]
    sc/<chip>/<stack>/sorted_token_ids    int32   [ids_unpadded_size]
    sc/<chip>/<stack>/sorted_gains        float32 [ids_unpadded_size]
    sc/<chip>/<stack>/sizes   int64 [row_pointers_unpadded_size, ids_unpadded_size, sample_count,
                                     num_minibatches_per_physical_sparse_core, dropped_ids]

`<chip>` is the chip's index on its host (0 .. chips_per_host-1); the global
chip is host * chips_per_host + chip.  Only the meaningful prefixes are
stored; `parse_fn` pads them back to TF's static buffer sizes (zeros, where
TF leaves uninitialised memory).  Encoding is hand-written protobuf with keys
in sorted order, so equal content gives equal bytes.

That is format version 1, and version 2 with its defaults.  Version 2
(`FORMAT_VERSION`, what the jobs write) adds, recorded in the manifest's
`shards.format` (`ShardFormat`):

* `compression`: "none", "GZIP" or "ZLIB" -- each shard file is one zlib
  stream over its TFRecord frames, byte for byte what `tf.io.TFRecordWriter`
  with `TFRecordOptions(compression_type=...)` writes (`tpu_embed.artifact.tfrecord`);
* `keys: "short"`: `sc/<chip>/<stack index>/{rp,cnt,sid,tid,g,n}` instead of
  the names above;
* per stack a `StackEncoding`: sample / token ids as uint8 or uint16 when the
  layout bounds them (the type's maximum stands for PAD_VALUE), gains left out
  of a record when they are all 1.0, and for small per-chip batches the
  padding entries left out (row pointers stored as per-partition counts).

Version 2 also records which layouts the records hold (`layouts`, written only when it is not just
"tensorflow"): "tensorflow" (the `sc/...` keys above, for `TPUEmbeddingV2.dequeue`) and/or "jax"
(jax-tpu-embedding's input arrays under `jax/<stack index>/...`, described by `jax`: its stacking and
static sizes; written and read by `tpu_embed.artifact.jax_records`). Records of a format without "tensorflow"
have no `sc/` keys (`stacks` is empty).

Readers accept versions 1 and 2 (`READ_VERSIONS`) and refuse others, naming the
manifest, the version and the fix.  Whatever the encoding, `decode_record` and
`parse_fn` give version 1's arrays and tensors.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from tpu_embed.artifact.tfrecord import canonical_compression

FORMAT_VERSION = 2  # what this tpu_embed writes
READ_VERSIONS = (1, 2)  # what it reads
SIZES_FIELDS = ("row_pointers_unpadded_size", "ids_unpadded_size", "sample_count",
                "num_minibatches_per_physical_sparse_core", "dropped_ids")
GAINS = ("stored", "omitted_if_unit")
PADDING = ("stored", "omitted")
KEYS = ("names", "short")
LAYOUTS = ("tensorflow", "jax")
ID_DTYPES: Dict[str, Any] = {"int32": np.int32, "uint16": np.uint16, "uint8": np.uint8}
# Array keys of a stack's record entry: "names" (version 1) sc/<chip>/<stack>/<name>, "short" sc/<chip>/<i>/<short>
# (i: the stack's index in the format's `stacks`). `counts` replaces `row_pointers` when padding is omitted.
SHORT_KEYS = {"row_pointers": "rp", "counts": "cnt", "sorted_sample_ids": "sid", "sorted_token_ids": "tid",
              "sorted_gains": "g", "sizes": "n"}


@dataclasses.dataclass(frozen=True)
class StackEncoding:
    """How one stack's CSR arrays are stored in format version 2 (the defaults are version 1's encoding).

    * `gains`: "stored" (always a gains key), or "omitted_if_unit": the key is left out of a record
      when every gain of that chip's prefix is 1.0 (padding entries: float32(PAD_VALUE), as always);
      readers rebuild exactly those float32 values.
    * `sample_ids` / `token_ids`: the little-endian integer type of the sample / token ids: "int32", or
      "uint16" / "uint8" when every real id of the stack is below the type's maximum, which then stands
      for PAD_VALUE. Readers widen them to int32.
    * `padding`: "stored" (the prefixes as TF lays them out, padding entries included), or "omitted":
      only the real entries are stored, and instead of the row pointers the number of real entries of
      each row pointer's partition (`counts`, an int64_list: protobuf varints, one byte per count
      below 128). TF's layout follows from them: partition i starts at the sum of the earlier counts
      each rounded up to a multiple of 8, its row pointer is start + count, and the entries from there
      to the next multiple of 8 are padding (ids PAD_VALUE, gains float32(PAD_VALUE)).
    """

    gains: str = "stored"
    sample_ids: str = "int32"
    token_ids: str = "int32"
    padding: str = "stored"

    def __post_init__(self):
        if self.gains not in GAINS:
            raise ValueError(f"gains must be one of {GAINS}, got {self.gains!r}")
        if self.padding not in PADDING:
            raise ValueError(f"padding must be one of {PADDING}, got {self.padding!r}")
        for k in ("sample_ids", "token_ids"):
            if getattr(self, k) not in ID_DTYPES:
                raise ValueError(f"{k} must be one of {tuple(ID_DTYPES)}, got {getattr(self, k)!r}")


V1_ENCODING = StackEncoding()


def narrowest_id_dtype(bound: int) -> str:
    """The narrowest id type for ids in [0, bound) that keeps its maximum free for PAD_VALUE."""
    for name in ("uint8", "uint16"):
        if bound <= int(np.iinfo(ID_DTYPES[name]).max):
            return name
    return "int32"


@dataclasses.dataclass(frozen=True)
class ShardFormat:
    """What a reader needs to know about the records of an artifact (stored in manifest.json).

    Version 2 adds `compression` (of each whole shard file, as TFRecordDataset reads it), `keys` (the
    record's key names: "names" as in version 1, or "short"), per-stack `StackEncoding`s (`encodings`
    lists the stacks not encoded as in version 1) and each stack's samples per chip (`samples`: the
    layout's `sample_count`; informational, `parse_fn` uses it to tell ids buffers much larger than the
    data from tight ones). A version-1 format has none of them.
    """

    num_hosts: int
    chips_per_host: int
    host_batch_size: int
    dense_features: Tuple[str, ...]
    tensor_core_features: Tuple[Tuple[str, bool, int], ...]  # (name, weighted, width)
    stacks: Tuple[Tuple[str, int, int], ...]  # (stack, row_pointers buffer size, ids buffer size)
    version: int = FORMAT_VERSION
    compression: str = "none"
    encodings: Tuple[Tuple[str, StackEncoding], ...] = ()  # (stack, encoding), stacks not encoded as in v1
    keys: str = "names"
    samples: Tuple[Tuple[str, int], ...] = ()  # (stack, samples per chip), where known
    layouts: Tuple[str, ...] = ("tensorflow",)  # which layouts the records hold (LAYOUTS)
    # The jax records' description (tpu_embed.artifact.jax_records.jax_format): plain JSON, as the manifest holds it,
    # so that reading a format needs no jax stacking.
    jax: Optional[Mapping[str, Any]] = dataclasses.field(default=None, hash=False)

    def __post_init__(self):
        object.__setattr__(self, "layouts", tuple(self.layouts))
        if not self.layouts or any(x not in LAYOUTS for x in self.layouts) or len(set(self.layouts)) < len(
                self.layouts):
            raise ValueError(f"layouts must be distinct values of {LAYOUTS}, got {list(self.layouts)}")
        if ("jax" in self.layouts) != (self.jax is not None):
            raise ValueError("a shard format holds jax records exactly when it describes them (`jax`)")
        if self.layouts != ("tensorflow",) and self.version < 2:
            raise ValueError("shard format version 1 holds TensorFlow's layout only")
        object.__setattr__(self, "compression", canonical_compression(self.compression))
        object.__setattr__(self, "encodings", tuple((s, e) for s, e in self.encodings if e != V1_ENCODING))
        if self.keys not in KEYS:
            raise ValueError(f"keys must be one of {KEYS}, got {self.keys!r}")
        if self.version == 1 and (self.compression != "none" or self.encodings or self.keys != "names"
                                  or self.samples):
            raise ValueError("shard format version 1 has no compression, stack encodings, short keys or samples")

    def encoding(self, stack: str) -> StackEncoding:
        return dict(self.encodings).get(stack, V1_ENCODING)

    def key(self, chip: int, stack: str, array: str) -> str:
        """The record key of one chip's stack array (`CSR_ARRAYS` names, "counts" or "sizes")."""
        if self.keys == "names":
            return f"sc/{chip}/{stack}/{array}"
        return f"sc/{chip}/{[s for s, _, _ in self.stacks].index(stack)}/{SHORT_KEYS[array]}"

    def to_json(self) -> dict:
        d: Dict[str, Any] = {
            "version": self.version, "num_hosts": self.num_hosts, "chips_per_host": self.chips_per_host,
            "host_batch_size": self.host_batch_size, "dense_features": list(self.dense_features),
            "tensor_core_features": [{"name": n, "weighted": w, "width": k} for n, w, k in self.tensor_core_features],
            "stacks": [{"name": s, "row_pointers_buffer": r, "ids_buffer": i} for s, r, i in self.stacks]}
        if self.version >= 2:
            d["compression"], d["keys"] = self.compression, self.keys
            samples = dict(self.samples)
            for st in d["stacks"]:
                st.update(dataclasses.asdict(self.encoding(st["name"])))
                if st["name"] in samples:
                    st["samples"] = samples[st["name"]]
            if self.layouts != ("tensorflow",):
                d["layouts"] = list(self.layouts)
                d["jax"] = self.jax
        return d

    @classmethod
    def from_json(cls, d: Mapping, source: Optional[str] = None) -> "ShardFormat":
        """The format of `manifest.json["shards"]["format"]`; ValueError (naming `source`) if this version
        cannot read it."""
        where = f"{source}: " if source else ""
        v = d.get("version")
        if not isinstance(v, int) or isinstance(v, bool) or v not in READ_VERSIONS:
            newer = isinstance(v, int) and not isinstance(v, bool) and v > FORMAT_VERSION
            raise ValueError(
                f"{where}shard format version {v!r} is not supported by this tpu_embed (it reads versions "
                f"{', '.join(map(str, READ_VERSIONS))})" + (
                    ": the shards were written by a newer tpu_embed. Upgrade tpu_embed, or regenerate the shards "
                    "with this version (`tpu-embed run` / `shard`)." if newer else
                    ". Regenerate the shards with this version (`tpu-embed run` / `shard`)."))
        encodings, samples = [], []
        try:
            compression = canonical_compression(d.get("compression")) if v >= 2 else "none"
            keys = (d.get("keys") or "names") if v >= 2 else "names"
            if keys not in KEYS:
                raise ValueError(f"keys must be one of {KEYS}, got {keys!r}")
            for s in d["stacks"]:
                if v >= 2:
                    encodings.append((s["name"], StackEncoding(
                        s.get("gains") or "stored", s.get("sample_ids") or "int32", s.get("token_ids") or "int32",
                        s.get("padding") or "stored")))
                    if s.get("samples") is not None:
                        samples.append((s["name"], int(s["samples"])))
        except ValueError as e:
            raise ValueError(f"{where}shard format version {v}: {e}. The manifest was edited, or written by a "
                             "newer tpu_embed: upgrade tpu_embed, or regenerate the shards.") from None
        return cls(int(d["num_hosts"]), int(d["chips_per_host"]), int(d["host_batch_size"]),
                   tuple(d["dense_features"]),
                   tuple((t["name"], bool(t["weighted"]), int(t["width"])) for t in d["tensor_core_features"]),
                   tuple((s["name"], int(s["row_pointers_buffer"]), int(s["ids_buffer"])) for s in d["stacks"]),
                   version=v, compression=compression, encodings=tuple(encodings), keys=keys, samples=tuple(samples),
                   layouts=tuple(d.get("layouts") or ("tensorflow",)), jax=d.get("jax"))
