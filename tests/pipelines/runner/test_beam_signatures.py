"""`pipelines.runner._signatures_computed_once`: while a job is built and run, Beam's `get_signature` gives what it
gives without the cache (computed once per function, or per method and class), and is Beam's own again after."""

import inspect

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import core
from apache_beam.typehints import decorators

from pipelines import runner


class _Fn(beam.DoFn):
    def process(self, element, side=None, *rest, key=beam.DoFn.KeyParam):
        yield element


class _Other(_Fn):
    def process(self, element, extra=1):
        yield element


def test_signatures_are_beams_while_cached_and_beam_gets_its_own_back():
    compute = decorators.get_signature
    targets = [_Fn().process, _Fn().process, _Other().process, _Fn.process, len, lambda a, b=2: a]
    want = [compute(f) for f in targets]
    with runner._signatures_computed_once():
        assert decorators.get_signature is not compute and core.get_signature is decorators.get_signature
        got = [decorators.get_signature(f) for f in targets] + [core.get_signature(f) for f in targets]
        assert got == want + want
        assert got[0] is got[1]  # one computation for the method of two instances
        assert core.get_function_arguments(_Other(), "process") == (["element", "extra"], [1])
    assert decorators.get_signature is compute and core.get_signature is compute
    assert want[0] == inspect.signature(_Fn().process)


def test_a_pipeline_runs_with_them():
    with runner._signatures_computed_once():
        with beam.Pipeline(runner="DirectRunner") as p:
            out = p | beam.Create([1, 2, 3]) | beam.ParDo(_Fn())
            assert_that(out, equal_to([1, 2, 3]))
