"""`optimize`: one entry point for every search method."""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable

from xrlflow_jax import compilation_cache
from xrlflow_jax.cost import calibrate
from xrlflow_jax.cost import model as cost_model
from xrlflow_jax.cost.kernel_table import KernelTimes
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.measure import check_settings, compare
from xrlflow_jax.rules.compile import DEFAULT_MAX_LOCATIONS
from xrlflow_jax.rules.library import builtin_rules
from xrlflow_jax.rules.ruleset import RuleSet, graph_op_codes, rules_that_can_fire
from xrlflow_jax.search.cache import IdentityCache
from xrlflow_jax.search.taso_style import taso
from xrlflow_jax.search.beam import beam
from xrlflow_jax.search.expand import Expander
from xrlflow_jax.search.greedy import greedy
from xrlflow_jax.search.policy import DEFAULT_STEPS as POLICY_STEPS, policy
from xrlflow_jax.search.random_search import random_search
from xrlflow_jax.search.result import METHODS, SearchError, SearchResult

DRIVERS: dict[str, Callable[..., SearchResult]] = {
    "greedy": greedy, "taso": taso, "beam": beam, "random": random_search, "policy": policy}
assert tuple(DRIVERS) == METHODS

_RULESETS: dict[tuple[str, ...], RuleSet] = {}
_MAX_RULESETS = 16
_EXPANDERS: IdentityCache[Expander] = IdentityCache(_MAX_RULESETS)


def default_ruleset(graph: layout.Graph | None = None) -> RuleSet:
  """The built-in rules, 64 locations each; with `graph`, only those that can fire on it
  (`rules.rules_that_can_fire` over its op codes: rules that cannot are not compiled). One
  RuleSet object per rule list in a process, so compiled Expanders are reused."""
  rules = builtin_rules()
  if graph is not None:
    # A RuleSet needs one rule; where none can fire, the first one finds nothing, cheaply.
    rules = rules_that_can_fire(rules, graph_op_codes([graph])) or rules[:1]
  key = tuple(r.name for r in rules)
  if key not in _RULESETS:
    if len(_RULESETS) >= _MAX_RULESETS:
      _RULESETS.pop(next(iter(_RULESETS)))
    _RULESETS[key] = RuleSet(rules)
  return _RULESETS[key]


def is_default(ruleset: RuleSet) -> bool:
  """Whether `ruleset` is every built-in rule at the default locations (replayable as "all")."""
  return (ruleset.max_locations == DEFAULT_MAX_LOCATIONS
          and ruleset.names == [r.name for r in builtin_rules()])


def get_expander(ruleset: RuleSet, coeffs: cost_model.CostCoefficients,
                 kernels: KernelTimes | None = None) -> Expander:
  """The Expander of (ruleset, coeffs, kernels), cached: repeated searches reuse its compiled
  code."""
  return _EXPANDERS.get((ruleset, coeffs, kernels), lambda: Expander(ruleset, coeffs, kernels))


def expected_expansions(method: str, options: dict[str, Any]) -> int | None:
  """The most graphs `method` expands with `options` (its defaults where not given): taso's
  budget, greedy's max_steps, beam's steps x beam_width, random's num_rollouts x steps,
  policy's (1 + num_samples) x steps; None where unbounded or unknown."""
  params = inspect.signature(DRIVERS[method]).parameters
  get = lambda name: options.get(name, params[name].default if name in params else None)
  if method == "policy":  # 1 + num_samples rollouts of `steps` (default: the env's horizon)
    env = options.get("env")
    steps = get("steps") or (env.horizon if env is not None else POLICY_STEPS)
    return (1 + int(get("num_samples"))) * int(steps)
  counts = {"taso": ("budget",), "greedy": ("max_steps",), "beam": ("steps", "beam_width"),
            "random": ("num_rollouts", "steps")}[method]
  values = [get(name) for name in counts]
  if any(v is None for v in values):
    return None
  return math.prod(int(v) for v in values)


def optimize(graph: layout.Graph, params: ParamStore, method: str = "taso",
             ruleset: RuleSet | None = None, coeffs: cost_model.CostCoefficients | None = None,
             *, expander: Expander | None = None, kernels: KernelTimes | None = None,
             measure: bool = False, seed: int = 0,
             measure_options: dict[str, Any] | None = None, fast_compile: bool | None = None,
             **options: Any) -> SearchResult:
  """Searches for a faster graph with `method` and returns a guarded SearchResult.

  Args:
    graph: one graph of capacity N (with room for the rules' new nodes).
    params: its weights (the guard measures and validates with them).
    method: "greedy", "taso", "beam", "random" or "policy".
    ruleset: the rules (default: the built-in rules that can fire on `graph`,
      `default_ruleset(graph)`; for "policy", the agent's).
    coeffs: cost-model coefficients (default: this device's, `cost.calibrate.coefficients()`:
      the shipped fit, or a calibration made on first use).
    expander: a compiled Expander to reuse (overrides ruleset, coeffs and kernels).
    kernels: measured kernel times (`cost.KernelTimes`): MatMuls and convolutions cost what
      they measure on this device (new ones are measured as the search meets them), timed as
      `graph`'s weights are read (`KernelTimes.use_for`: a call at a time where each weight
      is read once); None: the model's roofline. The result's options record the table's
      size, the time spent measuring (`kernel_seconds`) and the timing (`kernels_streamed`).
    measure: time the input and the best graph side by side and return the input unless the
      best is measured significantly faster (`measure.compare`; else the guard uses the
      modelled cost).
    The result's options record `compile_seconds` (calls that traced: compiling, or loading
    from JAX's persistent compilation cache, which this turns on: `compilation_cache.enable`)
    and the number of `rules`.
    seed: PRNG seed (random and policy). measure_options: keyword options of
      `measure.compare` (rounds, repeats_per_round, warmup, min_round_ms, backend, seed,
      precision), checked
      first.
    fast_compile: compile the search's functions for a fast compile rather than the fastest
      code (XLA:CPU only, `Expander.plan`); None: when the search expands at most
      `expand.FAST_COMPILE_MAX_EXPANSIONS` graphs (`expected_expansions`). Recorded in the
      result's options.
    **options: the method's settings (see the package docstring), e.g. budget=, alpha= (taso),
      beam_width=, steps= (beam), agent=, network_params= (policy).
  Raises:
    SearchError: an unknown method or option, or a graph with no room to rewrite.
    MeasurementError: measure_options that cannot give a verdict (before any search).
  """
  if method not in DRIVERS:
    raise SearchError(f"unknown search method {method!r}; choose one of {list(METHODS)}")
  driver = DRIVERS[method]
  allowed = [p for p, v in inspect.signature(driver).parameters.items()
             if v.kind is inspect.Parameter.KEYWORD_ONLY]
  unknown = sorted(set(options) - set(allowed))
  if unknown:
    raise SearchError(f"unknown option(s) {unknown} for method {method!r}; it takes "
                      f"{sorted(set(allowed) - {'measure', 'seed', 'measure_options'})}")
  if measure:
    _check_measure_options(measure_options or {})
  if expander is None:
    if method == "policy":
      agent = options.get("agent")
      if agent is None:
        raise SearchError("method 'policy' needs agent= (and network_params=)")
      ruleset = agent.ruleset
    ruleset = ruleset if ruleset is not None else default_ruleset(graph)
    coeffs = coeffs if coeffs is not None else calibrate.coefficients()
    expander = get_expander(ruleset, coeffs, kernels)
  if method == "policy":
    missing = [k for k in ("agent", "network_params") if options.get(k) is None]
    if missing:
      raise SearchError(f"method 'policy' needs {' and '.join(m + '=' for m in missing)}")
  if expander.kernels is not None:
    expander.kernels.use_for(graph)  # the kernel timing that fits the graph's weights
  compilation_cache.enable()
  expander.plan(expected_expansions(method, options), fast_compile=fast_compile)
  expander.prepare(graph)  # compiles in the background while the driver starts
  compiled_before = expander.stats.compile_seconds
  kernel_before = expander.stats.kernel_seconds
  try:
    result = driver(graph, params, expander, measure=measure, seed=seed,
                    measure_options=measure_options, **options)
  finally:
    expander.drain()
  result.options["compile_seconds"] = expander.stats.compile_seconds - compiled_before
  result.options["rules"] = len(expander.ruleset)
  result.options["fast_compile"] = expander.fast_compile
  if expander.kernels is not None:
    result.options["kernel_seconds"] = expander.stats.kernel_seconds - kernel_before
    result.options["kernels"] = len(expander.kernels)
    result.options["kernels_measured"] = expander.kernels.measured
    result.options["kernels_streamed"] = expander.kernels.streamed
  return result


def _check_measure_options(options: dict[str, Any]) -> None:
  """Unknown or invalid `measure.compare` options fail before the search runs."""
  allowed = [p for p, v in inspect.signature(compare).parameters.items()
             if v.kind is inspect.Parameter.KEYWORD_ONLY and p not in ("tolerance", "level")]
  unknown = sorted(set(options) - set(allowed))
  if unknown:
    raise SearchError(f"unknown measure option(s) {unknown}; measure.compare takes {allowed}")
  defaults = {p: inspect.signature(compare).parameters[p].default
              for p in ("rounds", "repeats_per_round", "warmup", "min_round_ms")}
  check_settings(*(options.get(p, d) for p, d in defaults.items()))
