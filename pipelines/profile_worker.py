"""A bundle's partial profile, in a thread or in a child process (`pipelines.child_process`).

The shard job adds every step to a partial profile (`profiles.ProfileCollector.add_step`). With the native
step counts (`profiles.step_counts`, built by the install) that is ~1.5 ms per 4096-example step, most of it
without the GIL: a thread runs it beside the build of the next steps' records and the worker's mapping. Without
them it is ~5 ms of numpy calls that mostly hold the GIL: in a thread they would take turns with the rest, so
where the worker may use two or more CPUs they run in a child process (`use_child`). The statistics are the
same: the same steps, in step order, on the same arrays; the child returns the accumulator when the bundle
ends. Both add the steps in groups (`profiles.collector.STEPS_PER_CALL`, `add_steps`): the same accumulator
as one by one, at a fraction of the calls.
"""

from __future__ import annotations

import os
from typing import Optional

from pipelines import child_process
from pipelines.background import Behind
from profiles import step_counts
from profiles.collector import STEPS_PER_CALL, StepInput


def use_child(model) -> bool:
    """Whether a worker's profile statistics of `model` run in a child process: as `TPU_EMBED_CHILD_PROCESS=0/1`
    says, else where the worker may use two or more CPUs (`child_process.wanted`) and the counting holds the GIL
    (the numpy counting: the native step counts are not built, `TPU_EMBED_NATIVE=0`, or the model's tables are
    past their limits, `profiles.step_counts.native_counts`). Feeding a child costs its start and a pickle of
    every step's ids both ways: on the quoted workload of `benchmarks/run_throughput.py` a run with the native
    counting in a thread takes 0.3 s less than in a child (docs/benchmarks.md)."""
    if os.environ.get(child_process.ENV):
        return child_process.wanted()
    return child_process.wanted() and not step_counts.native_counts(model)


def start(collector, depth: int, child: Optional[child_process.Child] = None):
    """A bundle's partial profile: `ProfileProcess` on `child` (a worker's child, reused bundle after bundle)
    if given, else `ProfileThread`. `depth`: steps that may wait for the statistics (their ids are held
    meanwhile)."""
    return ProfileThread(collector, depth) if child is None else ProfileProcess(collector, depth, child)


class StepGroups:
    """Steps collected into groups of `STEPS_PER_CALL`, each handed to `add(group, validate)` when full (and the
    last one at `flush`); `validate` is whether any step of the group asked for it."""

    def __init__(self, add):
        self._add, self._group, self._validate = add, [], False

    def append(self, global_ids, oov_counts, step: int, validate: bool) -> None:
        self._group.append(StepInput(global_ids, oov_counts, int(step)))
        self._validate = self._validate or bool(validate)
        if len(self._group) >= STEPS_PER_CALL:
            self.flush()

    def flush(self) -> None:
        if self._group:
            group, validate = self._group, self._validate
            self._group, self._validate = [], False
            self._add(group, validate)


class ProfileThread:
    """`collector.add_steps` of one accumulator, in order, on a background thread of this process. `depth`: the
    steps that may wait for it, as whole groups of `STEPS_PER_CALL` (one at least), besides the group gathered."""

    def __init__(self, collector, depth: int):
        self.collector, self.acc = collector, collector.create_accumulator()
        self._behind = Behind(max(1, depth // STEPS_PER_CALL))
        self._groups = StepGroups(lambda group, validate: self._behind.run(
            self.collector.add_steps, self.acc, group, validate=validate))

    def add_step(self, global_ids, oov_counts, step: int, validate: bool) -> None:
        self._groups.append(global_ids, oov_counts, step, validate)

    def close(self):
        """The accumulator of every step added (the first error of a step is raised here, or at `add_step`)."""
        self._groups.flush()
        self._behind.close()
        return self.acc

    def abort(self) -> None:
        """A failed bundle: the steps under way finish in the background; nothing is kept."""


class ProfileProcess:
    """`ProfileThread` with the statistics computed by a child process (a thread hands it the steps)."""

    def __init__(self, collector, depth: int, child: Optional[child_process.Child] = None):
        self._child = child_process.Child() if child is None else child
        self._owned = child is None  # ended by `close`; else the caller's, free for its next bundle
        self._child.start("pipelines.profile_worker:serve", collector)
        self._sends = Behind(depth)

    def add_step(self, global_ids, oov_counts, step: int, validate: bool) -> None:
        self._sends.run(self._child.send, ("step", global_ids, oov_counts, int(step), bool(validate)))

    def close(self):
        try:
            self._sends.run(self._child.send, ("finish",))
            self._sends.wait()  # a failed send raises the child's error here
            _, acc = self._child.receive()
        except BaseException:
            self._child.kill()  # it may be mid-step: not reusable
            raise
        finally:
            self._sends.close()
        if self._owned:
            self._child.close()
        return acc

    def abort(self) -> None:
        """A failed bundle: end the child now (it may be mid-step)."""
        self._child.kill()


def serve(receive, send, collector):
    """In the child: add every step the parent sends to one accumulator, in groups of `STEPS_PER_CALL`; return
    it at ("finish",)."""
    acc = collector.create_accumulator()
    groups = StepGroups(lambda group, validate: collector.add_steps(acc, group, validate=validate))
    while True:
        msg = receive()
        if msg is None or msg[0] == "finish":
            groups.flush()
            return acc
        _, gids, oov, step, validate = msg
        groups.append(gids, oov, step, validate)
