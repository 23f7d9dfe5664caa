"""The optimise job's report (`OptimizeReport`: report.json and the CLI's table) and its output
files, written all at once or not at all."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from xrlflow_jax import graph as G
from xrlflow_jax import onnx_io, visualize
from xrlflow_jax.graph import layout
from xrlflow_jax.measure import LatencyStats, NumericsCheck, Speedup
from xrlflow_jax.search import SearchResult
from xrlflow_jax.workflow import Loaded


@dataclasses.dataclass
class OptimizeReport:
  """What `optimize_model` did and found (see `to_json` for report.json).

  Attributes:
    source, label, kind ("zoo" | "onnx"), method.
    random_weights: initializers given seeded random values (graph-only ONNX files).
    result: the search's result after the guards (`search.SearchResult`: the graph returned,
      its modelled cost, rewrites and measured latency; `result.guard` the measured guard's
      decision, `result.comparison` what it timed; `result.method` says what found it,
      "policy" or "training" for "ppo").
    numerics: the output comparison of the graph returned (of the rejected one when the input
      is returned).
    seconds: {stage: wall seconds}.
    params: the weights of both graphs (not in report.json).
    precision: the numerics policy both graphs were compiled with (`ops.precision`).
    details: the job's figures: the search's, the rules, the cost model, the guard's
      checkpoints.
    against: the graph of `optimize_model(against=...)` (e.g. TASO's output for the same
      model), timed in the same rounds: {"file", "nodes", "random_weights", "latency",
      "vs_input" (its Speedup over the input), "returned_vs_it" (the returned graph's Speedup
      over it), "numerics" (its outputs against the input's; None when either file has no
      weight data), "note"}; None when not asked for.
    export: ONNX inputs: what was written and how it re-imports (`onnx_io.round_trip`):
      {"written", "round_trip" ("exact" | "differs"), "round_trip_text", "differences",
      "file_measured" (the file's own graph timed against the input, a Speedup, where it
      differs)}; None for zoo models.
    output_dir: where files were written ("" when none); files: {kind: path}.
  """
  source: str
  label: str
  kind: str
  method: str
  random_weights: int
  result: SearchResult = dataclasses.field(repr=False)
  numerics: NumericsCheck
  seconds: dict[str, float]
  params: Any = dataclasses.field(default=None, repr=False)
  precision: str = "highest"
  details: dict[str, Any] = dataclasses.field(default_factory=dict)
  against: dict[str, Any] | None = None
  export: dict[str, Any] | None = None
  output_dir: str = ""
  files: dict[str, str] = dataclasses.field(default_factory=dict)

  @property
  def found_by(self) -> str:
    """"greedy", ... (the method), or for "ppo", "policy" or "training"."""
    return self.result.method

  @property
  def input_graph(self) -> layout.Graph:
    return self.result.input_graph

  @property
  def graph(self) -> layout.Graph:
    """The graph returned."""
    return self.result.best_graph

  @property
  def nodes_before(self) -> int:
    return G.num_nodes(self.input_graph)

  @property
  def nodes_after(self) -> int:
    return G.num_nodes(self.graph)

  @property
  def cost_before_ms(self) -> float:
    return float(self.result.initial_cost_ms)

  @property
  def cost_after_ms(self) -> float:
    return float(self.result.best_cost_ms)

  @property
  def latency_before(self) -> LatencyStats | None:
    return self.result.input_latency

  @property
  def latency_after(self) -> LatencyStats | None:
    return self.result.best_latency

  @property
  def hash_before(self) -> str:
    return G.structural_hash(self.input_graph)

  @property
  def hash_after(self) -> str:
    return G.structural_hash(self.graph)

  @property
  def rewrites(self) -> list[dict[str, Any]]:
    """The replayable steps from the input to the graph returned (`search.replay`)."""
    return [r.to_json() for r in self.result.rewrites]

  @property
  def measured(self) -> Speedup | None:
    """The measured verdict of the graph returned ("unchanged" when the input is returned),
    or None when not measured."""
    if self.result.input_latency is None:
      return None
    if self.result.returned_input:
      return Speedup.unchanged()
    if self.export and self.export.get("file_measured") is not None:
      return self.export["file_measured"]  # the written file's figure is the one reported
    if self.result.guard is not None:
      return self.result.guard.speedup
    return self.result.measured or Speedup.unchanged()

  @property
  def runtime(self) -> str:
    """"XLA" or "onnxruntime": where the latencies were measured."""
    stats = self.latency_before
    return "onnxruntime" if stats is not None and stats.backend == "onnxruntime" else "XLA"

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
        "num_rewrites": len(self.rewrites),
        "hash_before": self.hash_before, "hash_after": self.hash_after,
        "seconds": self.seconds, "output_dir": self.output_dir, "files": self.files,
        "details": _jsonable(self.details),
        "against": None if self.against is None else _jsonable({
            **self.against, "latency": lat(self.against["latency"]),
            "vs_input": self.against["vs_input"].to_json(),
            "returned_vs_it": self.against["returned_vs_it"].to_json(),
            "numerics": (None if self.against["numerics"] is None
                         else dataclasses.asdict(self.against["numerics"]))}),
        "export": None if self.export is None else _jsonable({
            k: v.to_json() if isinstance(v, Speedup) else v for k, v in self.export.items()}),
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
        (f"{self.runtime} latency (median ± IQR/2)", lat(self.latency_before),
         lat(self.latency_after)),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines = [f"{a:<{w0}}  {b:>{w1}}  {c}" for a, b, c in rows]
    device = (f" on {self.latency_after.device_kind} ({self.latency_after.backend})"
              if self.latency_after else "")
    nrw = str(len(self.rewrites))
    returned = ""
    decision, r = self.result.guard, self.result
    if decision is not None and decision.kept == "input":
      returned = (f": the {r.method} graph ({r.found_rewrites} rewrites, modelled "
                  f"{r.found_cost_ms:.4f} ms) measured "
                  f"{r.comparison.candidates[0].median_ms:.4f} ms, speedup "
                  f"{decision.path_speedup.describe()}, not significantly faster than the "
                  "input: the input is returned")
    elif decision is not None and decision.kept == "checkpoint":
      other = r.options.get("checkpoint", {}).get("rejected_found_by")
      if other:
        returned = (f": measured faster than the {other}'s graph ({decision.of} rewrites, "
                    f"{decision.path_speedup.describe()})")
      else:
        returned = (f": the first {decision.rewrites} of {decision.of} found (all "
                    f"{decision.of} measured {decision.path_speedup.describe()})")
    elif "export_rejected" in r.options:
      returned = (f": the optimised graph's written file measured {r.options['export_rejected']},"
                  " not significantly faster than the input: the input is returned")
    elif r.returned_input:
      returned = ": no rewrite lowered the modelled cost, the input is returned"
    lines += [
        f"speedup: modelled x{self.modelled_speedup:.3f}, measured "
        + ("not measured" if self.measured is None else
           f"{self.measured.describe()}{device if meas is not None else ''}"),
        f"rewrites: {nrw} (found by {self.found_by}){returned}",
        f"numerics: {n.describe()} (precision {self.precision})",
    ]
    if "cost_model" in self.details:
      lines.append(f"cost model: {self.details['cost_model']}")
    if self.export is not None and "round_trip_text" in self.export:
      lines.append(f"written file: {self.export['round_trip_text']}"
                   + (f"; the file's graph measured {self.export['file_measured'].describe()}"
                      if self.export.get("file_measured") is not None else ""))
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


def write_outputs(report: OptimizeReport, loaded: Loaded, out_dir: Path, *,
                  picture: bool = True, log: Callable[[str], None] = print) -> dict[str, str]:
  """Writes the files into a fresh folder beside `out_dir`, then moves it into place, so a
  failure (an ONNX export error) leaves no partial output. report.json is written last, once,
  with the final times (`seconds["write"]`, `seconds["total"]`). Sets `report.files` and
  `report.output_dir`; returns {kind: path}."""
  started = time.perf_counter()
  out_dir = Path(out_dir)
  out_dir.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
  try:
    files = _write_files(report, loaded, tmp, picture, log)
    files["report"] = "report.json"
    report.output_dir = str(out_dir)
    report.files = {k: str(out_dir / v) for k, v in files.items()}
    report.seconds["write"] = time.perf_counter() - started
    report.seconds["total"] = sum(v for k, v in report.seconds.items() if k != "total")
    (tmp / "report.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in os.listdir(tmp):
      os.replace(tmp / name, out_dir / name)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return report.files


def _write_files(report: OptimizeReport, loaded: Loaded, folder: Path, picture: bool,
                 log: Callable[[str], None]) -> dict[str, str]:
  """Writes every output but report.json into `folder`; returns {kind: file name}."""
  files: dict[str, str] = {}
  best = report.graph
  if loaded.kind == "onnx" and report.result.returned_input \
      and onnx_io.stands_for(loaded.path, loaded.graph):
    shutil.copyfile(loaded.path, folder / "optimized.onnx")  # the user's own file, unchanged
    files["onnx"] = "optimized.onnx"
  elif loaded.kind == "onnx":
    metadata = {"xrlflow_jax.source": report.source, "xrlflow_jax.method": report.method}
    if loaded.random_weights:  # what the file holds is not the model's weights: say so in it
      metadata["xrlflow_jax.random_weights"] = (
          f"{loaded.random_weights} initializers hold seeded random values, not the model's "
          "weights (its external data file was absent)")
    onnx_io.save(best, loaded.params, folder / "optimized.onnx", metadata=metadata)
    files["onnx"] = "optimized.onnx"
  (folder / "rewrites.json").write_text(json.dumps(
      {"source": report.source, "method": report.method, "found_by": report.found_by,
       "rules": report.details.get("rules"),
       "max_locations": report.details.get("max_locations"),
       "taso_file": report.details.get("taso_file"), "hash_before": report.hash_before,
       "hash_after": report.hash_after, "capacity": G.capacity(loaded.graph),
       "rewrites": report.rewrites},
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
