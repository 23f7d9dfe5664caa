"""Converters of the convolutions: Conv and ConvTranspose, 1-D ones lifted to the project's
2-D ops (a height of 1) and 3-D ones summed over the kernel's depth of 2-D ones; the pads come
from ONNX's auto_pad, pads and (for ConvTranspose) output_shape."""

from __future__ import annotations

from typing import Sequence

from xrlflow_jax.onnx_io.convert.common import (Ctx, Operand, auto_pads, check_float, converter,
                                                pad_axis, spatial_attr, to_2d)
from xrlflow_jax.ops import Op


def _conv_operands(ctx: Ctx) -> tuple[Operand, Operand, Sequence[int], Sequence[int]]:
  """(X, W, X's shape, W's shape) of a Conv or ConvTranspose node: float, one dtype, one rank."""
  x, w = ctx.inp(0, "X"), ctx.inp(1, "W")
  ctx.same_dtype([x, w])
  check_float(ctx, x)
  xs, ws = ctx.shape(x), ctx.shape(w)
  if len(ws) != len(xs):
    raise ctx.error(f"weight '{ctx.node.input[1]}' has dims {list(ws)}, which do not fit input "
                    f"{list(xs)} (same rank needed)")
  return x, w, xs, ws


def _conv2d(ctx: Ctx, op: Op, x: Operand, w: Operand, strides: list[int], dilations: list[int],
            begins: list[int], ends: list[int], out_pad: list[int] | None = None) -> Operand:
  """A 1-D or 2-D Conv (op CONV2D) or ConvTranspose (op CONV_TRANSPOSE, with `out_pad`) as the
  project's 2-D op, with the node's bias B when it has one. A 1-D one is lifted to 2-D: X and W
  gain a height of 1 (NCL -> NC1L), the per-axis attributes a leading 1 (strides, dilations) or
  0 (pads, output padding), and the result loses the height again."""
  x4, one_d = to_2d(ctx, x, f"{ctx.node.op_type} input")
  w4 = ctx.unsqueeze(w, [2]) if one_d else w
  if one_d:
    strides, dilations = [1] + strides, [1] + dilations
    begins, ends = [0] + begins, [0] + ends
    out_pad = None if out_pad is None else [0] + out_pad
  inputs = [x4, w4]
  if ctx.has(2):
    bias = ctx.inp(2, "B")
    ctx.same_dtype([x, bias])
    inputs.append(bias)
  extra = {} if out_pad is None else {"output_padding": tuple(out_pad)}
  y = ctx.op(op, inputs, strides=tuple(strides), dilations=tuple(dilations),
             pads=(begins[0], begins[1], ends[0], ends[1]), groups=ctx.int_attr("group", 1),
             **extra)
  return ctx.squeeze(y, [2]) if one_d else y


@converter("Conv")
def _conv(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"])
  x, w, xs, ws = _conv_operands(ctx)
  n = len(xs) - 2
  kernel = ctx.ints_attr("kernel_shape", list(ws[2:]))
  if list(kernel) != list(ws[2:]):
    raise ctx.error(f"weight '{ctx.node.input[1]}' has dims {list(ws)} but kernel_shape is "
                    f"{kernel}")
  strides = spatial_attr(ctx, "strides", n, 1)
  dilations = spatial_attr(ctx, "dilations", n, 1)
  begins, ends = auto_pads(ctx, xs[2:], kernel, strides, dilations)
  if n == 3:
    return [_conv3d(ctx, x, w, xs, ws, strides, dilations, begins, ends)]
  return [_conv2d(ctx, Op.CONV2D, x, w, strides, dilations, begins, ends)]


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
  planes = ctx.transpose(pad_axis(ctx, x, 2, begins[0], ends[0]), [0, 2, 1, 3, 4])
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
      yk = pad_axis(ctx, ctx.reshape(yk, (bn, di, 1, f)), 2, 0, sd - 1)
    yk = ctx.reshape(yk, (bn, di * sd, f))
    yk = pad_axis(ctx, yk, 1, kd * dd, full - kd * dd - di * sd)
    y = yk if y is None else ctx.op(Op.ADD, [y, yk])
  y = pad_axis(ctx, y, 1, -begins[0], -ends[0])
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
  strides = spatial_attr(ctx, "strides", n, 1)
  dilations = spatial_attr(ctx, "dilations", n, 1)
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
  return [_conv2d(ctx, Op.CONV_TRANSPOSE, x, w, strides, dilations, begins, ends, out_pad)]
