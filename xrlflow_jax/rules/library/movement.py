"""Data-movement rules: activations and elementwise ops moved through concat and split (slices),
split(concat) and concat(split) cancellation, transpose and reshape cancellation and fusion."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from xrlflow_jax.ops import MAX_RANK as R
from xrlflow_jax.ops import Op
from xrlflow_jax.rules.pattern import MatchView, Ref, Rule, RuleBuilder

UNARY = (Op.RELU, Op.SIGMOID, Op.TANH)
BINARY = (Op.ADD, Op.MUL)


def _pair_for_concat(b, rng):
  """Two tensors that concatenate along a random axis: (x, y, axis)."""
  shape = [int(v) for v in rng.integers(1, 5, size=int(rng.integers(1, 4)))]
  axis = int(rng.integers(0, len(shape)))
  other = list(shape)
  other[axis] = int(rng.integers(1, 5))
  mk = lambda s: b.input(tuple(s)) if rng.random() < 0.7 else b.weight(tuple(s))
  return mk(shape), mk(other), axis


def unary_concat(op: Op, hoist: bool) -> Rule:
  """concat(f(a), f(b)) <-> f(concat(a, b)) for an elementwise activation f."""
  low = op.name.lower()
  name = f"{low}_after_concat" if hoist else f"{low}_before_concat"
  def ex(b, rng):
    x, y, axis = _pair_for_concat(b, rng)
    if hoist:
      return [b.concat([b.node(op, [x]), b.node(op, [y])], axis)]
    return [b.node(op, [b.concat([x, y], axis)])]
  r = RuleBuilder(name, "concat_movement", example=ex,
                  inverse=f"{low}_before_concat" if hoist else f"{low}_after_concat",
                  description=f"move {low} through a concat")
  a, b = r.var("a"), r.var("b")
  if hoist:
    fa, fb = r.src(op, a), r.src(op, b)
    c = r.src(Op.CONCAT, fa, fb)
    r.replace(c, r.dst(op, r.dst(Op.CONCAT, a, b, like=c)))
  else:
    c = r.src(Op.CONCAT, a, b)
    f = r.src(op, c)
    r.replace(f, r.dst(Op.CONCAT, r.dst(op, a), r.dst(op, b), like=c))
  return r.build()


def binary_concat(op: Op, hoist: bool) -> Rule:
  """concat(a op b, c op d) <-> concat(a, c) op concat(b, d) (no broadcasting)."""
  low = op.name.lower()
  name = f"{low}_after_concat" if hoist else f"{low}_before_concat"
  def ex(bld, rng):
    x, y, axis = _pair_for_concat(bld, rng)
    x2 = bld.weight(x.shape) if rng.random() < 0.5 else bld.input(x.shape)
    y2 = bld.weight(y.shape) if rng.random() < 0.5 else bld.input(y.shape)
    if hoist:
      return [bld.concat([bld.node(op, [x, x2]), bld.node(op, [y, y2])], axis)]
    return [bld.node(op, [bld.concat([x, y], axis), bld.concat([x2, y2], axis)])]
  r = RuleBuilder(name, "concat_movement", example=ex,
                  inverse=f"{low}_before_concat" if hoist else f"{low}_after_concat",
                  description=f"move {low} through a concat")
  a, b, c, d = r.var("a"), r.var("b"), r.var("c"), r.var("d")
  if hoist:
    e1, e2 = r.src(op, a, b), r.src(op, c, d)
    cat = r.src(Op.CONCAT, e1, e2)
    r.where(lambda m: m.same_shape(a, b) & m.same_shape(c, d))
    r.replace(cat, r.dst(op, r.dst(Op.CONCAT, a, c, like=cat), r.dst(Op.CONCAT, b, d, like=cat)))
  else:
    c1, c2 = r.src(Op.CONCAT, a, c), r.src(Op.CONCAT, b, d)
    e = r.src(op, c1, c2)
    r.where(lambda m: m.same_shape(a, b) & m.same_shape(c, d)
            & (m.attr(c1, "axis") == m.attr(c2, "axis")))
    r.replace(e, r.dst(Op.CONCAT, r.dst(op, a, b), r.dst(op, c, d), like=c1))
  return r.build()


def unary_slice(op: Op, hoist: bool) -> Rule:
  """f(slice(x)) <-> slice(f(x)) for an elementwise activation f."""
  low = op.name.lower()
  name = f"{low}_before_slice" if hoist else f"{low}_after_slice"
  def ex(b, rng):
    shape = tuple(int(v) for v in rng.integers(2, 6, size=int(rng.integers(1, 4))))
    x = b.input(shape)
    axis = int(rng.integers(0, len(shape)))
    start = int(rng.integers(0, shape[axis] - 1))
    if hoist:
      return [b.node(op, [b.slice(x, axis, start, shape[axis])])]
    fx = b.node(op, [x])
    return [b.slice(fx, axis, start, shape[axis])] + ([fx] if rng.random() < 0.3 else [])
  r = RuleBuilder(name, "slice_movement", example=ex,
                  inverse=f"{low}_after_slice" if hoist else f"{low}_before_slice",
                  description=f"move {low} through a slice")
  x = r.var("x")
  if hoist:
    s = r.src(Op.SLICE, x)
    f = r.src(op, s)
    r.replace(f, r.dst(Op.SLICE, r.dst(op, x), like=s))
  else:
    f = r.src(op, x, keep=True)
    s = r.src(Op.SLICE, f)
    r.replace(s, r.dst(op, r.dst(Op.SLICE, x, like=s)))
  return r.build()


def slice_of_concat(which: int) -> Rule:
  """slice(concat(a, b)) that selects exactly a (which=0) or b (which=1) -> that input."""
  name = f"slice_of_concat_{'first' if which == 0 else 'second'}"
  def ex(b, rng):
    x, y, axis = _pair_for_concat(b, rng)
    c = b.concat([x, y], axis)
    n0 = x.shape[axis]
    lo, hi = (0, n0) if which == 0 else (n0, n0 + y.shape[axis])
    outs = [b.slice(c, axis, lo, hi)]
    return outs + ([c] if rng.random() < 0.3 else [])
  r = RuleBuilder(name, "concat_slice", example=ex,
                  description="a slice that selects one input of a concat is that input")
  a, b = r.var("a"), r.var("b")
  c = r.src(Op.CONCAT, a, b, keep=True)
  s = r.src(Op.SLICE, c)
  def cond(m: MatchView):
    axis = m.attr(c, "axis")
    na = m.dim(a, axis)
    lo, hi = (0, na) if which == 0 else (na, na + m.dim(b, axis))
    return ((m.attr(s, "axis") == axis) & (m.attr(s, "start") == lo) & (m.attr(s, "end") == hi)
            & (m.attr(s, "step") == 1))
  r.where(cond)
  r.replace(s, a if which == 0 else b)
  return r.build()


def concat_of_slices() -> Rule:
  """concat(x[:k], x[k:]) along one axis -> x."""
  def ex(b, rng):
    shape = tuple(int(v) for v in rng.integers(2, 6, size=int(rng.integers(1, 4))))
    x = b.input(shape)
    axis = int(rng.integers(0, len(shape)))
    k = int(rng.integers(1, shape[axis]))
    return [b.concat([b.slice(x, axis, 0, k), b.slice(x, axis, k, shape[axis])], axis)]
  r = RuleBuilder("concat_of_slices", "concat_slice", example=ex,
                  description="concatenating adjacent slices that cover a tensor gives it back")
  x = r.var("x")
  s1, s2 = r.src(Op.SLICE, x, keep=True), r.src(Op.SLICE, x, keep=True)
  c = r.src(Op.CONCAT, s1, s2)
  def cond(m: MatchView):
    axis = m.attr(c, "axis")
    return ((m.attr(s1, "axis") == axis) & (m.attr(s2, "axis") == axis)
            & (m.attr(s1, "start") == 0) & (m.attr(s1, "end") == m.attr(s2, "start"))
            & (m.attr(s2, "end") == m.dim(x, axis)) & (m.attr(s1, "step") == 1)
            & (m.attr(s2, "step") == 1))
  r.where(cond)
  r.replace(c, x)
  return r.build()


def _composed_perm(m: MatchView, inner: Ref, outer: Ref, x: Ref):
  """perm of transpose(transpose(x, p1), p2) as one transpose: q[i] = p1[p2[i]]."""
  p1, p2 = m.attr(inner, "perm"), m.attr(outer, "perm")
  pos = jnp.arange(R)
  return jnp.where(pos < m.rank(x), p1[p2], 0)


def _ex_two_transposes(identity: bool):
  def ex(b, rng):
    rank = int(rng.integers(2, 5))
    shape = tuple(int(v) for v in rng.integers(1, 5, size=rank))
    x = b.input(shape)
    p1 = [int(v) for v in rng.permutation(rank)]
    if p1 == list(range(rank)):
      p1 = p1[1:] + p1[:1]
    t1 = b.transpose(x, p1)
    p2 = [int(v) for v in np.argsort(p1)] if identity else [int(v) for v in rng.permutation(rank)]
    if not identity and [p1[i] for i in p2] == list(range(rank)):
      p2 = p2[1:] + p2[:1]
    outs = [b.transpose(t1, p2)]
    return outs + ([t1] if rng.random() < 0.3 else [])
  return ex


def transpose_pair(cancel: bool) -> Rule:
  """transpose(transpose(x)) -> x (when the perms cancel) or one transpose (otherwise)."""
  name = "transpose_cancel" if cancel else "transpose_fuse"
  r = RuleBuilder(name, "transpose", example=_ex_two_transposes(cancel),
                  description="two transposes compose into one (or none)")
  x = r.var("x")
  t1 = r.src(Op.TRANSPOSE, x, keep=True)
  t2 = r.src(Op.TRANSPOSE, t1)
  is_identity = lambda m: jnp.all(jnp.where(jnp.arange(R) < m.rank(x),
                                            _composed_perm(m, t1, t2, x) == jnp.arange(R), True))
  if cancel:
    r.where(is_identity)
    r.replace(t2, x)
  else:
    r.where(lambda m: ~is_identity(m))
    r.replace(t2, r.dst(Op.TRANSPOSE, x, perm=lambda m: _composed_perm(m, t1, t2, x)))
  return r.build()


def reshape_pair(cancel: bool) -> Rule:
  """reshape(reshape(x)) -> x (back to x's shape) or one reshape (otherwise)."""
  name = "reshape_cancel" if cancel else "reshape_fuse"
  def ex(b, rng):
    shape = tuple(int(v) for v in rng.integers(1, 5, size=int(rng.integers(2, 4))))
    x = b.input(shape)
    total = int(np.prod(shape))
    r1 = b.reshape(x, (total,) if rng.random() < 0.5 else (shape[0], -1))
    final = shape if cancel else (total,) if len(r1.shape) > 1 else (1, total)
    outs = [b.reshape(r1, final)]
    return outs + ([r1] if rng.random() < 0.3 else [])
  r = RuleBuilder(name, "reshape", example=ex,
                  description="two reshapes compose into one (or none)")
  x = r.var("x")
  r1 = r.src(Op.RESHAPE, x, keep=True)
  r2 = r.src(Op.RESHAPE, r1)
  same = lambda m: m.same_shape(x, r2)
  if cancel:
    r.where(same)
    r.replace(r2, x)
  else:
    r.where(lambda m: ~same(m))
    r.replace(r2, r.dst(Op.RESHAPE, x, like=r2))
  return r.build()


def rules() -> list[Rule]:
  """Every data-movement rule."""
  out = []
  for op in UNARY:
    out += [unary_concat(op, True), unary_concat(op, False), unary_slice(op, True),
            unary_slice(op, False)]
  for op in BINARY:
    out += [binary_concat(op, True), binary_concat(op, False)]
  out += [slice_of_concat(0), slice_of_concat(1), concat_of_slices(), transpose_pair(True),
          transpose_pair(False), reshape_pair(True), reshape_pair(False)]
  return out
