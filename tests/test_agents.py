"""The learner: GAE, masked categorical, networks, PPO (no retrace, finite losses, learning past a
cost-raising rewrite that greedy cannot take), checkpoints, data parallelism on 4 CPU devices."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xrlflow_jax import GraphBuilder, cost, search, workflow
from xrlflow_jax import graph as G
from xrlflow_jax.agents import runs, training
from xrlflow_jax.agents import (Agent, AgentConfig, AgentError, MaskedCategorical, PPOConfig,
                                checkpoint, gae, make_train, ppo, runs, summaries)
from xrlflow_jax.configs import ppo as ppo_configs
from xrlflow_jax.cost import model as cost_model
from xrlflow_jax.env import GraphRewriteEnv
from xrlflow_jax.rules import RuleSet
from xrlflow_jax.rules.library import builtin_rules

from tests._graphs import toy_graph

ROOT = Path(__file__).resolve().parents[1]

# The learning problem. Cost = 1.0 per MatMul kernel + 1.5 per loop-fusion kernel (a synthetic
# cost model: the test is about the learner, not about a device). The graph
#     out = concat(x @ w1, x @ w2) + z
# costs 2 MatMuls + 1 fusion (concat+add) = 3.5. Merging the MatMuls (one MatMul, two slices
# feeding the concat) costs 1 + 2 * 1.5 = 4.0: every first rewrite raises the cost or keeps it
# (add_commute), so greedy stops at 3.5. After the merge, concat_of_slices cancels the slices:
# one MatMul + the add = 2.5, the optimum.
RULES = ("merge_matmul_shared_input_2", "split_matmul_shared_input_2", "concat_of_slices",
         "add_commute", "mul_commute")
INITIAL, OPTIMUM = 3.5, 2.5
_W = np.zeros(len(cost.FEATURE_NAMES), np.float32)
_W[cost.FEATURE_NAMES.index("matmul.launch")] = 1.0
_W[cost.FEATURE_NAMES.index("loop.launch")] = 1.5
COEFFS = cost.CostCoefficients(weights=jnp.asarray(_W), call_ms=jnp.float32(0.0),
                               device_kind="test")
SMALL = AgentConfig(head="local", hidden=32, layers=2, heads=2)
PPO = PPOConfig(num_envs=8, num_steps=8, total_timesteps=8 * 8 * 40, update_epochs=4,
                num_minibatches=2)
LEARN_UPDATES = 40


def _cost(g):
  return cost.graph_cost(g, COEFFS)


def _node_costs(g):
  return cost.node_costs(g, COEFFS)


@pytest.fixture(scope="module")
def ruleset():
  return RuleSet([r for r in builtin_rules() if r.name in RULES], max_locations=4)


_CANDIDATES_FNS = {}


def _candidates_fn(ruleset):
  """A jitted (graph, nodes, mask) -> (candidate graphs, flat actions, ok, their costs) of
  `RuleSet.candidates` over every slot, one per RuleSet."""
  if id(ruleset) not in _CANDIDATES_FNS:
    @jax.jit
    def build(g, nodes, mask):
      graphs, index, ok = ruleset.candidates(g, nodes, mask)
      return graphs, index, ok, jax.vmap(_cost)(graphs)
    _CANDIDATES_FNS[id(ruleset)] = build
  return _CANDIDATES_FNS[id(ruleset)]


@pytest.fixture(scope="module")
def env(ruleset):
  graph, _ = toy_graph()
  return GraphRewriteEnv([graph], ruleset, _cost, horizon=4, reward_scale=10.0,
                         node_cost_fn=_node_costs)


@pytest.fixture(scope="module")
def trainer(env, ruleset):
  tr = make_train(PPO, env, Agent(ruleset, _node_costs, SMALL))
  # Every test of this module updates through this one compiled function; chex counts traces.
  tr.update = jax.jit(chex.assert_max_traces(tr._update, n=1))  # pylint: disable=protected-access
  return tr


@pytest.fixture(scope="module")
def trained(trainer):
  """The run of the learning test: (states after 0, 1, 2 and LEARN_UPDATES updates, metrics)."""
  state = trainer.init(jax.random.PRNGKey(0))
  states, history = [state], []
  for i in range(LEARN_UPDATES):
    state, metrics = trainer.update(state)
    history.append({k: float(v) for k, v in metrics.items()})
    if i < 2:
      states.append(state)
  states.append(state)
  return states, history


# ----------------------------------------------------------------------------------------------
# GAE
# ----------------------------------------------------------------------------------------------

def _reference_gae(rewards, values, discounts, lasts, boot, last_value, gamma, lam):
  """Per environment, per step: the lambda-return written out episode by episode."""
  t_max, b_max = rewards.shape
  adv = np.zeros_like(rewards)
  for b in range(b_max):
    for t in range(t_max):
      total, weight = 0.0, 1.0
      for u in range(t, t_max):
        if lasts[u, b]:
          next_v = boot[u, b]
        elif u + 1 < t_max:
          next_v = values[u + 1, b]
        else:
          next_v = last_value[b]
        delta = rewards[u, b] + gamma * discounts[u, b] * next_v - values[u, b]
        total += weight * delta
        if lasts[u, b]:
          break
        weight *= gamma * lam * discounts[u, b]
      adv[t, b] = total
  return adv


def test_gae_hand_computed_truncation_and_termination():
  gamma, lam = 0.5, 0.5
  # One environment, 3 steps: an episode truncated at step 1 (bootstrap 10 from its final
  # observation, not 7 from the next episode's first one), then a new episode.
  rewards = np.array([[1.0], [2.0], [3.0]], np.float32)
  values = np.array([[4.0], [5.0], [7.0]], np.float32)
  discounts = np.ones([3, 1], np.float32)
  lasts = np.array([[False], [True], [False]])
  boot = np.array([[0.0], [10.0], [0.0]], np.float32)
  last_value = np.array([8.0], np.float32)
  adv, targets = gae(rewards, values, discounts, lasts, boot, last_value, gamma, lam)
  # delta2 = 3 + .5 * 8 - 7 = 0; delta1 = 2 + .5 * 10 - 5 = 2; delta0 = 1 + .5 * 5 - 4 = -0.5
  # adv2 = 0; adv1 = 2 (the episode ended, nothing flows back from step 2);
  # adv0 = -0.5 + .25 * 2 = 0.
  np.testing.assert_allclose(np.asarray(adv)[:, 0], [0.0, 2.0, 0.0], atol=1e-6)
  np.testing.assert_allclose(np.asarray(targets)[:, 0], [4.0, 7.0, 7.0], atol=1e-6)
  # Terminated at step 1 instead (discount 0): no bootstrap at all.
  discounts[1, 0] = 0.0
  adv, _ = gae(rewards, values, discounts, lasts, boot, last_value, gamma, lam)
  # delta1 = 2 - 5 = -3; adv0 = -0.5 + .25 * -3 = -1.25.
  np.testing.assert_allclose(np.asarray(adv)[:, 0], [-1.25, -3.0, 0.0], atol=1e-6)


def test_gae_matches_episode_by_episode_reference():
  rng = np.random.default_rng(0)
  t_max, b_max = 9, 4
  rewards = rng.normal(size=(t_max, b_max)).astype(np.float32)
  values = rng.normal(size=(t_max, b_max)).astype(np.float32)
  lasts = np.zeros((t_max, b_max), bool)
  discounts = np.ones((t_max, b_max), np.float32)
  lasts[2, 0], discounts[2, 0] = True, 0.0  # terminated
  lasts[5, 0] = True  # truncated
  lasts[3, 1] = True  # truncated
  lasts[8, 2], discounts[8, 2] = True, 0.0  # terminated on the rollout's last step
  boot = np.where(lasts, rng.normal(size=(t_max, b_max)), 0.0).astype(np.float32)
  last_value = rng.normal(size=b_max).astype(np.float32)
  adv, targets = jax.jit(gae, static_argnums=(6, 7))(rewards, values, discounts, lasts, boot,
                                                      last_value, 0.99, 0.95)
  ref = _reference_gae(rewards, values, discounts, lasts, boot, last_value, 0.99, 0.95)
  np.testing.assert_allclose(np.asarray(adv), ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(targets), ref + values, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# Masked categorical
# ----------------------------------------------------------------------------------------------

def test_masked_categorical_never_samples_masked_actions():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(64, 12)).astype(np.float32) * 3
  mask = rng.random((64, 12)) < 0.3
  mask[:, -1] = True
  logits[~mask] = 50.0  # masked actions would dominate if the mask leaked
  dist = MaskedCategorical(jnp.asarray(logits), jnp.asarray(mask))
  keys = jax.random.split(jax.random.PRNGKey(0), 300)
  samples = np.asarray(jax.vmap(dist.sample)(keys))  # [300, 64]
  assert mask[np.arange(64)[None, :], samples].all()
  probs = np.exp(np.asarray(dist.log_probs))
  assert (probs[~mask] == 0).all()
  np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
  valid = np.where(mask, logits, -np.inf)
  p = np.exp(valid - valid.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  np.testing.assert_allclose(probs, p, rtol=1e-5, atol=1e-7)
  ent = -np.sum(np.where(mask, p * np.log(np.where(mask, p, 1.0)), 0.0), -1)
  np.testing.assert_allclose(np.asarray(dist.entropy()), ent, rtol=1e-5, atol=1e-6)
  freq = np.mean(samples[:, 0:1] == np.arange(12)[None, :], axis=0)
  assert np.abs(freq - p[0]).max() < 0.1
  grad = jax.grad(lambda l: MaskedCategorical(l, jnp.asarray(mask)).entropy().sum())(
      jnp.asarray(logits))
  assert np.isfinite(np.asarray(grad)).all() and (np.asarray(grad)[~mask] == 0).all()


# ----------------------------------------------------------------------------------------------
# Networks
# ----------------------------------------------------------------------------------------------

def test_encoder_ignores_free_slots_and_padding_edges():
  """The graph embedding is the same at two capacities and after moving nodes to other slots."""
  from xrlflow_jax.agents import GraphEncoder, encoder_inputs  # pylint: disable=g-import-not-at-top
  enc = GraphEncoder(hidden=16, layers=2, heads=2)

  def inputs(graph):  # costs that follow the nodes (cheaper to compile than the cost model)
    costs = jnp.where(graph.nodes["alive"], 0.1 * (graph.nodes["op"] + 1.0), 0.0)
    return encoder_inputs(graph, costs, jnp.sum(costs))

  g32, _ = toy_graph(32)
  g48, _ = toy_graph(48)
  n = G.capacity(g48)
  perm = np.random.default_rng(0).permutation(n)  # new slot i holds old slot perm[i]
  moved = G.permute_slots(g48, perm)
  x32 = jax.jit(inputs)(g32)
  params = jax.jit(enc.init)(jax.random.PRNGKey(0), x32)
  embed = jax.jit(lambda x: enc.apply(params, x))
  h32, e32 = embed(x32)
  h48, e48 = embed(jax.jit(inputs)(g48))
  hm, em = embed(jax.jit(inputs)(moved))
  np.testing.assert_allclose(np.asarray(e32), np.asarray(e48), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(e48), np.asarray(em), rtol=1e-4, atol=1e-5)
  alive = np.asarray(g48.nodes["alive"])
  np.testing.assert_allclose(np.asarray(hm)[np.argsort(perm)][alive], np.asarray(h48)[alive],
                             rtol=1e-4, atol=1e-5)
  assert (np.asarray(h48)[~alive] == 0).all() and np.isfinite(np.asarray(e48)).all()
  np.testing.assert_allclose(np.asarray(h32)[:int(alive.sum())],
                             np.asarray(h48)[:int(alive.sum())], rtol=1e-4, atol=1e-5)


def _shared_input_graph(capacity: int = 32):
  """x feeds three consumers (two MatMuls and x * x: one node on two input slots of another);
  a three-input Concat; free slots after the nodes."""
  b = GraphBuilder()
  x = b.input([8, 16])
  w1, w2 = b.weight([16, 16]), b.weight([16, 16])
  y = b.concat([b.matmul(x, w1), b.matmul(x, w2), b.mul(x, x)], axis=1)
  b.output(b.add(y, b.input([8, 48])))
  return b.build(capacity=capacity)[0]


def test_gat_layer_equals_the_per_edge_formulation():
  """The GAT layer (sender terms summed per node and gathered once per tensor, receiver and
  slot terms broadcast, the backward direction's per-producer constant terms folded) is the
  per-edge formulation's function: same parameters, same outputs."""
  from xrlflow_jax.agents import encoder_inputs  # pylint: disable=g-import-not-at-top
  from xrlflow_jax.agents import networks
  from xrlflow_jax.harness import train_benchmark as benchmark  # pylint: disable=g-import-not-at-top
  graph = _shared_input_graph()
  n, k, hid = G.capacity(graph), G.max_inputs(graph), 16
  costs = jnp.where(graph.nodes["alive"], jnp.linspace(0.1, 1.0, n), 0.0)
  x = jax.jit(encoder_inputs)(graph, costs, jnp.sum(costs))
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  alive = np.asarray(graph.nodes["alive"])
  h = jnp.where(alive[:, None], jax.random.normal(keys[0], (n, hid)), 0.0)
  g = jax.random.normal(keys[1], (hid,))
  t = jnp.where(alive[:, None], jax.random.normal(keys[2], (n, hid)), 0.0)
  slot = jax.random.normal(keys[3], (k, hid))

  @jax.jit
  def both(h, g, t, slot, x):  # one compile for both (XLA:CPU compiles take seconds)
    out = []
    for layer in (networks.GATLayer, benchmark.PerEdgeGATLayer):
      params = layer(hid, 2).init(jax.random.PRNGKey(1), h, g, t, slot, x)
      # Perturbed: attention far from uniform, nonzero biases.
      params = jax.tree_util.tree_map(
          lambda p: p + 0.5 * jax.random.normal(jax.random.PRNGKey(p.size), p.shape), params)
      out.append((params, layer(hid, 2).apply(params, h, g, t, slot, x)))
    return out

  (params, (h1, g1)), (ref_params, (h_ref, g_ref)) = both(h, g, t, slot, x)
  chex.assert_trees_all_equal(params, ref_params)  # same names, shapes and initial values
  assert np.abs(np.asarray(h1)[alive]).max() > 0.1
  np.testing.assert_allclose(np.asarray(h1), np.asarray(h_ref), rtol=1e-5, atol=2e-5)
  np.testing.assert_allclose(np.asarray(g1), np.asarray(g_ref), rtol=1e-5, atol=2e-5)


def test_local_head_reads_only_the_slots_each_rule_binds(env, ruleset):
  """The local head gathers each rule's own P_r matched nodes (rules grouped by width), not all
  P slots of every rule: the same function (same parameters; logits, value and the PPO
  gradient) as the product over all P slots, whose extra slots are always unmatched."""
  widths = tuple(r.num_bound for r in ruleset.rules)
  assert len(set(widths)) > 1 and min(widths) < ruleset.num_bound  # groups, and slots skipped
  agent = Agent(ruleset, _node_costs, SMALL)
  assert agent.network.rule_widths == widths
  every_slot = Agent(ruleset, _node_costs, SMALL)
  every_slot.network = every_slot.network.clone(rule_widths=None)
  obs = jax.jit(env.reset)(jax.random.PRNGKey(0))[1].observation
  params = jax.jit(agent.init)(jax.random.PRNGKey(1), obs)
  # Perturbed so every slot's kernel rows matter (the initial bias is zero).
  params = jax.tree_util.tree_map(
      lambda p: p + 0.3 * jax.random.normal(jax.random.PRNGKey(p.size), p.shape), params)
  chex.assert_trees_all_equal_shapes(params, jax.jit(every_slot.init)(jax.random.PRNGKey(1), obs))

  @jax.jit
  def both(params, obs):
    out = []
    for a in (agent, every_slot):
      def loss(q, a=a):
        logits, value = a.apply(q, obs)
        return jnp.sum(jax.nn.log_softmax(logits)[:-1] * obs.action_mask[:-1]) + value
      out.append((a.apply(params, obs), jax.grad(loss)(params)))
    return out

  ((logits, value), grad), ((ref_logits, ref_value), ref_grad) = both(params, obs)
  mask = np.asarray(obs.action_mask)
  assert mask[:-1].any()
  np.testing.assert_allclose(np.asarray(logits)[mask], np.asarray(ref_logits)[mask], rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-5, atol=1e-5)
  chex.assert_trees_all_close(grad, ref_grad, rtol=1e-4, atol=1e-5)
  assert float(jnp.abs(grad["params"]["slot_in"]["kernel"]).max()) > 0.0
  bad = Agent(ruleset, _node_costs, SMALL)
  bad.network = bad.network.clone(rule_widths=widths[:-1])
  with pytest.raises(AgentError, match="rule_widths"):
    bad.init(jax.random.PRNGKey(1), obs)


def test_compacted_local_head_scores_the_valid_candidates_as_the_dense_head(env, ruleset):
  """With `max_candidates` slots the local head scores only the valid candidates, compacted in
  action order: the same logits at valid actions, value and PPO gradient (same parameters) as
  the head over all R * L; with fewer slots than valid candidates, those past the last slot are
  not offered (-1e9) and the others keep their logits."""
  obs = jax.jit(env.reset)(jax.random.PRNGKey(0))[1].observation
  valid = np.flatnonzero(np.asarray(obs.action_mask[:-1]))
  assert len(valid) >= 2
  agents = {slots: Agent(ruleset, _node_costs, dataclasses.replace(SMALL, max_candidates=slots))
            for slots in (0, len(valid) + 3, len(valid) - 1)}
  params = jax.jit(agents[0].init)(jax.random.PRNGKey(1), obs)
  params = jax.tree_util.tree_map(
      lambda p: p + 0.3 * jax.random.normal(jax.random.PRNGKey(p.size), p.shape), params)
  for a in agents.values():  # the same parameters for every slot count
    chex.assert_trees_all_equal_shapes(params, jax.jit(a.init)(jax.random.PRNGKey(1), obs))

  @jax.jit
  def run(params, obs):
    out = {}
    for slots, a in agents.items():
      def loss(q, a=a):
        logits, value = a.apply(q, obs)
        return jnp.sum(MaskedCategorical(logits, obs.action_mask).log_probs * obs.action_mask) + value
      out[slots] = (a.apply(params, obs), jax.grad(loss)(params))
    return out

  out = run(params, obs)
  (dense, dense_value), dense_grad = out[0]
  (logits, value), grad = out[len(valid) + 3]
  dense, logits = np.asarray(dense), np.asarray(logits)
  np.testing.assert_allclose(logits[valid], dense[valid], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(logits[-1], dense[-1], rtol=1e-5, atol=1e-5)  # stop
  np.testing.assert_allclose(float(value), float(dense_value), rtol=1e-5, atol=1e-5)
  # The same sums in another order: float32 errors relative to the gradient's largest entry.
  scale = max(float(np.abs(np.asarray(x)).max()) for x in jax.tree_util.tree_leaves(dense_grad))
  chex.assert_trees_all_close(grad, dense_grad, rtol=1e-4, atol=1e-5 * scale)
  assert float(jnp.abs(grad["params"]["slot_in"]["kernel"]).max()) > 0.0
  short = np.asarray(out[len(valid) - 1][0][0])
  np.testing.assert_allclose(short[valid[:-1]], dense[valid[:-1]], rtol=1e-5, atol=1e-5)
  assert short[valid[-1]] == -1e9


@pytest.mark.slow  # compiles the rules' matcher; see README for -m slow
def test_local_head_does_not_depend_on_padding(ruleset):
  agent = Agent(ruleset, _node_costs, AgentConfig(hidden=16, layers=2, heads=2))
  obs = []
  for capacity in (32, 48):
    graph, _ = toy_graph(capacity)
    e = GraphRewriteEnv([graph], ruleset, _cost, horizon=4, node_cost_fn=_node_costs)
    obs.append(jax.jit(e.reset)(jax.random.PRNGKey(0))[1].observation)
  params = jax.jit(agent.init)(jax.random.PRNGKey(1), obs[0])
  apply = jax.jit(lambda p, o: (*agent.apply(p, o), agent.value(p, o)))
  (l32, v32, value32), (l48, v48, _) = [apply(params, o) for o in obs]
  assert l32.shape == (ruleset.num_actions + 1,)
  np.testing.assert_allclose(np.asarray(l32), np.asarray(l48), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(float(v32), float(v48), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(float(value32), float(v32), rtol=1e-5, atol=1e-6)
  # The observation's node costs (computed once by the environment) are what the agent would
  # otherwise compute itself.
  assert obs[0].node_costs is not None
  l_own, v_own, value_own = apply(params, obs[0].replace(node_costs=None))
  np.testing.assert_allclose(np.asarray(l_own), np.asarray(l32), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(float(v_own), float(v32), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(float(value_own), float(value32), rtol=1e-6, atol=1e-6)


@pytest.mark.slow  # compiles the rules' matcher and edit kernel; see README for -m slow
def test_candidate_graphs_match_applying_each_action(ruleset):
  graph, _ = toy_graph()
  graph = ruleset.jit_apply_action(graph, ruleset.jit_match(graph), 0)[0]  # the merge
  match = ruleset.jit_match(graph)  # now concat_of_slices and split apply too
  l = ruleset.max_locations
  mask = np.asarray(match.mask)
  graphs, index, ok, costs = _candidates_fn(ruleset)(graph, match.nodes, match.mask)
  costs, index, ok = np.asarray(costs), np.asarray(index), np.asarray(ok)
  valid = np.flatnonzero(mask.reshape(-1))
  count = len(valid)
  assert count >= 3 and ok[:count].all() and not ok[count:].any()
  np.testing.assert_array_equal(index[:count], valid)  # compacted, in action order
  for i, a in enumerate(valid):
    expect, applied = ruleset.jit_apply_action(graph, match, a)
    assert bool(applied)
    got = jax.tree_util.tree_map(lambda x, i=i: x[i], graphs)
    assert G.structural_hash(got) == G.structural_hash(expect), ruleset.names[a // l]
    np.testing.assert_allclose(costs[i], float(_cost(expect)), rtol=1e-6)
  assert costs[:count].min() == pytest.approx(OPTIMUM)


@pytest.mark.slow  # compiles the rules' matcher and edit kernel; see README for -m slow
def test_candidates_head_scores_every_action(env, ruleset):
  agent = Agent(ruleset, _node_costs, AgentConfig(head="candidates", hidden=16, layers=1,
                                                  heads=2))
  _, ts = jax.jit(env.reset)(jax.random.PRNGKey(0))

  @jax.jit
  def init_apply(key, obs):
    params = agent.init(key, obs)
    return agent.apply(params, obs)

  logits, value = init_apply(jax.random.PRNGKey(0), ts.observation)
  assert logits.shape == (env.num_actions,) and np.isfinite(np.asarray(logits)).all()
  assert np.isfinite(float(value))


@pytest.mark.slow  # compiles the candidates head twice; see README for -m slow
def test_candidates_head_compacts_valid_candidates(env, ruleset):
  """Compacted into as many slots as there are valid candidates, the head gives the logits of
  the all-slots head on every valid action; with fewer slots, the candidates past the last
  slot are not offered (-1e9) and the others keep their logits."""
  _, ts = jax.jit(env.reset)(jax.random.PRNGKey(0))
  obs = ts.observation
  valid = np.flatnonzero(np.asarray(obs.action_mask[:-1]))
  assert len(valid) >= 2
  logits = {}
  for slots in (0, len(valid), len(valid) - 1):
    agent = Agent(ruleset, _node_costs, AgentConfig(head="candidates", hidden=16, layers=1,
                                                    heads=2, max_candidates=slots))
    params = jax.jit(agent.init)(jax.random.PRNGKey(0), obs)  # same shapes for every slots
    logits[slots] = np.asarray(jax.jit(agent.apply)(params, obs)[0])
  np.testing.assert_allclose(logits[len(valid)][valid], logits[0][valid], rtol=1e-5, atol=1e-6)
  short = logits[len(valid) - 1]
  np.testing.assert_allclose(short[valid[:-1]], logits[0][valid[:-1]], rtol=1e-5, atol=1e-6)
  assert short[valid[-1]] == -1e9
  with pytest.raises(AgentError, match="max_candidates"):
    AgentConfig(head="candidates", max_candidates=-1).validate()


def test_benchmark_variants_change_the_named_fields_only(trainer):
  """`agent:` and `ppo:` variants of the training benchmark rebuild the learner with those
  fields changed, on the same environment; a bad field or value is a clear error."""
  from xrlflow_jax.harness import train_benchmark as benchmark  # pylint: disable=g-import-not-at-top
  v = benchmark.variant("agent:hidden=16+max_candidates=7+remat=true", trainer)
  assert v.trainer.env is trainer.env and v.trainer.config == trainer.config
  assert v.trainer.agent.config == dataclasses.replace(trainer.agent.config, hidden=16,
                                                       max_candidates=7, remat=True)
  v = benchmark.variant("ppo:num_minibatches=1+clip_eps=0.1", trainer)
  assert v.trainer.agent is trainer.agent
  assert v.trainer.config == dataclasses.replace(trainer.config, num_minibatches=1,
                                                 clip_eps=0.1)
  for bad, match in (("agent:width=3", "AgentConfig"), ("agent:hidden=wide", "int"),
                     ("agent:remat=maybe", "true or false"), ("ppo:epochs=1", "PPOConfig"),
                     ("global", "unknown variant")):
    with pytest.raises(ValueError, match=match):
      benchmark.variant(bad, trainer)


def test_named_configs_train_the_models_they_name():
  """`--config=...ppo.py:<arg>`: the run names pick their model (the training binary's default
  is `test`), a zoo name a tiny model unless suffixed, and onnx= a file."""
  assert ppo_configs.get_config("test").model.name == "squeezenet1_1"
  job = ppo_configs.get_config("job")
  assert (job.model.name, job.env.horizon) == ("nasrnn", 20)
  bert = ppo_configs.get_config("bert,default")
  assert (bert.model.name, bert.model.size) == ("bert", "default")
  assert ppo_configs.get_config("vit").model.size == "tiny"
  onnx = ppo_configs.get_config("onnx=/x/y.onnx")
  assert (onnx.model.onnx, onnx.model.name) == ("/x/y.onnx", "")


def test_a_pool_mixes_sizes_and_names_each_graph_once():
  """`runs.load_pool`: "+"-joined models, each at the config's size or its own after a comma,
  and shape variants, at one capacity; a graph named twice is refused."""
  model = ppo_configs.get_config("test").model
  model.capacity = 0
  model.name = "squeezenet1_1+squeezenet1_1,default+nasrnn"
  names, graphs, _ = runs.load_pool(model)
  assert names == ["squeezenet1_1[tiny]", "squeezenet1_1", "nasrnn[tiny]"]
  assert len({G.capacity(g) for g in graphs}) == 1
  assert G.num_nodes(graphs[0]) == G.num_nodes(graphs[1])
  model.name = "squeezenet1_1+squeezenet1_1,image=48"
  names, graphs, _ = runs.load_pool(model)
  assert names == ["squeezenet1_1", "squeezenet1_1[image=48]"]
  model.name = "nasrnn+nasrnn,tiny"
  with pytest.raises(AgentError, match="names a graph twice"):
    runs.load_pool(model)
  model.name = "nasrnn,tiny,default"
  with pytest.raises(AgentError, match="2 sizes"):
    runs.load_pool(model)


def test_bad_configs_are_clear_errors(env, ruleset):
  with pytest.raises(AgentError, match="head"):
    Agent(ruleset, _node_costs, AgentConfig(head="global"))
  with pytest.raises(AgentError, match="divisible"):
    make_train(PPOConfig(num_envs=6, num_steps=5, num_minibatches=4), env,
               Agent(ruleset, _node_costs, SMALL))
  with pytest.raises(AgentError, match="unknown PPO config keys"):
    PPOConfig.from_mapping({"num_env": 4})


# ----------------------------------------------------------------------------------------------
# PPO
# ----------------------------------------------------------------------------------------------

@pytest.mark.slow  # compiles a full training run; see README for -m slow
def test_no_retrace_and_finite_losses(trainer, trained):
  states, history = trained
  assert trainer.update._cache_size() == 1  # pylint: disable=protected-access
  for m in history:
    for k in ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "grad_norm"):
      assert np.isfinite(m[k]), (k, m)
  assert history[-1]["env_steps"] == LEARN_UPDATES * PPO.batch_size
  assert int(states[-1].update) == LEARN_UPDATES
  assert not any(m["invalid_frac"] for m in history), "the policy chose a masked action"


def _greedy(ruleset, graph) -> float:
  """Greedy search on the modelled cost: take the best rewrite while it lowers the cost."""
  current = float(_cost(graph))
  while True:
    match = ruleset.jit_match(graph)
    graphs, _, ok, costs = _candidates_fn(ruleset)(graph, match.nodes, match.mask)
    costs = np.where(np.asarray(ok), np.asarray(costs), np.inf)
    best = int(np.argmin(costs))
    if not float(costs[best]) < current - 1e-6:
      return current
    graph = jax.tree_util.tree_map(lambda x: x[best], graphs)
    current = float(costs[best])


@pytest.mark.slow  # compiles a full training run; see README for -m slow
def test_ppo_learns_a_cost_raising_rewrite_that_greedy_misses(env, ruleset, trainer, trained):
  graph, params = toy_graph()
  assert float(_cost(graph)) == pytest.approx(INITIAL)
  assert _greedy(ruleset, graph) == pytest.approx(INITIAL), "greedy should be stuck"
  states, history = trained
  final = states[-1]
  assert float(final.best_cost[0]) == pytest.approx(OPTIMUM)
  # The trained policy's own search (`search.policy`, the one inference path), acting on its
  # most likely action only, walks through the cost increase to the optimum.
  result = search.policy(graph, params, search.Expander(ruleset, COEFFS), agent=trainer.agent,
                         network_params=final, env=env, num_samples=0)
  assert result.best_cost_ms == pytest.approx(OPTIMUM)
  path = [float(_cost(search.replay(graph, ruleset, result.rewrites[:k])))
          for k in range(len(result.rewrites) + 1)]
  assert max(path) > INITIAL, path  # it accepted the temporary loss
  assert path[-1] == pytest.approx(OPTIMUM), path
  # And the sampling policy reaches the optimum in (almost) every episode by the end.
  assert history[-1]["episode_best_ratio"] == pytest.approx(OPTIMUM / INITIAL, abs=0.02)
  # The best graph comes with the rewrites that made it: replaying them rebuilds it.
  count = int(final.best_num_rewrites[0])
  rows = np.asarray(final.best_rewrites[0])
  assert count >= 2 and (rows[count:] == -1).all()
  steps = [search.RewriteStep(ruleset.names[int(r[0])], int(r[0]), int(r[1]),
                              tuple(int(v) for v in r[2:])) for r in rows[:count]]
  best = jax.tree_util.tree_map(lambda a: np.asarray(a)[0], final.best_graph)
  assert G.structural_hash(search.replay(graph, ruleset, steps)) == G.structural_hash(best)


@pytest.mark.slow  # needs the trained fixture (a full training compile)
@pytest.mark.parametrize("backend", ["auto", "msgpack"])
def test_checkpoint_round_trip_and_resume(trainer, trained, tmp_path, backend):
  states, _ = trained
  s1, s2 = states[1], states[2]
  checkpoint.save(tmp_path, 1, s1, backend=backend)
  fresh = states[0]  # same structure, other values
  restored, step = checkpoint.restore(tmp_path, fresh)
  assert step == 1
  chex.assert_trees_all_equal(restored, s1)
  resumed, _ = trainer.update(restored)
  chex.assert_trees_all_equal(resumed, s2)  # resuming reproduces the uninterrupted run
  assert trainer.update._cache_size() == 1  # pylint: disable=protected-access
  with pytest.raises(checkpoint.CheckpointError, match="leaf"):
    checkpoint.restore(tmp_path, fresh.replace(update=jnp.zeros([2], jnp.int32)))


def test_csv_writer_resumes(tmp_path):
  path = tmp_path / "m.csv"
  w = summaries.CsvWriter(path, ["a", "b"])
  for u in range(1, 5):
    w.write(u, 0, {"a": u, "b": 2 * u})
  summaries.CsvWriter(path, ["a", "b"], resume_from=2).write(3, 0, {"a": 30.0})
  data = summaries.read_csv(path)
  np.testing.assert_array_equal(data["update"], [1, 2, 3])
  np.testing.assert_array_equal(data["a"], [1, 2, 30])
  assert np.isnan(data["b"][-1])


# ----------------------------------------------------------------------------------------------
# Data parallelism and seeds (a subprocess: the device count is fixed when JAX starts)
# ----------------------------------------------------------------------------------------------

_MULTI_DEVICE = textwrap.dedent("""
    import jax, numpy as np
    from tests import test_agents as T
    from xrlflow_jax.agents import Agent, AgentConfig, PPOConfig, make_train
    from xrlflow_jax.configs import ppo as ppo_configs
    from xrlflow_jax.env import GraphRewriteEnv
    from xrlflow_jax.rules import RuleSet
    from xrlflow_jax.rules.library import builtin_rules
    assert len(jax.devices()) == 4, jax.devices()
    rs = RuleSet([r for r in builtin_rules() if r.name in T.RULES[:3]], max_locations=2)
    graph, _ = T.toy_graph(32)
    env = GraphRewriteEnv([graph], rs, T._cost, horizon=3, reward_scale=10.0,
                          node_cost_fn=T._node_costs)
    agent = Agent(rs, T._node_costs, AgentConfig(hidden=16, layers=1, heads=2))
    cfg = PPOConfig(num_envs=8, num_steps=4, total_timesteps=8 * 4 * 2, update_epochs=2,
                    num_minibatches=2)
    out = {{}}
    for name, devices in (("one", jax.devices()[:1]), ("four", jax.devices())):
      tr = make_train(cfg, env, agent, devices=devices)
      state, metrics = tr(jax.random.PRNGKey(3))
      out[name] = (state, metrics)
      leaf = jax.tree_util.tree_leaves(state.env_state)[0]
      print(name, "env state on", len(leaf.sharding.device_set), "devices")
    (s1, m1), (s4, m4) = out["one"], out["four"]
    assert len(jax.tree_util.tree_leaves(s4.env_state)[0].sharding.device_set) == 4
    for k in m1:
      np.testing.assert_allclose(np.asarray(m1[k]), np.asarray(m4[k]), rtol=1e-4, atol=1e-5,
                                 err_msg=k)
    for a, b in zip(jax.tree_util.tree_leaves(s1.params), jax.tree_util.tree_leaves(s4.params)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    # Two seeds at once (vmap) on the 4-device mesh equal the seeds run one by one.
    keys = jax.random.split(jax.random.PRNGKey(5), 2)
    states, metrics = tr.train_seeds(keys)
    for i in range(2):
      s, m = tr(keys[i])
      np.testing.assert_allclose(np.asarray(metrics["loss"][i]), np.asarray(m["loss"]),
                                 rtol=1e-4, atol=1e-5)
      np.testing.assert_allclose(np.asarray(states.best_cost[i]), np.asarray(s.best_cost))
    print("OK")
""")


@pytest.mark.slow
def test_four_cpu_devices_match_one_device(xla_defaults_env):
  """Training on a 4-device mesh equals one device (and vmapped seeds equal single seeds).

  Under XLA's default code generation: the suite's fast-compile flags (LLVM -O0, the classic
  emitter) give gradients that differ in reduction order between the two meshes, and Adam
  turns that noise in near-zero gradients into ~1e-4 parameter differences (measured
  2026-12-05), which PPO then grows; with the defaults the meshes agree to ~1e-8."""
  env = dict(xla_defaults_env)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4")
  env["JAX_PLATFORMS"] = "cpu"
  script = _MULTI_DEVICE.replace("{{", "{").replace("}}", "}")
  proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True,
                        text=True, timeout=1500, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
  assert "OK" in proc.stdout


def test_chunk_size_is_the_largest_divisor_within_the_wish():
  for n in range(1, 61):
    for wanted in range(0, 25):
      c = ppo.chunk_size(n, wanted)
      assert n % c == 0 and 1 <= c <= max(1, min(wanted, n)), (n, wanted, c)
      assert not any(n % d == 0 for d in range(c + 1, min(wanted, n) + 1)), (n, wanted, c)


@pytest.mark.slow  # compiles two PPO chunk lengths; see README for -m slow
def test_chunked_training_equals_one_call_and_stops_at_its_time_budget():
  """The one training path (agents.training.train_ppo) runs in chunks: the result
  equals one jitted call of all updates, and a time budget stops it after the first chunk past
  it with the steps it took recorded."""
  loaded = workflow.load("squeezenet1_1", size="tiny", capacity=128)
  config = ppo_configs.get_config("test")
  config.ppo.total_timesteps = config.ppo.num_envs * config.ppo.num_steps * 4  # 4 updates
  coeffs = cost.load_coefficients()
  args = (["sq"], [loaded.graph], [loaded.params], config, coeffs)
  lines: list[str] = []
  full = training.train_ppo(*args, log=lines.append, updates_per_chunk=2)
  batch = full.run.trainer.config.batch_size
  assert full.env_steps == 4 * batch and len(full.metrics["loss"]) == 4
  assert sum("update " in s for s in lines) == 2  # one progress line per chunk
  tr = full.run.trainer
  state, metrics = tr.run(tr.init(jax.random.PRNGKey(int(config.seed))), 4)
  chex.assert_trees_all_close(state.params, full.state.params, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(metrics["loss"]), full.metrics["loss"], rtol=1e-5)
  lines.clear()
  cut = training.train_ppo(*args, log=lines.append, updates_per_chunk=2, max_seconds=0.0)
  assert cut.env_steps == 2 * batch and len(cut.metrics["loss"]) == 2
  assert int(cut.state.update) == 2
  assert any("stopped at the time budget" in s for s in lines)


def test_a_run_that_returns_nothing_has_learned_nothing():
  """`training.learned_something`: the restart test of `train_ppo` (a run collapsed to
  stopping returns 0; NaN marks updates where no episode ended)."""
  assert training.learned_something(np.array([0.2, np.nan, 0.1]))
  assert not training.learned_something(np.array([0.0, -0.0, 0.0]))
  assert not training.learned_something(np.array([-0.5, 0.3]))
  assert not training.learned_something(np.array([np.nan, np.nan]))
  assert not training.learned_something(np.zeros([0]))


@pytest.mark.slow  # compiles a PPO chunk; see README for -m slow
def test_a_run_that_learns_nothing_is_followed_by_the_next_seed():
  """`config.restarts`: with one rule that only raises the cost (unfusing a conv's ReLU), no
  run can return a gain, so every allowed run is trained, from consecutive seeds with the one
  compiled chunk, and the lowest best cost is kept (all equal the input's: the first)."""
  loaded = workflow.load("squeezenet1_1", size="tiny", capacity=128)
  config = ppo_configs.get_config("test")
  config.ppo.total_timesteps = config.ppo.num_envs * config.ppo.num_steps * 2  # 2 updates
  config.env.rules = ("conv_bias_relu_unfuse",)
  config.restarts = 3
  config.seed = 5
  lines: list[str] = []
  trained = training.train_ppo(["sq"], [loaded.graph], [loaded.params], config,
                               cost.load_coefficients(), log=lines.append, updates_per_chunk=2)
  batch = trained.run.trainer.config.batch_size
  assert len(trained.restart_ratios) == 3 and trained.env_steps == 3 * 2 * batch
  assert trained.restart_ratios == (1.0, 1.0, 1.0) and trained.seed == 5
  assert trained.chunk_programs == 1
  assert [s.strip().split(":")[0] for s in lines if "update 2/2" in s] == [
      "seed 5", "seed 6", "seed 7"]
  assert any("kept seed 5, the best of 3 runs" in s for s in lines)


def test_training_environment_costs_with_a_kernel_table():
  """runs.build(kernels=...): the environment's reward cost and node costs are the cost model
  with those measured kernels (what the searches and the policy's rollouts use), not the
  roofline's."""
  graph, params = toy_graph()
  keys = np.unique(np.asarray(jax.jit(cost_model.kernel_keys)(graph)))
  keys = np.sort(keys[keys != cost_model.NO_KERNEL]).astype(np.uint32)
  assert len(keys) >= 1  # the toy graph's MatMuls
  table = cost.KernelTable(keys=jnp.asarray(keys), ms=jnp.full([len(keys)], 7.0, jnp.float32))
  config = ppo_configs.get_config("test")
  config.env.rules = RULES
  run = runs.build(config, coeffs=COEFFS, pool=(["toy"], [graph], [params]), kernels=table)
  with_table = float(cost.graph_cost(graph, COEFFS, kernels=table))
  assert with_table != pytest.approx(float(cost.graph_cost(graph, COEFFS)))
  assert float(jax.jit(run.env.cost_fn)(graph)) == pytest.approx(with_table, rel=1e-6)
  np.testing.assert_allclose(np.asarray(jax.jit(run.env.node_cost_fn)(graph)),
                             np.asarray(cost.node_costs(graph, COEFFS, kernels=table)), rtol=1e-6)


@pytest.mark.slow  # ~120 s on 2 cores: measures the rewritten graphs' kernels; see README
def test_training_costs_every_graph_it_holds_as_the_search_does():
  """One cost for a graph: with a live kernel table (`train_ppo(kernels=...)`) that starts
  with the input's kernels only, training measures the kernels of the rewritten graphs it
  meets, so every graph its state holds (each environment's current graph, each pool graph's
  best) carries the cost the search's model gives it, not a roofline estimate of the kernels
  the table lacked."""
  from xrlflow_jax.cost import kernel_table  # pylint: disable=g-import-not-at-top
  from xrlflow_jax.env import wrappers  # pylint: disable=g-import-not-at-top
  loaded = workflow.load("squeezenet1_1", size="tiny", capacity=128)
  config = ppo_configs.get_config("test")
  config.ppo.total_timesteps = config.ppo.num_envs * config.ppo.num_steps * 2  # 2 updates
  config.env.rules = ("merge_conv_shared_input_bias", "enlarge_conv_kernel_bias_sib_bias")
  kernels = kernel_table.KernelTimes()
  kernels.use_for(loaded.graph)
  kernels.add(loaded.graph)  # the input's kernels only: every rewrite makes new ones
  coeffs = cost.load_coefficients()
  compiles = []

  def on_compile(event, seconds, **info):
    if event == "/jax/core/compile/backend_compile_duration":
      compiles.append(str(info.get("fun_name")))
  jax.monitoring.register_event_duration_secs_listener(on_compile)
  try:
    trained = training.train_ppo(["sq"], [loaded.graph], [loaded.params], config, coeffs,
                                 kernels=kernels, updates_per_chunk=1)
  finally:
    jax.monitoring.unregister_event_duration_listener(on_compile)
  assert trained.kernels_added > 0 and trained.costs_with == "measured kernels"
  # The grown table is an input of the compiled chunk: one program, compiled by XLA once.
  assert trained.chunk_programs == 1
  assert compiles.count("jit(ppo_run)") == 1, compiles
  expander = search.get_expander(trained.run.ruleset, coeffs, kernels)
  inner = wrappers.inner_state(trained.state.env_state)
  host = jax.tree_util.tree_map(np.asarray, inner)
  rewritten = 0
  for i in range(len(host.cost)):
    graph = jax.tree_util.tree_map(lambda a, i=i: a[i], host.graph)
    assert not kernels.missing(graph)
    assert float(host.cost[i]) == pytest.approx(float(expander.cost(graph)), rel=1e-5)
    rewritten += int(host.num_rewrites[i]) > 0
  assert rewritten > 0  # the check saw rewritten graphs, not only pool copies
  best, best_cost = trained.best(0)
  assert best_cost == pytest.approx(float(expander.cost(best)), rel=1e-5)
  assert best_cost <= float(trained.state.initial_cost[0])  # never a best above the input
  # What the policy driver costs with after training: the grown table.
  assert float(trained.run.env.cost_fn(best)) == pytest.approx(best_cost, rel=1e-5)


def test_a_recosted_best_above_its_start_is_the_start_again():
  """`training.no_worse_than_start`: after a kernel table grows, a best that now costs more
  than the graph its run started from gives way to that graph (its rows and counts reset to
  the filling given); the others are kept as they are."""
  best_cost = jnp.array([1.0, 3.0, 2.0], jnp.float32)
  start_cost = jnp.array([2.0, 2.0, 2.0], jnp.float32)
  held = (jnp.arange(6, dtype=jnp.int32).reshape(3, 2), jnp.array([4, 5, 6], jnp.int32))
  start = (jnp.full([3, 2], 9, jnp.int32), 0)
  cost_kept, (graphs, counts) = training.no_worse_than_start(best_cost, held, start_cost, start)
  np.testing.assert_array_equal(cost_kept, [1.0, 2.0, 2.0])
  np.testing.assert_array_equal(graphs, [[0, 1], [9, 9], [4, 5]])
  np.testing.assert_array_equal(counts, [4, 0, 6])
