r"""Trains the PPO agent on a model's graph, or a pool of graphs, and reports the best graph
found for each, measured.

    python -m experiments.train --config=experiments/configs/ppo.py:test --workdir=/tmp/run
    python -m experiments.train --config=experiments/configs/ppo.py:bert \
        --config.agent.head=candidates --config.ppo.num_envs=64 --workdir=runs/bert
    # an hour over a pool (zoo sizes per name, ONNX paths), costed with measured kernels
    python -m experiments.train --config=experiments/configs/ppo.py:nasrnn --workdir=runs/pool \
        --config.model.name="squeezenet1_1+squeezenet1_1,default+resnet18,default" \
        --config.env.kernels=measured --config.env.rules="('all',)" --max_minutes=60

After training, `--config.compare_methods="('greedy', 'taso', 'policy')"` searches from each
pool graph with the same rules and cost model and reports those graphs beside training's best
(modelled, numerics checked, timed in the same rounds); `--evaluate_only` does that for the
latest checkpoint of --workdir without training.

Writes to --workdir: metrics.csv (one row per update and seed), TensorBoard event files under
tb/ (when tensorboardX or TensorFlow is importable), checkpoints/ (orbax when installed, else
msgpack; a rerun with the same workdir resumes from the latest one and reproduces the
uninterrupted run), curves.png (when matplotlib is installed), best_graph.txt and results.json
(modelled cost and XLA-measured latency of the initial and the best graph, numerics checked).

Several processes (one per host, or several on one machine) train one run data-parallel on JAX's
distributed runtime: give each the same flags plus its --process_id, or --distributed alone on a
cluster JAX detects (SLURM, Open MPI, Kubernetes, Cloud TPU). The workdir must be on a file
system every process sees; process 0 writes everything but the checkpoints' shards.

    python -m experiments.train --workdir=/shared/run --coordinator_address=host0:1234 \
        --num_processes=2 --process_id=0   # and --process_id=1 on the other

Training runs in chunks of `updates_per_chunk` updates, each one jitted `lax.scan` of PPO
updates (one compile for the whole run); progress, metrics and checkpoints happen between chunks.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from xrlflow_jax import compilation_cache, measure, search, workflow
from xrlflow_jax.cost import kernel_table
from xrlflow_jax import graph as G
from xrlflow_jax.agents import METRICS, checkpoint, distributed, ppo, runs, summaries
from xrlflow_jax.errors import XrlflowError

_CONFIG = config_flags.DEFINE_config_file(
    "config", str(Path(__file__).resolve().parent / "configs" / "ppo.py") + ":test",
    "Training config file: experiments/configs/ppo.py:<model>.")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/xrlflow_train", "Output directory.")
_RESUME = flags.DEFINE_bool("resume", True, "Resume from the latest checkpoint in --workdir.")
_STOP = flags.DEFINE_integer("stop_after", 0, "Stop this invocation after this many updates "
                             "(0: run to the end); a rerun resumes.")
_EVALUATE_ONLY = flags.DEFINE_bool(
    "evaluate_only", False, "Train nothing: report the latest checkpoint of --workdir (its best "
    "graphs, and the config's compare_methods from each pool graph).")
_MAX_MINUTES = flags.DEFINE_float(
    "max_minutes", 0.0, "Stop this invocation after the first chunk that ends this many "
    "minutes after training began, with a checkpoint (0: no limit); a rerun resumes.")
_CACHE = flags.DEFINE_string("compilation_cache", "",
                             "JAX's persistent compilation cache directory (default: "
                             "$XRLFLOW_COMPILATION_CACHE, else ~/.cache/xrlflow_jax/xla); 'off' "
                             "to compile afresh.")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Train over several processes: jax.distributed.initialize() detects "
    "the cluster, or uses --coordinator_address, --num_processes and --process_id.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", "", "host:port of process 0's coordinator (implies --distributed).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes of a distributed run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in a distributed "
                                   "run (0 writes the metrics and reports).")


class Progress:
  """tqdm when installed, else one printed line per chunk with rate and ETA."""

  def __init__(self, total: int, initial: int):
    self.total, self.done, self.t0, self.start = total, initial, time.perf_counter(), initial
    try:
      import tqdm  # pylint: disable=g-import-not-at-top
      self.bar = tqdm.tqdm(total=total, initial=initial, unit="update")
    except ImportError:
      self.bar = None

  def advance(self, n: int, text: str) -> None:
    self.done += n
    if self.bar is not None:
      self.bar.update(n)
      self.bar.set_postfix_str(text)
      return
    elapsed = time.perf_counter() - self.t0
    rate = (self.done - self.start) / max(elapsed, 1e-9)
    eta = (self.total - self.done) / rate if rate > 0 else math.inf
    print(f"[{self.done:>5}/{self.total} {100 * self.done / self.total:5.1f}%] {text} | "
          f"{elapsed:6.1f}s elapsed, ETA {eta:6.1f}s", flush=True)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()


def _fmt(m: dict[str, float], names: list[str], ratios: np.ndarray, steps_per_s: float) -> str:
  """The progress text: the last update's metrics, the best cost ratio of each pool graph
  (ratios float[G], best over seeds; the 8 lowest of a larger pool) and the throughput."""
  order = np.argsort(ratios, kind="stable")[:8]
  per_graph = ", ".join(f"{names[i]} {ratios[i]:.3f}" for i in order)
  more = f" (+{len(names) - len(order)} more)" if len(names) > len(order) else ""
  return (f"return {m['episode_return']:.3f} entropy {m['entropy']:.3f} kl "
          f"{m['approx_kl']:.4f} | best {per_graph}{more} | {steps_per_s:.1f} steps/s")


def _kernel_table(config: Any, pool: tuple[list, list, list], ruleset: Any, coeffs: Any,
                  say: Callable[..., None]) -> Any:
  """The environment's kernel table (`config.env.kernels`): None for the roofline; measured
  kernels of the graphs a TASO-style search meets from each pool graph, measured by process
  0 and sent to the others (processes that each measured would build different programs)."""
  how = str(config.env.get("kernels", "roofline"))
  if how == "roofline":
    return None
  if how != "measured":
    raise app.UsageError(f"--config.env.kernels={how!r}: use 'roofline' or 'measured'")
  table = None
  if distributed.is_main():
    budget = int(config.env.get("kernel_budget", 0)) or search.DEFAULT_KERNEL_BUDGET
    _, graphs, params = pool
    table = search.fill_kernel_table(graphs, params, ruleset, coeffs, kernel_table.shared(),
                                     budget, log=lambda line: say(line, flush=True))
  return distributed.broadcast_kernel_table(table)


def _best_over_seeds(state: Any, seeded: bool, with_graphs: bool = True):
  """(best_cost [G], best_graph [G] (None unless `with_graphs`), initial_cost [G]) on the
  host, best over seeds (every process of a distributed run calls it)."""
  best_cost, graphs, initial = distributed.to_host(
      (state.best_cost, state.best_graph if with_graphs else None, state.initial_cost))
  if not seeded:
    return best_cost, graphs, initial
  s = best_cost.argmin(0)  # [G]
  g = np.arange(best_cost.shape[1])
  return (best_cost[s, g], jax.tree_util.tree_map(lambda a: a[s, g], graphs), initial[0])


def _report_best(run: runs.Run, best: tuple[Any, Any, Any], workdir: Path, rounds: int,
                 searches: dict[str, list[Any]] | None = None) -> dict:
  """Validates, checks numerics of and times (side by side, `measure.compare` with `rounds`
  rounds; 0: not timed) the initial and best graph of every pool graph; best is
  `_best_over_seeds`. `searches`: {method: a SearchResult per pool graph} to report beside
  training's best (modelled, and timed in the same rounds)."""
  best_cost, graphs, initial = best
  searches = searches or {}
  results = []
  dumps = []
  for i, name in enumerate(run.names):
    best = jax.tree_util.tree_map(lambda a, i=i: a[i], graphs)
    params = run.params[i]
    G.validate(best, params)
    check = measure.check_numerics(run.graphs[i], best, params)
    row = {"graph": name, "initial_cost_ms": float(initial[i]), "best_cost_ms": float(best_cost[i]),
           "modelled_speedup": float(initial[i] / best_cost[i]),
           "nodes_initial": G.num_nodes(run.graphs[i]), "nodes_best": G.num_nodes(best),
           "max_rel_error": check.max_rel_error, "numerics_passed": check.passed,
           "numerics": check.describe()}
    found = {m: r[i] for m, r in searches.items()}
    row["searches"] = {}
    for m, r in found.items():
      checked = measure.check_numerics(run.graphs[i], r.best_graph, params)
      row["searches"][m] = {"modelled_speedup": r.initial_cost_ms / r.best_cost_ms,
                            "rewrites": len(r.rewrites), "seconds": r.seconds,
                            "graphs_expanded": r.graphs_expanded,
                            "numerics_passed": checked.passed, "numerics": checked.describe()}
    if rounds > 0:
      cmp = measure.compare(run.graphs[i], [best] + [r.best_graph for r in found.values()],
                            params, rounds=rounds)
      lat0, lat1, verdict = cmp.reference, cmp.candidates[0], cmp.speedups[0]
      row.update({"initial_latency_ms": lat0.median_ms, "best_latency_ms": lat1.median_ms,
                  "initial_latency_iqr_ms": lat0.iqr_ms, "best_latency_iqr_ms": lat1.iqr_ms,
                  "measured_speedup": verdict.ratio, "measured": verdict.to_json(),
                  "measured_text": verdict.describe(), "device": lat1.device_kind})
      for j, m in enumerate(found, start=1):
        row["searches"][m].update({"measured_speedup": cmp.speedups[j].ratio,
                                   "measured_text": cmp.speedups[j].describe()})
    results.append(row)
    dumps.append(f"# {name}: best graph found (modelled cost {best_cost[i]:.5f} ms)\n"
                 + G.dump(best))
  (workdir / "best_graph.txt").write_text("\n\n".join(dumps) + "\n")
  return {"graphs": results}


def _run_searches(run: runs.Run, config: Any, network_params: Any, kernels: Any,
                  say: Callable[..., None]) -> dict[str, list[Any]]:
  """{method: SearchResult per pool graph} of `config.compare_methods` from each pool graph
  with the run's rules and cost model (`kernels`: the KernelTimes the run's table came from,
  or None), modelled (the report times them); "policy" is the trained policy (argmax and
  `config.policy_samples` samples; network_params a RunnerState on the host)."""
  methods = [str(m) for m in config.get("compare_methods", ())]
  out: dict[str, list[Any]] = {}
  for method in methods:
    options = {}
    if method == "policy":
      options = dict(agent=run.agent, network_params=network_params, env=run.env,
                     num_samples=int(config.get("policy_samples", 8)))
    out[method] = []
    for name, g, p in zip(run.names, run.graphs, run.params):
      r = search.optimize(g, p, method, run.ruleset, run.coeffs, kernels=kernels, **options)
      say(f"  {name}: {method} modelled x{r.initial_cost_ms / r.best_cost_ms:.3f} with "
          f"{len(r.rewrites)} rewrites ({r.graphs_expanded} expansions, {r.seconds:.1f}s)",
          flush=True)
      out[method].append(r)
  return out


def main(argv: list[str]) -> None:
  try:
    _train(argv)
  except XrlflowError as e:  # refused input or a run that cannot go on: one line, no traceback
    raise SystemExit(f"error: {type(e).__name__}: {e}") from None


def _train(argv: list[str]) -> None:
  del argv
  if _DISTRIBUTED.value or _COORDINATOR.value:
    distributed.initialize(_COORDINATOR.value or None, _NUM_PROCESSES.value, _PROCESS_ID.value)
  main_process = distributed.is_main()
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint step at INFO
  config = _CONFIG.value
  if int(config.latency_rounds):
    try:
      measure.check_settings(int(config.latency_rounds), 3)
    except measure.MeasurementError as e:
      raise app.UsageError(f"--config.latency_rounds: {e} (0 skips the timing)") from None
  workdir = Path(_WORKDIR.value)
  if workdir.exists() and not workdir.is_dir():
    raise app.UsageError(f"--workdir {str(workdir)!r} is an existing file, not a folder")
  workdir.mkdir(parents=True, exist_ok=True)
  compilation_cache.enable(_CACHE.value or None)
  if main_process:
    (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
  say = print if main_process else (lambda *a, **k: None)
  pool = runs.load_pool(config.model)
  ruleset = workflow.ruleset(config.env.rules, int(config.env.max_locations))
  coeffs = runs.load_cost(config.env.cost_coefficients)
  kernels = _kernel_table(config, pool, ruleset, coeffs, say)
  run = runs.build(config, coeffs=coeffs, pool=pool, ruleset=ruleset, kernels=kernels)
  trainer = run.trainer
  distributed.check_same_program(trainer)
  cfg = trainer.config
  seeds = int(config.num_seeds)
  seeded = seeds > 1
  say(f"pool {run.names} ({[G.num_nodes(g) for g in run.graphs]} nodes, capacity "
      f"{G.capacity(run.graphs[0])}); {len(run.ruleset)} rules x {run.ruleset.max_locations} "
      f"locations; head {run.agent.config.head}; {len(trainer.devices)} device(s) "
      f"{trainer.devices[0].device_kind} in {jax.process_count()} process(es); "
      f"{cfg.num_updates} updates of {cfg.batch_size} steps; {seeds} seed(s)", flush=True)

  key = jax.random.PRNGKey(int(config.seed))
  t0 = time.perf_counter()
  if seeded:
    state = trainer.init_seeds(jax.random.split(key, seeds))
  else:
    state = trainer.init(key)
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(state.params))
  n_params //= seeds if seeded else 1
  say(f"initialised in {time.perf_counter() - t0:.1f}s; {n_params} parameters", flush=True)

  ckpt_dir = workdir / "checkpoints"
  done = 0
  if _RESUME.value and checkpoint.steps(ckpt_dir):
    state, done = checkpoint.restore(ckpt_dir, state)
    say(f"resumed from update {done} ({ckpt_dir})", flush=True)
  chunk = ppo.chunk_size(cfg.num_updates, int(config.updates_per_chunk))
  if done % chunk:
    raise runs.AgentError(f"checkpoint at update {done} is not at a chunk boundary ({chunk}); "
                          "resume with the updates_per_chunk it was written with")
  csv = tb = None
  if main_process:
    csv = summaries.CsvWriter(workdir / "metrics.csv", METRICS, resume_from=done)
    tb = summaries.TensorBoardWriter(workdir / "tb")
    if not tb.active:
      print("TensorBoard event files: skipped (neither tensorboardX nor tensorflow is installed)")
    if summaries.available()["png"] is None:
      print("training curve PNG: skipped (matplotlib is not installed)")

  run_fn = trainer.run_seeds if seeded else trainer.run
  progress = Progress(cfg.num_updates, done) if main_process else None
  chunks = 0
  t_train = time.perf_counter()
  steps_done = 0
  stop_at = min(cfg.num_updates, done + _STOP.value) if _STOP.value > 0 else cfg.num_updates
  if _EVALUATE_ONLY.value:
    if not done:
      raise runs.AgentError(f"--evaluate_only: no checkpoint to evaluate in {ckpt_dir}")
    stop_at = done
  while done < stop_at:
    state, metrics = run_fn(state, chunk)
    metrics = {k: v.reshape(seeds, chunk) for k, v in distributed.to_host(metrics).items()}
    for j in range(chunk if main_process else 0):
      for s in range(seeds):
        row = {k: v[s, j] for k, v in metrics.items()}
        csv.write(done + j + 1, s, row)
        if tb.active:
          tb.write(done + j + 1, row, prefix=f"seed{s}/" if seeded else "")
    done += chunk
    chunks += 1
    steps_done += chunk * cfg.batch_size * seeds
    last = {k: float(np.nanmean(v[:, -1])) if np.isfinite(v[:, -1]).any() else math.nan
            for k, v in metrics.items()}
    best_cost, _, initial = _best_over_seeds(state, seeded, with_graphs=False)
    if progress is not None:
      rate = steps_done / max(time.perf_counter() - t_train, 1e-9)
      progress.advance(chunk, _fmt(last, run.names, best_cost / initial, rate))
    # Process 0's clock decides, so that every process stops after the same chunk.
    out_of_time = bool(distributed.from_main(np.bool_(
        _MAX_MINUTES.value > 0 and time.perf_counter() - t_train > 60 * _MAX_MINUTES.value)))
    if out_of_time and done < stop_at:
      say(f"stopped at --max_minutes={_MAX_MINUTES.value:g} after update {done}; a rerun with "
          "this workdir resumes", flush=True)
      stop_at = done
    if (config.checkpoint_every and chunks % int(config.checkpoint_every) == 0) or \
        done >= stop_at:
      checkpoint.save(ckpt_dir, done, state, backend=config.checkpoint_backend)
  elapsed = time.perf_counter() - t_train
  # Collectives: before the other processes leave.
  best = _best_over_seeds(state, seeded)
  # Host copies for the policy search (its seed: `search.policy.network_params_of`'s choice).
  network_params = state.replace(params=distributed.to_host(state.params),
                                 best_cost=distributed.to_host(state.best_cost))
  if not main_process:
    return
  progress.close()
  tb.close()
  if steps_done:
    print(f"trained {steps_done} environment steps in {elapsed:.1f}s (first chunk includes the "
          f"compile): {steps_done / elapsed:.1f} steps/s", flush=True)
  if summaries.plot_curves(workdir / "metrics.csv", workdir / "curves.png"):
    print(f"training curve: {workdir / 'curves.png'}")

  if config.get("compare_methods", ()):
    print(f"searching from each pool graph with {list(config.compare_methods)}, same rules and "
          "cost model", flush=True)
  searches = _run_searches(run, config, network_params,
                           kernel_table.shared() if kernels is not None else None, say)
  report = _report_best(run, best, workdir, int(config.latency_rounds), searches)
  report.update({"updates": done, "env_steps": done * cfg.batch_size, "seeds": seeds,
                 "parameters": n_params, "processes": jax.process_count(),
                 "devices": len(trainer.devices)})
  (workdir / "results.json").write_text(json.dumps(report, indent=2) + "\n")
  for r in report["graphs"]:
    line = (f"{r['graph']}: modelled cost {r['initial_cost_ms']:.4f} -> {r['best_cost_ms']:.4f} "
            f"ms (x{r['modelled_speedup']:.3f}), nodes {r['nodes_initial']} -> {r['nodes_best']}, "
            f"numerics {r['numerics']}")
    if "best_latency_ms" in r:
      line += (f"; measured {r['initial_latency_ms']:.4f} -> {r['best_latency_ms']:.4f} ms "
               f"({r['measured_text']}) on {r['device']}")
    print(line)
    for m, found in r["searches"].items():
      text = (f"  {m}: modelled x{found['modelled_speedup']:.3f} with {found['rewrites']} "
              f"rewrites, numerics {'PASS' if found['numerics_passed'] else 'FAIL'}")
      if "measured_text" in found:
        text += f"; measured {found['measured_text']}"
      print(text)
  print(f"best graph: {workdir / 'best_graph.txt'}; results: {workdir / 'results.json'}")
  wrong = [r["graph"] for r in report["graphs"] if not r["numerics_passed"]]
  wrong += [f"{r['graph']} ({m})" for r in report["graphs"] for m, found in r["searches"].items()
            if not found["numerics_passed"]]
  if wrong:
    raise SystemExit(f"error: the best graph of {wrong} computes something else than the "
                     "original (see numerics above and results.json)")


if __name__ == "__main__":
  app.run(main)
