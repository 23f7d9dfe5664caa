"""The guard every search driver ends with: never return a graph that is not faster than the
input. The decision itself is `measure.guard.decide`'s; this module replays and costs the
prefixes it times and builds the SearchResult."""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Sequence

from xrlflow_jax.measure import compare
from xrlflow_jax.measure.guard import (DEFAULT_CHECKPOINTS, checkpoint_lengths,
                                       checkpoint_level, decide)
from xrlflow_jax.graph import host as graph_host
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.search.expand import Expander, improves, replay
from xrlflow_jax.search.result import RewriteStep, SearchResult


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """A prefix of a found path, timed beside the whole path by a measured guard.

  Attributes:
    rewrites: the prefix's length (steps of the path); graph: the graph it reaches (host
      arrays, the input's capacity); cost_ms: its modelled cost.
  """
  rewrites: int
  graph: layout.Graph
  cost_ms: float


def finish(method: str, input_graph: layout.Graph, best_graph: layout.Graph,
           rewrites: Sequence[RewriteStep], params: ParamStore, *, initial_cost: float,
           best_cost: float, measure: bool, started: float, graphs_expanded: int,
           candidates_costed: int, options: dict[str, Any] | None = None,
           measure_options: dict[str, Any] | None = None, expander: Expander | None = None,
           checkpoints: int = DEFAULT_CHECKPOINTS) -> SearchResult:
  """Applies the guard and builds the SearchResult.

  With measure=False the best graph is kept only if its modelled cost is below the input's;
  with measure=True it must also be measured significantly faster than the input
  (`measure.compare`: interleaved rounds with an identical copy as control, verdict
  "faster"). Otherwise the input is returned (`returned_input=True`, no rewrites;
  also when the search found nothing better: `found_rewrites` tells the two apart).
  With `expander` (the search's, to replay and cost prefixes), the measured guard also times
  up to `checkpoints` prefixes of the path (`checkpoint_lengths`, those modelled cheaper than
  the input) in the same rounds, and returns the fastest of them and the whole path among
  those measured significantly faster (`fastest_faster`; intervals at `checkpoint_level`);
  `options["checkpoints"]` records each prefix's verdict, `options["checkpoint"]` the one
  returned. The graph returned is validated against `params` (GraphValidationError if not).

  Args:
    input_graph, best_graph: graphs of one capacity N; rewrites: steps from input to best.
    initial_cost, best_cost: modelled costs in ms; started: `time.perf_counter()` at the start.
  """
  input_graph = layout.to_host(input_graph)
  best_graph = layout.to_host(best_graph)
  rewrites = list(rewrites)
  found_cost, found_rewrites = float(best_cost), len(rewrites)
  keep = bool(rewrites) and improves(best_cost, initial_cost)
  options = dict(options or {})
  lat_in = lat_best = verdict = None
  if expander is not None:
    expander.drain()  # a search leaves nothing compiling (nor beside the timing below)
  if measure:
    prefixes = []
    if keep:
      graph_host.validate(best_graph, params)
      if expander is not None:
        prefixes = checkpoint_prefixes(expander, input_graph, rewrites, initial_cost, checkpoints)
    cmp = compare(input_graph, ([best_graph] + [p.graph for p in prefixes]) if keep else [],
                  params, **(measure_options or {}), level=checkpoint_level(len(prefixes)))
    lat_in = cmp.reference
    if keep:
      decision = decide(cmp.speedups[0], len(rewrites), cmp.speedups[1:],
                        [p.rewrites for p in prefixes])
      if prefixes:
        options["checkpoints"] = [{"rewrites": p.rewrites, "cost_ms": p.cost_ms,
                                   "speedup": s.describe()}
                                  for p, s in zip(prefixes, decision.checkpoint_speedups)]
      if decision.kept == "checkpoint":
        p = prefixes[decision.index - 1]
        options["checkpoint"] = {"rewrites": p.rewrites, "of": len(rewrites),
                                 "rejected_speedup": decision.path_speedup.describe()}
        best_graph, best_cost, rewrites = p.graph, p.cost_ms, rewrites[:p.rewrites]
      keep = decision.kept != "input"
      # The verdict reported is the kept graph's, or the rejected path's.
      verdict = decision.speedup if keep else decision.path_speedup
      if keep:
        lat_best = cmp.candidates[decision.index]
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
      found_rewrites=found_rewrites, options=options)


def rewrite_families(ruleset: Any, rewrites: Sequence[RewriteStep]) -> list[str]:
  """The rule family of each step of a path of `rewrites` found with `ruleset`, in order."""
  families = {r.name: r.family for r in ruleset.rules}
  return [families[s.rule] for s in rewrites]


def family_counts(families: Sequence[str]) -> str:
  """"family count, ..." of a path's families, most frequent first (ties by name); "" for an
  empty path: what a report says made a graph."""
  counts = collections.Counter(families)
  return ", ".join(f"{f} {n}" for f, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def checkpoint_prefixes(expander: Expander, graph: layout.Graph,
                        rewrites: Sequence[RewriteStep], initial_cost: float,
                        count: int) -> list[Checkpoint]:
  """The `checkpoint_lengths` prefixes of `rewrites` (found on `graph` with `expander`'s
  rules), replayed and costed; only those modelled cheaper than the input."""
  out = []
  for k in checkpoint_lengths(rewrite_families(expander.ruleset, rewrites), count):
    g = replay(graph, expander, rewrites[:k])
    c = expander.cost(g)
    if improves(c, initial_cost):
      out.append(Checkpoint(k, g, float(c)))
  return out
