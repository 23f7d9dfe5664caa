r"""Generalisation (X-RLflow's claim): a policy trained on some graphs optimises unseen ones.

    python -m experiments.evaluate --quick --output=/tmp/eval                # minutes on a CPU
    python -m experiments.evaluate --train_models=squeezenet1_1,resnet18 \
        --eval_models=resnet50,resnext50,inception_v3,squeezenet1_1.onnx \
        --eval_shapes=default,image=160 --eval_batch_sizes=2 --train_timesteps=102400

PPO is trained once on the pool --train_models (zoo names, ONNX paths or ../shared/models
stems), in chunks of 10 updates with a progress line each, for --train_timesteps or until
--train_minutes have passed; with --kernel_table (default) its environment costs with the
measured kernel table, filled first by a TASO-style search of --taso_budget per training
graph. The trained policy is then run, without further training, on every model of
--train_models and --eval_models at every shape variant of --eval_shapes (zoo models: any
integer field of their config, e.g. image=160, seq=32, frames=40; ONNX files: batch, image or
seq) and of --eval_batch_sizes (batch=N; ONNX only, zoo models fold batch 1 away): once with the
most likely action at every step ("ppo-argmax") and as the best of --samples sampled episodes
("ppo-best-of-K"). Greedy and TASO's backtracking search (same rules and cost model) are the
baselines. The `seen` column says what training saw: "yes" (that graph), "model" (the model at
another shape) or "no".

Capacity: the policy network itself works for any number of node slots, but the trained
environment, its rule set and the batched rollouts are compiled for one capacity, so every
graph (training and evaluation) is built at ONE capacity: --capacity, or (<= 0) the largest
`workflow.fitted_capacity` of all the models. A graph that does not
load (e.g. an ONNX export whose Reshape constants pin batch 1) keeps a row saying why, and the
binary exits 1 after writing the tables when any row failed (--allow_failures: exit 0).

Each model's original graph and every method's graph are compiled and timed side by side
(interleaved, with an identical copy of the original as control: `measure.compare`, a 95%
interval and a verdict per speedup) in one process, outputs checked against the original.
Writes to --output:
evaluate.md (machine/backend/date header, training summary, table), evaluate.csv,
training.csv (the PPO metrics per update), speedup.png (measured speedup per graph per method).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from absl import app, flags

from experiments.configs import ppo as ppo_configs
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

_TRAIN = flags.DEFINE_list("train_models", ["squeezenet1_1", "resnet18"],
                           "Models PPO trains on (zoo names, ONNX paths, shared stems).")
_EVAL = flags.DEFINE_list("eval_models", ["resnet50", "resnext50", "inception_v3"],
                          "Models never seen in training.")
_SHAPES = flags.DEFINE_list("eval_shapes", ["default", "image=160"],
                            "Shape variants: default, or key=int[+key=int] (see the docstring).")
_BATCHES = flags.DEFINE_list("eval_batch_sizes", [], "Extra batch=N variants (ONNX files).")
_SIZE = flags.DEFINE_enum("size", "default", ["default", "tiny"], "Zoo model size.")
_OUTPUT = flags.DEFINE_string("output", "evaluate_results", "Output directory.")
_QUICK = flags.DEFINE_bool("quick", False, "Tiny models, a few PPO updates, cheap budgets.")
_ALLOW_FAILURES = flags.DEFINE_bool(
    "allow_failures", False, "Exit 0 even when a row failed (a model that did not load, a "
    "method that raised, outputs that differ); the tables record each failure either way.")
_RULES = flags.DEFINE_list("rules", list(ppo_configs.DEFAULT_RULES), "Rule names or 'all'.")
_LOCATIONS = flags.DEFINE_integer("max_locations", 16, "Locations kept per rule.")
_CAPACITY = flags.DEFINE_integer("capacity", 0, "Node slots of every graph (<= 0: the largest "
                                 "workflow.fitted_capacity of the models).")
_TIMESTEPS = flags.DEFINE_integer("train_timesteps", 16 * 32 * 100, "PPO environment steps.")
_TRAIN_MINUTES = flags.DEFINE_float("train_minutes", 0.0, "Wall-clock budget of training, "
                                    "the kernel search and compiles included: it stops after "
                                    "the first chunk of "
                                    "updates that ends past it (0: --train_timesteps in full).")
_HORIZON = flags.DEFINE_integer("horizon", 50, "Episode length (training and evaluation).")
_SAMPLES = flags.DEFINE_integer("samples", 8, "K of ppo-best-of-K.")
_GREEDY_STEPS = flags.DEFINE_integer("greedy_steps", 100, "greedy: max rewrites.")
_TASO_BUDGET = flags.DEFINE_integer("taso_budget", 200, "taso: graphs expanded.")
_TIMING = cli_flags.define_timing_flags(looks_default=opt.DEFAULT_LOOKS,
                                        min_round_ms_default=None,
                                        looks_note="as the optimise job's --latency_looks")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of weights, training and sampling.")
_KERNELS = flags.DEFINE_bool("kernel_table", True, "Cost with measured MatMul and convolution "
                              "times: the searches, the policy's rollouts and the training "
                              "environment (its table is filled first by a TASO-style search "
                              "of --taso_budget on each training graph); false: the roofline "
                              "alone.")
_COEFFS = flags.DEFINE_string("cost_coefficients", "", "Cost-model JSON ('' = shipped fit).")

QUICK = {"train_models": ["squeezenet1_1"], "eval_models": ["resnet18"],
         "eval_shapes": ["default", "image=48"], "size": "tiny", "capacity": 0,
         "rules": ["merge_conv_shared_input_bias", "enlarge_conv_kernel_bias_sib_bias",
                   "conv_bias_relu_fuse"],
         "max_locations": 4, "train_timesteps": 4 * 4 * 2, "horizon": 6, "samples": 2,
         "greedy_steps": 6, "taso_budget": 4, "rounds": 5, "repeats_per_round": 1}

COLUMNS = [("model", "model", ""), ("shape", "shape", ""), ("seen", "seen in training", ""),
           ("nodes_in", "nodes", ""), ("method", "method", ""),
           ("modelled_speedup", "modelled speedup", ".3f"),
           ("latency_ms", "latency ms (median)", ".4f"),
           ("measured_speedup", "measured speedup", ".3f"), ("speedup_low", "95% low", ".3f"),
           ("speedup_high", "95% high", ".3f"), ("verdict", "verdict", ""), ("seconds", "time s", ".1f"),
           ("max_rel_error", "max rel err", ".1e"), ("note", "note", "")]


def _opt(name: str) -> Any:
  """A flag's value, or its --quick default when --quick is on and the flag was not given."""
  flag = flags.FLAGS[name]
  if _QUICK.value and not flag.present and name in QUICK:
    return QUICK[name]
  return flag.value


def ppo_config() -> Any:
  """The PPO config: the zoo default (the `test` config's sizes under --quick) + the flags."""
  return B.ppo_config("", quick=_QUICK.value, timesteps=_opt("train_timesteps"),
                      horizon=_opt("horizon"), seed=_SEED.value)


def eval_specs(train_specs, size: str) -> list[tuple[Any, str]]:
  """(spec at a shape variant, seen) for every train and eval model and every variant."""
  shapes = [workflow.parse_shape(s) for s in _opt("eval_shapes")]
  shapes += [(("batch", int(b)),) for b in _BATCHES.value]
  shapes = list(dict.fromkeys(shapes)) or [()]
  trained = {s.source for s in train_specs}
  models = list(train_specs) + [workflow.resolve(n, size) for n in _opt("eval_models")
                                if workflow.resolve(n, size).source not in trained]
  out = []
  for spec in models:
    for shape in shapes:
      seen = "no" if spec.source not in trained else ("yes" if not shape else "model")
      out.append((spec.with_shape(shape), seen))
  return out


def evaluate_graph(policy, spec, seen: str, graph, params, coeffs) -> list[dict[str, Any]]:
  """Baselines and the policy on one graph, measured side by side: report rows."""
  import time  # pylint: disable=g-import-not-at-top
  ruleset = policy.run.ruleset
  kernels = kernel_table.shared(graph) if _KERNELS.value else None  # the timing its searches use
  original = B.Outcome("original", graph, B.modelled_cost(graph, coeffs, kernels))
  outcomes = []
  for method, options in (("greedy", {"max_steps": _opt("greedy_steps")}),
                          ("taso", {"budget": _opt("taso_budget")})):
    t0 = time.perf_counter()
    try:
      outcomes.append(B.run_search(method, graph, params, ruleset, coeffs, options, _SEED.value,
                                   kernels=kernels))
    except Exception as e:  # pylint: disable=broad-except
      outcomes.append(B.failed(method, e, time.perf_counter() - t0))
  try:
    outcomes.extend(B.policy_outcomes(policy, graph, params, samples=_opt("samples"),
                                      seed=_SEED.value, kernels=kernels))
  except Exception as e:  # pylint: disable=broad-except
    outcomes.append(B.failed("ppo", e))
  for o in outcomes:
    print(f"  {o.method}: modelled x{original.modelled_cost / o.modelled_cost:.3f} in "
          f"{o.seconds:.1f}s {o.note}", flush=True)
  measured = B.measure_outcomes(
      graph, params, [o.graph for o in outcomes], **_TIMING.options(_opt),
      checkpoints=[o.checkpoints for o in outcomes], seed=_SEED.value)
  base = {"model": spec.label, "shape": spec.shape_label, "seen": seen,
          "nodes_in": G.num_nodes(graph)}
  return B.outcome_rows(base, original, outcomes, measured)


def main(argv: list[str]) -> None:
  del argv
  timing = _TIMING.options(_opt)
  try:  # before training: a bad timing setting would fail every row at its end
    measure.check_settings(**timing)
  except measure.MeasurementError as e:
    raise app.UsageError(str(e)) from None
  size = _opt("size")
  out_dir = Path(_OUTPUT.value)
  out_dir.mkdir(parents=True, exist_ok=True)
  train_specs = [workflow.resolve(n, size) for n in _opt("train_models")]
  evals = eval_specs(train_specs, size)
  cap = _opt("capacity")
  loaded = workflow.as_graph_params(workflow.load_many(
      train_specs + [s for s, _ in evals], capacity=cap if cap > 0 else None, seed=_SEED.value,
      errors="return", random_weights=True))
  train_loaded, eval_loaded = loaded[:len(train_specs)], loaded[len(train_specs):]
  bad = [(s.label, e) for s, e in zip(train_specs, train_loaded) if isinstance(e, Exception)]
  if bad:
    raise app.UsageError(f"training models that do not load: {bad}")
  coeffs = cost.coefficients(_COEFFS.value or None)
  ruleset = B.make_ruleset(_opt("rules"), _opt("max_locations"))
  capacity = G.capacity(train_loaded[0][0])
  header = (f"# xrlflow_jax generalisation\n\n{machine.machine_header()}\n- every graph at capacity "
            f"{capacity}; rules: {len(ruleset)} x {ruleset.max_locations} locations; greedy "
            f"{_opt('greedy_steps')} steps, taso budget {_opt('taso_budget')}; timing: "
            f"{timing['rounds']} interleaved rounds x {timing['repeats_per_round']} runs, up to "
            f"{timing['looks']} sets while a guard verdict is 'no change'")
  print(header, flush=True)
  started = time.perf_counter()
  train_graphs, train_params = [g for g, _ in train_loaded], [p for _, p in train_loaded]
  kernels = kernel_table.shared() if _KERNELS.value else None
  if kernels is not None:
    search.fill_kernel_table(train_graphs, train_params, ruleset, coeffs, kernels,
                             _opt("taso_budget"), log=lambda s: print(s, flush=True))
  policy = training.train_ppo([s.label for s in train_specs], train_graphs, train_params,
                              ppo_config(), coeffs, ruleset, log=lambda s: print(s, flush=True),
                              max_seconds=_TRAIN_MINUTES.value * 60 or None,
                              kernels=kernels, started=started)
  B.write_csv([{"update": i + 1, **{k: float(v[i]) for k, v in policy.metrics.items()}}
               for i in range(len(policy.metrics["env_steps"]))], out_dir / "training.csv")
  rows: list[dict[str, Any]] = []
  for (spec, seen), item in zip(evals, eval_loaded):
    if isinstance(item, Exception):
      print(f"\n## {spec.label} [{spec.shape_label}]: skipped ({type(item).__name__})")
      rows.append(B.failed_row({"model": spec.label, "shape": spec.shape_label, "seen": seen},
                               item, "not loaded"))
      continue
    graph, params = item
    print(f"\n## {spec.label} [{spec.shape_label}] (seen: {seen}): {G.num_nodes(graph)} nodes",
          flush=True)
    try:
      rows.extend(evaluate_graph(policy, spec, seen, graph, params, coeffs))
    except XrlflowError as e:  # refused by the project: a failed row with its reason
      rows.append(B.failed_row({"model": spec.label, "shape": spec.shape_label, "seen": seen},
                               e))
  train_line = (f"- PPO trained on {[s.label for s in train_specs]} for {policy.env_steps} "
                f"steps in {policy.seconds:.1f}s (compile included); evaluation without further "
                f"training")
  table = B.markdown_table(rows, COLUMNS)
  print("\n" + table, flush=True)
  (out_dir / "evaluate.md").write_text(
      f"{header}\n{train_line}\n\nSpeedups are original / method; measured = XLA latency timed "
      f"side by side in this process, modelled = the cost model.\n\n{table}\n")
  B.write_csv(rows, out_dir / "evaluate.csv")
  plotted = [{**r, "graph": f"{r['model']}[{r['shape']}]"} for r in rows
             if "measured_speedup" in r]
  png = B.plot_speedups(plotted, out_dir / "speedup.png", group="graph",
                        title="measured speedup on seen and unseen graphs (x)")
  print(f"\nwrote {out_dir / 'evaluate.md'}, evaluate.csv, training.csv"
        + (", speedup.png" if png else " (speedup.png skipped: matplotlib is not installed)"))

  B.exit_on_failures(rows, allow=_ALLOW_FAILURES.value)


if __name__ == "__main__":
  app.run(main)
