"""Example synthesis for the TASO rules that `rules.taso` translates: random instances of a
rule's source pattern, so the shared harness `xrlflow_jax.rules.verify.verify_rule` checks imported
rules numerically like built-in ones.

    plan = find_example(translation, rng)   # shapes and choices, or None
    outs = example(translation, builder, rng)   # the rule's `example(builder, rng)`

Shapes are found by unifying the dims that the pattern forces equal (a union-find over the
variables' dim slots: MatMul's inner dims, equal elementwise shapes, Concat's other axes, the
mapped outputs) and drawing the rest at random (kernels 1 or 3, spatial dims 3..6, few unit dims),
then rejection-testing each draw with the translation's own constraint code, run in numpy over a
`_HostView` of the built instance. `translate` skips a rule for which `find_example` finds nothing
in `EXAMPLE_TRIES` tries.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from xrlflow_jax import ops
from xrlflow_jax.errors import XrlflowError
from xrlflow_jax.graph.builder import GraphBuilder, Tensor
from xrlflow_jax.ops import MAX_RANK as R
from xrlflow_jax.ops import Op
from xrlflow_jax.rules.pattern import Ref, Rule
from xrlflow_jax.rules.taso import (_BINARY, _UNARY, Key, _activation, _conv_params,
                                    _same_pads_1d, _transpose_params, _Translation, _UnionFind)
from xrlflow_jax.rules.taso_wire import (CONCAT, CONV2D, ENLARGE, MATMUL, PAD_SAME, SCALAR_MUL,
                                         SPLIT, TRANSPOSE, RuleImportError)

EXAMPLE_TRIES = 64
_DIM_P = (0.1, 0.3, 0.3, 0.2, 0.1)  # probabilities of free example dims 1..5


class _HostView:
  """The interface of `taso._JaxView` over an example being built on the host (numpy values)."""
  xp = np

  def __init__(self, rule: Rule, shapes: dict[Ref, tuple[int, ...]],
               attrs: dict[Ref, np.ndarray]):
    self.rule = rule
    self._shapes = {ref: ops.pad_shape(s) for ref, s in shapes.items()}
    self._attrs = attrs
    self.new: dict[int, dict[str, Any]] = {}

  def set_new(self, t: int, shape: Any, rank: Any, attrs: Any, dtype: Any) -> None:
    del dtype  # examples are float32 throughout
    self.new[t] = {"shape": np.asarray(shape, np.int32), "rank": np.int32(rank),
                   "attrs": np.asarray(attrs, np.int32)}

  def shape(self, ref: Ref) -> np.ndarray:
    return self.new[ref.index]["shape"] if ref.kind == "dst" else self._shapes[ref][0]

  def rank(self, ref: Ref) -> np.int32:
    return self.new[ref.index]["rank"] if ref.kind == "dst" else np.int32(self._shapes[ref][1])

  def dtype(self, ref: Ref) -> np.int32:
    del ref  # examples are float32 throughout
    return np.int32(int(ops.DType.FLOAT32))

  def dim(self, ref: Ref, axis: int) -> np.int32:
    shape = self.shape(ref)
    if axis < 0:
      return shape[R + axis]
    return shape[int(np.clip(R - int(self.rank(ref)) + axis, 0, R - 1))]

  def attrs(self, ref: Ref) -> np.ndarray:
    return self.new[ref.index]["attrs"] if ref.kind == "dst" else self._attrs[ref]

  def attr(self, ref: Ref, name: str, op: Op | None = None) -> Any:
    if op is None:
      op = (self.rule.src if ref.kind == "src" else self.rule.dst)[ref.index].op
    offset, field = ops.get(op).attr_offsets()[name]
    vec = self.attrs(ref)[offset:offset + field.width]
    return vec[0] if field.width == 1 else vec


def example(tr: _Translation, b: GraphBuilder, rng: np.random.Generator) -> list[Tensor]:
  """A random instance of the source pattern whose shapes satisfy the constraint."""
  plan = find_example(tr, rng)
  if plan is None:
    raise RuleImportError(f"{tr.name}: no random instance of the source pattern satisfied "
                          f"its constraints in {EXAMPLE_TRIES} tries")
  outs, _ = _build_source(tr, b, plan)
  return [outs[root] for root, _ in tr.replace]


def find_example(tr: _Translation, rng: np.random.Generator) -> dict[str, Any] | None:
  """Shapes and choices of an instance that passes the constraint (None if none was found)."""
  for attempt in range(EXAMPLE_TRIES):
    canonical = attempt == EXAMPLE_TRIES - 1 or rng.random() < 0.2
    plan = _sample_plan(tr, rng, canonical)
    if plan is None:
      continue
    scratch = GraphBuilder(seed=0, name=f"{tr.name}-example")
    try:
      outs, attrs = _build_source(tr, scratch, plan)
    except XrlflowError:
      continue
    view = _HostView(tr.rule, {ref: t.shape for ref, t in outs.items()}, attrs)
    with np.errstate(divide="ignore"):
      if bool(tr.constraint(view)):
        return plan
  return None


def _sample_plan(tr: _Translation, rng: np.random.Generator,
                 canonical: bool) -> dict[str, Any] | None:
  """Random shapes for the variables: dims the pattern forces equal are unified first."""
  uf = _UnionFind()
  roles: dict[Any, set[str]] = collections.defaultdict(set)
  rank_of: dict[Any, int] = {}
  sym: dict[Key, list[Any]] = {}
  for vid in tr.var_ids:
    k = ("v", vid)
    rank = tr.ranks[k]
    if rank is None:
      root = ("rank", tr._rank_uf.find(k))
      if root not in rank_of:
        rank_of[root] = (2 if canonical else int(rng.choice([2, 3]))) if tr.min2[k] else (
            2 if canonical else int(rng.integers(1, 4)))
      rank = rank_of[root]
    sym[k] = [("slot", vid, a) for a in range(rank)]

  def key(side, t):
    return ("v", t.op) if t.is_var else (side, t.op, t.ts)

  def unify(a, b):
    if a is not None and b is not None:
      uf.union(a, b)

  for side, pattern in (("s", tr.t.src), ("d", tr.t.dst)):
    for i, op in enumerate(pattern):
      ins = [sym[key(side, x)] for x in op.inputs]
      if op.type == CONV2D:
        x, w = ins
        if len(x) != 4 or len(w) != 4:
          return None
        if side == "s":
          unify(x[1], w[1])
        for a in (2, 3):
          roles[w[a]].add("kernel")
          roles[x[a]].add("spatial")
        strides, _, _ = _conv_params(op)
        out = [x[0], w[0]] + ([x[2], x[3]] if strides == (1, 1) else [None, None])
      elif op.type == MATMUL:
        a, b = ins
        if len(a) != len(b) or len(a) < 2:
          return None
        unify(a[-1], b[-2])
        for d in range(len(a) - 2):
          unify(a[d], b[d])
        out = a[:-1] + [b[-1]]
      elif op.type in _BINARY:
        if len(ins[0]) != len(ins[1]):
          return None
        for p, q in zip(*ins):
          unify(p, q)
        out = list(ins[0])
      elif op.type in (SCALAR_MUL, *_UNARY):
        out = list(ins[0])
      elif op.type == CONCAT:
        axis = op.param("Axis")
        if any(len(x) != len(ins[0]) or axis >= len(x) for x in ins):
          return None
        for x in ins[1:]:
          for d in range(len(x)):
            if d != axis:
              unify(ins[0][d], x[d])
        out = [None if d == axis else s for d, s in enumerate(ins[0])]
      elif op.type == TRANSPOSE:
        perm, _ = _transpose_params(op)
        if len(ins[0]) != len(perm):
          return None
        out = [ins[0][p] for p in perm]
      elif op.type == SPLIT:
        axis = op.param("Axis")
        if axis >= len(ins[0]):
          return None
        roles[ins[0][axis]].add("split")
        out = [None if d == axis else s for d, s in enumerate(ins[0])]
      elif op.type == ENLARGE:
        out = ins[0][:2] + ins[1][2:]
      else:
        return None
      for ts in range(op.num_outputs):
        sym[(side, i, ts)] = list(out)
  for m in tr.t.mapped:
    a, b = sym[("s", m.src_op, m.src_ts)], sym[("d", m.dst_op, m.dst_ts)]
    if len(a) != len(b):
      return None
    for p, q in zip(a, b):
      unify(p, q)
  class_roles: dict[Any, set[str]] = collections.defaultdict(set)
  for slot, rs in roles.items():
    if slot is not None:
      class_roles[uf.find(slot)] |= rs
  n = int(rng.integers(2, 5))
  kernel = int(rng.choice([1, 3]))
  values: dict[Any, int] = {}

  def value(slot):
    root = uf.find(slot)
    if root not in values:
      rs = class_roles[root]
      if "kernel" in rs:
        values[root] = kernel if canonical else int(rng.choice([1, 3]))
      elif "spatial" in rs:
        values[root] = max(n, 3) if canonical else int(rng.integers(3, 7))
      elif "split" in rs:
        values[root] = n if canonical else int(rng.integers(2, 6))
      else:  # few unit dims: a dim of 1 hides transposed or swapped operands
        values[root] = n if canonical else int(rng.choice(5, p=_DIM_P) + 1)
    return values[root]

  shapes = {vid: tuple(value(s) for s in sym[("v", vid)]) for vid in tr.var_ids}
  return {"shapes": shapes,
          "weight": {vid: bool(rng.random() < 0.35) for vid in tr.var_ids},
          "cut": [float(rng.random()) for _ in tr.t.src]}


def _build_source(tr: _Translation, b: GraphBuilder, plan: dict[str, Any]
                  ) -> tuple[dict[Ref, Tensor], dict[Ref, np.ndarray]]:
  """Adds the source pattern to `b`; returns the tensor of every element and source attrs."""
  tensors: dict[Ref, Tensor] = {}
  attrs: dict[Ref, np.ndarray] = {}
  for vid in tr.var_ids:
    shape = plan["shapes"][vid]
    ref = tr.var_ref[vid]
    tensors[ref] = (b.weight(shape, name=f"v{-vid}") if plan["weight"][vid]
                    else b.input(shape, name=f"v{-vid}"))

  def add(ref: Ref, op: Op, ins: list[Tensor], **kw: Any) -> None:
    tensors[ref] = b.node(op, ins, **kw)
    attrs[ref] = ops.get(op).encode_attrs(**kw)

  for i, op in enumerate(tr.t.src):
    outs = tr.src_out[i]
    ins = [tensors[tr._src_ref(x)] for x in op.inputs]
    if op.type == CONV2D:
      strides, pad, act = _conv_params(op)
      x, w = ins
      pads = []
      for a, s in ((2, strides[0]), (3, strides[1])):
        pads.append(_same_pads_1d(np, x.shape[a], w.shape[a], s) if pad == PAD_SAME
                    else (0, 0))
      add(outs[0], Op.CONV2D, ins, strides=strides, dilations=(1, 1), groups=1,
          activation=act, pads=(pads[0][0], pads[1][0], pads[0][1], pads[1][1]))
    elif op.type in _UNARY:
      add(outs[0], _UNARY[op.type], ins)
    elif op.type in _BINARY:
      add(outs[0], _BINARY[op.type], ins)
    elif op.type == SCALAR_MUL:
      add(outs[0], Op.MUL, ins)
    elif op.type == MATMUL:
      add(outs[0], Op.MATMUL, ins, activation=_activation(op))
    elif op.type == CONCAT:
      add(outs[0], Op.CONCAT, ins, axis=op.param("Axis"))
    elif op.type == TRANSPOSE:
      perm, ndim = _transpose_params(op)
      add(outs[0], Op.TRANSPOSE, ins, perm=tuple(perm) + (0,) * (R - ndim))
    elif op.type == SPLIT:
      axis = op.param("Axis")
      size = ins[0].shape[axis]
      cut = 1 + int(plan["cut"][i] * max(size - 1, 0))
      add(outs[0], Op.SLICE, ins, axis=axis, start=0, end=cut, step=1)
      add(outs[1], Op.SLICE, ins, axis=axis, start=cut, end=size, step=1)
  return tensors, attrs
