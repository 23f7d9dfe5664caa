"""Evidence that a rewritten graph computes the same thing and is faster: the one home of the
numerics comparison, side-by-side timing with a control copy, and the speedup verdict.

    check = measure.check_numerics(original, optimised, params)      # NaN-aware
    cmp = measure.compare(original, [optimised], params)             # interleaved, with control
    cmp.speedups[0].verdict                                          # "faster" | "no change" | ...

The statistic. Every graph is compiled once (the reference, an identical copy of it compiled
separately as the control, each candidate) and timed in `rounds` interleaved rounds
(`cost.latency.time_interleaved`: a fresh random order per round). The paired unit is the
round: s_r = median(reference runs in round r) / median(candidate runs in round r). The speedup
is the geometric mean of s_r over the rounds, with a 95% expanded percentile-bootstrap
interval (`RESAMPLES` resamples of the rounds, seeded; `expanded_tail` widens the plain
percentile interval, too narrow over few rounds). The control gets the same statistic
(reference / copy), which shows how much two executables of one graph differ in this run.
The verdict is an intersection-union test: the candidate must beat both executables of the
reference, each paired by round and each interval at `level`:
  "faster"    the interval of reference / candidate lies above 1, and so does the interval of
              copy / candidate (per round log(ref/cand) - log(ref/copy), same resamples);
  "slower"    both intervals lie below 1;
  "no change" otherwise (the difference is inside what an identical copy shows);
  "unchanged" the candidate has the reference's structural hash: it is not timed against itself.
Under "no real difference" either interval lies above 1 with probability at most
(1 - level) / 2, so the pair does too: no correction is needed for testing two. The test has
far more power than requiring the candidate's interval to lie above the control's (two
intervals stacked): simulated with a 3% gain, 172 "faster" calls of 200 against 85 (see the
README's evidence bullet).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import scipy.stats

from xrlflow_jax import executor
from xrlflow_jax.cost import latency
from xrlflow_jax.errors import XrlflowError
from xrlflow_jax.graph import host as graph_host
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.ops import precision as precision_lib

DEFAULT_TOLERANCE = precision_lib.TOLERANCE[precision_lib.DEFAULT_POLICY]  # 1e-3
LEVEL = 0.95
RESAMPLES = 10000  # bootstrap resamples: the expanded tails of 10 rounds at 99% reach 2e-4
MIN_ROUNDS = 5
VERDICTS = ("faster", "no change", "slower", "unchanged")


class MeasurementError(XrlflowError):
  """Invalid measurement settings (too few rounds, no repeats, a negative warm-up)."""


class NumericsError(XrlflowError):
  """The optimised graph computes something else than the original (nothing is written)."""


# ----------------------------------------------------------------------------------------------
# Numerics
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class NumericsCheck:
  """Outputs of the original and the optimised graph on the same inputs.

  Attributes:
    max_abs_error: max |a - b| over the finite entries of all outputs (NaN propagates);
    max_rel_error: max |a - b| / (1 + |a|) likewise.
    outputs: number of outputs compared; tolerance: the bound on max_rel_error.
    passed: every output has the same shape, the same non-finite values in the same places and
      max_rel_error <= tolerance.
    nonfinite: what was found non-finite ("" when every value is finite): a mismatch (the check
      fails) or non-finite values shared by both graphs at the same places (reported, allowed).
  """
  max_abs_error: float
  max_rel_error: float
  outputs: int
  tolerance: float
  passed: bool
  nonfinite: str = ""

  def describe(self) -> str:
    """One line: PASS/FAIL, the errors, the tolerance, and any non-finite values."""
    text = (f"{'PASS' if self.passed else 'FAIL'} on {self.outputs} output(s): max abs error "
            f"{self.max_abs_error:.2e}, max rel error {self.max_rel_error:.2e} (tolerance "
            f"{self.tolerance:.0e})")
    return text + (f"; {self.nonfinite}" if self.nonfinite else "")


def _nan_max(current: float, value: float) -> float:
  """max() that propagates NaN (Python's max(0.0, nan) is 0.0)."""
  return value if math.isnan(value) or value > current else current


def compare_outputs(reference: Sequence[Any], candidate: Sequence[Any], *,
                    tolerance: float = DEFAULT_TOLERANCE) -> NumericsCheck:
  """Compares two graphs' outputs (arrays in output order).

  Integer and boolean outputs must be equal; float outputs must agree to
  max |a - b| / (1 + |a|) <= tolerance on their finite entries and carry the same NaN and
  +-Inf at the same places. NumericsError when the count or a shape differs.
  """
  if len(reference) != len(candidate):
    raise NumericsError(f"the optimised graph has {len(candidate)} outputs, the original "
                        f"{len(reference)}")
  if not (tolerance >= 0):
    raise MeasurementError(f"the numerics tolerance must be >= 0, got {tolerance}")
  max_abs = max_rel = 0.0
  notes: list[str] = []
  ok = True
  for i, (a, b) in enumerate(zip(reference, candidate)):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
      raise NumericsError(f"output {i} has shape {list(b.shape)} in the optimised graph, "
                          f"{list(a.shape)} in the original")
    if not a.size:
      continue
    if not (np.issubdtype(a.dtype, np.inexact) or np.issubdtype(b.dtype, np.inexact)):
      differ = a != b
      if differ.any():
        ok = False
        wide = np.abs(a.astype(np.float64) - b.astype(np.float64))[differ]
        max_abs = _nan_max(max_abs, float(wide.max()))
        max_rel = _nan_max(max_rel, float((wide / (1.0 + np.abs(a.astype(np.float64))[differ]))
                                          .max()))
        notes.append(f"output {i}: {int(differ.sum())} integer value(s) differ")
      continue
    a, b = a.astype(np.float64), b.astype(np.float64)
    fa, fb = np.isfinite(a), np.isfinite(b)
    same_special = (~fa & ~fb) & ((a == b) | (np.isnan(a) & np.isnan(b)))
    bad = ~(fa & fb) & ~same_special
    if bad.any():
      ok = False
      where = "the optimised graph" if (~fb & fa).any() else "the original"
      notes.append(f"output {i}: {int(bad.sum())} non-finite value(s) in {where} where the "
                   "other graph differs")
      max_abs = max_rel = float("nan")
    elif same_special.any():
      notes.append(f"output {i}: {int(same_special.sum())} non-finite value(s) in both graphs "
                   "at the same places")
    both = fa & fb
    if both.any():
      diff = np.abs(a[both] - b[both])
      max_abs = _nan_max(max_abs, float(diff.max()))
      max_rel = _nan_max(max_rel, float((diff / (1.0 + np.abs(a[both]))).max()))
  passed = bool(ok and max_rel <= tolerance)  # NaN compares False
  return NumericsCheck(max_abs, max_rel, len(reference), float(tolerance), passed,
                       "; ".join(notes))


def check_numerics(reference: layout.Graph, candidate: layout.Graph, params: ParamStore, *,
                   seed: int = 0, tolerance: float = DEFAULT_TOLERANCE,
                   precision: str | None = None) -> NumericsCheck:
  """Runs both graphs on the same random inputs (`executor.lower(...).random_inputs(seed)`),
  both under the numerics policy `precision`, and compares every output (`compare_outputs`)."""
  ref = executor.lower(reference, params, precision=precision)
  new = executor.lower(candidate, params, precision=precision)
  inputs = ref.random_inputs(seed)
  return compare_outputs(ref(*inputs), new(*inputs), tolerance=tolerance)


# ----------------------------------------------------------------------------------------------
# Speedup
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Speedup:
  """A candidate's measured speedup over the reference (see the module docstring).

  Attributes:
    ratio: reference time / candidate time, geometric mean over rounds (> 1: faster);
    low, high: its bootstrap interval at `level`.
    control_ratio, control_low, control_high: the same for the identical copy (NaN when none).
    verdict: one of VERDICTS; rounds: paired rounds.
    copy_low, copy_high: the interval of copy time / candidate time, the verdict's second test
      (NaN when no copy was timed).
  """
  ratio: float
  low: float
  high: float
  control_ratio: float
  control_low: float
  control_high: float
  verdict: str
  level: float
  rounds: int
  copy_low: float = math.nan
  copy_high: float = math.nan

  @classmethod
  def unchanged(cls) -> "Speedup":
    nan = float("nan")
    return cls(1.0, 1.0, 1.0, nan, nan, nan, "unchanged", LEVEL, 0)

  @property
  def faster(self) -> bool:
    return self.verdict == "faster"

  @property
  def keeps(self) -> bool:
    """The measured guard's rule (the search drivers' and the optimise job's): a rewritten graph
    is kept only when measured significantly faster, or when it is the input unchanged."""
    return self.verdict in ("faster", "unchanged")

  def describe(self) -> str:
    """"x1.089 [1.021, 1.160] (95%; identical copy x1.002 [0.990, 1.013], against it [1.015,
    1.151]): faster"."""
    if self.verdict == "unchanged":
      return "unchanged graph (not timed against itself)"
    text = f"x{self.ratio:.3f} [{self.low:.3f}, {self.high:.3f}] ({100 * self.level:.0f}%"
    if math.isfinite(self.control_ratio):
      text += (f"; identical copy x{self.control_ratio:.3f} [{self.control_low:.3f}, "
               f"{self.control_high:.3f}]")
    if math.isfinite(self.copy_low):
      text += f", against it [{self.copy_low:.3f}, {self.copy_high:.3f}]"
    return text + f"): {self.verdict}"

  def to_json(self) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in dataclasses.asdict(self).items()}


def expanded_tail(level: float, rounds: int) -> float:
  """The tail (a fraction, each side) at which a percentile bootstrap over `rounds` paired
  rounds is read for an interval at `level`: the expanded percentile interval, whose normal
  quantile is sqrt(R / (R - 1)) times Student's t quantile with R - 1 degrees of freedom.
  The plain percentile interval is too narrow for few rounds: over 10 rounds of identical
  graphs its 95% interval lay above 1 in 5.2% of 4000 trials (2.5% meant), its 99.17% interval
  in 2.2% (0.41% meant)."""
  t = scipy.stats.t.ppf(1 - (1 - level) / 2, rounds - 1)
  return float(scipy.stats.norm.sf(math.sqrt(rounds / (rounds - 1)) * t))


def _interval(log_ratios: np.ndarray, idx: np.ndarray, level: float
              ) -> tuple[float, float, float]:
  """(geometric mean, low, high) of exp(log_ratios) over bootstrap resamples `idx` [B, R],
  an expanded percentile interval (`expanded_tail`)."""
  means = log_ratios[idx].mean(axis=1)
  tail = 100 * expanded_tail(level, log_ratios.shape[0])
  lo, hi = np.percentile(means, [tail, 100 - tail])
  return float(np.exp(log_ratios.mean())), float(np.exp(lo)), float(np.exp(hi))


def speedup(reference_ms: np.ndarray, candidate_ms: np.ndarray,
            control_ms: np.ndarray | None = None, *, level: float = LEVEL,
            resamples: int = RESAMPLES, seed: int = 0) -> Speedup:
  """The verdict from per-round medians (float64[R] each, paired by round)."""
  ref = np.asarray(reference_ms, np.float64)
  cand = np.asarray(candidate_ms, np.float64)
  rounds = ref.shape[0]
  if rounds < MIN_ROUNDS or cand.shape != ref.shape:
    raise MeasurementError(f"a speedup verdict needs >= {MIN_ROUNDS} paired rounds (got "
                           f"{rounds} and {cand.shape[0]})")
  idx = np.random.default_rng(seed).integers(0, rounds, size=(resamples, rounds))
  gain = np.log(ref / cand)  # [R]
  ratio, low, high = _interval(gain, idx, level)
  c_ratio = c_low = c_high = d_low = d_high = float("nan")
  if control_ms is not None:
    noise = np.log(ref / np.asarray(control_ms, np.float64))  # [R]
    c_ratio, c_low, c_high = _interval(noise, idx, level)
    _, d_low, d_high = _interval(gain - noise, idx, level)  # log(copy / candidate)
  # Intersection-union: faster (slower) than the reference and than its identical copy.
  verdict = "no change"
  if low > 1.0 and not d_low <= 1.0:  # NaN (no copy timed) passes the second test
    verdict = "faster"
  elif high < 1.0 and not d_high >= 1.0:
    verdict = "slower"
  return Speedup(ratio, low, high, c_ratio, c_low, c_high, verdict, float(level), int(rounds),
                 d_low, d_high)


@dataclasses.dataclass(frozen=True)
class Comparison:
  """Candidates measured against a reference in the same interleaved rounds.

  Attributes:
    reference: the reference's LatencyStats; control: its identical copy's (None when every
      candidate is unchanged, then nothing was compared).
    candidates: LatencyStats per candidate (the reference's own for unchanged ones).
    speedups: Speedup per candidate.
    numerics: NumericsCheck per candidate (outputs of the compiled executables on the same
      inputs), or None when not asked for.
  """
  reference: latency.LatencyStats
  control: latency.LatencyStats | None
  candidates: list[latency.LatencyStats]
  speedups: list[Speedup]
  numerics: list[NumericsCheck] | None = None
  # Per-round medians (float64[R], ms): the reference, its copy, each candidate (the
  # reference's own for unchanged ones); None where nothing was timed.
  round_ms: tuple[np.ndarray, np.ndarray | None, list[np.ndarray]] | None = None

  def versus(self, i: int | None, j: int | None, seed: int = 0) -> Speedup:
    """Candidate `i` against candidate `j` (None: the reference; ratio > 1: `i` faster), paired
    by round; the control interval is the reference's against its identical copy (what noise
    alone gives). "unchanged" when nothing was timed."""
    if self.round_ms is None or self.round_ms[1] is None:
      return Speedup.unchanged()
    ref, copy, cands = self.round_ms
    a, b = (ref if k is None else cands[k] for k in (i, j))
    # speedup() takes the control's interval from log(reference / control): with b as the
    # reference, this control makes that log(ref / copy) round by round.
    return speedup(b, a, control_ms=b * copy / ref, seed=seed)


def look_level(level: float, looks: int) -> float:
  """The interval level of each of `looks` looks at one comparison (`compare`'s looks):
  1 - (1 - level) / looks (Bonferroni), so looking again keeps the false-positive rate."""
  return 1 - (1 - level) / looks


def settled(verdicts: Iterable[Speedup]) -> bool:
  """Whether a look decides: no verdict is "no change" (`compare` then times no more sets)."""
  return all(v.verdict != "no change" for v in verdicts)


def sequential_verdicts(reference_ms: np.ndarray, candidates_ms: Sequence[np.ndarray],
                        control_ms: np.ndarray, *, rounds: int | None, looks: int,
                        level: float = LEVEL, changed: Sequence[bool] | None = None,
                        seed: int = 0) -> list[Speedup]:
  """The verdicts `compare(..., level=level, looks=looks)` gives these candidates, from
  per-round medians (float64[R] each) timed in this order, perhaps more rounds than it needed:
  after each set of `rounds` rounds (None: all R as one set), every changed candidate's verdict
  over the rounds so far at `look_level(level, looks)`; the first set that `settled`, or the
  last one timed, decides. `changed[i]` False: candidate i is unchanged (`Speedup.unchanged`).
  """
  total = len(reference_ms)
  step = total if rounds is None else rounds
  at = look_level(level, looks)
  for look in range(1, looks + 1):
    n = min(look * step, total)
    verdicts = look_verdicts(reference_ms[:n], [c[:n] for c in candidates_ms], control_ms[:n],
                             level=at, seed=seed, changed=changed)
    if n == total or settled(verdicts):
      break
  return verdicts


def look_verdicts(reference_ms: np.ndarray, candidates_ms: Sequence[np.ndarray],
                  control_ms: np.ndarray, *, level: float, seed: int,
                  changed: Sequence[bool] | None = None) -> list[Speedup]:
  """One look: each candidate's `speedup` over the rounds given (float64[R] each) at `level`
  (already the per-look level); `changed[i]` False gives `Speedup.unchanged()`."""
  changed = [True] * len(candidates_ms) if changed is None else changed
  return [speedup(reference_ms, c, control_ms, level=level, seed=seed) if ch
          else Speedup.unchanged() for c, ch in zip(candidates_ms, changed)]


def check_settings(rounds: int, repeats_per_round: int, warmup: int = 0,
                   min_round_ms: float = 0.0, looks: int = 1) -> None:
  """MeasurementError naming the setting when the timing settings cannot give a verdict."""
  if int(rounds) != rounds or rounds < MIN_ROUNDS:
    raise MeasurementError(f"latency rounds must be an integer >= {MIN_ROUNDS} (the verdict is "
                           f"a paired statistic over rounds), got {rounds}")
  if int(repeats_per_round) != repeats_per_round or repeats_per_round < 1:
    raise MeasurementError(f"repeats per round must be an integer >= 1, got "
                           f"{repeats_per_round}")
  if int(warmup) != warmup or warmup < 0:
    raise MeasurementError(f"warm-up runs must be an integer >= 0, got {warmup}")
  if int(looks) != looks or looks < 1:
    raise MeasurementError(f"looks (sets of rounds) must be an integer >= 1, got {looks}")
  if not (np.isfinite(min_round_ms) and min_round_ms >= 0):
    raise MeasurementError(f"the least time of a round must be a finite number of ms >= 0, "
                           f"got {min_round_ms}")


def repeats_for(compiled: latency.CompiledGraph, repeats_per_round: int, min_round_ms: float,
                warmup: int = 2) -> int:
  """Runs per graph per round: at least `repeats_per_round`, more for a fast graph so that one
  graph's round lasts about `min_round_ms` (`compiled`, usually the reference, sets the count).

  A round's median is the paired unit of the verdict; on a graph of ~1 ms, 3 runs give a median
  whose spread on a shared machine hides a 15% change."""
  if min_round_ms <= 0:
    return repeats_per_round
  guess = float(np.median(latency.time_callable(compiled.fn, compiled.args, warmup=warmup,
                                                repeats=5)))
  return max(repeats_per_round, int(np.ceil(min_round_ms / max(guess, 1e-3))))


def compare(reference: layout.Graph, candidates: Sequence[layout.Graph], params: ParamStore, *,
            rounds: int = 10, repeats_per_round: int = 3, warmup: int = 2,
            min_round_ms: float = 30.0, backend: str | None = None, seed: int = 0,
            tolerance: float | None = None, time_unchanged: bool = False,
            precision: str | None = None,
            candidate_params: Sequence[ParamStore | None] | None = None,
            level: float = LEVEL, looks: int = 1) -> Comparison:
  """Times `candidates` against `reference` side by side, with an identical copy as control.

  Each graph runs `repeats_per_round` times per round, or more for a fast reference so that a
  round of one graph lasts about `min_round_ms` (`repeats_for`; 0 keeps the count as given).

  Candidates with the reference's structural hash are "unchanged" and not timed; candidates
  equal to each other are compiled once. With `tolerance`, each candidate's outputs (of its
  compiled executable, same random inputs as the reference) are compared too.
  `time_unchanged=True` (A/A experiments) compiles and times unchanged candidates like any
  other, so their verdicts measure the false-positive rate. Every executable is compiled under
  one numerics policy, `precision` (`ops.precision`; default "highest").

  Verdicts use intervals at `level` (a caller choosing the best of k candidates keeps its
  false-positive rate with 1 - (1 - LEVEL) / k).

  `looks` > 1 times up to `looks` sets of `rounds` rounds: after each set, every verdict is
  computed over all rounds so far, and another set is timed only while a changed candidate is
  "no change" (a fast graph whose gain hides in one set's noise gets a verdict). Each look
  uses intervals at 1 - (1 - level) / looks, so looking again does not raise the
  false-positive rate (Bonferroni over the looks).

  `candidate_params[i]`, when not None, is candidate i's own weights (a graph loaded apart, e.g.
  another optimiser's output for the same model): it is always compiled and timed, and must
  take the reference's inputs (same count, shapes and dtypes), which it is given.

  Raises:
    MeasurementError: bad settings, or a candidate with its own weights that takes other
      inputs. BackendError, DeviceMemoryError: see `cost.latency`.
  """
  check_settings(rounds, repeats_per_round, warmup, min_round_ms, looks)
  level = look_level(level, looks)
  own = list(candidate_params) if candidate_params is not None else [None] * len(candidates)
  if len(own) != len(candidates):
    raise MeasurementError(f"candidate_params has {len(own)} entries for {len(candidates)} "
                           "candidates")
  for i, (g, p) in enumerate(zip(candidates, own)):  # before anything compiles
    mismatch = None if p is None else executor.input_mismatch(reference, g)
    if mismatch:
      raise MeasurementError(f"candidate {i} takes other inputs than the reference: {mismatch}")
  device = latency.resolve_device(backend)
  ref_hash = graph_host.structural_hash(reference)
  hashes = [graph_host.structural_hash(g) for g in candidates]
  if time_unchanged:  # every candidate its own executable, compared like a changed graph
    ref_hash = ""
    hashes = [f"{h}/{i}" for i, h in enumerate(hashes)]
  # A graph with its own weights is never the reference's nor another candidate's executable.
  hashes = [h if p is None else f"{h}/own{i}" for i, (h, p) in enumerate(zip(hashes, own))]
  # Executable index per hash: 0 the reference, 1 its identical copy, then each new candidate.
  slot = {ref_hash: 0}
  changed: list[tuple[int, layout.Graph]] = []
  for i, (h, g) in enumerate(zip(hashes, candidates)):
    if h not in slot:
      slot[h] = 2 + len(changed)
      changed.append((i, g))
  compiled = [latency.compile_graph(reference, params, device=device, seed=seed,
                                    precision=precision, what="the reference graph")]
  if changed:
    compiled.append(latency.compile_graph(reference, params, device=device, seed=seed,
                                          precision=precision,
                                          what="the reference's identical copy"))
  for i, g in changed:
    c = latency.compile_graph(g, params if own[i] is None else own[i], device=device,
                              seed=seed, precision=precision, what=f"candidate {i}")
    if own[i] is not None:  # the reference's inputs (equal specs; index bounds may differ)
      c = dataclasses.replace(c, args=(c.args[0], *compiled[0].args[1:]))
    compiled.append(c)
  if changed:
    repeats_per_round = repeats_for(compiled[0], repeats_per_round, min_round_ms, warmup)
  times: list[list[np.ndarray]] = [[] for _ in compiled]
  for look in range(looks):
    more = latency.time_interleaved(compiled, rounds=rounds,
                                    repeats_per_round=repeats_per_round, warmup=warmup,
                                    seed=seed + look)
    times = [t + m for t, m in zip(times, more)]
    medians = [np.array([np.median(r) for r in t]) for t in times]
    verdicts = (dict(enumerate(look_verdicts(medians[0], medians[2:], medians[1], level=level,
                                             seed=seed), start=2)) if changed else {})
    if settled(verdicts.values()):
      break
  stats = [latency.stats_of(t, c) for t, c in zip(times, compiled)]
  used = [slot[h] for h in hashes]
  cand_stats = [stats[j] for j in used]
  speedups = [verdicts[j] if j else Speedup.unchanged() for j in used]
  numerics = None
  if tolerance is not None:
    outputs = {j: compiled[j].fn(*compiled[j].args) for j in {0, *used}}
    numerics = [compare_outputs(outputs[0], outputs[j], tolerance=tolerance) for j in used]
  round_ms = (medians[0], medians[1] if changed else None, [medians[j] for j in used])
  return Comparison(stats[0], stats[1] if changed else None, cand_stats, speedups, numerics,
                    round_ms)



# ---------------------------------------------------------------------------------------------
# Many graphs against one reference (cost validation, rewrite gains, calibration pairs)

def rankdata(x: Sequence[float]) -> np.ndarray:
  """float64[n]: 1-based ranks, ties get the average of their ranks."""
  x = np.asarray(x, np.float64)
  order = np.argsort(x, kind="mergesort")
  ranks = np.empty(len(x), np.float64)
  sorted_x = x[order]
  i = 0
  while i < len(x):
    j = i
    while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
      j += 1
    ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
    i = j + 1
  return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
  """Spearman's rank correlation (Pearson correlation of average ranks); nan if either side is
  constant or there are fewer than 3 points."""
  if len(x) != len(y):
    raise ValueError(f"spearman: {len(x)} values against {len(y)}")
  if len(x) < 3:
    return float("nan")
  rx, ry = rankdata(x), rankdata(y)
  rx -= rx.mean()
  ry -= ry.mean()
  denom = np.sqrt((rx * rx).sum() * (ry * ry).sum())
  return float((rx * ry).sum() / denom) if denom > 0 else float("nan")


# ----------------------------------------------------------------------------------------------
# Side-by-side measurement
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SideBySide:
  """Latencies of graphs measured in batches that each include the reference graph.

  Attributes:
    stats: LatencyStats per graph (in the order given).
    ratio: float64[n]: each graph's median over the reference's median in the same batch.
    reference_ms: median of the reference over all batches.
  """
  stats: list[latency.LatencyStats]
  ratio: np.ndarray
  reference_ms: float

  @property
  def latency_ms(self) -> np.ndarray:
    """float64[n]: ratio x reference median (drift between batches removed)."""
    return self.ratio * self.reference_ms


def measure_side_by_side(reference: layout.Graph, graphs: Sequence[layout.Graph],
                         params: ParamStore, *, rounds: int = 10, repeats_per_round: int = 3,
                         warmup: int = 2, min_round_ms: float = 30.0, batch_size: int = 16,
                         max_batch_mb: float = 2000.0, backend: str | None = None, seed: int = 0,
                         log: Callable[[str], None] | None = None,
                         precision: str | None = None) -> SideBySide:
  """Measures `graphs` against `reference`, interleaved, in batches bounded in count and memory.

  Every batch compiles two copies of the reference and up to `batch_size` graphs (fewer when
  their weights would exceed `max_batch_mb`), measures them in `rounds` interleaved rounds, and
  frees them. Ratios are to the geometric mean of the two reference copies of the same batch.
  Each graph runs at least `repeats_per_round` times per round, more for fast graphs so that a
  round of one graph lasts about `min_round_ms` (the reference's latency sets the count).
  """
  device = latency.resolve_device(backend)
  first = latency.compile_graph(reference, params, device=device, seed=seed,
                                precision=precision, what="the reference graph")
  repeats_per_round = repeats_for(first, repeats_per_round, min_round_ms, warmup)
  per_graph_mb = max(first.nbytes / 1e6, 1e-3)
  size = int(max(1, min(batch_size, max_batch_mb // per_graph_mb - 2)))
  del first
  stats: list[latency.LatencyStats | None] = [None] * len(graphs)
  ratio = np.zeros(len(graphs))
  ref_medians = []
  for start in range(0, len(graphs), size):
    chunk = list(range(start, min(start + size, len(graphs))))
    t0 = time.perf_counter()
    # Two copies of the reference, compiled afresh in every batch at a third and two thirds of
    # the compile order: identical executables differ by a few percent on a busy machine
    # (seen as a bias of the first-compiled copy), so the denominator is their geometric mean.
    order: list[int | None] = list(chunk)
    order.insert(2 * len(chunk) // 3, None)
    order.insert(len(chunk) // 3, None)
    built = [latency.compile_graph(reference if i is None else graphs[i], params,
                                   device=device, seed=seed, precision=precision,
                                   what="the reference" if i is None else f"variant {i}")
             for i in order]
    refs = [c for c, i in zip(built, order) if i is None]
    compiled = refs + [c for c, i in zip(built, order) if i is not None]
    t1 = time.perf_counter()
    res = latency.measure_interleaved(compiled, rounds=rounds, repeats_per_round=repeats_per_round,
                                      warmup=warmup, seed=seed + start)
    ref_ms = float(np.sqrt(res[0].median_ms * res[1].median_ms))
    ref_medians.append(ref_ms)
    for i, r in zip(chunk, res[2:]):
      stats[i] = r
      ratio[i] = r.median_ms / ref_ms
    del compiled, built, refs
    if log:
      log(f"  batch {start // size + 1}: {len(chunk)} graphs, compile {t1 - t0:.1f}s, measure "
          f"{time.perf_counter() - t1:.1f}s ({repeats_per_round} runs x {rounds} rounds each), "
          f"reference {ref_ms:.3f} ms (copies differ by "
          f"{100 * abs(res[0].median_ms / res[1].median_ms - 1):.1f}%)")
  ref_ms = float(np.median(ref_medians)) if ref_medians else float("nan")
  return SideBySide([s for s in stats if s is not None], ratio, ref_ms)


@dataclasses.dataclass(frozen=True)
class Passes:
  """Side-by-side measurements repeated in independent passes (see `measure_passes`).

  Attributes:
    ratio: float64[P, n]: each graph's median over the reference's, per pass.
    stats: P lists of n LatencyStats, in the graphs' order.
    reference_ms: geometric mean over the passes of the reference's median.
  """
  ratio: np.ndarray
  stats: list[list[latency.LatencyStats]]
  reference_ms: float

  @property
  def mean_ratio(self) -> np.ndarray:
    """float64[n]: the geometric mean of the passes' ratios."""
    return np.exp(np.log(self.ratio).mean(axis=0))


def measure_passes(reference: layout.Graph, graphs: Sequence[layout.Graph], params: ParamStore,
                   *, passes: int = 2, seed: int = 0, **side_by_side: Any) -> Passes:
  """`measure_side_by_side` repeated `passes` times, each compiling every graph afresh in
  another order (so other batch neighbours and another compile order): separately compiled
  copies of one graph differ by a few percent on a small CPU, which one pass cannot show.

  Args:
    side_by_side: rounds, repeats_per_round, min_round_ms, backend, log, ... (passed on).
  """
  n = len(graphs)
  ratios, stats, refs = [], [], []
  for p in range(max(1, passes)):
    order = np.random.default_rng(seed + 1000 * p).permutation(n) if p else np.arange(n)
    log = side_by_side.get("log")
    if log and passes > 1:
      log(f"  pass {p + 1}/{passes}")
    m = measure_side_by_side(reference, [graphs[i] for i in order], params, seed=seed + p,
                             **side_by_side)
    r = np.empty(n)
    r[order] = m.ratio
    st: list[Any] = [None] * n
    for i, s in zip(order, m.stats):
      st[int(i)] = s
    ratios.append(r)
    stats.append(st)
    refs.append(m.reference_ms)
  return Passes(np.stack(ratios), stats, float(np.exp(np.mean(np.log(refs)))))
