"""The optimise job for a JAX function: `optimize_jax(fn, *example_args)` traces it to a padded
graph (`jax_io.trace`), optimises that graph with the job's searches and measured guard
(`optimize_model`), and returns the optimised graph as a jittable function of the same
signature (`jax_io.as_function`), checked against the function itself.

    fast, report = optimize_jax(functools.partial(model.apply, variables), x)
    y = jax.jit(fast)(x)                      # what model.apply(variables, x) computes
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from xrlflow_jax import jax_io
from xrlflow_jax import graph as G
from xrlflow_jax.measure import NumericsError, compare_outputs
from xrlflow_jax.optimize.options import OptimizeOptions
from xrlflow_jax.optimize.pipeline import optimize_model
from xrlflow_jax.optimize.report import OptimizeReport
from xrlflow_jax.workflow import Loaded, fit_capacity, fitted_capacity


class OptimizedFunction(NamedTuple):
  """`optimize_jax`'s result: the optimised function and the job's report."""
  function: Callable[..., Any]
  report: OptimizeReport


def optimize_jax(fn: Callable[..., Any], *example_args: Any,
                 options: OptimizeOptions | None = None, name: str | None = None,
                 log: Callable[[str], None] = print, **settings: Any) -> OptimizedFunction:
  """Optimises a JAX function at the example arguments' shapes.

  Arrays `fn` closes over are its weights (folded and merged by the rewrites where they
  pay); arrays passed as arguments stay arguments of the function returned. Defaults differ
  from the command line's where a function asks for it: `method="taso"` and `write=False`
  (give `output_dir` to write report.json, rewrites.json and best_graph.txt).

  Args:
    fn: a JAX-traceable function of arrays (pytrees of arrays).
    example_args: arguments of the shapes and dtypes to optimise for.
    options, settings: the job's settings (`OptimizeOptions` and its field names).
    name: the label in reports (default: the function's __name__).
  Returns:
    (the optimised function, the report). The function takes arguments of the example's
    pytree, shapes and dtypes, returns the result's pytree, and is jittable; its outputs on
    the example arguments are checked against `fn`'s (NumericsError otherwise).
  Raises:
    JaxImportError: a primitive the graph cannot express; OptimizeError: bad settings.
  """
  settings.setdefault("method", "taso")
  settings.setdefault("write", "output_dir" in settings)
  label = name or getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None),
                                                           "__name__", "jax_function")
  graph, params, signature = jax_io.trace(fn, *example_args, name=label)
  graph = fit_capacity(graph, fitted_capacity(G.num_nodes(graph)))
  loaded = Loaded(label, "jax", graph, params)
  report = optimize_model(loaded, options, log=log, **settings)
  fast = jax_io.as_function(report.graph, params, signature, precision=report.precision)
  want = jax.tree_util.tree_leaves(fn(*example_args))
  got = jax.tree_util.tree_leaves(fast(*example_args))
  check = compare_outputs([np.asarray(x) for x in want], [np.asarray(x) for x in got],
                          tolerance=float(report.numerics.tolerance))
  if not check.passed:
    raise NumericsError(f"the optimised function's outputs differ from {label}'s: "
                        f"{check.describe()}")
  return OptimizedFunction(fast, report)
