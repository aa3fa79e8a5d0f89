"""Cost of balanced ids (`partition: {ids: balanced}`) on the demo's data, measured side by side in one run.

    .venv/bin/python benchmarks/balanced_ids.py [--examples 500000] [--out build/bench-balanced] [--pairs 2]

1. The assignment itself: every vocabulary's draft of the demo's data (its exact token counts, as the vocabulary
   job counts them) through `pipelines.mapping.balanced_ids.assign` (the one place the ids are chosen) and
   `apply` (each vocabulary's tokens put in id order, its frequency ids), best of 3.
2. `tpu-embed run --no-transform-output` of the demo's spec in frequency order and with balanced ids, alternating,
   `--pairs` times (wall time of the command): the assignment, its Beam stages, and the profile counting every
   step a second time in frequency order.
3. `ProfileCollector.add_step`, and `add_step` of a balanced artifact (each step counted in frequency order too),
   on the demo's first steps (its generator's ids as global ids), with the native step counts and with their numpy
   reference (`profiles.step_counts`), best of 3.

Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def data_and_specs(out: str, examples: int):
    from pipelines import demo_data
    data = os.path.join(out, "data")
    if not os.path.isdir(data):
        demo_data.write_dataset(data, examples, seed=1234, num_files=8)
    specs = {}
    for ids in ("frequency", "balanced"):
        path = os.path.join(out, f"spec-{ids}.yaml")
        text = demo_data.spec_text(["data/part-*.tfrecord"], path, 2048)
        if ids == "frequency":
            text = text.replace("partition: {ids: balanced}\n", "")
        with open(path, "w") as fh:
            fh.write(text)
        specs[ids] = path
    return specs


def token_counts(examples: int):
    """{feature: Table(token, count)} of the demo's data: the generator's columns counted (tokens are the ids'
    decimal text: the assignment sees counts; the apply step moves as many tokens)."""
    from pipelines import demo_data
    cols = demo_data.generate(examples, seed=1234)
    out = {}
    for name in demo_data.vocabulary_cardinalities():
        col = cols[name]
        ids = col[1] if isinstance(col, tuple) else col
        if name == "history":
            lengths = col[0]
            keep = np.concatenate([np.arange(n) < 10 for n in lengths]) if lengths.size else np.zeros(0, bool)
            ids = ids[keep]
        u, c = np.unique(ids, return_counts=True)
        out[name] = pa.table({"token": pa.array([str(x).encode() for x in u.tolist()], pa.large_binary()),
                              "count": pa.array(c, pa.int64())})
    return out


def time_assignment(spec_path: str, examples: int) -> dict:
    from pipelines.mapping import balanced_ids
    from tpu_embed.artifact.spec import load_spec
    spec = load_spec(spec_path)
    counts = token_counts(examples)
    drafts = {k: balanced_ids.draft(spec, k, counts[k]) for k in spec.vocabulary_groups()}
    light = {k: d.without_tokens() for k, d in drafts.items()}
    best_assign = best_apply = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        a = balanced_ids.assign(spec, light)
        best_assign = min(best_assign, time.perf_counter() - t)
        t = time.perf_counter()
        for k, d in drafts.items():
            balanced_ids.apply(d, a[k])
        best_apply = min(best_apply, time.perf_counter() - t)
    return {"tokens": sum(len(d.tokens) for d in drafts.values()), "vocabularies": len(drafts),
            "assign": best_assign, "apply": best_apply}


def time_runs(specs: dict, out: str, pairs: int) -> dict:
    exe = os.path.join(os.path.dirname(sys.executable), "tpu-embed")
    times = {k: [] for k in specs}
    for _ in range(pairs):
        for ids, spec in specs.items():
            art = os.path.join(out, f"artifact-{ids}")
            subprocess.run(["rm", "-rf", art], check=True)
            t = time.perf_counter()
            subprocess.run([exe, "run", "--spec", spec, "--output", art, "--no-transform-output"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times[ids].append(time.perf_counter() - t)
    return times


def time_profile(spec_path: str, out: str, steps: int = 24) -> dict:
    """add_step on the frequency artifact's first steps, plain and balanced, native counting and numpy."""
    import profiles
    from profiles import step_counts
    from tpu_embed.artifact.manifest import read_manifest
    from tpu_embed.artifact.spec import load_spec
    from tpu_embed.sparsecore import FeatureIds
    spec = load_spec(spec_path)
    art = os.path.join(out, "artifact-frequency")
    sizes = read_manifest(art).vocabulary_sizes
    model = spec.model(sizes)
    cols = __import__("pipelines.demo_data", fromlist=["generate"]).generate(steps * spec.global_batch_size, seed=1)
    B = spec.global_batch_size
    batches = []
    for s in range(steps):
        g = {}
        for f in model.features:
            col = cols[f.name]
            if isinstance(col, tuple):
                lengths, values = col
                off = np.concatenate([[0], np.cumsum(lengths)])
                lo, hi = off[s * B], off[(s + 1) * B]
                per = lengths[s * B:(s + 1) * B]
                if f.max_sequence_length:
                    L = f.max_sequence_length
                    pos = np.concatenate([np.arange(n) for n in per]) if per.size else np.zeros(0, np.int64)
                    keep = pos < L
                    rows = (np.repeat(np.arange(B), per) * L + pos)[keep]
                    ids = values[lo:hi][keep]
                else:
                    rows, ids = np.repeat(np.arange(B), per), values[lo:hi]
            else:
                rows, ids = np.arange(B), col[s * B:(s + 1) * B]
            ids = np.asarray(ids, np.int64) % f.table.vocabulary_size
            g[f.name] = FeatureIds(rows.astype(np.int64), ids, None)
        batches.append(g)
    collector = profiles.ProfileCollector(model)
    rng = np.random.default_rng(0)
    both = profiles.ProfileCollector(model, frequency_ids={t.name: rng.permutation(t.vocabulary_size - 1)
                                                           for t in model.tables})
    best = {(name, counting): float("inf")
            for name in ("add_step", "add_step_both") for counting in ("native", "numpy")}
    native = step_counts._native

    def timed(name, counting, c):
        step_counts._native = native if counting == "native" else None
        acc = c.create_accumulator()
        t = time.perf_counter()
        try:
            for i, g in enumerate(batches):
                c.add_step(acc, g, step=i)
        finally:
            step_counts._native = native
        best[name, counting] = min(best[name, counting], (time.perf_counter() - t) / steps)

    for _ in range(3):
        for counting in ("native", "numpy"):
            timed("add_step", counting, collector)
            timed("add_step_both", counting, both)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=500_000)
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench-balanced"))
    ap.add_argument("--pairs", type=int, default=2)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    specs = data_and_specs(args.out, args.examples)
    runs = time_runs(specs, args.out, args.pairs)
    assignment = time_assignment(specs["balanced"], args.examples)
    prof = time_profile(specs["frequency"], args.out)
    freq, bal = min(runs["frequency"]), min(runs["balanced"])
    cost = assignment["assign"] + assignment["apply"]
    print(f"| measurement (demo data, {args.examples:,} examples, {os.cpu_count()} cores) | figure |")
    print("| --- | --- |")
    print(f"| assignment: `balanced_ids.assign`, {assignment['vocabularies']} vocabularies, "
          f"{assignment['tokens']:,} tokens | {assignment['assign']:.3f} s |")
    print(f"| their tokens put in id order (`balanced_ids.apply`) | {assignment['apply']:.3f} s |")
    print(f"| `tpu-embed run`, frequency order (best of {args.pairs}) | {freq:.1f} s |")
    print(f"| `tpu-embed run`, balanced ids (best of {args.pairs}) | {bal:.1f} s |")
    print(f"| assignment / balanced run | {cost / bal:.1%} |")
    print(f"| balanced run / frequency run | {bal / freq:.3f} |")
    for counting in ("native", "numpy"):
        plain, both = prof["add_step", counting], prof["add_step_both", counting]
        print(f"| `ProfileCollector.add_step` per 2048-example step, {counting} counting | {plain * 1e3:.2f} ms |")
        print(f"| `add_step` of a balanced artifact (every step also counted in frequency order), {counting} counting "
              f"| {both * 1e3:.2f} ms ({both / plain:.2f}x) |")
    print(f"runs (s): {runs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
