"""TASO-style cost-based backtracking search (Jia et al., SOSP 2019, Algorithm 2)."""

from __future__ import annotations

import collections
import heapq
import itertools
import time
from typing import Any, NamedTuple

import numpy as np

from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.search.expand import Children, Expander, Expansion, check_graph, improves
from xrlflow_jax.search.progress import Progress
from xrlflow_jax.search.result import RewriteStep, SearchError, SearchResult


class QueueEntry(NamedTuple):
  """A graph in the search's priority queue (ordered by the first three fields; `tie` is
  unique, so graphs are never compared).

  A pushed child stays unbuilt until popped (most pushed graphs are never expanded): `graph` is
  None, `ids` its parent's Children, `position` its place in them and `steps` its parent's (its
  own step is recorded when built). A built graph has its node identities in `ids`.
  """
  priority: float  # the cost it is queued at: its own, or a seed's best graph's
  turn: int  # its place among its expansion's candidates of one rule (0: the cheapest)
  tie: int  # push order
  cost: float  # its modelled cost
  graph: layout.Graph | None
  ids: Any  # np.ndarray identities, or the parent's Children
  position: int | None
  steps: tuple[RewriteStep, ...]


def taso(graph: layout.Graph, params: ParamStore, expander: Expander, *, budget: int = 200,
         alpha: float = 1.05, max_children: int | None = None, max_queue: int = 10_000,
         saturate: bool = True, measure: bool = False, seed: int = 0,
         measure_options: dict[str, Any] | None = None) -> SearchResult:
  """Backtracking search over a priority queue ordered by modelled cost.

  Pops the cheapest unexpanded graph, costs and builds all its candidates (`Expander.expand`),
  and pushes every candidate whose cost is below `alpha` x the best cost so far (so a rewrite
  that raises the cost a little can lead to a better graph later), skipping graphs already seen
  (identity hash, as TASO's: `graph.identity`).

  Graphs of one cost (a plateau) are popped one per rule and expansion in turn: an expansion's
  cheapest candidate of each rule (its turn 0) before any rule's second (turn 1), and so on;
  then first in, first out. Operand swaps (add_commute, mul_commute) and other neutral rewrites
  make plateaus of hundreds of graphs of one cost; in cost order alone ViT-B/16's search spent
  77 of its 200 expansions on add_commute after the MLP's narrowing and never took the neutral
  slice join that the attention's narrowing needs. (Grouping costs within 1e-5 of each other
  into one plateau gave the same graphs as exact ties on nine models, 2026-12-06.)

  It first descends greedily from the input: each expansion's cheapest candidate is expanded
  next while it lowers the cost (these expansions count in the budget), whatever is cheaper in
  the queue, so the search ends at least as low as greedy's descent where the budget allows.
  Without it a cheap seed (below) can hold the queue: on NasRNN the ten saturated gate merges
  (modelled 1.651 ms) kept the whole budget on graphs near them, and the search returned
  them while the 24 input-batching merges alone reach 1.491 ms and with the hidden-state gate
  merges 1.485 ms (measured 0.71 of the input's latency, the seed's graph 0.83).

  With `saturate`, the input's expansion also seeds the queue with one graph per "valley"
  rule: a rule that matches at two or more locations of the input but raises the modelled
  cost at each, applied at every location in turn (`Expander.saturate`); so does the expansion
  of every graph popped while it is the best so far, once the greedy descent (above) has
  ended (a path can open a valley: on NasRNN, merging the eight hidden-state gate MatMuls of
  every step pays only after the input MatMuls are batched across steps; together 0.71 of
  the input's latency, the batching alone no measured change). Such a seed is queued at the
  cost of the graph it came from, behind that graph's first candidate of each rule:
  queued at its own lower cost it would be taken before a neutral step that does better (on
  `tests/test_narrowing.py`'s class-token head, moving a slice up both branches of a GELU at
  once, where joining the two equal slices first computes the MLP's first MatMul once; the
  window would then drop the join). Some rewrites pay
  only once made everywhere (merging an RNN cell's gate MatMuls adds a concatenated weight
  that the other steps do not share until they are merged too: on NasRNN one such merge
  measures slower than the input and all ten faster), a valley deeper than `alpha` lets a
  one-step search cross. Each seed is then cleaned of the equal sub-expressions the rule
  made at every location (the rule set's `dedupe` rules applied everywhere: every step's
  merge concatenates the same weights, and only one shared Concat lets the merged MatMuls be
  batched across steps). The seeds cost one match and one edit per application.

  Args:
    graph: the input graph (capacity N); params: its weights (guard and validation).
    expander: the compiled Expander.
    budget: most graphs expanded (popped and costed).
    alpha: relaxation (TASO used 1.05; 1.0 never accepts a worse graph).
    max_children: push at most this many (the cheapest) candidates per expansion (None: all).
    max_queue: the queue keeps at most this many graphs (the cheapest).
    saturate: seed the queue with the valley rules of the input and of each best graph
      applied everywhere (above). The report's `seeds` names each ("after k: " for a seed
      made k rewrites in).
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
  run = Progress("taso", expander, params, measure, measure_options, g0, cost0, started)
  tie = itertools.count()
  queue: list[QueueEntry] = []
  seen = {expander.graph_hash(g0, ids0)}
  best_cost = cost0
  # The descent starts at the input.
  best_entry = dive = QueueEntry(cost0, 0, next(tie), cost0, g0, ids0, None, ())
  seeded: list[str] = []
  seed_seconds = 0.0

  def push_seeds(g, ids, exp, steps, at: float | None = None) -> None:
    """Pushes g's valley seeds (reached by `steps`) that are new and inside the window, queued
    at their own cost, or at cost `at`."""
    nonlocal best_cost, best_entry, seed_seconds
    t = time.perf_counter()
    for c, sg, sids, more in _valley_seeds(expander, g, ids, exp):
      h = expander.graph_hash(sg, sids)
      if h in seen or not c < alpha * best_cost:
        continue
      seen.add(h)
      made = collections.Counter(step.rule for step in more)
      seeded.append((f"after {len(steps)}: " if steps else "")
                    + ", ".join(f"{rule} x{k}" for rule, k in made.items()))
      child = QueueEntry(c if at is None else at, 0, next(tie), c, sg, sids, None,
                         steps + more)
      if improves(c, best_cost):
        best_cost, best_entry = c, child
      heapq.heappush(queue, child)
    seed_seconds += time.perf_counter() - t

  if saturate:
    push_seeds(g0, ids0, first[0], ())
  while (queue or dive is not None) and run.expanded < budget:
    diving = dive is not None
    entry, dive = (dive, None) if diving else (heapq.heappop(queue), None)
    cost, g, ids, i, steps = entry.cost, entry.graph, entry.ids, entry.position, entry.steps
    if not diving and cost > alpha * best_cost:
      continue  # pushed before the best improved: outside the window now (TASO drops these)
    if g is None:
      g, ids, steps = _build(expander, ids, i, steps)
    exp, children = first if g is g0 else expander.expand(g, ids)
    valid, costs = np.asarray(exp.valid), np.asarray(exp.cost)
    run.counted(valid)
    order = np.argsort(costs, kind="stable")
    order = order[valid[order]]
    if diving and order.size and improves(float(costs[order[0]]), cost):
      j = children.fresh(int(order[0]), seen)  # the descent goes on (a seen one ends it)
      if j is not None:
        c = float(costs[order[0]])
        dive = QueueEntry(c, 0, next(tie), c, None, children, j, steps)
        if improves(c, best_cost):
          best_cost, best_entry = c, dive
    reseed = saturate and g is not g0 and entry is best_entry and dive is None
    order = order[costs[order] < alpha * best_cost]
    if max_children is not None:
      order = order[:max_children]
    turns: collections.Counter = collections.Counter()
    fresh = []  # (the candidate's turn among its rule's, position, cost, bucket position)
    for a in order.tolist():
      c = float(costs[a])
      j = children.fresh(a, seen)
      if j is not None:
        r = a // expander.max_locations
        fresh.append((turns[r], len(fresh), c, j))
        turns[r] += 1
    for turn, _, c, j in sorted(fresh):
      child = QueueEntry(c, turn, next(tie), c, None, children, j, steps)
      if improves(c, best_cost):
        best_cost, best_entry = c, child
      heapq.heappush(queue, child)
    if reseed:  # a valley the path to the best opened (or left), queued behind g's
      push_seeds(g, ids, exp, steps, at=cost)  # first candidates of each rule (a join first)
    if len(queue) > max_queue:
      queue = _cheapest(queue, max_queue)
  best_g, best_steps = best_entry.graph, best_entry.steps
  if best_g is None:
    best_g, _, best_steps = _build(expander, best_entry.ids, best_entry.position, best_steps)
  run.offer(best_g, best_cost, best_steps)
  return run.finish(budget=budget, alpha=alpha, max_children=max_children, max_queue=max_queue,
                    graphs_seen=len(seen), saturate=saturate, seeds=seeded,
                    seed_seconds=round(seed_seconds, 3))


def _valley_seeds(expander: Expander, g0: layout.Graph, ids0: np.ndarray, exp: Expansion
                  ) -> list[tuple[float, layout.Graph, np.ndarray, tuple[RewriteStep, ...]]]:
  """(cost, graph, identities, steps) for each rule that matches `g0` at >= 2 locations and
  raises its cost at every one (`exp`, g0's expansion), applied at every location in turn
  (at most as many times as it matched)."""
  current = float(exp.current)
  valid = np.asarray(exp.valid).reshape(expander.num_rules, expander.max_locations)
  costs = np.asarray(exp.cost).reshape(valid.shape)
  cleanup = [i for i, rule in enumerate(expander.ruleset.rules) if rule.family == "dedupe"]
  seeds = []
  for r in range(expander.num_rules):
    count = int(valid[r].sum())
    if count < 2 or not improves(current, float(costs[r][valid[r]].min())):
      continue
    g, ids, steps = expander.saturate(g0, ids0, r, max_steps=count)
    if len(steps) < 2:
      continue
    more = True
    while more:  # sub-expressions the rule built equal at every location, made one (to a
      more = False  # fixed point: two Concats become equal once their inputs are made one)
      for d in cleanup:
        g, ids, done = expander.saturate(g, ids, d, max_steps=layout.capacity(g))
        steps, more = steps + done, more or bool(done)
    seeds.append((expander.cost(g), g, ids, steps))
  return seeds


def _build(expander: Expander, children: Children, i: int, steps: tuple[RewriteStep, ...]
           ) -> tuple[layout.Graph, np.ndarray, tuple[RewriteStep, ...]]:
  """(graph, its node identities, its steps) of candidate `i` of an expansion whose graph
  was reached by `steps`."""
  r, loc = divmod(int(children.actions[i]), children.num_locations)
  return (*children.child(i), steps + (expander.step(r, loc, children.nodes[i]),))


def _cheapest(queue: list[QueueEntry], k: int) -> list[QueueEntry]:
  """The k smallest entries of a heap of QueueEntries, as a heap: the same entries as
  `heapq.nsmallest(k, queue)`, selected with numpy."""
  costs = np.fromiter((e.priority for e in queue), np.float64, len(queue))
  turns = np.fromiter((e.turn for e in queue), np.int64, len(queue))
  ties = np.fromiter((e.tie for e in queue), np.int64, len(queue))
  keep = np.lexsort((ties, turns, costs))[:k]
  return [queue[i] for i in keep.tolist()]  # sorted ascending: already a heap
