"""Measured latency: a graph lowered with the executor, compiled by XLA, timed end to end."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import jax
import numpy as np

from xrlflow_jax import executor
from xrlflow_jax.errors import XrlflowError
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore


class BackendError(XrlflowError):
  """A requested JAX backend (cpu, gpu, ...) is not present."""


@dataclasses.dataclass(frozen=True)
class LatencyStats:
  """Latency of one compiled graph, in milliseconds.

  Attributes:
    median_ms, q1_ms, q3_ms: median and quartiles of the timed runs.
    runs: number of timed runs.
    compile_s: lowering + XLA compile time (never part of the timed runs).
    backend: JAX platform ("cpu", "gpu", ...); device_kind: e.g. "cpu" or "NVIDIA H200".
  """
  median_ms: float
  q1_ms: float
  q3_ms: float
  runs: int
  compile_s: float
  backend: str
  device_kind: str

  @property
  def iqr_ms(self) -> float:
    return self.q3_ms - self.q1_ms


def resolve_device(backend: str | None) -> jax.Device:
  """The first device of `backend` (default backend when None); BackendError if absent."""
  try:
    return jax.devices(backend)[0] if backend else jax.devices()[0]
  except RuntimeError as e:
    raise BackendError(f"JAX backend {backend!r} is not available here ({e}); "
                       f"available: {sorted({d.platform for d in jax.devices()})}") from None


def time_callable(fn: Any, args: Sequence[Any], *, warmup: int = 3, repeats: int = 20,
                  min_time_s: float = 0.0) -> np.ndarray:
  """Wall times in ms of `fn(*args)` with `block_until_ready` on every run (compile excluded)."""
  for _ in range(max(warmup, 1)):
    jax.block_until_ready(fn(*args))
  times = []
  start_all = time.perf_counter()
  while len(times) < repeats or time.perf_counter() - start_all < min_time_s:
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append((time.perf_counter() - t0) * 1e3)
  out = np.asarray(times)
  if not (out > 0).all():
    raise XrlflowError("a timed run took no measurable time; the timer is broken")
  return out


def measure_latency(graph: layout.Graph, params: ParamStore, *, warmup: int = 3,
                    repeats: int = 20, backend: str | None = None, seed: int = 0,
                    min_time_s: float = 0.0) -> LatencyStats:
  """End-to-end latency of `graph` under XLA on one device.

  Lowers with the executor, compiles with `jit` ahead of time (compile excluded from timing),
  feeds fixed random inputs, and times `repeats` runs (at least `min_time_s` seconds) with
  `block_until_ready` after each.
  """
  device = resolve_device(backend)
  t0 = time.perf_counter()
  lowered = executor.lower(graph, params)
  inputs = [jax.device_put(x, device) for x in lowered.check_inputs(lowered.random_inputs(seed))]
  consts = jax.device_put(lowered.consts, device)
  compiled = jax.jit(lowered.apply).lower(consts, *inputs).compile()
  compile_s = time.perf_counter() - t0
  times = time_callable(compiled, (consts, *inputs), warmup=warmup, repeats=repeats,
                        min_time_s=min_time_s)
  q1, med, q3 = np.percentile(times, [25, 50, 75])
  return LatencyStats(float(med), float(q1), float(q3), int(times.size), compile_s,
                      device.platform, device.device_kind)
