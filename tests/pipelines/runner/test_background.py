"""pipelines.background: the reader one thread ahead (`prefetched`) keeps order, errors, bounded memory and
clean shutdown; the writes behind (`Behind`) land in order."""

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.background import mapped, prefetched


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(), max_size=50), st.integers(1, 4))
def test_items_arrive_in_order_and_complete(items, depth):
    assert list(prefetched(iter(items), depth)) == items


def test_the_iterator_runs_in_another_thread():
    threads = []

    def gen():
        for i in range(3):
            threads.append(threading.current_thread())
            yield i

    assert list(prefetched(gen())) == [0, 1, 2]
    assert all(t is not threading.current_thread() for t in threads)


def test_an_error_is_raised_after_the_items_before_it():
    def gen():
        yield 1
        yield 2
        raise ValueError("bad record 3")

    got = []
    with pytest.raises(ValueError, match="bad record 3"):
        for x in prefetched(gen()):
            got.append(x)
    assert got == [1, 2]


def test_the_producer_stays_at_most_depth_items_ahead():
    made = []
    depth = 2

    def gen():
        for i in range(100):
            made.append(i)
            yield i

    it = prefetched(gen(), depth)
    assert next(it) == 0
    deadline = time.time() + 5
    while len(made) < depth + 2 and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # had it no bound, it would have made all 100 by now
    # one handed out, `depth` in the queue, one made and waiting for room
    assert len(made) == depth + 2
    it.close()


def test_closing_early_stops_the_thread_and_closes_the_iterator():
    closed = threading.Event()
    before = set(threading.enumerate())

    def gen():
        try:
            for i in range(10 ** 6):
                yield i
        finally:
            closed.set()

    it = prefetched(gen())
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    it.close()
    assert closed.is_set()
    assert not [t for t in set(threading.enumerate()) - before if t.name == "tpu-embed-prefetch"]


def test_a_consumer_error_stops_the_thread():
    closed = threading.Event()

    def gen():
        try:
            while True:
                yield b"x" * 1000
        finally:
            closed.set()

    with pytest.raises(RuntimeError):
        for _ in prefetched(gen()):
            raise RuntimeError("consumer failed")
    assert closed.is_set()


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth 0"):
        list(prefetched(iter([1]), 0))


# ---------------------------------------------------------------- Behind

def test_writes_land_in_order_with_their_results(tmp_path):
    from pipelines.background import Behind
    from tpu_embed.artifact import io as tio
    w = Behind()
    paths = [str(tmp_path / f"f{i}") for i in range(7)]
    for i, p in enumerate(paths):
        w.run(tio.write_atomic, p, [b"a" * i, b"b"], durable=False)
    done = w.close()
    assert [d.path for d in done] == paths and [d.bytes for d in done] == [i + 1 for i in range(7)]
    assert [open(p, "rb").read() for p in paths] == [b"a" * i + b"b" for i in range(7)]


def test_at_most_depth_writes_wait(tmp_path, monkeypatch):
    from pipelines.background import Behind
    from tpu_embed.artifact import io as tio
    gate, calls, orig = threading.Event(), [], tio.write_atomic

    def gated(path, data, **kw):
        calls.append(path)
        assert gate.wait(10)
        return orig(path, data, **kw)

    monkeypatch.setattr(tio, "write_atomic", gated)
    w = Behind(depth=2)
    w.run(tio.write_atomic, str(tmp_path / "a"), b"1")
    w.run(tio.write_atomic, str(tmp_path / "b"), b"2")
    third = threading.Thread(target=w.run, args=(tio.write_atomic, str(tmp_path / "c"), b"3"))
    third.start()
    third.join(0.3)
    assert third.is_alive()  # two outstanding: the third write waits for room
    gate.set()
    third.join(10)
    assert [d.path for d in w.close()] == [str(tmp_path / x) for x in "abc"]


def test_a_write_error_is_raised_by_wait(tmp_path, monkeypatch):
    from pipelines.background import Behind
    from tpu_embed.artifact import io as tio

    def failing(path, data, **kw):
        raise OSError(28, f"No space left on device: {path}")

    monkeypatch.setattr(tio, "write_atomic", failing)
    w = Behind()
    w.run(tio.write_atomic, str(tmp_path / "x"), b"1")
    with pytest.raises(OSError, match="No space left on device: .*x"):
        w.close()


# ---------------------------------------------------------------- mapped

@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(), max_size=60), st.integers(1, 4), st.integers(0, 5))
def test_mapped_results_arrive_in_order(items, workers, depth):
    def slow_square(x):
        time.sleep(0.0005 * (x % 3))  # later items often finish first
        return x * x
    assert list(mapped(slow_square, iter(items), workers, depth)) == [x * x for x in items]


def test_mapped_runs_calls_side_by_side_on_its_threads():
    barrier = threading.Barrier(2, timeout=5)
    threads = []

    def meet(x):  # two calls must be under way at once, or the barrier times out
        threads.append(threading.current_thread())
        barrier.wait()
        return x
    assert list(mapped(meet, iter([1, 2, 3, 4]), 2)) == [1, 2, 3, 4]
    assert threading.current_thread() not in threads


def test_mapped_raises_a_calls_error_at_its_item_and_closes_the_items():
    closed = []

    def gen():
        try:
            yield from range(10)
        finally:
            closed.append(True)

    def fn(x):
        if x == 3:
            raise ValueError("bad batch 3")
        return x
    got = []
    with pytest.raises(ValueError, match="bad batch 3"):
        for x in mapped(fn, gen(), 2):
            got.append(x)
    assert got == [0, 1, 2] and closed == [True]


def test_mapped_holds_at_most_depth_results():
    started = []
    release = threading.Event()

    def fn(x):
        started.append(x)
        release.wait(5)
        return x
    it = mapped(fn, iter(range(100)), 2, depth=3)
    first = threading.Thread(target=lambda: next(it))
    first.start()
    time.sleep(0.2)
    assert len(started) <= 3  # no more calls than depth before the consumer takes one
    release.set()
    first.join()
    assert list(it) == list(range(1, 100))
    with pytest.raises(ValueError):
        list(mapped(fn, iter([]), 0))
