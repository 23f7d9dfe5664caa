"""Property test: random small graphs built with GraphBuilder keep every graph invariant.

Hypothesis draws a sequence of ops (unary, broadcasting binary, matmul, reshape, transpose,
concat, slice, softmax, reduce, squeeze/unsqueeze, layer norm, batch norm, conv, pad, gather
with negative indices) over 1-3 inputs and some weights,
marks a few tensors as outputs, then appends dead nodes. For each graph:
  - `validate` passes, before and after adding dead nodes;
  - the executor's outputs have the stored output shapes and dtypes;
  - every alive node's stored shape equals `infer_shape_jit`'s, computed in one jitted, vmapped
    call over all slots with input shapes gathered through the edge table;
  - the structural hash, and the identity hash the search de-duplicates with, are invariant
    under a random permutation of slots and under `compact`, and change when a node changes;
  - `remove_dead_code` frees exactly the nodes no output depends on (graph inputs kept), gives
    the graph built without the dead nodes (same hash), and leaves the outputs unchanged.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xrlflow_jax import GraphBuilder, executor, ops
from xrlflow_jax.graph import Tensor, host, identity, layout, transforms

CAPACITY = 64
MAX_NUMEL = 256
MAX_RANK = 5  # leaves room for Unsqueeze within ops.MAX_RANK
MIN_OPS, MAX_OPS = 3, 10


# ------------------------------------------------------------------ random graph generator

class _Generator:
  """Adds random ops to a builder, drawing every choice from hypothesis."""

  def __init__(self, draw: Callable[..., Any], b: GraphBuilder):
    self.draw = draw
    self.b = b
    self.pool: list[Tensor] = []
    self.num_inputs = 0

  def shape(self, min_rank: int = 1, max_rank: int = 4) -> tuple[int, ...]:
    rank = self.draw(st.integers(min_rank, max_rank))
    return tuple(self.draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))

  def pick(self, pred: Callable[[Tensor], bool] = lambda t: True) -> Tensor | None:
    # Newest first: hypothesis favours early elements, so graphs tend to chain into deep DAGs.
    candidates = [t for t in reversed(self.pool) if pred(t)]
    return self.draw(st.sampled_from(candidates)) if candidates else None

  def new_operand(self, shape: tuple[int, ...]) -> Tensor:
    """A new graph input (while fewer than 3) or a new weight of `shape`."""
    if self.num_inputs < 3 and self.draw(st.booleans()):
      self.num_inputs += 1
      return self.b.input(shape)
    return self.b.weight(shape)

  def add_random_op(self) -> Tensor | None:
    kind = self.draw(st.sampled_from(sorted(_OPS)))
    out = _OPS[kind](self)
    if out is not None:
      self.pool.append(out)
    return out


def _numel(shape: tuple[int, ...]) -> int:
  return int(np.prod(shape, dtype=np.int64))


def _unary(g: _Generator) -> Tensor:
  x = g.pick()
  op = g.draw(st.sampled_from(["Relu", "Sigmoid", "Tanh", "Neg", "Gelu", "HardSwish", "Erf"]))
  return g.b.node(op, [x])


def _binary(g: _Generator) -> Tensor | None:
  x = g.pick()
  op = g.draw(st.sampled_from(["Add", "Sub", "Mul", "Max", "Min"]))

  def fits(t: Tensor) -> bool:
    try:
      out = np.broadcast_shapes(x.shape, t.shape)
    except ValueError:
      return False
    return _numel(out) <= MAX_NUMEL and len(out) <= MAX_RANK
  y = g.pick(fits) if g.draw(st.booleans()) else None
  if y is None:
    # A broadcastable partner: drop some leading dims, set some dims to 1.
    drop = g.draw(st.integers(0, x.rank))
    shape = tuple(1 if g.draw(st.booleans()) else d for d in x.shape[drop:])
    y = g.new_operand(shape)
  a, c = (x, y) if g.draw(st.booleans()) else (y, x)
  return g.b.node(op, [a, c])


def _matmul(g: _Generator) -> Tensor | None:
  x = g.pick(lambda t: 2 <= t.rank)
  if x is None:
    return None
  k, n = x.shape[-1], g.draw(st.integers(1, 4))
  batch = ()
  if x.rank >= 3 and g.draw(st.booleans()):
    batch = (g.draw(st.sampled_from([1, x.shape[-3]])),)
  if _numel(x.shape[:-1] + (n,)) > MAX_NUMEL:
    return None
  w = g.new_operand(batch + (k, n))
  act = g.draw(st.sampled_from(["none", "relu", "tanh", "gelu"]))
  return g.b.matmul(x, w, activation=act)


def _reshape(g: _Generator) -> Tensor:
  x = g.pick()
  total = _numel(x.shape)
  options = [(total,), (1,) + x.shape, (-1, x.shape[-1]) if x.rank else (1,)]
  if x.rank >= 2:
    options.append(x.shape[:-2] + (x.shape[-2] * x.shape[-1],))
  target = g.draw(st.sampled_from([o for o in options if len(o) <= MAX_RANK]))
  return g.b.reshape(x, target)


def _transpose(g: _Generator) -> Tensor | None:
  x = g.pick(lambda t: t.rank >= 2)
  if x is None:
    return None
  return g.b.transpose(x, g.draw(st.permutations(range(x.rank))))


def _concat(g: _Generator) -> Tensor | None:
  x = g.pick(lambda t: t.rank >= 1)
  if x is None:
    return None
  axis = g.draw(st.integers(0, x.rank - 1))
  parts = [x]
  for _ in range(g.draw(st.integers(1, 2))):
    def same_but_axis(t: Tensor) -> bool:
      return t.rank == x.rank and all(a == b for i, (a, b) in enumerate(zip(t.shape, x.shape))
                                      if i != axis)
    y = g.pick(same_but_axis) if g.draw(st.booleans()) else None
    if y is None:
      shape = list(x.shape)
      shape[axis] = g.draw(st.integers(1, 3))
      y = g.new_operand(tuple(shape))
    parts.append(y)
  order = g.draw(st.permutations(range(len(parts))))
  parts = [parts[i] for i in order]
  if _numel(x.shape) // x.shape[axis] * sum(p.shape[axis] for p in parts) > MAX_NUMEL:
    return None
  return g.b.concat(parts, axis=axis)


def _slice(g: _Generator) -> Tensor | None:
  x = g.pick(lambda t: t.rank >= 1)
  if x is None:
    return None
  axis = g.draw(st.integers(0, x.rank - 1))
  size = x.shape[axis]
  start = g.draw(st.integers(0, size - 1))
  end = g.draw(st.integers(start + 1, size))
  return g.b.slice(x, axis, start, end, g.draw(st.integers(1, 3)))


def _along_an_axis(g: _Generator, op: Any) -> Tensor | None:
  """`op(x, axis=a)` of a picked tensor of rank >= 1 along a drawn axis."""
  x = g.pick(lambda t: t.rank >= 1)
  if x is None:
    return None
  return op(x, axis=g.draw(st.integers(0, x.rank - 1)))


def _softmax(g: _Generator) -> Tensor | None:
  return _along_an_axis(g, g.b.softmax)


def _reduce(g: _Generator) -> Tensor | None:
  x = g.pick(lambda t: t.rank >= 1)
  if x is None:
    return None
  axes = g.draw(st.lists(st.integers(0, x.rank - 1), min_size=1, max_size=x.rank, unique=True))
  keep = g.draw(st.booleans())
  fn = g.b.reduce_mean if g.draw(st.booleans()) else g.b.reduce_sum
  return fn(x, axes, keepdims=keep)


def _squeeze_unsqueeze(g: _Generator) -> Tensor | None:
  x = g.pick()
  ones = [i for i, d in enumerate(x.shape) if d == 1]
  if ones and g.draw(st.booleans()):
    axes = g.draw(st.lists(st.sampled_from(ones), min_size=1, max_size=len(ones), unique=True))
    return g.b.squeeze(x, axes)
  if x.rank >= MAX_RANK:
    return None
  return g.b.unsqueeze(x, [g.draw(st.integers(0, x.rank))])


def _layer_norm(g: _Generator) -> Tensor | None:
  return _along_an_axis(g, g.b.layer_norm)


def _batch_norm(g: _Generator) -> Tensor | None:
  x = g.pick(lambda t: t.rank >= 2)
  return None if x is None else g.b.batch_norm(x)


def _conv2d(g: _Generator) -> Tensor | None:
  x = g.pick(lambda t: t.rank == 4)
  if x is None:
    return None
  c = x.shape[1]
  groups = g.draw(st.sampled_from([1, c]))
  o = groups * g.draw(st.integers(1, 2))
  kh, kw = g.draw(st.integers(1, 3)), g.draw(st.integers(1, 3))
  w = g.b.weight((o, c // groups, kh, kw))
  bias = g.b.weight((o,), init="bias") if g.draw(st.booleans()) else None
  return g.b.conv2d(x, w, bias, padding="SAME", strides=(g.draw(st.integers(1, 2)),) * 2,
                    groups=groups, activation=g.draw(st.sampled_from(["none", "relu"])))


def _pad(g: _Generator) -> Tensor | None:
  x = g.pick(lambda t: 1 <= t.rank)
  mode = g.draw(st.sampled_from(["constant", "reflect", "edge"]))
  limit = (lambda d: min(d - 1, 2)) if mode == "reflect" else (lambda d: 2)
  pads = [(g.draw(st.integers(0, limit(d))), g.draw(st.integers(0, limit(d)))) for d in x.shape]
  if _numel(tuple(d + b + e for d, (b, e) in zip(x.shape, pads))) > MAX_NUMEL:
    return None
  return g.b.pad(x, pads, mode=mode, value=0.5)


def _gather(g: _Generator) -> Tensor | None:
  x = g.pick(lambda t: 1 <= t.rank <= 3)
  if x is None:
    return None
  axis = g.draw(st.integers(0, x.rank - 1))
  size = x.shape[axis]
  idx_shape = g.shape(0, 2)
  values = g.draw(st.lists(st.integers(-size, size - 1), min_size=_numel(idx_shape),
                           max_size=_numel(idx_shape)))
  idx = g.b.constant(np.asarray(values, np.int32).reshape(idx_shape))
  return g.b.gather(x, idx, axis=axis)


_OPS: dict[str, Callable[[_Generator], Tensor | None]] = {
    "batch_norm": _batch_norm, "conv2d": _conv2d, "pad": _pad, "gather": _gather,
    "unary": _unary, "binary": _binary, "matmul": _matmul, "reshape": _reshape,
    "transpose": _transpose, "concat": _concat, "slice": _slice, "softmax": _softmax,
    "reduce": _reduce, "squeeze_unsqueeze": _squeeze_unsqueeze, "layer_norm": _layer_norm,
}


@st.composite
def random_graphs(draw: Callable[..., Any]) -> dict[str, Any]:
  """A random graph, the same graph with dead nodes appended, their params and a slot order.

  Returns a dict: clean, dirty (graphs of CAPACITY slots), params, perm (a permutation of the
  slots), num_dead (nodes appended after the outputs were chosen).
  """
  b = GraphBuilder(seed=draw(st.integers(0, 2**16)), name="random")
  g = _Generator(draw, b)
  for _ in range(draw(st.integers(1, 3))):
    g.pool.append(b.input(g.shape()))
    g.num_inputs += 1
  for _ in range(draw(st.integers(0, 2))):
    g.pool.append(b.weight(g.shape()))
  last = None
  for _ in range(draw(st.integers(MIN_OPS, MAX_OPS))):
    if len(b) < CAPACITY - 12:  # an op adds at most 5 nodes; room for the dead ones below
      last = g.add_random_op() or last
  if last is None:
    last = b.relu(g.pool[0])
  outputs = [last] + draw(st.lists(st.sampled_from(g.pool), max_size=2))
  seen: set[int] = set()
  b.output(*[t for t in outputs if not (t.index in seen or seen.add(t.index))])
  clean, params = b.build(CAPACITY)
  num_clean = len(b)
  g.num_inputs = 3  # dead nodes may add weights but no graph inputs (those are never dead)
  for _ in range(draw(st.integers(1, 3))):
    if len(b) < CAPACITY - 5:
      g.add_random_op()
  dirty, params = b.build(CAPACITY)
  perm = np.asarray(draw(st.permutations(range(CAPACITY))), np.int32)
  return {"clean": clean, "dirty": dirty, "params": params, "perm": perm,
          "num_dead": len(b) - num_clean}


# ------------------------------------------------------------------ helpers under test use

@jax.jit
def _identity_hash_jit(graph: layout.Graph) -> jax.Array:
  return identity.graph_hash(graph, identity.identities(graph))


def _identity_hash(graph: layout.Graph) -> int:
  return identity.as_ints(np.asarray(_identity_hash_jit(graph))[None])[0]


def permute_slots(graph: layout.Graph, new_to_old: np.ndarray) -> layout.Graph:
  """The same graph with node `new_to_old[s]` moved to slot `s` (edges renumbered)."""
  g = layout.to_host(graph)
  n, k = layout.capacity(g), layout.max_inputs(g)
  old_to_new = np.empty(n, np.int32)
  old_to_new[new_to_old] = np.arange(n, dtype=np.int32)
  arrays = layout.empty_arrays(n, k)
  for field in layout.NODE_FIELDS:
    arrays[field] = np.asarray(g.nodes[field])[new_to_old]
  table = layout.input_table(g)[new_to_old]
  arrays["inputs"] = np.where(table >= 0, old_to_new[np.maximum(table, 0)], -1)
  return layout.from_arrays(arrays)


@jax.jit
def rule_shapes(graph: layout.Graph) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`infer_shape_jit` for every slot at once: (shape int32[N, R], rank int32[N], ok bool[N]).

  Input shapes are gathered through the edge table; unused input rows are ones with rank 0.
  """
  table = layout.input_table(graph)  # [N, K]
  used = table >= 0
  src = jnp.maximum(table, 0)
  in_shapes = jnp.where(used[..., None], graph.nodes["shape"][src], 1)
  in_ranks = jnp.where(used, graph.nodes["rank"][src], 0)
  n_inputs = used.sum(-1).astype(jnp.int32)
  return jax.vmap(ops.infer_shape_jit)(graph.nodes["op"], in_shapes, in_ranks,
                                       graph.nodes["attrs"], n_inputs, graph.nodes["shape"],
                                       graph.nodes["rank"])


_compact = jax.jit(transforms.compact)
_remove_dead_code = jax.jit(transforms.remove_dead_code)


def needed_nodes(graph: layout.Graph) -> np.ndarray:
  """bool[N]: alive nodes some output depends on, plus graph inputs (host DFS)."""
  g = layout.to_host(graph)
  table = layout.input_table(g)
  need = g.nodes["alive"] & (g.nodes["is_output"] | (g.nodes["input_index"] >= 0))
  stack = [int(v) for v in np.flatnonzero(need)]
  while stack:
    for u in table[stack.pop()]:
      if u >= 0 and not need[u]:
        need[u] = True
        stack.append(int(u))
  return need


def stored_outputs(graph: layout.Graph) -> list[tuple[tuple[int, ...], np.dtype]]:
  """(shape, dtype) of each graph output in output order, as the node arrays store them."""
  g = layout.to_host(graph)
  nd = g.nodes
  outs = sorted((int(nd["output_index"][v]), int(v))
                for v in np.flatnonzero(nd["alive"] & nd["is_output"]))
  return [(ops.unpad_shape(nd["shape"][v], nd["rank"][v]),
           np.dtype(jnp.dtype(ops.numpy_dtype(int(nd["dtype"][v]))))) for _, v in outs]


def run(graph: layout.Graph, params: Any, inputs: list[np.ndarray]) -> list[np.ndarray]:
  """Lowers `graph` (jitted) and returns its outputs for `inputs` as numpy arrays."""
  return [np.asarray(y) for y in executor.lower(graph, params)(*inputs)]


# ------------------------------------------------------------------ the property

@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs())
def test_random_graph_invariants(sample: dict[str, Any]):
  clean, dirty, params = sample["clean"], sample["dirty"], sample["params"]
  host.validate(clean, params)
  host.validate(dirty, params)

  # Executor outputs have the stored output shapes and dtypes.
  lowered = executor.lower(dirty, params)
  inputs = lowered.random_inputs(seed=0)
  outs = [np.asarray(y) for y in lowered(*inputs)]
  want = stored_outputs(dirty)
  assert [(o.shape, o.dtype) for o in outs] == want

  # Every alive node's stored shape is what the jitted rule computes from its inputs' shapes.
  shapes, ranks, oks = (np.asarray(v) for v in rule_shapes(dirty))
  nd = layout.to_host(dirty).nodes
  alive = np.flatnonzero(nd["alive"])
  assert oks[alive].all(), [host.dump(dirty), np.flatnonzero(~oks & nd["alive"])]
  np.testing.assert_array_equal(ranks[alive], nd["rank"][alive])
  np.testing.assert_array_equal(shapes[alive], nd["shape"][alive])

  # The structural hash ignores slot placement, and sees a changed node.
  digest = host.structural_hash(dirty)
  permuted = permute_slots(dirty, sample["perm"])
  host.validate(permuted, params)
  assert host.structural_hash(permuted) == digest
  compacted, new_to_old = _compact(permuted)
  compacted = layout.to_host(compacted)
  m = len(alive)
  assert compacted.nodes["alive"][:m].all() and not compacted.nodes["alive"][m:].any()
  kept = np.asarray(new_to_old)[:m]
  assert np.all(np.diff(kept) > 0), "compact must keep the relative order of alive nodes"
  host.validate(compacted, params)
  assert host.structural_hash(compacted) == digest
  changed = jax.tree_util.tree_map(np.array, dirty)  # writable host copy
  v = int(alive[-1])
  changed.nodes["dtype"][v] = (changed.nodes["dtype"][v] + 1) % len(ops.DType)
  assert host.structural_hash(changed) != digest

  # The identity hash (search de-duplication) agrees: blind to slots, sees the changed node.
  id_digest = _identity_hash(dirty)
  assert _identity_hash(permuted) == id_digest
  assert _identity_hash(compacted) == id_digest
  assert _identity_hash(changed) != id_digest

  # Dead-code removal keeps exactly what the outputs need and changes no output.
  pruned = layout.to_host(_remove_dead_code(dirty))
  host.validate(pruned, params)
  np.testing.assert_array_equal(pruned.nodes["alive"], needed_nodes(dirty))
  pruned_clean = _remove_dead_code(clean)
  assert host.structural_hash(pruned) == host.structural_hash(pruned_clean)
  assert host.num_nodes(pruned) <= host.num_nodes(dirty) - sample["num_dead"]
  for got, ref in zip(run(pruned, params, inputs), outs):
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
  for got, ref in zip(run(compacted, params, inputs), outs):
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
