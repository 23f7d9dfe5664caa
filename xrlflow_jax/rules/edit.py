"""The edit: a small fixed-size description of one rewrite, and the one kernel that applies it.

Rule-specific code only computes an `Edit` (which ops to add, with their op codes, attributes,
shapes and inputs; which consumers to redirect; which ops to free). `apply_edit` performs the
array surgery for any edit, so under `vmap` (where `lax.switch` evaluates every branch) the
expensive part runs once per step, not once per rule.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from xrlflow_jax import ops
from xrlflow_jax.graph import layout
from xrlflow_jax.graph import transforms
from xrlflow_jax.ops import Op

NONE, EXISTING, NEW = 0, 1, 2  # kinds of a reference in an edit


@chex.dataclass(frozen=True)
class Edit:
  """One rewrite as data (M new nodes, Q redirects, F freed nodes, K input slots).

  Attributes:
    new_valid: bool[M]; new_op, new_rank, new_dtype: int32[M]; new_attrs: int32[M, A];
    new_shape: int32[M, R]; new_const: bool[M].
    in_kind, in_ref: int32[M, K]: input k of new node j is nothing (NONE), an existing slot
      (EXISTING, ref = slot) or new node ref (NEW, ref < j).
    red_old: int32[Q]: a node whose consumers (and output role) move (N = none);
    red_kind, red_ref: int32[Q]: the replacement, EXISTING slot or NEW node.
    free: int32[F]: nodes removed (N = none).
    ok: bool[]: the edit is well formed (shape rules passed).
  """
  new_valid: jax.Array
  new_op: jax.Array
  new_attrs: jax.Array
  new_shape: jax.Array
  new_rank: jax.Array
  new_dtype: jax.Array
  new_const: jax.Array
  in_kind: jax.Array
  in_ref: jax.Array
  red_old: jax.Array
  red_kind: jax.Array
  red_ref: jax.Array
  free: jax.Array
  ok: jax.Array


def _dtype_rule_table() -> tuple[jax.Array, jax.Array]:
  """Per op code: which input gives the output dtype (0 or 1), or -1 for an attribute, and that
  attribute's offset, or -2 for a fixed dtype, and that dtype's code."""
  source, offset = [], []
  for spec in ops.all_specs():
    rule = spec.dtype_rule
    if ops.fixed_dtype(rule) is not None:
      source.append(-2)
      offset.append(ops.fixed_dtype(rule))
    elif rule.startswith("attr:"):
      source.append(-1)
      offset.append(spec.attr_offsets()[rule[5:]][0])
    else:
      source.append(1 if rule == "input1" else 0)
      offset.append(0)
  return jnp.asarray(source, jnp.int32), jnp.asarray(offset, jnp.int32)


def complete(graph: layout.Graph, edit: Edit) -> Edit:
  """Fills in shapes, ranks, dtypes and constness of an edit's new nodes from the shape rules.

  One `lax.scan` over the M new nodes (in order, so a new node may read earlier ones) with
  `ops.infer_shape_jit`, so the shape rules are compiled once for every rule. Also checks that
  every replacement has exactly the shape and dtype of the tensor it replaces; a failure makes
  `ok` false and the edit is not applied.
  """
  edit = jax.tree_util.tree_map(jnp.asarray, edit)  # a plan keeps what it fixes as numpy
  nodes = graph.nodes
  n = nodes["op"].shape[-1]
  m, k = edit.in_kind.shape
  width = max(k, 3)
  dtype_source, dtype_offset = _dtype_rule_table()

  def step(carry, j):
    shapes, ranks, dtypes, const = carry
    kind, ref = edit.in_kind[j], edit.in_ref[j]
    existing = jnp.clip(ref, 0, n - 1)
    new = jnp.clip(ref, 0, m - 1)
    in_shapes = jnp.where((kind == EXISTING)[:, None], nodes["shape"][existing],
                          jnp.where((kind == NEW)[:, None], shapes[new], 1))
    in_ranks = jnp.where(kind == EXISTING, nodes["rank"][existing],
                         jnp.where(kind == NEW, ranks[new], 0))
    in_dtypes = jnp.where(kind == EXISTING, nodes["dtype"][existing], dtypes[new])
    in_const = jnp.where(kind == EXISTING, nodes["is_constant"][existing],
                         jnp.where(kind == NEW, const[new], True))
    if width > k:
      in_shapes = jnp.concatenate([in_shapes, jnp.ones([width - k, in_shapes.shape[1]],
                                                       jnp.int32)])
      in_ranks = jnp.concatenate([in_ranks, jnp.zeros([width - k], jnp.int32)])
    op = edit.new_op[j]
    attrs = edit.new_attrs[j]
    n_in = (kind != NONE).sum().astype(jnp.int32)
    shape, rank, ok = ops.infer_shape_jit(op, in_shapes, in_ranks, attrs, n_in,
                                          jnp.ones_like(in_shapes[0]), jnp.int32(0))
    src = dtype_source[op]
    dtype = jnp.where(src == -2, dtype_offset[op],
                      jnp.where(src < 0, attrs[dtype_offset[op]], in_dtypes[jnp.maximum(src, 0)]))
    is_const = jnp.all(in_const) & (n_in > 0)
    valid = edit.new_valid[j]
    carry = (shapes.at[j].set(shape), ranks.at[j].set(rank), dtypes.at[j].set(dtype),
             const.at[j].set(is_const))
    return carry, ~valid | ok

  init = (edit.new_shape, edit.new_rank, edit.new_dtype, edit.new_const)
  (shapes, ranks, dtypes, const), oks = jax.lax.scan(step, init, jnp.arange(m))
  ok = edit.ok & jnp.all(oks)
  # A replacement must produce exactly the tensor it replaces.
  for q in range(edit.red_old.shape[0]):
    old = jnp.clip(edit.red_old[q], 0, n - 1)
    active = edit.red_old[q] < n
    is_new = edit.red_kind[q] == NEW
    ref_e = jnp.clip(edit.red_ref[q], 0, n - 1)
    ref_n = jnp.clip(edit.red_ref[q], 0, m - 1)
    shape = jnp.where(is_new, shapes[ref_n], nodes["shape"][ref_e])
    rank = jnp.where(is_new, ranks[ref_n], nodes["rank"][ref_e])
    dtype = jnp.where(is_new, dtypes[ref_n], nodes["dtype"][ref_e])
    same = (jnp.all(shape == nodes["shape"][old]) & (rank == nodes["rank"][old])
            & (dtype == nodes["dtype"][old]))
    ok = ok & (~active | same)
  return edit.replace(new_shape=shapes, new_rank=ranks, new_dtype=dtypes, new_const=const, ok=ok)


def neutralize(edit: Edit, keep: jax.Array, num_slots: int) -> Edit:
  """The edit where `keep`, else an empty edit (adds, redirects and frees nothing).

  Refused edits are emptied before the kernel runs, so its loops never see a nonsensical
  graph (a forced invalid action costs as little as a no-op).
  """
  keep = keep & edit.ok
  return edit.replace(new_valid=edit.new_valid & keep,
                      red_old=jnp.where(keep, edit.red_old, num_slots),
                      free=jnp.where(keep, edit.free, num_slots), ok=keep)


def _free_unused(nodes: dict, table: jax.Array) -> tuple[dict, jax.Array]:
  """Frees alive nodes nobody reads that are neither outputs nor graph inputs, to a fixed point."""
  n = table.shape[0]

  def counts(alive, table):
    used = (table >= 0) & alive[:, None]
    return jax.ops.segment_sum(used.reshape(-1).astype(jnp.int32),
                               jnp.where(used, table, n).reshape(-1), num_segments=n)

  def removable(alive, table):
    return alive & (counts(alive, table) == 0) & ~nodes["is_output"] & (nodes["input_index"] < 0)

  def body(state):
    alive, table, _ = state
    dead = removable(alive, table)
    alive = alive & ~dead
    table = jnp.where(dead[:, None], -1, table)
    return alive, table, jnp.any(removable(alive, table))

  alive, table, _ = jax.lax.while_loop(
      lambda s: s[2], body,
      (nodes["alive"], table, jnp.any(removable(nodes["alive"], table))))
  return {**nodes, "alive": alive}, table


def _propagate_constness(nodes: dict, table: jax.Array) -> dict:
  """Recomputes is_constant to a fixed point: a Constant, or an op whose inputs are all constant.

  A rewrite that replaces a tensor by an existing constant one (slice of a concat of weights,
  say) makes its consumers constant too; usually this loop runs once and changes nothing.
  """
  has_inputs = (table >= 0).any(-1)
  source_const = nodes["op"] == int(Op.CONSTANT)

  def compute(const):
    inputs_const = jnp.all((table < 0) | const[jnp.maximum(table, 0)], axis=-1)
    return nodes["alive"] & (source_const | (has_inputs & inputs_const))

  def body(state):
    const, _ = state
    new = compute(const)
    return new, jnp.any(new != const)

  first = compute(nodes["is_constant"])
  const, _ = jax.lax.while_loop(lambda s: s[1], body,
                                (first, jnp.any(first != nodes["is_constant"])))
  return {**nodes, "is_constant": const}


def _relax_levels(nodes: dict, table: jax.Array) -> tuple[dict, jax.Array]:
  """Raises levels until every edge goes upward (new nodes start at 0; usually a few rounds).

  Returns (nodes, converged). A cyclic graph never converges: the loop stops after N rounds and
  reports it (only a refused edit can produce one; its result is discarded).
  """
  n = table.shape[0]

  def compute(level):
    above = jnp.where(table >= 0, level[jnp.maximum(table, 0)] + 1, 0).max(-1)
    return jnp.where(nodes["alive"], jnp.maximum(level, above), 0)

  def body(state):
    level, _, rounds = state
    new = compute(level)
    return new, jnp.any(new != level), rounds + 1

  first = compute(nodes["level"])
  level, changing, _ = jax.lax.while_loop(
      lambda s: s[1] & (s[2] < n), body, (first, jnp.any(first != nodes["level"]), 0))
  return {**nodes, "level": level}, ~changing


def apply_edit(graph: layout.Graph, edit: Edit) -> tuple[layout.Graph, jax.Array]:
  """Applies `edit`; returns (new graph, applied). When not applicable the graph is unchanged.

  Steps: claim the lowest free slots for the new nodes, write their features and inputs,
  redirect consumers (and output roles) of replaced nodes, free the listed nodes, then free
  whatever no longer reaches anything (a cascade, usually zero or one round).
  """
  n = graph.nodes["op"].shape[-1]
  m = edit.new_valid.shape[0]
  nodes = dict(graph.nodes)
  table = layout.input_table(graph)  # [N, K]

  slots, _ = transforms.allocate_slots(graph, m)
  rank_in_new = jnp.cumsum(edit.new_valid.astype(jnp.int32)) - 1
  slot = jnp.where(edit.new_valid, slots[jnp.clip(rank_in_new, 0, m - 1)], n)  # [M]
  enough = jnp.all(~edit.new_valid | (slot < n))
  edit = neutralize(edit, enough, n)
  slot = jnp.where(edit.new_valid, slot, n)
  ok = edit.ok

  def put(field, values):
    nodes[field] = nodes[field].at[slot].set(values.astype(nodes[field].dtype), mode="drop")

  put("op", edit.new_op)
  put("attrs", edit.new_attrs)
  put("shape", edit.new_shape)
  put("rank", edit.new_rank)
  put("dtype", edit.new_dtype)
  put("is_constant", edit.new_const)
  put("alive", jnp.ones([m], bool))
  put("is_output", jnp.zeros([m], bool))
  put("output_index", jnp.full([m], -1))
  put("input_index", jnp.full([m], -1))
  put("param_id", jnp.full([m], -1))
  put("level", jnp.zeros([m], jnp.int32))
  new_inputs = jnp.where(edit.in_kind == EXISTING, edit.in_ref,
                         jnp.where(edit.in_kind == NEW, slot[jnp.clip(edit.in_ref, 0, m - 1)], -1))
  table = table.at[slot].set(new_inputs, mode="drop")

  target = jnp.where(edit.red_kind == EXISTING, edit.red_ref,
                     slot[jnp.clip(edit.red_ref, 0, m - 1)])  # [Q]
  for q in range(edit.red_old.shape[0]):
    old, new = edit.red_old[q], target[q]
    active = old < n
    table = jnp.where(active & (table == old), new, table)
    was_output = active & nodes["is_output"][jnp.clip(old, 0, n - 1)]
    out_index = nodes["output_index"][jnp.clip(old, 0, n - 1)]
    dest = jnp.where(was_output, new, n)
    nodes["is_output"] = nodes["is_output"].at[dest].set(True, mode="drop")
    nodes["output_index"] = nodes["output_index"].at[dest].set(out_index, mode="drop")
    src = jnp.where(was_output, old, n)
    nodes["is_output"] = nodes["is_output"].at[src].set(False, mode="drop")
    nodes["output_index"] = nodes["output_index"].at[src].set(-1, mode="drop")

  nodes["alive"] = nodes["alive"].at[edit.free].set(False, mode="drop")
  table = table.at[edit.free].set(-1, mode="drop")
  nodes, table = _free_unused(nodes, table)
  nodes = _propagate_constness(nodes, table)
  nodes, acyclic = _relax_levels(nodes, table)
  ok = ok & acyclic

  valid = table >= 0
  new_graph = graph._replace(nodes=nodes, edges={**graph.edges, "valid": valid.reshape(-1)},
                             senders=jnp.where(valid, table, n).reshape(-1).astype(jnp.int32))
  out = jax.tree_util.tree_map(lambda a, b: jnp.where(ok, a, b), new_graph, graph)
  return out, ok
