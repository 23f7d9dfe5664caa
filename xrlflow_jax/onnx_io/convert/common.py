"""What every converter shares: `Const` (a value known on import), `Ctx` (the node being
converted, its attributes and operands, and the ops it builds: folded on the host when every
input is a constant), the registry `CONVERTERS` with its `converter` decorator, the errors a
builder may raise (`BUILDER_ERRORS`), and the helpers more than one op family uses: the float
check, the spatial attributes and pads of convolutions and pools, the 1-D to 2-D lift, and ONNX
Pad's pad-or-crop."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence, Union

import jax.numpy as jnp
import numpy as np
import onnx

from xrlflow_jax import ops
from xrlflow_jax.errors import (CapacityError, OnnxImportError, ParamError, ShapeError,
                                UnknownOpError, UnsupportedOnnxOpError)
from xrlflow_jax.graph.builder import GraphBuilder, Tensor, axes_bits
from xrlflow_jax.onnx_io.common import project_dtype
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
    return self.op(Op.SQUEEZE, [x], axes=axes_bits(axes))

  def unsqueeze(self, x: Operand, axes: Sequence[int]) -> Operand:
    if not axes:
      return x
    if len(self.shape(x)) + len(axes) > MAX_RANK:
      raise self.unsupported(f"rank {len(self.shape(x)) + len(axes)} exceeds the project's "
                             f"maximum rank {MAX_RANK}")
    return self.op(Op.UNSQUEEZE, [x], axes=axes_bits(axes))

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


BUILDER_ERRORS = (ShapeError, UnknownOpError, ParamError, CapacityError)


def check_float(ctx: Ctx, x: Operand, what: str = "input") -> None:
  if not np.issubdtype(ctx.dtype(x), np.floating):
    raise ctx.unsupported(f"{what} of dtype {ctx.dtype(x).name} is not supported (floats only)")


def auto_pads(ctx: Ctx, spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
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


def spatial_attr(ctx: Ctx, name: str, n: int, default: int) -> list[int]:
  value = ctx.ints_attr(name, [default] * n)
  if len(value) != n or any(v < 1 for v in value):
    raise ctx.error(f"{name} {value} must be {n} values >= 1")
  return value


def to_2d(ctx: Ctx, x: Operand, what: str) -> tuple[Operand, bool]:
  """NCL -> NC1L so 1-D convolutions and pools run as 2-D ones."""
  rank = len(ctx.shape(x))
  if rank == 4:
    return x, False
  if rank == 3:
    return ctx.unsqueeze(x, [2]), True
  raise ctx.unsupported(f"{what} of rank {rank} is not supported (1-D and 2-D only)")


def pad_crop(ctx: Ctx, x: Operand, begins: Sequence[int], ends: Sequence[int],
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


def pad_axis(ctx: Ctx, x: Operand, axis: int, before: int, after: int) -> Operand:
  """x with `before` / `after` zeros along one axis (negative amounts crop)."""
  begins, ends = [0] * len(ctx.shape(x)), [0] * len(ctx.shape(x))
  begins[axis], ends[axis] = before, after
  return pad_crop(ctx, x, begins, ends)
