"""Tests of the padded graph: builder, validation, structural hash, jittable transforms, errors."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xrlflow_jax import errors, executor, ops
from xrlflow_jax import graph as G
from xrlflow_jax.graph import layout
from xrlflow_jax.ops import Op


def _mlp(seed: int = 0, capacity: int = 32, dead_branch: bool = False):
  """x[4, 8] -> dense 16 relu -> dense 8 -> softmax; optionally a dead side branch."""
  b = G.GraphBuilder(seed=seed)
  x = b.input((4, 8), name="x")
  h = b.dense(x, 16, activation="relu")
  y = b.softmax(b.dense(h, 8))
  if dead_branch:  # added last so weights keep their param ids
    b.tanh(b.matmul(h, b.weight((16, 3))))
  b.output(y)
  return b.build(capacity=capacity)


def _outputs(graph, params, seed=0):
  lowered = executor.lower(graph, params)
  return [np.asarray(o) for o in lowered(*lowered.random_inputs(seed))]


def test_layout_matches_design():
  g, _ = _mlp(capacity=32)
  n, k = 32, G.DEFAULT_MAX_INPUTS
  assert G.capacity(g) == n and G.max_inputs(g) == k
  assert g.senders.shape == (n * k,) and g.receivers.shape == (n * k,)
  np.testing.assert_array_equal(g.receivers, np.repeat(np.arange(n), k))
  table = np.asarray(G.input_table(g))
  senders = np.asarray(g.senders).reshape(n, k)
  valid = np.asarray(g.edges["valid"]).reshape(n, k)
  # Edge n*K + k is input k of node n; unused edge slots point one past the last node.
  np.testing.assert_array_equal(np.where(valid, senders, -1), table)
  assert (senders[~valid] == n).all()
  for f in G.NODE_FIELDS:
    assert g.nodes[f].shape[0] == n, f
  assert g.nodes["shape"].shape == (n, ops.MAX_RANK)
  assert g.nodes["attrs"].shape == (n, ops.ATTR_WIDTH)


def test_validate_accepts_built_graph_and_dump_is_readable():
  g, p = _mlp()
  G.validate(g, p)
  text = G.dump(g)
  assert "MatMul(" in text and "Softmax(" in text and "output 0" in text
  assert G.op_histogram(g)["MatMul"] == 2


def test_capacity_overflow_names_slots_needed():
  b = G.GraphBuilder(name="toy")
  x = b.input((2, 2))
  for _ in range(5):
    x = b.relu(x)
  b.output(x)
  with pytest.raises(errors.CapacityError, match="needs 6 node slots.*capacity >= 6"):
    b.build(capacity=4)


def test_too_many_inputs_for_slots_is_capacity_error():
  b = G.GraphBuilder(max_inputs=2)
  xs = [b.input((1, 2)) for _ in range(3)]
  with pytest.raises(errors.CapacityError, match="3 inputs exceed the 2 input slots"):
    b.node(Op.CONCAT, xs, axis=0)
  # The helper splits a wide concat into a chain instead.
  y = b.concat(xs, axis=0)
  assert y.shape == (3, 2)


def test_unknown_op_and_attribute():
  b = G.GraphBuilder()
  x = b.input((2, 2))
  with pytest.raises(errors.UnknownOpError, match="unknown op 'Frobnicate'"):
    b.node("Frobnicate", [x])
  with pytest.raises(errors.UnknownOpError):
    ops.get(999)
  with pytest.raises(errors.ShapeError, match="no attribute"):
    b.node(Op.RELU, [x], alpha=3)


def test_inconsistent_shapes_at_build_time_name_node_op_and_shapes():
  b = G.GraphBuilder(name="bad")
  a = b.input((2, 3))
  w = b.weight((4, 5))
  with pytest.raises(errors.ShapeError, match=r"MatMul.*\[2, 3\], \[4, 5\].*contracted"):
    b.matmul(a, w, name="proj")
  with pytest.raises(errors.ShapeError, match="do not broadcast"):
    b.add(a, b.weight((4,)))
  with pytest.raises(errors.ShapeError, match="different dtypes"):
    b.add(a, b.input((2, 3), dtype="int32"))


def test_cycle_is_detected():
  g, _ = _mlp()
  arrays = G.to_arrays(g)
  # Make the first MatMul read the final Softmax: a cycle.
  mm = int(np.flatnonzero(arrays["op"] == Op.MATMUL)[0])
  sm = int(np.flatnonzero(arrays["op"] == Op.SOFTMAX)[0])
  arrays["inputs"][mm, 0] = sm
  bad = layout.from_arrays(arrays)
  with pytest.raises(errors.CycleError, match="cycle"):
    G.topological_order(bad)
  with pytest.raises(errors.CycleError):
    G.validate(bad)


def test_dangling_input_is_detected():
  g, _ = _mlp()
  arrays = G.to_arrays(g)
  relu = int(np.flatnonzero(arrays["op"] == Op.RELU)[0])
  arrays["inputs"][relu, 0] = 30  # a free slot
  with pytest.raises(errors.DanglingInputError, match=r"node \d+ \(Relu\) reads slot 30"):
    G.validate(layout.from_arrays(arrays))


def test_validate_reports_wrong_stored_shape_and_missing_output():
  g, p = _mlp()
  arrays = G.to_arrays(g)
  relu = int(np.flatnonzero(arrays["op"] == Op.RELU)[0])
  arrays["shape"][relu, -1] = 17
  with pytest.raises(errors.GraphValidationError, match="stored shape.*shape rule gives"):
    G.validate(layout.from_arrays(arrays))
  arrays = G.to_arrays(g)
  arrays["is_output"][:] = False
  arrays["output_index"][:] = -1
  with pytest.raises(errors.GraphValidationError, match="no alive output"):
    G.validate(layout.from_arrays(arrays))


def test_validate_checks_params():
  g, p = _mlp()
  bad = G.ParamStore({k: p[k] for k in list(p)[1:]})
  with pytest.raises(errors.GraphValidationError, match="not in the parameter store"):
    G.validate(g, bad)
  wrong = G.ParamStore({k: (p[k] if k else np.zeros((1, 1), np.float32)) for k in p})
  with pytest.raises(errors.GraphValidationError, match="has shape"):
    G.validate(g, wrong)


def test_structural_hash_ignores_placement_but_sees_real_changes():
  g, p = _mlp(seed=0)
  g2, _ = _mlp(seed=1)  # same structure, different weight values: same structure hash
  h = G.structural_hash(g)
  assert G.structural_hash(g2) == h
  rng = np.random.default_rng(0)
  for _ in range(3):
    perm = rng.permutation(G.capacity(g))
    assert G.structural_hash(G.permute_slots(g, perm)) == h
  assert G.structural_hash(G.compact(G.permute_slots(g, perm))[0]) == h

  # A changed attribute, a swapped input order of a non-commutative op, and a changed shape.
  arrays = G.to_arrays(g)
  sm = int(np.flatnonzero(arrays["op"] == Op.SOFTMAX)[0])
  arrays["op"][sm] = Op.SIGMOID
  assert G.structural_hash(layout.from_arrays(arrays)) != h

  b = G.GraphBuilder()
  x, y = b.input((3,)), b.input((3,))
  b.output(b.sub(x, y))
  b2 = G.GraphBuilder()
  x, y = b2.input((3,)), b2.input((3,))
  b2.output(b2.sub(y, x))
  assert G.structural_hash(b.build(8)[0]) != G.structural_hash(b2.build(8)[0])


def test_permuted_graph_validates_and_computes_the_same():
  g, p = _mlp()
  perm = np.random.default_rng(1).permutation(G.capacity(g))
  gp = G.permute_slots(g, perm)
  G.validate(gp, p)
  for a, b in zip(_outputs(g, p), _outputs(gp, p)):
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_consumer_counts_match_host_count_under_jit_and_vmap():
  g, _ = _mlp(dead_branch=True)
  table = np.asarray(G.input_table(g))
  alive = np.asarray(g.nodes["alive"])
  expect = np.zeros(G.capacity(g), np.int32)
  for v in np.flatnonzero(alive):
    for u in table[v]:
      if u >= 0:
        expect[u] += 1
  np.testing.assert_array_equal(jax.jit(G.consumer_counts)(g), expect)
  batch = jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), g)
  np.testing.assert_array_equal(jax.vmap(G.consumer_counts)(batch), np.stack([expect, expect]))


def test_allocate_slots():
  g, _ = _mlp(capacity=16)
  used = int(np.asarray(g.nodes["alive"]).sum())
  slots, ok = jax.jit(G.allocate_slots, static_argnums=1)(g, 3)
  np.testing.assert_array_equal(slots, np.arange(used, used + 3))
  assert bool(ok)
  slots, ok = G.allocate_slots(g, 16 - used + 1)
  assert not bool(ok) and int(slots[-1]) == 16


def test_remove_dead_code_frees_unreachable_nodes_and_keeps_outputs():
  g, p = _mlp(dead_branch=True)
  clean, _ = _mlp(dead_branch=False)
  before = G.num_nodes(g)
  pruned = jax.jit(G.remove_dead_code)(g)
  G.validate(pruned, p)
  assert G.num_nodes(pruned) == before - 3  # weight, matmul, tanh
  assert G.structural_hash(pruned) == G.structural_hash(clean)
  for a, b in zip(_outputs(g, p), _outputs(pruned, p)):
    np.testing.assert_allclose(a, b, rtol=1e-6)
  # Graph inputs survive even when nothing reads them.
  b = G.GraphBuilder()
  unused = b.input((2,))
  x = b.input((2,))
  b.output(b.relu(x))
  del unused
  g2, _ = b.build(8)
  assert G.num_nodes(G.remove_dead_code(g2)) == 3


def test_compact_moves_alive_nodes_first_and_preserves_semantics():
  g, p = _mlp(dead_branch=True)
  g = G.remove_dead_code(g)  # leaves holes in the middle
  compacted, new_to_old = jax.jit(G.compact)(g)
  alive = np.asarray(compacted.nodes["alive"])
  k = int(alive.sum())
  assert alive[:k].all() and not alive[k:].any()
  np.testing.assert_array_equal(np.sort(np.asarray(new_to_old)), np.arange(G.capacity(g)))
  G.validate(compacted, p)
  assert G.structural_hash(compacted) == G.structural_hash(g)
  for a, b in zip(_outputs(g, p), _outputs(compacted, p)):
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_stable_sort_by_key_equals_a_stable_argsort():
  """The packed one-operand sort gives argsort's order (ties by position) and the sorted keys,
  batched, with few or many distinct keys, and through its argsort fallback when key * N could
  leave int32."""
  from xrlflow_jax.graph import transforms  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  for n, num_keys in ((1, 1), (7, 2), (64, 3), (1024, 1025), (300, 10_000_000)):
    keys = rng.integers(0, num_keys, size=(4, n)).astype(np.int32)
    keys[0] = num_keys - 1  # all equal: the order is the positions
    order, sorted_keys = jax.jit(jax.vmap(lambda k, m=num_keys: transforms.stable_sort_by_key(k, m)))(
        keys)
    want = np.argsort(keys, axis=-1, kind="stable")
    np.testing.assert_array_equal(order, want)
    np.testing.assert_array_equal(sorted_keys, np.take_along_axis(keys, want, -1))
    assert order.dtype == sorted_keys.dtype == jnp.int32


def test_transforms_do_not_retrace_across_graphs_of_one_capacity():
  @jax.jit
  @chex.assert_max_traces(n=1)
  def step(graph):
    graph = G.remove_dead_code(graph)
    graph, _ = G.compact(graph)
    return G.consumer_counts(graph), G.allocate_slots(graph, 2)

  chex.clear_trace_counter()
  for seed, dead in ((0, False), (1, True), (2, True)):
    g, _ = _mlp(seed=seed, dead_branch=dead)
    step(g)
  b = G.GraphBuilder()
  x = b.input((5, 5, 5))
  b.output(b.transpose(b.relu(x), (2, 0, 1)))
  step(b.build(32)[0])  # a different model, same capacity: still one trace


def test_executor_folds_constant_subgraphs():
  b = G.GraphBuilder()
  x = b.input((2, 4))
  w1, w2 = b.weight((4, 3)), b.weight((4, 5))
  w = b.concat([w1, w2], axis=1)  # a merged weight, as a rewrite would create
  b.output(b.matmul(x, w))
  g, p = b.build(16)
  lowered = executor.lower(g, p)
  assert len(lowered.consts) == 1 and lowered.consts[0].shape == (4, 8)
  (xv,) = lowered.random_inputs()
  jaxpr = str(jax.make_jaxpr(lowered.apply)(lowered.consts, xv))
  assert "concatenate" not in jaxpr and "dot_general" in jaxpr
  expect = xv @ np.concatenate([p[0], p[1]], axis=1)
  np.testing.assert_allclose(lowered(xv)[0], expect, rtol=1e-5, atol=1e-6)


def test_executor_shares_identical_folded_constants():
  # An unrolled RNN after a merge rewrite: every step concatenates the same shared weights.
  # One folded copy must serve all steps (a copy per step multiplies the memory read per call).
  b = G.GraphBuilder()
  h = b.input((1, 4))
  w1, w2, w3 = b.weight((4, 4)), b.weight((4, 4)), b.weight((4, 4))
  for _ in range(3):
    both = b.matmul(h, b.concat([w1, w2], axis=1))
    h = b.tanh(b.add(b.slice(both, 1, 0, 4), b.slice(both, 1, 4, 8)))
  other = b.matmul(h, b.concat([w1, w3], axis=1))  # different inputs: its own constant
  swapped = b.matmul(h, b.concat([w2, w1], axis=1))  # different order: its own constant
  b.output(h, other, swapped)
  g, p = b.build(64)
  lowered = executor.lower(g, p)
  assert sorted(c.shape for c in lowered.consts) == [(4, 8)] * 3
  (hv,) = lowered.random_inputs()
  ref = hv
  for _ in range(3):
    both = ref @ np.concatenate([p[0], p[1]], axis=1)
    ref = np.tanh(both[:, :4] + both[:, 4:])
  outs = lowered(hv)
  np.testing.assert_allclose(outs[0], ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(outs[1], ref @ np.concatenate([p[0], p[2]], axis=1), rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(outs[2], ref @ np.concatenate([p[1], p[0]], axis=1), rtol=1e-5,
                             atol=1e-6)


def test_executor_input_errors():
  g, p = _mlp()
  lowered = executor.lower(g, p, input_names=["x"])
  with pytest.raises(errors.ShapeError, match="takes 1 inputs"):
    lowered()
  with pytest.raises(errors.ShapeError, match=r"input x has shape \[3, 8\].*\[4, 8\]"):
    lowered(np.zeros((3, 8), np.float32))


def test_executor_outputs_in_order_and_index_inputs_in_range():
  b = G.GraphBuilder()
  ids = b.input((6,), dtype="int32")
  table = b.weight((11, 4))
  emb = b.gather(table, ids)
  b.output(b.relu(emb), emb)
  g, p = b.build(16)
  lowered = executor.lower(g, p)
  (idv,) = lowered.random_inputs()
  assert idv.min() >= 0 and idv.max() < 11
  relu, raw = lowered(idv)
  np.testing.assert_allclose(raw, p[0][idv], rtol=1e-6)
  np.testing.assert_allclose(relu, np.maximum(p[0][idv], 0), rtol=1e-6)


def test_executor_int64_inputs_run_as_int32_without_warning_and_refuse_overflow():
  import warnings  # pylint: disable=g-import-not-at-top
  b = G.GraphBuilder()
  ids = b.input((3,), dtype="int64", name="ids")
  b.output(b.gather(b.weight((5, 2)), ids))
  g, p = b.build(8)
  lowered = executor.lower(g, p, input_names=["ids"])
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # JAX's "int64 ... truncated to int32" would fail here
    (out,) = lowered(np.asarray([4, 0, 2], np.int64))
  np.testing.assert_allclose(out, p[0][[4, 0, 2]], rtol=1e-6)
  with pytest.raises(errors.ShapeError, match=r"input ids is int64 with values outside int32"):
    lowered(np.asarray([2**40, 0, 1], np.int64))


def test_executor_float64_inputs_run_as_float32_and_refuse_values_beyond_its_range():
  if jax.config.jax_enable_x64:
    pytest.skip("x64 is enabled: float64 runs as float64")
  b = G.GraphBuilder()
  x = b.input((3,), dtype="float64", name="x")
  b.output(b.relu(x))
  g, p = b.build(8)
  lowered = executor.lower(g, p, input_names=["x"])
  (out,) = lowered(np.asarray([1.5, -2.0, np.inf], np.float64))  # inf is a value float32 has
  np.testing.assert_array_equal(out, [1.5, 0.0, np.inf])
  with pytest.raises(errors.ShapeError, match=r"input x is float64 with finite values beyond "
                     r"float32's range \(largest magnitude 1e\+300\)"):
    lowered(np.asarray([1.0, -1e300, 0.0], np.float64))
