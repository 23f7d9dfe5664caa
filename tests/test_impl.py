"""The implementation choice (`ops.Impl`): a search whose table measures tap-by-tap grouped
convolutions faster lowers every grouped convolution, and only those, that way; the result
computes the original function and exports to the same standard ONNX ops (pools included)."""

from __future__ import annotations

import numpy as np
import pytest

from xrlflow_jax import cost, executor, ops, search
from xrlflow_jax import graph as G
from xrlflow_jax.cost import kernel_table
from xrlflow_jax.ops import Impl, Op
from xrlflow_jax.rules import RuleSet
from xrlflow_jax.rules.library import builtin_rules, impl as impl_rules

from tests.test_kernel_table import _TableProfiler
from tests.test_layout import assert_found_is_sound

CONV = ops.get(Op.CONV2D).attr_offsets()
GROUPS, IMPL = CONV["groups"][0], CONV["impl"][0]
POOL_IMPL = ops.get(Op.MAX_POOL).attr_offsets()["impl"][0]


def _separable_stack(capacity: int = 48, pool_impl: Impl = Impl.XLA
                     ) -> tuple[G.Graph, G.ParamStore]:
  """Depthwise (with and without bias), 4-group and pointwise convolutions, a max and an
  average pool: NASNet-like."""
  b = G.GraphBuilder(seed=0)
  x = b.input((1, 8, 12, 12))
  y = b.conv2d(x, b.weight((8, 1, 3, 3)), padding=1, groups=8)
  pool = dict(kernel=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1), impl=int(pool_impl))
  y = b.add(b.node(Op.MAX_POOL, [y], **pool), b.node(Op.AVG_POOL, [x], **pool))
  y = b.relu(b.conv2d(y, b.weight((16, 8, 1, 1)), b.weight((16,), init="bias")))
  z = b.conv2d(y, b.weight((16, 1, 5, 5)), b.weight((16,), init="bias"), strides=(2, 2),
               padding=2, groups=16, activation="relu")
  z = b.conv2d(z, b.weight((16, 4, 3, 3)), padding=1, groups=4)
  b.output(b.global_avg_pool(z))
  return b.build(capacity=capacity)


def _search(graph, params, tmp_path, taps_ms: float, pool_taps_ms: float = 1.0):
  """Greedy over the impl rules, on a table that measures every kernel 1 ms but tap-by-tap
  convolutions (`taps_ms`) and tap-by-tap pools (`pool_taps_ms`)."""
  rs = RuleSet([r for r in builtin_rules() if r.family == impl_rules.FAMILY], max_locations=8)
  def ms(sig):
    if sig.op == "Conv2D" and int(sig.attrs[IMPL]) == Impl.TAPS:
      return taps_ms
    if sig.op in ("MaxPool", "AvgPool") and int(sig.attrs[POOL_IMPL]) == Impl.TAPS:
      return pool_taps_ms
    return 1.0
  times = kernel_table.KernelTimes(_TableProfiler(tmp_path, ms))
  ex = search.Expander(rs, cost.load_coefficients("cpu"), kernels=times)
  return search.optimize(graph, params, "greedy", expander=ex, max_steps=10), rs


def _live_attrs(graph: G.Graph, op: Op) -> list[np.ndarray]:
  g = G.to_host(graph)
  live = np.asarray(G.live_nodes(g)) & ~g.nodes["is_constant"]
  return [g.nodes["attrs"][v] for v in np.flatnonzero(live & (g.nodes["op"] == op))]


def test_search_lowers_every_grouped_convolution_tap_by_tap(tmp_path):
  graph, params = _separable_stack()
  found, rs = _search(graph, params, tmp_path, taps_ms=0.1)
  convs = _live_attrs(found.best_graph, Op.CONV2D)
  assert len(convs) == 4
  for attrs in convs:  # grouped: taps; the pointwise (ungrouped) one stays with XLA
    assert attrs[IMPL] == (Impl.TAPS if attrs[GROUPS] > 1 else Impl.XLA), attrs
  assert sorted(s.rule for s in found.rewrites) == ["conv_bias_taps", "conv_taps", "conv_taps"]
  assert_found_is_sound(graph, params, found, rs, (1, 8, 12, 12), rtol=1e-5, atol=1e-6)


def test_search_keeps_xla_kernels_when_taps_measure_slower(tmp_path):
  graph, params = _separable_stack()
  found, _ = _search(graph, params, tmp_path, taps_ms=3.0)
  assert not found.rewrites
  assert all(attrs[IMPL] == Impl.XLA for attrs in _live_attrs(found.best_graph, Op.CONV2D))


@pytest.mark.parametrize("pool_taps_ms", [0.2, 3.0])
def test_search_lowers_pools_by_what_the_table_measures(tmp_path, pool_taps_ms):
  """Pools are kernels of the table: where it measures tap-by-tap pools faster the search
  lowers both pools that way (and the result computes the original function); where slower,
  it keeps XLA's reduce-window."""
  graph, params = _separable_stack()
  found, rs = _search(graph, params, tmp_path, taps_ms=3.0, pool_taps_ms=pool_taps_ms)
  want = Impl.TAPS if pool_taps_ms < 1 else Impl.XLA
  for op in (Op.MAX_POOL, Op.AVG_POOL):
    (attrs,) = _live_attrs(found.best_graph, op)
    assert attrs[POOL_IMPL] == want, op
  if want == Impl.TAPS:
    assert sorted(s.rule for s in found.rewrites) == ["avg_pool_taps", "max_pool_taps"]
    assert found.modelled_speedup > 1
    assert_found_is_sound(graph, params, found, rs, (1, 8, 12, 12), rtol=1e-5, atol=1e-6)
  else:
    assert not found.rewrites


def test_taps_graph_exports_the_same_onnx_ops(tmp_path):
  ort = pytest.importorskip("onnxruntime")
  from xrlflow_jax import onnx_io  # pylint: disable=g-import-not-at-top
  import onnx  # pylint: disable=g-import-not-at-top
  graph, params = _separable_stack()
  taps_pools, _ = _separable_stack(pool_impl=Impl.TAPS)  # the same weights (seed)
  found, _ = _search(taps_pools, params, tmp_path, taps_ms=0.1)
  exported, original = (onnx_io.to_model(g, params) for g in (found.best_graph, graph))
  onnx.checker.check_model(exported, full_check=True)
  # Names of made-up tensors and the order of nodes follow slots; the ops and their attributes
  # must be the same.
  ops_of = lambda m: [(n.op_type, sorted((a.name, onnx.helper.get_attribute_value(a))
                                         for a in n.attribute)) for n in m.graph.node]
  assert sorted(ops_of(exported)) == sorted(ops_of(original))
  assert [n.op_type for n in exported.graph.node].count("Conv") == 4
  x = np.random.default_rng(0).standard_normal((1, 8, 12, 12)).astype(np.float32)
  sess = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
  (got,) = sess.run(None, {sess.get_inputs()[0].name: x})
  np.testing.assert_allclose(got, executor.run(graph, params, x)[0], rtol=1e-4, atol=1e-5)
