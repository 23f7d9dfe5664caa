"""Vectorised expansion: the modelled cost of every (rule, location) candidate of a graph in one
jitted call, and the host helpers every driver shares (graph checks, steps, replay)."""

from __future__ import annotations

from typing import Any, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from xrlflow_jax.cost import model as cost_model
from xrlflow_jax.graph import host as graph_host
from xrlflow_jax.graph import layout
from xrlflow_jax.rules import edit as edit_lib
from xrlflow_jax.rules.ruleset import RuleSet, RuleSetMatch
from xrlflow_jax.search.result import RewriteStep, SearchError


@chex.dataclass(frozen=True)
class Expansion:
  """Every one-step candidate of one graph (A = R * L, action = rule * L + location).

  Attributes:
    valid: bool[A], the candidate exists and its rewrite applies.
    cost: float32[A], its modelled cost in ms (+inf where not valid).
    nodes: int32[R, L, P], the bound nodes of every location (as `RuleSet.match`).
    current: float32[], the modelled cost of the graph itself.
  """
  valid: jax.Array
  cost: jax.Array
  nodes: jax.Array
  current: jax.Array


# A graph is better only if cheaper by this relative margin: candidates costed inside one jitted
# call and graphs costed alone differ by float rounding, and noise is not a gain.
MIN_GAIN = 1e-6


def improves(cost: float, reference: float) -> bool:
  """cost < reference by more than float noise (relative MIN_GAIN)."""
  return float(cost) < float(reference) * (1.0 - MIN_GAIN)


class Expander:
  """Costs every candidate of a graph in one call, and applies one.

  All functions are jitted; `jax.jit` caches one executable per graph capacity (N, K), so a
  search over graphs of one capacity compiles each function once (`trace_counts` counts traces).

  Inside `costs`, rules are visited by `lax.map` (a loop, one rule at a time) and each rule's L
  locations by `vmap`, with the rule-specific plan chosen by `lax.switch` on the (unbatched)
  rule index: memory is one rule's L candidate graphs, and the shared edit kernel and cost model
  are traced once (compile time does not grow with R).

  Args:
    ruleset: the rules (R rules, L locations, P bound slots).
    coeffs: cost-model coefficients (`cost.load_coefficients()`).
  """

  def __init__(self, ruleset: RuleSet, coeffs: cost_model.CostCoefficients):
    self.ruleset = ruleset
    self.coeffs = coeffs
    self.trace_counts: dict[str, int] = {"costs": 0, "apply_at": 0, "cost": 0,
                                         "match": 0}
    self._costs = jax.jit(self._costs_impl)
    self._apply_at = jax.jit(self._apply_at_impl)
    self._cost = jax.jit(self._cost_impl)
    self._match = jax.jit(self._match_impl)

  # ------------------------------------------------------------------ properties
  @property
  def num_rules(self) -> int:
    return len(self.ruleset)

  @property
  def max_locations(self) -> int:
    return self.ruleset.max_locations

  @property
  def num_actions(self) -> int:
    """A = R * L."""
    return self.ruleset.num_actions

  # ------------------------------------------------------------------ traced bodies
  def _cost_impl(self, graph: layout.Graph) -> jax.Array:
    self.trace_counts["cost"] += 1
    return cost_model.graph_cost(graph, self.coeffs)

  def _match_impl(self, graph: layout.Graph) -> RuleSetMatch:
    self.trace_counts["match"] += 1
    return self.ruleset.match(graph)

  def _costs_impl(self, graph: layout.Graph) -> Expansion:
    self.trace_counts["costs"] += 1
    rs = self.ruleset
    n = layout.capacity(graph)
    match = rs.match(graph)

    def one(r, nodes, allowed):
      edit = rs.edit(graph, r, nodes)
      edit = edit_lib.neutralize(edit, allowed & (nodes[0] >= 0), n)
      new, ok = edit_lib.apply_edit(graph, edit)
      return ok, cost_model.graph_cost(new, self.coeffs)

    def per_rule(r):
      ok, c = jax.vmap(one, in_axes=(None, 0, 0))(r, match.nodes[r], match.mask[r])
      return ok, c

    ok, c = jax.lax.map(per_rule, jnp.arange(len(rs), dtype=jnp.int32))  # [R, L]
    valid = (ok & match.mask).reshape(-1)
    cost = jnp.where(valid, c.reshape(-1).astype(jnp.float32), jnp.inf)
    current = cost_model.graph_cost(graph, self.coeffs).astype(jnp.float32)
    return Expansion(valid=valid, cost=cost, nodes=match.nodes, current=current)

  def _apply_at_impl(self, graph: layout.Graph, rule: jax.Array,
                     nodes: jax.Array) -> tuple[layout.Graph, jax.Array]:
    self.trace_counts["apply_at"] += 1
    return self.ruleset.apply(graph, rule, nodes)

  # ------------------------------------------------------------------ public
  def costs(self, graph: layout.Graph) -> Expansion:
    """Every candidate of `graph` (capacity N): valid bool[A], cost float32[A] (+inf where
    invalid), nodes int32[R, L, P], and the graph's own cost float32[]. One jitted call."""
    return self._costs(graph)

  def apply(self, graph: layout.Graph, action: int) -> layout.Graph:
    """The graph after flat action `action` (rule * L + location of `RuleSet.match(graph)`).

    Matches (jitted `RuleSet.match`), then applies with the same compiled kernel as `apply_at`.
    An invalid action returns the graph unchanged.
    """
    mask, nodes = self.match(graph)
    r, loc = divmod(int(action), self.max_locations)
    if not (0 <= r < self.num_rules and mask[r, loc]):
      return graph
    return self.apply_at(graph, r, nodes[r, loc])[0]

  def apply_at(self, graph: layout.Graph, rule: int, nodes: Any) -> tuple[layout.Graph, bool]:
    """Applies rule index `rule` at bound `nodes` (int32[P], from `Expansion.nodes[r, l]`).

    Returns (graph, applied: bool); unchanged when it does not apply.
    """
    nodes = np.asarray(nodes, np.int32)
    p = self.ruleset.num_slots
    if nodes.shape[0] < p:
      nodes = np.concatenate([nodes, np.full([p - nodes.shape[0]], -1, np.int32)])
    new, ok = self._apply_at(graph, np.int32(rule), nodes)
    return new, bool(ok)

  def cost(self, graph: layout.Graph) -> float:
    """Modelled cost of `graph` in ms (float)."""
    return float(self._cost(graph))

  def match(self, graph: layout.Graph) -> tuple[np.ndarray, np.ndarray]:
    """(mask bool[R, L], nodes int32[R, L, P]) on the host."""
    m = self._match(graph)
    return np.array(m.mask), np.array(m.nodes)

  def step(self, rule: int, location: int, nodes: Any) -> RewriteStep:
    """The RewriteStep record of rule index `rule` at `location` with bound `nodes`."""
    return RewriteStep(self.ruleset.names[rule], int(rule), int(location),
                       tuple(int(v) for v in np.asarray(nodes)))

  def new_child(self, graph: layout.Graph, rule: int, location: int, nodes: Any,
                seen: set) -> tuple[layout.Graph, RewriteStep] | None:
    """(host graph, step) of rule `rule` at `location` (bound `nodes`) applied to `graph`, or
    None when the edit is refused or the result's structural hash is in `seen` (it is added)."""
    g2, ok = self.apply_at(graph, rule, nodes)
    if not ok:
      return None
    h = graph_host.structural_hash(g2)
    if h in seen:
      return None
    seen.add(h)
    return layout.to_host(g2), self.step(rule, location, nodes)

  def apply_step(self, graph: layout.Graph, step: RewriteStep) -> layout.Graph:
    """Applies a recorded step; SearchError if it no longer applies."""
    if not 0 <= step.rule_index < len(self.ruleset) or \
        self.ruleset.names[step.rule_index] != step.rule:
      raise SearchError(f"rewrite {step.rule!r} (index {step.rule_index}) is not rule "
                        f"{step.rule_index} of this rule set; replay with the rule set the "
                        "search used")
    new, ok = self.apply_at(graph, step.rule_index, step.nodes)
    if not ok:
      raise SearchError(f"rewrite {step.rule} at nodes {list(step.nodes)} does not apply; the "
                        "sequence must be replayed on the graph it was found on")
    return new


def check_graph(graph: layout.Graph, ruleset: RuleSet) -> layout.Graph:
  """Checks that `graph` is one unbatched graph with room for a rewrite; returns it on the host.

  Raises:
    SearchError: a batched graph, or a capacity with fewer free slots than the largest rule
      adds (the message names the capacity needed).
  """
  if not isinstance(graph, layout.Graph):
    raise SearchError(f"expected a Graph (jraph.GraphsTuple), got {type(graph).__name__}")
  if np.ndim(graph.nodes["op"]) != 1:
    raise SearchError(f"expected one graph, got a batch of shape "
                      f"{tuple(np.shape(graph.nodes['op']))[:-1]}; search graphs one at a time")
  host = layout.to_host(graph)
  n = layout.capacity(host)
  used = graph_host.num_nodes(host)
  need = used + ruleset.max_new
  if need > n:
    raise SearchError(f"the graph has {used} nodes in a capacity of {n}: no room for a rewrite "
                      f"(rules add up to {ruleset.max_new} nodes before freeing any); rebuild it "
                      f"with capacity >= {need} (e.g. {max(need, int(used * 1.25) + 8)})")
  return host


def replay(graph: layout.Graph, ruleset: RuleSet | Expander,
           rewrites: Sequence[RewriteStep]) -> layout.Graph:
  """Re-applies `rewrites` (a SearchResult's) to `graph` in order: the best graph, as host numpy
  arrays (same capacity). SearchError if a step does not apply or names another rule."""
  expander = ruleset if isinstance(ruleset, Expander) else _replayer(ruleset)
  g = layout.to_host(graph)
  for step in rewrites:
    g = expander.apply_step(g, step)
  return layout.to_host(g)


_REPLAYERS: dict[int, tuple[RuleSet, Expander]] = {}


def _replayer(ruleset: RuleSet) -> Expander:
  hit = _REPLAYERS.get(id(ruleset))
  if hit is None or hit[0] is not ruleset:
    hit = (ruleset, Expander(ruleset, None))  # apply only: no cost model needed
    _REPLAYERS[id(ruleset)] = hit
  return hit[1]
