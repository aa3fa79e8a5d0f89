"""manifest.json: what an artifact directory holds, how it was made, and what was counted (`write_manifest`).

One manifest per artifact directory; each job (vocab, shard, profile) updates its own sections and the file
list, then the whole manifest is validated against `tpu_embed.artifact.manifest.Manifest` (the typed schema
the training side reads) and replaced atomically through `tpu_embed.artifact.io`. The jobs write it last, in
one step after every other output. No timestamps: the same inputs and spec give the same manifest bytes.
While a job command holds the directory (its run marker is there: `pipelines.output.claim`), every manifest
written here carries `unfinished` (the marker's command, pid, host, start), which readers refuse
(`tpu_embed.artifact.verify.check_finished`); the command's last step removes it.
"""

from __future__ import annotations

import collections
from typing import Any, Dict, List, Optional, Sequence

import apache_beam as beam
import yaml

from pipelines.jobs.counters import MAX_PREFIX, SumCounters
from pipelines.jobs.job_config import JobConfig
from pipelines.output import write_atomic
from pipelines.read import value_kinds
from pipelines.read.records import InputFile
from tpu_embed.artifact import io as tio
from tpu_embed.artifact import jax_records, lineage
from tpu_embed.artifact import verify as tverify
from tpu_embed.artifact.manifest import (
    FILENAME,
    KIND,
    SCHEMA_VERSION,
    Manifest,
    manifest_bytes,
    manifest_path,
    read_manifest,
)

TRANSFORM_OUTPUT_KIND = "transform_output"  # the files of `pipelines.tft_output_writer`


def job_json(cfg: JobConfig, files: Sequence[InputFile], job: str) -> dict:
    """The job's section of the manifest: what it was given (spec, inputs, options)."""
    spec = cfg.spec
    d = {
        "job": job,
        "spec": spec.to_dict(),
        "spec_fingerprint": spec.fingerprint,
        "inputs": [{"path": f.path, "bytes": f.size} for f in files],
        "strict": cfg.strict,
    }
    if job == "vocab":
        d["engine"] = cfg.vocab_engine
    else:
        d["tail_policy"] = cfg.tail_policy
        d["steps_per_file"] = cfg.steps_per_file
        d["vocab_dir"] = _rel(cfg.vocab_dir or cfg.output, cfg.output)
        d["plan"] = cfg.plan
    return d


def _rel(path: str, base: str) -> str:
    """`path` relative to the artifact directory when inside it (manifests do not depend on where DIR is)."""
    rel = tio.relpath(path, base)
    return path if rel is None else rel


def existing_manifest(output: str) -> Optional[Manifest]:
    """The manifest already in `output`, or None if there is none yet (a damaged one raises ManifestError)."""
    if not tio.exists(manifest_path(output)):
        return None
    return read_manifest(output)


def _nest_counts(stats: Dict[str, int]) -> dict:
    """Flat counter keys ('feature/C1/oov') -> nested dicts."""
    out: Dict[str, Any] = {}
    for k, v in sorted(stats.items()):
        parts = k.split("/")
        d = out
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = int(v)
    return out


def update_manifest(output: str, job: str, job_cfg: dict, *, stats: Dict[str, int], files: List[dict],
                    extra: dict) -> Manifest:
    """Write output/manifest.json with this job's sections, keeping those of the other jobs of the same spec."""
    existing = existing_manifest(output)
    fp = job_cfg["spec_fingerprint"]
    if existing is None or existing.spec_fingerprint != fp:
        # A manifest of another spec describes files this run replaces: start afresh.
        m: Dict[str, Any] = {"schema_version": SCHEMA_VERSION, "kind": KIND, "spec_fingerprint": fp, "jobs": {},
                             "files": []}
    else:
        m = existing.to_json()
    spec = job_cfg["spec"]
    m["spec_name"] = spec["name"]
    m["topology"] = spec["topology"]
    topo = spec["topology"]
    gbs = spec["global_batch_size"]
    m["batch_sizes"] = {"global": gbs, "per_host": gbs // topo["num_hosts"], "per_chip": gbs // topo["num_chips"],
                        "chips_per_host": topo["num_chips"] // topo["num_hosts"]}
    spec_info = write_atomic(output, "spec.yaml", _yaml(spec), extra={"kind": "spec"})
    files = list(files) + [spec_info.to_json()]

    maxima = {k: v for k, v in stats.items() if k.startswith(MAX_PREFIX)}
    kinds = {k: v for k, v in stats.items() if k.startswith(value_kinds.COUNTER_PREFIX)}
    stats = {k: v for k, v in stats.items() if not k.startswith((MAX_PREFIX, value_kinds.COUNTER_PREFIX))}
    counts = _nest_counts(stats)
    jobinfo = {k: v for k, v in job_cfg.items()
               if k not in ("spec", "spec_fingerprint", "layout", "format", "lineage")}
    jobinfo["counts"] = counts
    if kinds or "records_read" in stats:  # the job read records: the kinds their values had
        jobinfo["value_kinds"] = value_kinds.recorded_kinds(kinds)
    m["jobs"][job] = jobinfo
    _record_value_kinds(m)

    if job == "vocab":
        replaced = _vocab_sections(m, job_cfg, extra, files, fp)
    else:
        replaced = _shard_sections(m, job, job_cfg, stats, maxima, extra, output)
    kept = [f for f in m.get("files", []) if f.get("kind") not in replaced]
    m["files"] = sorted(kept + files, key=lambda f: f["path"])
    m["features"] = _features(spec, m)
    return _write(output, m)


def _vocab_sections(m: dict, job_cfg: dict, extra: dict, files: List[dict], fp: str) -> set:
    """The vocabulary job's sections of manifest `m`; returns the kinds of files this job's replace."""
    m["vocabularies"] = extra.get("vocabularies", {})
    m.pop("lineage", None)
    if job_cfg.get("lineage") is not None:
        sizes = {k: v["size"] for k, v in m["vocabularies"].items()}
        m["lineage"] = lineage.lineage_section(job_cfg["lineage"], files, fp, sizes)
    # The transform output holds the vocabularies: a new vocabulary job's makes it stale.
    return {"vocabulary", "spec", "dead_letter", lineage.COUNTS_KIND, TRANSFORM_OUTPUT_KIND}


def _shard_sections(m: dict, job: str, job_cfg: dict, stats: Dict[str, int], maxima: Dict[str, int], extra: dict,
                    output: str) -> set:
    """The shard or profile job's sections of manifest `m`; returns the kinds of files this job's replace."""
    m["layout"] = job_cfg["layout"]
    m["stacks"] = {name: {"tables": s["tables"], "features": s["features"], "sample_count": s["sample_count"],
                          "padded_dim": s["padded_dim"]} for name, s in job_cfg["layout"]["stacks"].items()}
    m["limits"] = job_cfg["limits"]
    m["vocab_sizes"] = job_cfg["vocab_sizes"]
    batching = extra.get("batching", {"examples": 0, "steps": 0, "tail_dropped": 0, "tail_padding": 0})
    m["counts"] = _summary_counts(stats, batching, job_cfg)
    m["batching"] = _batching(batching, job_cfg)
    if job == "shard":
        fmt = dict(job_cfg["format"])
        if fmt.get("jax") is not None:
            fmt["jax"] = jax_records.with_static_sizes(fmt["jax"], maxima)
        m["shards"] = {"format": fmt, "steps": batching["steps"],
                       "tail_policy": job_cfg["tail_policy"], "steps_per_file": job_cfg["steps_per_file"]}
        replaced = {"shard", "dead_letter", "spec", "profile", "plan"}
    else:
        replaced = {"dead_letter", "spec", "profile"}
    if "profile" in extra:
        m["profile"] = dict(extra["profile"], directory=_rel(extra["profile"]["directory"], output))
    return replaced


def _record_value_kinds(m: dict) -> None:
    """The manifest's `value_kinds`: every job's, joined (what serving parses Examples as); absent where no job
    recorded them."""
    recorded = [j["value_kinds"] for j in m["jobs"].values() if j.get("value_kinds") is not None]
    if not recorded:
        m.pop("value_kinds", None)
        return
    joined: Dict[str, set] = {}
    for r in recorded:
        for column, kinds in r.items():
            joined.setdefault(column, set()).update(kinds)
    m["value_kinds"] = {c: sorted(k) for c, k in sorted(joined.items())}


def replace_files(output: str, kind: str, files: List[dict]) -> Manifest:
    """Rewrite output/manifest.json with `files` (`FileInfo.to_json()`s) as its files of `kind`."""
    m = read_manifest(output).to_json()
    m["files"] = sorted([f for f in m["files"] if f.get("kind") != kind] + list(files), key=lambda f: f["path"])
    return _write(output, m)


def _write(output: str, m: dict) -> Manifest:
    marker = tverify.read_run_marker(output)
    if marker is None:
        m.pop(tverify.UNFINISHED_KEY, None)
    else:  # a job command is writing the directory (or died writing it): not an artifact before it finishes
        m[tverify.UNFINISHED_KEY] = {k: marker[k] for k in ("command", "pid", "host", "started") if k in marker}
    typed = Manifest.from_json(m, manifest_path(output))  # what is written is what readers accept
    write_atomic(output, FILENAME, manifest_bytes(m))
    return typed


def _batching(b: dict, job_cfg: dict) -> dict:
    """How examples became steps: per epoch (one unless shuffled) and in total; `shuffle` null = input order."""
    return {"examples": b.get("examples", 0), "steps": b.get("steps", 0), "epochs": b.get("epochs", 1),
            "steps_per_epoch": b.get("steps_per_epoch", b.get("steps", 0)), "tail_policy": job_cfg["tail_policy"],
            "tail_dropped_per_epoch": b.get("tail_dropped_per_epoch", b.get("tail_dropped", 0)),
            "tail_padding_per_epoch": b.get("tail_padding_per_epoch", b.get("tail_padding", 0)),
            "shuffle": b.get("shuffle")}


def _summary_counts(stats: Dict[str, int], batching: dict, job_cfg: dict) -> dict:
    invalid = {k.split("/", 1)[1]: v for k, v in stats.items() if k.startswith("dead_letter/")}
    read = stats.get("records_read", 0)
    valid = stats.get("records_valid", 0)
    padding = stats.get("examples_padding", 0)
    written = stats.get("examples_in_steps", 0) - padding
    features: Dict[str, Dict[str, int]] = collections.defaultdict(dict)
    for k, v in stats.items():
        if k.startswith("feature/"):
            _, name, what = k.split("/", 2)
            features[name][what] = v
    dropped_ids = {k.split("/")[1]: v for k, v in stats.items() if k.startswith("stack/") and k.endswith("dropped_ids")}
    return {
        "records_read": read,
        "records_invalid": read - valid,
        "files_read": stats.get("files_read", 0),
        "records_dead_lettered": stats.get("records_dead_lettered", 0),  # = records_invalid (one letter each)
        "files_dead_lettered": stats.get("files_dead_lettered", 0),  # whole files (record -1), not in records_read
        "dead_letters": dict(sorted(invalid.items())),
        "examples_valid": valid,
        "examples_written": written,
        "examples_dropped": {"tail": batching.get("tail_dropped", 0),
                             "invalid_records": read - valid},
        "examples_padding": padding,
        "steps": batching.get("steps", 0),
        "ids": dict(sorted(features.items())),
        "ids_dropped_by_limits": dict(sorted(dropped_ids.items())),
    }


def _features(spec: dict, m: dict) -> dict:
    out = {}
    vocabs = m.get("vocabularies", {})
    tables = {t["name"]: t for t in spec["tables"]}
    shared = collections.Counter(f["table"] for f in spec["categorical"])
    for f in spec["categorical"]:
        key = f["table"] if shared[f["table"]] > 1 else f["name"]
        v = f["vocabulary"]
        d = {"table": f["table"], "vocabulary_type": v["type"], "device": f["embedding_lookup_device"],
             "sequence_length": f["sequence_length"], "dim": tables[f["table"]]["dim"]}
        if v["type"] == "frequency":
            d["vocabulary_key"] = key
            d["vocabulary_file"] = f"vocab/{f['name']}.txt"
            # The vocabulary job's sizes; a shard job given another directory's vocabularies (--vocab) has them too.
            size = vocabs[key]["size"] if key in vocabs else (m.get("vocab_sizes") or {}).get(key)
            if size is not None:
                d["vocabulary_size"] = size
                d["table_vocabulary_size"] = max(1, size + v["num_oov_buckets"])
        else:
            d["table_vocabulary_size"] = v["num_buckets"]
        ids = m.get("counts", {}).get("ids", {}).get(f["name"])
        if ids:
            d["counts"] = ids
        out[f["name"]] = d
    return out


def _yaml(spec: dict) -> bytes:
    return yaml.safe_dump(spec, sort_keys=False, default_flow_style=None, width=110).encode("utf-8")


# ---------------------------------------------------------------- the step that writes it

def merge_extras(extras) -> dict:
    """The manifest's extra sections from several dicts: a key's dict values are merged (e.g. one
    {"vocabularies": {key: info}} per vocabulary), other values set."""
    merged: Dict[str, Any] = {}
    for e in extras:
        for k, v in e.items():
            if isinstance(v, dict) and isinstance(merged.get(k), dict):
                merged[k] = {**merged[k], **v}
            else:
                merged[k] = v
    return merged


@beam.typehints.with_output_types(str)
class _WriteManifest(beam.DoFn):
    """The one step that writes the manifest, once every other output exists (its side inputs)."""

    def __init__(self, cfg_json: dict, output: str, job: str):
        self.cfg_json, self.output, self.job = cfg_json, output, job

    def process(self, _, stats, files, extras):
        sums = SumCounters()
        total = sums.merge_accumulators([sums.add_input(sums.create_accumulator(), s) for s in stats])
        update_manifest(self.output, self.job, self.cfg_json, stats=sums.extract_output(total),
                        files=[f.to_json() for f in files], extra=merge_extras(extras))
        yield "manifest.json"


def _flat(label: str, pcolls):
    return tuple(pcolls) | label >> beam.Flatten()


def write_manifest(p, output: str, job: str, cfg_json: dict, stats, files, extras):
    """Write/merge output/manifest.json after every other output of the pipeline exists.

    `stats`: PCollections of counter dicts, summed (once per bundle, then here); `files`: PCollections of
    `pipelines.output.FileInfo`; `extras`: PCollections of dicts (`merge_extras`). A few small side inputs, one
    step: each transform of a pipeline costs its construction and the runner's translation ~10 ms (most of it
    Beam inspecting every method of every DoFn), and the jobs run two pipelines per `run`."""
    summed = _flat(f"AllStats{job}", stats) | f"SumStats{job}" >> beam.CombineGlobally(SumCounters()).without_defaults()
    return (p | f"ManifestTrigger{job}" >> beam.Create([None])
            | f"WriteManifest{job}" >> beam.ParDo(_WriteManifest(cfg_json, output, job),
                                                   beam.pvalue.AsList(summed),
                                                   beam.pvalue.AsList(_flat(f"AllFiles{job}", files)),
                                                   beam.pvalue.AsList(_flat(f"AllExtras{job}", extras))))
