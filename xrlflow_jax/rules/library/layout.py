"""Layout rules: convolutions, pools and batch norms moved to NHWC, and the transposes that
bridge the layouts moved through the graph until they meet and cancel.

XLA:CPU runs NHWC convolutions with HWIO weights markedly faster than NCHW ones (a ResNet-50
stack in 0.68x the time, measured on the project's 2-core CPU), but every imported graph is
NCHW. One convolution moved to NHWC costs two transposes (a temporary loss); the rules below
then carry the NHWC -> NCHW transpose downstream through the next convolution, pool, batch
norm, elementwise op and concat, each step keeping one transpose, until it reaches the outputs
or meets its inverse (`transpose_cancel`, family "transpose"). A constant weight's transpose
to HWIO is a constant subgraph: the executor folds it once, when the graph is lowered.

Transposes here are the rank-4 perms TO_NHWC = (0, 2, 3, 1) and TO_NCHW = (0, 3, 1, 2);
the elementwise and concat rules move any perm.

MatMuls have a layout choice too: x [M, K] @ w [K, N] can be computed transposed, as
T(w) [N, K] @ T(x) [K, M] -> [N, M], with the (folded) weight as the left operand. With few
rows (M = 16-64) and a large weight the transposed form measured 0.65-0.85x the time of
x @ w (plain JAX on the project's 2-core CPU; slower for M = 1 and M = 197; our reading:
XLA:CPU's dot library repacks its right operand on every call). XLA would fold a transpose
that directly reads a dot back into the dot (the original form); the executor keeps the dot
as written (`executor._pinned_dots`). `matmul_transposed_bias` takes the bias add after a
MatMul along, and a chain
of linear layers keeps the transposed layout through activations
(`unary_through_transpose`), bias and scale vectors (`*_through_transpose_and_vector`) and the
next MatMul (`matmul_*through_transpose*`).
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import numpy as np

from xrlflow_jax.ops import MAX_RANK as R
from xrlflow_jax.ops import Layout, Op
from xrlflow_jax.rules.library.fusion import reshape_attrs
from xrlflow_jax.rules.pattern import MatchView, Ref, Rule, RuleBuilder

FAMILY = "layout"
TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)
OIHW_TO_HWIO = (2, 3, 1, 0)
UNARY = (Op.RELU, Op.SIGMOID, Op.TANH, Op.GELU, Op.CLIP, Op.HARD_SWISH, Op.HARD_SIGMOID)
BINARY = (Op.ADD, Op.MUL, Op.SUB, Op.DIV, Op.MAX, Op.MIN)
POOLS = (Op.MAX_POOL, Op.AVG_POOL, Op.GLOBAL_AVG_POOL)
CONCAT_INPUTS = (2, 3, 4)
SWAP = (1, 0)
VECTOR_OPS = (Op.ADD, Op.MUL)


def _perm_attr(perm: tuple[int, ...]) -> tuple[int, ...]:
  return tuple(perm) + (0,) * (R - len(perm))


def _is_perm(m: MatchView, t: Ref, perm: tuple[int, ...]) -> jnp.ndarray:
  """The transpose `t` is of rank len(perm) with exactly `perm`."""
  return (m.rank(t) == len(perm)) & jnp.all(m.attr(t, "perm") == jnp.asarray(_perm_attr(perm)))


def _nchw(m: MatchView, ref: Ref) -> jnp.ndarray:
  return m.attr(ref, "layout") == Layout.NCHW


def _inverse_perm(m: MatchView, t: Ref, x: Ref) -> jnp.ndarray:
  """int32[R]: the perm that undoes transpose `t` of `x` (padded like a perm attribute)."""
  p = m.attr(t, "perm")
  pos = jnp.arange(R)
  inv = jnp.zeros([R], jnp.int32).at[jnp.where(pos < m.rank(x), p, R)].set(
      pos.astype(jnp.int32), mode="drop")
  return jnp.where(pos < m.rank(x), inv, 0)


def _column(c: Ref) -> dict:
  """The attributes of a Reshape of a vector c [n] to a column [n, 1]."""
  return reshape_attrs(lambda m: [m.dim(c, 0), 1], 2)


# ---------------------------------------------------------------------------------- examples

def _conv_example(bias: bool, through: bool) -> Callable:
  """conv(x, w[, b]) on NCHW x; `through`: x is the NHWC -> NCHW transpose of an input."""
  def ex(b, rng):
    c = int(rng.integers(1, 5))
    groups = int(rng.choice([1, c])) if rng.random() < 0.3 else 1
    o = groups * int(rng.integers(1, 4))
    h, w_ = (int(v) for v in rng.integers(3, 8, size=2))
    if through:
      x = b.transpose(b.input((int(rng.integers(1, 3)), h, w_, c)), TO_NCHW)
    else:
      x = b.input((int(rng.integers(1, 3)), c, h, w_))
    k = int(rng.choice([1, 3]))
    stride = int(rng.choice([1, 2]))
    return [b.conv2d(x, b.weight((o, c // groups, k, k)),
                     b.weight((o,), init="bias") if bias else None, strides=(stride, stride),
                     padding="SAME", groups=groups,
                     activation=str(rng.choice(["none", "relu"])))]
  return ex


def _nhwc_to_nchw_input(b, rng):
  shape = (int(rng.integers(1, 3)),) + tuple(int(v) for v in rng.integers(2, 7, size=3))
  return b.transpose(b.input(shape), TO_NCHW)


def _random_transposed(b, rng, shape=None):
  """transpose(x, p) for a random rank 2-4 x and perm p; returns (t, perm)."""
  if shape is None:
    shape = tuple(int(v) for v in rng.integers(1, 5, size=int(rng.integers(2, 5))))
  perm = [int(v) for v in rng.permutation(len(shape))]
  src = tuple(shape[int(i)] for i in np.argsort(perm))  # so that transpose(src, perm) is `shape`
  x = b.input(src) if rng.random() < 0.8 else b.weight(src)
  return b.transpose(x, perm), perm


def _linear_example(bias: bool, through: bool) -> Callable:
  """x [M, K] @ w [K, N] (+ c [N]); `through`: x is the transpose of an input [K, M]."""
  def ex(b, rng):
    m, k, n = (int(v) for v in rng.integers(1, 6, size=3))
    x = b.transpose(b.input((k, m)), SWAP) if through else b.input((m, k))
    w = b.weight((k, n)) if rng.random() < 0.8 else b.input((k, n))
    y = b.matmul(x, w, activation=str(rng.choice(["none", "relu", "gelu"])))
    return [b.add(y, b.weight((n,), init="bias")) if bias else y]
  return ex


# ---------------------------------------------------------------------------------- rules

def conv_to_nhwc(bias: bool) -> Rule:
  """conv_NCHW(x, w[, b]) -> T_NCHW(conv_NHWC(T_NHWC(x), T_HWIO(w)[, b]))."""
  name = "conv_to_nhwc" + ("_bias" if bias else "")
  r = RuleBuilder(name, FAMILY, example=_conv_example(bias, through=False), layout_aware=True,
                  description="run a convolution in NHWC between two transposes")
  x, w = r.var("x"), r.var("w")
  args = (r.var("b"),) if bias else ()
  conv = r.src(Op.CONV2D, x, w, *args)
  r.where(lambda m: _nchw(m, conv))
  xt = r.dst(Op.TRANSPOSE, x, perm=_perm_attr(TO_NHWC))
  wt = r.dst(Op.TRANSPOSE, w, perm=_perm_attr(OIHW_TO_HWIO))
  y = r.dst(Op.CONV2D, xt, wt, *args, like=conv, layout=int(Layout.NHWC))
  r.replace(conv, r.dst(Op.TRANSPOSE, y, perm=_perm_attr(TO_NCHW)))
  return r.build()


def conv_through_transpose(bias: bool) -> Rule:
  """conv_NCHW(T_NCHW(y), w[, b]) -> T_NCHW(conv_NHWC(y, T_HWIO(w)[, b])): the transpose
  moves past the convolution, which runs in NHWC."""
  name = "conv_nhwc_through_transpose" + ("_bias" if bias else "")
  r = RuleBuilder(name, FAMILY, example=_conv_example(bias, through=True), layout_aware=True,
                  description="move an NHWC-to-NCHW transpose past a convolution, run in NHWC")
  y, w = r.var("y"), r.var("w")
  args = (r.var("b"),) if bias else ()
  t = r.src(Op.TRANSPOSE, y, keep=True)
  conv = r.src(Op.CONV2D, t, w, *args)
  r.where(lambda m: _nchw(m, conv) & _is_perm(m, t, TO_NCHW))
  wt = r.dst(Op.TRANSPOSE, w, perm=_perm_attr(OIHW_TO_HWIO))
  z = r.dst(Op.CONV2D, y, wt, *args, like=conv, layout=int(Layout.NHWC))
  r.replace(conv, r.dst(Op.TRANSPOSE, z, perm=_perm_attr(TO_NCHW)))
  return r.build()


def pool_through_transpose(op: Op) -> Rule:
  """pool_NCHW(T_NCHW(y)) -> T_NCHW(pool_NHWC(y)) (max, average and global average pools)."""
  low = {Op.MAX_POOL: "max_pool", Op.AVG_POOL: "avg_pool",
         Op.GLOBAL_AVG_POOL: "global_avg_pool"}[op]
  def ex(b, rng):
    t = _nhwc_to_nchw_input(b, rng)
    if op == Op.GLOBAL_AVG_POOL:
      return [b.global_avg_pool(t)]
    k = int(rng.integers(1, 3))
    s = int(rng.integers(1, 3))
    pool = b.max_pool if op == Op.MAX_POOL else b.avg_pool
    return [pool(t, (k, k), (s, s), padding=str(rng.choice(["VALID", "SAME"])),
                 ceil_mode=bool(rng.random() < 0.3))]
  r = RuleBuilder(f"{low}_nhwc_through_transpose", FAMILY, example=ex, layout_aware=True,
                  description=f"move an NHWC-to-NCHW transpose past a {low}, run in NHWC")
  y = r.var("y")
  t = r.src(Op.TRANSPOSE, y, keep=True)
  pool = r.src(op, t)
  r.where(lambda m: _nchw(m, pool) & _is_perm(m, t, TO_NCHW))
  z = r.dst(op, y, like=pool, layout=int(Layout.NHWC))
  r.replace(pool, r.dst(Op.TRANSPOSE, z, perm=_perm_attr(TO_NCHW)))
  return r.build()


def batch_norm_through_transpose() -> Rule:
  """batch_norm_NCHW(T_NCHW(y), ...) -> T_NCHW(batch_norm_NHWC(y, ...))."""
  def ex(b, rng):
    return [b.batch_norm(_nhwc_to_nchw_input(b, rng))]
  r = RuleBuilder("batch_norm_nhwc_through_transpose", FAMILY, example=ex, layout_aware=True,
                  description="move an NHWC-to-NCHW transpose past a batch norm, run in NHWC")
  y = r.var("y")
  stats = [r.var(n) for n in ("scale", "bias", "mean", "var")]
  t = r.src(Op.TRANSPOSE, y, keep=True)
  bn = r.src(Op.BATCH_NORM, t, *stats)
  r.where(lambda m: _nchw(m, bn) & _is_perm(m, t, TO_NCHW))
  z = r.dst(Op.BATCH_NORM, y, *stats, like=bn, layout=int(Layout.NHWC))
  r.replace(bn, r.dst(Op.TRANSPOSE, z, perm=_perm_attr(TO_NCHW)))
  return r.build()


def unary_through_transpose(op: Op) -> Rule:
  """f(T_p(y)) -> T_p(f(y)) for an elementwise f and any perm p."""
  low = op.name.lower()
  def ex(b, rng):
    t, _ = _random_transposed(b, rng)
    return [b.node(op, [t])]
  r = RuleBuilder(f"{low}_through_transpose", FAMILY, example=ex, layout_aware=True,
                  description=f"move a transpose past {low}")
  y = r.var("y")
  t = r.src(Op.TRANSPOSE, y, keep=True)
  f = r.src(op, t)
  r.replace(f, r.dst(Op.TRANSPOSE, r.dst(op, y, like=f), like=t))
  return r.build()


def binary_through_transposes(op: Op) -> Rule:
  """T_p(a) op T_p(b) -> T_p(a op b) for an elementwise op, both operands of one rank."""
  low = op.name.lower()
  def ex(b, rng):
    t1, perm = _random_transposed(b, rng)
    shape = tuple(1 if rng.random() < 0.2 else d for d in t1.shape)  # broadcasting kept
    src = tuple(shape[int(i)] for i in np.argsort(perm))
    t2 = b.transpose(b.input(src) if rng.random() < 0.7 else b.weight(src), perm)
    return [b.node(op, [t1, t2] if rng.random() < 0.5 else [t2, t1])]
  r = RuleBuilder(f"{low}_through_transposes", FAMILY, example=ex, layout_aware=True,
                  description=f"one transpose after {low} instead of one on each operand")
  a, c = r.var("a"), r.var("b")
  ta, tc = r.src(Op.TRANSPOSE, a, keep=True), r.src(Op.TRANSPOSE, c, keep=True)
  f = r.src(op, ta, tc)
  r.where(lambda m: (m.rank(a) == m.rank(c))
          & jnp.all(m.attr(ta, "perm") == m.attr(tc, "perm")))
  r.replace(f, r.dst(Op.TRANSPOSE, r.dst(op, a, c, like=f), like=ta))
  return r.build()


def binary_through_transpose_and_constant(op: Op, transposed_first: bool,
                                          vector: bool = False) -> Rule:
  """T_p(a) op c -> T_p(a op T_p^-1(c)) (or c op T_p(a)) for a constant c of a's rank: the
  constant's transpose is folded when the graph is lowered. `vector`: c is a constant vector
  [n] and T swaps the axes of a rank-2 a, so T(a) op c -> T(a op c[:, None]): a bias or scale
  carried along a transposed MatMul chain."""
  low = op.name.lower()
  kind = "vector" if vector else "constant"
  name = f"{low}_through_transpose_" + (f"and_{kind}" if transposed_first else f"after_{kind}")
  def ex(b, rng):
    if vector:
      m, n = (int(v) for v in rng.integers(1, 6, size=2))
      t, c = b.transpose(b.input((n, m)), SWAP), b.weight((n,), init="bias")
    else:
      t, _ = _random_transposed(b, rng)
      shape = tuple(1 if rng.random() < 0.5 else d for d in t.shape)
      c = b.weight(shape) if op != Op.DIV else b.constant(
          rng.uniform(0.5, 2.0, shape).astype(np.float32))
    return [b.node(op, [t, c] if transposed_first else [c, t])]
  how = "as a column" if vector else "transposing it"
  r = RuleBuilder(name, FAMILY, example=ex, layout_aware=True,
                  description=f"move a transpose past {low} with a {kind}, {how}")
  a, c = r.var("a"), r.var("c", const=True)
  t = r.src(Op.TRANSPOSE, a, keep=True)
  f = r.src(op, t, c) if transposed_first else r.src(op, c, t)
  if vector:
    r.where(lambda m: _is_perm(m, t, SWAP) & (m.rank(c) == 1))
    ct = r.dst(Op.RESHAPE, c, **_column(c))
  else:
    r.where(lambda m: m.rank(a) == m.rank(c))
    ct = r.dst(Op.TRANSPOSE, c, perm=lambda m: _inverse_perm(m, t, a))
  inner = r.dst(op, a, ct, like=f) if transposed_first else r.dst(op, ct, a, like=f)
  r.replace(f, r.dst(Op.TRANSPOSE, inner, like=t))
  return r.build()


def concat_through_transposes(n: int) -> Rule:
  """concat(T_p(x1), ..., T_p(xn), axis) -> T_p(concat(x1, ..., xn, axis=p[axis]))."""
  def ex(b, rng):
    rank = int(rng.integers(2, 5))
    shape = [int(v) for v in rng.integers(1, 4, size=rank)]
    perm = [int(v) for v in rng.permutation(rank)]
    axis = int(rng.integers(0, rank))
    parts = []
    for _ in range(n):
      s = list(shape)
      s[axis] = int(rng.integers(1, 4))
      src = tuple(s[int(i)] for i in np.argsort(perm))
      parts.append(b.transpose(b.input(src) if rng.random() < 0.8 else b.weight(src), perm))
    return [b.concat(parts, axis)]
  r = RuleBuilder(f"concat_{n}_through_transposes", FAMILY, example=ex, layout_aware=True,
                  description="one transpose after a concat instead of one on each input")
  xs = [r.var(f"x{i}") for i in range(n)]
  ts = [r.src(Op.TRANSPOSE, x, keep=True) for x in xs]
  c = r.src(Op.CONCAT, *ts)
  def same_perm(m: MatchView):
    ok = jnp.asarray(True)
    for x, t in zip(xs[1:], ts[1:]):
      ok = ok & (m.rank(x) == m.rank(xs[0])) & jnp.all(m.attr(t, "perm") == m.attr(ts[0], "perm"))
    return ok
  r.where(same_perm)
  inner = r.dst(Op.CONCAT, *xs, like=c,
                axis=lambda m: m.attr(ts[0], "perm")[m.attr(c, "axis")])
  r.replace(c, r.dst(Op.TRANSPOSE, inner, like=ts[0]))
  return r.build()


def matmul_transposed(bias: bool, through: bool) -> Rule:
  """x @ w [+ c] -> T(T(w) @ T(x) [+ c[:, None]]) for rank-2 x and w, c a constant vector;
  `through`: x is T(y), and T(x) is y itself (the transpose moves past the MatMul)."""
  name = "matmul_" + ("through_transpose" if through else "transposed") + ("_bias" if bias else "")
  what = "move a transpose past a MatMul" if through else "compute a MatMul transposed"
  r = RuleBuilder(name, FAMILY, example=_linear_example(bias, through), layout_aware=True,
                  description=what + (", its bias add with it" if bias else "")
                  + " (weight on the left)")
  x, w = r.var("y" if through else "x"), r.var("w")
  t = r.src(Op.TRANSPOSE, x, keep=True) if through else None
  mm = r.src(Op.MATMUL, t if through else x, w)
  root = mm
  if bias:
    c = r.var("c", const=True)
    root = r.src(Op.ADD, mm, c)
  def ok(m: MatchView) -> jnp.ndarray:
    good = (m.rank(x) == 2) & (m.rank(w) == 2)
    if through:
      good = good & _is_perm(m, t, SWAP)
    if bias:
      good = good & (m.rank(c) == 1)
    return good
  r.where(ok)
  wt = r.dst(Op.TRANSPOSE, w, perm=_perm_attr(SWAP))
  xt = x if through else r.dst(Op.TRANSPOSE, x, perm=_perm_attr(SWAP))
  y = r.dst(Op.MATMUL, wt, xt, like=mm)
  if bias:
    y = r.dst(Op.ADD, y, r.dst(Op.RESHAPE, c, **_column(c)))
  r.replace(root, r.dst(Op.TRANSPOSE, y, perm=_perm_attr(SWAP)))
  return r.build()


def rules() -> list[Rule]:
  """Every layout rule."""
  out = [conv_to_nhwc(False), conv_to_nhwc(True), conv_through_transpose(False),
         conv_through_transpose(True), batch_norm_through_transpose()]
  out += [pool_through_transpose(op) for op in POOLS]
  out += [unary_through_transpose(op) for op in UNARY]
  for op in BINARY:
    out += [binary_through_transposes(op), binary_through_transpose_and_constant(op, True),
            binary_through_transpose_and_constant(op, False)]
  out += [concat_through_transposes(n) for n in CONCAT_INPUTS]
  out += [matmul_transposed(bias, through) for through in (False, True) for bias in (False, True)]
  out += [binary_through_transpose_and_constant(op, first, vector=True) for op in VECTOR_OPS
          for first in (True, False)]
  return out
