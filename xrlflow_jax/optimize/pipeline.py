"""The optimise job's pipeline, `optimize_model`: check, load, search, check numerics, measure,
write (the stages are described in `xrlflow_jax.optimize`)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from xrlflow_jax import compilation_cache, cost, executor
from xrlflow_jax import graph as G
from xrlflow_jax.cost import calibrate
from xrlflow_jax.cost import kernel_table as kernel_table_lib
from xrlflow_jax.measure import (Comparison, LatencyStats, NumericsError, Speedup,
                                 check_numerics, compare)
from xrlflow_jax.ops import precision as precision_lib
from xrlflow_jax.optimize import checks, methods
from xrlflow_jax.optimize.checks import OptimizeError
from xrlflow_jax.optimize.methods import BUDGET_OPTION, Found
from xrlflow_jax.optimize.report import OptimizeReport, default_output_dir, write_outputs
from xrlflow_jax.measure.guard import DEFAULT_CHECKPOINTS, GuardDecision, checkpoint_level, decide
from xrlflow_jax.workflow import Loaded, load

DEFAULT_MODEL = "squeezenet1_1"
# Sets of latency rounds the guard may time (`measure.compare`'s looks): a second set only
# while the verdict is "no change". At 10 rounds, NasRNN's gate merges (1.1 ms a call) measured
# x1.185 [1.036, 1.348] against a control spanning 0.930-1.147, "no change" (2026-12-05).
DEFAULT_LOOKS = 2


def load_source(source: str, *, size: str = "tiny",
                input_shapes: Mapping[str, Sequence[int]] | None = None,
                capacity: int | None = None, seed: int = 0) -> Loaded:
  """`workflow.load` with the optimise job's default size ("tiny")."""
  return load(source, size=size, input_shapes=input_shapes, capacity=capacity, seed=seed)


@functools.lru_cache(maxsize=4)
def _coefficients(path: str) -> cost.CostCoefficients:
  """Cost-model coefficients from a JSON file, or (""): this device's shipped fit or
  calibration, calibrated on first use (`cost.calibrate.coefficients`); once per process."""
  return calibrate.coefficients(path or None)


def measured_guard(loaded: Loaded, found: Found, comparison: Comparison,
                   checkpoint_slots: Sequence[int] = ()
                   ) -> tuple[Found, LatencyStats, Speedup, GuardDecision]:
  """The measured guard's decision (`measure.guard.decide`) applied to the search's outcome:
  the found graph, one of its checkpoints (prefixes of its rewrites, `Found.checkpoints`,
  timed in the same rounds), or the input.

  Args:
    comparison: `measure.compare(loaded.graph, [found.graph, ...], ...)`.
    checkpoint_slots: the comparison's candidate index of each of `found.checkpoints`.
  Returns:
    (what is kept as a Found, its latency, its Speedup, the decision): the found graph; a
    checkpoint's graph (its prefix of the rewrites, its modelled cost); or the input itself
    (no rewrites, modelled cost of the input, the input's latency and an "unchanged"
    Speedup), with what was rejected in `details["measured_guard"]`. What each checkpoint
    measured is in `details["checkpoints"]`.
  """
  slots = list(checkpoint_slots)
  cps = list(found.checkpoints)[:len(slots)]
  decision = decide(comparison.speedups[0], len(found.rewrites or ()),
                    [comparison.speedups[j] for j in slots], [cp.rewrites for cp in cps])
  details = dict(found.details)
  if slots:
    details["checkpoints"] = [
        {"rewrites": cp.rewrites, "cost_ms": cp.cost_ms,
         "latency_median_ms": comparison.candidates[j].median_ms,
         "speedup": comparison.speedups[j].describe()}
        for cp, j in zip(cps, slots)]
  if decision.kept == "checkpoint":
    cp, j = cps[decision.index - 1], slots[decision.index - 1]
    details["checkpoint"] = {"rewrites": cp.rewrites, "of": len(found.rewrites or ()),
                             "rejected_speedup": decision.path_speedup.describe()}
    kept = Found(cp.graph, cp.cost_ms, found.initial_cost_ms,
                 list(found.rewrites or ())[:cp.rewrites], found.found_by, details)
    return kept, comparison.candidates[j], decision.speedup, decision
  if decision.kept == "path":
    kept = dataclasses.replace(found, details=details) if slots else found
    return kept, comparison.candidates[0], decision.speedup, decision
  after, verdict = comparison.candidates[0], decision.path_speedup
  details["returned_input"] = True
  details["measured_guard"] = {
      "rejected_found_by": found.found_by, "rejected_cost_ms": found.cost_ms,
      "rejected_rewrites": None if found.rewrites is None else len(found.rewrites),
      "rejected_latency_median_ms": after.median_ms, "rejected_latency_iqr_ms": after.iqr_ms,
      "input_latency_median_ms": comparison.reference.median_ms,
      "rejected_speedup": verdict.describe(), "rejected_verdict": verdict.to_json()}
  kept = Found(loaded.graph, found.initial_cost_ms, found.initial_cost_ms, [], found.found_by,
               details)
  return kept, comparison.reference, decision.speedup, decision


def _against(path: str, other: Loaded, loaded: Loaded, comparison: Comparison, *,
             returned_input: bool, seed: int) -> dict[str, Any]:
  """`OptimizeReport.against` from a comparison whose candidates are [search's graph, other]."""
  weightless = [f"{what} has no weight data" for what, n in
                (("the input", loaded.random_weights), (path, other.random_weights)) if n]
  return {
      "file": path, "nodes": G.num_nodes(other.graph), "random_weights": other.random_weights,
      "latency": comparison.candidates[1], "vs_input": comparison.speedups[1],
      "returned_vs_it": comparison.versus(None if returned_input else 0, 1, seed=seed),
      "numerics": None if weightless else comparison.numerics[1],
      "note": "; ".join(weightless) + (": different random weights, outputs not comparable"
                                       if weightless else "")}


def optimize_model(source: str = DEFAULT_MODEL, *, method: str = "ppo", size: str = "tiny",
                   input_shapes: Mapping[str, Sequence[int]] | None = None,
                   output_dir: str | os.PathLike | None = None, budget: int | None = None,
                   seed: int = 0, capacity: int | None = None,
                   rules: Sequence[str] | None = None, search_options:
                   Mapping[str, Any] | None = None, measure: bool = True,
                   latency_rounds: int = 10, repeats_per_round: int = 3,
                   min_round_ms: float = 30.0, latency_looks: int = DEFAULT_LOOKS,
                   tolerance: float | None = None,
                   precision: str | None = None,
                   picture: bool = True,
                   cost_coefficients: str | None = None, write: bool = True,
                   keep_slower: bool = False, compilation_cache_dir: str | None = None,
                   kernel_table: bool = True, against: str | None = None,
                   checkpoints: int = DEFAULT_CHECKPOINTS,
                   log: Callable[[str], None] = print) -> OptimizeReport:
  """Optimises a model and writes the result with its evidence (see the module docstring).

  Args:
    source: a zoo model name or an .onnx path.
    method: "ppo" (short training + policy), "greedy", "taso", "beam" or "random".
    size: zoo size; input_shapes: ONNX dynamic input shapes {name: shape}.
    output_dir: where to write (default `default_output_dir`).
    budget: "ppo": PPO updates (default: the test config's 12); other methods: greedy's
      max_steps, taso's budget (graphs expanded), beam's and random's steps (see
      BUDGET_OPTION); None: the search's default.
    seed: weights, search and training seed; capacity: node slots (default auto).
    rules: rule names (default: every built-in rule for the searches; for "ppo"
      `default_ppo_rules`, the test config's five when they apply).
    search_options: extra keyword options of `search.optimize`.
    measure: time both graphs with XLA (latency_rounds rounds of repeats_per_round runs each,
      more runs per round for a fast graph so that a round lasts about min_round_ms; up to
      latency_looks such sets while the verdict is "no change", `measure.compare`'s looks).
    tolerance: bound on max |a - b| / (1 + |a|) of the outputs (default: the policy's,
      `ops.precision.tolerance`: 1e-3 at "highest").
    precision: numerics policy of matmuls and convolutions for both graphs ("highest",
      default; "high", "default": faster on GPUs, TF32/bf16), recorded in the report.
    picture: draw graph.png; cost_coefficients: a JSON file (None: this device's shipped fit
      or calibration, calibrated on first use: `cost.calibrate.coefficients`).
    write: write the output files (False: only return the report).
    keep_slower: keep the optimised graph even when XLA measured it no faster than the input
      (default: the input is returned instead, see `measured_guard`).
    checkpoints: prefixes of the search's rewrites timed beside its graph (where the rule
      family changes, the last ones: `measure.guard.checkpoint_lengths`); the guard returns the
      fastest of them and the whole path among those measured significantly faster, every
      verdict at the level 1 - 0.05 / (1 + checkpoints) (0: the whole path alone); for "ppo",
      prefixes of the returned path (the policy's or training's best).
    compilation_cache_dir: JAX's persistent compilation cache (None: `$XRLFLOW_COMPILATION_CACHE`
      or the per-user default; "off": none), see `compilation_cache.enable`.
    kernel_table: the searches cost MatMuls and convolutions by their measured time on this
      device (`cost.kernel_table`; each kernel measured once and kept in the profiler's
      on-disk cache, `$XRLFLOW_PROFILE_CACHE` or ~/.cache/xrlflow_jax/profiles); False: the
      model's roofline alone. "ppo": training's environment costs with the table too, filled
      first by a TASO-style search from the input (`search.fill_kernel_table`).
    against: an ONNX file of the same model optimised by another tool (e.g. TASO's output),
      taking the same inputs: timed in the same interleaved rounds as the input and the
      result, its outputs checked against the input's when both files carry their weights
      (`OptimizeReport.against`); needs `measure`.
  Raises:
    OptimizeError (bad input), OnnxImportError, NumericsError (nothing written), SearchError.
  """
  input_shapes = checks.check_request(
      str(source), method=method, size=size, input_shapes=input_shapes, output_dir=output_dir,
      budget=budget, capacity=capacity, latency_rounds=latency_rounds,
      repeats_per_round=repeats_per_round, min_round_ms=min_round_ms, tolerance=tolerance,
      precision=precision, write=write, against=against, measure=measure,
      latency_looks=latency_looks)
  if checkpoints < 0:
    raise OptimizeError(f"checkpoints must be >= 0 (prefixes timed beside the found graph), "
                        f"got {checkpoints}")
  policy = precision_lib.check(precision)
  tolerance = precision_lib.tolerance(policy) if tolerance is None else tolerance
  cache_dir = compilation_cache.enable(compilation_cache_dir)
  times: dict[str, float] = {}
  t = time.perf_counter()
  loaded = load_source(str(source), size=size, input_shapes=input_shapes, capacity=capacity,
                       seed=seed)
  checks.check_memory(loaded)
  out = Path(output_dir) if output_dir else default_output_dir(loaded.label, method)
  if write:
    checks.check_output_dir(out)
  times["load"] = time.perf_counter() - t
  log(f"loaded {loaded.label} ({loaded.kind}): {G.num_nodes(loaded.graph)} nodes, capacity "
      f"{G.capacity(loaded.graph)}" + (f"; {loaded.random_weights} initializers given random "
                                       "weights (the file has no weight data)"
                                       if loaded.random_weights else ""))
  for note in getattr(getattr(loaded.params, "stats", None), "notes", ()):  # ONNX import notes
    log(f"note: {note}")
  other = None
  if against is not None:
    other = load_source(str(against), input_shapes=input_shapes, seed=seed)
    mismatch = executor.input_mismatch(loaded.graph, other.graph)
    if mismatch:  # refused before the search, not after it
      raise OptimizeError(f"--against {against} takes other inputs than {source}: {mismatch}")
    log(f"loaded {against} to time against: {G.num_nodes(other.graph)} nodes"
        + (f"; {other.random_weights} initializers given random weights" if other.random_weights
           else ""))
  coeffs = _coefficients(cost_coefficients or "")

  t = time.perf_counter()
  log(f"searching with {method}" + (f" (budget {budget})" if budget else "") + " ...")
  kernels = kernel_table_lib.shared() if kernel_table else None
  if method == "ppo":
    found = methods.run_ppo(loaded, coeffs, budget=budget, seed=seed, rules=rules,
                            options=search_options, kernels=kernels,
                            checkpoints=checkpoints if measure else 0, log=log)
  else:
    opts = dict(search_options or {})
    if budget is not None:
      opts.setdefault(BUDGET_OPTION[method], int(budget))
    found = methods.run_search(loaded, method, coeffs, seed=seed, rules=rules, options=opts,
                               kernels=kernels, checkpoints=checkpoints if measure else 0)
  if kernels is not None:
    found.details["cost_model"] = (
        f"measured kernel table ({len(kernels)} kernels known, "
        f"{kernels.measured} measured in this process; MatMuls timed "
        + ("a call at a time: each weight is read once)" if kernels.streamed
           else "in a hot loop: MatMuls share weights)"))
  else:
    found.details["cost_model"] = "roofline"
  times["search"] = time.perf_counter() - t
  found.details["compilation_cache"] = str(cache_dir) if cache_dir else "off"
  compiled = float(found.details.get("options", {}).get("compile_seconds", 0.0))
  if compiled:  # the search's first calls of each compiled shape, reported on their own
    times["compile"] = compiled
    times["search"] -= compiled
  measuring = float(found.details.get("options", {}).get("kernel_seconds", 0.0))
  if measuring:  # kernels measured (or read from the profile cache) for the cost model
    times["kernels"] = measuring
    times["search"] -= measuring

  t = time.perf_counter()
  best = found.graph
  G.validate(best, loaded.params)
  lat_before = lat_after = verdict = None
  checkpoints = found.checkpoints if measure and not keep_slower else []
  for c in checkpoints:
    G.validate(c.graph, loaded.params)
  if measure:  # one set of compiles: the timed executables' outputs are the numerics check
    theirs = [other.graph] if other else []
    slots = [1 + len(theirs) + i for i in range(len(checkpoints))]
    comparison = compare(loaded.graph, [best] + theirs + [c.graph for c in checkpoints],
                         loaded.params, rounds=latency_rounds, looks=latency_looks,
                         repeats_per_round=repeats_per_round, min_round_ms=min_round_ms,
                         seed=seed, tolerance=tolerance, precision=policy,
                         candidate_params=[None] + ([other.params] if other else [])
                         + [None] * len(checkpoints),
                         level=checkpoint_level(len(checkpoints)))  # best of 1 + k
    numerics = comparison.numerics[0]
    for j in slots:  # every rewritten graph timed must compute what the input does
      if not comparison.numerics[j].passed:
        numerics = comparison.numerics[j]
    lat_before, lat_after, verdict = (comparison.reference, comparison.candidates[0],
                                      comparison.speedups[0])
    times["check+measure"] = time.perf_counter() - t
  else:
    numerics = check_numerics(loaded.graph, best, loaded.params, seed=seed, tolerance=tolerance,
                              precision=policy)
    times["check"] = time.perf_counter() - t
  if not numerics.passed:
    raise NumericsError(f"the optimised graph's outputs differ from the original's: "
                        f"{numerics.describe()}; nothing was written")
  if measure and not keep_slower:
    found, lat_after, verdict, decision = measured_guard(loaded, found, comparison, slots)
    if decision.kept == "input":
      log(f"measured: the optimised graph is not significantly faster than the input "
          f"({decision.path_speedup.describe()}): the input is kept")
      best = loaded.graph
    elif decision.kept == "checkpoint":
      log(f"measured: the first {decision.rewrites} of the {decision.of} rewrites "
          f"{verdict.describe()}, all of them {decision.path_speedup.describe()}: the faster "
          "(the first) is returned")
      best = found.graph
      numerics = comparison.numerics[slots[decision.index - 1]]
  against_info = None
  if other is not None:
    against_info = _against(str(against), other, loaded, comparison,
                            returned_input=best is loaded.graph, seed=seed)

  report = OptimizeReport(
      source=str(source), label=loaded.label, kind=loaded.kind, method=method,
      found_by=found.found_by, random_weights=loaded.random_weights,
      nodes_before=G.num_nodes(loaded.graph), nodes_after=G.num_nodes(best),
      cost_before_ms=found.initial_cost_ms, cost_after_ms=found.cost_ms,
      latency_before=lat_before, latency_after=lat_after, measured=verdict, numerics=numerics,
      rewrites=found.rewrites, hash_before=G.structural_hash(loaded.graph),
      hash_after=G.structural_hash(best), seconds=times, details=found.details,
      input_graph=loaded.graph, graph=best, params=loaded.params, precision=policy,
      against=against_info)
  if write:
    t = time.perf_counter()
    report.output_dir = str(out)
    times["write"] = 0.0
    report.files = write_outputs(report, loaded, best, out, picture=picture, log=log)
    times["write"] = time.perf_counter() - t
  times["total"] = sum(v for k, v in times.items() if k != "total")
  if write:  # report.json carries the final times
    Path(report.files["report"]).write_text(json.dumps(report.to_json(), indent=2) + "\n")
  return report
