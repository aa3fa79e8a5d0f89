"""Busy and idle samples per thread and task of a py-spy raw profile; or where the time under a frame goes.

    py-spy record -r 100 --threads --idle --nonblocking -f raw -o F -- .venv/bin/python benchmarks/phases.py DATA
    .venv/bin/python benchmarks/pyspy_threads.py F                  # per (thread, its first project frame)
    .venv/bin/python benchmarks/pyspy_threads.py F "_BuildStep._build"   # inclusive samples under that frame

A sample is "idle" when its innermost frame waits (a condition, a queue, a thread join, an idle pool
worker); else "busy", which includes waiting for the GIL. The task of a thread is its outermost frame
in pipelines/, tpu_embed/ or profiles/ other than the thread plumbing (`prefetched`, `Behind.run`).
"""

from __future__ import annotations

import collections
import re
import sys

_IDLE = ("Condition.wait", "_wait_for_tstate_lock", "Queue.get", "Event.wait",
         "_worker (concurrent/futures/thread.py:81)")
_PLUMBING = ("prefetched.<locals>.produce", "Behind.run", "_WorkItem.run")


def samples(path: str):
    """(thread name, frames outermost first, count) of each line of a py-spy raw file."""
    with open(path) as fh:
        for line in fh:
            stack, _, n = line.rstrip().rpartition(" ")
            if not n.isdigit():
                continue
            frames = stack.split(";")
            head = frames[0]
            yield (head.split(":", 1)[1].strip() if ":" in head else head), frames[1:], int(n)


def _short(frame: str) -> str:
    return re.sub(r" \(.*?([^/]+/[^/]+\.py):\d+\)", r" (\1)", frame)


def per_task(path: str) -> None:
    counts: dict = collections.defaultdict(collections.Counter)
    for thread, frames, n in samples(path):
        task = "?"
        for f in frames:
            m = re.search(r"^(\S+) \((?:.*/)?(pipelines|tpu_embed|profiles)/([^:]+):", f)
            if m and m.group(1) not in _PLUMBING:
                task = f"{m.group(1)} ({m.group(2)}/{m.group(3)})"
                break
        idle = bool(frames) and any(x in frames[-1] for x in _IDLE)
        counts[(thread, task)]["idle" if idle else "busy"] += n
    for (thread, task), c in sorted(counts.items(), key=lambda kv: -kv[1]["busy"] - kv[1]["idle"])[:30]:
        print(f"{c['busy']:6d} busy {c['idle']:6d} idle  {thread}: {task}")


def under(path: str, marker: str) -> None:
    incl: collections.Counter = collections.Counter()
    total = 0
    for _, frames, n in samples(path):
        hits = [k for k, f in enumerate(frames) if marker in f]
        if not hits or any(x in frames[-1] for x in _IDLE):
            continue
        total += n
        for f in set(_short(f) for f in frames[hits[-1]:]):
            incl[f] += n
    print(f"{total} busy samples under {marker!r}")
    for f, c in incl.most_common(30):
        print(f"{c:6d} {f}")


if __name__ == "__main__":
    if len(sys.argv) > 2:
        under(sys.argv[1], sys.argv[2])
    else:
        per_task(sys.argv[1])
