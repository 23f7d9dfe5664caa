"""The guard every driver ends with: never return a graph that is not faster than the input."""

from __future__ import annotations

import time
from typing import Any, Sequence

from xrlflow_jax.cost import latency
from xrlflow_jax.graph import host as graph_host
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.search.expand import improves
from xrlflow_jax.search.result import RewriteStep, SearchResult


def measure_pair(input_graph: layout.Graph, best_graph: layout.Graph, params: ParamStore, *,
                 rounds: int = 10, repeats_per_round: int = 3, warmup: int = 2,
                 backend: str | None = None, seed: int = 0
                 ) -> tuple[latency.LatencyStats, latency.LatencyStats]:
  """Latencies of the input and the best graph measured side by side.

  Both are compiled for one device with the same random inputs, then timed in `rounds`
  interleaved rounds (a fresh random order each round, `repeats_per_round` runs each), so load
  drift on the machine biases neither. Returns (input stats, best stats).
  """
  device = latency.resolve_device(backend)
  a = latency.compile_graph(input_graph, params, device=device, seed=seed, what="the input graph")
  b = latency.compile_graph(best_graph, params, device=device, seed=seed, what="the best graph")
  s_in, s_best = latency.measure_interleaved([a, b], rounds=rounds,
                                             repeats_per_round=repeats_per_round, warmup=warmup,
                                             seed=seed)
  return s_in, s_best


def finish(method: str, input_graph: layout.Graph, best_graph: layout.Graph,
           rewrites: Sequence[RewriteStep], params: ParamStore, *, initial_cost: float,
           best_cost: float, measure: bool, started: float, graphs_expanded: int,
           candidates_costed: int, options: dict[str, Any] | None = None,
           measure_options: dict[str, Any] | None = None) -> SearchResult:
  """Applies the guard and builds the SearchResult.

  With measure=False the best graph is kept only if its modelled cost is below the input's;
  with measure=True it must also have a lower median latency than the input, measured side by
  side (`measure_pair`). Otherwise the input is returned (`returned_input=True`, no rewrites;
  also when the search found nothing better: `found_rewrites` tells the two apart).
  The graph returned is validated against `params` (GraphValidationError if not).

  Args:
    input_graph, best_graph: graphs of one capacity N; rewrites: steps from input to best.
    initial_cost, best_cost: modelled costs in ms; started: `time.perf_counter()` at the start.
  """
  input_graph = layout.to_host(input_graph)
  best_graph = layout.to_host(best_graph)
  rewrites = list(rewrites)
  found_cost, found_rewrites = float(best_cost), len(rewrites)
  keep = bool(rewrites) and improves(best_cost, initial_cost)
  lat_in = lat_best = None
  if measure:
    if keep:
      graph_host.validate(best_graph, params)
      lat_in, lat_best = measure_pair(input_graph, best_graph, params, **(measure_options or {}))
      keep = lat_best.median_ms < lat_in.median_ms
    else:
      lat_in = _measure_one(input_graph, params, measure_options or {})
  if not keep:
    best_graph, rewrites, best_cost = input_graph, [], float(initial_cost)
    if lat_in is not None:
      lat_best = lat_in
  graph_host.validate(best_graph, params)
  return SearchResult(
      method=method, input_graph=input_graph, best_graph=best_graph, rewrites=rewrites,
      initial_cost_ms=float(initial_cost), best_cost_ms=float(best_cost), input_latency=lat_in,
      best_latency=lat_best, seconds=time.perf_counter() - started,
      graphs_expanded=int(graphs_expanded), candidates_costed=int(candidates_costed),
      returned_input=not keep, found_cost_ms=found_cost,
      found_rewrites=found_rewrites, options=dict(options or {}))


def _measure_one(graph: layout.Graph, params: ParamStore,
                 options: dict[str, Any]) -> latency.LatencyStats:
  """The input alone (nothing to compare it with), interleaving kept for equal statistics."""
  device = latency.resolve_device(options.get("backend"))
  seed = int(options.get("seed", 0))
  c = latency.compile_graph(graph, params, device=device, seed=seed, what="the input graph")
  (stats,) = latency.measure_interleaved([c], rounds=int(options.get("rounds", 10)),
                                         repeats_per_round=int(options.get(
                                             "repeats_per_round", 3)),
                                         warmup=int(options.get("warmup", 2)), seed=seed)
  return stats

