"""Before/after pictures of a rewritten graph, with the nodes the rewrites touched highlighted.

    visualize.draw_before_after(original, optimised, "graph.png")  # "graphviz" | "matplotlib"

A node is *changed* when its local identity (its op, attributes, shape and roles, and those of its
inputs in order) occurs more often in one graph than in the other: in the result these are the
nodes the rewrites created or rewired (highlighted "new"), in the input the nodes they removed or
rewired ("removed"). A local identity, unlike a whole-DAG (Merkle) hash, does not mark every node
downstream of a rewrite.

Graphviz's `dot` renders when it is installed; otherwise matplotlib draws a layered layout (one
row per topological level, two panels); with neither, nothing is drawn (`None` is returned).
Weights and weight pre-processing ops (constant nodes, evaluated once when the graph is lowered)
are left out by default; labels are drawn only on small graphs.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from xrlflow_jax import ops
from xrlflow_jax.graph import host, layout
from xrlflow_jax.ops import Op

LABEL_THRESHOLD = 80  # draw op names on panels with at most this many nodes
COLORS = {"same": "#9aa5b1", "new": "#d62728", "removed": "#ff7f0e", "input": "#2ca02c",
          "output": "#1f77b4"}


@dataclasses.dataclass(frozen=True)
class Panel:
  """One graph prepared for drawing.

  Attributes:
    nodes: int[M] slots drawn, in topological order; ops: op name per drawn node.
    level: int[M] longest-path depth from the sources; edges: (i, j) index pairs into `nodes`.
    status: per drawn node, "same", "new" (result) or "removed" (input).
  """
  nodes: np.ndarray
  ops: list[str]
  level: np.ndarray
  edges: list[tuple[int, int]]
  status: list[str]

  @property
  def changed(self) -> int:
    return sum(s != "same" for s in self.status)


def local_identities(graph: layout.Graph) -> dict[int, bytes]:
  """{slot: digest} of every alive node: its signature and its inputs' signatures, in order."""
  g = layout.to_host(graph)
  table = layout.input_table(g)
  sig = {int(v): host.node_signature(g, int(v)) for v in np.flatnonzero(g.nodes["alive"])}
  out = {}
  for v, s in sig.items():
    h = hashlib.blake2b(s, digest_size=16)
    for u in table[v]:
      if u >= 0:
        h.update(b"|" + sig[int(u)])
    out[v] = h.digest()
  return out


def changed_nodes(before: layout.Graph, after: layout.Graph) -> tuple[set[int], set[int]]:
  """(removed slots of `before`, new slots of `after`): nodes whose local identity is more
  frequent in their own graph than in the other (the surplus ones, latest in topological order).
  """
  ids_b, ids_a = local_identities(before), local_identities(after)
  return (_surplus(ids_b, ids_a, host.topological_order(layout.to_host(before))),
          _surplus(ids_a, ids_b, host.topological_order(layout.to_host(after))))


def _surplus(mine: dict[int, bytes], other: dict[int, bytes], order: np.ndarray) -> set[int]:
  budget = collections.Counter(other.values())
  out = set()
  for v in order:  # the first occurrences match the other graph's, the rest are surplus
    d = mine[int(v)]
    if budget[d] > 0:
      budget[d] -= 1
    else:
      out.add(int(v))
  return out


def prepare(graph: layout.Graph, highlight: set[int], mark: str, *,
            show_constants: bool = False) -> Panel:
  """The drawn part of `graph`: weights and ops computed from weights only (evaluated once at
  lowering, never at run time) dropped unless `show_constants`; levels by longest path;
  `highlight` slots get status `mark`."""
  g = layout.to_host(graph)
  nd = g.nodes
  table = layout.input_table(g)
  order = [int(v) for v in host.topological_order(g)]
  keep = [v for v in order
          if show_constants or not bool(nd["is_constant"][v]) or int(nd["op"][v]) == int(Op.INPUT)]
  index = {v: i for i, v in enumerate(keep)}
  level = np.zeros(len(keep), np.int64)
  edges = []
  for i, v in enumerate(keep):
    for u in table[v]:
      j = index.get(int(u)) if u >= 0 else None
      if j is not None:
        edges.append((j, i))
        level[i] = max(level[i], level[j] + 1)
  names = [ops.get(int(nd["op"][v])).name for v in keep]
  status = [mark if v in highlight else "same" for v in keep]
  return Panel(np.asarray(keep, np.int64), names, level, edges, status)


def layered_positions(panel: Panel) -> np.ndarray:
  """float[M, 2] (x, y): one row per level (top to bottom), nodes of a row centred, ordered by
  the mean x of their inputs (one barycentre pass keeps edges short)."""
  pos = np.zeros((len(panel.nodes), 2))
  preds = collections.defaultdict(list)
  for j, i in panel.edges:
    preds[i].append(j)
  rows = collections.defaultdict(list)
  for i, lv in enumerate(panel.level):
    rows[int(lv)].append(i)
  for lv in sorted(rows):
    row = rows[lv]
    key = {i: np.mean([pos[j, 0] for j in preds[i]]) if preds[i] else 0.0 for i in row}
    row.sort(key=lambda i: key[i])
    for k, i in enumerate(row):
      pos[i] = (k - (len(row) - 1) / 2.0, -lv)
  return pos


def draw_before_after(before: layout.Graph, after: layout.Graph, path: str | os.PathLike, *,
                      title: str = "", backend: str | None = None,
                      show_constants: bool = False) -> str | None:
  """Writes a PNG of both graphs side by side, changed nodes highlighted.

  Args:
    before, after: the input graph and the rewritten one.
    path: the .png file to write.
    title: a heading; backend: "graphviz", "matplotlib" or None (graphviz when `dot` is on the
      PATH, else matplotlib).
    show_constants: also draw unchanged weight nodes.
  Returns:
    The backend used, or None when neither is available (nothing written).
  """
  removed, new = changed_nodes(before, after)
  left = prepare(before, removed, "removed", show_constants=show_constants)
  right = prepare(after, new, "new", show_constants=show_constants)
  if backend in (None, "graphviz") and shutil.which("dot"):
    _draw_graphviz(left, right, Path(path), title)
    return "graphviz"
  if backend == "graphviz":
    return None
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  matplotlib.use("Agg", force=False)
  _draw_matplotlib(left, right, Path(path), title)
  return "matplotlib"


def _panel_title(name: str, panel: Panel, mark: str) -> str:
  return f"{name}: {len(panel.nodes)} nodes drawn, {panel.changed} {mark}"


def _draw_matplotlib(left: Panel, right: Panel, path: Path, title: str) -> None:
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib.collections import LineCollection  # pylint: disable=g-import-not-at-top
  depth = int(max(left.level.max(initial=0), right.level.max(initial=0))) + 1
  fig, axes = plt.subplots(1, 2, figsize=(14, min(40.0, max(6.0, 0.12 * depth + 4))))
  for ax, panel, name, mark in ((axes[0], left, "before", "removed"),
                                (axes[1], right, "after", "new")):
    pos = layered_positions(panel)
    n = len(panel.nodes)
    size = 60.0 if n <= LABEL_THRESHOLD else max(6.0, 3000.0 / n)
    segs = [(pos[j], pos[i]) for j, i in panel.edges]
    ax.add_collection(LineCollection(segs, colors="#c7ccd1", linewidths=0.5, zorder=1))
    colors = [COLORS[s] for s in panel.status]
    for i, v in enumerate(panel.ops):
      if panel.status[i] == "same" and v == "Input":
        colors[i] = COLORS["input"]
    sizes = [size * (2.5 if s != "same" else 1.0) for s in panel.status]
    ax.scatter(pos[:, 0], pos[:, 1], s=sizes, c=colors, zorder=2, linewidths=0)
    if n <= LABEL_THRESHOLD:
      for (x, y), label, s in zip(pos, panel.ops, panel.status):
        ax.annotate(label, (x, y), xytext=(4, 2), textcoords="offset points", fontsize=6,
                    color="black" if s == "same" else COLORS[s], zorder=3)
    ax.set_title(_panel_title(name, panel, mark), fontsize=10)
    ax.autoscale()
    ax.margins(0.08)
    ax.axis("off")
  handles = [plt.Line2D([], [], marker="o", ls="", color=COLORS[k], label=k)
             for k in ("same", "new", "removed", "input")]
  fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
  if title:
    fig.suptitle(title)
  fig.tight_layout(rect=(0, 0.03, 1, 0.97))
  fig.savefig(path, dpi=110)
  plt.close(fig)


def to_dot(left: Panel, right: Panel, title: str = "") -> str:
  """Graphviz DOT text: two clusters, changed nodes filled with their colour."""
  small = max(len(left.nodes), len(right.nodes)) <= LABEL_THRESHOLD
  lines = ["digraph G {", "  rankdir=TB; nodesep=0.05; ranksep=0.15;",
           f'  label="{title}"; labelloc=t;',
           "  node [shape=box, style=filled, fontsize=8, height=0.15, width=0.3, margin=0.02];"]
  for c, (panel, name, mark) in enumerate(((left, "before", "removed"),
                                           (right, "after", "new"))):
    lines.append(f"  subgraph cluster_{c} {{")
    lines.append(f'    label="{_panel_title(name, panel, mark)}";')
    for i, (op, s) in enumerate(zip(panel.ops, panel.status)):
      label = op if small else ""
      color = COLORS["input"] if (s == "same" and op == "Input") else COLORS[s]
      lines.append(f'    p{c}n{i} [label="{label}", fillcolor="{color}"];')
    for j, i in panel.edges:
      lines.append(f"    p{c}n{j} -> p{c}n{i};")
    lines.append("  }")
  lines.append("}")
  return "\n".join(lines) + "\n"


def _draw_graphviz(left: Panel, right: Panel, path: Path, title: str) -> None:
  with tempfile.NamedTemporaryFile("w", suffix=".dot", delete=False) as f:
    f.write(to_dot(left, right, title))
  try:
    subprocess.run(["dot", "-Tpng", "-Gdpi=80", f.name, "-o", str(path)], check=True,
                   capture_output=True, timeout=120)
  finally:
    os.unlink(f.name)


def summarize(before: layout.Graph, after: layout.Graph) -> dict[str, int]:
  """Counts for reports: removed and new nodes by the local-identity diff."""
  removed, new = changed_nodes(before, after)
  return {"removed": len(removed), "new": len(new)}


__all__ = ("Panel", "changed_nodes", "draw_before_after", "layered_positions",
                          "local_identities", "prepare", "summarize", "to_dot")
