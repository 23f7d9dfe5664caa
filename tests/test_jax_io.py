"""JAX functions in and out: Flax models traced to padded graphs and back, and `optimize_jax`."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xrlflow_jax
from xrlflow_jax import graph as G
from xrlflow_jax import jax_io
from xrlflow_jax.ops import Layout, Op


class _CNN(nn.Module):
  """Conv (NHWC, as Flax writes it), ReLU, max and average pools, a dense head."""

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(8, (3, 3))(x))
    x = nn.max_pool(x, (2, 2), (2, 2))
    x = nn.avg_pool(x, (2, 2), (2, 2))
    x = x.reshape((x.shape[0], -1))
    return nn.Dense(10)(x)


class _Block(nn.Module):
  """A pre-norm transformer block: layer norms, two-head self-attention, a GELU MLP."""

  @nn.compact
  def __call__(self, x):
    h = nn.SelfAttention(num_heads=2, qkv_features=16)(nn.LayerNorm()(x))
    x = x + h
    h = nn.Dense(16)(nn.gelu(nn.Dense(32)(nn.LayerNorm()(x))))
    return x + h


def _random(shape, seed=0):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


@pytest.mark.parametrize("module, shape", [(_CNN(), (2, 8, 8, 3)), (_Block(), (2, 4, 16))])
def test_a_flax_model_traces_to_a_graph_that_computes_it(module, shape):
  x = _random(shape)
  variables = module.init(jax.random.PRNGKey(0), x)
  fn = functools.partial(module.apply, variables)
  graph, params, signature = jax_io.trace(fn, x, name=type(module).__name__)
  G.validate(graph, params)
  ops = G.op_histogram(graph)
  assert ops["Input"] == 1 and ops["MatMul"] >= 1  # the weights are constants, not inputs
  if isinstance(module, _CNN):
    nd = G.to_arrays(graph)
    conv = np.flatnonzero(nd["alive"] & (nd["op"] == Op.CONV2D))
    layout_at = __import__("xrlflow_jax").ops.get(Op.CONV2D).attr_offsets()["layout"][0]
    assert [int(nd["attrs"][v][layout_at]) for v in conv] == [Layout.NHWC]
    assert ops["Relu"] == 1 and ops["MaxPool"] == 1 and ops["AvgPool"] == 1
  else:
    assert ops["MatMul"] == 8 and ops["Exp"] == 1  # q, k, v, scores, mix, out, two MLP
  back = jax_io.as_function(graph, params, signature)
  want = fn(x)
  np.testing.assert_allclose(back(x), want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(jax.jit(back)(_random(shape, 1)), fn(_random(shape, 1)),
                             rtol=1e-5, atol=1e-5)


def test_pytrees_in_and_out_and_arguments_kept_as_inputs():
  """Every argument leaf is a graph input (in tree order), the result's pytree comes back, and
  an argument of another shape is refused by name."""
  w = _random((4, 3), 2)

  def fn(batch, scale):
    y = batch["x"] @ w * scale
    return {"y": y, "sum": jnp.sum(y, axis=1)}, jnp.maximum(batch["z"], 0.0)

  args = ({"x": _random((5, 4)), "z": _random((5, 2), 3)}, _random((5, 3), 4))
  graph, params, signature = jax_io.trace(fn, *args)
  assert G.op_histogram(graph)["Input"] == 3
  back = jax_io.as_function(graph, params, signature)
  got, want = back(*args), fn(*args)
  assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  with pytest.raises(jax_io.JaxImportError, match=r"argument leaf 0 has shape \[6, 4\]"):
    back({"x": _random((6, 4)), "z": args[0]["z"]}, args[1])


def test_a_primitive_without_a_graph_op_is_refused_by_name_and_line():
  def fn(x):
    return jnp.sort(x, axis=-1) + 1.0

  with pytest.raises(jax_io.JaxImportError, match=r"^sorter: sort\(float32\[3, 5\]\).*: this "
                     r"primitive has no graph op$"):
    jax_io.trace(fn, _random((3, 5)), name="sorter")


def test_optimize_jax_returns_a_function_of_the_optimised_graph():
  """Two MatMuls of one input (a fused QKV-like projection) are merged by the search; the
  function returned computes what the original does, with the same signature."""
  w1, w2 = _random((64, 32), 5), _random((64, 32), 6)

  def two_heads(x):
    return jnp.tanh(x @ w1), jax.nn.sigmoid(x @ w2)

  x = _random((16, 64))
  fast, report = xrlflow_jax.optimize_jax(
      two_heads, x, rules=["merge_matmul_shared_input_2"], measure=False, kernel_table=False,
      log=lambda _: None)
  assert report.kind == "jax" and report.label == "two_heads"
  assert [r["rule"] for r in report.rewrites] == ["merge_matmul_shared_input_2"]
  assert G.op_histogram(report.graph)["MatMul"] == 1 and report.numerics.passed
  for a, b in zip(jax.jit(fast)(x), two_heads(x)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert not report.files  # a function writes nothing unless given an output folder
