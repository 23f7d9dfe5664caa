"""The measured kernel table: keys agree between the jitted model and the host signatures,
lookups replace exactly the kernel part of a row, the incremental candidate cost equals the
full model with a table, and a search follows what the table measures."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xrlflow_jax import cost, models, search
from xrlflow_jax.cost import incremental, kernel_table
from xrlflow_jax.cost import model as cost_model
from xrlflow_jax.cost.profiler import LOOP_TIMING, TIMING, Profiler
from xrlflow_jax.cost.signatures import OpSignature
from xrlflow_jax.errors import XrlflowError
from xrlflow_jax.graph import GraphBuilder, layout
from xrlflow_jax.ops import ATTR_WIDTH, Activation, Op
from xrlflow_jax.rules import RuleSet
from xrlflow_jax.rules.library import builtin_rules


class _TableProfiler(Profiler):
  """A profiler whose 'measurement' is a given function of the signature (deterministic, so
  tests can say which kernel is faster); everything else (cache, keys) is the real one."""

  def __init__(self, cache_dir, ms_of):
    super().__init__(cache_dir=cache_dir)
    self.ms_of = ms_of

  def measure_many(self, sigs):
    entries, errors = {}, {}
    for sig in sigs:
      try:
        ms = float(self.ms_of(sig))
      except XrlflowError as e:
        errors[sig.key] = e
        continue
      self.measure_count += 1
      entries[sig.key] = {"median_ms": ms, "q1_ms": ms, "q3_ms": ms, "runs": 1,
                          "compile_s": 0.0, "op": sig.op, "describe": sig.describe(),
                          "call_ms": self.call_overhead(), "timing": TIMING}
    return entries, errors

  measure_kernels = measure_many

  def call_overhead(self, save=True):
    return 0.005


def _groups(sig: OpSignature) -> int:
  return int(sig.attrs[cost_model._CONV_GROUPS]) if sig.op == "Conv2D" else 1  # pylint: disable=protected-access


def _conv_graph(*, groups=4, bias=False, act=Activation.NONE, max_inputs=None, extra=False):
  b = GraphBuilder(seed=0, **({"max_inputs": max_inputs} if max_inputs else {}))
  x = b.input((1, 16, 8, 8))
  if extra:  # another op first, so the conv sits at another slot
    x = b.node(Op.RELU, [x])
  w = b.weight((16, 16 // groups, 3, 3))
  y = b.conv2d(x, w, b.weight((16,)) if bias else None, padding=1, groups=groups,
               activation=act)
  b.output(y)
  return b.build(capacity=16)


def _conv_key(graph):
  g = layout.to_host(graph)
  (v,) = np.flatnonzero(g.nodes["alive"] & (g.nodes["op"] == Op.CONV2D))
  return int(np.asarray(jax.jit(cost_model.kernel_keys)(g))[v])


def test_kernel_keys_name_the_bare_kernel_in_any_graph():
  """One key per (op, attributes, data and weight shapes): the same in graphs of another input
  capacity or slot order, without the bias and activation (the epilogue is the model's);
  another group count or shape is another key."""
  base = _conv_key(_conv_graph()[0])
  assert _conv_key(_conv_graph(max_inputs=6)[0]) == base
  assert _conv_key(_conv_graph(extra=True)[0]) == base
  assert _conv_key(_conv_graph(bias=True, act=Activation.RELU)[0]) == base
  assert _conv_key(_conv_graph(groups=2)[0]) != base
  assert base < 2 ** 31  # never the table's padding


def test_the_host_signature_of_a_kernel_keys_the_same_in_its_own_graph(tmp_path):
  """What the table stores under a key (the bare signature the host derives from a graph's
  node) is, built alone, a graph whose kernel has the same key: the profile is of that key."""
  graph, _ = _conv_graph(bias=True, act=Activation.RELU)
  times = kernel_table.KernelTimes(_TableProfiler(tmp_path, lambda s: 1.0))
  (key, sig), = times.missing(graph).items()
  assert len(sig.in_shapes) == cost_model.KERNEL_OPERANDS and sig.attrs[
      cost_model.kernel_activation_offset("Conv2D")] == 0
  alone, _ = sig.single_op_graph()
  assert _conv_key(alone) == key


def test_table_replaces_the_kernel_part_only(tmp_path):
  """Without a table entry a kernel keeps the roofline (and is reported missing); with one, its
  row costs the measured time plus the model's epilogue, and no other row changes."""
  coeffs = cost.load_coefficients("cpu")
  graph, _ = _conv_graph(bias=True, act=Activation.RELU)
  times = kernel_table.KernelTimes(_TableProfiler(tmp_path, lambda s: 2.5))
  fn = jax.jit(lambda g, t: cost_model.node_costs_and_misses(g, coeffs, kernels=t))
  empty = times.table()
  analytic = np.asarray(cost_model.node_costs(graph, coeffs))
  before, missing = fn(graph, empty)
  np.testing.assert_array_equal(np.asarray(before), analytic)
  assert bool(missing)
  assert times.add(graph) == 1 and times.add(graph) == 0 and times.measured == 1
  after, missing = fn(graph, times.table())
  assert not bool(missing)
  g = layout.to_host(graph)
  (v,) = np.flatnonzero(g.nodes["alive"] & (g.nodes["op"] == Op.CONV2D))
  feats = np.asarray(cost_model.node_features(graph))
  w = np.asarray(coeffs.weights)
  loop = [cost_model.FEATURE_NAMES.index(f"loop.{p}") for p in cost_model.PER_CLASS]
  epilogue = feats[v, loop] @ w[loop]
  assert epilogue > 0  # bias and relu
  assert float(after[v]) == pytest.approx(2.5 - 0.005 + epilogue, rel=1e-6)
  others = np.arange(len(analytic)) != v
  np.testing.assert_array_equal(np.asarray(after)[others], analytic[others])


def test_a_pool_costs_what_the_table_measures(tmp_path):
  """A pool is a kernel of the table: its row costs the measured time (no epilogue), it is
  reported missing until measured, and no other row changes."""
  coeffs = cost.load_coefficients("cpu")
  b = GraphBuilder(seed=0)
  x = b.node(Op.RELU, [b.input((1, 8, 12, 12))])
  b.output(b.node(Op.MAX_POOL, [x], kernel=(3, 3), strides=(2, 2), pads=(0, 0, 0, 0)))
  graph, _ = b.build(capacity=16)
  times = kernel_table.KernelTimes(_TableProfiler(tmp_path, lambda s: 0.75))
  fn = jax.jit(lambda g, t: cost_model.node_costs_and_misses(g, coeffs, kernels=t))
  analytic = np.asarray(cost_model.node_costs(graph, coeffs))
  before, missing = fn(graph, times.table())
  np.testing.assert_array_equal(np.asarray(before), analytic)
  assert bool(missing)
  (sig,) = times.missing(graph).values()
  assert sig.op == "MaxPool"
  assert times.add(graph) == 1
  after, missing = fn(graph, times.table())
  assert not bool(missing)
  g = layout.to_host(graph)
  (v,) = np.flatnonzero(g.nodes["alive"] & (g.nodes["op"] == Op.MAX_POOL))
  assert float(after[v]) == pytest.approx(0.75 - 0.005, rel=1e-6)
  others = np.arange(len(analytic)) != v
  np.testing.assert_array_equal(np.asarray(after)[others], analytic[others])


def test_siblings_keep_the_fitted_concurrency_discount(tmp_path):
  """Two MatMuls reading one tensor run concurrently on XLA:CPU: measured alone, each is
  scaled by the fit's sibling/own GFLOP ratio."""
  coeffs = cost.load_coefficients("cpu")
  b = GraphBuilder(seed=0)
  x = b.input((8, 32))
  b.output(b.matmul(x, b.weight((32, 32))), b.matmul(x, b.weight((32, 32))))
  graph, _ = b.build(capacity=16)
  times = kernel_table.KernelTimes(_TableProfiler(tmp_path, lambda s: 1.005))
  times.add(graph)
  costs = np.asarray(cost_model.node_costs(graph, coeffs, kernels=times.table()))
  named = coeffs.named()
  ratio = named["matmul.gflop_sibling"] / named["matmul.gflop"]
  mm = np.flatnonzero(np.asarray(graph.nodes["op"]) == Op.MATMUL)
  np.testing.assert_allclose(costs[mm], ratio * 1.0, rtol=1e-6)


def _resnext_expander(tmp_path, ms_of):
  names = ("merge_group_conv_bias", "split_group_conv_bias", "conv_bias_unfuse",
           "conv_bias_relu_unfuse", "add_commute")
  rs = RuleSet([r for r in builtin_rules() if r.name in names], max_locations=16)
  times = kernel_table.KernelTimes(_TableProfiler(tmp_path, ms_of))
  return search.Expander(rs, cost.load_coefficients("cpu"), kernels=times), times


def test_incremental_candidate_costs_with_a_table_equal_the_full_model(tmp_path):
  """Every candidate of tiny ResNeXt-50 at capacity 256 (the incremental cost's path), with
  measured kernels: the bucket's cost equals the full model with the same table; candidates
  whose new kernels were not in the table were measured and costed again."""
  assert 256 >= incremental.MIN_CAPACITY
  graph, _ = models.build("resnext50", "tiny", capacity=256)
  ex, times = _resnext_expander(
      tmp_path, lambda s: 0.05 * _groups(s) + 1e-4 * np.prod(s.in_shapes[-1]))
  exp, children = ex.expand(graph, ex.identities(graph))
  assert ex.stats.kernel_recosted > 0 and len(times) > ex.stats.kernel_recosted // 8
  valid, costs = np.asarray(exp.valid), np.asarray(exp.cost)
  assert valid.sum() > 20
  for i, a in enumerate(children.actions):
    if children.ok[i]:
      assert costs[a] == pytest.approx(ex.cost(children.graph(i)), rel=1e-6), int(a)
  table = times.table()
  full = jax.jit(lambda g: cost_model.graph_cost(g, ex.coeffs, pruned=True, kernels=table))
  base = jax.jit(lambda g: incremental.cost_base(g, ex.coeffs, table))(graph)
  incr = jax.jit(lambda p, b, c: incremental.candidate_cost(p, b, c, ex.coeffs, kernels=table))
  for i in np.flatnonzero(children.ok)[:12]:
    child = children.graph(int(i))
    c, exact, missing = incr(graph, base, child)
    assert bool(exact) and not bool(missing)
    assert float(c) == pytest.approx(float(full(child)), rel=1e-6)


def test_search_follows_the_measured_kernels(tmp_path):
  """A grouped convolution that the table says runs faster with fewer groups: the TASO-style
  search with the table merges its groups, though the roofline alone calls the first merge
  (8 -> 4 groups, a bigger weight) slower."""
  b = GraphBuilder(seed=0)
  x = b.input((1, 32, 16, 16))
  y = b.conv2d(x, b.weight((32, 4, 3, 3)), b.weight((32,)), padding=1, groups=8)
  b.output(b.node(Op.RELU, [y]))
  graph, params = b.build(capacity=32)
  rs = RuleSet([r for r in builtin_rules() if r.name == "merge_group_conv_bias"])
  coeffs = cost.load_coefficients("cpu")
  times = kernel_table.KernelTimes(_TableProfiler(tmp_path, lambda s: 0.5 * _groups(s)))
  ex = search.Expander(rs, coeffs, kernels=times)
  found = search.optimize(graph, params, "taso", expander=ex, budget=8)
  assert [s.rule for s in found.rewrites] == ["merge_group_conv_bias"] * 3  # 8 -> 1 groups
  assert found.modelled_speedup > 2
  assert ex.stats.kernels_added == 4 and times.measured == 4
  first = search.replay(graph, ex, found.rewrites[:1])
  roofline = jax.jit(lambda g: cost_model.graph_cost(g, coeffs))
  assert float(roofline(first)) > float(roofline(graph))


def test_kernel_times_measure_for_real_and_cache_on_disk(tmp_path):
  """The real profiler: a kernel is timed once (positive, less the empty call), and a second
  table on the same cache finds it without measuring."""
  graph, _ = _conv_graph(groups=2)
  first = kernel_table.KernelTimes(Profiler(cache_dir=tmp_path, repeats=5, min_time_s=0.01))
  assert first.add(graph) == 1 and first.measured == 1
  (ms,) = first.ms.values()
  assert 0 <= ms < 1000
  second = kernel_table.KernelTimes(Profiler(cache_dir=tmp_path))
  assert second.add(graph) == 1 and second.measured == 0
  assert second.ms == first.ms
  assert second.rows()[0]["kernel"].startswith("Conv2D(float32[1, 16, 8, 8], float32[16, 8, 3")


def test_needs_timing_only_for_kernels_neither_known_nor_cached(tmp_path):
  """`needs_timing` (whether `add` would time a kernel, so a search must stop its background
  compiles first): true for a kernel new to the table and the profiler's cache, false once
  either holds it."""
  graph, _ = _conv_graph(groups=2)
  first = kernel_table.KernelTimes(_TableProfiler(tmp_path, lambda s: 1.0))
  assert first.needs_timing(graph)
  first.add(graph)
  assert first.profiler.measure_count == 1 and not first.needs_timing(graph)
  second = kernel_table.KernelTimes(_TableProfiler(tmp_path, lambda s: 1.0))
  assert second.missing(graph) and not second.needs_timing(graph)  # in the cache on disk
  second.add(graph)
  assert second.profiler.measure_count == 0
  assert kernel_table.KernelTimes(_TableProfiler(tmp_path, lambda s: 1.0)).needs_timing(
      _conv_graph(groups=4)[0])


def test_table_grows_past_its_capacity(tmp_path):
  """More kernels than the table's capacity: it doubles, keys stay sorted and all are found."""
  times = kernel_table.KernelTimes(_TableProfiler(tmp_path, lambda s: 1.0 + _groups(s)),
                                   capacity=1)
  for groups in (1, 2, 4):
    times.add(_conv_graph(groups=groups)[0])
  table = times.table()
  assert table.keys.shape[0] == 4
  keys = np.asarray(table.keys)
  assert (np.diff(keys.astype(np.int64)) > 0).all()
  hit, ms = cost_model.lookup_kernels(table, jnp.asarray(keys[:3]))
  assert np.asarray(hit).all() and sorted(np.asarray(ms).round(3)) == [1.995, 2.995, 4.995]


def test_a_kernel_that_cannot_be_timed_keeps_the_roofline(tmp_path):
  """A profiler error (say, a kernel too big to run alone) is recorded, not raised: that kernel
  keeps the model's estimate and is not reported missing (so a search does not measure it
  again and again)."""
  def refuse(sig):
    raise cost.ProfileError(f"cannot build {sig.describe()} alone")
  coeffs = cost.load_coefficients("cpu")
  graph, _ = _conv_graph(bias=True)
  times = kernel_table.KernelTimes(_TableProfiler(tmp_path, refuse))
  assert times.add(graph) == 1 and len(times.unmeasured) == 1
  assert "cannot build" in times.rows()[0]["unmeasured"]
  costs, missing = cost_model.node_costs_and_misses(graph, coeffs, kernels=times.table())
  assert not bool(missing)
  np.testing.assert_array_equal(np.asarray(costs),
                                np.asarray(cost_model.node_costs(graph, coeffs)))


MERGE_RULES = ("merge_matmul_shared_input_2", "merge_matmul_shared_input_4",
               "merge_matmul_shared_input_8", "merge_matmul_shared_weight", "dedupe_concat_2",
               "dedupe_concat_4")


def test_a_search_takes_the_same_path_whether_its_kernels_are_new_or_known(tmp_path):
  """Tiny NasRNN (many equal-cost merges): the first search measures kernels as it meets them,
  the second finds them all in the table. Both must return the same rewrites: a candidate
  whose kernels were new is costed by the same computation a later expansion runs, not alone
  (which rounds differently and reorders ties in the queue)."""
  graph, params = models.build("nasrnn", "tiny", capacity=256)
  assert 256 >= incremental.MIN_CAPACITY
  # The rules that make NasRNN's ties (its gate and step merges, and the Concat dedupes they
  # repeat), not every rule that can fire: compiling all of them took 216 s of the suite.
  rs = RuleSet([r for r in builtin_rules() if r.name in MERGE_RULES], max_locations=16)
  # A launch overhead per kernel: merging MatMuls pays.
  times = kernel_table.KernelTimes(_TableProfiler(
      tmp_path, lambda s: 0.01 + 1e-7 * np.prod(s.in_shapes[1])))
  ex = search.Expander(rs, cost.load_coefficients("cpu"), kernels=times)
  cold = search.optimize(graph, params, "taso", expander=ex, budget=10)
  assert ex.stats.kernel_recosted > 0
  ex.stats.reset()
  warm = search.optimize(graph, params, "taso", expander=ex, budget=10)
  assert ex.stats.kernels_added == 0 and ex.stats.kernel_recosted == 0
  assert [s.to_json() for s in warm.rewrites] == [s.to_json() for s in cold.rewrites]
  assert warm.rewrites, "the search must find something for the comparison to mean anything"


# ---------------------------------------------------------------------------------------------
# Streamed weights: MatMuls timed a call at a time where no weight is read twice.

class _TwoTimings(_TableProfiler):
  """Every kernel 1 ms an iteration of its hot loop, 3 ms a call (its weight streamed)."""

  def __init__(self, cache_dir):
    super().__init__(cache_dir, lambda s: 3.0)

  def measure_kernels(self, sigs):
    entries, errors = self.measure_many(sigs)
    return ({k: {**e, "median_ms": 1.0, "call_ms": 0.0, "timing": LOOP_TIMING, "load": 1.0}
             for k, e in entries.items()}, errors)


def _two_matmuls(shared: bool):
  """x [2, 8] @ w, tanh, @ w again (shared) or @ another weight."""
  b = GraphBuilder(seed=0)
  w = b.weight((8, 8))
  h = b.matmul(b.input((2, 8)), w)
  b.output(b.matmul(b.node(Op.TANH, [h]), w if shared else b.weight((8, 8))))
  return b.build(capacity=32)


def test_weights_read_once_choose_call_at_a_time_timing(tmp_path):
  """A graph that reads each weight once is costed with MatMuls timed a call at a time; one
  whose MatMuls share a weight (an unrolled RNN) with the hot loop's times; each timing keeps
  its own table, and a search records which it used."""
  once, params = _two_matmuls(shared=False)
  shared, _ = _two_matmuls(shared=True)
  assert kernel_table.weights_read_once(once) and not kernel_table.weights_read_once(shared)
  times = kernel_table.KernelTimes(_TwoTimings(tmp_path))
  assert times.use_for(shared) is False
  times.add(shared)
  assert set(times.ms.values()) == {1.0}
  assert times.use_for(once) is True and times.needs_timing(once)
  times.add(once)
  assert np.allclose(list(times.ms.values()), 3.0 - 0.005)
  table = times.table()
  keys = np.asarray(jax.jit(cost_model.kernel_keys)(once))
  g = layout.to_host(once)
  mm = np.flatnonzero(g.nodes["alive"] & (g.nodes["op"] == Op.MATMUL))
  hit, ms = cost_model.lookup_kernels(table, jnp.asarray(keys[mm]))
  assert bool(jnp.all(hit)) and np.allclose(np.asarray(ms), 2.995)
  assert times.use_for(shared) is False and set(times.ms.values()) == {1.0}  # kept
  rs = RuleSet([r for r in builtin_rules() if r.name == "matmul_transposed"], max_locations=4)
  found = search.optimize(once, params, "greedy", rs, cost.load_coefficients("cpu"),
                          kernels=times, max_steps=2)
  assert found.options["kernels_streamed"] is True and times.streamed


def test_streamed_kernels_are_timed_a_call_at_a_time(tmp_path):
  """The real profiler: `streamed` times a MatMul one call at a time (the empty call recorded
  to be taken off), cached apart from its hot-loop entry."""
  prof = Profiler(cache_dir=tmp_path, repeats=5, min_time_s=0.01)
  sig = OpSignature("MatMul", (0,) * ATTR_WIDTH, ((4, 32), (32, 16)), ("float32", "float32"))
  (called,) = prof.profile_kernels([sig], streamed=True)[0].values()
  assert called["timing"] == TIMING and called["call_ms"] > 0
  assert prof.current_kernel(sig, streamed=True) is not None
  assert prof.current_kernel(sig) is None  # the hot loop's entry is another measurement
  (looped,) = prof.profile_kernels([sig])[0].values()
  assert looped["timing"] == LOOP_TIMING and looped["call_ms"] == 0.0


def test_a_bound_table_is_a_traced_input_of_every_model_cost(tmp_path):
  """`cost.bound_kernels(table)`: inside the block a ModelCost with a table costs with the
  bound one (what a training state carries), its full cost, node costs and candidate costs
  alike, and a jitted function taking the table as an argument is traced once for tables of
  one capacity; a roofline ModelCost is unaffected."""
  coeffs = cost.load_coefficients("cpu")
  graph, _ = _conv_graph(bias=True, act=Activation.RELU)
  times = kernel_table.KernelTimes(_TableProfiler(tmp_path, lambda s: 2.5))
  empty = times.table()
  own = cost.ModelCost(coeffs, kernels=empty)
  roofline = cost.ModelCost(coeffs)
  traces = []

  def costs(table, g):
    traces.append(1)
    with cost.bound_kernels(table):
      return own(g), own.node_costs(g), roofline(g), own.candidate_costs(
          g, jax.tree_util.tree_map(lambda x: x[None], g))
  fn = jax.jit(costs)
  before = [np.asarray(x) for x in fn(empty, graph)]
  assert times.add(graph) == 1
  grown = times.table()
  assert grown.keys.shape == empty.keys.shape
  after = [np.asarray(x) for x in fn(grown, graph)]
  assert len(traces) == 1  # the same compiled function for the grown table
  measured = cost.ModelCost(coeffs, kernels=grown)
  assert float(before[0]) == pytest.approx(float(own(graph)), rel=1e-6)
  assert float(after[0]) == pytest.approx(float(measured(graph)), rel=1e-6)
  assert float(after[0]) != pytest.approx(float(before[0]), rel=1e-3)
  np.testing.assert_allclose(after[1], np.asarray(measured.node_costs(graph)), rtol=1e-6)
  assert float(after[2]) == float(before[2]) == pytest.approx(float(roofline(graph)), rel=1e-6)
  assert float(after[3][0]) == pytest.approx(float(after[0]), rel=1e-6)
  with cost.bound_kernels(grown), cost.bound_kernels(None):
    assert float(own(graph)) == pytest.approx(float(before[0]), rel=1e-6)  # None: its own
