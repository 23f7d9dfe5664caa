"""The per-op profiler: every distinct op signature of a graph compiled alone with XLA and timed.

A signature (`cost.signatures`) is what decides an op's run time: op, attribute vector, input
shapes and dtypes. Each one becomes a single-op graph (every operand a graph input, so nothing
is folded), lowered with the executor, compiled with `jit` (compile excluded from timing) and
fed fixed random inputs. The signatures measured together (up to `BATCH` at a time) and an empty
call are timed in `ROUNDS` interleaved rounds (`latency.time_interleaved`, a fresh order per
round), and a signature's time is the median of its per-round medians: a round that another
process disturbs is outvoted instead of biasing the one kernel that was timed then. Results are
cached on disk as JSON, one file per device kind and JAX version, keyed by signature, so a
second run of the same model measures nothing new; entries timed another way (an older `TIMING`)
are measured again. The cost model's MatMuls are timed in a hot loop instead
(`profile_kernels`). Groups of sibling MatMuls/Conv2Ds (reading one tensor) are also profiled
together, interleaved with their members alone, to measure what XLA:CPU's concurrent execution
of independent kernels buys (see `GroupSignature`).

    prof = Profiler()                            # cache: $XRLFLOW_PROFILE_CACHE or
    result = prof.profile_graph(graph)           #   ~/.cache/xrlflow_jax/profiles
    print(result.table())
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

import jax
import numpy as np

from xrlflow_jax import executor, ops
from xrlflow_jax.measure import latency
from xrlflow_jax.cost import coefficient_files
from xrlflow_jax.cost import model as cost_model
from xrlflow_jax.cost.signatures import (GroupSignature, OpSignature, ProfileError,
                                         graph_signatures, single_op_costs)
from xrlflow_jax.errors import XrlflowError
from xrlflow_jax.graph import layout

CACHE_ENV = "XRLFLOW_PROFILE_CACHE"
DEFAULT_CACHE_DIR = Path("~/.cache/xrlflow_jax/profiles")
CALL_KEY = "__call__"  # the cache entry of an empty call (the fixed cost of one dispatch)
# How signatures are timed; cached entries without this tag are measured again. Interleaved
# rounds, not each signature alone in one window (median of its runs): timed alone, a kernel
# measured while another job ran stays in the cache up to 2.6x too slow (1x512 @ 512x4096:
# 0.247 ms cached, 0.094 ms interleaved), enough to rank NasRNN's merges backwards. The median
# of the round medians, not the least: the least favours whichever convolution had one lucky
# round (SqueezeNet's layout search chose a graph measured x1.08 with it, x1.22 with the median).
TIMING = "interleaved-median-of-round-medians"
# Hot-loop kernels (below) take the least of their round medians instead: a loop of ~2 ms is a
# steady state that no round can run faster than, so only disturbance spreads its rounds.
# Under the median, 3 disturbed rounds of 5 stayed in the table: 1x512 @ 512x4096 cached at
# 0.110 ms (rounds 0.066-0.120 an iteration), 0.066-0.070 in two fresh measurements, which
# made merging NasRNN's eight gate MatMuls (8 x 0.011 ms) look slower when it measures 30%
# faster in the graph (2-core x86_64, 2026-12-06).
# (The tag also says the batch was load-checked, `LOADED`: entries without the check are timed
# again.)
LOOP_TIMING = "interleaved-least-round-median-per-iteration-load-checked"
ROUNDS = 5  # interleaved timing rounds of a batch
BATCH = 16  # signatures compiled and timed together (bounds the memory they hold at once)
# Threads that compile a batch's signatures timed a call at a time (XLA compiles without
# holding Python's lock; nothing is timed until all are compiled). A hot loop's compile times a
# probe, so those compile one at a time.
COMPILE_THREADS = 2
# MatMuls for the cost model's table (`profile_kernels`) are timed running back to back inside
# one executable, as they run in a graph, under this key prefix. Timed one call at a time, a
# small MatMul also pays the dispatch and waking XLA:CPU's worker threads, and that cost is
# bimodal: 1x512 @ 512x512 took 0.042 ms a call but 0.0124 ms an iteration of a loop
# (2-core x86_64, 2026-12-05), and NasRNN's 80 such MatMuls run in 1.07 ms as a graph.
# Convolutions are not: inside a loop XLA:CPU ran NCHW convolutions 2-10x slower than alone
# (1x256x56x56 by 256 1x1 filters: 59.8 ms an iteration, 7.1 ms a call), a code path no graph
# takes; they are timed a call at a time (`profile_many`).
LOOP_OPS = ("MatMul",)
LOOP_PREFIX = "loop|"
LOOP_MS = 2.0  # the loop's iteration count makes one call last about this long
MAX_ITERATIONS = 256
PROBE_ITERATIONS = 4  # a first guess of the iteration time, to choose the count
# Load. Another job on the machine slows a multi-threaded kernel evenly in every round, so the
# least round cannot see it: beside a second benchmark, every round of 1x512 @ 512x4096 ran
# 0.084-0.146 ms an iteration against 0.066-0.072 alone, while 1x512 @ 512x512 (one thread)
# did not move (2-core x86_64, 2026-12-06); the table's 0.083 hid NasRNN's gate merges from the
# search. So every hot-loop batch also times this canary; its entry keeps the least time it
# ever had (`best_ms`), and a batch whose canary runs over (1 + LOADED) x that is timed again,
# up to RETAKES more sets of rounds (each kernel keeping its least round of all). Entries still
# loaded after that record their `load` and are measured again when next needed.
LOADED = 0.15
RETAKES = 2
# Streamed timing (`profile_kernels(streamed=True)`): a hot loop reads the same weight every
# iteration, so it times a MatMul whose weight is cache-resident (and, for x @ w, packed once):
# right for an unrolled RNN that reads each weight at every step, wrong for a transformer that
# reads each of hundreds of MBs of weights once a call. Measured in plain JAX (2-core x86_64,
# XLA:CPU, 2026-12-06): 16x768 @ 768x2048 took 0.25 ms an iteration of the loop but 0.47 ms a
# call, and 0.63 ms each of 8 with distinct weights in one program (0.34 ms each with one shared
# weight); its transposed form [2048, 768] @ [768, 16] 0.35 ms in the loop, 0.39 a call and
# 0.45 with distinct weights, so the loop ranked the two forms backwards. Streamed, every kernel
# is timed a call at a time (less the empty call) instead; `kernel_table.KernelTimes.use_for`
# chooses it for a graph none of whose weights two MatMuls read.


def default_cache_dir() -> Path:
  """$XRLFLOW_PROFILE_CACHE if set, else ~/.cache/xrlflow_jax/profiles."""
  return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR).expanduser()


CANARY = OpSignature("MatMul", (0,) * ops.ATTR_WIDTH, ((1, 512), (512, 4096)),
                     ("float32", "float32"))  # see LOADED
CANARY_KEY = LOOP_PREFIX + "__canary__"  # its least time an iteration (not a signature entry)


# ----------------------------------------------------------------------------------------------
# The on-disk cache
# ----------------------------------------------------------------------------------------------

class ProfileCache:
  """Profiles of one device kind and JAX version: `<dir>/<device>-jax<version>.json`.

  The file maps signature keys to entries (median_ms: the signature's time, see `TIMING`;
  q1_ms, q3_ms: quartiles of all its runs; runs, compile_s, op, describe; for signatures timed
  in rounds also round_ms, call_ms (the empty call timed in the same rounds) and timing).
  `save` merges with what is on disk, so concurrent profilers lose nothing.
  """

  def __init__(self, cache_dir: str | os.PathLike[str] | None, device_kind: str,
               jax_version: str = jax.__version__):
    self.dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    self.device_kind = device_kind
    self.jax_version = jax_version
    self.path = self.dir / f"{coefficient_files.slug(device_kind)}-jax{jax_version}.json"
    self.entries: dict[str, dict[str, Any]] = self._read()

  def _read(self) -> dict[str, dict[str, Any]]:
    if not self.path.is_file():
      return {}
    try:
      data = json.loads(self.path.read_text())
    except (OSError, json.JSONDecodeError) as e:
      raise ProfileError(f"profile cache {self.path} is unreadable ({e}); delete it to start "
                         "afresh") from None
    if data.get("device_kind") != self.device_kind or data.get("jax") != self.jax_version:
      raise ProfileError(f"profile cache {self.path} is for {data.get('device_kind')!r} / jax "
                         f"{data.get('jax')}, not {self.device_kind!r} / jax {self.jax_version}")
    return dict(data.get("entries", {}))

  def get(self, key: str) -> dict[str, Any] | None:
    return self.entries.get(key)

  def put(self, key: str, entry: dict[str, Any]) -> None:
    self.entries[key] = entry

  def save(self) -> Path:
    """Writes the cache atomically (merged with entries another process wrote meanwhile)."""
    try:
      self.dir.mkdir(parents=True, exist_ok=True)
      merged = {**self._read(), **self.entries}
      self.entries = merged
      tmp = self.path.with_suffix(f".tmp{os.getpid()}")
      tmp.write_text(json.dumps({"device_kind": self.device_kind, "jax": self.jax_version,
                                 "entries": merged}, indent=1, sort_keys=True))
      os.replace(tmp, self.path)
    except OSError as e:
      raise ProfileError(f"cannot write the profile cache {self.path}: {e}") from None
    return self.path


# ----------------------------------------------------------------------------------------------
# The profiler
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ProfileRow:
  """One signature of a profiled graph: how often it occurs, its measured time, cache status."""
  signature: OpSignature
  count: int
  median_ms: float
  q1_ms: float
  q3_ms: float
  cached: bool


@dataclasses.dataclass(frozen=True)
class GraphProfile:
  """The profile of one graph: a row per distinct signature, and the cost of an empty call."""
  rows: list[ProfileRow]
  call_ms: float
  device_kind: str
  backend: str

  @property
  def measured(self) -> int:
    """Signatures that had to be measured (not found in the cache)."""
    return sum(not r.cached for r in self.rows)

  def sum_ms(self) -> float:
    """Sum over ops of count x (median - call overhead), plus one call: a naive estimate of the
    graph's latency that ignores fusion."""
    return self.call_ms + sum(r.count * max(r.median_ms - self.call_ms, 0.0) for r in self.rows)

  def table(self, coeffs: cost_model.CostCoefficients | None = None, limit: int | None = None
            ) -> str:
    """A text table, slowest total first; with `coeffs`, the model's cost of each op alone."""
    rows = sorted(self.rows, key=lambda r: -r.count * r.median_ms)
    model = {}
    if coeffs is not None:
      model = dict(zip((r.signature.key for r in rows),
                       single_op_costs([r.signature for r in rows], coeffs)))
    lines = [f"{'op':<14}{'class':<8}{'count':>6}{'median ms':>12}{'IQR ms':>10}"
             f"{'net x count':>13}" + (f"{'model ms':>10}" if model else "")
             + "  cached  signature"]
    for r in rows[:limit]:
      net = r.count * max(r.median_ms - self.call_ms, 0.0)
      cls = cost_model.op_class_name(ops.get(r.signature.op).code, r.signature.attrs)
      line = (f"{r.signature.op:<14}{cls:<8}{r.count:>6}{r.median_ms:>12.4f}"
              f"{r.q3_ms - r.q1_ms:>10.4f}{net:>13.4f}")
      if model:
        line += f"{model[r.signature.key]:>10.4f}"
      lines.append(line + f"  {'yes' if r.cached else 'no ':<6}  {r.signature.describe()}")
    lines.append(f"{len(self.rows)} signatures, {sum(r.count for r in self.rows)} ops, "
                 f"{self.measured} measured now; empty call {self.call_ms:.4f} ms; "
                 f"sum of op times {self.sum_ms():.3f} ms ({self.backend}, {self.device_kind})")
    return "\n".join(lines)


def _loopable(sig: OpSignature) -> bool:
  """Whether `profile_kernels` times `sig` in a hot loop (a MatMul with a float data operand)."""
  return (sig.op in LOOP_OPS and bool(sig.in_shapes)
          and bool(jax.numpy.issubdtype(jax.numpy.dtype(sig.in_dtypes[0]), jax.numpy.floating)))


class Profiler:
  """Measures op signatures on one device, through an on-disk cache.

  Args:
    cache_dir: cache folder (default $XRLFLOW_PROFILE_CACHE or ~/.cache/xrlflow_jax/profiles).
    backend: JAX platform ("cpu", "gpu"); BackendError if absent. Default: JAX's default.
    warmup, repeats, min_time_s: timing of each signature (see `time_callable`).
    seed: seed of the random inputs.
  Attributes:
    measure_count: signatures measured (not served from the cache) by this profiler.
  """

  def __init__(self, cache_dir: str | os.PathLike[str] | None = None, backend: str | None = None,
               *, warmup: int = 3, repeats: int = 30, min_time_s: float = 0.05, seed: int = 0):
    self.device = latency.resolve_device(backend)
    self.cache = ProfileCache(cache_dir, self.device.device_kind)
    self.warmup, self.repeats, self.min_time_s, self.seed = warmup, repeats, min_time_s, seed
    self.measure_count = 0
    self._canary_loop: tuple[latency.CompiledGraph, int] | None = None

  def _time(self, fn: Any, args: Sequence[Any]) -> np.ndarray:
    self.measure_count += 1
    return latency.time_callable(fn, args, warmup=self.warmup, repeats=self.repeats,
                                 min_time_s=self.min_time_s)

  def _entry(self, times: np.ndarray, compile_s: float, **extra: Any) -> dict[str, Any]:
    q1, med, q3 = np.percentile(times, [25, 50, 75])
    return {"median_ms": float(med), "q1_ms": float(q1), "q3_ms": float(q3),
            "runs": int(times.size), "compile_s": round(compile_s, 4),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"), **extra}

  def call_overhead(self, save: bool = True) -> float:
    """ms of one call of a compiled executable that does no work (cached like a signature)."""
    entry = self.cache.get(CALL_KEY)
    if entry is None:
      empty = self._empty_call()
      entry = self._entry(self._time(empty.fn, empty.args), empty.compile_s, op="call",
                          describe="an empty call (identity on float32[1])")
      self.cache.put(CALL_KEY, entry)
      if save:
        self.cache.save()
    return float(entry["median_ms"])

  def current(self, sig: OpSignature | GroupSignature) -> dict[str, Any] | None:
    """The cached entry of `sig` when it was timed as this profiler times it, else None."""
    entry = self.cache.get(sig.key)
    if entry is None or (isinstance(sig, OpSignature) and entry.get("timing") != TIMING):
      return None
    return entry

  def measure(self, sig: OpSignature | GroupSignature) -> dict[str, Any]:
    """Compiles `sig` alone and times it (no cache lookup). ProfileError if it cannot run."""
    entries, errors = self.measure_many([sig])
    if sig.key in errors:
      raise errors[sig.key]
    return entries[sig.key]

  def measure_many(self, sigs: Sequence[OpSignature | GroupSignature]
                   ) -> tuple[dict[str, dict[str, Any]], dict[str, XrlflowError]]:
    """Measures `sigs` (no cache lookup): op signatures `BATCH` at a time in interleaved
    rounds with an empty call, sibling groups each with its members.

    Returns:
      ({key: entry}, {key: error}): every signature in exactly one of them (an error: it cannot
      be built, compiled or run alone, e.g. too big for the device's memory).
    """
    entries: dict[str, dict[str, Any]] = {}
    errors: dict[str, XrlflowError] = {}
    singles = [s for s in dict.fromkeys(sigs) if isinstance(s, OpSignature)]
    for sig in dict.fromkeys(sigs):
      if isinstance(sig, GroupSignature):
        try:
          entries[sig.key] = self._measure_group(sig, self._compile(sig))
        except XrlflowError as e:
          errors[sig.key] = e
    for i in range(0, len(singles), BATCH):
      e, err = self._measure_batch(singles[i:i + BATCH])
      entries.update(e)
      errors.update(err)
    return entries, errors

  def current_kernel(self, sig: OpSignature, streamed: bool = False) -> dict[str, Any] | None:
    """The cached entry `profile_kernels` would return for `sig` (its hot-loop entry for a
    MatMul unless `streamed`, else its call-at-a-time one), or None when it must be measured."""
    if streamed or not _loopable(sig):
      return self.current(sig)
    entry = self.cache.get(LOOP_PREFIX + sig.key)
    if entry is None or entry.get("timing") != LOOP_TIMING:
      return None
    return None if entry.get("load", 1.0) > 1 + LOADED else entry

  def profile_kernels(self, sigs: Iterable[OpSignature], *, save: bool = True,
                      streamed: bool = False
                      ) -> tuple[dict[str, dict[str, Any]], dict[str, XrlflowError]]:
    """Per-iteration times of kernels run back to back in one executable (a loop whose every
    iteration reads the last one's output, so XLA can neither hoist nor drop the op), timed
    like `profile_many` (`BATCH` at a time, interleaved rounds with an empty call, the median
    of the round medians) and cached under `LOOP_PREFIX`. MatMuls (`LOOP_OPS`) with a float data
    operand only; others (convolutions), and every kernel when `streamed`, are timed one call
    at a time (`profile_many`; see the note on streamed timing below `RETAKES`).

    Returns:
      ({sig.key: entry}, {sig.key: error}); entry["median_ms"] is the time of one iteration
      (the empty call already taken off, so entry["call_ms"] is 0).
    """
    sigs = list(dict.fromkeys(sigs))
    loopable = [] if streamed else [s for s in sigs if _loopable(s)]
    entries, errors = self._profile([s for s in sigs if s not in loopable], loop=False,
                                    save=save)
    looped, loop_errors = self._profile(loopable, loop=True, save=save)
    return {**entries, **looped}, {**errors, **loop_errors}

  def measure_kernels(self, sigs: Sequence[OpSignature]
                      ) -> tuple[dict[str, dict[str, Any]], dict[str, XrlflowError]]:
    """Measures kernels in their hot loops (no cache lookup): ({key: entry}, {key: error})."""
    return self._measure_batch(sigs, loop=True)

  def _compile_loop(self, sig: OpSignature) -> tuple[latency.CompiledGraph, int]:
    """`sig` run `iterations` times in a loop (its last argument), and that count, chosen so
    a call lasts about `LOOP_MS`."""
    try:
      graph, params = sig.single_op_graph()
    except XrlflowError as e:
      raise ProfileError(f"cannot build {sig.describe()} alone: {e}") from None
    lowered = executor.lower(graph, params, jit=False)

    def loop(consts, first, *rest_and_count):
      *rest, count = rest_and_count
      corner = (0,) * first.ndim

      def body(_, x):
        y = jax.lax.optimization_barrier(lowered.apply(consts, x, *rest)[0])  # all of it runs
        return x.at[corner].add((y.reshape(-1)[0] * 0).astype(x.dtype))  # in place
      return jax.lax.fori_loop(0, count, body, first)

    try:
      inputs = [jax.device_put(x, self.device)
                for x in lowered.check_inputs(lowered.random_inputs(self.seed))]
      consts = jax.device_put(lowered.consts, self.device)
      t0 = time.perf_counter()
      count = jax.device_put(np.int32(PROBE_ITERATIONS), self.device)
      fn = jax.jit(loop).lower(consts, *inputs, count).compile()
      compile_s = time.perf_counter() - t0
      probe = float(np.median(latency.time_callable(fn, (consts, *inputs, count), warmup=1,
                                                    repeats=3))) / PROBE_ITERATIONS
    except XrlflowError:
      raise
    except Exception as e:  # pylint: disable=broad-except  (XLA's errors: OOM, unsupported)
      raise ProfileError(f"cannot run {sig.describe()} in a loop: {type(e).__name__}: "
                         f"{str(e)[:200]}") from None
    iterations = int(np.clip(np.ceil(LOOP_MS / max(probe, 1e-4)), 2, MAX_ITERATIONS))
    args = (consts, *inputs, jax.device_put(np.int32(iterations), self.device))
    nbytes = int(sum(a.nbytes for a in jax.tree.leaves(args)))
    return latency.CompiledGraph(fn, args, compile_s, self.device, nbytes), iterations

  def _compile(self, sig: OpSignature | GroupSignature) -> latency.CompiledGraph:
    try:
      graph, params = sig.single_op_graph()
    except XrlflowError as e:
      raise ProfileError(f"cannot build {sig.describe()} alone: {e}") from None
    return latency.compile_graph(graph, params, device=self.device, seed=self.seed)

  def _compile_all(self, sigs: Sequence[OpSignature]
                   ) -> list[tuple[latency.CompiledGraph | None, XrlflowError | None]]:
    """Each signature compiled alone (`_compile`), `COMPILE_THREADS` at a time, in order:
    (compiled, None) or (None, its error)."""
    def one(sig: OpSignature):
      try:
        return self._compile(sig), None
      except XrlflowError as e:
        return None, e
    if len(sigs) < 2 or COMPILE_THREADS < 2:
      return [one(s) for s in sigs]
    with concurrent.futures.ThreadPoolExecutor(COMPILE_THREADS,
                                               thread_name_prefix="xrlflow-kernels") as pool:
      futures = [pool.submit(contextvars.copy_context().run, one, s) for s in sigs]
      return [f.result() for f in futures]

  def _empty_call(self) -> latency.CompiledGraph:
    x = jax.device_put(np.zeros([1], np.float32), self.device)
    t0 = time.perf_counter()
    fn = jax.jit(lambda a: a).lower(x).compile()
    return latency.CompiledGraph(fn, (x,), time.perf_counter() - t0, self.device, 4)

  def _measure_batch(self, sigs: Sequence[OpSignature], loop: bool = False
                     ) -> tuple[dict[str, dict[str, Any]], dict[str, XrlflowError]]:
    """Op signatures timed together with an empty call in `ROUNDS` interleaved rounds (each
    at least `repeats / ROUNDS` runs and `min_time_s / ROUNDS` seconds per round); `loop`:
    each in its hot loop (`_compile_loop`), per iteration."""
    compiled: dict[str, latency.CompiledGraph] = {}
    iterations: dict[str, int] = {}
    errors: dict[str, XrlflowError] = {}
    if loop:
      for sig in sigs:
        try:
          compiled[sig.key], iterations[sig.key] = self._compile_loop(sig)
        except XrlflowError as e:
          errors[sig.key] = e
    else:
      for sig, (c, e) in zip(sigs, self._compile_all(sigs)):
        if e is not None:
          errors[sig.key] = e
        else:
          compiled[sig.key] = c
    if not compiled:
      return {}, errors
    runnable = [self._empty_call(), *compiled.values()]
    if loop:
      canary, canary_iterations = self._canary()
      runnable.insert(1, canary)
    times: list[list[np.ndarray]] = []
    try:
      for take in range(1 + (RETAKES if loop else 0)):
        more = latency.time_interleaved(
            runnable, rounds=ROUNDS, repeats_per_round=max(self.repeats // ROUNDS, 1),
            warmup=self.warmup, seed=self.seed + take,
            min_round_time_s=self.min_time_s / ROUNDS)
        times = more if take == 0 else [t + m for t, m in zip(times, more)]
        if loop:
          call_ms = min(float(np.median(t)) for t in times[0])
          load = self._record_canary(times[1], call_ms, canary_iterations)
          if load <= 1 + LOADED:
            break
      if loop:
        del times[1]
    except XrlflowError as e:
      if len(compiled) == 1:
        return {}, {**errors, next(iter(compiled)): e}
      # One of them fails when run (e.g. out of memory): time each alone to say which.
      entries: dict[str, dict[str, Any]] = {}
      for sig in sigs:
        if sig.key in compiled:
          one, err = self._measure_batch([sig], loop)
          entries.update(one)
          errors.update(err)
      return entries, errors
    self.measure_count += len(compiled)
    call_rounds = [float(np.median(t)) for t in times[0]]
    call_ms = float(min(call_rounds) if loop else np.median(call_rounds))
    entries = {}
    by_key = {s.key: s for s in sigs}
    for (key, c), rounds in zip(compiled.items(), times[1:]):
      sig = by_key[key]
      medians = [float(np.median(t)) for t in rounds]
      entry = self._entry(np.concatenate(rounds), c.compile_s, op=sig.op,
                          describe=sig.describe())
      if loop:  # the least round median (see LOOP_TIMING), per iteration
        k = iterations[key]
        entry.update(median_ms=max(min(medians) - call_ms, 0.0) / k,
                     q1_ms=max(entry["q1_ms"] - call_ms, 0.0) / k,
                     q3_ms=max(entry["q3_ms"] - call_ms, 0.0) / k, iterations=k, call_ms=0.0,
                     loop_call_ms=call_ms, timing=LOOP_TIMING, load=round(load, 4))
      else:
        entry.update(median_ms=float(np.median(medians)), call_ms=call_ms, timing=TIMING)
      entry.update(round_ms=[round(m, 5) for m in medians])
      entries[key] = entry
    return entries, errors

  def _canary(self) -> tuple[latency.CompiledGraph, int]:
    """The `CANARY` kernel's hot loop (compiled once per profiler) and its iteration count."""
    if self._canary_loop is None:
      self._canary_loop = self._compile_loop(CANARY)
    return self._canary_loop

  def _record_canary(self, rounds: Sequence[np.ndarray], call_ms: float,
                     iterations: int) -> float:
    """The load of a batch: the canary's least round (ms an iteration, `rounds` of its runs)
    over the least it ever had on this machine (1.0 the first time); keeps that least in the
    canary's cache entry (`best_ms`)."""
    ms = max(min(float(np.median(t)) for t in rounds) - call_ms, 0.0) / iterations
    best = min(float((self.cache.get(CANARY_KEY) or {}).get("best_ms", ms)), ms)
    self.cache.put(CANARY_KEY, {"best_ms": best, "describe": CANARY.describe()})
    return ms / best if best > 0 else 1.0

  def _measure_group(self, sig: GroupSignature,
                     compiled: latency.CompiledGraph) -> dict[str, Any]:
    """A sibling group timed interleaved with each member alone: the ratio of the group to the
    members one at a time is what concurrency buys, measured under the same machine load."""
    members = [latency.compile_graph(*m.single_op_graph(), device=self.device, seed=self.seed)
               for m in sig.members]
    self.measure_count += 1
    guess = float(np.median(latency.time_callable(compiled.fn, compiled.args, repeats=3)))
    per_round = max(self.repeats // 5, int(np.ceil(20.0 / max(guess, 1e-3))), 1)
    stats = latency.measure_interleaved([compiled, *members], rounds=5,
                                        repeats_per_round=per_round, warmup=self.warmup)
    group = stats[0]
    return {"median_ms": group.median_ms, "q1_ms": group.q1_ms, "q3_ms": group.q3_ms,
            "runs": group.runs, "compile_s": round(compiled.compile_s, 4),
            "members_ms": [st.median_ms for st in stats[1:]],
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "op": sig.op,
            "describe": sig.describe()}

  def profile_signatures(self, sigs: Iterable[OpSignature | GroupSignature], *,
                         save: bool = True, progress: bool = False
                         ) -> dict[str, dict[str, Any]]:
    """Cache entries of `sigs`, measuring (and caching) those not cached as `TIMING` says.
    ProfileError (or the measurement's error) for the first signature that cannot be timed."""
    entries, errors = self.profile_many(sigs, save=save, progress=progress)
    if errors:
      raise next(iter(errors.values()))
    return entries

  def profile_many(self, sigs: Iterable[OpSignature | GroupSignature], *, save: bool = True,
                   progress: bool = False
                   ) -> tuple[dict[str, dict[str, Any]], dict[str, XrlflowError]]:
    """`profile_signatures` that reports the signatures it cannot time instead of raising:
    ({key: entry}, {key: error})."""
    return self._profile(list(dict.fromkeys(sigs)), loop=False, save=save, progress=progress)

  def _profile(self, sigs: Sequence[OpSignature | GroupSignature], *, loop: bool, save: bool,
               progress: bool = False
               ) -> tuple[dict[str, dict[str, Any]], dict[str, XrlflowError]]:
    """Cache entries of `sigs` (distinct), measuring `BATCH` at a time those not current: in
    hot loops under `LOOP_PREFIX` (`loop`, `measure_kernels`) or a call at a time
    (`measure_many`). ({sig.key: entry}, {sig.key: error})."""
    prefix, current, measure = ((LOOP_PREFIX, self.current_kernel, self.measure_kernels) if loop
                                else ("", self.current, self.measure_many))
    todo = [s for s in sigs if current(s) is None]
    errors: dict[str, XrlflowError] = {}
    for i in range(0, len(todo), BATCH):
      chunk = todo[i:i + BATCH]
      if progress:
        print(f"  [{i + 1}-{i + len(chunk)}/{len(todo)}] {chunk[0].describe()} ...", flush=True)
      measured, err = measure(chunk)
      for key, entry in measured.items():
        self.cache.put(prefix + key, entry)
      errors.update(err)
      if save and (i // BATCH + 1) % 2 == 0:
        self.cache.save()
    if todo and save:
      self.cache.save()
    return ({s.key: self.cache.get(prefix + s.key) for s in sigs if s.key not in errors},
            errors)

  def profile_graph(self, graph: layout.Graph, *, save: bool = True,
                    progress: bool = False) -> GraphProfile:
    """Profiles every distinct signature of `graph` (validated first)."""
    sigs = graph_signatures(graph)
    cached = {s.key for s, _ in sigs if self.current(s) is not None}
    entries = self.profile_signatures([s for s, _ in sigs], save=save, progress=progress)
    call = self.call_overhead(save=save)
    rows = [ProfileRow(s, c, entries[s.key]["median_ms"], entries[s.key]["q1_ms"],
                       entries[s.key]["q3_ms"], s.key in cached) for s, c in sigs]
    return GraphProfile(rows, call, self.device.device_kind, self.device.platform)
