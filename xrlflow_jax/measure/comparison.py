"""Candidates timed against a reference and its identical copy in interleaved rounds, with
every executable's outputs checked: `compare`, the one side-by-side measurement behind every
speed claim (the statistic is `measure.verdict`'s)."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from xrlflow_jax import executor
from xrlflow_jax.graph import host as graph_host
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.measure import latency, ort

from xrlflow_jax.measure.numerics import NumericsCheck, compare_outputs
from xrlflow_jax.measure.verdict import (LEVEL, MIN_ROUNDS, MeasurementError, Speedup,
                                         look_level, look_verdicts, settled, speedup)

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
            level: float = LEVEL, looks: int = 1, runtime: str = "xla",
            reference_model: Any = None) -> Comparison:
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

  `runtime`: "xla" (compiled executables on `backend`'s device) or "onnxruntime" (each graph
  exported and run as an onnxruntime session, `measure.ort`; the same inputs, rounds and
  statistics). `reference_model` (onnxruntime only): the ONNX file (path or bytes) timed as the
  reference and its identical copy instead of the reference graph's export, e.g. the user's
  own file, so a candidate is judged against what the user already has.

  Raises:
    MeasurementError: bad settings, or a candidate with its own weights that takes other
      inputs. BackendError, DeviceMemoryError: see `measure.latency`.
  """
  check_settings(rounds, repeats_per_round, warmup, min_round_ms, looks)
  ort.check_runtime(runtime)
  if reference_model is not None and runtime != "onnxruntime":
    raise MeasurementError("a reference model file is timed by onnxruntime only")
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
  def build(g: layout.Graph, p: ParamStore, what: str, model: Any = None
            ) -> latency.CompiledGraph:
    if runtime == "onnxruntime":
      return ort.compile_onnxruntime(g, p, seed=seed, model=model, what=what)
    return latency.compile_graph(g, p, device=device, seed=seed, precision=precision,
                                 what=what)

  compiled = [build(reference, params, "the reference graph", reference_model)]
  if changed:
    compiled.append(build(reference, params, "the reference's identical copy",
                          reference_model))
  for i, g in changed:
    c = build(g, params if own[i] is None else own[i], f"candidate {i}")
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
