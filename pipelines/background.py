"""Reads ahead and writes behind in a background thread, so that a worker's I/O and parsing overlap its work.

* `prefetched`: an iterator (a split's read and parse) runs one thread ahead of its consumer.
* `mapped`: work on the items of an iterator (a split's decoding and parsing, chunk by chunk) spread over
  several threads, the results in order.
* `Behind`: calls that can wait (writes of the job's own transient files, a bundle's profile statistics,
  the build of the next steps' records) run in order in a thread while the worker goes on.

Their heavy parts (file reads and writes, pyarrow's CSV parser, the native scan) let go of the GIL, so on a
machine with two or more cores they run beside the worker's counting, mapping, packing and statistics.
Order is kept (one producer, FIFO queues), so outputs are the same bytes as without the threads; errors
are raised in the worker, at the item or the `wait` they belong to.
"""

from __future__ import annotations

import collections
import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Deque, Iterable, Iterator, List, TypeVar

T = TypeVar("T")
U = TypeVar("U")

DEFAULT_DEPTH = 2  # items made ahead: enough to hide a read's jitter, little memory (a chunk is ~10 MB)
_ITEM, _END, _ERROR = range(3)


def prefetched(items: Iterable[T], depth: int = DEFAULT_DEPTH) -> Iterator[T]:
    """Yield what `items` yields, made in a background thread up to `depth` items ahead.

    An exception of the iterator is raised here, at the place of the item it stopped at. Closing this
    generator early (or an exception in the consumer) stops the thread and closes the iterator (its files)
    before returning.
    """
    if depth < 1:
        raise ValueError(f"prefetch depth {depth} must be >= 1")
    q: "queue.Queue" = queue.Queue(depth)
    stop = threading.Event()

    def put(kind: int, value) -> bool:
        while not stop.is_set():
            try:
                q.put((kind, value), timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        it = iter(items)
        try:
            for x in it:
                if not put(_ITEM, x):
                    return
            put(_END, None)
        except BaseException as e:  # handed to the consumer, raised there
            put(_ERROR, e)
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="tpu-embed-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = q.get()
            if kind == _ITEM:
                yield value
            elif kind == _END:
                return
            else:
                raise value
    finally:
        stop.set()
        thread.join()


def mapped(fn: Callable[[T], U], items: Iterable[T], workers: int, depth: int = 0) -> Iterator[U]:
    """Yield fn(x) for each x of `items`, in order, computed by `workers` background threads.

    At most `depth` calls (default: workers + 1) are under way or done and not yet yielded, which bounds
    the memory their results hold. `items` is iterated in the calling thread (give it `prefetched` to make
    them in another). An exception of a call is raised here, at the place of its item. Closing this
    generator early (or an exception in the consumer) waits for the calls under way, drops the rest and
    closes `items`.
    """
    if workers < 1:
        raise ValueError(f"workers {workers} must be >= 1")
    depth = depth or workers + 1
    pool = ThreadPoolExecutor(workers, thread_name_prefix="tpu-embed-mapped")
    pending: Deque[Future] = collections.deque()
    it = iter(items)
    try:
        for x in it:
            if len(pending) >= depth:
                yield pending.popleft().result()
            pending.append(pool.submit(fn, x))
        while pending:
            yield pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()
        pool.shutdown(wait=True)
        close = getattr(it, "close", None)
        if close is not None:
            close()


class Behind:
    """Calls run by one background thread, in the order given, at most `depth` outstanding.

    `run` returns at once (it waits only while `depth` calls are outstanding, which bounds the memory their
    arguments hold); `wait` returns every call's result, in order, once all are done, and raises the first
    call's error. Calls that are not waited for (their worker failed) still finish or fail; for the job's
    transient files its clean-up removes what they leave, as after a crash.
    """

    def __init__(self, depth: int = DEFAULT_DEPTH):
        if depth < 1:
            raise ValueError(f"background depth {depth} must be >= 1")
        self.depth = depth
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tpu-embed-behind")
        self._pending: Deque[Future] = collections.deque()
        self._done: List = []

    def run(self, fn: Callable, *args, **kwargs) -> None:
        """Queue fn(*args, **kwargs); its arguments must not change afterwards."""
        while self._pending and (len(self._pending) >= self.depth or self._pending[0].done()):
            self._done.append(self._pending.popleft().result())
        self._pending.append(self._pool.submit(fn, *args, **kwargs))

    def results(self) -> List:
        """The results of the calls done so far that no earlier call is still running before, in order
        (each once: `wait` then returns the rest)."""
        while self._pending and self._pending[0].done():
            self._done.append(self._pending.popleft().result())
        done, self._done = self._done, []
        return done

    def wait(self) -> List:
        """Every queued call's result, in order (more calls can be queued afterwards)."""
        try:
            while self._pending:
                self._done.append(self._pending.popleft().result())
        finally:
            self._pending.clear()  # after an error the rest still run; their results are not wanted
        done, self._done = self._done, []
        return done

    def close(self) -> List:
        """`wait`, then stop the thread."""
        try:
            return self.wait()
        finally:
            self._pool.shutdown(wait=True)
