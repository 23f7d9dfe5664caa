"""The guard every driver ends with: never return a graph that is not faster than the input."""

from __future__ import annotations

import time
from typing import Any, Sequence

from xrlflow_jax.measure import compare
from xrlflow_jax.graph import host as graph_host
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.search.expand import improves
from xrlflow_jax.search.result import RewriteStep, SearchResult


def finish(method: str, input_graph: layout.Graph, best_graph: layout.Graph,
           rewrites: Sequence[RewriteStep], params: ParamStore, *, initial_cost: float,
           best_cost: float, measure: bool, started: float, graphs_expanded: int,
           candidates_costed: int, options: dict[str, Any] | None = None,
           measure_options: dict[str, Any] | None = None) -> SearchResult:
  """Applies the guard and builds the SearchResult.

  With measure=False the best graph is kept only if its modelled cost is below the input's;
  with measure=True it must also be measured significantly faster than the input
  (`measure.compare`: interleaved rounds with an identical copy as control, verdict
  "faster"). Otherwise the input is returned (`returned_input=True`, no rewrites;
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
  lat_in = lat_best = verdict = None
  if measure:
    if keep:
      graph_host.validate(best_graph, params)
    cmp = compare(input_graph, [best_graph] if keep else [], params,
                   **(measure_options or {}))
    lat_in = cmp.reference
    if keep:
      lat_best, verdict = cmp.candidates[0], cmp.speedups[0]
      keep = verdict.keeps
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
      returned_input=not keep, found_cost_ms=found_cost, measured=verdict,
      found_rewrites=found_rewrites, options=dict(options or {}))
