"""The demo's stages, one day or a lineage of two: data, jobs, plan, training, serving, report."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from pipelines import demo_data, progress, runner, tft_output_writer
from pipelines.demo.dlrm_training import Trained, TrainResult, save_checkpoint, train_and_evaluate
from pipelines.demo.options import DemoConfig, DemoError
from pipelines.demo.output_dir import (
    ARTIFACT_DIR,
    CHECKPOINT_DIR,
    DATA_DIR,
    MARKER,
    MODEL_DIR,
    REPORT_DIR,
    SPEC_FILE,
    holding,
    prepare_output,
)
from pipelines.demo.serving_check import ServingCheck, export_and_score, held_out_examples, serving_lines
from pipelines.jobs import JobConfig
from pipelines.lineage_report import lineage_lines
from pipelines.sharding.planned_limits import PLAN_FILE
from profiles import load_plan
from profiles.balance_figures import balance_lines
from profiles.display import short_stack_name
from profiles.report import write_report
from tpu_embed.artifact.spec import Spec, load_spec

# ---------------------------------------------------------------- plan table

TF_DEFAULTS = (256, 256, 64)


def plan_lines(plan, stack_tables: Dict[str, List[str]]) -> List[str]:
    """The plan as a table: per stacked table the limits against TF's defaults, memory, drops, balance."""
    rows = [("stack", "tables", "max_ids_per_table", "max_unique_ids", "KiB/SC planned", "KiB/SC TF defaults",
             "drop rate", "balance")]
    for name, s in plan.stacks.items():
        rows.append((short_stack_name(name, stack_tables.get(name) or s.tables), str(len(s.tables)),
                     f"{s.max_ids_per_table} (TF {TF_DEFAULTS[0]})",
                     f"{s.max_unique_ids_per_table} (TF {TF_DEFAULTS[1]})",
                     f"{s.memory['planned_bytes_per_sc'] / 1024:.1f}",
                     f"{s.memory['tf_default_bytes_per_sc'] / 1024:.1f}",
                     f"{s.drops['drop_rate_at_most']:.3g}",
                     "-" if s.destination_balance is None else f"{s.destination_balance:.2f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = ["  " + "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
           for r in rows]
    m = plan.memory
    out.append(f"  max_ids_per_chip_per_sample = {plan.max_ids_per_chip_per_sample} (TF {TF_DEFAULTS[2]}); "
               f"allow_id_dropping = {plan.allow_id_dropping}")
    saved = m["tf_default_bytes_per_sc"] - m["planned_bytes_per_sc"]
    out.append(f"  buffer memory per SparseCore: {m['planned_bytes_per_sc'] / 1024:.1f} KiB planned vs "
               f"{m['tf_default_bytes_per_sc'] / 1024:.1f} KiB with TF's defaults "
               f"({'saves' if saved >= 0 else 'needs'} {abs(saved) / 1024:.1f} KiB)")
    over = [n for n, s in plan.stacks.items() if s.max_ids_per_table > TF_DEFAULTS[0]
            or s.max_unique_ids_per_table > TF_DEFAULTS[1]]
    if over:
        out.append(f"  with TF's defaults {len(over)} stacked table(s) would fail a step: the limits were measured, "
                   "not guessed")
    out.append("  balance = busiest destination SparseCore / mean over the whole run (1.00 is perfect)")
    return out


# ---------------------------------------------------------------- the demo

class _Steps:
    """`[i/n] text` headings."""

    def __init__(self, total: int):
        self.total, self.done = total, 0

    def __call__(self, text: str) -> str:
        self.done += 1
        return f"[{self.done}/{self.total}] {text}"


def _write_spec(output: str, patterns: Sequence[str], cfg: DemoConfig, name: str = SPEC_FILE,
                capacities: Optional[Dict[str, int]] = None) -> str:
    path = os.path.join(output, name)
    with open(path, "w") as fh:
        fh.write(demo_data.spec_text(patterns, path, cfg.global_batch_size, capacities))
    return path


def _run_jobs(spec: Union[str, Spec], artifact: str, examples: int, beam_args, say, times: dict, key: str,
              base: Optional[str] = None):
    spec = load_spec(spec) if isinstance(spec, str) else spec
    job = JobConfig(spec=spec, output=artifact, base=base)
    graph = tft_output_writer.start(spec, base)  # as `tpu-embed run`: built beside the jobs unless cached
    try:
        t = time.time()
        with progress.records("  vocabularies", examples):
            runner.run_vocab(job, beam_args)
        times[f"{key}vocab"] = time.time() - t
        say(f"      vocabularies: {times[f'{key}vocab']:.1f} s")
        t = time.time()
        with progress.records("  shards + profile", examples):
            m = runner.run_shard(job, beam_args)
        assert m.counts is not None  # a shard job's manifest has counts
        times[f"{key}shard"] = time.time() - t
        say(f"      shards + profile + plan: {times[f'{key}shard']:.1f} s; {m.counts.examples_written:,} examples in "
            f"{m.counts.steps} steps of {spec.global_batch_size} on {spec.topology.num_chips} chips x "
            f"{spec.topology.num_sc_per_chip} SparseCores")
        t = time.time()
        m = tft_output_writer.write(artifact, spec, graph)
        times[f"{key}transform_output"] = time.time() - t
        say(f"      tf.Transform output: {times[f'{key}transform_output']:.1f} s more ({artifact}/transform_output)")
        return m
    finally:
        tft_output_writer.cancel(graph)  # a failed job's: the child stops


def _say_plan(artifact: str, m, say) -> None:
    plan = load_plan(os.path.join(artifact, PLAN_FILE))
    stacks = {k: list(v.tables) for k, v in (m.stacks or {}).items()}
    for line in plan_lines(plan, stacks):
        say(line)
    for line in balance_lines(plan.balance, stacks):  # frequency order -> balanced ids, with the floor
        say(line)


def _result_line(r: TrainResult) -> str:
    return (f"      loss {r.first_loss:.4f} -> {r.last_loss:.4f} over {r.train_steps} steps "
            f"({r.steps_per_second:.1f} steps/s); held out: {r.eval_examples:,} examples, "
            f"log loss {r.eval_loss:.4f}, AUC {r.eval_auc:.3f}")


def _train_summary(r: TrainResult) -> dict:
    return {k: v for k, v in dataclasses.asdict(r).items() if k != "losses"}


def run_demo(output: str, *, cfg: Optional[DemoConfig] = None, beam_args=(),
             say: Callable[[str], None] = print) -> dict:
    """Everything `tpu-embed demo` does; returns what it produced (also written to OUTPUT/demo.json). An earlier
    demo's output in `output` is replaced (see the module docstring)."""
    cfg = cfg or DemoConfig()
    if cfg.days not in (1, 2):
        raise DemoError(f"--days {cfg.days}: the demo runs 1 day, or a lineage of 2 (--days 2).")
    with holding(output):
        return _run_demo(output, cfg, beam_args, say)


def _run_demo(output: str, cfg: DemoConfig, beam_args, say: Callable[[str], None]) -> dict:
    t_start = time.time()
    if prepare_output(output):
        say(f"(replacing the earlier demo in {output})")
    with open(os.path.join(output, MARKER), "w") as fh:
        json.dump({"status": "running", "config": dataclasses.asdict(cfg)}, fh)
    run = _run_two_days if cfg.days == 2 else _run_one_day
    summary = run(output, cfg, beam_args, say)
    report_dir = os.path.join(output, REPORT_DIR)
    html = summary["report"]
    pngs = sorted(f for f in os.listdir(report_dir) if f.endswith(".png"))
    total = time.time() - t_start
    summary = {"status": "done", "config": dataclasses.asdict(cfg), **summary}
    summary["seconds"] = {k: round(v, 1) for k, v in dict(summary["seconds"], total=total).items()}
    with open(os.path.join(output, MARKER), "w") as fh:
        json.dump(summary, fh, indent=1)

    artifact = summary["artifact"]
    say("")
    say(f"Done in {total:.0f} s. Produced:")
    produced = [(summary["data"], "the raw data"), (summary["spec"], "its spec")]
    if cfg.days == 2:
        produced += [(summary["days"][0]["artifact"], "day 1's artifact: vocab/, shards/, profiles/, "
                      "transform_output/, plan.json, manifest.json"), (summary["days"][0]["checkpoint"],
                                                                       "day 1's checkpoint")]
    produced.append((artifact, ("day 2's artifact" if cfg.days == 2 else "the artifact") +
                     ": vocab/, shards/, profiles/, transform_output/, plan.json, manifest.json"))
    if summary["serving"] is not None:
        produced.append((summary["serving"]["path"], "the SavedModel (serving_default: serialized tf.train.Examples)"))
    produced.append((html, f"the profile report ({len(pngs)} plots)"))
    width = max(len(p) for p, _ in produced)
    for path, what in produced:
        say(f"  {path.ljust(width)}  {what}")
    exe = command_as_typed()
    say("Next:")
    say(f"  {exe} inspect {artifact}")
    say(f"  open {html}")
    if cfg.days == 1:
        say(f"  {exe} demo --days 2 --output build/demo2   # two days: append, restore, train on")
    say(f"  {exe} run --spec examples/criteo/spec.yaml --output build/criteo   # the same on your own spec")
    return summary


def command_as_typed() -> str:
    """How the user can type `tpu-embed` again: the bare name where it is on PATH as this very script, else the
    script's path as run (`make demo` runs `.venv/bin/tpu-embed`, whose folder is not on PATH)."""
    script = sys.argv[0] if sys.argv and os.path.basename(sys.argv[0]) == "tpu-embed" else None
    if script is None:
        return "tpu-embed"
    on_path = shutil.which("tpu-embed")
    if on_path and os.path.realpath(on_path) == os.path.realpath(script):
        return "tpu-embed"
    return os.path.relpath(script) if not os.path.relpath(script).startswith("..") else script


def _run_one_day(output: str, cfg: DemoConfig, beam_args, say) -> dict:
    step = _Steps(5 + int(cfg.serving))
    data_dir, artifact, report_dir = (os.path.join(output, d) for d in (DATA_DIR, ARTIFACT_DIR, REPORT_DIR))
    times: Dict[str, float] = {}

    say(step(f"data: {cfg.num_examples:,} synthetic Criteo-like examples (13 dense, 26 categorical with Zipf "
             "skew, 2 multivalent, 1 weighted, 1 sequence feature)"))
    t = time.time()
    with progress.bar(cfg.num_examples, "  generating", unit="examples") as bar:
        paths = demo_data.write_dataset(data_dir, cfg.num_examples, seed=cfg.seed, num_files=cfg.num_files,
                                        progress=bar.update)
    spec_path = _write_spec(output, [f"{DATA_DIR}/part-*.tfrecord"], cfg)
    times["data"] = time.time() - t
    size = sum(os.path.getsize(p) for p in paths)
    say(f"      {len(paths)} TFRecord files, {size / 2**20:.0f} MiB in {data_dir} ({times['data']:.1f} s); "
        f"spec: {spec_path}")

    say(step("jobs (Apache Beam, local runner): vocabularies, then shards + profile in one pass, then the plan"))
    m = _run_jobs(spec_path, artifact, cfg.num_examples, beam_args, say, times, "")

    say(step(f"plan ({os.path.join(artifact, PLAN_FILE)}; recorded in manifest.json and used for the shards)"))
    _say_plan(artifact, m, say)

    say(step(f"training a DLRM on CPU with HostEmbedding from the shards (held out: the last "
             f"{cfg.eval_fraction:.0%} of the steps)"))
    t = time.time()
    trained = train_and_evaluate(artifact, cfg, say)
    times["train"] = time.time() - t
    say(_result_line(trained.result))

    check = _serving_step(artifact, trained, load_spec(spec_path).input_patterns(), output, cfg, times, say, step,
                          "serving: the model exported as one SavedModel (raw tf.train.Examples in, logits and "
                          "probabilities out), scored on the held-out rows")

    say(step("profile report"))
    t = time.time()
    html = write_report(os.path.join(artifact, "profiles"), os.path.join(artifact, PLAN_FILE), report_dir)
    times["report"] = time.time() - t
    return {"data": data_dir, "spec": spec_path, "artifact": artifact, "plan": os.path.join(artifact, PLAN_FILE),
            "report": html, "seconds": times, "train": _train_summary(trained.result),
            "serving": check and dataclasses.asdict(check)}


def _run_two_days(output: str, cfg: DemoConfig, beam_args, say) -> dict:
    step = _Steps(7 + int(cfg.serving))
    data_dir, report_dir = os.path.join(output, DATA_DIR), os.path.join(output, REPORT_DIR)
    artifacts = [os.path.join(output, f"{ARTIFACT_DIR}-day{d}") for d in (1, 2)]
    checkpoint_prefix = os.path.join(output, CHECKPOINT_DIR, "day1", "ckpt")
    per_day = cfg.num_examples // 2
    times: Dict[str, float] = {}
    spec_path = _two_days_data(output, data_dir, cfg, say, step, times)

    say(step("day 1 jobs: vocabularies (the lineage's first day), shards + profile, plan"))
    m1 = _run_jobs(spec_path, artifacts[0], per_day, beam_args, say, times, "day1_")
    for line in _vocabulary_lines(m1, artifacts[0]):
        say(line)

    say(step(f"day 1 plan ({os.path.join(artifacts[0], PLAN_FILE)})"))
    _say_plan(artifacts[0], m1, say)

    say(step(f"day 1 training (held out: the last {cfg.eval_fraction:.0%} of the steps), then a checkpoint"))
    t = time.time()
    day1 = train_and_evaluate(artifacts[0], cfg, say)
    checkpoint = save_checkpoint(day1, checkpoint_prefix)
    times["day1_train"] = time.time() - t
    say(_result_line(day1.result))
    say(f"      checkpoint: {checkpoint} (tables with their Adagrad slots, the DLRM and its Adam)")

    say(step(f"day 2 jobs with --base {artifacts[0]}: day-1 tokens keep their ids, new ones take the free rows"))
    # The same spec on day 2's files (`tpu-embed run --spec S --input 'data/day2/*' --base artifact-day1`).
    spec2 = load_spec(spec_path).with_inputs([os.path.abspath(os.path.join(data_dir, "day2", "part-*.tfrecord"))])
    m2 = _run_jobs(spec2, artifacts[1], per_day, beam_args, say, times, "day2_", base=artifacts[0])
    for line in _vocabulary_lines(m2, artifacts[1]):
        say(line)

    say(step("day 2 training: warm (day 1's checkpoint restored as it is) against cold (fresh tables and "
             "model, same seed and steps)"))
    warm, cold = _warm_and_cold(artifacts[1], checkpoint, cfg, say, times)
    w, c = warm.result, cold.result

    check = _serving_step(artifacts[1], warm, spec2.input_patterns(), output, cfg, times, say, step,
                          "serving: day 2's warm model exported as one SavedModel, scored on day 2's held-out raw rows")

    say(step("profile report (day 2)"))
    t = time.time()
    html = write_report(os.path.join(artifacts[1], "profiles"), os.path.join(artifacts[1], PLAN_FILE), report_dir)
    times["report"] = time.time() - t
    return {"data": data_dir, "spec": spec_path, "artifact": artifacts[1],
            "plan": os.path.join(artifacts[1], PLAN_FILE), "report": html, "seconds": times,
            "train": _train_summary(w),
            "days": [{"artifact": artifacts[0], "checkpoint": checkpoint, "train": _train_summary(day1.result)},
                     {"artifact": artifacts[1], "warm": _train_summary(w), "cold": _train_summary(c)}],
            "serving": check and dataclasses.asdict(check)}


def _two_days_data(output: str, data_dir: str, cfg: DemoConfig, say, step: _Steps, times: dict) -> str:
    """Two days of synthetic data, and the spec of day 1's files with a capacity per vocabulary; its path."""
    per_day = cfg.num_examples // 2
    capacities = demo_data.append_capacities(per_day)
    say(step(f"data: {cfg.num_examples:,} synthetic Criteo-like examples as two days of {per_day:,} (the same "
             "hidden effects per token; each day brings new tokens)"))
    t = time.time()
    with progress.bar(cfg.num_examples, "  generating", unit="examples") as bar:
        paths = demo_data.write_days(data_dir, cfg.num_examples, 2, seed=cfg.seed, num_files=cfg.num_files,
                                     progress=bar.update)
    spec_path = _write_spec(output, [f"{DATA_DIR}/day1/part-*.tfrecord"], cfg, capacities=capacities)
    times["data"] = time.time() - t
    say(f"      {sum(len(p) for p in paths)} TFRecord files in {data_dir}/day1 and day2 ({times['data']:.1f} s); "
        f"spec: {spec_path}: every vocabulary `mode: append` with a capacity (e.g. C3 {capacities['C3']:,} rows, "
        f"history {capacities['history']:,}), so the tables keep their shapes from day to day")
    return spec_path


def _warm_and_cold(artifact: str, checkpoint: str, cfg: DemoConfig, say, times: dict) -> Tuple[Trained, Trained]:
    """Day 2 trained from day 1's checkpoint and from scratch, the same steps; their held-out figures side by
    side."""
    t = time.time()
    say("  warm start:")
    warm = train_and_evaluate(artifact, cfg, say, warm_start=checkpoint)
    say(_result_line(warm.result))
    say("  cold start:")
    cold = train_and_evaluate(artifact, cfg, say)
    say(_result_line(cold.result))
    times["day2_train"] = time.time() - t
    w, c = warm.result, cold.result
    say(f"      held out on day 2 after {w.train_steps} steps: log loss {w.eval_loss:.4f} warm vs "
        f"{c.eval_loss:.4f} cold, AUC {w.eval_auc:.3f} warm vs {c.eval_auc:.3f} cold")
    return warm, cold


def _serving_step(artifact: str, trained: Trained, inputs: Sequence[str], output: str, cfg: DemoConfig,
                  times: dict, say, step: _Steps, heading: str) -> Optional[ServingCheck]:
    # The held-out raw rows are found and checked against the shards even when the export is skipped (cheap).
    records = held_out_examples(artifact, trained, inputs)
    if not cfg.serving:
        return None  # not a step: `step` counted it only with serving
    say(step(heading))
    t = time.time()
    check = export_and_score(artifact, trained, records, os.path.join(output, MODEL_DIR))
    times["serving"] = time.time() - t
    for line in serving_lines(check):
        say(line)
    return check


def _vocabulary_lines(m, artifact: str) -> List[str]:
    """The lineage line, and the vocabularies that took new tokens or found their capacity full (every one:
    `tpu-embed inspect`)."""
    lines = lineage_lines(m)
    shown = sorted((x for x in lines[1:] if " 0 new)" not in x or "over capacity" in x),
                   key=lambda x: "over capacity" not in x)  # a full capacity first
    out = ["      " + x.strip() for x in lines[:1]] + ["      " + x for x in shown[:8]]
    if len(lines) - 1 > len(out) - 1:
        out.append(f"        ... and {len(lines) - len(out)} more: tpu-embed inspect {artifact}")
    return out


def main(output: str, num_examples: Optional[int], beam_args=(), days: int = 1, serving: bool = True) -> int:
    cfg = DemoConfig(days=days, serving=serving)
    if num_examples is not None:
        cfg.num_examples = num_examples
    run_demo(output, cfg=cfg, beam_args=beam_args)
    sys.stdout.flush()
    return 0
