"""TASO-style cost-based backtracking search (Jia et al., SOSP 2019, Algorithm 2)."""

from __future__ import annotations

import heapq
import itertools
import time
from typing import Any

import numpy as np

from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.search import guard
from xrlflow_jax.search.expand import Expander, check_graph, improves
from xrlflow_jax.search.result import RewriteStep, SearchError, SearchResult


def taso(graph: layout.Graph, params: ParamStore, expander: Expander, *, budget: int = 200,
         alpha: float = 1.05, max_children: int | None = None, max_queue: int = 10_000,
         measure: bool = False, seed: int = 0,
         measure_options: dict[str, Any] | None = None) -> SearchResult:
  """Backtracking search over a priority queue ordered by modelled cost.

  Pops the cheapest unexpanded graph, costs and builds all its candidates (`Expander.expand`),
  and pushes every candidate whose cost is below `alpha` x the best cost so far (so a rewrite
  that raises the cost a little can lead to a better graph later), skipping graphs already seen
  (identity hash, as TASO's: `graph.identity`).

  Args:
    graph: the input graph (capacity N); params: its weights (guard and validation).
    expander: the compiled Expander.
    budget: most graphs expanded (popped and costed).
    alpha: relaxation (TASO used 1.05; 1.0 never accepts a worse graph).
    max_children: push at most this many (the cheapest) candidates per expansion (None: all).
    max_queue: the queue keeps at most this many graphs (the cheapest).
    seed: unused (deterministic), kept for a common signature.
    measure, measure_options: the guard (see `guard.finish`).
  """
  del seed
  if budget < 1:
    raise SearchError(f"budget must be >= 1, got {budget}")
  if not alpha >= 1.0:
    raise SearchError(f"alpha must be >= 1.0, got {alpha}")
  if max_children is not None and max_children < 1:
    raise SearchError(f"max_children must be >= 1 or None, got {max_children}")
  started = time.perf_counter()
  g0 = check_graph(graph, expander.ruleset)
  ids0 = expander.identities(g0)
  first = expander.expand(g0, ids0)
  cost0 = float(first[0].current)
  tie = itertools.count()
  queue: list[tuple[float, int, Any, Any, tuple[RewriteStep, ...]]] = [
      (cost0, next(tie), g0, ids0, ())]
  seen = {expander.graph_hash(g0, ids0)}
  best_g, best_cost, best_steps = g0, cost0, ()
  expanded = costed = 0
  num_l = expander.max_locations
  while queue and expanded < budget:
    cost, _, g, ids, steps = heapq.heappop(queue)
    if cost > alpha * best_cost:
      continue  # pushed before the best improved: outside the window now (TASO drops these)
    exp, children = first if expanded == 0 else expander.expand(g, ids)
    valid, costs = np.asarray(exp.valid), np.asarray(exp.cost)
    expanded += 1
    costed += int(valid.sum())
    order = np.argsort(costs, kind="stable")
    order = order[valid[order] & (costs[order] < alpha * best_cost)]
    if max_children is not None:
      order = order[:max_children]
    nodes_all = np.asarray(exp.nodes)
    for a in order:
      c = float(costs[a])
      if not c < alpha * best_cost:
        break
      r, loc = divmod(int(a), num_l)
      child = expander.new_child(children, int(a), nodes_all[r, loc], seen)
      if child is None:
        continue
      g2, ids2, child_steps = child[0], child[1], steps + (child[2],)
      if improves(c, best_cost):
        best_g, best_cost, best_steps = g2, c, child_steps
      heapq.heappush(queue, (c, next(tie), g2, ids2, child_steps))
    if len(queue) > max_queue:
      queue = heapq.nsmallest(max_queue, queue)
      heapq.heapify(queue)
  return guard.finish("taso", g0, best_g, list(best_steps), params, initial_cost=cost0,
                      best_cost=best_cost, measure=measure, started=started,
                      graphs_expanded=expanded, candidates_costed=costed,
                      options={"budget": budget, "alpha": alpha, "max_children": max_children,
                               "max_queue": max_queue, "graphs_seen": len(seen)},
                      measure_options=measure_options)
