"""Converters of the normalisations: BatchNormalization (inference), LayerNormalization (with
its optional statistics), InstanceNormalization and GroupNormalization (as LayerNorm over the
right dims, then the per-channel affine map), LRN (an average pool over channels), Softmax and
LogSoftmax (flattened from `axis` on before opset 13)."""

from __future__ import annotations

import numpy as np

from xrlflow_jax import ops
from xrlflow_jax.graph.builder import axes_bits
from xrlflow_jax.onnx_io.convert.common import Ctx, Operand, check_float, converter
from xrlflow_jax.ops import Op


@converter("BatchNormalization")
def _batch_norm(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["epsilon", "momentum", "spatial", "training_mode", "is_test"])
  if ctx.int_attr("training_mode", 0):
    raise ctx.unsupported("training_mode=1 is not supported (inference only)")
  if ctx.int_attr("spatial", 1) != 1:
    raise ctx.unsupported("spatial=0 is not supported")
  if any(ctx.needed[1:]):
    raise ctx.unsupported("the running mean/var outputs are not supported (inference only)")
  xs = [ctx.inp(i, what) for i, what in enumerate(("X", "scale", "B", "input_mean",
                                                   "input_var"))]
  check_float(ctx, xs[0])
  ctx.same_dtype(xs)
  y = ctx.op(Op.BATCH_NORM, xs, epsilon=ctx.float_attr("epsilon", 1e-5))
  return [y] + [None] * (len(ctx.needed) - 1)


@converter("LayerNormalization")
def _layer_norm(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["axis", "epsilon", "stash_type"])
  if ctx.int_attr("stash_type", 1) != 1:
    raise ctx.unsupported("stash_type other than 1 (float32 statistics) is not supported")
  x, scale = ctx.inp(0, "X"), ctx.inp(1, "Scale")
  check_float(ctx, x)
  inputs = [x, scale] + ([ctx.inp(2)] if ctx.has(2) else [])
  ctx.same_dtype(inputs)
  rank = len(ctx.shape(x))
  axis = ctx.axis(ctx.int_attr("axis", -1), rank)
  eps = ctx.float_attr("epsilon", 1e-5)
  y = ctx.op(Op.LAYER_NORM, inputs, axis=axis, epsilon=eps)
  outs: list[Operand | None] = [y, None, None][:len(ctx.needed)]
  if any(ctx.needed[1:]):  # the optional statistics, over the normalised dims (kept as 1s)
    axes = axes_bits(range(axis, rank))
    mean = ctx.op(Op.REDUCE_MEAN, [x], axes=axes, keepdims=True)
    d = ctx.op(Op.SUB, [x, mean])
    var = ctx.op(Op.REDUCE_MEAN, [ctx.op(Op.MUL, [d, d])], axes=axes, keepdims=True)
    std = ctx.op(Op.SQRT, [ctx.op(Op.ADD, [var, ctx.scalar(eps, x, "eps")])])
    inv = ctx.op(Op.RECIPROCAL, [std])
    outs[1:] = [mean, inv][:len(ctx.needed) - 1]
  return outs


@converter("InstanceNormalization")
def _instance_norm(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["epsilon"])
  x, scale, bias = ctx.inp(0, "input"), ctx.inp(1, "scale"), ctx.inp(2, "B")
  check_float(ctx, x)
  ctx.same_dtype([x, scale, bias])
  xs = ctx.shape(x)
  if len(xs) < 3:
    raise ctx.error(f"input must have rank >= 3, got {list(xs)}")
  c = xs[1]
  for what, p in (("scale", scale), ("B", bias)):
    if ctx.shape(p) != (c,):
      raise ctx.error(f"{what} has dims {list(ctx.shape(p))}, expected [{c}]")
  # Normalise over the spatial dims per (n, c), then the per-channel affine map.
  one = ctx.const_value(np.ones([1], ctx.dtype(x)), "one")
  y = ctx.op(Op.LAYER_NORM, [x, one], axis=2, epsilon=ctx.float_attr("epsilon", 1e-5))
  per_channel = (c,) + (1,) * (len(xs) - 2)
  y = ctx.op(Op.MUL, [y, ctx.reshape(scale, per_channel)])
  return [ctx.op(Op.ADD, [y, ctx.reshape(bias, per_channel)])]


@converter("GroupNormalization")
def _group_norm(ctx: Ctx) -> list[Operand | None]:
  """Normalise each group of C / num_groups channels (with the spatial dims) of a sample, then
  the per-channel affine map (opset 18 gives scale and bias per group; 21 per channel)."""
  ctx.check_attrs(["epsilon", "num_groups", "stash_type"])
  if ctx.int_attr("stash_type", 1) != 1:
    raise ctx.unsupported("stash_type other than 1 (float32 statistics) is not supported")
  x, scale, bias = ctx.inp(0, "X"), ctx.inp(1, "scale"), ctx.inp(2, "bias")
  check_float(ctx, x)
  ctx.same_dtype([x, scale, bias])
  xs = ctx.shape(x)
  groups = ctx.int_attr("num_groups", 0)
  if len(xs) < 3:
    raise ctx.error(f"input must have rank >= 3, got {list(xs)}")
  n, c = xs[0], xs[1]
  if groups < 1 or c % groups:
    raise ctx.error(f"num_groups {groups} must be >= 1 and divide the {c} channels")
  per_group = c // groups
  for what, p in (("scale", scale), ("bias", bias)):
    if ctx.shape(p) not in ((c,), (groups,)):
      raise ctx.error(f"{what} has dims {list(ctx.shape(p))}, expected [{c}] (or [{groups}] "
                      "before opset 21)")
  one = ctx.const_value(np.ones([1], ctx.dtype(x)), "one")
  grouped = ctx.reshape(x, (n, groups, int(np.prod(xs[1:])) // groups))
  y = ctx.op(Op.LAYER_NORM, [grouped, one], axis=2, epsilon=ctx.float_attr("epsilon", 1e-5))
  y = ctx.reshape(y, xs)

  def per_channel(p: Operand) -> Operand:
    if ctx.shape(p) == (groups,) and groups != c:  # one value per group: repeat per channel
      p = ctx.op(Op.EXPAND, [ctx.reshape(p, (groups, 1))],
                 **dict(zip(("shape", "rank"), _padded(groups, per_group))))
    return ctx.reshape(p, (c,) + (1,) * (len(xs) - 2))
  y = ctx.op(Op.MUL, [y, per_channel(scale)])
  return [ctx.op(Op.ADD, [y, per_channel(bias)])]


def _padded(*dims: int) -> tuple[tuple[int, ...], int]:
  padded, rank = ops.pad_shape(dims)
  return tuple(int(v) for v in padded), rank


@converter("LRN")
def _lrn(ctx: Ctx) -> list[Operand | None]:
  """y = x / (bias + alpha / size * sum of x^2 over a channel window) ** beta.

  The channel-window sum divided by size is an average pool (padding counted) over the channel
  axis of x^2 viewed as [N, 1, C, H*W].
  """
  ctx.check_attrs(["alpha", "beta", "bias", "size"])
  x = ctx.inp(0)
  check_float(ctx, x)
  xs = ctx.shape(x)
  if len(xs) != 4:
    raise ctx.unsupported(f"input of rank {len(xs)} is not supported (NCHW only)")
  size = ctx.int_attr("size", 0)
  if size < 1:
    raise ctx.error(f"size must be >= 1, got {size}")
  n, c, h, w = xs
  lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
  sq = ctx.op(Op.MUL, [x, x])
  sq = ctx.reshape(sq, (n, 1, c, h * w))
  mean = ctx.op(Op.AVG_POOL, [sq], kernel=(size, 1), strides=(1, 1), pads=(lo, 0, hi, 0),
                count_include_pad=True)
  mean = ctx.reshape(mean, xs)
  alpha = ctx.float_attr("alpha", 1e-4)
  beta = ctx.float_attr("beta", 0.75)
  bias = ctx.float_attr("bias", 1.0)
  d = ctx.op(Op.ADD, [ctx.op(Op.MUL, [mean, ctx.scalar(alpha, x, "alpha")]),
                      ctx.scalar(bias, x, "bias")])
  d = ctx.op(Op.POW, [d, ctx.scalar(beta, x, "beta")])
  return [ctx.op(Op.DIV, [x, d])]


@converter("Softmax", "LogSoftmax")
def _softmax(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["axis"])
  x = ctx.inp(0)
  check_float(ctx, x)
  op = Op.SOFTMAX if ctx.node.op_type == "Softmax" else Op.LOG_SOFTMAX
  xs = ctx.shape(x)
  r = len(xs)
  if r == 0:
    raise ctx.error(f"{ctx.node.op_type} of a scalar")
  if ctx.opset >= 13:
    return [ctx.op(op, [x], axis=ctx.axis(ctx.int_attr("axis", -1), r))]
  # Opset < 13: (log-)softmax over the flattened dims from `axis` on.
  axis = ctx.axis(ctx.int_attr("axis", 1), r)
  if axis == r - 1:
    return [ctx.op(op, [x], axis=axis)]
  flat = ctx.reshape(x, (int(np.prod(xs[:axis])), int(np.prod(xs[axis:]))))
  return [ctx.reshape(ctx.op(op, [flat], axis=1), xs)]
