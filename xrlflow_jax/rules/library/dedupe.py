"""Common sub-expressions: two nodes of one op reading the same inputs with equal attributes
become one (the other's consumers read the survivor).

Rewrites create these: an RNN cell's gate merge concatenates the same weights at every step
(one Concat per step until deduplicated, so the steps' merged MatMuls cannot then share one
weight and be batched across steps), and converting two convolutions reading one tensor to
NHWC transposes that tensor twice.

An opt-in family (`OPT_IN_FAMILIES`, select it as "family:dedupe"): XLA already computes equal
sub-expressions once (and the executor folds equal constants into one operand), so a dedupe
alone changes no measured time, and what it enables did not pay on XLA:CPU. On NasRNN
(2026-12-04, 2-core x86_64, kernel table) the TASO search's seed cleaned by it went on to batch
the five steps' merged input MatMuls into one 5-row MatMul: modelled x1.447 against x1.177
for the gate merges alone, but measured x1.18 [1.06, 1.30] against x1.41 [1.30, 1.53] (same
run, 20 rounds): the input-side MatMuls do not depend on the recurrence, so XLA:CPU already
runs them beside it, which a sum of kernel times does not see.
"""

from __future__ import annotations

import jax.numpy as jnp

from xrlflow_jax.ops import Op
from xrlflow_jax.rules.pattern import Rule, RuleBuilder

# (op, inputs) pairs deduplicated: the Concats the merge rules build (2, 3 and 4 inputs: the
# 8-way merge concatenates in two groups of 4, then the two groups) and Transposes.
DEDUPED = ((Op.CONCAT, 2), (Op.CONCAT, 3), (Op.CONCAT, 4), (Op.TRANSPOSE, 1))


def dedupe(op: Op, arity: int, family: str = "dedupe", name: str | None = None) -> Rule:
  """a = op(x1..xk), b = op(x1..xk) with equal attributes -> b's consumers read a.

  `family`, `name`: another family may offer a dedupe its own rules need (narrowing joins equal
  slices); "dedupe_*" names are this opt-in family's."""
  name = name or f"dedupe_{op.name.lower()}_{arity}"
  r = RuleBuilder(name, family, symmetric=True, example=_example(op, arity),
                  description=f"two {op.name.title()}s of the same inputs and attributes "
                              "become one")
  xs = [r.var(f"x{i}") for i in range(arity)]
  first = r.src(op, *xs, keep=True)
  second = r.src(op, *xs)
  r.where(lambda m: jnp.all(m.attrs(first) == m.attrs(second)))
  r.replace(second, first)
  return r.build()


def rules() -> list[Rule]:
  """Every dedupe rule."""
  return [dedupe(op, k) for op, k in DEDUPED]


def _example(op: Op, arity: int):
  # The second copy is read by another op: a node holds at most one graph output, so two
  # copies that are both outputs are left as they are (the edit refuses them).
  def ex(b, rng):
    if op == Op.TRANSPOSE:
      x = b.input(tuple(int(d) for d in rng.integers(1, 5, size=3)))
      perm = [int(p) for p in rng.permutation(3)]
      return [b.transpose(x, perm), b.neg(b.transpose(x, perm))]
    if op == Op.SLICE:
      x = b.input(tuple(int(d) for d in rng.integers(2, 5, size=2)))
      axis = int(rng.integers(0, 2))
      return [b.slice(x, axis, 1, x.shape[axis]), b.neg(b.slice(x, axis, 1, x.shape[axis]))]
    rows = int(rng.integers(2, 6))
    make = b.weight if rng.random() < 0.5 else b.input
    xs = [make((rows, int(rng.integers(1, 5)))) for _ in range(arity)]
    return [b.concat(xs, axis=1), b.neg(b.concat(xs, axis=1))]
  return ex
