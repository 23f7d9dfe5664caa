"""`optimize`: one entry point for every search method."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from xrlflow_jax.cost import model as cost_model
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.rules.ruleset import RuleSet
from xrlflow_jax.search.backtracking import taso
from xrlflow_jax.search.beam import beam
from xrlflow_jax.search.expand import Expander
from xrlflow_jax.search.greedy import greedy
from xrlflow_jax.search.policy import policy
from xrlflow_jax.search.random_search import random_search
from xrlflow_jax.search.result import METHODS, SearchError, SearchResult

DRIVERS: dict[str, Callable[..., SearchResult]] = {
    "greedy": greedy, "taso": taso, "beam": beam, "random": random_search, "policy": policy}
assert tuple(DRIVERS) == METHODS

_DEFAULT_RULESET: list[RuleSet] = []
_EXPANDERS: dict[tuple[int, int], tuple[RuleSet, Any, Expander]] = {}


def default_ruleset() -> RuleSet:
  """Every built-in rule, 64 locations each (built once per process)."""
  if not _DEFAULT_RULESET:
    from xrlflow_jax.rules.library import builtin_rules  # pylint: disable=g-import-not-at-top
    _DEFAULT_RULESET.append(RuleSet(builtin_rules()))
  return _DEFAULT_RULESET[0]


def get_expander(ruleset: RuleSet, coeffs: cost_model.CostCoefficients) -> Expander:
  """The Expander of (ruleset, coeffs), cached: repeated searches reuse its compiled code."""
  key = (id(ruleset), id(coeffs))
  hit = _EXPANDERS.get(key)
  if hit is None or hit[0] is not ruleset or hit[1] is not coeffs:
    hit = (ruleset, coeffs, Expander(ruleset, coeffs))
    _EXPANDERS[key] = hit
  return hit[2]


def optimize(graph: layout.Graph, params: ParamStore, method: str = "taso",
             ruleset: RuleSet | None = None, coeffs: cost_model.CostCoefficients | None = None,
             *, expander: Expander | None = None, measure: bool = False, seed: int = 0,
             measure_options: dict[str, Any] | None = None, **options: Any) -> SearchResult:
  """Searches for a faster graph with `method` and returns a guarded SearchResult.

  Args:
    graph: one graph of capacity N (with room for the rules' new nodes).
    params: its weights (the guard measures and validates with them).
    method: "greedy", "taso", "beam", "random" or "policy".
    ruleset: the rules (default: every built-in rule; for "policy", the agent's).
    coeffs: cost-model coefficients (default: `cost.load_coefficients()` for this device).
    expander: a compiled Expander to reuse (overrides ruleset and coeffs).
    measure: time the input and the best graph side by side and return the input unless the
      best is measurably faster (else the guard uses the modelled cost).
    seed: PRNG seed (random and policy). measure_options: see `guard.measure_pair`.
    **options: the method's settings (see the package docstring), e.g. budget=, alpha= (taso),
      beam_width=, steps= (beam), agent=, network_params= (policy).
  Raises:
    SearchError: an unknown method or option, or a graph with no room to rewrite.
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
  if expander is None:
    if method == "policy":
      agent = options.get("agent")
      if agent is None:
        raise SearchError("method 'policy' needs agent= (and network_params=)")
      ruleset = agent.ruleset
    ruleset = ruleset if ruleset is not None else default_ruleset()
    coeffs = coeffs if coeffs is not None else cost_model.load_coefficients()
    expander = get_expander(ruleset, coeffs)
  if method == "policy":
    missing = [k for k in ("agent", "network_params") if options.get(k) is None]
    if missing:
      raise SearchError(f"method 'policy' needs {' and '.join(m + '=' for m in missing)}")
  return driver(graph, params, expander, measure=measure, seed=seed,
                measure_options=measure_options, **options)
