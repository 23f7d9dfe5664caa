r"""End-to-end benchmark: every method on every model, measured side by side.

    python -m experiments.benchmark --quick --output=/tmp/bench        # two tiny models, minutes
    python -m experiments.benchmark                                     # the zoo + ../shared/models
    python -m experiments.benchmark --models=bert,resnet50_keepbn --methods=greedy,taso,ppo \
        --taso_budget=500 --ppo_timesteps=51200

For each model (zoo names at --size, ONNX paths, or stems of ../shared/models files, which get
seeded random weights) it reports: the original graph's measured XLA latency; for each method
(greedy, taso, beam, random search, and PPO trained on that model alone for --ppo_timesteps
steps, then the trained policy's own rollouts: argmax + --ppo_samples sampled, the best kept) the modelled and measured latency and speedup, the
optimisation wall time (compiles included) and the rewrites applied; and the environment's
throughput (steps/s of a random valid-action policy, vmapped over --env_envs environments).

Every method uses the same rules (--rules; by default every built-in rule, as the optimise
job) and cost model; the searches keep --max_locations locations per rule (default the optimise
job's, 64), PPO's environment --ppo_max_locations (its action space; default 16). All graphs of a
model, original included, are compiled and timed interleaved in one process
(`measure.compare`: --rounds rounds of --repeats_per_round runs each, more for a fast graph so
that a round lasts --min_round_ms, in a fresh random order per round, with an identical copy of
the original as control; up to --looks such sets, another while some method's guard verdict
is "no change", as the optimise job's --latency_looks); each measured speedup comes with
its 95% bootstrap interval over every round timed and a verdict (faster / no change / slower /
unchanged), "guard returns" replays the optimise job's measured guard on the same rounds, and
each graph's outputs are compared with the original's. A method that fails, or whose outputs differ,
keeps its row with n/a and the reason in the note, and the binary exits 1 after writing the
tables (--allow_failures: exit 0).

Writes to --output: benchmark.md (machine/backend/date header and the table) and benchmark.csv,
both rewritten after every model (a run stopped part of the way keeps its finished models), then
speedup.png (measured speedup per model per method; needs matplotlib) and prints the table.
--quick: squeezenet1_1 and bert at the tiny size, tight capacities, cheap budgets (flags given
explicitly still win).
"""

from __future__ import annotations

import dataclasses
import gc
import math
import time
from pathlib import Path
from typing import Any, Mapping

import jax
import numpy as np
from absl import app, flags

from xrlflow_jax import cost, measure, search
from xrlflow_jax import optimize as opt
from xrlflow_jax.agents import training
from xrlflow_jax.cli import flags as cli_flags
from xrlflow_jax.cost import kernel_table
from xrlflow_jax import graph as G
from xrlflow_jax import workflow
from xrlflow_jax.errors import XrlflowError
from xrlflow_jax.harness import benchmark as B
from xrlflow_jax.harness import machine
from xrlflow_jax.rules.compile import DEFAULT_MAX_LOCATIONS

_MODELS = flags.DEFINE_list("models", [], "Zoo names, ONNX paths or ../shared/models stems "
                            "(default: every zoo model and every ../shared/models file).")
_SIZE = flags.DEFINE_enum("size", "default", ["default", "tiny"], "Zoo model size.")
_METHODS = flags.DEFINE_list("methods", ["greedy", "taso", "beam", "random", "ppo"],
                             "Methods: greedy, taso, beam, random, ppo.")
_OUTPUT = flags.DEFINE_string("output", "benchmark_results", "Output directory.")
_QUICK = flags.DEFINE_bool("quick", False, "Two tiny models, cheap budgets.")
_ALLOW_FAILURES = flags.DEFINE_bool(
    "allow_failures", False, "Exit 0 even when a row failed (a model that did not load, a "
    "method that raised, outputs that differ); the tables record each failure either way.")
_RULES = flags.DEFINE_list("rules", ["builtin"], "Rules and rule sets, as the optimise job's "
                           "--rules: built-in rule names, 'builtin' (the default), families, "
                           "'taso:<file>' (every method uses these).")
_LOCATIONS = flags.DEFINE_integer("max_locations", DEFAULT_MAX_LOCATIONS,
                                  "Locations kept per rule by the searches (the optimise job's "
                                  "default).")
_PPO_LOCATIONS = flags.DEFINE_integer("ppo_max_locations", 16, "Locations kept per rule by PPO's "
                                      "environment: its action space is rules x this.")
_CAPACITY = flags.DEFINE_integer("capacity", 0, "Node slots (<= 0: workflow.fitted_capacity, "
                                 "1.3 x the nodes rounded up to 64).")
_GREEDY_STEPS = flags.DEFINE_integer("greedy_steps", 100, "greedy: max rewrites.")
_TASO_BUDGET = flags.DEFINE_integer("taso_budget", 200, "taso: graphs expanded.")
_TASO_ALPHA = flags.DEFINE_float("taso_alpha", 1.05, "taso: keep candidates within alpha x best.")
_BEAM_WIDTH = flags.DEFINE_integer("beam_width", 8, "beam: width.")
_BEAM_STEPS = flags.DEFINE_integer("beam_steps", 20, "beam: depth.")
_RANDOM_ROLLOUTS = flags.DEFINE_integer("random_rollouts", 16, "random: rollouts.")
_PPO_SAMPLES = flags.DEFINE_integer("ppo_samples", 8, "ppo: sampled policy rollouts besides the "
                                    "argmax one (the row is the trained policy's best).")
_RANDOM_STEPS = flags.DEFINE_integer("random_steps", 20, "random: steps per rollout.")
_PPO_TIMESTEPS = flags.DEFINE_integer("ppo_timesteps", 16 * 32 * 50,
                                      "ppo: environment steps of training per model.")
_PPO_HORIZON = flags.DEFINE_integer("ppo_horizon", 50, "ppo: episode length.")
_PPO_MINUTES = flags.DEFINE_float("ppo_minutes", 0.0, "ppo: stop training after the first chunk "
                                  "of updates that ends past this many minutes per model (the "
                                  "kernel table and compiles included; the row's note says how "
                                  "many steps it took); 0: all of --ppo_timesteps.")
_TIMING = cli_flags.define_timing_flags(looks_default=opt.DEFAULT_LOOKS,
                                        looks_note="as the optimise job's --latency_looks")
_ENV_ENVS = flags.DEFINE_integer("env_envs", 8, "Environments of the steps/s rollout.")
_ENV_STEPS = flags.DEFINE_integer("env_steps", 16, "Steps of the steps/s rollout.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of weights, searches and training.")
_KERNELS = flags.DEFINE_bool("kernel_table", True, "Cost MatMuls and convolutions by their "
                              "measured time, as the optimise job does (PPO's training "
                              "environment too: its table is filled by a TASO-style search of "
                              "--taso_budget first); false: the roofline alone.")
_COEFFS = flags.DEFINE_string("cost_coefficients", "", "Cost-model JSON ('' = shipped fit).")
_AGAINST = flags.DEFINE_list("against", [], "model=file.onnx entries: another optimiser's output "
                             "of that model (e.g. TASO's), same inputs, timed beside the methods "
                             "as the row against:<file> (outputs compared when both files carry "
                             "weights). model is the row's model name.")

QUICK_MODELS = ("squeezenet1_1", "bert")
QUICK = {"size": "tiny", "capacity": 0, "rules": ["merge_conv_shared_input_bias",
                                                   "enlarge_conv_kernel_bias_sib_bias",
                                                   "conv_bias_relu_fuse",
                                                   "merge_matmul_shared_input_3",
                                                   "matmul_gelu_fuse", "add_commute"],
         "max_locations": 4, "ppo_max_locations": 4, "greedy_steps": 8, "taso_budget": 6, "beam_width": 2,
         "beam_steps": 3, "random_rollouts": 2, "random_steps": 4, "ppo_timesteps": 4 * 4 * 2,
         "ppo_horizon": 6, "rounds": 5, "repeats_per_round": 1, "min_round_ms": 5.0, "env_envs": 4,
         "env_steps": 4}


def _opt(name: str) -> Any:
  """A flag's value, or its --quick default when --quick is on and the flag was not given."""
  flag = flags.FLAGS[name]
  if _QUICK.value and not flag.present and name in QUICK:
    return QUICK[name]
  return flag.value


def search_options() -> dict[str, dict[str, Any]]:
  """Per-method options of `search.optimize` from the budget flags."""
  return {"greedy": {"max_steps": _opt("greedy_steps")},
          "taso": {"budget": _opt("taso_budget"), "alpha": _opt("taso_alpha")},
          "beam": {"beam_width": _opt("beam_width"), "steps": _opt("beam_steps")},
          "random": {"num_rollouts": _opt("random_rollouts"), "steps": _opt("random_steps")}}


def ppo_config(model: str) -> Any:
  """The PPO config for one model: the zoo's (test-sized under --quick) with the budget flags."""
  return B.ppo_config(model, quick=_QUICK.value, timesteps=_opt("ppo_timesteps"),
                      horizon=_opt("ppo_horizon"), seed=_SEED.value)


COLUMNS = [("model", "model", ""), ("nodes_in", "nodes", ""), ("env_steps_per_s", "env steps/s",
                                                                ".0f"),
           ("method", "method", ""), ("nodes", "nodes out", ""),
           ("modelled_speedup", "modelled speedup", ".3f"),
           ("latency_ms", "latency ms (median)", ".4f"), ("latency_iqr_ms", "IQR ms", ".4f"),
           ("measured_speedup", "measured speedup", ".3f"), ("speedup_low", "95% low", ".3f"),
           ("speedup_high", "95% high", ".3f"), ("verdict", "verdict", ""),
           ("returned", "guard returns", ""), ("returned_speedup", "after the guard", ".3f"),
           ("seconds", "opt time s", ".1f"), ("compile_seconds", "of which compile s", ".1f"),
           ("kernel_seconds", "kernel timing s", ".1f"),
           ("rewrites", "rewrites", ""), ("families_returned", "rule families returned", ""),
           ("max_rel_error", "max rel err", ".1e"),
           ("note", "note", "")]


def fill_budget(done: list[B.Outcome]) -> int:
  """The budget of the TASO-style search that fills PPO's kernel table
  (`search.fill_kernel_table`): 0 when this model's "taso" method has already searched from
  the same graph with the same table and rules at more locations (the fill then added no kernel
  on SqueezeNet, NasRNN and ResNeXt-50 ONNX, 2026-12-05, and cost 14-46 s), else --taso_budget."""
  searched = any(o.method == "taso" and o.graph is not None for o in done)
  return (0 if searched and _opt("max_locations") >= _opt("ppo_max_locations")
          else _opt("taso_budget"))


def benchmark_model(spec, ruleset, ppo_ruleset, coeffs, methods: list[str],
                    against: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
  """Every method on one model, and `against[spec.label]` when given (`--against`); rows for
  the report (original first). `ruleset`: the searches'; `ppo_ruleset`: the same rules with
  PPO's environment's locations (the environment's throughput is measured on it)."""
  cap = _opt("capacity")
  loaded, = workflow.load_many([spec], capacity=cap if cap > 0 else None, seed=_SEED.value,
                               random_weights=True)
  graph, params = loaded.graph, loaded.params
  G.validate(graph, params)
  # As the optimise job: rules whose source ops cannot occur in this graph are not compiled.
  ruleset, ppo_ruleset = (workflow.that_can_fire(r, [graph]) for r in (ruleset, ppo_ruleset))
  kernels = kernel_table.shared(graph) if _KERNELS.value else None  # the timing its searches use
  original = B.Outcome("original", graph, B.modelled_cost(graph, coeffs, kernels))
  print(f"\n## {spec.label}: {G.num_nodes(graph)} nodes, capacity {G.capacity(graph)}, "
        f"modelled {original.modelled_cost:.4f} ms; {len(ruleset)} rules can fire", flush=True)
  steps_per_s = B.env_steps_per_second(graph, ppo_ruleset, coeffs, num_envs=_opt("env_envs"),
                                       steps=_opt("env_steps"), seed=_SEED.value)
  print(f"  environment: {steps_per_s:.0f} steps/s (random policy)", flush=True)
  options = search_options()
  outcomes = []
  for method in methods:
    t0 = time.perf_counter()
    try:
      if method == "ppo":
        if kernels is not None:
          search.fill_kernel_table([graph], [params], ppo_ruleset, coeffs, kernels,
                                   fill_budget(outcomes),
                                   log=lambda s: print("  " + s, flush=True))
        policy = training.train_ppo(
            [spec.label], [graph], [params], ppo_config(spec.source), coeffs, ppo_ruleset,
            log=lambda s: print("  " + s, flush=True), kernels=kernels, started=t0,
            max_seconds=_PPO_MINUTES.value * 60 or None)
        _, train_cost = policy.best(0)
        train_initial = float(np.asarray(policy.state.initial_cost)[0])
        rollout = B.policy_outcome(policy, graph, params, samples=_PPO_SAMPLES.value,
                                   label="ppo", seed=_SEED.value, kernels=kernels)
        out = dataclasses.replace(
            rollout, seconds=policy.seconds + rollout.seconds,
            note=f"trained policy: argmax + {_PPO_SAMPLES.value} sampled rollouts after "
                 f"{policy.env_steps} training steps (training's best graph modelled "
                 f"x{train_initial / train_cost:.3f} by the cost model training used: "
                 f"{policy.costs_with})")
      else:
        out = B.run_search(method, graph, params, ruleset, coeffs, options[method], _SEED.value,
                           kernels=kernels)
    except Exception as e:  # pylint: disable=broad-except
      out = B.failed(method, e, time.perf_counter() - t0)
    parts = (f" (compile {out.compile_seconds:.1f}s, kernel timing {out.kernel_seconds:.1f}s)"
             if math.isfinite(out.compile_seconds) else "")
    print(f"  {method}: modelled {out.modelled_cost:.4f} ms in {out.seconds:.1f}s{parts} "
          f"{out.note}", flush=True)
    outcomes.append(out)
  against = against or {}
  if spec.label in against:
    outcomes.append(B.against_outcome(against[spec.label], loaded, coeffs, kernels, _SEED.value))
  measured = B.measure_outcomes(
      graph, params, [o.graph for o in outcomes], **_TIMING.options(_opt),
      own_params=[o.params for o in outcomes], checkpoints=[o.checkpoints for o in outcomes],
      seed=_SEED.value)
  base = {"model": spec.label, "nodes_in": G.num_nodes(graph), "rules": len(ruleset),
          "env_steps_per_s": steps_per_s}
  return B.outcome_rows(base, original, outcomes, measured)


def _write_tables(header: str, rows: list[dict[str, Any]], out_dir: Path) -> None:
  """benchmark.md (header and table) and benchmark.csv of the rows so far."""
  table = B.markdown_table(rows, COLUMNS)
  text = (f"{header}\n\nSpeedups are original / method; measured = XLA latency timed side by "
          f"side in this process, modelled = the cost model; guard returns / after the guard = "
          f"what the optimise job's measured guard returns (the method's graph or one of the "
          f"prefixes of its path timed beside it, when measured faster; else the input, "
          f"1.000).\n\n{table}\n")
  (out_dir / "benchmark.md").write_text(text)
  B.write_csv(rows, out_dir / "benchmark.csv")


def main(argv: list[str]) -> None:
  del argv
  methods = [m.strip() for m in _METHODS.value if m.strip()]
  unknown = [m for m in methods if m not in B.METHODS]
  if unknown:
    raise app.UsageError(f"unknown methods {unknown}; use {B.METHODS}")
  timing = _TIMING.options(_opt)
  try:  # before any search: a bad timing setting would fail every model's row at its end
    measure.check_settings(**timing)
  except measure.MeasurementError as e:
    raise app.UsageError(str(e)) from None
  size = _opt("size")
  names = _MODELS.value or (list(QUICK_MODELS) if _QUICK.value else None)
  specs = ([workflow.resolve(n, size) for n in names] if names
           else workflow.default_models(size))
  try:
    against = B.parse_against(_AGAINST.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  for model, path in against.items():  # before any work, not at that model's turn
    if model not in {s.label for s in specs}:
      raise app.UsageError(f"--against names model {model!r}, which this run does not "
                           f"benchmark (models: {', '.join(s.label for s in specs)})")
    if not Path(path).is_file():
      raise app.UsageError(f"--against {model}: ONNX file not found: {path}")
  out_dir = Path(_OUTPUT.value)
  out_dir.mkdir(parents=True, exist_ok=True)
  coeffs = cost.coefficients(_COEFFS.value or None)
  ruleset = B.make_ruleset(_opt("rules"), _opt("max_locations"))
  ppo_ruleset = B.make_ruleset(_opt("rules"), _opt("ppo_max_locations"))
  header = (f"# xrlflow_jax benchmark\n\n{machine.machine_header()}\n- rules: {len(ruleset)} "
            f"({', '.join(_opt('rules'))}) x {ruleset.max_locations} locations (PPO's "
            f"environment: x {ppo_ruleset.max_locations}); budgets: {search_options()}, ppo "
            f"{_opt('ppo_timesteps')} steps (horizon {_opt('ppo_horizon')}); timing: "
            f"{timing['rounds']} interleaved rounds x {timing['repeats_per_round']} runs (more "
            f"for a fast graph: a round lasts >= {timing['min_round_ms']:g} ms), up to "
            f"{timing['looks']} sets while a guard verdict is 'no change'")
  print(header, flush=True)
  rows: list[dict[str, Any]] = []
  for done, spec in enumerate(specs, 1):
    try:
      new_rows = benchmark_model(spec, ruleset, ppo_ruleset, coeffs, methods, against)
    except XrlflowError as e:  # a model this project refuses: a failed row with its reason
      print(f"  {spec.label}: failed ({type(e).__name__}: {str(e)[:200]})", flush=True)
      new_rows = [B.failed_row({"model": spec.label}, e)]
    rows.extend(new_rows)
    print("\n" + B.markdown_table(new_rows, COLUMNS), flush=True)
    # Written after every model: a run stopped part of the way keeps what it measured.
    # Every model compiles its own executables (searches, environment, timed graphs); kept,
    # they pile up memory mappings until LLVM cannot map more (a run died on the sixth model).
    jax.clear_caches()
    gc.collect()
    progress = ("" if done == len(specs) else
                f"\n- partial: {done} of {len(specs)} models measured so far")
    _write_tables(header + progress, rows, out_dir)
  table = B.markdown_table(rows, COLUMNS)
  print("\n" + table, flush=True)
  plotted = [r for r in rows if "measured_speedup" in r]
  if B.plot_speedups(plotted, out_dir / "speedup.png", title="measured speedup (x)"):
    print(f"\nwrote {out_dir / 'benchmark.md'}, benchmark.csv, speedup.png")
  else:
    print(f"\nwrote {out_dir / 'benchmark.md'}, benchmark.csv (speedup.png skipped: matplotlib "
          "is not installed)")

  B.exit_on_failures(rows, allow=_ALLOW_FAILURES.value)


if __name__ == "__main__":
  app.run(main)
