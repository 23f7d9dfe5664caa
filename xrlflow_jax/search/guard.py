"""The guard every driver ends with: never return a graph that is not faster than the input."""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Sequence

from xrlflow_jax.measure import LEVEL, Speedup, compare
from xrlflow_jax.graph import host as graph_host
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.search.expand import Expander, improves, replay
from xrlflow_jax.search.result import RewriteStep, SearchResult

# Prefixes of a found path timed beside it by a measured guard (`checkpoint_lengths`).
DEFAULT_CHECKPOINTS = 2


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


def checkpoint_lengths(families: Sequence[str], count: int) -> list[int]:
  """The last `count` prefix lengths of a path of rewrites at which the rule family changes
  (each step's family in order; 0 and the whole path excluded), ascending: a run of one
  family (converting convolutions to NHWC, merging a cell's gates) is one transformation, so
  its ends are where a path can be cut with its gains whole. The cost model can rate a late
  run a gain that XLA does not measure; a guard that times these prefixes beside the whole
  path need not then drop all of it."""
  ends = [i for i in range(1, len(families)) if families[i] != families[i - 1]]
  return ends[-count:] if count > 0 else []


def checkpoint_level(count: int) -> float:
  """The interval level of each verdict when the best of the whole path and `count` prefixes
  is chosen: 1 - (1 - LEVEL) / (1 + count) (Bonferroni), so choosing does not raise the
  false-positive rate."""
  return 1 - (1 - LEVEL) / (1 + count)


def fastest_faster(speedups: Sequence[Speedup]) -> int | None:
  """The index of the highest ratio among `speedups` measured significantly faster (the first
  on a tie: the whole path, listed first, over its prefixes), or None when none is."""
  best = None
  for i, s in enumerate(speedups):
    if s.faster and (best is None or s.ratio > speedups[best].ratio):
      best = i
  return best


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
      i = fastest_faster(cmp.speedups)
      if prefixes:
        options["checkpoints"] = [{"rewrites": p.rewrites, "cost_ms": p.cost_ms,
                                   "speedup": cmp.speedups[j + 1].describe()}
                                  for j, p in enumerate(prefixes)]
      if i:  # a prefix measured faster than the whole path
        p = prefixes[i - 1]
        options["checkpoint"] = {"rewrites": p.rewrites, "of": len(rewrites),
                                 "rejected_speedup": cmp.speedups[0].describe()}
        best_graph, best_cost, rewrites = p.graph, p.cost_ms, rewrites[:p.rewrites]
      lat_best, verdict = cmp.candidates[i or 0], cmp.speedups[i or 0]
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
