"""xrlflow_jax: a JAX-native tensor-graph superoptimiser in the line of X-RLflow.

Modules:
  ops        operators: codes, attributes, shape rules, JAX lowerings, FLOP counts
  graph      the padded jraph.GraphsTuple every part shares, its builder and helpers
  executor   lower a graph + parameters to a jitted JAX function
  models     the benchmark model zoo built in code
  onnx_io    ONNX import (static shapes, folding) and export
  jax_io     JAX functions in (their jaxpr as a graph) and out (a graph as a function)
  rules      the rule language, vectorised matcher/applier, built-in and TASO rules
  cost       XLA latency measurement, per-op profiler, jittable cost model
  env        the pure, jittable graph-rewrite environment
  errors     the project's exception types
  optimize   the main job: `optimize_model(model)`, `optimize_jax(fn, *example_args)` (both
             also here, imported on first use)
"""

from xrlflow_jax import errors, executor, graph, models, ops
from xrlflow_jax.executor import lower
from xrlflow_jax.graph import GraphBuilder, ParamStore

__version__ = "0.1.0"

__all__ = ["GraphBuilder", "ParamStore", "errors", "executor", "graph", "lower", "models", "ops",
           "optimize_jax", "optimize_model"]


def __getattr__(name: str):
  """`optimize_jax` and `optimize_model` without importing the whole job at `import xrlflow_jax`."""
  if name in ("optimize_jax", "optimize_model"):
    from xrlflow_jax import optimize  # pylint: disable=g-import-not-at-top
    return getattr(optimize, name)
  raise AttributeError(f"module 'xrlflow_jax' has no attribute {name!r}")
