"""The rewrite engine: every built-in rule verified numerically, near misses rejected, RuleSet
matching under jit/vmap without retracing, random rewrite sequences on zoo models."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xrlflow_jax import cost, executor, models, rules
from xrlflow_jax.cost import incremental
from xrlflow_jax.ops import Op
from xrlflow_jax import graph as G
from xrlflow_jax.rules import RuleSet
from xrlflow_jax.rules.library import OPT_IN_FAMILIES, builtin_rules
from xrlflow_jax.rules.verify import verify_rule

from tests.conftest import SHARED

RULES = builtin_rules()
# Verified like the default rules: the opt-in families.
OPT_IN = builtin_rules(list(OPT_IN_FAMILIES))
BY_NAME = {r.name: r for r in RULES + OPT_IN}
HARNESS = RuleSet(RULES + OPT_IN, max_locations=16)  # one compilation verifies every rule


def test_library_size_and_inverses():
  assert len(RULES) >= 40
  assert len(BY_NAME) == len(RULES) + len(OPT_IN)
  assert OPT_IN and not {r.family for r in RULES} & set(OPT_IN_FAMILIES)  # left out by default
  for r in RULES + OPT_IN:
    if r.inverse is not None:
      assert r.inverse in BY_NAME, f"{r.name}: inverse {r.inverse} missing"
      back = BY_NAME[r.inverse]
      assert back.family == r.family and back.inverse is not None, r.name
  families = {r.family for r in RULES}
  for fam in ("merge_matmul", "merge_conv", "enlarge_conv", "group_conv", "conv_bias",
              "conv_activation", "matmul_activation", "batch_norm", "matmul_algebra",
              "elementwise_algebra", "concat_movement", "slice_movement", "concat_slice",
              "transpose", "reshape", "narrowing"):
    assert fam in families, fam


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_rule_passes_harness(name):
  report = verify_rule(BY_NAME[name], seeds=range(3), ruleset=HARNESS)
  assert report.ok, "\n".join(report.problems)
  assert report.max_rel_err < 1e-3


# ---------------------------------------------------------------------------------------------
# Near misses: each must NOT match.

def _count(rule_name: str, graph) -> int:
  return int(HARNESS.jit_match(graph).found[HARNESS.index(rule_name)])


def _build(fn, capacity=64):  # the harness capacity: the compiled matcher is reused
  b = G.GraphBuilder(seed=0)
  outs = fn(b)
  b.output(*outs)
  return b.build(capacity)[0]


def test_merge_conv_near_misses():
  def convs(stride2=(1, 1), act2="none", k2=3):
    def fn(b):
      x = b.input((1, 3, 8, 8))
      y1 = b.conv2d(x, b.weight((4, 3, 3, 3)), padding="SAME")
      y2 = b.conv2d(x, b.weight((5, 3, k2, k2)), strides=stride2, padding="SAME",
                    activation=act2)
      return [y1, y2]
    return fn
  assert _count("merge_conv_shared_input", _build(convs())) == 1
  assert _count("merge_conv_shared_input", _build(convs(stride2=(2, 2)))) == 0
  assert _count("merge_conv_shared_input", _build(convs(act2="relu"))) == 0
  assert _count("merge_conv_shared_input", _build(convs(k2=1))) == 0
  # ... but the 1x1 can be enlarged to 3x3 first (same strides, SAME padding).
  assert _count("enlarge_conv_kernel", _build(convs(k2=1))) == 1
  assert _count("enlarge_conv_kernel", _build(convs(stride2=(2, 2), k2=1))) == 0


def test_merge_matmul_requires_constant_weights_and_shared_input():
  def fn(b):
    x, y = b.input((4, 8)), b.input((4, 8))
    w1, w2 = b.weight((8, 8)), b.weight((8, 8))
    return [b.matmul(x, w1), b.matmul(y, w2), b.matmul(x, b.input((8, 8)))]
  assert _count("merge_matmul_shared_input_2", _build(fn)) == 0


def test_merge_matmul_shared_weight_rejects_dependency_path():
  # m2 reads a function of m1: merging them would create a cycle.
  def fn(b):
    w = b.weight((6, 6))
    m1 = b.matmul(b.input((2, 6)), w)
    m2 = b.matmul(b.relu(m1), w)
    return [m2]
  assert _count("merge_matmul_shared_weight", _build(fn)) == 0
  def ok(b):
    w = b.weight((6, 6))
    return [b.matmul(b.input((2, 6)), w), b.matmul(b.input((3, 6)), w)]
  assert _count("merge_matmul_shared_weight", _build(ok)) == 1


def test_dedupe_requires_the_same_inputs_in_order_and_equal_attributes():
  def concats(order, axis):
    def fn(b):
      x, y = b.input((2, 3)), b.input((2, 3))
      return [b.neg(b.concat([x, y], axis=1)), b.relu(b.concat(order(x, y), axis=axis))]
    return fn
  assert _count("dedupe_concat_2", _build(concats(lambda x, y: [x, y], 1))) == 1
  assert _count("dedupe_concat_2", _build(concats(lambda x, y: [y, x], 1))) == 0  # order
  assert _count("dedupe_concat_2", _build(concats(lambda x, y: [x, y], 0))) == 0  # axis
  assert _count("dedupe_concat_2", _build(concats(lambda x, y: [x, x], 1))) == 0  # inputs
  def transposes(perm):
    def fn(b):
      x = b.input((2, 3, 4))
      return [b.neg(b.transpose(x, [0, 2, 1])), b.relu(b.transpose(x, perm))]
    return fn
  assert _count("dedupe_transpose_1", _build(transposes([0, 2, 1]))) == 1
  assert _count("dedupe_transpose_1", _build(transposes([1, 0, 2]))) == 0
  # Three equal copies: each pair once (the rule is symmetric), three pairs.
  def three(b):
    x, y = b.input((2, 3)), b.input((2, 3))
    return [b.neg(b.concat([x, y], axis=1)) for _ in range(3)]
  assert _count("dedupe_concat_2", _build(three)) == 3


def test_fusion_rejects_internal_output_used_outside_or_graph_output():
  def used_twice(b):
    y = b.conv2d(b.input((1, 2, 5, 5)), b.weight((3, 2, 3, 3)))
    return [b.relu(y), b.neg(y)]
  assert _count("conv_relu_fuse", _build(used_twice)) == 0
  def output_inside(b):
    y = b.conv2d(b.input((1, 2, 5, 5)), b.weight((3, 2, 3, 3)))
    return [b.relu(y), y]
  assert _count("conv_relu_fuse", _build(output_inside)) == 0
  def already_fused(b):
    y = b.conv2d(b.input((1, 2, 5, 5)), b.weight((3, 2, 3, 3)), activation="tanh")
    return [b.relu(y)]
  assert _count("conv_relu_fuse", _build(already_fused)) == 0
  def bn_shared(b):
    y = b.conv2d(b.input((1, 2, 5, 5)), b.weight((3, 2, 3, 3)))
    return [b.batch_norm(y), b.relu(y)]
  assert _count("fold_batch_norm", _build(bn_shared)) == 0


def test_movement_near_misses():
  def slices(lo, hi):
    def fn(b):
      c = b.concat([b.input((2, 3)), b.input((2, 4))], axis=1)
      return [b.slice(c, 1, lo, hi)]
    return fn
  assert _count("slice_of_concat_first", _build(slices(0, 3))) == 1
  assert _count("slice_of_concat_first", _build(slices(0, 2))) == 0
  assert _count("slice_of_concat_second", _build(slices(3, 7))) == 1
  assert _count("slice_of_concat_second", _build(slices(2, 7))) == 0
  def transposes(p2):
    def fn(b):
      return [b.transpose(b.transpose(b.input((2, 3, 4)), (1, 2, 0)), p2)]
    return fn
  assert _count("transpose_cancel", _build(transposes((2, 0, 1)))) == 1
  assert _count("transpose_cancel", _build(transposes((1, 0, 2)))) == 0
  assert _count("transpose_fuse", _build(transposes((1, 0, 2)))) == 1
  def binary(shape_b):
    def fn(b):
      x, y = b.input((2, 3)), b.input((2, 3))
      return [b.concat([b.add(x, b.input(shape_b)), b.add(y, b.input((2, 3)))], axis=0)]
    return fn
  assert _count("add_after_concat", _build(binary((2, 3)))) == 1
  assert _count("add_after_concat", _build(binary((3,)))) == 0  # broadcasting: not hoistable


# ---------------------------------------------------------------------------------------------
# The RuleSet on real models.

@pytest.fixture(scope="module")
def zoo_ruleset():
  return RuleSet(RULES, max_locations=32)


@pytest.fixture(scope="module")
def zoo_match(zoo_ruleset):
  return jax.jit(zoo_ruleset.match)


@pytest.fixture(scope="module")
def zoo_apply(zoo_ruleset):
  return jax.jit(zoo_ruleset.apply_action)


TINY = ["bert", "resnet18", "squeezenet1_1", "inception_v3", "nasrnn"]


@pytest.fixture(scope="module")
def zoo_costs():
  """(full, pruned, incremental) jitted graph costs: the pruned form skips the reachability
  loop; the incremental one costs a child from its parent (what the search pays)."""
  coeffs = cost.load_coefficients()
  full = jax.jit(lambda g: cost.graph_cost(g, coeffs))
  pruned = jax.jit(lambda g: cost.graph_cost(g, coeffs, pruned=True))
  incr = jax.jit(lambda parent, child: incremental.candidate_cost(
      parent, incremental.cost_base(parent, coeffs), child, coeffs)[:2])
  return full, pruned, incr


@pytest.fixture(scope="module")
def const_spreads():
  """Whether a child's constant sub-tree hash change spreads beyond the slots its rewrite
  touched (`incremental._const_total` not exact): the one documented case where the
  incremental cost is not exact without a cap overflowing (see
  `test_incremental_cost_is_not_exact_where_a_hash_change_spreads`)."""
  coeffs = cost.load_coefficients()
  def spreads(parent, child):
    tp, tc = G.input_table(parent), G.input_table(child)
    d = incremental.dirty_slots(parent, child, tp, tc, incremental.MAX_CHANGED)[2]
    base = incremental.cost_base(parent, coeffs)
    # pylint: disable-next=protected-access
    return ~incremental._const_total(base, parent, child, d, tp, tc)[1]
  return jax.jit(spreads)


def test_ruleset_vmap_matches_per_graph_and_traces_once():
  # A representative subset keeps the compile short; the zoo tests below use every rule.
  subset = RuleSet([BY_NAME[n] for n in (
      "merge_matmul_shared_input_2", "merge_matmul_shared_input_3", "merge_conv_shared_input",
      "enlarge_conv_kernel_bias_sib_bias", "split_matmul_shared_input_2", "conv_relu_fuse",
      "add_commute", "transpose_fuse", "slice_of_concat_first", "merge_matmul_shared_weight")],
      max_locations=16)
  graphs = [models.build(name, "tiny", capacity=256)[0] for name in ("bert", "resnet18")]

  @jax.jit
  @chex.assert_max_traces(n=1)
  def batched(batch):
    return jax.vmap(subset.match)(batch)

  chex.clear_trace_counter()
  batch = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *graphs)
  out = batched(batch)
  batched(jax.tree_util.tree_map(lambda a: a[::-1], batch))  # other graphs, same shapes
  for i, g in enumerate(graphs):
    single = subset.jit_match(g)
    np.testing.assert_array_equal(out.mask[i], single.mask)
    np.testing.assert_array_equal(out.nodes[i], single.nodes)
    np.testing.assert_array_equal(out.found[i], single.found)


def test_match_hints_skip_rules_and_cap_anchors_as_told():
  """`only` leaves the other rules empty and matches the rest as without it; `anchor_caps` at the
  graph's own op counts changes nothing, and a cap below a count examines fewer nodes and
  says how many it skipped."""
  subset = RuleSet([BY_NAME[n] for n in (
      "merge_matmul_shared_input_2", "merge_matmul_shared_input_3", "add_commute",
      "merge_conv_shared_input")], max_locations=16)
  g = models.build("bert", "tiny", capacity=256)[0]
  full = subset.jit_match(g)
  counts = rules.graph_op_counts([g])
  only = rules.firing_rules(subset.rules, counts)
  assert subset.index("merge_conv_shared_input") not in only  # no convolution in BERT
  hinted = jax.jit(lambda x: subset.match(x, only=only, anchor_caps=counts))(g)
  for leaf in ("mask", "nodes", "found", "anchors_dropped"):
    np.testing.assert_array_equal(getattr(hinted, leaf), getattr(full, leaf))
  matmul, add = int(Op.MATMUL), int(Op.ADD)
  assert counts[add] > 2 and full.mask[subset.index("add_commute")].sum() > 2
  capped = jax.jit(lambda x: subset.match(x, anchor_caps={add: 2}))(g)
  r = subset.index("add_commute")
  assert int(capped.found[r]) == 2 and int(capped.anchors_dropped[r]) == counts[add] - 2
  np.testing.assert_array_equal(capped.mask[subset.index("merge_matmul_shared_input_2")],
                                full.mask[subset.index("merge_matmul_shared_input_2")])
  assert matmul in counts
  # One rewrite by a rule that adds two MatMuls and frees one grows the bound by one per step.
  bound = rules.op_count_bounds([BY_NAME["split_matmul_shared_input_2"]], {matmul: 5}, 3)
  assert bound[matmul] == 8


def test_compact_keeps_the_first_valid_candidates_in_order():
  """`compact` (many rules at once) equals `nonzero(size=L)` row by row, with fewer, as many
  and more candidates than locations, and more valid ones than fit; `compact_index` gives the
  positions it picked."""
  rng = np.random.default_rng(0)
  for c, size in ((3, 8), (8, 8), (40, 8), (300, 64)):
    ok = rng.random((5, c)) < np.array([0.0, 0.1, 0.5, 0.9, 1.0])[:, None]
    nodes = rng.integers(0, 1000, (5, c, 3)).astype(np.int32)
    valid, picked, found = jax.jit(rules.compile.compact, static_argnums=2)(ok, nodes, size)
    for g in range(5):
      (idx,) = np.nonzero(ok[g])
      assert int(found[g]) == idx.size
      k = min(idx.size, size)
      np.testing.assert_array_equal(valid[g], np.arange(size) < k)
      np.testing.assert_array_equal(picked[g, :k], nodes[g, idx[:k]])
      assert (np.asarray(picked[g, k:]) == -1).all()
    index, valid_i, found_i = jax.jit(rules.compile.compact_index, static_argnums=1)(ok, size)
    np.testing.assert_array_equal(valid_i, valid)
    np.testing.assert_array_equal(found_i, found)
    for g in range(5):
      (idx,) = np.nonzero(ok[g])
      k = min(idx.size, size)
      np.testing.assert_array_equal(index[g, :k], idx[:k])


def _constraint_rules() -> list:
  rules_with_where = [r for r in RULES if r.where is not None]
  taso_path = SHARED / "taso" / "graph_subst.pb"
  if taso_path.is_file():
    rules_with_where += [r for r in rules.load_taso(taso_path).rules if r.where is not None]
  return rules_with_where


def test_constraints_read_prefetched_rows_as_the_graph(monkeypatch):
  """A constraint reads the rows the matcher prefetched for it (only those it reads, found by
  tracing it once) exactly as it would read the graph: binding every rule with prefetching
  and with every read from the graph gives the same candidates (built-in rules, and TASO's
  where ../shared has them), and prefetching is not empty."""
  constrained = _constraint_rules()
  subset = RuleSet(constrained)
  g = models.build("bert", "tiny", capacity=256)[0]

  def bind(x):
    f = rules.Features(x, subset.need_depth, subset.max_anchors, None)
    return [c.bind_all(f) for c in subset.compiled]
  prefetched = jax.jit(bind)(g)
  reads = {c.rule.name: c._where_reads(g, c.rule.num_bound)  # pylint: disable=protected-access
           for c in subset.compiled}
  assert sum(bool(r) for r in reads.values()) >= len(reads) // 2, reads
  for c in subset.compiled:
    monkeypatch.setattr(c, "_where_reads", lambda graph, p: ())
  from_graph = jax.jit(bind)(g)
  for c, (ok_a, nodes_a), (ok_b, nodes_b) in zip(subset.compiled, prefetched, from_graph):
    np.testing.assert_array_equal(ok_a, ok_b, err_msg=c.rule.name)
    np.testing.assert_array_equal(nodes_a, nodes_b, err_msg=c.rule.name)


def test_ruleset_match_equals_each_rule_bound_alone():
  """The rule set compacts rules of equal candidate count together and puts them back in rule
  order: every rule's locations equal its own candidates compacted independently (numpy),
  for single-root, joined and symmetric three-root rules, skipped rules (`only`) and an
  anchor cap below the location count."""
  names = ("add_commute", "merge_matmul_shared_input_2", "merge_matmul_shared_input_3",
           "conv_relu_fuse", "transpose_fuse", "merge_conv_shared_input", "slice_of_concat_first",
           "split_matmul_shared_input_2")
  subset = RuleSet([BY_NAME[n] for n in names], max_locations=4)
  for model in ("bert", "resnet18"):
    g = models.build(model, "tiny", capacity=256)[0]
    counts = rules.graph_op_counts([g])
    only = frozenset(range(0, len(names), 2))
    for kwargs in ({}, {"only": only}, {"anchor_caps": {int(Op.ADD): 2}}):
      got = jax.jit(lambda x, kw=kwargs: subset.match(x, **kw))(g)

      def alone(x, kw=kwargs):
        f = rules.Features(x, subset.need_depth, subset.max_anchors, kw.get("anchor_caps"))
        return [c.bind_all(f) for c in subset.compiled]
      for r, (ok, nodes) in enumerate(jax.jit(alone)(g)):
        ok, nodes = np.asarray(ok), np.asarray(nodes)
        if "only" in kwargs and r not in only:
          ok = np.zeros_like(ok)
        (idx,) = np.nonzero(ok)
        k = min(idx.size, 4)
        assert int(got.found[r]) == idx.size, (model, names[r], kwargs)
        np.testing.assert_array_equal(got.mask[r], np.arange(4) < k)
        p = nodes.shape[-1]
        np.testing.assert_array_equal(got.nodes[r, :k, :p], nodes[idx[:k]])
        assert (np.asarray(got.nodes[r, k:]) == -1).all() and (np.asarray(got.nodes[r, :, p:]) == -1).all()
    assert int(got.found[0]) == 2  # the cap: add_commute examined two Adds


# Inception-v3's walk takes about 100 s (its lowerings dominate); it runs with `-m slow`.
_SLOW_WALKS = ("inception_v3",)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in _SLOW_WALKS
                                  else n for n in models.list_models()])
def test_random_rewrite_sequence_keeps_outputs(name, zoo_ruleset, zoo_match, zoo_apply,
                                               zoo_costs, const_spreads):
  """Fifty random valid rewrites of every zoo model: outputs unchanged, and after every rewrite
  the cost model's pruned and incremental forms (what the search pays per candidate) equal the
  full one, the incremental one exactly (no fallback to the full model needed) except where a
  folded constant's hash change spreads to an untouched folded reader (re-pointing a merged
  weight's Concat: then the search costs the child in full), at most twice a walk."""
  full_cost, pruned_cost, incremental_cost = zoo_costs
  graph, params = models.build(name, "tiny", capacity=256)
  lowered = executor.lower(graph, params)
  inputs = lowered.random_inputs(0)
  ref = [np.asarray(y) for y in lowered(*inputs)]
  rng = np.random.default_rng(0)
  applied = spread = 0
  steps = 50
  for step in range(steps):
    m = zoo_match(graph)
    flat = np.flatnonzero(np.asarray(m.mask).reshape(-1))
    if not len(flat):
      break
    parent = graph
    graph, ok = zoo_apply(graph, m, int(rng.choice(flat)))
    assert bool(ok), f"step {step}: a masked action was refused"
    applied += 1
    full = float(full_cost(graph))
    assert float(pruned_cost(graph)) == pytest.approx(full, rel=1e-6), step
    incr, exact = incremental_cost(parent, graph)
    if bool(exact):
      assert float(incr) == pytest.approx(full, rel=1e-6), step
    else:
      assert bool(const_spreads(parent, graph)), step  # no cap overflowed
      spread += 1
    if step % 10 == 9 or step == steps - 1:
      G.validate(graph, params)
  G.validate(graph, params)
  out = [np.asarray(y) for y in executor.lower(graph, params)(*inputs)]
  for a, b in zip(ref, out):
    np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-4)
  assert applied > 0 and spread <= 2


@pytest.mark.parametrize("name", ["nasrnn"] + [pytest.param(n, marks=pytest.mark.slow)
                                              for n in ("bert", "resnext50")])
def test_incremental_cost_equals_the_full_model_on_every_candidate(name, zoo_match, zoo_apply,
                                                                   zoo_costs):
  """Every valid candidate of a zoo graph (NasRNN's steps share weights, so its folded
  constants have classes of many slots): the incremental cost, where it says exact, equals
  the full model; it is exact on all of them."""
  full_cost, _, incremental_cost = zoo_costs
  graph, _ = models.build(name, "tiny", capacity=256)
  m = zoo_match(graph)
  actions = np.flatnonzero(np.asarray(m.mask).reshape(-1))
  assert len(actions) > 20
  inexact = 0
  for a in actions:
    child, ok = zoo_apply(graph, m, int(a))
    if not bool(ok):
      continue
    incr, exact = incremental_cost(graph, child)
    if not bool(exact):
      inexact += 1
      continue
    assert float(incr) == pytest.approx(float(full_cost(child)), rel=1e-6), int(a)
  assert inexact == 0


def test_incremental_cost_sees_a_new_constant_equal_to_an_existing_one(zoo_ruleset, zoo_match,
                                                                        zoo_apply, zoo_costs):
  """Two MatMul pairs share their weights (as an unrolled RNN's steps do): after merging one
  pair, merging the other builds a folded concat equal to the first one's, so the distinct
  constants do not grow: the new slot's hash must be the child's own, not the free slot's."""
  full_cost, _, incremental_cost = zoo_costs
  b = G.GraphBuilder(seed=0)
  w1, w2 = b.weight((8, 6)), b.weight((8, 6))
  outs = []
  for _ in range(2):
    x = b.input((4, 8))
    outs += [b.matmul(x, w1), b.matmul(x, w2)]
  b.output(*outs)
  graph, _ = b.build(capacity=256)
  rule = zoo_ruleset.names.index("merge_matmul_shared_input_2")
  locations = zoo_ruleset.max_locations

  def merges(g):
    m = zoo_match(g)
    return m, [a for a in np.flatnonzero(np.asarray(m.mask).reshape(-1))
               if a // locations == rule]
  m, actions = merges(graph)
  assert len(actions) == 2
  child, ok = zoo_apply(graph, m, int(actions[0]))
  assert bool(ok)
  m, actions = merges(child)
  (a,) = actions
  grandchild, ok = zoo_apply(child, m, int(a))
  assert bool(ok)
  incr, exact = incremental_cost(child, grandchild)
  assert bool(exact)
  assert float(incr) == pytest.approx(float(full_cost(grandchild)), rel=1e-6)


def test_incremental_cost_is_not_exact_where_a_hash_change_spreads(zoo_costs):
  """A rewrite that re-points a folded constant read by another folded constant changes that
  reader's sub-tree hash too, beyond the slots the rewrite touched: the incremental cost says
  it is not exact (the search then costs the child alone), and says exact where nothing
  spreads."""
  rs = RuleSet([BY_NAME["transpose_fuse"]], max_locations=4)
  for extra_reader, want_exact in ((False, True), (True, False)):
    _check_one_rewrite(rs, _folded_transposes(extra_reader), zoo_costs, want_exact)


def test_model_cost_costs_a_child_in_full_where_the_incremental_cost_is_not_exact(
    zoo_costs, monkeypatch):
  """`cost.ModelCost.candidate_costs` (an environment's exact candidate delta) equals costing
  each child in full, also for children the incremental cost does not cover: with room for
  one changed slot only, the incremental values are wrong and say so, and those children are
  costed in full inside the same jitted call (tiny BERT, its Q/K/V MatMul merges)."""
  rs = RuleSet([BY_NAME["merge_matmul_shared_input_2"]], max_locations=4)
  coeffs = cost.load_coefficients()
  full_cost = zoo_costs[0]
  graph, _ = models.build("bert", "tiny", capacity=256)
  m = jax.jit(rs.match)(graph)
  children, _, ok = jax.jit(rs.candidates)(graph, m.nodes, m.mask)
  ok = np.flatnonzero(np.asarray(ok))
  assert len(ok) >= 2
  want = np.asarray([float(full_cost(jax.tree_util.tree_map(lambda x, i=i: x[i], children)))
                     for i in ok])
  for max_changed in (incremental.MAX_CHANGED, 1):
    monkeypatch.setattr(incremental, "MAX_CHANGED", max_changed)  # read when traced
    got = np.asarray(jax.jit(cost.ModelCost(coeffs).candidate_costs)(graph, children))[ok]
    np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"MAX_CHANGED {max_changed}")
  base = incremental.cost_base(graph, coeffs)  # still MAX_CHANGED 1: the fallback was needed
  incr, exact, _ = jax.vmap(lambda c: incremental.candidate_cost(graph, base, c, coeffs))(
      jax.tree_util.tree_map(lambda x: x[ok], children))
  assert not np.asarray(exact).any()
  assert np.abs(np.asarray(incr) / want - 1).max() > 1e-3


def _folded_transposes(extra_reader: bool):
  """x @ reshape(transpose(transpose(w))) with folded constants (and, with `extra_reader`,
  more folded readers downstream), at the zoo tests' capacity (one compile of the costs)."""
  b = G.GraphBuilder(seed=0)
  x = b.input((3, 24))
  w = b.weight((2, 3, 4))
  t = b.transpose(b.transpose(w, (1, 2, 0)), (1, 0, 2))  # folded: [4, 3, 2]
  r = b.reshape(t, (24, 1))
  if extra_reader:
    r = b.unsqueeze(b.squeeze(r, [1]), [1])
  b.output(b.matmul(x, r))
  return b.build(capacity=256)[0]


def _check_one_rewrite(rs: RuleSet, graph, zoo_costs, want_exact: bool) -> None:
  """Applies the one candidate of `rs` on `graph`: the incremental cost says exact as told,
  and then equals the full model."""
  full_cost, _, incremental_cost = zoo_costs
  m = jax.jit(rs.match)(graph)
  (a,) = np.flatnonzero(np.asarray(m.mask).reshape(-1))
  child, ok = jax.jit(rs.apply_action)(graph, m, int(a))
  assert bool(ok)
  incr, exact = incremental_cost(graph, child)
  assert bool(exact) == want_exact
  if want_exact:
    assert float(incr) == pytest.approx(float(full_cost(child)), rel=1e-6)


def test_incremental_cost_is_not_exact_past_its_reader_table(zoo_costs):
  """A rewrite that re-points a node read (through bitcasts) by more consumers than the
  parent's reader table keeps (`incremental.MAX_READERS`): the rows it can change are not all
  known, so the incremental cost says it is not exact; with fewer readers it is exact and
  equal to the full model."""
  rs = RuleSet([BY_NAME["transpose_fuse"]], max_locations=4)

  def build(readers: int):
    b = G.GraphBuilder(seed=0)
    x = b.input((2, 3, 4))
    y = b.node(Op.RELU, [b.transpose(b.transpose(x, (1, 2, 0)), (1, 0, 2))])  # [4, 3, 2]
    flat = b.reshape(y, (24,))  # half the readers see y through a bitcast
    b.output(*[b.node(Op.ADD, [y if i % 2 else b.reshape(flat, (4, 3, 2)),
                               b.input((4, 3, 2))])
               for i in range(readers)])
    return b.build(capacity=256)[0]
  for readers, want_exact in ((incremental.MAX_READERS // 2, True),
                              (incremental.MAX_READERS + 2, False)):
    _check_one_rewrite(rs, build(readers), zoo_costs, want_exact)


@pytest.mark.parametrize("name", ["resnet18", pytest.param("bert", marks=pytest.mark.slow)])
def test_incremental_cost_with_fused_epilogues_equals_the_full_model(name, zoo_match,
                                                                     zoo_apply):
  """The GPU form of the model (bias and activation fused into MatMul/Conv2D kernels, so
  consumers join them): every candidate of a tiny zoo graph, incremental == full, all exact.
  ResNet-18's merges of sibling convolutions cross the count of 2 (dropping the sibling rows
  fails this test)."""
  coeffs = dataclasses.replace(cost.load_coefficients(), epilogue_fusion=True)
  full = jax.jit(lambda g: cost.graph_cost(g, coeffs, pruned=True))
  incr = jax.jit(lambda p, c: incremental.candidate_cost(
      p, incremental.cost_base(p, coeffs), c, coeffs)[:2])
  graph, _ = models.build(name, "tiny", capacity=256)
  m = zoo_match(graph)
  actions = np.flatnonzero(np.asarray(m.mask).reshape(-1))
  assert len(actions) > 10
  for a in actions:
    child, ok = zoo_apply(graph, m, int(a))
    if bool(ok):
      c, exact = incr(graph, child)
      assert bool(exact), int(a)
      assert float(c) == pytest.approx(float(full(child)), rel=1e-6), int(a)


def test_location_table_on_zoo(zoo_match, zoo_ruleset):
  """Every rule family fires somewhere in the zoo (rules that fire nowhere are listed)."""
  fired: dict[str, int] = {n: 0 for n in zoo_ruleset.names}
  for name in models.list_models():
    graph, _ = models.build(name, "tiny", capacity=256)
    found = np.asarray(zoo_match(graph).found)
    for rule, count in zip(zoo_ruleset.names, found):
      fired[rule] += int(count)
  for must in ("merge_matmul_shared_input_3", "merge_conv_shared_input_bias",
               "enlarge_conv_kernel_bias_sib_bias", "merge_group_conv_bias", "add_commute",
               "conv_bias_relu_unfuse"):
    assert fired[must] > 0, must
