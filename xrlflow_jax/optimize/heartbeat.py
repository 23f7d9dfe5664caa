"""Progress lines while a phase of the optimise job runs without printing.

XLA compiling a search's functions, or a PPO run's first chunk, can take a minute or two on a
CPU with nothing printed. `Heartbeat` wraps the job's log: inside `phase(name)`, after every
`every_s` seconds with no line logged, it logs how long the phase has run and what XLA compiled
meanwhile (counted from JAX's compile events), so a long compile never looks like a hang:

    log = Heartbeat(print, every_s=20)
    with log.phase("searching with taso"):
      ...  # "  ... searching with taso: 40 s so far; XLA compiled 43 programs (55 s of
           #  compile, threads together)": compiles in background threads add up
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from typing import Any, Callable, Iterator

import jax

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class Heartbeat:
  """A log (call it with a line) that speaks up inside `phase` after `every_s` of silence.

  Args:
    log: where lines go.
    every_s: seconds without a line before a progress line (0 or infinite: never).
  """

  def __init__(self, log: Callable[[str], None], every_s: float):
    self._log = log
    self.every_s = float(every_s) if math.isfinite(every_s) else 0.0
    self._lock = threading.Lock()
    self._last = time.monotonic()
    self._compiles = 0
    self._compile_s = 0.0

  def __call__(self, line: str) -> None:
    with self._lock:
      self._last = time.monotonic()
    self._log(line)  # outside the lock: compile threads take it to count their compiles

  def _on_event(self, event: str, seconds: float, **_: Any) -> None:
    if event == _COMPILE_EVENT:
      with self._lock:
        self._compiles += 1
        self._compile_s += float(seconds)

  def line(self, name: str, elapsed: float, compiles: int, compile_s: float) -> str:
    """The progress line of phase `name` after `elapsed` seconds with `compiles` XLA
    compilations (`compile_s` seconds) finished in it."""
    text = f"  ... {name}: {elapsed:.0f} s so far"
    if compiles:
      text += (f"; XLA compiled {compiles} program{'s' if compiles > 1 else ''} "
               f"({compile_s:.0f} s of compile, threads together)")
    return text

  @contextlib.contextmanager
  def phase(self, name: str) -> Iterator[None]:
    """Progress lines for the block (a thread that wakes when `every_s` passed since the last
    line); nothing when `every_s` is 0."""
    if self.every_s <= 0:
      yield
      return
    start = time.monotonic()
    with self._lock:
      self._last = start
      base = (self._compiles, self._compile_s)
    done = threading.Event()

    def beat() -> None:
      while True:
        with self._lock:
          due = self._last + self.every_s
        if done.wait(max(0.0, due - time.monotonic())):
          return
        with self._lock:
          now = time.monotonic()
          if now < self._last + self.every_s:  # a line came meanwhile
            continue
          self._last = now
          text = self.line(name, now - start, self._compiles - base[0],
                           self._compile_s - base[1])
        self._log(text)

    jax.monitoring.register_event_duration_secs_listener(self._on_event)
    thread = threading.Thread(target=beat, name=f"heartbeat: {name}", daemon=True)
    thread.start()
    try:
      yield
    finally:
      done.set()
      thread.join()
      jax.monitoring.unregister_event_duration_listener(self._on_event)
