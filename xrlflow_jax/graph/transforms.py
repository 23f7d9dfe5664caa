"""Jittable graph helpers: consumer counts, free-slot allocation, dead-code removal, compaction.

All are pure functions of the padded arrays with static shapes, so they run under `jit` and
`vmap` (over a batch of graphs of one capacity) without retracing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xrlflow_jax.graph import layout


def stable_sort_by_key(keys: jax.Array, num_keys: int) -> tuple[jax.Array, jax.Array]:
  """A stable sort of integer keys in [0, num_keys) along the last axis: (order int32[..., N],
  sorted keys int32[..., N]), as `jnp.argsort(keys, stable=True)` and the keys in that order.

  Each key and its position are packed into one int32 (key * N + position) and sorted as one
  operand: XLA:CPU sorts one operand several times faster than the two an argsort carries
  (64 rows of 1024 keys: 2.5 vs 16.9 ms, 2-core x86_64, 2026-12-04). When key * N + position
  can exceed int32 (num_keys * N >= 2^31) it is an argsort.
  """
  n = keys.shape[-1]
  if num_keys * n >= 2 ** 31:
    order = jnp.argsort(keys, axis=-1, stable=True).astype(jnp.int32)
    return order, jnp.take_along_axis(keys.astype(jnp.int32), order, axis=-1)
  packed = jnp.sort(keys.astype(jnp.int32) * n + jnp.arange(n, dtype=jnp.int32), axis=-1)
  return packed % n, packed // n


def consumer_counts(graph: layout.Graph) -> jax.Array:
  """int32[N]: number of input slots of alive nodes that read each node's output.

  A node used twice by one consumer (x * x) counts twice. Padding edges (sender N) are dropped.
  """
  n = graph.nodes["op"].shape[-1]
  used = graph.edges["valid"] & graph.nodes["alive"][graph.receivers]
  return jax.ops.segment_sum(used.astype(jnp.int32), graph.senders, num_segments=n)


def allocate_slots(graph: layout.Graph, count: int) -> tuple[jax.Array, jax.Array]:
  """The `count` lowest free slots.

  Returns:
    slots: int32[count], N where there are not enough free slots.
    ok: bool[], True when all `count` slots exist.
  """
  n = graph.nodes["op"].shape[-1]
  (slots,) = jnp.nonzero(~graph.nodes["alive"], size=count, fill_value=n)
  slots = slots.astype(jnp.int32)
  return slots, slots[-1] < n if count else jnp.asarray(True)


def live_nodes(graph: layout.Graph) -> jax.Array:
  """bool[N]: alive nodes from which a graph output is reachable, plus every graph input.

  Backward reachability by repeated edge relaxation (a `while_loop`, at most depth steps).
  """
  n = graph.nodes["op"].shape[-1]
  alive = graph.nodes["alive"]
  seed = alive & (graph.nodes["is_output"] | (graph.nodes["input_index"] >= 0))

  def step(state):
    live, _ = state
    reach = graph.edges["valid"] & live[graph.receivers]
    hit = jax.ops.segment_max(reach.astype(jnp.int32), graph.senders, num_segments=n) > 0
    new = (live | hit) & alive
    return new, jnp.any(new != live)

  live, _ = jax.lax.while_loop(lambda s: s[1], step, (seed, jnp.asarray(True)))
  return live


def remove_dead_code(graph: layout.Graph) -> layout.Graph:
  """Frees every node whose output reaches no graph output (graph inputs are kept).

  Freed slots get alive=False and their input slots cleared, so they are free for reuse.
  """
  n = graph.nodes["op"].shape[-1]
  live = live_nodes(graph)
  keep_edge = graph.edges["valid"] & live[graph.receivers]
  nodes = dict(graph.nodes)
  nodes["alive"] = live
  return graph._replace(nodes=nodes, edges={**graph.edges, "valid": keep_edge},
                        senders=jnp.where(keep_edge, graph.senders, n))


def compact(graph: layout.Graph) -> tuple[layout.Graph, jax.Array]:
  """Moves alive nodes to the lowest slots, keeping their relative order.

  Returns:
    graph: the compacted graph (same capacity).
    new_to_old: int32[N], the old slot of each new slot (dead slots map to old dead slots).
  """
  n = graph.nodes["op"].shape[-1]
  alive = graph.nodes["alive"]
  new_to_old, _ = stable_sort_by_key((~alive).astype(jnp.int32), 2)
  old_to_new = jnp.zeros([n], jnp.int32).at[new_to_old].set(jnp.arange(n, dtype=jnp.int32))
  nodes = {k: v[new_to_old] for k, v in graph.nodes.items()}
  table = layout.input_table(graph)[new_to_old]  # [N, K] old ids
  table = jnp.where(table >= 0, old_to_new[jnp.maximum(table, 0)], -1)
  valid = table >= 0
  senders = jnp.where(valid, table, n).reshape(-1)
  return graph._replace(nodes=nodes, edges={**graph.edges, "valid": valid.reshape(-1)},
                        senders=senders), new_to_old
