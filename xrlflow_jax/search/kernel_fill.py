"""Filling a measured kernel table before training: the kernels of every graph a TASO-style
search meets from the training graphs, so that the environment (jitted, unable to measure)
costs what the searches and the measured guard are judged by."""

from __future__ import annotations

import time
from typing import Callable, Sequence

from xrlflow_jax import cost
from xrlflow_jax.graph import Graph, ParamStore
from xrlflow_jax.rules.ruleset import RuleSet
from xrlflow_jax.search.api import optimize

# Graphs a TASO-style search expands from each training graph to fill the kernel table.
DEFAULT_KERNEL_BUDGET = 200


def fill_kernel_table(graphs: Sequence[Graph], params: Sequence[ParamStore], ruleset: RuleSet,
                      coeffs: cost.CostCoefficients, kernels: cost.KernelTimes,
                      budget: int = DEFAULT_KERNEL_BUDGET,
                      log: Callable[[str], None] | None = None) -> cost.KernelTable:
  """The kernel table a training environment costs with: the kernels of every graph a
  TASO-style search of `budget` expansions meets from each of `graphs` (the search measures
  the ones `kernels` lacks); budget 0: the graphs' own kernels only (for a caller whose own
  search from these graphs has filled `kernels` already). Kernels an episode meets beyond
  those keep the roofline's estimate inside the jitted environment, which cannot measure
  them."""
  before = len(kernels)
  t0 = time.perf_counter()
  for g, p in zip(graphs, params):
    if budget > 0:
      optimize(g, p, "taso", ruleset, coeffs, measure=False, kernels=kernels, budget=budget)
    else:
      kernels.add(g)
  if log:
    how = (f"a TASO-style search of budget {budget} per graph" if budget > 0
           else "the training graphs themselves")
    log(f"kernel table for training: {len(kernels)} kernels ({len(kernels) - before} added by "
        f"{how}, {time.perf_counter() - t0:.0f}s)")
  return kernels.table()
