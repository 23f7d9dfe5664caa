"""One report of what this device does with the package: the figures a GPU run must give.

    report = device_report.run(quick=False, log=print)     # JSON-ready dict
    print(device_report.markdown(report))

Parts (each timed and recorded; a part that fails is recorded with its error, the others run):
  device       name, memory, platform version (CUDA on GPUs), JAX, the machine
  calibration  the cost model's coefficients for this device kind: shipped, cached, or
               calibrated now (`cost.calibrate.coefficients`, its time)
  env          random-policy environment steps per second at several batch sizes, BERT-base
               with every built-in rule
  ppo          PPO environment steps per second, learning included, on BERT at batch 64
  optimize     the optimise job (TASO-style search, budget 100) on SqueezeNet, BERT and NasRNN
               at default size, with XLA latency measured side by side and numerics checked
  validation   the cost model against measured latency on one model's rewritten variants
  scaling      with several local devices: PPO steps per second on 1 device and on all
`quick` shrinks every part (tiny models, small batches and budgets) to run on a CPU in minutes.
"""

from __future__ import annotations

import tempfile
import time
import traceback
from typing import Any, Callable

import jax
import numpy as np

from xrlflow_jax import cost, optimize, workflow
from xrlflow_jax import graph as G
from xrlflow_jax.agents import runs
from xrlflow_jax.configs import ppo as ppo_configs
from xrlflow_jax.cost import coefficient_files
from xrlflow_jax.harness import cost_validation, env_benchmark, machine
from xrlflow_jax.optimize import checks

Log = Callable[[str], None]

# (full, quick) settings of each part. The quick run uses the PPO configs' 21 default rules
# instead of all 82 built-in ones: on a CPU, compiling is most of its time.
ENV = {"full": dict(model="bert_base", size="default", batches=(1, 64, 1024, 4096),
                    rules=("builtin",), max_locations=16, steps=10),
       "quick": dict(model="bert", size="tiny", batches=(1, 16),
                     rules=ppo_configs.DEFAULT_RULES, max_locations=4, steps=3)}
PPO = {"full": dict(model="bert", size="default", num_envs=64, num_steps=16, updates=3),
       "quick": dict(model="bert", size="tiny", num_envs=8, num_steps=4, updates=2)}
OPTIMIZE = {"full": dict(models=("squeezenet1_1", "bert", "nasrnn"), size="default",
                         method="taso", budget=100, rounds=10, rules=None),
            "quick": dict(models=("squeezenet1_1", "bert", "nasrnn"), size="tiny",
                          method="greedy", budget=2, rounds=5, rules=ppo_configs.DEFAULT_RULES)}
VALIDATION = {"full": dict(model="squeezenet1_1", size="default", variants=20, neighbours=10),
              "quick": dict(model="squeezenet1_1", size="tiny", variants=3, neighbours=2)}


def _device() -> dict[str, Any]:
  dev = jax.devices()[0]
  return {**machine.machine_info(), "device": dev.device_kind, "platform": dev.platform,
          "platform_version": str(getattr(dev.client, "platform_version", "")),
          "memory_gb": checks.device_memory_bytes() / 2**30,
          "local_devices": jax.local_device_count()}


def _calibration(log: Log, out: dict[str, Any]) -> dict[str, Any]:
  """The cost model's source for this device; its coefficients go into `out["coeffs"]`."""
  kind = jax.devices()[0].device_kind
  shipped = coefficient_files.coefficients_path(kind).is_file()
  cached = coefficient_files.calibrated_path(kind).is_file()
  t = time.perf_counter()
  coeffs = out["coeffs"] = cost.coefficients(log=log)
  source = "shipped" if shipped else "cached calibration" if cached else "calibrated now"
  return {"source": source, "seconds": time.perf_counter() - t, "device_kind": kind,
          "coefficients": coeffs.named()}


def _env(s: dict[str, Any], coeffs: cost.CostCoefficients, log: Log) -> dict[str, Any]:
  loaded = workflow.load(s["model"], size=s["size"], random_weights=True)
  ruleset = workflow.ruleset(s["rules"], s["max_locations"])
  env = env_benchmark.make_env(loaded.graph, ruleset, coeffs, horizon=50)
  rows = []
  for batch in s["batches"]:
    r = env_benchmark.time_env(env, batch, steps=s["steps"], repeats=2)
    log(f"  env batch {batch}: {r.steps_per_s:.1f} steps/s (compile {r.compile_s:.0f} s)")
    rows.append({"batch": batch, "steps_per_s": r.steps_per_s, "compile_s": r.compile_s,
                 "temp_mb": r.temp_mb})
  return {"model": loaded.label, "nodes": G.num_nodes(loaded.graph),
          "capacity": G.capacity(loaded.graph), "rules": len(ruleset),
          "max_locations": s["max_locations"], "rows": rows}


def _ppo_steps_per_s(s: dict[str, Any], coeffs: cost.CostCoefficients,
                     devices: list[jax.Device]) -> dict[str, Any]:
  c = ppo_configs.get_config(f"{s['model']},{s['size']}")
  c.ppo.num_envs, c.ppo.num_steps = s["num_envs"], s["num_steps"]
  c.ppo.total_timesteps = s["num_envs"] * s["num_steps"] * 2 * s["updates"]
  run = runs.build(c, devices, coeffs)
  state = run.trainer.init(jax.random.PRNGKey(0))
  t = time.perf_counter()
  state, _ = run.trainer.run(state, s["updates"])  # compiles (the chunk length is static)
  jax.block_until_ready(state.params)
  first_s = time.perf_counter() - t
  t = time.perf_counter()
  state, _ = run.trainer.run(state, s["updates"])
  jax.block_until_ready(state.params)
  seconds = time.perf_counter() - t
  return {"model": run.names[0], "batch": run.trainer.config.batch_size, "devices": len(devices),
          "updates": s["updates"], "first_call_s": first_s,
          "steps_per_s": s["updates"] * run.trainer.config.batch_size / seconds}


def _optimize(s: dict[str, Any], log: Log) -> list[dict[str, Any]]:
  rows = []
  for name in s["models"]:
    with tempfile.TemporaryDirectory() as out:
      r = optimize.optimize_model(name, method=s["method"], size=s["size"], budget=s["budget"],
                                  rules=s["rules"], output_dir=out, latency_rounds=s["rounds"],
                                  picture=False, log=lambda _: None)
    row = {"model": r.label, "method": r.method, "nodes": r.nodes_before,
           "modelled_speedup": r.modelled_speedup, "measured_speedup": r.measured_speedup,
           "verdict": r.measured.verdict if r.measured else None,
           "latency_before_ms": r.latency_before.median_ms if r.latency_before else None,
           "numerics_passed": r.numerics.passed, "max_rel_error": r.numerics.max_rel_error,
           "seconds": r.seconds.get("total"), "rewrites": len(r.rewrites or [])}
    log(f"  optimise {name}: modelled x{row['modelled_speedup']:.3f}, {row['verdict']}, "
        f"{row['seconds']:.0f} s")
    rows.append(row)
  return rows


def _validation(s: dict[str, Any], coeffs: cost.CostCoefficients) -> dict[str, Any]:
  loaded = workflow.load(s["model"], size=s["size"], random_weights=True)
  v = cost_validation.validate_model(loaded.graph, loaded.params, coeffs, name=loaded.label,
                                     variants=s["variants"], neighbours=s["neighbours"],
                                     rounds=5, passes=2, log=None)
  return {"model": v.model, "graphs": len(v.items), "spearman": v.spearman_all,
          "retest_spearman": v.retest_spearman, "ceiling": v.ceiling,
          "sign_accuracy": v.sign_accuracy, "seconds": v.seconds}


def _part(report: dict[str, Any], name: str, fn: Callable[[], Any], log: Log) -> Any:
  log(f"{name} ...")
  t = time.perf_counter()
  try:
    report[name] = fn()
  except Exception as e:  # pylint: disable=broad-except  (recorded; the other parts still run)
    report[name] = {"error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc(limit=5)}
    log(f"{name} failed: {type(e).__name__}: {e}")
  report["seconds"][name] = time.perf_counter() - t
  return report[name]


def run(quick: bool = False, log: Log = print) -> dict[str, Any]:
  """Every part (see the module docstring); returns the JSON-ready report."""
  size = "quick" if quick else "full"
  report: dict[str, Any] = {"quick": quick, "seconds": {}}
  _part(report, "device", _device, log)
  held: dict[str, Any] = {}
  _part(report, "calibration", lambda: _calibration(log, held), log)
  coeffs = held.get("coeffs")
  if coeffs is None:  # every later part needs the cost model
    report["failed"] = ["calibration"]
    return report
  _part(report, "env", lambda: _env(ENV[size], coeffs, log), log)
  devices = jax.local_devices()
  _part(report, "ppo", lambda: _ppo_steps_per_s(PPO[size], coeffs, devices[:1]), log)
  if len(devices) > 1:
    _part(report, "scaling", lambda: {"one": report["ppo"], "all": _ppo_steps_per_s(
        {**PPO[size], "num_envs": PPO[size]["num_envs"] * len(devices)}, coeffs, devices)}, log)
  _part(report, "optimize", lambda: _optimize(OPTIMIZE[size], log), log)
  _part(report, "validation", lambda: _validation(VALIDATION[size], coeffs), log)
  report["seconds"]["total"] = float(np.sum(list(report["seconds"].values())))
  report["failed"] = [k for k, v in report.items() if isinstance(v, dict) and "error" in v]
  return report


def _fmt(v: Any, spec: str = ".3f") -> str:
  return "-" if v is None else format(v, spec) if isinstance(v, (int, float)) else str(v)


def markdown(report: dict[str, Any]) -> str:
  """The report as markdown tables (parts that failed say so)."""
  d = report.get("device", {})
  lines = [f"# Device report{' (quick)' if report.get('quick') else ''}", ""]
  lines += [f"- {k}: {v}" for k, v in d.items() if k != "error"] or [f"- {d.get('error')}"]
  for part in report.get("failed", []):
    lines.append(f"- **{part} failed**: {report[part]['error']}")
  cal = report.get("calibration", {})
  if "source" in cal:
    lines.append(f"- cost model: {cal['source']} ({cal['seconds']:.1f} s)")
  env = report.get("env", {})
  if "rows" in env:
    lines += ["", f"Environment, {env['model']} ({env['nodes']} nodes, capacity "
              f"{env['capacity']}), {env['rules']} rules x {env['max_locations']} locations:", "",
              "| batch | env steps/s | compile s |", "|---:|---:|---:|"]
    lines += [f"| {r['batch']} | {r['steps_per_s']:.1f} | {r['compile_s']:.0f} |"
              for r in env["rows"]]
  runs_ = [report[k] for k in ("ppo",) if "steps_per_s" in report.get(k, {})]
  runs_ += [report["scaling"]["all"]] if "all" in report.get("scaling", {}) else []
  if runs_:
    lines += ["", "| PPO (learning included) | batch | devices | env steps/s | first call s "
              "(compile) |",
              "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['batch']} | {r['devices']} | {r['steps_per_s']:.1f} | "
              f"{r['first_call_s']:.0f} |" for r in runs_]
  if isinstance(report.get("optimize"), list):
    lines += ["", "| optimise job | method | nodes | modelled | measured | verdict | numerics "
              "| rewrites | s |", "|---|---|---:|---:|---:|---|---|---:|---:|"]
    lines += [f"| {r['model']} | {r['method']} | {r['nodes']} | {_fmt(r['modelled_speedup'])} "
              f"| {_fmt(r['measured_speedup'])} | {r['verdict']} | "
              f"{'ok' if r['numerics_passed'] else 'FAILED'} ({r['max_rel_error']:.1e}) | "
              f"{r['rewrites']} | {_fmt(r['seconds'], '.0f')} |" for r in report["optimize"]]
  v = report.get("validation", {})
  if "spearman" in v:
    lines += ["", f"Cost model on {v['model']} ({v['graphs']} graphs): Spearman "
              f"{_fmt(v['spearman'])}, retest {_fmt(v['retest_spearman'])}, ceiling "
              f"{_fmt(v['ceiling'])}, sign accuracy {_fmt(v['sign_accuracy'], '.2f')}"]
  lines += ["", "Seconds per part: " + ", ".join(f"{k} {t:.0f}"
                                                 for k, t in report["seconds"].items())]
  return "\n".join(lines) + "\n"
