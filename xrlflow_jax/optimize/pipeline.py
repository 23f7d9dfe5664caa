"""The optimise job's pipeline, `optimize_model`: check, load, search, guard, write (the stages
are described in `xrlflow_jax.optimize`)."""

from __future__ import annotations

import dataclasses
import functools
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from xrlflow_jax import compilation_cache, cost, executor, onnx_io
from xrlflow_jax import graph as G
from xrlflow_jax.cost import calibrate
from xrlflow_jax.cost import kernel_table as kernel_table_lib
from xrlflow_jax.errors import MissingWeightsError
from xrlflow_jax.measure import NumericsCheck, NumericsError, check_numerics, compare
from xrlflow_jax.optimize import checks, methods
from xrlflow_jax.optimize.checks import OptimizeError
from xrlflow_jax.optimize.heartbeat import Heartbeat
from xrlflow_jax.optimize.methods import BUDGET_OPTION
from xrlflow_jax.optimize.options import OptimizeOptions
from xrlflow_jax.optimize.report import OptimizeReport, default_output_dir, write_outputs
from xrlflow_jax.search import SearchResult
from xrlflow_jax.search.guard import kept_slot, measured_guard
from xrlflow_jax.workflow import Loaded, load

DEFAULT_MODEL = "nasrnn"


def load_source(source: str, *, size: str = "tiny",
                input_shapes: Mapping[str, Sequence[int]] | None = None,
                capacity: int | None = None, seed: int = 0,
                random_weights: bool = False) -> Loaded:
  """`workflow.load` with the optimise job's default size ("tiny"); a graph-only file without
  `random_weights` is refused with an OptimizeError naming the missing file and the flag."""
  try:
    return load(source, size=size, input_shapes=input_shapes, capacity=capacity, seed=seed,
                random_weights=random_weights)
  except MissingWeightsError as e:
    raise OptimizeError(
        f"{source}: {e.count} initializer(s) keep their data in {', '.join(e.files)}, which is "
        "missing: put it beside the model, or pass --random_weights (random_weights=True) to "
        "run on seeded random weights; the optimised file would then hold those, not the "
        "model's") from None


@functools.lru_cache(maxsize=4)
def _coefficients(path: str) -> cost.CostCoefficients:
  """Cost-model coefficients from a JSON file, or (""): this device's shipped fit or
  calibration, calibrated on first use (`cost.calibrate.coefficients`); once per process."""
  return calibrate.coefficients(path or None)


def optimize_model(source: str | Loaded = DEFAULT_MODEL, options: OptimizeOptions | None = None,
                   *, log: Callable[[str], None] = print, **settings: Any) -> OptimizeReport:
  """Optimises a model and writes the result with its evidence (see the package docstring).

    report = optimize_model("squeezenet1_1", method="greedy", output_dir="/tmp/o")
    report = optimize_model(path, OptimizeOptions(method="taso", budget=50))

  Args:
    source: a zoo model name, an .onnx path, or a model already loaded (`workflow.Loaded`,
      e.g. a traced JAX function: `optimize_jax`).
    options: the job's settings (`OptimizeOptions`; default: its defaults), with `settings`
      (its field names) replaced.
    log: where progress lines go (inside each phase also a line after every
      `progress_seconds` without one: `optimize.heartbeat`).
  Raises:
    OptimizeError (bad input), OnnxImportError, NumericsError (nothing written), SearchError.
  """
  given = source if isinstance(source, Loaded) else None
  source = given.label if given else str(source)
  opts = OptimizeOptions.of(options, **settings).checked(None if given else source)
  cache_dir = compilation_cache.enable(opts.compilation_cache_dir)
  log = Heartbeat(log, opts.progress_seconds)
  times: dict[str, float] = {}
  t = time.perf_counter()
  with log.phase("loading"):
    loaded, other = _load(given or source, opts, log)
  out = Path(opts.output_dir) if opts.output_dir else default_output_dir(loaded.label,
                                                                          opts.method)
  if opts.write:
    checks.check_output_dir(out)
  times["load"] = time.perf_counter() - t

  t = time.perf_counter()
  with log.phase(f"searching with {opts.method}"):
    found, details = _search(loaded, opts, log)
  details["compilation_cache"] = str(cache_dir) if cache_dir else "off"
  times.update(_search_times(found, time.perf_counter() - t))

  t = time.perf_counter()
  with log.phase("checking numerics and measuring" if opts.measure else "checking numerics"):
    result, numerics = _guard(loaded, other, found, opts, log)
  times["check+measure" if opts.measure else "check"] = time.perf_counter() - t

  export = None
  if loaded.kind == "onnx":
    t = time.perf_counter()
    with log.phase("checking the ONNX file to be written"):
      result, export = _check_export(loaded, result, opts, log)
    times["export check"] = time.perf_counter() - t

  report = OptimizeReport(
      source=str(source), label=loaded.label, kind=loaded.kind, method=opts.method,
      random_weights=loaded.random_weights, result=result, numerics=numerics, seconds=times,
      params=loaded.params, precision=opts.precision,
      export=export,
      details={**details, "returned_input": result.returned_input,
               **{k: result.options[k] for k in ("checkpoints", "checkpoint", "measured_guard")
                  if k in result.options}},
      against=_against(str(opts.against), other, loaded, result, opts.seed) if other else None)
  if opts.write:
    with log.phase("writing"):
      write_outputs(report, loaded, out, picture=opts.picture, log=log)
  else:
    times["total"] = sum(times.values())
  return report


def _load(source: str | Loaded, opts: OptimizeOptions, log: Callable[[str], None]
          ) -> tuple[Loaded, Loaded | None]:
  """The model (loaded here, or as given), checked to fit in memory, and the `against` graph
  (None when not asked for), refused before any search when it takes other inputs."""
  loaded = source if isinstance(source, Loaded) else load_source(
      source, size=opts.size, input_shapes=opts.input_shapes, capacity=opts.capacity,
      seed=opts.seed, random_weights=opts.random_weights)
  checks.check_memory(loaded)
  log(f"loaded {loaded.label} ({loaded.kind}): {G.num_nodes(loaded.graph)} nodes, capacity "
      f"{G.capacity(loaded.graph)}" + (f"; {loaded.random_weights} initializers given random "
                                       "weights (the file has no weight data)"
                                       if loaded.random_weights else ""))
  for note in getattr(getattr(loaded.params, "stats", None), "notes", ()):  # ONNX import notes
    log(f"note: {note}")
  if opts.against is None:
    return loaded, None
  other = load_source(str(opts.against), input_shapes=opts.input_shapes, seed=opts.seed,
                      random_weights=opts.random_weights)
  mismatch = executor.input_mismatch(loaded.graph, other.graph)
  if mismatch:
    raise OptimizeError(f"--against {opts.against} takes other inputs than {loaded.label}: "
                        f"{mismatch}")
  log(f"loaded {opts.against} to time against: {G.num_nodes(other.graph)} nodes"
      + (f"; {other.random_weights} initializers given random weights" if other.random_weights
         else ""))
  return loaded, other


def _search(loaded: Loaded, opts: OptimizeOptions, log: Callable[[str], None]
            ) -> tuple[SearchResult, dict[str, Any]]:
  """The method's result under the modelled guard (with the prefixes the measured guard is to
  time) and the job's details of it."""
  coeffs = _coefficients(opts.cost_coefficients or "")
  log(f"searching with {opts.method}" + (f" (budget {opts.budget})" if opts.budget else "")
      + " ...")
  kernels = kernel_table_lib.shared() if opts.kernel_table else None
  checkpoints = opts.checkpoints if opts.measure and not opts.keep_slower else 0
  if opts.method == "ppo":
    found, details = methods.run_ppo(loaded, coeffs, budget=opts.budget, seed=opts.seed,
                                     rules=opts.rules, options=opts.search_options,
                                     kernels=kernels, checkpoints=checkpoints, log=log)
  else:
    search_options = dict(opts.search_options or {})
    if opts.budget is not None:
      search_options.setdefault(BUDGET_OPTION[opts.method], int(opts.budget))
    found, details = methods.run_search(loaded, opts.method, coeffs, seed=opts.seed,
                                        rules=opts.rules, options=search_options,
                                        kernels=kernels, checkpoints=checkpoints)
  if kernels is not None:
    details["cost_model"] = (
        f"measured kernel table ({len(kernels)} kernels known, "
        f"{kernels.measured} measured in this process; MatMuls timed "
        + ("a call at a time: each weight is read once)" if kernels.streamed
           else "in a hot loop: MatMuls share weights)"))
  else:
    details["cost_model"] = "roofline"
  return found, details


def _search_times(found: SearchResult, seconds: float) -> dict[str, float]:
  """The search's wall time split into {"search", "compile" (its first calls of each compiled
  shape), "kernels" (kernels measured or read from the profile cache)} where they were spent."""
  times = {"search": seconds}
  for key, option in (("compile", "compile_seconds"), ("kernels", "kernel_seconds")):
    spent = float(found.options.get(option, 0.0))
    if spent:
      times[key] = spent
      times["search"] -= spent
  return times


def _guard(loaded: Loaded, other: Loaded | None, found: SearchResult, opts: OptimizeOptions,
           log: Callable[[str], None]) -> tuple[SearchResult, NumericsCheck]:
  """The graph returned and its numerics check. With `opts.measure`, the measured guard
  (`search.guard.measured_guard`, the `against` graph timed in the same rounds), whose timed
  executables' outputs are the numerics check: every rewritten graph timed must compute what
  the input does. Without it, the numerics of the search's graph alone. NumericsError (nothing
  is written) when a check fails."""
  G.validate(found.best_graph, loaded.params)
  for c in found.checkpoints:
    G.validate(c.graph, loaded.params)
  if not opts.measure:
    numerics = check_numerics(loaded.graph, found.best_graph, loaded.params, seed=opts.seed,
                              tolerance=opts.tolerance, precision=opts.precision)
    _check(numerics)
    return found, numerics
  others = [(other.graph, other.params)] if other else []
  mine = (opts.target == "onnxruntime" and loaded.kind == "onnx"
          and onnx_io.stands_for(loaded.path, loaded.graph))
  result = measured_guard(found, loaded.params, others=others, keep_slower=opts.keep_slower,
                          reference_model=loaded.path if mine else None,
                          **opts.compare_options())
  cmp = result.comparison
  rewritten = [0] + list(range(1 + len(others), len(cmp.candidates)))
  _check(next((cmp.numerics[j] for j in rewritten if not cmp.numerics[j].passed),
              cmp.numerics[0]))
  decision = result.guard
  if decision is not None and decision.kept == "input":
    log(f"measured: the optimised graph is not significantly faster than the input "
        f"({decision.path_speedup.describe()}): the input is kept")
  elif decision is not None and "rejected_found_by" in result.options.get("checkpoint", {}):
    log(f"measured: the {result.method}'s graph ({decision.rewrites} rewrites) "
        f"{decision.speedup.describe()}, the {result.options['checkpoint']['rejected_found_by']}"
        f"'s ({decision.of} rewrites) {decision.path_speedup.describe()}: the faster (the "
        f"{result.method}'s) is returned")
  elif decision is not None and decision.kept == "checkpoint":
    log(f"measured: the first {decision.rewrites} of the {decision.of} rewrites "
        f"{decision.speedup.describe()}, all of them {decision.path_speedup.describe()}: the "
        "faster (the first) is returned")
  slot = kept_slot(result)
  return result, cmp.numerics[0 if slot is None else slot]


def _check_export(loaded: Loaded, result: SearchResult, opts: OptimizeOptions,
                  log: Callable[[str], None]) -> tuple[SearchResult, dict[str, Any]]:
  """What the user takes away is what was measured: the graph returned is written as ONNX and
  read back (`onnx_io.round_trip`). Under --target=onnxruntime the guard timed that export
  itself. Under XLA, when the file runs another graph than the one measured (a node the
  exporter cannot tag for the importer), the file's own graph is timed against the input in
  the same way (`measure.compare`, control copy), and unless it is measured significantly
  faster (or `keep_slower`), the input is returned instead. Either way the file read back runs
  on the input's random inputs and must compute what the input does (NumericsError, nothing
  written, otherwise). Returns (the result, report.json's `export`: "round_trip", its
  "differences", "file_numerics", the file's verdict where it was timed)."""
  info: dict[str, Any] = {"written": "the input file's graph" if result.returned_input
                          else "the optimised graph"}
  if result.returned_input:
    return result, info
  trip = onnx_io.round_trip(result.best_graph, loaded.params)
  info.update({"round_trip": "exact" if trip.exact else "differs",
               "round_trip_text": trip.describe(),
               "differences": {op: list(ab) for op, ab in trip.differences.items()}})
  if trip.exact or not opts.measure or opts.target == "onnxruntime":
    # The file read back, run against the input (under onnxruntime the guard's outputs were
    # this very export's already; XLA runs it here, as the user re-importing it would).
    numerics = check_numerics(loaded.graph, trip.graph, loaded.params, seed=opts.seed,
                              tolerance=opts.tolerance, precision=opts.precision,
                              candidate_params=trip.params)
    info["file_numerics"] = numerics.describe()
    _check(numerics)
    if not trip.exact:  # under onnxruntime, what the guard timed was this very export
      log(f"the written file {trip.describe()}"
          + (" (not measured: --nomeasure)" if not opts.measure else ""))
    return result, info
  log(f"the written file {trip.describe()}: timing the file's graph against the input ...")
  cmp = compare(loaded.graph, [trip.graph], loaded.params, candidate_params=[trip.params],
                **opts.compare_options())
  verdict = cmp.speedups[0]
  info.update({"file_measured": verdict, "file_latency_median_ms": cmp.candidates[0].median_ms,
               "input_latency_median_ms": cmp.reference.median_ms})
  info["file_numerics"] = cmp.numerics[0].describe()
  _check(cmp.numerics[0])
  if verdict.faster or opts.keep_slower:
    log(f"  the written file measured {verdict.describe()}")
    return dataclasses.replace(result, best_latency=cmp.candidates[0]), info
  log(f"  the written file measured {verdict.describe()}, not significantly faster than the "
      "input: the input is written and returned")
  info["written"] = "the input file's graph (the optimised graph's file was not faster)"
  kept = dataclasses.replace(
      result, best_graph=result.input_graph, rewrites=[], best_cost_ms=result.initial_cost_ms,
      best_latency=result.input_latency, returned_input=True,
      options={**result.options, "export_rejected": verdict.describe()})
  return kept, info


def _check(numerics: NumericsCheck) -> None:
  if not numerics.passed:
    raise NumericsError(f"the optimised graph's outputs differ from the original's: "
                        f"{numerics.describe()}; nothing was written")


def _against(path: str, other: Loaded, loaded: Loaded, result: SearchResult, seed: int
             ) -> dict[str, Any]:
  """`OptimizeReport.against` from the measured guard's comparison (candidate 1: `other`)."""
  cmp = result.comparison
  weightless = [f"{what} has no weight data" for what, n in
                (("the input", loaded.random_weights), (path, other.random_weights)) if n]
  return {
      "file": path, "nodes": G.num_nodes(other.graph), "random_weights": other.random_weights,
      "latency": cmp.candidates[1], "vs_input": cmp.speedups[1],
      "returned_vs_it": cmp.versus(kept_slot(result), 1, seed=seed),
      "numerics": None if weightless else cmp.numerics[1],
      "note": "; ".join(weightless) + (": different random weights, outputs not comparable"
                                       if weightless else "")}
