"""ONNX op converters: each turns one ONNX node into the project's ops through `GraphBuilder`.

A converter receives a `Ctx` (the node, its decoded attributes, its inputs as `Const` values or
builder `Tensor`s) and returns one operand per node output (None for outputs nobody reads).
Decompositions are chosen to compute the same numbers as the ONNX definition (up to float
rounding), e.g. LeakyRelu as max(x, alpha * x), Expand of a tensor as a product with ones, LRN as
an average pool over channels. Ops the project cannot express raise `UnsupportedOnnxOpError`,
which the importer collects so every unsupported op is reported at once.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence, Union

import jax.numpy as jnp
import numpy as np
import onnx

from xrlflow_jax import ops
from xrlflow_jax.errors import (CapacityError, OnnxImportError, ParamError, ShapeError,
                                UnknownOpError, UnsupportedOnnxOpError)
from xrlflow_jax.graph.builder import GraphBuilder, Tensor
from xrlflow_jax.onnx_io import fold
from xrlflow_jax.onnx_io.common import onnx_to_numpy_dtype, project_dtype
from xrlflow_jax.ops import MAX_RANK, Op
from xrlflow_jax.ops.tensor import PAD_MODES


@dataclasses.dataclass(eq=False)
class Const:
  """A value known on import (initializer, Constant node, or folded); materialised on first use
  as a Constant node of the graph, once."""
  value: np.ndarray
  name: str
  tensor: Tensor | None = None

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(self.value.shape)

  @property
  def dtype(self) -> np.dtype:
    return self.value.dtype


Operand = Union[Const, Tensor]


def _bits(axes: Sequence[int]) -> int:
  out = 0
  for a in axes:
    out |= 1 << int(a)
  return out


class Ctx:
  """Everything a converter needs about the node it converts.

  Attributes:
    node: the ONNX node.
    attrs: its decoded attributes.
    inputs: one operand per input slot (None for an absent optional input).
    needed: per output, whether anything reads it.
    opset: the model's default-domain opset (after conversion of opsets below MIN_OPSET).
    source_opset: the opset the file was written in.
    where: error-message prefix naming file, node and op.
  """

  def __init__(self, builder: GraphBuilder, node: onnx.NodeProto, attrs: dict[str, Any],
               inputs: list[Operand | None], needed: list[bool], opset: int, where: str,
               materialize: Callable[[Const], Tensor], source_opset: int | None = None):
    self.b = builder
    # The file's own opset: below MIN_OPSET the model was converted and `opset` is the
    # converted one (a few old semantics survive conversion, e.g. opset-6 PRelu's slope).
    self.source_opset = opset if source_opset is None else source_opset
    self.node = node
    self.attrs = attrs
    self.inputs = inputs
    self.needed = needed
    self.opset = opset
    self.where = where
    self._materialize = materialize
    self._count = 0
    # Names of constants and nodes made here start with the node's first output (unique in a
    # valid model, unlike node names), so they do not depend on the order nodes are visited in.
    self.base = next((o for o in node.output if o), node.name or node.op_type)

  # ---------------------------------------------------------------- errors
  def unsupported(self, message: str) -> UnsupportedOnnxOpError:
    return UnsupportedOnnxOpError(self.where + message, (self.node.op_type,))

  def error(self, message: str) -> OnnxImportError:
    return OnnxImportError(self.where + message)

  def check_attrs(self, known: Sequence[str]) -> None:
    unknown = sorted(set(self.attrs) - set(known))
    if unknown:
      raise self.unsupported(f"attribute(s) {unknown} are not supported (known: {sorted(known)})")

  def attr(self, name: str, default: Any = None) -> Any:
    return self.attrs.get(name, default)

  def int_attr(self, name: str, default: int) -> int:
    value = self.attrs.get(name, default)
    if not isinstance(value, (int, np.integer)):
      raise self.error(f"attribute {name} must be an int, got {value!r}")
    return int(value)

  def ints_attr(self, name: str, default: Sequence[int] | None = None) -> list[int] | None:
    value = self.attrs.get(name, default)
    if value is None:
      return None
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(v, (int, np.integer)) for v in value):
      raise self.error(f"attribute {name} must be a list of ints, got {value!r}")
    return [int(v) for v in value]

  def float_attr(self, name: str, default: float) -> float:
    value = self.attrs.get(name, default)
    if not isinstance(value, (int, float, np.number)):
      raise self.error(f"attribute {name} must be a float, got {value!r}")
    return float(value)

  # ---------------------------------------------------------------- inputs
  def has(self, i: int) -> bool:
    return i < len(self.inputs) and self.inputs[i] is not None

  def inp(self, i: int, what: str = "input") -> Operand:
    if not self.has(i):
      raise self.error(f"{what} (input {i}) is missing")
    return self.inputs[i]

  def const(self, i: int, what: str) -> np.ndarray:
    """The value of input i, which must be known on import."""
    x = self.inp(i, what)
    if not isinstance(x, Const):
      raise self.unsupported(f"{what} (input {i}, '{self.node.input[i]}') must be a constant "
                             "known on import")
    return x.value

  def ints(self, i: int, what: str) -> list[int]:
    value = self.const(i, what)
    if not np.issubdtype(value.dtype, np.integer):
      raise self.error(f"{what} must be integers, got {value.dtype}")
    return [int(v) for v in value.reshape(-1)]

  @staticmethod
  def shape(x: Operand) -> tuple[int, ...]:
    return tuple(x.shape)

  @staticmethod
  def dtype(x: Operand) -> np.dtype:
    if isinstance(x, Const):
      return x.value.dtype
    return np.dtype(ops.numpy_dtype(int(x.dtype)))

  def axis(self, a: int, rank: int, what: str = "axis") -> int:
    if not -rank <= int(a) < max(rank, 1):
      raise self.error(f"{what} {a} is out of range for rank {rank}")
    return int(a) % max(rank, 1)

  # ---------------------------------------------------------------- building
  def tensor(self, x: Operand) -> Tensor:
    return self._materialize(x) if isinstance(x, Const) else x

  def const_value(self, value: Any, suffix: str, dtype: Any = None) -> Const:
    value = np.asarray(value) if dtype is None else np.asarray(value, dtype=dtype)
    self._count += 1
    return Const(value, f"{self.base}/{suffix}_{self._count}")

  def op(self, op: Op, inputs: Sequence[Operand], **attrs: Any) -> Operand:
    """Adds a project op; folds it on the host when every input is a constant."""
    if all(isinstance(x, Const) for x in inputs):
      return self._fold(op, list(inputs), attrs)
    self._count += 1
    return self.b.node(op, [self.tensor(x) for x in inputs],
                       name=f"{self.base}/{ops.get(op).name.lower()}_{self._count}", **attrs)

  def _fold(self, op: Op, inputs: list[Const], attrs: dict[str, Any]) -> Const:
    spec = ops.get(op)
    vec = spec.encode_attrs(**attrs)
    k = max(len(inputs), 3)
    in_shapes = np.ones([k, MAX_RANK], np.int32)
    in_ranks = np.zeros([k], np.int32)
    for i, x in enumerate(inputs):
      in_shapes[i], in_ranks[i] = ops.pad_shape(x.shape)
    shape, rank = ops.infer_shape(op, in_shapes, in_ranks, vec, len(inputs), where=self.where)
    dtypes = [int(project_dtype(x.dtype, self.where)) for x in inputs]
    out_dtype = ops.numpy_dtype(ops.infer_dtype(op, dtypes, vec))
    out_shape = ops.unpad_shape(shape, rank)
    value = spec.lower([jnp.asarray(x.value) for x in inputs], spec.decode_attrs(vec), out_shape,
                       jnp.dtype(out_dtype))
    self._count += 1
    return Const(np.asarray(value).astype(out_dtype),
                 f"{self.base}/{spec.name.lower()}_{self._count}")

  def reshape(self, x: Operand, shape: Sequence[int]) -> Operand:
    shape = tuple(int(s) for s in shape)
    if shape == self.shape(x):
      return x
    if len(shape) > MAX_RANK:
      raise self.unsupported(f"rank {len(shape)} exceeds the project's maximum rank {MAX_RANK}")
    padded, rank = ops.pad_shape(shape)
    return self.op(Op.RESHAPE, [x], shape=tuple(int(v) for v in padded), rank=rank)

  def transpose(self, x: Operand, perm: Sequence[int]) -> Operand:
    perm = [int(p) for p in perm]
    if perm == list(range(len(perm))):
      return x
    return self.op(Op.TRANSPOSE, [x], perm=tuple(perm) + (0,) * (MAX_RANK - len(perm)))

  def squeeze(self, x: Operand, axes: Sequence[int]) -> Operand:
    if not axes:
      return x
    return self.op(Op.SQUEEZE, [x], axes=_bits(axes))

  def unsqueeze(self, x: Operand, axes: Sequence[int]) -> Operand:
    if not axes:
      return x
    if len(self.shape(x)) + len(axes) > MAX_RANK:
      raise self.unsupported(f"rank {len(self.shape(x)) + len(axes)} exceeds the project's "
                             f"maximum rank {MAX_RANK}")
    return self.op(Op.UNSQUEEZE, [x], axes=_bits(axes))

  def slice(self, x: Operand, axis: int, start: int, end: int, step: int = 1) -> Operand:
    if start == 0 and end == self.shape(x)[axis] and step == 1:
      return x
    return self.op(Op.SLICE, [x], axis=axis, start=start, end=end, step=step)

  def concat(self, xs: Sequence[Operand], axis: int) -> Operand:
    xs = list(xs)
    if len(xs) == 1:
      return xs[0]
    k = self.b.max_inputs
    while len(xs) > k:
      xs = [self.op(Op.CONCAT, xs[:k], axis=axis)] + xs[k:]
    return self.op(Op.CONCAT, xs, axis=axis)

  def scalar(self, value: float, like: Operand, suffix: str) -> Const:
    return self.const_value(np.asarray(value, dtype=self.dtype(like)), suffix)

  def same_dtype(self, xs: Sequence[Operand]) -> None:
    names = {self.dtype(x).name for x in xs}
    if len(names) > 1:
      raise self.error(f"inputs have different dtypes ({', '.join(sorted(names))})")


Converter = Callable[[Ctx], list[Operand | None]]
CONVERTERS: dict[str, Converter] = {}


def converter(*names: str) -> Callable[[Converter], Converter]:
  def register(fn: Converter) -> Converter:
    for n in names:
      CONVERTERS[n] = fn
    return fn
  return register


def _float(ctx: Ctx, x: Operand, what: str = "input") -> None:
  if not np.issubdtype(ctx.dtype(x), np.floating):
    raise ctx.unsupported(f"{what} of dtype {ctx.dtype(x).name} is not supported (floats only)")


# ==================================================================== elementwise

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
    _float(ctx, x)
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
  _float(ctx, x)
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
  _float(ctx, x)
  return [ctx.op(Op.HARD_SIGMOID, [x], alpha=ctx.float_attr("alpha", 0.2),
                 beta=ctx.float_attr("beta", 0.5))]


@converter("HardSwish")
def _hard_swish(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs([])
  x = ctx.inp(0)
  _float(ctx, x)
  return [ctx.op(Op.HARD_SWISH, [x])]


@converter("Gelu")
def _gelu(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["approximate"])
  approx = ctx.attr("approximate", "none")
  if approx not in ("none", "tanh"):
    raise ctx.error(f"approximate must be 'none' or 'tanh', got {approx!r}")
  x = ctx.inp(0)
  _float(ctx, x)
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
  _float(ctx, x)
  values = {k: ctx.float_attr(k, v) for k, v in defaults.items()}
  if op == Op.CELU and values["alpha"] == 0.0:
    raise ctx.error("alpha must not be 0")
  return [ctx.op(op, [x], **values)]


@converter("PRelu")
def _prelu(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs([])
  x, slope = ctx.inp(0), ctx.inp(1, "slope")
  _float(ctx, x)
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
    _float(ctx, y)
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


# ==================================================================== matmul / conv

@converter("MatMul")
def _matmul(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs([])
  a, b = ctx.inp(0, "A"), ctx.inp(1, "B")
  ctx.same_dtype([a, b])
  ra, rb = len(ctx.shape(a)), len(ctx.shape(b))
  if ra == 0 or rb == 0:
    raise ctx.error("MatMul operands must have rank >= 1")
  if ra == 1:
    a = ctx.unsqueeze(a, [0])
  if rb == 1:
    b = ctx.unsqueeze(b, [1])
  y = ctx.op(Op.MATMUL, [a, b])
  r = len(ctx.shape(y))
  drop = ([r - 2] if ra == 1 else []) + ([r - 1] if rb == 1 else [])
  return [ctx.squeeze(y, drop)]


@converter("Gemm")
def _gemm(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["alpha", "beta", "transA", "transB", "broadcast"])
  a, b = ctx.inp(0, "A"), ctx.inp(1, "B")
  ctx.same_dtype([a, b])
  if len(ctx.shape(a)) != 2 or len(ctx.shape(b)) != 2:
    raise ctx.error(f"A and B must be rank 2, got {list(ctx.shape(a))} and {list(ctx.shape(b))}")
  if ctx.int_attr("transA", 0):
    a = ctx.transpose(a, [1, 0])
  if ctx.int_attr("transB", 0):
    b = ctx.transpose(b, [1, 0])
  y = ctx.op(Op.MATMUL, [a, b])
  alpha, beta = ctx.float_attr("alpha", 1.0), ctx.float_attr("beta", 1.0)
  if alpha != 1.0:
    y = ctx.op(Op.MUL, [y, ctx.scalar(alpha, y, "alpha")])
  if ctx.has(2) and beta != 0.0:
    c = ctx.inp(2)
    ctx.same_dtype([y, c])
    if beta != 1.0:
      c = ctx.op(Op.MUL, [c, ctx.scalar(beta, c, "beta")])
    y = ctx.op(Op.ADD, [y, c])
  return [y]


def _auto_pads(ctx: Ctx, spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
               dilations: Sequence[int]) -> tuple[list[int], list[int]]:
  """(begins, ends) of ONNX auto_pad / pads for each spatial dim."""
  n = len(spatial)
  mode = ctx.attr("auto_pad", "NOTSET")
  if mode in ("NOTSET", ""):
    pads = ctx.ints_attr("pads", [0] * (2 * n))
    if len(pads) != 2 * n or any(p < 0 for p in pads):
      raise ctx.error(f"pads {pads} must be {2 * n} values >= 0")
    return pads[:n], pads[n:]
  if mode == "VALID":
    return [0] * n, [0] * n
  if mode not in ("SAME_UPPER", "SAME_LOWER"):
    raise ctx.error(f"unknown auto_pad {mode!r}")
  begins, ends = [], []
  for size, k, s, d in zip(spatial, kernel, strides, dilations):
    out = -(-size // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    small = total // 2
    begins.append(small if mode == "SAME_UPPER" else total - small)
    ends.append(total - small if mode == "SAME_UPPER" else small)
  return begins, ends


def _spatial_attr(ctx: Ctx, name: str, n: int, default: int) -> list[int]:
  value = ctx.ints_attr(name, [default] * n)
  if len(value) != n or any(v < 1 for v in value):
    raise ctx.error(f"{name} {value} must be {n} values >= 1")
  return value


def _to_2d(ctx: Ctx, x: Operand, what: str) -> tuple[Operand, bool]:
  """NCL -> NC1L so 1-D convolutions and pools run as 2-D ones."""
  rank = len(ctx.shape(x))
  if rank == 4:
    return x, False
  if rank == 3:
    return ctx.unsqueeze(x, [2]), True
  raise ctx.unsupported(f"{what} of rank {rank} is not supported (1-D and 2-D only)")


def _conv_operands(ctx: Ctx) -> tuple[Operand, Operand, Sequence[int], Sequence[int]]:
  """(X, W, X's shape, W's shape) of a Conv or ConvTranspose node: float, one dtype, one rank."""
  x, w = ctx.inp(0, "X"), ctx.inp(1, "W")
  ctx.same_dtype([x, w])
  _float(ctx, x)
  xs, ws = ctx.shape(x), ctx.shape(w)
  if len(ws) != len(xs):
    raise ctx.error(f"weight '{ctx.node.input[1]}' has dims {list(ws)}, which do not fit input "
                    f"{list(xs)} (same rank needed)")
  return x, w, xs, ws


@converter("Conv")
def _conv(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"])
  x, w, xs, ws = _conv_operands(ctx)
  n = len(xs) - 2
  kernel = ctx.ints_attr("kernel_shape", list(ws[2:]))
  if list(kernel) != list(ws[2:]):
    raise ctx.error(f"weight '{ctx.node.input[1]}' has dims {list(ws)} but kernel_shape is "
                    f"{kernel}")
  strides = _spatial_attr(ctx, "strides", n, 1)
  dilations = _spatial_attr(ctx, "dilations", n, 1)
  begins, ends = _auto_pads(ctx, xs[2:], kernel, strides, dilations)
  if n == 3:
    return [_conv3d(ctx, x, w, xs, ws, strides, dilations, begins, ends)]
  x4, one_d = _to_2d(ctx, x, "Conv input")
  w4 = ctx.unsqueeze(w, [2]) if one_d else w
  if one_d:
    strides, dilations = [1] + strides, [1] + dilations
    begins, ends = [0] + begins, [0] + ends
  inputs = [x4, w4]
  if ctx.has(2):
    bias = ctx.inp(2, "B")
    ctx.same_dtype([x, bias])
    inputs.append(bias)
  y = ctx.op(Op.CONV2D, inputs, strides=tuple(strides), dilations=tuple(dilations),
             pads=(begins[0], begins[1], ends[0], ends[1]), groups=ctx.int_attr("group", 1))
  return [ctx.squeeze(y, [2]) if one_d else y]


def _pad_crop(ctx: Ctx, x: Operand, begins: Sequence[int], ends: Sequence[int],
              mode: str = "constant", value: float = 0.0) -> Operand:
  """x padded by `begins` / `ends` per axis (ONNX Pad's meaning; negative amounts crop)."""
  y = x
  for a in range(len(begins)):
    b, e = min(begins[a], 0), min(ends[a], 0)
    if b or e:
      size = ctx.shape(y)[a]
      if size + b + e < 1:
        raise ctx.unsupported(f"pads crop axis {a} to nothing (zero-size tensors)")
      y = ctx.slice(y, a, -b, size + e)
  begins = [max(v, 0) for v in begins]
  ends = [max(v, 0) for v in ends]
  if not any(begins) and not any(ends):
    return y
  if mode == "reflect" and any(max(b, e) >= d for b, e, d in zip(begins, ends, ctx.shape(y))):
    raise ctx.error("reflect pads must be smaller than the padded dims")
  flat = [0] * (2 * MAX_RANK)
  for a in range(len(begins)):
    flat[a], flat[MAX_RANK + a] = begins[a], ends[a]
  return ctx.op(Op.PAD, [y], pads=tuple(flat), mode=PAD_MODES.index(mode), value=value)


def _pad_axis(ctx: Ctx, x: Operand, axis: int, before: int, after: int) -> Operand:
  """x with `before` / `after` zeros along one axis (negative amounts crop)."""
  begins, ends = [0] * len(ctx.shape(x)), [0] * len(ctx.shape(x))
  begins[axis], ends[axis] = before, after
  return _pad_crop(ctx, x, begins, ends)


def _depth_plane(ctx: Ctx, w: Operand, kd: int) -> Operand:
  """w[:, :, kd] of a 3-D convolution's weight (folded when w is a constant)."""
  return ctx.squeeze(ctx.slice(w, 2, kd, kd + 1), [2])


def _conv3d(ctx: Ctx, x: Operand, w: Operand, xs: Sequence[int], ws: Sequence[int],
            strides: Sequence[int], dilations: Sequence[int], begins: Sequence[int],
            ends: Sequence[int]) -> Operand:
  """A 3-D convolution as a sum over the kernel's depth of 2-D convolutions: for each kernel
  plane kd, the input planes it meets (every stride-th from kd x dilation, after padding the
  depth) are stacked into the batch and convolved over (H, W) with w[:, :, kd]; the bias
  joins the first plane's convolution. X [N, C, D, H, W] -> Y [N, O, Do, Ho, Wo]."""
  bn, c, d, h, wd = xs
  kd_size = ws[2]
  sd, dd = strides[0], dilations[0]
  depth = d + begins[0] + ends[0]
  do = (depth - dd * (kd_size - 1) - 1) // sd + 1
  if do < 1:
    raise ctx.error(f"the kernel's depth {kd_size} (dilation {dd}) exceeds the padded input "
                    f"depth {depth}")
  planes = ctx.transpose(_pad_axis(ctx, x, 2, begins[0], ends[0]), [0, 2, 1, 3, 4])
  bias = ctx.inp(2, "B") if ctx.has(2) else None
  if bias is not None:
    ctx.same_dtype([x, bias])
  y = None
  for kd in range(kd_size):
    start = kd * dd
    xk = ctx.reshape(ctx.slice(planes, 1, start, start + (do - 1) * sd + 1, sd),
                     (bn * do, c, h, wd))
    inputs = [xk, _depth_plane(ctx, w, kd)] + ([bias] if bias is not None and kd == 0 else [])
    yk = ctx.op(Op.CONV2D, inputs, strides=tuple(strides[1:]), dilations=tuple(dilations[1:]),
                pads=(begins[1], begins[2], ends[1], ends[2]), groups=ctx.int_attr("group", 1))
    y = yk if y is None else ctx.op(Op.ADD, [y, yk])
  o, ho, wo = ctx.shape(y)[1:]
  return ctx.transpose(ctx.reshape(y, (bn, do, o, ho, wo)), [0, 2, 1, 3, 4])


def _einsum_terms(ctx: Ctx, equation: str, ranks: list[int]) -> tuple[list[str], str]:
  """The labels of each operand and of the output, with "..." spelled out as labels of their own
  (Greek letters, right-aligned across operands, as broadcasting aligns them)."""
  eq = equation.replace(" ", "")
  lhs, arrow, rhs = eq.partition("->")
  terms = lhs.split(",")
  if len(terms) != len(ranks):
    raise ctx.error(f"equation {equation!r} names {len(terms)} operands, the node has "
                    f"{len(ranks)}")
  ell_dims = 0
  for t, r in zip(terms, ranks):
    if "..." in t:
      ell_dims = max(ell_dims, r - (len(t) - 3))
  ell = "".join(chr(0x3B1 + i) for i in range(ell_dims))
  out_terms = []
  for t, r in zip(terms, ranks):
    if "..." in t:
      k = r - (len(t) - 3)
      if k < 0:
        raise ctx.error(f"term {t!r} has more labels than its operand's rank {r}")
      t = t.replace("...", ell[ell_dims - k:])
    if not all(ch.isascii() and ch.isalpha() or ch in ell for ch in t):
      raise ctx.error(f"equation {equation!r}: labels must be letters (and one '...')")
    if len(t) != r:
      raise ctx.error(f"term {t!r} has {len(t)} labels for an operand of rank {r}")
    out_terms.append(t)
  if arrow:
    out = rhs.replace("...", ell)
  else:  # implicit output: the ellipsis, then the labels used once, in alphabetical order
    counts = {ch: sum(t.count(ch) for t in out_terms) for ch in set("".join(out_terms))}
    out = ell + "".join(sorted(ch for ch, n in counts.items() if n == 1 and ch not in ell))
  if len(set(out)) != len(out) or any(ch not in "".join(out_terms) for ch in out):
    raise ctx.error(f"equation {equation!r}: output labels must be distinct input labels")
  return out_terms, out


def _einsum_pair(ctx: Ctx, a: Operand, ta: str, b: Operand, tb: str, keep: str,
                 sizes: dict[str, int]) -> tuple[Operand, str]:
  """a (labels ta) times b (labels tb), summed over the labels not in `keep`: one MatMul of
  [batch, left, contracted] by [batch, contracted, right]. Returns (result, its labels)."""
  batch = [ch for ch in ta if ch in tb and ch in keep]
  contract = [ch for ch in ta if ch in tb and ch not in keep]
  left = [ch for ch in ta if ch not in tb]
  right = [ch for ch in tb if ch not in ta]

  def size(labels: list[str]) -> int:
    return int(np.prod([sizes[ch] for ch in labels])) if labels else 1
  a3 = ctx.reshape(ctx.transpose(a, [ta.index(ch) for ch in batch + left + contract]),
                   (size(batch), size(left), size(contract)))
  b3 = ctx.reshape(ctx.transpose(b, [tb.index(ch) for ch in batch + contract + right]),
                   (size(batch), size(contract), size(right)))
  y = ctx.op(Op.MATMUL, [a3, b3])
  labels = batch + left + right
  if len(labels) > MAX_RANK:
    raise ctx.unsupported(f"an intermediate of rank {len(labels)} exceeds the maximum rank "
                          f"{MAX_RANK}")
  return ctx.reshape(y, tuple(sizes[ch] for ch in labels)), "".join(labels)


def _einsum_diagonal(ctx: Ctx, x: Operand, t: str) -> tuple[Operand, str]:
  """x with each label its term repeats taken along the diagonal ("ii->i"): the two axes moved
  last, merged and sliced with step n + 1. Returns (x, its labels, each once)."""
  while len(set(t)) != len(t):
    ch = next(c for c in t if t.count(c) > 1)
    p, q = [a for a, c in enumerate(t) if c == ch][:2]
    shape = ctx.shape(x)
    if shape[p] != shape[q]:
      raise ctx.error(f"term {t!r}: label {ch!r} has sizes {shape[p]} and {shape[q]}")
    n = shape[p]
    rest = [a for a in range(len(t)) if a not in (p, q)]
    moved = ctx.transpose(x, rest + [p, q])
    flat = ctx.reshape(moved, tuple(shape[a] for a in rest) + (n * n,))
    x = ctx.slice(flat, len(rest), 0, n * n, n + 1)
    t = "".join(t[a] for a in rest) + ch
  return x, t


@converter("Einsum")
def _einsum(ctx: Ctx) -> list[Operand | None]:
  """Einsum as transposes, reshapes, sums and batched MatMuls (the contractions transformers
  use: "bhqd,bhkd->bhqk", "bij,bjk->bik", "bnd,dh->bnh", ...). Operands are contracted left to
  right; labels used by one operand only are summed first. A label repeated within one
  operand takes the diagonal; size-1 dims of "..." broadcast."""
  ctx.check_attrs(["equation"])
  equation = ctx.attr("equation", "")
  if not isinstance(equation, str) or not equation:
    raise ctx.error("the equation attribute is missing")
  xs = [x for x in ctx.inputs if x is not None]
  if not xs:
    raise ctx.error("needs at least one operand")
  ctx.same_dtype(xs)
  _float(ctx, xs[0])
  terms, out = _einsum_terms(ctx, equation, [len(ctx.shape(x)) for x in xs])
  xs, terms = zip(*[_einsum_diagonal(ctx, x, t) for x, t in zip(xs, terms)])
  sizes: dict[str, int] = {}
  for t, x in zip(terms, xs):
    for ch, d in zip(t, ctx.shape(x)):
      sizes[ch] = max(sizes.get(ch, 1), d)
  xs, terms = list(xs), list(terms)
  for i, (x, t) in enumerate(zip(xs, terms)):
    shape = ctx.shape(x)
    for ch, d in zip(t, shape):
      if d != sizes[ch] and (d != 1 or ch.isascii()):
        raise ctx.error(f"label {ch!r} has sizes {d} and {sizes[ch]} (only dims of '...' "
                        "broadcast, and only from size 1)")
    # A size-1 dim broadcast against a larger one: drop it from this operand (the product
    # then broadcasts over the label, as the other operands carry it).
    drop = [a for a, ch in enumerate(t) if shape[a] != sizes[ch]]
    if drop:
      xs[i] = ctx.squeeze(x, drop) if len(drop) < len(t) else ctx.reshape(x, (1,))
      terms[i] = "".join(ch for a, ch in enumerate(t) if a not in drop)
      if len(drop) == len(t):  # a scalar operand: keep one axis of size 1 under a new label
        terms[i] = "\u03c9"
        sizes["\u03c9"] = 1

  def sum_out(x: Operand, t: str, keep: str) -> tuple[Operand, str]:
    drop = [i for i, ch in enumerate(t) if ch not in keep]
    if not drop:
      return x, t
    y = ctx.op(Op.REDUCE_SUM, [x], axes=_bits(drop), keepdims=False)
    return y, "".join(ch for ch in t if ch in keep)

  later = ["".join(terms[i + 1:]) for i in range(len(terms))]
  y, ty = sum_out(xs[0], terms[0], out + later[0])
  for i in range(1, len(xs)):
    keep = out + later[i]
    b, tb = sum_out(xs[i], terms[i], keep + ty)
    y, ty = sum_out(y, ty, keep + tb)
    y, ty = _einsum_pair(ctx, y, ty, b, tb, keep, sizes)
  y, ty = sum_out(y, ty, out)
  return [ctx.transpose(y, [ty.index(ch) for ch in out])]


def _conv_transpose3d(ctx: Ctx, x: Operand, w: Operand, xs: Sequence[int],
                      ws: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
                      out_pad: Sequence[int], begins: Sequence[int],
                      ends: Sequence[int]) -> Operand:
  """A 3-D transposed convolution as a sum over the kernel's depth of 2-D ones: every input
  plane is transposed-convolved over (H, W) with w[:, :, kd] and lands on output depth
  id x stride + kd x dilation (zeros between, for strides > 1); the sum over kd is then cropped
  by the depth pads and the bias added once. X [N, C, D, H, W] -> Y [N, O, Do, Ho, Wo]."""
  bn, c, di, h, wd = xs
  kd_size = ws[2]
  sd, dd = strides[0], dilations[0]
  full = sd * (di - 1) + out_pad[0] + (kd_size - 1) * dd + 1
  depth = full - begins[0] - ends[0]
  if depth < 1:
    raise ctx.error(f"pads {begins[0]}, {ends[0]} crop the output depth {full} to nothing")
  planes = ctx.reshape(ctx.transpose(x, [0, 2, 1, 3, 4]), (bn * di, c, h, wd))
  y = None
  for kd in range(kd_size):
    yk = ctx.op(Op.CONV_TRANSPOSE, [planes, _depth_plane(ctx, w, kd)],
                strides=tuple(strides[1:]), dilations=tuple(dilations[1:]),
                pads=(begins[1], begins[2], ends[1], ends[2]), groups=ctx.int_attr("group", 1),
                output_padding=tuple(out_pad[1:]))
    o, ho, wo = ctx.shape(yk)[1:]
    f = o * ho * wo
    if sd > 1:  # input plane id lands on id x stride: stride - 1 zero planes after each
      yk = _pad_axis(ctx, ctx.reshape(yk, (bn, di, 1, f)), 2, 0, sd - 1)
    yk = ctx.reshape(yk, (bn, di * sd, f))
    yk = _pad_axis(ctx, yk, 1, kd * dd, full - kd * dd - di * sd)
    y = yk if y is None else ctx.op(Op.ADD, [y, yk])
  y = _pad_axis(ctx, y, 1, -begins[0], -ends[0])
  y = ctx.transpose(ctx.reshape(y, (bn, depth, o, ho, wo)), [0, 2, 1, 3, 4])
  if ctx.has(2):
    bias = ctx.inp(2, "B")
    ctx.same_dtype([x, bias])
    y = ctx.op(Op.ADD, [y, ctx.reshape(bias, (o, 1, 1, 1))])
  return y


@converter("ConvTranspose")
def _conv_transpose(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["auto_pad", "dilations", "group", "kernel_shape", "output_padding",
                   "output_shape", "pads", "strides"])
  x, w, xs, ws = _conv_operands(ctx)
  n = len(xs) - 2
  if n not in (1, 2, 3):
    raise ctx.unsupported(f"input of rank {len(xs)} is not supported (1-D to 3-D only)")
  kernel = ctx.ints_attr("kernel_shape", list(ws[2:]))
  if list(kernel) != list(ws[2:]):
    raise ctx.error(f"weight has dims {list(ws)} but kernel_shape is {kernel}")
  strides = _spatial_attr(ctx, "strides", n, 1)
  dilations = _spatial_attr(ctx, "dilations", n, 1)
  out_pad = ctx.ints_attr("output_padding", [0] * n)
  if len(out_pad) != n:
    raise ctx.error(f"output_padding {out_pad} must be {n} values")
  full = [s * (i - 1) + op + (k - 1) * d + 1
          for s, i, op, k, d in zip(strides, xs[2:], out_pad, kernel, dilations)]
  mode = ctx.attr("auto_pad", "NOTSET")
  target = ctx.ints_attr("output_shape")
  if target is None and mode in ("SAME_UPPER", "SAME_LOWER"):
    target = [i * s for i, s in zip(xs[2:], strides)]
  if target is not None:  # pads follow from the output shape (ONNX's formula)
    target = list(target)[-n:]
    if len(target) != n:
      raise ctx.error(f"output_shape {target} must give {n} spatial dims")
    total = [f - t for f, t in zip(full, target)]  # < 0: output beyond the full result
    if any(t < 0 for t in total) and mode in ("SAME_UPPER", "SAME_LOWER"):
      raise ctx.unsupported(f"output_shape {target} is larger than the full transposed "
                            f"convolution {full} with auto_pad {mode}")
    if mode == "SAME_UPPER":
      begins, ends = [t // 2 for t in total], [t - t // 2 for t in total]
    else:
      begins, ends = [t - t // 2 for t in total], [t // 2 for t in total]
  elif mode == "VALID":
    begins, ends = [0] * n, [0] * n
  else:
    if mode not in ("NOTSET", ""):
      raise ctx.error(f"unknown auto_pad {mode!r}")
    pads = ctx.ints_attr("pads", [0] * (2 * n))
    if len(pads) != 2 * n or any(p < 0 for p in pads):
      raise ctx.error(f"pads {pads} must be {2 * n} values >= 0")
    begins, ends = pads[:n], pads[n:]
  if n == 3:
    return [_conv_transpose3d(ctx, x, w, xs, ws, strides, dilations, out_pad, begins, ends)]
  x4, one_d = _to_2d(ctx, x, "ConvTranspose input")
  w4 = ctx.unsqueeze(w, [2]) if one_d else w
  if one_d:
    strides, dilations, out_pad = [1] + strides, [1] + dilations, [0] + out_pad
    begins, ends = [0] + begins, [0] + ends
  inputs = [x4, w4]
  if ctx.has(2):
    bias = ctx.inp(2, "B")
    ctx.same_dtype([x, bias])
    inputs.append(bias)
  y = ctx.op(Op.CONV_TRANSPOSE, inputs, strides=tuple(strides), dilations=tuple(dilations),
             pads=(begins[0], begins[1], ends[0], ends[1]), groups=ctx.int_attr("group", 1),
             output_padding=tuple(out_pad))
  return [ctx.squeeze(y, [2]) if one_d else y]


# ==================================================================== Resize / Upsample
# Resizing is separable: each resized axis is a sum over a few taps of Gathers along that axis
# with constant indices, weighted by constant coefficients, all computed here as onnx's
# reference does (`onnx.reference.ops.op_resize`): source coordinates by the coordinate
# transformation mode, neighbours of edge-padded data (clamped indices), exclude_outside,
# antialias footprints. Nearest is one Gather.

def _resize_coeffs(mode: str, nearest_mode: str, cubic_a: float, antialias: bool,
                   ratio: float, scale: float) -> np.ndarray:
  if mode == "nearest":
    if float(ratio).is_integer():
      return np.asarray([0.0, 1.0])
    if nearest_mode == "round_prefer_floor":
      return np.asarray([ratio <= 0.5, ratio > 0.5], np.float64)
    if nearest_mode == "round_prefer_ceil":
      return np.asarray([ratio < 0.5, ratio >= 0.5], np.float64)
    return np.asarray([1.0, 0.0] if nearest_mode == "floor" else [0.0, 1.0])
  if mode == "linear":
    if not antialias:
      return np.asarray([1 - ratio, ratio])
    s = min(scale, 1.0)
    start = int(np.floor(-1 / s) + 1)
    args = (np.arange(start, start + 2 - 2 * start) - ratio) * s
    c = np.clip(1 - np.abs(args), 0, 1)
    return c / c.sum()
  a = cubic_a
  if not antialias:
    r = ratio
    return np.asarray([((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                       ((a + 2) * r - (a + 3)) * r * r + 1,
                       ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
                       ((a * ((1 - r) + 1) - 5 * a) * ((1 - r) + 1) + 8 * a) * ((1 - r) + 1)
                       - 4 * a])
  s = min(scale, 1.0)

  def coeff(x: float) -> float:
    x = abs(x)
    if x <= 1:
      return (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1
    if x < 2:
      return a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a
    return 0.0
  i_start = int(np.floor(-2 / s) + 1)
  c = np.asarray([coeff(s * (i - ratio)) for i in range(i_start, 2 - i_start)])
  return c / c.sum()


def _resize_taps(ctx: Ctx, in_len: int, out_len: int, scale: float, roi: tuple[float, float],
                 attrs: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
  """(indices int64[out, n] in [0, in_len), coefficients float64[out, n], the output positions
  that take the extrapolation value or None) of one resized axis."""
  ctm = attrs["coordinate_transformation_mode"]
  y = np.arange(out_len, dtype=np.float64)
  out_width = scale * in_len
  extrapolated = None
  if ctm == "align_corners":
    x = np.zeros(out_len) if out_width == 1 else y * (in_len - 1) / (out_width - 1)
  elif ctm == "asymmetric":
    x = y / scale
  elif ctm == "pytorch_half_pixel":
    x = np.full(out_len, -0.5) if out_width == 1 else (y + 0.5) / scale - 0.5
  elif ctm == "half_pixel":
    x = (y + 0.5) / scale - 0.5
  elif ctm == "half_pixel_symmetric":
    offset = in_len / 2 * (1 - out_len / out_width)
    x = offset + (y + 0.5) / scale - 0.5
  elif ctm == "tf_crop_and_resize":
    lo, hi = roi
    x = (np.full(out_len, (hi - lo) * (in_len - 1) / 2) if out_width == 1
         else y * (hi - lo) * (in_len - 1) / (out_width - 1))
    x = x + lo * (in_len - 1)
    extrapolated = (x < 0) | (x > in_len - 1)
  else:
    raise ctx.error(f"unknown coordinate_transformation_mode {ctm!r}")
  base = np.floor(x)
  ratios = np.where(x == base, 1.0, x - base)
  coeffs = np.stack([_resize_coeffs(attrs["mode"], attrs["nearest_mode"], attrs["cubic_coeff_a"],
                                    attrs["antialias"], float(r), scale) for r in ratios])
  n = coeffs.shape[1]
  pad = int(np.ceil(n / 2))
  xp_ = x + pad
  p = np.floor(xp_).astype(np.int64)
  frac = xp_ - p
  if n % 2 == 0:
    offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
  else:
    offset = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
  idx = (p + offset)[:, None] + np.arange(n)[None, :] - pad
  if attrs["exclude_outside"]:
    coeffs = np.where((idx < 0) | (idx >= in_len), 0.0, coeffs)
    total = coeffs.sum(axis=1, keepdims=True)
    coeffs = coeffs / np.where(total == 0, 1.0, total)
  return np.clip(idx, 0, in_len - 1), coeffs, (extrapolated if extrapolated is not None
                                               and extrapolated.any() else None)


def _resize(ctx: Ctx, x: Operand, out_size: list[int], scales: list[float],
            roi: list[float] | None, attrs: dict[str, Any]) -> Operand:
  xs = ctx.shape(x)
  r = len(xs)
  y = x
  for axis in range(r):
    if out_size[axis] < 1:
      raise ctx.unsupported(f"output size {out_size[axis]} of axis {axis} (zero-size tensors "
                            "are not supported)")
    lo, hi = (roi[axis], roi[axis + r]) if roi is not None else (0.0, 1.0)
    if (math.isclose(scales[axis], 1.0) and out_size[axis] == xs[axis]
        and math.isclose(lo, 0.0) and math.isclose(hi, 1.0)):
      continue
    idx, coeffs, extrapolated = _resize_taps(ctx, xs[axis], out_size[axis], scales[axis],
                                             (lo, hi), attrs)
    trail = (1,) * (r - axis - 1)
    if attrs["mode"] == "nearest":
      pick = idx[np.arange(len(idx)), np.argmax(coeffs, axis=1)]
      out = ctx.op(Op.GATHER, [y, ctx.const_value(pick.astype(np.int64), f"nearest_{axis}")],
                   axis=axis)
    else:
      out = None
      for t in range(coeffs.shape[1]):
        if not coeffs[:, t].any():
          continue
        tap = ctx.op(Op.GATHER, [y, ctx.const_value(idx[:, t].astype(np.int64),
                                                   f"taps_{axis}_{t}")], axis=axis)
        w = ctx.const_value(coeffs[:, t].reshape((-1,) + trail).astype(ctx.dtype(x)),
                            f"weights_{axis}_{t}")
        term = ctx.op(Op.MUL, [tap, w])
        out = term if out is None else ctx.op(Op.ADD, [out, term])
    if extrapolated is not None:
      mask = ctx.const_value(extrapolated.reshape((-1,) + trail), f"outside_{axis}")
      out = ctx.op(Op.WHERE, [mask, ctx.scalar(attrs["extrapolation_value"], x, "extrapolation"),
                              out])
    y = out
  return y


_RESIZE_ATTRS = {"mode": "nearest", "coordinate_transformation_mode": "half_pixel",
                 "nearest_mode": "round_prefer_floor", "cubic_coeff_a": -0.75,
                 "exclude_outside": 0, "extrapolation_value": 0.0, "antialias": 0,
                 "keep_aspect_ratio_policy": "stretch"}


@converter("Resize", "Upsample")
def _resize_conv(ctx: Ctx) -> list[Operand | None]:
  upsample = ctx.node.op_type == "Upsample"
  known = ["mode", "scales"] if upsample else list(_RESIZE_ATTRS) + ["axes"]
  ctx.check_attrs(known)
  x = ctx.inp(0, "X")
  _float(ctx, x)
  xs = ctx.shape(x)
  r = len(xs)
  attrs = {k: ctx.attr(k, v) for k, v in _RESIZE_ATTRS.items()}
  attrs["mode"] = str(attrs["mode"]).lower()
  if attrs["mode"] == "bilinear":  # Upsample's name for it (opset 7)
    attrs["mode"] = "linear"
  if attrs["mode"] not in ("nearest", "linear", "cubic"):
    raise ctx.unsupported(f"mode {attrs['mode']!r} is not supported (nearest, linear, cubic)")
  roi, scales, sizes = None, None, None
  if upsample or ctx.opset < 11:
    # Upsample and Resize-10: scales only, asymmetric coordinates, nearest rounds down.
    attrs["coordinate_transformation_mode"] = "asymmetric"
    attrs["nearest_mode"] = "floor"
    if upsample and ctx.opset < 9:
      scales = [float(v) for v in ctx.attr("scales", [])]
    else:
      scales = [float(v) for v in ctx.const(1, "scales").reshape(-1)]
  else:
    if ctx.has(1):
      roi_v = ctx.const(1, "roi").astype(np.float64).reshape(-1)
      roi = [float(v) for v in roi_v] if roi_v.size else None
    if ctx.has(2) and ctx.const(2, "scales").size:
      scales = [float(v) for v in ctx.const(2, "scales").reshape(-1)]
    if ctx.has(3) and ctx.const(3, "sizes").size:
      sizes = ctx.ints(3, "sizes")
  if (scales is None) == (sizes is None):
    raise ctx.error("exactly one of scales and sizes must be given")
  axes = [ctx.axis(a, r, "axes") for a in ctx.ints_attr("axes", list(range(r)))]
  given = scales if scales is not None else sizes
  if len(given) != len(axes) or (roi is not None and len(roi) != 2 * len(axes)):
    raise ctx.error(f"scales/sizes/roi {given}/{roi} do not fit {len(axes)} axes")
  full_scales, full_sizes = [1.0] * r, list(xs)
  full_roi = None if roi is None else [0.0] * r + [1.0] * r
  for i, a in enumerate(axes):
    if scales is not None:
      full_scales[a] = scales[i]
    else:
      full_sizes[a] = sizes[i]
    if roi is not None:
      full_roi[a], full_roi[r + a] = roi[i], roi[len(axes) + i]
  if sizes is not None:
    full_scales = [full_sizes[i] / xs[i] for i in range(r)]
    policy = attrs["keep_aspect_ratio_policy"]
    if policy != "stretch":
      picked = [full_scales[a] for a in axes]
      if policy not in ("not_larger", "not_smaller"):
        raise ctx.error(f"unknown keep_aspect_ratio_policy {policy!r}")
      s = min(picked) if policy == "not_larger" else max(picked)
      full_scales = [s if i in axes else 1.0 for i in range(r)]
      full_sizes = [int(s * xs[i] + 0.5) if i in axes else xs[i] for i in range(r)]
  else:
    if any(s <= 0 for s in full_scales):
      raise ctx.error(f"scales {full_scales} must be > 0")
    full_sizes = [int(s * d) for s, d in zip(full_scales, xs)]
  if attrs["antialias"] and attrs["mode"] == "nearest":
    raise ctx.error("antialias is not defined for mode nearest")
  if attrs["coordinate_transformation_mode"] == "tf_crop_and_resize" and full_roi is None:
    raise ctx.error("tf_crop_and_resize needs roi")
  return [_resize(ctx, x, full_sizes, full_scales, full_roi, attrs)]


# ==================================================================== pooling / normalisation

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
  strides = _spatial_attr(ctx, "strides", n, 1)
  dilations = _spatial_attr(ctx, "dilations", n, 1)
  begins, ends = _auto_pads(ctx, xs[2:], kernel, strides, dilations)
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
  x4, one_d = _to_2d(ctx, x, "pool input")
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
  _float(ctx, ctx.inp(0))
  return _pool(ctx, Op.AVG_POOL)


@converter("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs([])
  x = ctx.inp(0)
  xs = ctx.shape(x)
  if len(xs) < 3:
    raise ctx.error(f"input of rank {len(xs)} has no spatial dims")
  if ctx.node.op_type == "GlobalMaxPool":
    x4, one_d = _to_2d(ctx, x, "GlobalMaxPool input")
    s = ctx.shape(x4)
    y = ctx.op(Op.MAX_POOL, [x4], kernel=(s[2], s[3]), strides=(1, 1))
    return [ctx.squeeze(y, [2]) if one_d else y]
  _float(ctx, x)
  if len(xs) == 4:
    return [ctx.op(Op.GLOBAL_AVG_POOL, [x])]
  return [ctx.op(Op.REDUCE_MEAN, [x], axes=_bits(range(2, len(xs))), keepdims=True)]


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
  _float(ctx, xs[0])
  ctx.same_dtype(xs)
  y = ctx.op(Op.BATCH_NORM, xs, epsilon=ctx.float_attr("epsilon", 1e-5))
  return [y] + [None] * (len(ctx.needed) - 1)


@converter("LayerNormalization")
def _layer_norm(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["axis", "epsilon", "stash_type"])
  if ctx.int_attr("stash_type", 1) != 1:
    raise ctx.unsupported("stash_type other than 1 (float32 statistics) is not supported")
  x, scale = ctx.inp(0, "X"), ctx.inp(1, "Scale")
  _float(ctx, x)
  inputs = [x, scale] + ([ctx.inp(2)] if ctx.has(2) else [])
  ctx.same_dtype(inputs)
  rank = len(ctx.shape(x))
  axis = ctx.axis(ctx.int_attr("axis", -1), rank)
  eps = ctx.float_attr("epsilon", 1e-5)
  y = ctx.op(Op.LAYER_NORM, inputs, axis=axis, epsilon=eps)
  outs: list[Operand | None] = [y, None, None][:len(ctx.needed)]
  if any(ctx.needed[1:]):  # the optional statistics, over the normalised dims (kept as 1s)
    axes = _bits(range(axis, rank))
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
  _float(ctx, x)
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
  _float(ctx, x)
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
  _float(ctx, x)
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
  _float(ctx, x)
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
    _float(ctx, x)
  axes = _reduce_axes(ctx, x, 1)
  if kind == "ReduceSumSquare":
    x = ctx.op(Op.MUL, [x, x])
  if axes is None or not ctx.shape(x):
    # Nothing reduced (noop_with_empty_axes, or a scalar): the elementwise part of the norms
    # still applies, as in onnx's reference (L1 and L2 give |x|, LogSumExp x, SumSquare x^2).
    return [ctx.op(Op.ABS, [x]) if kind in ("ReduceL1", "ReduceL2") else x]
  return [ctx.op(_REDUCE[kind], [x], axes=_bits(axes),
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
  return [ctx.op(op, [x], axes=_bits([axis]), keepdims=bool(ctx.int_attr("keepdims", 1)),
                 select_last_index=bool(ctx.int_attr("select_last_index", 0)))]


# ==================================================================== data movement

@converter("Concat")
def _concat(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["axis"])
  xs = [x for x in ctx.inputs if x is not None]
  if not xs:
    raise ctx.error("needs at least one input")
  ctx.same_dtype(xs)
  axis = ctx.axis(ctx.int_attr("axis", 0), len(ctx.shape(xs[0])))
  return [ctx.concat(xs, axis)]


@converter("Split")
def _split(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["axis", "split", "num_outputs"])
  x = ctx.inp(0)
  xs = ctx.shape(x)
  axis = ctx.axis(ctx.int_attr("axis", 0), len(xs))
  dim, count = xs[axis], len(ctx.node.output)
  if "split" in ctx.attrs:
    sizes = ctx.ints_attr("split")
  elif ctx.has(1):
    sizes = ctx.ints(1, "split")
  elif "num_outputs" in ctx.attrs:
    parts = ctx.int_attr("num_outputs", count)
    if parts != count or parts < 1:
      raise ctx.error(f"num_outputs {parts} but the node has {count} outputs")
    chunk = -(-dim // parts)
    sizes = [min(chunk, dim - i * chunk) for i in range(parts)]
  else:
    if dim % count:
      raise ctx.error(f"dim {dim} does not split evenly into {count} outputs")
    sizes = [dim // count] * count
  if len(sizes) != count or sum(sizes) != dim or any(s < 0 for s in sizes):
    raise ctx.error(f"split sizes {sizes} must be {count} values >= 0 summing to {dim}")
  if any(s == 0 and needed for s, needed in zip(sizes, ctx.needed)):
    raise ctx.unsupported(f"split sizes {sizes} make an empty output that is read (zero-size "
                          "tensors are not supported)")
  outs: list[Operand | None] = []
  start = 0
  for s, needed in zip(sizes, ctx.needed):
    outs.append(ctx.slice(x, axis, start, start + s) if needed else None)
    start += s
  return outs


@converter("Slice")
def _slice(ctx: Ctx) -> list[Operand | None]:
  x = ctx.inp(0)
  xs = ctx.shape(x)
  if ctx.opset < 10:
    ctx.check_attrs(["starts", "ends", "axes"])
    starts, ends = ctx.ints_attr("starts", []), ctx.ints_attr("ends", [])
    axes = ctx.ints_attr("axes", list(range(len(starts))))
    steps = [1] * len(starts)
  else:
    ctx.check_attrs([])
    starts, ends = ctx.ints(1, "starts"), ctx.ints(2, "ends")
    axes = ctx.ints(3, "axes") if ctx.has(3) else list(range(len(starts)))
    steps = ctx.ints(4, "steps") if ctx.has(4) else [1] * len(starts)
  if not len(starts) == len(ends) == len(axes) == len(steps):
    raise ctx.error(f"starts {starts}, ends {ends}, axes {axes}, steps {steps} differ in length")
  axes = [ctx.axis(a, len(xs), "axes") for a in axes]
  if len(set(axes)) != len(axes):
    raise ctx.error(f"axes {axes} repeat")
  y = x
  for a, s, e, st in zip(axes, starts, ends, steps):
    if st == 0:
      raise ctx.error("slice step 0")
    r = fold.onnx_slice(xs[a], s, e, st)
    if len(r) == 0:
      raise ctx.unsupported(f"the slice of axis {a} is empty (zero-size tensors are not "
                            "supported)")
    if st > 0:
      y = ctx.slice(y, a, r.start, min(r.stop, xs[a]), st)
    else:  # a reversed slice picks explicit indices
      idx = ctx.const_value(np.asarray(list(r), np.int64), f"indices_{a}")
      y = ctx.op(Op.GATHER, [y, idx], axis=a)
  return [y]


def _target_shape(ctx: Ctx, in_shape: Sequence[int], target: Sequence[int],
                  allowzero: bool) -> list[int]:
  out = []
  for i, s in enumerate(target):
    if s == 0 and not allowzero:
      if i >= len(in_shape):
        raise ctx.error(f"shape {list(target)} copies dim {i} of a rank-{len(in_shape)} input")
      s = in_shape[i]
    out.append(int(s))
  total = int(np.prod(in_shape))
  if out.count(-1) > 1 or any(s < -1 for s in out):
    raise ctx.error(f"invalid target shape {list(target)}")
  if 0 in out:
    raise ctx.unsupported(f"target shape {list(target)} has a zero dim (zero-size tensors are not "
                          "supported)")
  if -1 in out:
    known = int(np.prod([s for s in out if s != -1]))
    if total % known:
      raise ctx.error(f"cannot reshape {list(in_shape)} to {list(target)}")
    out[out.index(-1)] = total // known
  if int(np.prod(out)) != total:
    raise ctx.error(f"cannot reshape {list(in_shape)} ({total} elements) to {list(target)}")
  return out


@converter("Reshape")
def _reshape(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["allowzero", "shape"])
  x = ctx.inp(0)
  target = ctx.ints_attr("shape") if ctx.opset < 5 else ctx.ints(1, "shape")
  shape = _target_shape(ctx, ctx.shape(x), target, bool(ctx.int_attr("allowzero", 0)))
  return [ctx.reshape(x, shape)]


@converter("Flatten")
def _flatten(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["axis"])
  x = ctx.inp(0)
  xs = ctx.shape(x)
  axis = ctx.int_attr("axis", 1)
  if not -len(xs) <= axis <= len(xs):
    raise ctx.error(f"axis {axis} is out of range for rank {len(xs)}")
  if axis < 0:
    axis += len(xs)
  return [ctx.reshape(x, (int(np.prod(xs[:axis])), int(np.prod(xs[axis:]))))]


@converter("Transpose")
def _transpose(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["perm"])
  x = ctx.inp(0)
  r = len(ctx.shape(x))
  perm = ctx.ints_attr("perm", list(range(r))[::-1])
  if sorted(perm) != list(range(r)):
    raise ctx.error(f"perm {perm} is not a permutation of {r} axes")
  return [ctx.transpose(x, perm)]


def _axes_arg(ctx: Ctx) -> list[int] | None:
  if ctx.opset < 13:
    return ctx.ints_attr("axes")
  return ctx.ints(1, "axes") if ctx.has(1) else None


@converter("Squeeze")
def _squeeze(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["axes"])
  x = ctx.inp(0)
  xs = ctx.shape(x)
  axes = _axes_arg(ctx)
  if axes is None:
    axes = [i for i, d in enumerate(xs) if d == 1]
  axes = sorted({ctx.axis(a, len(xs), "axes") for a in axes})
  bad = [a for a in axes if xs[a] != 1]
  if bad:
    raise ctx.error(f"cannot squeeze axes {bad} of shape {list(xs)} (dims must be 1)")
  return [ctx.squeeze(x, axes)]


@converter("Unsqueeze")
def _unsqueeze(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["axes"])
  x = ctx.inp(0)
  axes = _axes_arg(ctx)
  if not axes:
    raise ctx.error("axes are required")
  out_rank = len(ctx.shape(x)) + len(axes)
  norm = sorted({ctx.axis(a, out_rank, "axes") for a in axes})
  if len(norm) != len(axes):
    raise ctx.error(f"axes {axes} repeat")
  return [ctx.unsqueeze(x, norm)]


@converter("Gather")
def _gather(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["axis"])
  data, idx = ctx.inp(0, "data"), ctx.inp(1, "indices")
  ds = ctx.shape(data)
  axis = ctx.axis(ctx.int_attr("axis", 0), len(ds))
  if not np.issubdtype(ctx.dtype(idx), np.integer):
    raise ctx.error(f"indices must be integers, got {ctx.dtype(idx).name}")
  idx = _wrapped_indices(ctx, idx, ds, axis)
  if isinstance(idx, Const) and idx.value.size == 1 and idx.value.ndim <= 1:
    # One constant index is a slice (and, for a scalar index, a squeeze): slices move through
    # row-wise ops (rules family "narrowing"), so the rows nobody reads are never computed.
    i = int(idx.value.reshape(()))
    picked = ctx.slice(data, axis, i, i + 1)
    return [ctx.squeeze(picked, [axis]) if idx.value.ndim == 0 else picked]
  return [ctx.op(Op.GATHER, [data, idx], axis=axis)]


def _wrapped_indices(ctx: Ctx, idx: Operand, ds: Sequence[int], axis: int) -> Operand:
  """Constant indices checked against dim `axis` of data shape `ds`, negatives wrapped; indices
  computed at run time are returned as they are."""
  if not isinstance(idx, Const):
    return idx
  v = idx.value.astype(np.int64)
  if v.size and (v.min() < -ds[axis] or v.max() >= ds[axis]):
    raise ctx.error(f"indices in [{v.min()}, {v.max()}] are out of range for axis {axis} of "
                    f"shape {list(ds)}")
  return Const(np.where(v < 0, v + ds[axis], v), idx.name)


@converter("GatherElements")
def _gather_elements(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["axis"])
  data, idx = ctx.inp(0, "data"), ctx.inp(1, "indices")
  ds, its = ctx.shape(data), ctx.shape(idx)
  axis = ctx.axis(ctx.int_attr("axis", 0), len(ds))
  if not np.issubdtype(ctx.dtype(idx), np.integer):
    raise ctx.error(f"indices must be integers, got {ctx.dtype(idx).name}")
  if len(its) != len(ds) or any(i > d for a, (i, d) in enumerate(zip(its, ds)) if a != axis):
    raise ctx.error(f"indices of shape {list(its)} do not fit data of shape {list(ds)} (same "
                    "rank, dims off the axis no larger)")
  return [ctx.op(Op.GATHER_ELEMENTS, [data, _wrapped_indices(ctx, idx, ds, axis)], axis=axis)]


@converter("CumSum")
def _cumsum(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["exclusive", "reverse"])
  x = ctx.inp(0)
  if ctx.dtype(x) == np.bool_:
    raise ctx.error("CumSum of a bool tensor")
  axes = ctx.ints(1, "axis")
  if len(axes) != 1:
    raise ctx.error(f"axis must hold one value, got {axes}")
  axis = ctx.axis(axes[0], len(ctx.shape(x)))
  return [ctx.op(Op.CUMSUM, [x], axis=axis, exclusive=bool(ctx.int_attr("exclusive", 0)),
                 reverse=bool(ctx.int_attr("reverse", 0)))]


@converter("Trilu")
def _trilu(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["upper"])
  x = ctx.inp(0)
  xs = ctx.shape(x)
  if len(xs) < 2:
    raise ctx.error(f"input must have rank >= 2, got {list(xs)}")
  k = ctx.ints(1, "k") if ctx.has(1) else [0]
  if len(k) != 1:
    raise ctx.error(f"k must be a scalar, got {k}")
  k0 = int(np.clip(k[0], -xs[-2] - 1, xs[-1] + 1))  # beyond the matrix: all kept or all zero
  return [ctx.op(Op.TRILU, [x], upper=bool(ctx.int_attr("upper", 1)), k=k0)]


@converter("TopK")
def _top_k(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["axis", "k", "largest", "sorted"])
  x = ctx.inp(0)
  xs = ctx.shape(x)
  if ctx.dtype(x) == np.bool_ or not xs:
    raise ctx.error(f"input must be a numeric tensor of rank >= 1, got {ctx.dtype(x).name}"
                    f"{list(xs)}")
  axis = ctx.axis(ctx.int_attr("axis", -1), len(xs))
  if ctx.opset < 10:
    k = ctx.int_attr("k", -1)
  else:
    values = ctx.ints(1, "K")
    if len(values) != 1:
      raise ctx.error(f"K must hold one value, got {values}")
    k = values[0]
  if not 1 <= k <= xs[axis]:
    raise ctx.unsupported(f"k={k} must lie in [1, {xs[axis]}] (the size of axis {axis}; k=0 "
                          "makes zero-size outputs)")
  attrs = dict(axis=axis, k=k, largest=bool(ctx.int_attr("largest", 1)))
  outs: list[Operand | None] = [None, None]
  if ctx.needed[0]:
    outs[0] = ctx.op(Op.TOP_K_VALUES, [x], **attrs)
  if len(ctx.needed) > 1 and ctx.needed[1]:
    outs[1] = ctx.op(Op.TOP_K_INDICES, [x], **attrs)
  return outs[:len(ctx.needed)]


@converter("Pad")
def _pad(ctx: Ctx) -> list[Operand | None]:
  x = ctx.inp(0)
  xs = ctx.shape(x)
  r = len(xs)
  if ctx.opset < 11:
    ctx.check_attrs(["mode", "pads", "value"])
    pads = ctx.ints_attr("pads", [])
    value = ctx.float_attr("value", 0.0)
    axes = list(range(r))
  else:
    ctx.check_attrs(["mode"])
    pads = ctx.ints(1, "pads")
    value = 0.0
    if ctx.has(2):
      v = ctx.const(2, "constant_value")
      if v.size != 1:
        raise ctx.error("constant_value must be a scalar")
      value = float(v.reshape(-1)[0])
    axes = ctx.ints(3, "axes") if ctx.has(3) else list(range(r))
    axes = [ctx.axis(a, r, "axes") for a in axes]
  if len(pads) != 2 * len(axes):
    raise ctx.error(f"pads {pads} must hold 2 x {len(axes)} values")
  mode = ctx.attr("mode", "constant")
  if mode not in PAD_MODES:
    raise ctx.unsupported(f"mode {mode!r} is not supported ({', '.join(PAD_MODES)})")
  begins, ends = [0] * r, [0] * r
  for i, a in enumerate(axes):
    begins[a], ends[a] = pads[i], pads[len(axes) + i]
  return [_pad_crop(ctx, x, begins, ends, mode, value)]


@converter("Expand")
def _expand(ctx: Ctx) -> list[Operand | None]:
  """Broadcast to `shape` (known on import), numpy rules (the output may have a higher rank)."""
  ctx.check_attrs([])
  x = ctx.inp(0)
  target = ctx.ints(1, "shape")
  xs = ctx.shape(x)
  try:
    out = tuple(int(d) for d in np.broadcast_shapes(xs, tuple(target)))
  except ValueError:
    raise ctx.error(f"cannot expand shape {list(xs)} to {target}") from None
  if out == xs:
    return [x]
  if 0 in out:
    raise ctx.unsupported("expanding to a zero-size tensor is not supported")
  if len(out) > MAX_RANK:
    raise ctx.unsupported(f"rank {len(out)} exceeds the project's maximum rank {MAX_RANK}")
  padded, rank = ops.pad_shape(out)
  return [ctx.op(Op.EXPAND, [x], shape=tuple(int(v) for v in padded), rank=rank)]


@converter("Tile")
def _tile(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs([])
  x = ctx.inp(0)
  reps = ctx.ints(1, "repeats")
  r = len(ctx.shape(x))
  if len(reps) != r or any(v < 1 for v in reps):
    raise ctx.error(f"repeats {reps} must be {r} values >= 1 (0 would make a zero-size "
                    "tensor)")
  if all(v == 1 for v in reps):
    return [x]
  return [ctx.op(Op.TILE, [x], reps=(1,) * (MAX_RANK - r) + tuple(reps))]


BUILDER_ERRORS = (ShapeError, UnknownOpError, ParamError, CapacityError)
