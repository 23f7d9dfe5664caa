"""Policy search: roll out a trained PPO agent (X-RLflow's inference) and keep the best graph."""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xrlflow_jax.agents.distributions import MaskedCategorical
from xrlflow_jax.agents.networks import Agent
from xrlflow_jax.env import GraphRewriteEnv, observe, offered_candidates
from xrlflow_jax.env.types import Observation
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.search.cache import IdentityCache
from xrlflow_jax.search.expand import Expander, check_graph, improves
from xrlflow_jax.search.progress import Progress
from xrlflow_jax.search.result import SearchError, SearchResult

DEFAULT_STEPS = 50


def network_params_of(agent: Agent, network_params: Any, seed_index: int | None = None,
                      expected: list[tuple[int, ...]] | None = None) -> Any:
  """The network parameters of one policy from params, a RunnerState, or a multi-seed one.

  A RunnerState (from `Trainer.init`/`run`/`train`, `make_train(...)(key)[0]`, or a restored
  checkpoint) gives its `.params`. Multi-seed params (`Trainer.train_seeds`: every leaf has a
  leading seed axis, detected against `expected`, the leaf shapes of one policy) give seed
  `seed_index`, by default the seed with the lowest training best cost (RunnerState) or 0.
  """
  best_cost = getattr(network_params, "best_cost", None)
  if hasattr(network_params, "params") and hasattr(network_params, "opt_state"):
    network_params = network_params.params
  leaves = jax.tree_util.tree_leaves(network_params)
  if not leaves:
    raise SearchError("the policy has no network parameters")
  if expected is None:
    return network_params
  got = [tuple(np.shape(x)) for x in leaves]
  if got == expected:
    return network_params
  if len(got) == len(expected) and all(len(g) == len(e) + 1 and g[1:] == e
                                       for g, e in zip(got, expected)):
    if seed_index is None:
      seed_index = 0
      if best_cost is not None and np.ndim(best_cost) == 2:
        seed_index = int(np.argmin(np.asarray(best_cost).min(axis=1)))
    if not 0 <= seed_index < got[0][0]:
      raise SearchError(f"seed_index {seed_index} is out of range for {got[0][0]} seeds")
    return jax.tree_util.tree_map(lambda x: x[seed_index], network_params)
  raise SearchError("the network parameters do not fit this agent (another head, width or rule "
                    "set?); pass the params trained with this agent")


_SHAPES: IdentityCache[list[tuple[int, ...]]] = IdentityCache()


class _PolicyNet:
  """The policy's log-probabilities for one graph, from the Expander's expansion of it.

  The observation is the environment's (`env.observe`, one builder for both): the mask of valid
  candidates (plus stop), their bound nodes, the node costs and those of the nodes each
  candidate removes, and (when the env was trained with `exact_candidate_delta`) each
  candidate's exact cost change, here taken from the expansion's exact costs.
  Jitted once per (agent, capacity); the expansion itself is the Expander's compiled one, so the
  policy adds only the network to compile.
  """

  def __init__(self, agent: Agent, node_cost_fn: Any, exact: bool, max_candidates: int = 0):
    self.agent = agent
    self.node_cost_fn = node_cost_fn
    self.exact = exact
    self.max_candidates = max_candidates if exact else 0
    self.fn = jax.jit(self._log_probs)

  def observation(self, graph: layout.Graph, valid: jax.Array, nodes: jax.Array,
                  cand_cost: jax.Array, current: jax.Array, step: jax.Array) -> Observation:
    """The environment's observation of `graph` from its expansion (jittable): with an exact
    delta over `max_candidates` slots, only the candidates the environment offers."""
    r, l = nodes.shape[:2]
    mask = offered_candidates(valid.reshape(r, l), self.max_candidates)
    delta = jnp.where(mask, cand_cost.reshape(r, l) - current, 0.0) if self.exact else None
    return observe(self.agent.ruleset, graph, mask, nodes, step,
                   node_cost_fn=self.node_cost_fn, delta=delta)

  def init(self, key: jax.Array, graph: layout.Graph, exp: Any) -> Any:
    """Fresh network parameters (untrained) from the observation of `graph`."""
    obs = self.observation(graph, exp.valid, exp.nodes, exp.cost, exp.current, 0)
    return self.agent.init(key, obs)

  def _log_probs(self, params: Any, graph: layout.Graph, valid: jax.Array, nodes: jax.Array,
                 cand_cost: jax.Array, current: jax.Array, step: jax.Array) -> jax.Array:
    """float32[A + 1] log-probabilities (-inf where masked; the last entry is stop)."""
    obs = self.observation(graph, valid, nodes, cand_cost, current, step)
    mask = obs.action_mask
    logits, _ = self.agent.apply(params, obs)
    dist = MaskedCategorical(logits, mask)
    return jnp.where(mask, dist.log_probs, -jnp.inf)


_NETS: IdentityCache[_PolicyNet] = IdentityCache()


def _policy_net(agent: Agent, env: GraphRewriteEnv | None) -> _PolicyNet:
  """The policy network of `agent`, observing as `env` does (None: no exact delta)."""
  if env is None:
    return _NETS.get((agent,), lambda: _PolicyNet(agent, agent.node_cost_fn, False))
  return _NETS.get((agent, env), lambda: _PolicyNet(
      agent, env.node_cost_fn, env.exact_candidate_delta, env.max_candidates))


def policy(graph: layout.Graph, params: ParamStore, expander: Expander, *, agent: Agent,
           network_params: Any, env: GraphRewriteEnv | None = None, steps: int | None = None,
           num_samples: int = 8, seed_index: int | None = None, measure: bool = False,
           seed: int = 0, measure_options: dict[str, Any] | None = None) -> SearchResult:
  """Rolls out the policy from `graph`: one greedy (argmax) rollout and `num_samples` sampled
  ones, and keeps the cheapest graph reached at any step of any rollout.

  Each step expands the current graph with the Expander (one jitted call: valid candidates,
  their exact costs and bound nodes), builds the observation the agent was trained on, and runs
  the jitted network; a rollout ends at the stop action, when nothing applies, or after `steps`.
  Reusing the Expander means the policy compiles only its network, not a second copy of the
  environment.

  Args:
    graph: the input graph (capacity N, any capacity the agent's GNN accepts); params: weights.
    expander: the Expander of the agent's rule set (`agent.ruleset`) and the cost model that
      ranks the graphs found.
    agent: the `agents.Agent` the policy was trained with (`agents.runs.build(config).agent`).
    network_params: trained network parameters, or a RunnerState (`Trainer.train`,
      `make_train(...)(key)[0]`, a restored checkpoint); multi-seed runs: see `seed_index`.
    env: the training environment (optional): its cost function, reward scale and
      `exact_candidate_delta` are reused so the observations match training.
    steps: rollout length (default: the env's horizon, else 50).
    num_samples: sampled rollouts besides the greedy one (0: greedy only).
    seed_index: for multi-seed params (a leading seed axis): which seed (default: the seed with
      the lowest training best cost when a RunnerState is given, else 0).
    seed: PRNG seed of the sampled rollouts.
    measure, measure_options: the guard (see `guard.finish`).
  """
  if agent.ruleset is not expander.ruleset and (agent.ruleset.names != expander.ruleset.names or
                                                agent.ruleset.max_locations !=
                                                expander.max_locations):
    raise SearchError("the agent was built for another rule set than the expander's; build the "
                      "Expander from agent.ruleset")
  if num_samples < 0:
    raise SearchError(f"num_samples must be >= 0, got {num_samples}")
  steps = int(steps or (env.horizon if env is not None else DEFAULT_STEPS))
  if steps < 1:
    raise SearchError(f"steps must be >= 1, got {steps}")
  started = time.perf_counter()
  g0 = check_graph(graph, expander.ruleset)
  net_fn = _policy_net(agent, env)
  # Committed to the device as `apply_at`'s children are, so every step calls the network's
  # one compiled executable (an uncommitted first graph would compile it a second time).
  device = jax.devices()[0]
  jgraph = jax.tree_util.tree_map(lambda x: jax.device_put(x, device), g0)
  first = expander.costs(jgraph)
  def leaf_shapes() -> list[tuple[int, ...]]:
    shapes = jax.eval_shape(net_fn.init, jax.random.PRNGKey(0), jgraph, first)  # traces only
    return [tuple(x.shape) for x in jax.tree_util.tree_leaves(shapes)]
  net = network_params_of(agent, network_params, seed_index, _SHAPES.get((agent,), leaf_shapes))
  rng = np.random.default_rng(seed)
  run = Progress("policy", expander, params, measure, measure_options, g0,
                 float(first.current), started)
  num_l, stop = expander.max_locations, expander.num_actions
  for rollout in range(1 + num_samples):  # rollout 0 takes the argmax action
    g, exp, trail = jgraph, first, []
    for t in range(steps):
      if t:
        exp = expander.costs(g)
      valid = np.asarray(exp.valid)
      run.counted(valid)
      if not valid.any():
        break
      logp = np.asarray(net_fn.fn(net, g, exp.valid, exp.nodes, exp.cost, exp.current,
                                  np.int32(t)), np.float64)
      if rollout == 0:
        action = int(np.argmax(logp))
      else:
        action = int(np.argmax(logp + rng.gumbel(size=logp.shape)))  # Gumbel-max sample
      if action == stop or not np.isfinite(logp[action]):
        break
      r, loc = divmod(action, num_l)
      nodes = np.asarray(exp.nodes[r, loc])
      g, ok = expander.apply_at(g, r, nodes)
      if not ok:
        raise SearchError(f"rule {expander.ruleset.names[r]} at location {loc} was costed as "
                          "valid but did not apply")
      trail.append(expander.step(r, loc, nodes))
      c = float(np.asarray(exp.cost)[action])
      if improves(c, run.best_cost):
        run.offer(layout.to_host(g), c, trail)
  return run.finish(steps=steps, num_samples=num_samples, seed=seed)


def init_network(agent: Agent, expander: Expander, graph: layout.Graph, key: jax.Array,
                 env: GraphRewriteEnv | None = None) -> Any:
  """Untrained network parameters for `agent` (jitted init on `graph`'s observation)."""
  net_fn = _policy_net(agent, env)
  jgraph = jax.tree_util.tree_map(jnp.asarray, graph)
  return jax.jit(net_fn.init)(key, jgraph, expander.costs(jgraph))
