"""Data-movement operators: Input, Constant, Concat, Slice, Reshape, Transpose, Squeeze,
Unsqueeze, Gather, Pad, Expand, Tile, GatherElements, CumSum, Trilu, TopK.

Axes are stored non-negative (importers and the builder normalise negative axes)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from xrlflow_jax.ops import spec
from xrlflow_jax.ops.codes import Op
from xrlflow_jax.ops.spec import MAX_RANK as R
from xrlflow_jax.ops.spec import AttrField, OpSpec


def _zero_flops(xp, in_shapes, in_ranks, out_shape, attrs):
  return 0.0 * spec.numel(xp, out_shape)


def _source_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  raise AssertionError("source ops carry their own shape")  # handled by ops.infer_shape


def _source_lower(inputs, a, out_shape, out_dtype):
  raise AssertionError("source ops are bound by the executor, not lowered")


INPUT = spec.register(OpSpec(
    code=Op.INPUT, name="Input", min_inputs=0, max_inputs=0, attrs=(),
    shape_rule=_source_rule, lower=_source_lower, flops=_zero_flops, source=True))
CONSTANT = spec.register(OpSpec(
    code=Op.CONSTANT, name="Constant", min_inputs=0, max_inputs=0, attrs=(),
    shape_rule=_source_rule, lower=_source_lower, flops=_zero_flops, source=True))


# ------------------------------------------------------------------ Concat

def _concat_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  axis, rank = attrs[0], in_ranks[0]
  pos = spec.positions(xp)
  at_axis = pos == R - rank + axis
  first = in_shapes[0]
  total = first
  ok = xp.asarray(True)
  for i in range(1, in_shapes.shape[0]):
    used = xp.asarray(i) < n_inputs
    s = in_shapes[i]
    same = (in_ranks[i] == rank) & xp.all(at_axis | (s == first))
    ok = ok & (~used | same)
    total = xp.where(at_axis & used, total + s, total)
  checks = [(xp.asarray((axis >= 0) & (axis < rank)), "axis out of range"),
            (xp.asarray(ok), "inputs must agree on every dimension but the concat axis")]
  return total.astype(xp.int32), rank, checks


def _concat_lower(inputs, a, out_shape, out_dtype):
  return jnp.concatenate(inputs, axis=a["axis"])


CONCAT = spec.register(OpSpec(
    code=Op.CONCAT, name="Concat", min_inputs=1, max_inputs=1 << 30, attrs=(AttrField("axis"),),
    shape_rule=_concat_rule, lower=_concat_lower, flops=_zero_flops))


# ------------------------------------------------------------------ Slice (one axis, step > 0)

def _slice_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del n_inputs
  axis, start, end, step = attrs[0], attrs[1], attrs[2], attrs[3]
  x, rank = in_shapes[0], in_ranks[0]
  size = spec.dim(xp, x, rank, axis)
  st = xp.maximum(step, 1)
  length = xp.maximum(0, (end - start + st - 1) // st)
  out = spec.set_dim(xp, x, rank, axis, length).astype(xp.int32)
  checks = [(xp.asarray((axis >= 0) & (axis < rank)), "axis out of range"),
            (xp.asarray(step >= 1), "step must be >= 1"),
            (xp.asarray((start >= 0) & (start <= end) & (end <= size)),
             "need 0 <= start <= end <= dim (the builder clamps ONNX-style indices)"),
            (xp.asarray(length >= 1), "slice is empty")]
  return out, rank, checks


def _slice_lower(inputs, a, out_shape, out_dtype):
  x = inputs[0]
  index = [slice(None)] * x.ndim
  index[a["axis"]] = slice(a["start"], a["end"], a["step"])
  return x[tuple(index)]


SLICE = spec.register(OpSpec(
    code=Op.SLICE, name="Slice", min_inputs=1, max_inputs=1,
    attrs=(AttrField("axis"), AttrField("start"), AttrField("end"), AttrField("step", default=1)),
    shape_rule=_slice_rule, lower=_slice_lower, flops=_zero_flops))


# ------------------------------------------------------------------ Reshape
# shape: the target shape right-aligned and padded with ones (as shapes are stored); rank.

def _reshape_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del n_inputs
  target = xp.asarray(attrs[0:R]).astype(xp.int32)
  rank = attrs[R]
  beyond_rank = spec.positions(xp) < R - rank
  checks = [(xp.asarray((rank >= 0) & (rank <= R)), "rank out of range"),
            (xp.asarray(xp.all(target >= 1)), "target dims must be >= 1 (-1 is resolved on build)"),
            (xp.asarray(xp.all(xp.where(beyond_rank, target == 1, True))),
             "target shape has dims beyond its rank (the padding must be ones)"),
            (xp.asarray(spec.numel(xp, target) == spec.numel(xp, in_shapes[0])),
             "element count changes")]
  return target, rank, checks


def _reshape_lower(inputs, a, out_shape, out_dtype):
  return inputs[0].reshape(out_shape)


RESHAPE = spec.register(OpSpec(
    code=Op.RESHAPE, name="Reshape", min_inputs=1, max_inputs=1,
    attrs=(AttrField("shape", R, default=(1,) * R), AttrField("rank")),
    shape_rule=_reshape_rule, lower=_reshape_lower, flops=_zero_flops))


# ------------------------------------------------------------------ Transpose
# perm: perm[i] (for i < rank) is the input axis that becomes output axis i.

def _transpose_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del n_inputs
  x, rank = in_shapes[0], in_ranks[0]
  perm = xp.asarray(attrs[0:R]).astype(xp.int32)
  pos = spec.positions(xp)
  axis = pos - (R - rank)
  use = axis >= 0
  src_axis = perm[xp.clip(axis, 0, R - 1)]
  out = spec.regather(xp, x, R - rank + src_axis, use)
  # A permutation: every axis below rank appears exactly once among perm[:rank].
  in_range = xp.where(pos < rank, (perm >= 0) & (perm < rank), True)
  hits = xp.sum(((perm[:, None] == pos[None, :]) & (pos[:, None] < rank)).astype(xp.int32), axis=0)
  is_perm = xp.all(in_range) & xp.all(xp.where(pos < rank, hits == 1, True))
  return out, rank, [(xp.asarray(is_perm), "perm is not a permutation of the input's axes")]


def _transpose_lower(inputs, a, out_shape, out_dtype):
  x = inputs[0]
  return jnp.transpose(x, a["perm"][:x.ndim])


TRANSPOSE = spec.register(OpSpec(
    code=Op.TRANSPOSE, name="Transpose", min_inputs=1, max_inputs=1,
    attrs=(AttrField("perm", R, default=tuple(range(R))),),
    shape_rule=_transpose_rule, lower=_transpose_lower, flops=_zero_flops))


# ------------------------------------------------------------------ Squeeze / Unsqueeze
# axes: bit mask; for Squeeze over the input's axes, for Unsqueeze over the output's axes.

def _squeeze_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del n_inputs
  x, rank, bits = in_shapes[0], in_ranks[0], attrs[0]
  mask = spec.axis_mask(xp, rank, bits)
  out, out_rank = spec.drop_axes(xp, x, rank, mask)
  checks = [(xp.asarray((bits >= 1) & (bits < (1 << rank))), "axes must name existing axes"),
            (xp.asarray(xp.all(xp.where(mask, x == 1, True))), "squeezed dims must be 1")]
  return out, out_rank, checks


def _squeeze_lower(inputs, a, out_shape, out_dtype):
  return inputs[0].reshape(out_shape)


SQUEEZE = spec.register(OpSpec(
    code=Op.SQUEEZE, name="Squeeze", min_inputs=1, max_inputs=1, attrs=(AttrField("axes"),),
    shape_rule=_squeeze_rule, lower=_squeeze_lower, flops=_zero_flops))


def _popcount(xp, bits, below):
  """Number of set bits of `bits` at positions < below (both may be arrays)."""
  idx = xp.arange(32, dtype=xp.int32)
  set_bits = ((bits >> idx) & 1) == 1
  return xp.sum((set_bits[None, :] & (idx[None, :] < xp.reshape(below, (-1, 1)))).astype(xp.int32),
                axis=1)


def _unsqueeze_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del n_inputs
  x, rank, bits = in_shapes[0], in_ranks[0], attrs[0]
  added = _popcount(xp, bits, xp.asarray([32]))[0]
  out_rank = rank + added
  pos = spec.positions(xp)
  axis = pos - (R - out_rank)
  is_new = (axis >= 0) & (((bits >> xp.clip(axis, 0, 31)) & 1) == 1)
  src_axis = axis - _popcount(xp, bits, axis)
  use = (axis >= 0) & ~is_new
  out = spec.regather(xp, x, R - rank + src_axis, use)
  checks = [(xp.asarray((bits >= 1) & (out_rank <= R) & (bits < (1 << xp.minimum(out_rank, 30)))),
             "axes out of range for the output rank")]
  return out, out_rank, checks


UNSQUEEZE = spec.register(OpSpec(
    code=Op.UNSQUEEZE, name="Unsqueeze", min_inputs=1, max_inputs=1, attrs=(AttrField("axes"),),
    shape_rule=_unsqueeze_rule, lower=_squeeze_lower, flops=_zero_flops))


# ------------------------------------------------------------------ Gather
# out = data.shape[:axis] + indices.shape + data.shape[axis + 1:]

def _gather_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del n_inputs
  data, dr = in_shapes[0], in_ranks[0]
  idx, ir = in_shapes[1], in_ranks[1]
  axis = attrs[0]
  out_rank = dr + ir - 1
  pos = spec.positions(xp)
  a = pos - (R - out_rank)
  valid = a >= 0
  from_idx = valid & (a >= axis) & (a < axis + ir)
  from_data = valid & ~from_idx
  data_axis = xp.where(a < axis, a, a - ir + 1)
  out_data = spec.regather(xp, data, R - dr + data_axis, from_data)
  out_idx = spec.regather(xp, idx, R - ir + (a - axis), from_idx)
  out = xp.where(from_idx, out_idx, out_data).astype(xp.int32)
  checks = [(xp.asarray((axis >= 0) & (axis < dr)), "axis out of range"),
            (xp.asarray(out_rank <= R), "output rank exceeds the maximum rank")]
  return out, out_rank, checks


def _gather_lower(inputs, a, out_shape, out_dtype):
  data, idx = inputs
  size = data.shape[a["axis"]]
  idx = jnp.where(idx < 0, idx + size, idx)  # ONNX allows negative indices
  return jnp.take(data, idx, axis=a["axis"])


GATHER = spec.register(OpSpec(
    code=Op.GATHER, name="Gather", min_inputs=2, max_inputs=2, attrs=(AttrField("axis"),),
    shape_rule=_gather_rule, lower=_gather_lower, flops=_zero_flops))


# ------------------------------------------------------------------ Pad
# pads: begin for axes 0..R-1, then end for axes 0..R-1 (by axis index, not position).

PAD_MODES = ("constant", "reflect", "edge")


def _pad_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del n_inputs
  x, rank = in_shapes[0], in_ranks[0]
  pads = xp.asarray(attrs[0:2 * R]).astype(xp.int32)
  pos = spec.positions(xp)
  axis = xp.clip(pos - (R - rank), 0, R - 1)
  live = pos >= R - rank
  grow = xp.where(live, pads[axis] + pads[R + axis], 0)
  out = (x + grow).astype(xp.int32)
  unused_zero = xp.all(xp.where(pos >= rank, (pads[:R] == 0) & (pads[R:] == 0), True))
  checks = [(xp.asarray(xp.all(pads >= 0)), "pads must be >= 0 (negative pads are slices)"),
            (xp.asarray(unused_zero), "pads given for axes beyond the rank"),
            (xp.asarray((attrs[2 * R] >= 0) & (attrs[2 * R] < len(PAD_MODES))), "unknown mode")]
  return out, rank, checks


def _pad_lower(inputs, a, out_shape, out_dtype):
  x = inputs[0]
  pads = a["pads"]
  widths = [(pads[i], pads[R + i]) for i in range(x.ndim)]
  mode = PAD_MODES[a["mode"]]
  if mode == "constant":
    return jnp.pad(x, widths, constant_values=np.asarray(a["value"]).astype(x.dtype))
  return jnp.pad(x, widths, mode=mode)


PAD = spec.register(OpSpec(
    code=Op.PAD, name="Pad", min_inputs=1, max_inputs=1,
    attrs=(AttrField("pads", 2 * R, default=(0,) * (2 * R)), AttrField("mode"),
           AttrField("value", kind="float", default=0.0)),
    shape_rule=_pad_rule, lower=_pad_lower, flops=_zero_flops))


# ------------------------------------------------------------------ Expand
# shape: the output shape, right-aligned and padded with ones (as Reshape stores it); rank. The
# input broadcasts to it (numpy rules: each of its dims equals the output's or is 1).

def _expand_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del n_inputs
  x, xr = in_shapes[0], in_ranks[0]
  target = xp.asarray(attrs[0:R]).astype(xp.int32)
  rank = attrs[R]
  beyond_rank = spec.positions(xp) < R - rank
  checks = [(xp.asarray((rank >= xr) & (rank <= R)), "rank must lie in [input rank, 6]"),
            (xp.asarray(xp.all(target >= 1)), "target dims must be >= 1"),
            (xp.asarray(xp.all(xp.where(beyond_rank, target == 1, True))),
             "target shape has dims beyond its rank (the padding must be ones)"),
            (xp.asarray(xp.all((x == target) | (x == 1))),
             "the input does not broadcast to the target shape")]
  return target, rank, checks


EXPAND = spec.register(OpSpec(
    code=Op.EXPAND, name="Expand", min_inputs=1, max_inputs=1,
    attrs=(AttrField("shape", R, default=(1,) * R), AttrField("rank")),
    shape_rule=_expand_rule,
    lower=lambda inputs, a, out_shape, out_dtype: jnp.broadcast_to(inputs[0], out_shape),
    flops=_zero_flops))


# ------------------------------------------------------------------ Tile
# reps: repeats per axis, right-aligned like a shape and padded with ones; out = x * reps.

def _tile_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del n_inputs
  x, rank = in_shapes[0], in_ranks[0]
  reps = xp.asarray(attrs[0:R]).astype(xp.int32)
  beyond_rank = spec.positions(xp) < R - rank
  checks = [(xp.asarray(xp.all(reps >= 1)), "repeats must be >= 1"),
            (xp.asarray(xp.all(xp.where(beyond_rank, reps == 1, True))),
             "repeats given for axes beyond the rank")]
  return (x * reps).astype(xp.int32), rank, checks


TILE = spec.register(OpSpec(
    code=Op.TILE, name="Tile", min_inputs=1, max_inputs=1,
    attrs=(AttrField("reps", R, default=(1,) * R),),
    shape_rule=_tile_rule,
    lower=lambda inputs, a, out_shape, out_dtype: jnp.tile(
        inputs[0], a["reps"][R - inputs[0].ndim:] if inputs[0].ndim else ()),
    flops=_zero_flops))


# ------------------------------------------------------------------ GatherElements
# out[i...] = data[i... with axis replaced by indices[i...]]: out has the indices' shape, the
# data's rank; off the axis, the indices' dims may not exceed the data's.

def _gather_elements_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del n_inputs
  data, dr = in_shapes[0], in_ranks[0]
  idx, ir = in_shapes[1], in_ranks[1]
  axis = attrs[0]
  at_axis = spec.positions(xp) == R - dr + axis
  checks = [(xp.asarray((axis >= 0) & (axis < dr)), "axis out of range"),
            (xp.asarray(ir == dr), "indices must have the data's rank"),
            (xp.asarray(xp.all(at_axis | (idx <= data))),
             "indices dims off the axis must not exceed the data's")]
  return idx.astype(xp.int32), ir, checks


def _gather_elements_lower(inputs, a, out_shape, out_dtype):
  data, idx = inputs
  axis = a["axis"]
  # Off the axis, output position j reads data at j: crop the data to the indices' dims.
  crop = tuple(slice(None) if d == axis else slice(0, idx.shape[d]) for d in range(data.ndim))
  data = data[crop]
  size = data.shape[axis]
  idx = jnp.where(idx < 0, idx + size, idx)  # ONNX allows negative indices
  return jnp.take_along_axis(data, idx.astype(jnp.int32), axis=axis)


GATHER_ELEMENTS = spec.register(OpSpec(
    code=Op.GATHER_ELEMENTS, name="GatherElements", min_inputs=2, max_inputs=2,
    attrs=(AttrField("axis"),), shape_rule=_gather_elements_rule, lower=_gather_elements_lower,
    flops=_zero_flops))


# ------------------------------------------------------------------ CumSum (one axis)

def _axis_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  """Same shape; attrs[0] is an axis of the input."""
  del n_inputs
  axis = attrs[0]
  return in_shapes[0].astype(xp.int32), in_ranks[0], [
      (xp.asarray((axis >= 0) & (axis < in_ranks[0])), "axis out of range")]


def _cumsum_lower(inputs, a, out_shape, out_dtype):
  x = inputs[0]
  axis = a["axis"]
  if a["reverse"]:
    x = jnp.flip(x, axis)
  y = jnp.cumsum(x, axis=axis, dtype=x.dtype)
  if a["exclusive"]:  # shift by one: element i sums the elements before i
    pad = [(0, 0)] * x.ndim
    pad[axis] = (1, 0)
    y = jnp.pad(y, pad)[tuple(slice(0, n) for n in x.shape)]
  return jnp.flip(y, axis) if a["reverse"] else y


CUMSUM = spec.register(OpSpec(
    code=Op.CUMSUM, name="CumSum", min_inputs=1, max_inputs=1,
    attrs=(AttrField("axis"), AttrField("exclusive", kind="bool", default=False),
           AttrField("reverse", kind="bool", default=False)),
    shape_rule=_axis_rule, lower=_cumsum_lower,
    flops=lambda xp, in_shapes, in_ranks, out_shape, attrs: spec.numel(xp, out_shape)))


# ------------------------------------------------------------------ Trilu (last two axes)

def _trilu_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del attrs, n_inputs
  return in_shapes[0].astype(xp.int32), in_ranks[0], [
      (xp.asarray(in_ranks[0] >= 2), "input must have rank >= 2")]


def _trilu_lower(inputs, a, out_shape, out_dtype):
  x = inputs[0]
  return jnp.triu(x, a["k"]) if a["upper"] else jnp.tril(x, a["k"])


TRILU = spec.register(OpSpec(
    code=Op.TRILU, name="Trilu", min_inputs=1, max_inputs=1,
    attrs=(AttrField("upper", kind="bool", default=True), AttrField("k")),
    shape_rule=_trilu_rule, lower=_trilu_lower, flops=_zero_flops))


# ------------------------------------------------------------------ TopK (constant k)
# Two ops, one per ONNX output (values keep the dtype, indices are int64); both sort (ONNX's
# sorted=0 allows any order), equal values by lower index first.

def _top_k_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del n_inputs
  x, rank = in_shapes[0], in_ranks[0]
  axis, k = attrs[0], attrs[1]
  size = spec.dim(xp, x, rank, axis)
  checks = [(xp.asarray((axis >= 0) & (axis < rank)), "axis out of range"),
            (xp.asarray((k >= 1) & (k <= size)), "k must lie in [1, dim of the axis]")]
  return spec.set_dim(xp, x, rank, axis, k).astype(xp.int32), rank, checks


def _top_k(x, a):
  axis, k = a["axis"], a["k"]
  moved = jnp.moveaxis(x, axis, -1)
  values, indices = jax.lax.top_k(moved if a["largest"] else -moved, k)
  if not a["largest"]:
    values = -values
  return jnp.moveaxis(values, -1, axis), jnp.moveaxis(indices, -1, axis)


_TOP_K_ATTRS = (AttrField("axis"), AttrField("k", default=1),
                AttrField("largest", kind="bool", default=True))
TOP_K_VALUES = spec.register(OpSpec(
    code=Op.TOP_K_VALUES, name="TopKValues", min_inputs=1, max_inputs=1, attrs=_TOP_K_ATTRS,
    shape_rule=_top_k_rule,
    lower=lambda inputs, a, out_shape, out_dtype: _top_k(inputs[0], a)[0],
    flops=lambda xp, in_shapes, in_ranks, out_shape, attrs: 4.0 * spec.numel(xp, in_shapes[0])))
TOP_K_INDICES = spec.register(OpSpec(
    code=Op.TOP_K_INDICES, name="TopKIndices", min_inputs=1, max_inputs=1, attrs=_TOP_K_ATTRS,
    shape_rule=_top_k_rule,
    lower=lambda inputs, a, out_shape, out_dtype: _top_k(inputs[0], a)[1].astype(
        jax.dtypes.canonicalize_dtype(out_dtype)),
    flops=TOP_K_VALUES.flops, dtype_rule="dtype:int64"))
