"""Converters of the data-movement ops, as `xrlflow_jax.ops.tensor` has them: Concat, Split,
Slice, Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Gather, GatherElements, CumSum, Trilu,
TopK, Pad, Expand and Tile. Shapes, axes, pads and the like must be known on import (the
indices of Gather and GatherElements may be computed at run time); negative axes and constant
indices are normalised here."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from xrlflow_jax import ops
from xrlflow_jax.onnx_io import fold
from xrlflow_jax.onnx_io.convert.common import Const, Ctx, Operand, converter, pad_crop
from xrlflow_jax.ops import MAX_RANK, Op
from xrlflow_jax.ops.tensor import PAD_MODES


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
  return [pad_crop(ctx, x, begins, ends, mode, value)]


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
