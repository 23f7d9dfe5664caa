"""Layouts: NHWC convolutions, pools and batch norms compute the NCHW result; rules written
for NCHW never match an NHWC op; a search with a table that measures NHWC faster carries a
conv stack to NHWC with one transpose at each end; NHWC graphs export to valid ONNX."""

from __future__ import annotations

import numpy as np
import pytest

from xrlflow_jax import cost, executor, ops, search
from xrlflow_jax import graph as G
from xrlflow_jax.cost import kernel_table
from xrlflow_jax.errors import ShapeError
from xrlflow_jax.ops import Impl, Layout, Op
from xrlflow_jax.rules import RuleSet
from xrlflow_jax.rules.library import builtin_rules, layout as layout_rules

from tests.test_kernel_table import _TableProfiler

TO_NHWC, TO_NCHW, OIHW_TO_HWIO = (0, 2, 3, 1), (0, 3, 1, 2), (2, 3, 1, 0)
CONV_LAYOUT = ops.get(Op.CONV2D).attr_offsets()["layout"][0]


def _nhwc_twin(b: G.GraphBuilder, op: Op, x_nchw: G.Tensor, weights: list[G.Tensor],
               **attrs) -> tuple[G.Tensor, G.Tensor]:
  """(op in NCHW, the same op in NHWC between transposes) on one input."""
  ref = b.node(op, [x_nchw] + weights, **attrs)
  w = list(weights)
  if op == Op.CONV2D:
    w[0] = b.transpose(w[0], OIHW_TO_HWIO)
  nhwc = b.node(op, [b.transpose(x_nchw, TO_NHWC)] + w, layout=int(Layout.NHWC), **attrs)
  return ref, b.transpose(nhwc, TO_NCHW)


@pytest.mark.parametrize("groups, bias, strides, dilations, pads, act, impl", [
    (1, True, (1, 1), (1, 1), (1, 1, 1, 1), 0, Impl.XLA),
    (2, False, (2, 1), (1, 2), (0, 1, 2, 0), 1, Impl.XLA),
    (4, True, (1, 2), (2, 1), (2, 2, 2, 2), 2, Impl.XLA),
    (2, True, (2, 1), (1, 2), (0, 1, 2, 0), 1, Impl.TAPS),
    (4, False, (1, 2), (2, 1), (2, 2, 2, 2), 2, Impl.TAPS),
])
def test_nhwc_ops_compute_the_nchw_result(groups, bias, strides, dilations, pads, act, impl):
  b = G.GraphBuilder(seed=0)
  x = b.input((2, 8, 9, 7))
  w = [b.weight((12, 8 // groups, 3, 2))] + ([b.weight((12,), init="bias")] if bias else [])
  y, y2 = _nhwc_twin(b, Op.CONV2D, x, w, strides=strides, dilations=dilations, pads=pads,
                     groups=groups, activation=act, impl=int(impl))
  outs = [y, y2]
  pool = dict(kernel=(3, 2), strides=(2, 1), pads=(1, 0, 1, 1), dilations=dilations,
              impl=int(impl))
  outs += _nhwc_twin(b, Op.MAX_POOL, y, [], ceil_mode=True, **pool)
  outs += _nhwc_twin(b, Op.AVG_POOL, y, [], count_include_pad=bool(groups % 2), **pool)
  outs += _nhwc_twin(b, Op.GLOBAL_AVG_POOL, y, [])
  stats = [b.constant(np.random.default_rng(1).uniform(0.5, 1.5, 12).astype(np.float32))
           for _ in range(4)]
  outs += _nhwc_twin(b, Op.BATCH_NORM, y, stats, epsilon=1e-3)
  b.output(*outs)
  graph, params = b.build(capacity=64)
  got = executor.run(graph, params, np.random.default_rng(0).standard_normal((2, 8, 9, 7)))
  for ref, nhwc in zip(got[::2], got[1::2]):
    assert ref.shape == nhwc.shape
    np.testing.assert_allclose(nhwc, ref, rtol=1e-5, atol=1e-5)
  # The NHWC op's own shape is channels last.
  nd = G.to_host(graph).nodes
  convs = np.flatnonzero(nd["alive"] & (nd["op"] == Op.CONV2D))
  (n, c, h, w_), nhwc_shape = (tuple(nd["shape"][v][-4:]) for v in convs)
  assert nhwc_shape == (n, h, w_, c) == (2,) + got[0].shape[2:] + (12,)


@pytest.mark.parametrize("layout", [Layout.NCHW, Layout.NHWC])
@pytest.mark.parametrize("groups, out_channels, kernel_hw, strides, dilations, pads", [
    (6, 6, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),   # depthwise
    (6, 12, (3, 2), (2, 1), (1, 2), (0, 1, 2, 0)),  # depthwise, channel multiplier 2
    (3, 6, (5, 5), (2, 2), (1, 1), (2, 2, 2, 2)),   # two channels per group
    (1, 4, (2, 3), (1, 2), (2, 1), (1, 0, 0, 1)),   # ungrouped
])
def test_taps_kernel_computes_the_xla_convolution(layout, groups, out_channels, kernel_hw,
                                                  strides, dilations, pads):
  """`Impl.TAPS` and `Impl.XLA` lower one Conv2D (bias and activation included) to
  the same function in either layout; an unknown kernel code is a shape error."""
  b = G.GraphBuilder(seed=0)
  x = b.input((2, 6, 9, 8))
  w = b.weight((out_channels, 6 // groups) + kernel_hw)
  bias = b.weight((out_channels,), init="bias")
  if layout == Layout.NHWC:
    x, w = b.transpose(x, TO_NHWC), b.transpose(w, OIHW_TO_HWIO)
  attrs = dict(strides=strides, dilations=dilations, pads=pads, groups=groups, activation=3,
               layout=int(layout))
  ys = [b.node(Op.CONV2D, [x, w, bias], impl=int(k), **attrs) for k in Impl]
  b.output(*ys)
  graph, params = b.build(capacity=32)
  xla, taps = executor.run(graph, params, np.random.default_rng(0).standard_normal((2, 6, 9, 8)))
  assert xla.shape == taps.shape
  np.testing.assert_allclose(taps, xla, rtol=1e-5, atol=1e-5)
  assert np.std(xla) > 0.05  # a non-trivial output
  with pytest.raises(ShapeError, match="impl must be XLA"):
    b.node(Op.CONV2D, [x, w, bias], impl=2, **attrs)


def test_nhwc_shape_errors_name_the_layout():
  b = G.GraphBuilder(seed=0)
  x = b.input((1, 5, 5, 3))
  with pytest.raises(ShapeError, match="input channels must equal"):
    b.node(Op.CONV2D, [x, b.weight((3, 3, 2, 4))], layout=int(Layout.NHWC))  # 2 != 3 in-channels
  with pytest.raises(ShapeError, match="layout must be NCHW or NHWC"):
    b.node(Op.GLOBAL_AVG_POOL, [x], layout=7)


HARNESS = RuleSet(builtin_rules(), max_locations=16)


def _count(rule: str, graph) -> int:
  return int(HARNESS.jit_match(graph).found[HARNESS.index(rule)])


@pytest.mark.parametrize("nhwc", [False, True])
def test_nchw_rules_never_match_nhwc_ops(nhwc):
  """merge_conv_shared_input, fold_batch_norm, conv_relu_fuse and enlarge_conv_kernel read
  OIHW weights and channel axis 1: on the NHWC twin of their pattern they must not fire."""
  b = G.GraphBuilder(seed=0)
  x = b.input((1, 4, 6, 6))
  if nhwc:
    x = b.transpose(x, TO_NHWC)
  def conv(o, k):
    w = b.weight((o, 4, k, k))
    if nhwc:
      w = b.transpose(w, OIHW_TO_HWIO)
    return b.node(Op.CONV2D, [x, w], pads=(k // 2,) * 4, layout=int(nhwc))
  y1, y2 = conv(5, 3), conv(3, 1)
  stats = [b.constant(np.ones(5, np.float32)) for _ in range(4)]
  bn = b.node(Op.BATCH_NORM, [y1] + stats, layout=int(nhwc))
  b.output(bn, b.relu(y2))
  graph, _ = b.build(capacity=64)
  expected = 0 if nhwc else 1
  assert _count("fold_batch_norm", graph) == expected
  assert _count("conv_relu_fuse", graph) == expected
  assert _count("enlarge_conv_kernel", graph) == expected
  b2 = G.GraphBuilder(seed=0)
  x = b2.input((1, 4, 6, 6))
  if nhwc:
    x = b2.transpose(x, TO_NHWC)
  ws = [b2.weight((o, 4, 3, 3)) for o in (5, 6)]
  if nhwc:
    ws = [b2.transpose(w, OIHW_TO_HWIO) for w in ws]
  b2.output(*[b2.node(Op.CONV2D, [x, w], pads=(1,) * 4, layout=int(nhwc)) for w in ws])
  assert _count("merge_conv_shared_input", b2.build(capacity=64)[0]) == expected


def _conv_stack(capacity: int = 64):
  """conv -> relu -> maxpool -> conv(+bias) -> relu, a residual add, concat and global pool."""
  b = G.GraphBuilder(seed=0)
  x = b.input((1, 3, 16, 16))
  y = b.relu(b.conv2d(x, b.weight((8, 3, 3, 3)), padding=1))
  y = b.max_pool(y, (2, 2), (2, 2))
  z = b.relu(b.conv2d(y, b.weight((8, 8, 3, 3)), b.weight((8,), init="bias"), padding=1))
  z = b.add(z, y)
  z = b.concat([z, b.conv2d(z, b.weight((4, 8, 1, 1)))], 1)
  b.output(b.global_avg_pool(z))
  return b.build(capacity=capacity)


def _layout_search(graph, params, tmp_path, method="taso", budget=40):
  names = {r.name for r in layout_rules.rules()} | {"transpose_cancel", "transpose_fuse"}
  rs = RuleSet([r for r in builtin_rules() if r.name in names], max_locations=8)
  # A table that measures every NHWC convolution at half its NCHW time.
  def ms(sig):
    nhwc = sig.op == "Conv2D" and int(sig.attrs[CONV_LAYOUT]) == Layout.NHWC
    return 0.5 if nhwc else 1.0
  times = kernel_table.KernelTimes(_TableProfiler(tmp_path, ms))
  ex = search.Expander(rs, cost.load_coefficients("cpu"), kernels=times)
  found = search.optimize(graph, params, method, expander=ex,
                          **({"max_steps": budget} if method == "greedy" else {"budget": budget}))
  return found, rs


def test_search_carries_a_conv_stack_to_nhwc(tmp_path):
  graph, params = _conv_stack()
  found, rs = _layout_search(graph, params, tmp_path)
  nd = G.to_host(found.best_graph).nodes
  live = np.asarray(G.live_nodes(G.to_host(found.best_graph))) & ~nd["is_constant"]
  convs = np.flatnonzero(live & (nd["op"] == Op.CONV2D))
  attrs = nd["attrs"]
  assert len(convs) == 3 and all(attrs[v][CONV_LAYOUT] == Layout.NHWC for v in convs)
  # One transpose into NHWC at the input, one back before the output, and at most one pair
  # that cancels (XLA folds transpose(transpose(x)) itself: the model sees no gain in it).
  assert int(np.sum(live & (nd["op"] == Op.TRANSPOSE))) <= 4, [s.rule for s in found.rewrites]
  assert any(s.rule == "transpose_cancel" for s in found.rewrites)
  assert found.modelled_speedup > 1.5
  assert_found_is_sound(graph, params, found, rs, (1, 3, 16, 16), rtol=1e-4, atol=1e-5)


def assert_found_is_sound(graph, params, found, rs, input_shape: tuple[int, ...], *,
                          rtol: float, atol: float) -> None:
  """The search's best graph computes the original's output (on one random input of the
  graph's single input) and its rewrites replay to it."""
  x = np.random.default_rng(0).standard_normal(input_shape).astype(np.float32)
  np.testing.assert_allclose(executor.run(found.best_graph, params, x)[0],
                             executor.run(graph, params, x)[0], rtol=rtol, atol=atol)
  replayed = search.replay(graph, rs, found.rewrites)
  assert G.structural_hash(replayed) == G.structural_hash(found.best_graph)


def test_nhwc_graph_exports_to_valid_onnx(tmp_path):
  ort = pytest.importorskip("onnxruntime")
  from xrlflow_jax import onnx_io  # pylint: disable=g-import-not-at-top
  import onnx  # pylint: disable=g-import-not-at-top
  graph, params = _conv_stack()
  found, _ = _layout_search(graph, params, tmp_path, budget=12)
  assert any(s.rule.startswith("conv_") for s in found.rewrites)
  model = onnx_io.to_model(found.best_graph, params)
  onnx.checker.check_model(model, full_check=True)
  x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
  sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
  (got,) = sess.run(None, {sess.get_inputs()[0].name: x})
  np.testing.assert_allclose(got, executor.run(graph, params, x)[0], rtol=1e-4, atol=1e-5)
  # Written as the NCHW ops between tagged transposes, the NHWC nodes are read back as NHWC
  # nodes: the file re-imports to the graph found (`onnx_io.restore`).
  trip = onnx_io.round_trip(found.best_graph, params)
  assert trip.exact, trip.describe()
  (back,) = executor.run(trip.graph, trip.params, x)
  np.testing.assert_allclose(back, got, rtol=1e-4, atol=1e-5)
  assert onnx_io.round_trip(graph, params).exact  # the NCHW input re-imports to itself


# ---------------------------------------------------------------------------------------------
# MatMuls computed transposed (weight on the left).

def _linear_chain(capacity: int = 64, bias: bool = True):
  """x [8, 16] -> linear 16->32 (gelu) -> linear 32->24 -> output; biases as separate adds."""
  b = G.GraphBuilder(seed=0)
  x = b.input((8, 16))
  h = b.matmul(x, b.weight((16, 32)))
  if bias:
    h = b.add(h, b.weight((32,), init="bias"))
  h = b.gelu(h)
  y = b.matmul(h, b.weight((32, 24)))
  if bias:
    y = b.add(y, b.weight((24,), init="bias"))
  b.output(y)
  return b.build(capacity=capacity)


def test_a_transposed_matmul_is_compiled_as_written():
  """XLA folds transpose(dot(a, b)) back into dot(b, a); the executor's barrier keeps the dot
  the graph wrote (its output [N, M]), and the result is unchanged."""
  graph, params = _linear_chain(bias=False)
  rs = RuleSet([r for r in builtin_rules() if r.name == "matmul_transposed"], max_locations=8)
  m = rs.jit_match(graph)
  assert int(m.found[0]) == 2
  new, ok = rs.apply(graph, 0, m.nodes[0, int(np.flatnonzero(np.asarray(m.mask[0]))[-1])])
  assert bool(ok)
  x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
  np.testing.assert_allclose(executor.run(new, params, x)[0], executor.run(graph, params, x)[0],
                             rtol=1e-5, atol=1e-5)
  lowered = executor.lower(new, params)
  hlo = lowered.compiled.lower(lowered.consts, x).compile().as_text()
  dots = [line for line in hlo.splitlines() if " dot(" in line]
  assert any("f32[24,8]" in line.split("=")[1] for line in dots), dots  # [N, M], as written


@pytest.mark.parametrize("bias", [True, False])
def test_search_runs_a_linear_chain_transposed(tmp_path, bias):
  """With a table that measures weight-on-the-left MatMuls at half the time, the search runs
  both MatMuls of a linear chain transposed, and the result computes the original."""
  graph, params = _linear_chain(bias=bias)
  names = {r.name for r in layout_rules.rules()} | {"transpose_cancel", "transpose_fuse"}
  rs = RuleSet([r for r in builtin_rules() if r.name in names], max_locations=8)
  def ms(sig):  # weight left: [N, K] @ [K, M] with N > M here
    return 0.5 if sig.op == "MatMul" and sig.in_shapes[0][0] > sig.in_shapes[1][1] else 1.0
  times = kernel_table.KernelTimes(_TableProfiler(tmp_path, ms))
  ex = search.Expander(rs, cost.load_coefficients("cpu"), kernels=times)
  found = search.optimize(graph, params, "taso", expander=ex, budget=100)
  nd = G.to_host(found.best_graph).nodes
  live = np.asarray(G.live_nodes(G.to_host(found.best_graph))) & ~nd["is_constant"]
  mms = np.flatnonzero(live & (nd["op"] == Op.MATMUL))
  assert len(mms) == 2
  for v in mms:  # the weight is the left operand: [N, K] @ [K, M=8]
    assert int(nd["shape"][v][ops.MAX_RANK - 1]) == 8, [s.rule for s in found.rewrites]
  # The input's transpose, the output's, and at most one pair that XLA fuses into one loop
  # (transpose(gelu(transpose(z))): the model sees no gain in moving it through the GELU).
  assert int(np.sum(live & (nd["op"] == Op.TRANSPOSE))) <= 4, [s.rule for s in found.rewrites]
  assert found.modelled_speedup > 1.2
  assert_found_is_sound(graph, params, found, rs, (8, 16), rtol=1e-4, atol=1e-5)


def test_transposed_matmul_rules_near_misses():
  """The bias must be a vector (a [1, N] row is left alone), the MatMul rank 2, and the
  transpose a MatMul moves past must swap its operand's axes."""
  b = G.GraphBuilder(seed=0)
  x = b.input((4, 6))
  row_bias = b.add(b.matmul(x, b.weight((6, 5))), b.weight((1, 5), init="bias"))
  batched = b.matmul(b.input((2, 4, 6)), b.weight((2, 6, 3)))
  b.output(row_bias, batched)
  graph, _ = b.build(capacity=64)
  assert _count("matmul_transposed_bias", graph) == 0
  assert _count("matmul_transposed", graph) == 1  # the rank-2 one only
  b2 = G.GraphBuilder(seed=0)
  t = b2.transpose(b2.input((6, 4)), (1, 0))
  b2.output(b2.add(b2.matmul(t, b2.weight((6, 3))), b2.weight((3,), init="bias")))
  assert _count("matmul_through_transpose_bias", b2.build(capacity=64)[0]) == 1
  b3 = G.GraphBuilder(seed=0)
  t3 = b3.transpose(b3.input((4, 6, 2)), (0, 2, 1))
  b3.output(b3.matmul(t3, b3.weight((4, 6, 3))))
  assert _count("matmul_through_transpose", b3.build(capacity=64)[0]) == 0


def test_transposed_matmul_graph_exports_to_valid_onnx(tmp_path):
  """A linear chain run transposed exports to ONNX (the transposed weights folded into
  initializers) and onnxruntime computes the original's output."""
  ort = pytest.importorskip("onnxruntime")
  from xrlflow_jax import onnx_io  # pylint: disable=g-import-not-at-top
  import onnx  # pylint: disable=g-import-not-at-top
  graph, params = _linear_chain()
  rs = RuleSet([r for r in builtin_rules() if r.name == "matmul_transposed_bias"], max_locations=8)
  m = rs.jit_match(graph)
  new, ok = rs.apply(graph, 0, m.nodes[0, int(np.flatnonzero(np.asarray(m.mask[0]))[0])])
  assert bool(ok)
  model = onnx_io.to_model(new, params)
  onnx.checker.check_model(model, full_check=True)
  assert {n.op_type for n in model.graph.node} >= {"MatMul", "Transpose"}
  x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
  sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
  (got,) = sess.run(None, {sess.get_inputs()[0].name: x})
  np.testing.assert_allclose(got, executor.run(graph, params, x)[0], rtol=1e-4, atol=1e-5)
