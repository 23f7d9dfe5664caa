"""A graph written as ONNX and read back: `round_trip(graph, params)` says whether the file
re-imports to the graph that was measured, and what differs where it does not."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Mapping

import numpy as np
import onnx

from xrlflow_jax import ops
from xrlflow_jax.graph import host as graph_host
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.onnx_io.exporter import save
from xrlflow_jax.onnx_io import weights
from xrlflow_jax.onnx_io.importer import ImportedParams, load


@dataclasses.dataclass(frozen=True)
class RoundTrip:
  """What an exported file imports back to.

  Attributes:
    graph, params: the file re-imported.
    exact: the file runs what the graph runs (`graph.runtime_hash` equal: the same ops on the
      same shapes; constants, folded into initializers on export, compare by shape).
    differences: {op: (count in the graph, count in the file re-imported)} of the run-time
      (non-constant) ops whose counts differ, or where every op count agrees, of the ops with
      their attributes ("Conv2D {impl=1}"); empty when `exact`.
  """
  graph: layout.Graph
  params: ImportedParams
  exact: bool
  differences: dict[str, tuple[int, int]]

  def describe(self) -> str:
    """"re-imports to the graph measured", or what differs, e.g. "re-imports to another
    graph (Transpose 12 -> 40, Conv2D 10 -> 10 ...)"."""
    if self.exact:
      return "re-imports to the graph measured"
    if not self.differences:
      return "re-imports to another graph with the same ops and attributes (wired differently)"
    return "re-imports to another graph (" + ", ".join(
        f"{op} {a} -> {b}" for op, (a, b) in sorted(self.differences.items())) + ")"


def runtime_ops(graph: layout.Graph, attrs: bool = False) -> dict[str, int]:
  """Counts of the alive run-time (non-constant) nodes per op name (with `attrs`, per op and
  its non-default attributes, e.g. "Conv2D {pads=(1, 1, 1, 1), layout=1}")."""
  g = layout.to_host(graph)
  nd = g.nodes
  out: dict[str, int] = {}
  for v in np.flatnonzero(nd["alive"] & ~nd["is_constant"]):
    spec = ops.get(int(nd["op"][v]))
    name = spec.name + (graph_host.attrs_text(spec, nd["attrs"][v]) if attrs else "")
    out[name] = out.get(name, 0) + 1
  return out


def round_trip(graph: layout.Graph, params: ParamStore, *,
               metadata: Mapping[str, str] | None = None) -> RoundTrip:
  """Writes `graph` as ONNX (`exporter.save`, checked) into a temporary folder and imports it
  back (at the capacity the importer fits it to). Raises OnnxExportError, OnnxImportError."""
  with tempfile.TemporaryDirectory(prefix="xrlflow_round_trip_") as folder:
    path = os.path.join(folder, "model.onnx")
    save(graph, params, path, metadata=metadata)
    back, back_params = load(path)
  exact = graph_host.runtime_hash(back) == graph_host.runtime_hash(graph)
  differences: dict[str, tuple[int, int]] = {}
  for with_attrs in (False, True):  # op counts first; where they agree, ops with attributes
    if exact or differences:
      break
    a, b = runtime_ops(graph, with_attrs), runtime_ops(back, with_attrs)
    differences = {op: (a.get(op, 0), b.get(op, 0)) for op in set(a) | set(b)
                   if a.get(op, 0) != b.get(op, 0)}
  return RoundTrip(back, back_params, exact, differences)


def stands_for(path: str, graph: layout.Graph) -> bool:
  """Whether the ONNX file at `path` can be handed out (or timed) in place of `graph`, the
  graph imported from it: it holds all its weights, and each of its inputs takes the graph's
  input shape (dynamic dims, or the same sizes: not a file whose fixed dims an
  `input_shapes` override changed)."""
  model = onnx.load(path, load_external_data=False)
  if any(weights.is_external(t) for t in model.graph.initializer):
    return False
  init = {t.name for t in model.graph.initializer}
  inputs = [vi for vi in model.graph.input if vi.name not in init]
  nd = layout.to_host(graph).nodes
  slots = sorted(np.flatnonzero(nd["alive"] & (nd["op"] == ops.Op.INPUT)),
                 key=lambda v: int(nd["input_index"][v]))
  if len(inputs) != len(slots):
    return False
  for vi, v in zip(inputs, slots):
    want = ops.unpad_shape(nd["shape"][v], nd["rank"][v])
    dims = vi.type.tensor_type.shape.dim
    if len(dims) != len(want):
      return False
    for d, n in zip(dims, want):
      if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != n:
        return False
  return True
