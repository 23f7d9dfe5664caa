"""Architectures found by neural architecture search: NasNet-A and NasRNN, as in TASO's examples.

NasNet-A follows TASO's `nasnet_a.py` cells (separable convs as a depthwise conv with
groups = channels followed by a pointwise conv, average/max pools, pairwise adds and a concat of
the five cell outputs), with NASNet's wiring: each cell reads the two cells before it, and a
previous input of larger spatial size is fitted by a stride-2 3x3 conv. NasRNN follows TASO's
`nasrnn.py` cell (eight x/h matmul pairs combined through a fixed tree of adds, muls and
activations), unrolled over a short sequence with weights shared across time steps.
"""

from __future__ import annotations

import dataclasses

from xrlflow_jax.graph import GraphBuilder, Tensor
from xrlflow_jax.models import registry
from xrlflow_jax.models.layers import check_positive, classifier_head, conv


# ------------------------------------------------------------------ NasNet-A

@dataclasses.dataclass(frozen=True)
class NasNetConfig:
  """NasNet-A: a conv stem, then `stages` x (`normal_cells` normal cells + 1 reduction cell);
  cell width starts at `channels` and doubles at each reduction."""
  image: int = 224
  stem: int = 64
  channels: int = 128
  stages: int = 3
  normal_cells: int = 5
  classes: int = 1000


def _squeeze(b: GraphBuilder, x: Tensor, channels: int, name: str) -> Tensor:
  """1x1 conv + ReLU to `channels`."""
  return conv(b, x, channels, 1, name, padding="SAME", bias=False)


def _fit(b: GraphBuilder, cur: Tensor, prev: Tensor, name: str) -> Tensor:
  """Brings `prev` to cur's channels (1x1 conv) and, if larger, to cur's spatial size (3x3 s2)."""
  if prev.shape[2] == cur.shape[2]:
    return _squeeze(b, prev, cur.shape[1], name)
  return conv(b, prev, cur.shape[1], 3, name, stride=2, padding="SAME", bias=False)


def _sep_conv(b: GraphBuilder, x: Tensor, channels: int, kernel: int, stride: int,
              name: str) -> Tensor:
  """Separable conv: depthwise kxk (groups = channels of x), then pointwise 1x1, no activation."""
  c = x.shape[1]
  t = conv(b, x, c, kernel, f"{name}.depthwise", stride=stride, padding="SAME", groups=c,
           act="none", bias=False)
  return conv(b, t, channels, 1, f"{name}.pointwise", padding="SAME", act="none", bias=False)


def _avg3(b: GraphBuilder, x: Tensor, stride: int, name: str) -> Tensor:
  return b.avg_pool(x, (3, 3), (stride, stride), "SAME", name=name)


def _max3(b: GraphBuilder, x: Tensor, stride: int, name: str) -> Tensor:
  return b.max_pool(x, (3, 3), (stride, stride), "SAME", name=name)


def _normal_cell(b: GraphBuilder, prev: Tensor, cur: Tensor, channels: int, name: str) -> Tensor:
  """[1, *, H, W] x 2 -> [1, 5 * channels, H, W]."""
  cur = _squeeze(b, cur, channels, f"{name}.squeeze")
  prev = _fit(b, cur, prev, f"{name}.fit")
  pairs = [
      (_sep_conv(b, cur, channels, 3, 1, f"{name}.sep0"), cur),
      (_sep_conv(b, prev, channels, 3, 1, f"{name}.sep1"),
       _sep_conv(b, cur, channels, 3, 1, f"{name}.sep2")),
      (_avg3(b, cur, 1, f"{name}.avg0"), prev),
      (_avg3(b, prev, 1, f"{name}.avg1"), _avg3(b, prev, 1, f"{name}.avg2")),
      (_sep_conv(b, prev, channels, 3, 1, f"{name}.sep3"),
       _sep_conv(b, prev, channels, 3, 1, f"{name}.sep4")),
  ]
  outs = [b.add(l, r, name=f"{name}.add{i}") for i, (l, r) in enumerate(pairs)]
  return b.concat(outs, axis=1, name=name)


def _reduction_cell(b: GraphBuilder, prev: Tensor, cur: Tensor, channels: int,
                    name: str) -> Tensor:
  """[1, *, H, W] x 2 -> [1, 5 * channels, ceil(H/2), ceil(W/2)]."""
  cur = _squeeze(b, cur, channels, f"{name}.squeeze")
  prev = _fit(b, cur, prev, f"{name}.fit")
  o0 = b.add(_sep_conv(b, prev, channels, 7, 2, f"{name}.sep0"),
             _sep_conv(b, cur, channels, 5, 2, f"{name}.sep1"), name=f"{name}.add0")
  o1 = b.add(_max3(b, cur, 2, f"{name}.max0"),
             _sep_conv(b, prev, channels, 7, 2, f"{name}.sep2"), name=f"{name}.add1")
  o2 = b.add(_avg3(b, cur, 2, f"{name}.avg0"),
             _sep_conv(b, prev, channels, 5, 2, f"{name}.sep3"), name=f"{name}.add2")
  o3 = b.add(_max3(b, cur, 2, f"{name}.max1"),
             _sep_conv(b, o0, channels, 3, 1, f"{name}.sep4"), name=f"{name}.add3")
  o4 = b.add(_avg3(b, o0, 1, f"{name}.avg1"), o1, name=f"{name}.add4")
  return b.concat([o0, o1, o2, o3, o4], axis=1, name=name)


def nasnet_a(b: GraphBuilder, cfg: NasNetConfig) -> None:
  """NasNet-A (TASO's cells): input [1, 3, image, image] -> logits [1, classes]."""
  check_positive(b.name, **dataclasses.asdict(cfg))
  x = b.input((1, 3, cfg.image, cfg.image), name="image")
  x = conv(b, x, cfg.stem, 7, "stem.conv", stride=2, padding="SAME", bias=False)
  x = _max3(b, x, 2, "stem.pool")
  prev, cur = x, x
  channels = cfg.channels
  for s in range(cfg.stages):
    for i in range(cfg.normal_cells):
      prev, cur = cur, _normal_cell(b, prev, cur, channels, f"stage{s}.normal{i}")
    channels *= 2
    prev, cur = cur, _reduction_cell(b, prev, cur, channels, f"stage{s}.reduction")
  b.output(classifier_head(b, cur, cfg.classes))


# ------------------------------------------------------------------ NasRNN

@dataclasses.dataclass(frozen=True)
class NasRNNConfig:
  """NasRNN: `length` time steps of a cell of width `hidden` (batch 1)."""
  hidden: int = 512
  length: int = 5


def _nas_cell(b: GraphBuilder, h: Tensor, x: Tensor, weights: list[tuple[Tensor, Tensor]],
              name: str) -> Tensor:
  """One NAS cell: x, h [1, H] -> new h [1, H]."""
  t = [b.add(b.matmul(x, wx), b.matmul(h, wh), name=f"{name}.t{i}")
       for i, (wx, wh) in enumerate(weights)]
  m0 = b.add(b.relu(t[0]), b.sigmoid(t[3]), name=f"{name}.m0")
  m1 = b.add(b.sigmoid(t[1]), b.tanh(t[2]), name=f"{name}.m1")
  m2 = b.mul(b.sigmoid(t[4]), b.tanh(t[5]), name=f"{name}.m2")
  m3 = b.mul(b.sigmoid(t[6]), b.relu(t[7]), name=f"{name}.m3")
  m4 = b.add(b.sigmoid(m1), b.tanh(m2), name=f"{name}.m4")
  m5 = b.mul(b.tanh(m0), b.tanh(m3), name=f"{name}.m5")
  m6 = b.mul(b.tanh(m4), b.tanh(m5), name=f"{name}.m6")
  return b.tanh(m6, name=name)


def nasrnn(b: GraphBuilder, cfg: NasRNNConfig) -> None:
  """NasRNN unrolled: inputs x_0..x_{L-1} [1, hidden] and h0 [1, hidden] -> h_L [1, hidden]."""
  check_positive(b.name, **dataclasses.asdict(cfg))
  hid = cfg.hidden
  xs = [b.input((1, hid), name=f"x{t}") for t in range(cfg.length)]
  h = b.input((1, hid), name="h0")
  weights = [(b.weight((hid, hid), name=f"cell.w_x{i}"), b.weight((hid, hid), name=f"cell.w_h{i}"))
             for i in range(8)]
  for t, x in enumerate(xs):
    h = _nas_cell(b, h, x, weights, f"step{t}")
  b.output(h)


registry.register(
    "nasnet_a", "nas",
    "NasNet-A (TASO's cells): stem + 3 x (5 normal + 1 reduction) cells, input 1x3x224x224",
    nasnet_a,
    {"default": NasNetConfig(),
     "tiny": NasNetConfig(image=32, stem=8, channels=8, stages=3, normal_cells=1, classes=10)})
registry.register(
    "nasrnn", "nas", "NasRNN (TASO's cell): 5 steps of hidden 512, batch 1", nasrnn,
    {"default": NasRNNConfig(), "tiny": NasRNNConfig(hidden=16, length=2)})
