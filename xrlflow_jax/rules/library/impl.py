"""Implementation-choice rules: a grouped convolution or a pool lowered tap by tap instead of
by XLA's convolution or reduce-window emitter (`ops.Impl`).

The tap-by-tap form computes the same function as one strided slice of the padded input per
kernel tap, combined elementwise (see `ops.Impl`). XLA:CPU's grouped-convolution and
reduce-window emitters are slow. On the project's 2-core CPU (2026-12-05, jitted alone), a
3x3 depthwise convolution of 1 x 128 x 56 x 56 took 12.4 ms as one convolution and 0.25 ms
as taps; a 7x7 stride-2 one took 15.5 and 1.3 ms; ResNeXt's 32-group 3x3 convolutions took
0.32-0.59x their time. A 3x3 stride-2 max pool (2026-12-06, jitted alone, the same machine)
took 0.46 ms by reduce-window and 0.10 ms as taps on 1 x 111 x 111 x 64 (NHWC; 0.79 and 0.23
ms NCHW), 0.12 and 0.05 ms on 1 x 27 x 27 x 256.

An ungrouped convolution (one dense Eigen kernel) is never offered: it is far faster as is.
Each choice is priced by the kernel table, per signature, like any other rewrite (pools are
kernels of the table too: `cost.model.KERNEL_OPS`). The rules work in either layout, and the
exported ONNX is the same Conv or pool whichever was chosen.
"""

from __future__ import annotations

from typing import Callable

from xrlflow_jax.ops import Impl, Layout, Op
from xrlflow_jax.rules.library.layout import OIHW_TO_HWIO, TO_NHWC
from xrlflow_jax.rules.pattern import Rule, RuleBuilder

FAMILY = "impl"
POOLS = (Op.MAX_POOL, Op.AVG_POOL)


def _other(to: Impl) -> Impl:
  return Impl.XLA if to == Impl.TAPS else Impl.TAPS


def _grouped_conv_example(bias: bool, impl: Impl) -> Callable:
  """A grouped conv(x, w[, b]) lowered by `impl`: depthwise (with a channel multiplier) or
  several channels per group, in NCHW or (a third of the time) NHWC."""
  def ex(b, rng):
    groups = int(rng.integers(2, 5))
    cg = int(rng.choice([1, 1, 2]))
    o = groups * int(rng.integers(1, 3))
    n, h, w_ = int(rng.integers(1, 3)), int(rng.integers(3, 8)), int(rng.integers(3, 8))
    k = int(rng.choice([1, 3]))
    stride = int(rng.choice([1, 2]))
    x = b.input((n, groups * cg, h, w_))
    wt = b.weight((o, cg, k, k))
    extra = [b.weight((o,), init="bias")] if bias else []
    attrs = dict(strides=(stride, stride), pads=(k // 2,) * 4, groups=groups,
                 activation=int(rng.choice([0, 1])), impl=int(impl))
    if rng.random() < 1 / 3:
      return [b.node(Op.CONV2D, [b.transpose(x, TO_NHWC), b.transpose(wt, OIHW_TO_HWIO)] + extra,
                     layout=int(Layout.NHWC), **attrs)]
    return [b.node(Op.CONV2D, [x, wt] + extra, **attrs)]
  return ex


def _pool_example(op: Op, impl: Impl) -> Callable:
  """A max or average pool lowered by `impl`: random window, strides, pads, ceil mode and
  dilations, in NCHW or (a third of the time) NHWC."""
  def ex(b, rng):
    k = tuple(int(v) for v in rng.integers(1, 4, size=2))
    d = tuple(int(v) for v in rng.choice([1, 1, 2], size=2))
    span = tuple((kk - 1) * dd + 1 for kk, dd in zip(k, d))
    pads = tuple(int(rng.integers(0, span[i % 2])) for i in range(4))
    shape = (int(rng.integers(1, 3)), int(rng.integers(1, 4)),
             int(rng.integers(span[0], 9)), int(rng.integers(span[1], 9)))
    attrs = dict(kernel=k, strides=tuple(int(v) for v in rng.integers(1, 3, size=2)), pads=pads,
                 ceil_mode=bool(rng.random() < 0.3), dilations=d, impl=int(impl))
    if op == Op.AVG_POOL:
      attrs["count_include_pad"] = bool(rng.random() < 0.5)
    x = b.input(shape)
    if rng.random() < 1 / 3:
      return [b.node(op, [b.transpose(x, TO_NHWC)], layout=int(Layout.NHWC), **attrs)]
    return [b.node(op, [x], **attrs)]
  return ex


def conv_impl(bias: bool, to: Impl) -> Rule:
  """conv(x, w[, b], impl=other) -> the same conv with impl=`to` (grouped convs only)."""
  stem = "conv_bias" if bias else "conv"
  r = RuleBuilder(f"{stem}_{to.name.lower()}", FAMILY,
                  example=_grouped_conv_example(bias, _other(to)), layout_aware=True,
                  inverse=f"{stem}_{_other(to).name.lower()}",
                  description=("lower a grouped convolution tap by tap" if to == Impl.TAPS
                               else "lower a grouped convolution with XLA's convolution"))
  x, w = r.var("x"), r.var("w")
  extra = [r.var("b")] if bias else []
  conv = r.src(Op.CONV2D, x, w, *extra)
  r.where(lambda m: (m.attr(conv, "impl") == _other(to)) & (m.attr(conv, "groups") > 1))
  r.replace(conv, r.dst(Op.CONV2D, x, w, *extra, like=conv, impl=int(to)))
  return r.build()


def pool_impl(op: Op, to: Impl) -> Rule:
  """pool(x, impl=other) -> the same pool with impl=`to`."""
  stem = op.name.lower()
  r = RuleBuilder(f"{stem}_{to.name.lower()}", FAMILY, example=_pool_example(op, _other(to)),
                  layout_aware=True, inverse=f"{stem}_{_other(to).name.lower()}",
                  description=(f"lower a {stem.replace('_', ' ')} tap by tap" if to == Impl.TAPS
                               else f"lower a {stem.replace('_', ' ')} with XLA's reduce-window"))
  x = r.var("x")
  pool = r.src(op, x)
  r.where(lambda m: m.attr(pool, "impl") == _other(to))
  r.replace(pool, r.dst(op, x, like=pool, impl=int(to)))
  return r.build()


def rules() -> list[Rule]:
  """The implementation-choice rules: grouped convolutions' and pools'."""
  return ([conv_impl(bias, to) for to in (Impl.TAPS, Impl.XLA) for bias in (False, True)]
          + [pool_impl(op, to) for to in (Impl.TAPS, Impl.XLA) for op in POOLS])
