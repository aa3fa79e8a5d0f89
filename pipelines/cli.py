"""`tpu-embed`: vocabularies, lookup statistics and SparseCore CSR shards from one spec.

    tpu-embed run --spec SPEC --output DIR [--input PATTERN] [Beam options...]

Unknown flags are Beam pipeline options (--runner, --direct_num_workers,
--project, --region, --temp_location, --setup_file, --flink_master, ...).
Without --runner the jobs run in this process (DirectRunner, in_memory; with
--direct_num_workers=N > 1, multi_processing).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import List, Optional, Sequence

from pipelines import paths, quiet, user_errors
from pipelines.flags import NoAbbrevParser, check_pass_through, subcommand_flags
from pipelines.lineage_report import lineage_lines
from pipelines.user_errors import UserError
from profiles import commands as profiles_commands

# Beam is imported by the commands that run a job (pipelines.jobs, pipelines.runner, pipelines.demo), not here:
# it takes about a second, which `tpu-embed --help`, `plan`, `report` and `inspect` do not pay. The artifact
# readers (the pydantic manifest, ~0.1 s) and the output helpers are imported by the commands that use them,
# for the same reason: `--help` builds only the parser.

EPILOG = """\
examples:
  tpu-embed run --spec examples/criteo/spec.yaml --output build/criteo
  tpu-embed run --spec examples/criteo/spec.yaml --output build/criteo \\
      --direct_num_workers=2 --direct_running_mode=multi_processing
  tpu-embed vocab --spec SPEC --output DIR            # vocabularies only
  tpu-embed run --spec SPEC --output day2 --base day1  # vocabulary modes append / frozen: day1's ids kept
  tpu-embed shard --spec SPEC --output DIR --plan plan.json --tail pad
  tpu-embed profile --spec SPEC --output DIR          # lookup statistics only
  tpu-embed plan --profiles DIR/profiles --output plan.json
  tpu-embed inspect DIR
  tpu-embed remap --from day1 --to day2 --checkpoint ckpt/day1 --output ckpt/day2/ckpt-0
  tpu-embed run --spec SPEC --output gs://bucket/out --input 'gs://bucket/data/*.csv' \\
      --runner=DataflowRunner --project=P --region=R --temp_location=gs://bucket/tmp \\
      --setup_file=./setup.py
  tpu-embed run --spec SPEC --output DIR --runner dask --dask-workers 2   # a local Dask cluster
  tpu-embed run --spec SPEC --output DIR --runner dask --dask_client_address tcp://host:8786
Any flag not listed above is passed to Beam's PipelineOptions. See docs/reference/cli.md.
"""

RUN_EPILOG = """\
examples:
  tpu-embed run --spec examples/criteo/spec.yaml --output build/criteo
  tpu-embed run --spec SPEC --output day2 --base day1   # modes append / frozen keep day1's ids
  tpu-embed run --spec SPEC --output DIR --direct_num_workers=2 \\
      --direct_running_mode=multi_processing
Any flag not listed above is passed to Beam's PipelineOptions; other runners:
docs/how-to/run-on-a-cluster.md.
"""

# Each command's line in `tpu-embed --help` (one line at 80 columns, the style of argparse's own "show this
# help message and exit"), and the first line of its own `--help`. plan and report: profiles.commands.
COMMANDS = {
    "vocab": "compute the vocabularies -> DIR/vocab/",
    "shard": "write the SparseCore CSR shards (and the profile)",
    "profile": "compute the lookup statistics only",
    "run": "vocab, then shards + profile: the main command",
    "inspect": "summarise an artifact, decode its first records",
    "demo": "raw data to a trained model in a few minutes",
    "remap": "move a checkpoint's rows to another artifact's ids",
    "transform-output": "write the raw -> id mapping as tf.Transform output",
}


def _description(command: str, more: str = "") -> str:
    """A command's own `--help` text: its line from the command list as a sentence, then `more`."""
    line = COMMANDS[command]
    return line[0].upper() + line[1:] + "." + (f"\n\n{more}" if more else "")


def _add_common(sp: argparse.ArgumentParser, output_required: bool = True):
    sp.add_argument("--spec", required=True, help="the YAML spec (every key: docs/reference/spec.md)")
    sp.add_argument("--output", required=output_required, help="artifact directory (local path or gs://...)")
    sp.add_argument("--input", action="append", default=None, metavar="PATTERN",
                    help="input file pattern(s); replaces the spec's inputs.patterns (repeatable)")
    sp.add_argument("--strict", action="store_true",
                    help="stop at the first bad record (message names file and record) instead of writing "
                         "it to dead_letter/ and counting it")
    sp.add_argument("--chunk-rows", type=int, default=None, help="rows per Arrow batch (default 32768)")
    sp.add_argument("--split-bytes", type=int, default=None, metavar="N",
                    help="input files larger than N bytes are read by several workers: CSV by byte range, "
                         "Parquet by row group (default: whole files on the DirectRunner with one worker, else "
                         "67108864, 64 MiB); the output does not depend on it")
    sp.add_argument("--overwrite", action="store_true",
                    help="replace an existing artifact in --output (run/vocab refuse a non-empty --output, shard "
                         "one with shards, without it); files the new manifest does not list are deleted")


def _add_shard(sp: argparse.ArgumentParser):
    sp.add_argument("--vocab", default=None, metavar="DIR",
                    help="artifact directory with the vocabularies (default: --output)")
    sp.add_argument("--plan", default=None, help="plan file from `tpu-embed plan`: SparseCore limits to enforce "
                                                 "(default: the spec's limits; if it pins none, the limits are "
                                                 "planned from this run's own profile, exact maxima)")
    sp.add_argument("--tail", choices=("drop", "pad"), default=None,
                    help="examples that do not fill a last global batch: drop (and count) or pad with "
                         "zero-mask examples (default: the spec's policies.tail)")
    sp.add_argument("--steps-per-file", type=int, default=1000, help="training steps per shard file")
    sp.add_argument("--profile-dir", default=None,
                    help="where the lookup statistics go (default: spec profile_data_directory, relative to --output)")
    sp.add_argument("--candidate-chip-counts", default=None, metavar="N,N,...",
                    help="other chip counts (same global batch) to profile in the same pass, e.g. 8,16, so that "
                         "`tpu-embed plan --spec` can plan them (default: the spec's profile_candidate_chip_counts; "
                         "none: the spec's topology only)")


def _add_lineage(sp: argparse.ArgumentParser):
    sp.add_argument("--base", default=None, metavar="DIR",
                    help="the previous day's artifact: vocabularies of mode append keep its ids, those of mode "
                         "frozen its vocabulary (overrides the spec's `base`; docs/how-to/daily-retraining.md)")
    sp.add_argument("--day", type=int, default=None, metavar="N",
                    help="this run's day in its lineage, recorded as each token's last day seen (default: the "
                         "base's day + 1, or 1 without a base); must increase along the lineage")


def _wide_names(prog: str) -> argparse.HelpFormatter:
    """The top-level help, with room for the longest command name (`transform-output`, indented by 4) and its
    line on one line: argparse sizes the name column by the options, at indent 2."""
    formatter = argparse.RawDescriptionHelpFormatter(prog)
    formatter._action_max_length = 4 + len(max(COMMANDS, key=len)) + 2  # noqa: SLF001 - argparse's column width
    return formatter


def build_parser() -> argparse.ArgumentParser:
    parser = NoAbbrevParser(  # `--str` is not `--strict`; unknown flags: check_pass_through
        prog="tpu-embed", description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n", 1)[1],
        formatter_class=_wide_names, epilog=EPILOG)
    import tpu_embed  # already imported (pipelines.user_errors); its version, written once
    parser.add_argument("--version", action="version", version=f"%(prog)s {tpu_embed.__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="Beam's INFO logs")
    parser.add_argument("--debug", action="store_true",
                        help="show Python tracebacks and TensorFlow's start-up logs (errors are one line otherwise)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    sp = sub.add_parser("vocab", help=COMMANDS["vocab"], formatter_class=argparse.RawDescriptionHelpFormatter,
                        description=_description("vocab", "Frequency, identity and hashing vocabularies with "
                                                          "tensorflow-transform's semantics, and the manifest."))
    _add_common(sp)
    sp.add_argument("--vocab-engine", choices=("combine", "tft"), default="combine",
                    help="combine: exact counts as a Beam CombinePerKey (fast, default); tft: "
                         "tensorflow-transform's AnalyzeDataset + tft.vocabulary (same files, also writes "
                         "transform_fn/, ~4 s of pipeline construction per vocabulary)")
    _add_lineage(sp)
    sp.set_defaults(func=cmd_vocab)

    for name, more in (
            ("shard", "Per-host shards of SparseCore CSR, and the lookup statistics unless --no-profile."),
            ("profile", "The lookup statistics at the shards' batching -> the spec's profile_data_directory."),
            ("run", "The vocabularies, then the shards and the profile in one read of the data; the limits are "
                    "planned\nfrom that pass unless the spec or --plan pins them.")):
        sp = sub.add_parser(name, help=COMMANDS[name], formatter_class=argparse.RawDescriptionHelpFormatter,
                            description=_description(name, more), epilog=RUN_EPILOG if name == "run" else None)
        _add_common(sp)
        _add_shard(sp)
        if name != "profile":
            sp.add_argument("--no-profile", action="store_true",
                            help="do not compute the lookup statistics (then nothing is planned: limits the "
                                 "spec does not pin are TF's defaults, 256/256/64)")
        if name == "run":
            _add_lineage(sp)
            sp.add_argument("--vocab-engine", choices=("combine", "tft"), default="combine",
                            help="see `tpu-embed vocab --help`")
            sp.add_argument("--reread-input", action="store_true",
                            help="the shard job reads and parses the input again, instead of replaying the "
                                 "vocabulary job's parsed read kept under --output/.tmp-read-spill until it ends "
                                 "(about twice the CSV's size on disk); same output")
            sp.add_argument("--no-transform-output", dest="transform_output", action="store_false",
                            help="do not write DIR/transform_output/ (the raw -> id mapping as tf.Transform "
                                 "output: `tft.TFTransformOutput(DIR/transform_output)`)")
            sp.add_argument("--read-memory-mb", type=int, default=None,
                            help="where both jobs run in this process (the DirectRunner without worker processes), "
                                 "up to this many MB of the parsed read stay in memory for the shard job instead "
                                 "of the spill files; 0: all spilled (default 1024)")
        sp.set_defaults(func={"shard": cmd_shard, "profile": cmd_profile, "run": cmd_run}[name])

    sp = sub.add_parser("inspect", help=COMMANDS["inspect"], description=_description(
        "inspect", "The manifest's summary (topology, vocabularies, counts, limits, files), then the host's first "
                   "shard records: per chip and stacked table, the ids it holds, the slots they take with each "
                   "partition padded to 8, the id buffer TPUEmbeddingV2.dequeue receives, and the ids the "
                   "limits dropped."))
    sp.add_argument("artifact", help="artifact directory")
    sp.add_argument("--host", type=int, default=0, metavar="H",
                    help="the host whose shard records are decoded (default 0; 0..num_hosts-1)")
    sp.add_argument("--steps", type=int, default=None, metavar="N",
                    help="decode and summarise this many records (default 1; with --json, none unless given)")
    sp.add_argument("--json", action="store_true",
                    help="print the manifest as JSON; with --steps N, {\"manifest\": ..., \"records\": [the N "
                         "decoded records]}")
    sp.add_argument("--unseen-days", type=int, default=1, metavar="N",
                    help="a lineage's vocabularies: count the tokens in use not seen for N days or more "
                         "(last_day <= day - N), those a retiring policy would free (default 1: not seen this day)")
    sp.set_defaults(func=cmd_inspect)

    sp = sub.add_parser("demo", help=COMMANDS["demo"], description=_description(
        "demo", "Synthetic Criteo-like data, the jobs, the plan, a DLRM trained with HostEmbedding, the SavedModel "
                "and the report. A second demo into the same --output replaces what the first one wrote (other "
                "files there are kept)."))
    sp.add_argument("--output", default="build/demo", help="where everything goes (default build/demo)")
    # Accepted, hidden: a demo replaces its own earlier output anyway, and scripts that pass it keep working.
    sp.add_argument("--overwrite", action="store_true", help=argparse.SUPPRESS)
    sp.add_argument("--examples", type=int, default=None, help="synthetic examples to generate (default 500000)")
    sp.add_argument("--days", type=int, choices=(1, 2), default=1,
                    help="2: the examples as two days of one lineage (vocabularies append under capacities); "
                         "day 2 restores day 1's checkpoint and trains on, against a cold start (default 1)")
    sp.add_argument("--no-serving", dest="serving", action="store_false",
                    help="skip the SavedModel export and its scoring of the held-out raw rows (a minute or more)")
    sp.set_defaults(func=cmd_demo)

    _add_remap(sub)
    _add_transform_output(sub)
    profiles_commands.add_commands(sub, spec_loader=_plan_model)
    return parser



def _add_remap(sub) -> None:
    sp = sub.add_parser("remap", help=COMMANDS["remap"], description=_description(
        "remap", "Warm start across vocabularies: a checkpoint's tables and optimizer slots moved from artifact A's "
                 "ids to artifact B's."))
    sp.add_argument("--from", dest="from_artifact", required=True, metavar="A",
                    help="the artifact directory the checkpoint was trained on")
    sp.add_argument("--to", dest="to_artifact", required=True, metavar="B",
                    help="the artifact directory to train on next (same spec's features and tables)")
    sp.add_argument("--checkpoint", required=True, metavar="CKPT",
                    help="a checkpoint prefix (DIR/ckpt-3) or the directory whose `checkpoint` file names the latest")
    sp.add_argument("--output", required=True, metavar="CKPT2",
                    help="the new checkpoint's prefix (writes CKPT2.index and CKPT2.data-00000-of-00001)")
    sp.add_argument("--prefix", default=None, metavar="P",
                    help="the embedding's path in the checkpoint, e.g. `embedding` (default: found)")
    sp.add_argument("--seed", type=int, default=None,
                    help="seeds the initializer of new tokens' rows (TF's TableConfig default, a truncated normal) "
                         "with the table's name (default: artifact B's fingerprint does, so a re-run gives the same "
                         "bytes and another day other values)")
    sp.add_argument("--chunk-rows", type=int, default=None, metavar="N",
                    help="rows moved at a time (default 131072): memory follows it, not the table")
    sp.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint at --output")
    sp.set_defaults(func=cmd_remap)


def _add_transform_output(sub) -> None:
    sp = sub.add_parser("transform-output", help=COMMANDS["transform-output"], description=_description(
        "transform-output", "tft.TFTransformOutput reads it (docs/how-to/serve.md)."))
    sp.add_argument("artifact", help="artifact directory (made by `tpu-embed run`)")
    sp.add_argument("--output", default=None, metavar="DIR",
                    help="where to write it, replacing what is there (default: ARTIFACT/transform_output)")
    sp.set_defaults(func=cmd_transform_output)


def cmd_transform_output(args):
    # A command's imports (see the imports); TensorFlow only in the child that builds a graph not cached.
    from tpu_embed.serving.transform_output import DIRECTORY, write_transform_output
    if args.output is None:  # the artifact's own: listed in its manifest, as `run` writes it
        from pipelines import transform_output
        from tpu_embed.artifact import io as tio
        from tpu_embed.artifact.load import load_artifact
        transform_output.write(args.artifact, load_artifact(args.artifact, verify="none").spec)
        path = tio.join(args.artifact, DIRECTORY)
    else:
        path = write_transform_output(args.artifact, args.output)
    print(f"transform output: {path} (tft.TFTransformOutput reads it)")
    return 0


def cmd_remap(args):
    from pipelines import progress  # a command's imports (see the imports)
    from tpu_embed.training.remap import remap
    kw = {}
    if args.chunk_rows is not None:
        if args.chunk_rows < 1:
            raise UserError(f"--chunk-rows must be a positive number of rows, got {args.chunk_rows}")
        kw["chunk_rows"] = args.chunk_rows
    with progress.bar(None, "remap", unit="rows") as bar:
        def moved(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)
        # A RemapError / BundleError names what is wrong and the fix: one line, exit code 1 (pipelines.user_errors).
        report = remap(args.from_artifact, args.to_artifact, args.checkpoint, args.output, prefix=args.prefix,
                       seed=args.seed, overwrite=args.overwrite, progress=moved, **kw)
    print(report.summary())
    return 0


def _config(args, **kw):
    from pipelines.jobs import JobConfig  # Beam: a job command (see the imports)
    from tpu_embed.artifact.spec import load_spec  # 20 ms (YAML, the schema) that `--help` does not need
    spec = load_spec(args.spec)
    if args.input:
        spec = spec.with_inputs(args.input)
    c = dict(spec=spec, output=args.output, strict=args.strict)
    if args.chunk_rows:
        c["chunk_rows"] = args.chunk_rows
    if args.split_bytes is not None:
        if args.split_bytes < 1:
            raise UserError(f"--split-bytes must be a positive number of bytes, got {args.split_bytes}")
        c["split_bytes"] = args.split_bytes
    for a, k in (("vocab", "vocab_dir"), ("plan", "plan"), ("tail", "tail"), ("steps_per_file", "steps_per_file"),
                 ("profile_dir", "profile_dir"), ("vocab_engine", "vocab_engine"), ("base", "base"),
                 ("day", "day")):
        if getattr(args, a, None) is not None:
            c[k] = getattr(args, a)
    if getattr(args, "no_profile", False):
        c["write_profile"] = False
    if getattr(args, "reread_input", False):
        c["reuse_read"] = False
    if getattr(args, "transform_output", False):
        c["transform_output"] = True
    if getattr(args, "read_memory_mb", None) is not None:
        if args.read_memory_mb < 0:
            raise UserError(f"--read-memory-mb must be 0 or more, got {args.read_memory_mb}")
        c["read_memory_bytes"] = args.read_memory_mb << 20
    if getattr(args, "candidate_chip_counts", None) is not None:
        c["candidate_chip_counts"] = _chip_counts(args.candidate_chip_counts)
    c.update(kw)
    return JobConfig(**c)


def _plan_model(path: str, profile_dir: Optional[str]):
    """`tpu-embed plan --spec SPEC.yaml`: the project's spec as a model, its table sizes from the vocabularies of
    the artifact whose profile directory is `profile_dir`; None for the other files `plan --spec` reads."""
    import yaml

    from profiles.report import find_artifact  # plan's imports (see the imports)
    from tpu_embed.artifact import io as tio
    from tpu_embed.artifact.manifest import read_manifest
    from tpu_embed.artifact.spec import load_spec
    try:
        raw = yaml.safe_load(tio.read_text(path))
    except (OSError, yaml.YAMLError):
        return None  # plan's own reader says what is wrong with it
    if not (isinstance(raw, dict) and "categorical" in raw):
        return None
    spec = load_spec(path)
    artifact = find_artifact(profile_dir) if profile_dir else None
    if artifact is None:
        raise UserError(f"--spec {path}: a spec's table sizes come from its artifact's vocabularies, and "
                        f"--profiles {profile_dir} is not an artifact's profile directory (DIR/profiles beside "
                        "DIR/manifest.json); pass that one, or a layout dump or model file as --spec")
    return spec.model(read_manifest(artifact).vocabulary_sizes)


def _chip_counts(text: str) -> List[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise UserError(f"--candidate-chip-counts must be positive integers separated by commas (e.g. 8,16), "
                        f"got {text!r}")
    return counts


def _job_command(job: str):
    """A subcommand that runs `pipelines.runner.<job>` and prints the artifact summary."""
    def command(args, beam_args):
        from pipelines import output, runner  # Beam: a job command (see the imports)
        # The spec, and whether the runner's workers can see the paths, are checked before the output is touched.
        cfg = paths.for_workers(_config(args), runner.runner_name(beam_args))
        if job in ("run_vocab", "run_all"):
            runner.lineage_seed_for(cfg)  # the base too: `--overwrite` of the base itself must not clear it first
        # One command at a time per output; a killed or failed one's directory is taken over (pipelines.output).
        with output.claim(args.output, args.command, args.overwrite) as claimed:
            getattr(runner, job)(cfg, beam_args)
            manifest = claimed.finish()
        print(summary(manifest, args.output))
        return 0
    command.__name__ = f"cmd_{job}"
    return command


cmd_vocab = _job_command("run_vocab")
cmd_shard = _job_command("run_shard")
cmd_profile = _job_command("run_profile")
cmd_run = _job_command("run_all")


def cmd_demo(args, beam_args):
    from pipelines import demo  # Beam: the demo runs the jobs (see the imports)
    return demo.main(args.output, args.examples, beam_args, days=args.days, serving=args.serving)


def summary(m, output: str, unseen_days: int = 1) -> str:
    """A few lines about an artifact directory, from its typed manifest (`tpu_embed.artifact.manifest.Manifest`)
    and, for a lineage, its token-count files (`lineage_lines`)."""
    if m is None:
        return f"{output}: no manifest written"
    lines = [f"artifact: {output}  (spec {m.spec_name}, fingerprint {m.spec_fingerprint[:16]})"]
    t, b = m.topology, m.batch_sizes
    lines.append(f"topology: {t.num_chips} chips x {t.num_sc_per_chip} SparseCores, "
                 f"{t.num_hosts} host(s); global batch {b.global_} "
                 f"(per host {b.per_host}, per chip {b.per_chip})")
    vocabs = m.vocabularies or {}
    if vocabs:
        sizes = ", ".join(f"{k}={v.size}" for k, v in sorted(vocabs.items())[:8])
        more = f" (+{len(vocabs) - 8} more)" if len(vocabs) > 8 else ""
        lines.append(f"vocabularies ({len(vocabs)}): {sizes}{more}")
    lines.extend(lineage_lines(m, output, unseen_days))
    c = m.counts
    if c is not None:
        lines.append(f"records read {c.records_read}, invalid {c.records_invalid} "
                     f"(dead letters: {c.dead_letters or 'none'}), examples written {c.examples_written} "
                     f"in {c.steps} steps, tail dropped {c.examples_dropped['tail']}, "
                     f"padding {c.examples_padding}")
        oov = {k: v.get("oov", 0) for k, v in c.ids.items() if v.get("oov")}
        if oov:
            lines.append(f"out-of-vocabulary values: {sum(oov.values())} over {len(oov)} features")
        if c.ids_dropped_by_limits:
            lines.append(f"ids dropped by SparseCore limits: {c.ids_dropped_by_limits}")
        policy = {f"{k}.{w}": n for k, v in sorted(c.ids.items()) for w, n in sorted(v.items())
                  if n and w in ("invalid_ids_dropped", "invalid_ids_defaulted", "oov_dropped", "nan_weights_dropped",
                                 "nan_weights_zeroed", "truncated_sequence", "truncated_tensor_core")}
        if policy:  # values changed or left out by a policy (records kept): never only in the manifest
            lines.append("values dropped/changed by policies: " + ", ".join(f"{k} {n}" for k, n in policy.items()))
    lines.extend(limits_table(m))
    lines.extend(balance_table(m, output))
    if m.profile is not None:
        lines.append(f"profile: {m.profile.files_written} files in {m.profile.directory}")
    kinds: dict = {}
    for f in m.files:
        kinds[f.kind] = kinds.get(f.kind, 0) + 1
    lines.append("files: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    return "\n".join(lines)


def limits_table(m) -> list:
    """Per stacked table: its tables and the limits the shards were packed with, and where they came from."""
    lim, stacks = m.limits, m.stacks or {}
    if lim is None or not stacks:
        return []
    source = lim.source
    if source.startswith("planned"):
        source = "planned from this run's profile (exact maxima; plan.json)"
    elif source == "tf-defaults":
        source = "TF's defaults (256 / 256 / 64)"
    from profiles.display import short_stack_name  # a command's import (see the imports)
    rows = [("stack", "tables", "max_ids_per_table", "max_unique_ids_per_table")]
    for name, st in stacks.items():
        tables = list(st.tables)
        shown = ", ".join(tables) if len(tables) <= 3 else f"{tables[0]} … {tables[-1]} ({len(tables)})"
        rows.append((short_stack_name(name, tables), shown, str(lim.max_ids_per_table.get(name, "")),
                     str(lim.max_unique_ids_per_table.get(name, ""))))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [f"limits: {source}; max_ids_per_chip_per_sample={lim.max_ids_per_chip_per_sample}, "
             f"allow_id_dropping={lim.allow_id_dropping}"]
    lines += ["  " + "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
              for r in rows]
    return lines


def balance_table(m, output: str) -> list:
    """The balance per stacked table that the artifact's plan.json records (`profiles.balance`): frequency order
    and balanced ids side by side, with the floor; nothing without a plan that has it."""
    plan_files = [f.path for f in m.files if f.kind == "plan"]
    if not plan_files:
        return []
    from profiles import load_plan  # a command's imports (see the imports)
    from profiles.balance import balance_lines
    from tpu_embed.artifact import io as tio
    try:
        plan = load_plan(tio.join(output, plan_files[0]))
    except (OSError, ValueError):
        return []  # `inspect` says what is missing or damaged
    return balance_lines(plan.balance, {k: list(v.tables) for k, v in (m.stacks or {}).items()})


def cmd_inspect(args, beam_args):
    import json  # a command's imports (see the imports)

    from tpu_embed.artifact import shard_records, tfrecord, verify
    from tpu_embed.artifact.manifest import ManifestNotFoundError, read_manifest
    try:
        m = read_manifest(args.artifact)
    except ManifestNotFoundError:
        run = verify.read_run_marker(args.artifact)
        if run is None:
            raise
        raise verify.unfinished_error(args.artifact, run, "an unfinished artifact with no manifest yet") from None
    if args.steps is not None and args.steps < 0:
        raise UserError(f"--steps {args.steps}: give a number of records, 0 or more.")
    if args.unseen_days < 1:
        raise UserError(f"--unseen-days {args.unseen_days}: give a number of days, 1 or more.")
    problem = None
    try:  # unfinished, or a listed file missing or of another size: said after what the manifest says
        verify.check_listed(args.artifact, m)
        for h in range(m.shard_format.num_hosts if m.shards is not None else 0):
            verify.check_shard_steps(m, h)
    except verify.ArtifactDamagedError as e:
        problem = e
    steps = args.steps if args.steps is not None else (0 if args.json else 1)
    records: list = []
    if problem is None and steps and m.shards is not None:
        fmt = m.shard_format
        if not 0 <= args.host < fmt.num_hosts:
            raise UserError(f"--host {args.host}: {args.artifact} has {fmt.num_hosts} host(s), "
                            f"so --host must be in 0..{fmt.num_hosts - 1}.")
        for path in shard_records.shard_files(args.artifact, args.host, m):
            for rec in tfrecord.read_records(path):
                if len(records) >= steps:
                    break
                records.append(shard_records.decode_record(rec, fmt))
    if args.json:
        if args.steps is None:  # the manifest as written
            print(m.to_bytes().decode("utf-8"), end="")
        else:
            print(json.dumps({"manifest": m.to_json(), "records": [_record_json(r) for r in records]}, indent=1))
        if problem is not None:
            raise problem
        return 0
    print(summary(m, args.artifact, args.unseen_days))
    if problem is not None:
        raise problem
    for r in records:
        print("\n".join(record_lines(m, r)))
    return 0


def record_lines(m, r) -> List[str]:
    """A decoded shard record (`shard_records.decode_record`) in a few lines: per chip and stacked table, the
    ids it holds, the slots they take in the CSR arrays (each partition padded to a multiple of 8, as TF lays
    them out), the id buffer `TPUEmbeddingV2.dequeue` receives (max_ids_per_chip_per_sample x samples, the
    static size `input_fn` pads to), the row pointers and the ids the limits dropped."""
    from profiles.display import short_stack_name  # a command's imports (see the imports)
    from tpu_embed.sparsecore.padding import PAD_VALUE
    per_sample = m.limits.max_ids_per_chip_per_sample if m.limits is not None else None
    lines = [f"host {r['host']} step {r['step']}: {int(r['mask'].sum())} examples, "
             f"label mean {float(r['label'].mean()) if r['label'].size else 0:.3f}"]
    for c, chip in enumerate(r["sparse_core"]):
        for stack, d in chip.items():
            ids = int((d["sorted_token_ids"] != PAD_VALUE).sum())
            buffer = f" of a {per_sample * d['sample_count']}-id buffer" if per_sample else ""
            lines.append(f"  chip {c} {short_stack_name(stack, m.stacks[stack].tables)}: {ids} ids in "
                         f"{d['ids_unpadded_size']} slots{buffer}, {d['row_pointers_unpadded_size']} row pointers, "
                         f"{d['dropped_ids']} dropped")
    return lines


def _record_json(r) -> dict:
    """A decoded shard record as JSON: its arrays as lists."""
    def plain(x):
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        return x.tolist() if hasattr(x, "tolist") else x
    return plain(r)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]  # accepted anywhere on the line
    if not debug:
        quiet.install()  # before anything imports TensorFlow: no oneDNN / CUDA / cuInit lines
    else:
        quiet.uninstall()  # what `import tpu_embed` installed: --debug shows TensorFlow's own logs
    parser = build_parser()
    args, beam_args = parser.parse_known_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return user_errors.USAGE
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not (args.verbose or debug):
        # Beam logs a failing worker's traceback at ERROR before raising it; the error is shown once, below.
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
    takes_beam = args.command in ("vocab", "shard", "profile", "run", "demo")
    if beam_args and not takes_beam:
        parser.error(f"unrecognized arguments: {' '.join(beam_args)}")
    if beam_args:
        problem = check_pass_through(beam_args, subcommand_flags(parser, args.command))
        if problem:
            parser.error(problem)
    try:
        if _one_arg(args.func):
            return int(args.func(args) or 0)
        return int(args.func(args, beam_args) or 0)
    except BrokenPipeError:  # `tpu-embed inspect DIR | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("tpu-embed: interrupted", file=sys.stderr)
        return user_errors.INTERRUPTED
    except Exception as e:  # noqa: BLE001 - one clear line, never a traceback (unless --debug)
        if debug:
            raise
        output = getattr(args, "output", None)
        said = user_errors.describe(e, output=paths.absolute(output) if output else None)
        print(f"tpu-embed {args.command}: {said.line}", file=sys.stderr)
        if not said.expected:
            print(user_errors.DEBUG_HINT, file=sys.stderr)
        return user_errors.exit_code(e)


def _one_arg(func) -> bool:
    import inspect
    try:
        return len(inspect.signature(func).parameters) == 1
    except (TypeError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(main())
