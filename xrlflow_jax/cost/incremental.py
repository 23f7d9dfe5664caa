"""The cost of a rewritten graph from its parent's: what a search pays per candidate.

    base = cost_base(graph, coeffs)                            # once per expansion
    cost, exact, missing = candidate_cost(graph, base, child, coeffs)  # per candidate (vmap)
    ModelCost(coeffs).candidate_costs(graph, children)         # both, exact (environments)

A rewrite touches a few slots: the "dirty" ones, whose aliveness, constness or inputs changed
(at most `MAX_CHANGED`; an edit writes a slot's own fields only on slots it claims, free in the
parent). Every part of the cost model changes only around them:
  * FLOPs. A node's FLOPs depend only on its op, attributes, shape and its inputs' shapes: they
    are recomputed on the dirty slots alive in the child (the FLOP rule is a `lax.switch` over
    every op's rule: under `vmap` every branch runs, so this saves most of that work).
  * Measured kernels (`model.KernelTable`, optional). A slot's kernel signature is part of its
    FLOP operands (with its inputs' dtypes): recomputed and looked up on the same slots.
  * Node features (fusion, materialisation, siblings). A slot's row (`model.row_columns`)
    reads its own fields, its inputs and their producers through bitcast chains, whether a
    MatMul/Conv2D or a graph output resolves to it, and how many sibling candidates share its
    first input's producer. So the rows that can change are: the dirty slots; the slots whose
    input chains pass through one ("readers", from a reverse table of the parent); the old and
    new producers those read from memory or resolve to; and the sibling candidates of every
    producer whose reader count crosses 2. Those rows (at most `MAX_ROWS`) are evaluated in the
    child with the same row formula, the counts they need patched from the parent's by the
    dirty slots and readers, and the child's total is the parent's plus their change.
  * Distinct folded constants (`const.mb`). Only dirty slots can change their constant sub-tree
    hash: their hash rounds are recomputed from the parent's rounds of their other inputs.
    Whether a constant is read at run time changes only on them and their inputs (before and
    after): the parent's count of reading edges is patched by the dirty readers' edges. Classes
    are then compared on those slots only, and the child's total is the parent's plus, for
    every class whose membership changed, its megabytes when it appears or disappears (no
    per-candidate sort). A dirty constant whose hash changed and that an untouched folded
    constant reads would change that reader's hash too: not exact.

`exact` is False when a part's fixed-size lists overflow (more dirty slots, readers, rows or
sibling candidates than their caps) or a hash change spreads; the caller must then cost that
child with `model.graph_cost` (the search does; `tests/test_rules.py` checks that on the zoo's
random rewrite walks no cap overflows and a hash spreads at most twice a walk, and that no
one-step candidate of tiny NasRNN, BERT and ResNeXt-50 falls back). Otherwise the cost equals
`graph_cost(child, pruned=True)` up to float32 summation order (the property tests check rel
1e-6) and under the full model's own assumption that distinct constants have distinct 31-bit
hashes.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Iterator

import chex
import jax
import jax.numpy as jnp

from xrlflow_jax import ops
from xrlflow_jax.cost import model
from xrlflow_jax.graph import layout

# Slots a rewrite may change before the child falls back to the full model. The largest rule of
# the built-in and TASO collections adds 12 nodes.
MAX_CHANGED = 32
# Per slot, the readers (slots whose input chains pass through it) and the sibling candidates
# (MatMuls/Conv2Ds whose first input resolves to it) the parent's reverse tables keep.
MAX_READERS = 16
# Slots whose own fields or input chains changed (the dirty ones and their readers), and rows
# whose features are evaluated again, per candidate. The 8-way MatMul merge (8 removed
# MatMuls, 12 new nodes, the removed ones' readers) needs 35-36 on tiny NasRNN: at 34 four of
# its candidates fell back to the full model (2026-12-04).
MAX_REACHED = 40
MAX_ROWS = 64
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
    context: the parent's `model.graph_context` (pruned).
    row_cost: float32[N], every slot's modelled cost without `const.mb` (measured kernels
      applied); row_total: float32[], their sum.
    row_missing: bool[N], kernel slots whose signature the table lacks.
    readers: int32[N + 1, MAX_READERS], the active slots whose input chains (an input and the
      bitcasts it resolves through) pass through each slot, N-padded; readers_full: bool[N + 1],
      a slot has more.
    siblings: int32[N + 1, MAX_READERS], the sibling candidates reading each producer first
      (`GraphContext.first_src`), N-padded; siblings_full: bool[N + 1], a producer has more.
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
  Liveness is `alive` throughout (as the pruned child's: `candidate_cost`).
  """
  operands: tuple[jax.Array, ...]
  flops: jax.Array
  context: model.GraphContext
  row_cost: jax.Array
  row_total: jax.Array
  row_missing: jax.Array
  readers: jax.Array
  readers_full: jax.Array
  siblings: jax.Array
  siblings_full: jax.Array
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


def _reverse_table(target: jax.Array, source: jax.Array, n: int, cap: int
                   ) -> tuple[jax.Array, jax.Array]:
  """(int32[n + 1, cap], bool[n + 1]): for each slot t < n, the distinct `source` values of the
  pairs whose `target` is t (ascending, n-padded), and whether there are more than `cap`.
  Pairs with target n are ignored; row n is empty."""
  stride = n + 1
  none = jnp.int32((n + 2) * stride)
  key = jnp.sort(jnp.where(target < n, target * stride + source, none).reshape(-1))
  repeat = jnp.concatenate([jnp.zeros([1], bool), key[1:] == key[:-1]])
  key = jnp.sort(jnp.where(repeat, none, key))  # distinct pairs first, ascending
  slots = jnp.arange(n + 1, dtype=jnp.int32)
  start = jnp.searchsorted(key, slots * stride)
  count = jnp.searchsorted(key, (slots + 1) * stride) - start
  r = jnp.arange(cap, dtype=jnp.int32)
  at = jnp.minimum(start[:, None] + r[None, :], key.shape[0] - 1)
  table = jnp.where(r[None, :] < count[:, None], key[at] % stride, n)
  return table.astype(jnp.int32), count > cap


def _row_costs(feats: jax.Array, op: jax.Array, coeffs: model.CostCoefficients,
               hit: jax.Array | None, ms: jax.Array | None) -> tuple[jax.Array, jax.Array]:
  """(float32[M] costs, bool[M] kernel rows missing from the table) of feature rows
  [M, F - 1] (no `const.mb`) of slots with op codes int32[M], measured kernels applied where
  `hit`."""
  feats = jnp.concatenate([feats, jnp.zeros(feats.shape[:-1] + (1,), feats.dtype)], axis=-1)
  costs = feats @ jnp.asarray(coeffs.weights, jnp.float32)
  if hit is None:
    return costs, jnp.zeros(costs.shape, bool)
  costs, _ = model.measured_costs(costs, feats, op, hit, ms, coeffs)
  return costs, model.kernel_rows(op, feats) & ~hit


def cost_base(graph: layout.Graph, coeffs: model.CostCoefficients,
              kernels: model.KernelTable | None = None) -> CostBase:
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
  mb = model.row_out_mb(nd["shape"], nd["dtype"])[1]
  first = model.distinct_constant_mb(graph, table, alive, mb)
  operands = model.flop_operands(graph)
  flops = jax.vmap(ops.flops_jit)(*operands)
  kkey = hit = kms = None
  if kernels is not None:
    kkey = model.kernel_keys(graph)
    hit, kms = model.lookup_kernels(kernels, kkey)
  ctx = model.graph_context(graph, coeffs.epilogue_fusion, pruned=True)
  row_cost, row_missing = _row_costs(
      model.context_features(graph, ctx, coeffs.epilogue_fusion, flops), nd["op"], coeffs,
      hit, kms)
  # Input chains: each input and the slots it resolves through ([N, K, depth + 1]).
  safe = jnp.maximum(ctx.table, 0)
  chain = [safe]
  for _ in range(model.BITCAST_DEPTH):
    x = chain[-1]
    chain.append(jnp.where(ctx.kinds.is_bitcast[x], safe[:, 0][x], x))
  chain = jnp.stack(chain, axis=-1)
  on = ctx.valid & ctx.kinds.active[:, None]
  owner = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32)[:, None, None], chain.shape)
  readers, readers_full = _reverse_table(jnp.where(on[..., None], chain, n), owner, n,
                                         MAX_READERS)
  siblings, siblings_full = _reverse_table(ctx.first_src, jnp.arange(n, dtype=jnp.int32), n,
                                           MAX_READERS)
  return CostBase(operands=operands, flops=flops, context=ctx, row_cost=row_cost,
                  row_total=jnp.sum(row_cost), row_missing=row_missing, readers=readers,
                  readers_full=readers_full, siblings=siblings, siblings_full=siblings_full,
                  hashes=hashes, reads=reads, const_read=const_read, const_key=key,
                  const_mb=mb, sorted_key=jnp.sort(key), const_total=jnp.sum(first),
                  kernel_key=kkey, kernel_hit=hit, kernel_ms=kms)


def _changed_flops(parent: layout.Graph, base: CostBase, child: layout.Graph, d: jax.Array,
                   changed_inputs: jax.Array, kernels: model.KernelTable | None
                   ) -> tuple[jax.Array, jax.Array | None, jax.Array | None]:
  """(float32[N] the child's FLOPs, and with `kernels` its kernel hits bool[N] and times
  float32[N]): recomputed on the dirty slots `d` ([M], N-padded) alive in the child, whose
  inputs (`changed_inputs` bool[M]) or own fields (new slots) may differ. An edit writes a
  slot's own fields only on the slots it claims, and FLOPs and kernel keys depend only on a
  slot's own fields and its inputs' shapes and dtypes, so no other slot changes."""
  n = base.flops.shape[0]
  rows = jnp.minimum(d, n - 1)
  c = child.nodes
  touched = (d < n) & c["alive"][rows] & (~parent.nodes["alive"][rows] | changed_inputs)
  idx = jnp.where(touched, d, n)  # n: dropped by the scatters
  fresh = jax.vmap(ops.flops_jit)(*model.flop_operands(child, rows))
  flops = base.flops.at[idx].set(fresh, mode="drop")
  if kernels is None:
    return flops, None, None
  fresh_hit, fresh_ms = model.lookup_kernels(kernels, model.kernel_keys(child, rows))
  return (flops, base.kernel_hit.at[idx].set(fresh_hit, mode="drop"),
          base.kernel_ms.at[idx].set(fresh_ms, mode="drop"))


def _const_total(base: CostBase, parent: layout.Graph, child: layout.Graph, d: jax.Array,
                 tp: jax.Array, tc: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(float32[] the child's distinct-constant megabytes, bool[] exact).

  Only the dirty slots `d` ([M], N-padded) can change their sub-tree hash, unless the change
  spreads to an untouched folded constant that reads one of them (then not exact); only those
  and their inputs (before and after; input tables `tp`, `tc`) can change whether they are read
  at run time. So the hash rounds run on the dirty slots and the class keys are compared on
  those slots and their inputs, against the parent's.
  """
  n = base.const_key.shape[0]
  m = d.shape[0]
  p, c = parent.nodes, child.nodes
  used = d < n
  rows = jnp.minimum(d, n - 1)
  # The child's hash rounds on the dirty slots; other inputs keep the parent's rounds.
  own = model.constant_key_base(child, rows)  # [D]
  where_dirty = jnp.full([n], -1, jnp.int32).at[d].set(jnp.arange(m), mode="drop")
  ins = tc[rows]  # [D, K]
  valid = ins >= 0
  safe = jnp.maximum(ins, 0)
  local = where_dirty[safe]  # [D, K]: position among the dirty slots, -1 if not dirty

  def one_round(h: jax.Array, parent_round: jax.Array) -> tuple[jax.Array, jax.Array]:
    prev = jnp.where(local >= 0, h[jnp.maximum(local, 0)], parent_round[safe])
    h = model.hash_round(own, prev, valid)
    return h, h

  # A scan, as `model.constant_hash_rounds` (unrolled, XLA repeats `own`'s mix in each gather).
  _, later = jax.lax.scan(one_round, own, base.hashes[:-1])  # rounds 1..H of the dirty slots
  rounds = jnp.concatenate([own[None], later])  # [H + 1, D]
  moved = jnp.any(rounds != base.hashes[:, rows], axis=0)  # [D]
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
  mb = model.row_out_mb(c["shape"][sr], c["dtype"][sr])[1]
  no_class = jnp.uint32(model.NO_CLASS)
  changed = once & ((key != base.const_key[sr]) | ((key != no_class) & (mb != base.const_mb[sr])))
  (j,) = jnp.nonzero(changed, size=m, fill_value=s_len)
  on = j < s_len
  pick = jnp.minimum(j, s_len - 1)
  total = base.const_total + _class_events(base, base.const_key[sr][pick], key[pick],
                                           base.const_mb[sr][pick], mb[pick], on)
  exact = ~jnp.any(spreads) & (changed.sum() <= m)
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


def _mark(n: int, *ids: jax.Array) -> jax.Array:
  """bool[n]: the slots named in `ids` (any shapes; n = none)."""
  marked = jnp.zeros([n + 1], bool)
  for x in ids:
    marked = marked.at[x.reshape(-1)].set(True)
  return marked[:n]


def _row_delta(base: CostBase, child: layout.Graph, tc: jax.Array, d: jax.Array,
               flops: jax.Array, hit: jax.Array | None, kms: jax.Array | None,
               coeffs: model.CostCoefficients) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(float32[] the child's row costs less the parent's, bool[] a kernel of the child is
  missing from the table, bool[] exact): the rows that can change (module docstring) evaluated
  in the child with `model.row_columns`, from the dirty slots `d` ([M], N-padded)."""
  ef = coeffs.epilogue_fusion
  ctx = base.context
  n = ctx.src.shape[0]
  c = child.nodes
  kinds_at = lambda rows: model.row_kinds(  # noqa: E731
      c["op"][rows], c["attrs"][rows], c["alive"][rows], c["is_constant"][rows],
      (tc[rows] >= 0).sum(-1), ef)
  is_bitcast = model.row_kinds(c["op"], c["attrs"], c["alive"], c["is_constant"],
                               (tc >= 0).sum(-1), ef).is_bitcast  # [N]; the rest is unused
  first_input = jnp.maximum(tc[:, 0], 0)
  resolve = lambda x: model.resolve_bitcasts(x, is_bitcast, first_input)  # noqa: E731

  # The slots whose own fields or input chains changed: dirty, and readers of dirty slots.
  reached = _mark(n, d, base.readers[d])
  (r,) = jnp.nonzero(reached, size=MAX_REACHED, fill_value=n)
  on = r < n
  rr = jnp.minimum(r, n - 1)
  kr = kinds_at(rr)
  tr = tc[rr]
  vr = (tr >= 0) & on[:, None]
  src_c = resolve(jnp.maximum(tr, 0))  # [R, K]
  self_c = resolve(rr)
  force_c = vr & (kr.is_mm | kr.is_conv)[:, None]
  out_c = on & c["alive"][rr] & c["is_output"][rr]
  first_c = jnp.where(on & kr.mmconv & vr[:, 0], src_c[:, 0], n)
  src_p, self_p = ctx.src[rr], ctx.self_ids[rr]
  force_p = ctx.force[rr] & on[:, None]
  out_p = ctx.out_node[rr] & on
  first_p = jnp.where(on, ctx.first_src[rr], n)
  # Their edges' contributions to the counts, parent's out and child's in.
  delta = lambda new, new_on, old, old_on: (  # noqa: E731
      jnp.zeros([n + 1], jnp.int32)
      .at[jnp.where(new_on, new, n).reshape(-1)].add(1)
      .at[jnp.where(old_on, old, n).reshape(-1)].add(-1))
  need_delta = delta(src_c, force_c, src_p, force_p)
  out_delta = delta(self_c, out_c, self_p, out_p)
  readers_delta = delta(first_c, first_c < n, first_p, first_p < n)
  # Producers whose sibling candidates cross the count of 2: all their candidates change.
  prod = jnp.concatenate([first_p, first_c])
  before = ctx.readers[prod]
  flips = (prod < n) & ((before >= 2) != (before + readers_delta[prod] >= 2))
  flipped = jnp.where(flips[:, None], base.siblings[prod], n)
  rows_on = _mark(n, r, jnp.where(force_c, src_c, n), jnp.where(force_p, src_p, n),
                  jnp.where(out_c, self_c, n), jnp.where(out_p, self_p, n), flipped)
  (s,) = jnp.nonzero(rows_on, size=MAX_ROWS, fill_value=n)
  son = s < n
  ss = jnp.minimum(s, n - 1)

  # The child's features on those rows, with the patched counts.
  ks = kinds_at(ss)
  ts = tc[ss]
  vs = ts >= 0
  safe = jnp.maximum(ts, 0)
  numel, out_mb = model.row_out_mb(c["shape"][ss], c["dtype"][ss])
  in_mb = jnp.where(vs, model.row_out_mb(c["shape"][safe], c["dtype"][safe])[1], 0.0)
  src = resolve(safe)
  src_loop_out = kinds_at(src).loop_out
  materialise = ((ctx.need_count[ss] + need_delta[ss] > 0)
                 | (ctx.out_count[ss] + out_delta[ss] > 0))
  first = jnp.where(ks.mmconv & vs[:, 0], src[:, 0], n)
  sibling = ks.mmconv & (ctx.readers[first] + readers_delta[first] >= 2)
  feats = model.row_columns(ks, c["op"][ss], numel, out_mb, vs, in_mb, src_loop_out,
                            materialise, sibling, flops[ss], ef)
  costs, missing = _row_costs(feats, c["op"][ss], coeffs, None if hit is None else hit[ss],
                              None if kms is None else kms[ss])
  change = jnp.sum(jnp.where(son, costs - base.row_cost[ss], 0.0))
  # Missing kernels: the child's rows here, the parent's elsewhere.
  missing_elsewhere = (jnp.sum(base.row_missing.astype(jnp.int32))
                       - jnp.sum((son & base.row_missing[ss]).astype(jnp.int32))) > 0
  exact = ((reached.sum() <= MAX_REACHED) & (rows_on.sum() <= MAX_ROWS)
           & ~jnp.any(base.readers_full[d]) & ~jnp.any(flips & base.siblings_full[prod]))
  return change, jnp.any(son & missing) | missing_elsewhere, exact


def dirty_slots(parent: layout.Graph, child: layout.Graph, tp: jax.Array, tc: jax.Array,
                max_changed: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(bool[N] dirty, bool[N] inputs changed, int32[max_changed] the dirty slots, N-padded):
  the slots whose aliveness, constness or inputs (tables `tp`, `tc`) differ."""
  p, c = parent.nodes, child.nodes
  changed_inputs = jnp.any(tp != tc, axis=-1)
  dirty = (p["alive"] != c["alive"]) | (p["is_constant"] != c["is_constant"]) | changed_inputs
  (d,) = jnp.nonzero(dirty, size=max_changed, fill_value=tp.shape[0])
  return dirty, changed_inputs, d


def candidate_cost(parent: layout.Graph, base: CostBase, child: layout.Graph,
                   coeffs: model.CostCoefficients, *, max_changed: int | None = None,
                   kernels: model.KernelTable | None = None
                   ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(float32[] the modelled cost of `child` in ms, bool[] exact, bool[] a kernel of the child
  is missing from `kernels`).

  `child` must be `parent` after one `rules.edit.apply_edit` (same capacity; every unread node
  freed, so its liveness is `alive`, as `graph_cost(child, pruned=True)`); `base` is
  `cost_base(parent, coeffs, kernels)`. Pure and jittable; vmap it over the candidates of one
  parent. `max_changed`: default MAX_CHANGED (read at trace time). `kernels`: measured kernel
  times (`model.measured_costs`), the same table as `base`'s.
  """
  max_changed = MAX_CHANGED if max_changed is None else max_changed
  n = base.flops.shape[0]
  tp, tc = layout.input_table(parent), layout.input_table(child)
  dirty, changed_inputs, d = dirty_slots(parent, child, tp, tc, max_changed)
  flops, hit, kms = _changed_flops(parent, base, child, d,
                                   changed_inputs[jnp.minimum(d, n - 1)], kernels)
  rows, missing, rows_exact = _row_delta(base, child, tc, d, flops, hit, kms, coeffs)
  const_total, const_exact = _const_total(base, parent, child, d, tp, tc)
  w = jnp.asarray(coeffs.weights, jnp.float32)
  cost = (jnp.asarray(coeffs.call_ms, jnp.float32) + base.row_total + rows
          + w[_CONST_COLUMN] * const_total)
  exact = (dirty.sum() <= max_changed) & rows_exact & const_exact
  return cost, exact, missing


# The kernel table a training program carries in its state (`bound_kernels`); None: each
# ModelCost uses its own.
_BOUND_TABLE: contextvars.ContextVar[model.KernelTable | None] = contextvars.ContextVar(
    "xrlflow_bound_kernel_table", default=None)


@contextlib.contextmanager
def bound_kernels(table: model.KernelTable | None) -> Iterator[None]:
  """While tracing inside this block, every `ModelCost` built with a kernel table costs with
  `table` instead (a traced input, e.g. a training state's field: a table that grows within
  its capacity then reuses the compiled program; `KernelTimes.table()` of the same profile).
  ModelCosts of the roofline (no table) are unaffected; None binds nothing."""
  token = _BOUND_TABLE.set(table)
  try:
    yield
  finally:
    _BOUND_TABLE.reset(token)


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity (its table holds arrays)
class ModelCost:
  """The cost model as a function of a graph, for an environment or a training run: calling it
  gives `model.graph_cost(graph, coeffs, pruned=pruned, kernels=kernels)` (float32[] ms), and
  it knows how to cost one parent's children cheaply (`candidate_costs`). An environment given
  one as its `cost_fn` builds its exact candidate delta from the incremental cost.

  Attributes:
    coeffs: the cost-model coefficients; kernels: measured kernel times (None: the roofline).
    pruned: the graphs are pruned (every unread node freed, as the environment keeps them).
  """
  coeffs: model.CostCoefficients
  kernels: model.KernelTable | None = None
  pruned: bool = True

  @property
  def table(self) -> model.KernelTable | None:
    """The kernel table costs use: the one bound by `bound_kernels` when this model has a
    table and one is bound, else `kernels`."""
    bound = _BOUND_TABLE.get()
    return bound if bound is not None and self.kernels is not None else self.kernels

  def __call__(self, graph: layout.Graph) -> jax.Array:
    return model.graph_cost(graph, self.coeffs, pruned=self.pruned, kernels=self.table)

  def node_costs(self, graph: layout.Graph) -> jax.Array:
    """float32[N]: `model.node_costs` under the same settings."""
    return model.node_costs(graph, self.coeffs, pruned=self.pruned, kernels=self.table)

  def candidate_costs(self, parent: layout.Graph, children: layout.Graph) -> jax.Array:
    """float32[C]: the cost of each of `children` (a batch of C graphs, each `parent` after one
    `rules.edit.apply_edit`), equal to calling this on each. Jittable and vmappable.

    From capacity MIN_CAPACITY up, on pruned graphs, each child is costed incrementally from
    the parent (`candidate_cost`); the children it cannot cover exactly are then costed in
    full, one per round of a `lax.while_loop` (none on the zoo's walks, so usually no round).
    Below it, or unpruned, every child is costed in full.
    """
    if layout.capacity(parent) < MIN_CAPACITY or not self.pruned:
      return jax.vmap(self)(children)
    table = self.table
    base = cost_base(parent, self.coeffs, table)
    cost, exact, _ = jax.vmap(lambda c: candidate_cost(parent, base, c, self.coeffs,
                                                       kernels=table))(children)

    def costed_alone(carry):
      cost, todo = carry
      i = jnp.argmax(todo)
      child = jax.tree_util.tree_map(lambda x: x[i], children)
      return cost.at[i].set(self(child)), todo.at[i].set(False)
    cost, _ = jax.lax.while_loop(lambda carry: jnp.any(carry[1]), costed_alone,
                                 (cost.astype(jnp.float32), ~exact))
    return cost
