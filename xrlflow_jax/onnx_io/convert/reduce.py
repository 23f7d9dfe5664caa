"""Converters of the reductions: ReduceMean, ReduceSum, ReduceSumSquare, ReduceMax, ReduceMin,
ReduceProd, ReduceL1, ReduceL2, ReduceLogSumExp (axes as an attribute or, from opset 13/18, an
input) and ArgMax, ArgMin."""

from __future__ import annotations

import numpy as np

from xrlflow_jax.graph.builder import axes_bits
from xrlflow_jax.onnx_io.convert.common import Ctx, Operand, check_float, converter
from xrlflow_jax.ops import Op


def _reduce_axes(ctx: Ctx, x: Operand, axes_input: int) -> list[int] | None:
  """Normalised reduction axes; None means an identity (noop_with_empty_axes)."""
  r = len(ctx.shape(x))
  if "axes" in ctx.attrs:
    axes = ctx.ints_attr("axes")
  elif ctx.has(axes_input):
    axes = ctx.ints(axes_input, "axes")
  else:
    axes = []
  if not axes:
    if ctx.int_attr("noop_with_empty_axes", 0):
      return None
    axes = list(range(r))
  axes = sorted({ctx.axis(a, r, "axes") for a in axes})
  return axes


_REDUCE = {"ReduceMean": Op.REDUCE_MEAN, "ReduceSum": Op.REDUCE_SUM,
           "ReduceSumSquare": Op.REDUCE_SUM, "ReduceMax": Op.REDUCE_MAX,
           "ReduceMin": Op.REDUCE_MIN, "ReduceProd": Op.REDUCE_PROD, "ReduceL1": Op.REDUCE_L1,
           "ReduceL2": Op.REDUCE_L2, "ReduceLogSumExp": Op.REDUCE_LOG_SUM_EXP}
_REDUCE_INTEGERS = {"ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"}  # also take ints


@converter(*_REDUCE)
def _reduce(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["axes", "keepdims", "noop_with_empty_axes"])
  x = ctx.inp(0)
  kind = ctx.node.op_type
  dt = ctx.dtype(x)
  if kind in ("ReduceMax", "ReduceMin") and dt == np.bool_ and ctx.opset >= 20:
    pass  # opset 20 allows bool (max: any, min: all)
  elif kind not in _REDUCE_INTEGERS or not np.issubdtype(dt, np.integer):
    check_float(ctx, x)
  axes = _reduce_axes(ctx, x, 1)
  if kind == "ReduceSumSquare":
    x = ctx.op(Op.MUL, [x, x])
  if axes is None or not ctx.shape(x):
    # Nothing reduced (noop_with_empty_axes, or a scalar): the elementwise part of the norms
    # still applies, as in onnx's reference (L1 and L2 give |x|, LogSumExp x, SumSquare x^2).
    return [ctx.op(Op.ABS, [x]) if kind in ("ReduceL1", "ReduceL2") else x]
  return [ctx.op(_REDUCE[kind], [x], axes=axes_bits(axes),
                 keepdims=bool(ctx.int_attr("keepdims", 1)))]


@converter("ArgMax", "ArgMin")
def _arg_reduce(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["axis", "keepdims", "select_last_index"])
  x = ctx.inp(0)
  if ctx.dtype(x) == np.bool_:
    raise ctx.unsupported("bool input is not supported")
  r = len(ctx.shape(x))
  if r == 0:
    raise ctx.error("input must have rank >= 1")
  axis = ctx.axis(ctx.int_attr("axis", 0), r)
  op = Op.ARG_MAX if ctx.node.op_type == "ArgMax" else Op.ARG_MIN
  return [ctx.op(op, [x], axes=axes_bits([axis]), keepdims=bool(ctx.int_attr("keepdims", 1)),
                 select_last_index=bool(ctx.int_attr("select_last_index", 0)))]
