"""Random walks of rewrites: rewritten variants of a graph, for measuring and calibrating.

    walker = RewriteWalker()                                    # the built-in rules
    variant, trail = walker.walk(graph, steps=5, rng=np.random.default_rng(0))

A random walk picks, at every step, a rule uniformly among the rules that match somewhere, then
one of its valid locations uniformly, so rules with hundreds of locations (commuting an
addition) do not drown the rare ones (merging Q/K/V projections). Variants are told apart by
`graph.host.structural_hash`.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from xrlflow_jax.graph import layout
from xrlflow_jax.rules.library import builtin_rules
from xrlflow_jax.rules.pattern import Rule
from xrlflow_jax.rules.ruleset import RuleSet


@dataclasses.dataclass(frozen=True)
class Step:
  """One applied rewrite: the rule, its family and the bound nodes."""
  rule: str
  family: str
  nodes: tuple[int, ...]


class RewriteWalker:
  """Applies rewrites of a rule set on the host, one (rule, location) at a time.

  `match` and `apply` are jitted once per graph capacity (about half a minute each on a small
  CPU); the same walker serves every graph of that capacity.

  Args:
    rules: the rules (default: every built-in rule).
    max_locations: L, locations matched per rule.
  """

  def __init__(self, rules: Sequence[Rule] | None = None, max_locations: int = 32):
    self.rules = list(rules) if rules is not None else builtin_rules()
    self.ruleset = RuleSet(self.rules, max_locations)
    self._match = jax.jit(self.ruleset.match)
    self._apply = jax.jit(self.ruleset.apply)

  def matches(self, graph: layout.Graph) -> tuple[np.ndarray, np.ndarray]:
    """(mask bool[R, L], nodes int32[R, L, P]) of every rule on `graph`."""
    m = self._match(graph)
    return np.array(m.mask), np.array(m.nodes)

  def apply(self, graph: layout.Graph, rule: int, nodes: np.ndarray
            ) -> tuple[layout.Graph, bool]:
    """Applies rule index `rule` at bound `nodes`; (graph, applied)."""
    g2, ok = self._apply(graph, np.int32(rule), np.asarray(nodes, np.int32))
    return g2, bool(ok)

  def step(self, graph: layout.Graph, rng: np.random.Generator,
           families: Sequence[str] | None = None) -> tuple[layout.Graph, Step] | None:
    """One random valid rewrite (rule uniform among matching ones, then location); None when
    nothing applies."""
    mask, nodes = self.matches(graph)
    if families is not None:
      keep = np.asarray([r.family in families for r in self.rules])
      mask = mask & keep[:, None]
    while mask.any():
      r = int(rng.choice(np.flatnonzero(mask.any(axis=1))))
      loc = int(rng.choice(np.flatnonzero(mask[r])))
      g2, ok = self.apply(graph, r, nodes[r, loc])
      if ok:
        rule = self.rules[r]
        return g2, Step(rule.name, rule.family, tuple(int(v) for v in nodes[r, loc] if v >= 0))
      mask[r, loc] = False
    return None

  def walk(self, graph: layout.Graph, steps: int, rng: np.random.Generator
           ) -> tuple[layout.Graph, list[Step]]:
    """Up to `steps` random rewrites in sequence (fewer if nothing applies)."""
    trail: list[Step] = []
    for _ in range(steps):
      out = self.step(graph, rng)
      if out is None:
        break
      graph, s = out
      trail.append(s)
    return graph, trail

  def neighbours(self, graph: layout.Graph, count: int, rng: np.random.Generator
                 ) -> list[tuple[layout.Graph, Step]]:
    """Up to `count` distinct one-step variants: rules drawn in turn (uniform among the rules
    that match), a new random location each time."""
    mask, nodes = self.matches(graph)
    out: list[tuple[layout.Graph, Step]] = []
    while mask.any() and len(out) < count:
      r = int(rng.choice(np.flatnonzero(mask.any(axis=1))))
      loc = int(rng.choice(np.flatnonzero(mask[r])))
      mask[r, loc] = False
      g2, ok = self.apply(graph, r, nodes[r, loc])
      if ok:
        rule = self.rules[r]
        out.append((g2, Step(rule.name, rule.family,
                             tuple(int(v) for v in nodes[r, loc] if v >= 0))))
    return out
