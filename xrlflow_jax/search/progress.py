"""What every search driver keeps while it runs: the input, the cheapest graph met so far under
the cost model, and its counts; `Progress.finish` ends the run with the guards
(`search.guard.finish`)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.search import guard
from xrlflow_jax.search.expand import Expander, improves
from xrlflow_jax.search.result import RewriteStep, SearchResult


@dataclasses.dataclass
class Progress:
  """A search driver's run so far.

  Attributes:
    method: the driver's name; expander: its compiled Expander; params: the input's weights.
    measure, measure_options: the measured guard (`search.guard.finish`).
    input_graph: the (checked) input, capacity N; initial_cost: its modelled cost (ms).
    started: `time.perf_counter()` when the driver started.
    best_graph, best_cost, best_steps: the cheapest graph met (the input until `offer` takes
      one), its modelled cost and the steps that reach it from the input.
    expanded: graphs expanded (or steps taken); costed: candidates whose cost was computed.
  """
  method: str
  expander: Expander
  params: ParamStore
  measure: bool
  measure_options: dict[str, Any] | None
  input_graph: layout.Graph
  initial_cost: float
  started: float = dataclasses.field(default_factory=time.perf_counter)
  best_graph: layout.Graph | None = None
  best_cost: float = float("nan")
  best_steps: Sequence[RewriteStep] = ()
  expanded: int = 0
  costed: int = 0

  def __post_init__(self) -> None:
    if self.best_graph is None:
      self.best_graph, self.best_cost = self.input_graph, float(self.initial_cost)

  def counted(self, valid: Any) -> None:
    """One graph expanded (or one step taken) with `valid`'s true entries costed."""
    self.expanded += 1
    self.costed += int(valid.sum())

  def offer(self, graph: layout.Graph, cost: float, steps: Sequence[RewriteStep]) -> bool:
    """Takes `graph` (reached by `steps`, modelled `cost`) as the best when it improves on it
    (`expand.improves`); whether it did."""
    if not improves(cost, self.best_cost):
      return False
    self.best_graph, self.best_cost, self.best_steps = graph, float(cost), tuple(steps)
    return True

  def finish(self, **options: Any) -> SearchResult:
    """The SearchResult of the best graph met, through the guards; `options`: the driver's
    settings, for reports."""
    return guard.finish(self.method, self.input_graph, self.best_graph, list(self.best_steps),
                        self.params, initial_cost=self.initial_cost, best_cost=self.best_cost,
                        measure=self.measure, started=self.started,
                        graphs_expanded=self.expanded, candidates_costed=self.costed,
                        options=options, measure_options=self.measure_options,
                        expander=self.expander)
