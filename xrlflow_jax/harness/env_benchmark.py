"""Throughput of the environment under a uniformly random valid policy, and where its time goes.

Used by `experiments/env_benchmark.py`. Everything is timed with compile excluded (ahead-of-time
`lower().compile()`), `block_until_ready` after every timed call, best of `repeats`.
"""

from __future__ import annotations

import dataclasses
import resource
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from xrlflow_jax import cost
from xrlflow_jax.env.env import GraphRewriteEnv
from xrlflow_jax.env.wrappers import AutoResetWrapper, VmapWrapper
from xrlflow_jax.graph import layout
from xrlflow_jax.rules import RuleSet


def make_env(graphs: Sequence[layout.Graph] | layout.Graph, ruleset: RuleSet,
             coeffs: cost.CostCoefficients, horizon: int = 50,
             reward_scale: float = 10.0) -> GraphRewriteEnv:
  """The graph-rewrite environment over `graphs` under the cost model `coeffs` (graph cost as
  the reward's cost, node costs in the observation; the environment's graphs are pruned)."""
  graphs = [graphs] if isinstance(graphs, layout.Graph) else list(graphs)
  model_cost = cost.ModelCost(coeffs, pruned=True)
  return GraphRewriteEnv(graphs, ruleset, model_cost, int(horizon), reward_scale=reward_scale,
                         node_cost_fn=model_cost.node_costs)


def random_valid_action(key: jax.Array, mask: jax.Array) -> jax.Array:
  """A uniformly random valid action: int32[] from bool[A] (the stop action is always valid)."""
  return jax.random.categorical(key, jnp.where(mask, 0.0, -jnp.inf)).astype(jnp.int32)


def random_rollout(env: Any, steps: int) -> Callable:
  """rollout(state, timestep, key) -> (state, episodes ended, observed): `steps` steps of a
  batched (vmapped, auto-reset) env under the random valid policy, in one `lax.scan`.

  The stop action is excluded while a rewrite is valid, so episodes run to the horizon or to
  a graph with nothing left to match (what a random explorer of the rewrite space does).
  `observed` is a sum over every float array of every observation: the rollout reads the whole
  observation, as an agent does, so XLA cannot drop the parts the policy itself ignores (node
  costs, removed costs, the exact candidate deltas).
  """
  def body(carry, key):
    state, mask, ended, observed = carry  # mask: bool[B, A]
    rewrites = mask.at[:, -1].set(~jnp.any(mask[:, :-1], axis=1))
    keys = jax.random.split(key, mask.shape[0])
    action = jax.vmap(random_valid_action)(keys, rewrites)
    state, ts = env.step(state, action)
    for leaf in jax.tree_util.tree_leaves(ts.observation):
      if jnp.issubdtype(leaf.dtype, jnp.floating):
        observed = observed + jnp.sum(leaf, dtype=jnp.float32)
    return (state, ts.observation.action_mask, ended + jnp.sum(ts.last()), observed), None

  def run(state, ts, key):
    init = (state, ts.observation.action_mask, jnp.int32(0), jnp.float32(0))
    (state, _, ended, observed), _ = jax.lax.scan(body, init, jax.random.split(key, steps))
    return state, ended, observed
  return run


@dataclasses.dataclass(frozen=True)
class EnvTiming:
  """Random-policy throughput of a batch of environments.

  Attributes:
    batch: environments stepped together; steps: steps per timed rollout.
    compile_s: ahead-of-time compile of the rollout; seconds_per_step: one step of the batch.
    steps_per_s: environment steps per second (batch * steps / seconds).
    episodes_ended: episodes that ended inside the timed rollout (all environments).
    temp_mb, argument_mb: XLA's memory analysis of the compiled rollout (scratch, inputs).
    peak_rss_mb: the process's peak resident memory after the run (monotone over a process).
  """
  batch: int
  steps: int
  compile_s: float
  seconds_per_step: float
  steps_per_s: float
  episodes_ended: int
  temp_mb: float
  argument_mb: float
  peak_rss_mb: float


def _peak_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def time_env(env: GraphRewriteEnv, batch: int, steps: int = 10, repeats: int = 3,
             seed: int = 0) -> EnvTiming:
  """Times `steps` random-policy steps of `batch` auto-reset environments (best of repeats)."""
  venv = VmapWrapper(AutoResetWrapper(env))
  keys = jax.random.split(jax.random.PRNGKey(seed), batch)
  state, ts = jax.jit(venv.reset)(keys)
  fn = jax.jit(random_rollout(venv, steps))
  t0 = time.perf_counter()
  compiled = fn.lower(state, ts, jax.random.PRNGKey(seed)).compile()
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  jax.block_until_ready(compiled(state, ts, jax.random.PRNGKey(seed)))
  best, ended = np.inf, 0
  for r in range(repeats):
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(state, ts, jax.random.PRNGKey(seed + r + 1)))
    elapsed = time.perf_counter() - t0
    if elapsed < best:
      best, ended = elapsed, int(out[1])
  temp = getattr(mem, "temp_size_in_bytes", 0) if mem is not None else 0
  arg = getattr(mem, "argument_size_in_bytes", 0) if mem is not None else 0
  return EnvTiming(batch, steps, compile_s, best / steps, batch * steps / best, ended,
                   temp / 2**20, arg / 2**20, _peak_rss_mb())


def time_parts(env: GraphRewriteEnv, batch: int, repeats: int = 3, seed: int = 0
               ) -> dict[str, float]:
  """Milliseconds per batched call of each part of a step: match the rules (those that can
  fire on the pool), apply one random valid rewrite, the cost model, the observation's
  per-candidate features, a full env.step, and an auto-reset env.step (which also selects the
  next episode's first state, cached per pool graph, where an episode ended)."""
  venv = VmapWrapper(env)
  keys = jax.random.split(jax.random.PRNGKey(seed), batch)
  state, ts = jax.jit(venv.reset)(keys)
  action = jax.jit(jax.vmap(random_valid_action))(keys, ts.observation.action_mask)
  rs = env.ruleset
  graphs, match = state.graph, state.match
  parts: dict[str, tuple[Callable, tuple]] = {
      "match": (jax.vmap(env._match), (graphs,)),  # pylint: disable=protected-access
      "apply": (jax.vmap(rs.apply_action), (graphs, match, action)),
      "cost": (jax.vmap(env.cost_fn), (graphs,)),
      "observe": (jax.vmap(lambda g, m, c: env._observe(g, m, c, jnp.int32(0))),  # pylint: disable=protected-access
                  (graphs, match, state.cost)),
      "env.step": (venv.step, (state, action)),
      "auto-reset step": (VmapWrapper(AutoResetWrapper(env)).step, (state, action)),
  }
  out = {}
  for name, (fn, args) in parts.items():
    compiled = jax.jit(fn).lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    best = np.inf
    for _ in range(repeats):
      t0 = time.perf_counter()
      jax.block_until_ready(compiled(*args))
      best = min(best, time.perf_counter() - t0)
    out[name] = best * 1e3
  return out


def markdown(model: str, rows: list[EnvTiming]) -> str:
  """A markdown table of `time_env` rows."""
  lines = ["| model | batch | env steps/s | ms/step (batch) | compile s | XLA temp MB | "
           "args MB | peak RSS MB |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    lines.append(f"| {model} | {r.batch} | {r.steps_per_s:.1f} | {r.seconds_per_step * 1e3:.1f} | "
                 f"{r.compile_s:.0f} | {r.temp_mb:.0f} | {r.argument_mb:.0f} | "
                 f"{r.peak_rss_mb:.0f} |")
  return "\n".join(lines)
