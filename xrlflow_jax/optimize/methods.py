"""The optimise job's searches: a baseline search driver, or a short PPO run followed by the
trained policy as a search driver; each returns the `search.SearchResult` of its modelled
guard (graph, modelled cost, replayable rewrites, the prefixes the measured guard is to time)
with the job's details."""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from xrlflow_jax import cost, search, workflow
from xrlflow_jax import graph as G
from xrlflow_jax.agents import training
from xrlflow_jax.configs import ppo as ppo_configs
from xrlflow_jax.graph import layout
from xrlflow_jax.optimize.checks import OptimizeError
from xrlflow_jax.rules import RuleSet
from xrlflow_jax.rules.library import builtin_rules
from xrlflow_jax.search import guard as guard_lib
from xrlflow_jax.measure.guard import DEFAULT_CHECKPOINTS
from xrlflow_jax.workflow import Loaded

# What `budget` means for each search method (the option of `search.optimize` it sets).
BUDGET_OPTION = {"greedy": "max_steps", "taso": "budget", "beam": "steps", "random": "steps"}


# What the job says of a search beside its own figures (`search_details`).
_SEARCH_FIELDS = ("seconds", "graphs_expanded", "candidates_costed", "returned_input",
                  "found_cost_ms", "found_rewrites", "options")


def search_details(result: search.SearchResult) -> dict[str, Any]:
  """The search's own figures for report.json (a subset of `SearchResult.to_json`)."""
  data = result.to_json()
  return {k: data[k] for k in _SEARCH_FIELDS}


def run_search(loaded: Loaded, method: str, coeffs: cost.CostCoefficients, *, seed: int = 0,
               rules: Sequence[str] | None = None, max_locations: int = 16,
               options: Mapping[str, Any] | None = None,
               kernels: cost.KernelTimes | None = None,
               checkpoints: int = DEFAULT_CHECKPOINTS
               ) -> tuple[search.SearchResult, dict[str, Any]]:
  """A baseline search ("greedy", "taso", "beam", "random") on the cost model (with `kernels`,
  its measured kernel table), over the rules of the selection `rules` (default: every built-in
  rule) that can fire on the graph: rules whose source ops cannot occur are not compiled
  (`rules.rules_that_can_fire`). Returns (the result of its modelled guard, carrying up to
  `checkpoints` prefixes of its path for the measured guard, `search.guard.checkpoint_lengths`;
  the job's details: the rules and their selection)."""
  if rules:
    selected = _ruleset(rules, max_locations)
    ruleset = workflow.that_can_fire(selected, [loaded.graph])
    kept = f"{len(ruleset)} of the {len(selected)} selected rules can fire on this graph"
  else:
    ruleset = search.default_ruleset(loaded.graph)
    kept = f"{len(ruleset)} of {len(builtin_rules())} built-in rules can fire on this graph"
  result = search.optimize(loaded.graph, loaded.params, method, ruleset, coeffs, measure=False,
                           seed=seed, kernels=kernels, **dict(options or {}))
  details = {**search_details(result),
             **_ruleset_details(ruleset, rules or (), default=search.is_default(ruleset)),
             "rules_kept": kept}
  if checkpoints and not result.returned_input:
    result.checkpoints = guard_lib.checkpoint_prefixes(
        search.get_expander(ruleset, coeffs, kernels), loaded.graph, list(result.rewrites),
        result.initial_cost_ms, checkpoints)
  return result, details


def _ruleset_details(ruleset: Any, selection: Sequence[str] = (), default: bool = False
                     ) -> dict[str, Any]:
  """What replaying needs to rebuild the rule set: rule names (["all"] for the search's
  default, every built-in rule), locations per rule, and the TASO rule file when TASO's rules
  are among them; `selection` is what was asked for (report only)."""
  out: dict[str, Any] = {"rules": ["all"] if default else list(ruleset.names),
                         "max_locations": int(ruleset.max_locations),
                         "rule_selection": list(selection) or ["builtin"]}
  if any(r.family == "taso" for r in ruleset.rules):
    out["taso_file"] = workflow.taso_file(selection)
  return out


def ruleset_for_replay(rewrites_json: Mapping[str, Any]):
  """The RuleSet a rewrites.json was found with (for `search.replay`)."""
  if rewrites_json.get("rules") in (None, ["all"]):
    return search.default_ruleset()
  return _ruleset(rewrites_json["rules"], int(rewrites_json["max_locations"]),
                  rewrites_json.get("taso_file"))


def _ruleset(names: Sequence[str], max_locations: int, taso_file: str | None = None):
  """`workflow.ruleset` (one cached object per selection, so the search's compiled Expander is
  reused by later calls); a bad selection: OptimizeError listing what exists."""
  try:
    return workflow.ruleset(names, max_locations, taso_file_path=taso_file)
  except workflow.RuleSelectionError as e:
    raise OptimizeError(str(e)) from None


def ppo_config(budget: int | None = None, seed: int = 0, rules: Sequence[str] | None = None):
  """The short-run PPO config: `configs.ppo.get_config("job")` with `budget` updates."""
  c = ppo_configs.get_config("job")
  if budget:
    c.ppo.total_timesteps = int(c.ppo.num_envs) * int(c.ppo.num_steps) * int(budget)
  if rules:
    c.env.rules = tuple(rules)
  c.seed = seed
  return c


def rules_match(graph: layout.Graph, names: Sequence[str], max_locations: int) -> bool:
  """Whether any of the rules `names` applies somewhere in `graph` (one jitted match)."""
  ruleset = _ruleset(names, max_locations)
  g = jax.tree_util.tree_map(jax.numpy.asarray, graph)
  return bool(np.asarray(jax.jit(ruleset.match)(g).mask).any())


def default_ppo_rules(graph: layout.Graph, max_locations: int) -> tuple[str, ...]:
  """The rule set PPO trains with when none is given: the first of `configs.ppo.JOB_RULES`
  that applies somewhere in `graph` (the MatMul merges with the transposed layout, NasRNN's
  merge-after-a-loss situation; the five conv rules, SqueezeNet's enlarge-then-merge), else
  the default config's wider set, else every built-in rule. OptimizeError when no rule
  applies at all."""
  for names in (*ppo_configs.JOB_RULES, ppo_configs.DEFAULT_RULES, ("all",)):
    if rules_match(graph, names, max_locations):
      return tuple(names)
  raise OptimizeError("no built-in rule applies anywhere in this graph; nothing to optimise")


def run_ppo(loaded: Loaded, coeffs: cost.CostCoefficients, *, budget: int | None = None,
            seed: int = 0, rules: Sequence[str] | None = None,
            options: Mapping[str, Any] | None = None,
            kernels: cost.KernelTimes | None = None,
            checkpoints: int = DEFAULT_CHECKPOINTS,
            log: Callable[[str], None] = print
            ) -> tuple[search.SearchResult, dict[str, Any]]:
  """Short PPO training (`agents.training.train_ppo`; with `kernels`, its environment costs
  with the measured kernel table, as the searches do), then the policy as a search driver; the
  better graph by modelled cost of the policy's result and the best graph training met (ties go
  to the policy, whose rewrite sequence is known), both costed by the search's model (with
  `kernels`, training measures the kernels of the graphs it holds as it meets them, so its
  environment's cost of its best graph is that model's: details `train_env_cost_ms` beside
  `train_best_cost_ms`). Returns (the result, method "policy" or "training", carrying for
  the measured guard up to `checkpoints` prefixes of its path and the other of the two graphs
  where it differs and is modelled cheaper than the input (`search.Checkpoint.path`); the
  job's details: training's figures and the policy's search), as `run_search`'s."""
  started = time.perf_counter()
  config = ppo_config(budget, seed, rules)
  if not rules:
    config.env.rules = default_ppo_rules(loaded.graph, int(config.env.max_locations))
  ruleset = _ruleset(config.env.rules, int(config.env.max_locations))
  if kernels is not None:
    kernels.use_for(loaded.graph)  # training's environment costs with the same timing
    search.fill_kernel_table([loaded.graph], [loaded.params], ruleset, coeffs, kernels,
                             log=lambda s: log("  " + s))
  # With `kernels`, training measures what its table lacks as it meets it, so its best graph
  # is costed as the search's model costs it.
  trained = training.train_ppo([loaded.label], [loaded.graph], [loaded.params], config, coeffs,
                               ruleset, log=lambda s: log("  " + s),
                               updates_per_chunk=int(config.updates_per_chunk),
                               kernels=kernels, started=started, devices=jax.devices()[:1])
  state = trained.state
  expander = search.get_expander(ruleset, coeffs, kernels)
  train_graph, env_cost = trained.best(0)
  train_graph = layout.to_host(train_graph)
  train_cost = float(expander.cost(train_graph))
  details: dict[str, Any] = {"train_seconds": trained.seconds,
                             "train_updates": int(np.asarray(state.update)),
                             "train_best_cost_ms": train_cost,
                             "train_env_cost_ms": env_cost,
                             "train_kernels_added": trained.kernels_added,
                             "train_cost_model": trained.costs_with,
                             "train_seed": trained.seed,
                             "train_restart_ratios": list(trained.restart_ratios),
                             **_ruleset_details(ruleset, config.env.rules)}
  policy = search.optimize(loaded.graph, loaded.params, "policy", expander=expander, seed=seed,
                           measure=False, **_policy_options(trained, options))
  found = policy
  log(f"  policy: modelled cost {found.initial_cost_ms:.4f} -> {found.best_cost_ms:.4f} ms with "
      f"{len(found.rewrites)} rewrites; training's best {train_cost:.4f} ms")
  details.update({"policy_cost_ms": found.best_cost_ms, "policy": search_details(found)})
  training_path = None  # training's best as a result, when it improves on the input
  if train_cost < found.initial_cost_ms * (1.0 - 1e-6):
    steps = training_rewrites(loaded.graph, expander, state, train_graph)
    if steps is None:  # cannot happen unless replay and the environment disagree: say so
      details["training_replay"] = "mismatch: the policy's graph is returned instead"
      log("  training's best graph does not replay from its recorded rewrites; the policy's "
          "graph is returned")
    else:
      path = [search.RewriteStep.from_json(s) for s in steps]
      training_path = search.SearchResult(
          "training", found.input_graph, train_graph, path, found.initial_cost_ms, train_cost,
          found_cost_ms=train_cost, found_rewrites=len(path))
      details["training_rewrites"] = len(steps)
  other = None  # the graph of the two not returned, timed beside it by the measured guard
  if training_path is not None:
    if train_cost < found.best_cost_ms * (1.0 - 1e-6):
      found, other = training_path, found
    else:
      other = training_path
  greedy = search.optimize(loaded.graph, loaded.params, "greedy", expander=expander,
                           seed=seed, measure=False)
  details.update({"greedy_cost_ms": greedy.best_cost_ms, "greedy_rewrites": len(greedy.rewrites)})
  log(f"  {_versus_greedy(found, greedy)}")
  if checkpoints and found.rewrites and found.best_cost_ms < found.initial_cost_ms:
    found.checkpoints = guard_lib.checkpoint_prefixes(expander, loaded.graph, found.rewrites,
                                                      found.initial_cost_ms, checkpoints)
    # The cost model can rank the two graphs otherwise than XLA does (tiny NasRNN: 12 merges
    # modelled 3% below 13 measured 2-3x slower), so the guard times the other one too.
    # Either graph with rewrites is modelled below the input (the policy's modelled guard;
    # training's path is built only then).
    if (other is not None and other.rewrites
        and G.structural_hash(other.best_graph) != G.structural_hash(found.best_graph)):
      found.checkpoints.append(search.Checkpoint.of_path(
          other.rewrites, layout.to_host(other.best_graph), other.best_cost_ms, other.method))
  return found, details


def _versus_greedy(found: search.SearchResult, greedy: search.SearchResult) -> str:
  """How the agent's graph compares with the greedy search's on the same rules (modelled)."""
  agent = found.initial_cost_ms / found.best_cost_ms
  line = (f"greedy on the same rules: modelled x{found.initial_cost_ms / greedy.best_cost_ms:.3f} "
          f"with {len(greedy.rewrites)} rewrites; the agent's x{agent:.3f} with "
          f"{len(found.rewrites)}")
  if not greedy.rewrites and found.rewrites:
    line += " (no single rewrite lowers the input's modelled cost, so greedy stops there)"
  return line


def training_rewrites(graph: layout.Graph, replayer: RuleSet | search.Expander, state: Any,
                      best_graph: layout.Graph, index: int = 0) -> list[dict[str, Any]] | None:
  """The recorded rewrites of the best graph training met for pool graph `index` (the rows of
  `RunnerState.best_rewrites`), as JSON-ready `search.RewriteStep`s, checked by replaying them
  onto `graph` with `replayer` (as `search.replay`: the training's RuleSet, or the search's
  Expander over it, whose compiled edit is then reused): None when the replay does not
  rebuild `best_graph` (same structural hash)."""
  ruleset = replayer.ruleset if isinstance(replayer, search.Expander) else replayer
  count = int(np.asarray(state.best_num_rewrites)[index])
  rows = np.asarray(state.best_rewrites)[index][:count]
  steps = [search.RewriteStep(ruleset.names[int(r[0])], int(r[0]), int(r[1]),
                              tuple(int(v) for v in r[2:])) for r in rows]
  try:
    replayed = search.replay(graph, replayer, steps)
  except search.SearchError:
    return None
  if G.structural_hash(replayed) != G.structural_hash(best_graph):
    return None
  return [s.to_json() for s in steps]


def _policy_options(trained: training.TrainedPolicy, options: Mapping[str, Any] | None
                    ) -> dict[str, Any]:
  """Keyword arguments that hand the trained agent to the policy driver."""
  opts = dict(options or {})
  opts.setdefault("agent", trained.run.agent)
  opts.setdefault("network_params", trained.state.params)
  opts.setdefault("env", trained.run.env)
  return opts
