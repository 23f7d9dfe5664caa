"""The end-to-end experiment binaries in their smallest settings: `experiments.benchmark` and
`experiments.evaluate` run as subprocesses (as a user would) and write their table, CSV and PNG.

Each run compiles searches, a PPO update and the measured graphs, so the default test runs the
benchmark on one tiny model with two searches; anything that trains PPO (the full `--quick`
benchmark, the evaluation) is marked slow (`python -m pytest -m slow`).
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from xrlflow_jax import cost, measure
from xrlflow_jax.harness import device_report

REPO = Path(__file__).resolve().parents[1]
HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


def _run(module: str, *args: str, timeout: int = 600, env: dict[str, str] | None = None) -> str:
  """Runs `python -m module args` from the repository root (in `env`, default this process's
  environment); its stdout (fails on rc != 0)."""
  env = dict(os.environ if env is None else env)
  env["JAX_PLATFORMS"] = env.get("JAX_PLATFORMS", "cpu")
  proc = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=timeout, check=False)
  assert proc.returncode == 0, f"{module} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
  return proc.stdout


def _rows(path: Path) -> list[dict[str, str]]:
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def _check_outputs(out: Path, stem: str, methods: set[str]) -> list[dict[str, str]]:
  """The markdown (machine header + table), CSV (every method, measured) and PNG exist."""
  md = (out / f"{stem}.md").read_text()
  for key in ("date:", "backend:", "cpu:", "| method |"):
    assert key in md, f"{key!r} missing from {stem}.md"
  rows = _rows(out / f"{stem}.csv")
  assert methods <= {r["method"] for r in rows}, rows
  for r in rows:
    assert r["note"].find("OUTPUTS DIFFER") < 0, r
    if r["method"] == "original":
      assert float(r["latency_ms"]) > 0 and float(r["measured_speedup"]) == 1.0
  if HAVE_MPL:
    png = out / "speedup.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  return rows


def test_benchmark_quick_one_model(tmp_path, xla_defaults_env):
  """--quick on tiny BERT, two rules, two searches: every figure present and measured, every
  graph's outputs equal the original's. The one default-suite run under XLA's default code
  generation (the rest of the suite compiles with conftest's FAST_COMPILE_XLA_FLAGS)."""
  from xrlflow_jax import onnx_io, workflow  # pylint: disable=g-import-not-at-top
  out = tmp_path / "bench"
  # "Another optimiser's output": the same tiny BERT with the same weights, as an ONNX file.
  loaded, = workflow.load_many([workflow.resolve("bert", "tiny")], seed=0)
  theirs = tmp_path / "theirs.onnx"
  onnx_io.save(loaded.graph, loaded.params, theirs)
  stdout = _run("experiments.benchmark", "--quick", "--models=bert", "--methods=greedy,beam",
                "--rules=matmul_gelu_fuse,add_commute", f"--output={out}",
                f"--against=bert={theirs}", env=xla_defaults_env)
  assert "| model |" in stdout and "backend:" in stdout
  # Each model's rows are printed (and the files written) when it finishes, then the whole table.
  assert stdout.count("| model |") == 2
  assert "partial:" not in (out / "benchmark.md").read_text()  # the run finished
  rows = _check_outputs(out, "benchmark", {"original", "greedy", "beam", "against:theirs.onnx"})
  against = [r for r in rows if r["method"] == "against:theirs.onnx"]
  assert len(against) == 1 and against[0]["status"] == "ok", against  # timed, outputs equal
  assert float(against[0]["max_rel_error"]) < 1e-5 and against[0]["verdict"], against
  for r in rows:
    assert r["model"] == "bert"
    assert float(r["env_steps_per_s"]) > 0
    if r["method"] in ("greedy", "beam"):  # the optimise job's guard: faster, or the input
      kept = r["verdict"] in ("faster", "unchanged")
      assert float(r["returned_speedup"]) == (float(r["measured_speedup"]) if kept else 1.0)
      # Where a search's time went: parts of its wall time, measured.
      compile_s, kernel_s = float(r["compile_seconds"]), float(r["kernel_seconds"])
      assert 0.0 <= compile_s <= float(r["seconds"]) and 0.0 <= kernel_s <= float(r["seconds"])
      # The rule families of its path: one count per rewrite, of the two rules' families.
      counts = [part.rsplit(" ", 1) for part in r["families"].split(", ") if part]
      assert sum(int(n) for _, n in counts) == int(r["rewrites"]), r
      assert {f for f, _ in counts} <= {"matmul_activation", "elementwise_algebra"}, r
      if r["returned"] == "input":
        assert r["families_returned"] == "", r
      elif r["returned"] == "graph":
        assert r["families_returned"] == r["families"], r
    assert float(r["latency_ms"]) > 0, r  # no method failed
    assert float(r["modelled_speedup"]) >= 1.0 - 1e-6  # the modelled guard
    assert int(r["nodes"]) > 0


def test_benchmark_rows_say_what_the_measured_guard_returns():
  """`returned_speedup`: a method's measured speedup when its verdict keeps its graph
  ("faster", "unchanged"), the input's 1.0 otherwise, never above what was measured faster;
  n/a for another optimiser's graph (no guard of ours applies to it)."""
  from tests._graphs import toy_graph  # pylint: disable=g-import-not-at-top
  from xrlflow_jax import measure  # pylint: disable=g-import-not-at-top
  from xrlflow_jax.harness import benchmark as B  # pylint: disable=g-import-not-at-top
  graph, _ = toy_graph()

  def stats(ms: float) -> measure.LatencyStats:
    return measure.LatencyStats(ms, 0.9 * ms, 1.1 * ms, 10, 0.0, "cpu", "cpu")

  def verdict(name: str, ratio: float) -> measure.Speedup:
    return measure.Speedup(ratio, ratio - 0.01, ratio + 0.01, 1.0, 0.99, 1.01, name, 0.95, 10)
  names = ["faster", "no change", "slower", "unchanged", "faster"]
  ratios = [1.25, 1.04, 0.8, 1.0, 1.1]
  methods = ["taso", "greedy", "beam", "random", f"{B.AGAINST_PREFIX}theirs.onnx"]
  outcomes = [B.Outcome(m, graph, 1.0) for m in methods]
  measured = B.Measured(stats(1.0), [stats(1.0 / r) for r in ratios],
                        [verdict(n, r) for n, r in zip(names, ratios)],
                        [measure.NumericsCheck(0.0, 0.0, 1, 1e-3, True)] * len(methods))
  rows = B.outcome_rows({"model": "toy"}, B.Outcome("original", graph, 1.0), outcomes, measured)
  returned = [r["returned_speedup"] for r in rows]
  assert returned[:5] == [1.0, 1.25, 1.0, 1.0, 1.0] and math.isnan(returned[5])
  assert [r["returned"] for r in rows] == ["", "graph", "input", "input", "graph", ""]

  # The rule families of each path, and of the part of it the guard returns.
  path = ("layout", "conv_activation", "layout", "merge_conv")
  outcomes = [dataclasses.replace(o, families=path) for o in outcomes]
  rows = B.outcome_rows({"model": "toy"}, B.Outcome("original", graph, 1.0), outcomes, measured)
  assert {r["families"] for r in rows[1:]} == {"layout 2, conv_activation 1, merge_conv 1"}
  assert [r["families_returned"] for r in rows] == [
      "", "layout 2, conv_activation 1, merge_conv 1", "", "",
      "layout 2, conv_activation 1, merge_conv 1", ""]  # another optimiser's: no guard of ours
  measured = dataclasses.replace(measured, returned=[(1.2, "first 3"), (1.0, "input"),
                                                    (1.0, "input"), (1.1, "first 1"), None])
  rows = B.outcome_rows({"model": "toy"}, B.Outcome("original", graph, 1.0), outcomes, measured)
  assert [r["families_returned"] for r in rows] == [
      "", "layout 2, conv_activation 1", "", "", "layout 1", ""]

  # With prefixes timed in the same rounds: the fastest measured faster at the Bonferroni
  # level of 1 + k verdicts (`measure.guard.checkpoint_level`), else the input.
  rng = np.random.default_rng(0)
  ref = 1.0 + 0.01 * rng.standard_normal(12)
  copy = ref * (1.0 + 0.005 * rng.standard_normal(12))
  def comparison(*ratios):
    return measure.Comparison(stats(1.0), stats(1.0), [], [verdict("no change", 1.0)] * len(ratios),
                              None, (ref, copy, [ref / r for r in ratios]))
  assert B._guarded(comparison(1.0, 1.3), [0, 1], [5], seed=0)[1] == "first 5"  # pylint: disable=protected-access
  assert B._guarded(comparison(1.0, 1.3), [0, 1], [5], seed=0)[0] == pytest.approx(1.3, rel=0.02)  # pylint: disable=protected-access
  assert B._guarded(comparison(1.4, 1.3), [0, 1], [5], seed=0)[1] == "graph"  # pylint: disable=protected-access
  assert B._guarded(comparison(0.9, 1.0), [0, 1], [5], seed=0) == (1.0, "input")  # pylint: disable=protected-access


def test_benchmark_guard_replays_the_optimise_jobs_looks():
  """With looks, "guard returns" is what the optimise job's guard returns on the same rounds:
  it looks again only while one of its own changed graphs is "no change" (a graph decided in
  the first set is returned from that set even when later rounds, timed for another method,
  would undo it), at `measure.look_level` per look."""
  from xrlflow_jax import measure  # pylint: disable=g-import-not-at-top
  from xrlflow_jax.harness import benchmark as B  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  ref = 1.0 + 0.01 * rng.standard_normal(20)
  copy = ref * (1.0 + 0.003 * rng.standard_normal(20))
  late = np.concatenate([1.04 + 0.08 * rng.standard_normal(10),  # gain hidden in the noise
                         1.12 + 0.005 * rng.standard_normal(10)])
  undone = np.concatenate([np.full(10, 1.30), np.full(10, 0.70)])  # faster, then slower
  stats = measure.LatencyStats(1.0, 0.9, 1.1, 10, 0.0, "cpu", "cpu")
  changed = measure.Speedup(1.0, 0.9, 1.1, 1.0, 0.99, 1.01, "no change", 0.95, 20)

  def comparison(*ratios, unchanged=()):
    cands = [ref if i in unchanged else ref / r for i, r in enumerate(ratios)]
    speedups = [measure.Speedup.unchanged() if i in unchanged else changed
                for i in range(len(ratios))]
    return measure.Comparison(stats, stats, [], speedups, None, (ref, copy, cands))

  at = measure.look_level(measure.LEVEL, 2)  # the premises, checked, not assumed
  first, both = slice(0, 10), slice(0, 20)
  assert measure.speedup(ref[first], (ref / late)[first], copy[first], level=at).verdict == (
      "no change")
  assert measure.speedup(ref[both], (ref / late)[both], copy[both], level=at).faster
  assert measure.speedup(ref[first], (ref / undone)[first], copy[first], level=at).faster
  assert not measure.speedup(ref[both], (ref / undone)[both], copy[both]).faster

  guarded = B._guarded  # pylint: disable=protected-access
  # A gain the first set cannot decide: the second set finds it (one set would not).
  assert guarded(comparison(late), [0], [], seed=0, rounds=10, looks=2)[1] == "graph"
  assert guarded(comparison(late), [0], [], seed=0, rounds=10, looks=1) == (1.0, "input")
  cut = measure.Comparison(stats, stats, [], [changed], None, (ref[first], copy[first],
                                                               [(ref / late)[first]]))
  assert guarded(cut, [0], [], seed=0, rounds=10, looks=2) == (1.0, "input")  # one set timed
  # Decided in the first set: the job stops there and returns it, whatever came after.
  ratio, what = guarded(comparison(undone), [0], [], seed=0, rounds=10, looks=2)
  assert what == "graph" and ratio == pytest.approx(1.30, rel=1e-3)
  assert guarded(comparison(undone), [0], [], seed=0) == (1.0, "input")  # all rounds at once
  # An unchanged prefix is not "no change": it does not make the job look again.
  ratio, what = guarded(comparison(undone, 1.0, unchanged=(1,)), [0, 1], [3], seed=0,
                        rounds=10, looks=2)
  assert what == "graph" and ratio == pytest.approx(1.30, rel=1e-3)


def test_benchmark_verdicts_stay_at_95_percent_with_looks_and_prefixes():
  """The benchmark times at the strictest guard level (prefixes, looks), but each graph's own
  verdict column is its 95% interval over every round timed."""
  from tests._graphs import toy_graph  # pylint: disable=g-import-not-at-top
  from xrlflow_jax import measure  # pylint: disable=g-import-not-at-top
  from xrlflow_jax.harness import benchmark as B  # pylint: disable=g-import-not-at-top
  from xrlflow_jax.ops import Op  # pylint: disable=g-import-not-at-top
  from xrlflow_jax.search.guard import Checkpoint  # pylint: disable=g-import-not-at-top
  graph, params = toy_graph()
  op = np.array(graph.nodes["op"])
  (add,) = np.flatnonzero(np.asarray(graph.nodes["alive"]) & (op == int(Op.ADD)))
  op[add] = int(Op.MUL)
  other = graph._replace(nodes={**graph.nodes, "op": op})
  measured = B.measure_outcomes(graph, params, [other], rounds=5, repeats_per_round=1,
                                min_round_ms=0.0, looks=2,
                                checkpoints=[[Checkpoint(1, other, 1.0)]])
  (v,) = measured.speedups
  assert v.level == pytest.approx(measure.LEVEL) and v.rounds in (5, 10)
  assert measured.returned[0][1] in ("graph", "first 1", "input")


@pytest.mark.parametrize("binary", ["experiments.benchmark", "experiments.evaluate"])
def test_benchmarks_refuse_bad_looks_before_any_work(tmp_path, binary):
  proc = subprocess.run([sys.executable, "-m", binary, "--quick", "--looks=0",
                         f"--output={tmp_path}"], cwd=REPO, capture_output=True, text=True,
                        timeout=120, check=False)
  assert proc.returncode != 0
  assert "looks (sets of rounds) must be an integer >= 1, got 0" in proc.stdout + proc.stderr
  assert not list(tmp_path.iterdir())  # refused before any model ran


def test_benchmark_checks_the_outputs_of_the_prefixes_it_times():
  """A search's checkpoint prefix is timed beside its graph and must compute what the original
  does: one that does not fails the method's row (its numerics are the prefix's)."""
  from tests._graphs import toy_graph  # pylint: disable=g-import-not-at-top
  from xrlflow_jax.harness import benchmark as B  # pylint: disable=g-import-not-at-top
  from xrlflow_jax.ops import Op  # pylint: disable=g-import-not-at-top
  from xrlflow_jax.search.guard import Checkpoint  # pylint: disable=g-import-not-at-top
  graph, params = toy_graph()
  op = np.array(graph.nodes["op"])
  (add,) = np.flatnonzero(np.asarray(graph.nodes["alive"]) & (op == int(Op.ADD)))
  op[add] = int(Op.MUL)  # computes something else, same shapes
  bad = graph._replace(nodes={**graph.nodes, "op": op})
  measured = B.measure_outcomes(graph, params, [graph, graph], rounds=5, repeats_per_round=1,
                                min_round_ms=0.0,
                                checkpoints=[[Checkpoint(1, bad, 1.0)], []])
  assert not measured.numerics[0].passed and measured.numerics[1].passed
  rows = B.outcome_rows({"model": "toy"}, B.Outcome("original", graph, 1.0),
                        [B.Outcome("taso", graph, 1.0), B.Outcome("greedy", graph, 1.0)],
                        measured)
  assert [r["status"] for r in rows] == ["ok", "failed", "ok"]
  assert "OUTPUTS DIFFER" in rows[1]["note"]


def test_benchmark_rejects_unknown_method(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "experiments.benchmark", "--methods=nope",
                         f"--output={tmp_path}"], cwd=REPO, capture_output=True, text=True,
                        timeout=120, check=False)
  assert proc.returncode != 0
  assert "unknown methods" in proc.stdout + proc.stderr


@pytest.mark.parametrize("against, message", [
    ("bert", "entries are model=file.onnx"),
    ("nasrnn=x.onnx", "which this run does not benchmark"),
    ("bert=/absent/x.onnx", "ONNX file not found"),
])
def test_benchmark_refuses_a_bad_against_before_any_work(tmp_path, against, message):
  proc = subprocess.run([sys.executable, "-m", "experiments.benchmark", "--quick",
                         "--models=bert", f"--against={against}", f"--output={tmp_path}"],
                        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode != 0
  assert message in proc.stdout + proc.stderr
  assert not (tmp_path / "benchmark.csv").exists()  # refused before any model ran


@pytest.mark.slow
def test_benchmark_quick_all_methods(tmp_path):
  """The full --quick run: two tiny models, every method including PPO."""
  out = tmp_path / "bench"
  stdout = _run("experiments.benchmark", "--quick", f"--output={out}", timeout=1800)
  rows = _check_outputs(out, "benchmark", {"original", "greedy", "taso", "beam", "random", "ppo"})
  assert {r["model"] for r in rows} == {"squeezenet1_1", "bert"}
  # PPO trains on the measured kernel table that the taso method (run before it) filled: no
  # second search to fill it.
  assert stdout.count("environment costs with measured kernels") == 2, stdout[-3000:]
  assert stdout.count("added by the training graphs themselves") == 2, stdout[-3000:]


@pytest.mark.slow
def test_evaluate_smallest(tmp_path):
  """(Slow: two PPO compiles, about 2 minutes on 2 CPU cores.) Train PPO on tiny SqueezeNet for two updates; evaluate it on an unseen model and shape."""
  out = tmp_path / "eval"
  stdout = _run("experiments.evaluate", "--quick", "--eval_shapes=default,image=48",
                "--train_models=squeezenet1_1", "--eval_models=resnet18", "--samples=2",
                f"--output={out}")
  assert "PPO trained" in stdout
  rows = _check_outputs(out, "evaluate", {"original", "greedy", "taso", "ppo-argmax",
                                          "ppo-best-of-2"})
  seen = {(r["model"], r["shape"]): r["seen"] for r in rows}
  assert seen[("squeezenet1_1", "default")] == "yes"
  assert seen[("squeezenet1_1", "image=48")] == "model"
  assert seen[("resnet18", "default")] == "no"
  assert seen[("resnet18", "image=48")] == "no"
  for r in rows:
    assert float(r["latency_ms"]) > 0, r
  assert len(_rows(out / "training.csv")) == 2


def test_benchmark_exits_nonzero_when_a_row_failed(tmp_path):
  """A model that does not import: a failed row with its reason in the CSV, exit status 1
  (`--allow_failures`: 0)."""
  bad = tmp_path / "broken.onnx"
  bad.write_text("not a model\n")
  env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
  for extra, rc in (([], 1), (["--allow_failures"], 0)):
    out = tmp_path / f"bench{rc}"
    proc = subprocess.run([sys.executable, "-m", "experiments.benchmark", "--quick",
                           f"--models={bad}", "--methods=greedy", f"--output={out}", *extra],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == rc, proc.stdout + proc.stderr
    rows = _rows(out / "benchmark.csv")
    assert rows[0]["status"] == "failed" and "not a valid ONNX model" in rows[0]["note"], rows
    if rc:
      assert "1 of 1 rows failed" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow  # every part of the report at its quick size: a few minutes on 2 cores
def test_device_report_quick(tmp_path):
  """The device report's --quick run (what a GPU runs at full size): every part present and
  measured, the JSON and the markdown written."""
  out = tmp_path / "device"
  text = _run("experiments.device_report", "--quick", f"--output={out}", timeout=1500)
  report = json.loads((out / "device_report.json").read_text())
  assert report["quick"] and report["failed"] == [], report.get("failed")
  assert report["device"]["platform"] == "cpu" and report["device"]["memory_gb"] > 0
  assert report["calibration"]["source"] in ("shipped", "cached calibration", "calibrated now")
  assert [r["batch"] for r in report["env"]["rows"]] == [1, 16]
  assert all(r["steps_per_s"] > 0 for r in report["env"]["rows"])
  assert report["ppo"]["steps_per_s"] > 0 and report["ppo"]["batch"] == 32
  assert [r["numerics_passed"] for r in report["optimize"]] == [True] * 3
  spearman = report["validation"]["spearman"]
  assert spearman is None or math.isnan(spearman) or -1.0 <= spearman <= 1.0  # nan: all tied
  md = (out / "device_report.md").read_text()
  assert "| optimise job |" in md and "env steps/s" in md and md.strip() in text


def test_device_report_stops_cleanly_without_a_cost_model(monkeypatch):
  """A failed calibration is recorded (every later part needs the cost model), not raised."""
  def no_coefficients(*_, **__):
    raise cost.CostModelError("no cost-model coefficients for device kind 'x'")
  monkeypatch.setattr(cost, "coefficients", no_coefficients)
  report = device_report.run(quick=True, log=lambda _: None)
  assert report["failed"] == ["calibration"] and "CostModelError" in report["calibration"]["error"]
  assert report["device"]["platform"] == "cpu" and "env" not in report
  assert "**calibration failed**: CostModelError" in device_report.markdown(report)


def test_timing_flags_are_defined_once_for_every_binary():
  """`cli.flags.define_timing_flags`: the names, defaults and help each binary passes, claimed
  by the calling module (so its --helpshort lists them), and `options()` as `measure.compare`'s
  keywords (a binary's preset reader applied)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from xrlflow_jax.cli import flags as cli_flags  # pylint: disable=g-import-not-at-top
  fv = flags.FlagValues()
  job = cli_flags.define_timing_flags(rounds_name="latency_rounds", looks_name="latency_looks",
                                      looks_default=2, flag_values=fv)
  assert {f.name for f in fv.get_flags_for_module(__name__)} == {
      "latency_rounds", "latency_looks", "repeats_per_round", "min_round_ms"}
  assert "--latency_rounds rounds" in fv["latency_looks"].help
  fv(["prog", "--latency_rounds=7", "--min_round_ms=0"])
  assert job.options() == {"rounds": 7, "repeats_per_round": 3, "min_round_ms": 0.0,
                           "looks": 2}
  assert job.options(lambda name: -1 if name == "latency_looks" else fv[name].value)["looks"] == -1

  fv = flags.FlagValues()
  plain = cli_flags.define_timing_flags(repeats_name="repeats", flag_values=fv)
  assert set(fv) == {"rounds", "repeats", "min_round_ms"} and plain.looks is None
  assert "exactly --repeats" in fv["min_round_ms"].help
  fv(["prog"])
  assert plain.options() == {"rounds": 10, "repeats_per_round": 3, "min_round_ms": 30.0}
  fv = flags.FlagValues()
  cli_flags.define_timing_flags(looks_default=1, min_round_ms_default=None, flag_values=fv)
  assert set(fv) == {"rounds", "repeats_per_round", "looks"}
  assert "--min_round_ms" not in fv["repeats_per_round"].help


def _free_port() -> int:
  import socket  # pylint: disable=g-import-not-at-top
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _train_in_processes(workdir: Path, processes: int, *args: str,
                        env: dict[str, str]) -> list[str]:
  """`experiments.train` in `processes` local processes of one distributed run (one CPU
  device each; JAX's CPU collectives between them); their stdouts."""
  common = [sys.executable, "-m", "experiments.train", f"--workdir={workdir}", *args]
  if processes > 1:
    common.append(f"--coordinator_address=localhost:{_free_port()}")
    common.append(f"--num_processes={processes}")
  procs = [subprocess.Popen(common + ([f"--process_id={i}"] if processes > 1 else []), cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(processes)]
  outs = []
  for p in procs:
    out, err = p.communicate(timeout=900)
    assert p.returncode == 0, f"experiments.train failed:\n{out[-3000:]}\n{err[-5000:]}"
    outs.append(out)
  return outs


def _last_checkpoint_leaves(workdir: Path) -> list[np.ndarray]:
  """The arrays of the newest checkpoint `experiments.train` wrote, in leaf order."""
  from xrlflow_jax.agents import checkpoint  # pylint: disable=g-import-not-at-top
  folder = workdir / "checkpoints" / f"step_{checkpoint.steps(workdir / 'checkpoints')[-1]:08d}"
  if (folder / "state.msgpack").is_file():
    from flax import serialization  # pylint: disable=g-import-not-at-top
    raw = serialization.msgpack_restore((folder / "state.msgpack").read_bytes())
  else:
    import jax  # pylint: disable=g-import-not-at-top
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
    here = jax.sharding.SingleDeviceSharding(jax.devices()[0])  # saved over other devices
    reader = ocp.StandardCheckpointer()
    saved = reader.metadata((folder / "state").resolve()).item_metadata
    raw = reader.restore((folder / "state").resolve(), {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=here) for k, v in saved.items()})
  return [np.asarray(raw[k]) for k in sorted(raw)]


@pytest.mark.slow  # three training runs, ~4 min on 2 cores; see README for -m slow
def test_two_processes_train_as_one_and_resume_after_a_stop(tmp_path, xla_defaults_env):
  """Data-parallel PPO over two processes on JAX's distributed runtime (`agents.distributed`):
  two local processes, one CPU device each, stopped by the time limit after 2 of 4 updates
  (process 0's clock decides for both) and rerun (resuming from the checkpoint they wrote
  together), give the metrics, parameters and best graph of one uninterrupted process with the
  same seed and global batch. XLA's default code generation (the suite's fast-compile flags
  reorder float reductions between the two layouts)."""
  env = {**xla_defaults_env, "JAX_PLATFORMS": "cpu"}
  args = ["--config.latency_rounds=0", "--config.ppo.total_timesteps=256",
          "--config.updates_per_chunk=2", f"--compilation_cache={tmp_path / 'cache'}"]
  one, two = tmp_path / "one", tmp_path / "two"
  _train_in_processes(one, 1, *args, env=env)
  first = _train_in_processes(two, 2, *args, "--max_minutes=1e-6", env=env)  # 1 chunk of 2
  assert "2 device(s) cpu in 2 process(es)" in first[0]
  assert "stopped at --max_minutes=1e-06 after update 2" in first[0]
  assert "pool " not in first[1] and "trained " not in first[1]  # process 0 reports alone
  again = _train_in_processes(two, 2, *args, env=env)
  assert "resumed from update 2" in again[0]
  a, b = _rows(one / "metrics.csv"), _rows(two / "metrics.csv")
  assert [r["update"] for r in b] == ["1", "2", "3", "4"] == [r["update"] for r in a]
  for key in ("loss", "entropy", "approx_kl", "grad_norm", "episode_return", "best_cost_ratio"):
    np.testing.assert_allclose([float(r[key]) for r in b], [float(r[key]) for r in a],
                               rtol=1e-4, atol=1e-6, err_msg=key)
  for x, y in zip(_last_checkpoint_leaves(two), _last_checkpoint_leaves(one)):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)
  r1, r2 = (json.loads((w / "results.json").read_text()) for w in (one, two))
  assert (r2["processes"], r2["devices"]) == (2, 2) and (r1["processes"], r1["devices"]) == (1, 1)
  assert r2["graphs"][0]["best_cost_ms"] == pytest.approx(r1["graphs"][0]["best_cost_ms"],
                                                         rel=1e-6)
  assert r2["graphs"][0]["numerics_passed"]


def test_training_a_model_that_does_not_exist_is_one_clear_line(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "experiments.train",
                         "--config=experiments/configs/ppo.py:nosuchnet",
                         f"--workdir={tmp_path / 'run'}"],
                        cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"},
                        capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode != 0
  assert "unknown model 'nosuchnet'" in proc.stderr and "Traceback" not in proc.stderr


def test_processes_that_build_different_runs_stop_with_one_line(tmp_path):
  """Every process of a distributed run must trace the same program: a process given another
  horizon is refused by all of them before anything trains."""
  port = _free_port()
  procs = [subprocess.Popen(
      [sys.executable, "-m", "experiments.train", f"--workdir={tmp_path / 'run'}",
       f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={i}",
       f"--config.env.horizon={10 + i}"], cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"},
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
  for p in procs:
    out, err = p.communicate(timeout=600)
    assert p.returncode != 0, out[-2000:]
    assert "processes [1] built another trainer than process 0" in err, err[-3000:]
    assert "Traceback" not in err and "initialised" not in out


@pytest.mark.slow  # a 2-update training, then two searches: ~40-90 s on 2 cores
def test_a_trained_run_is_evaluated_against_the_searches_without_training_more(tmp_path):
  """`--evaluate_only` reports the latest checkpoint with `compare_methods` (the trained
  policy and the searches from each pool graph, same rules and cost model), numerics checked,
  and trains nothing."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  args = [f"--workdir={tmp_path / 'run'}", "--config.latency_rounds=0",
          "--config.ppo.total_timesteps=128", "--config.updates_per_chunk=2"]
  _run("experiments.train", *args, env=env)
  before = _rows(tmp_path / "run" / "metrics.csv")
  out = _run("experiments.train", *args, "--evaluate_only",
             "--config.compare_methods=('greedy', 'policy')", env=env)
  assert "resumed from update 2" in out and "trained " not in out
  assert _rows(tmp_path / "run" / "metrics.csv") == before
  row = json.loads((tmp_path / "run" / "results.json").read_text())["graphs"][0]
  assert set(row["searches"]) == {"greedy", "policy"}
  for found in row["searches"].values():
    assert found["numerics_passed"] and found["modelled_speedup"] >= 1.0 - 1e-6
  assert row["searches"]["greedy"]["graphs_expanded"] >= 1
  assert "  policy: modelled x" in out
