"""The cost of a rewritten graph from its parent's: what a search pays per candidate.

    base = cost_base(graph)                                    # once per expansion
    cost, exact = candidate_cost(graph, base, child, coeffs)   # per candidate (vmap it)

A rewrite touches a few slots, and two parts of the cost model only change where it touches:
  * FLOPs. A node's FLOPs depend only on its op, attributes, shape and its inputs' shapes. The
    child's FLOPs are the parent's except on the (at most `max_changed`) alive slots whose
    operands differ, which are recomputed (the FLOP rule is a `lax.switch` over every op's rule:
    under `vmap` every branch runs, so this saves most of that work).
  * Distinct folded constants (`const.mb`). The parent's constant value classes are sorted once;
    the child's total is the parent's plus, for every class whose membership changed on the
    (at most `max_changed`) slots whose class key changed, its megabytes when it appears or
    disappears. No per-candidate sort. The hash's per-slot part (op, parameter, attributes) is
    the parent's except on the slots the rewrite wrote.
The remaining features (fusion, materialisation, siblings) are cheap gathers and segment sums
over the child and are computed as the full model does.

`exact` is False when more than `max_changed` slots changed in either part; the caller must
then cost that child with `model.graph_cost` (the search does; it never happened on the zoo's
random rewrite walks, `tests/test_rules.py`). Otherwise the cost equals `graph_cost(child,
pruned=True)` up to float32 summation order (the property test checks rel 1e-6) and under the
full model's own assumption that distinct constants have distinct 31-bit hashes.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from xrlflow_jax import ops
from xrlflow_jax.cost import model
from xrlflow_jax.graph import layout, transforms

# Slots a rewrite may change, per part, before the child falls back to the full model. The
# largest rule of the built-in and TASO collections adds 12 nodes.
MAX_CHANGED = 32
# Below this capacity the full (pruned) model is cheaper than the bookkeeping: measured on one
# bucket per model, interleaved in one process (2-core x86_64, XLA:CPU, 2026-12-01), the
# incremental cost took 1.29x the full one at SqueezeNet (N = 128), 0.93x at ResNeXt-50
# (N = 256), 0.85x at BERT-base (N = 704) and NasRNN (N = 384).
MIN_CAPACITY = 256
_CONST_COLUMN = model.FEATURE_NAMES.index("const.mb")


@chex.dataclass(frozen=True)
class CostBase:
  """What every candidate of one parent graph shares (computed once per expansion).

  Attributes:
    operands: the parent's `model.flop_operands` (what each slot's FLOPs depend on).
    flops: float32[N], every slot's FLOPs.
    key_base: uint32[N], every slot's own part of that class hash (`model.constant_key_base`).
    const_key: uint32[N], every slot's folded-constant class (`model.constant_keys`).
    const_mb: float32[N], every slot's output megabytes.
    sorted_key: uint32[N], `const_key` sorted (class sizes by binary search).
    const_total: float32[], megabytes of the parent's distinct folded constants.
  """
  operands: tuple[jax.Array, ...]
  flops: jax.Array
  key_base: jax.Array
  const_key: jax.Array
  const_mb: jax.Array
  sorted_key: jax.Array
  const_total: jax.Array


def _out_mb(graph: layout.Graph) -> jax.Array:
  nd = graph.nodes
  numel = jnp.prod(nd["shape"].astype(jnp.float32), axis=-1)
  return numel * ops.dtype_size(jnp, nd["dtype"]).astype(jnp.float32) / 1e6


def cost_base(graph: layout.Graph, *, pruned: bool = False) -> CostBase:
  """The parent's shared parts. `pruned`: as `model.node_features` (the parent's liveness)."""
  live = graph.nodes["alive"] if pruned else transforms.live_nodes(graph)
  key_base = model.constant_key_base(graph)
  key = model.constant_keys(graph, layout.input_table(graph), live, key_base)
  mb = _out_mb(graph)
  first = model.distinct_constant_mb(graph, layout.input_table(graph), live, mb)
  operands = model.flop_operands(graph)
  return CostBase(operands=operands, flops=jax.vmap(ops.flops_jit)(*operands),
                  key_base=key_base, const_key=key, const_mb=mb, sorted_key=jnp.sort(key),
                  const_total=jnp.sum(first))


def _changed_rows(parent: layout.Graph, base: CostBase, child: layout.Graph,
                  max_changed: int) -> tuple[jax.Array, tuple[jax.Array, ...], jax.Array]:
  """(int32[M] the alive slots whose own fields or FLOP operands changed, n where unused;
  their FLOP operands in the child ([M, ...]); bool[] at most M = `max_changed` of them).

  An edit writes a slot's own fields only on the slots it claims (free in the parent), and a
  slot's FLOP operands are its own fields and its inputs' shapes, so only new slots and slots
  whose inputs changed can differ: those (at most 2M) are compared, not all N.
  """
  n = base.flops.shape[0]
  p, c = parent.nodes, child.nodes
  touched = c["alive"] & (~p["alive"] | jnp.any(
      layout.input_table(parent) != layout.input_table(child), axis=-1))
  (cand,) = jnp.nonzero(touched, size=2 * max_changed, fill_value=n)
  rows = jnp.minimum(cand, n - 1)
  new = model.flop_operands(child, rows)
  differs = ~p["alive"][rows]
  for a, b in zip(base.operands, new):  # op, input shapes and ranks, shape, attributes
    differs = differs | jnp.any((a[rows] != b).reshape(rows.shape[0], -1), axis=-1)
  dirty = (cand < n) & differs
  (j,) = jnp.nonzero(dirty, size=max_changed, fill_value=2 * max_changed)
  pick = jnp.minimum(j, 2 * max_changed - 1)
  idx = jnp.where(j < 2 * max_changed, cand[pick], n)
  exact = (touched.sum() <= 2 * max_changed) & (dirty.sum() <= max_changed)
  return idx, tuple(x[pick] for x in new), exact


def _changed_flops(base: CostBase, operands: tuple[jax.Array, ...],
                   idx: jax.Array) -> jax.Array:
  """float32[N]: the child's FLOPs, recomputed on slots `idx` (n: unused) from their
  `operands` ([M, ...])."""
  fresh = jax.vmap(ops.flops_jit)(*operands)
  return base.flops.at[idx].set(fresh, mode="drop")  # idx == n: fill, dropped


def _const_total(base: CostBase, child: layout.Graph, live: jax.Array, idx: jax.Array,
                 max_changed: int) -> tuple[jax.Array, jax.Array]:
  """(float32[] the child's distinct-constant megabytes, bool[] at most `max_changed` slots
  changed class). `idx`: the slots whose own fields changed (`_changed_rows`); every other
  slot keeps the parent's own part of its class hash."""
  n = base.const_key.shape[0]
  key_base = base.key_base.at[idx].set(
      model.constant_key_base(child, jnp.minimum(idx, n - 1)), mode="drop")
  key = model.constant_keys(child, layout.input_table(child), live, key_base)
  mb = _out_mb(child)
  no_class = jnp.uint32(model.NO_CLASS)
  changed = (key != base.const_key) | ((key != no_class) & (mb != base.const_mb))
  (idx,) = jnp.nonzero(changed, size=max_changed, fill_value=n)
  used = idx < n
  rows = jnp.minimum(idx, n - 1)
  # Events: a slot leaves its parent class and joins its child class ([2M]).
  ev_key = jnp.concatenate([base.const_key[rows], key[rows]])
  ev_sign = jnp.concatenate([-jnp.ones_like(idx), jnp.ones_like(idx)])
  ev_mb = jnp.concatenate([base.const_mb[rows], mb[rows]])
  ev_on = jnp.concatenate([used, used]) & (ev_key != no_class)
  same = (ev_key[:, None] == ev_key[None, :]) & ev_on[:, None] & ev_on[None, :]  # [2M, 2M]
  net = jnp.sum(jnp.where(same, ev_sign[None, :], 0), axis=-1)
  earlier = jnp.tril(same, k=-1).any(axis=-1)
  first = ev_on & ~earlier  # one event per touched class
  size = (jnp.searchsorted(base.sorted_key, ev_key, side="right")
          - jnp.searchsorted(base.sorted_key, ev_key, side="left"))
  before, after = size > 0, size + net > 0
  delta = jnp.sum(jnp.where(first, (after.astype(jnp.float32) - before.astype(jnp.float32))
                            * ev_mb, 0.0))
  return base.const_total + delta, changed.sum() <= max_changed


def candidate_cost(parent: layout.Graph, base: CostBase, child: layout.Graph,
                   coeffs: model.CostCoefficients, *,
                   max_changed: int | None = None) -> tuple[jax.Array, jax.Array]:
  """(float32[] the modelled cost of `child` in ms, bool[] exact).

  `child` must be `parent` after one `rules.edit.apply_edit` (same capacity; every unread node
  freed, so its liveness is `alive`, as `graph_cost(child, pruned=True)`); `base` is
  `cost_base(parent)`. Pure and jittable; vmap it over the candidates of one parent.
  `max_changed`: default MAX_CHANGED (read at trace time).
  """
  max_changed = MAX_CHANGED if max_changed is None else max_changed
  n = base.flops.shape[0]
  idx, operands, rows_exact = _changed_rows(parent, base, child, max_changed)
  flops = _changed_flops(base, operands, idx)
  const_total, const_exact = _const_total(base, child, child.nodes["alive"], idx, max_changed)
  feats = model.node_features(child, coeffs.epilogue_fusion, pruned=True, flops=flops,
                              const_mb=jnp.zeros([n], jnp.float32))
  w = jnp.asarray(coeffs.weights, jnp.float32)
  cost = (jnp.asarray(coeffs.call_ms, jnp.float32) + jnp.sum(feats @ w)
          + w[_CONST_COLUMN] * const_total)
  return cost, rows_exact & const_exact
