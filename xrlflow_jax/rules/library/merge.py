"""Merge rules: matmuls sharing an input or a weight, convolutions sharing an input, kernel
enlargement so convolutions can merge, grouped-convolution merging, and their inverses."""

from __future__ import annotations

from typing import Any, Callable

import jax.numpy as jnp

from xrlflow_jax.ops import MAX_RANK as R
from xrlflow_jax.ops import Op
from xrlflow_jax.rules.pattern import AttrValue, MatchView, Ref, Rule, RuleBuilder


def equal_except(m: MatchView, a: Ref, b: Ref, position: int) -> jnp.ndarray:
  """Same rank and same dims except the one at padded position `position`."""
  pos = jnp.arange(R)
  return (m.rank(a) == m.rank(b)) & jnp.all((pos == position) | (m.shape(a) == m.shape(b)))


def last_axis(ref: Ref):
  return lambda m: m.rank(ref) - 1


def _bias_variant(name: str, family: str, bias: bool, *, inverse: str,
                  **kwargs: Any) -> RuleBuilder:
  """The builder of a convolution rule's variant with (`bias`) or without a bias operand: the
  rule's `name` and its `inverse` both end in "_bias" with one."""
  suffix = "_bias" if bias else ""
  return RuleBuilder(name + suffix, family, inverse=inverse + suffix, **kwargs)


def _conv_vars(r: RuleBuilder, bias: bool, const_weight: bool = False
               ) -> tuple[Ref, Ref, list[Ref]]:
  """The variables of a rule on one convolution: (x, w, [b] with a bias, else [])."""
  x, w = r.var("x"), r.var("w", const=const_weight)
  return x, w, [r.var("b")] if bias else []


def _replace_conv(r: RuleBuilder, conv: Ref, x: Ref, w: Ref, bias: list[Ref],
                  **attrs: AttrValue) -> Rule:
  """The rule `r` that replaces `conv` by conv(x, w, *bias) with `conv`'s attributes, `attrs`
  overriding them."""
  r.replace(conv, r.dst(Op.CONV2D, x, w, *bias, like=conv, **attrs))
  return r.build()


# A merged weight is concatenated in groups of at most this many (within every graph's
# `layout.DEFAULT_MAX_INPUTS` input slots), then the groups are concatenated.
_CONCAT_GROUP = 4


def merge_matmul_shared_input(ways: int) -> Rule:
  """x @ w1, ..., x @ wk -> slices of x @ concat(w1, ..., wk); weights constant.

  k = 2 or 3 pairs the matmuls within the join window; k >= 4 merges runs of k consecutive
  matmuls reading x (all of an RNN cell's gates at once: merging them two at a time can cost
  more than it saves until most are merged, a valley a greedy search does not cross).
  """
  assert 2 <= ways <= _CONCAT_GROUP ** 2, ways
  r = RuleBuilder(f"merge_matmul_shared_input_{ways}", "merge_matmul", symmetric=True,
                  example=_ex_merge_mm(ways),
                  inverse="split_matmul_shared_input_2" if ways == 2 else None,
                  description="matmuls reading one tensor become one matmul on concatenated "
                              "weights (attention's Q/K/V, an RNN cell's gates)")
  x = r.var("x")
  ws = [r.var(f"w{i}", const=True) for i in range(ways)]
  mms = [r.src(Op.MATMUL, x, w) for w in ws]
  for w, mm in zip(ws[1:], mms[1:]):
    r.where(lambda m, w=w, mm=mm: equal_except(m, ws[0], w, R - 1)
            & (m.attr(mm, "activation") == m.attr(mms[0], "activation")))
  axis = last_axis(ws[0])
  if ways <= _CONCAT_GROUP:
    c = r.dst(Op.CONCAT, *ws, axis=axis)
  else:
    groups = [ws[i:i + _CONCAT_GROUP] for i in range(0, ways, _CONCAT_GROUP)]
    c = r.dst(Op.CONCAT, *[r.dst(Op.CONCAT, *g, axis=axis) for g in groups], axis=axis)
  big = r.dst(Op.MATMUL, x, c, activation=lambda m: m.attr(mms[0], "activation"))
  for i, mm in enumerate(mms):
    lo = (lambda m, i=i: sum(m.dim(ws[j], -1) for j in range(i)) + jnp.int32(0))
    hi = (lambda m, i=i: sum(m.dim(ws[j], -1) for j in range(i + 1)))
    r.replace(mm, r.dst(Op.SLICE, big, axis=last_axis(mms[0]), start=lo, end=hi))
  return r.build()


def split_matmul_shared_input() -> Rule:
  """Inverse of the 2-way merge: slices of x @ concat(w1, w2) -> x @ w1, x @ w2."""
  r = RuleBuilder("split_matmul_shared_input_2", "merge_matmul", example=_ex_split_mm,
                  inverse="merge_matmul_shared_input_2",
                  description="undo a merged matmul")
  x, w1, w2 = r.var("x"), r.var("w1", const=True), r.var("w2", const=True)
  return _split_matmul(r, -1, (w1, w2), lambda w: (x, w))


def merge_matmul_shared_weight() -> Rule:
  """x1 @ w, x2 @ w -> row slices of concat(x1, x2) @ w (concat on the batch side)."""
  r = RuleBuilder("merge_matmul_shared_weight", "merge_matmul", symmetric=True,
                  example=_ex_merge_mm_w,
                  inverse="split_matmul_shared_weight",
                  description="matmuls sharing a weight become one taller matmul")
  x1, x2, w = r.var("x1"), r.var("x2"), r.var("w")
  m1 = r.src(Op.MATMUL, x1, w)
  m2 = r.src(Op.MATMUL, x2, w)
  r.where(lambda m: equal_except(m, x1, x2, R - 2) & (m.rank(w) == 2)
          & (m.attr(m1, "activation") == m.attr(m2, "activation")))
  rows = lambda ref: (lambda m: m.rank(ref) - 2)
  c = r.dst(Op.CONCAT, x1, x2, axis=rows(x1))
  big = r.dst(Op.MATMUL, c, w, activation=lambda m: m.attr(m1, "activation"))
  r.replace(m1, r.dst(Op.SLICE, big, axis=rows(m1), start=0, end=lambda m: m.dim(x1, -2)))
  r.replace(m2, r.dst(Op.SLICE, big, axis=rows(m1), start=lambda m: m.dim(x1, -2),
                      end=lambda m: m.dim(x1, -2) + m.dim(x2, -2)))
  return r.build()


def split_matmul_shared_weight() -> Rule:
  """Inverse: row slices of concat(x1, x2) @ w -> x1 @ w, x2 @ w."""
  r = RuleBuilder("split_matmul_shared_weight", "merge_matmul", example=_ex_split_mm_w,
                  inverse="merge_matmul_shared_weight", description="undo a row-merged matmul")
  x1, x2, w = r.var("x1"), r.var("x2"), r.var("w")
  return _split_matmul(r, -2, (x1, x2), lambda x: (x, w))


def _split_matmul(r: RuleBuilder, axis: int, pieces: tuple[Ref, Ref],
                  operands: Callable[[Ref], tuple[Ref, Ref]]) -> Rule:
  """Both splits: slices on `axis` (-1: columns, -2: rows) of matmul(*operands(concat(p1, p2)))
  whose concat is on the pieces' same axis -> matmul(*operands(p1)), matmul(*operands(p2))."""
  p1, p2 = pieces
  c = r.src(Op.CONCAT, p1, p2)
  mm = r.src(Op.MATMUL, *operands(c))
  s1 = r.src(Op.SLICE, mm)
  s2 = r.src(Op.SLICE, mm)
  n1 = lambda m: m.dim(p1, axis)
  r.where(lambda m: (m.attr(c, "axis") == m.rank(p1) + axis)
          & (m.attr(s1, "axis") == m.rank(mm) + axis) & (m.attr(s2, "axis") == m.rank(mm) + axis)
          & (m.attr(s1, "start") == 0) & (m.attr(s1, "end") == n1(m))
          & (m.attr(s2, "start") == n1(m)) & (m.attr(s2, "end") == n1(m) + m.dim(p2, axis))
          & (m.attr(s1, "step") == 1) & (m.attr(s2, "step") == 1))
  act = lambda m: m.attr(mm, "activation")
  r.replace(s1, r.dst(Op.MATMUL, *operands(p1), activation=act))
  r.replace(s2, r.dst(Op.MATMUL, *operands(p2), activation=act))
  return r.build()


def merge_conv_shared_input(bias: bool) -> Rule:
  """conv(x, w1), conv(x, w2) with equal attributes -> channel slices of conv(x, concat(w1, w2))."""
  r = _bias_variant("merge_conv_shared_input", "merge_conv", bias, symmetric=True,
                    example=_ex_merge_conv(bias), inverse="split_conv_shared_input",
                    description="convolutions reading one tensor with the same kernel, strides, "
                                "pads and activation become one convolution")
  x = r.var("x")
  w1, w2 = r.var("w1", const=True), r.var("w2", const=True)
  b1 = r.var("b1", const=True) if bias else None
  b2 = r.var("b2", const=True) if bias else None
  c1 = r.src(Op.CONV2D, x, w1, *([b1] if bias else []))
  c2 = r.src(Op.CONV2D, x, w2, *([b2] if bias else []))
  r.where(lambda m: jnp.all(m.attrs(c1) == m.attrs(c2)) & (m.attr(c1, "groups") == 1)
          & equal_except(m, w1, w2, R - 4))
  cw = r.dst(Op.CONCAT, w1, w2, axis=0)
  extra = [r.dst(Op.CONCAT, b1, b2, axis=0)] if bias else []
  conv = r.dst(Op.CONV2D, x, cw, *extra, like=c1)
  o1 = lambda m: m.dim(w1, 0)
  r.replace(c1, r.dst(Op.SLICE, conv, axis=1, start=0, end=o1))
  r.replace(c2, r.dst(Op.SLICE, conv, axis=1, start=o1, end=lambda m: o1(m) + m.dim(w2, 0)))
  return r.build()


def split_conv_shared_input(bias: bool) -> Rule:
  """Inverse: channel slices of conv(x, concat(w1, w2)) -> conv(x, w1), conv(x, w2)."""
  r = _bias_variant("split_conv_shared_input", "merge_conv", bias, example=_ex_split_conv(bias),
                    inverse="merge_conv_shared_input", description="undo a merged conv")
  x = r.var("x")
  w1, w2 = r.var("w1", const=True), r.var("w2", const=True)
  b1 = r.var("b1", const=True) if bias else None
  b2 = r.var("b2", const=True) if bias else None
  cw = r.src(Op.CONCAT, w1, w2)
  extra = [r.src(Op.CONCAT, b1, b2)] if bias else []
  conv = r.src(Op.CONV2D, x, cw, *extra)
  s1 = r.src(Op.SLICE, conv)
  s2 = r.src(Op.SLICE, conv)
  o1 = lambda m: m.dim(w1, 0)
  cond = lambda m: ((m.attr(cw, "axis") == 0) & (m.attr(conv, "groups") == 1)
                    & (m.attr(s1, "axis") == 1) & (m.attr(s2, "axis") == 1)
                    & (m.attr(s1, "start") == 0) & (m.attr(s1, "end") == o1(m))
                    & (m.attr(s2, "start") == o1(m)) & (m.attr(s2, "end") == o1(m) + m.dim(w2, 0))
                    & (m.attr(s1, "step") == 1) & (m.attr(s2, "step") == 1))
  if bias:
    r.where(lambda m: cond(m) & (m.attr(extra[0], "axis") == 0))
  else:
    r.where(cond)
  r.replace(s1, r.dst(Op.CONV2D, x, w1, *([b1] if bias else []), like=conv))
  r.replace(s2, r.dst(Op.CONV2D, x, w2, *([b2] if bias else []), like=conv))
  return r.build()


def enlarge_conv_kernel(bias: bool, sibling_bias: bool) -> Rule:
  """conv(x, w1) beside a conv(x, w2) with a larger kernel: zero-pad w1 to w2's kernel (and grow
  the padding to match) so the two convolutions can then merge."""
  name = "enlarge_conv_kernel" + ("_bias" if bias else "") + ("_sib_bias" if sibling_bias else "")
  r = RuleBuilder(name, "enlarge_conv", example=_ex_enlarge(bias, sibling_bias),
                  inverse="shrink_conv_kernel" + ("_bias" if bias else ""),
                  description="enlarge a smaller kernel to a sibling's size (TASO's enlarge)")
  x, w1, w2 = r.var("x"), r.var("w1", const=True), r.var("w2")
  b1 = r.var("b1") if bias else None
  b2 = r.var("b2") if sibling_bias else None
  c1 = r.src(Op.CONV2D, x, w1, *([b1] if bias else []))
  c2 = r.src(Op.CONV2D, x, w2, *([b2] if sibling_bias else []), keep=True)
  grow_h = lambda m: (m.dim(w2, 2) - m.dim(w1, 2)) // 2
  grow_w = lambda m: (m.dim(w2, 3) - m.dim(w1, 3)) // 2
  def cond(m):
    p1, p2 = m.attr(c1, "pads"), m.attr(c2, "pads")
    gh, gw = grow_h(m), grow_w(m)
    bigger = (m.dim(w2, 2) >= m.dim(w1, 2)) & (m.dim(w2, 3) >= m.dim(w1, 3)) & (
        (m.dim(w2, 2) > m.dim(w1, 2)) | (m.dim(w2, 3) > m.dim(w1, 3)))
    even = ((m.dim(w2, 2) - m.dim(w1, 2)) % 2 == 0) & ((m.dim(w2, 3) - m.dim(w1, 3)) % 2 == 0)
    pads_ok = jnp.all(p2 == p1 + jnp.stack([gh, gw, gh, gw]))
    return (bigger & even & pads_ok & jnp.all(m.attr(c1, "strides") == m.attr(c2, "strides"))
            & jnp.all(m.attr(c1, "dilations") == 1) & jnp.all(m.attr(c2, "dilations") == 1)
            & (m.attr(c1, "groups") == 1) & (m.attr(c2, "groups") == 1))
  r.where(cond)
  e = r.dst(Op.ENLARGE, w1, kernel=lambda m: jnp.stack([m.dim(w2, 2), m.dim(w2, 3)]))
  r.replace(c1, r.dst(Op.CONV2D, x, e, *([b1] if bias else []), like=c1,
                      pads=lambda m: m.attr(c2, "pads")))
  return r.build()


def shrink_conv_kernel(bias: bool) -> Rule:
  """Inverse of enlarge: conv(x, enlarge(w)) -> conv(x, w) with the padding reduced."""
  r = _bias_variant("shrink_conv_kernel", "enlarge_conv", bias, example=_ex_shrink(bias),
                    inverse="enlarge_conv_kernel",
                    description="drop the zero border of an enlarged kernel")
  x, w, b = _conv_vars(r, bias)
  e = r.src(Op.ENLARGE, w)
  conv = r.src(Op.CONV2D, x, e, *b)
  shrink = lambda m: jnp.stack([(m.dim(e, 2) - m.dim(w, 2)) // 2, (m.dim(e, 3) - m.dim(w, 3)) // 2,
                                (m.dim(e, 2) - m.dim(w, 2)) // 2, (m.dim(e, 3) - m.dim(w, 3)) // 2])
  r.where(lambda m: jnp.all(m.attr(conv, "pads") >= shrink(m))
          & jnp.all(m.attr(conv, "dilations") == 1))
  return _replace_conv(r, conv, x, w, b, pads=lambda m: m.attr(conv, "pads") - shrink(m))


def merge_group_conv(bias: bool) -> Rule:
  """conv(x, w, groups=g) -> conv(x, merge_gconv(w, g, 2), groups=g/2) (TASO's merge_gconv)."""
  r = _bias_variant("merge_group_conv", "group_conv", bias, example=_ex_gconv(bias, merged=False),
                    inverse="split_group_conv",
                    description="halve the number of groups of a grouped convolution")
  x, w, b = _conv_vars(r, bias, const_weight=True)
  conv = r.src(Op.CONV2D, x, w, *b)
  r.where(lambda m: (m.attr(conv, "groups") >= 2) & (m.attr(conv, "groups") % 2 == 0))
  mw = r.dst(Op.MERGE_GCONV, w, groups=lambda m: m.attr(conv, "groups"), count=2)
  return _replace_conv(r, conv, x, mw, b, groups=lambda m: m.attr(conv, "groups") // 2)


def split_group_conv(bias: bool) -> Rule:
  """Inverse: conv(x, merge_gconv(w, g, c), groups=g/c) -> conv(x, w, groups=g)."""
  r = _bias_variant("split_group_conv", "group_conv", bias, example=_ex_gconv(bias, merged=True),
                    inverse="merge_group_conv", description="undo a grouped-convolution merge")
  x, w, b = _conv_vars(r, bias)
  mg = r.src(Op.MERGE_GCONV, w)
  conv = r.src(Op.CONV2D, x, mg, *b)
  r.where(lambda m: m.attr(conv, "groups") * m.attr(mg, "count") == m.attr(mg, "groups"))
  return _replace_conv(r, conv, x, w, b, groups=lambda m: m.attr(mg, "groups"))


def rules() -> list[Rule]:
  """Every merge-family rule."""
  out = [merge_matmul_shared_input(k) for k in (2, 3, 4, 8)]
  out += [split_matmul_shared_input(),
         merge_matmul_shared_weight(), split_matmul_shared_weight()]
  for bias in (False, True):
    out += [merge_conv_shared_input(bias), split_conv_shared_input(bias),
            shrink_conv_kernel(bias), merge_group_conv(bias), split_group_conv(bias)]
    out += [enlarge_conv_kernel(bias, sib) for sib in (False, True)]
  return out


# ---------------------------------------------------------------------------------------------
# Examples: random instances of each source pattern, for the verification harness.

def _act(rng) -> str:
  return str(rng.choice(["none", "relu", "sigmoid", "tanh"]))


def _ex_merge_mm(ways):
  def ex(b, rng):
    k = int(rng.integers(3, 9))
    lead = tuple(int(d) for d in rng.integers(1, 5, size=int(rng.integers(1, 3))))
    x = b.input(lead + (k,))
    act = _act(rng)
    return [b.matmul(x, b.weight((k, int(rng.integers(2, 7)))), activation=act)
            for _ in range(ways)]
  return ex


def _ex_split_mm(b, rng):
  k, n1, n2 = (int(v) for v in rng.integers(2, 7, size=3))
  x = b.input((int(rng.integers(1, 5)), k))
  c = b.concat([b.weight((k, n1)), b.weight((k, n2))], axis=1)
  mm = b.matmul(x, c, activation=_act(rng))
  return [b.slice(mm, 1, 0, n1), b.slice(mm, 1, n1, n1 + n2)]


def _ex_merge_mm_w(b, rng):
  k, n = (int(v) for v in rng.integers(2, 7, size=2))
  w = b.weight((k, n)) if rng.random() < 0.5 else b.input((k, n))
  act = _act(rng)
  return [b.matmul(b.input((int(rng.integers(1, 5)), k)), w, activation=act) for _ in range(2)]


def _ex_split_mm_w(b, rng):
  k, n, m1, m2 = (int(v) for v in rng.integers(1, 6, size=4))
  c = b.concat([b.input((m1, k)), b.input((m2, k))], axis=0)
  mm = b.matmul(c, b.weight((k, n)), activation=_act(rng))
  return [b.slice(mm, 0, 0, m1), b.slice(mm, 0, m1, m1 + m2)]


def _conv_args(rng):
  kernel = int(rng.choice([1, 3]))
  stride = int(rng.choice([1, 2]))
  return kernel, dict(strides=(stride, stride), padding="SAME", activation=_act(rng))


def _ex_merge_conv(bias):
  def ex(b, rng):
    c = int(rng.integers(1, 5))
    x = b.input((1, c, int(rng.integers(4, 9)), int(rng.integers(4, 9))))
    kernel, kw = _conv_args(rng)
    outs = []
    for _ in range(2):
      o = int(rng.integers(1, 6))
      extra = b.weight((o,), init="bias") if bias else None
      outs.append(b.conv2d(x, b.weight((o, c, kernel, kernel)), extra, **kw))
    return outs
  return ex


def _ex_split_conv(bias):
  def ex(b, rng):
    c, o1, o2 = (int(v) for v in rng.integers(1, 5, size=3))
    x = b.input((1, c, 6, 7))
    kernel, kw = _conv_args(rng)
    w = b.concat([b.weight((o1, c, kernel, kernel)), b.weight((o2, c, kernel, kernel))], axis=0)
    extra = (b.concat([b.weight((o1,), init="bias"), b.weight((o2,), init="bias")], axis=0)
             if bias else None)
    y = b.conv2d(x, w, extra, **kw)
    return [b.slice(y, 1, 0, o1), b.slice(y, 1, o1, o1 + o2)]
  return ex


def _ex_enlarge(bias, sibling_bias):
  def ex(b, rng):
    c = int(rng.integers(1, 5))
    x = b.input((1, c, int(rng.integers(5, 9)), int(rng.integers(5, 9))))
    stride = int(rng.choice([1, 2]))
    o1, o2 = (int(v) for v in rng.integers(1, 5, size=2))
    small = b.conv2d(x, b.weight((o1, c, 1, 1)), b.weight((o1,), init="bias") if bias else None,
                     strides=(stride, stride), padding=0, activation=_act(rng))
    big = b.conv2d(x, b.weight((o2, c, 3, 3)), b.weight((o2,), init="bias") if sibling_bias
                   else None, strides=(stride, stride), padding=1, activation=_act(rng))
    return [small, big]
  return ex


def _ex_shrink(bias):
  def ex(b, rng):
    c, o = (int(v) for v in rng.integers(1, 5, size=2))
    x = b.input((1, c, 7, 6))
    w = b.enlarge(b.weight((o, c, 1, 1)), (3, 3))
    pad = int(rng.choice([1, 2]))
    return [b.conv2d(x, w, b.weight((o,), init="bias") if bias else None, padding=pad,
                     activation=_act(rng))]
  return ex


def _ex_gconv(bias, merged):
  """A grouped 3x3 convolution of random sizes (merge_group_conv's source); `merged`: its weight
  is merge_gconv(w, groups, 2) and it has half the groups (split_group_conv's source)."""
  def ex(b, rng):
    groups = int(rng.choice([2, 4]))
    cg, og = (int(v) for v in rng.integers(1, 3, size=2))
    x = b.input((1, groups * cg, 6, 6))
    o = groups * og
    w = b.weight((o, cg, 3, 3))
    if merged:
      w, groups = b.merge_gconv(w, groups=groups, count=2), groups // 2
    return [b.conv2d(x, w, b.weight((o,), init="bias") if bias else None, groups=groups,
                     activation=_act(rng))]
  return ex
