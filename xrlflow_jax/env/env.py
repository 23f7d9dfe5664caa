"""The graph-rewrite MDP as pure functions, in Jumanji's shape: `reset(key)`, `step(state, action)`.

An action is a flat index `rule * L + location` into the RuleSet's locations, or the stop action
`R * L`. The reward is `scale * (C_{t-1} - C_t) / C_0` under the in-graph cost model. Episodes end
on the stop action or when no rule matches (termination, discount 0), or at the horizon
(truncation, discount 1 so learners bootstrap). A masked action, if forced, changes nothing and
is flagged in `extras["invalid_action"]`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from xrlflow_jax.cost.incremental import bound_kernels
from xrlflow_jax.errors import XrlflowError
from xrlflow_jax.graph import layout, transforms
from xrlflow_jax.rules.ruleset import (RuleSet, RuleSetMatch, firing_rules, graph_op_counts,
                                       op_count_bounds)
from xrlflow_jax.env.types import (ArraySpec, DiscreteSpec, Observation, ObservationSpec, State,
                                   StepType, TimeStep)

CostFn = Callable[[layout.Graph], jax.Array]  # graph -> float32[] (jittable)
NodeCostFn = Callable[[layout.Graph], jax.Array]  # graph -> float32[N] (jittable)


def removed_cost(ruleset: RuleSet, costs: jax.Array, nodes: jax.Array) -> jax.Array:
  """Sum of the node costs (float32[N]) of the source ops each candidate removes: float32[R, L].

  `nodes`: int32[R, L, P], the candidates' bound nodes (`RuleSetMatch.nodes`; -1 where unbound).
  """
  out = []
  for r, c in enumerate(ruleset.compiled):
    cols = [c.num_vars + j for j, s in enumerate(c.rule.src) if not s.keep]
    ids = nodes[r][:, cols]  # [L, removed]
    out.append(jnp.where(ids >= 0, costs[jnp.maximum(ids, 0)], 0.0).sum(-1))
  return jnp.stack(out).astype(jnp.float32)


def offered_candidates(mask: jax.Array, slots: int) -> jax.Array:
  """bool[R, L]: the first `slots` valid candidates of mask bool[R, L] in action order (0: all),
  the ones a compacted build of `slots` slots covers (`RuleSet.candidates`)."""
  if not slots:
    return mask
  flat = mask.reshape(-1)
  return (flat & (jnp.cumsum(flat.astype(jnp.int32)) <= slots)).reshape(mask.shape)


def observe(ruleset: RuleSet, graph: layout.Graph, mask: jax.Array, nodes: jax.Array,
            step_count: jax.Array, *, node_cost_fn: NodeCostFn | None = None,
            delta: jax.Array | None = None) -> Observation:
  """The agent's observation of `graph`: the one builder, used by the environment and by the
  policy search driver (`search.policy`), so a policy sees at inference what it was trained on.

  Args:
    mask: bool[R, L] valid candidates; nodes: int32[R, L, P] their bound nodes.
    step_count: int32[] steps taken in the episode.
    node_cost_fn: graph -> float32[N]; when given, the observation carries the node costs and
      each candidate's `candidate_removed_cost` (else zeros and None).
    delta: float32[R, L] each candidate's exact cost change (0 where invalid), or None for zeros.
  Jittable. The action mask is bool[R * L + 1], its last entry the stop action.
  """
  r, l = mask.shape
  action_mask = jnp.concatenate([mask.reshape(-1), jnp.ones([1], bool)])
  costs = None
  removed = jnp.zeros([r, l], jnp.float32)
  if node_cost_fn is not None:
    costs = jnp.asarray(node_cost_fn(graph), jnp.float32)
    removed = removed_cost(ruleset, costs, nodes)
  delta = jnp.zeros([r, l], jnp.float32) if delta is None else delta.astype(jnp.float32)
  return Observation(graph=graph, action_mask=action_mask, candidate_nodes=nodes,
                     candidate_removed_cost=removed, candidate_delta=delta,
                     step_count=jnp.asarray(step_count, jnp.int32), node_costs=costs)


class EnvError(XrlflowError):
  """An environment built from graphs that cannot share a batch, or a bad configuration."""


def stack_graphs(graphs: Sequence[layout.Graph]) -> layout.Graph:
  """A pool: graphs of one capacity stacked on a leading axis (EnvError names a mismatch)."""
  if not graphs:
    raise EnvError("the graph pool is empty")
  caps = [(layout.capacity(g), layout.max_inputs(g)) for g in graphs]
  if len(set(caps)) > 1:
    raise EnvError(f"pool graphs must share capacity and input slots; got (N, K) = {caps}; "
                   "build them with one capacity")
  return jax.tree_util.tree_map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *graphs)


class GraphRewriteEnv:
  """A pure, jittable graph-rewrite environment over a pool of graphs of one capacity.

  Every graph it holds is pruned: the pool's nodes from which no output is reachable are freed
  at construction (`graph.remove_dead_code`), and a rewrite frees every node it leaves unread,
  so each alive node other than a graph input or output has an alive consumer and cost
  functions may skip the reachability pass (`cost.graph_cost(..., pruned=True)`). Rules that
  cannot fire on any graph reachable from the pool (`rules.firing_rules` of its op codes) are
  not matched: they keep their actions, always masked; and a rule examines only as many nodes
  of its root op as an episode's graphs can hold (`rules.op_count_bounds` over the horizon).
  Both find exactly what matching every rule would.

  Args:
    graphs: the pool (a list of graphs, or an already stacked pool); `reset` draws one.
    ruleset: the rewrite rules; the action space is `ruleset.num_actions + 1`.
    cost_fn: graph -> modelled cost (float32[], jittable), e.g. `cost.ModelCost(coeffs)` (the
      cost model on pruned graphs; with it the exact candidate delta costs the candidates
      incrementally from the current graph, `ModelCost.candidate_costs`) or any function; one
      with a `candidate_costs(parent, children) -> float32[C]` method costs candidates by it.
    horizon: steps before truncation.
    reward_scale: multiplies the reward (X-RLflow used 100).
    node_cost_fn: graph -> float32[N] per-node costs; enables `candidate_removed_cost`.
    exact_candidate_delta: also build the valid candidates and report each one's exact cost
      change (`RuleSet.candidates`: only valid candidates are built, compacted into
      `max_candidates` slots).
    max_candidates: slots of that build (0: R * L, every candidate). Valid candidates past the
      cap are not offered: they are masked out of the observation's action mask (as the
      `candidates` policy head does), so every offered action has its exact delta.
  """

  def __init__(self, graphs: Sequence[layout.Graph] | layout.Graph, ruleset: RuleSet,
               cost_fn: CostFn, horizon: int, *, reward_scale: float = 1.0,
               node_cost_fn: NodeCostFn | None = None, exact_candidate_delta: bool = False,
               max_candidates: int = 0):
    if isinstance(graphs, layout.Graph):
      pool = graphs if np.ndim(graphs.nodes["op"]) == 2 else stack_graphs([graphs])
    else:
      pool = stack_graphs(list(graphs))
    if horizon < 1:
      raise EnvError(f"horizon must be >= 1, got {horizon}")
    if max_candidates < 0:
      raise EnvError(f"max_candidates must be >= 0 (0: every candidate), got {max_candidates}")
    with jax.ensure_compile_time_eval():
      pool = jax.jit(jax.vmap(transforms.remove_dead_code))(pool)
    self.pool = pool
    self.pool_size = int(pool.nodes["op"].shape[0])
    self.ruleset = ruleset
    counts = graph_op_counts([pool])
    firing = firing_rules(ruleset.rules, counts)
    self.firing_rules = None if len(firing) == len(ruleset) else firing
    # An episode applies at most `horizon` rewrites (stepping on past a LAST step without a
    # reset may outgrow these; the match then counts what it skipped in `anchors_dropped`).
    self.anchor_caps = op_count_bounds([ruleset.rules[i] for i in sorted(firing)], counts,
                                       int(horizon))
    self.cost_fn = cost_fn
    self.node_cost_fn = node_cost_fn
    self.horizon = int(horizon)
    self.reward_scale = float(reward_scale)
    self.exact_candidate_delta = exact_candidate_delta
    self.max_candidates = int(max_candidates)
    self.num_slots = int(pool.nodes["op"].shape[1])
    self.max_inputs = int(pool.senders.shape[1]) // self.num_slots
    self._initial: tuple | None = None

  def __fingerprint__(self) -> tuple:
    """`trace_cache.fingerprint`: everything but the cache of initial states (derived)."""
    return (self.pool, self.ruleset, self.cost_fn, self.node_cost_fn, self.horizon,
            self.reward_scale, self.exact_candidate_delta, self.max_candidates)

  # ------------------------------------------------------------------ specs
  @property
  def num_actions(self) -> int:
    return self.ruleset.num_actions + 1

  @property
  def stop_action(self) -> int:
    return self.ruleset.num_actions

  def action_spec(self) -> DiscreteSpec:
    return DiscreteSpec((), jnp.int32, "action", self.num_actions)

  def observation_spec(self) -> ObservationSpec:
    r, l, p = len(self.ruleset), self.ruleset.max_locations, self.ruleset.num_bound
    return ObservationSpec(
        self.num_slots, self.max_inputs,
        ArraySpec((self.num_actions,), jnp.bool_, "action_mask"),
        ArraySpec((r, l, p), jnp.int32, "candidate_nodes"),
        ArraySpec((r, l), jnp.float32, "candidate_removed_cost"),
        ArraySpec((r, l), jnp.float32, "candidate_delta"),
        ArraySpec((self.num_slots,), jnp.float32, "node_costs")
        if self.node_cost_fn is not None else None)

  # ------------------------------------------------------------------ dynamics
  def _match(self, graph: layout.Graph) -> RuleSetMatch:
    """The rules' match of `graph`, its mask limited to the offered candidates (with an exact
    delta over `max_candidates` slots, the valid candidates past the cap are not actions)."""
    match = self.ruleset.match(graph, only=self.firing_rules, anchor_caps=self.anchor_caps)
    if self.exact_candidate_delta and self.max_candidates:
      match = match.replace(mask=offered_candidates(match.mask, self.max_candidates))
    return match

  def _observe(self, graph, match, cost, step_count) -> Observation:
    delta = None
    if self.exact_candidate_delta:
      delta = self._candidate_delta(graph, match.nodes, match.mask, cost)
    return observe(self.ruleset, graph, match.mask, match.nodes, step_count,
                   node_cost_fn=self.node_cost_fn, delta=delta)

  def _candidate_delta(self, graph, nodes, mask, cost) -> jax.Array:
    """Exact modelled cost change of the candidates of mask bool[R, L]: float32[R, L] (0
    elsewhere), from the compacted build of `RuleSet.candidates`."""
    r, l = mask.shape
    graphs, index, ok = self.ruleset.candidates(graph, nodes, mask, self.max_candidates or None)
    candidate_costs = getattr(self.cost_fn, "candidate_costs", None)  # e.g. cost.ModelCost
    if candidate_costs is not None:  # costs a parent's children at once (incrementally)
      new = candidate_costs(graph, graphs).astype(jnp.float32)
    else:
      new = jax.vmap(self.cost_fn)(graphs).astype(jnp.float32)
    target = jnp.where(ok, index, r * l)  # slots without a built candidate scatter nowhere
    flat = jnp.zeros([r * l], jnp.float32).at[target].set(new - cost, mode="drop")
    return flat.reshape(r, l)

  def _first(self, graph: layout.Graph) -> tuple:
    match = self._match(graph)
    cost = jnp.asarray(self.cost_fn(graph), jnp.float32)
    return match, cost, self._observe(graph, match, cost, jnp.int32(0))

  def initial(self) -> tuple:
    """(match, cost, observation) of every pool graph, stacked on a leading pool axis.

    The pool is fixed, so its matches are computed once (on first use, eagerly even when that
    happens while tracing) and `reset` only indexes them: an auto-reset step then pays one match
    (of the stepped graph), not two.
    """
    if self._initial is None:  # with the env's own kernel table (the pool's kernels are in it)
      with bound_kernels(None), jax.ensure_compile_time_eval():
        self._initial = jax.jit(jax.vmap(self._first))(self.pool)
    return self._initial

  def reset(self, key: jax.Array) -> tuple[State, TimeStep]:
    """Starts an episode on a pool graph drawn uniformly with `key`."""
    key, draw = jax.random.split(key)
    index = jax.random.randint(draw, (), 0, self.pool_size)
    graph = jax.tree_util.tree_map(lambda a: a[index], self.pool)
    match, cost, observation = jax.tree_util.tree_map(lambda a: a[index], self.initial())
    # The same arrays as the state's (not copies cached apart), so an auto-reset selects each
    # once: XLA merges the state's and the observation's identical selects.
    observation = observation.replace(graph=graph, candidate_nodes=match.nodes)
    zero = jnp.int32(0)
    rewrites = jnp.full([self.horizon, 2 + self.ruleset.num_bound], -1, jnp.int32)
    state = State(graph=graph, match=match, cost=cost, initial_cost=cost, best_cost=cost,
                  best_graph=graph, step_count=zero, graph_index=index, key=key,
                  rewrites=rewrites, num_rewrites=zero)
    timestep = TimeStep(step_type=jnp.int32(StepType.FIRST), reward=jnp.float32(0.0),
                        discount=jnp.float32(1.0), observation=observation,
                        extras=self._extras(state, jnp.asarray(False)))
    return state, timestep

  def _extras(self, state: State, invalid: jax.Array) -> dict:
    return {"invalid_action": invalid, "cost": state.cost, "best_cost": state.best_cost,
            "initial_cost": state.initial_cost, "graph_index": state.graph_index,
            "rewrites": state.rewrites, "num_rewrites": state.num_rewrites}

  def step(self, state: State, action: jax.Array) -> tuple[State, TimeStep]:
    """Applies `action` (int32[]): a rewrite index or the stop action."""
    action = jnp.asarray(action, jnp.int32)
    is_stop = action == self.stop_action
    rewrite = jnp.clip(action, 0, self.ruleset.num_actions - 1)
    rule, loc = rewrite // self.ruleset.max_locations, rewrite % self.ruleset.max_locations
    # Unchanged (one select, inside `apply`) unless a valid rewrite applied.
    graph, applied = self.ruleset.apply(state.graph, rule, state.match.nodes[rule, loc],
                                        state.match.mask[rule, loc] & ~is_stop)
    invalid = ~is_stop & ~applied
    cost = jnp.where(applied, jnp.asarray(self.cost_fn(graph), jnp.float32), state.cost)
    match = self._match(graph)
    reward = self.reward_scale * (state.cost - cost) / state.initial_cost
    step_count = state.step_count + 1
    terminated = is_stop | ~jnp.any(match.mask)
    truncated = (step_count >= self.horizon) & ~terminated
    better = cost < state.best_cost
    best_graph = jax.tree_util.tree_map(lambda a, b: jnp.where(better, a, b), graph,
                                        state.best_graph)
    row = jnp.concatenate([jnp.stack([rule, loc]), state.match.nodes[rule, loc]]).astype(jnp.int32)
    slot = jnp.minimum(state.num_rewrites, self.horizon - 1)  # < horizon: one per step
    rewrites = jnp.where(applied, state.rewrites.at[slot].set(row), state.rewrites)
    num_rewrites = state.num_rewrites + applied.astype(jnp.int32)
    new_state = State(graph=graph, match=match, cost=cost, initial_cost=state.initial_cost,
                      best_cost=jnp.minimum(cost, state.best_cost), best_graph=best_graph,
                      step_count=step_count, graph_index=state.graph_index, key=state.key,
                      rewrites=rewrites, num_rewrites=num_rewrites)
    step_type = jnp.where(terminated | truncated, StepType.LAST, StepType.MID).astype(jnp.int32)
    timestep = TimeStep(step_type=step_type, reward=reward.astype(jnp.float32),
                        discount=jnp.where(terminated, 0.0, 1.0).astype(jnp.float32),
                        observation=self._observe(graph, match, cost, step_count),
                        extras=self._extras(new_state, invalid))
    return new_state, timestep
