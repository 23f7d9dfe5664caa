"""The cost of a rewritten graph from its parent's: what a search pays per candidate.

    base = cost_base(graph)                                    # once per expansion
    cost, exact, missing = candidate_cost(graph, base, child, coeffs)  # per candidate (vmap)

A rewrite touches a few slots, and two parts of the cost model only change where it touches:
  * FLOPs. A node's FLOPs depend only on its op, attributes, shape and its inputs' shapes. The
    child's FLOPs are the parent's except on the (at most `max_changed`) alive slots whose
    operands differ, which are recomputed (the FLOP rule is a `lax.switch` over every op's rule:
    under `vmap` every branch runs, so this saves most of that work).
  * Measured kernels (`model.KernelTable`, optional). A slot's kernel signature is part of its
    FLOP operands (with its inputs' dtypes): recomputed and looked up on the same slots.
  * Distinct folded constants (`const.mb`). Only "dirty" slots (aliveness, constness or
    inputs changed; at most `max_changed`) can change their constant sub-tree hash: their hash
    rounds are recomputed from the parent's rounds of their other inputs. Whether a constant
    is read at run time changes only on them and their inputs (before and after): the parent's
    count of reading edges is patched by the dirty readers' edges. Classes are then compared
    on those slots only, and the child's total is the parent's plus, for every class whose
    membership changed, its megabytes when it appears or disappears (no per-candidate sort).
    A dirty constant whose hash changed and that an untouched folded constant reads would
    change that reader's hash too: not exact.
The remaining features (fusion, materialisation, siblings) are gathers and segment sums over
the child, computed as the full model does (the largest part left: on BERT-base, 46 of the
bucket's 114 ms, 2026-12-02).

`exact` is False when more than `max_changed` slots changed in either part or a hash change
spreads; the caller must then cost that child with `model.graph_cost` (the search does; it
happened on none of the zoo's random rewrite walks nor on any one-step candidate of tiny
NasRNN, BERT and ResNeXt-50, `tests/test_rules.py`). Otherwise the cost equals `graph_cost(child,
pruned=True)` up to float32 summation order (the property test checks rel 1e-6) and under the
full model's own assumption that distinct constants have distinct 31-bit hashes.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from xrlflow_jax import ops
from xrlflow_jax.cost import model
from xrlflow_jax.graph import layout

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
    hashes: uint32[H + 1, N], every slot's constant sub-tree hash rounds
      (`model.constant_hash_rounds`).
    reads: int32[N], input edges of live computed nodes reading each slot
      (`model.computed_reads`).
    const_read: bool[N], the slot is read by an alive folded constant (a change of its hash
      would spread to a slot the rewrite did not touch).
    const_key: uint32[N], every slot's folded-constant class (`model.constant_keys`).
    const_mb: float32[N], every slot's output megabytes.
    sorted_key: uint32[N], `const_key` sorted (class sizes by binary search).
    const_total: float32[], megabytes of the parent's distinct folded constants.
    kernel_key, kernel_hit, kernel_ms: uint32[N], bool[N], float32[N], every slot's kernel
      key and measured time (`model.kernel_keys`, `model.lookup_kernels`; None without a
      kernel table).
  The constant parts take liveness as `alive` (as the pruned child's: `candidate_cost`).
  """
  operands: tuple[jax.Array, ...]
  flops: jax.Array
  hashes: jax.Array
  reads: jax.Array
  const_read: jax.Array
  const_key: jax.Array
  const_mb: jax.Array
  sorted_key: jax.Array
  const_total: jax.Array
  kernel_key: jax.Array | None = None
  kernel_hit: jax.Array | None = None
  kernel_ms: jax.Array | None = None


def _out_mb(graph: layout.Graph, rows: jax.Array | None = None) -> jax.Array:
  """float32[N] (or [M] for `rows`): each slot's output megabytes."""
  shape, dtype = graph.nodes["shape"], graph.nodes["dtype"]
  if rows is not None:
    shape, dtype = shape[rows], dtype[rows]
  numel = jnp.prod(shape.astype(jnp.float32), axis=-1)
  return numel * ops.dtype_size(jnp, dtype).astype(jnp.float32) / 1e6


def cost_base(graph: layout.Graph, kernels: model.KernelTable | None = None) -> CostBase:
  """The parent's shared parts (with `kernels`, its slots' measured kernel times)."""
  nd = graph.nodes
  n = nd["op"].shape[0]
  table = layout.input_table(graph)
  alive = nd["alive"]
  hashes = model.constant_hash_rounds(table, model.constant_key_base(graph))
  reads = model.computed_reads(graph, table, alive)
  key = model.class_key(alive & nd["is_constant"] & (reads > 0), hashes[-1])
  const_reader = (table >= 0) & (alive & nd["is_constant"])[:, None]
  const_read = jax.ops.segment_max(const_reader.reshape(-1).astype(jnp.int32),
                                   jnp.maximum(table, 0).reshape(-1), num_segments=n) > 0
  mb = _out_mb(graph)
  first = model.distinct_constant_mb(graph, table, alive, mb)
  operands = model.flop_operands(graph)
  kkey = hit = kms = None
  if kernels is not None:
    kkey = model.kernel_keys(graph)
    hit, kms = model.lookup_kernels(kernels, kkey)
  return CostBase(operands=operands, flops=jax.vmap(ops.flops_jit)(*operands), hashes=hashes,
                  reads=reads, const_read=const_read, const_key=key, const_mb=mb,
                  sorted_key=jnp.sort(key), const_total=jnp.sum(first), kernel_key=kkey,
                  kernel_hit=hit, kernel_ms=kms)


def _changed_rows(parent: layout.Graph, base: CostBase, child: layout.Graph, max_changed: int,
                  kernels: model.KernelTable | None = None
                  ) -> tuple[jax.Array, tuple[jax.Array, ...], jax.Array, jax.Array | None]:
  """(int32[M] the alive slots whose own fields or FLOP operands (or, with `kernels`, kernel
  keys) changed, n where unused; their FLOP operands in the child ([M, ...]); bool[] at most
  M = `max_changed` of them; with `kernels`, their kernel keys in the child uint32[M]).

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
  keys = None
  if kernels is not None:  # the inputs' dtypes too
    keys = model.kernel_keys(child, rows)
    differs = differs | (keys != base.kernel_key[rows])
  dirty = (cand < n) & differs
  (j,) = jnp.nonzero(dirty, size=max_changed, fill_value=2 * max_changed)
  pick = jnp.minimum(j, 2 * max_changed - 1)
  idx = jnp.where(j < 2 * max_changed, cand[pick], n)
  exact = (touched.sum() <= 2 * max_changed) & (dirty.sum() <= max_changed)
  return idx, tuple(x[pick] for x in new), exact, None if keys is None else keys[pick]


def _changed_flops(base: CostBase, operands: tuple[jax.Array, ...],
                   idx: jax.Array) -> jax.Array:
  """float32[N]: the child's FLOPs, recomputed on slots `idx` (n: unused) from their
  `operands` ([M, ...])."""
  fresh = jax.vmap(ops.flops_jit)(*operands)
  return base.flops.at[idx].set(fresh, mode="drop")  # idx == n: fill, dropped


def _const_total(base: CostBase, parent: layout.Graph, child: layout.Graph,
                 max_changed: int) -> tuple[jax.Array, jax.Array]:
  """(float32[] the child's distinct-constant megabytes, bool[] exact).

  Only slots whose aliveness, constness or inputs the rewrite changed ("dirty", at most
  `max_changed`) can change their sub-tree hash, unless the change spreads to an untouched
  folded constant that reads one of them (then not exact); only those and their inputs (before
  and after) can change whether they are read at run time. So the hash rounds run on the dirty
  slots and the class keys are compared on those slots and their inputs, against the parent's.
  """
  n = base.const_key.shape[0]
  p, c = parent.nodes, child.nodes
  tp, tc = layout.input_table(parent), layout.input_table(child)
  dirty = ((p["alive"] != c["alive"]) | (p["is_constant"] != c["is_constant"])
           | jnp.any(tp != tc, axis=-1))
  (d,) = jnp.nonzero(dirty, size=max_changed, fill_value=n)
  used = d < n
  rows = jnp.minimum(d, n - 1)
  # The child's hash rounds on the dirty slots; other inputs keep the parent's rounds.
  own = model.constant_key_base(child, rows)  # [D]
  where_dirty = jnp.full([n], -1, jnp.int32).at[d].set(jnp.arange(max_changed), mode="drop")
  ins = tc[rows]  # [D, K]
  valid = ins >= 0
  safe = jnp.maximum(ins, 0)
  local = where_dirty[safe]  # [D, K]: position among the dirty slots, -1 if not dirty
  rounds = [own]
  for r in range(1, base.hashes.shape[0]):
    prev = jnp.where(local >= 0, rounds[-1][jnp.maximum(local, 0)], base.hashes[r - 1][safe])
    rounds.append(model.hash_round(own, prev, valid))
  moved = jnp.any(jnp.stack(rounds) != base.hashes[:, rows], axis=0)  # [D]
  spreads = used & c["alive"][rows] & c["is_constant"][rows] & moved & base.const_read[rows]
  # Reads by live computed nodes: the parent's, less the dirty readers' edges before, plus
  # their edges after.
  computed_p = model.computed_nodes(p, p["alive"])
  computed_c = model.computed_nodes(c, c["alive"])
  before = used[:, None] & (tp[rows] >= 0) & computed_p[rows][:, None]  # [D, K]
  after = used[:, None] & valid & computed_c[rows][:, None]
  change = (jnp.zeros([n + 1], jnp.int32)
            .at[jnp.where(before, tp[rows], n).reshape(-1)].add(-1)
            .at[jnp.where(after, ins, n).reshape(-1)].add(1))
  # The slots whose class can change: the dirty ones and their inputs, each counted once.
  cand = jnp.concatenate([d, jnp.where(before, tp[rows], n).reshape(-1),
                          jnp.where(after, ins, n).reshape(-1)])  # [S]
  s_len = cand.shape[0]
  first_at = jnp.full([n + 1], s_len, jnp.int32).at[cand].min(jnp.arange(s_len))
  once = (cand < n) & (first_at[cand] == jnp.arange(s_len))
  sr = jnp.minimum(cand, n - 1)
  boundary = (c["alive"][sr] & c["is_constant"][sr]
              & (base.reads[sr] + change[jnp.minimum(cand, n)] > 0))
  pos = where_dirty[sr]
  final = jnp.where(pos >= 0, rounds[-1][jnp.maximum(pos, 0)], base.hashes[-1][sr])
  key = model.class_key(boundary, final)
  mb = _out_mb(child, sr)
  no_class = jnp.uint32(model.NO_CLASS)
  changed = once & ((key != base.const_key[sr]) | ((key != no_class) & (mb != base.const_mb[sr])))
  (j,) = jnp.nonzero(changed, size=max_changed, fill_value=s_len)
  on = j < s_len
  pick = jnp.minimum(j, s_len - 1)
  total = base.const_total + _class_events(base, base.const_key[sr][pick], key[pick],
                                           base.const_mb[sr][pick], mb[pick], on)
  exact = (dirty.sum() <= max_changed) & ~jnp.any(spreads) & (changed.sum() <= max_changed)
  return total, exact


def _class_events(base: CostBase, old_key: jax.Array, new_key: jax.Array, old_mb: jax.Array,
                  new_mb: jax.Array, on: jax.Array) -> jax.Array:
  """float32[]: the change of the distinct-constant megabytes when M slots (`on`) leave class
  `old_key` (size `old_mb`) and join `new_key` (`new_mb`); class sizes in the parent by binary
  search in `base.sorted_key`. No per-candidate sort."""
  no_class = jnp.uint32(model.NO_CLASS)
  ev_key = jnp.concatenate([old_key, new_key])  # [2M]
  ev_sign = jnp.concatenate([-jnp.ones(on.shape, jnp.int32), jnp.ones(on.shape, jnp.int32)])
  ev_mb = jnp.concatenate([old_mb, new_mb])
  ev_on = jnp.concatenate([on, on]) & (ev_key != no_class)
  same = (ev_key[:, None] == ev_key[None, :]) & ev_on[:, None] & ev_on[None, :]  # [2M, 2M]
  net = jnp.sum(jnp.where(same, ev_sign[None, :], 0), axis=-1)
  earlier = jnp.tril(same, k=-1).any(axis=-1)
  first = ev_on & ~earlier  # one event per touched class
  size = (jnp.searchsorted(base.sorted_key, ev_key, side="right")
          - jnp.searchsorted(base.sorted_key, ev_key, side="left"))
  was, now = size > 0, size + net > 0
  return jnp.sum(jnp.where(first, (now.astype(jnp.float32) - was.astype(jnp.float32)) * ev_mb,
                           0.0))


def candidate_cost(parent: layout.Graph, base: CostBase, child: layout.Graph,
                   coeffs: model.CostCoefficients, *, max_changed: int | None = None,
                   kernels: model.KernelTable | None = None
                   ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(float32[] the modelled cost of `child` in ms, bool[] exact, bool[] a kernel of the child
  is missing from `kernels`).

  `child` must be `parent` after one `rules.edit.apply_edit` (same capacity; every unread node
  freed, so its liveness is `alive`, as `graph_cost(child, pruned=True)`); `base` is
  `cost_base(parent, kernels)`. Pure and jittable; vmap it over the candidates of one parent.
  `max_changed`: default MAX_CHANGED (read at trace time). `kernels`: measured kernel times
  (`model.measured_costs`), the same table as `base`'s.
  """
  max_changed = MAX_CHANGED if max_changed is None else max_changed
  n = base.flops.shape[0]
  idx, operands, rows_exact, keys = _changed_rows(parent, base, child, max_changed, kernels)
  flops = _changed_flops(base, operands, idx)
  const_total, const_exact = _const_total(base, parent, child, max_changed)
  feats = model.node_features(child, coeffs.epilogue_fusion, pruned=True, flops=flops,
                              const_mb=jnp.zeros([n], jnp.float32))
  w = jnp.asarray(coeffs.weights, jnp.float32)
  costs = feats @ w
  missing = jnp.asarray(False)
  if kernels is not None:
    fresh_hit, fresh_ms = model.lookup_kernels(kernels, keys)
    hit = base.kernel_hit.at[idx].set(fresh_hit, mode="drop")  # idx == n: dropped
    kms = base.kernel_ms.at[idx].set(fresh_ms, mode="drop")
    costs, missing = model.measured_costs(costs, feats, hit, kms, coeffs)
  cost = (jnp.asarray(coeffs.call_ms, jnp.float32) + jnp.sum(costs)
          + w[_CONST_COLUMN] * const_total)
  return cost, rows_exact & const_exact, missing
