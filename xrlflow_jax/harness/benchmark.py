"""Shared logic of the end-to-end experiments (`experiments/benchmark.py`, `experiments/evaluate.py`)
and the notebooks (models load with `workflow.load`): side-by-side latency measurement, search and PPO outcomes,
environment throughput, and the reports (markdown, CSV, bar chart).

Every speed figure these helpers report is measured: the original graph and every method's graph
are compiled by XLA and timed interleaved in one process (`measure_outcomes`), and each
graph's outputs are compared with the original's on the same random inputs. Modelled figures
(the cost model the searches optimise) are reported next to them, labelled as modelled.

    from xrlflow_jax.harness import benchmark as B
    loaded = workflow.load("squeezenet1_1", size="tiny")
    graph, params = loaded.graph, loaded.params
    ruleset = B.make_ruleset(["all"], max_locations=16)
    coeffs = cost.coefficients()
    out = B.run_search("greedy", graph, params, ruleset, coeffs, {"max_steps": 20})
    measured = B.measure_outcomes(graph, params, [out.graph])  # verdict, numerics
"""

from __future__ import annotations

import csv
import dataclasses
import os
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from xrlflow_jax import cost, executor, measure, search, workflow
from xrlflow_jax import graph as G
from xrlflow_jax.agents.training import TrainedPolicy
from xrlflow_jax.configs import ppo as ppo_configs
from xrlflow_jax.graph import Graph, ParamStore
from xrlflow_jax.harness import env_benchmark
from xrlflow_jax.search import guard
from xrlflow_jax.search.result import JOB_METHODS

METHODS = JOB_METHODS  # what the benchmark binaries accept

Log = Callable[[str], None]


# ----------------------------------------------------------------------------------------------
# Rules, PPO config and environment throughput
# ----------------------------------------------------------------------------------------------

# The method label of another optimiser's graph timed beside ours (`against_outcome`).
AGAINST_PREFIX = "against:"


def make_ruleset(names: Sequence[str], max_locations: int = 16):
  """A RuleSet of built-in rules by name (("all",) for every one): `workflow.ruleset`."""
  return workflow.ruleset(list(names), int(max_locations))


def ppo_config(name: str, *, quick: bool, timesteps: int, horizon: int, seed: int) -> Any:
  """The PPO config of a benchmark run: `configs.ppo.get_config(name)` ("" the zoo default), or
  under `quick` the `test` config at 4 envs x 4 steps, one minibatch and one epoch; trained for
  `timesteps` environment steps in all, episodes of `horizon` steps, seeded with `seed`."""
  c = ppo_configs.get_config("test" if quick else name)
  if quick:
    c.ppo.num_envs, c.ppo.num_steps, c.ppo.num_minibatches, c.ppo.update_epochs = 4, 4, 1, 1
  c.ppo.total_timesteps = int(timesteps)
  c.env.horizon = int(horizon)
  c.seed = seed
  return c


def env_steps_per_second(graph: Graph, ruleset, coeffs: cost.CostCoefficients, *,
                         num_envs: int = 8, steps: int = 16, horizon: int = 50,
                         seed: int = 0) -> float:
  """Environment steps per second of the random valid policy over `num_envs` auto-reset
  environments (`env_benchmark.time_env`: one compiled `lax.scan` of `steps` steps, best of
  two timed calls after a warm-up)."""
  env = env_benchmark.make_env(graph, ruleset, coeffs, horizon)
  return env_benchmark.time_env(env, num_envs, steps=steps, repeats=2, seed=seed).steps_per_s


# ----------------------------------------------------------------------------------------------
# Optimisation outcomes
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Outcome:
  """What one method made of one graph.

  Attributes:
    method: "original", a search method, "ppo", "ppo-argmax", "ppo-best-of-K", ...
    graph: the graph returned (None when the method failed).
    modelled_cost: its modelled cost (ms); seconds: wall time of the method (compiles included).
    rewrites: rewrites applied (None when the method does not report them).
    note: an error or remark for the report.
    params: the graph's own weights (a graph loaded apart, e.g. another optimiser's output of
      the model); None: the original's.
    outputs_comparable: False when its outputs cannot equal the original's for a reason that is
      not a bug (a file without weight data was given random ones): not compared.
    checkpoints: prefixes of a search's path (`search.guard.Checkpoint`s) that the optimise
      job's measured guard times beside its graph.
    compile_seconds, kernel_seconds: of `seconds`, what the search spent compiling (or waiting
      for its background compiles) and adding kernels to the measured kernel table (NaN where
      the method does not report them).
    families: the rule family of each rewrite of its path, in order (empty where unknown).
  """
  method: str
  graph: Graph | None
  modelled_cost: float
  seconds: float = 0.0
  rewrites: int | None = None
  note: str = ""
  params: ParamStore | None = None
  outputs_comparable: bool = True
  checkpoints: list[Any] = dataclasses.field(default_factory=list)
  compile_seconds: float = float("nan")
  kernel_seconds: float = float("nan")
  families: tuple[str, ...] = ()


def modelled_cost(graph: Graph, coeffs: cost.CostCoefficients,
                  kernels: cost.KernelTimes | None = None) -> float:
  """The cost model's latency estimate of `graph` (ms); with `kernels`, its kernels measured
  (the same model the searches use)."""
  if kernels is None:
    return float(cost.graph_cost(graph, coeffs))
  kernels.add(graph)
  return float(cost.graph_cost(graph, coeffs, kernels=kernels.table()))


def run_search(method: str, graph: Graph, params: ParamStore, ruleset, coeffs, options:
               Mapping[str, Any] | None = None, seed: int = 0,
               kernels: cost.KernelTimes | None = None,
               checkpoints: int = measure.guard.DEFAULT_CHECKPOINTS) -> Outcome:
  """`search.optimize` with the modelled guard only (latency is measured afterwards, side by
  side with every other method's graph); `kernels`: the measured kernel table; `checkpoints`:
  prefixes of its path kept for the measured guard, as the optimise job's
  (`search.guard.checkpoint_prefixes`)."""
  t0 = time.perf_counter()
  r = search.optimize(graph, params, method, ruleset, coeffs, measure=False, seed=seed,
                      kernels=kernels, **dict(options or {}))
  note = "input returned (nothing cheaper found)" if r.returned_input else ""
  prefixes = []
  if checkpoints and not r.returned_input:
    prefixes = guard.checkpoint_prefixes(search.get_expander(ruleset, coeffs, kernels), graph,
                                         list(r.rewrites), r.initial_cost_ms, checkpoints)
  return Outcome(method, r.best_graph, float(r.best_cost_ms), time.perf_counter() - t0,
                 len(r.rewrites), note, checkpoints=prefixes,
                 compile_seconds=float(r.options.get("compile_seconds", float("nan"))),
                 kernel_seconds=float(r.options.get("kernel_seconds", float("nan"))),
                 families=tuple(guard.rewrite_families(ruleset, r.rewrites)))


def reason(error: BaseException) -> str:
  """"TypeName: first line of the message" (at most 160 characters of it) for report notes."""
  first = (str(error).strip().splitlines() or [""])[0]
  return f"{type(error).__name__}: {first[:160]}"


def failed(method: str, error: Exception, seconds: float = 0.0) -> Outcome:
  """An Outcome for a method that raised (the report keeps the row, honestly empty)."""
  return Outcome(method, None, float("nan"), seconds, None, f"failed: {reason(error)}")


# ----------------------------------------------------------------------------------------------
# PPO: training and policy rollouts
# ----------------------------------------------------------------------------------------------

def policy_outcome(policy: TrainedPolicy, graph: Graph, params: ParamStore, *, samples: int,
                   label: str, steps: int | None = None, seed: int = 0,
                   kernels: cost.KernelTimes | None = None,
                   checkpoints: int = measure.guard.DEFAULT_CHECKPOINTS) -> Outcome:
  """The trained policy on a (possibly unseen) graph, through the policy search driver (the
  one policy-inference path: `search.optimize(..., "policy")`, observations as in training):
  the argmax rollout and `samples` sampled ones, the cheapest graph any reached under the cost
  model (the input when nothing is cheaper; with `kernels`, costed with the measured kernel
  table, which training's environment also used when it was given one:
  `policy.costs_with`), with its replayable rewrite count and up to `checkpoints` prefixes of
  its path for the measured guard, as `run_search`'s."""
  run = policy.run
  t0 = time.perf_counter()
  expander = search.get_expander(run.ruleset, run.coeffs, kernels)
  r = search.optimize(graph, params, "policy", expander=expander, agent=run.agent,
                      network_params=policy.state, env=run.env, steps=steps,
                      num_samples=samples, seed=seed)
  prefixes = []
  if checkpoints and not r.returned_input:
    prefixes = guard.checkpoint_prefixes(expander, graph, list(r.rewrites), r.initial_cost_ms,
                                         checkpoints)
  return Outcome(label, r.best_graph, float(r.best_cost_ms), time.perf_counter() - t0,
                 len(r.rewrites), checkpoints=prefixes,
                 families=tuple(guard.rewrite_families(run.ruleset, r.rewrites)))


def policy_outcomes(policy: TrainedPolicy, graph: Graph, params: ParamStore, *,
                    samples: int = 8, steps: int | None = None, seed: int = 0,
                    kernels: cost.KernelTimes | None = None) -> list[Outcome]:
  """Two `policy_outcome`s: "ppo-argmax" (the most likely action each step only) and
  "ppo-best-of-K" (the argmax rollout and K = `samples` sampled ones)."""
  return [policy_outcome(policy, graph, params, samples=k, label=label, steps=steps, seed=seed,
                         kernels=kernels)
          for label, k in (("ppo-argmax", 0), (f"ppo-best-of-{samples}", samples))]


def parse_against(entries: Iterable[str]) -> dict[str, str]:
  """{"model": "file.onnx"} from "model=file.onnx" entries (`--against`); ValueError naming a
  malformed entry."""
  out: dict[str, str] = {}
  for entry in entries:
    model, sep, path = str(entry).partition("=")
    if not sep or not model.strip() or not path.strip():
      raise ValueError(f"--against entries are model=file.onnx, got {entry!r}")
    out[model.strip()] = path.strip()
  return out


def against_outcome(path: str, original: workflow.Loaded, coeffs: cost.CostCoefficients,
                    kernels: cost.KernelTimes | None = None, seed: int = 0) -> Outcome:
  """Another optimiser's ONNX output of the same model (e.g. TASO's) as an outcome timed beside
  the methods' ("against:<file>"): its own weights; its outputs compared with the original's
  only when both carry their weights. A file that does not load, or takes other inputs, is a
  failed outcome that says why."""
  label = f"{AGAINST_PREFIX}{os.path.basename(path)}"
  t0 = time.perf_counter()
  try:
    other = workflow.load(path, seed=seed, random_weights=True)
    mismatch = executor.input_mismatch(original.graph, other.graph)
    if mismatch:
      raise ValueError(f"{path} takes other inputs than {original.label}: {mismatch}")
  except Exception as e:  # pylint: disable=broad-except
    return failed(label, e, time.perf_counter() - t0)
  comparable = not (original.random_weights or other.random_weights)
  return Outcome(label, other.graph, modelled_cost(other.graph, coeffs, kernels),
                 time.perf_counter() - t0, None,
                 "" if comparable else "outputs not compared: a file without weight data was "
                 "given random weights", params=other.params, outputs_comparable=comparable)


# ----------------------------------------------------------------------------------------------
# Measurement
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Measured:
  """Outcomes' graphs measured against the original (`measure_outcomes`).

  Attributes:
    original: the original's LatencyStats.
    stats, speedups, numerics: per graph (None where the graph is None): LatencyStats,
      `measure.Speedup` (verdict with its interval) and `measure.NumericsCheck`.
  """
  original: measure.LatencyStats
  stats: list[measure.LatencyStats | None]
  speedups: list[measure.Speedup | None]
  numerics: list[measure.NumericsCheck | None]
  returned: list[tuple[float, str] | None] | None = None


def measure_outcomes(original: Graph, params: ParamStore, graphs: Sequence[Graph | None], *,
                     rounds: int = 10, repeats_per_round: int = 3,
                     min_round_ms: float = 30.0, backend: str | None = None,
                     own_params: Sequence[ParamStore | None] | None = None,
                     checkpoints: Sequence[Sequence[Any]] | None = None,
                     seed: int = 0, looks: int = 1) -> Measured:
  """Latency of `original` and of each graph, timed interleaved in one process with an
  identical copy of the original as control (`measure.compare`), and each graph's outputs
  compared with the original's on the same random inputs. `own_params[i]`: graph i's own
  weights (a graph loaded apart; None: `params`). `checkpoints[i]`: graph i's path prefixes
  (`search.guard.Checkpoint`s), timed in the same rounds for what the optimise job's measured
  guard returns (`Measured.returned`); a prefix whose outputs differ is that graph's numerics.

  `looks`: sets of `rounds` rounds timed at most, as the optimise job's `--latency_looks`:
  another set while any graph timed is "no change" at the strictest guard level (so whenever
  some method's job would look again). Each graph's verdict (`Measured.speedups`) is over every
  round timed at `measure.LEVEL`; what its guard returns replays the job's procedure on the
  same rounds (`_guarded`): the job would have stopped after the first set when its own
  verdicts were all decided, and this reports what it would then have returned.
  """
  own = list(own_params) if own_params is not None else [None] * len(graphs)
  cps = [list(c) for c in checkpoints] if checkpoints is not None else [[] for _ in graphs]
  present = [g for g in graphs if g is not None]  # compiling validates each of them
  extra = [c.graph for g, cs in zip(graphs, cps) if g is not None for c in cs]
  # Another set of rounds whenever some method's guard would take one: compare's stopping
  # rule at the strictest of their levels ("no change" there covers every looser level).
  strictest = min([measure.LEVEL] + [measure.guard.checkpoint_level(len(cs))
                                     for g, cs in zip(graphs, cps) if g is not None])
  cmp = measure.compare(original, present + extra, params, rounds=rounds,
                        repeats_per_round=repeats_per_round, min_round_ms=min_round_ms,
                        backend=backend, level=strictest, looks=looks,
                        tolerance=measure.DEFAULT_TOLERANCE,
                        candidate_params=[p for g, p in zip(graphs, own) if g is not None]
                        + [None] * len(extra))
  index = iter(range(len(present)))
  at = [None if g is None else next(index) for g in graphs]
  extra_at = iter(range(len(present), len(present) + len(extra)))

  def per_graph(values: Sequence[Any]) -> list[Any]:
    return [None if i is None else values[i] for i in at]

  returned: list[tuple[float, str] | None] = []
  numerics = per_graph(cmp.numerics)
  for k, (i, cs) in enumerate(zip(at, cps)):
    if i is None:
      returned.append(None)
      continue
    slots = [i] + [next(extra_at) for _ in cs]
    returned.append(_guarded(cmp, slots, [c.rewrites for c in cs], seed, rounds=rounds,
                             looks=looks))
    # Every graph timed must compute what the original does, its prefixes too (as the
    # optimise job checks them): a prefix that does not fails the method's row.
    numerics[k] = next((cmp.numerics[j] for j in slots if not cmp.numerics[j].passed),
                       numerics[k])
  return Measured(cmp.reference, per_graph(cmp.candidates),
                  per_graph([_at_level(cmp, j, measure.LEVEL, seed)
                             for j in range(len(cmp.speedups))]),
                  numerics, returned)


def _at_level(cmp: measure.Comparison, j: int, level: float, seed: int) -> measure.Speedup:
  """Candidate j's verdict over every round timed, at `level` (compare's own verdicts are at
  the level its stopping rule used)."""
  s = cmp.speedups[j]
  if s.verdict == "unchanged" or cmp.round_ms is None:
    return s
  ref, copy, cands = cmp.round_ms
  return measure.speedup(ref, cands[j], copy, level=level, seed=seed)


def _guarded(cmp: measure.Comparison, slots: Sequence[int], lengths: Sequence[int],
             seed: int, *, rounds: int | None = None, looks: int = 1) -> tuple[float, str]:
  """(speedup, what) the optimise job's measured guard returns from the comparison's
  candidates `slots` (the whole path, then its prefixes of `lengths` rewrites): the fastest of
  those measured significantly faster at `measure.guard.checkpoint_level` (per look,
  `measure.look_level`), else the input.

  It replays the job's (up to `looks`) sets of `rounds` rounds on the comparison's rounds
  (`measure.sequential_verdicts`; `rounds` None: all of them as one set).
  """
  if cmp.round_ms is None or cmp.round_ms[1] is None:  # nothing was timed: all unchanged
    return 1.0, "input"
  ref, copy, cands = cmp.round_ms
  verdicts = measure.sequential_verdicts(
      ref, [cands[j] for j in slots], copy, rounds=rounds, looks=looks,
      level=measure.guard.checkpoint_level(len(slots) - 1), seed=seed,
      changed=[cmp.speedups[j].verdict != "unchanged" for j in slots])
  decision = measure.guard.decide(verdicts[0], None, verdicts[1:], lengths)
  if decision.returns_input:
    return 1.0, "input"
  return (decision.speedup.ratio,
          "graph" if decision.kept == "path" else f"first {decision.rewrites}")


# ----------------------------------------------------------------------------------------------
# Reports
# ----------------------------------------------------------------------------------------------

def outcome_rows(base: Mapping[str, Any], original: Outcome, outcomes: Sequence[Outcome],
                 measured: Measured) -> list[dict[str, Any]]:
  """Report rows (one for the original, one per outcome): `base` fields, then method, nodes,
  modelled and measured latency, the measured speedup with its interval and verdict, what the
  optimise job's measured guard returns (`returned`: "graph", "first k" rewrites of its
  path, or "input"; `returned_speedup`: its measured speedup, the input's 1.0; from
  `measured.returned`, else the graph when its verdict keeps it; n/a for another optimiser's
  graph), time, rewrites, the rule families of the method's path and of what the guard
  returns (`families`, `families_returned`: "family count, ..."), max relative error, status
  ("ok" or "failed") and note."""
  nan = float("nan")
  rows = [{**base, "method": "original", "nodes": G.num_nodes(original.graph),
           "modelled_ms": original.modelled_cost, "modelled_speedup": 1.0,
           "latency_ms": measured.original.median_ms,
           "latency_iqr_ms": measured.original.iqr_ms, "measured_speedup": 1.0,
           "speedup_low": nan, "speedup_high": nan, "verdict": "reference",
           "returned_speedup": 1.0, "returned": "", "seconds": 0.0, "compile_seconds": nan,
           "kernel_seconds": nan, "rewrites": 0, "families": "", "families_returned": "",
           "max_rel_error": 0.0, "status": "ok", "note": ""}]
  guards = measured.returned or [None] * len(outcomes)
  for o, s, v, n, got in zip(outcomes, measured.stats, measured.speedups, measured.numerics,
                             guards):
    ok = o.graph is not None and s is not None
    guarded = ok and not o.method.startswith(AGAINST_PREFIX)
    # Without timed prefixes the guard keeps the graph when its verdict does.
    returned = got if got is not None else ((v.ratio, "graph") if ok and v.keeps else
                                            (1.0, "input"))
    differ = ok and o.outputs_comparable and not n.passed
    rows.append({
        **base, "method": o.method, "nodes": G.num_nodes(o.graph) if ok else "",
        "modelled_ms": o.modelled_cost,
        "modelled_speedup": original.modelled_cost / o.modelled_cost if ok else nan,
        "latency_ms": s.median_ms if ok else nan, "latency_iqr_ms": s.iqr_ms if ok else nan,
        "measured_speedup": v.ratio if ok else nan, "speedup_low": v.low if ok else nan,
        "speedup_high": v.high if ok else nan, "verdict": v.verdict if ok else "",
        "returned_speedup": nan if not guarded else returned[0],
        "returned": "" if not guarded else returned[1],
        "seconds": o.seconds, "compile_seconds": o.compile_seconds,
        "kernel_seconds": o.kernel_seconds, "rewrites": "" if o.rewrites is None else o.rewrites,
        "families": guard.family_counts(o.families),
        "families_returned": (guard.family_counts(_returned_path(o.families, returned[1]))
                              if guarded else ""),
        "max_rel_error": n.max_rel_error if ok and o.outputs_comparable else nan,
        "status": "ok" if ok and not differ else "failed",
        "note": o.note + (f" OUTPUTS DIFFER ({n.describe()})" if differ else "")})
  return rows


def _returned_path(families: Sequence[str], returned: str) -> Sequence[str]:
  """The families of the rewrites the guard returns: all for "graph", the first k for
  "first k", none for "input"."""
  if returned == "graph":
    return families
  if returned.startswith("first "):
    return families[:int(returned.split()[1])]
  return ()


def failed_row(base: Mapping[str, Any], error: BaseException, what: str = "failed"
               ) -> dict[str, Any]:
  """A row for a model that could not be benchmarked, with its reason."""
  return {**base, "method": "original", "status": "failed", "note": f"{what}: {reason(error)}"}


def failures(rows: Sequence[Mapping[str, Any]]) -> list[str]:
  """"model method: note" of every failed row."""
  return [f"{r.get('model', '?')}{' [' + r['shape'] + ']' if r.get('shape') else ''} "
          f"{r.get('method', '?')}: {r.get('note', '').strip()}"
          for r in rows if r.get("status") == "failed"]


def exit_on_failures(rows: Sequence[Mapping[str, Any]], *, allow: bool = False) -> None:
  """After the tables are written: SystemExit(1) listing the failed rows unless `allow`."""
  bad = failures(rows)
  if bad:
    text = f"{len(bad)} of {len(rows)} rows failed:\n  " + "\n  ".join(bad)
    if not allow:
      raise SystemExit(f"error: {text}\n(--allow_failures exits 0 with partial tables)")
    print(f"warning: {text}", flush=True)


def _fmt(value: Any, spec: str) -> str:
  if isinstance(value, float):
    return "n/a" if np.isnan(value) else format(value, spec)
  return str(value)


def markdown_table(rows: Sequence[Mapping[str, Any]],
                   columns: Sequence[tuple[str, str, str]]) -> str:
  """A markdown table of `rows`; columns are (key, header, format spec for floats)."""
  lines = ["| " + " | ".join(h for _, h, _ in columns) + " |",
           "|" + "|".join("---:" if f else "---" for _, _, f in columns) + "|"]
  for r in rows:
    lines.append("| " + " | ".join(_fmt(r.get(k, ""), f) for k, _, f in columns) + " |")
  return "\n".join(lines)


def write_csv(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> None:
  """`rows` as CSV (columns: the union of the rows' keys, in first-seen order)."""
  keys: list[str] = []
  for r in rows:
    keys.extend(k for k in r if k not in keys)
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=keys)
    w.writeheader()
    w.writerows(rows)


def plot_speedups(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike[str], *,
                  group: str = "model", series: str = "method",
                  value: str = "measured_speedup", title: str = "",
                  exclude: Iterable[str] = ("original",)) -> bool:
  """A grouped bar chart of `value` per `group` (x) and `series` (bars) with a line at 1.0.

  Returns False (nothing written) when matplotlib is not installed.
  """
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    return False
  exclude = set(exclude)
  groups = list(dict.fromkeys(str(r[group]) for r in rows))
  names = list(dict.fromkeys(str(r[series]) for r in rows if r[series] not in exclude))
  def number(v: Any) -> float:
    try:
      return float(v)
    except (TypeError, ValueError):
      return float("nan")

  table = {(str(r[group]), str(r[series])): number(r.get(value)) for r in rows}
  width = 0.8 / max(len(names), 1)
  fig, ax = plt.subplots(figsize=(max(6.5, 0.45 * len(groups) * max(1, len(names)) + 3.0),
                                  4.0))
  x = np.arange(len(groups))
  for i, name in enumerate(names):
    ys = [table.get((g, name), np.nan) for g in groups]
    ax.bar(x + (i - (len(names) - 1) / 2) * width, np.nan_to_num(ys, nan=0.0), width,
           label=name)  # a failed method (nan) has no bar
  values = [v for v in table.values() if np.isfinite(v)] or [1.0]
  ax.set_ylim(min(0.9, min(values) - 0.05), max(1.1, max(values) + 0.05))
  ax.axhline(1.0, color="k", lw=0.8, ls="--")
  ax.set_xticks(x)
  ax.set_xticklabels(groups, rotation=30, ha="right")
  ax.set_ylabel(value.replace("_", " "))
  ax.set_title(title or f"{value.replace('_', ' ')} per {group}")
  ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True
