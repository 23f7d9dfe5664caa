"""Kernel-choice rules: a grouped convolution lowered tap by tap instead of by XLA's emitter.

`ConvKernel.TAPS` computes the same Conv2D as one strided slice of the padded input per
kernel tap, scaled by the tap's weights and summed (see `ops.ConvKernel`). XLA:CPU's grouped
convolution emitter is slow: on the project's 2-core CPU a 3x3 depthwise convolution of
1 x 128 x 56 x 56 took 12.4 ms as one convolution and 0.25 ms as taps, a 7x7 stride-2 one
15.5 ms and 1.3 ms, and ResNeXt's 32-group 3x3 convolutions 0.32-0.59x their time. An
ungrouped convolution (one dense Eigen kernel) is never offered: it is far faster as is. The
choice is the kernel table's to price, per signature, like any other rewrite; the rules work
in either layout and the exported ONNX is the same Conv whichever kernel was chosen.
"""

from __future__ import annotations

from typing import Callable

from xrlflow_jax.ops import ConvKernel, Layout, Op
from xrlflow_jax.rules.pattern import Rule, RuleBuilder

FAMILY = "conv_kernel"
HWIO = (2, 3, 1, 0)  # OIHW -> HWIO
TO_NHWC = (0, 2, 3, 1)


def _grouped_conv_example(bias: bool, kernel: ConvKernel) -> Callable:
  """A grouped conv(x, w[, b]) lowered by `kernel`: depthwise (with a channel multiplier) or
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
                 activation=int(rng.choice([0, 1])), kernel=int(kernel))
    if rng.random() < 1 / 3:
      y = b.node(Op.CONV2D, [b.transpose(x, TO_NHWC), b.transpose(wt, HWIO)] + extra,
                 layout=int(Layout.NHWC), **attrs)
    else:
      y = b.node(Op.CONV2D, [x, wt] + extra, **attrs)
    return [y]
  return ex


def conv_kernel(bias: bool, to: ConvKernel) -> Rule:
  """conv(x, w[, b], kernel=other) -> the same conv with kernel=`to` (grouped convs only)."""
  src_kernel = ConvKernel.XLA if to == ConvKernel.TAPS else ConvKernel.TAPS
  stem = "conv_bias" if bias else "conv"
  name = f"{stem}_{to.name.lower()}"
  r = RuleBuilder(name, FAMILY, example=_grouped_conv_example(bias, src_kernel),
                  layout_aware=True, inverse=f"{stem}_{src_kernel.name.lower()}",
                  description=("lower a grouped convolution tap by tap" if to == ConvKernel.TAPS
                               else "lower a grouped convolution with XLA's convolution"))
  x, w = r.var("x"), r.var("w")
  extra = [r.var("b")] if bias else []
  conv = r.src(Op.CONV2D, x, w, *extra)
  r.where(lambda m: (m.attr(conv, "kernel") == src_kernel) & (m.attr(conv, "groups") > 1))
  r.replace(conv, r.dst(Op.CONV2D, x, w, *extra, like=conv, kernel=int(to)))
  return r.build()


def rules() -> list[Rule]:
  """Every kernel-choice rule."""
  return [conv_kernel(bias, to) for to in (ConvKernel.TAPS, ConvKernel.XLA)
          for bias in (False, True)]
