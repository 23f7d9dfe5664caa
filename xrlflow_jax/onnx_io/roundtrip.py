"""A graph written as ONNX and read back: `round_trip(graph, params)` says whether the file
re-imports to the graph that was measured, and what differs where it does not."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Mapping

from xrlflow_jax import ops
from xrlflow_jax.graph import host as graph_host
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.onnx_io.exporter import save
from xrlflow_jax.onnx_io.importer import ImportedParams, load


@dataclasses.dataclass(frozen=True)
class RoundTrip:
  """What an exported file imports back to.

  Attributes:
    graph, params: the file re-imported.
    exact: the file runs what the graph runs (`graph.runtime_hash` equal: the same ops on the
      same shapes; constants, folded into initializers on export, compare by shape).
    differences: {op: (count in the graph, count in the file re-imported)} of the run-time
      (non-constant) ops whose counts differ; empty when `exact`.
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
      return "re-imports to another graph with the same op counts (wired differently)"
    return "re-imports to another graph (" + ", ".join(
        f"{op} {a} -> {b}" for op, (a, b) in sorted(self.differences.items())) + ")"


def runtime_ops(graph: layout.Graph) -> dict[str, int]:
  """Counts of the alive run-time (non-constant) nodes per op name."""
  g = layout.to_host(graph)
  nd = g.nodes
  keep = nd["alive"] & ~nd["is_constant"]
  out: dict[str, int] = {}
  for code in nd["op"][keep]:
    name = ops.get(int(code)).name
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
  a, b = runtime_ops(graph), runtime_ops(back)
  differences = {} if exact else {op: (a.get(op, 0), b.get(op, 0)) for op in set(a) | set(b)
                                  if a.get(op, 0) != b.get(op, 0)}
  return RoundTrip(back, back_params, exact, differences)
