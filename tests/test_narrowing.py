"""Narrowing (`rules/library/narrowing.py`): a search moves a classifier's token slice up through
the last transformer layer, so only the one row is computed, and the result computes the
original; slices a rule must not move (they would change the result or save nothing) are not
matched."""

from __future__ import annotations

import numpy as np
import pytest

from xrlflow_jax import cost, search
from xrlflow_jax import graph as G
from xrlflow_jax.ops import Op
from xrlflow_jax.rules import RuleSet
from xrlflow_jax.rules.library import builtin_rules, narrowing

from tests.test_layout import assert_found_is_sound

TOKENS, WIDTH, HEADS = 32, 128, 4
NARROWING = RuleSet(builtin_rules([narrowing.FAMILY]), max_locations=8)


def _class_token_head(capacity: int = 192) -> tuple[G.Graph, G.ParamStore]:
  """A pre-LN transformer layer on x [1, T, D] (attention with heads, then an erf-GELU MLP),
  a final LN and a classifier that reads token 0 (Slice + Squeeze, as ViT's ONNX Gather is
  imported)."""
  b = G.GraphBuilder(seed=0)
  x = b.input((1, TOKENS, WIDTH))
  h = b.layer_norm(x)
  def heads(t):  # [1, T, D] -> [1, H, T, D/H]
    return b.transpose(b.reshape(t, (1, TOKENS, HEADS, WIDTH // HEADS)), (0, 2, 1, 3))
  q, k, v = (heads(b.matmul(h, b.weight((WIDTH, WIDTH)))) for _ in range(3))
  scores = b.softmax(b.matmul(b.mul(q, b.constant(np.float32(0.5))),
                              b.transpose(k, (0, 1, 3, 2))))
  att = b.reshape(b.transpose(b.matmul(scores, v), (0, 2, 1, 3)), (1, TOKENS, WIDTH))
  x = b.add(x, b.add(b.matmul(att, b.weight((WIDTH, WIDTH))), b.weight((WIDTH,), init="bias")))
  u = b.add(b.matmul(b.layer_norm(x), b.weight((WIDTH, 4 * WIDTH))),
            b.weight((4 * WIDTH,), init="bias"))
  gelu = b.mul(u, b.mul(b.constant(np.float32(0.5)), b.add(
      b.erf(b.div(u, b.constant(np.float32(np.sqrt(2.0))))), b.constant(np.float32(1.0)))))
  x = b.add(x, b.matmul(gelu, b.weight((4 * WIDTH, WIDTH))))
  token = b.squeeze(b.slice(b.layer_norm(x), 1, 0, 1), [1])
  b.output(b.matmul(token, b.weight((WIDTH, 10))))
  return b.build(capacity=capacity)


def _matmul_rows(graph: G.Graph) -> list[int]:
  """Rows (second-to-last dim) of every live MatMul, sorted."""
  g = G.to_host(graph)
  live = np.asarray(G.live_nodes(g))
  rows = [int(g.nodes["shape"][v][-2]) for v in np.flatnonzero(live & (g.nodes["op"] == Op.MATMUL))]
  return sorted(rows)


def test_search_computes_only_the_class_token_of_the_last_layer():
  graph, params = _class_token_head()
  # Before: every projection and the MLP run on all tokens (the scores have T rows per head).
  assert _matmul_rows(graph) == [1] + [TOKENS] * 8
  ex = search.Expander(NARROWING, cost.load_coefficients("cpu"))
  found = search.optimize(graph, params, "taso", expander=ex, budget=200)
  # After: K and V still see every token; the query, scores, attention output, output
  # projection and both MLP MatMuls are one row.
  assert _matmul_rows(found.best_graph) == [1] * 7 + [TOKENS] * 2, G.dump(found.best_graph)
  assert found.best_cost_ms < found.initial_cost_ms
  assert {s.rule for s in found.rewrites} >= {
      "slice_through_layer_norm_3", "slice_through_matmul_rows", "slice_through_softmax",
      "slice_through_transpose", "slice_through_reshape", "slice_through_erf",
      "slice_through_add_both", "slice_through_mul_rhs", "slice_through_div_lhs"}
  assert_found_is_sound(graph, params, found, NARROWING, (1, TOKENS, WIDTH), rtol=1e-5,
                        atol=1e-6)


def test_narrowed_graph_exports_to_onnx_that_onnxruntime_agrees_with():
  ort = pytest.importorskip("onnxruntime")
  import onnx  # pylint: disable=g-import-not-at-top
  from xrlflow_jax import executor, onnx_io  # pylint: disable=g-import-not-at-top
  graph, params = _class_token_head()
  ex = search.Expander(NARROWING, cost.load_coefficients("cpu"))
  found = search.optimize(graph, params, "taso", expander=ex, budget=200)
  model = onnx_io.to_model(found.best_graph, params)
  onnx.checker.check_model(model, full_check=True)
  x = np.random.default_rng(1).standard_normal((1, TOKENS, WIDTH)).astype(np.float32)
  sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
  (got,) = sess.run(None, {sess.get_inputs()[0].name: x})
  np.testing.assert_allclose(got, executor.run(graph, params, x)[0], rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Near misses: slices that must not move.

def _found(build) -> dict[str, int]:
  b = G.GraphBuilder(seed=0)
  b.output(*build(b))
  graph = b.build(64)[0]
  m = NARROWING.jit_match(graph)
  return {r.name: int(m.found[i]) for i, r in enumerate(NARROWING.rules) if int(m.found[i])}


def test_a_slice_along_a_reduced_axis_is_not_moved():
  # Layer norm over the last two axes, sliced along the second: it reduces over that axis.
  assert _found(lambda b: [b.slice(b.layer_norm(b.input((2, 4, 6)), axis=1), 1, 0, 2)]) == {}
  assert _found(lambda b: [b.slice(b.layer_norm(b.input((2, 4, 6)), axis=1), 0, 0, 1)]) == {
      "slice_through_layer_norm_3": 1}
  assert _found(lambda b: [b.slice(b.softmax(b.input((3, 5)), axis=1), 1, 0, 2)]) == {}
  assert _found(lambda b: [b.slice(b.softmax(b.input((3, 5)), axis=1), 0, 0, 2)]) == {
      "slice_through_softmax": 1}


def test_a_whole_axis_slice_is_not_moved():
  assert _found(lambda b: [b.slice(b.erf(b.input((3, 5))), 0, 0, 3)]) == {}
  assert _found(lambda b: [b.slice(b.erf(b.input((3, 5))), 0, 0, 3, 2)]) == {
      "slice_through_erf": 1}  # every other row: it drops one


def test_binary_operands_are_sliced_only_where_they_span_the_axis():
  def add(shape_b, axis):
    return lambda b: [b.slice(b.add(b.input((3, 4)), b.input(shape_b)), axis, 1, 3)]
  assert _found(add((3, 4), 0)) == {"slice_through_add_both": 1}
  assert _found(add((1, 4), 0)) == {"slice_through_add_lhs": 1}
  assert _found(add((4,), 0)) == {"slice_through_add_lhs": 1}
  assert _found(add((4,), 1)) == {"slice_through_add_both": 1}
  assert _found(add((3, 1), 1)) == {"slice_through_add_lhs": 1}
  assert _found(lambda b: [b.slice(b.sub(b.input((1, 4)), b.input((3, 4))), 0, 0, 1)]) == {
      "slice_through_sub_rhs": 1}


def test_matmul_slices_rows_columns_and_only_broadcast_batches():
  def mm(a_shape, b_shape, axis):
    return lambda b: [b.slice(b.matmul(b.input(a_shape), b.weight(b_shape)), axis, 0, 1)]
  assert _found(mm((2, 3, 4), (4, 5), 1)) == {"slice_through_matmul_rows": 1}
  assert _found(mm((2, 3, 4), (4, 5), 2)) == {"slice_through_matmul_columns": 1}
  assert _found(mm((2, 3, 4), (4, 5), 0)) == {"slice_through_matmul_rows": 1}  # b broadcast
  assert _found(mm((2, 3, 4), (2, 4, 5), 0)) == {}  # b has the batch axis too
  assert _found(mm((1, 3, 4), (2, 4, 5), 0)) == {}  # a is the broadcast one


def test_reshape_must_keep_the_sliced_axis_whole():
  def rs(shape, axis):
    return lambda b: [b.slice(b.reshape(b.input((6, 4)), shape), axis, 0, 2)]
  assert _found(rs((6, 2, 2), 0)) == {"slice_through_reshape": 1}
  assert _found(rs((1, 6, 4), 1)) == {"slice_through_reshape": 1}
  assert _found(rs((4, 6), 0)) == {}  # rows of 4 are not rows of 6
  assert _found(rs((3, 8), 0)) == {}  # one new row holds two old ones
  assert _found(rs((6, 2, 2), 1)) == {}  # an axis split out of one


def test_transpose_maps_the_sliced_axis():
  g = lambda b: [b.slice(b.transpose(b.input((2, 3, 4)), (2, 0, 1)), 0, 1, 3)]
  assert _found(g) == {"slice_through_transpose": 1}
