"""Converters of Resize and Upsample. Resizing is separable: each resized axis is a sum over a
few taps of Gathers along that axis with constant indices, weighted by constant coefficients,
all computed here as onnx's reference does (`onnx.reference.ops.op_resize`): source coordinates
by the coordinate transformation mode, neighbours of edge-padded data (clamped indices),
exclude_outside, antialias footprints. Nearest is one Gather."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from xrlflow_jax.onnx_io.convert.common import Ctx, Operand, check_float, converter
from xrlflow_jax.ops import Op


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
  check_float(ctx, x)
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
