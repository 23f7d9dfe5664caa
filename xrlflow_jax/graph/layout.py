"""The padded graph: a `jraph.GraphsTuple` of fixed capacity.

Layout (N node slots, K input slots per node, E = N*K edge slots, R = ops.MAX_RANK,
A = ops.ATTR_WIDTH):

  nodes["op"]            int32[N]     op code (`ops.Op`)
  nodes["attrs"]         int32[N, A]  attribute vector (`OpSpec.encode_attrs`)
  nodes["shape"]         int32[N, R]  output shape, right-aligned, padded with ones
  nodes["rank"]          int32[N]     output rank
  nodes["dtype"]         int32[N]     output dtype (`ops.DType`)
  nodes["is_constant"]   bool[N]      a weight, or computed from weights only
  nodes["is_output"]     bool[N]      a graph output
  nodes["output_index"]  int32[N]     position among the graph outputs, -1 if none
  nodes["input_index"]   int32[N]     position among the graph inputs (Input ops), -1 if none
  nodes["param_id"]      int32[N]     key of a Constant's value in the ParamStore, -1 if none
  nodes["alive"]         bool[N]      the slot holds a node; dead slots are free
  nodes["level"]         int32[N]     a topological potential: level[u] < level[v] on every edge
                                      u -> v (kept by rewrites; proves "a does not depend on b");
                                      built graphs space it by LEVEL_GAP, so the nodes a rewrite
                                      adds (one above their inputs) fit below their consumers
                                      instead of pushing every node downstream up
  edges["valid"]         bool[E]      edge slot holds an input
  senders                int32[E]     producer slot; N for an unused edge slot
  receivers              int32[E]     always n for edge n*K + k (fixed)
  n_node = [N], n_edge = [E], globals = None

Edge slot n*K + k is input k of node n, so "the k-th input of node n" is `senders[n*K + k]`, and
inputs of a node occupy slots 0..num_inputs-1 with no gaps. Padding senders point one past the
last node so segment sums over senders drop them.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import jraph
import numpy as np

from xrlflow_jax.ops import ATTR_WIDTH, MAX_RANK

Graph = jraph.GraphsTuple

DEFAULT_CAPACITY = 1024  # fits BERT-base from ../shared/models with room for rewrites
DEFAULT_MAX_INPUTS = 5  # BatchNorm reads five tensors
# Levels of a built graph are multiples of this: room for chains of up to LEVEL_GAP - 1 new nodes
# between a node and its consumers before a rewrite must raise the levels downstream (a
# `while_loop` round per level raised, over every node, in `rules.edit.apply_edit`).
LEVEL_GAP = 64

NODE_FIELDS = ("op", "attrs", "shape", "rank", "dtype", "is_constant", "is_output",
               "output_index", "input_index", "param_id", "alive", "level")


def capacity(graph: Graph) -> int:
  """N: number of node slots."""
  return int(graph.nodes["op"].shape[-1])


def max_inputs(graph: Graph) -> int:
  """K: input slots per node."""
  return int(graph.senders.shape[-1]) // capacity(graph)


def empty_arrays(num_slots: int, k: int) -> dict[str, np.ndarray]:
  """Host arrays for an empty graph of capacity `num_slots` (all slots free)."""
  n = num_slots
  return {
      "op": np.zeros([n], np.int32),
      "attrs": np.zeros([n, ATTR_WIDTH], np.int32),
      "shape": np.ones([n, MAX_RANK], np.int32),
      "rank": np.zeros([n], np.int32),
      "dtype": np.zeros([n], np.int32),
      "is_constant": np.zeros([n], bool),
      "is_output": np.zeros([n], bool),
      "output_index": np.full([n], -1, np.int32),
      "input_index": np.full([n], -1, np.int32),
      "param_id": np.full([n], -1, np.int32),
      "alive": np.zeros([n], bool),
      "level": np.zeros([n], np.int32),
      "inputs": np.full([n, k], -1, np.int32),
  }


def from_arrays(arrays: dict[str, Any], *, as_numpy: bool = False) -> Graph:
  """Builds the GraphsTuple from node arrays and an `inputs` int32[N, K] table (-1 = none)."""
  xp = np if as_numpy else jnp
  inputs = xp.asarray(arrays["inputs"], dtype=xp.int32)
  n, k = inputs.shape
  valid = inputs >= 0
  senders = xp.where(valid, inputs, n).reshape(n * k).astype(xp.int32)
  receivers = xp.repeat(xp.arange(n, dtype=xp.int32), k)
  nodes = {f: xp.asarray(arrays[f]) for f in NODE_FIELDS}
  return jraph.GraphsTuple(
      nodes=nodes, edges={"valid": valid.reshape(n * k)}, senders=senders, receivers=receivers,
      globals=None, n_node=xp.asarray([n], xp.int32), n_edge=xp.asarray([n * k], xp.int32))


def input_table(graph: Graph) -> Any:
  """int32[N, K]: producer of each input slot, -1 where unused (works on jax and numpy)."""
  n = graph.nodes["op"].shape[-1]
  xp = np if isinstance(graph.senders, np.ndarray) else jnp
  table = xp.where(graph.edges["valid"], graph.senders, -1)
  return table.reshape(table.shape[:-1] + (n, -1))


def new_slots(parent: Graph, child: Graph, size: int) -> Any:
  """int32[size]: the slots alive in `child` but free in `parent` (the new nodes of one edit,
  which only claims free slots), in order, padded with N. jittable and vmappable."""
  n = parent.nodes["alive"].shape[-1]
  (slots,) = jnp.nonzero(child.nodes["alive"] & ~parent.nodes["alive"], size=size,
                         fill_value=n)
  return slots


def to_host(graph: Graph) -> Graph:
  """The same graph with every leaf a numpy array (for host-side helpers)."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree_util.tree_map(np.asarray, graph)


def num_inputs(graph: Graph) -> Any:
  """int32[N]: number of used input slots per node."""
  valid = graph.edges["valid"]
  n = graph.nodes["op"].shape[-1]
  return valid.reshape(valid.shape[:-1] + (n, -1)).sum(-1).astype(np.int32)
