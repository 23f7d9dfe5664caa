"""The disk cache of traced functions (`trace_cache`): a later process loads what an earlier one
traced and computes the same thing; anything that changes what tracing makes (closure data,
static arguments, shapes, a module constant changed at run time) is a different entry; an
unfingerprintable closure or a cache that is off is an ordinary jit; broken entries are traced
again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xrlflow_jax import compilation_cache, cost, search, trace_cache
from xrlflow_jax.agents import networks
from xrlflow_jax.cost import incremental
from xrlflow_jax.rules import RuleSet
from xrlflow_jax.rules.library import builtin_rules

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache_dir(tmp_path):
  """A fresh compilation cache directory for this test (the trace cache lives inside it)."""
  before = jax.config.jax_compilation_cache_dir
  jax.config.update("jax_compilation_cache_dir", str(tmp_path))
  yield tmp_path / trace_cache.SUBDIR
  jax.config.update("jax_compilation_cache_dir", before)


def _scaled(x, data):
  return {"y": x * data["scale"] + incremental.MAX_CHANGED, "n": x.shape[0]}


def _impl(x, data, *, n=1):
  return jnp.tile(_scaled(x, data)["y"], n)


def test_a_second_instance_loads_and_computes_the_same(cache_dir):
  data = {"scale": np.float32(3.0)}
  x = np.arange(4, dtype=np.float32)
  first = trace_cache.PersistentJit(lambda x, *, n=1: _impl(x, data, n=n), "test.tile",
                                    closure=data, static_argnames=("n",))
  out = first(x, n=2)
  assert (first.traces, first.loads) == (1, 0)
  first(x + 1, n=2)  # same shapes: the same instance
  assert first.instances == 1
  assert len(list(cache_dir.glob("test.tile-*.bin"))) == 1

  second = trace_cache.PersistentJit(lambda x, *, n=1: _impl(x, data, n=n), "test.tile",
                                     closure={"scale": np.float32(3.0)}, static_argnames=("n",))
  np.testing.assert_array_equal(second(x, n=2), out)
  assert (second.traces, second.loads) == (0, 1)
  np.testing.assert_array_equal(out, np.tile(x * 3 + incremental.MAX_CHANGED, 2))

  # What changes the trace is a different entry: static argument, shape, dtype, closure data.
  second(x, n=3)
  second(np.arange(5, dtype=np.float32), n=2)
  second(np.arange(4, dtype=np.int32), n=2)
  assert (second.traces, second.loads) == (3, 1)
  other = trace_cache.PersistentJit(lambda x, *, n=1: _impl(x, {"scale": np.float32(5)}, n=n),
                                    "test.tile", closure={"scale": np.float32(5.0)},
                                    static_argnames=("n",))
  np.testing.assert_array_equal(other(x, n=2), np.tile(x * 5 + incremental.MAX_CHANGED, 2))
  assert (other.traces, other.loads) == (1, 0)


def test_the_process_keeps_a_bounded_number_of_compiled_instances(cache_dir, monkeypatch):
  """Past MAX_LIVE_INSTANCES (all PersistentJits together) the least recently used instance is
  dropped (its compiled code freed); calling it again makes it again (from the disk here) and
  computes the same."""
  monkeypatch.setattr(trace_cache, "MAX_LIVE_INSTANCES", 3)
  data = {"scale": np.float32(2.0)}
  f = trace_cache.PersistentJit(lambda x, *, n=1: _impl(x, data, n=n), "test.bounded",
                                closure=data, static_argnames=("n",))
  g = trace_cache.PersistentJit(lambda x, *, n=1: _impl(x, data, n=n), "test.bounded_other",
                                closure=data, static_argnames=("n",))
  x = np.arange(4, dtype=np.float32)
  first = f(x, n=1)
  f(x, n=2)
  g(x, n=1)
  f(x, n=2)  # used again: now the most recent
  assert trace_cache.live_instances() <= 3 and len(f._entries) == 2
  g(x, n=2)  # a fourth instance: f(n=1), the least recently used, is dropped
  assert trace_cache.live_instances() <= 3
  assert len(f._entries) == 1 and len(g._entries) == 2
  assert f.instances == 2
  np.testing.assert_array_equal(f(x, n=1), first)  # made again: loaded from the disk
  assert (f.traces, f.loads) == (2, 1) and f.distinct_instances == 2


def test_a_module_constant_changed_at_run_time_is_a_different_entry(cache_dir, monkeypatch):
  x = np.arange(4, dtype=np.float32)
  data = {"scale": np.float32(1.0)}

  def make():
    # Named as a package function would be: the module walk starts from `_impl`'s module,
    # so the closure names the cost module it reads.
    return trace_cache.PersistentJit(lambda x: _scaled(x, data)["y"], "test.constant",
                                     closure=(data, incremental.candidate_cost))

  before = make()(x)
  monkeypatch.setattr(incremental, "MAX_CHANGED", incremental.MAX_CHANGED + 100)
  patched = make()
  np.testing.assert_array_equal(patched(x), before + 100)  # not the stored trace
  assert (patched.traces, patched.loads) == (1, 0)
  monkeypatch.undo()
  again = make()
  np.testing.assert_array_equal(again(x), before)
  assert again.loads == 1


def test_available_says_which_instances_exist_here_or_on_disk_and_makes_none(cache_dir):
  """`available` is True for an instance made in this process or traced by an earlier one (its
  entry on disk), False otherwise, and traces, stores and compiles nothing."""
  data = {"scale": np.float32(2.0)}
  x = np.arange(4, dtype=np.float32)
  make = lambda: trace_cache.PersistentJit(lambda x, *, n=1: _impl(x, data, n=n),
                                           "test.available", closure=data,
                                           static_argnames=("n",))
  first = make()
  assert not first.available(x, n=2) and not first.available(x, n=3)
  assert first.instances == 0 and not list(cache_dir.glob("test.available-*"))
  first(x, n=2)
  assert first.available(x, n=2) and not first.available(x, n=3)
  assert not first.available(np.arange(5, dtype=np.float32), n=2)  # another shape
  second = make()  # a later process: the trace is on disk
  assert second.available(x, n=2) and not second.available(x, n=3)
  assert second.instances == 0
  plain = trace_cache.PersistentJit(lambda v: v * 2, "test.available_plain", persist=False)
  assert not plain.available(x)
  plain(x)
  assert plain.available(x)


def test_unfingerprintable_closures_and_a_cache_that_is_off_are_plain_jits(cache_dir,
                                                                          monkeypatch):
  def local(v):  # defined outside the package: its globals are not in any key
    return v + 1

  with pytest.raises(trace_cache.Unfingerprintable, match="defined outside"):
    trace_cache.fingerprint(local)
  with pytest.raises(trace_cache.Unfingerprintable):
    trace_cache.fingerprint(object())
  x = np.ones(3, np.float32)
  for _ in range(2):
    f = trace_cache.PersistentJit(lambda v: local(v) * 2, "test.local", closure=local)
    np.testing.assert_array_equal(f(x), 4 * x)
    assert (f.traces, f.loads) == (1, 0)
  assert not list(cache_dir.glob("test.local-*"))

  monkeypatch.setattr(compilation_cache, "directory", lambda: None)  # the cache is off
  assert trace_cache.directory() is None
  for _ in range(2):
    g = trace_cache.PersistentJit(lambda v: v * 3, "test.off", closure=None)
    np.testing.assert_array_equal(g(x), 3 * x)
    assert (g.traces, g.loads) == (1, 0)
  assert not list(cache_dir.glob("test.off-*"))


def test_a_broken_entry_is_traced_again_and_replaced(cache_dir):
  x = np.ones(3, np.float32)
  f = trace_cache.PersistentJit(lambda v: v - 1, "test.broken", closure=())
  f(x)
  (path,) = cache_dir.glob("test.broken-*.bin")
  path.write_bytes(b"not a stored trace")
  g = trace_cache.PersistentJit(lambda v: v - 1, "test.broken", closure=())
  np.testing.assert_array_equal(g(x), x - 1)
  assert (g.traces, g.loads) == (1, 0)
  h = trace_cache.PersistentJit(lambda v: v - 1, "test.broken", closure=())
  h(x)
  assert h.loads == 1


def test_fingerprints_tell_rule_sets_and_coefficients_apart():
  rules = [r for r in builtin_rules() if r.family == "merge_matmul"][:3]
  base = trace_cache.fingerprint(RuleSet(rules, max_locations=4))
  assert trace_cache.fingerprint(RuleSet(rules, max_locations=4)) == base
  assert trace_cache.fingerprint(RuleSet(rules, max_locations=8)) != base
  assert trace_cache.fingerprint(RuleSet(rules[:2], max_locations=4)) != base
  assert trace_cache.fingerprint(RuleSet(rules, max_locations=4, join_window=2)) != base
  coeffs = cost.CostCoefficients(weights=jnp.ones(len(cost.FEATURE_NAMES)),
                                 call_ms=jnp.float32(0.0))
  bumped = cost.CostCoefficients(weights=jnp.ones(len(cost.FEATURE_NAMES)).at[3].set(1.5),
                                 call_ms=jnp.float32(0.0))
  assert trace_cache.fingerprint(coeffs) != trace_cache.fingerprint(bumped)
  # Closures of functions count: the same code with another captured value differs.
  assert trace_cache.fingerprint([_adder(1)]) != trace_cache.fingerprint([_adder(2)])
  assert trace_cache.fingerprint([_adder(1)]) == trace_cache.fingerprint([_adder(1)])


def _adder(k):
  """`v + k` as if defined in the package, with `k` in a closure cell and as a default."""
  cell = (lambda: lambda v, j=k: v + k + j)()  # pylint: disable=unnecessary-lambda
  return types.FunctionType(cell.__code__, {"__name__": "xrlflow_jax.fake"}, "adder",
                            cell.__defaults__, cell.__closure__)


_RUN = """
import json, sys
import numpy as np
from xrlflow_jax import compilation_cache, cost, search, trace_cache, workflow
from xrlflow_jax.rules import RuleSet
compilation_cache.enable(sys.argv[1])
loaded = workflow.load("bert", size="tiny")
rules = workflow.ruleset(["merge_matmul_shared_input_2", "add_commute", "concat_of_slices",
                          "taso_73", "taso_77", "taso_79", "taso_91"], 4,
                         taso_file_path=sys.argv[2])
expander = search.Expander(rules, cost.calibrate.coefficients())
res = search.taso(loaded.graph, loaded.params, expander, budget=4, alpha=1.05)
exp, children = expander.expand(loaded.graph)
valid = np.asarray(exp.valid)
print(json.dumps({"cost": float(res.best_cost_ms), "rewrites": [r.to_json() for r in res.rewrites],
                  "valid": np.flatnonzero(valid).tolist(),
                  "costs": np.asarray(exp.cost)[valid].tolist(), "hashes": children.hashes,
                  "children": [trace_cache.fingerprint(children.child(i))
                               for i in range(len(children.actions))],
                  "traces": sum(f.traces for f in (expander._fn.bucket, expander._fn.match,
                                                    expander._fn.apply_at)),
                  "loads": sum(f.loads for f in (expander._fn.bucket, expander._fn.match,
                                                  expander._fn.apply_at)),
                  "rules": trace_cache.fingerprint(rules), "n": len(rules)}))
"""


def test_a_search_in_a_new_process_loads_its_traces_and_finds_the_same(tmp_path, shared_dir):
  """Two processes with different string hashing (PYTHONHASHSEED) search with TASO's rules and
  built-in ones (on tiny BERT) and expand the input: the second traces
  none of the search's functions (matcher, bucket, child rebuild) and returns the same
  rewrites, cost, candidate costs, hashes and rebuilt children."""
  taso = str(shared_dir / "taso" / "graph_subst.pb")
  runs = []
  for seed in ("1", "2"):
    env = {**os.environ, "PYTHONHASHSEED": seed, "JAX_PLATFORMS": "cpu"}
    env.pop("XRLFLOW_COMPILATION_CACHE", None)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_RUN), str(tmp_path), taso],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=900,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
  first, second = runs
  assert first["rules"] == second["rules"]
  assert first["traces"] >= 2 and first["loads"] == 0
  assert second["traces"] == 0 and second["loads"] == first["traces"]
  assert second["rewrites"] == first["rewrites"] and second["cost"] == first["cost"]
  assert len(first["valid"]) >= 5 and first["rewrites"]  # candidates: costs, hashes, graphs
  for key in ("valid", "costs", "hashes", "children"):
    assert second[key] == first[key], key


_WITHOUT_FLATBUFFERS = """
import importlib.abc, json, sys
class Block(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name == "flatbuffers" or name.startswith("flatbuffers."):
      raise ImportError("No module named 'flatbuffers' (blocked by the test)")
    return None
sys.meta_path.insert(0, Block())
sys.modules.pop("flatbuffers", None)
import jax
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
import numpy as np
from xrlflow_jax import trace_cache
f = trace_cache.PersistentJit(lambda x: x * 2 + 1, "test.noflatbuffers")
a = f(np.arange(3, dtype=np.float32)); b = f(np.ones(5, np.float32))
print(json.dumps({"out": np.asarray(a).tolist() + np.asarray(b).tolist(), "traces": f.traces,
                  "dir": trace_cache.directory() is None}))
"""


def test_without_flatbuffers_traces_are_not_stored_and_calls_still_work(tmp_path):
  """An environment that cannot serialize an export (no flatbuffers): one note on stderr,
  every call an ordinary jit, nothing written, no traceback."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  env.pop("XRLFLOW_COMPILATION_CACHE", None)
  done = subprocess.run([sys.executable, "-c", _WITHOUT_FLATBUFFERS, str(tmp_path)],
                        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
                        check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  out = json.loads(done.stdout.strip().splitlines()[-1])
  assert out == {"out": [1.0, 3.0, 5.0, 3.0, 3.0, 3.0, 3.0, 3.0], "traces": 2, "dir": True}
  notes = [line for line in done.stderr.splitlines() if line.startswith("note: ")]
  assert len(notes) == 1 and "flatbuffers" in notes[0], done.stderr
  assert "Traceback" not in done.stderr
  assert not list(tmp_path.rglob("*.bin"))


def test_old_entries_are_pruned(cache_dir, monkeypatch):
  monkeypatch.setattr(trace_cache, "MAX_ENTRIES", 2)
  monkeypatch.setattr(trace_cache._prune, "__defaults__", (2,))
  x = np.ones(2, np.float32)
  for k in range(4):
    trace_cache.PersistentJit(lambda v, k=k: v * k, f"test.prune{k}", closure=k)(x)
  assert sorted(p.name.split("-")[0] for p in cache_dir.glob("*.bin")) == ["test.prune2",
                                                                         "test.prune3"]


def _toy_run(learning_rate: float = 2.5e-4, coeffs=None):
  """A PPO run of the test config on a toy graph (4 rules), built afresh."""
  from xrlflow_jax import GraphBuilder  # pylint: disable=g-import-not-at-top
  from xrlflow_jax.agents import runs  # pylint: disable=g-import-not-at-top
  from xrlflow_jax.configs import ppo as ppo_configs  # pylint: disable=g-import-not-at-top
  b = GraphBuilder()
  x = b.input([8, 16])
  y = b.concat([b.matmul(x, b.weight([16, 16])), b.matmul(x, b.weight([16, 16]))], axis=1)
  b.output(b.add(y, b.input([8, 32])))
  graph, params = b.build(capacity=32)
  config = ppo_configs.get_config("test")
  config.env.rules = ("merge_matmul_shared_input_2", "split_matmul_shared_input_2",
                      "concat_of_slices", "add_commute")
  config.env.max_locations = 4
  config.ppo.learning_rate = learning_rate
  coeffs = coeffs if coeffs is not None else cost.CostCoefficients(
      weights=jnp.ones(len(cost.FEATURE_NAMES)), call_ms=jnp.float32(0.0))
  return runs.build(config, coeffs=coeffs, pool=(["toy"], [graph], [params]),
                    devices=jax.devices()[:1])


def test_a_ppo_trainer_is_fingerprinted_by_what_builds_it():
  """Two trainers built from one config have one key; a setting of the config, the rule set or
  the cost coefficients changes it; a cost function defined outside the package turns the disk
  off (an ordinary jit)."""
  first = _toy_run().trainer
  assert trace_cache.fingerprint(first) == trace_cache.fingerprint(_toy_run().trainer)
  assert trace_cache.fingerprint(first) != trace_cache.fingerprint(
      _toy_run(learning_rate=1e-3).trainer)
  run = _toy_run()
  bumped = cost.CostCoefficients(weights=jnp.ones(len(cost.FEATURE_NAMES)).at[0].set(2.0),
                                 call_ms=jnp.float32(0.0))
  assert trace_cache.fingerprint(run.env) != trace_cache.fingerprint(
      _toy_run(coeffs=bumped).env)
  assert first.init.persist and first.run.persist
  outside = (lambda g: cost.graph_cost(g, bumped))  # pylint: disable=unnecessary-lambda
  with pytest.raises(trace_cache.Unfingerprintable):
    trace_cache.fingerprint(_with_cost_fn(run.env, outside))
  # The network's layer, swapped in after the agent is built, is part of the key too.
  agent = _toy_run().trainer.agent
  key = trace_cache.fingerprint(agent)
  agent.network = agent.network.clone(gat_layer=_OtherLayer)
  assert trace_cache.fingerprint(agent) != key


class _OtherLayer(networks.GATLayer):
  """A layer class other than the default (same computation)."""


def _with_cost_fn(env, cost_fn):
  """`env` with another cost function (a shallow copy)."""
  import copy  # pylint: disable=g-import-not-at-top
  out = copy.copy(env)
  out.cost_fn = cost_fn
  return out


@pytest.mark.slow  # two PPO compiles (~45 s on 2 CPU cores)
def test_a_ppo_trainer_built_again_loads_its_programs_and_trains_the_same(cache_dir):
  """The trainer's init and update chunk are stored (single device): a trainer built again from
  the same config loads both and its state after two updates is bit-identical; another
  learning rate is another key."""
  first = _toy_run().trainer
  s1, m1 = first.run(first.init(jax.random.PRNGKey(3)), 2)
  assert (first.init.traces, first.run.traces) == (1, 1)
  second = _toy_run().trainer
  s2, m2 = second.run(second.init(jax.random.PRNGKey(3)), 2)
  assert (second.init.loads, second.run.loads) == (1, 1)
  assert (second.init.traces, second.run.traces) == (0, 0)
  for a, b in zip(jax.tree_util.tree_leaves((s1, m1)), jax.tree_util.tree_leaves((s2, m2))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert trace_cache.fingerprint(_toy_run(learning_rate=1e-3).trainer) != \
      trace_cache.fingerprint(first)


_SMALL = """
import sys
import jax, jax.numpy as jnp
from jax import monitoring
from xrlflow_jax import compilation_cache
hits = []
monitoring.register_event_listener(
    lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None)
compilation_cache.enable(sys.argv[1])
print(float(jax.jit(lambda x: jnp.tanh(x) * 2.0 + 1.0)(jnp.arange(3.0)).sum()), len(hits))
"""


def test_the_persistent_cache_keeps_executables_that_compile_in_milliseconds(tmp_path):
  """`compilation_cache.enable` writes every executable, however fast it compiled (skipping the
  default job's ~60 small helpers would cost it ~1.5 s per warm run): a second process
  loads a tiny function's executable from the cache instead of compiling it."""
  runs = []
  for _ in range(2):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XRLFLOW_COMPILATION_CACHE", None)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_SMALL), str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    runs.append(done.stdout.split())
  (value_1, hits_1), (value_2, hits_2) = runs
  assert value_1 == value_2
  assert int(hits_1) == 0 and int(hits_2) >= 1
  assert [p for p in tmp_path.iterdir() if p.name != trace_cache.SUBDIR]


def test_output_shapes_trace_without_compiling_and_a_call_waits_for_compile_in(cache_dir,
                                                                              monkeypatch):
  """`output_shapes` makes the instance (its output's shapes, nothing compiled); `compile_in`
  compiles it in another thread, and a call meanwhile waits for that compile instead of
  compiling the function again; a second `compile_in` has nothing to do."""
  import concurrent.futures  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  events, started = [], threading.Event()
  real = trace_cache.PersistentJit._compile  # pylint: disable=protected-access

  def slow_compile(entry, specs):
    events.append("compile")
    started.set()
    time.sleep(0.5)
    real(entry, specs)
    events.append("compiled")
  monkeypatch.setattr(trace_cache.PersistentJit, "_compile", staticmethod(slow_compile))
  for persist in (True, False):
    events.clear()
    started.clear()
    f = trace_cache.PersistentJit(lambda x: {"y": jnp.cumsum(x) * 2, "n": x.sum()},
                                  f"test.compile_in_{persist}", persist=persist)
    spec = jax.ShapeDtypeStruct((5,), jnp.float32)
    shapes = f.output_shapes(spec)
    assert shapes == jax.eval_shape(lambda x: {"y": jnp.cumsum(x) * 2, "n": x.sum()}, spec)
    assert f.instances == 1 and not events
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
      future = f.compile_in(pool, spec)
      started.wait(5)
      out = f(np.arange(5, dtype=np.float32))
      assert events == ["compile", "compiled"]  # the call waited for the compile
      future.result()
      assert f.compile_in(pool, spec) is None
    np.testing.assert_array_equal(out["y"], np.cumsum(np.arange(5)) * 2)
    assert f.instances == 1 and f.first_calls == 1


def test_the_persistent_cache_is_pruned_to_its_bound(tmp_path, monkeypatch):
  """`compilation_cache.prune` deletes the least recently used executables until they fit the
  bound (-1: none; other files are left); `enable` prunes to `$XRLFLOW_COMPILATION_CACHE_MAX_MB`;
  a bad value is refused naming the variable."""
  folder = tmp_path / "xla"
  folder.mkdir()
  for i in range(6):  # 6 x 1000 bytes, used in order 0..5
    f = folder / f"jit_f{i}-key{i}-cache"
    f.write_bytes(b"x" * 1000)
    os.utime(f, (1000 + i, 1000 + i))
  (folder / "notes.txt").write_bytes(b"y" * 5000)
  assert compilation_cache.prune(folder, -1) == 0
  assert compilation_cache.prune(folder, 3500) == 3
  assert sorted(p.name for p in folder.iterdir()) == [
      "jit_f3-key3-cache", "jit_f4-key4-cache", "jit_f5-key5-cache", "notes.txt"]
  monkeypatch.delenv(compilation_cache.MAX_MB_ENV, raising=False)
  assert compilation_cache.max_size_bytes() == int(compilation_cache.DEFAULT_MAX_MB * 2**20)
  monkeypatch.setenv(compilation_cache.MAX_MB_ENV, "-1")
  assert compilation_cache.max_size_bytes() == -1
  for bad in ("0", "lots", "-2", "inf"):
    monkeypatch.setenv(compilation_cache.MAX_MB_ENV, bad)
    with pytest.raises(compilation_cache.CompilationCacheError,
                       match=compilation_cache.MAX_MB_ENV):
      compilation_cache.max_size_bytes()
  env = {**os.environ, "JAX_PLATFORMS": "cpu", compilation_cache.MAX_MB_ENV: "0.001"}
  env.pop("XRLFLOW_COMPILATION_CACHE", None)
  done = subprocess.run([sys.executable, "-c", "import sys; from xrlflow_jax import "
                         "compilation_cache; compilation_cache.enable(sys.argv[1])", str(folder)],
                        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
                        check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert sorted(p.name for p in folder.iterdir()) == ["jit_f5-key5-cache", "notes.txt"]
