"""Converters of the matrix products: MatMul (1-D operands lifted and dropped again), Gemm
(transposes, alpha, beta and C as separate ops) and Einsum (transposes, reshapes, sums and
batched MatMuls, contracted left to right)."""

from __future__ import annotations

import numpy as np

from xrlflow_jax.graph.builder import axes_bits
from xrlflow_jax.onnx_io.convert.common import Ctx, Operand, check_float, converter
from xrlflow_jax.ops import MAX_RANK, Op


@converter("MatMul")
def _matmul(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs([])
  a, b = ctx.inp(0, "A"), ctx.inp(1, "B")
  ctx.same_dtype([a, b])
  ra, rb = len(ctx.shape(a)), len(ctx.shape(b))
  if ra == 0 or rb == 0:
    raise ctx.error("MatMul operands must have rank >= 1")
  if ra == 1:
    a = ctx.unsqueeze(a, [0])
  if rb == 1:
    b = ctx.unsqueeze(b, [1])
  y = ctx.op(Op.MATMUL, [a, b])
  r = len(ctx.shape(y))
  drop = ([r - 2] if ra == 1 else []) + ([r - 1] if rb == 1 else [])
  return [ctx.squeeze(y, drop)]


@converter("Gemm")
def _gemm(ctx: Ctx) -> list[Operand | None]:
  ctx.check_attrs(["alpha", "beta", "transA", "transB", "broadcast"])
  a, b = ctx.inp(0, "A"), ctx.inp(1, "B")
  ctx.same_dtype([a, b])
  if len(ctx.shape(a)) != 2 or len(ctx.shape(b)) != 2:
    raise ctx.error(f"A and B must be rank 2, got {list(ctx.shape(a))} and {list(ctx.shape(b))}")
  if ctx.int_attr("transA", 0):
    a = ctx.transpose(a, [1, 0])
  if ctx.int_attr("transB", 0):
    b = ctx.transpose(b, [1, 0])
  y = ctx.op(Op.MATMUL, [a, b])
  alpha, beta = ctx.float_attr("alpha", 1.0), ctx.float_attr("beta", 1.0)
  if alpha != 1.0:
    y = ctx.op(Op.MUL, [y, ctx.scalar(alpha, y, "alpha")])
  if ctx.has(2) and beta != 0.0:
    c = ctx.inp(2)
    ctx.same_dtype([y, c])
    if beta != 1.0:
      c = ctx.op(Op.MUL, [c, ctx.scalar(beta, c, "beta")])
    y = ctx.op(Op.ADD, [y, c])
  return [y]


def _einsum_terms(ctx: Ctx, equation: str, ranks: list[int]) -> tuple[list[str], str]:
  """The labels of each operand and of the output, with "..." spelled out as labels of their own
  (Greek letters, right-aligned across operands, as broadcasting aligns them)."""
  eq = equation.replace(" ", "")
  lhs, arrow, rhs = eq.partition("->")
  terms = lhs.split(",")
  if len(terms) != len(ranks):
    raise ctx.error(f"equation {equation!r} names {len(terms)} operands, the node has "
                    f"{len(ranks)}")
  ell_dims = 0
  for t, r in zip(terms, ranks):
    if "..." in t:
      ell_dims = max(ell_dims, r - (len(t) - 3))
  ell = "".join(chr(0x3B1 + i) for i in range(ell_dims))
  out_terms = []
  for t, r in zip(terms, ranks):
    if "..." in t:
      k = r - (len(t) - 3)
      if k < 0:
        raise ctx.error(f"term {t!r} has more labels than its operand's rank {r}")
      t = t.replace("...", ell[ell_dims - k:])
    if not all(ch.isascii() and ch.isalpha() or ch in ell for ch in t):
      raise ctx.error(f"equation {equation!r}: labels must be letters (and one '...')")
    if len(t) != r:
      raise ctx.error(f"term {t!r} has {len(t)} labels for an operand of rank {r}")
    out_terms.append(t)
  if arrow:
    out = rhs.replace("...", ell)
  else:  # implicit output: the ellipsis, then the labels used once, in alphabetical order
    counts = {ch: sum(t.count(ch) for t in out_terms) for ch in set("".join(out_terms))}
    out = ell + "".join(sorted(ch for ch, n in counts.items() if n == 1 and ch not in ell))
  if len(set(out)) != len(out) or any(ch not in "".join(out_terms) for ch in out):
    raise ctx.error(f"equation {equation!r}: output labels must be distinct input labels")
  return out_terms, out


def _einsum_pair(ctx: Ctx, a: Operand, ta: str, b: Operand, tb: str, keep: str,
                 sizes: dict[str, int]) -> tuple[Operand, str]:
  """a (labels ta) times b (labels tb), summed over the labels not in `keep`: one MatMul of
  [batch, left, contracted] by [batch, contracted, right]. Returns (result, its labels)."""
  batch = [ch for ch in ta if ch in tb and ch in keep]
  contract = [ch for ch in ta if ch in tb and ch not in keep]
  left = [ch for ch in ta if ch not in tb]
  right = [ch for ch in tb if ch not in ta]

  def size(labels: list[str]) -> int:
    return int(np.prod([sizes[ch] for ch in labels])) if labels else 1
  a3 = ctx.reshape(ctx.transpose(a, [ta.index(ch) for ch in batch + left + contract]),
                   (size(batch), size(left), size(contract)))
  b3 = ctx.reshape(ctx.transpose(b, [tb.index(ch) for ch in batch + contract + right]),
                   (size(batch), size(contract), size(right)))
  y = ctx.op(Op.MATMUL, [a3, b3])
  labels = batch + left + right
  if len(labels) > MAX_RANK:
    raise ctx.unsupported(f"an intermediate of rank {len(labels)} exceeds the maximum rank "
                          f"{MAX_RANK}")
  return ctx.reshape(y, tuple(sizes[ch] for ch in labels)), "".join(labels)


def _einsum_diagonal(ctx: Ctx, x: Operand, t: str) -> tuple[Operand, str]:
  """x with each label its term repeats taken along the diagonal ("ii->i"): the two axes moved
  last, merged and sliced with step n + 1. Returns (x, its labels, each once)."""
  while len(set(t)) != len(t):
    ch = next(c for c in t if t.count(c) > 1)
    p, q = [a for a, c in enumerate(t) if c == ch][:2]
    shape = ctx.shape(x)
    if shape[p] != shape[q]:
      raise ctx.error(f"term {t!r}: label {ch!r} has sizes {shape[p]} and {shape[q]}")
    n = shape[p]
    rest = [a for a in range(len(t)) if a not in (p, q)]
    moved = ctx.transpose(x, rest + [p, q])
    flat = ctx.reshape(moved, tuple(shape[a] for a in rest) + (n * n,))
    x = ctx.slice(flat, len(rest), 0, n * n, n + 1)
    t = "".join(t[a] for a in rest) + ch
  return x, t


@converter("Einsum")
def _einsum(ctx: Ctx) -> list[Operand | None]:
  """Einsum as transposes, reshapes, sums and batched MatMuls (the contractions transformers
  use: "bhqd,bhkd->bhqk", "bij,bjk->bik", "bnd,dh->bnh", ...). Operands are contracted left to
  right; labels used by one operand only are summed first. A label repeated within one
  operand takes the diagonal; size-1 dims of "..." broadcast."""
  ctx.check_attrs(["equation"])
  equation = ctx.attr("equation", "")
  if not isinstance(equation, str) or not equation:
    raise ctx.error("the equation attribute is missing")
  xs = [x for x in ctx.inputs if x is not None]
  if not xs:
    raise ctx.error("needs at least one operand")
  ctx.same_dtype(xs)
  check_float(ctx, xs[0])
  terms, out = _einsum_terms(ctx, equation, [len(ctx.shape(x)) for x in xs])
  xs, terms = zip(*[_einsum_diagonal(ctx, x, t) for x, t in zip(xs, terms)])
  sizes: dict[str, int] = {}
  for t, x in zip(terms, xs):
    for ch, d in zip(t, ctx.shape(x)):
      sizes[ch] = max(sizes.get(ch, 1), d)
  xs, terms = list(xs), list(terms)
  for i, (x, t) in enumerate(zip(xs, terms)):
    shape = ctx.shape(x)
    for ch, d in zip(t, shape):
      if d != sizes[ch] and (d != 1 or ch.isascii()):
        raise ctx.error(f"label {ch!r} has sizes {d} and {sizes[ch]} (only dims of '...' "
                        "broadcast, and only from size 1)")
    # A size-1 dim broadcast against a larger one: drop it from this operand (the product
    # then broadcasts over the label, as the other operands carry it).
    drop = [a for a, ch in enumerate(t) if shape[a] != sizes[ch]]
    if drop:
      xs[i] = ctx.squeeze(x, drop) if len(drop) < len(t) else ctx.reshape(x, (1,))
      terms[i] = "".join(ch for a, ch in enumerate(t) if a not in drop)
      if len(drop) == len(t):  # a scalar operand: keep one axis of size 1 under a new label
        terms[i] = "\u03c9"
        sizes["\u03c9"] = 1

  def sum_out(x: Operand, t: str, keep: str) -> tuple[Operand, str]:
    drop = [i for i, ch in enumerate(t) if ch not in keep]
    if not drop:
      return x, t
    y = ctx.op(Op.REDUCE_SUM, [x], axes=axes_bits(drop), keepdims=False)
    return y, "".join(ch for ch in t if ch in keep)

  later = ["".join(terms[i + 1:]) for i in range(len(terms))]
  y, ty = sum_out(xs[0], terms[0], out + later[0])
  for i in range(1, len(xs)):
    keep = out + later[i]
    b, tb = sum_out(xs[i], terms[i], keep + ty)
    y, ty = sum_out(y, ty, keep + tb)
    y, ty = _einsum_pair(ctx, y, ty, b, tb, keep, sizes)
  y, ty = sum_out(y, ty, out)
  return [ctx.transpose(y, [ty.index(ch) for ch in out])]
