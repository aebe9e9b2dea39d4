"""The cyclic garbage collector paused around a burst of objects that hold no cycles.

CPython's collector runs when allocations outnumber deallocations: every 700 new container
objects a young collection, and a full one, which walks every tracked object of the process,
once the objects that survived young collections reach a quarter of the old ones. Parsing a
large JSON document makes hundreds of thousands of dicts and lists that stay alive until the
parse ends, so it sets off collections that find nothing to free (JSON has no cycles) but
walk the heap each time and promote the new objects, which brings on full collections.

Measured at an operator's restart at 1,000 services of 10 pods (10,000 pods of 10 KB, 20 pages
of LIST): py-spy found ~9 s of the start in `json.loads`, nearly all in the pods' informer; 20
such pages parse in 1.0 s with the collector paused and 3.2 s with it on, in a small process.
`core.informer` pauses it while it reads a LIST: the watches' first LISTs took 4.8 s of the
restart instead of 11.1 s (`bench/results/issue28-control-plane-1000x10-gc-paused.txt`). The
gateway pauses it while it renders /metrics (`gateway.app`).

Garbage in cycles made meanwhile (by any thread: the pause is process-wide) waits for the
next collection after the pause.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator


class _Paused:
    """`gc.disable()` while at least one caller is inside (threads nest: a count under a lock);
    the collector as it was when the first came in once the last has left."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self._was_enabled = False

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._inside == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._inside += 1
        try:
            yield
        finally:
            with self._lock:
                self._inside -= 1
                if self._inside == 0 and self._was_enabled:
                    gc.enable()


collector_paused = _Paused()
"""The process's one pause (a second, separate one would turn the collector on under the
first's feet)."""
