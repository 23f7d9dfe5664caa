"""Algebraic rules: matmul associativity and distributivity, elementwise associativity,
commutativity and distributivity, transpose of a matmul."""

from __future__ import annotations

import jax.numpy as jnp

from xrlflow_jax.ops import MAX_RANK as R
from xrlflow_jax.ops import Op
from xrlflow_jax.rules.pattern import MatchView, Ref, Rule, RuleBuilder


def _same_rank(m: MatchView, *refs: Ref):
  ok = True
  for ref in refs[1:]:
    ok = ok & (m.rank(ref) == m.rank(refs[0]))
  return ok


def _plain(m: MatchView, *mms: Ref):
  ok = True
  for mm in mms:
    ok = ok & (m.attr(mm, "activation") == 0)
  return ok


def _ex_chain(b, rng):
  d = [int(v) for v in rng.integers(2, 7, size=4)]
  return b.input((d[0], d[1])), b.weight((d[1], d[2])), b.weight((d[2], d[3]))


def matmul_assoc_left_to_right() -> Rule:
  """(a @ b) @ c -> a @ (b @ c)."""
  def ex(b, rng):
    a, w1, w2 = _ex_chain(b, rng)
    return [b.matmul(b.matmul(a, w1), w2)]
  r = RuleBuilder("matmul_assoc_right", "matmul_algebra", inverse="matmul_assoc_left",
                  example=ex, description="(a @ b) @ c -> a @ (b @ c): with b, c weights the "
                                          "inner product is folded at lowering")
  a, b, c = r.var("a"), r.var("b"), r.var("c")
  inner = r.src(Op.MATMUL, a, b)
  outer = r.src(Op.MATMUL, inner, c)
  r.where(lambda m: _plain(m, inner, outer) & _same_rank(m, a, b, c))
  r.replace(outer, r.dst(Op.MATMUL, a, r.dst(Op.MATMUL, b, c)))
  return r.build()


def matmul_assoc_right_to_left() -> Rule:
  """a @ (b @ c) -> (a @ b) @ c."""
  def ex(b, rng):
    a, w1, w2 = _ex_chain(b, rng)
    return [b.matmul(a, b.matmul(w1, w2))]
  r = RuleBuilder("matmul_assoc_left", "matmul_algebra", inverse="matmul_assoc_right",
                  example=ex, description="a @ (b @ c) -> (a @ b) @ c")
  a, b, c = r.var("a"), r.var("b"), r.var("c")
  inner = r.src(Op.MATMUL, b, c)
  outer = r.src(Op.MATMUL, a, inner)
  r.where(lambda m: _plain(m, inner, outer) & _same_rank(m, a, b, c))
  r.replace(outer, r.dst(Op.MATMUL, r.dst(Op.MATMUL, a, b), c))
  return r.build()


def matmul_distribute(side: str, direction: str) -> Rule:
  """a@b + a@c <-> a@(b+c) (side "left"), a@c + b@c <-> (a+b)@c (side "right")."""
  name = f"matmul_{'factor' if direction == 'factor' else 'expand'}_{side}"
  inverse = f"matmul_{'expand' if direction == 'factor' else 'factor'}_{side}"

  def ex(bld, rng):
    m_, k, n = (int(v) for v in rng.integers(2, 6, size=3))
    if side == "left":
      a, u, v = bld.input((m_, k)), bld.weight((k, n)), bld.weight((k, n))
      if direction == "factor":
        return [bld.add(bld.matmul(a, u), bld.matmul(a, v))]
      return [bld.matmul(a, bld.add(u, v))]
    u, v, c = bld.input((m_, k)), bld.input((m_, k)), bld.weight((k, n))
    if direction == "factor":
      return [bld.add(bld.matmul(u, c), bld.matmul(v, c))]
    return [bld.matmul(bld.add(u, v), c)]

  r = RuleBuilder(name, "matmul_algebra", inverse=inverse, example=ex,
                  description="distributivity of matmul over addition")
  if side == "left":
    a, b, c = r.var("a"), r.var("b"), r.var("c")
    if direction == "factor":
      m1, m2 = r.src(Op.MATMUL, a, b), r.src(Op.MATMUL, a, c)
      add = r.src(Op.ADD, m1, m2)
      r.where(lambda m: _plain(m, m1, m2) & m.same_shape(b, c) & _same_rank(m, a, b))
      r.replace(add, r.dst(Op.MATMUL, a, r.dst(Op.ADD, b, c)))
    else:
      s = r.src(Op.ADD, b, c)
      mm = r.src(Op.MATMUL, a, s)
      r.where(lambda m: _plain(m, mm) & m.same_shape(b, c) & _same_rank(m, a, b))
      r.replace(mm, r.dst(Op.ADD, r.dst(Op.MATMUL, a, b), r.dst(Op.MATMUL, a, c)))
  else:
    a, b, c = r.var("a"), r.var("b"), r.var("c")
    if direction == "factor":
      m1, m2 = r.src(Op.MATMUL, a, c), r.src(Op.MATMUL, b, c)
      add = r.src(Op.ADD, m1, m2)
      r.where(lambda m: _plain(m, m1, m2) & m.same_shape(a, b) & _same_rank(m, a, c))
      r.replace(add, r.dst(Op.MATMUL, r.dst(Op.ADD, a, b), c))
    else:
      s = r.src(Op.ADD, a, b)
      mm = r.src(Op.MATMUL, s, c)
      r.where(lambda m: _plain(m, mm) & m.same_shape(a, b) & _same_rank(m, a, c))
      r.replace(mm, r.dst(Op.ADD, r.dst(Op.MATMUL, a, c), r.dst(Op.MATMUL, b, c)))
  return r.build()


def _ew_inputs(b, rng, n):
  """n random tensors that broadcast together (some of lower rank)."""
  shape = tuple(int(v) for v in rng.integers(1, 5, size=int(rng.integers(1, 4))))
  out = []
  for _ in range(n):
    s = shape[int(rng.integers(0, len(shape))):] if rng.random() < 0.3 else shape
    out.append(b.input(s) if rng.random() < 0.5 else b.weight(s))
  return out


def commute(op: Op) -> Rule:
  """a op b -> b op a (its own inverse)."""
  name = f"{op.name.lower()}_commute"
  def ex(b, rng):
    x, y = _ew_inputs(b, rng, 2)
    return [b.node(op, [x, y])]
  r = RuleBuilder(name, "elementwise_algebra", inverse=name, example=ex,
                  description=f"commutativity of {op.name.lower()}")
  a, b = r.var("a"), r.var("b")
  e = r.src(op, a, b)
  r.replace(e, r.dst(op, b, a))
  return r.build()


def associate(op: Op, to_right: bool) -> Rule:
  """(a op b) op c <-> a op (b op c)."""
  name = f"{op.name.lower()}_assoc_{'right' if to_right else 'left'}"
  inverse = f"{op.name.lower()}_assoc_{'left' if to_right else 'right'}"
  def ex(b, rng):
    x, y, z = _ew_inputs(b, rng, 3)
    if to_right:
      return [b.node(op, [b.node(op, [x, y]), z])]
    return [b.node(op, [x, b.node(op, [y, z])])]
  r = RuleBuilder(name, "elementwise_algebra", inverse=inverse, example=ex,
                  description=f"associativity of {op.name.lower()}")
  a, b, c = r.var("a"), r.var("b"), r.var("c")
  if to_right:
    inner = r.src(op, a, b)
    outer = r.src(op, inner, c)
    r.replace(outer, r.dst(op, a, r.dst(op, b, c)))
  else:
    inner = r.src(op, b, c)
    outer = r.src(op, a, inner)
    r.replace(outer, r.dst(op, r.dst(op, a, b), c))
  return r.build()


def ew_distribute(factor: bool) -> Rule:
  """a*b + a*c <-> a*(b + c)."""
  name = "mul_add_factor" if factor else "mul_add_expand"
  def ex(b, rng):
    x, y, z = _ew_inputs(b, rng, 3)
    if factor:
      return [b.add(b.mul(x, y), b.mul(x, z))]
    return [b.mul(x, b.add(y, z))]
  r = RuleBuilder(name, "elementwise_algebra",
                  inverse="mul_add_expand" if factor else "mul_add_factor", example=ex,
                  description="distributivity of elementwise multiplication over addition")
  a, b, c = r.var("a"), r.var("b"), r.var("c")
  if factor:
    m1, m2 = r.src(Op.MUL, a, b), r.src(Op.MUL, a, c)
    add = r.src(Op.ADD, m1, m2)
    r.replace(add, r.dst(Op.MUL, a, r.dst(Op.ADD, b, c)))
  else:
    s = r.src(Op.ADD, b, c)
    mul = r.src(Op.MUL, a, s)
    r.replace(mul, r.dst(Op.ADD, r.dst(Op.MUL, a, b), r.dst(Op.MUL, a, c)))
  return r.build()


def _swap_last_two(m: MatchView, ref: Ref):
  """The perm that swaps the last two axes of a tensor of ref's rank (width R)."""
  rank = m.rank(ref)
  pos = jnp.arange(R)
  perm = jnp.where(pos == rank - 1, rank - 2, jnp.where(pos == rank - 2, rank - 1, pos))
  return jnp.where(pos < rank, perm, 0)


def _is_swap(m: MatchView, t: Ref, ref: Ref):
  return jnp.all(m.attr(t, "perm") == _swap_last_two(m, ref))


def transpose_matmul(forward: bool) -> Rule:
  """(a @ b)^T <-> b^T @ a^T (transposes of the last two axes)."""
  name = "transpose_of_matmul" if forward else "matmul_of_transposes"
  def ex(b, rng):
    m_, k, n = (int(v) for v in rng.integers(2, 6, size=3))
    lead = (int(rng.integers(1, 3)),) if rng.random() < 0.5 else ()
    a, w = b.input(lead + (m_, k)), b.weight(lead + (k, n))
    sw = tuple(range(len(lead))) + (len(lead) + 1, len(lead))
    if forward:
      return [b.transpose(b.matmul(a, w), sw)]
    return [b.matmul(b.transpose(w, sw), b.transpose(a, sw))]
  r = RuleBuilder(name, "transpose", example=ex,
                  inverse="matmul_of_transposes" if forward else "transpose_of_matmul",
                  description="a transposed product is the product of transposes, swapped")
  a, b = r.var("a"), r.var("b")
  if forward:
    mm = r.src(Op.MATMUL, a, b)
    t = r.src(Op.TRANSPOSE, mm)
    r.where(lambda m: _plain(m, mm) & _same_rank(m, a, b) & _is_swap(m, t, mm))
    bt = r.dst(Op.TRANSPOSE, b, perm=lambda m: _swap_last_two(m, b))
    at = r.dst(Op.TRANSPOSE, a, perm=lambda m: _swap_last_two(m, a))
    r.replace(t, r.dst(Op.MATMUL, bt, at))
  else:
    bt = r.src(Op.TRANSPOSE, b, keep=True)
    at = r.src(Op.TRANSPOSE, a, keep=True)
    mm = r.src(Op.MATMUL, bt, at)
    r.where(lambda m: _plain(m, mm) & _same_rank(m, a, b) & _is_swap(m, bt, b)
            & _is_swap(m, at, a))
    prod = r.dst(Op.MATMUL, a, b)
    r.replace(mm, r.dst(Op.TRANSPOSE, prod, perm=lambda m: _swap_last_two(m, a)))
  return r.build()


def rules() -> list[Rule]:
  """Every algebra-family rule."""
  out = [matmul_assoc_left_to_right(), matmul_assoc_right_to_left()]
  for side in ("left", "right"):
    for direction in ("factor", "expand"):
      out.append(matmul_distribute(side, direction))
  for op in (Op.ADD, Op.MUL):
    out += [commute(op), associate(op, True), associate(op, False)]
  out += [ew_distribute(True), ew_distribute(False), transpose_matmul(True),
          transpose_matmul(False)]
  return out
