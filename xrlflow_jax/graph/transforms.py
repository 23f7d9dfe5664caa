"""Jittable graph helpers: consumer counts, free-slot allocation, dead-code removal, compaction.

All are pure functions of the padded arrays with static shapes, so they run under `jit` and
`vmap` (over a batch of graphs of one capacity) without retracing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xrlflow_jax.graph import layout


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
  new_to_old = jnp.argsort(~alive, stable=True).astype(jnp.int32)
  old_to_new = jnp.zeros([n], jnp.int32).at[new_to_old].set(jnp.arange(n, dtype=jnp.int32))
  nodes = {k: v[new_to_old] for k, v in graph.nodes.items()}
  table = layout.input_table(graph)[new_to_old]  # [N, K] old ids
  table = jnp.where(table >= 0, old_to_new[jnp.maximum(table, 0)], -1)
  valid = table >= 0
  senders = jnp.where(valid, table, n).reshape(-1)
  return graph._replace(nodes=nodes, edges={**graph.edges, "valid": valid.reshape(-1)},
                        senders=senders), new_to_old
