"""Neural-network operators: Conv2D, MatMul, pooling, normalisation (Softmax, LogSoftmax,
LayerNorm, BatchNorm), reductions (Mean, Sum, Max, Min, Prod, L1, L2, LogSumExp; ArgMax, ArgMin)
and TASO's weight transforms (Enlarge, MergeGConv)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from xrlflow_jax.ops import precision, spec
from xrlflow_jax.ops.codes import Op
from xrlflow_jax.ops.spec import MAX_RANK as R
from xrlflow_jax.ops.spec import Activation, AttrField, Impl, Layout, OpSpec


def apply_activation(x: jax.Array, activation: int) -> jax.Array:
  """Applies a fused `Activation` code."""
  activation = Activation(int(activation))
  if activation == Activation.NONE:
    return x
  if activation == Activation.RELU:
    return jax.nn.relu(x)
  if activation == Activation.SIGMOID:
    return jax.nn.sigmoid(x)
  if activation == Activation.TANH:
    return jnp.tanh(x)
  return jax.nn.gelu(x, approximate=False)


_ACT = AttrField("activation", default=int(Activation.NONE))
_LAYOUT = AttrField("layout", default=int(Layout.NCHW))  # `Layout`


def _offset(fields: tuple[AttrField, ...], name: str) -> int:
  """The position of attribute `name` in the vector of `fields` (as `OpSpec.attr_offsets`)."""
  names = [f.name for f in fields]
  return sum(f.width for f in fields[:names.index(name)])


def _layout_check(xp, layout) -> spec.Check:
  return (xp.asarray((layout == Layout.NCHW) | (layout == Layout.NHWC)),
          "layout must be NCHW or NHWC")


def _impl_check(xp, impl) -> spec.Check:
  return xp.asarray((impl == Impl.XLA) | (impl == Impl.TAPS)), "impl must be XLA (0) or TAPS (1)"


# ------------------------------------------------------------------ Conv2D
# x [N, C, H, W], w [O, C/groups, kh, kw], optional bias [O] -> [N, O, Ho, Wo]; with layout
# NHWC: x [N, H, W, C], w [kh, kw, C/groups, O] -> [N, Ho, Wo, O]. `impl` (`Impl`) chooses
# how it is lowered, not what it computes.

_CONV_ATTRS = (AttrField("strides", 2, default=(1, 1)), AttrField("pads", 4, default=(0, 0, 0, 0)),
               AttrField("dilations", 2, default=(1, 1)), AttrField("groups", default=1), _ACT,
               _LAYOUT, AttrField("impl", default=int(Impl.XLA)))
_CONV_LAYOUT = _offset(_CONV_ATTRS, "layout")
_CONV_IMPL = _offset(_CONV_ATTRS, "impl")


def _conv_out(xp, size, pad, kernel, stride, dilation):
  stride = xp.maximum(stride, 1)
  return (size + pad - dilation * (kernel - 1) - 1) // stride + 1


def _conv_shared_checks(xp, in_shapes, in_ranks, n_inputs, groups, sh, sw, dh, dw, o):
  """Checks Conv2D and ConvTranspose share: ranks, groups, strides/dilations, the bias."""
  bias = in_shapes[2] if in_shapes.shape[0] > 2 else in_shapes[0]
  bias_rank = in_ranks[2] if in_shapes.shape[0] > 2 else 1
  has_bias = xp.asarray(n_inputs) >= 3
  return [
      (xp.asarray((in_ranks[0] == 4) & (in_ranks[1] == 4)), "input and weight must be rank 4"),
      (xp.asarray(groups >= 1), "groups must be >= 1"),
      (xp.asarray((sh >= 1) & (sw >= 1) & (dh >= 1) & (dw >= 1)),
       "strides and dilations must be >= 1"),
      (xp.asarray(~has_bias | ((bias_rank == 1) & (bias[R - 1] == o))),
       "bias must be rank 1 with one value per output channel"),
  ]


def _conv_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  x, w = in_shapes[0], in_shapes[1]
  sh, sw, pt, pl, pb, pr, dh, dw, groups = (attrs[i] for i in range(9))
  nhwc = attrs[_CONV_LAYOUT] == Layout.NHWC
  n = x[R - 4]
  # NCHW: x [N, C, H, W], w [O, C/g, kh, kw]; NHWC: x [N, H, W, C], w [kh, kw, C/g, O].
  c, h, wd = (xp.where(nhwc, x[R - 1], x[R - 3]), xp.where(nhwc, x[R - 3], x[R - 2]),
              xp.where(nhwc, x[R - 2], x[R - 1]))
  o, cg = xp.where(nhwc, w[R - 1], w[R - 4]), xp.where(nhwc, w[R - 2], w[R - 3])
  kh, kw = xp.where(nhwc, w[R - 4], w[R - 2]), xp.where(nhwc, w[R - 3], w[R - 1])
  ho = _conv_out(xp, h, pt + pb, kh, sh, dh)
  wo = _conv_out(xp, wd, pl + pr, kw, sw, dw)
  one = xp.ones_like(n)
  out = xp.where(nhwc, xp.stack([one, one, n, ho, wo, o]),
                 xp.stack([one, one, n, o, ho, wo])).astype(xp.int32)
  g = xp.maximum(groups, 1)
  checks = _conv_shared_checks(xp, in_shapes, in_ranks, n_inputs, groups, sh, sw, dh, dw, o) + [
      (xp.asarray((pt >= 0) & (pl >= 0) & (pb >= 0) & (pr >= 0)), "pads must be >= 0"),
      (xp.asarray(c == cg * g), "input channels must equal weight in-channels x groups"),
      (xp.asarray(o % g == 0), "output channels must be divisible by groups"),
      (xp.asarray((ho >= 1) & (wo >= 1)), "kernel larger than the padded input"),
      _layout_check(xp, attrs[_CONV_LAYOUT]),
      _impl_check(xp, attrs[_CONV_IMPL]),
  ]
  return out, xp.asarray(4, xp.int32), checks


def _conv_taps(x: jax.Array, w: jax.Array, a: dict[str, Any], nhwc: bool,
               out_shape: tuple[int, ...]) -> jax.Array:
  """Conv2D as a sum over kernel taps (`Impl.TAPS`), in x's layout and without bias.

  x: [N, C, H, W] (NHWC: [N, H, W, C]); w: [O, C/G, kh, kw] (NHWC: [kh, kw, C/G, O]);
  out_shape: the node's [N, O, Ho, Wo] (NHWC: [N, Ho, Wo, O]).
  Tap (i, j) reads the strided window of the padded input that meets weight w[..., i, j] and
  contributes window [N, G, C/G, Ho, Wo] x w_tap [G, O/G, C/G] -> [N, G, O/G, Ho, Wo] (a
  broadcast multiply when C/G is 1, else a dot per group). 16-bit floats accumulate in float32.
  """
  (sh, sw), (dh, dw), g = a["strides"], a["dilations"], int(a["groups"])
  pt, pl, pb, pr = a["pads"]
  if nhwc:
    kh, kw, cg, o = w.shape
    n, ho, wo, _ = out_shape
  else:
    o, cg, kh, kw = w.shape
    n, _, ho, wo = out_shape
  og = o // g
  acc_dtype = jnp.float32 if jnp.dtype(x.dtype).itemsize < 4 else x.dtype
  x = x.astype(acc_dtype)
  w = w.astype(acc_dtype)
  zero = jnp.zeros((), acc_dtype)
  hw = (1, 2) if nhwc else (2, 3)
  config = [(0, 0, 0)] * 4
  config[hw[0]], config[hw[1]] = (pt, pb, 0), (pl, pr, 0)
  xp = lax.pad(x, zero, config)
  total = None
  for i in range(kh):
    for j in range(kw):
      start, limit, step = [0] * 4, list(xp.shape), [1] * 4
      for axis, k, d, s, size in ((hw[0], i, dh, sh, ho), (hw[1], j, dw, sw, wo)):
        start[axis], limit[axis], step[axis] = k * d, k * d + s * (size - 1) + 1, s
      window = lax.slice(xp, start, limit, step)
      if nhwc:  # [N, Ho, Wo, G, C/G] x [G, C/G, O/G]
        window = window.reshape(n, ho, wo, g, cg)
        tap = w[i, j].reshape(cg, g, og).transpose(1, 0, 2)
        if cg == 1:
          term = window * tap[:, 0]
        else:
          term = jnp.einsum("nhwgi,gio->nhwgo", window, tap, precision=precision.current())
        term = term.reshape(n, ho, wo, o)
      else:  # [N, G, C/G, Ho, Wo] x [G, O/G, C/G]
        window = window.reshape(n, g, cg, ho, wo)
        tap = w[:, :, i, j].reshape(g, og, cg)
        if cg == 1:
          term = window * tap[None, :, :, :, None]
        else:
          term = jnp.einsum("ngihw,goi->ngohw", window, tap, precision=precision.current())
        term = term.reshape(n, o, ho, wo)
      total = term if total is None else total + term
  return total


def _conv_lower(inputs, a, out_shape, out_dtype):
  x, w = inputs[0], inputs[1]
  pt, pl, pb, pr = a["pads"]
  nhwc = a["layout"] == Layout.NHWC
  numbers = ("NHWC", "HWIO", "NHWC") if nhwc else ("NCHW", "OIHW", "NCHW")
  if a["impl"] == Impl.TAPS:
    y = _conv_taps(x, w.astype(x.dtype), a, nhwc, tuple(out_shape)).astype(x.dtype)
  else:
    y = lax.conv_general_dilated(
        x, w.astype(x.dtype), window_strides=a["strides"], padding=((pt, pb), (pl, pr)),
        rhs_dilation=a["dilations"], dimension_numbers=numbers,
        feature_group_count=a["groups"], precision=precision.current())
  if len(inputs) > 2:
    bias = inputs[2].astype(y.dtype)
    y = y + (bias if nhwc else bias[None, :, None, None])
  return apply_activation(y, a["activation"])


def _conv_flops(xp, in_shapes, in_ranks, out_shape, attrs):
  w = in_shapes[1]
  nhwc = attrs[_CONV_LAYOUT] == Layout.NHWC
  # C/g x kh x kw per output value: the product of the weight's dims but the output channels.
  per_out = (w[R - 4].astype(xp.float32) * w[R - 3] * w[R - 2] * w[R - 1]
             / xp.where(nhwc, w[R - 1], w[R - 4]).astype(xp.float32))
  return 2.0 * spec.numel(xp, out_shape) * per_out


CONV2D = spec.register(OpSpec(
    code=Op.CONV2D, name="Conv2D", min_inputs=2, max_inputs=3, attrs=_CONV_ATTRS,
    shape_rule=_conv_rule, lower=_conv_lower, flops=_conv_flops))


# ------------------------------------------------------------------ ConvTranspose
# x [N, C, H, W], w [C, O/groups, kh, kw], optional bias [O] -> [N, O, Ho, Wo] with
# Ho = sh * (H - 1) + output_padding + dh * (kh - 1) + 1 - pt - pb (ONNX; a negative pad, from
# an ONNX output_shape beyond the full result, adds rows that no input reaches). The attributes
# lay out as Conv2D's (groups and the fused activation at the same offsets), then
# output_padding.

def _conv_transpose_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  x, w = in_shapes[0], in_shapes[1]
  sh, sw, pt, pl, pb, pr, dh, dw, groups = (attrs[i] for i in range(9))
  oph, opw = attrs[10], attrs[11]
  n, c, h, wd = x[R - 4], x[R - 3], x[R - 2], x[R - 1]
  cw, og, kh, kw = w[R - 4], w[R - 3], w[R - 2], w[R - 1]
  g = xp.maximum(groups, 1)
  o = og * g
  ho = sh * (h - 1) + oph + dh * (kh - 1) + 1 - pt - pb
  wo = sw * (wd - 1) + opw + dw * (kw - 1) + 1 - pl - pr
  out = xp.stack([xp.ones_like(n), xp.ones_like(n), n, o, ho, wo]).astype(xp.int32)
  checks = _conv_shared_checks(xp, in_shapes, in_ranks, n_inputs, groups, sh, sw, dh, dw, o) + [
      (xp.asarray((oph >= 0) & (opw >= 0) & (oph < xp.maximum(sh, dh))
                  & (opw < xp.maximum(sw, dw))),
       "output_padding must be >= 0 and below the stride or dilation"),
      (xp.asarray((c == cw) & (c % g == 0)),
       "input channels must equal the weight's first dim and divide by groups"),
      (xp.asarray((ho >= 1) & (wo >= 1)), "pads larger than the output"),
  ]
  return out, xp.asarray(4, xp.int32), checks


def _conv_transpose_lower(inputs, a, out_shape, out_dtype):
  """The gradient of a convolution: a convolution of the input dilated by the strides with
  the kernel flipped and its channel axes swapped (per group)."""
  x, w = inputs[0], inputs[1].astype(inputs[0].dtype)
  g = a["groups"]
  c, og, kh, kw = w.shape
  w = w.reshape(g, c // g, og, kh, kw).transpose(0, 2, 1, 3, 4).reshape(g * og, c // g, kh, kw)
  w = jnp.flip(w, (2, 3))
  pt, pl, pb, pr = a["pads"]
  dh, dw = a["dilations"]
  oph, opw = a["output_padding"]
  padding = ((dh * (kh - 1) - pt, dh * (kh - 1) - pb + oph),
             (dw * (kw - 1) - pl, dw * (kw - 1) - pr + opw))
  y = lax.conv_general_dilated(
      x, w, window_strides=(1, 1), padding=padding, lhs_dilation=a["strides"],
      rhs_dilation=a["dilations"], dimension_numbers=("NCHW", "OIHW", "NCHW"),
      feature_group_count=g, precision=precision.current())
  if len(inputs) > 2:
    y = y + inputs[2].astype(y.dtype)[None, :, None, None]
  return apply_activation(y, a["activation"])


def _conv_transpose_flops(xp, in_shapes, in_ranks, out_shape, attrs):
  w = in_shapes[1]
  per_in = w[R - 3].astype(xp.float32) * w[R - 2] * w[R - 1]  # O/g * kh * kw per input value
  return 2.0 * spec.numel(xp, in_shapes[0]) * per_in


CONV_TRANSPOSE = spec.register(OpSpec(
    code=Op.CONV_TRANSPOSE, name="ConvTranspose", min_inputs=2, max_inputs=3,
    attrs=(AttrField("strides", 2, default=(1, 1)), AttrField("pads", 4, default=(0, 0, 0, 0)),
           AttrField("dilations", 2, default=(1, 1)), AttrField("groups", default=1), _ACT,
           AttrField("output_padding", 2, default=(0, 0))),
    shape_rule=_conv_transpose_rule, lower=_conv_transpose_lower, flops=_conv_transpose_flops))


# ------------------------------------------------------------------ MatMul
# a [..., m, k] @ b [..., k, n] -> [broadcast(...), m, n]; both operands rank >= 2.

def _matmul_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del attrs, n_inputs
  a, b = in_shapes[0], in_shapes[1]
  pos = spec.positions(xp)
  batch = pos < R - 2
  ab = xp.where(batch, a, 1)
  bb = xp.where(batch, b, 1)
  ok_batch = xp.all((ab == bb) | (ab == 1) | (bb == 1))
  out = xp.where(ab == 1, bb, ab)
  out = xp.where(pos == R - 2, a[R - 2], out)
  out = xp.where(pos == R - 1, b[R - 1], out).astype(xp.int32)
  rank = xp.maximum(in_ranks[0], in_ranks[1])
  checks = [
      (xp.asarray((in_ranks[0] >= 2) & (in_ranks[1] >= 2)), "operands must be rank >= 2"),
      (xp.asarray(a[R - 1] == b[R - 2]), "contracted dimensions differ"),
      (xp.asarray(ok_batch), "batch dimensions do not broadcast"),
  ]
  return out, rank, checks


def _matmul_lower(inputs, a, out_shape, out_dtype):
  y = jnp.matmul(inputs[0], inputs[1].astype(inputs[0].dtype), precision=precision.current())
  return apply_activation(y, a["activation"])


def _matmul_flops(xp, in_shapes, in_ranks, out_shape, attrs):
  return 2.0 * spec.numel(xp, out_shape) * in_shapes[0][R - 1]


MATMUL = spec.register(OpSpec(
    code=Op.MATMUL, name="MatMul", min_inputs=2, max_inputs=2, attrs=(_ACT,),
    shape_rule=_matmul_rule, lower=_matmul_lower, flops=_matmul_flops))


# ------------------------------------------------------------------ Pools (NCHW)

# dilations: a 0 reads as 1 (`_dilations`), so an attribute vector that leaves those slots zero
# is an undilated pool.
_POOL_ATTRS = (AttrField("kernel", 2, default=(1, 1)), AttrField("strides", 2, default=(1, 1)),
               AttrField("pads", 4, default=(0, 0, 0, 0)),
               AttrField("ceil_mode", kind="bool", default=False),
               AttrField("count_include_pad", kind="bool", default=False),
               AttrField("dilations", 2, default=(1, 1)), _LAYOUT,
               AttrField("impl", default=int(Impl.XLA)))
_POOL_LAYOUT = _offset(_POOL_ATTRS, "layout")
_POOL_IMPL = _offset(_POOL_ATTRS, "impl")


def _pool_out(xp, size, pad_begin, pad_end, kernel, stride, ceil_mode):
  stride = xp.maximum(stride, 1)
  span = size + pad_begin + pad_end - kernel
  out = xp.where(ceil_mode != 0, -(-span // stride), span // stride) + 1
  # ONNX/PyTorch: the last window must start inside the input or the begin padding.
  return xp.where((ceil_mode != 0) & ((out - 1) * stride >= size + pad_begin), out - 1, out)


def _pool_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del n_inputs
  x = in_shapes[0]
  kh, kw, sh, sw, pt, pl, pb, pr, ceil = (attrs[i] for i in range(9))
  dh, dw = xp.maximum(attrs[10], 1), xp.maximum(attrs[11], 1)
  hpos = xp.where(attrs[_POOL_LAYOUT] == Layout.NHWC, R - 3, R - 2)  # H, then W at hpos + 1
  ho = _pool_out(xp, x[hpos], pt, pb, (kh - 1) * dh + 1, sh, ceil)
  wo = _pool_out(xp, x[hpos + 1], pl, pr, (kw - 1) * dw + 1, sw, ceil)
  pos = spec.positions(xp)
  out = xp.where(pos == hpos, ho, xp.where(pos == hpos + 1, wo, x)).astype(xp.int32)
  checks = [
      (xp.asarray(in_ranks[0] == 4), "input must be rank 4 (NCHW or NHWC)"),
      (xp.asarray((kh >= 1) & (kw >= 1) & (sh >= 1) & (sw >= 1)),
       "kernel and strides must be >= 1"),
      (xp.asarray((attrs[10] >= 0) & (attrs[11] >= 0)), "dilations must be >= 1"),
      (xp.asarray((pt < (kh - 1) * dh + 1) & (pb < (kh - 1) * dh + 1) & (pl < (kw - 1) * dw + 1)
                  & (pr < (kw - 1) * dw + 1) & (pt >= 0) & (pl >= 0) & (pb >= 0) & (pr >= 0)),
       "pads must be in [0, dilated kernel)"),
      (xp.asarray((ho >= 1) & (wo >= 1)), "kernel larger than the padded input"),
      _layout_check(xp, attrs[_POOL_LAYOUT]),
      _impl_check(xp, attrs[_POOL_IMPL]),
  ]
  return out, in_ranks[0], checks


def _dilations(a) -> tuple[int, int]:
  return tuple(max(int(d), 1) for d in a["dilations"])


def _spatial_axes(a) -> tuple[int, int]:
  """The H and W axes of a rank-4 tensor in the node's layout."""
  return (1, 2) if a["layout"] == Layout.NHWC else (2, 3)


def _pool_padding(x_shape, a, out_shape):
  """Explicit (begin, end) padding per spatial dim, plus the extra end padding of ceil mode."""
  pt, pl, pb, pr = a["pads"]
  pads, extras = [], []
  for i, (b, e) in enumerate(((pt, pb), (pl, pr))):
    k = (a["kernel"][i] - 1) * _dilations(a)[i] + 1
    axis = _spatial_axes(a)[i]
    size, s, o = x_shape[axis], a["strides"][i], out_shape[axis]
    need = (o - 1) * s + k - (size + b + e)
    pads.append((b, e))
    extras.append(max(0, need))
  return pads, extras


def _window(a, spatial: tuple[Any, Any], other: Any) -> tuple[Any, ...]:
  """A rank-4 window argument: `spatial` on the H and W axes of the layout, `other` elsewhere."""
  out = [other] * 4
  for axis, value in zip(_spatial_axes(a), spatial):
    out[axis] = value
  return tuple(out)


def _pool_taps(x: jax.Array, a: dict[str, Any], out_shape: tuple[int, ...], padding,
               init: Any, combine) -> jax.Array:
  """A pool as one strided slice of the padded input per window position (`Impl.TAPS`),
  folded with `combine` (max or add): x [N, C, H, W] (NHWC: [N, H, W, C]) -> out_shape;
  `padding` is the (begin, end) pair per axis that `lax.reduce_window` would take."""
  xp = lax.pad(x, jnp.asarray(init, x.dtype), [(b, e, 0) for b, e in padding])
  (dh, dw), axes = _dilations(a), _spatial_axes(a)
  total = None
  for i in range(a["kernel"][0]):
    for j in range(a["kernel"][1]):
      start, limit, step = [0] * 4, list(xp.shape), [1] * 4
      for axis, k, d, s in ((axes[0], i, dh, a["strides"][0]), (axes[1], j, dw, a["strides"][1])):
        start[axis], limit[axis], step[axis] = k * d, k * d + s * (out_shape[axis] - 1) + 1, s
      tap = lax.slice(xp, start, limit, step)
      total = tap if total is None else combine(total, tap)
  return total


def _max_pool_lower(inputs, a, out_shape, out_dtype):
  x = inputs[0]
  pads, extras = _pool_padding(x.shape, a, out_shape)
  padding = _window(a, tuple((b, e + x_) for (b, e), x_ in zip(pads, extras)), (0, 0))
  init = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
  if a["impl"] == Impl.TAPS:
    return _pool_taps(x, a, out_shape, padding, init, jnp.maximum)
  return lax.reduce_window(x, jnp.asarray(init, x.dtype), lax.max, _window(a, a["kernel"], 1),
                           _window(a, a["strides"], 1), padding,
                           window_dilation=_window(a, _dilations(a), 1))


def _avg_pool_lower(inputs, a, out_shape, out_dtype):
  x = inputs[0]
  pads, extras = _pool_padding(x.shape, a, out_shape)
  window, strides = _window(a, a["kernel"], 1), _window(a, a["strides"], 1)
  padding = _window(a, tuple((b, e + x_) for (b, e), x_ in zip(pads, extras)), (0, 0))
  dil = _window(a, _dilations(a), 1)
  taps = a["impl"] == Impl.TAPS
  if taps:
    total = _pool_taps(x, a, out_shape, padding, 0, jnp.add)
  else:
    total = lax.reduce_window(x, jnp.asarray(0, x.dtype), lax.add, window, strides, padding,
                              window_dilation=dil)
  # Divisor: the window's cells inside the input, plus the explicit pads if count_include_pad;
  # the extra cells that ceil mode adds never count. A constant expression (XLA folds it),
  # summed by the same kernel as the total.
  ones = jnp.ones(_window(a, tuple(x.shape[i] for i in _spatial_axes(a)), 1), x.dtype)
  if a["count_include_pad"]:
    ones = jnp.pad(ones, _window(a, tuple(pads), (0, 0)), constant_values=1)
    count_pad = _window(a, tuple((0, x_) for x_ in extras), (0, 0))
  else:
    count_pad = padding
  if taps:
    count = _pool_taps(ones, a, out_shape, count_pad, 0, jnp.add)
  else:
    count = lax.reduce_window(ones, jnp.asarray(0, x.dtype), lax.add, window, strides,
                              count_pad, window_dilation=dil)
  return total / count


def _pool_flops(xp, in_shapes, in_ranks, out_shape, attrs):
  return spec.numel(xp, out_shape) * attrs[0] * attrs[1]


MAX_POOL = spec.register(OpSpec(
    code=Op.MAX_POOL, name="MaxPool", min_inputs=1, max_inputs=1, attrs=_POOL_ATTRS,
    shape_rule=_pool_rule, lower=_max_pool_lower, flops=_pool_flops))
AVG_POOL = spec.register(OpSpec(
    code=Op.AVG_POOL, name="AvgPool", min_inputs=1, max_inputs=1, attrs=_POOL_ATTRS,
    shape_rule=_pool_rule, lower=_avg_pool_lower, flops=_pool_flops))


def _global_pool_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del n_inputs
  x = in_shapes[0]
  hpos = xp.where(attrs[0] == Layout.NHWC, R - 3, R - 2)  # attrs: (layout,)
  pos = spec.positions(xp)
  out = xp.where((pos == hpos) | (pos == hpos + 1), 1, x).astype(xp.int32)
  return out, in_ranks[0], [
      (xp.asarray(in_ranks[0] == 4), "input must be rank 4 (NCHW or NHWC)"),
      _layout_check(xp, attrs[0])]


GLOBAL_AVG_POOL = spec.register(OpSpec(
    code=Op.GLOBAL_AVG_POOL, name="GlobalAvgPool", min_inputs=1, max_inputs=1, attrs=(_LAYOUT,),
    shape_rule=_global_pool_rule,
    lower=lambda inputs, a, out_shape, out_dtype: jnp.mean(
        inputs[0], axis=_spatial_axes(a), keepdims=True).astype(out_dtype),
    flops=lambda xp, in_shapes, in_ranks, out_shape, attrs: spec.numel(xp, in_shapes[0])))


# ------------------------------------------------------------------ Softmax / norms

def _axis_check(xp, rank, axis):
  return (xp.asarray((axis >= 0) & (axis < rank)), "axis out of range (attributes store it >= 0)")


def _softmax_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del n_inputs
  return in_shapes[0].astype(xp.int32), in_ranks[0], [_axis_check(xp, in_ranks[0], attrs[0])]


SOFTMAX = spec.register(OpSpec(
    code=Op.SOFTMAX, name="Softmax", min_inputs=1, max_inputs=1, attrs=(AttrField("axis"),),
    shape_rule=_softmax_rule,
    lower=lambda inputs, a, out_shape, out_dtype: jax.nn.softmax(inputs[0], axis=a["axis"]),
    flops=lambda xp, in_shapes, in_ranks, out_shape, attrs: 5.0 * spec.numel(xp, out_shape)))


LOG_SOFTMAX = spec.register(OpSpec(
    code=Op.LOG_SOFTMAX, name="LogSoftmax", min_inputs=1, max_inputs=1,
    attrs=(AttrField("axis"),), shape_rule=_softmax_rule,
    lower=lambda inputs, a, out_shape, out_dtype: jax.nn.log_softmax(inputs[0], axis=a["axis"]),
    flops=SOFTMAX.flops))


def _trailing_broadcast_ok(xp, x, xr, p, pr, axis):
  """A scale/bias p must broadcast to the normalised trailing dims of x (from `axis`)."""
  pos = spec.positions(xp)
  in_norm = pos >= R - xr + axis
  ok = xp.all(xp.where(in_norm, (p == x) | (p == 1), p == 1))
  return ok & (pr <= xr - axis)


def _layer_norm_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  x, xr, axis = in_shapes[0], in_ranks[0], attrs[0]
  checks = [_axis_check(xp, xr, axis),
            (xp.asarray(_trailing_broadcast_ok(xp, x, xr, in_shapes[1], in_ranks[1], axis)),
             "scale must broadcast over the normalised dims")]
  if in_shapes.shape[0] > 2:
    has_bias = xp.asarray(n_inputs) >= 3
    checks.append((xp.asarray(~has_bias | _trailing_broadcast_ok(
        xp, x, xr, in_shapes[2], in_ranks[2], axis)),
                   "bias must broadcast over the normalised dims"))
  return x.astype(xp.int32), xr, checks


def _layer_norm_lower(inputs, a, out_shape, out_dtype):
  x = inputs[0]
  axes = tuple(range(a["axis"], x.ndim))
  mean = jnp.mean(x, axis=axes, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
  y = (x - mean) * lax.rsqrt(var + jnp.asarray(a["epsilon"], x.dtype)) * inputs[1]
  if len(inputs) > 2:
    y = y + inputs[2]
  return y


LAYER_NORM = spec.register(OpSpec(
    code=Op.LAYER_NORM, name="LayerNorm", min_inputs=2, max_inputs=3,
    attrs=(AttrField("axis"), AttrField("epsilon", kind="float", default=1e-5)),
    shape_rule=_layer_norm_rule, lower=_layer_norm_lower,
    flops=lambda xp, in_shapes, in_ranks, out_shape, attrs: 8.0 * spec.numel(xp, out_shape)))


_BN_ATTRS = (AttrField("epsilon", kind="float", default=1e-5), _LAYOUT)
_BN_LAYOUT = _offset(_BN_ATTRS, "layout")


def _batch_norm_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del n_inputs
  x = in_shapes[0]
  nhwc = attrs[_BN_LAYOUT] == Layout.NHWC  # channels last instead of at axis 1
  c = xp.where(nhwc, x[R - 1], spec.dim(xp, x, in_ranks[0], 1))  # clamped: see the rank check
  ok = xp.asarray(True)
  for i in range(1, 5):
    ok = ok & (in_ranks[i] == 1) & (in_shapes[i][R - 1] == c)
  checks = [(xp.asarray(in_ranks[0] >= 2), "input must be rank >= 2 (N, C, ...)"),
            (xp.asarray(ok), "scale, bias, mean and var must be rank 1 of size C"),
            _layout_check(xp, attrs[_BN_LAYOUT])]
  return x.astype(xp.int32), in_ranks[0], checks


def _batch_norm_lower(inputs, a, out_shape, out_dtype):
  x, scale, bias, mean, var = inputs
  if a["layout"] == Layout.NHWC:
    shape = (1,) * (x.ndim - 1) + (-1,)
  else:
    shape = (1, -1) + (1,) * (x.ndim - 2)
  inv = scale * lax.rsqrt(var + jnp.asarray(a["epsilon"], var.dtype))
  return (x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)


BATCH_NORM = spec.register(OpSpec(
    code=Op.BATCH_NORM, name="BatchNorm", min_inputs=5, max_inputs=5,
    attrs=_BN_ATTRS, shape_rule=_batch_norm_rule, lower=_batch_norm_lower,
    flops=lambda xp, in_shapes, in_ranks, out_shape, attrs: 2.0 * spec.numel(xp, out_shape),
    elementwise=True))


# ------------------------------------------------------------------ Reductions
# axes: a bit mask over the input's axes; keepdims: keep reduced axes as size 1.

def _reduce_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del n_inputs
  x, xr, bits, keep = in_shapes[0], in_ranks[0], attrs[0], attrs[1]
  mask = spec.axis_mask(xp, xr, bits)
  kept_shape = xp.where(mask, 1, x).astype(xp.int32)
  dropped, dropped_rank = spec.drop_axes(xp, x, xr, mask)
  out = xp.where(keep != 0, kept_shape, dropped)
  rank = xp.where(keep != 0, xr, dropped_rank)
  checks = [(xp.asarray((bits >= 1) & (bits < (1 << xr))), "axes must name existing axes")]
  return out.astype(xp.int32), rank, checks


def _reduce_axes(bits: int, rank: int) -> tuple[int, ...]:
  return tuple(i for i in range(rank) if (bits >> i) & 1)


def _reduce_lower(fn):
  def lower(inputs, a, out_shape, out_dtype):
    x = inputs[0]
    # jnp.mean of integers is float; the node keeps its input's dtype (ONNX truncates).
    y = fn(x, axis=_reduce_axes(a["axes"], x.ndim), keepdims=bool(a["keepdims"]))
    return y.astype(jax.dtypes.canonicalize_dtype(out_dtype))  # int64 is int32 without x64
  return lower


_REDUCE_ATTRS = (AttrField("axes"), AttrField("keepdims", kind="bool", default=True))
REDUCE_MEAN = spec.register(OpSpec(
    code=Op.REDUCE_MEAN, name="ReduceMean", min_inputs=1, max_inputs=1, attrs=_REDUCE_ATTRS,
    shape_rule=_reduce_rule, lower=_reduce_lower(jnp.mean),
    flops=lambda xp, in_shapes, in_ranks, out_shape, attrs: spec.numel(xp, in_shapes[0])))
REDUCE_SUM = spec.register(OpSpec(
    code=Op.REDUCE_SUM, name="ReduceSum", min_inputs=1, max_inputs=1, attrs=_REDUCE_ATTRS,
    shape_rule=_reduce_rule, lower=_reduce_lower(jnp.sum),
    flops=lambda xp, in_shapes, in_ranks, out_shape, attrs: spec.numel(xp, in_shapes[0])))


def _reduce_flops(per_element: float) -> spec.FlopRule:
  def rule(xp, in_shapes, in_ranks, out_shape, attrs):
    del in_ranks, out_shape, attrs
    return per_element * spec.numel(xp, in_shapes[0])
  return rule


def _l1(x, axis, keepdims):
  return jnp.sum(jnp.abs(x), axis=axis, keepdims=keepdims)


def _l2(x, axis, keepdims):
  return jnp.sqrt(jnp.sum(jnp.square(x), axis=axis, keepdims=keepdims))


_ONE_PER_ELEMENT = _reduce_flops(1.0)
REDUCE_MAX = spec.register(OpSpec(
    code=Op.REDUCE_MAX, name="ReduceMax", min_inputs=1, max_inputs=1, attrs=_REDUCE_ATTRS,
    shape_rule=_reduce_rule, lower=_reduce_lower(jnp.max), flops=_ONE_PER_ELEMENT))
REDUCE_MIN = spec.register(OpSpec(
    code=Op.REDUCE_MIN, name="ReduceMin", min_inputs=1, max_inputs=1, attrs=_REDUCE_ATTRS,
    shape_rule=_reduce_rule, lower=_reduce_lower(jnp.min), flops=_ONE_PER_ELEMENT))
REDUCE_PROD = spec.register(OpSpec(
    code=Op.REDUCE_PROD, name="ReduceProd", min_inputs=1, max_inputs=1, attrs=_REDUCE_ATTRS,
    shape_rule=_reduce_rule, lower=_reduce_lower(jnp.prod), flops=_ONE_PER_ELEMENT))
REDUCE_L1 = spec.register(OpSpec(
    code=Op.REDUCE_L1, name="ReduceL1", min_inputs=1, max_inputs=1, attrs=_REDUCE_ATTRS,
    shape_rule=_reduce_rule, lower=_reduce_lower(_l1), flops=_reduce_flops(2.0)))
REDUCE_L2 = spec.register(OpSpec(
    code=Op.REDUCE_L2, name="ReduceL2", min_inputs=1, max_inputs=1, attrs=_REDUCE_ATTRS,
    shape_rule=_reduce_rule, lower=_reduce_lower(_l2), flops=_reduce_flops(2.0)))
REDUCE_LOG_SUM_EXP = spec.register(OpSpec(
    code=Op.REDUCE_LOG_SUM_EXP, name="ReduceLogSumExp", min_inputs=1, max_inputs=1,
    attrs=_REDUCE_ATTRS, shape_rule=_reduce_rule,
    lower=_reduce_lower(lambda x, axis, keepdims: jax.nn.logsumexp(x, axis=axis,
                                                                   keepdims=keepdims)),
    flops=_reduce_flops(4.0)))


# ArgMax / ArgMin: one axis (a one-bit mask, so the reduction shape rule applies), int64 indices.

def _arg_reduce_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  shape, rank, checks = _reduce_rule(xp, in_shapes, in_ranks, attrs, n_inputs)
  bits = attrs[0]
  one_axis = (bits >= 1) & ((bits & (bits - 1)) == 0)
  return shape, rank, checks + [(xp.asarray(one_axis), "exactly one axis must be reduced")]


def _arg_lower(fn):
  def lower(inputs, a, out_shape, out_dtype):
    x = inputs[0]
    (axis,) = _reduce_axes(a["axes"], x.ndim)
    if a["select_last_index"]:  # the last occurrence: the first one of the reversed axis
      idx = x.shape[axis] - 1 - fn(jnp.flip(x, axis), axis=axis, keepdims=bool(a["keepdims"]))
    else:
      idx = fn(x, axis=axis, keepdims=bool(a["keepdims"]))
    return idx.astype(jax.dtypes.canonicalize_dtype(out_dtype))  # int32 unless x64
  return lower


_ARG_ATTRS = _REDUCE_ATTRS + (AttrField("select_last_index", kind="bool", default=False),)
ARG_MAX = spec.register(OpSpec(
    code=Op.ARG_MAX, name="ArgMax", min_inputs=1, max_inputs=1, attrs=_ARG_ATTRS,
    shape_rule=_arg_reduce_rule, lower=_arg_lower(jnp.argmax), flops=_ONE_PER_ELEMENT,
    dtype_rule="dtype:int64"))
ARG_MIN = spec.register(OpSpec(
    code=Op.ARG_MIN, name="ArgMin", min_inputs=1, max_inputs=1, attrs=_ARG_ATTRS,
    shape_rule=_arg_reduce_rule, lower=_arg_lower(jnp.argmin), flops=_ONE_PER_ELEMENT,
    dtype_rule="dtype:int64"))


# ------------------------------------------------------------------ TASO weight transforms

def _enlarge_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del n_inputs
  w = in_shapes[0]
  kh, kw = attrs[0], attrs[1]
  pos = spec.positions(xp)
  out = xp.where(pos == R - 2, kh, xp.where(pos == R - 1, kw, w)).astype(xp.int32)
  checks = [(xp.asarray(in_ranks[0] == 4), "weight must be rank 4 (OIHW)"),
            (xp.asarray((kh >= w[R - 2]) & (kw >= w[R - 1])), "target kernel smaller than weight"),
            (xp.asarray(((kh - w[R - 2]) % 2 == 0) & ((kw - w[R - 1]) % 2 == 0)),
             "kernel growth must be even so the old kernel stays centred")]
  return out, in_ranks[0], checks


def _enlarge_lower(inputs, a, out_shape, out_dtype):
  w = inputs[0]
  dh, dw = (a["kernel"][0] - w.shape[2]) // 2, (a["kernel"][1] - w.shape[3]) // 2
  return jnp.pad(w, ((0, 0), (0, 0), (dh, dh), (dw, dw)))


ENLARGE = spec.register(OpSpec(
    code=Op.ENLARGE, name="Enlarge", min_inputs=1, max_inputs=1,
    attrs=(AttrField("kernel", 2, default=(1, 1)),),
    shape_rule=_enlarge_rule, lower=_enlarge_lower,
    flops=lambda xp, in_shapes, in_ranks, out_shape, attrs: 0.0 * spec.numel(xp, out_shape)))


def _merge_gconv_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del n_inputs
  w = in_shapes[0]
  groups, count = attrs[0], attrs[1]
  out = xp.where(spec.positions(xp) == R - 3, w[R - 3] * count, w).astype(xp.int32)
  g = xp.maximum(groups, 1)
  c = xp.maximum(count, 1)
  checks = [(xp.asarray(in_ranks[0] == 4), "weight must be rank 4 (OIHW)"),
            (xp.asarray((groups >= 1) & (count >= 1) & (groups % c == 0)),
             "groups must be a multiple of count"),
            (xp.asarray(w[R - 4] % g == 0), "output channels must divide by groups")]
  return out, in_ranks[0], checks


def _merge_gconv_lower(inputs, a, out_shape, out_dtype):
  """[O, I/g, kh, kw] with g groups -> [O, count*I/g, kh, kw] with g/count groups.

  Output channel o (old group o // (O/g)) keeps its weights in block (old group % count) of the
  merged group's input channels and zeros elsewhere.
  """
  w = inputs[0]
  o, ig = w.shape[0], w.shape[1]
  groups, count = a["groups"], a["count"]
  block = (jnp.arange(o) // (o // groups)) % count  # [O]
  onehot = (block[:, None] == jnp.arange(count)[None, :]).astype(w.dtype)  # [O, count]
  merged = onehot[:, :, None, None, None] * w[:, None]  # [O, count, I/g, kh, kw]
  return merged.reshape(o, count * ig, w.shape[2], w.shape[3])


MERGE_GCONV = spec.register(OpSpec(
    code=Op.MERGE_GCONV, name="MergeGConv", min_inputs=1, max_inputs=1,
    attrs=(AttrField("groups", default=1), AttrField("count", default=1)),
    shape_rule=_merge_gconv_rule, lower=_merge_gconv_lower,
    flops=lambda xp, in_shapes, in_ranks, out_shape, attrs: 0.0 * spec.numel(xp, out_shape)))
