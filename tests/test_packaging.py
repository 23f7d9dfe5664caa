"""The package installed without the checkout (`pip install .`): it builds into a wheel that
carries its data and configs, imports nothing from `experiments/`, and runs the optimise job's
library entry from a folder outside the checkout.

The wheel is built offline (`pip wheel --no-deps --no-build-isolation`) and unpacked into a
temporary folder that comes first on the path of a subprocess started elsewhere, so the
checkout (and the editable install of the test environment) is not what runs.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
  """The package's wheel, unpacked into a site folder (what `pip install .` puts there)."""
  out = tmp_path_factory.mktemp("wheel")
  # Built from a copy of the sources: setuptools keeps a build/ folder in the tree it builds,
  # whose stale files (modules since removed) would otherwise end up in the wheel.
  src = out / "src"
  shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
      ".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis"))
  res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-q", "-w", str(out), str(src)], capture_output=True, text=True,
                       check=False, cwd=out)
  if res.returncode != 0 and "invalid command 'bdist_wheel'" in res.stderr:
    pytest.skip("building a wheel offline needs the `wheel` package (pip install -e '.[test]')")
  assert res.returncode == 0, res.stderr[-2000:]
  wheels = list(out.glob("xrlflow_jax-*.whl"))
  assert len(wheels) == 1, wheels
  site = out / "site"
  with zipfile.ZipFile(wheels[0]) as z:
    z.extractall(site)
  return site


def _run(site: Path, code: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
  env = {**os.environ, "PYTHONPATH": str(site), "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                        text=True, check=False, cwd=cwd, env=env, timeout=timeout)


CORE = ("ops", "graph", "executor.py", "models", "onnx_io", "rules", "env", "cost", "agents",
        "search", "workflow", "measure.py", "errors.py", "compilation_cache.py",
        "trace_cache.py", "xla_options.py")
# Command lines inside the core may use the layer above: `python -m xrlflow_jax.cost fit`
# calibrates on rewritten variants drawn by the harness's walker.
CORE_MAINS = ("cost/__main__.py",)


def _imports(path: Path) -> list[tuple[int, str]]:
  """(line, absolute module name) of every import in a file."""
  out = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      out += [(node.lineno, a.name) for a in node.names]
    elif isinstance(node, ast.ImportFrom) and not node.level:
      mod = node.module or ""
      out += [(node.lineno, mod)] + [(node.lineno, f"{mod}.{a.name}") for a in node.names]
  return out


def _offenders(paths, banned) -> list[str]:
  return [f"{p.relative_to(ROOT)}:{line} imports {name}" for p in paths
          for line, name in _imports(p)
          if any(name == b or name.startswith(b + ".") for b in banned)]


def test_no_library_module_imports_experiments():
  offenders = _offenders(sorted((ROOT / "xrlflow_jax").rglob("*.py")), ["experiments"])
  assert not offenders, "\n".join(offenders)


def test_core_imports_nothing_from_the_layers_above_it():
  lib = ROOT / "xrlflow_jax"
  paths = [p for c in CORE for p in (sorted((lib / c).rglob("*.py")) if (lib / c).is_dir()
                                     else [lib / c])
           if str(p.relative_to(lib)) not in CORE_MAINS]
  assert len(paths) > 50, len(paths)
  offenders = _offenders(paths, ["xrlflow_jax.harness", "xrlflow_jax.optimize",
                                 "xrlflow_jax.visualize", "experiments"])
  assert not offenders, "\n".join(offenders)


def test_wheel_holds_the_library_its_data_and_configs_only(installed):
  top = {p.name for p in installed.iterdir() if not p.name.endswith(".dist-info")}
  assert top == {"xrlflow_jax"}, top
  for rel in ("data", "configs/ppo.py", "harness/benchmark.py", "optimize/pipeline.py"):
    assert (installed / "xrlflow_jax" / rel).exists(), rel
  assert list((installed / "xrlflow_jax" / "data").glob("*.json"))


def test_installed_package_imports_and_loads_its_configs_outside_the_checkout(installed,
                                                                             tmp_path):
  res = _run(installed, """
      import importlib.util, json
      import xrlflow_jax, xrlflow_jax.optimize as opt
      from xrlflow_jax import cost
      from xrlflow_jax.configs import ppo
      c = opt.ppo_config(budget=2)
      print(json.dumps({"file": xrlflow_jax.__file__,
                        "experiments": importlib.util.find_spec("experiments") is not None,
                        "updates": c.ppo.total_timesteps // (c.ppo.num_envs * c.ppo.num_steps),
                        "coefficients": cost.load_coefficients().device_kind}))
      """, tmp_path)
  assert res.returncode == 0, res.stderr[-3000:]
  info = json.loads(res.stdout.strip().splitlines()[-1])
  assert Path(info["file"]).is_relative_to(installed), info
  assert not info["experiments"] and info["updates"] == 2, info
  assert info["coefficients"] == "cpu", info


@pytest.mark.slow  # every method compiles its search (and PPO its training): several minutes
def test_installed_package_runs_every_method_outside_the_checkout(installed, tmp_path):
  res = _run(installed, """
      import json
      from xrlflow_jax import optimize as opt
      out = {}
      for method in opt.METHODS:
        r = opt.optimize_model("squeezenet1_1", size="tiny", method=method, budget=2,
                               output_dir=f"out_{method}", measure=False, picture=False,
                               compilation_cache_dir="off", log=lambda *_: None)
        out[method] = {"numerics": r.numerics.passed, "found_by": r.found_by,
                       "files": sorted(r.files), "recorded": r.rewrites is not None}
      print(json.dumps(out))
      """, tmp_path, timeout=1800)
  assert res.returncode == 0, res.stderr[-3000:]
  out = json.loads(res.stdout.strip().splitlines()[-1])
  assert sorted(out) == sorted(["ppo", "greedy", "taso", "beam", "random"]), out
  for method, r in out.items():
    assert r["numerics"] and r["recorded"], (method, r)
    assert {"report", "rewrites", "graph_text"} <= set(r["files"]), (method, r)
