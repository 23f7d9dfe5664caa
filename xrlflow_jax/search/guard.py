"""The guards every search ends with: never return a graph that is not faster than the input.

`finish` applies the modelled guard (a path is kept only when modelled cheaper) and, with
measure=True, `measured_guard`: the one place a measured verdict (`measure.guard.decide`)
turns into the graph returned. The optimise job calls `measured_guard` on a search's result
itself, to time its other graphs in the same rounds.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Sequence

from xrlflow_jax.graph import host as graph_host
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.measure import compare
from xrlflow_jax.measure.guard import (DEFAULT_CHECKPOINTS, checkpoint_lengths,
                                       checkpoint_level, decide)
from xrlflow_jax.search.expand import Expander, improves, replay
from xrlflow_jax.search.result import Checkpoint, RewriteStep, SearchResult


def finish(method: str, input_graph: layout.Graph, best_graph: layout.Graph,
           rewrites: Sequence[RewriteStep], params: ParamStore, *, initial_cost: float,
           best_cost: float, measure: bool, started: float, graphs_expanded: int,
           candidates_costed: int, options: dict[str, Any] | None = None,
           measure_options: dict[str, Any] | None = None, expander: Expander | None = None,
           checkpoints: int = DEFAULT_CHECKPOINTS) -> SearchResult:
  """Applies the guards and builds the SearchResult.

  The best graph is kept only if its modelled cost is below the input's; with measure=True it
  must also pass `measured_guard` (timed beside the input and an identical copy, with up to
  `checkpoints` prefixes of its path when `expander`, the search's, can replay and cost
  them). Otherwise the input is returned (`returned_input=True`, no rewrites; also when the
  search found nothing better: `found_rewrites` tells the two apart). The graph returned is
  validated against `params` (GraphValidationError if not).

  Args:
    input_graph, best_graph: graphs of one capacity N; rewrites: steps from input to best.
    initial_cost, best_cost: modelled costs in ms; started: `time.perf_counter()` at the start.
    measure_options: keyword options of `measure.compare`.
  """
  input_graph = layout.to_host(input_graph)
  best_graph = layout.to_host(best_graph)
  rewrites = list(rewrites)
  keep = bool(rewrites) and improves(best_cost, initial_cost)
  if expander is not None:
    expander.drain()  # a search leaves nothing compiling (nor beside the timing below)
  if keep:
    graph_host.validate(best_graph, params)
  result = SearchResult(
      method=method, input_graph=input_graph, best_graph=best_graph if keep else input_graph,
      rewrites=rewrites if keep else [], initial_cost_ms=float(initial_cost),
      best_cost_ms=float(best_cost if keep else initial_cost),
      graphs_expanded=int(graphs_expanded), candidates_costed=int(candidates_costed),
      returned_input=not keep, found_cost_ms=float(best_cost), found_rewrites=len(rewrites),
      options=dict(options or {}))
  if measure:
    if keep and expander is not None:
      result.checkpoints = checkpoint_prefixes(expander, input_graph, rewrites,
                                               float(initial_cost), checkpoints)
    result = measured_guard(result, params, **(measure_options or {}))
  graph_host.validate(result.best_graph, params)
  result.seconds = time.perf_counter() - started
  return result


def measured_guard(found: SearchResult, params: ParamStore, *,
                   others: Sequence[tuple[layout.Graph, ParamStore | None]] = (),
                   keep_slower: bool = False, **compare_options: Any) -> SearchResult:
  """The measured guard on a search's result: what it returns is what was timed faster.

  `measure.compare` times the input against [the found graph, *others, *found.checkpoints]
  (interleaved rounds, an identical copy of the input as control, every verdict at
  `checkpoint_level(len(found.checkpoints))`), and `measure.guard.decide` keeps the fastest
  of the whole path and its prefixes among those measured significantly faster (the whole
  path on a tie, or when it is the input unchanged), else the input.

  Args:
    found: a result of the modelled guard (`finish` with measure=False, or the optimise job's
      choice among training's and the policy's graphs); its `checkpoints` are the other graphs
      timed (prefixes of its path, or another driver's path: `Checkpoint.path`; dropped when
      the input was returned).
    params: the input's weights.
    others: graphs timed in the same rounds but never returned (another optimiser's output),
      each with its own weights (None: `params`); candidates 1..len(others) of the comparison.
    keep_slower: time everything, but keep the whole path whatever it measured (no decision:
      `guard` None, no prefixes timed).
    **compare_options: `measure.compare`'s (rounds, looks, repeats_per_round, min_round_ms,
      seed, tolerance, precision, ...).
  Returns:
    `found` with the graph kept, its rewrites, modelled cost and latency, `input_latency`,
    `measured` (the kept graph's verdict, or the rejected path's), `guard` (the decision; None
    when the input came in unchanged, then nothing is decided), `comparison`, and in
    `options`: "checkpoints" (each prefix's figures), "checkpoint" (the prefix returned) or
    "measured_guard" (the path rejected).
  """
  prefixes = [] if found.returned_input or keep_slower else list(found.checkpoints)
  cmp = compare(found.input_graph,
                [found.best_graph, *(g for g, _ in others), *(p.graph for p in prefixes)],
                params, candidate_params=[None, *(p for _, p in others), *[None] * len(prefixes)],
                level=checkpoint_level(len(prefixes)), **compare_options)
  out = dataclasses.replace(found, options=dict(found.options), checkpoints=prefixes,
                            input_latency=cmp.reference, best_latency=cmp.candidates[0],
                            measured=None if found.returned_input else cmp.speedups[0],
                            comparison=cmp)
  if keep_slower or found.returned_input:
    return out
  first = 1 + len(others)
  decision = decide(cmp.speedups[0], len(found.rewrites), cmp.speedups[first:],
                    [p.rewrites for p in prefixes])
  out.guard = decision
  out.measured = decision.speedup if decision.kept != "input" else decision.path_speedup
  if prefixes:
    out.options["checkpoints"] = [
        {"rewrites": p.rewrites, "cost_ms": p.cost_ms,
         "latency_median_ms": cmp.candidates[first + i].median_ms, "speedup": s.describe()}
        for i, (p, s) in enumerate(zip(prefixes, decision.checkpoint_speedups))]
  if decision.kept == "checkpoint":
    p = prefixes[decision.index - 1]
    out.options["checkpoint"] = {"rewrites": p.rewrites, "of": len(found.rewrites),
                                 "rejected_speedup": decision.path_speedup.describe()}
    if p.path is not None:  # another path: its finder's graph, not a prefix of this one
      out.method = p.found_by or found.method
      out.options["checkpoint"].update(found_by=out.method, rejected_found_by=found.method)
    out.best_graph, out.best_cost_ms, out.rewrites = p.graph, p.cost_ms, p.steps(found.rewrites)
    out.best_latency = cmp.candidates[first + decision.index - 1]
  elif decision.kept == "input":
    rejected = cmp.candidates[0]
    out.options["measured_guard"] = {
        "rejected_found_by": found.method, "rejected_cost_ms": found.best_cost_ms,
        "rejected_rewrites": len(found.rewrites),
        "rejected_latency_median_ms": rejected.median_ms,
        "rejected_latency_iqr_ms": rejected.iqr_ms,
        "input_latency_median_ms": cmp.reference.median_ms,
        "rejected_speedup": decision.path_speedup.describe(),
        "rejected_verdict": decision.path_speedup.to_json()}
    out.best_graph, out.best_cost_ms, out.rewrites = (found.input_graph, found.initial_cost_ms,
                                                      [])
    out.best_latency, out.returned_input = cmp.reference, True
  return out


def kept_slot(result: SearchResult) -> int | None:
  """The comparison's candidate index of the graph `result` returns (None: the input)."""
  if result.returned_input:
    return None
  if result.guard is None or result.guard.kept == "path":
    return 0
  return len(result.comparison.candidates) - len(result.checkpoints) + result.guard.index - 1


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
