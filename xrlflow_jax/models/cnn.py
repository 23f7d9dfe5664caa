"""Convolutional benchmark models with torchvision's structure: InceptionV3, SqueezeNet 1.1,
ResNet-18, ResNet-50 and ResNeXt-50 (32x4d).

Inference graphs: every batch norm is folded into its conv as a bias and every ReLU that follows
a conv is fused into it (as TASO's model examples do); dropout is omitted; the auxiliary
classifier of InceptionV3 (training only) is omitted. Input NCHW with batch 1.
"""

from __future__ import annotations

import dataclasses

from xrlflow_jax.graph import GraphBuilder, Tensor
from xrlflow_jax.models import registry
from xrlflow_jax.models.layers import check_positive, classifier_head, conv


# ------------------------------------------------------------------ InceptionV3

@dataclasses.dataclass(frozen=True)
class InceptionConfig:
  """InceptionV3: channel widths are torchvision's x width_num / width_den (at least 1).

  blocks: how many of each of Mixed 5 (InceptionA), 6b-e (InceptionC) and 7b-c (InceptionE) to
  use (torchvision: 3, 4, 2); the reduction blocks 6a (B) and 7a (D) are always present.
  """
  image: int = 299
  width_num: int = 1
  width_den: int = 1
  blocks: tuple[int, int, int] = (3, 4, 2)
  classes: int = 1000


def _inception_a(b: GraphBuilder, x: Tensor, pool_features: int, ch, name: str) -> Tensor:
  b1 = conv(b, x, ch(64), 1, f"{name}.branch1x1")
  b5 = conv(b, x, ch(48), 1, f"{name}.branch5x5_1")
  b5 = conv(b, b5, ch(64), 5, f"{name}.branch5x5_2", padding=2)
  b3 = conv(b, x, ch(64), 1, f"{name}.branch3x3dbl_1")
  b3 = conv(b, b3, ch(96), 3, f"{name}.branch3x3dbl_2", padding=1)
  b3 = conv(b, b3, ch(96), 3, f"{name}.branch3x3dbl_3", padding=1)
  bp = b.avg_pool(x, (3, 3), (1, 1), 1, count_include_pad=True, name=f"{name}.pool")
  bp = conv(b, bp, pool_features, 1, f"{name}.branch_pool")
  return b.concat([b1, b5, b3, bp], axis=1, name=name)


def _inception_b(b: GraphBuilder, x: Tensor, ch, name: str) -> Tensor:
  b3 = conv(b, x, ch(384), 3, f"{name}.branch3x3", stride=2)
  bd = conv(b, x, ch(64), 1, f"{name}.branch3x3dbl_1")
  bd = conv(b, bd, ch(96), 3, f"{name}.branch3x3dbl_2", padding=1)
  bd = conv(b, bd, ch(96), 3, f"{name}.branch3x3dbl_3", stride=2)
  bp = b.max_pool(x, (3, 3), (2, 2), name=f"{name}.pool")
  return b.concat([b3, bd, bp], axis=1, name=name)


def _inception_c(b: GraphBuilder, x: Tensor, c7: int, ch, name: str) -> Tensor:
  b1 = conv(b, x, ch(192), 1, f"{name}.branch1x1")
  b7 = conv(b, x, c7, 1, f"{name}.branch7x7_1")
  b7 = conv(b, b7, c7, (1, 7), f"{name}.branch7x7_2", padding=(0, 3))
  b7 = conv(b, b7, ch(192), (7, 1), f"{name}.branch7x7_3", padding=(3, 0))
  bd = conv(b, x, c7, 1, f"{name}.branch7x7dbl_1")
  bd = conv(b, bd, c7, (7, 1), f"{name}.branch7x7dbl_2", padding=(3, 0))
  bd = conv(b, bd, c7, (1, 7), f"{name}.branch7x7dbl_3", padding=(0, 3))
  bd = conv(b, bd, c7, (7, 1), f"{name}.branch7x7dbl_4", padding=(3, 0))
  bd = conv(b, bd, ch(192), (1, 7), f"{name}.branch7x7dbl_5", padding=(0, 3))
  bp = b.avg_pool(x, (3, 3), (1, 1), 1, count_include_pad=True, name=f"{name}.pool")
  bp = conv(b, bp, ch(192), 1, f"{name}.branch_pool")
  return b.concat([b1, b7, bd, bp], axis=1, name=name)


def _inception_d(b: GraphBuilder, x: Tensor, ch, name: str) -> Tensor:
  b3 = conv(b, x, ch(192), 1, f"{name}.branch3x3_1")
  b3 = conv(b, b3, ch(320), 3, f"{name}.branch3x3_2", stride=2)
  b7 = conv(b, x, ch(192), 1, f"{name}.branch7x7x3_1")
  b7 = conv(b, b7, ch(192), (1, 7), f"{name}.branch7x7x3_2", padding=(0, 3))
  b7 = conv(b, b7, ch(192), (7, 1), f"{name}.branch7x7x3_3", padding=(3, 0))
  b7 = conv(b, b7, ch(192), 3, f"{name}.branch7x7x3_4", stride=2)
  bp = b.max_pool(x, (3, 3), (2, 2), name=f"{name}.pool")
  return b.concat([b3, b7, bp], axis=1, name=name)


def _inception_e(b: GraphBuilder, x: Tensor, ch, name: str) -> Tensor:
  b1 = conv(b, x, ch(320), 1, f"{name}.branch1x1")
  b3 = conv(b, x, ch(384), 1, f"{name}.branch3x3_1")
  b3 = b.concat([conv(b, b3, ch(384), (1, 3), f"{name}.branch3x3_2a", padding=(0, 1)),
                 conv(b, b3, ch(384), (3, 1), f"{name}.branch3x3_2b", padding=(1, 0))], axis=1)
  bd = conv(b, x, ch(448), 1, f"{name}.branch3x3dbl_1")
  bd = conv(b, bd, ch(384), 3, f"{name}.branch3x3dbl_2", padding=1)
  bd = b.concat([conv(b, bd, ch(384), (1, 3), f"{name}.branch3x3dbl_3a", padding=(0, 1)),
                 conv(b, bd, ch(384), (3, 1), f"{name}.branch3x3dbl_3b", padding=(1, 0))], axis=1)
  bp = b.avg_pool(x, (3, 3), (1, 1), 1, count_include_pad=True, name=f"{name}.pool")
  bp = conv(b, bp, ch(192), 1, f"{name}.branch_pool")
  return b.concat([b1, b3, bd, bp], axis=1, name=name)


def inception_v3(b: GraphBuilder, cfg: InceptionConfig) -> None:
  """InceptionV3 (torchvision, eval mode): input [1, 3, image, image] -> logits [1, classes]."""
  check_positive(b.name, image=cfg.image, width_num=cfg.width_num, width_den=cfg.width_den,
                 classes=cfg.classes, **{f"blocks{i}": n for i, n in enumerate(cfg.blocks)})

  def ch(c: int) -> int:
    return max(1, c * cfg.width_num // cfg.width_den)

  x = b.input((1, 3, cfg.image, cfg.image), name="image")
  x = conv(b, x, ch(32), 3, "Conv2d_1a_3x3", stride=2)
  x = conv(b, x, ch(32), 3, "Conv2d_2a_3x3")
  x = conv(b, x, ch(64), 3, "Conv2d_2b_3x3", padding=1)
  x = b.max_pool(x, (3, 3), (2, 2), name="maxpool1")
  x = conv(b, x, ch(80), 1, "Conv2d_3b_1x1")
  x = conv(b, x, ch(192), 3, "Conv2d_4a_3x3")
  x = b.max_pool(x, (3, 3), (2, 2), name="maxpool2")
  n_a, n_c, n_e = cfg.blocks
  for i in range(n_a):  # Mixed_5b has 32 pool features, 5c and 5d have 64
    x = _inception_a(b, x, ch(32) if i == 0 else ch(64), ch, f"Mixed_5{chr(ord('b') + i)}")
  x = _inception_b(b, x, ch, "Mixed_6a")
  c7s = (128, 160, 160, 192)  # 7x7-branch widths of Mixed_6b..6e
  for i in range(n_c):
    x = _inception_c(b, x, ch(c7s[min(i, 3)]), ch, f"Mixed_6{chr(ord('b') + i)}")
  x = _inception_d(b, x, ch, "Mixed_7a")
  for i in range(n_e):
    x = _inception_e(b, x, ch, f"Mixed_7{chr(ord('b') + i)}")
  b.output(classifier_head(b, x, cfg.classes))


# ------------------------------------------------------------------ SqueezeNet 1.1

@dataclasses.dataclass(frozen=True)
class SqueezeNetConfig:
  """SqueezeNet 1.1: channel widths are torchvision's / width_div (at least 1)."""
  image: int = 224
  width_div: int = 1
  classes: int = 1000


def _fire(b: GraphBuilder, x: Tensor, squeeze: int, expand: int, name: str) -> Tensor:
  s = conv(b, x, squeeze, 1, f"{name}.squeeze")
  e1 = conv(b, s, expand, 1, f"{name}.expand1x1")
  e3 = conv(b, s, expand, 3, f"{name}.expand3x3", padding=1)
  return b.concat([e1, e3], axis=1, name=name)


def squeezenet1_1(b: GraphBuilder, cfg: SqueezeNetConfig) -> None:
  """SqueezeNet 1.1 (torchvision): input [1, 3, image, image] -> logits [1, classes]."""
  check_positive(b.name, image=cfg.image, width_div=cfg.width_div, classes=cfg.classes)

  def ch(c: int) -> int:
    return max(1, c // cfg.width_div)

  x = b.input((1, 3, cfg.image, cfg.image), name="image")
  x = conv(b, x, ch(64), 3, "features.0", stride=2)
  fires = [(16, 64), (16, 64), "pool", (32, 128), (32, 128), "pool", (48, 192), (48, 192),
           (64, 256), (64, 256)]
  x = b.max_pool(x, (3, 3), (2, 2), ceil_mode=True, name="features.2")
  for i, f in enumerate(fires):
    if f == "pool":
      x = b.max_pool(x, (3, 3), (2, 2), ceil_mode=True, name=f"pool{i}")
    else:
      x = _fire(b, x, ch(f[0]), ch(f[1]), f"fire{i}")
  # Classifier: a 1x1 conv to the classes with ReLU, then global average pooling and flatten.
  x = conv(b, x, cfg.classes, 1, "classifier.1")
  x = b.global_avg_pool(x, name="classifier.3")
  b.output(b.reshape(x, (1, cfg.classes), name="flatten"))


# ------------------------------------------------------------------ ResNet / ResNeXt

@dataclasses.dataclass(frozen=True)
class ResNetConfig:
  """torchvision ResNet family (v1.5: the stride sits on the 3x3 conv of a bottleneck).

  block: "basic" (ResNet-18/34) or "bottleneck" (ResNet-50, ResNeXt). A bottleneck's inner
  width is planes * width_per_group / 64 * groups, its output planes * 4.
  """
  block: str = "bottleneck"
  layers: tuple[int, ...] = (3, 4, 6, 3)
  base: int = 64
  groups: int = 1
  width_per_group: int = 64
  image: int = 224
  classes: int = 1000


def _basic_block(b: GraphBuilder, x: Tensor, planes: int, stride: int, name: str) -> Tensor:
  out = conv(b, x, planes, 3, f"{name}.conv1", stride=stride, padding=1)
  out = conv(b, out, planes, 3, f"{name}.conv2", padding=1, act="none")
  if stride != 1 or x.shape[1] != planes:
    x = conv(b, x, planes, 1, f"{name}.downsample", stride=stride, act="none")
  return b.relu(b.add(out, x, name=f"{name}.add"), name=f"{name}.relu")


def _bottleneck(b: GraphBuilder, x: Tensor, planes: int, stride: int, cfg: ResNetConfig,
                name: str) -> Tensor:
  width = planes * cfg.width_per_group // 64 * cfg.groups
  out = conv(b, x, width, 1, f"{name}.conv1")
  out = conv(b, out, width, 3, f"{name}.conv2", stride=stride, padding=1, groups=cfg.groups)
  out = conv(b, out, planes * 4, 1, f"{name}.conv3", act="none")
  if stride != 1 or x.shape[1] != planes * 4:
    x = conv(b, x, planes * 4, 1, f"{name}.downsample", stride=stride, act="none")
  return b.relu(b.add(out, x, name=f"{name}.add"), name=f"{name}.relu")


def resnet(b: GraphBuilder, cfg: ResNetConfig) -> None:
  """ResNet or ResNeXt (BN folded): input [1, 3, image, image] -> logits [1, classes]."""
  check_positive(b.name, base=cfg.base, groups=cfg.groups, width_per_group=cfg.width_per_group,
                 image=cfg.image, classes=cfg.classes,
                 **{f"layers{i}": n for i, n in enumerate(cfg.layers)})
  x = b.input((1, 3, cfg.image, cfg.image), name="image")
  x = conv(b, x, cfg.base, 7, "conv1", stride=2, padding=3)
  x = b.max_pool(x, (3, 3), (2, 2), 1, name="maxpool")
  for stage, blocks in enumerate(cfg.layers):
    planes = cfg.base * 2 ** stage
    for i in range(blocks):
      stride = 2 if stage > 0 and i == 0 else 1
      name = f"layer{stage + 1}.{i}"
      if cfg.block == "basic":
        x = _basic_block(b, x, planes, stride, name)
      else:
        x = _bottleneck(b, x, planes, stride, cfg, name)
  b.output(classifier_head(b, x, cfg.classes))


registry.register(
    "inception_v3", "cnn",
    "InceptionV3 (torchvision, BN folded into conv bias + fused ReLU), input 1x3x299x299",
    inception_v3,
    {"default": InceptionConfig(),
     "tiny": InceptionConfig(image=75, width_num=1, width_den=8, blocks=(1, 1, 1), classes=10)})
registry.register(
    "squeezenet1_1", "cnn", "SqueezeNet 1.1 (torchvision), input 1x3x224x224", squeezenet1_1,
    {"default": SqueezeNetConfig(),
     "tiny": SqueezeNetConfig(image=64, width_div=8, classes=10)})
registry.register(
    "resnext50", "cnn", "ResNeXt-50 32x4d (grouped 3x3 convs, groups=32), input 1x3x224x224",
    resnet,
    {"default": ResNetConfig(groups=32, width_per_group=4),
     "tiny": ResNetConfig(layers=(1, 1, 1, 1), base=8, groups=4, width_per_group=16, image=32,
                          classes=10)})
registry.register(
    "resnet18", "cnn", "ResNet-18 (torchvision, BN folded), input 1x3x224x224", resnet,
    {"default": ResNetConfig(block="basic", layers=(2, 2, 2, 2)),
     "tiny": ResNetConfig(block="basic", layers=(1, 1, 1, 1), base=8, image=32, classes=10)})
registry.register(
    "resnet50", "cnn", "ResNet-50 v1.5 (torchvision, BN folded), input 1x3x224x224", resnet,
    {"default": ResNetConfig(),
     "tiny": ResNetConfig(layers=(1, 1, 1, 1), base=8, image=32, classes=10)})
