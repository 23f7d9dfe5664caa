"""Fusion rules: conv + bias, conv/matmul + activation, batch-norm folded into the conv; inverses."""

from __future__ import annotations

import jax.numpy as jnp

from xrlflow_jax.ops import MAX_RANK as R
from xrlflow_jax.ops import Activation, Op
from xrlflow_jax.rules.pattern import Rule, RuleBuilder

ACTIVATION_OPS = {Activation.RELU: Op.RELU, Activation.SIGMOID: Op.SIGMOID,
                  Activation.TANH: Op.TANH, Activation.GELU: Op.GELU}


def reshape_attrs(dims_fn, rank: int):
  """Attributes of a Reshape to `dims_fn(m)` (a list of `rank` traced dims)."""
  def shape(m):
    d = dims_fn(m)
    return jnp.concatenate([jnp.ones([R - rank], jnp.int32), jnp.stack(d).astype(jnp.int32)])
  return {"shape": shape, "rank": rank}


def _ex_conv(bias: bool, act: str = "none"):
  def build(b, rng):
    c, o = (int(v) for v in rng.integers(1, 5, size=2))
    x = b.input((1, c, int(rng.integers(3, 8)), int(rng.integers(3, 8))))
    k = int(rng.choice([1, 3]))
    return x, b.conv2d(x, b.weight((o, c, k, k)), b.weight((o,), init="bias") if bias else None,
                       padding="SAME", activation=act), o
  return build


def conv_bias_fuse() -> Rule:
  """conv(x, w) + b (b constant, one value per channel) -> conv(x, w, b)."""
  def ex(b, rng):
    _, y, o = _ex_conv(False)(b, rng)
    shape = (1, o, 1, 1) if rng.random() < 0.5 else (o, 1, 1)
    return [b.add(y, b.weight(shape, init="bias"))]
  r = RuleBuilder("conv_bias_fuse", "conv_bias", inverse="conv_bias_unfuse", example=ex,
                  description="fold a per-channel constant add into the convolution's bias")
  x, w, bias = r.var("x"), r.var("w"), r.var("b", const=True)
  conv = r.src(Op.CONV2D, x, w)
  add = r.src(Op.ADD, conv, bias)
  o = lambda m: m.dim(w, 0)
  pos = jnp.arange(R)
  r.where(lambda m: (m.attr(conv, "activation") == 0) & (m.rank(bias) >= 3) & (m.rank(bias) <= 4)
          & jnp.all(jnp.where(pos == R - 3, m.shape(bias) == o(m), m.shape(bias) == 1)))
  flat = r.dst(Op.RESHAPE, bias, **reshape_attrs(lambda m: [o(m)], 1))
  r.replace(add, r.dst(Op.CONV2D, x, w, flat, like=conv))
  return r.build()


def conv_bias_unfuse() -> Rule:
  """conv(x, w, b) -> conv(x, w) + reshape(b, [O, 1, 1])."""
  def ex(b, rng):
    return [_ex_conv(True)(b, rng)[1]]
  r = RuleBuilder("conv_bias_unfuse", "conv_bias", inverse="conv_bias_fuse", example=ex,
                  description="split a convolution's bias into a separate add")
  x, w, bias = r.var("x"), r.var("w"), r.var("b")
  conv = r.src(Op.CONV2D, x, w, bias)
  r.where(lambda m: m.attr(conv, "activation") == 0)
  plain = r.dst(Op.CONV2D, x, w, like=conv)
  shaped = r.dst(Op.RESHAPE, bias, **reshape_attrs(lambda m: [m.dim(w, 0), 1, 1], 3))
  r.replace(conv, r.dst(Op.ADD, plain, shaped))
  return r.build()


def conv_activation_fuse(act: Activation, bias: bool) -> Rule:
  """act(conv(x, w[, b])) -> conv(x, w[, b], activation=act)."""
  name = f"conv{'_bias' if bias else ''}_{act.name.lower()}_fuse"
  act_op = ACTIVATION_OPS[act]
  def ex(b, rng):
    y = _ex_conv(bias)(b, rng)[1]
    return [b.node(act_op, [y])]
  r = RuleBuilder(name, "conv_activation", inverse=name.replace("_fuse", "_unfuse"), example=ex,
                  description=f"fuse a {act.name.lower()} into the convolution before it")
  x, w = r.var("x"), r.var("w")
  extra = [r.var("b")] if bias else []
  conv = r.src(Op.CONV2D, x, w, *extra)
  a = r.src(act_op, conv)
  r.where(lambda m: m.attr(conv, "activation") == 0)
  if act == Activation.GELU:
    r.where(lambda m: m.attr(a, "approximate") == 0)
  r.replace(a, r.dst(Op.CONV2D, x, w, *extra, like=conv, activation=int(act)))
  return r.build()


def conv_activation_unfuse(act: Activation, bias: bool) -> Rule:
  """conv(x, w[, b], activation=act) -> act(conv(x, w[, b]))."""
  name = f"conv{'_bias' if bias else ''}_{act.name.lower()}_unfuse"
  def ex(b, rng):
    return [_ex_conv(bias, act.name.lower())(b, rng)[1]]
  r = RuleBuilder(name, "conv_activation", inverse=name.replace("_unfuse", "_fuse"), example=ex,
                  description=f"split a fused {act.name.lower()} off a convolution")
  x, w = r.var("x"), r.var("w")
  extra = [r.var("b")] if bias else []
  conv = r.src(Op.CONV2D, x, w, *extra)
  r.where(lambda m: m.attr(conv, "activation") == int(act))
  plain = r.dst(Op.CONV2D, x, w, *extra, like=conv, activation=0)
  r.replace(conv, r.dst(ACTIVATION_OPS[act], plain))
  return r.build()


def _ex_matmul(act: str = "none"):
  def build(b, rng):
    k, n = (int(v) for v in rng.integers(2, 7, size=2))
    lead = tuple(int(d) for d in rng.integers(1, 4, size=int(rng.integers(1, 3))))
    return b.matmul(b.input(lead + (k,)), b.weight((k, n)), activation=act)
  return build


def matmul_activation_fuse(act: Activation) -> Rule:
  """act(a @ b) -> matmul(a, b, activation=act)."""
  name = f"matmul_{act.name.lower()}_fuse"
  act_op = ACTIVATION_OPS[act]
  r = RuleBuilder(name, "matmul_activation", inverse=name.replace("_fuse", "_unfuse"),
                  example=lambda b, rng: [b.node(act_op, [_ex_matmul()(b, rng)])],
                  description=f"fuse a {act.name.lower()} into the matmul before it")
  a, w = r.var("a"), r.var("b")
  mm = r.src(Op.MATMUL, a, w)
  y = r.src(act_op, mm)
  r.where(lambda m: m.attr(mm, "activation") == 0)
  if act == Activation.GELU:
    r.where(lambda m: m.attr(y, "approximate") == 0)
  r.replace(y, r.dst(Op.MATMUL, a, w, activation=int(act)))
  return r.build()


def matmul_activation_unfuse(act: Activation) -> Rule:
  """matmul(a, b, activation=act) -> act(a @ b)."""
  name = f"matmul_{act.name.lower()}_unfuse"
  r = RuleBuilder(name, "matmul_activation", inverse=name.replace("_unfuse", "_fuse"),
                  example=lambda b, rng: [_ex_matmul(act.name.lower())(b, rng)],
                  description=f"split a fused {act.name.lower()} off a matmul")
  a, w = r.var("a"), r.var("b")
  mm = r.src(Op.MATMUL, a, w)
  r.where(lambda m: m.attr(mm, "activation") == int(act))
  r.replace(mm, r.dst(ACTIVATION_OPS[act], r.dst(Op.MATMUL, a, w, activation=0)))
  return r.build()


def fold_batch_norm(bias: bool) -> Rule:
  """batch_norm(conv(x, w[, cb]), s, b, mean, var) -> conv(x, w', b') with folded weights.

  w' = w * s / sqrt(var + eps) per output channel and b' = (cb - mean) * s / sqrt(var + eps) + b
  are built from ops on constants (so the executor computes them once at lowering): the zero
  vector is mean - mean, and both products are BatchNorm ops applied to weights.
  """
  name = "fold_batch_norm" + ("_bias" if bias else "")
  def ex(b, rng):
    return [b.batch_norm(_ex_conv(bias)(b, rng)[1])]
  r = RuleBuilder(name, "batch_norm", example=ex,
                  description="fold an inference batch-norm into the preceding convolution")
  x, w = r.var("x"), r.var("w", const=True)
  cb = r.var("cb", const=True) if bias else None
  s, b = r.var("s", const=True), r.var("b", const=True)
  mean, var = r.var("mean", const=True), r.var("var", const=True)
  conv = r.src(Op.CONV2D, x, w, *([cb] if bias else []))
  bn = r.src(Op.BATCH_NORM, conv, s, b, mean, var)
  r.where(lambda m: m.attr(conv, "activation") == 0)
  eps = lambda m: m.attr(bn, "epsilon")
  o = lambda m: m.dim(w, 0)
  swap = (1, 0, 2, 3, 0, 0)
  zero = r.dst(Op.SUB, mean, mean)
  wt = r.dst(Op.TRANSPOSE, w, perm=swap)
  wn = r.dst(Op.BATCH_NORM, wt, s, zero, zero, var, epsilon=eps)
  w2 = r.dst(Op.TRANSPOSE, wn, perm=swap)
  row = r.dst(Op.RESHAPE, cb if bias else zero, **reshape_attrs(lambda m: [1, o(m)], 2))
  bb = r.dst(Op.BATCH_NORM, row, s, b, mean, var, epsilon=eps)
  b2 = r.dst(Op.RESHAPE, bb, **reshape_attrs(lambda m: [o(m)], 1))
  r.replace(bn, r.dst(Op.CONV2D, x, w2, b2, like=conv))
  return r.build()


def rules() -> list[Rule]:
  """Every fusion-family rule."""
  out = [conv_bias_fuse(), conv_bias_unfuse(), fold_batch_norm(False), fold_batch_norm(True)]
  for act in (Activation.RELU, Activation.SIGMOID, Activation.TANH):
    for bias in (False, True):
      out += [conv_activation_fuse(act, bias), conv_activation_unfuse(act, bias)]
  for act in (Activation.RELU, Activation.SIGMOID, Activation.TANH, Activation.GELU):
    out += [matmul_activation_fuse(act), matmul_activation_unfuse(act)]
  return out
