"""Beam search: keep the `beam_width` cheapest distinct graphs at every depth."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.search.expand import Expander, check_graph
from xrlflow_jax.search.progress import Progress
from xrlflow_jax.search.result import RewriteStep, SearchError, SearchResult


def beam(graph: layout.Graph, params: ParamStore, expander: Expander, *, beam_width: int = 8,
         steps: int = 20, measure: bool = False, seed: int = 0,
         measure_options: dict[str, Any] | None = None) -> SearchResult:
  """Beam search over rewrite sequences.

  At each of `steps` depths every beam graph is expanded (one `Expander.expand` call each); the
  children of all of them are ranked by modelled cost and the cheapest `beam_width` graphs not
  seen before (identity hash, `graph.identity`) form the next beam, whether or not they are cheaper than
  their parent (so a costly rewrite can lead somewhere). The cheapest graph ever seen is kept.

  Args:
    graph: the input graph (capacity N); params: its weights (guard and validation).
    expander: the compiled Expander.
    beam_width: graphs kept per depth; steps: depth (most rewrites).
    seed: unused (deterministic), kept for a common signature.
    measure, measure_options: the guard (see `guard.finish`).
  """
  del seed
  if beam_width < 1 or steps < 0:
    raise SearchError(f"beam_width must be >= 1 and steps >= 0, got {beam_width}, {steps}")
  started = time.perf_counter()
  g0 = check_graph(graph, expander.ruleset)
  ids0 = expander.identities(g0)
  first = expander.expand(g0, ids0)
  run = Progress("beam", expander, params, measure, measure_options, g0,
                 float(first[0].current), started)
  seen = {expander.graph_hash(g0, ids0)}
  frontier: list[tuple[float, Any, Any, tuple[RewriteStep, ...]]] = [(run.initial_cost, g0,
                                                                       ids0, ())]
  num_l = expander.max_locations
  for _ in range(steps):
    pool = []  # (cost, parent index, action)
    expansions = []
    for i, (_, g, ids, _) in enumerate(frontier):
      exp, children = first if run.expanded == 0 else expander.expand(g, ids)
      valid, costs = np.asarray(exp.valid), np.asarray(exp.cost)
      run.counted(valid)
      expansions.append((np.asarray(exp.nodes), children))
      pool.extend((float(costs[a]), i, int(a)) for a in np.flatnonzero(valid))
    pool.sort(key=lambda t: (t[0], t[1], t[2]))
    nxt: list[tuple[float, Any, Any, tuple[RewriteStep, ...]]] = []
    for c, i, a in pool:
      if len(nxt) >= beam_width:
        break
      r, loc = divmod(a, num_l)
      parent_steps = frontier[i][3]
      nodes_all, children = expansions[i]
      made = expander.new_child(children, a, nodes_all[r, loc], seen)
      if made is None:
        continue
      child = (c, made[0], made[1], parent_steps + (made[2],))
      nxt.append(child)
      run.offer(child[1], c, child[3])
    if not nxt:
      break
    frontier = nxt
  return run.finish(beam_width=beam_width, steps=steps)
