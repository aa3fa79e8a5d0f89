"""Work-arounds for three bugs of Beam 2.77's DaskRunner (apache_beam/runners/dask), used by `pipelines.runner`.

1. The outputs of a multi-output ParDo are not separated: the runner keeps one Dask bag per
   *transform* (`DaskBagVisitor.bags[producer]`) and `apply_dofn_to_bundle` returns every output
   with its tag stripped, so the consumers of each output see all of them. The jobs avoid
   `.with_outputs(...)` altogether (`pipelines.jobs.split_tagged`), on every runner.

2. A ParDo's output list is shared by all the bundles that run in one process: `ParDo.apply` builds
   one `OneReceiver` at graph-construction time, and `apply_dofn_to_bundle` appends to its `values`
   and never clears them. Whenever the same deserialized task arguments run twice in a worker (one
   task computing several side inputs that share an upstream ParDo, as the manifest writer does),
   the second run returns the first run's elements again: our shard job counted its one input chunk
   twice. `DaskParDo` below is Beam's `ParDo` op with fresh receivers per bundle.

3. `apply_dofn_to_bundle` collects a bundle's outputs before `finish_bundle`, so whatever a DoFn
   emits there is lost (the shard job's last runs of each bundle, `pipelines.shard_runs`).
   `_apply_dofn_to_bundle` collects after it.

`fixed_translations()` installs `DaskParDo` for the duration of one pipeline run (the graph is
built in the driver; workers import `pipelines.dask_compat._apply_dofn_to_bundle` by reference).
See docs/pipelines.md, "Dask".
"""

from __future__ import annotations

import contextlib

import apache_beam
from apache_beam import DoFn
from apache_beam.runners.common import DoFnContext, DoFnInvoker, DoFnSignature, _OutputHandler


def _apply_dofn_to_bundle(items, fn, window_fn, invoker_kwargs):
    """Beam's `transform_evaluator.apply_dofn_to_bundle`, with receivers that belong to this bundle only."""
    from apache_beam.runners.dask.transform_evaluator import OneReceiver
    receivers = OneReceiver()
    handler = _OutputHandler(window_fn=window_fn, main_receivers=receivers[None], tagged_receivers=receivers,
                             per_element_output_counter=None, output_batch_converter=None,
                             process_yields_batches=False, process_batch_yields_elements=False)
    invoker = DoFnInvoker.create_invoker(DoFnSignature(fn), handler, **invoker_kwargs)
    invoker.invoke_setup()
    invoker.invoke_start_bundle()
    for it in items:
        invoker.invoke_process(it)
    invoker.invoke_finish_bundle()  # Beam collects before finish_bundle and loses what it emits (our shard runs)
    invoker.invoke_teardown()
    return [v.value for v in receivers.values]


def _dask_pardo_class():
    from apache_beam.runners.dask import transform_evaluator as te

    class DaskParDo(te.ParDo):
        def apply(self, input_bag, side_inputs=None):
            transform = self.transform
            args, kwargs = transform.raw_side_inputs
            main_input = next(iter(self.applied.main_inputs.values()))
            window_fn = main_input.windowing.windowfn if hasattr(main_input, "windowing") else None
            invoker_kwargs = dict(context=DoFnContext(transform.label, state=None), side_inputs=side_inputs,
                                  input_args=list(args), input_kwargs=kwargs, user_state_context=None,
                                  bundle_finalizer_param=DoFn.BundleFinalizerParam())
            return input_bag.map(te.get_windowed_value, window_fn).map_partitions(
                _apply_dofn_to_bundle, transform.fn, window_fn, invoker_kwargs)

    return DaskParDo


@contextlib.contextmanager
def fixed_translations():
    """Beam's DaskRunner translation table with `DaskParDo`, restored afterwards."""
    from apache_beam.runners.dask import transform_evaluator as te
    before = te.TRANSLATIONS[apache_beam.ParDo]
    te.TRANSLATIONS[apache_beam.ParDo] = _dask_pardo_class()
    try:
        yield
    finally:
        te.TRANSLATIONS[apache_beam.ParDo] = before
