"""Host-side graph helpers: topological order, validation, structural hash and a text dump.

These run in numpy on a concrete graph (never inside `jit`).
"""

from __future__ import annotations

import hashlib
import heapq
from typing import Any

import numpy as np

from xrlflow_jax import ops
from xrlflow_jax.errors import (CycleError, DanglingInputError, GraphValidationError, ParamError,
                                ShapeError, UnknownOpError)
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.ops import MAX_RANK, DType, Op


def _host(graph: layout.Graph) -> layout.Graph:
  return layout.to_host(graph)


def _describe(g: layout.Graph, n: int) -> str:
  try:
    name = ops.get(int(g.nodes["op"][n])).name
  except UnknownOpError:
    name = f"op#{int(g.nodes['op'][n])}"
  return f"node {n} ({name})"


def topological_order(graph: layout.Graph) -> np.ndarray:
  """int32[num_alive]: alive slots, every node after its inputs (ties by slot index).

  Raises CycleError naming the nodes on cycles, DanglingInputError for an input that is dead.
  """
  g = _host(graph)
  alive = g.nodes["alive"]
  table = layout.input_table(g)
  n = alive.shape[0]
  indegree = np.zeros(n, np.int64)
  consumers: list[list[int]] = [[] for _ in range(n)]
  for v in np.flatnonzero(alive):
    for u in table[v]:
      if u < 0:
        continue
      if u >= n or not alive[u]:
        raise DanglingInputError(f"{_describe(g, v)} reads slot {int(u)}, which is not alive")
      indegree[v] += 1
      consumers[u].append(int(v))
  heap = [int(v) for v in np.flatnonzero(alive) if indegree[v] == 0]
  heapq.heapify(heap)
  order = []
  while heap:
    u = heapq.heappop(heap)
    order.append(u)
    for v in consumers[u]:
      indegree[v] -= 1
      if indegree[v] == 0:
        heapq.heappush(heap, v)
  if len(order) != int(alive.sum()):
    stuck = [int(v) for v in np.flatnonzero(alive & (indegree > 0))]
    shown = ", ".join(_describe(g, v) for v in stuck[:8])
    raise CycleError(f"the graph has a cycle through {len(stuck)} node(s): {shown}"
                     + (" ..." if len(stuck) > 8 else ""))
  return np.asarray(order, np.int32)


def validate(graph: layout.Graph, params: ParamStore | None = None) -> None:
  """Checks every invariant of the padded graph; raises on the first category of problems.

  Checks: op codes known; input slots contiguous, alive and within arity; dead slots empty;
  acyclic; every shape, rank and dtype equal to what the op's shape rule gives; is_constant
  consistent; inputs and outputs numbered 0..n-1 without gaps; at least one output, all alive;
  with `params`, every Constant has a value of its shape and dtype.

  Raises:
    DanglingInputError, CycleError, or GraphValidationError listing every problem found.
  """
  g = _host(graph)
  nd = g.nodes
  alive = nd["alive"]
  table = layout.input_table(g)
  n = alive.shape[0]
  problems: list[str] = []
  dangling: list[str] = []

  for v in np.flatnonzero(~alive):
    if (table[v] >= 0).any() or nd["is_output"][v] or nd["output_index"][v] >= 0:
      problems.append(f"dead slot {v} still has inputs or an output flag")
  for v in np.flatnonzero(alive):
    try:
      spec = ops.get(int(nd["op"][v]))
    except UnknownOpError as e:
      problems.append(f"node {v}: {e}")
      continue
    used = table[v] >= 0
    k = int(used.sum())
    if used.any() and not used[:k].all():
      problems.append(f"{_describe(g, v)}: input slots are not contiguous")
    if not spec.min_inputs <= k <= spec.max_inputs:
      problems.append(f"{_describe(g, v)}: has {k} inputs, needs {spec.min_inputs}.."
                      f"{spec.max_inputs}")
    for u in table[v][used]:
      if u >= n or not alive[u]:
        dangling.append(f"{_describe(g, v)} reads slot {int(u)}, which is not alive")
  if dangling:
    raise DanglingInputError("; ".join(dangling))
  if problems:
    raise GraphValidationError("invalid graph: " + "; ".join(problems))

  order = topological_order(g)  # raises CycleError

  for v in order:
    spec = ops.get(int(nd["op"][v]))
    inputs = [int(u) for u in table[v] if u >= 0]
    where = f"{_describe(g, v)}: "
    if spec.source:
      expect_const = spec.code == Op.CONSTANT
      if spec.code == Op.CONSTANT and nd["param_id"][v] < 0:
        problems.append(where + "Constant without a param_id")
      if spec.code == Op.INPUT and nd["input_index"][v] < 0:
        problems.append(where + "Input without an input_index")
    else:
      expect_const = all(nd["is_constant"][u] for u in inputs)
      k = max(len(inputs), 3)
      in_shapes = np.ones([k, MAX_RANK], np.int32)
      in_ranks = np.zeros([k], np.int32)
      for i, u in enumerate(inputs):
        in_shapes[i], in_ranks[i] = nd["shape"][u], nd["rank"][u]
      try:
        shape, rank = ops.infer_shape(spec.code, in_shapes, in_ranks, nd["attrs"][v], len(inputs),
                                      where=where)
        if rank != nd["rank"][v] or not np.array_equal(shape, nd["shape"][v]):
          problems.append(where + f"stored shape {ops.fmt_shape(nd['shape'][v], nd['rank'][v])} "
                          f"but the shape rule gives {ops.fmt_shape(shape, rank)}")
        dtype = ops.infer_dtype(spec.code, [int(nd["dtype"][u]) for u in inputs], nd["attrs"][v])
        if dtype != nd["dtype"][v]:
          problems.append(where + f"stored dtype {DType(int(nd['dtype'][v])).name} but inputs "
                          f"give {DType(dtype).name}")
      except ShapeError as e:
        problems.append(str(e))
      if nd["input_index"][v] >= 0 or nd["param_id"][v] >= 0:
        problems.append(where + "only Input/Constant nodes carry input_index/param_id")
    late = [u for u in inputs if nd["level"][u] >= nd["level"][v]]
    if late:
      problems.append(where + f"level {int(nd['level'][v])} is not above its inputs' levels "
                      f"{[int(nd['level'][u]) for u in late]}")
    if bool(nd["is_constant"][v]) != expect_const:
      problems.append(where + f"is_constant is {bool(nd['is_constant'][v])}, expected "
                      f"{expect_const}")
    if nd["is_output"][v] != (nd["output_index"][v] >= 0):
      problems.append(where + "is_output disagrees with output_index")
    if params is not None and spec.code == Op.CONSTANT and nd["param_id"][v] >= 0:
      try:
        value = params[int(nd["param_id"][v])]
        want = ops.unpad_shape(nd["shape"][v], nd["rank"][v])
        if tuple(value.shape) != want:
          problems.append(where + f"param {int(nd['param_id'][v])} has shape "
                          f"{list(value.shape)}, node says {list(want)}")
        elif ops.dtype_code(value.dtype) != nd["dtype"][v]:
          problems.append(where + f"param dtype {value.dtype} disagrees with the node")
      except (ParamError, UnknownOpError) as e:
        problems.append(where + str(e))

  for field, what in (("output_index", "outputs"), ("input_index", "inputs")):
    idx = np.sort(nd[field][alive & (nd[field] >= 0)])
    if not np.array_equal(idx, np.arange(idx.size)):
      problems.append(f"graph {what} are numbered {idx.tolist()}, expected 0..{idx.size - 1}")
  if not (alive & nd["is_output"]).any():
    problems.append("the graph has no alive output")
  if problems:
    raise GraphValidationError("invalid graph: " + "; ".join(problems))


def node_signature(g: layout.Graph, v: int) -> bytes:
  """The bytes of a node that are independent of where it sits: op, attrs, shape, dtype, roles."""
  nd = g.nodes
  rank = int(nd["rank"][v])
  parts = [int(nd["op"][v]), rank, int(nd["dtype"][v]), int(nd["output_index"][v]),
           int(nd["input_index"][v]), int(nd["param_id"][v])]
  return (np.asarray(parts, np.int64).tobytes() + np.asarray(nd["attrs"][v], np.int32).tobytes()
          + np.asarray(nd["shape"][v][MAX_RANK - rank:], np.int32).tobytes())


def constant_classes(graph: layout.Graph, order: Any = None) -> dict[int, int]:
  """{constant node: its representative}: constant nodes that compute the same value share one.

  Two Constant nodes are the same when they read the same parameter; two computed constant
  nodes when they have the same op and attributes on the same (representative) inputs, e.g.
  the concat of shared weights that a merge rewrite makes at every step of an unrolled RNN.
  Lowering and export evaluate each representative once, so a rewritten graph never holds
  (or reads at run time) several copies of one weight.

  Args:
    graph: a (host) graph; order: node ids in topological order (default: computed).
  Returns:
    A dict over the constant nodes of `order`; the representative is the first in `order`.
  """
  g = _host(graph)
  nd = g.nodes
  table = layout.input_table(g)
  order = topological_order(g) if order is None else order
  canon: dict[int, int] = {}
  seen: dict[tuple[Any, ...], int] = {}
  for v in order:
    v = int(v)
    if not nd["is_constant"][v]:
      continue
    if nd["op"][v] == int(Op.CONSTANT):
      key: tuple[Any, ...] = ("param", int(nd["param_id"][v]))
    else:
      key = (int(nd["op"][v]), np.asarray(nd["attrs"][v]).tobytes(),
             tuple(canon[int(u)] for u in table[v] if u >= 0))
    canon[v] = seen.setdefault(key, v)
  return canon


def structural_hash(graph: layout.Graph) -> str:
  """A hex digest equal for graphs that differ only in slot placement (and dead-slot contents).

  Each node's hash covers its signature and its inputs' hashes in input order (a Merkle hash
  over the DAG); the graph hash covers the sorted multiset of alive node hashes, so two graphs
  get the same digest exactly when they are the same DAG up to renumbering of slots.
  """
  return _digest(_host(graph), runtime=False)


def runtime_hash(graph: layout.Graph) -> str:
  """A hex digest of what a graph computes at run time: `structural_hash` over the nodes its
  outputs read, with every constant node (a weight, or a value computed from weights only)
  hashed by its shape and dtype alone.

  Lowering and export evaluate constants before the graph runs, so two graphs with this digest
  run the same ops on the same shapes: e.g. a rewritten graph whose merged weights are a Concat
  of two parameters, and its exported file, where that Concat is one folded initializer.
  """
  return _digest(_host(graph), runtime=True)


def _digest(g: layout.Graph, runtime: bool) -> str:
  """The Merkle digest of `structural_hash`, or with `runtime` of `runtime_hash`."""
  nd = g.nodes
  table = layout.input_table(g)
  live = None
  if runtime:  # what the outputs read: dead code does not run
    live, stack = set(), [int(v) for v in np.flatnonzero(nd["alive"] & nd["is_output"])]
    while stack:
      v = stack.pop()
      if v not in live:
        live.add(v)
        stack.extend(int(u) for u in table[v] if u >= 0)
  hashes: dict[int, bytes] = {}
  for v in topological_order(g):
    if live is not None and int(v) not in live:
      continue
    if runtime and nd["is_constant"][v]:
      rank = int(nd["rank"][v])
      h = hashlib.blake2b(b"constant" + np.asarray(
          [rank, int(nd["dtype"][v]), int(nd["output_index"][v])], np.int64).tobytes()
          + np.asarray(nd["shape"][v][MAX_RANK - rank:], np.int32).tobytes(), digest_size=16)
    else:
      h = hashlib.blake2b(node_signature(g, v), digest_size=16)
      for u in table[v]:
        if u >= 0:
          h.update(hashes[int(u)])
    hashes[int(v)] = h.digest()
  total = hashlib.blake2b(digest_size=16)
  for v, d in sorted(hashes.items(), key=lambda kv: kv[1]):
    if not (runtime and nd["is_constant"][v] and nd["output_index"][v] < 0):
      total.update(d)
  return total.hexdigest()


def attrs_text(spec: ops.OpSpec, vec: Any) -> str:
  """" {name=value, ...}" of a node's non-default attributes ("" when all are defaults)."""
  attrs = spec.decode_attrs(vec)
  if spec.code == Op.RESHAPE:
    attrs = {"shape": list(attrs["shape"][MAX_RANK - attrs["rank"]:])}
  elif spec.code == Op.TRANSPOSE:
    attrs = {"perm": attrs["perm"]}
  defaults = {f.name: f.default for f in spec.attrs}
  shown = {k: v for k, v in attrs.items() if v != defaults.get(k)}
  if not shown:
    return ""
  return " {" + ", ".join(f"{k}={v}" for k, v in shown.items()) + "}"


def dump(graph: layout.Graph, names: list[str] | None = None) -> str:
  """Readable text, one line per alive node in topological order, e.g.

      %12 = Conv2D(%0, %3) {strides=(2, 2), activation=1} : float32[1, 64, 112, 112]
  """
  g = _host(graph)
  nd = g.nodes
  table = layout.input_table(g)
  lines = [f"# graph: {int(nd['alive'].sum())} nodes alive of {nd['alive'].shape[0]} slots, "
           f"{layout.max_inputs(g)} input slots each"]
  for v in topological_order(g):
    spec = ops.get(int(nd["op"][v]))
    args = ", ".join(f"%{int(u)}" for u in table[v] if u >= 0)
    ty = f"{DType(int(nd['dtype'][v])).name.lower()}{ops.fmt_shape(nd['shape'][v], nd['rank'][v])}"
    extra = []
    if nd["input_index"][v] >= 0:
      extra.append(f"input {int(nd['input_index'][v])}")
    if nd["param_id"][v] >= 0:
      extra.append(f"param {int(nd['param_id'][v])}")
    if nd["is_output"][v]:
      extra.append(f"output {int(nd['output_index'][v])}")
    if nd["is_constant"][v] and not spec.source:
      extra.append("constant")
    if names is not None and v < len(names):
      extra.append(names[v])
    note = f"  # {', '.join(extra)}" if extra else ""
    lines.append(f"%{int(v)} = {spec.name}({args}){attrs_text(spec, nd['attrs'][v])} : {ty}{note}")
  return "\n".join(lines)


def op_histogram(graph: layout.Graph) -> dict[str, int]:
  """Counts of alive nodes per op name."""
  g = _host(graph)
  codes = g.nodes["op"][g.nodes["alive"]]
  out: dict[str, int] = {}
  for c in codes:
    name = ops.get(int(c)).name
    out[name] = out.get(name, 0) + 1
  return dict(sorted(out.items()))


def num_nodes(graph: layout.Graph) -> int:
  """Number of alive nodes."""
  return int(np.asarray(graph.nodes["alive"]).sum())


def permute_slots(graph: layout.Graph, new_to_old: np.ndarray) -> layout.Graph:
  """The same graph with its slots renumbered: new slot i holds old slot new_to_old[i].

  Useful to prove that nothing depends on slot placement (the structural hash, the executor).
  """
  g = _host(graph)
  n = layout.capacity(g)
  new_to_old = np.asarray(new_to_old, np.int64)
  if sorted(new_to_old.tolist()) != list(range(n)):
    raise ValueError(f"new_to_old must be a permutation of 0..{n - 1}")
  old_to_new = np.empty(n, np.int64)
  old_to_new[new_to_old] = np.arange(n)
  arrays = {f: np.asarray(g.nodes[f])[new_to_old] for f in layout.NODE_FIELDS}
  table = layout.input_table(g)[new_to_old]
  arrays["inputs"] = np.where(table >= 0, old_to_new[np.maximum(table, 0)], -1).astype(np.int32)
  return layout.from_arrays(arrays)


def to_arrays(graph: layout.Graph) -> dict[str, np.ndarray]:
  """Writable numpy copies of the node arrays plus the `inputs` table (see layout.from_arrays)."""
  g = _host(graph)
  arrays = {f: np.array(g.nodes[f]) for f in layout.NODE_FIELDS}
  arrays["inputs"] = np.array(layout.input_table(g))
  return arrays
