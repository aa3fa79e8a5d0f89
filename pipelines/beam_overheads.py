"""Beam's fixed costs that the jobs' pipelines pay once per transform or bundle, cut while a job is built and run.

Each is a context manager that changes one thing of Beam 2.77 for as long as it is entered, and leaves a Beam
whose code is not the one it knows as it is (`pipelines.runner._run_pipeline` enters them):

* `state_sampling_period`: the period of Beam's state sampler (every bundle's end waits for it);
* `signatures_computed_once`: the signatures of DoFn methods, computed once per function;
* `option_views_made_once`: one view of the pipeline's options per options class;
* `dofn_specs_computed_once`: the state and timer specs of a DoFn, computed once per DoFn object;
* `pickles_compressed_lightly`: the pickles of functions and DoFns compressed by zlib's fastest level, not bzip2's
  best (in-process runs only: a worker in another process reads Beam's format).

What Beam computes is the same with and without them (tests/pipelines/runner/test_beam_overheads.py).
"""

from __future__ import annotations

import contextlib
import zlib
from typing import Dict, Tuple

# Beam's state sampler (the msec counters of each step) runs a thread per bundle that sleeps up to its
# sampling period (200 ms) between samples, and the end of every bundle joins it: a bundle that ran for
# seconds waits ~100 ms on average for nothing. The jobs' in-process bundles run for seconds (the read,
# the vocabulary combine, the shard build), one after another: 0.2-0.4 s of a 2 M-example `run`.
# Beam 2.77 has no option for the period, so for the runs of the in-process runner its default is this.
STATE_SAMPLING_MS = 20


@contextlib.contextmanager
def state_sampling_period(ms: int):
    from apache_beam.runners.worker import statesampler
    init = statesampler.StateSampler.__init__
    defaults = init.__defaults__
    if defaults != (statesampler.DEFAULT_SAMPLING_PERIOD_MS,):  # another Beam: leave it as it is
        yield
        return
    init.__defaults__ = (ms,)
    try:
        yield
    finally:
        init.__defaults__ = defaults


# Beam asks for the signature of a DoFn's methods whenever it builds, translates or starts running a ParDo (its
# state and timer parameters, `userstate.get_dofn_specs`): ~20,000 `inspect.signature` calls in one `run`, of
# the same few dozen functions, 0.2-0.3 s of the jobs' fixed cost. While a job is built and run they are
# computed once per function (per method and class, the same for every instance), as Beam computes them.
_SIGNATURE_USERS = ("apache_beam.typehints.decorators", "apache_beam.transforms.core",
                    "apache_beam.transforms.ptransform", "apache_beam.transforms.util")


@contextlib.contextmanager
def signatures_computed_once():
    import importlib
    modules = [importlib.import_module(m) for m in _SIGNATURE_USERS]
    compute = modules[0].get_signature
    if any(getattr(m, "get_signature", None) is not compute for m in modules):  # another Beam: leave it
        yield
        return
    cache: dict = {}

    def get_signature(func):
        owner = getattr(func, "__self__", None)
        key = (getattr(func, "__func__", func), None if owner is None else type(owner))
        try:
            return cache[key]
        except TypeError:  # not hashable: computed each time
            return compute(func)
        except KeyError:
            signature = cache[key] = compute(func)
            return signature

    for m in modules:
        m.get_signature = get_signature  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for m in modules:
            m.get_signature = compute  # type: ignore[attr-defined]


# Beam reads its options through views (`PipelineOptions.view_as(TypeOptions).pipeline_type_check`, ...): at every
# transform applied, type hint checked, and step run. Each view is a new options object that builds an
# argparse parser of its class's flags and parses the pipeline's flags with it (~0.6 ms): ~600 views in one
# `run`, 0.3-0.4 s of its fixed cost. A view holds nothing of its own: its flags are the pipeline's and its
# values live in the options' shared `_all_options`, which Beam fills with the class's defaults at the first
# view. So while a job is built and run, an options object makes one view per class and gives it again.
@contextlib.contextmanager
def option_views_made_once():
    from apache_beam.options.pipeline_options import PipelineOptions
    make_view = PipelineOptions.view_as
    if make_view.__qualname__ != "PipelineOptions.view_as":  # another Beam, or already entered: leave it
        yield
        return
    views: Dict[Tuple[int, type], Tuple[PipelineOptions, PipelineOptions]] = {}

    def view_as(self, cls):
        key = (id(self), cls)
        made = views.get(key)
        if made is None or made[0] is not self:  # not made yet, or an id reused by another object
            made = views[key] = (self, make_view(self, cls))
        return made[1]

    PipelineOptions.view_as = view_as  # type: ignore[method-assign]
    try:
        yield
    finally:
        PipelineOptions.view_as = make_view  # type: ignore[method-assign]


# Beam asks for a DoFn's state and timer specs (`userstate.get_dofn_specs`: a walk over every attribute of the
# DoFn, each method's parameters wrapped) whenever a ParDo is made, translated, checked or set up to run a bundle,
# ~4 times per DoFn object: ~640 walks in one `run`, 0.14 s of its fixed cost. A DoFn's methods and their
# defaults do not change once it is made, so while a job is built and run they are walked once per DoFn object
# (Beam's own errors, a DoFn it refuses, are raised each time).
@contextlib.contextmanager
def dofn_specs_computed_once():
    from apache_beam.transforms import userstate
    compute = userstate.get_dofn_specs
    if compute.__qualname__ != "get_dofn_specs" or compute.__module__ != userstate.__name__:  # another Beam, or
        yield                                                                                # already entered
        return
    specs: Dict[int, tuple] = {}

    def get_dofn_specs(dofn):
        made = specs.get(id(dofn))
        if made is None or made[0] is not dofn:  # not walked yet, or an id reused by another object
            made = specs[id(dofn)] = (dofn, compute(dofn))
        state_specs, timer_specs = made[1]
        return set(state_specs), set(timer_specs)  # the caller's own sets, as Beam returns

    userstate.get_dofn_specs = get_dofn_specs
    try:
        yield
    finally:
        userstate.get_dofn_specs = compute


# Beam pickles every DoFn, function and transform payload it translates, copies or sets up for a bundle, and
# compresses each pickle with bzip2 at its best level (`cloudpickle_pickler.dumps`): ~630 pickles of a few hundred
# bytes in one `run`, each paying bzip2's setup (a 900 kB block: ~8 MB of work memory made and cleared), and ~400
# decompressed the same way. That is 0.15-0.25 s of the jobs' fixed cost, mostly on the thread that builds the
# pipeline and its bundles' operations. Where every pickle is read in this process (the in-process runner), the
# pickles it makes are compressed with zlib's fastest level instead; a pickle Beam made before (bzip2: "BZh") is
# still read as such.
_BZIP2_MAGIC = b"BZh"


class _LightCompression:
    """What `cloudpickle_pickler` calls as `bz2`: compress with zlib level 1; decompress either."""

    def __init__(self, bz2_module):
        self._bz2 = bz2_module

    @staticmethod
    def compress(data: bytes, compresslevel: int = 9) -> bytes:  # Beam's level is not zlib's: the fastest one
        return zlib.compress(data, 1)

    def decompress(self, data: bytes) -> bytes:
        if data[:3] == _BZIP2_MAGIC:
            return self._bz2.decompress(data)
        return zlib.decompress(data)


@contextlib.contextmanager
def pickles_compressed_lightly():
    import bz2

    from apache_beam.internal import cloudpickle_pickler
    if getattr(cloudpickle_pickler, "bz2", None) is not bz2:  # another Beam, or already entered: leave it
        yield
        return
    cloudpickle_pickler.bz2 = _LightCompression(bz2)  # type: ignore[assignment]
    try:
        yield
    finally:
        cloudpickle_pickler.bz2 = bz2
