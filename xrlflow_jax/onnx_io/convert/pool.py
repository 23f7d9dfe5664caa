"""Converters of the pools: MaxPool and AveragePool (1-D ones lifted to 2-D, 3-D ones as a
2-D pool over (H, W) then one over the depth) and GlobalAveragePool, GlobalMaxPool."""

from __future__ import annotations

from typing import Sequence

from xrlflow_jax.graph.builder import axes_bits
from xrlflow_jax.onnx_io.convert.common import (Ctx, Operand, auto_pads, check_float, converter,
                                                spatial_attr, to_2d)
from xrlflow_jax.ops import Op


def _pool(ctx: Ctx, op: Op) -> list[Operand | None]:
  known = ["auto_pad", "ceil_mode", "kernel_shape", "pads", "strides", "dilations"]
  known += ["storage_order"] if op == Op.MAX_POOL else ["count_include_pad"]
  ctx.check_attrs(known)
  x = ctx.inp(0, "X")
  if len(ctx.needed) > 1 and ctx.needed[1]:
    raise ctx.unsupported("the Indices output is not supported")
  xs = ctx.shape(x)
  n = len(xs) - 2
  if n < 1:
    raise ctx.error(f"input of rank {len(xs)} has no spatial dims")
  kernel = ctx.ints_attr("kernel_shape")
  if kernel is None or len(kernel) != n or any(k < 1 for k in kernel):
    raise ctx.error(f"kernel_shape {kernel} must be {n} values >= 1")
  strides = spatial_attr(ctx, "strides", n, 1)
  dilations = spatial_attr(ctx, "dilations", n, 1)
  begins, ends = auto_pads(ctx, xs[2:], kernel, strides, dilations)
  common = dict(ceil_mode=bool(ctx.int_attr("ceil_mode", 0)))
  if op == Op.AVG_POOL:
    common["count_include_pad"] = bool(ctx.int_attr("count_include_pad", 0))

  def pool2d(x4: Operand, k: Sequence[int], s: Sequence[int], b: Sequence[int],
             e: Sequence[int], d: Sequence[int]) -> Operand:
    return ctx.op(op, [x4], kernel=tuple(k), strides=tuple(s), pads=(b[0], b[1], e[0], e[1]),
                  dilations=tuple(d), **common)
  rest = [None] * (len(ctx.needed) - 1)
  if n == 3:
    # 3-D pools are separable: a box's max is the max over depth of the maxima over (H, W),
    # and its mean the mean over depth of the means over (H, W), as each window's count of
    # cells (with or without pads; never ceil mode's extra cells) is a product over the axes.
    bn, c, d, h, w = xs
    hw = pool2d(ctx.reshape(x, (bn, c * d, h, w)), kernel[1:], strides[1:], begins[1:],
                ends[1:], dilations[1:])
    ho, wo = ctx.shape(hw)[2:]
    y = pool2d(ctx.reshape(hw, (bn, c, d, ho * wo)), (kernel[0], 1), (strides[0], 1),
               (begins[0], 0), (ends[0], 0), (dilations[0], 1))
    return [ctx.reshape(y, (bn, c, ctx.shape(y)[2], ho, wo))] + rest
  x4, one_d = to_2d(ctx, x, "pool input")
  if one_d:
    kernel, strides, begins, ends = [1] + kernel, [1] + strides, [0] + begins, [0] + ends
    dilations = [1] + dilations
  y = pool2d(x4, kernel, strides, begins, ends, dilations)
  return [ctx.squeeze(y, [2]) if one_d else y] + rest


@converter("MaxPool")
def _max_pool(ctx: Ctx) -> list[Operand | None]:
  return _pool(ctx, Op.MAX_POOL)


@converter("AveragePool")
def _avg_pool(ctx: Ctx) -> list[Operand | None]:
  check_float(ctx, ctx.inp(0))
  return _pool(ctx, Op.AVG_POOL)


@converter("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs([])
  x = ctx.inp(0)
  xs = ctx.shape(x)
  if len(xs) < 3:
    raise ctx.error(f"input of rank {len(xs)} has no spatial dims")
  if ctx.node.op_type == "GlobalMaxPool":
    x4, one_d = to_2d(ctx, x, "GlobalMaxPool input")
    s = ctx.shape(x4)
    y = ctx.op(Op.MAX_POOL, [x4], kernel=(s[2], s[3]), strides=(1, 1))
    return [ctx.squeeze(y, [2]) if one_d else y]
  check_float(ctx, x)
  if len(xs) == 4:
    return [ctx.op(Op.GLOBAL_AVG_POOL, [x])]
  return [ctx.op(Op.REDUCE_MEAN, [x], axes=axes_bits(range(2, len(xs))), keepdims=True)]
