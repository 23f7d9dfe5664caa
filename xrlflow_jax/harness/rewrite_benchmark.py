"""Throughput of the rewrite engine: "match every rule + apply one random valid rewrite" steps.

Used by `experiments/rewrite_benchmark.py`; everything here is timed with compile excluded and
`block_until_ready` after every timed call.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from xrlflow_jax.graph import layout
from xrlflow_jax.rules.compile import CompiledRule, Features
from xrlflow_jax.rules.ruleset import RuleSet


def random_step(ruleset: RuleSet) -> Callable[[layout.Graph, jax.Array], tuple]:
  """step(graph, key) -> (graph, applied): match all rules, apply one uniformly random valid
  (rule, location); a graph with no valid location is returned unchanged."""
  def step(graph, key):
    m = ruleset.match(graph)
    flat = m.mask.reshape(-1)
    logits = jnp.where(flat, 0.0, -jnp.inf)
    action = jax.random.categorical(key, jnp.where(flat.any(), logits, 0.0))
    new, ok = ruleset.apply_action(graph, m, action)
    return new, ok & flat.any()
  return step


def rollout(ruleset: RuleSet, steps: int) -> Callable[[layout.Graph, jax.Array], tuple]:
  """rollout(graph, key) -> (graph, applied count): `steps` random steps in one `lax.scan`."""
  step = random_step(ruleset)
  def run(graph, key):
    def body(carry, k):
      g, n = carry
      g, ok = step(g, k)
      return (g, n + ok.astype(jnp.int32)), None
    (graph, n), _ = jax.lax.scan(body, (graph, jnp.int32(0)), jax.random.split(key, steps))
    return graph, n
  return run


@dataclasses.dataclass(frozen=True)
class StepTiming:
  """Timing of batched random rewrite steps."""
  batch: int
  steps: int
  compile_s: float
  seconds_per_step: float  # one step of the whole batch
  rewrites_per_s: float  # applied rewrites per second over the batch


def time_steps(ruleset: RuleSet, graph: layout.Graph, batch: int, steps: int = 10,
               repeats: int = 3, seed: int = 0) -> StepTiming:
  """Times `steps` vmapped random steps over `batch` copies of `graph` (best of `repeats`)."""
  fn = jax.jit(jax.vmap(rollout(ruleset, steps)))
  graphs = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (batch,) + a.shape), graph)
  keys = jax.random.split(jax.random.PRNGKey(seed), batch)
  t0 = time.perf_counter()
  compiled = fn.lower(graphs, keys).compile()
  compile_s = time.perf_counter() - t0
  jax.block_until_ready(compiled(graphs, keys))
  best, applied = np.inf, 0
  for r in range(repeats):
    keys = jax.random.split(jax.random.PRNGKey(seed + r + 1), batch)
    t0 = time.perf_counter()
    out, count = compiled(graphs, keys)
    jax.block_until_ready(out)
    elapsed = time.perf_counter() - t0
    if elapsed < best:
      best, applied = elapsed, int(np.asarray(count).sum())
  return StepTiming(batch, steps, compile_s, best / steps, applied / best)


def time_rule_matches(ruleset: RuleSet, graph: layout.Graph, repeats: int = 5
                      ) -> list[tuple[str, float]]:
  """Seconds per match of each rule alone on one graph (shared features included), slowest
  first."""
  out = []
  for c in ruleset.compiled:
    def one(g, c: CompiledRule = c):
      return c.match(g, Features(g, c.needs_depth, ruleset.max_anchors)).valid
    fn = jax.jit(one).lower(graph).compile()
    jax.block_until_ready(fn(graph))
    t0 = time.perf_counter()
    for _ in range(repeats):
      jax.block_until_ready(fn(graph))
    out.append((c.rule.name, (time.perf_counter() - t0) / repeats))
  return sorted(out, key=lambda x: -x[1])


def markdown(rows: Sequence[StepTiming]) -> str:
  lines = ["| batch | step (ms, whole batch) | rewrites/s | compile (s) |", "|---:|---:|---:|---:|"]
  for r in rows:
    lines.append(f"| {r.batch} | {r.seconds_per_step * 1e3:.2f} | {r.rewrites_per_s:.0f} | "
                 f"{r.compile_s:.1f} |")
  return "\n".join(lines)
