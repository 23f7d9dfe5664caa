"""The optimise job's report (`OptimizeReport`: report.json and the CLI's table) and its output
files, written all at once or not at all."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from xrlflow_jax import onnx_io, visualize
from xrlflow_jax.measure import LatencyStats
from xrlflow_jax import graph as G
from xrlflow_jax.graph import layout
from xrlflow_jax.measure import NumericsCheck, Speedup
from xrlflow_jax.workflow import Loaded


@dataclasses.dataclass
class OptimizeReport:
  """What `optimize_model` did and found (see `to_json` for report.json).

  Attributes:
    source, label, kind ("zoo" | "onnx"), method, found_by ("policy" | "training" | method).
    random_weights: initializers given seeded random values (graph-only ONNX files).
    nodes_before, nodes_after: alive nodes; cost_before_ms, cost_after_ms: modelled cost.
    latency_before, latency_after: XLA latency measured side by side, or None.
    measured: the speedup verdict of the graph returned (`measure.Speedup`; "unchanged" when
      the input is returned), or None when not measured.
    numerics: the output comparison; rewrites: the replayable steps (None: not recorded).
    precision: the numerics policy both graphs were compiled with (`ops.precision`).
    hash_before, hash_after: structural hashes; seconds: {stage: wall seconds}.
    output_dir: where files were written ("" when none); files: {kind: path}.
    details: the search's own figures.
    against: the graph of `optimize_model(against=...)` (e.g. TASO's output for the same
      model), timed in the same rounds: {"file", "nodes", "random_weights", "latency",
      "vs_input" (its Speedup over the input), "returned_vs_it" (the returned graph's Speedup
      over it), "numerics" (its outputs against the input's; None when either file has no
      weight data), "note"}; None when not asked for.
    input_graph, graph, params: the loaded graph, the optimised one and their weights (not in
      report.json).
  """
  source: str
  label: str
  kind: str
  method: str
  found_by: str
  random_weights: int
  nodes_before: int
  nodes_after: int
  cost_before_ms: float
  cost_after_ms: float
  latency_before: LatencyStats | None
  latency_after: LatencyStats | None
  numerics: NumericsCheck
  rewrites: list[dict[str, Any]] | None
  hash_before: str
  hash_after: str
  seconds: dict[str, float]
  output_dir: str = ""
  files: dict[str, str] = dataclasses.field(default_factory=dict)
  details: dict[str, Any] = dataclasses.field(default_factory=dict)
  against: dict[str, Any] | None = None
  input_graph: Any = dataclasses.field(default=None, repr=False)
  graph: Any = dataclasses.field(default=None, repr=False)
  params: Any = dataclasses.field(default=None, repr=False)
  measured: Speedup | None = None
  precision: str = "highest"

  @property
  def modelled_speedup(self) -> float:
    return self.cost_before_ms / self.cost_after_ms if self.cost_after_ms > 0 else 1.0

  @property
  def measured_speedup(self) -> float | None:
    """The measured speedup of a changed graph (`measured.ratio`); None when not measured or
    when the graph returned is the input (nothing was timed against itself)."""
    if self.measured is None or self.measured.verdict == "unchanged":
      return None
    return self.measured.ratio

  def to_json(self) -> dict[str, Any]:
    """A JSON-ready dict."""
    def lat(s: LatencyStats | None) -> dict[str, Any] | None:
      if s is None:
        return None
      return {**dataclasses.asdict(s), "iqr_ms": s.iqr_ms}
    return {
        "source": self.source, "label": self.label, "kind": self.kind, "method": self.method,
        "found_by": self.found_by, "random_weights": self.random_weights,
        "nodes_before": self.nodes_before, "nodes_after": self.nodes_after,
        "cost_before_ms": self.cost_before_ms, "cost_after_ms": self.cost_after_ms,
        "modelled_speedup": self.modelled_speedup, "measured_speedup": self.measured_speedup,
        "measured": None if self.measured is None else self.measured.to_json(),
        "latency_before": lat(self.latency_before), "latency_after": lat(self.latency_after),
        "numerics": dataclasses.asdict(self.numerics), "precision": self.precision,
        "num_rewrites": None if self.rewrites is None else len(self.rewrites),
        "hash_before": self.hash_before, "hash_after": self.hash_after,
        "seconds": self.seconds, "output_dir": self.output_dir, "files": self.files,
        "details": _jsonable(self.details),
        "against": None if self.against is None else _jsonable({
            **self.against, "latency": lat(self.against["latency"]),
            "vs_input": self.against["vs_input"].to_json(),
            "returned_vs_it": self.against["returned_vs_it"].to_json(),
            "numerics": (None if self.against["numerics"] is None
                         else dataclasses.asdict(self.against["numerics"]))}),
    }

  def table(self) -> str:
    """The before/after table printed by the CLI."""
    def lat(s: LatencyStats | None) -> str:
      return "not measured" if s is None else f"{s.median_ms:.4f} ms ± {s.iqr_ms / 2:.4f}"
    meas = self.measured_speedup
    n = self.numerics
    rows = [
        ("", "before", "after"),
        ("nodes", str(self.nodes_before), str(self.nodes_after)),
        ("modelled cost", f"{self.cost_before_ms:.4f} ms", f"{self.cost_after_ms:.4f} ms"),
        ("XLA latency (median ± IQR/2)", lat(self.latency_before), lat(self.latency_after)),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines = [f"{a:<{w0}}  {b:>{w1}}  {c}" for a, b, c in rows]
    device = (f" on {self.latency_after.device_kind} ({self.latency_after.backend})"
              if self.latency_after else "")
    nrw = "unrecorded" if self.rewrites is None else str(len(self.rewrites))
    returned = (": no rewrite lowered the modelled cost, the input is returned"
                if self.details.get("returned_input") else "")
    if "measured_guard" in self.details:
      g = self.details["measured_guard"]
      returned = (f": the {g['rejected_found_by']} graph ({g['rejected_rewrites']} rewrites, "
                  f"modelled {g['rejected_cost_ms']:.4f} ms) measured "
                  f"{g['rejected_latency_median_ms']:.4f} ms, speedup {g['rejected_speedup']}, "
                  "not significantly faster than the input: the input is returned")
    elif "checkpoint" in self.details:
      cp = self.details["checkpoint"]
      returned = (f": the first {cp['rewrites']} of {cp['of']} found (all {cp['of']} measured "
                  f"{cp['rejected_speedup']})")
    lines += [
        f"speedup: modelled x{self.modelled_speedup:.3f}, measured "
        + ("not measured" if self.measured is None else
           f"{self.measured.describe()}{device if meas is not None else ''}"),
        f"rewrites: {nrw} (found by {self.found_by}){returned}",
        f"numerics: {n.describe()} (precision {self.precision})",
    ]
    if "cost_model" in self.details:
      lines.append(f"cost model: {self.details['cost_model']}")
    if self.against is not None:
      lines.append(against_line(self.against))
    lines += [
        "time: " + ", ".join(f"{k} {v:.1f}s" for k, v in self.seconds.items()),
    ]
    if self.random_weights:
      lines.append(f"note: {self.random_weights} initializers had no data in the file and were "
                   "given seeded random weights")
    return "\n".join(lines)


def _jsonable(v: Any) -> Any:
  if isinstance(v, (bool, int, str)) or v is None:
    return v
  if isinstance(v, (float, np.floating)):
    f = float(v)
    return f if math.isfinite(f) else None
  if isinstance(v, np.integer):
    return int(v)
  if isinstance(v, (list, tuple)):
    return [_jsonable(x) for x in v]
  if isinstance(v, dict):
    return {str(k): _jsonable(x) for k, x in v.items()}
  return repr(v)


def write_outputs(report: OptimizeReport, loaded: Loaded, best: layout.Graph, out_dir: Path, *,
                  picture: bool = True, log: Callable[[str], None] = print) -> dict[str, str]:
  """Writes the files into a fresh folder beside `out_dir`, then moves it into place, so a
  failure (an ONNX export error) leaves no partial output. Returns {kind: path}."""
  out_dir = Path(out_dir)
  out_dir.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
  try:
    files = _write_files(report, loaded, best, tmp, picture, log)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in os.listdir(tmp):
      os.replace(tmp / name, out_dir / name)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return {k: str(out_dir / v) for k, v in files.items()}


def _write_files(report: OptimizeReport, loaded: Loaded, best: layout.Graph, folder: Path,
                 picture: bool, log: Callable[[str], None]) -> dict[str, str]:
  """Writes every output into `folder`; returns {kind: file name}."""
  files: dict[str, str] = {}
  if loaded.kind == "onnx":
    onnx_io.save(best, loaded.params, folder / "optimized.onnx")
    files["onnx"] = "optimized.onnx"
  (folder / "rewrites.json").write_text(json.dumps(
      {"source": report.source, "method": report.method, "found_by": report.found_by,
       "rules": report.details.get("rules"),
       "max_locations": report.details.get("max_locations"),
       "taso_file": report.details.get("taso_file"), "hash_before": report.hash_before,
       "hash_after": report.hash_after, "capacity": G.capacity(loaded.graph),
       "recorded": report.rewrites is not None, "rewrites": report.rewrites or []},
      indent=2) + "\n")
  files["rewrites"] = "rewrites.json"
  (folder / "best_graph.txt").write_text(G.dump(best) + "\n")
  files["graph_text"] = "best_graph.txt"
  if picture:
    how = visualize.draw_before_after(loaded.graph, best, folder / "graph.png",
                                      title=f"{report.label}: {report.method}")
    if how is None:
      log("graph picture: skipped (neither graphviz's dot nor matplotlib is installed)")
    else:
      files["picture"] = "graph.png"
  report.files = {k: str(v) for k, v in files.items()}
  (folder / "report.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
  files["report"] = "report.json"
  return files


def default_output_dir(label: str, method: str) -> Path:
  """/tmp/xrlflow_optimize/<label>_<method> (or $TMPDIR's)."""
  return Path(tempfile.gettempdir()) / "xrlflow_optimize" / f"{label}_{method}"


def against_line(against: dict[str, Any]) -> str:
  """One line on the `against` graph (see OptimizeReport.against)."""
  vs_input, ours = against["vs_input"], against["returned_vs_it"]
  lat = against["latency"]
  return (f"against {against['file']}: {lat.median_ms:.4f} ms, vs the input "
          f"{vs_input.describe()}; the returned graph vs it {ours.describe()}; "
          + (f"its numerics: {against['numerics'].describe()}" if against["numerics"] is not None
             else f"its numerics: not checked ({against['note']})"))
