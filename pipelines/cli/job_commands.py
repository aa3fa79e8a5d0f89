"""`tpu-embed vocab`, `shard`, `profile` and `run`: the jobs' flags, their configuration and the summary printed."""

from __future__ import annotations

import argparse
from typing import List

from pipelines import paths
from pipelines.cli.artifact_summary import summary
from pipelines.cli.help_text import COMMANDS, description
from pipelines.user_errors import UserError

# Beam is imported by the command that runs a job (pipelines.jobs, pipelines.runner), not here: `tpu-embed --help`
# builds only the parsers.

RUN_EPILOG = """\
examples:
  tpu-embed run --spec examples/criteo/spec.yaml --output build/criteo
  tpu-embed run --spec SPEC --output day2 --base day1   # modes append / frozen keep day1's ids
  tpu-embed run --spec SPEC --output DIR --direct_num_workers=2 \\
      --direct_running_mode=multi_processing
Any flag not listed above is passed to Beam's PipelineOptions; other runners:
docs/how-to/run-on-a-cluster.md.
"""


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


def add_parsers(sub) -> None:
    """The four job commands' parsers, in the order of `tpu-embed --help`."""
    sp = sub.add_parser("vocab", help=COMMANDS["vocab"], formatter_class=argparse.RawDescriptionHelpFormatter,
                        description=description("vocab", "Frequency, identity and hashing vocabularies with "
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
                            description=description(name, more), epilog=RUN_EPILOG if name == "run" else None)
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


def job_config(args, **kw):
    """The job configuration of a job command's flags (`pipelines.jobs.JobConfig`), with `kw` over them."""
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
        cfg = paths.for_workers(job_config(args), runner.runner_name(beam_args))
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
