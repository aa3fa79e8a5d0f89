"""`tpu-embed plan` and `tpu-embed report`: their flags and what they print (the work: `profiles.commands`).

Both work from the profile directory alone: every profile file records its tables, features and topology,
so `--spec` is optional (it plans for another configuration, e.g. another chip count, from the same
statistics).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Optional

from pipelines.user_errors import UserError

if TYPE_CHECKING:
    from profiles.model_file import SpecLoader

# The planner, the report and the store are imported by the command that runs (`cmd_plan`, `cmd_report`):
# `tpu-embed --help` adds these parsers and should not pay for loading them.

# The commands' lines in `tpu-embed --help`: one line each, in the style of the other commands
# (pipelines.cli.help_text).
PLAN_HELP = "plan SparseCore limits from a profile -> plan.json"
PLAN_DESCRIPTION = """\
Derive SparseCoreEmbeddingConfig limits from the lookup statistics that the
profile job wrote to a profile_data_directory, and write them as a plan file
(JSON) that training loads with profiles.load_plan(path).to_sparse_core_config().

Per stacked table: max_ids_per_table and max_unique_ids_per_table bound the
ids / unique ids one SparseCore sends to one other SparseCore in a step; TF
raises on a step over them, so they are planned from the exact maxima
(--partition-quantile max) times --headroom.  max_ids_per_chip_per_sample
sizes each chip's id buffer (samples x value slots, every segment padded to
8); --quantile below 'max' (e.g. p99.9) makes it smaller and turns on
allow_id_dropping, and the plan states how many ids that drops on the
profiled data.  The plan also records memory per SparseCore against TF's
defaults (256 / 256 / 64), 'mod' vs 'div' load balance per table, the
stacking, and the same limits for every other chip count the profile
covered.

Warnings (printed, and recorded in the plan): too few profiled steps,
statistics from another configuration, bounds instead of exact figures.
"""

REPORT_HELP = "write an HTML report of a profile (and a plan)"
REPORT_DESCRIPTION = """\
Write OUTPUT/index.html and PNG plots: ids per example per table, per-SparseCore
load heat maps, planned limits against per-step maxima, hot ids, 'mod' vs
'div' balance, and the plan's memory against TF's defaults.  Without --plan,
a plan with exact maxima is computed for the report.
"""


def add_commands(subparsers, spec_loader: Optional[SpecLoader] = None) -> None:
    """Add `plan` and `report` to an argparse subparsers object; each sets `func` (args -> exit code).

    `spec_loader(path, profile_dir)` may return a tpu_embed.core.model.ModelConfig or (feature_config,
    tpu_embed.Topology), or None for a file it does not read; it reads the project's YAML spec for --spec.
    Without it, --spec accepts the formats of profiles/model_file.py; `tpu-embed` passes `spec_model`.
    """
    _add_plan(subparsers, spec_loader)
    _add_report(subparsers)


def _add_plan(subparsers, spec_loader: Optional[SpecLoader]) -> None:
    p = subparsers.add_parser("plan", help=PLAN_HELP, description=PLAN_DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profiles", default=None, metavar="DIR",
                   help="profile_data_directory written by the profile job (tpu-embed profile); required, except "
                        "with --format jax-fdo --artifact (default there: the artifact's own, where it has one).")
    p.add_argument("--spec", metavar="SPEC_OR_LAYOUT", default=None,
                   help="configuration to plan for (spec, layout dump, model-*.json or plan file); default: the "
                        "profiled model itself. A different chip count is planned from the profile's candidate "
                        "figures.")
    p.add_argument("--output", required=True, metavar="PLAN_JSON",
                   help="plan file to write (with --format jax-fdo: the directory for jax's FDO files).")
    p.add_argument("--format", default="plan", choices=("plan", "jax-fdo"),
                   help="'plan' (default): a plan file for TensorFlow. 'jax-fdo': the profile's exact per-partition "
                        "maxima as jax-tpu-embedding's FDO statistics (fdo_stats_<host>_<time>.npz, which its "
                        "NPZFileFDOClient loads, and tpu_embed_jax_fdo.json for tpu_embed.jax.limits).")
    p.add_argument("--jax-stacking", default=None, choices=("tpu_embed", "none", "jax"),
                   help="with --format jax-fdo: the stacked tables the figures are for: 'tpu_embed' (default "
                        "without --artifact; the profile's stacks, which tpu_embed.jax.limits.stack_tables builds "
                        "in jax), 'none' (one stack per table, named by it) or 'jax' (default with --artifact; "
                        "jax's auto_stack_tables over the features in name order, as the jax shards stack them: "
                        "with --artifact every stack, from its manifest's maxima where the profile did not count "
                        "it; without, refused where a stack was not profiled).")
    p.add_argument("--artifact", default=None, nargs="+", metavar="DIR",
                   help="with --format jax-fdo: the artifact whose jax shards (shards: {layout: jax} or both) the "
                        "figures are for: its recorded stacking and per-stack maxima, and its profile directory "
                        "unless --profiles is given. Several: a window of days of one lineage, oldest first, as "
                        "tpu_embed.jax.input_iterator reads it (each stack's maxima over the days).")
    p.add_argument("--quantile", default="max", metavar="Q",
                   help="quantile over steps for the chip id buffer: 'max' (default; zero drops on the profiled "
                        "data), or e.g. 'p99.9' (smaller buffer, allow_id_dropping, stated drop budget).")
    p.add_argument("--partition-quantile", default="max", metavar="Q",
                   help="quantile for max_ids_per_table / max_unique_ids_per_table (default 'max'; anything lower "
                        "makes TF fail on the steps above it).")
    p.add_argument("--headroom", type=float, default=1.0, metavar="X",
                   help="multiply every observed figure by X >= 1 (e.g. 1.1 for 10%% margin on unseen data).")
    p.add_argument("--model", default=None, metavar="KEY",
                   help="model key (prefix) when the directory holds profiles of several models.")
    p.add_argument("--min-steps", type=int, default=100, metavar="N",
                   help="warn if the profile covers fewer than N steps (default 100).")
    p.add_argument("--propose", action="store_true",
                   help="compare placements on the profile's recorded steps under the cost model of "
                        "docs/explanation/partitioning.md: TensorFlow's stacking, disable_table_stacking, "
                        "jax-tpu-embedding's stack groups, small tables whose hottest token sets a stack's floor "
                        "moved to the TensorCore; print the table, record it in the plan (proposal) and write the "
                        "chosen configurations to PLAN_proposal.py beside the plan (SparseCoreEmbeddingConfig "
                        "keyword arguments; jax stack groups and limits).")
    p.add_argument("--tensor-core-max-bytes", type=int, default=None, metavar="B",
                   help="with --propose: the largest table (rows x width x 4 B) it moves to the TensorCore "
                        "(default 65536).")
    p.set_defaults(func=lambda args: cmd_plan(args, spec_loader))


def _add_report(subparsers) -> None:
    r = subparsers.add_parser("report", help=REPORT_HELP, description=REPORT_DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--profiles", required=True, metavar="DIR", help="profile_data_directory.")
    r.add_argument("--plan", default=None, metavar="PLAN_JSON", help="plan file from `tpu-embed plan` (optional).")
    r.add_argument("--output", required=True, metavar="DIR", help="directory for index.html and the PNGs.")
    r.add_argument("--model", default=None, metavar="KEY",
                   help="model key (prefix) when the directory holds profiles of several models.")
    r.set_defaults(func=cmd_report)


def cmd_plan(args, spec_loader: Optional[SpecLoader]) -> int:
    from profiles import commands  # a command's imports (see the imports)
    from profiles.balance_figures import balance_lines
    from profiles.model_file import load_model_config
    if getattr(args, "format", "plan") == "jax-fdo":
        return _cmd_plan_jax_fdo(args, spec_loader)
    if not args.profiles or args.artifact:
        from profiles.errors import ProfileError
        raise ProfileError("--profiles DIR is required (--artifact is for --format jax-fdo only)")
    spec = load_model_config(args.spec, spec_loader, args.profiles) if args.spec else None
    p = commands.make_plan(args.profiles, spec, quantile=args.quantile, headroom=args.headroom,
                           partition_quantile=args.partition_quantile, min_steps=args.min_steps, model=args.model)
    snippet = (commands.propose(p, args.profiles, args.output, args.tensor_core_max_bytes)
               if getattr(args, "propose", False) else None)
    p.write(args.output)
    for w in p.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"wrote {args.output}: {len(p.stacks)} stacked tables, max_ids_per_chip_per_sample="
          f"{p.max_ids_per_chip_per_sample}, allow_id_dropping={p.allow_id_dropping}")
    for name, s in p.stacks.items():
        print(f"  {name}: max_ids_per_table={s.max_ids_per_table} (observed {s.observed['max_ids']['max']}), "
              f"max_unique_ids_per_table={s.max_unique_ids_per_table} "
              f"(observed {s.observed['max_unique_ids']['max']}), drop rate <= {s.drops['drop_rate_at_most']:.3g}")
    m = p.memory
    print(f"memory per SparseCore (model): {m['planned_bytes_per_sc']} B planned vs "
          f"{m['tf_default_bytes_per_sc']} B with TF defaults")
    for line in balance_lines(p.balance):
        print(line)
    covered = [t["num_chips"] for t in p.topologies if t["status"] in ("main", "profiled")]
    if covered:
        print(f"chip counts the profile covers: {', '.join(map(str, covered))} (another needs a profile with "
              "--candidate-chip-counts)")
    from profiles.planner.variants import what_if_lines
    for line in what_if_lines(p.what_if):
        print(line)
    if snippet is not None:
        from profiles.planner.proposal import proposal_lines
        for line in proposal_lines(p.proposal or {}):
            print(line)
        print(f"wrote {snippet}: sparse_core_config() and stack_feature_specs(feature_specs) with the chosen "
              "configurations")
    return 0


def _cmd_plan_jax_fdo(args, spec_loader: Optional[SpecLoader]) -> int:
    from profiles import commands  # a command's imports (see the imports)
    from profiles.errors import ProfileError
    from profiles.jax_fdo import fdo_stats
    from profiles.model_file import load_model_config
    if args.quantile != "max" or args.partition_quantile != "max" or args.headroom != 1.0:
        raise ProfileError("--format jax-fdo writes the exact observed maxima, which jax's FDO client reads as "
                           "observations: --quantile, --partition-quantile and --headroom apply to plan files only")
    stacking = args.jax_stacking or ("jax" if args.artifact else "tpu_embed")
    stats = fdo_stats(args.profiles, stacking, model=args.model, artifact=args.artifact)
    spec = load_model_config(args.spec, spec_loader, args.profiles) if args.spec else None
    commands.write_fdo_files(stats, args.output, spec, args.spec)
    t = stats.model.topology
    print(f"wrote {args.output}: jax-tpu-embedding FDO statistics of {stats.steps} steps, {len(stats.stacks)} stacked "
          f"tables ({stats.stacking} stacking), {t.num_hosts} process file(s) of {t.chips_per_host} device(s) x "
          f"{t.num_sparse_cores} partitions")
    for name, s in stats.stacks.items():
        lim = s.limits(t.num_sc_per_chip)
        print(f"  {name}: max_ids_per_partition={lim['max_ids_per_partition']}, max_unique_ids_per_partition="
              f"{lim['max_unique_ids_per_partition']}, suggested_coo_buffer_size_per_device="
              f"{lim['suggested_coo_buffer_size_per_device']} (from the {s.source})")
    return 0


def cmd_report(args) -> int:
    from profiles import commands  # a command's imports (see the imports)
    print(f"wrote {commands.report(args.profiles, args.plan, args.output, args.model)}")
    return 0


def spec_model(path: str, profile_dir: Optional[str]):
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
