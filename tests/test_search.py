"""Search drivers (greedy, TASO-style backtracking, beam, random, policy) over one compiled
Expander: valid graphs that compute the same thing, never costlier than the input, replayable;
the guard; TASO past a cost-raising rewrite that greedy cannot take; clear errors."""

from __future__ import annotations

import collections
import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xrlflow_jax import GraphBuilder, cost, executor, measure, search
from xrlflow_jax import graph as G
from xrlflow_jax.agents import Agent, AgentConfig, RunnerState
from xrlflow_jax.env import GraphRewriteEnv
from xrlflow_jax.harness import search_benchmark as bench
from xrlflow_jax.rules import RuleSet
from xrlflow_jax.rules.library import builtin_rules
from xrlflow_jax.ops import Op
from xrlflow_jax.search import api
from xrlflow_jax.search.policy import _policy_net

from tests._graphs import toy_graph


def synthetic_coeffs(**weights: float) -> cost.CostCoefficients:
  """Cost coefficients that are `weights` ({feature name with '_' for '.': ms per unit}) and
  zero elsewhere, with no call cost."""
  w = np.zeros(len(cost.FEATURE_NAMES), np.float32)
  for name, value in weights.items():
    w[cost.FEATURE_NAMES.index(name.replace("_", ".", 1))] = value
  return cost.CostCoefficients(weights=jnp.asarray(w), call_ms=jnp.float32(0.0),
                               device_kind="test")


# A synthetic cost model (1.0 per MatMul kernel, 1.5 per loop-fusion kernel) on
#     out = concat(x @ w1, x @ w2) + z          cost 2 + 1.5 = 3.5
# Merging the two MatMuls (one MatMul, two slices into the concat) costs 1 + 2 * 1.5 = 4.0, so
# every first rewrite raises the cost (or keeps it: add_commute) and greedy stops at 3.5; after
# the merge concat_of_slices cancels the slices: one MatMul and the add, 2.5, the optimum.
RULES = ("merge_matmul_shared_input_2", "split_matmul_shared_input_2", "concat_of_slices",
         "add_commute")
INITIAL, OPTIMUM = 3.5, 2.5
COEFFS = synthetic_coeffs(matmul_launch=1.0, loop_launch=1.5)
CAPACITY = 32
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def toy():
  return toy_graph()


@pytest.fixture(scope="module")
def ruleset():
  return RuleSet([r for r in builtin_rules() if r.name in RULES], max_locations=4)


@pytest.fixture(scope="module")
def expander(ruleset):
  """The one compiled Expander every test of this module shares."""
  return search.Expander(ruleset, COEFFS)


def assert_same_outputs(a, b, params):
  ref, new = executor.lower(a, params), executor.lower(b, params)
  inputs = ref.random_inputs(0)
  for x, y in zip(ref(*inputs), new(*inputs)):
    np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-4, atol=1e-4)


def check_result(res, toy, ruleset, expander):
  graph, params = toy
  G.validate(res.best_graph, params)
  assert_same_outputs(graph, res.best_graph, params)
  assert res.initial_cost_ms == pytest.approx(INITIAL, rel=1e-5)
  assert res.best_cost_ms <= res.initial_cost_ms
  assert res.best_cost_ms == pytest.approx(float(expander.costs(res.best_graph).current),
                                           rel=1e-5)
  replayed = search.replay(graph, ruleset, res.rewrites)
  assert G.structural_hash(replayed) == G.structural_hash(res.best_graph)
  assert res.returned_input == (not res.rewrites)
  assert res.graphs_expanded >= 1 and res.seconds > 0
  json.dumps(res.to_json())  # JSON-ready
  assert res.modelled_speedup == pytest.approx(res.initial_cost_ms / res.best_cost_ms)


# ----------------------------------------------------------------------------------------------
# Expansion
# ----------------------------------------------------------------------------------------------

def test_costs_equal_applying_each_candidate(toy, ruleset, expander):
  graph, _ = toy
  exp = expander.costs(graph)
  valid, costs = np.asarray(exp.valid), np.asarray(exp.cost)
  assert valid.shape == costs.shape == (ruleset.num_actions,)
  assert exp.nodes.shape == (len(ruleset), ruleset.max_locations, ruleset.num_bound)
  assert float(exp.current) == pytest.approx(INITIAL)
  assert valid.sum() >= 2 and np.isinf(costs[~valid]).all()
  for a in np.flatnonzero(valid):
    r, loc = divmod(int(a), ruleset.max_locations)
    g2, ok = expander.apply_at(graph, r, exp.nodes[r, loc])
    assert ok
    assert float(expander.costs(g2).current) == pytest.approx(costs[a], rel=1e-6)
  merge = ruleset.index("merge_matmul_shared_input_2") * ruleset.max_locations
  assert costs[merge] == pytest.approx(4.0)
  g_apply = expander.apply(graph, merge)  # the flat-action form (matches inside)
  g_at, _ = expander.apply_at(graph, merge // ruleset.max_locations, exp.nodes[merge // 4, 0])
  assert G.structural_hash(g_apply) == G.structural_hash(g_at)


def test_bucket_sizes():
  a = 5248
  small = search.expand.MIN_BUCKET
  counts = (0, 1, small, small + 1, small * 3 // 2, small * 3 // 2 + 1, 2 * small + 1,
            3 * small + 1, 5000, 6000)
  assert [search.bucket_size(c, a) for c in counts] == [
      small, small, small, small * 3 // 2, small * 3 // 2, 2 * small, 3 * small, 4 * small,
      a, a]
  sizes = sorted({search.bucket_size(c, 10**6) for c in range(1, 10_000)})
  assert sizes[:6] == [64, 96, 128, 192, 256, 384] and sizes[-1] == 12288
  for c in range(1, 10_000):  # never under the count, never more than 1.5x it past the floor
    assert c <= search.bucket_size(c, 10**6) <= max(small, 1.5 * c)
  assert search.bucket_size(3, 8) == 8  # never more slots than actions
  # Buckets larger than BUCKET_CHUNK run in equal chunks of at most that many.
  chunk = search.expand.bucket_chunk
  limit = search.expand.BUCKET_CHUNK
  assert [chunk(s) for s in (64, 96, 128, 192, 256, 384, 768)] == [64, 96, 128, 96, 128, 128, 128]
  assert all(chunk(s) <= limit for s in sizes)  # every bucket size splits evenly
  for s in range(1, 1000):
    assert s % chunk(s) == 0
    assert chunk(s) <= limit or chunk(s) == s  # one vmap where no divisor is large enough
  assert chunk(131) == 131  # a prime number of actions: one vmap


def test_bucketed_expansion_equals_each_candidate_alone_on_a_zoo_model(monkeypatch):
  """More candidates than the smallest bucket (so the bucket boundary is crossed): every valid
  (rule, location) is built and costed, and equals applying it alone and costing the result
  with the full (unpruned) cost model; the built child is the graph `apply_at` makes. The
  incremental cost covers only 1 changed slot here, so its fallback (the child costed again
  alone) is exercised; its exact path is checked by the rewrite walks of test_rules. The bucket
  runs in chunks (`BUCKET_CHUNK` = 4: its bucket of 30 in ten chunks of 3)."""
  from xrlflow_jax import models  # pylint: disable=g-import-not-at-top
  from xrlflow_jax.cost import incremental  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(search.expand, "MIN_BUCKET", 10)  # buckets 10, 15, 20, 30, ...
  monkeypatch.setattr(search.expand, "BUCKET_CHUNK", 4)
  monkeypatch.setattr(incremental, "MAX_CHANGED", 1)
  monkeypatch.setattr(incremental, "MIN_CAPACITY", 0)  # this graph is smaller
  # Rewrites that change more than 4 rows (5 here) are hashed again alone: both paths run.
  monkeypatch.setattr(search.expand.identity, "MAX_CHANGED_ROWS", 4)
  graph, _ = models.build("squeezenet1_1", "tiny", capacity=128)
  names = ("relu_after_concat", "conv_bias_relu_unfuse", "enlarge_conv_kernel_bias_sib_bias",
           "merge_conv_shared_input_bias")
  rs = RuleSet([r for r in builtin_rules() if r.name in names], max_locations=16)
  coeffs = cost.load_coefficients()
  ex = search.Expander(rs, coeffs)
  ids = ex.identities(graph)
  exp, children = ex.expand(graph, ids)
  mask = np.asarray(ex.match(graph)[0]).reshape(-1)
  (bucket,) = ex.stats.buckets
  assert bucket == search.bucket_size(int(mask.sum()), rs.num_actions)
  assert 10 < mask.sum() < bucket  # a size up from the smallest, with empty slots at its end
  assert 1 < search.expand.bucket_chunk(bucket) < bucket  # more than one chunk
  np.testing.assert_array_equal(np.sort(children.actions), np.flatnonzero(mask))
  valid, costs = np.asarray(exp.valid), np.asarray(exp.cost)
  assert valid.sum() == children.ok.sum() and np.isinf(costs[~valid]).all()
  assert 0 < ex.stats.recosted <= valid.sum()
  assert 0 < ex.stats.rehashed < valid.sum(), ex.stats.rehashed
  full_cost = jax.jit(lambda g: cost.graph_cost(g, coeffs))
  for i, a in enumerate(children.actions):
    r, loc = divmod(int(a), rs.max_locations)
    alone, ok = ex.apply_at(graph, r, exp.nodes[r, loc])
    assert ok == bool(children.ok[i]) == bool(valid[a])
    if ok:
      assert costs[a] == pytest.approx(float(full_cost(alone)), rel=1e-6)
      # The child rebuilt from its parent is the graph `apply_at` makes, field by field.
      built, built_ids = children.child(i)
      jax.tree_util.tree_map(np.testing.assert_array_equal, built,
                             jax.tree_util.tree_map(np.asarray, alone))
      # Its identities (computed on the new slots only) equal the formula over all N, and the
      # bucket's hash (from the parent's row terms) is the hash of the graph built alone.
      np.testing.assert_array_equal(built_ids,
                                    _child_identities_over_all_slots(graph, ids, alone, rs.max_new))
      assert children.hashes[i] == ex.graph_hash(alone, built_ids)


def _child_identities_over_all_slots(parent, parent_ids, child, max_new):
  """`identity.child_identities` as first written (every round over all N slots)."""
  from xrlflow_jax.graph import identity  # pylint: disable=g-import-not-at-top
  table = G.input_table(child)
  new = (np.asarray(child.nodes["alive"]) & ~np.asarray(parent.nodes["alive"]))[:, None]
  sig = identity.signatures(child)
  ids = jnp.where(child.nodes["alive"][:, None], parent_ids, jnp.uint32(0))
  for _ in range(max_new):
    ids = jnp.where(new, identity._combine(sig, ids, table), ids)  # pylint: disable=protected-access
  return np.asarray(ids)


def test_identity_hash_sees_commuted_graphs_as_one():
  """Commuting an Add twice gives the input's hash back; two independent rewrites give one
  hash in either order; distinct graphs get distinct hashes (the known limit is below)."""
  b = GraphBuilder()
  x, y = b.input([4, 8]), b.input([4, 8])
  b.output(b.add(b.relu(b.add(x, y)), b.add(y, x)))
  graph, _ = b.build(capacity=24)
  rs = RuleSet([r for r in builtin_rules() if r.name == "add_commute"], max_locations=4)
  ex = search.Expander(rs, COEFFS)
  ids0 = ex.identities(graph)
  h0 = ex.graph_hash(graph, ids0)
  exp, kids = ex.expand(graph, ids0)
  assert len(kids.actions) == 3 and kids.ok.all()
  assert len(set(kids.hashes) | {h0}) == 4  # three different one-step graphs
  # Commute the same Add back: the input graph again.
  s0 = G.structural_hash(graph)
  _, grand = ex.expand(*kids.child(0))
  back = [i for i in range(len(grand.actions)) if G.structural_hash(grand.graph(i)) == s0]
  assert len(back) == 1 and grand.hashes[back[0]] == h0
  # Two Adds commuted in either order: one graph. Where neither Add reads the other, one hash.
  # Where the second reads the first (%4 feeds %5), the identity of the Add re-created second
  # depends on the order (identities name nodes by creation, as TASO's op cache does): two
  # hashes, so the search expands that graph twice. Distinct graphs never share a hash.
  by_structure: dict[str, set[int]] = {}
  for i in range(len(kids.actions)):
    _, g2 = ex.expand(*kids.child(i))
    for j in range(len(g2.actions)):
      by_structure.setdefault(G.structural_hash(g2.graph(j)), set()).add(g2.hashes[j])
  assert len(by_structure) == 4  # the input and the three graphs with two Adds commuted
  assert sorted(len(h) for h in by_structure.values()) == [1, 1, 1, 2]
  all_hashes = [h for hs in by_structure.values() for h in hs]
  assert len(set(all_hashes)) == len(all_hashes)


def test_rules_that_can_fire_closure():
  from xrlflow_jax.ops import Op  # pylint: disable=g-import-not-at-top
  from xrlflow_jax.rules import graph_op_codes, rules_that_can_fire  # pylint: disable=g-import-not-at-top
  rules = builtin_rules()
  graph, _ = toy_graph()
  codes = graph_op_codes([graph])
  assert codes == {int(Op.INPUT), int(Op.CONSTANT), int(Op.MATMUL), int(Op.CONCAT),
                   int(Op.ADD)}
  kept = {r.name for r in rules_that_can_fire(rules, codes)}
  assert {"merge_matmul_shared_input_2", "add_commute"} <= kept
  # No Slice in the graph, but the merge makes Slices: the rule that cancels them is kept.
  assert "concat_of_slices" in kept
  assert not any("conv" in name for name in kept)
  for r in rules:  # every kept rule's source ops occur or are made by a kept rule
    if r.name in kept:
      made = codes | {int(d.op) for k in rules if k.name in kept for d in k.dst}
      assert all(int(s.op) in made for s in r.src)
  pruned = search.default_ruleset(graph)
  assert pruned.names == [r.name for r in rules if r.name in kept]
  assert search.default_ruleset(graph) is pruned and not search.is_default(pruned)
  assert search.is_default(search.default_ruleset())


# ----------------------------------------------------------------------------------------------
# Drivers
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method,options", [
    ("greedy", {}),
    ("taso", {"budget": 8, "alpha": 1.2}),
    ("beam", {"beam_width": 3, "steps": 3}),
    ("random", {"num_rollouts": 3, "steps": 3}),
])
def test_driver_results_are_valid_equivalent_and_replayable(method, options, toy, ruleset,
                                                            expander):
  graph, params = toy
  res = search.optimize(graph, params, method, expander=expander, seed=1, **options)
  assert res.method == method
  check_result(res, toy, ruleset, expander)
  if method in ("taso", "beam"):  # both search past the cost-raising merge
    assert res.best_cost_ms == pytest.approx(OPTIMUM)
    assert [s.rule for s in res.rewrites] == ["merge_matmul_shared_input_2", "concat_of_slices"]


def test_a_graph_with_dead_code_is_searched_as_its_pruned_self(ruleset, expander):
  """Nodes no output reads cost nothing in the input's cost, and an edit frees every unread
  node, so its candidates (costed as pruned graphs) are not charged for them either; replaying
  the result onto the graph as given rebuilds it."""
  b = GraphBuilder()
  x = b.input([8, 16])
  w1, w2 = b.weight([16, 16]), b.weight([16, 16])
  y = b.concat([b.matmul(x, w1), b.matmul(x, w2)], axis=1)
  b.output(b.add(y, b.input([8, 32])))
  b.relu(b.matmul(x, b.weight([16, 4])))  # read by no output: a MatMul (1.0) that never runs
  graph, params = b.build(capacity=CAPACITY)
  # Budget 12, not 8 as for the toy: the dead MatMul adds neutral merges to the 3.5 plateau,
  # which the queue pops one per rule in turn (`search.taso_style.taso`) before the 4.0 merge.
  res = search.taso(graph, params, expander, budget=12, alpha=1.2)
  assert res.initial_cost_ms == pytest.approx(INITIAL)
  assert res.best_cost_ms == pytest.approx(OPTIMUM)
  assert res.best_cost_ms == pytest.approx(float(expander.costs(res.best_graph).current))
  replayed = search.replay(graph, ruleset, res.rewrites)
  assert G.structural_hash(replayed) == G.structural_hash(res.best_graph)
  assert_same_outputs(graph, res.best_graph, params)


def test_taso_finds_the_optimum_greedy_cannot(toy, ruleset, expander):
  graph, params = toy
  g = search.greedy(graph, params, expander)
  assert g.returned_input and g.best_cost_ms == pytest.approx(INITIAL) and not g.rewrites
  strict = search.taso(graph, params, expander, budget=8, alpha=1.0)
  assert strict.best_cost_ms == pytest.approx(INITIAL)  # no relaxation: stuck like greedy
  t = search.taso(graph, params, expander, budget=8, alpha=1.2)
  assert t.best_cost_ms == pytest.approx(OPTIMUM) and t.best_cost_ms < g.best_cost_ms
  assert t.found_cost_ms == pytest.approx(OPTIMUM) and not t.returned_input
  assert t.graphs_expanded <= 8 and t.candidates_costed >= t.graphs_expanded


def recurrent_toy(steps: int = 3, ways: int = 4):
  """h <- h @ w0 + ... + h @ w{ways-1} (a tree of Adds), `steps` times with the same weights."""
  b = GraphBuilder(seed=3)
  h = b.input([1, 16])
  ws = [b.weight([16, 16]) for _ in range(ways)]
  for _ in range(steps):
    terms = [b.matmul(h, w) for w in ws]
    while len(terms) > 1:
      terms = [b.add(terms[i], terms[i + 1]) for i in range(0, len(terms), 2)]
    h = b.tanh(terms[0])
  b.output(h)
  return b.build(capacity=96 if ways == 4 else 160)


def test_taso_crosses_a_valley_only_a_rule_applied_everywhere_crosses():
  """Merging one step's four MatMuls saves three kernels but adds a concatenated weight the
  other steps do not share (distinct folded constants cost `const.mb`): every single merge
  raises the cost beyond alpha, all of them lower it. The saturated seed finds that graph;
  without it the search is stuck at the input."""
  # const.mb: four 16 x 16 float32 weights cost 6.1
  coeffs = synthetic_coeffs(matmul_launch=1.0, const_mb=1500.0)
  rs = RuleSet([r for r in builtin_rules()
                if r.name in ("merge_matmul_shared_input_4", "add_commute")], max_locations=4)
  ex = search.Expander(rs, coeffs)
  graph, params = recurrent_toy()
  kb = 16 * 16 * 4 / 1e6  # one weight, in megabytes
  initial, single, merged = 12 + 4 * kb * 1500, 9 + 8 * kb * 1500, 3 + 4 * kb * 1500
  first = ex.costs(graph)
  assert float(first.current) == pytest.approx(initial, rel=1e-4)
  valid = np.asarray(first.valid).reshape(len(rs), -1)[0]
  assert valid.sum() == 3
  np.testing.assert_allclose(np.asarray(first.cost).reshape(len(rs), -1)[0][valid], single,
                             rtol=1e-4)  # each single merge: x1.16, beyond alpha = 1.05
  stuck = search.taso(graph, params, ex, budget=8, saturate=False)
  assert stuck.returned_input and stuck.best_cost_ms == pytest.approx(initial, rel=1e-4)
  res = search.taso(graph, params, ex, budget=8)
  assert res.options["seeds"] == ["merge_matmul_shared_input_4 x3"]
  assert [s.rule for s in res.rewrites] == ["merge_matmul_shared_input_4"] * 3
  assert res.best_cost_ms == pytest.approx(merged, rel=1e-4)
  assert res.best_cost_ms == pytest.approx(float(ex.costs(res.best_graph).current), rel=1e-5)
  replayed = search.replay(graph, rs, res.rewrites)
  assert G.structural_hash(replayed) == G.structural_hash(res.best_graph)
  G.validate(res.best_graph, params)
  assert_same_outputs(graph, res.best_graph, params)
  two, _, steps = ex.saturate(graph, ex.identities(graph), 0, max_steps=2)
  assert len(steps) == 2  # two steps merged: both read one concatenated weight (one class)
  assert float(ex.costs(two).current) == pytest.approx(6 + 8 * kb * 1500, rel=1e-4)


def test_policy_accepts_a_runner_state_and_raw_params(toy, ruleset, expander):
  graph, params = toy
  node_cost_fn = lambda g: cost.node_costs(g, COEFFS)  # pylint: disable=unnecessary-lambda-assignment
  env = GraphRewriteEnv([graph], ruleset, lambda g: cost.graph_cost(g, COEFFS), horizon=3,
                        node_cost_fn=node_cost_fn)
  agent = Agent(ruleset, node_cost_fn, AgentConfig(head="local", hidden=16, layers=1, heads=2))
  net = search.init_network(agent, expander, graph, jax.random.PRNGKey(1), env)
  # What Trainer.init / make_train(...)(key) return (only .params and .best_cost are read).
  state = RunnerState(params=net, opt_state=(), env_state=None, obs=None, key=None, update=0,
                      best_cost=np.full([1], INITIAL), best_graph=None,
                      initial_cost=np.full([1], INITIAL))
  res = search.optimize(graph, params, "policy", expander=expander, agent=agent,
                        network_params=state, env=env,
                        num_samples=4, seed=3)
  assert res.method == "policy" and res.options["steps"] == 3
  assert 1 <= res.graphs_expanded <= 5 * 3
  check_result(res, toy, ruleset, expander)
  same = search.policy(graph, params, expander, agent=agent, network_params=net, env=env,
                       num_samples=4, seed=3)
  assert G.structural_hash(same.best_graph) == G.structural_hash(res.best_graph)
  # Multi-seed params (Trainer.train_seeds): a leading seed axis; best_cost [S, G] picks seed 1.
  seeds = jax.tree_util.tree_map(lambda x: jnp.stack([x * 0.0, x]), net)
  stacked = state.replace(params=seeds, best_cost=np.asarray([[3.0], [2.5]]))
  picked = search.policy(graph, params, expander, agent=agent, network_params=stacked, env=env,
                         num_samples=4, seed=3)
  assert G.structural_hash(picked.best_graph) == G.structural_hash(res.best_graph)
  assert search.policy_params(agent, stacked, expected=None) is seeds
  with pytest.raises(search.SearchError, match="another rule set"):
    other = RuleSet([r for r in builtin_rules() if r.name in RULES[:2]], max_locations=4)
    search.policy(graph, params, search.Expander(other, COEFFS), agent=agent,
                  network_params=state, env=env)


# ----------------------------------------------------------------------------------------------
# The guard
# ----------------------------------------------------------------------------------------------

# Each environment compiles for ~25 s: the default suite checks the capped one (the first
# candidates offered, their deltas); the uncapped one runs with -m slow (the environment's own
# exact-delta test covers every candidate).
@pytest.mark.parametrize("cap", [1, pytest.param(0, marks=pytest.mark.slow)])
def test_policy_observes_what_an_exact_delta_environment_offers(toy, ruleset, expander, cap):
  """With an environment that builds at most `max_candidates` candidates for its exact delta,
  the policy driver's observation (from the Expander's expansion) is the environment's: the
  same offered mask (the first valid candidates) and the same deltas."""
  graph, _ = toy
  node_cost_fn = lambda g: cost.node_costs(g, COEFFS)  # pylint: disable=unnecessary-lambda-assignment
  cost_fn = lambda g: cost.graph_cost(g, COEFFS)  # pylint: disable=unnecessary-lambda-assignment
  agent = Agent(ruleset, node_cost_fn, AgentConfig(head="local", hidden=16, layers=1, heads=2))
  env = GraphRewriteEnv([graph], ruleset, cost_fn, horizon=3, node_cost_fn=node_cost_fn,
                        exact_candidate_delta=True, max_candidates=cap)
  _, ts = jax.jit(env.reset)(jax.random.PRNGKey(0))
  net = _policy_net(agent, env)
  g = jax.tree_util.tree_map(jnp.asarray, graph)
  exp = expander.costs(g)
  obs = jax.jit(net.observation)(g, exp.valid, exp.nodes, exp.cost, exp.current, 0)
  np.testing.assert_array_equal(np.asarray(obs.action_mask),
                                np.asarray(ts.observation.action_mask))
  np.testing.assert_allclose(np.asarray(obs.candidate_delta),
                             np.asarray(ts.observation.candidate_delta), rtol=1e-5, atol=1e-6)
  if cap:
    assert np.asarray(obs.action_mask)[:-1].sum() == cap < np.asarray(exp.valid).sum()


def _stats(ms: float) -> measure.LatencyStats:
  return measure.LatencyStats(ms, ms * 0.9, ms * 1.1, 10, 0.1, "cpu", "cpu")


def _verdict(name: str) -> measure.Speedup:
  ratio = {"faster": 1.25, "no change": 1.01, "slower": 0.8}[name]
  return measure.Speedup(ratio, ratio - 0.01, ratio + 0.01, 1.0, 0.99, 1.01, name, 0.95, 10)


@pytest.mark.parametrize("verdict,kept", [("slower", False), ("no change", False),
                                          ("faster", True)])
def test_measured_guard_returns_the_input_unless_faster(monkeypatch, toy, ruleset, expander,
                                                       verdict, kept):
  """The guard keeps the graph found only on the verdict "faster" (not on a lower median)."""
  graph, params = toy
  calls = []

  def fake(a, candidates, p, **kw):
    calls.append(kw)
    return measure.Comparison(_stats(1.0), _stats(1.0), [_stats(0.8)] * len(candidates),
                              [_verdict(verdict)] * len(candidates))

  monkeypatch.setattr(search.guard, "compare", fake)
  res = search.optimize(graph, params, "taso", expander=expander, budget=8, alpha=1.2,
                        measure=True, measure_options={"rounds": 6})
  # The merge alone costs more: no checkpoint.
  assert [(kw["rounds"], kw["level"]) for kw in calls] == [(6, 0.95)]
  assert res.found_cost_ms == pytest.approx(OPTIMUM) and res.found_rewrites == 2
  assert res.returned_input == (not kept)
  assert res.input_latency.median_ms == 1.0 and res.measured.verdict == verdict
  if kept:
    assert res.best_cost_ms == pytest.approx(OPTIMUM) and len(res.rewrites) == 2
    assert res.speedup == pytest.approx(1.0 / 0.8)
  else:
    assert not res.rewrites and res.best_cost_ms == pytest.approx(INITIAL)
    assert G.structural_hash(res.best_graph) == G.structural_hash(graph)
    assert res.best_latency.median_ms == 1.0 and res.speedup == 1.0
    assert "not measured faster" in res.summary()
  check_result(res, toy, ruleset, expander)


@pytest.mark.parametrize("options, message", [
    ({"rounds": 2}, "rounds must be an integer >= 5"), ({"rounds": 0}, "rounds"),
    ({"repeats_per_round": 0}, "repeats per round"), ({"warmup": -1}, "warm-up"),
    ({"min_round_ms": -1.0}, "least time of a round"), ({"round": 5}, "unknown measure option")])
def test_bad_measure_options_fail_before_the_search(monkeypatch, toy, expander, options,
                                                    message):
  graph, params = toy
  def must_not_run(*args, **kwargs):
    raise AssertionError("the search ran before its measure options were checked")

  monkeypatch.setitem(search.api.DRIVERS, "taso", must_not_run)
  with pytest.raises((measure.MeasurementError, search.SearchError), match=message):
    search.optimize(graph, params, "taso", expander=expander, measure=True,
                    measure_options=options)


def test_measured_guard_times_both_graphs_for_real(toy, expander):
  graph, params = toy
  res = search.optimize(graph, params, "beam", expander=expander, beam_width=2, steps=2,
                        measure=True,
                        measure_options={"rounds": 5, "repeats_per_round": 2, "warmup": 1,
                                         "min_round_ms": 0})
  assert res.input_latency is not None and res.best_latency is not None
  assert res.input_latency.runs == 10
  if res.returned_input:
    assert res.best_latency == res.input_latency
  else:
    assert res.best_latency.median_ms < res.input_latency.median_ms
  assert res.to_json()["input_latency"]["median_ms"] > 0


def test_modelled_guard_never_returns_a_costlier_graph(toy, expander):
  graph, params = toy
  res = search.guard.finish("test", graph, expander.apply(graph, 0), [expander.step(0, 0, [0])],
                            params, initial_cost=1.0, best_cost=1.0, measure=False, started=0.0,
                            graphs_expanded=1, candidates_costed=1)
  assert res.returned_input and not res.rewrites and res.found_rewrites == 1
  assert dataclasses.asdict(res)["best_cost_ms"] == 1.0


# ----------------------------------------------------------------------------------------------
# Errors, compilation
# ----------------------------------------------------------------------------------------------

def test_clear_errors(toy, ruleset, expander):
  graph, params = toy
  with pytest.raises(search.SearchError, match="unknown search method"):
    search.optimize(graph, params, "annealing", expander=expander)
  with pytest.raises(search.SearchError, match="unknown option"):
    search.optimize(graph, params, "greedy", expander=expander, budget=3)
  with pytest.raises(search.SearchError, match="needs agent"):
    search.optimize(graph, params, "policy", expander=expander)
  with pytest.raises(search.SearchError, match="alpha"):
    search.taso(graph, params, expander, alpha=0.9)
  full, full_params = toy_graph(capacity=G.num_nodes(graph))
  with pytest.raises(search.SearchError, match="capacity >="):
    search.greedy(full, full_params, expander)
  batch = jax.tree_util.tree_map(lambda x: np.stack([x, x]), graph)
  with pytest.raises(search.SearchError, match="one graph"):
    search.greedy(batch, params, expander)
  bad = [search.RewriteStep("concat_of_slices", 0, 0, (0,) * ruleset.num_bound)]
  with pytest.raises(search.SearchError, match="not rule"):
    search.replay(graph, ruleset, bad)
  res = search.taso(graph, params, expander, budget=8, alpha=1.2)
  with pytest.raises(search.SearchError, match="does not apply"):
    search.replay(graph, ruleset, res.rewrites[1:])  # the second step alone


def test_prepare_compiles_in_the_background_and_changes_nothing(toy, ruleset, expander):
  """`Expander.prepare` (what `search.optimize` starts with) makes each function's one instance
  in background threads; the search then finds what it finds without it, and nothing is left
  compiling after the first expansion. A batch it leaves to the drivers to refuse."""
  graph, params = toy
  fresh = search.Expander(ruleset, COEFFS)
  batch = jax.tree_util.tree_map(lambda x: np.stack([x, x]), graph)
  fresh.prepare(batch)
  assert not fresh._pending  # pylint: disable=protected-access
  fresh.prepare(graph)
  res = search.taso(graph, params, fresh, budget=8, alpha=1.2)
  assert not fresh._pending  # pylint: disable=protected-access
  counts = fresh.trace_counts
  assert all(counts[k] == 1 for k in ("match", "apply_at", "identities", "costs")), counts
  ref = search.taso(graph, params, expander, budget=8, alpha=1.2)
  assert res.best_cost_ms == ref.best_cost_ms == pytest.approx(OPTIMUM)
  assert [r.to_json() for r in res.rewrites] == [r.to_json() for r in ref.rewrites]


def test_a_short_search_compiles_for_a_fast_compile(toy, expander):
  """`search.optimize` compiles a search of at most `FAST_COMPILE_MAX_EXPANSIONS` expansions
  (counted from the driver's options and defaults) with XLA:CPU's fast-compile options and a
  longer one with XLA's defaults, unless told; the result records the choice."""
  limit = search.expand.FAST_COMPILE_MAX_EXPANSIONS
  assert api.expected_expansions("taso", {}) == 200 <= limit
  assert api.expected_expansions("taso", {"budget": limit + 1}) == limit + 1
  assert api.expected_expansions("beam", {"steps": 3, "beam_width": 5}) == 15
  assert api.expected_expansions("random", {"num_rollouts": 2, "steps": 3}) == 6
  # The policy: 1 + num_samples rollouts of its steps (default: the env's horizon, else 50).
  assert api.expected_expansions("policy", {}) == 9 * api.POLICY_STEPS
  assert api.expected_expansions("policy", {"steps": 10, "num_samples": 3}) == 40
  on_cpu = jax.default_backend() == "cpu"
  assert expander.plan(limit) is on_cpu and expander.plan(limit + 1) is False
  assert expander.plan(None) is False and expander.plan(1, fast_compile=False) is False
  assert expander.plan(10**6, fast_compile=True) is on_cpu
  graph, params = toy
  res = search.optimize(graph, params, "taso", expander=expander, budget=4, alpha=1.2)
  assert res.options["fast_compile"] is on_cpu and expander.fast_compile is on_cpu
  res = search.optimize(graph, params, "greedy", expander=expander, max_steps=2,
                        fast_compile=False)
  assert res.options["fast_compile"] is False


_TIERS = """
import json
import numpy as np
from tests.test_search import COEFFS, RULES, toy_graph
from xrlflow_jax import graph as G, search
from xrlflow_jax.rules import RuleSet
from xrlflow_jax.rules.library import builtin_rules
graph, params = toy_graph()
ex = search.Expander(RuleSet([r for r in builtin_rules() if r.name in RULES], max_locations=4),
                     COEFFS)
out = []
for fast in (False, True):
  assert ex.plan(fast_compile=fast) == fast
  exp, children = ex.expand(graph, ex.identities(graph))
  res = search.taso(graph, params, ex, budget=8, alpha=1.2)
  out.append({"valid": np.asarray(exp.valid).tolist(), "cost": repr(np.asarray(exp.cost).tolist()),
              "hashes": children.hashes, "ok": children.ok.tolist(),
              "children": [G.structural_hash(children.graph(i)) for i in range(len(children.ok))],
              "best": float(res.best_cost_ms), "rewrites": [r.to_json() for r in res.rewrites]})
print(json.dumps(out))
"""


def test_both_compile_tiers_compute_the_same(xla_defaults_env):
  """Compiled with XLA's default code generation (a process without the suite's fast-compile
  flags) and with `FAST_COMPILE_OPTIONS`, an expansion gives the same candidates, costs (bit
  for bit), hashes and children, and a search the same rewrites."""
  done = subprocess.run([sys.executable, "-c", textwrap.dedent(_TIERS)], capture_output=True,
                        text=True, cwd=ROOT, env=xla_defaults_env, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  default, fast = json.loads(done.stdout.strip().splitlines()[-1])
  assert sum(default["valid"]) >= 2 and default["rewrites"]
  assert fast == default


def test_expander_compiled_once_per_capacity(toy, expander):
  """Runs last: every search of this module went through one trace of each function per
  compile tier (`Expander.plan`: the short searches through `search.optimize` compile for a
  fast compile, the drivers called directly before them with XLA's defaults)."""
  graph, params = toy
  search.beam(graph, params, expander, beam_width=2, steps=2)
  tiers = expander._tiers.values()  # pylint: disable=protected-access
  # Distinct instances: the module's many functions pass the live-instance bound, which drops
  # the least recently used (an instance remade for the same key is not a second compile key).
  counts = {tier: (t.bucket.distinct_instances, t.apply_at.distinct_instances,
                   t.match.distinct_instances)
            for tier, t in expander._tiers.items()}  # pylint: disable=protected-access
  assert all(max(c) <= 1 for c in counts.values()), counts
  assert expander.trace_counts["costs"] == sum(t.bucket.instances for t in tiers) >= 1


@pytest.mark.slow  # compiles the expansion of a real model (~30 s on 2 CPU cores)
def test_taso_beats_greedy_on_squeezenet_fire_modules():
  from xrlflow_jax import models  # pylint: disable=g-import-not-at-top
  graph, params = models.build("squeezenet1_1", "tiny", capacity=128)
  rules = ("enlarge_conv_kernel_bias_sib_bias", "merge_conv_shared_input_bias",
           "split_conv_shared_input_bias")
  rs = RuleSet([r for r in builtin_rules() if r.name in rules], max_locations=8)
  ex = search.Expander(rs, cost.load_coefficients())
  g = search.greedy(graph, params, ex)
  t = search.taso(graph, params, ex, budget=12)
  assert g.returned_input and t.best_cost_ms < g.best_cost_ms * 0.98
  assert "enlarge_conv_kernel_bias_sib_bias" == t.rewrites[0].rule
  assert_same_outputs(graph, t.best_graph, params)


def test_search_benchmark_times_cold_and_warm_calls(toy, ruleset):
  """`harness.search_benchmark.time_search` (the search-speed benchmark's core): two calls, the
  same graph, compile charged to the first, a table with TASO's reference where the model has
  one. (The small rule set keeps the compile short; the benchmark uses `default_ruleset`.)"""
  graph, params = toy
  row = bench.time_search("squeezenet-toy", graph, params, coeffs=COEFFS, ruleset=ruleset,
                          budget=4, alpha=1.2)
  assert row.expansions >= 1 and row.warm_seconds > 0 and row.cold_seconds >= row.warm_seconds
  assert 0 < row.compile_seconds <= row.cold_seconds
  assert row.rules == len(ruleset) and row.median_candidates >= 1
  assert row.taso_expansions_per_s == bench.TASO_EXPANSIONS_PER_S["squeezenet"]
  table = bench.markdown([row])
  assert "squeezenet-toy" in table and table.count("\n") == 2


def test_identity_cache_holds_objects_and_evicts_the_least_recently_used():
  """Keys are objects by identity (value-equal objects do not share an entry); entries keep
  their objects alive, so an id is never reused while cached; past maxsize the least recently
  used entry goes."""
  from xrlflow_jax.search.cache import IdentityCache  # pylint: disable=g-import-not-at-top
  cache: IdentityCache[int] = IdentityCache(maxsize=2)
  a, b, c = [0], [0], [0]  # equal values, distinct objects
  calls = []
  def make(v):
    calls.append(v)
    return v
  assert cache.get((a,), lambda: make(1)) == 1
  assert cache.get((b,), lambda: make(2)) == 2
  assert cache.get((a,), lambda: make(9)) == 1  # a hit; a is now the most recent
  assert cache.get((c,), lambda: make(3)) == 3  # evicts b
  assert len(cache) == 2 and calls == [1, 2, 3]
  assert cache.get((b,), lambda: make(4)) == 4  # b was evicted: rebuilt
  with pytest.raises(ValueError, match="maxsize"):
    IdentityCache(0)


def test_queue_trim_keeps_what_heapq_nsmallest_keeps():
  """The search's queue trim (numpy) keeps exactly `heapq.nsmallest`'s entries, ties in cost
  broken by the turn, then the push counter, and returns a valid heap."""
  import heapq  # pylint: disable=g-import-not-at-top
  from xrlflow_jax.search import taso_style  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  costs = rng.integers(0, 20, size=500).astype(float) / 4  # many equal costs
  turns = rng.integers(0, 3, size=500)  # and many equal turns among them
  queue = [taso_style.QueueEntry(float(c), int(t), i, float(c), None, None, i, ())
           for i, (c, t) in enumerate(zip(costs, turns))]
  heapq.heapify(queue)
  for k in (1, 37, 250, 499):
    kept = taso_style._cheapest(list(queue), k)  # pylint: disable=protected-access
    assert kept == heapq.nsmallest(k, queue)
    expected = sorted(kept)
    assert [heapq.heappop(kept) for _ in range(k)] == expected


@pytest.fixture(scope="module")
def gate_merge_expander():
  """An Expander of the 8-way gate merge and the Concat dedupes on a cost model that counts
  MatMul kernels and folded constants (each single merge raises the cost)."""
  coeffs = synthetic_coeffs(matmul_launch=1.0, const_mb=1500.0)
  names = ("merge_matmul_shared_input_8", "dedupe_concat_2", "dedupe_concat_4")
  rs = RuleSet([r for r in builtin_rules(["merge_matmul", "dedupe"]) if r.name in names],
               max_locations=4)
  return search.Expander(rs, coeffs)


def test_taso_seed_is_cleaned_of_the_concats_every_step_repeats(gate_merge_expander):
  """After the 8-way gate merge at every step, each step concatenates the same eight weights
  (two Concats of four, then one of two): the seed makes them one Concat tree, inner ones
  first (to a fixed point), so every step's merged MatMul reads one weight node."""
  ex = gate_merge_expander
  rs = ex.ruleset
  graph, params = recurrent_toy(ways=8)
  res = search.taso(graph, params, ex, budget=4)
  assert res.options["seeds"] == [
      "merge_matmul_shared_input_8 x3, dedupe_concat_4 x4, dedupe_concat_2 x2"]
  best = G.to_host(res.best_graph)
  alive = np.asarray(best.nodes["alive"])
  op = np.asarray(best.nodes["op"])
  table = np.asarray(G.input_table(best))
  assert (alive & (op == int(Op.CONCAT))).sum() == 3  # one tree of two groups of four
  weights = {int(table[i, 1]) for i in np.flatnonzero(alive & (op == int(Op.MATMUL)))}
  assert len(weights) == 1 and op[weights.pop()] == int(Op.CONCAT)
  kb = 16 * 16 * 4 / 1e6
  # 3 launches; the eight weights are folded into one concatenated constant
  assert res.best_cost_ms == pytest.approx(3 + 8 * kb * 1500, rel=1e-4)
  replayed = search.replay(graph, rs, res.rewrites)
  assert G.structural_hash(replayed) == G.structural_hash(res.best_graph)
  G.validate(res.best_graph, params)
  assert_same_outputs(graph, res.best_graph, params)


def test_measured_guard_returns_a_prefix_measured_faster(monkeypatch, gate_merge_expander):
  """With the search's expander the guard also times the path's prefix where the rule family
  changes (the gate merges before the dedupes), at the level for the best of two, and returns
  it when it measured faster than the whole path: its rewrites replay to it."""
  ex = gate_merge_expander
  graph, params = recurrent_toy(ways=8)
  calls = []

  def fake(a, candidates, p, **kw):
    calls.append((len(candidates), kw["level"]))
    ratios = [1.1, 1.3][:len(candidates)]
    verdicts = [measure.Speedup(r, r - 0.05, r + 0.05, 1.0, 0.97, 1.03, "faster", kw["level"], 6)
                for r in ratios]
    return measure.Comparison(_stats(1.0), _stats(1.0), [_stats(1 / r) for r in ratios],
                              verdicts)

  monkeypatch.setattr(search.guard, "compare", fake)
  res = search.optimize(graph, params, "taso", expander=ex, budget=4, measure=True,
                        measure_options={"rounds": 6})
  assert calls == [(2, pytest.approx(0.975))]
  assert res.options["checkpoints"][0]["rewrites"] == 3
  whole = measure.Speedup(1.1, 1.05, 1.15, 1.0, 0.97, 1.03, "faster", 0.975, 6)
  assert res.options["checkpoint"] == {"rewrites": 3, "of": 9,
                                       "rejected_speedup": whole.describe()}
  assert [s.rule for s in res.rewrites] == ["merge_matmul_shared_input_8"] * 3
  assert res.measured.ratio == pytest.approx(1.3) and not res.returned_input
  assert res.best_cost_ms == pytest.approx(float(ex.costs(res.best_graph).current), rel=1e-5)
  replayed = search.replay(graph, ex.ruleset, res.rewrites)
  assert G.structural_hash(replayed) == G.structural_hash(res.best_graph)
  assert_same_outputs(graph, res.best_graph, params)
  # No checkpoints: the same whole path is timed alone at the usual level and kept.
  found = search.optimize(graph, params, "taso", expander=ex, budget=4)  # modelled guard only
  assert len(found.rewrites) == 9
  calls.clear()
  alone = search.guard.finish("taso", graph, found.best_graph, found.rewrites, params,
                              initial_cost=found.initial_cost_ms, best_cost=found.best_cost_ms,
                              measure=True, started=0.0, graphs_expanded=0, candidates_costed=0,
                              measure_options={"rounds": 6}, expander=ex, checkpoints=0)
  assert calls == [(1, pytest.approx(0.95))]
  assert "checkpoints" not in alone.options and "checkpoint" not in alone.options
  assert len(alone.rewrites) == 9 and alone.measured.ratio == pytest.approx(1.1)
  assert measure.guard.fastest_faster([_verdict("faster")] * 2) == 0  # a tie: the whole path
  assert measure.guard.fastest_faster([_verdict("no change")]) is None


def test_measured_guard_returns_another_drivers_graph_measured_faster(monkeypatch,
                                                                       gate_merge_expander):
  """A `Checkpoint` with its own `path` (training's best beside the policy's graph) is timed
  with the found path, and returned with its own rewrites and finder when it measured faster;
  when it did not, the found path is kept as it was."""
  ex = gate_merge_expander
  graph, params = recurrent_toy(ways=8)
  found = search.optimize(graph, params, "taso", expander=ex, budget=4)  # modelled guard only
  assert len(found.rewrites) == 9
  steps = tuple(found.rewrites[:3])
  other = search.replay(graph, ex, list(steps))
  alternative = search.Checkpoint.of_path(steps, other, float(ex.cost(other)), "training")
  assert alternative.rewrites == 3 and alternative.steps(found.rewrites) == list(steps)
  ratios = []

  def fake(a, candidates, p, **kw):
    verdicts = [measure.Speedup(r, r - 0.05, r + 0.05, 1.0, 0.97, 1.03, "faster", kw["level"], 6)
                for r in ratios]
    return measure.Comparison(_stats(1.0), _stats(1.0), [_stats(1 / r) for r in ratios],
                              verdicts)
  monkeypatch.setattr(search.guard, "compare", fake)
  ratios[:] = [1.1, 1.3]
  res = search.measured_guard(dataclasses.replace(found, checkpoints=[alternative]), params,
                              rounds=6)
  assert res.method == "training" and res.rewrites == list(steps)
  assert res.options["checkpoint"]["found_by"] == "training"
  assert res.options["checkpoint"]["rejected_found_by"] == "taso"
  assert res.best_graph is other and res.measured.ratio == pytest.approx(1.3)
  assert G.structural_hash(search.replay(graph, ex, res.rewrites)) == G.structural_hash(other)
  ratios[:] = [1.3, 1.1]
  res = search.measured_guard(dataclasses.replace(found, checkpoints=[alternative]), params,
                              rounds=6)
  assert res.method == "taso" and res.rewrites == found.rewrites and res.guard.kept == "path"


def test_a_fast_compile_search_compiles_one_bucket_and_runs_it_in_windows(toy, ruleset,
                                                                         expander, monkeypatch):
  """Compiled for a fast compile, a search runs the bucket `prepare` traced on the match's output
  shapes and compiled before it (`Expander.bucket_plan`), on consecutive windows when the
  candidates outnumber it, in every expansion: no other bucket compiles. A bucket of the count
  (or a larger one than `prepare`'s) is used where it is available. Windows and one bucket of
  the other tier give the same expansion: validity, costs bit for bit, candidate order,
  hashes, children; a search takes the same rewrites. (At the end of the module: its instances
  would push the shared expander's out of the process's live ones.)"""
  graph, params = toy
  ref = search.taso(graph, params, expander, budget=8, alpha=1.2)  # its usual bucket
  monkeypatch.setattr(search.expand, "MIN_BUCKET", 1)
  fresh = search.Expander(ruleset, COEFFS)
  if not fresh.plan(fast_compile=True):
    pytest.skip("the fast-compile tier is XLA:CPU's")
  fresh.prepare(graph)
  fresh.drain()
  fast_fns = fresh._fn  # pylint: disable=protected-access
  assert fast_fns.bucket.instances == 1 and fast_fns.bucket.first_calls == 0
  ids = fresh.identities(graph)
  windows, windows_children = fresh.expand(graph, ids)
  count = fresh.stats.candidates[-1]
  exact = search.expand.bucket_size(count, fresh.num_actions)
  assert count >= 2 and exact > 1
  assert fresh.bucket_plan(count) == 1  # count windows of 1
  assert fresh.bucket_plan(count, available=lambda s: s == exact) == exact
  assert fresh.num_actions > 12 and search.expand.bucket_size(10, fresh.num_actions) == 12
  assert fresh.bucket_plan(10, available=lambda s: s in (3, 4)) == 4  # the largest one
  assert fresh.stats.buckets == {1} and fast_fns.bucket.instances == 1  # prepare's served
  again, again_children = fresh.expand(graph, ids)
  assert fresh.stats.buckets == {1} and fast_fns.bucket.instances == 1  # and serves again
  assert fresh.plan(fast_compile=False) is False
  assert fresh.bucket_plan(count) == exact
  one, one_children = fresh.expand(graph, ids)
  for exp, children in ((windows, windows_children), (again, again_children)):
    np.testing.assert_array_equal(np.asarray(exp.valid), np.asarray(one.valid))
    assert np.asarray(exp.cost).tobytes() == np.asarray(one.cost).tobytes()
    np.testing.assert_array_equal(children.actions, one_children.actions)
    np.testing.assert_array_equal(children.ok, one_children.ok)
    assert children.hashes == one_children.hashes
    assert [G.structural_hash(children.graph(i)) for i in range(count)] == \
        [G.structural_hash(one_children.graph(i)) for i in range(count)]
  fresh.plan(fast_compile=True)
  res = search.taso(graph, params, fresh, budget=8, alpha=1.2)
  assert not fresh._pending  # pylint: disable=protected-access  (the search drained)
  assert fast_fns.bucket.instances == 1  # the whole search ran prepare's bucket
  assert [r.to_json() for r in res.rewrites] == [r.to_json() for r in ref.rewrites]
  assert res.best_cost_ms == ref.best_cost_ms


def test_taso_seeds_a_valley_that_the_path_to_the_best_opens():
  """Each MatMul of a step reads its own transpose of the state, so the 4-way merge matches
  nowhere in the input (no seed there); deduplicating the transposes lowers the cost and makes
  the four MatMuls of every step share one tensor, where each single merge raises the cost
  beyond alpha and all of them lower it. Seeding from each best graph crosses that valley;
  seeding from the input alone stops at the dedupes."""
  coeffs = synthetic_coeffs(matmul_launch=1.0, loop_launch=1.0, const_mb=1500.0)
  names = ("merge_matmul_shared_input_4", "dedupe_transpose_1")
  rs = RuleSet([r for r in builtin_rules(["merge_matmul", "dedupe"]) if r.name in names],
               max_locations=8)
  ex = search.Expander(rs, coeffs)
  b = GraphBuilder(seed=5)
  ws = [b.weight([16, 16]) for _ in range(4)]
  outs = []
  for _ in range(3):
    x = b.input([16, 16])
    terms = [b.matmul(b.transpose(x, [1, 0]), w_) for w_ in ws]
    while len(terms) > 1:
      terms = [b.add(terms[i], terms[i + 1]) for i in range(0, len(terms), 2)]
    outs.append(b.tanh(terms[0]))
  b.output(b.add(b.add(outs[0], outs[1]), outs[2]))
  graph, params = b.build(capacity=128)
  first = ex.costs(graph)
  valid = np.asarray(first.valid).reshape(len(rs), -1)
  assert valid[0].sum() == 0 and valid[1].sum() > 0  # no merge (no seed) in the input
  res = search.taso(graph, params, ex, budget=30)
  made = collections.Counter(s.rule for s in res.rewrites)
  assert made == {"dedupe_transpose_1": 9, "merge_matmul_shared_input_4": 3}, made  # 9 -> 3 MatMuls
  assert any(s.startswith("after 9: merge_matmul_shared_input_4 x3")
             for s in res.options["seeds"]), res.options["seeds"]
  deduped = search.replay(graph, rs, [s for s in res.rewrites
                                      if s.rule == "dedupe_transpose_1"])
  assert res.best_cost_ms == pytest.approx(float(ex.costs(deduped).current) - 3, rel=1e-4)
  assert res.best_cost_ms == pytest.approx(float(ex.costs(res.best_graph).current), rel=1e-5)
  G.validate(res.best_graph, params)
  assert_same_outputs(graph, res.best_graph, params)


def test_taso_plateau_pops_one_candidate_per_rule_in_turn():
  """A neutral slice move (through a reshape) opens the MatMul's narrowing, beside twelve
  neutral operand swaps. Popped one rule per turn inside the plateau, the move comes second
  and its gain follows; in cost order with first in, first out, the swaps would take the
  budget (as they took ViT-B/16's)."""
  coeffs = synthetic_coeffs(matmul_launch=1.0, matmul_gflop=1000.0, loop_launch=1.0)
  names = ("add_commute", "slice_through_reshape", "slice_through_matmul_rows")
  rs = RuleSet([r for r in builtin_rules() if r.name in names], max_locations=16)
  assert rs.names[0] == "add_commute"  # the swaps come first in every expansion's cost order
  ex = search.Expander(rs, coeffs)
  b = GraphBuilder(seed=2)
  y = b.reshape(b.matmul(b.input([64, 64]), b.weight([64, 64])), [64, 8, 8])
  total = b.input([4, 4])
  for _ in range(12):
    total = b.add(total, b.input([4, 4]))
  b.output(b.slice(y, 0, 0, 1), total)
  graph, params = b.build(capacity=64)
  first = ex.costs(graph)
  valid = np.asarray(first.valid).reshape(len(rs), -1)
  assert {n: int(v) for n, v in zip(rs.names, valid.sum(-1))} == {
      "add_commute": 12, "slice_through_reshape": 1, "slice_through_matmul_rows": 0}
  np.testing.assert_allclose(np.asarray(first.cost).reshape(len(rs), -1)[valid],
                             float(first.current), rtol=1e-6)  # every first step is neutral
  res = search.taso(graph, params, ex, budget=4)
  assert [s.rule for s in res.rewrites] == ["slice_through_reshape", "slice_through_matmul_rows"]
  assert res.best_cost_ms < float(first.current) - 0.1
  assert_same_outputs(graph, res.best_graph, params)
