"""Converters of the elementwise ops: unary maths and activations (Relu ... Mish, LeakyRelu,
Elu, Selu, Celu, ThresholdedRelu, Shrink, HardSigmoid, HardSwish, Gelu, PRelu, Clip), binary
arithmetic with broadcasting (Add, Sub, Mul, Div, Pow, Mod) and its variadic forms (Max, Min,
Sum, Mean), comparisons and bool logic, IsNaN, IsInf, Where, Cast and CastLike, and the
identities of inference (Identity, Dropout)."""

from __future__ import annotations

import math

import numpy as np

from xrlflow_jax import ops
from xrlflow_jax.onnx_io.common import onnx_to_numpy_dtype, project_dtype
from xrlflow_jax.onnx_io.convert.common import Const, Ctx, Operand, check_float, converter
from xrlflow_jax.ops import Op


_UNARY = {"Relu": Op.RELU, "Sigmoid": Op.SIGMOID, "Tanh": Op.TANH, "Erf": Op.ERF, "Exp": Op.EXP,
          "Log": Op.LOG, "Sqrt": Op.SQRT, "Neg": Op.NEG, "Reciprocal": Op.RECIPROCAL,
          "Abs": Op.ABS, "Sign": Op.SIGN, "Floor": Op.FLOOR, "Ceil": Op.CEIL, "Round": Op.ROUND,
          "Softplus": Op.SOFTPLUS, "Softsign": Op.SOFTSIGN, "Mish": Op.MISH, "IsNaN": Op.IS_NAN,
          "Not": Op.NOT}
_ANY_NUMBER = {"Neg", "Abs", "Sign"}  # the unary ops that also take integers


def _bool(ctx: Ctx, x: Operand, what: str = "input") -> None:
  if ctx.dtype(x) != np.bool_:
    raise ctx.error(f"{what} must be bool, got {ctx.dtype(x).name}")


@converter(*_UNARY)
def _unary(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs([])
  x = ctx.inp(0)
  op = ctx.node.op_type
  if op == "Not":
    _bool(ctx, x)
  elif op in _ANY_NUMBER:
    if ctx.dtype(x) == np.bool_:
      raise ctx.error("input must be a number, got bool")
  else:
    check_float(ctx, x)
  return [ctx.op(_UNARY[op], [x])]


_COMPARE = {"Equal": Op.EQUAL, "Less": Op.LESS, "Greater": Op.GREATER,
            "LessOrEqual": Op.LESS_OR_EQUAL, "GreaterOrEqual": Op.GREATER_OR_EQUAL}
_LOGIC = {"And": Op.AND, "Or": Op.OR, "Xor": Op.XOR}


@converter(*_COMPARE, *_LOGIC)
def _compare(ctx: Ctx) -> list[Operand | None]:
  """Comparisons (one dtype on both sides, bool result) and bool logic, numpy broadcasting."""
  ctx.check_attrs([])
  a, b = ctx.inp(0, "A"), ctx.inp(1, "B")
  op = ctx.node.op_type
  ctx.same_dtype([a, b])
  if op in _LOGIC:
    _bool(ctx, a, "A")
  return [ctx.op((_COMPARE | _LOGIC)[op], [a, b])]


@converter("Mod")
def _mod(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["fmod"])
  a, b = ctx.inp(0, "A"), ctx.inp(1, "B")
  ctx.same_dtype([a, b])
  fmod = ctx.int_attr("fmod", 0)
  if fmod not in (0, 1):
    raise ctx.error(f"fmod must be 0 or 1, got {fmod}")
  if ctx.dtype(a) == np.bool_:
    raise ctx.error("Mod of bool tensors")
  if np.issubdtype(ctx.dtype(a), np.floating) and not fmod and ctx.opset < 28:
    raise ctx.error(f"fmod=0 on floats is defined from opset 28 on (the model is opset "
                    f"{ctx.opset}); floating-point Mod needs fmod=1")
  return [ctx.op(Op.MOD, [a, b], fmod=bool(fmod))]


@converter("IsInf")
def _is_inf(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["detect_positive", "detect_negative"])
  x = ctx.inp(0)
  check_float(ctx, x)
  return [ctx.op(Op.IS_INF, [x], detect_positive=bool(ctx.int_attr("detect_positive", 1)),
                 detect_negative=bool(ctx.int_attr("detect_negative", 1)))]


@converter("Identity")
def _identity(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs([])
  return [ctx.inp(0)]


@converter("Dropout")
def _dropout(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["ratio", "seed", "is_test"])
  if ctx.has(2):
    if bool(np.asarray(ctx.const(2, "training_mode")).reshape(-1)[0]):
      raise ctx.unsupported("training_mode=True (random dropout) is not supported")
  x = ctx.inp(0)
  if len(ctx.needed) > 1 and ctx.needed[1]:  # inference keeps everything: an all-true mask
    padded, rank = ops.pad_shape(ctx.shape(x))
    mask = ctx.op(Op.EXPAND, [ctx.const_value(np.ones([1] * rank, np.bool_), "mask")],
                  shape=tuple(int(v) for v in padded), rank=rank)
    return [x, mask]
  return [x] + [None] * (len(ctx.needed) - 1)


@converter("HardSigmoid")
def _hard_sigmoid(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["alpha", "beta"])
  x = ctx.inp(0)
  check_float(ctx, x)
  return [ctx.op(Op.HARD_SIGMOID, [x], alpha=ctx.float_attr("alpha", 0.2),
                 beta=ctx.float_attr("beta", 0.5))]


@converter("HardSwish")
def _hard_swish(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs([])
  x = ctx.inp(0)
  check_float(ctx, x)
  return [ctx.op(Op.HARD_SWISH, [x])]


@converter("Gelu")
def _gelu(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["approximate"])
  approx = ctx.attr("approximate", "none")
  if approx not in ("none", "tanh"):
    raise ctx.error(f"approximate must be 'none' or 'tanh', got {approx!r}")
  x = ctx.inp(0)
  check_float(ctx, x)
  return [ctx.op(Op.GELU, [x], approximate=approx == "tanh")]


# ONNX activations with float attributes: op, {attribute: default}.
_ACTIVATIONS = {
    "LeakyRelu": (Op.LEAKY_RELU, {"alpha": 0.01}),
    "Elu": (Op.ELU, {"alpha": 1.0}),
    "Selu": (Op.SELU, {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}),
    "Celu": (Op.CELU, {"alpha": 1.0}),
    "ThresholdedRelu": (Op.THRESHOLDED_RELU, {"alpha": 1.0}),
    "Shrink": (Op.SHRINK, {"bias": 0.0, "lambd": 0.5}),
}


@converter(*_ACTIVATIONS)
def _activation(ctx: Ctx) -> list[Operand | None]:
  op, defaults = _ACTIVATIONS[ctx.node.op_type]
  ctx.check_attrs(list(defaults))
  x = ctx.inp(0)
  check_float(ctx, x)
  values = {k: ctx.float_attr(k, v) for k, v in defaults.items()}
  if op == Op.CELU and values["alpha"] == 0.0:
    raise ctx.error("alpha must not be 0")
  return [ctx.op(op, [x], **values)]


@converter("PRelu")
def _prelu(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs([])
  x, slope = ctx.inp(0), ctx.inp(1, "slope")
  check_float(ctx, x)
  ctx.same_dtype([x, slope])
  xs, ss = ctx.shape(x), ctx.shape(slope)
  if ctx.source_opset < 7 and len(ss) == 1 and len(xs) >= 2 and ss[0] == xs[1] != 1:
    # Opset 6 and before: a 1-D slope holds one value per channel (axis 1), and the version
    # converter leaves it as it is.
    slope = ctx.reshape(slope, (ss[0],) + (1,) * (len(xs) - 2))
    ss = ctx.shape(slope)
  try:
    fits = tuple(np.broadcast_shapes(xs, ss)) == tuple(xs)
  except ValueError:
    fits = False
  if not fits:
    raise ctx.error(f"slope of shape {list(ss)} does not broadcast to the input's {list(xs)}")
  return [ctx.op(Op.PRELU, [x, slope])]


@converter("Clip")
def _clip(ctx: Ctx) -> list[Operand | None]:
  x = ctx.inp(0)
  if ctx.opset < 11:  # attributes, defaulting to the float range (not to infinities)
    ctx.check_attrs(["min", "max"])
    finfo = np.finfo(np.float32)
    bounds = [np.asarray(ctx.float_attr("min", float(finfo.min)), ctx.dtype(x)),
              np.asarray(ctx.float_attr("max", float(finfo.max)), ctx.dtype(x))]
  else:
    ctx.check_attrs([])
    bounds = []
    for i, what in ((1, "min"), (2, "max")):
      if not ctx.has(i):
        bounds.append(None)
      elif isinstance(ctx.inputs[i], Const):
        bounds.append(ctx.const(i, what))
      else:
        bounds.append(ctx.inputs[i])
  dt = ctx.dtype(x)
  consts = [b is None or isinstance(b, np.ndarray) for b in bounds]
  if np.issubdtype(dt, np.floating) and dt == np.float32 and all(consts) and all(
      b is None or b.size == 1 for b in bounds):
    finfo = np.finfo(np.float32)
    lo = float(bounds[0].reshape(-1)[0]) if bounds[0] is not None else float(finfo.min)
    hi = float(bounds[1].reshape(-1)[0]) if bounds[1] is not None else float(finfo.max)
    if bounds[0] is None:
      lo = -math.inf
    if bounds[1] is None:
      hi = math.inf
    return [ctx.op(Op.CLIP, [x], min=lo, max=hi)]
  y = x
  for b, op, suffix in ((bounds[0], Op.MAX, "min"), (bounds[1], Op.MIN, "max")):
    if b is None:
      continue
    operand = ctx.const_value(np.asarray(b, dt), suffix) if isinstance(b, np.ndarray) else b
    ctx.same_dtype([x, operand])
    y = ctx.op(op, [y, operand])
  return [y]


_BINARY = {"Add": Op.ADD, "Sub": Op.SUB, "Mul": Op.MUL, "Div": Op.DIV, "Pow": Op.POW}


@converter(*_BINARY)
def _binary(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs([])
  a, b = ctx.inp(0), ctx.inp(1)
  op = ctx.node.op_type
  if op == "Pow" and ctx.dtype(b) != ctx.dtype(a):  # Pow allows another exponent type
    b = (ctx.const_value(b.value.astype(ctx.dtype(a)), "exponent") if isinstance(b, Const)
         else ctx.op(Op.CAST, [b], to=int(project_dtype(ctx.dtype(a), ctx.where))))
  ctx.same_dtype([a, b])
  if op in ("Div", "Pow") and not np.issubdtype(ctx.dtype(a), np.floating):
    raise ctx.unsupported(f"integer {op} on tensors computed at run time is not supported")
  return [ctx.op(_BINARY[op], [a, b])]


@converter("Max", "Min", "Sum", "Mean")
def _variadic(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs([])
  xs = [x for x in ctx.inputs if x is not None]
  if not xs:
    raise ctx.error("needs at least one input")
  ctx.same_dtype(xs)
  op = {"Max": Op.MAX, "Min": Op.MIN, "Sum": Op.ADD, "Mean": Op.ADD}[ctx.node.op_type]
  y = xs[0]
  for x in xs[1:]:
    y = ctx.op(op, [y, x])
  if ctx.node.op_type == "Mean" and len(xs) > 1:
    check_float(ctx, y)
    y = ctx.op(Op.DIV, [y, ctx.scalar(len(xs), y, "count")])
  return [y]


@converter("Cast", "CastLike")
def _cast(ctx: Ctx) -> list[Operand | None]:
  x = ctx.inp(0)
  if ctx.node.op_type == "Cast":
    ctx.check_attrs(["to", "saturate", "round_mode"])
    to = onnx_to_numpy_dtype(ctx.int_attr("to", -1), ctx.where)
  else:
    ctx.check_attrs(["saturate", "round_mode"])
    to = ctx.dtype(ctx.inp(1, "target_type"))
  if to == ctx.dtype(x):
    return [x]
  return [ctx.op(Op.CAST, [x], to=int(project_dtype(to, ctx.where)))]


@converter("Where")
def _where(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs([])
  cond, a, b = ctx.inp(0, "condition"), ctx.inp(1, "X"), ctx.inp(2, "Y")
  if ctx.dtype(cond) != np.bool_:
    raise ctx.error(f"condition must be bool, got {ctx.dtype(cond).name}")
  ctx.same_dtype([a, b])
  return [ctx.op(Op.WHERE, [cond, a, b])]
