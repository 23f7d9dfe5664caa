"""Importer of TASO's substitution collection (`graph_subst.pb`) into the project's rule language.

    imported = load_taso("../shared/taso/graph_subst.pb")
    print(imported.summary())
    ruleset = RuleSet(imported.rules)

The file is a serialised proto2 `RuleCollection` (schema in ../shared/taso/README.md). It is read
by a small wire-format decoder (`rules.taso_wire`, no generated protobuf code), then every rule whose ops the project
has is translated into a `Rule`:

- Pattern variables become `r.var`; TASO ops map to project ops (Conv2D, MatMul and activations
  keep their fused activation; Split becomes two Slice ops of one tensor; scalar Mul is Mul by a
  rank-0 tensor; Enlarge's second input only gives the target kernel size).
- TASO's semantics become `where` constraints, so a rule matches only where it is valid:
  elementwise ops take equal shapes (no broadcasting), MatMul operands have equal rank and equal
  batch dims, Concat inputs have rank NumDim, source convolutions have the stride of the pattern,
  SAME (or VALID) padding, no dilation and one group (the setting TASO verified its rules in).
  The target pattern must also be valid: its shapes are computed with the project's shape rules
  inside the constraint, and every replaced output must keep its shape. TASO's Conv2D infers its
  group count from the channel counts; a target convolution with more than one group is only
  accepted in the block-diagonal form that is exact (channel-concat of two equal inputs against
  an output-channel concat of two equal weights).
- Target attributes are computed from the match: SAME pads from the weight's kernel, the group
  count from the channels, a Split's cut point from the Concat that produced the split tensor (TASO
  tracks that in its tensors' split metadata; a split whose sizes no Concat of the target
  determines is skipped with a reason).
- Every translated rule gets an `example(builder, rng)` that instantiates the source pattern with
  random shapes satisfying the constraints (found by unifying the dims that the pattern forces
  equal and rejection-testing the rest with the same constraint code, run in numpy; synthesised
  by `rules.taso_examples`), so the shared harness `xrlflow_jax.rules.verify.verify_rule` checks
  imported rules like built-in ones.

Rules whose convolution reads one tensor as both input and weight (14 in TASO's file) are listed
in `never_matching` and not translated: no network convolves an activation with itself.
"""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path
from typing import Any, Callable, Sequence

import jax.numpy as jnp
import numpy as np

from xrlflow_jax import ops
from xrlflow_jax.graph.builder import GraphBuilder, Tensor
from xrlflow_jax.ops import MAX_RANK as R
from xrlflow_jax.ops import Activation, Op
from xrlflow_jax.rules.pattern import MatchView, Ref, Rule, RuleBuilder, encode_attrs_jit
from xrlflow_jax.rules.taso_wire import (CONCAT, CONV2D, ENLARGE, EW_ADD, EW_MUL, MATMUL,
                                         PAD_SAME, PAD_VALID, RELU, SCALAR_MUL, SIGMOID, SPLIT,
                                         TANH, TRANSPOSE, RuleImportError, TasoMapping, TasoOp,
                                         TasoRule, TasoTensor, parse_rule_collection)


# ---------------------------------------------------------------------------------------------
# What the translation supports.

SUPPORTED = (CONV2D, RELU, SIGMOID, TANH, CONCAT, SPLIT, TRANSPOSE, EW_ADD, EW_MUL, MATMUL,
             SCALAR_MUL, ENLARGE)
_UNARY = {RELU: Op.RELU, SIGMOID: Op.SIGMOID, TANH: Op.TANH}
_BINARY = {EW_ADD: Op.ADD, EW_MUL: Op.MUL}

# TASO activation codes (0 none, 1 sigmoid, 2 relu, 3 tanh) -> the project's.
_ACTIVATION = {0: int(Activation.NONE), 1: int(Activation.SIGMOID), 2: int(Activation.RELU),
               3: int(Activation.TANH)}

FAMILY = "taso"


# ---------------------------------------------------------------------------------------------
# Views of one match: the jitted constraint's (jax) here, the example generator's (numpy) in
# `rules.taso_examples`; the helpers below take either.

def _xp(view: Any) -> Any:
  return getattr(view, "xp", jnp)


class _JaxView(MatchView):
  """A MatchView whose target-op shapes are filled in by the constraint itself."""
  xp = jnp

  def set_new(self, t: int, shape: Any, rank: Any, attrs: Any, dtype: Any) -> None:
    self.new[t] = {"shape": jnp.asarray(shape, jnp.int32), "rank": jnp.asarray(rank, jnp.int32),
                   "attrs": attrs, "dtype": jnp.asarray(dtype, jnp.int32)}


def _same_shape(v: Any, a: Ref, b: Ref) -> Any:
  return (v.rank(a) == v.rank(b)) & _xp(v).all(v.shape(a) == v.shape(b))


def _batch_dims_equal(v: Any, a: Ref, b: Ref) -> Any:
  """Equal rank >= 2 and equal leading (batch) dims: TASO's MatMul takes no broadcasting."""
  xp = _xp(v)
  batch = xp.arange(R) < R - 2
  return ((v.rank(a) == v.rank(b)) & (v.rank(a) >= 2)
          & xp.all(xp.where(batch, v.shape(a) == v.shape(b), True)))


def _same_pads_1d(xp: Any, size: Any, kernel: Any, stride: int) -> tuple[Any, Any]:
  """TF/TASO SAME padding of one spatial axis: (begin, end), the extra pad at the end."""
  out = (size + stride - 1) // stride
  total = xp.maximum((out - 1) * stride + kernel - size, 0)
  return total // 2, total - total // 2


def _conv_pads(v: Any, x: Ref, w: Ref, strides: tuple[int, int], pad_mode: int) -> Any:
  """int32[4] (top, left, bottom, right) for TASO's padding mode of a matched (source) conv."""
  xp = _xp(v)
  if pad_mode == PAD_VALID:
    return xp.zeros([4], xp.int32)
  top, bottom = _same_pads_1d(xp, v.dim(x, 2), v.dim(w, 2), strides[0])
  left, right = _same_pads_1d(xp, v.dim(x, 3), v.dim(w, 3), strides[1])
  return xp.stack([top, left, bottom, right]).astype(xp.int32)


def _encode(xp: Any, op: Op, values: dict[str, Any]) -> Any:
  """An attribute vector int32[A] from named values, in numpy or inside jit."""
  if xp is np:
    plain = {k: ([int(x) for x in np.ravel(val)] if np.ndim(val) else int(val))
             for k, val in values.items()}
    return ops.get(op).encode_attrs(**plain)
  return encode_attrs_jit(op, None, values)


# ---------------------------------------------------------------------------------------------
# Translation of one rule.

class _Skip(Exception):
  """The rule cannot be expressed faithfully; the message is the reason."""


@dataclasses.dataclass
class _DstEntry:
  """A target op as the constraint evaluates it (mirrors the rule's DstOp)."""
  op: Op
  inputs: tuple[Ref, ...]
  attrs: dict[str, Any]
  check: Callable[[Any], Any] | None


class _UnionFind:
  def __init__(self):
    self.parent: dict[Any, Any] = {}

  def find(self, x: Any) -> Any:
    self.parent.setdefault(x, x)
    while self.parent[x] != x:
      self.parent[x] = self.parent[self.parent[x]]
      x = self.parent[x]
    return x

  def union(self, a: Any, b: Any) -> None:
    ra, rb = self.find(a), self.find(b)
    if ra != rb:
      self.parent[rb] = ra


Key = tuple  # ("v", var id) | ("s", op, ts) | ("d", op, ts): a tensor of the TASO rule


class _Translation:
  """Translates one TASO rule (raises `_Skip` with the reason when it cannot)."""

  def __init__(self, rule: TasoRule):
    self.t = rule
    self.name = f"taso_{rule.index}"
    for op in rule.src + rule.dst:
      if op.type not in SUPPORTED:
        raise _Skip(f"uses TASO op {op.name} ({op.type}), which the project does not have")
    self.ranks, self.min2 = self._infer_ranks()
    self.r = RuleBuilder(self.name, FAMILY, example=self._example,
                         description=f"TASO rule {rule.index}: {rule.pretty()}")
    self.var_ref: dict[int, Ref] = {}
    self.var_ids = rule.variables()
    for vid in self.var_ids:
      self.var_ref[vid] = self.r.var(f"v{-vid}")
    self.src_out: list[list[Ref]] = []
    self.src_checks: list[Callable[[Any], Any]] = []
    for i, op in enumerate(rule.src):
      self.src_out.append(self._source_op(i, op))
    self._check_roots()
    self.dst_out: list[list[Ref]] = []
    self.dst: list[_DstEntry] = []
    # Split metadata (TASO's SplitInfo): axis -> (tensor, its axis) whose size is the first piece.
    self.prov: dict[Ref, dict[int, tuple[Ref, int]]] = {}
    self.concats: dict[Ref, tuple[int, tuple[Ref, ...]]] = {}
    self.dst_dim: dict[Ref, Callable[[int], Callable[[Any], Any]]] = {}
    for i, op in enumerate(rule.dst):
      self.dst_out.append(self._target_op(i, op))
    self.replace: list[tuple[Ref, Ref]] = []
    for m in rule.mapped:
      pair = (self.src_out[m.src_op][m.src_ts], self.dst_out[m.dst_op][m.dst_ts])
      self.replace.append(pair)
      self.r.replace(*pair)
    self.r.where(self._constraint_jax)
    self.rule = self.r.build()

  def __fingerprint__(self) -> tuple:
    """`trace_cache.fingerprint`: a translation is a function of TASO's rule alone (its
    dicts' order follows string hashing, which differs between processes)."""
    return (self.t,)

  # ------------------------------------------------------------------ static ranks
  def _infer_ranks(self) -> tuple[dict[Key, int | None], dict[Key, bool]]:
    """Rank of every tensor of the rule where the ops fix it (None: free)."""
    uf = _UnionFind()
    fixed: dict[Key, int] = {}
    min2: set[Key] = set()

    def key(side: str, t: TasoTensor) -> Key:
      return ("v", t.op) if t.is_var else (side, t.op, t.ts)

    def fix(k: Key, rank: int) -> None:
      fixed.setdefault(k, rank)
      if fixed[k] != rank:
        raise _Skip(f"inconsistent ranks in the pattern ({k} is both {fixed[k]} and {rank})")

    for side, pattern in (("s", self.t.src), ("d", self.t.dst)):
      for i, op in enumerate(pattern):
        ins = [key(side, x) for x in op.inputs]
        outs = [(side, i, ts) for ts in range(op.num_outputs)]
        if op.type in (CONV2D, ENLARGE):
          for k in ins + outs:
            fix(k, 4)
        elif op.type in (CONCAT, TRANSPOSE):
          ndim = op.param("NumDim")
          if ndim is None:
            raise _Skip(f"{op.name} without NumDim")
          for k in ins + outs:
            fix(k, ndim)
        elif op.type == SCALAR_MUL:
          fix(ins[1], 0)
          uf.union(ins[0], outs[0])
        elif op.type == MATMUL:
          for k in ins[1:] + outs:
            uf.union(ins[0], k)
          min2.add(ins[0])
        else:  # elementwise, activations, split: every tensor has one rank
          for k in ins[1:] + outs:
            uf.union(ins[0], k)
    for m in self.t.mapped:
      uf.union(("s", m.src_op, m.src_ts), ("d", m.dst_op, m.dst_ts))
    ranks: dict[Key, int] = {}
    for k, rank in fixed.items():
      root = uf.find(k)
      if ranks.setdefault(root, rank) != rank:
        raise _Skip(f"inconsistent ranks in the pattern ({k}: {ranks[root]} vs {rank})")
    roots_min2 = {uf.find(k) for k in min2}
    keys = {("v", vid) for vid in self.t.variables()}
    for side, pattern in (("s", self.t.src), ("d", self.t.dst)):
      for i, op in enumerate(pattern):
        keys |= {(side, i, ts) for ts in range(op.num_outputs)}
    out = {k: ranks.get(uf.find(k)) for k in keys}
    low = {k: uf.find(k) in roots_min2 for k in keys}
    for k, rank in out.items():
      if rank is not None and low[k] and rank < 2:
        raise _Skip(f"a MatMul operand of rank {rank}")
    self._rank_uf = uf
    return out, low

  # ------------------------------------------------------------------ source pattern
  def _src_ref(self, t: TasoTensor) -> Ref:
    return self.var_ref[t.op] if t.is_var else self.src_out[t.op][t.ts]

  def _source_op(self, i: int, op: TasoOp) -> list[Ref]:
    r = self.r
    ins = [self._src_ref(x) for x in op.inputs]
    if op.type == CONV2D:
      if len(ins) != 2:
        raise _Skip(f"source Conv2D with {len(ins)} inputs")
      strides, pad, act = _conv_params(op)
      c = r.src(Op.CONV2D, *ins)
      x, w = ins

      def conv_ok(v, c=c, x=x, w=w):
        xp = _xp(v)
        return (xp.all(v.attr(c, "strides") == xp.asarray(strides))
                & xp.all(v.attr(c, "dilations") == 1) & (v.attr(c, "groups") == 1)
                & (v.attr(c, "activation") == act)
                & xp.all(v.attr(c, "pads") == _conv_pads(v, x, w, strides, pad)))
      self.src_checks.append(conv_ok)
      return [c]
    if op.type in _UNARY:
      return [r.src(_UNARY[op.type], *ins)]
    if op.type in _BINARY:
      e = r.src(_BINARY[op.type], *ins)
      self.src_checks.append(lambda v, a=ins[0], b=ins[1]: _same_shape(v, a, b))
      return [e]
    if op.type == SCALAR_MUL:
      e = r.src(Op.MUL, *ins)
      self.src_checks.append(lambda v, s=ins[1]: v.rank(s) == 0)
      return [e]
    if op.type == MATMUL:
      act = _activation(op)
      mm = r.src(Op.MATMUL, *ins)
      self.src_checks.append(lambda v, mm=mm, a=ins[0], b=ins[1]: _batch_dims_equal(v, a, b)
                             & (v.attr(mm, "activation") == act))
      return [mm]
    if op.type == CONCAT:
      axis, ndim = _concat_params(op, len(ins))
      c = r.src(Op.CONCAT, *ins)
      self.src_checks.append(lambda v, c=c, a=ins[0]: (v.attr(c, "axis") == axis)
                             & (v.rank(a) == ndim))
      return [c]
    if op.type == TRANSPOSE:
      perm, ndim = _transpose_params(op)
      t = r.src(Op.TRANSPOSE, *ins)
      self.src_checks.append(lambda v, t=t, x=ins[0]: (v.rank(x) == ndim) & _xp(v).all(
          v.attr(t, "perm")[:ndim] == _xp(v).asarray(perm)))
      return [t]
    if op.type == SPLIT:
      axis = _split_axis(op)
      x = ins[0]
      s0, s1 = r.src(Op.SLICE, x), r.src(Op.SLICE, x)

      def split_ok(v, x=x, s0=s0, s1=s1, axis=axis):
        ok = (v.rank(x) > axis) & (v.attr(s0, "axis") == axis) & (v.attr(s1, "axis") == axis)
        ok = ok & (v.attr(s0, "step") == 1) & (v.attr(s1, "step") == 1)
        return (ok & (v.attr(s0, "start") == 0) & (v.attr(s0, "end") == v.attr(s1, "start"))
                & (v.attr(s1, "end") == v.dim(x, axis)))
      self.src_checks.append(split_ok)
      return [s0, s1]
    if op.type == ENLARGE:
      raise _Skip("Enlarge in the source pattern: TASO's Enlarge reads a second tensor for the "
                  "kernel size, which the project's one-input Enlarge op cannot bind")
    raise _Skip(f"source op {op.name} is not translated")

  def _check_roots(self) -> None:
    """Replaced outputs must be the pattern's roots, and the roots must share an element."""
    t = self.t
    consumed = {(x.op, x.ts) for op in t.src for x in op.inputs if not x.is_var}
    mapped = {(m.src_op, m.src_ts) for m in t.mapped}
    if len(mapped) != len(t.mapped):
      raise _Skip("a source output is mapped twice")
    for i, op in enumerate(t.src):
      for ts in range(op.num_outputs):
        if (i, ts) in consumed and (i, ts) in mapped:
          raise _Skip(f"source output ({i}, {ts}) is mapped and also read inside the pattern; "
                      "the engine replaces only pattern roots")
        if (i, ts) not in consumed and (i, ts) not in mapped:
          raise _Skip(f"source output ({i}, {ts}) is neither read inside the pattern nor mapped")
    roots = sorted(mapped)
    if len(roots) > 2:
      raise _Skip(f"{len(roots)} source roots: compile.py joins 3 roots only for symmetric rules")
    if len(roots) == 2:
      reach = [self._reach(i) for i, _ in roots]
      if not reach[0] & reach[1]:
        raise _Skip("the source pattern is two disconnected parts (two independent rewrites); "
                    "compile.py joins several roots only on an element they share")

  def _reach(self, i: int) -> set[Key]:
    seen: set[Key] = {("s", i)}
    stack = [i]
    while stack:
      for x in self.t.src[stack.pop()].inputs:
        k = ("v", x.op) if x.is_var else ("s", x.op)
        if k not in seen:
          seen.add(k)
          if not x.is_var:
            stack.append(x.op)
    return seen

  # ------------------------------------------------------------------ target pattern
  def _dst_ref(self, t: TasoTensor) -> Ref:
    return self.var_ref[t.op] if t.is_var else self.dst_out[t.op][t.ts]

  def _add_dst(self, op: Op, ins: Sequence[Ref], attrs: dict[str, Any],
               check: Callable[[Any], Any] | None = None) -> Ref:
    ref = self.r.dst(op, *ins, **attrs)
    self.dst.append(_DstEntry(op, tuple(ins), dict(attrs), check))
    return ref

  def _static_rank(self, ref: Ref) -> int | None:
    """The rank the pattern fixes for an element (None when free)."""
    for k, rank in self.ranks.items():
      if rank is not None and self._key_ref(k) == ref:
        return rank
    return None

  def _key_ref(self, k: Key) -> Ref | None:
    if k[0] == "v":
      return self.var_ref.get(k[1])
    outs = self.src_out if k[0] == "s" else self.dst_out
    return outs[k[1]][k[2]] if k[1] < len(outs) else None

  # Target attributes are computed when the edit is planned, from the matched elements only (the
  # new nodes' shapes are not known yet), so sizes of target tensors are expressions over them.
  def _dim(self, ref: Ref, axis: int) -> Callable[[Any], Any]:
    """Size of `axis` of a pattern element as a function of a view of the match, reading only
    variables and source ops (negative axes count from the end)."""
    if ref.kind != "dst":
      return lambda v: v.dim(ref, axis)
    return self.dst_dim[ref](axis)

  def _conv_attrs(self, x: Ref, w: Ref, strides: tuple[int, int], pad: int,
                  act: int) -> dict[str, Any]:
    dims = {(t, a): self._dim(t, a) for t in (x, w) for a in (1, 2, 3)}

    def pads(v):
      xp = _xp(v)
      if pad == PAD_VALID:
        return xp.zeros([4], xp.int32)
      top, bottom = _same_pads_1d(xp, dims[x, 2](v), dims[w, 2](v), strides[0])
      left, right = _same_pads_1d(xp, dims[x, 3](v), dims[w, 3](v), strides[1])
      return xp.stack([top, left, bottom, right]).astype(xp.int32)

    def groups(v):  # TASO's Conv2D infers groups = C_in / C_w
      xp = _xp(v)
      return xp.maximum(dims[x, 1](v) // xp.maximum(dims[w, 1](v), 1), 1)

    return {"strides": strides, "dilations": (1, 1), "activation": act, "pads": pads,
            "groups": groups}

  def _target_op(self, i: int, op: TasoOp) -> list[Ref]:
    del i
    ins = [self._dst_ref(x) for x in op.inputs]
    prov = [self.prov.get(x, {}) for x in ins]
    same = lambda axis: self._dim(ins[0], axis)  # noqa: E731  (shape of the first input)
    if op.type == CONV2D:
      if len(ins) != 2:
        raise _Skip(f"target Conv2D with {len(ins)} inputs")
      strides, pad, act = _conv_params(op)
      x, w = ins
      ref = self._add_dst(Op.CONV2D, ins, self._conv_attrs(x, w, strides, pad, act),
                          self._group_check(x, w))
      self.dst_dim[ref] = lambda axis: self._conv_out_dim(x, w, strides, pad, axis % 4)
      self.prov[ref] = {a: p for a, p in ((0, prov[0].get(0)), (1, prov[1].get(0))) if p}
      return [ref]
    if op.type in _UNARY:
      ref = self._add_dst(_UNARY[op.type], ins, {})
      self.dst_dim[ref] = same
      self.prov[ref] = prov[0]
      return [ref]
    if op.type in _BINARY:
      a, b = ins
      ref = self._add_dst(_BINARY[op.type], ins, {}, lambda v, a=a, b=b: _same_shape(v, a, b))
      self.dst_dim[ref] = same
      return [ref]
    if op.type == SCALAR_MUL:
      ref = self._add_dst(Op.MUL, ins, {}, lambda v, s=ins[1]: v.rank(s) == 0)
      self.dst_dim[ref] = same
      self.prov[ref] = prov[0]
      return [ref]
    if op.type == MATMUL:
      a, b = ins
      ref = self._add_dst(Op.MATMUL, ins, {"activation": _activation(op)},
                          lambda v, a=a, b=b: _batch_dims_equal(v, a, b))
      rank = self._static_rank(a)
      if rank is None:
        rank = self._static_rank(b)
      self.dst_dim[ref] = lambda axis: self._matmul_out_dim(a, b, rank, axis)
      if rank is not None:
        self.prov[ref] = {ax: p for ax, p in ((rank - 2, prov[0].get(rank - 2)),
                                              (rank - 1, prov[1].get(rank - 1))) if p}
      return [ref]
    if op.type == CONCAT:
      axis, ndim = _concat_params(op, len(ins))
      ref = self._add_dst(Op.CONCAT, ins, {"axis": axis},
                          lambda v, a=ins[0]: v.rank(a) == ndim)
      parts = [lambda ax, t=t: self._dim(t, ax) for t in ins]

      def concat_dim(ax, axis=axis, ndim=ndim, parts=parts):
        ax %= ndim
        if ax != axis:
          return parts[0](ax)
        fns = [p(ax) for p in parts]
        return lambda v: sum(f(v) for f in fns[1:]) + fns[0](v)
      self.dst_dim[ref] = concat_dim
      if len(ins) == 2:
        self.prov[ref] = {axis: (ins[0], axis)}
      self.concats[ref] = (axis, tuple(ins))
      return [ref]
    if op.type == TRANSPOSE:
      perm, ndim = _transpose_params(op)
      ref = self._add_dst(Op.TRANSPOSE, ins, {"perm": tuple(perm) + (0,) * (R - ndim)},
                          lambda v, x=ins[0]: v.rank(x) == ndim)
      self.dst_dim[ref] = lambda axis: self._dim(ins[0], perm[axis % ndim])
      return [ref]
    if op.type == ENLARGE:
      w1, w2 = ins
      k2, k3 = self._dim(w2, 2), self._dim(w2, 3)
      ref = self._add_dst(Op.ENLARGE, [w1], {"kernel": lambda v: _xp(v).stack([k2(v), k3(v)])})
      self.dst_dim[ref] = lambda axis: self._dim(w1 if axis % 4 < 2 else w2, axis % 4)
      return [ref]
    if op.type == SPLIT:
      axis = _split_axis(op)
      x = ins[0]
      if axis not in prov[0]:
        raise _Skip(f"target Split on axis {axis} of a tensor whose split sizes no Concat of the "
                    "target pattern determines")
      piece, piece_axis = prov[0][axis]
      cut, end = self._dim(piece, piece_axis), self._dim(x, axis)
      first = self._add_dst(Op.SLICE, [x], {"axis": axis, "start": 0, "end": cut, "step": 1})
      second = self._add_dst(Op.SLICE, [x], {"axis": axis, "start": cut, "end": end, "step": 1})
      rank = self._static_rank(x)

      def piece_dim(ax, size):
        if rank is None:
          raise _Skip("a split tensor of unknown rank")
        return size if ax % rank == axis else self._dim(x, ax % rank)
      self.dst_dim[first] = lambda ax: piece_dim(ax, cut)
      self.dst_dim[second] = lambda ax: piece_dim(ax, lambda v: end(v) - cut(v))
      return [first, second]
    raise _Skip(f"target op {op.name} is not translated")

  def _conv_out_dim(self, x: Ref, w: Ref, strides: tuple[int, int], pad: int,
                    axis: int) -> Callable[[Any], Any]:
    if axis < 2:
      return self._dim(x if axis == 0 else w, 0)
    size, kernel, s = self._dim(x, axis), self._dim(w, axis), strides[axis - 2]
    if pad == PAD_SAME:
      return lambda v: (size(v) + s - 1) // s
    return lambda v: (size(v) - kernel(v)) // s + 1

  def _matmul_out_dim(self, a: Ref, b: Ref, rank: int | None, axis: int) -> Callable[[Any], Any]:
    if axis >= 0:
      if rank is None:
        raise _Skip("a non-negative axis of a MatMul output of unknown rank")
      axis -= rank
    return self._dim(b, -1) if axis == -1 else self._dim(a, axis)

  def _group_check(self, x: Ref, w: Ref) -> Callable[[Any], Any]:
    """TASO's Conv2D takes groups = C_in / C_w. One group is always exact; two groups are exact
    only for the block-diagonal form conv(concat_C(a, b), concat_O(p, q)) with equal halves."""
    block = None
    cx, cw = self.concats.get(x), self.concats.get(w)
    if cx and cw and cx[0] == 1 and cw[0] == 0 and len(cx[1]) == 2 and len(cw[1]) == 2:
      block = (cx[1], cw[1])

    def check(v):
      ok = v.dim(x, 1) == v.dim(w, 1)
      if block is not None:
        (a, b), (p, q) = block
        ok = ok | ((v.dim(x, 1) == 2 * v.dim(w, 1)) & (v.dim(a, 1) == v.dim(b, 1))
                   & (v.dim(p, 0) == v.dim(q, 0)))
      return ok
    return check

  # ------------------------------------------------------------------ the constraint
  def constraint(self, v: Any) -> Any:
    """True where the rule applies: source semantics, a valid target, shapes kept (jax/numpy)."""
    xp = _xp(v)
    ok = xp.asarray(True)
    for check in self.src_checks:
      ok = ok & check(v)
    for t, e in enumerate(self.dst):
      values = {k: (fn(v) if callable(fn) else fn) for k, fn in e.attrs.items()}
      vec = _encode(xp, e.op, values)
      width = max(len(e.inputs), 3)
      shapes = [v.shape(ref) for ref in e.inputs]
      shapes += [xp.ones([R], xp.int32)] * (width - len(e.inputs))
      ranks = [xp.asarray(v.rank(ref), xp.int32) for ref in e.inputs]
      ranks += [xp.asarray(0, xp.int32)] * (width - len(e.inputs))
      in_shapes = xp.stack(shapes).astype(xp.int32)
      spec = ops.get(e.op)
      shape, rank, checks = spec.shape_rule(xp, in_shapes, xp.stack(ranks), vec, len(e.inputs))
      for c, _ in checks:
        ok = ok & c
      if ops.fixed_dtype(spec.dtype_rule) is not None:
        dtype = xp.asarray(ops.fixed_dtype(spec.dtype_rule), xp.int32)
      elif spec.dtype_rule.startswith("attr:"):
        dtype = vec[spec.attr_offsets()[spec.dtype_rule[5:]][0]]
      else:
        dtype = v.dtype(e.inputs[1 if spec.dtype_rule == "input1" else 0])
      v.set_new(t, shape, rank, vec, dtype)
      if e.check is not None:
        ok = ok & e.check(v)
    for root, by in self.replace:
      ok = ok & _same_shape(v, root, by) & (v.dtype(root) == v.dtype(by))
    return ok

  def _constraint_jax(self, m: MatchView) -> Any:
    return self.constraint(_JaxView(m.rule, m.graph, m.bound, new={}, rows=m.rows))

  # ------------------------------------------------------------------ examples
  def _example(self, b: GraphBuilder, rng: np.random.Generator) -> list[Tensor]:
    """A random instance of the source pattern whose shapes satisfy the constraint
    (`rules.taso_examples`)."""
    # taso_examples imports this module, so it is imported here and not at the top
    from xrlflow_jax.rules import taso_examples  # pylint: disable=g-import-not-at-top
    return taso_examples.example(self, b, rng)


def _activation(op: TasoOp) -> int:
  act = op.param("Activation")
  if act is None:
    raise _Skip(f"{op.name} without an Activation parameter")
  if act not in _ACTIVATION:
    raise _Skip(f"{op.name} with unknown TASO activation {act}")
  return _ACTIVATION[act]


def _conv_params(op: TasoOp) -> tuple[tuple[int, int], int, int]:
  sh, sw, pad = op.param("StrideH"), op.param("StrideW"), op.param("Pad")
  if sh is None or sw is None or pad is None:
    raise _Skip("Conv2D without strides or padding mode")
  if sh < 1 or sw < 1 or pad not in (PAD_SAME, PAD_VALID):
    raise _Skip(f"Conv2D with strides ({sh}, {sw}) and padding mode {pad}")
  return (sh, sw), pad, _activation(op)


def _concat_params(op: TasoOp, n_inputs: int) -> tuple[int, int]:
  axis, ndim, n = op.param("Axis"), op.param("NumDim"), op.param("NumInputs")
  if axis is None or ndim is None:
    raise _Skip("Concat without Axis or NumDim")
  if n is not None and n != n_inputs:
    raise _Skip(f"Concat with NumInputs={n} but {n_inputs} inputs")
  if not 0 <= axis < ndim <= R:
    raise _Skip(f"Concat axis {axis} outside rank {ndim}")
  return axis, ndim


def _split_axis(op: TasoOp) -> int:
  axis = op.param("Axis")
  if op.num_outputs != 2 or axis is None:
    raise _Skip(f"Split into {op.num_outputs} outputs (only two-way splits are translated)")
  return axis


def _transpose_params(op: TasoOp) -> tuple[list[int], int]:
  ndim, index = op.param("NumDim"), op.param("Perm")
  if ndim is None or index is None or not 1 <= ndim <= R:
    raise _Skip("Transpose without NumDim or Perm")
  perm = [0] * ndim
  for i in reversed(range(ndim)):  # TASO packs perm as base-NumDim digits, most significant first
    perm[i] = index % ndim
    index //= ndim
  if index or sorted(perm) != list(range(ndim)):
    raise _Skip(f"Transpose with invalid packed perm {op.param('Perm')} for rank {ndim}")
  return perm, ndim


# ---------------------------------------------------------------------------------------------
# The import.

@dataclasses.dataclass
class TasoImport:
  """What `load_taso` made of a rule file.

  Attributes:
    path: the file read.
    source: every rule of the file as decoded (index = position).
    rules: the translated rules (`taso_<index>`, family "taso"), each with an example generator.
    skipped: (index, reason) of every rule not translated, never-matching ones excluded.
    never_matching: indices of rules with a convolution whose input is also its weight.
  """
  path: str
  source: list[TasoRule]
  rules: list[Rule]
  skipped: list[tuple[int, str]]
  never_matching: list[int]

  def summary(self) -> str:
    """Counts (translated / skipped by reason / never matching), one line per group."""
    two = sum(1 for t in self.source if len(t.mapped) == 2)
    lines = [f"TASO rule file {self.path}: {len(self.source)} rules ({two} with two mapped "
             "outputs)",
             f"  translated: {len(self.rules)}",
             f"  never matching (not translated; a convolution reads one tensor as input and "
             f"weight): {len(self.never_matching)}: {self.never_matching}",
             f"  skipped: {len(self.skipped)}"]
    groups: dict[str, list[int]] = collections.defaultdict(list)
    for index, reason in self.skipped:
      groups[reason].append(index)
    for reason, indices in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
      lines.append(f"    {len(indices)} x {reason}: {indices}")
    return "\n".join(lines)


def translate(rules: Sequence[TasoRule], source: str = "<rules>") -> TasoImport:
  """Translates decoded TASO rules (see module docstring); never raises for unsupported rules."""
  # taso_examples imports this module, so it is imported here and not at the top
  from xrlflow_jax.rules import taso_examples  # pylint: disable=g-import-not-at-top
  out, skipped, never = [], [], []
  for t in rules:
    if t.self_convolutions():
      never.append(t.index)
      continue
    try:
      tr = _Translation(t)
    except _Skip as e:
      skipped.append((t.index, str(e)))
      continue
    if taso_examples.find_example(tr, np.random.default_rng(t.index)) is None:
      skipped.append((t.index, "no shapes satisfying the translated constraints were found "
                               f"in {taso_examples.EXAMPLE_TRIES} random tries"))
      continue
    out.append(tr.rule)
  return TasoImport(source, list(rules), out, skipped, never)


def load_taso(path: str | Path) -> TasoImport:
  """Reads and translates TASO's `graph_subst.pb`.

  Raises:
    RuleImportError: the file is missing, unreadable, truncated or corrupt.
  """
  path = Path(path)
  try:
    data = path.read_bytes()
  except OSError as e:
    raise RuleImportError(f"{path}: cannot read the TASO rule file ({e.strerror})") from None
  return translate(parse_rule_collection(data, str(path)), str(path))


__all__ = ["RuleImportError", "TasoImport", "TasoMapping", "TasoOp", "TasoRule", "TasoTensor",
           "load_taso", "parse_rule_collection", "translate"]
