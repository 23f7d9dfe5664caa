"""Measured latency: a graph lowered with the executor, compiled by XLA, timed end to end."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from xrlflow_jax import executor
from xrlflow_jax.errors import XrlflowError
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore


class BackendError(XrlflowError):
  """A requested JAX backend (cpu, gpu, ...) is not present."""


class DeviceMemoryError(XrlflowError):
  """A graph (its weights, inputs or temporaries) does not fit in the device's memory."""


def _is_out_of_memory(e: Exception) -> bool:
  text = str(e)
  return any(s in text for s in ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory",
                                 "Failed to allocate", "failed to allocate"))


def _memory_error(e: Exception, what: str, device: jax.Device, nbytes: int) -> DeviceMemoryError:
  first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
  return DeviceMemoryError(f"{what} does not fit in the memory of {device.device_kind} "
                           f"({device.platform}): weights {nbytes / 1e6:.1f} MB; XLA said: "
                           f"{first[:300]}")


@dataclasses.dataclass(frozen=True)
class LatencyStats:
  """Latency of one compiled graph, in milliseconds.

  Attributes:
    median_ms, q1_ms, q3_ms: median and quartiles of the timed runs.
    runs: number of timed runs.
    compile_s: lowering + XLA compile time (never part of the timed runs).
    backend: JAX platform ("cpu", "gpu", ...), or "onnxruntime"; device_kind: e.g. "cpu",
      "NVIDIA H200", or onnxruntime's execution provider.
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
  return _timed_runs(fn, args, repeats, min_time_s)


def _timed_runs(fn: Any, args: Sequence[Any], repeats: int, min_time_s: float) -> np.ndarray:
  """Wall times in ms of `repeats` runs (at least `min_time_s` seconds) of a warm function."""
  if repeats < 1 and min_time_s <= 0:
    raise XrlflowError(f"need repeats >= 1 or min_time_s > 0 (got {repeats}, {min_time_s})")
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


@dataclasses.dataclass(frozen=True)
class CompiledGraph:
  """A graph compiled for one device with its operands in place: `fn(*args)` runs it.

  Attributes:
    fn: the XLA executable; args: folded constants then fixed random inputs, on the device.
    compile_s: lowering + compile time; device: where it runs; nbytes: bytes of `args`.
    backend, device_kind: what `LatencyStats` reports ("": the device's platform and kind;
      another runtime's, e.g. "onnxruntime" and its execution provider: `measure.ort`).
  """
  fn: Any
  args: tuple[Any, ...]
  compile_s: float
  device: jax.Device
  nbytes: int
  backend: str = ""
  device_kind: str = ""


def compile_graph(graph: layout.Graph, params: ParamStore, *, backend: str | None = None,
                  device: jax.Device | None = None, seed: int = 0,
                  what: str = "the graph", precision: str | None = None,
                  compiler_options: Mapping[str, Any] | None = None) -> CompiledGraph:
  """Lowers (validating the graph), places operands on the device and compiles ahead of time.
  `precision`: the numerics policy of matmuls and convolutions (`ops.precision`);
  `compiler_options`: XLA options of this compile (e.g. `xla_options.for_cpu`'s).

  Raises:
    GraphValidationError (and its subclasses): the graph is invalid.
    BackendError: `backend` is not present. DeviceMemoryError: it does not fit on the device.
  """
  device = device or resolve_device(backend)
  t0 = time.perf_counter()
  lowered = executor.lower(graph, params, precision=precision)
  nbytes = int(sum(np.asarray(c).nbytes for c in lowered.consts))
  try:
    inputs = [jax.device_put(x, device)
              for x in lowered.check_inputs(lowered.random_inputs(seed))]
    consts = jax.device_put(lowered.consts, device)
    compiled = jax.jit(lowered.apply).lower(consts, *inputs).compile(
        compiler_options=dict(compiler_options) if compiler_options else None)
  except Exception as e:  # pylint: disable=broad-except
    if _is_out_of_memory(e):
      raise _memory_error(e, what, device, nbytes) from None
    raise
  return CompiledGraph(compiled, (consts, *inputs), time.perf_counter() - t0, device, nbytes)


def _stats(times: np.ndarray, compiled: CompiledGraph) -> LatencyStats:
  q1, med, q3 = np.percentile(times, [25, 50, 75])
  return LatencyStats(float(med), float(q1), float(q3), int(times.size), compiled.compile_s,
                      compiled.backend or compiled.device.platform,
                      compiled.device_kind or compiled.device.device_kind)


def _time_compiled(compiled: CompiledGraph, what: str, *, warmup: int, repeats: int,
                   min_time_s: float = 0.0) -> np.ndarray:
  try:
    if warmup:
      return time_callable(compiled.fn, compiled.args, warmup=warmup, repeats=repeats,
                           min_time_s=min_time_s)
    return _timed_runs(compiled.fn, compiled.args, repeats, min_time_s)
  except Exception as e:  # pylint: disable=broad-except
    if _is_out_of_memory(e):
      raise _memory_error(e, what, compiled.device, compiled.nbytes) from None
    raise


def measure_latency(graph: layout.Graph, params: ParamStore, *, warmup: int = 3,
                    repeats: int = 20, backend: str | None = None, seed: int = 0,
                    min_time_s: float = 0.0) -> LatencyStats:
  """End-to-end latency of `graph` under XLA on one device.

  Lowers with the executor, compiles with `jit` ahead of time (compile excluded from timing),
  feeds fixed random inputs, and times `repeats` runs (at least `min_time_s` seconds) with
  `block_until_ready` after each.
  """
  compiled = compile_graph(graph, params, backend=backend, seed=seed)
  times = _time_compiled(compiled, "the graph", warmup=warmup, repeats=repeats,
                         min_time_s=min_time_s)
  return _stats(times, compiled)


def time_interleaved(compiled: Sequence[CompiledGraph], *, rounds: int = 10,
                     repeats_per_round: int = 3, warmup: int = 2, seed: int = 0,
                     min_round_time_s: float = 0.0) -> list[list[np.ndarray]]:
  """Wall times in ms of several compiled graphs timed side by side, kept per round.

  Each round times every graph `repeats_per_round` times (at least `min_round_time_s`), in a
  fresh random order, so drift in the machine's load (other processes, frequency changes)
  spreads over all graphs instead of biasing whichever was measured last.

  Returns:
    times[g][r]: float64[runs] of graph g in round r (the paired unit of `measure.speedup`).
  """
  if rounds < 1 or repeats_per_round < 1 or warmup < 0:
    raise XrlflowError(f"need rounds >= 1, repeats_per_round >= 1 and warmup >= 0 (got "
                       f"{rounds}, {repeats_per_round}, {warmup})")
  if not compiled:
    return []
  rng = np.random.default_rng(seed)
  for c in compiled:
    _time_compiled(c, "a graph", warmup=warmup, repeats=1)
  times: list[list[np.ndarray]] = [[] for _ in compiled]
  for _ in range(rounds):
    for i in rng.permutation(len(compiled)):
      times[i].append(_time_compiled(compiled[i], f"graph {i}", warmup=0,
                                     repeats=repeats_per_round, min_time_s=min_round_time_s))
  return times


def stats_of(rounds: Sequence[np.ndarray], compiled: CompiledGraph) -> LatencyStats:
  """LatencyStats of `compiled` over all runs of its rounds (`time_interleaved`'s times[g])."""
  return _stats(np.concatenate([np.ravel(t) for t in rounds]), compiled)


def measure_interleaved(compiled: Sequence[CompiledGraph], *, rounds: int = 10,
                        repeats_per_round: int = 3, warmup: int = 2, seed: int = 0,
                        min_round_time_s: float = 0.0) -> list[LatencyStats]:
  """Latencies of several compiled graphs measured side by side (`time_interleaved`);
  statistics pool all rounds (runs = rounds x repeats)."""
  times = time_interleaved(compiled, rounds=rounds, repeats_per_round=repeats_per_round,
                           warmup=warmup, seed=seed, min_round_time_s=min_round_time_s)
  return [stats_of(t, c) for t, c in zip(times, compiled)]
