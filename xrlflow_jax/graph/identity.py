"""Node identities and graph hashes for search de-duplication, computed inside `jit`.

A search must recognise a graph it has already met. `host.structural_hash` is exact (a Merkle
hash over the whole DAG) but costs a Python walk of every node, 1-5 ms a graph: more than costing
all the graph's candidates. Here, as in TASO's op cache, every node carries an identity:

  * the nodes of the search's input graph get their Merkle hash (`identities`: a node's
    signature and its inputs' identities, iterated to a fixed point over the DAG);
  * a node created by a rewrite gets the same function of its signature and its inputs'
    identities at creation (`child_identities`), so re-creating a node that existed (commuting
    an Add twice) gives back its old identity;
  * a node whose inputs a rewrite redirects keeps its identity (the identity names the node,
    not its current inputs; its edges carry the change).

The graph hash (`graph_hash`) is a sum over alive nodes of a hash of (identity, output index,
the identities of its inputs in order): independent of slot placement and of the order in which
independent rewrites were applied. Two lanes of 32 bits: distinct graphs collide with
probability about (graphs seen)^2 / 2^64. Unlike the structural hash, two equal DAGs reached by
derivations in which one node was re-created in one and kept (with redirected inputs) in the
other hash differently; the search then expands that graph twice (never skips a new one).

Identities are uint32[N, 2] arrays (two independent lanes).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from xrlflow_jax.graph import layout

LANES = 2
_SEEDS = (0x811C9DC5, 0x2545F491)
_EMPTY = (0x5BD1E995, 0x27D4EB2F)  # the identity read for an unused input slot


def _mix(h: jax.Array, x: jax.Array) -> jax.Array:
  """Combines a uint32 word into a uint32 hash (multiply-xorshift; wraps)."""
  h = (h ^ x.astype(jnp.uint32)) * jnp.uint32(0x01000193)
  return h ^ (h >> jnp.uint32(15))


def _finish(h: jax.Array) -> jax.Array:
  """The murmur3 finaliser: full avalanche of a uint32."""
  h = h ^ (h >> jnp.uint32(16))
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> jnp.uint32(13))
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> jnp.uint32(16))


def signatures(graph: layout.Graph, rows: jax.Array | None = None) -> jax.Array:
  """uint32[N, 2]: a hash of what a node is, apart from its inputs and its slot (op, attributes,
  shape, rank, dtype, input index, parameter id); the output role is hashed per edge row.
  With `rows` (int32[M], in range), only those slots': uint32[M, 2]."""
  nd = graph.nodes
  if rows is not None:
    nd = {f: nd[f][rows] for f in ("op", "rank", "dtype", "input_index", "param_id", "attrs",
                                   "shape")}
  words = ([nd["op"], nd["rank"], nd["dtype"], nd["input_index"], nd["param_id"]]
           + [nd["attrs"][:, a] for a in range(nd["attrs"].shape[-1])]
           + [nd["shape"][:, r] for r in range(nd["shape"].shape[-1])])
  lanes = []
  for seed in _SEEDS:
    h = jnp.full(nd["op"].shape, seed, jnp.uint32)
    for w in words:
      h = _mix(h, w)
    lanes.append(_finish(h))
  return jnp.stack(lanes, -1)


def _combine(sig: jax.Array, ids: jax.Array, table: jax.Array) -> jax.Array:
  """uint32[N, 2]: each node's signature combined with its inputs' identities in order."""
  empty = jnp.asarray(_EMPTY, jnp.uint32)
  h = sig
  for k in range(table.shape[-1]):
    read = jnp.where((table[:, k] >= 0)[:, None], ids[jnp.maximum(table[:, k], 0)], empty)
    h = _mix(h, read)
  return _finish(h)


def identities(graph: layout.Graph) -> jax.Array:
  """uint32[N, 2]: the Merkle identity of every alive node (0 for dead slots). A fixed point
  over the DAG (a `while_loop` of at most depth + 1 rounds); for a search's input graph."""
  table = layout.input_table(graph)
  alive = graph.nodes["alive"][:, None]
  sig = signatures(graph)

  def body(state):
    ids, _ = state
    new = jnp.where(alive, _combine(sig, ids, table), jnp.uint32(0))
    return new, jnp.any(new != ids)

  init = jnp.where(alive, sig, jnp.uint32(0))
  ids, _ = jax.lax.while_loop(lambda s: s[1], body, (init, jnp.asarray(True)))
  return ids


def child_identities(parent: layout.Graph, parent_ids: jax.Array, child: layout.Graph,
                     max_new: int) -> jax.Array:
  """uint32[N, 2]: identities of `child`, a graph one rewrite (at most `max_new` new nodes)
  away from `parent`: kept nodes keep theirs, new nodes (alive in the child, free in the
  parent: an edit only claims free slots) get their Merkle identity at creation. Works on the
  new slots only (O(max_new), not O(N)): a search calls it on every candidate."""
  n = child.nodes["alive"].shape[0]
  # Only the (at most max_new) new slots change: compute on those rows alone, not on all N.
  rows = layout.new_slots(parent, child, max_new)
  safe = jnp.minimum(rows, n - 1)
  sig = signatures(child, safe)  # [M, 2]
  table = layout.input_table(child)[safe]  # [M, K]
  ids = jnp.where(child.nodes["alive"][:, None], parent_ids, jnp.uint32(0))
  for _ in range(max_new):  # new nodes may read each other: a chain is at most max_new long
    ids = ids.at[rows].set(_combine(sig, ids, table), mode="drop")  # fill rows (n): dropped
  return ids


# Rows a rewrite may change before `child_graph_hash` reports that the child needs
# `graph_hash` (a rewrite whose cascade frees many nodes).
MAX_CHANGED_ROWS = 64


def _rows(nd: dict, ids: jax.Array, table: jax.Array, rows: jax.Array | None = None
          ) -> jax.Array:
  """uint32[N, 2] (or [M, 2] for `rows`): each slot's term of the graph hash (0 if dead)."""
  own, alive, out_index = ids, nd["alive"], nd["output_index"]
  if rows is not None:
    own, alive, out_index, table = own[rows], alive[rows], out_index[rows], table[rows]
  h = _combine(_finish(own ^ out_index.astype(jnp.uint32)[:, None]), ids, table)
  return jnp.where(alive[:, None], h, jnp.uint32(0))


def row_hashes(graph: layout.Graph, ids: jax.Array) -> jax.Array:
  """uint32[N, 2]: every slot's term of `graph_hash` (their sum, wrapping, is the hash)."""
  return _rows(graph.nodes, ids, layout.input_table(graph))


def graph_hash(graph: layout.Graph, ids: jax.Array) -> jax.Array:
  """uint32[2]: the hash of a graph given its node identities (see the module docstring)."""
  return jnp.sum(row_hashes(graph, ids), axis=0, dtype=jnp.uint32)


def child_graph_hash(parent: layout.Graph, parent_rows: jax.Array, child: layout.Graph,
                     child_ids: jax.Array, max_rows: int | None = None
                     ) -> tuple[jax.Array, jax.Array]:
  """(uint32[2] `graph_hash(child, child_ids)`, bool[] exact) from the parent's `row_hashes`:
  only the slots whose term can differ (alive, inputs or output index changed; kept nodes keep
  their identities, `child_identities`) are hashed again, at most `max_rows` (default
  MAX_CHANGED_ROWS, read at trace time). Not exact when more changed: use `graph_hash`."""
  max_rows = MAX_CHANGED_ROWS if max_rows is None else max_rows
  p, c = parent.nodes, child.nodes
  n = c["alive"].shape[0]
  table = layout.input_table(child)
  changed = ((p["alive"] != c["alive"]) | (p["output_index"] != c["output_index"])
             | jnp.any(layout.input_table(parent) != table, axis=-1))
  (rows,) = jnp.nonzero(changed, size=max_rows, fill_value=n)
  safe = jnp.minimum(rows, n - 1)
  used = (rows < n)[:, None]
  old = jnp.where(used, parent_rows[safe], jnp.uint32(0))
  new = jnp.where(used, _rows(c, child_ids, table, safe), jnp.uint32(0))
  total = (jnp.sum(parent_rows, axis=0, dtype=jnp.uint32) + jnp.sum(new, axis=0, dtype=jnp.uint32)
           - jnp.sum(old, axis=0, dtype=jnp.uint32))
  return total, changed.sum() <= max_rows


def as_ints(hashes) -> list[int]:
  """Host ints of uint32[C, 2] hashes (for sets)."""
  h = np.asarray(hashes, np.uint64).reshape(-1, LANES)
  return [int(x) for x in (h[:, 1] << np.uint64(32)) | h[:, 0]]
