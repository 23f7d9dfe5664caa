"""Operator specifications: op codes, the fixed-width attribute vector, dtypes and shape helpers.

Shapes are stored right-aligned in a fixed-rank vector padded with ones: a rank-2 tensor of shape
(3, 4) is stored as [1, 1, 1, 1, 3, 4] with rank 2. Numpy broadcasting is then an elementwise
max over the padded vectors, the element count is the product of the whole vector, and axis `a`
of a rank-`r` tensor sits at position `MAX_RANK - r + a`.

Shape rules take an array module `xp` (numpy on the host, jax.numpy inside `jit`) so one
definition serves the builder, `validate` and the rewrite engine. They never update in place.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any, Callable, Sequence

import numpy as np

from xrlflow_jax.errors import ShapeError, UnknownOpError

MAX_RANK = 6  # R: the padded rank of every shape vector.
ATTR_WIDTH = 16  # A: the width of every attribute vector.


class DType(enum.IntEnum):
  """Element types a node may produce."""
  FLOAT32 = 0
  FLOAT16 = 1
  BFLOAT16 = 2
  INT32 = 3
  INT64 = 4
  BOOL = 5
  INT8 = 6
  UINT8 = 7
  FLOAT64 = 8


_NUMPY_DTYPES = {
    DType.FLOAT32: np.dtype("float32"),
    DType.FLOAT16: np.dtype("float16"),
    DType.INT32: np.dtype("int32"),
    DType.INT64: np.dtype("int64"),
    DType.BOOL: np.dtype("bool"),
    DType.INT8: np.dtype("int8"),
    DType.UINT8: np.dtype("uint8"),
    DType.FLOAT64: np.dtype("float64"),
}


def numpy_dtype(dtype: int) -> np.dtype:
  """The numpy dtype of a `DType` code (bfloat16 via ml_dtypes)."""
  dtype = DType(int(dtype))
  if dtype == DType.BFLOAT16:
    import ml_dtypes  # pylint: disable=g-import-not-at-top
    return np.dtype(ml_dtypes.bfloat16)
  return _NUMPY_DTYPES[dtype]


def dtype_code(dtype: Any) -> DType:
  """The `DType` code of a numpy/jax dtype or dtype name."""
  name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
  for code in DType:
    if code.name.lower() == name.lower():
      return code
  raise UnknownOpError(f"unsupported dtype {dtype!r}")


def dtype_size(xp: Any, dtype: Any) -> Any:
  """Bytes per element of a `DType` code (array or int); works under jit."""
  table = xp.asarray([4, 2, 2, 4, 8, 1, 1, 1, 8], dtype=xp.int32)
  return table[dtype]


class Activation(enum.IntEnum):
  """Activation fused into a Conv2D or MatMul."""
  NONE = 0
  RELU = 1
  SIGMOID = 2
  TANH = 3
  GELU = 4


class Layout(enum.IntEnum):
  """Memory layout of a Conv2D's or pool's activations (and a Conv2D's weight).

  NCHW: x [N, C, H, W], weight [O, C/groups, kh, kw] (ONNX's, and every imported graph's).
  NHWC: x [N, H, W, C], weight [kh, kw, C/groups, O] (XLA:CPU's fast convolution layout; the
  layout rules reach it through transposes, and a constant weight's transpose is folded when
  the graph is lowered).
  """
  NCHW = 0
  NHWC = 1


class Impl(enum.IntEnum):
  """How a Conv2D or a max/average pool is lowered to XLA: a choice of kernel, not of function.

  XLA: one `lax.conv_general_dilated` or `lax.reduce_window` (what an ONNX Conv or pool
  becomes; every imported graph's).
  TAPS: one strided slice of the padded input per kernel tap (window position), combined
  elementwise: for a Conv2D scaled by that tap's weights and summed (a per-channel
  multiply-add when each group has one input channel, a per-group dot otherwise), for a pool
  maxed or summed (then divided by the window's count). XLA fuses the taps into one loop.
  XLA:CPU's grouped-convolution and reduce-window emitters are slow (a 3x3 depthwise
  convolution of 128 x 56 x 56 ran 50x faster as taps, a 3x3 stride-1 pool 3x, on the 2-core
  CPU), so the `impl` rules offer the choice to the search and the measured kernel table
  decides. ONNX has no such choice: the exported Conv or pool is the same whichever was chosen.
  """
  XLA = 0
  TAPS = 1


def float_to_bits(value: float) -> int:
  """Encodes a float32 value as the int32 with the same bits (float attributes)."""
  return int(np.array(value, dtype=np.float32).view(np.int32))


def bits_to_float(bits: int) -> float:
  """Decodes `float_to_bits`."""
  return float(np.array(bits, dtype=np.int32).view(np.float32))


# A check is a boolean (numpy bool or traced array) and the message shown when it is false.
Check = tuple[Any, str]
# shape_rule(xp, in_shapes[K, R], in_ranks[K], attrs[A], n_inputs) -> (shape[R], rank, checks)
ShapeRule = Callable[..., tuple[Any, Any, list[Check]]]
# lower(inputs, attrs: dict, out_shape: tuple, out_dtype: np.dtype) -> jax.Array
Lowering = Callable[..., Any]
# flops(xp, in_shapes[K, R], in_ranks[K], out_shape[R], attrs[A]) -> float
FlopRule = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class AttrField:
  """One named attribute: its position(s) in the attribute vector and how it is encoded.

  `width` > 1 makes a tuple-valued attribute (strides, pads, perm). `kind` is "int", "float"
  (stored as float32 bits) or "bool".
  """
  name: str
  width: int = 1
  kind: str = "int"
  default: Any = 0


@dataclasses.dataclass(frozen=True)
class OpSpec:
  """Everything the project knows about one operator.

  Attributes:
    code: the op code stored in the graph.
    name: the op's name (as in dumps and error messages).
    min_inputs / max_inputs: arity.
    attrs: attribute fields, laid out in order in the attribute vector.
    shape_rule: jittable output shape rule (see module docstring).
    lower: JAX lowering.
    flops: FLOP count rule.
    dtype_rule: "input0" (same as first input), "input1", "attr:<name>" (a DType attribute) or
      "dtype:<name>" (always that DType, e.g. "dtype:bool" for comparisons).
    elementwise: True for ops XLA fuses into a loop fusion (used by the cost model).
    source: True for Input and Constant, whose shape is stored, not inferred.
  """
  code: int
  name: str
  min_inputs: int
  max_inputs: int
  attrs: tuple[AttrField, ...]
  shape_rule: ShapeRule
  lower: Lowering
  flops: FlopRule
  dtype_rule: str = "input0"
  elementwise: bool = False
  source: bool = False

  def attr_offsets(self) -> dict[str, tuple[int, AttrField]]:
    """Maps each attribute name to (offset in the vector, field)."""
    out, offset = {}, 0
    for field in self.attrs:
      out[field.name] = (offset, field)
      offset += field.width
    return out

  def encode_attrs(self, **values: Any) -> np.ndarray:
    """Encodes named attribute values into an int32[ATTR_WIDTH] vector.

    Unknown names raise `UnknownOpError`; missing names take their default.
    """
    offsets = self.attr_offsets()
    unknown = set(values) - set(offsets)
    if unknown:
      raise UnknownOpError(
          f"op {self.name} has no attribute(s) {sorted(unknown)}; known: {sorted(offsets)}")
    vec = np.zeros([ATTR_WIDTH], np.int32)
    for name, (offset, field) in offsets.items():
      value = values.get(name, field.default)
      items = list(value) if field.width > 1 else [value]
      if len(items) != field.width:
        raise UnknownOpError(
            f"op {self.name} attribute {name} needs {field.width} values, got {value!r}")
      for i, item in enumerate(items):
        if field.kind == "float":
          vec[offset + i] = float_to_bits(float(item))
        else:
          vec[offset + i] = int(item)
    return vec

  def decode_attrs(self, vec: Sequence[int]) -> dict[str, Any]:
    """Decodes an attribute vector into named Python values (tuples for wide fields)."""
    vec = np.asarray(vec, np.int32)
    out: dict[str, Any] = {}
    for name, (offset, field) in self.attr_offsets().items():
      raw = [int(v) for v in vec[offset:offset + field.width]]
      if field.kind == "float":
        vals = [bits_to_float(v) for v in raw]
      elif field.kind == "bool":
        vals = [bool(v) for v in raw]
      else:
        vals = raw
      out[name] = tuple(vals) if field.width > 1 else vals[0]
    return out


# ----------------------------------------------------------------------------------------------
# Shape helpers. All take `xp` and work on numpy values and traced jax values alike.
# ----------------------------------------------------------------------------------------------

def fixed_dtype(rule: str) -> int | None:
  """The DType code of a "dtype:<name>" dtype rule; None for any other rule."""
  if not rule.startswith("dtype:"):
    return None
  return int(DType[rule[6:].upper()])


def positions(xp: Any) -> Any:
  """int32[R]: 0..R-1."""
  return xp.arange(MAX_RANK, dtype=xp.int32)


def dim(xp: Any, shape: Any, rank: Any, axis: Any) -> Any:
  """Size of `axis` (0-based, from the front) of a right-aligned shape of `rank`."""
  idx = xp.clip(MAX_RANK - rank + axis, 0, MAX_RANK - 1)
  return shape[idx]


def set_dim(xp: Any, shape: Any, rank: Any, axis: Any, value: Any) -> Any:
  """A copy of `shape` with `axis` of a rank-`rank` tensor set to `value`."""
  return xp.where(positions(xp) == MAX_RANK - rank + axis, value, shape)


def numel(xp: Any, shape: Any) -> Any:
  """Element count of a padded shape (the padding ones do not count)."""
  return xp.prod(shape.astype(xp.float32))


def axis_mask(xp: Any, rank: Any, bits: Any) -> Any:
  """bool[R]: position p is selected when bit (p - (R - rank)) of `bits` is set."""
  axis = positions(xp) - (MAX_RANK - rank)
  valid = axis >= 0
  return valid & (((bits >> xp.clip(axis, 0, 31)) & 1) == 1)


def regather(xp: Any, shape: Any, src_pos: Any, use: Any) -> Any:
  """out[p] = shape[src_pos[p]] where use[p], else 1. Gather by one-hot (works in numpy and jit)."""
  onehot = (src_pos[:, None] == positions(xp)[None, :]) & use[:, None]
  picked = xp.sum(xp.where(onehot, shape[None, :], 0), axis=1)
  return xp.where(use, picked, 1).astype(xp.int32)


def drop_axes(xp: Any, shape: Any, rank: Any, drop: Any) -> tuple[Any, Any]:
  """Removes the positions marked in bool[R] `drop` from a shape; returns (shape, new rank)."""
  pos = positions(xp)
  live = (pos >= MAX_RANK - rank) & ~drop
  new_rank = xp.sum(live.astype(xp.int32))
  # Kept position p goes to R - new_rank + (number of kept positions before p).
  dest = MAX_RANK - new_rank + xp.cumsum(live.astype(xp.int32)) - 1
  # Invert: for every destination d, the source p with dest[p] == d and live[p].
  onehot = (dest[None, :] == pos[:, None]) & live[None, :]  # [d, p]
  src = xp.sum(xp.where(onehot, pos[None, :], 0), axis=1)
  use = xp.any(onehot, axis=1)
  return regather(xp, shape, src, use), new_rank


def broadcast_shapes(xp: Any, shapes: Any, ranks: Any, n: int) -> tuple[Any, Any, list[Check]]:
  """Numpy broadcasting of the first `n` rows of shapes[K, R]."""
  out = shapes[0]
  ok = xp.asarray(True)
  for i in range(1, n):
    s = shapes[i]
    ok = ok & xp.all((out == s) | (out == 1) | (s == 1))
    out = xp.where(out == 1, s, out)
  rank = ranks[0]
  for i in range(1, n):
    rank = xp.maximum(rank, ranks[i])
  return out.astype(xp.int32), rank, [(ok, "input shapes do not broadcast")]


def fmt_shape(shape: Sequence[int], rank: int) -> str:
  """Human-readable shape, e.g. '[1, 3, 224, 224]'."""
  shape = [int(v) for v in shape]
  return "[" + ", ".join(str(v) for v in shape[MAX_RANK - int(rank):]) + "]"


def pad_shape(shape: Sequence[int]) -> tuple[np.ndarray, int]:
  """Right-aligns a Python shape into int32[R]; returns (padded, rank)."""
  shape = [int(v) for v in shape]
  if len(shape) > MAX_RANK:
    raise UnknownOpError(f"rank {len(shape)} exceeds the maximum rank {MAX_RANK}")
  out = np.ones([MAX_RANK], np.int32)
  if shape:
    out[MAX_RANK - len(shape):] = shape
  return out, len(shape)


def unpad_shape(shape: Sequence[int], rank: int) -> tuple[int, ...]:
  """Inverse of `pad_shape`."""
  rank = int(rank)
  return tuple(int(v) for v in list(shape)[MAX_RANK - rank:]) if rank else ()


_REGISTRY: dict[int, OpSpec] = {}
_BY_NAME: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
  """Adds an op to the registry (codes and names must be unique)."""
  assert spec.code not in _REGISTRY, spec
  assert spec.name not in _BY_NAME, spec
  assert sum(f.width for f in spec.attrs) <= ATTR_WIDTH, spec.name
  rule = spec.dtype_rule
  assert (rule in ("input0", "input1") or fixed_dtype(rule) is not None
          or rule[5:] in spec.attr_offsets()), (spec.name, rule)
  _REGISTRY[spec.code] = spec
  _BY_NAME[spec.name] = spec
  return spec


def get(op: int | str) -> OpSpec:
  """The spec of an op code or name; `UnknownOpError` if there is none."""
  try:
    if isinstance(op, str):
      return _BY_NAME[op]
    return _REGISTRY[int(op)]
  except KeyError:
    known = ", ".join(sorted(_BY_NAME))
    raise UnknownOpError(f"unknown op {op!r}; known ops: {known}") from None


def all_specs() -> list[OpSpec]:
  """Every registered op, by code."""
  return [_REGISTRY[c] for c in sorted(_REGISTRY)]


INT32_MAX = 2**31 - 1


def checked_dims(dims: Sequence[Any]) -> tuple[int, ...]:
  """A user-given shape as ints: each dim an integer in [1, 2^31 - 1] and at most 2^31 - 1
  elements in all (the graph stores sizes as int32). ShapeError says which dim and why."""
  if isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence):
    raise ShapeError(f"a shape must be a sequence of ints (e.g. (1, 3, 224, 224)), got "
                     f"{dims!r}")
  out = []
  for i, d in enumerate(dims):
    if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
      raise ShapeError(f"dim {i} is {d!r}, not an integer")
    if not 1 <= int(d) <= INT32_MAX:
      raise ShapeError(f"dim {i} is {int(d)}; dims must lie in [1, {INT32_MAX}]")
    out.append(int(d))
  if math.prod(out) > INT32_MAX:
    raise ShapeError(f"shape {out} has {math.prod(out)} elements, more than {INT32_MAX} (the "
                     "graph's int32 sizes)")
  return tuple(out)

