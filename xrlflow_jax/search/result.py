"""What every search driver returns: `SearchResult`, its applied steps `RewriteStep`, and
`SearchError`."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from xrlflow_jax.errors import XrlflowError
from xrlflow_jax.measure import Comparison, Speedup
from xrlflow_jax.measure.guard import GuardDecision
from xrlflow_jax.measure.latency import LatencyStats
from xrlflow_jax.graph import host as graph_host
from xrlflow_jax.graph import layout

# The cost-model searches, then the search driven by a trained policy: `search.optimize`'s methods.
BASELINES = ("greedy", "taso", "beam", "random")
METHODS = BASELINES + ("policy",)
# What the optimise job and the benchmarks offer: "ppo" (train, then search with the policy) and
# the baselines.
JOB_METHODS = ("ppo",) + BASELINES


class SearchError(XrlflowError):
  """A search that cannot run: unknown method, bad options, a graph with no room to rewrite,
  a policy built for another rule set, or a rewrite sequence that does not replay."""


@dataclasses.dataclass(frozen=True)
class RewriteStep:
  """One applied rewrite, enough to replay it (`search.replay`).

  Attributes:
    rule: the rule's name; rule_index: its index in the RuleSet.
    location: the location index l in the RuleSet's match of the graph it was applied to.
    nodes: the bound node slots (length P of the RuleSet, -1 padding), in the rule's order
      (pattern variables, then source ops), of the graph it was applied to.
  """
  rule: str
  rule_index: int
  location: int
  nodes: tuple[int, ...]

  def to_json(self) -> dict[str, Any]:
    return {"rule": self.rule, "rule_index": self.rule_index, "location": self.location,
            "nodes": [int(v) for v in self.nodes]}

  @classmethod
  def from_json(cls, data: dict[str, Any]) -> "RewriteStep":
    return cls(str(data["rule"]), int(data["rule_index"]), int(data["location"]),
               tuple(int(v) for v in data["nodes"]))


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """A graph the measured guard times beside the found path's and may return instead: a
  prefix of that path, or another path from the same input (`path`).

  Attributes:
    rewrites: the prefix's length (steps of the path), or `path`'s; graph: the graph it reaches
      (host arrays, the input's capacity); cost_ms: its modelled cost.
    path: None for a prefix; else the steps from the input to `graph` that are not a prefix of
      the found path (the best graph training met beside the trained policy's), replayable.
    found_by: who found `path` (the result's `method` when it is returned; `of_path`).
  """
  rewrites: int
  graph: layout.Graph
  cost_ms: float
  path: tuple[RewriteStep, ...] | None = None
  found_by: str = ""

  @classmethod
  def of_path(cls, path: Sequence[RewriteStep], graph: layout.Graph, cost_ms: float,
              found_by: str) -> "Checkpoint":
    """Another driver's graph, reached from the input by `path` (its length is `rewrites`)."""
    return cls(len(path), graph, float(cost_ms), tuple(path), found_by)

  def steps(self, found: Sequence[RewriteStep]) -> list[RewriteStep]:
    """The rewrites from the input to `graph`, given the found path's `found`."""
    return list(self.path) if self.path is not None else list(found[:self.rewrites])


@dataclasses.dataclass
class SearchResult:
  """The outcome of one search.

  Attributes:
    method: "greedy", "taso", "beam", "random" or "policy".
    input_graph: the graph searched from (host numpy arrays, capacity N).
    best_graph: the graph returned (host numpy arrays, validated); `input_graph` itself when
      `returned_input`.
    rewrites: the applied steps that turn `input_graph` into `best_graph` (empty when
      `returned_input`); `search.replay(input_graph, ruleset, rewrites)` rebuilds it.
    initial_cost_ms: modelled cost of the input; best_cost_ms: of the graph returned.
    input_latency, best_latency: measured side by side (interleaved) when the search ran with
      measure=True, else None.
    seconds: wall time of the search (expansions and the guard).
    graphs_expanded: graphs whose every candidate was costed (or, for random and policy, steps
      taken); candidates_costed: candidate graphs whose modelled cost was computed.
    returned_input: the input is returned: the guard rejected the graph found (not faster), or
      the search found nothing better (then `found_rewrites` is 0).
    found_cost_ms: modelled cost of the best graph the search found, before the guard.
    found_rewrites: number of rewrites of that graph (before the guard).
    options: the driver's settings (for reports).
    measured: the measured verdict on the graph found (`measure.Speedup`; the whole path's
      when the guard rejected it), or None when not measured or nothing was found.
    checkpoints: prefixes of the found path for the measured guard (`guard.measured_guard`):
      those it timed, or, for a search run without it, those it is to time.
    guard: the measured guard's decision (`measure.guard.GuardDecision`), None when it did not
      run (measure=False, or told to keep the path whatever it measured).
    comparison: the guard's `measure.Comparison`: candidate 0 the found graph, then the other
      graphs it was given, then `checkpoints`; None when not measured.
  """
  method: str
  input_graph: layout.Graph
  best_graph: layout.Graph
  rewrites: list[RewriteStep]
  initial_cost_ms: float
  best_cost_ms: float
  input_latency: LatencyStats | None = None
  best_latency: LatencyStats | None = None
  seconds: float = 0.0
  graphs_expanded: int = 0
  candidates_costed: int = 0
  returned_input: bool = False
  found_cost_ms: float = float("nan")
  found_rewrites: int = 0
  options: dict[str, Any] = dataclasses.field(default_factory=dict)
  measured: Speedup | None = None
  checkpoints: list[Checkpoint] = dataclasses.field(default_factory=list, repr=False)
  guard: GuardDecision | None = None
  comparison: Comparison | None = dataclasses.field(default=None, repr=False)

  @property
  def modelled_speedup(self) -> float:
    """initial_cost_ms / best_cost_ms (1.0 when the input is returned)."""
    return float(self.initial_cost_ms / self.best_cost_ms) if self.best_cost_ms > 0 else 1.0

  @property
  def measured_speedup(self) -> float | None:
    """Input median latency / best median latency, or None when not measured."""
    if self.input_latency is None or self.best_latency is None:
      return None
    return float(self.input_latency.median_ms / self.best_latency.median_ms)

  @property
  def speedup(self) -> float:
    """The measured speedup when measured, else the modelled one (>= 1 after the guard)."""
    m = self.measured_speedup
    return m if m is not None else self.modelled_speedup

  def to_json(self) -> dict[str, Any]:
    """A JSON-ready dict (no graph arrays: node counts and structural hashes instead)."""
    def lat(s: LatencyStats | None) -> dict[str, Any] | None:
      if s is None:
        return None
      d = dataclasses.asdict(s)
      d["iqr_ms"] = s.iqr_ms
      return d

    return {
        "method": self.method,
        "initial_cost_ms": float(self.initial_cost_ms),
        "best_cost_ms": float(self.best_cost_ms),
        "found_cost_ms": float(self.found_cost_ms),
        "found_rewrites": int(self.found_rewrites),
        "modelled_speedup": self.modelled_speedup,
        "measured_speedup": self.measured_speedup,
        "speedup": self.speedup,
        "input_latency": lat(self.input_latency),
        "best_latency": lat(self.best_latency),
        "measured": None if self.measured is None else self.measured.to_json(),
        "returned_input": bool(self.returned_input),
        "rewrites": [r.to_json() for r in self.rewrites],
        "num_rewrites": len(self.rewrites),
        "seconds": float(self.seconds),
        "graphs_expanded": int(self.graphs_expanded),
        "candidates_costed": int(self.candidates_costed),
        "input_nodes": graph_host.num_nodes(self.input_graph),
        "best_nodes": graph_host.num_nodes(self.best_graph),
        "capacity": layout.capacity(self.input_graph),
        "input_hash": graph_host.structural_hash(self.input_graph),
        "best_hash": graph_host.structural_hash(self.best_graph),
        "options": {k: _jsonable(v) for k, v in self.options.items()},
    }

  def summary(self) -> str:
    """One line: method, costs, speedups, rewrites, time."""
    meas = self.measured_speedup
    text = (f"{self.method}: modelled {self.initial_cost_ms:.4f} -> {self.best_cost_ms:.4f} ms "
            f"(x{self.modelled_speedup:.3f})")
    if meas is not None:
      text += (f", measured {self.input_latency.median_ms:.4f} -> "
               f"{self.best_latency.median_ms:.4f} ms (x{meas:.3f})")
    text += (f", {len(self.rewrites)} rewrites, {self.graphs_expanded} expanded, "
             f"{self.candidates_costed} costed, {self.seconds:.1f}s")
    if self.measured is not None:
      text += f" [found graph measured {self.measured.describe()}]"
    if self.returned_input and self.found_rewrites:
      text += " [input returned: the graph found was not measured faster]"
    return text


def _jsonable(v: Any) -> Any:
  if isinstance(v, (bool, int, float, str)) or v is None:
    return v
  if isinstance(v, (np.integer, np.floating)):
    return v.item()
  if isinstance(v, (list, tuple)):
    return [_jsonable(x) for x in v]
  if isinstance(v, dict):
    return {str(k): _jsonable(x) for k, x in v.items()}
  return repr(v)
