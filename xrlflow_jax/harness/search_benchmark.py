"""Search speed: expansions per second of a search driver, cold (first call, compiling) and warm
(second call in the process), against TASO's own search on the same model class.

    rows = [time_search(label, graph, params) for label, (graph, params) in models]
    print(markdown(rows))
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from xrlflow_jax.cost import calibrate
from xrlflow_jax.cost.kernel_table import KernelTimes
from xrlflow_jax.cost import model as cost_model
from xrlflow_jax.graph import host as graph_host
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.rules import RuleSet
from xrlflow_jax.search.api import default_ruleset, optimize
from xrlflow_jax.search.expand import Expander

# TASO's backtracking search on its own example graphs (alpha 1.05, budget 1000), 2-core x86_64
# machine of this class, from ../shared/benchmarks/taso_reference.md: expansions per second.
TASO_EXPANSIONS_PER_S = {"squeezenet": 33.0, "bert": 25.0, "resnext50": 50.0,
                         "inception": 8.3, "nasrnn": 2.6, "nasnet": 0.7}


def taso_reference(label: str) -> float | None:
  """TASO's expansions/s for the model family `label` names, if TASO's table has it."""
  low = label.lower()
  for key, value in TASO_EXPANSIONS_PER_S.items():
    if key in low:
      return value
  return None


@dataclasses.dataclass(frozen=True)
class SearchSpeed:
  """One model's search timing (both calls search the same graph with the same settings)."""
  label: str
  nodes: int
  capacity: int
  rules: int
  expansions: int
  median_candidates: float
  buckets: tuple[int, ...]
  cold_seconds: float
  compile_seconds: float
  warm_seconds: float
  modelled_speedup: float
  rewrites: int
  fast_compile: bool = False  # the search's functions compiled for a fast compile (`plan`)

  @property
  def warm_expansions_per_s(self) -> float:
    return self.expansions / self.warm_seconds

  @property
  def taso_expansions_per_s(self) -> float | None:
    return taso_reference(self.label)


def time_search(label: str, graph: layout.Graph, params: ParamStore, *, method: str = "taso",
                coeffs: cost_model.CostCoefficients | None = None,
                ruleset: RuleSet | None = None, kernels: KernelTimes | None = None,
                **options: Any) -> SearchSpeed:
  """Runs `method` twice on `graph` with a fresh Expander of `ruleset` (default
  `default_ruleset(graph)`) and `kernels` (a measured kernel table; None: the roofline): the
  first call compiles (and measures kernels new to the table), the second is warm. Both must
  find the same graph (the search is deterministic); a difference raises AssertionError."""
  coeffs = coeffs if coeffs is not None else calibrate.coefficients()
  ruleset = ruleset if ruleset is not None else default_ruleset(graph)
  expander = Expander(ruleset, coeffs, kernels)
  t = time.perf_counter()
  cold = optimize(graph, params, method, expander=expander, **options)
  cold_s = time.perf_counter() - t
  compile_s = expander.stats.compile_seconds
  expander.stats.reset()
  t = time.perf_counter()
  warm = optimize(graph, params, method, expander=expander, **options)
  warm_s = time.perf_counter() - t
  assert [s.to_json() for s in warm.rewrites] == [s.to_json() for s in cold.rewrites], \
      "a deterministic search found different graphs in two calls"
  return SearchSpeed(
      label=label, nodes=graph_host.num_nodes(graph), capacity=layout.capacity(graph),
      rules=len(ruleset), expansions=warm.graphs_expanded,
      median_candidates=float(np.median(expander.stats.candidates)),
      buckets=tuple(sorted(expander.stats.buckets)), cold_seconds=cold_s,
      compile_seconds=compile_s, warm_seconds=warm_s,
      modelled_speedup=warm.modelled_speedup, rewrites=len(warm.rewrites),
      fast_compile=bool(warm.options.get("fast_compile", False)))


def markdown(rows: list[SearchSpeed]) -> str:
  """A markdown table of `rows`."""
  out = ["| model | nodes | capacity | rules | expansions | valid candidates (median) | "
         "buckets | cold (s) | of which compile (s) | warm (s) | warm expansions/s | "
         "TASO expansions/s | modelled speedup | rewrites | code |",
         "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
  for r in rows:
    taso = r.taso_expansions_per_s
    out.append(
        f"| {r.label} | {r.nodes} | {r.capacity} | {r.rules} | {r.expansions} | "
        f"{r.median_candidates:.0f} | {','.join(map(str, r.buckets))} | {r.cold_seconds:.1f} | "
        f"{r.compile_seconds:.1f} | {r.warm_seconds:.2f} | {r.warm_expansions_per_s:.1f} | "
        f"{taso if taso is not None else '-'} | {r.modelled_speedup:.4f} | {r.rewrites} | "
        f"{'fast compile' if r.fast_compile else 'fastest'} |")
  return "\n".join(out)
