"""Layer helpers shared by the zoo's model families, on top of `GraphBuilder`.

Every helper adds plain graph ops (no fused "layer" ops), named after the layer so weights can be
told apart in the parameter store. Linear layers are a MatMul followed by a separate bias Add and
activation, the way frameworks export them, so the fusion rules have something to fuse; convs
carry a folded batch-norm as their bias and a fused activation, as TASO's model examples do.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from xrlflow_jax.errors import ModelError
from xrlflow_jax.graph import GraphBuilder, Tensor

# Additive mask value for disallowed attention positions: large enough to zero the softmax weight,
# small enough to stay finite (and so keep `where`-free masks numerically safe) in float32.
MASK_VALUE = -1e9


def activate(b: GraphBuilder, x: Tensor, act: str, name: str | None = None) -> Tensor:
  """Adds a separate activation node ("none", "relu", "gelu", "tanh" or "sigmoid")."""
  if act == "none":
    return x
  fns = {"relu": b.relu, "gelu": b.gelu, "tanh": b.tanh, "sigmoid": b.sigmoid}
  if act not in fns:
    raise ModelError(f"{b.name}: unknown activation {act!r}; use one of none/{'/'.join(fns)}")
  return fns[act](x, name=name)


def conv(b: GraphBuilder, x: Tensor, out_ch: int, kernel: int | Sequence[int], name: str, *,
         stride: int = 1, padding: str | int | Sequence[int] = 0, groups: int = 1,
         act: str = "relu", bias: bool = True) -> Tensor:
  """Conv2D (+ folded-BN bias) (+ fused activation) on x [N, C, H, W] -> [N, out_ch, Ho, Wo].

  Args:
    padding: "SAME" / "VALID", a symmetric int, a torch-style (ph, pw) pair, or explicit
      (top, left, bottom, right).
  """
  kh, kw = (kernel, kernel) if isinstance(kernel, int) else tuple(kernel)
  c = x.shape[1]
  if c % groups or out_ch % groups:
    raise ModelError(f"{b.name}: {name}: channels {c} -> {out_ch} do not divide into {groups} "
                     "groups")
  if not isinstance(padding, (str, int)) and len(padding) == 2:
    padding = (padding[0], padding[1], padding[0], padding[1])
  w = b.weight((out_ch, c // groups, kh, kw), name=f"{name}.weight")
  bias_t = b.weight((out_ch,), name=f"{name}.bias", init="bias") if bias else None
  return b.conv2d(x, w, bias_t, strides=(stride, stride), padding=padding, groups=groups,
                  activation=act, name=name)


def linear(b: GraphBuilder, x: Tensor, units: int, name: str, *, bias: bool = True,
           act: str = "none") -> Tensor:
  """x [..., d] @ W [d, units] (+ b [units]) (activation) -> [..., units], as separate nodes."""
  d = x.shape[-1]
  w = b.weight((d, units), name=f"{name}.weight", fan_in=d)
  y = b.matmul(x, w, name=name)
  if bias:
    y = b.add(y, b.weight((units,), name=f"{name}.bias", init="bias"), name=f"{name}.add_bias")
  return activate(b, y, act, name=f"{name}.{act}")


def layer_norm(b: GraphBuilder, x: Tensor, name: str, epsilon: float = 1e-5) -> Tensor:
  """LayerNorm over the last dim of x [..., d] with a random scale and bias of shape [d]."""
  d = x.shape[-1]
  scale = b.weight((d,), name=f"{name}.weight", init="scale")
  bias = b.weight((d,), name=f"{name}.bias", init="bias")
  return b.layer_norm(x, scale, bias, axis=-1, epsilon=epsilon, name=name)


def classifier_head(b: GraphBuilder, x: Tensor, classes: int, name: str = "fc") -> Tensor:
  """Global average pool, flatten and a linear layer: x [1, C, H, W] -> logits [1, classes]."""
  pooled = b.global_avg_pool(x, name="avgpool")
  flat = b.reshape(pooled, (x.shape[0], x.shape[1]), name="flatten")
  return linear(b, flat, classes, name)


def causal_mask(b: GraphBuilder, n: int, name: str) -> Tensor:
  """A constant additive mask [n, n]: 0 where key <= query, MASK_VALUE above the diagonal."""
  upper = np.triu(np.ones((n, n), bool), k=1)
  return b.constant(np.where(upper, MASK_VALUE, 0.0).astype(np.float32), name=name)


def attention(b: GraphBuilder, x: Tensor, heads: int, name: str, *, mask: Tensor | None = None,
              bias: bool = True) -> Tensor:
  """Multi-head self-attention on x [S, D] -> [S, D].

  Separate Q, K and V projections (so merge rules can join them), heads split by reshape and
  transpose into Q [H, S, Dh], K^T [H, Dh, S], V [H, S, Dh], a batched score matmul [H, S, S],
  scaling by 1/sqrt(Dh), an optional additive mask [S, S] broadcast over heads, softmax, the
  batched value matmul, heads merged back to [S, D] and the output projection.
  """
  s, d = x.shape
  if d % heads:
    raise ModelError(f"{b.name}: {name}: width {d} does not split into {heads} heads")
  dh = d // heads
  q = linear(b, x, d, f"{name}.q", bias=bias)
  k = linear(b, x, d, f"{name}.k", bias=bias)
  v = linear(b, x, d, f"{name}.v", bias=bias)
  qh = b.transpose(b.reshape(q, (s, heads, dh)), (1, 0, 2), name=f"{name}.q_heads")
  kt = b.transpose(b.reshape(k, (s, heads, dh)), (1, 2, 0), name=f"{name}.k_heads_t")
  vh = b.transpose(b.reshape(v, (s, heads, dh)), (1, 0, 2), name=f"{name}.v_heads")
  scores = b.matmul(qh, kt, name=f"{name}.scores")
  scale = b.constant(np.float32(1.0 / math.sqrt(dh)), name=f"{name}.scale")
  scores = b.mul(scores, scale, name=f"{name}.scaled")
  if mask is not None:
    scores = b.add(scores, mask, name=f"{name}.masked")
  probs = b.softmax(scores, axis=-1, name=f"{name}.softmax")
  ctx = b.matmul(probs, vh, name=f"{name}.context")
  ctx = b.reshape(b.transpose(ctx, (1, 0, 2)), (s, d), name=f"{name}.merge_heads")
  return linear(b, ctx, d, f"{name}.out", bias=bias)


def check_positive(model: str, **dims: int) -> None:
  """Raises ModelError naming the first config dim that is not a positive int."""
  for key, value in dims.items():
    if not isinstance(value, (int, np.integer)) or value < 1:
      raise ModelError(f"{model}: config field {key}={value!r} must be a positive int")
