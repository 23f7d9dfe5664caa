"""The cost model: the per-op profiler and the in-graph cost model calibrated to XLA-measured
latency (`xrlflow_jax.measure`, the ground truth of every speed claim, below this package).

  OpSignature, graph_signatures                          what an op's time depends on (signatures)
  Profiler                                               per-op timing, cached on disk (profiler)
  node_costs, graph_cost                                 jittable cost model (model)
  load_coefficients, save_coefficients                   coefficient files (coefficient_files)
  ModelCost                                              it as a function; candidates' costs
  bound_kernels                                          a traced table for every ModelCost
  KernelTimes, KernelTable                               measured MatMul/conv times (kernel_table)
  coefficients                                           this device's, calibrated on first use
  fit_coefficients, fit_from_profiles                    non-negative least squares (fit, scipy's)
The validation and rewrite-gain harnesses that use it live in `xrlflow_jax.harness`.
"""

from xrlflow_jax.cost import calibrate
from xrlflow_jax.cost.calibrate import coefficients
from xrlflow_jax.cost.coefficient_files import load_coefficients, save_coefficients
from xrlflow_jax.cost.fit import FitReport, fit_coefficients, fit_from_profiles
from xrlflow_jax.cost.incremental import ModelCost, bound_kernels
from xrlflow_jax.cost.kernel_table import KernelTimes
from xrlflow_jax.cost.model import (FEATURE_NAMES, CostCoefficients, CostModelError,
                                    KernelTable, graph_cost, graph_features, node_costs,
                                    node_features)
from xrlflow_jax.cost.profiler import GraphProfile, ProfileCache, Profiler
from xrlflow_jax.cost.signatures import OpSignature, ProfileError, graph_signatures

__all__ = [
    "CostCoefficients", "CostModelError", "FEATURE_NAMES", "FitReport", "GraphProfile",
    "KernelTable", "KernelTimes", "ModelCost", "OpSignature", "ProfileCache", "ProfileError",
    "Profiler", "bound_kernels", "calibrate", "coefficients", "fit_coefficients",
    "fit_from_profiles", "graph_cost", "graph_features", "graph_signatures", "load_coefficients",
    "node_costs", "node_features", "save_coefficients",
]
