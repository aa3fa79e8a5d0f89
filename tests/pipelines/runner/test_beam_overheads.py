"""`pipelines.beam_overheads`: while a job is built and run, Beam computes what it computes without them (each DoFn
method's signature computed once, one view of the pipeline's options per class), and is its own again after."""

import inspect

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import core
from apache_beam.typehints import decorators

from pipelines import beam_overheads


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
    with beam_overheads.signatures_computed_once():
        assert decorators.get_signature is not compute and core.get_signature is decorators.get_signature
        got = [decorators.get_signature(f) for f in targets] + [core.get_signature(f) for f in targets]
        assert got == want + want
        assert got[0] is got[1]  # one computation for the method of two instances
        assert core.get_function_arguments(_Other(), "process") == (["element", "extra"], [1])
    assert decorators.get_signature is compute and core.get_signature is compute
    assert want[0] == inspect.signature(_Fn().process)


def test_a_pipeline_runs_with_them():
    with beam_overheads.signatures_computed_once():
        with beam.Pipeline(runner="DirectRunner") as p:
            out = p | beam.Create([1, 2, 3]) | beam.ParDo(_Fn())
            assert_that(out, equal_to([1, 2, 3]))


def test_option_views_are_made_once_per_class_share_their_values_and_beam_gets_its_own_back():
    from apache_beam.options.pipeline_options import (
        DebugOptions,
        PipelineOptions,
        SetupOptions,
        StandardOptions,
        TypeOptions,
    )
    make_view = PipelineOptions.view_as
    flags = ["--runner=DirectRunner", "--experiments=a", "--no_pipeline_type_check"]
    plain = PipelineOptions(flags)
    want = {cls: make_view(plain, cls).get_all_options() for cls in (StandardOptions, TypeOptions, DebugOptions)}
    with beam_overheads.option_views_made_once():
        assert PipelineOptions.view_as is not make_view
        with beam_overheads.option_views_made_once():  # entered again: nothing changes twice
            pass
        assert PipelineOptions.view_as is not make_view
        opts = PipelineOptions(flags)
        for cls, values in want.items():
            assert opts.view_as(cls) is opts.view_as(cls)
            assert opts.view_as(cls).get_all_options() == values
        assert opts.view_as(TypeOptions).pipeline_type_check is False
        assert opts.view_as(DebugOptions).experiments == ["a"]
        opts.view_as(StandardOptions).runner = None  # as beam.Pipeline does: the value is the options', not the view's
        assert opts.view_as(StandardOptions).runner is None and opts.get_all_options()["runner"] is None
        opts.view_as(StandardOptions).runner = "DirectRunner"
        opts.view_as(SetupOptions).save_main_session = True
        assert opts.view_as(SetupOptions).save_main_session is True
        assert opts.get_all_options()["save_main_session"] is True
        other = PipelineOptions(flags)  # another object: views of its own
        assert other.view_as(StandardOptions) is not opts.view_as(StandardOptions)
        assert other.view_as(SetupOptions).save_main_session is make_view(plain, SetupOptions).save_main_session is None
    assert PipelineOptions.view_as is make_view
    assert opts.view_as(StandardOptions) is not opts.view_as(StandardOptions)
    assert opts.view_as(StandardOptions).runner == "DirectRunner"


def test_a_pipeline_runs_with_its_options_viewed_once():
    from apache_beam.options.pipeline_options import PipelineOptions
    with beam_overheads.option_views_made_once(), beam_overheads.signatures_computed_once():
        with beam.Pipeline(runner="DirectRunner", options=PipelineOptions(["--no_pipeline_type_check"])) as p:
            out = p | beam.Create([1, 2, 3]) | beam.ParDo(_Fn())
            assert_that(out, equal_to([1, 2, 3]))


class _Stateful(beam.DoFn):
    SEEN = beam.transforms.userstate.BagStateSpec("seen", beam.coders.VarIntCoder())
    EXPIRY = beam.transforms.userstate.TimerSpec("expiry", beam.transforms.timeutil.TimeDomain.WATERMARK)

    def process(self, element, seen=beam.DoFn.StateParam(SEEN), expiry=beam.DoFn.TimerParam(EXPIRY)):  # noqa: B008
        seen.add(element[1])
        expiry.set(0)

    @beam.transforms.userstate.on_timer(EXPIRY)
    def expire(self, seen=beam.DoFn.StateParam(SEEN)):  # noqa: B008 - Beam's way of asking for state
        yield sum(seen.read())


def test_dofn_specs_are_beams_walked_once_per_dofn_and_beam_gets_its_own_back(monkeypatch):
    import functools

    from apache_beam.transforms import userstate
    compute = userstate.get_dofn_specs
    walked = []

    @functools.wraps(compute)
    def counted(dofn):
        walked.append(dofn)
        return compute(dofn)

    monkeypatch.setattr(userstate, "get_dofn_specs", counted)
    dofns = [_Stateful(), _Stateful(), _Fn(), beam.Map(lambda x, t=beam.DoFn.TimestampParam: x).fn]
    want = [compute(d) for d in dofns]
    assert want[0][0] and want[0][1]  # a state spec and a timer spec
    walked.clear()  # (beam.Map's ParDo asked when it was made)
    with beam_overheads.dofn_specs_computed_once():
        assert userstate.get_dofn_specs is not counted
        with beam_overheads.dofn_specs_computed_once():  # entered again: nothing changes twice
            pass
        got = [userstate.get_dofn_specs(d) for d in dofns + dofns]
        assert got == want + want
        assert userstate.is_stateful_dofn(dofns[0]) and not userstate.is_stateful_dofn(dofns[2])
        userstate.validate_stateful_dofn(dofns[0])
        assert got[0][0] is not got[4][0]  # each caller gets its own sets
        assert walked == dofns  # once per object, not per class
    assert userstate.get_dofn_specs is counted


def test_a_stateful_pipeline_runs_with_its_specs_walked_once():
    with beam_overheads.dofn_specs_computed_once(), beam_overheads.signatures_computed_once():
        with beam.Pipeline(runner="DirectRunner") as p:
            out = p | beam.Create([("a", 1), ("a", 2), ("b", 5)]) | beam.ParDo(_Stateful())
            assert_that(out, equal_to([3, 5]))


def test_pickles_are_compressed_by_zlib_read_either_way_and_beam_gets_bzip2_back():
    import base64
    import bz2

    from apache_beam.internal import cloudpickle_pickler, pickler
    value = {"fn": _Fn(), "data": list(range(1000))}
    before = pickler.dumps(value)  # bzip2, as Beam writes it
    assert base64.b64decode(before)[:3] == b"BZh"
    with beam_overheads.pickles_compressed_lightly():
        with beam_overheads.pickles_compressed_lightly():  # entered again: nothing changes twice
            pass
        assert cloudpickle_pickler.bz2 is not bz2
        light = pickler.dumps(value)
        assert base64.b64decode(light)[:1] == b"\x78"  # a zlib stream
        for encoded in (light, before):
            got = pickler.loads(encoded)
            assert got["data"] == value["data"] and isinstance(got["fn"], _Fn)
        assert cloudpickle_pickler._dumps(value) == cloudpickle_pickler._dumps(value)  # the pickle itself unchanged
    assert cloudpickle_pickler.bz2 is bz2
    assert base64.b64decode(pickler.dumps(value))[:3] == b"BZh"


def test_a_pipeline_runs_with_its_pickles_compressed_lightly():
    with beam_overheads.pickles_compressed_lightly(), beam_overheads.dofn_specs_computed_once():
        with beam.Pipeline(runner="DirectRunner") as p:
            out = (p | beam.Create([("a", 1), ("b", 2), ("a", 3)]) | beam.Map(lambda kv: (kv[0], kv[1] * 10))
                   | beam.GroupByKey() | beam.MapTuple(lambda k, vs: (k, sorted(vs))) | beam.ParDo(_Fn()))
            assert_that(out, equal_to([("a", [10, 30]), ("b", [20])]))
