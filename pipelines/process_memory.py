"""glibc's malloc, tuned while a job runs in this process (the in-process DirectRunner), then set back.

A job allocates and frees large arrays all the time: the reader's batches, the parsed chunks, each step's ids,
CSR buffers and records. With glibc's defaults an array of 128 KiB or more (up to the dynamic threshold) is
mapped afresh and unmapped when freed, and the heap's free top is given back to the system past 128 KiB, so
the next array's every page is a page fault, zeroed by the kernel: at 1 M examples of
`benchmarks/run_throughput.py`'s quoted workload ~250 k faults and ~1.5 s of system time in a 4 s run.

* `one_malloc_arena`: the reader's threads allocate from the process's main arena (a job that reads its input).
* `freed_memory_reused`: arrays up to `MMAP_THRESHOLD` come from the heap, whose free top is kept up to
  `TRIM_THRESHOLD` and grown `TOP_PAD` at a time, so freed memory is handed out again instead of faulted in anew
  (~40 k fewer faults and 0.3–0.4 s less system time on that run; docs/explanation/jobs.md). When the job ends, glibc's
  documented defaults are set back and `malloc_trim(0)` gives the free memory back to the system. glibc turns its
  dynamic mmap threshold off once any of these is set: afterwards arrays of 128 KiB or more are mapped, its
  static default.

Elsewhere than glibc (musl, macOS) nothing changes. Workers in other processes (`multi_processing`, Dataflow)
keep their allocator's settings.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any, Iterator, Optional

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8
# glibc's defaults for the three (mallopt(3)); M_ARENA_MAX's is 0 (as many as glibc decides).
GLIBC_DEFAULTS = {M_TRIM_THRESHOLD: 128 << 10, M_TOP_PAD: 128 << 10, M_MMAP_THRESHOLD: 128 << 10}

MMAP_THRESHOLD = 32 << 20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit): larger arrays are still mapped
TRIM_THRESHOLD = 1 << 30
TOP_PAD = 64 << 20


def _libc() -> Optional[Any]:
    """glibc's handle with `mallopt` and `malloc_trim` typed, or None where the C library is not glibc."""
    try:
        libc = ctypes.CDLL(None)
        mallopt, trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return libc


@contextlib.contextmanager
def one_malloc_arena() -> Iterator[None]:
    """While a job that reads its input runs in this process, threads it starts allocate from the process's
    main malloc arena.

    glibc gives each new thread an arena of its own (up to 8 per CPU). The reader's threads (one pool per
    split, `pipelines.background.mapped`) allocate batches that the worker's thread frees, and what a
    thread's arena gives back is mapped afresh by the next: at 2 M benchmark examples 0.7 M page faults
    instead of 0.47 M and ~1 s more CPU in the vocabulary job (2.6 -> 3.1 s of its wall time on 2 cores). A
    shard job that replays the read gains nothing from it and is left as it is."""
    libc = _libc()
    if libc is not None and not libc.mallopt(M_ARENA_MAX, 1):
        libc = None
    try:
        yield
    finally:
        if libc is not None:
            libc.mallopt(M_ARENA_MAX, 0)  # glibc's default again for later threads


@contextlib.contextmanager
def freed_memory_reused() -> Iterator[None]:
    """While a job runs in this process, freed arrays stay in malloc's heap for the next ones (the module's
    docstring); then glibc's defaults again and the free memory given back."""
    libc = _libc()
    applied = []
    try:
        if libc is not None:
            for param, value in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                                 (M_TOP_PAD, TOP_PAD)):
                if libc.mallopt(param, value):
                    applied.append(param)
        yield
    finally:
        if libc is not None and applied:
            for param in applied:
                libc.mallopt(param, GLIBC_DEFAULTS[param])
            libc.malloc_trim(0)
