"""The graph-rewrite environment: purity, no retracing, rewards, termination, wrappers."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xrlflow_jax import cost, executor, models
from xrlflow_jax import graph as G
from xrlflow_jax.env import (AutoResetWrapper, EnvError, GraphRewriteEnv, LoggingWrapper, StepType,
                             VmapWrapper)
from xrlflow_jax.rules import RuleSet, graph_op_counts, op_count_bounds
from xrlflow_jax.rules.library import builtin_rules

CAPACITY = 256
POOL = ("bert", "resnet18", "nasrnn")
RULE_NAMES = (
    "merge_matmul_shared_input_2", "merge_matmul_shared_input_3", "split_matmul_shared_input_2",
    "merge_conv_shared_input_bias", "split_conv_shared_input_bias", "conv_bias_relu_unfuse",
    "conv_bias_relu_fuse", "enlarge_conv_kernel_bias_sib_bias", "add_commute", "add_assoc_left",
    "add_assoc_right", "mul_commute", "matmul_tanh_fuse", "matmul_sigmoid_fuse",
    "transpose_fuse", "transpose_cancel")
COEFFS = cost.CostCoefficients(weights=jnp.linspace(0.01, 0.2, len(cost.FEATURE_NAMES)),
                               call_ms=jnp.float32(0.01), device_kind="test")


def _cost(graph):
  return cost.graph_cost(graph, COEFFS)


@pytest.fixture(scope="module")
def pool():
  return [models.build(name, "tiny", capacity=CAPACITY) for name in POOL]


@pytest.fixture(scope="module")
def env(pool):
  rules = [r for r in builtin_rules() if r.name in RULE_NAMES]
  ruleset = RuleSet(rules, max_locations=16)
  return GraphRewriteEnv([g for g, _ in pool], ruleset, _cost, horizon=100,
                         node_cost_fn=lambda g: cost.node_costs(g, COEFFS))


@pytest.fixture(scope="module")
def jitted(env):
  @jax.jit
  @chex.assert_max_traces(n=1)
  def step(state, action):
    return env.step(state, action)
  return jax.jit(env.reset), step


def _valid_action(mask: np.ndarray, rng, stop_prob=0.0) -> int:
  choices = np.flatnonzero(mask[:-1])
  if not len(choices) or rng.random() < stop_prob:
    return len(mask) - 1
  return int(rng.choice(choices))


def test_specs_match_observation(env, jitted):
  reset, _ = jitted
  state, ts = reset(jax.random.PRNGKey(0))
  spec = env.observation_spec()
  assert ts.observation.action_mask.shape == spec.action_mask.shape
  assert ts.observation.candidate_nodes.shape == spec.candidate_nodes.shape
  assert ts.observation.candidate_removed_cost.shape == spec.candidate_removed_cost.shape
  # Node costs are computed once per step by the environment and carried in the observation.
  assert ts.observation.node_costs.shape == spec.node_costs.shape == (CAPACITY,)
  # (graph_cost = call_ms + the sum of node costs; no second compile of the cost model)
  np.testing.assert_allclose(float(jnp.sum(ts.observation.node_costs) + COEFFS.call_ms),
                             float(state.cost), rtol=1e-5)
  assert env.action_spec().num_values == env.num_actions == env.ruleset.num_actions + 1
  assert bool(ts.observation.action_mask[-1])  # stop is always allowed
  assert int(ts.step_type) == StepType.FIRST


def test_no_retrace_across_steps_and_pool_graphs(env, jitted):
  reset, step = jitted
  chex.clear_trace_counter()
  rng = np.random.default_rng(0)
  seen = set()
  for episode in range(4):
    state, ts = reset(jax.random.PRNGKey(episode))
    seen.add(int(state.graph_index))
    for _ in range(5):
      state, ts = step(state, _valid_action(np.asarray(ts.observation.action_mask), rng))
  assert len(seen) >= 2, "the pool draw should reach several graphs"


@pytest.mark.parametrize("batch,steps", [
    (16, 30), pytest.param(64, 100, marks=pytest.mark.slow)])
def test_batch_of_random_episodes_preserves_semantics(env, pool, batch, steps):
  venv = VmapWrapper(env)
  reset, step = jax.jit(venv.reset), jax.jit(venv.step)
  state, ts = reset(jax.random.split(jax.random.PRNGKey(1), batch))
  lowered = [executor.lower(g, p, jit=False) for g, p in pool]
  inputs = [lw.random_inputs(0) for lw in lowered]
  refs = [[np.asarray(y) for y in lw(*x)] for lw, x in zip(lowered, inputs)]
  rng = np.random.default_rng(1)
  returns = np.zeros(batch)
  done = np.zeros(batch, bool)
  c0 = np.asarray(state.initial_cost)
  final_cost = np.asarray(state.cost).copy()

  def check(states, which):
    for b in which:
      g = jax.tree_util.tree_map(lambda a: a[b], states.graph)
      idx = int(states.graph_index[b])
      params = pool[idx][1]
      G.validate(g, params)
      out = executor.lower(g, params, jit=False)(*inputs[idx])
      for a, y in zip(refs[idx], out):
        np.testing.assert_allclose(np.asarray(y), a, rtol=2e-4, atol=2e-4)

  for t in range(steps):
    masks = np.asarray(ts.observation.action_mask)
    actions = np.array([_valid_action(masks[b], rng, stop_prob=0.01) if not done[b]
                        else env.stop_action for b in range(batch)], np.int32)
    state, ts = step(state, jnp.asarray(actions))
    assert not np.asarray(ts.extras["invalid_action"]).any(), "a valid action was refused"
    live = ~done
    returns[live] += np.asarray(ts.reward)[live]
    final_cost[live] = np.asarray(state.cost)[live]
    stopped = actions == env.stop_action
    last = np.asarray(ts.step_type) == StepType.LAST
    assert last[live & stopped].all(), "stop must end the episode"
    assert (np.asarray(ts.discount)[live & stopped] == 0).all()
    done |= last
    if t % 10 == 9:
      check(state, range(0, batch, 4))
  check(state, range(batch))
  np.testing.assert_allclose(returns, (c0 - final_cost) / c0, rtol=1e-4, atol=1e-5)


def test_truncation_keeps_discount_and_invalid_action_is_flagged(pool):
  rules = [r for r in builtin_rules() if r.name in ("add_commute", "mul_commute")]
  env = GraphRewriteEnv([pool[0][0]], RuleSet(rules, max_locations=8), _cost, horizon=2)
  step = jax.jit(env.step)  # one compile; eager op-by-op dispatch of the matcher is far slower
  state, ts = jax.jit(env.reset)(jax.random.PRNGKey(0))
  masked = int(np.flatnonzero(~np.asarray(ts.observation.action_mask))[0])
  state2, ts2 = step(state, masked)
  assert bool(ts2.extras["invalid_action"]) and float(ts2.reward) == 0.0
  assert G.structural_hash(state2.graph) == G.structural_hash(state.graph)
  valid = int(np.flatnonzero(np.asarray(ts2.observation.action_mask)[:-1])[0])
  state3, ts3 = step(state2, valid)
  assert int(ts3.step_type) == StepType.LAST and float(ts3.discount) == 1.0  # truncated
  # The episode's applied rewrites are recorded (the refused one is not): rule, location and
  # the bound nodes of the match it was applied to.
  r, loc = divmod(valid, env.ruleset.max_locations)
  assert int(state2.num_rewrites) == 0 and int(state3.num_rewrites) == 1
  row = np.asarray(state3.rewrites)
  assert row.shape == (2, 2 + env.ruleset.num_bound) and (row[1] == -1).all()
  np.testing.assert_array_equal(row[0], [r, loc, *np.asarray(state2.match.nodes)[r, loc]])
  np.testing.assert_array_equal(np.asarray(ts3.extras["rewrites"]), row)


def test_auto_reset_and_logging(pool):
  rules = [r for r in builtin_rules() if r.name in ("add_commute",)]
  env = LoggingWrapper(AutoResetWrapper(GraphRewriteEnv(
      [pool[0][0]], RuleSet(rules, max_locations=8), _cost, horizon=3)))
  step = jax.jit(env.step)
  state, ts = jax.jit(env.reset)(jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  lengths = []
  for _ in range(7):
    state, ts = step(state, _valid_action(np.asarray(ts.observation.action_mask), rng))
    if bool(ts.extras["episode_done"]):
      lengths.append(int(ts.extras["episode_length"]))
      assert int(ts.observation.step_count) == 0  # the next episode's first observation
      assert int(ts.extras["final_observation"].step_count) == 3
  assert lengths == [3, 3]


def test_pool_of_mismatched_capacity_is_a_clear_error(pool):
  other, _ = models.build("bert", "tiny", capacity=CAPACITY * 2)
  with pytest.raises(EnvError, match="capacity"):
    GraphRewriteEnv([pool[0][0], other], RuleSet(builtin_rules()[:1]), _cost, horizon=5)


def test_exact_candidate_delta_matches_applying(pool):
  """Every offered candidate's delta (the environment's cost is `cost.ModelCost`: deltas from
  the incremental cost) equals applying it and costing the result in full; with
  `max_candidates` below the number of valid candidates, exactly the first ones (action order)
  are offered, the rest are masked out of the observation and not actions of the step."""
  rules = [r for r in builtin_rules() if r.name in ("merge_matmul_shared_input_2",
                                                     "matmul_tanh_fuse")]
  ruleset = RuleSet(rules, max_locations=8)
  model_cost = cost.ModelCost(COEFFS)  # the deltas from the incremental cost (capacity 256)
  apply, cost_fn = jax.jit(ruleset.apply_action), jax.jit(_cost)
  full = None
  for cap in (0, 2):
    env = GraphRewriteEnv([pool[0][0]], ruleset, model_cost, horizon=5,
                          exact_candidate_delta=True, max_candidates=cap)
    state, ts = jax.jit(env.reset)(jax.random.PRNGKey(0))
    delta = np.asarray(ts.observation.candidate_delta)
    mask = np.asarray(ts.observation.action_mask)[:-1].reshape(delta.shape)
    assert (mask == np.asarray(state.match.mask)).all()
    if cap == 0:
      full = mask
      assert mask.sum() > 2  # so that the cap below removes some
    else:
      offered = np.flatnonzero(full.reshape(-1))[:cap]
      np.testing.assert_array_equal(np.flatnonzero(mask.reshape(-1)), offered)
      assert (delta[~mask] == 0).all()
      past = int(np.flatnonzero(full.reshape(-1))[cap])
      _, step = jax.jit(env.step)(state, jnp.int32(past))
      assert bool(step.extras["invalid_action"])  # not an action while past the cap
    for r, l in zip(*np.nonzero(mask)):
      new, ok = apply(state.graph, state.match, r * ruleset.max_locations + l)
      assert bool(ok)
      np.testing.assert_allclose(delta[r, l], float(cost_fn(new) - state.cost), rtol=1e-4,
                                 atol=1e-6)
  with pytest.raises(EnvError, match="max_candidates"):
    GraphRewriteEnv([pool[0][0]], ruleset, _cost, horizon=5, max_candidates=-1)


def test_benchmark_policy_only_takes_valid_actions():
  from xrlflow_jax.harness.env_benchmark import random_valid_action  # pylint: disable=g-import-not-at-top
  masks = np.random.default_rng(0).random((64, 9)) < 0.3
  masks[:, -1] = True  # stop is always valid
  keys = jax.random.split(jax.random.PRNGKey(0), 64)
  actions = np.asarray(jax.jit(jax.vmap(random_valid_action))(keys, jnp.asarray(masks)))
  assert masks[np.arange(64), actions].all()
  assert len(set(actions.tolist())) > 3  # not stuck on the stop action


def test_env_prunes_its_pool_and_never_matches_rules_that_cannot_fire(pool):
  """The pool's dead nodes are freed at construction and every graph of a random walk stays
  pruned (so `graph_cost(pruned=True)`, which the benchmark and training use, is exact); the
  rules the environment does not match (their ops cannot occur) would have found nothing."""
  b = G.GraphBuilder(seed=0)
  x = b.input((4, 8), name="x")
  h = b.dense(x, 16, activation="relu")
  y = b.softmax(b.dense(h, 8))
  b.tanh(b.matmul(h, b.weight((16, 3))))  # no output reads it
  b.output(y)
  mlp, _ = b.build(capacity=CAPACITY)
  rules = [r for r in builtin_rules() if r.name in (
      "merge_matmul_shared_input_2", "split_matmul_shared_input_2", "add_commute",
      "matmul_tanh_fuse", "transpose_cancel", "merge_conv_shared_input_bias",
      "conv_bias_relu_fuse")]
  ruleset = RuleSet(rules, max_locations=16)
  env = GraphRewriteEnv([pool[0][0], mlp], ruleset, _cost, horizon=6,
                        node_cost_fn=lambda g: cost.node_costs(g, COEFFS, pruned=True))
  assert env.firing_rules is not None and 0 < len(env.firing_rules) < len(ruleset)
  assert "merge_conv_shared_input_bias" not in {ruleset.names[i] for i in env.firing_rules}
  assert G.num_nodes(jax.tree_util.tree_map(lambda a: a[1], env.pool)) == G.num_nodes(mlp) - 3
  firing = [ruleset.rules[i] for i in sorted(env.firing_rules)]
  max_anchors = 64  # max(64, CAPACITY // 4)
  assert min(env.anchor_caps.values()) < max_anchors  # the caps do cut work
  start = [graph_op_counts([jax.tree_util.tree_map(lambda a, i=i: a[i], env.pool)])
           for i in range(env.pool_size)]
  venv = VmapWrapper(AutoResetWrapper(env))
  reset, step = jax.jit(venv.reset), jax.jit(venv.step)
  full_match = jax.jit(jax.vmap(ruleset.match))
  costs = jax.jit(jax.vmap(lambda g: jnp.stack([cost.graph_cost(g, COEFFS),
                                                cost.graph_cost(g, COEFFS, pruned=True)])))
  state, ts = reset(jax.random.split(jax.random.PRNGKey(3), 4))
  rng = np.random.default_rng(3)
  for _ in range(12):  # two episodes each (auto-reset at the horizon)
    full = full_match(state.graph)
    np.testing.assert_array_equal(np.asarray(full.mask), np.asarray(state.match.mask))
    np.testing.assert_array_equal(np.asarray(full.nodes), np.asarray(state.match.nodes))
    both = np.asarray(costs(state.graph))
    np.testing.assert_allclose(both[:, 1], both[:, 0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(state.cost), both[:, 0], rtol=1e-6)
    for b in range(4):  # every op within its bound after the episode's rewrites so far
      g = jax.tree_util.tree_map(lambda a, b=b: a[b], state.graph)
      bound = op_count_bounds(firing, start[int(state.graph_index[b])],
                              int(state.num_rewrites[b]))
      assert all(k <= bound[op] for op, k in graph_op_counts([g]).items())
    masks = np.asarray(ts.observation.action_mask)
    actions = np.array([_valid_action(m, rng) for m in masks], np.int32)
    state, ts = step(state, jnp.asarray(actions))
