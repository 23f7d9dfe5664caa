"""The rule language: a rule is data.

A `Rule` has a source pattern (ops over pattern variables), a constraint on the matched nodes,
a target pattern (new ops over the same variables, their attributes computed from the match)
and a map saying which target node (or variable) replaces each source root.

    r = RuleBuilder("merge_matmul_shared_input", family="merge_matmul")
    x, w1, w2 = r.var("x"), r.var("w1", const=True), r.var("w2", const=True)
    m1 = r.src(Op.MATMUL, x, w1)
    m2 = r.src(Op.MATMUL, x, w2)
    r.where(lambda m: m.attr(m1, "activation") == m.attr(m2, "activation"))
    c = r.dst(Op.CONCAT, w1, w2, axis=lambda m: m.rank(w1) - 1)
    ...
    r.replace(m1, s1); r.replace(m2, s2)
    rule = r.build()

Constraints and attribute functions receive a `MatchView` of ONE match (the compiler vmaps
them over all candidate locations), written with jax.numpy so they trace once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from xrlflow_jax import ops
from xrlflow_jax.ops import MAX_RANK as R
from xrlflow_jax.ops import Op


@dataclasses.dataclass(frozen=True)
class Ref:
  """A pattern element: a variable ("var"), a source op ("src") or a target op ("dst")."""
  kind: str
  index: int

  def __repr__(self) -> str:
    return f"{self.kind}{self.index}"


@dataclasses.dataclass(frozen=True)
class Var:
  """A pattern variable; `const=True` requires a constant (weight-only) tensor."""
  name: str
  const: bool = False


@dataclasses.dataclass(frozen=True)
class SrcOp:
  """A source pattern op. `keep=True`: matched but not removed (it may have outside users)."""
  op: Op
  inputs: tuple[Ref, ...]
  keep: bool = False


AttrValue = Any  # a Python value, or Callable[[MatchView], jax value]


@dataclasses.dataclass(frozen=True)
class DstOp:
  """A target op; attrs are values or functions of the MatchView; `like` copies a source op's
  attribute vector first (then `attrs` override fields)."""
  op: Op
  inputs: tuple[Ref, ...]
  attrs: tuple[tuple[str, AttrValue], ...]
  like: Ref | None = None


@dataclasses.dataclass(frozen=True)
class Rule:
  """A rewrite rule (see module docstring). Build with `RuleBuilder`."""
  name: str
  family: str
  vars: tuple[Var, ...]
  src: tuple[SrcOp, ...]
  dst: tuple[DstOp, ...]
  replace: tuple[tuple[Ref, Ref], ...]  # (source root, target op or variable)
  where: Callable[["MatchView"], Any] | None = None
  symmetric: bool = False  # roots are interchangeable: match each set of roots once
  inverse: str | None = None
  description: str = ""
  # example(builder, rng) -> tensors: builds a random instance of the source pattern (used by
  # the verification harness, which adds random context around it).
  example: Callable[..., Any] | None = None

  @property
  def num_bound(self) -> int:
    """P: bound node ids per match (variables first, then source ops)."""
    return len(self.vars) + len(self.src)

  def roots(self) -> list[int]:
    """Source ops whose output no other source op reads (they are replaced or kept)."""
    used = {r.index for s in self.src for r in s.inputs if r.kind == "src"}
    return [i for i in range(len(self.src)) if i not in used]


class RuleBuilder:
  """Builds a `Rule` step by step; `build()` checks that it is well formed.

  Unless `layout_aware` (the layout rules), source ops with a `layout` attribute (Conv2D,
  pools) match only in the NCHW layout, the one the rule's shapes and axes are written for.
  """

  def __init__(self, name: str, family: str, *, description: str = "",
               inverse: str | None = None, symmetric: bool = False,
               example: Callable[..., Any] | None = None, layout_aware: bool = False):
    self.name, self.family, self.description = name, family, description
    self.layout_aware = layout_aware
    self.inverse, self.symmetric = inverse, symmetric
    self.example = example
    self._vars: list[Var] = []
    self._src: list[SrcOp] = []
    self._dst: list[DstOp] = []
    self._replace: list[tuple[Ref, Ref]] = []
    self._where: list[Callable[[MatchView], Any]] = []

  def var(self, name: str, const: bool = False) -> Ref:
    self._vars.append(Var(name, const))
    return Ref("var", len(self._vars) - 1)

  def src(self, op: Op, *inputs: Ref, keep: bool = False) -> Ref:
    for r in inputs:
      assert r.kind in ("var", "src"), f"{self.name}: source inputs are vars or source ops"
    self._src.append(SrcOp(Op(op), tuple(inputs), keep))
    return Ref("src", len(self._src) - 1)

  def dst(self, op: Op, *inputs: Ref, like: Ref | None = None, **attrs: AttrValue) -> Ref:
    for r in inputs:
      if r.kind == "src":
        assert self._src[r.index].keep, f"{self.name}: a target may read only kept source ops"
      if r.kind == "dst":
        assert r.index < len(self._dst), f"{self.name}: target ops read earlier target ops"
    self._dst.append(DstOp(Op(op), tuple(inputs), tuple(attrs.items()), like))
    return Ref("dst", len(self._dst) - 1)

  def where(self, fn: Callable[["MatchView"], Any]) -> None:
    self._where.append(fn)

  def replace(self, root: Ref, by: Ref) -> None:
    assert root.kind == "src" and by.kind in ("dst", "var", "src"), (root, by)
    self._replace.append((root, by))

  def build(self) -> Rule:
    conds = list(self._where)
    if not self.layout_aware:
      for i, src in enumerate(self._src):
        if "layout" in ops.get(src.op).attr_offsets():
          conds.append(lambda m, ref=Ref("src", i): m.attr(ref, "layout") == ops.Layout.NCHW)
    where = None
    if conds:
      def where(m):  # pylint: disable=function-redefined
        ok = jnp.asarray(True)
        for c in conds:
          ok = ok & jnp.asarray(c(m))
        return ok
    rule = Rule(self.name, self.family, tuple(self._vars), tuple(self._src), tuple(self._dst),
                tuple(self._replace), where, self.symmetric, self.inverse, self.description,
                self.example)
    replaced = {r.index for r, _ in rule.replace}
    for i in rule.roots():
      if not rule.src[i].keep:
        assert i in replaced, f"{self.name}: root src{i} must be replaced"
    for root, by in rule.replace:
      assert not rule.src[root.index].keep, f"{self.name}: a kept op is not replaced"
      if by.kind == "src":
        assert rule.src[by.index].keep, f"{self.name}: replacement by a removed op"
    assert len(rule.roots()) <= 3 or rule.symmetric, f"{self.name}: at most 3 unlike roots"
    return rule


class MatchView:
  """One match as seen by constraints and attribute functions (all values are jax scalars/arrays).

  Refs to variables and source ops read the graph at the bound node; refs to target ops read the
  new node's computed shape (only targets created earlier than the one being built).

  `rows` (optional): {(feature, slot): array [...]} some of the bound nodes' `ROW_FEATURES`,
  gathered beforehand for every candidate at once (the matcher gathers exactly those its
  constraint reads, then vmaps the view over them; `by_slot` wraps {feature: [P, ...]}); a
  view reads them by static key and indexes the graph for anything else.
  """
  ROW_FEATURES = ("shape", "rank", "dtype", "is_constant", "attrs")

  def __init__(self, rule: Rule, graph: Any, bound: jax.Array,
               new: dict[int, dict[str, jax.Array]] | None = None,
               rows: Mapping[tuple[str, int], jax.Array] | None = None):
    self.rule, self.graph, self.bound = rule, graph, bound
    self.new = new or {}
    self.rows = rows

  def _slot(self, ref: Ref) -> int:
    return ref.index if ref.kind == "var" else len(self.rule.vars) + ref.index

  def node(self, ref: Ref) -> jax.Array:
    """Slot of a bound variable or source op (int32[])."""
    if ref.kind == "var":
      return self.bound[ref.index]
    assert ref.kind == "src", ref
    return self.bound[len(self.rule.vars) + ref.index]

  def _feature(self, ref: Ref, name: str) -> jax.Array:
    if ref.kind == "dst":
      return self.new[ref.index][name]
    if self.rows is not None:
      key = (name, self._slot(ref))
      if key in self.rows:
        return self.rows[key]
    return self.graph.nodes[name][self.node(ref)]

  def shape(self, ref: Ref) -> jax.Array:
    """int32[R], right-aligned and padded with ones."""
    return self._feature(ref, "shape")

  def rank(self, ref: Ref) -> jax.Array:
    return self._feature(ref, "rank")

  def dtype(self, ref: Ref) -> jax.Array:
    return self._feature(ref, "dtype")

  def const(self, ref: Ref) -> jax.Array:
    return self._feature(ref, "is_constant")

  def dim(self, ref: Ref, axis: int | jax.Array) -> jax.Array:
    """Size of `axis`; negative axes count from the end."""
    shape = self.shape(ref)
    if isinstance(axis, int) and axis < 0:
      return shape[R + axis]
    return shape[jnp.clip(R - self.rank(ref) + axis, 0, R - 1)]

  def op_of(self, ref: Ref) -> Op:
    if ref.kind == "src":
      return self.rule.src[ref.index].op
    if ref.kind == "dst":
      return self.rule.dst[ref.index].op
    raise ValueError("the op of a variable is not static; pass op= to attr()")

  def attrs(self, ref: Ref) -> jax.Array:
    """The raw attribute vector int32[A]."""
    return self._feature(ref, "attrs")

  def attr(self, ref: Ref, name: str, op: Op | None = None) -> jax.Array:
    """A decoded attribute: int32[] (or int32[width] for wide fields; float32 for floats)."""
    spec = ops.get(op if op is not None else self.op_of(ref))
    offset, field = spec.attr_offsets()[name]
    vec = self.attrs(ref)[offset:offset + field.width]
    if field.kind == "float":
      vec = jax.lax.bitcast_convert_type(vec, jnp.float32)
    return vec[0] if field.width == 1 else vec

  def same_shape(self, a: Ref, b: Ref) -> jax.Array:
    return (self.rank(a) == self.rank(b)) & jnp.all(self.shape(a) == self.shape(b))


class by_slot(Mapping):  # pylint: disable=invalid-name
  """{(feature, slot): row} read from {feature: array [P, ...]} (`MatchView`'s `rows`)."""

  def __init__(self, rows: Mapping[str, jax.Array]):
    self._rows = rows

  def __getitem__(self, key: tuple[str, int]) -> jax.Array:
    return self._rows[key[0]][key[1]]

  def __contains__(self, key: object) -> bool:
    return isinstance(key, tuple) and key[0] in self._rows

  def __iter__(self) -> Iterator[tuple[str, int]]:
    return ((name, i) for name, v in self._rows.items() for i in range(v.shape[0]))

  def __len__(self) -> int:
    return sum(v.shape[0] for v in self._rows.values())


def encode_attrs_jit(op: Op, base: jax.Array | None, values: dict[str, Any]) -> jax.Array:
  """Attribute vector int32[A] for `op` from named values (Python or traced), inside jit.

  Fields not in `values` come from `base` (when given) or the field default. Python values are
  encoded on the host, so only traced values cost ops.
  """
  spec = ops.get(op)
  unknown = set(values) - set(spec.attr_offsets())
  assert not unknown, f"{spec.name} has no attribute(s) {sorted(unknown)}"
  defaults = spec.encode_attrs()
  pieces: list[Any] = []
  used = 0
  for name, (offset, field) in spec.attr_offsets().items():
    used = offset + field.width
    if name not in values:
      pieces.append(base[offset:used] if base is not None else defaults[offset:used])
      continue
    value = values[name]
    traced = isinstance(value, jax.Array) or (
        isinstance(value, (tuple, list)) and any(isinstance(v, jax.Array) for v in value))
    if not traced:
      pieces.append(spec.encode_attrs(**{name: value})[offset:used])
    elif field.kind == "float":
      bits = jax.lax.bitcast_convert_type(jnp.asarray(value, jnp.float32), jnp.int32)
      pieces.append(jnp.reshape(bits, (field.width,)))
    else:
      arr = jnp.stack(value) if isinstance(value, (tuple, list)) else jnp.asarray(value)
      pieces.append(jnp.reshape(arr.astype(jnp.int32), (field.width,)))
  tail = base[used:] if base is not None else defaults[used:]
  return jnp.concatenate([jnp.asarray(p, jnp.int32) for p in pieces] + [jnp.asarray(tail,
                                                                                   jnp.int32)])
