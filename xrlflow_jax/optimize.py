"""The main job: optimise a model's graph end to end and write the result with its evidence.

    report = optimize_model("squeezenet1_1", size="tiny", method="greedy", output_dir="/tmp/o")
    report = optimize_model("../shared/models/squeezenet1_1.onnx", method="ppo")
    print(report.table())

Pipeline (`optimize_model`):

  0. check      every argument (`check_request`) and, once loaded, memory (`check_memory`):
                one clear error before any work.
  1. load       a zoo model or an ONNX file (`workflow.load`; graph-only files get seeded random
                weights, which the report says), at `workflow.fitted_capacity`.
  2. search     "greedy" | "taso" | "beam" | "random": `search.optimize` on the cost model;
                "ppo": a short PPO training run (`xrlflow_jax/configs/ppo.py:test` settings, the
                budget in updates), then the trained policy as a search driver
                (`search.optimize(..., "policy")`); the better graph by modelled cost of the
                policy's and the best one training itself met is kept, either with its
                recorded rewrite sequence (training records the episode's rewrites; they are
                replayed and checked before the graph is kept).
  3. check      both graphs run on the same random inputs; every output must agree
                (max |a - b| / (1 + |a|) <= tolerance) or `NumericsError` is raised and nothing
                is written.
  4. measure    both graphs compiled by XLA and timed side by side (interleaved rounds):
                median and IQR.
  5. write      into the output directory: optimized.onnx (ONNX inputs), rewrites.json,
                report.json, best_graph.txt, graph.png (when matplotlib or graphviz is present).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from xrlflow_jax import compilation_cache, cost, ops, workflow
from xrlflow_jax import graph as G
from xrlflow_jax.configs import ppo as ppo_configs
from xrlflow_jax.errors import ShapeError, UsageError
from xrlflow_jax.graph import layout
from xrlflow_jax.measure import (DEFAULT_TOLERANCE, Comparison, MeasurementError,
                                 NumericsCheck, NumericsError, Speedup, check_numerics,
                                 check_settings, compare)
from xrlflow_jax.ops.spec import checked_dims
from xrlflow_jax.search.result import JOB_METHODS as METHODS
from xrlflow_jax.workflow import SIZES, Loaded, load, resolve
from xrlflow_jax.workflow import fit_capacity  # noqa: F401  (part of this module's API)

DEFAULT_MODEL = "squeezenet1_1"
# The random inputs, the weights and the two largest tensors must fit in this share of the
# device's memory before any search starts.
MEMORY_SHARE = 0.8
# What `budget` means for each search method (the option of `search.optimize` it sets).
BUDGET_OPTION = {"greedy": "max_steps", "taso": "budget", "beam": "steps", "random": "steps"}


class OptimizeError(UsageError):
  """Bad input to the optimise job: unknown method, bad shape text, budget, output path...
  (bad model names and files raise `workflow.LoadError`, also a UsageError)."""


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------

def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
  """"name=1,3,224,224" -> ("name", (1, 3, 224, 224)); OptimizeError names bad text."""
  name, sep, dims = text.rpartition("=")
  name = name.strip()
  if not sep or not name:
    raise OptimizeError(f"bad input shape {text!r}: expected name=d0,d1,... "
                        "(e.g. x=1,3,224,224)")
  parts = [d.strip() for d in dims.split(",")]
  if not parts or not all(re.fullmatch(r"\d+", d) for d in parts):
    raise OptimizeError(f"bad input shape {text!r}: the dims of {name!r} must be positive "
                        f"integers separated by commas, got {dims!r}")
  return name, check_shape(name, [int(d) for d in parts])


def check_shape(name: str, dims: Sequence[Any]) -> tuple[int, ...]:
  """A whole input shape checked by `ops.spec.checked_dims` (integers in [1, 2^31 - 1], at most
  2^31 - 1 elements); OptimizeError names the input and the flag."""
  try:
    return checked_dims(dims)
  except ShapeError as e:
    raise OptimizeError(f"input {name!r}: {e} (--input_shape={name}=d0,d1,...)") from None


def parse_input_shapes(texts: Sequence[str]) -> dict[str, tuple[int, ...]]:
  """Several `parse_input_shape` texts as {name: shape}; a repeated name is an error."""
  out: dict[str, tuple[int, ...]] = {}
  for t in texts:
    name, shape = parse_input_shape(t)
    if name in out:
      raise OptimizeError(f"input {name!r} is given two shapes ({out[name]} and {shape})")
    out[name] = shape
  return out


def load_source(source: str, *, size: str = "tiny",
                input_shapes: Mapping[str, Sequence[int]] | None = None,
                capacity: int | None = None, seed: int = 0) -> Loaded:
  """`workflow.load` with the optimise job's default size ("tiny")."""
  return load(source, size=size, input_shapes=input_shapes, capacity=capacity, seed=seed)


# ----------------------------------------------------------------------------------------------
# Searching
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Found:
  """A search's outcome in the form the report needs.

  Attributes:
    graph: the best graph; cost_ms: its modelled cost; initial_cost_ms: the input's.
    rewrites: JSON-ready steps that replay onto the input (`search.replay`), or None when
      unknown (no component of the job returns such a graph).
    found_by: "greedy", ..., "policy" or "training".
    details: extra figures for report.json.
  """
  graph: layout.Graph
  cost_ms: float
  initial_cost_ms: float
  rewrites: list[dict[str, Any]] | None
  found_by: str
  details: dict[str, Any]


def _search_module():
  from xrlflow_jax import search  # pylint: disable=g-import-not-at-top
  return search


def _found_from_result(result: Any, found_by: str) -> Found:
  """A `search.SearchResult` as a Found."""
  data = result.to_json()
  details = {k: data[k] for k in ("seconds", "graphs_expanded", "candidates_costed",
                                  "returned_input", "found_cost_ms", "found_rewrites",
                                  "options") if k in data}
  return Found(layout.to_host(result.best_graph), float(result.best_cost_ms),
               float(result.initial_cost_ms), [r.to_json() for r in result.rewrites],
               found_by, details)


def run_search(loaded: Loaded, method: str, coeffs: cost.CostCoefficients, *, seed: int = 0,
               rules: Sequence[str] | None = None, max_locations: int = 16,
               options: Mapping[str, Any] | None = None) -> Found:
  """A baseline search ("greedy", "taso", "beam", "random") on the cost model."""
  search = _search_module()
  ruleset = _ruleset(rules, max_locations) if rules else search.default_ruleset(loaded.graph)
  result = search.optimize(loaded.graph, loaded.params, method, ruleset, coeffs, measure=False,
                           seed=seed, **dict(options or {}))
  found = _found_from_result(result, method)
  found.details.update(_ruleset_details(ruleset, default=search.is_default(ruleset)))
  if not rules:
    from xrlflow_jax.rules.library import builtin_rules  # pylint: disable=g-import-not-at-top
    found.details["rules_kept"] = (f"{len(ruleset)} of {len(builtin_rules())} built-in rules "
                                   "can fire on this graph")
  return found


def _ruleset_details(ruleset: Any, default: bool = False) -> dict[str, Any]:
  """What replaying needs to rebuild the rule set: rule names (["all"] for the search's
  default, every built-in rule) and locations per rule."""
  return {"rules": ["all"] if default else list(ruleset.names),
          "max_locations": int(ruleset.max_locations)}


def ruleset_for_replay(rewrites_json: Mapping[str, Any]):
  """The RuleSet a rewrites.json was found with (for `search.replay`)."""
  if rewrites_json.get("rules") in (None, ["all"]):
    return _search_module().default_ruleset()
  return _ruleset(rewrites_json["rules"], int(rewrites_json["max_locations"]))


def _ruleset(names: Sequence[str], max_locations: int):
  """`workflow.ruleset` (one cached object per (names, max_locations), so the search's compiled
  Expander is reused by later calls); unknown names: OptimizeError listing the built-in rules."""
  try:
    return workflow.ruleset(names, max_locations)
  except workflow.RuleSelectionError as e:
    raise OptimizeError(str(e)) from None


@functools.lru_cache(maxsize=4)
def _coefficients(path: str) -> cost.CostCoefficients:
  """Cost-model coefficients from a JSON file ("": the shipped fit), loaded once per process."""
  return cost.load_coefficients(path=path or None)


def ppo_config(budget: int | None = None, seed: int = 0, rules: Sequence[str] | None = None):
  """The short-run PPO config: `configs.ppo.get_config("test")` with `budget` updates."""
  c = ppo_configs.get_config("test")
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
  """The rule set PPO trains with when none is given: the test config's five conv rules
  (SqueezeNet's enlarge-then-merge situation) when one of them applies, else the default
  config's wider set, else every built-in rule. OptimizeError when no rule applies at all."""
  for names in (ppo_configs.TEST_RULES, ppo_configs.DEFAULT_RULES, ("all",)):
    if rules_match(graph, names, max_locations):
      return tuple(names)
  raise OptimizeError("no built-in rule applies anywhere in this graph; nothing to optimise")


def train_ppo(loaded: Loaded, config: Any, coeffs: cost.CostCoefficients,
              log: Callable[[str], None] = print):
  """Builds the environment, agent and trainer on `loaded` and trains in chunks.

  Returns:
    (trainer, ruleset, runner_state, seconds): the final RunnerState holds the network params
    (`.params`) and the best graph training met (`.best_graph`, `.best_cost`, leading [1]).
  """
  from xrlflow_jax.agents import runs  # pylint: disable=g-import-not-at-top

  ruleset = _ruleset(config.env.rules, int(config.env.max_locations))
  run = runs.build(config, jax.devices()[:1], coeffs, ruleset=ruleset,
                   pool=([loaded.label], [loaded.graph], [loaded.params]))
  trainer = run.trainer
  t0 = time.perf_counter()
  state = trainer.init(jax.random.PRNGKey(int(config.seed)))
  total = trainer.config.num_updates
  chunk = _chunk_size(total, int(config.updates_per_chunk))
  done = 0
  while done < total:
    state, metrics = trainer.run(state, chunk)
    done += chunk
    ret = float(np.nanmean(np.asarray(metrics["episode_return"])[-1:]))
    best = float(np.asarray(state.best_cost)[0] / np.asarray(state.initial_cost)[0])
    log(f"  ppo update {done}/{total}: return {ret:.3f}, best cost ratio {best:.4f} "
        f"({time.perf_counter() - t0:.1f}s)")
  return trainer, ruleset, state, time.perf_counter() - t0


def _chunk_size(num_updates: int, wanted: int) -> int:
  """The largest divisor of num_updates that is <= wanted."""
  wanted = max(1, min(wanted, num_updates))
  return max(d for d in range(1, wanted + 1) if num_updates % d == 0)


def run_ppo(loaded: Loaded, coeffs: cost.CostCoefficients, *, budget: int | None = None,
            seed: int = 0, rules: Sequence[str] | None = None,
            options: Mapping[str, Any] | None = None,
            log: Callable[[str], None] = print) -> Found:
  """Short PPO training, then the policy as a search driver; the better graph by modelled cost
  of the policy's result and the best graph training met (ties go to the policy, whose rewrite
  sequence is known)."""
  config = ppo_config(budget, seed, rules)
  if not rules:
    config.env.rules = default_ppo_rules(loaded.graph, int(config.env.max_locations))
  trainer, ruleset, state, train_s = train_ppo(loaded, config, coeffs, log)
  train_cost = float(np.asarray(state.best_cost)[0])
  train_graph = layout.to_host(jax.tree_util.tree_map(lambda a: np.asarray(a)[0],
                                                      state.best_graph))
  details: dict[str, Any] = {"train_seconds": train_s, "train_updates":
                             trainer.config.num_updates, "train_best_cost_ms": train_cost,
                             **_ruleset_details(ruleset)}
  search = _search_module()
  policy = search.optimize(loaded.graph, loaded.params, "policy", ruleset, coeffs, measure=False,
                           seed=seed, **_policy_options(trainer, state, options))
  found = _found_from_result(policy, "policy")
  log(f"  policy: modelled cost {found.initial_cost_ms:.4f} -> {found.cost_ms:.4f} ms with "
      f"{len(found.rewrites or [])} rewrites; training's best {train_cost:.4f} ms")
  details.update({"policy_cost_ms": found.cost_ms, "policy": found.details})
  if train_cost < found.cost_ms * (1.0 - 1e-6):
    steps = training_rewrites(loaded.graph, ruleset, state, train_graph)
    if steps is None:  # cannot happen unless replay and the environment disagree: say so
      details["training_replay"] = "mismatch: the policy's graph is returned instead"
      log("  training's best graph does not replay from its recorded rewrites; the policy's "
          "graph is returned")
    else:
      found = Found(train_graph, train_cost, found.initial_cost_ms, steps, "training", {})
      details["training_rewrites"] = len(steps)
  found.details = details
  return found


def training_rewrites(graph: layout.Graph, ruleset: Any, state: Any,
                      best_graph: layout.Graph, index: int = 0) -> list[dict[str, Any]] | None:
  """The recorded rewrites of the best graph training met for pool graph `index` (the rows of
  `RunnerState.best_rewrites`), as JSON-ready `search.RewriteStep`s, checked by replaying them
  onto `graph`: None when the replay does not rebuild `best_graph` (same structural hash)."""
  search = _search_module()
  count = int(np.asarray(state.best_num_rewrites)[index])
  rows = np.asarray(state.best_rewrites)[index][:count]
  steps = [search.RewriteStep(ruleset.names[int(r[0])], int(r[0]), int(r[1]),
                              tuple(int(v) for v in r[2:])) for r in rows]
  try:
    replayed = search.replay(graph, ruleset, steps)
  except search.SearchError:
    return None
  if G.structural_hash(replayed) != G.structural_hash(best_graph):
    return None
  return [s.to_json() for s in steps]


def _policy_options(trainer: Any, state: Any, options: Mapping[str, Any] | None
                    ) -> dict[str, Any]:
  """Keyword arguments that hand the trained agent to the policy driver."""
  opts = dict(options or {})
  opts.setdefault("agent", trainer.agent)
  opts.setdefault("network_params", state.params)
  opts.setdefault("env", trainer.env)
  return opts


# ----------------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class OptimizeReport:
  """What `optimize_model` did and found (see `to_json` for report.json).

  Attributes:
    source, label, kind ("zoo" | "onnx"), method, found_by ("policy" | "training" | method).
    random_weights: initializers given seeded random values (graph-only ONNX files).
    nodes_before, nodes_after: alive nodes; cost_before_ms, cost_after_ms: modelled cost.
    latency_before, latency_after: XLA latency measured side by side, or None.
    measured: the speedup verdict of the graph returned (`measure.Speedup`; "unchanged" when
      the input is returned), or None when not measured.
    numerics: the output comparison; rewrites: the replayable steps (None: not recorded).
    hash_before, hash_after: structural hashes; seconds: {stage: wall seconds}.
    output_dir: where files were written ("" when none); files: {kind: path}.
    details: the search's own figures.
    input_graph, graph, params: the loaded graph, the optimised one and their weights (not in
      report.json).
  """
  source: str
  label: str
  kind: str
  method: str
  found_by: str
  random_weights: int
  nodes_before: int
  nodes_after: int
  cost_before_ms: float
  cost_after_ms: float
  latency_before: cost.LatencyStats | None
  latency_after: cost.LatencyStats | None
  numerics: NumericsCheck
  rewrites: list[dict[str, Any]] | None
  hash_before: str
  hash_after: str
  seconds: dict[str, float]
  output_dir: str = ""
  files: dict[str, str] = dataclasses.field(default_factory=dict)
  details: dict[str, Any] = dataclasses.field(default_factory=dict)
  input_graph: Any = dataclasses.field(default=None, repr=False)
  graph: Any = dataclasses.field(default=None, repr=False)
  params: Any = dataclasses.field(default=None, repr=False)
  measured: Speedup | None = None

  @property
  def modelled_speedup(self) -> float:
    return self.cost_before_ms / self.cost_after_ms if self.cost_after_ms > 0 else 1.0

  @property
  def measured_speedup(self) -> float | None:
    """The measured speedup of a changed graph (`measured.ratio`); None when not measured or
    when the graph returned is the input (nothing was timed against itself)."""
    if self.measured is None or self.measured.verdict == "unchanged":
      return None
    return self.measured.ratio

  def to_json(self) -> dict[str, Any]:
    """A JSON-ready dict."""
    def lat(s: cost.LatencyStats | None) -> dict[str, Any] | None:
      if s is None:
        return None
      return {**dataclasses.asdict(s), "iqr_ms": s.iqr_ms}
    return {
        "source": self.source, "label": self.label, "kind": self.kind, "method": self.method,
        "found_by": self.found_by, "random_weights": self.random_weights,
        "nodes_before": self.nodes_before, "nodes_after": self.nodes_after,
        "cost_before_ms": self.cost_before_ms, "cost_after_ms": self.cost_after_ms,
        "modelled_speedup": self.modelled_speedup, "measured_speedup": self.measured_speedup,
        "measured": None if self.measured is None else self.measured.to_json(),
        "latency_before": lat(self.latency_before), "latency_after": lat(self.latency_after),
        "numerics": dataclasses.asdict(self.numerics),
        "num_rewrites": None if self.rewrites is None else len(self.rewrites),
        "hash_before": self.hash_before, "hash_after": self.hash_after,
        "seconds": self.seconds, "output_dir": self.output_dir, "files": self.files,
        "details": _jsonable(self.details),
    }

  def table(self) -> str:
    """The before/after table printed by the CLI."""
    def lat(s: cost.LatencyStats | None) -> str:
      return "not measured" if s is None else f"{s.median_ms:.4f} ms ± {s.iqr_ms / 2:.4f}"
    meas = self.measured_speedup
    n = self.numerics
    rows = [
        ("", "before", "after"),
        ("nodes", str(self.nodes_before), str(self.nodes_after)),
        ("modelled cost", f"{self.cost_before_ms:.4f} ms", f"{self.cost_after_ms:.4f} ms"),
        ("XLA latency (median ± IQR/2)", lat(self.latency_before), lat(self.latency_after)),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines = [f"{a:<{w0}}  {b:>{w1}}  {c}" for a, b, c in rows]
    device = (f" on {self.latency_after.device_kind} ({self.latency_after.backend})"
              if self.latency_after else "")
    nrw = "unrecorded" if self.rewrites is None else str(len(self.rewrites))
    returned = (": no rewrite lowered the modelled cost, the input is returned"
                if self.details.get("returned_input") else "")
    if "measured_guard" in self.details:
      g = self.details["measured_guard"]
      returned = (f": the {g['rejected_found_by']} graph ({g['rejected_rewrites']} rewrites, "
                  f"modelled {g['rejected_cost_ms']:.4f} ms) measured "
                  f"{g['rejected_latency_median_ms']:.4f} ms, speedup {g['rejected_speedup']}, "
                  "not significantly faster than the input: the input is returned")
    lines += [
        f"speedup: modelled x{self.modelled_speedup:.3f}, measured "
        + ("not measured" if self.measured is None else
           f"{self.measured.describe()}{device if meas is not None else ''}"),
        f"rewrites: {nrw} (found by {self.found_by}){returned}",
        f"numerics: {n.describe()}",
        "time: " + ", ".join(f"{k} {v:.1f}s" for k, v in self.seconds.items()),
    ]
    if self.random_weights:
      lines.append(f"note: {self.random_weights} initializers had no data in the file and were "
                   "given seeded random weights")
    return "\n".join(lines)


def _jsonable(v: Any) -> Any:
  if isinstance(v, (bool, int, str)) or v is None:
    return v
  if isinstance(v, (float, np.floating)):
    f = float(v)
    return f if math.isfinite(f) else None
  if isinstance(v, np.integer):
    return int(v)
  if isinstance(v, (list, tuple)):
    return [_jsonable(x) for x in v]
  if isinstance(v, dict):
    return {str(k): _jsonable(x) for k, x in v.items()}
  return repr(v)


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------

def write_outputs(report: OptimizeReport, loaded: Loaded, best: layout.Graph, out_dir: Path, *,
                  picture: bool = True, log: Callable[[str], None] = print) -> dict[str, str]:
  """Writes the files into a fresh folder beside `out_dir`, then moves it into place, so a
  failure (an ONNX export error) leaves no partial output. Returns {kind: path}."""
  out_dir = Path(out_dir)
  out_dir.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
  try:
    files = _write_files(report, loaded, best, tmp, picture, log)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in os.listdir(tmp):
      os.replace(tmp / name, out_dir / name)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return {k: str(out_dir / v) for k, v in files.items()}


def _write_files(report: OptimizeReport, loaded: Loaded, best: layout.Graph, folder: Path,
                 picture: bool, log: Callable[[str], None]) -> dict[str, str]:
  """Writes every output into `folder`; returns {kind: file name}."""
  files: dict[str, str] = {}
  if loaded.kind == "onnx":
    from xrlflow_jax import onnx_io  # pylint: disable=g-import-not-at-top
    onnx_io.save(best, loaded.params, folder / "optimized.onnx")
    files["onnx"] = "optimized.onnx"
  (folder / "rewrites.json").write_text(json.dumps(
      {"source": report.source, "method": report.method, "found_by": report.found_by,
       "rules": report.details.get("rules"),
       "max_locations": report.details.get("max_locations"), "hash_before": report.hash_before,
       "hash_after": report.hash_after, "capacity": G.capacity(loaded.graph),
       "recorded": report.rewrites is not None, "rewrites": report.rewrites or []},
      indent=2) + "\n")
  files["rewrites"] = "rewrites.json"
  (folder / "best_graph.txt").write_text(G.dump(best) + "\n")
  files["graph_text"] = "best_graph.txt"
  if picture:
    from xrlflow_jax import visualize  # pylint: disable=g-import-not-at-top
    how = visualize.draw_before_after(loaded.graph, best, folder / "graph.png",
                                      title=f"{report.label}: {report.method}")
    if how is None:
      log("graph picture: skipped (neither graphviz's dot nor matplotlib is installed)")
    else:
      files["picture"] = "graph.png"
  report.files = {k: str(v) for k, v in files.items()}
  (folder / "report.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
  files["report"] = "report.json"
  return files


def default_output_dir(label: str, method: str) -> Path:
  """/tmp/xrlflow_optimize/<label>_<method> (or $TMPDIR's)."""
  return Path(tempfile.gettempdir()) / "xrlflow_optimize" / f"{label}_{method}"


# ----------------------------------------------------------------------------------------------
# Checking (everything the job can refuse is refused before loading or searching)
# ----------------------------------------------------------------------------------------------

def _positive_int(value: Any, what: str) -> None:
  """OptimizeError unless `value` is None (the default) or an integer >= 1."""
  if value is None:
    return
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise OptimizeError(f"{what} must be a positive integer, got {value!r}")


def check_output_dir(path: str | os.PathLike) -> Path:
  """`path` can be written as the output folder: not an existing file, and its nearest existing
  ancestor is a writable folder. OptimizeError naming the path otherwise."""
  out = Path(path)
  if out.exists() and not out.is_dir():
    raise OptimizeError(f"output {str(out)!r} is an existing file, not a folder (--output)")
  parent = out
  while not parent.exists():
    parent = parent.parent
  if not parent.is_dir():
    raise OptimizeError(f"output {str(out)!r} cannot be created: {str(parent)!r} is a file "
                        "(--output)")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise OptimizeError(f"output {str(out)!r} is not writable: no write permission on "
                        f"{str(parent)!r} (--output)")
  return out


def check_request(source: str, *, method: str, size: str,
                  input_shapes: Mapping[str, Sequence[int]] | None, output_dir: Any,
                  budget: int | None, capacity: int | None, latency_rounds: int,
                  repeats_per_round: int, tolerance: float,
                  write: bool) -> dict[str, tuple[int, ...]]:
  """Every argument of `optimize_model` that can be checked without loading: OptimizeError
  (or MeasurementError) naming the argument. Returns the input shapes as int tuples."""
  if method not in METHODS:
    raise OptimizeError(f"unknown method {method!r}; methods are {', '.join(METHODS)}")
  if size not in SIZES:
    raise OptimizeError(f"unknown size {size!r}; sizes are {', '.join(SIZES)}")
  _positive_int(budget, "the budget (--budget)")
  _positive_int(capacity, "the capacity (--capacity)")
  if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance >= 0):
    raise OptimizeError(f"the numerics tolerance must be a finite number >= 0, got "
                        f"{tolerance!r}")
  try:  # checked even with measure_latency=False: a bad value is a mistake either way
    check_settings(latency_rounds, repeats_per_round)
  except MeasurementError as e:
    raise OptimizeError(f"{e} (--latency_rounds, --repeats_per_round)") from None
  shapes = {}
  for name, dims in dict(input_shapes or {}).items():
    shapes[str(name)] = check_shape(str(name), dims)
  spec = resolve(source, size)  # LoadError: unknown name, a folder, a missing file
  if shapes and not spec.is_onnx:
    raise OptimizeError("input shapes apply to ONNX files only; zoo models have fixed shapes")
  if write and output_dir:
    check_output_dir(output_dir)
  return shapes


def memory_need(graph: layout.Graph) -> tuple[int, int, int, str]:
  """(bytes of the graph's inputs, of its constants, of its largest tensor, that tensor as
  "node 12 (MATMUL) [1024, 4096] float32"). Padded dims are 1, so a row's product is its size;
  float64 keeps products of int32 dims exact enough for a memory estimate."""
  nd = G.to_arrays(graph)
  alive = nd["alive"]
  nbytes = np.prod(nd["shape"].astype(np.float64), axis=1) * \
      np.asarray(ops.dtype_size(np, nd["dtype"]), np.float64)
  nbytes = np.where(alive, nbytes, 0.0)
  inputs = int(nbytes[nd["op"] == int(ops.Op.INPUT)].sum())
  consts = int(nbytes[nd["op"] == int(ops.Op.CONSTANT)].sum())
  v = int(np.argmax(nbytes))
  shape = [int(d) for d in ops.unpad_shape(nd["shape"][v], nd["rank"][v])]
  what = (f"node {v} ({ops.Op(int(nd['op'][v])).name}) {shape} "
          f"{ops.DType(int(nd['dtype'][v])).name.lower()}")
  return inputs, consts, int(nbytes[v]), what


def device_memory_bytes() -> int:
  """Memory of the default device: its allocator's limit (GPUs), else the host's RAM."""
  try:
    stats = jax.devices()[0].memory_stats() or {}
  except Exception:  # pylint: disable=broad-except
    stats = {}
  if stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def check_memory(loaded: Loaded) -> None:
  """OptimizeError, before any search, when the graph cannot run here: its random inputs (a
  host copy and a device copy), its weights and two tensors the size of its largest above
  MEMORY_SHARE of the device's memory."""
  inputs, consts, largest, what = memory_need(loaded.graph)
  need, have = 2 * inputs + consts + 2 * largest, device_memory_bytes()
  if need > MEMORY_SHARE * have:
    gib = 2.0**30
    raise OptimizeError(f"{loaded.label} needs about {need / gib:.1f} GiB to run (inputs "
                        f"{inputs / gib:.1f} GiB, weights {consts / gib:.1f} GiB, largest "
                        f"tensor {what} {largest / gib:.1f} GiB), more than "
                        f"{MEMORY_SHARE:.0%} of the {have / gib:.1f} GiB here; give smaller "
                        "--input_shape dims")


# ----------------------------------------------------------------------------------------------
# The job
# ----------------------------------------------------------------------------------------------

def measured_guard(loaded: Loaded, found: Found, comparison: Comparison
                   ) -> tuple[Found, cost.LatencyStats, Speedup]:
  """Keeps the search's graph only if XLA measured it significantly faster than the input.

  Args:
    comparison: `measure.compare(loaded.graph, [found.graph], ...)`.
  Returns:
    (found, its latency, its Speedup) when the verdict is "faster" or the graph is unchanged;
    otherwise the input itself (no rewrites, modelled cost of the input) with the input's
    latency and an "unchanged" Speedup, and what was rejected in `details["measured_guard"]`.
  """
  after, verdict = comparison.candidates[0], comparison.speedups[0]
  if verdict.verdict in ("faster", "unchanged"):
    return found, after, verdict
  details = dict(found.details)
  details["returned_input"] = True
  details["measured_guard"] = {
      "rejected_found_by": found.found_by, "rejected_cost_ms": found.cost_ms,
      "rejected_rewrites": None if found.rewrites is None else len(found.rewrites),
      "rejected_latency_median_ms": after.median_ms, "rejected_latency_iqr_ms": after.iqr_ms,
      "input_latency_median_ms": comparison.reference.median_ms,
      "rejected_speedup": verdict.describe(), "rejected_verdict": verdict.to_json()}
  kept = Found(loaded.graph, found.initial_cost_ms, found.initial_cost_ms, [], found.found_by,
               details)
  return kept, comparison.reference, Speedup.unchanged()


def optimize_model(source: str = DEFAULT_MODEL, *, method: str = "ppo", size: str = "tiny",
                   input_shapes: Mapping[str, Sequence[int]] | None = None,
                   output_dir: str | os.PathLike | None = None, budget: int | None = None,
                   seed: int = 0, capacity: int | None = None,
                   rules: Sequence[str] | None = None, search_options:
                   Mapping[str, Any] | None = None, measure: bool = True,
                   latency_rounds: int = 10, repeats_per_round: int = 3,
                   tolerance: float = DEFAULT_TOLERANCE, picture: bool = True,
                   cost_coefficients: str | None = None, write: bool = True,
                   keep_slower: bool = False, compilation_cache_dir: str | None = None,
                   log: Callable[[str], None] = print) -> OptimizeReport:
  """Optimises a model and writes the result with its evidence (see the module docstring).

  Args:
    source: a zoo model name or an .onnx path.
    method: "ppo" (short training + policy), "greedy", "taso", "beam" or "random".
    size: zoo size; input_shapes: ONNX dynamic input shapes {name: shape}.
    output_dir: where to write (default `default_output_dir`).
    budget: "ppo": PPO updates (default: the test config's 12); other methods: greedy's
      max_steps, taso's budget (graphs expanded), beam's and random's steps (see
      BUDGET_OPTION); None: the search's default.
    seed: weights, search and training seed; capacity: node slots (default auto).
    rules: rule names (default: every built-in rule for the searches; for "ppo"
      `default_ppo_rules`, the test config's five when they apply).
    search_options: extra keyword options of `search.optimize`.
    measure: time both graphs with XLA (latency_rounds x repeats_per_round runs each).
    tolerance: bound on max |a - b| / (1 + |a|) of the outputs.
    picture: draw graph.png; cost_coefficients: a JSON file ("": the shipped fit).
    write: write the output files (False: only return the report).
    keep_slower: keep the optimised graph even when XLA measured it no faster than the input
      (default: the input is returned instead, see `measured_guard`).
    compilation_cache_dir: JAX's persistent compilation cache (None: `$XRLFLOW_COMPILATION_CACHE`
      or the per-user default; "off": none), see `compilation_cache.enable`.
  Raises:
    OptimizeError (bad input), OnnxImportError, NumericsError (nothing written), SearchError.
  """
  input_shapes = check_request(
      str(source), method=method, size=size, input_shapes=input_shapes, output_dir=output_dir,
      budget=budget, capacity=capacity, latency_rounds=latency_rounds,
      repeats_per_round=repeats_per_round, tolerance=tolerance, write=write)
  cache_dir = compilation_cache.enable(compilation_cache_dir)
  times: dict[str, float] = {}
  t = time.perf_counter()
  loaded = load_source(str(source), size=size, input_shapes=input_shapes, capacity=capacity,
                       seed=seed)
  check_memory(loaded)
  out = Path(output_dir) if output_dir else default_output_dir(loaded.label, method)
  if write:
    check_output_dir(out)
  times["load"] = time.perf_counter() - t
  log(f"loaded {loaded.label} ({loaded.kind}): {G.num_nodes(loaded.graph)} nodes, capacity "
      f"{G.capacity(loaded.graph)}" + (f"; {loaded.random_weights} initializers given random "
                                       "weights (the file has no weight data)"
                                       if loaded.random_weights else ""))
  for note in getattr(getattr(loaded.params, "stats", None), "notes", ()):  # ONNX import notes
    log(f"note: {note}")
  coeffs = _coefficients(cost_coefficients or "")

  t = time.perf_counter()
  log(f"searching with {method}" + (f" (budget {budget})" if budget else "") + " ...")
  if method == "ppo":
    found = run_ppo(loaded, coeffs, budget=budget, seed=seed, rules=rules,
                    options=search_options, log=log)
  else:
    opts = dict(search_options or {})
    if budget is not None:
      opts.setdefault(BUDGET_OPTION[method], int(budget))
    found = run_search(loaded, method, coeffs, seed=seed, rules=rules, options=opts)
  times["search"] = time.perf_counter() - t
  found.details["compilation_cache"] = str(cache_dir) if cache_dir else "off"
  compiled = float(found.details.get("options", {}).get("compile_seconds", 0.0))
  if compiled:  # the search's first calls of each compiled shape, reported on their own
    times["compile"] = compiled
    times["search"] -= compiled

  t = time.perf_counter()
  best = found.graph
  G.validate(best, loaded.params)
  lat_before = lat_after = verdict = None
  if measure:  # one set of compiles: the timed executables' outputs are the numerics check
    comparison = compare(loaded.graph, [best], loaded.params, rounds=latency_rounds,
                         repeats_per_round=repeats_per_round, seed=seed, tolerance=tolerance)
    numerics = comparison.numerics[0]
    lat_before, lat_after, verdict = (comparison.reference, comparison.candidates[0],
                                      comparison.speedups[0])
    times["check+measure"] = time.perf_counter() - t
  else:
    numerics = check_numerics(loaded.graph, best, loaded.params, seed=seed, tolerance=tolerance)
    times["check"] = time.perf_counter() - t
  if not numerics.passed:
    raise NumericsError(f"the optimised graph's outputs differ from the original's: "
                        f"{numerics.describe()}; nothing was written")
  if measure:
    if not keep_slower:
      found, lat_after, verdict = measured_guard(loaded, found, comparison)
      if "measured_guard" in found.details:
        log(f"measured: the optimised graph is not significantly faster than the input "
            f"({comparison.speedups[0].describe()}): the input is kept")
        best = loaded.graph

  report = OptimizeReport(
      source=str(source), label=loaded.label, kind=loaded.kind, method=method,
      found_by=found.found_by, random_weights=loaded.random_weights,
      nodes_before=G.num_nodes(loaded.graph), nodes_after=G.num_nodes(best),
      cost_before_ms=found.initial_cost_ms, cost_after_ms=found.cost_ms,
      latency_before=lat_before, latency_after=lat_after, measured=verdict, numerics=numerics,
      rewrites=found.rewrites, hash_before=G.structural_hash(loaded.graph),
      hash_after=G.structural_hash(best), seconds=times, details=found.details,
      input_graph=loaded.graph, graph=best, params=loaded.params)
  if write:
    t = time.perf_counter()
    report.output_dir = str(out)
    times["write"] = 0.0
    report.files = write_outputs(report, loaded, best, out, picture=picture, log=log)
    times["write"] = time.perf_counter() - t
  times["total"] = sum(v for k, v in times.items() if k != "total")
  if write:  # report.json carries the final times
    Path(report.files["report"]).write_text(json.dumps(report.to_json(), indent=2) + "\n")
  return report
