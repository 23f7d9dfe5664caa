"""The verification harness every rule must pass (built-in and imported alike).

For a rule: build random instances of its source pattern (the rule's `example`) inside random
context (extra consumers of the pattern's outputs, outputs passed through other ops), find every
location, apply the rule at each one, validate the result and compare the outputs of the
original and rewritten graphs through the executor on random inputs.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from xrlflow_jax import executor
from xrlflow_jax import graph as G
from xrlflow_jax.errors import XrlflowError
from xrlflow_jax.rules.pattern import Rule
from xrlflow_jax.rules.ruleset import RuleSet

CAPACITY = 64


class RuleVerificationError(XrlflowError):
  """A rule changed what a graph computes, broke an invariant, or never fired on its example."""


@dataclasses.dataclass
class RuleReport:
  """Outcome of verifying one rule over several random examples."""
  rule: str
  examples: int = 0
  locations: int = 0
  applied: int = 0
  max_abs_err: float = 0.0
  max_rel_err: float = 0.0
  problems: list[str] = dataclasses.field(default_factory=list)

  @property
  def ok(self) -> bool:
    return not self.problems and self.applied > 0


def example_graph(rule: Rule, seed: int, capacity: int = CAPACITY) -> tuple[G.Graph, G.ParamStore]:
  """A random instance of `rule`'s source pattern in random context."""
  if rule.example is None:
    raise RuleVerificationError(f"rule {rule.name} has no example generator")
  rng = np.random.default_rng(seed)
  b = G.GraphBuilder(seed=seed, name=f"{rule.name}#{seed}")
  outs = list(rule.example(b, rng))
  final = []
  for t in outs:
    choice = rng.integers(0, 3)
    if choice == 1:  # an extra consumer: the pattern's output is used twice
      final += [t, b.neg(t)]
    elif choice == 2:  # output consumed, not an output itself
      final.append(b.tanh(t))
    else:
      final.append(t)
  b.output(*final)
  return b.build(capacity=capacity)


def _compare(ref: Sequence[np.ndarray], out: Sequence[np.ndarray], rtol: float, atol: float
             ) -> tuple[float, float, str | None]:
  abs_err = rel_err = 0.0
  for i, (a, b) in enumerate(zip(ref, out)):
    if a.shape != b.shape:
      return np.inf, np.inf, f"output {i} shape {b.shape} != {a.shape}"
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    abs_err = max(abs_err, float(diff.max(initial=0)))
    rel_err = max(rel_err, float((diff / (np.abs(a) + atol)).max(initial=0)))
    if not np.allclose(b, a, rtol=rtol, atol=atol):
      return abs_err, rel_err, f"output {i} differs (max abs err {abs_err:.3g})"
  return abs_err, rel_err, None


def verify_rule(rule: Rule, seeds: Sequence[int] = range(4), *, rtol: float = 1e-4,
                atol: float = 1e-5, capacity: int = CAPACITY,
                ruleset: RuleSet | None = None) -> RuleReport:
  """Runs the harness on one rule; the report lists every problem (empty when the rule passes).

  `ruleset`: a RuleSet containing `rule` whose compiled matcher and applier are reused (to
  verify many rules with one compilation); by default a RuleSet of this rule alone.
  """
  rs = ruleset if ruleset is not None else RuleSet([rule], max_locations=16)
  index = rs.index(rule.name)
  match, apply = rs.jit_match, rs.jit_apply
  report = RuleReport(rule.name)
  for seed in seeds:
    graph, params = example_graph(rule, seed, capacity)
    report.examples += 1
    lowered = executor.lower(graph, params, jit=False)
    inputs = lowered.random_inputs(seed)
    ref = [np.asarray(y) for y in lowered(*inputs)]
    m = match(graph)
    locations = np.flatnonzero(np.asarray(m.mask[index]))
    report.locations += len(locations)
    if not len(locations):
      report.problems.append(f"seed {seed}: the rule does not fire on its own example")
      continue
    for loc in locations:
      new, ok = apply(graph, index, m.nodes[index, loc])
      where = f"seed {seed}, location {loc} (nodes {np.asarray(m.nodes[index, loc]).tolist()})"
      if not bool(ok):
        report.problems.append(f"{where}: matched but the edit was refused")
        continue
      try:
        G.validate(new, params)
        out = [np.asarray(y) for y in executor.lower(new, params, jit=False)(*inputs)]
      except XrlflowError as e:
        report.problems.append(f"{where}: invalid result: {e}")
        continue
      if G.structural_hash(new) == G.structural_hash(graph):
        report.problems.append(f"{where}: the rewrite changed nothing")
      abs_err, rel_err, problem = _compare(ref, out, rtol, atol)
      report.max_abs_err = max(report.max_abs_err, abs_err)
      report.max_rel_err = max(report.max_rel_err, rel_err)
      if problem:
        report.problems.append(f"{where}: {problem}")
      else:
        report.applied += 1
  return report
