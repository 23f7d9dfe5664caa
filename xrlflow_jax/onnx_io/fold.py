"""Constant folding of ONNX nodes on the host.

Every node whose inputs are all known constants (initializers, Constant nodes, shapes of
statically shaped tensors, and whatever was computed from those) is evaluated here once on
import. The ops that real exporters use for shape arithmetic and weight pre-processing are
evaluated with numpy directly (fast: an unoptimised export has hundreds of them); any other
deterministic op falls back to the ONNX reference implementation (`onnx.reference`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import onnx
from onnx import helper

from xrlflow_jax.errors import OnnxImportError
from xrlflow_jax.onnx_io.common import onnx_to_numpy_dtype

# Folded values larger than this are refused (a corrupt shape must not exhaust memory).
MAX_FOLD_ELEMENTS = 1 << 27

# Ops never folded: their result is random, or they have sub-graphs, or they are stateful.
NOT_FOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                "Multinomial", "Bernoulli", "If", "Loop", "Scan", "SequenceMap"}

Arrays = list[np.ndarray | None]


def check_size(shape: Sequence[int], where: str) -> None:
  """Refuses negative dims and constants over MAX_FOLD_ELEMENTS (OnnxImportError)."""
  total = 1
  for d in shape:
    if int(d) < 0:
      raise OnnxImportError(f"{where}negative dimension in shape {list(shape)}")
    total *= int(d)
  if total > MAX_FOLD_ELEMENTS:
    raise OnnxImportError(f"{where}folding would create a constant of shape {list(shape)} "
                          f"({total} elements, limit {MAX_FOLD_ELEMENTS})")


def _axes(value: Any, rank: int, where: str) -> list[int]:
  axes = [int(a) for a in np.asarray(value).reshape(-1)]
  for a in axes:
    if not -rank <= a < rank:
      raise OnnxImportError(f"{where}axis {a} is out of range for rank {rank}")
  return [a % rank for a in axes]


def _reshape(x: np.ndarray, shape: np.ndarray, allowzero: int, where: str) -> np.ndarray:
  target = [int(s) for s in np.asarray(shape).reshape(-1)]
  out = []
  for i, s in enumerate(target):
    if s == 0 and not allowzero:
      if i >= x.ndim:
        raise OnnxImportError(f"{where}shape {target} copies dim {i} of a rank-{x.ndim} input")
      s = x.shape[i]
    out.append(s)
  if out.count(-1) > 1 or any(s < -1 for s in out):
    raise OnnxImportError(f"{where}invalid target shape {target}")
  if -1 in out:
    known = int(np.prod([s for s in out if s != -1]))
    if known == 0 or x.size % known:
      raise OnnxImportError(f"{where}cannot reshape {list(x.shape)} to {target}")
    out[out.index(-1)] = x.size // known
  if int(np.prod(out)) != x.size:
    raise OnnxImportError(f"{where}cannot reshape {list(x.shape)} to {target}")
  return x.reshape(out)


def onnx_slice(dim: int, start: int, end: int, step: int) -> range:
  """The indices ONNX Slice picks from an axis of size `dim` (its clamping rules)."""
  if step == 0:
    raise ValueError("step must not be 0")
  if start < 0:
    start += dim
  if end < 0:
    end += dim
  if step > 0:
    start = min(max(start, 0), dim)
    end = min(max(end, 0), dim)
  else:
    start = min(max(start, 0), dim - 1)
    end = min(max(end, -1), dim - 1)
  return range(start, end, step)


def _slice(x: np.ndarray, starts, ends, axes, steps, where: str) -> np.ndarray:
  starts = [int(v) for v in np.asarray(starts).reshape(-1)]
  ends = [int(v) for v in np.asarray(ends).reshape(-1)]
  axes = (_axes(axes, x.ndim, where) if axes is not None else list(range(len(starts))))
  steps = ([int(v) for v in np.asarray(steps).reshape(-1)] if steps is not None
           else [1] * len(starts))
  if not len(starts) == len(ends) == len(axes) == len(steps) or len(set(axes)) != len(axes):
    raise OnnxImportError(f"{where}starts/ends/axes/steps disagree in length or repeat an axis")
  index: list[Any] = [slice(None)] * x.ndim
  for a, s, e, st in zip(axes, starts, ends, steps):
    if st == 0:
      raise OnnxImportError(f"{where}slice step 0")
    r = onnx_slice(x.shape[a], s, e, st)
    index[a] = np.asarray(list(r), np.int64) if st < 0 else slice(r.start, r.stop, r.step)
  out = x
  for a, idx in enumerate(index):  # one axis at a time, so index arrays do not combine
    if not (isinstance(idx, slice) and idx == slice(None)):
      sel: list[Any] = [slice(None)] * x.ndim
      sel[a] = idx
      out = out[tuple(sel)]
  return out


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  if np.any(b == 0):
    raise ZeroDivisionError("integer division by zero")
  q = np.abs(a) // np.abs(b)
  return (np.sign(a) * np.sign(b) * q).astype(np.result_type(a, b))


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], keep_dtype: bool = True):
  def run(inputs: Arrays, attrs: dict[str, Any], where: str) -> list[np.ndarray]:
    a, b = inputs[0], inputs[1]
    out = np.asarray(fn(a, b))
    return [out.astype(a.dtype) if keep_dtype else out]
  return run


def _div(inputs: Arrays, attrs: dict[str, Any], where: str) -> list[np.ndarray]:
  a, b = inputs[0], inputs[1]
  if np.issubdtype(a.dtype, np.integer):
    return [_int_div(a, b)]
  with np.errstate(divide="ignore", invalid="ignore"):
    return [np.asarray(a / b).astype(a.dtype)]


def _variadic(fn):
  def run(inputs: Arrays, attrs: dict[str, Any], where: str) -> list[np.ndarray]:
    xs = [x for x in inputs if x is not None]
    out = xs[0]
    for x in xs[1:]:
      out = fn(out, x)
    return [np.asarray(out).astype(xs[0].dtype)]
  return run


def _unary(fn):
  def run(inputs: Arrays, attrs: dict[str, Any], where: str) -> list[np.ndarray]:
    with np.errstate(all="ignore"):
      return [np.asarray(fn(inputs[0])).astype(inputs[0].dtype)]
  return run


def _dropout(inputs: Arrays, where: str) -> np.ndarray:
  if len(inputs) > 2 and inputs[2] is not None and bool(np.asarray(inputs[2]).reshape(-1)[0]):
    raise OnnxImportError(f"{where}Dropout in training mode has no fixed result")
  return inputs[0]


def _cast(inputs: Arrays, attrs: dict[str, Any], where: str) -> list[np.ndarray]:
  return [inputs[0].astype(onnx_to_numpy_dtype(int(attrs["to"]), where))]


def shape_of(shape: Sequence[int], attrs: dict[str, Any]) -> np.ndarray:
  """ONNX Shape of a tensor of `shape` (with the start/end attributes of opset 15): int64[k]."""
  shape = list(shape)
  start = int(attrs.get("start", 0))
  end = attrs.get("end")
  return np.asarray(shape[slice(start, None if end is None else int(end))], np.int64)


def _constant_of_shape(inputs: Arrays, attrs: dict[str, Any], where: str) -> list[np.ndarray]:
  shape = [int(s) for s in np.asarray(inputs[0]).reshape(-1)]
  check_size(shape, where)
  value = attrs.get("value")
  value = np.zeros([1], np.float32) if value is None else np.asarray(value)
  if value.size != 1:
    raise OnnxImportError(f"{where}ConstantOfShape value must hold one element")
  return [np.full(shape, value.reshape(-1)[0], dtype=value.dtype)]


def _expand(inputs: Arrays, attrs: dict[str, Any], where: str) -> list[np.ndarray]:
  x, shape = inputs[0], [int(s) for s in np.asarray(inputs[1]).reshape(-1)]
  try:
    out_shape = np.broadcast_shapes(x.shape, tuple(shape))
  except ValueError:
    raise OnnxImportError(f"{where}cannot expand {list(x.shape)} to {shape}") from None
  check_size(out_shape, where)
  return [np.broadcast_to(x, out_shape).copy()]


def _tile(inputs: Arrays, attrs: dict[str, Any], where: str) -> list[np.ndarray]:
  x, reps = inputs[0], [int(r) for r in np.asarray(inputs[1]).reshape(-1)]
  if len(reps) != x.ndim or any(r < 0 for r in reps):
    raise OnnxImportError(f"{where}repeats {reps} do not fit a rank-{x.ndim} input")
  check_size([d * r for d, r in zip(x.shape, reps)], where)
  return [np.tile(x, reps)]


def _range(inputs: Arrays, attrs: dict[str, Any], where: str) -> list[np.ndarray]:
  start, limit, delta = (np.asarray(v).reshape(()) for v in inputs[:3])
  if delta == 0:
    raise OnnxImportError(f"{where}Range delta is 0")
  count = max(int(np.ceil((limit - start) / delta)), 0)
  check_size([count], where)
  return [(start + np.arange(count) * delta).astype(start.dtype)]


def _gather(inputs: Arrays, attrs: dict[str, Any], where: str) -> list[np.ndarray]:
  data, idx = inputs[0], np.asarray(inputs[1])
  axis = _axes(attrs.get("axis", 0), data.ndim, where)[0]
  size = data.shape[axis]
  if idx.size and (idx.min() < -size or idx.max() >= size):
    raise OnnxImportError(f"{where}Gather indices out of range for axis {axis} of size {size}")
  return [np.take(data, np.where(idx < 0, idx + size, idx).astype(np.int64), axis=axis)]


def _gather_elements(inputs: Arrays, attrs: dict[str, Any], where: str) -> list[np.ndarray]:
  data, idx = inputs[0], np.asarray(inputs[1]).astype(np.int64)
  axis = _axes(attrs.get("axis", 0), data.ndim, where)[0]
  if idx.ndim != data.ndim:
    raise OnnxImportError(f"{where}indices rank {idx.ndim} differs from data rank {data.ndim}")
  size = data.shape[axis]
  if idx.size and (idx.min() < -size or idx.max() >= size):
    raise OnnxImportError(f"{where}GatherElements indices out of range for axis {axis} of size "
                          f"{size}")
  return [np.take_along_axis(data, np.where(idx < 0, idx + size, idx), axis=axis)]


def _squeeze(inputs: Arrays, attrs: dict[str, Any], where: str) -> list[np.ndarray]:
  x = inputs[0]
  axes = inputs[1] if len(inputs) > 1 and inputs[1] is not None else attrs.get("axes")
  if axes is None:
    return [x.reshape([d for d in x.shape if d != 1])]
  axes = _axes(axes, x.ndim, where)
  if any(x.shape[a] != 1 for a in axes):
    raise OnnxImportError(f"{where}cannot squeeze axes {axes} of {list(x.shape)}")
  return [np.squeeze(x, axis=tuple(axes))]


def _unsqueeze(inputs: Arrays, attrs: dict[str, Any], where: str) -> list[np.ndarray]:
  x = inputs[0]
  axes = inputs[1] if len(inputs) > 1 and inputs[1] is not None else attrs.get("axes")
  if axes is None:
    raise OnnxImportError(f"{where}Unsqueeze needs axes")
  n = np.asarray(axes).size
  axes = sorted(_axes(axes, x.ndim + n, where))
  if len(set(axes)) != len(axes):
    raise OnnxImportError(f"{where}Unsqueeze axes repeat")
  out = x
  for a in axes:
    out = np.expand_dims(out, a)
  return [out]


def _concat(inputs: Arrays, attrs: dict[str, Any], where: str) -> list[np.ndarray]:
  xs = [x for x in inputs if x is not None]
  axis = _axes(attrs.get("axis", 0), max(xs[0].ndim, 1), where)[0]
  return [np.concatenate(xs, axis=axis).astype(xs[0].dtype)]


def _transpose(inputs: Arrays, attrs: dict[str, Any], where: str) -> list[np.ndarray]:
  x = inputs[0]
  perm = attrs.get("perm")
  perm = list(range(x.ndim))[::-1] if perm is None else [int(p) for p in perm]
  if sorted(p % max(x.ndim, 1) for p in perm) != list(range(x.ndim)):
    raise OnnxImportError(f"{where}perm {perm} is not a permutation of {x.ndim} axes")
  return [np.transpose(x, perm)]


def _flatten(inputs: Arrays, attrs: dict[str, Any], where: str) -> list[np.ndarray]:
  x = inputs[0]
  axis = int(attrs.get("axis", 1))
  if not -x.ndim <= axis <= x.ndim:
    raise OnnxImportError(f"{where}axis {axis} out of range for rank {x.ndim}")
  if axis < 0:
    axis += x.ndim
  return [x.reshape(int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])))]


def _where(inputs: Arrays, attrs: dict[str, Any], where: str) -> list[np.ndarray]:
  return [np.where(inputs[0], inputs[1], inputs[2]).astype(inputs[1].dtype)]


def _matmul(inputs: Arrays, attrs: dict[str, Any], where: str) -> list[np.ndarray]:
  return [np.matmul(inputs[0], inputs[1]).astype(inputs[0].dtype)]


_NUMPY_OPS: dict[str, Callable[[Arrays, dict[str, Any], str], list[np.ndarray]]] = {
    "Identity": lambda i, a, w: [i[0]],
    "Dropout": lambda i, a, w: [_dropout(i, w)],
    "Cast": _cast,
    "CastLike": lambda i, a, w: [i[0].astype(i[1].dtype)],
    "Shape": lambda i, a, w: [shape_of(i[0].shape, a)],
    "Size": lambda i, a, w: [np.asarray(i[0].size, np.int64)],
    "Reshape": lambda i, a, w: [_reshape(i[0], i[1], int(a.get("allowzero", 0)), w)],
    "Flatten": _flatten,
    "Transpose": _transpose,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Concat": _concat,
    "Gather": _gather,
    "GatherElements": _gather_elements,
    "Slice": lambda i, a, w: [_slice(i[0], i[1], i[2], i[3] if len(i) > 3 else None,
                                     i[4] if len(i) > 4 else None, w)],
    "Expand": _expand,
    "Tile": _tile,
    "ConstantOfShape": _constant_of_shape,
    "Range": _range,
    "Add": _binary(np.add), "Sub": _binary(np.subtract), "Mul": _binary(np.multiply),
    "Div": _div, "Pow": _binary(np.power),
    "Equal": _binary(np.equal, False), "Less": _binary(np.less, False),
    "Greater": _binary(np.greater, False), "LessOrEqual": _binary(np.less_equal, False),
    "GreaterOrEqual": _binary(np.greater_equal, False),
    "And": _binary(np.logical_and, False), "Or": _binary(np.logical_or, False),
    "Xor": _binary(np.logical_xor, False),
    "Not": lambda i, a, w: [np.logical_not(i[0])],
    "Where": _where,
    "Max": _variadic(np.maximum), "Min": _variadic(np.minimum), "Sum": _variadic(np.add),
    "Neg": _unary(np.negative), "Abs": _unary(np.abs), "Sqrt": _unary(np.sqrt),
    "Exp": _unary(np.exp), "Log": _unary(np.log), "Reciprocal": _unary(np.reciprocal),
    "Floor": _unary(np.floor), "Ceil": _unary(np.ceil), "Sign": _unary(np.sign),
    "Relu": _unary(lambda x: np.maximum(x, 0)),
    "Tanh": _unary(np.tanh),
    "MatMul": _matmul,
}


def _reference(node: onnx.NodeProto, inputs: Arrays, opset: int, where: str) -> list[np.ndarray]:
  from onnx.reference import ReferenceEvaluator  # pylint: disable=g-import-not-at-top
  names = [f"in{i}" if x is not None else "" for i, x in enumerate(inputs)]
  while names and not names[-1]:
    names.pop()
  outs = [f"out{i}" for i in range(len(node.output))]
  clone = helper.make_node(node.op_type, names, outs, domain=node.domain)
  clone.attribute.extend(node.attribute)
  feeds = {n: x for n, x in zip(names, inputs) if n}
  evaluator = ReferenceEvaluator(clone, opsets={"": opset})
  return [np.asarray(v) for v in evaluator.run(None, feeds)]


def evaluate(node: onnx.NodeProto, inputs: Arrays, attrs: dict[str, Any], opset: int,
             where: str) -> list[np.ndarray]:
  """Evaluates one node on constant inputs; returns one array per node output.

  Args:
    node: the node (its op_type and attributes).
    inputs: one array per input slot, None for an absent optional input.
    attrs: the node's decoded attributes.
    opset: the model's default-domain opset.
    where: error-message prefix naming file, node and op.
  Raises:
    OnnxImportError: the op cannot be evaluated on these inputs (the message says why).
  """
  op = node.op_type
  if op in NOT_FOLDABLE or node.domain not in ("", "ai.onnx"):
    raise OnnxImportError(f"{where}{op} cannot be evaluated on import")
  try:
    fn = _NUMPY_OPS.get(op)
    if fn is not None and not (op == "Dropout" and len(node.output) > 1):
      outs = fn(inputs, attrs, where)
    else:
      outs = _reference(node, inputs, opset, where)
  except OnnxImportError:
    raise
  except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, AttributeError,
          RuntimeError, NotImplementedError, OverflowError, MemoryError) as e:
    shapes = ", ".join("-" if x is None else f"{x.dtype}{list(x.shape)}" for x in inputs)
    raise OnnxImportError(f"{where}constant folding failed on inputs ({shapes}): "
                          f"{type(e).__name__}: {e}") from None
  for o in outs:
    check_size(np.shape(o), where)
  return [np.asarray(o) for o in outs]
