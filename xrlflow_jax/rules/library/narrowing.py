"""Narrowing rules: a slice moved toward the tensors it reads, so what it drops is never computed.

A classifier that reads one token (ViT's and BERT's class token: an ONNX Gather of one constant
index, imported as Slice + Squeeze) computes the last layer's feed-forward network, attention
output projection and queries for every token, then keeps one row. XLA does not move a slice
through a dot (measured on the project's 2-core CPU: an MLP of 197 tokens x 768 -> 3072 -> 768
then a slice of token 0 ran in 10.2 ms, the same MLP on the sliced row in 1.0 ms). Each rule
here moves one slice one op up: through elementwise ops (operands broadcast along the sliced
axis are read whole), layer norms and softmaxes that do not reduce over it, a MatMul's rows or
columns (a column slice of a constant weight is folded when the graph is lowered), transposes
and reshapes that keep the axis whole. The op above loses its other rows, and once no one else
reads them the op itself goes (`rules.edit` frees unread nodes). A slice that keeps the whole
axis is left alone, so the rules cannot cycle.

Slices here are single-axis (`Op.SLICE`: axis, start, end, step); every rule keeps start, end and
step and maps only the axis.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from xrlflow_jax.ops import MAX_RANK as R
from xrlflow_jax.ops import Op
from xrlflow_jax.rules.library import dedupe
from xrlflow_jax.rules.pattern import MatchView, Ref, Rule, RuleBuilder

FAMILY = "narrowing"
# Elementwise ops a slice moves through (movement.UNARY's ReLU, sigmoid and tanh already have
# `*_after_slice` in family "slice_movement").
UNARY = (Op.GELU, Op.ERF, Op.EXP, Op.NEG, Op.CLIP, Op.HARD_SIGMOID, Op.HARD_SWISH)
BINARY = (Op.ADD, Op.SUB, Op.MUL, Op.DIV)
NORMS = ((Op.SOFTMAX, 1), (Op.LOG_SOFTMAX, 1), (Op.LAYER_NORM, 2), (Op.LAYER_NORM, 3))


# ---------------------------------------------------------------------------------- conditions

def _axis(m: MatchView, s: Ref) -> jnp.ndarray:
  return m.attr(s, "axis")


def _narrows(m: MatchView, s: Ref, f: Ref) -> jnp.ndarray:
  """The slice `s` of `f` drops something (a whole-axis slice is not moved)."""
  return m.dim(s, _axis(m, s)) < m.dim(f, _axis(m, s))


def _axis_in(m: MatchView, s: Ref, f: Ref, x: Ref) -> jnp.ndarray:
  """The sliced axis of `f` in the frame of its operand `x` (right-aligned; < 0: x lacks it)."""
  return _axis(m, s) - (m.rank(f) - m.rank(x))


def _whole_at(m: MatchView, s: Ref, f: Ref, x: Ref) -> jnp.ndarray:
  """`x` spans f's whole extent along the sliced axis, so it is sliced with f."""
  ax = _axis_in(m, s, f, x)
  return (ax >= 0) & (m.dim(x, ax) == m.dim(f, _axis(m, s)))


def _broadcast_at(m: MatchView, s: Ref, f: Ref, x: Ref) -> jnp.ndarray:
  """`x` is broadcast along the sliced axis (absent or of size 1), so it is read whole."""
  ax = _axis_in(m, s, f, x)
  return (ax < 0) | (m.dim(x, ax) == 1)


def _slice_of(r: RuleBuilder, x: Ref, s: Ref, f: Ref) -> Ref:
  """Target: the slice `s` of `f`, applied to f's operand `x` instead."""
  return r.dst(Op.SLICE, x, like=s, axis=lambda m: _axis_in(m, s, f, x))


# ---------------------------------------------------------------------------------- examples

def _narrow_slice(b, rng, t, axes: list[int] | None = None):
  """A slice of `t` that drops something, along a random axis of `axes` (default: any axis)."""
  axes = [a for a in (axes if axes is not None else range(t.rank)) if t.shape[a] > 1]
  axis = int(rng.choice(axes))
  n = t.shape[axis]
  start = int(rng.integers(0, n))
  end = int(rng.integers(start + 1, n + 1))
  if end - start == n:
    end -= 1
  step = int(rng.integers(1, 3)) if end - start > 2 else 1
  return b.slice(t, axis, start, end, step)


def _shape(rng, rank: int | None = None, low: int = 2) -> tuple[int, ...]:
  rank = rank if rank is not None else int(rng.integers(1, 4))
  return tuple(int(v) for v in rng.integers(low, 5, size=rank))


def _with_kept(rng, out, f):
  return [out] + ([f] if rng.random() < 0.3 else [])


# ---------------------------------------------------------------------------------- rules

def slice_through_unary(op: Op) -> Rule:
  """slice(f(x)) -> f(slice(x)) for an elementwise f."""
  low = op.name.lower()
  def ex(b, rng):
    f = b.node(op, [b.input(_shape(rng))])
    return _with_kept(rng, _narrow_slice(b, rng, f), f)
  r = RuleBuilder(f"slice_through_{low}", FAMILY, example=ex,
                  description=f"slice before {low} instead of after it")
  x = r.var("x")
  f = r.src(op, x, keep=True)
  s = r.src(Op.SLICE, f)
  r.where(lambda m: _narrows(m, s, f))
  r.replace(s, r.dst(op, _slice_of(r, x, s, f), like=f))
  return r.build()


def slice_through_binary(op: Op, sliced: str) -> Rule:
  """slice(a op b) -> slice(a) op slice(b) ("both"), slice(a) op b ("lhs": b broadcast along the
  axis) or a op slice(b) ("rhs": a broadcast along it)."""
  low = op.name.lower()
  def ex(bld, rng):
    shape = _shape(rng, int(rng.integers(1, 4)))
    axis = int(rng.integers(0, len(shape)))
    def operand(whole: bool, positive: bool):
      s = list(shape)
      if not whole:  # broadcast along `axis`: size 1 there, or leading axes dropped
        s = s[axis + 1:] if rng.random() < 0.5 else s[:axis] + [1] + s[axis + 1:]
        s = s or [1]
      if positive:
        return bld.constant(rng.uniform(0.5, 2.0, s).astype(np.float32))
      return bld.input(tuple(s)) if rng.random() < 0.7 else bld.weight(tuple(s))
    a = operand(sliced != "rhs", False)
    c = operand(sliced != "lhs", op == Op.DIV)
    f = bld.node(op, [a, c])
    return _with_kept(rng, _narrow_slice(bld, rng, f, [axis]), f)
  r = RuleBuilder(f"slice_through_{low}_{sliced}", FAMILY, example=ex,
                  description=f"slice the operands of {low} instead of its result "
                              f"({'both' if sliced == 'both' else 'the ' + sliced} sliced)")
  a, c = r.var("a"), r.var("b")
  f = r.src(op, a, c, keep=True)
  s = r.src(Op.SLICE, f)
  conds = {"both": (_whole_at, _whole_at), "lhs": (_whole_at, _broadcast_at),
           "rhs": (_broadcast_at, _whole_at)}[sliced]
  r.where(lambda m: _narrows(m, s, f) & conds[0](m, s, f, a) & conds[1](m, s, f, c))
  na = _slice_of(r, a, s, f) if sliced != "rhs" else a
  nc = _slice_of(r, c, s, f) if sliced != "lhs" else c
  r.replace(s, r.dst(op, na, nc, like=f))
  return r.build()


def slice_through_norm(op: Op, arity: int) -> Rule:
  """slice(norm(x, ...)) -> norm(slice(x), ...) when the norm does not reduce over the sliced
  axis (softmax: any other axis; layer norm: an axis before its first normalised one).
  `arity`: the norm's inputs (a layer norm's scale and bias are read whole)."""
  low = op.name.lower()
  def ex(b, rng):
    x = b.input(_shape(rng, int(rng.integers(2, 4))))
    axis = int(rng.integers(1, x.rank))
    if op == Op.LAYER_NORM:
      params = [b.weight(x.shape[axis:], init=init) for init in ("scale", "bias")[:arity - 1]]
      f = b.node(op, [x] + params, axis=axis, epsilon=1e-5)
      keep = list(range(axis))
    else:
      f = b.node(op, [x], axis=axis)
      keep = [a for a in range(x.rank) if a != axis]
    return _with_kept(rng, _narrow_slice(b, rng, f, keep), f)
  name = f"slice_through_{low}" + (f"_{arity}" if op == Op.LAYER_NORM else "")
  r = RuleBuilder(name, FAMILY, example=ex,
                  description=f"slice before {low} when it does not reduce over the sliced axis")
  x = r.var("x")
  params = [r.var(f"p{i}") for i in range(arity - 1)]
  f = r.src(op, x, *params, keep=True)
  s = r.src(Op.SLICE, f)
  if op == Op.LAYER_NORM:
    r.where(lambda m: _narrows(m, s, f) & (_axis(m, s) < m.attr(f, "axis")))
  else:
    r.where(lambda m: _narrows(m, s, f) & (_axis(m, s) != m.attr(f, "axis")))
  r.replace(s, r.dst(op, _slice_of(r, x, s, f), *params, like=f))
  return r.build()


def slice_through_matmul(columns: bool) -> Rule:
  """slice(a @ b) -> slice(a) @ b (rows, or a batch axis along which b is broadcast), or
  a @ slice(b) (columns; a constant b's slice is folded when the graph is lowered)."""
  def ex(bld, rng):
    m, k, n = (int(v) for v in rng.integers(2, 5, size=3))
    batch = _shape(rng, int(rng.integers(0, 2)))
    a = bld.input(batch + (m, k))
    c = bld.weight((k, n)) if rng.random() < 0.6 else bld.input((k, n))
    f = bld.matmul(a, c, activation="relu" if rng.random() < 0.3 else "none")
    axes = [f.rank - 1] if columns else list(range(f.rank - 1))
    return _with_kept(rng, _narrow_slice(bld, rng, f, axes), f)
  r = RuleBuilder("slice_through_matmul_" + ("columns" if columns else "rows"), FAMILY,
                  example=ex, description="slice a MatMul's " + (
                      "right operand's columns" if columns else "left operand's rows")
                  + " instead of its result")
  a, c = r.var("a"), r.var("b")
  f = r.src(Op.MATMUL, a, c, keep=True)
  s = r.src(Op.SLICE, f)
  last = lambda m: m.rank(f) - 1
  if columns:
    r.where(lambda m: _narrows(m, s, f) & (_axis(m, s) == last(m)))
    r.replace(s, r.dst(Op.MATMUL, a, _slice_of(r, c, s, f), like=f))
  else:
    r.where(lambda m: _narrows(m, s, f) & _whole_at(m, s, f, a) & (
        (_axis(m, s) == last(m) - 1)
        | ((_axis(m, s) < last(m) - 1) & _broadcast_at(m, s, f, c))))
    r.replace(s, r.dst(Op.MATMUL, _slice_of(r, a, s, f), c, like=f))
  return r.build()


def slice_through_transpose() -> Rule:
  """slice(T_p(x), axis) -> T_p(slice(x, p[axis]))."""
  def ex(b, rng):
    x = b.input(_shape(rng, int(rng.integers(2, 5)), low=1))
    if max(x.shape) == 1:
      x = b.input((2,) + x.shape[1:])
    f = b.transpose(x, [int(p) for p in rng.permutation(x.rank)])
    return _with_kept(rng, _narrow_slice(b, rng, f), f)
  r = RuleBuilder("slice_through_transpose", FAMILY, example=ex,
                  description="slice before a transpose instead of after it")
  x = r.var("x")
  t = r.src(Op.TRANSPOSE, x, keep=True)
  s = r.src(Op.SLICE, t)
  r.where(lambda m: _narrows(m, s, t))
  inner = r.dst(Op.SLICE, x, like=s, axis=lambda m: m.attr(t, "perm")[_axis(m, s)])
  r.replace(s, r.dst(Op.TRANSPOSE, inner, like=t))
  return r.build()


def _reshape_source_axis(m: MatchView, x: Ref, f: Ref, s: Ref) -> tuple[jnp.ndarray, jnp.ndarray]:
  """(found, axis of x): the input axis that the reshape `f` keeps whole as its output axis
  `s.axis`: same size, and the same number of elements before it. Rows of that axis are then
  rows of the same elements on both sides of the reshape."""
  pos = jnp.arange(R)
  at = R - m.rank(f) + _axis(m, s)  # padded position of the sliced axis in f's shape
  out_shape, in_shape = m.shape(f), m.shape(x)
  before_out = jnp.prod(jnp.where(pos < at, out_shape, 1))
  # Elements before each input position (shapes are padded with leading ones).
  before_in = jnp.cumprod(in_shape) // in_shape
  hit = (before_in == before_out) & (in_shape == out_shape[at]) & (pos >= R - m.rank(x))
  return jnp.any(hit), jnp.argmax(hit) - (R - m.rank(x))


def slice_through_reshape() -> Rule:
  """slice(reshape(x), axis) -> reshape(slice(x, b)) where the reshape keeps axis b of x whole
  as `axis` (e.g. [S, D] -> [S, H, D/H] keeps the token axis)."""
  def ex(b, rng):
    lead = _shape(rng, int(rng.integers(0, 2)), low=1)
    kept = int(rng.integers(2, 5))
    tail = _shape(rng, 2, low=1)
    x = b.input(lead + (kept,) + tail)
    if rng.random() < 0.5:  # [*lead, kept, *tail] -> [*lead, kept, prod(tail)]
      f, axis = b.reshape(x, lead + (kept, int(np.prod(tail)))), len(lead)
    else:  # -> [prod(lead), kept, *reversed(tail)]
      f, axis = b.reshape(x, (int(np.prod(lead)), kept) + tail[::-1]), 1
    return _with_kept(rng, _narrow_slice(b, rng, f, [axis]), f)
  r = RuleBuilder("slice_through_reshape", FAMILY, example=ex,
                  description="slice before a reshape that keeps the sliced axis whole")
  x = r.var("x")
  f = r.src(Op.RESHAPE, x, keep=True)
  s = r.src(Op.SLICE, f)
  r.where(lambda m: _narrows(m, s, f) & _reshape_source_axis(m, x, f, s)[0])
  inner = r.dst(Op.SLICE, x, like=s, axis=lambda m: _reshape_source_axis(m, x, f, s)[1])
  r.replace(s, r.dst(Op.RESHAPE, inner, shape=lambda m: m.shape(s), rank=lambda m: m.rank(s)))
  return r.build()


def rules() -> list[Rule]:
  """Every narrowing rule."""
  out = [slice_through_unary(op) for op in UNARY]
  out += [slice_through_binary(op, w) for op in BINARY for w in ("both", "lhs", "rhs")]
  out += [slice_through_norm(op, k) for op, k in NORMS]
  out += [slice_through_matmul(False), slice_through_matmul(True), slice_through_transpose(),
          slice_through_reshape(),
          dedupe.dedupe(Op.SLICE, 1, family=FAMILY, name="join_equal_slices")]
  return out

