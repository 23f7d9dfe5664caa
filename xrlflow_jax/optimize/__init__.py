"""The main job: optimise a model's graph end to end and write the result with its evidence.

    report = optimize_model("squeezenet1_1", size="tiny", method="greedy", output_dir="/tmp/o")
    report = optimize_model("../shared/models/squeezenet1_1.onnx", method="ppo")
    print(report.table())

Pipeline (`optimize_model`, its settings one frozen `OptimizeOptions`):

  0. check      every setting (`OptimizeOptions.checked`, `check_request`) and, once loaded,
                memory (`check_memory`): one clear error before any work.
  1. load       a zoo model or an ONNX file (`workflow.load`; graph-only files get seeded random
                weights, which the report says), at `workflow.fitted_capacity`.
  2. search     "greedy" | "taso" | "beam" | "random": `search.optimize` on the cost model;
                "ppo": a short PPO training run (`xrlflow_jax/configs/ppo.py:test` settings, the
                budget in updates), then the trained policy as a search driver
                (`search.optimize(..., "policy")`); the better graph by modelled cost of the
                policy's and the best one training itself met is kept, either with its
                recorded rewrite sequence (training records the episode's rewrites; they are
                replayed and checked before the graph is kept).
  3. guard      the search's measured guard (`search.guard.measured_guard`): the input, the
                result, its checkpoint prefixes (and an `against` file) compiled by XLA and
                timed side by side with an identical copy of the input (interleaved rounds:
                median and IQR); the result is returned only when measured significantly
                faster. The timed executables run on the same random inputs: every output of
                every rewritten graph must agree with the input's (max |a - b| / (1 + |a|) <=
                tolerance) or `NumericsError` is raised and nothing is written.
  4. write      into the output directory: optimized.onnx (ONNX inputs), rewrites.json,
                best_graph.txt, graph.png (when matplotlib or graphviz is present), and last
                report.json.

Modules: `options` (OptimizeOptions), `checks` (every setting refused up front), `methods`
(the searches and the PPO run), `report` (OptimizeReport and the output files), `pipeline`
(`optimize_model`). Their public names are re-exported here.
"""

from xrlflow_jax.measure import (DEFAULT_TOLERANCE, NumericsCheck, NumericsError,
                                 check_numerics)
from xrlflow_jax.optimize.checks import (MEMORY_SHARE, METHODS, OptimizeError, check_memory,
                                         check_output_dir, check_request, check_shape,
                                         device_memory_bytes, memory_need, parse_input_shape,
                                         parse_input_shapes)
from xrlflow_jax.optimize.methods import (BUDGET_OPTION, default_ppo_rules, ppo_config,
                                          rules_match, ruleset_for_replay, run_ppo, run_search,
                                          search_details, training_rewrites)
from xrlflow_jax.optimize.jax_function import OptimizedFunction, optimize_jax
from xrlflow_jax.optimize.options import DEFAULT_LOOKS, DEFAULT_REPEATS, OptimizeOptions
from xrlflow_jax.optimize.pipeline import DEFAULT_MODEL, load_source, optimize_model
from xrlflow_jax.optimize.report import OptimizeReport, default_output_dir, write_outputs
from xrlflow_jax.workflow import SIZES, Loaded, fit_capacity

__all__ = [
    "BUDGET_OPTION", "DEFAULT_LOOKS", "DEFAULT_MODEL", "DEFAULT_REPEATS", "DEFAULT_TOLERANCE",
    "Loaded", "MEMORY_SHARE", "METHODS", "NumericsCheck", "NumericsError", "OptimizeError",
    "OptimizeOptions", "OptimizeReport", "OptimizedFunction", "SIZES",
    "check_memory", "check_numerics", "check_output_dir", "check_request", "check_shape",
    "default_output_dir", "default_ppo_rules", "device_memory_bytes", "fit_capacity",
    "load_source", "memory_need", "optimize_jax", "optimize_model", "parse_input_shape",
    "parse_input_shapes", "ppo_config", "rules_match", "ruleset_for_replay", "run_ppo",
    "run_search", "search_details", "training_rewrites", "write_outputs",
]
