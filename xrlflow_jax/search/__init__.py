"""Search drivers over the same rules and cost model as the RL environment.

Final API (stable; the optimise job in `xrlflow_jax/optimize/` and the experiments use it):

  optimize(graph, params, method="taso", ruleset=None, coeffs=None, *, expander=None,
           measure=False, seed=0, measure_options=None, **options) -> SearchResult
      method in METHODS = ("greedy", "taso", "beam", "random", "policy"); ruleset None: the
      built-in rules that can fire on the graph (64 locations, `default_ruleset(graph)`); coeffs None: `cost.load_coefficients()`. Options per method:
        greedy:  max_steps=100
        taso:    budget=200, alpha=1.05, max_children=None, max_queue=10_000, saturate=True
        beam:    beam_width=8, steps=20
        random:  num_rollouts=16, steps=20
        policy:  agent, network_params (params or a RunnerState), env=None, steps=None,
                 num_samples=8, seed_index=None  (the ruleset is the agent's)
      measure_options: passed to `measure.compare` (rounds, repeats_per_round, warmup,
        backend, seed); the guard keeps the graph found only when measured "faster".

  greedy(graph, params, expander, *, max_steps, measure, seed, measure_options) -> SearchResult
  taso(graph, params, expander, *, budget, alpha, max_children, max_queue, ...) -> SearchResult
  beam(graph, params, expander, *, beam_width, steps, ...) -> SearchResult
  random_search(graph, params, expander, *, num_rollouts, steps, seed, ...) -> SearchResult
  policy(graph, params, expander, *, agent, network_params, env, steps, num_samples, ...)

  Expander(ruleset, coeffs): jitted, compiled once per (ruleset, capacity, bucket size):
    costs(graph) -> Expansion(valid bool[A], cost float32[A], nodes int32[R, L, P]),
      A = R * L, action = rule * L + location
    expand(graph, ids=None) -> (Expansion, Children: the candidates' identity hashes, each
      rebuilt on demand with `child(i)` -> (graph, node identities)); identities(graph)
    apply(graph, action) -> graph;  apply_at(graph, rule, nodes) -> (graph, applied)
    cost(graph) -> float32[]
  replay(graph, ruleset, rewrites) -> graph      (re-applies a SearchResult's rewrites)
  policy_params(agent, params_or_runner_state, seed_index=None, expected=None) -> params
  init_network(agent, expander, graph, key, env=None) -> untrained network params

  SearchResult fields: method, input_graph, best_graph, rewrites (list[RewriteStep: rule,
    rule_index, location, nodes]), initial_cost_ms, best_cost_ms, input_latency, best_latency
    (LatencyStats | None), seconds, graphs_expanded, candidates_costed, returned_input,
    found_cost_ms, found_rewrites, options; properties speedup, modelled_speedup,
    measured_speedup; to_json(), summary().
  SearchError(XrlflowError): unknown method, bad options, no room in the graph's capacity, ...

Every driver ends with the guard (`guard.finish`): with measure=True the input, the best graph
and up to two prefixes of its path (where the rule family changes, `measure.guard.checkpoint_lengths`)
are compiled and timed side by side (interleaved, one process, with an identical copy as
control) and the fastest of them measured significantly faster is returned, else the input;
with measure=False the input is returned unless the best's modelled cost is lower.
"""

from xrlflow_jax.search.result import (BASELINES, JOB_METHODS, METHODS, Checkpoint, RewriteStep,
                                       SearchError, SearchResult)
from xrlflow_jax.search import expand
from xrlflow_jax.search.expand import (Children, Expander, Expansion, bucket_size, check_graph,
                                      replay)
from xrlflow_jax.search.guard import finish, measured_guard
from xrlflow_jax.search.progress import Progress
from xrlflow_jax.search.greedy import greedy
from xrlflow_jax.search.taso_style import taso
from xrlflow_jax.search.beam import beam
from xrlflow_jax.search.random_search import random_search
from xrlflow_jax.search.policy import network_params_of as policy_params
from xrlflow_jax.search.policy import init_network, policy
from xrlflow_jax.search.api import default_ruleset, get_expander, is_default, optimize
from xrlflow_jax.search.kernel_fill import DEFAULT_KERNEL_BUDGET, fill_kernel_table

__all__ = [
    "BASELINES", "DEFAULT_KERNEL_BUDGET", "JOB_METHODS", "METHODS", "Checkpoint", "Children", "Expander", "Expansion", "bucket_size", "RewriteStep", "SearchError", "SearchResult", "beam",
    "check_graph", "default_ruleset", "fill_kernel_table", "finish", "get_expander", "greedy", "init_network", "is_default",
    "measured_guard", "optimize", "policy", "Progress", "policy_params", "random_search", "replay", "taso",
]
