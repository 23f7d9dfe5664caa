"""Random search: random valid rollouts, keeping the cheapest graph seen."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.search.expand import Expander, check_graph, improves
from xrlflow_jax.search.progress import Progress
from xrlflow_jax.search.result import SearchError, SearchResult


def random_search(graph: layout.Graph, params: ParamStore, expander: Expander, *,
                  num_rollouts: int = 16, steps: int = 20, measure: bool = False, seed: int = 0,
                  measure_options: dict[str, Any] | None = None) -> SearchResult:
  """`num_rollouts` rollouts of up to `steps` uniformly random valid rewrites from the input.

  Each step costs every candidate (`Expander.costs`, which also says which apply), draws a rule
  uniformly among those with a valid location and then a location, and applies it. The
  cheapest graph reached is kept. A baseline for the policy: the same action space without
  learning.

  Args:
    graph: the input graph (capacity N); params: its weights (guard and validation).
    expander: the compiled Expander.
    num_rollouts: independent rollouts; steps: rewrites per rollout (fewer if none applies).
    seed: seeds numpy's generator (same seed, same result).
    measure, measure_options: the guard (see `guard.finish`).
  """
  if num_rollouts < 1 or steps < 0:
    raise SearchError(f"num_rollouts must be >= 1 and steps >= 0, got {num_rollouts}, {steps}")
  started = time.perf_counter()
  rng = np.random.default_rng(seed)
  g0 = check_graph(graph, expander.ruleset)
  first = expander.costs(g0)
  run = Progress("random", expander, params, measure, measure_options, g0,
                 float(first.current), started)
  num_l = expander.max_locations
  for _ in range(num_rollouts):
    g, trail, exp = g0, [], first
    for t in range(steps):
      if t:
        exp = expander.costs(g)
      valid = np.asarray(exp.valid).reshape(-1, num_l)
      run.counted(valid)
      if not valid.any():
        break
      r = int(rng.choice(np.flatnonzero(valid.any(axis=1))))
      loc = int(rng.choice(np.flatnonzero(valid[r])))
      nodes = np.asarray(exp.nodes[r, loc])
      g2, ok = expander.apply_at(g, r, nodes)
      if not ok:
        raise SearchError(f"rule {expander.ruleset.names[r]} at location {loc} was costed as "
                          "valid but did not apply")
      g = g2
      trail.append(expander.step(r, loc, nodes))
      c = float(np.asarray(exp.cost)[r * num_l + loc])
      if improves(c, run.best_cost):
        run.offer(layout.to_host(g), c, trail)
  return run.finish(num_rollouts=num_rollouts, steps=steps, seed=seed)
