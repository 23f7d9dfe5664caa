"""Op signatures: what decides an op's run time, the unit the profiler times and caches.

An `OpSignature` is an op, its attribute vector, and its input shapes and dtypes; its `key` is
the profile cache's key, and `signature_from_key` reads one back. A `GroupSignature` is a group
of sibling MatMuls/Conv2Ds that read one tensor, timed together. Each becomes a single-op graph
(every operand a graph input, so nothing is folded) for the profiler to compile and time, and for
the cost model to compute its features (`single_op_features`).

    sigs = graph_signatures(graph)               # [(OpSignature, count)] of the ops that run
    groups = sibling_groups(graph)               # [(GroupSignature, count)]
    feats = single_op_features([s for s, _ in sigs])  # float32[S, F]
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np

from xrlflow_jax import ops
from xrlflow_jax.cost import model as cost_model
from xrlflow_jax.errors import XrlflowError
from xrlflow_jax.graph import GraphBuilder, host, layout, transforms
from xrlflow_jax.ops import DType, Op

SINGLE_OP_CAPACITY = 8  # single-op graphs: up to 7 operands + the op


class ProfileError(XrlflowError):
  """A signature that cannot be profiled, or a cache file that cannot be read or written
  (defined with the signatures: `signature_from_key` raises it for a malformed cache key)."""


@dataclasses.dataclass(frozen=True)
class OpSignature:
  """What an op's run time depends on: op name, attribute vector, input shapes and dtypes."""
  op: str
  attrs: tuple[int, ...]
  in_shapes: tuple[tuple[int, ...], ...]
  in_dtypes: tuple[str, ...]

  @property
  def key(self) -> str:
    """A stable text key, e.g. 'MatMul|0,0,...|64x64;64x256|float32;float32'."""
    shapes = ";".join("x".join(str(d) for d in s) or "scalar" for s in self.in_shapes)
    return (f"{self.op}|{','.join(str(a) for a in self.attrs)}|{shapes}|"
            f"{';'.join(self.in_dtypes)}")

  def describe(self) -> str:
    """Readable: op, input shapes and the attributes that differ from their defaults."""
    spec = ops.get(self.op)
    decoded = spec.decode_attrs(np.asarray(self.attrs, np.int32))
    defaults = {f.name: f.default for f in spec.attrs}
    shown = {k: v for k, v in decoded.items() if v != defaults.get(k)}
    if spec.code == Op.RESHAPE:
      shown = {"shape": list(decoded["shape"][ops.MAX_RANK - decoded["rank"]:])}
    elif spec.code == Op.TRANSPOSE:
      shown = {"perm": list(decoded["perm"][:len(self.in_shapes[0])])}
    args = ", ".join(f"{dt}{list(s)}" for s, dt in zip(self.in_shapes, self.in_dtypes))
    extra = " " + " ".join(f"{k}={v}" for k, v in shown.items()) if shown else ""
    return f"{self.op}({args}){extra}"

  def single_op_graph(self) -> tuple[layout.Graph, Any]:
    """The op alone: one graph input per operand, the op, its output. Returns (graph, params)."""
    n = len(self.in_shapes)
    b = GraphBuilder(max_inputs=max(layout.DEFAULT_MAX_INPUTS, n), name=self.describe())
    xs = [b.input(s, dtype=dt) for s, dt in zip(self.in_shapes, self.in_dtypes)]
    spec = ops.get(self.op)
    y = b.node(spec.code, xs, **spec.decode_attrs(np.asarray(self.attrs, np.int32)))
    b.output(y)
    return b.build(max(SINGLE_OP_CAPACITY, n + 1))


def graph_signatures(graph: layout.Graph) -> list[tuple[OpSignature, int]]:
  """Distinct signatures of the ops that run when the graph is executed, with their counts.

  Skips graph inputs, constants, constant nodes (folded at lowering) and nodes from which no
  output is reachable (never run). The graph is validated first (GraphValidationError).
  """
  g = layout.to_host(graph)
  host.validate(g)
  nd = g.nodes
  table = layout.input_table(g)
  live = np.asarray(jax.jit(transforms.live_nodes)(graph))
  counts: dict[OpSignature, int] = {}
  for v in host.topological_order(g):
    if not live[v] or nd["is_constant"][v] or int(nd["op"][v]) in (Op.INPUT, Op.CONSTANT):
      continue
    sig = node_signature(g, table, int(v))
    counts[sig] = counts.get(sig, 0) + 1
  return list(counts.items())


GROUP_PREFIX = "group|"
GROUP_CAPACITY = 16
MAX_GROUP = 7  # siblings profiled together at most (and as many as fit GROUP_CAPACITY slots)


@dataclasses.dataclass(frozen=True)
class GroupSignature:
  """Sibling MatMuls/Conv2Ds that read one tensor, profiled together in one executable.

  XLA:CPU runs independent kernels concurrently, so siblings cost less together than one at a
  time; groups are what the cost model's `*.gflop_sibling` coefficients are fitted from.
  Every member's first operand is the same shape; in the graph it is one shared input.
  """
  members: tuple[OpSignature, ...]
  op = "group"

  @property
  def key(self) -> str:
    return GROUP_PREFIX + "||".join(m.key for m in self.members)

  def describe(self) -> str:
    return f"{len(self.members)} siblings: " + "; ".join(m.describe() for m in self.members)

  def single_op_graph(self) -> tuple[layout.Graph, Any]:
    """The siblings alone: one shared first input, their other operands, each an output."""
    first = self.members[0]
    b = GraphBuilder(max_inputs=layout.DEFAULT_MAX_INPUTS, name=self.describe())
    x = b.input(first.in_shapes[0], dtype=first.in_dtypes[0])
    outs = []
    for m in self.members:
      rest = [b.input(sh, dtype=dt) for sh, dt in zip(m.in_shapes[1:], m.in_dtypes[1:])]
      spec = ops.get(m.op)
      outs.append(b.node(spec.code, [x, *rest],
                         **spec.decode_attrs(np.asarray(m.attrs, np.int32))))
    b.output(*outs)
    return b.build(GROUP_CAPACITY)


def sibling_groups(graph: layout.Graph) -> list[tuple[GroupSignature, int]]:
  """Groups of >= 2 MatMul / ungrouped Conv2D nodes reading one tensor (through bitcasts) as
  their first operand with the same shape, with how often each group occurs (host)."""
  g = layout.to_host(graph)
  nd = g.nodes
  table = layout.input_table(g)
  live = np.asarray(jax.jit(transforms.live_nodes)(graph))
  bitcast = {int(Op.RESHAPE), int(Op.SQUEEZE), int(Op.UNSQUEEZE)}
  groups_attr = ops.get(Op.CONV2D).attr_offsets()["groups"][0]
  by_source: dict[tuple[int, tuple[int, ...]], list[int]] = {}
  for v in np.flatnonzero(nd["alive"] & live & ~nd["is_constant"]):
    op = int(nd["op"][v])
    if op not in (Op.MATMUL, Op.CONV2D) or table[v][0] < 0:
      continue
    if op == Op.CONV2D and nd["attrs"][v][groups_attr] > 1:
      continue
    u = int(table[v][0])
    for _ in range(4):
      if int(nd["op"][u]) in bitcast and not nd["is_constant"][u] and table[u][0] >= 0:
        u = int(table[u][0])
    shape = ops.unpad_shape(nd["shape"][table[v][0]], nd["rank"][table[v][0]])
    by_source.setdefault((u, shape), []).append(int(v))
  counts: dict[GroupSignature, int] = {}
  for members in by_source.values():
    sigs, slots = [], 1  # the shared input
    for v in members[:MAX_GROUP]:
      sig = node_signature(g, table, v)
      if slots + len(sig.in_shapes) > GROUP_CAPACITY:  # the op and its other operands
        break
      sigs.append(sig)
      slots += len(sig.in_shapes)
    if len(sigs) < 2:
      continue
    group = GroupSignature(tuple(sorted(sigs, key=lambda s: s.key)))
    counts[group] = counts.get(group, 0) + 1
  return list(counts.items())


def node_signature(g: layout.Graph, table: np.ndarray, v: int) -> OpSignature:
  """The signature of node slot `v` of host graph `g` (`table`: its `layout.input_table`)."""
  nd = g.nodes
  inputs = [int(u) for u in table[v] if u >= 0]
  return OpSignature(
      ops.get(int(nd["op"][v])).name, tuple(int(a) for a in nd["attrs"][v]),
      tuple(ops.unpad_shape(nd["shape"][u], nd["rank"][u]) for u in inputs),
      tuple(DType(int(nd["dtype"][u])).name.lower() for u in inputs))


def signature_from_key(key: str) -> OpSignature | GroupSignature:
  """Inverse of `OpSignature.key` and `GroupSignature.key`; ProfileError for a malformed key."""
  if key.startswith(GROUP_PREFIX):
    return GroupSignature(tuple(signature_from_key(k)
                                for k in key[len(GROUP_PREFIX):].split("||")))
  try:
    op, attrs, shapes, dtypes = key.split("|")
    in_shapes = tuple(() if s == "scalar" else tuple(int(d) for d in s.split("x"))
                      for s in shapes.split(";")) if shapes else ()
    return OpSignature(op, tuple(int(a) for a in attrs.split(",")), in_shapes,
                       tuple(dtypes.split(";")) if dtypes else ())
  except ValueError:
    raise ProfileError(f"malformed profile key {key!r}") from None


# ----------------------------------------------------------------------------------------------
# Features of single-op graphs (for fitting and for the table)
# ----------------------------------------------------------------------------------------------

_FEATURES_JIT: dict[bool, Any] = {}


def single_op_features(sigs: Sequence[OpSignature | GroupSignature],
                       epilogue_fusion: bool = False) -> np.ndarray:
  """float32[S, F]: the cost features of each signature's graph (what is timed)."""
  if epilogue_fusion not in _FEATURES_JIT:
    _FEATURES_JIT[epilogue_fusion] = jax.jit(
        lambda g: cost_model.graph_features(g, epilogue_fusion))
  fn = _FEATURES_JIT[epilogue_fusion]
  out = np.zeros([len(sigs), cost_model.NUM_FEATURES], np.float32)
  for i, sig in enumerate(sigs):
    graph, _ = sig.single_op_graph()
    out[i] = np.asarray(fn(graph))
  return out


def single_op_costs(sigs: Sequence[OpSignature],
                    coeffs: cost_model.CostCoefficients) -> np.ndarray:
  """float64[S]: the model's cost (ms, without the call overhead) of each op alone."""
  feats = single_op_features(sigs, coeffs.epilogue_fusion)
  return feats.astype(np.float64) @ np.asarray(coeffs.weights, np.float64)
