"""Greedy search: apply the best one-step improvement until none improves."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.search.progress import Progress
from xrlflow_jax.search.expand import Expander, check_graph, improves
from xrlflow_jax.search.result import RewriteStep, SearchError, SearchResult

def greedy(graph: layout.Graph, params: ParamStore, expander: Expander, *, max_steps: int = 100,
           measure: bool = False, seed: int = 0,
           measure_options: dict[str, Any] | None = None) -> SearchResult:
  """Hill climbing: each step costs every candidate (one `Expander.costs` call) and applies the
  cheapest, while it lowers the modelled cost, for at most `max_steps` steps.

  Args:
    graph: the input graph (capacity N); params: its weights (for the guard and validation).
    expander: the compiled Expander of the rule set and cost model.
    max_steps: most rewrites applied. seed: unused (deterministic), kept for a common signature.
    measure, measure_options: the guard (see `guard.finish`).
  """
  del seed
  if max_steps < 0:
    raise SearchError(f"max_steps must be >= 0, got {max_steps}")
  started = time.perf_counter()
  g0 = check_graph(graph, expander.ruleset)
  exp = expander.costs(g0)
  run = Progress("greedy", expander, params, measure, measure_options, g0,
                 float(exp.current), started)
  g, cost = g0, run.initial_cost
  steps: list[RewriteStep] = []
  num_l = expander.max_locations
  for step in range(max_steps):
    if step:
      exp = expander.costs(g)
    valid, costs = np.asarray(exp.valid), np.asarray(exp.cost)
    run.counted(valid)
    if not valid.any():
      break
    a = int(np.argmin(costs))
    if not improves(costs[a], cost):
      break
    r, loc = divmod(a, num_l)
    nodes = np.asarray(exp.nodes[r, loc])
    g2, ok = expander.apply_at(g, r, nodes)
    if not ok:  # costs says it applies; a mismatch is a bug, never silently skipped
      raise SearchError(f"rule {expander.ruleset.names[r]} at location {loc} was costed as "
                        "valid but did not apply")
    steps.append(expander.step(r, loc, nodes))
    g, cost = g2, float(costs[a])
    run.offer(g, cost, steps)
  return run.finish(max_steps=max_steps)
