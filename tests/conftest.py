"""Shared test fixtures: where ../shared lives, and a skip when it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
  """The ../shared folder beside the repository; skips the test when it is absent."""
  if not SHARED.is_dir():
    pytest.skip(f"../shared is absent (looked for {SHARED}); it holds the ONNX models and "
                "TASO's rule file these tests read")
  return SHARED


# XLA:CPU compile options for the test processes (and the binaries they start, which inherit
# the environment). The suite is dominated by XLA compiles of large matchers and cost models
# that then run a few times; LLVM's optimisation level 0 and the classic (non-fusion-emitter)
# CPU backend halve those compiles (test_exact_candidate_delta_matches_applying alone: 91 s ->
# 45 s, 2026-12-03). Same HLO, same XLA passes: only the machine code differs, so what a test
# checks (graphs, costs, numerics within tolerance) is unchanged; timings are slower and no
# test asserts a speed. XRLFLOW_TEST_XLA_DEFAULTS=1 runs the suite with XLA's defaults.
FAST_COMPILE_XLA_FLAGS = ("--xla_backend_optimization_level=0",
                          "--xla_cpu_use_fusion_emitters=false")


def _use_fast_compile_flags() -> None:
  import os  # pylint: disable=g-import-not-at-top
  if os.environ.get("XRLFLOW_TEST_XLA_DEFAULTS") == "1":
    return
  flags = os.environ.get("XLA_FLAGS", "").split()
  known = {f.split("=")[0] for f in flags}  # a flag the user set wins
  flags += [f for f in FAST_COMPILE_XLA_FLAGS if f.split("=")[0] not in known]
  os.environ["XLA_FLAGS"] = " ".join(flags)


@pytest.fixture(scope="session")
def xla_defaults_env() -> dict[str, str]:
  """This process's environment without `FAST_COMPILE_XLA_FLAGS`: a subprocess started with it
  compiles with XLA's default code generation, as users' processes do."""
  import os  # pylint: disable=g-import-not-at-top
  ours = set(FAST_COMPILE_XLA_FLAGS)
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if f not in ours]
  return {**os.environ, "XLA_FLAGS": " ".join(flags)}


def pytest_configure(config):
  """Shares XLA compilations between test processes (pytest-xdist workers) of one run."""
  import os  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top

  _use_fast_compile_flags()  # before the first backend starts
  import jax  # pylint: disable=g-import-not-at-top
  cache = os.environ.get("XRLFLOW_TEST_JAX_CACHE")
  if cache is None:  # the controlling process makes it; xdist workers inherit the variable
    cache = tempfile.mkdtemp(prefix="xrlflow-jax-cache-")
    os.environ["XRLFLOW_TEST_JAX_CACHE"] = cache
    config.stash[_OWNED_CACHE] = cache
  jax.config.update("jax_compilation_cache_dir", cache)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  # Measured kernels (the optimise job's kernel table) go to a cache of this run, shared by
  # the workers, not the user's ~/.cache.
  os.environ.setdefault("XRLFLOW_PROFILE_CACHE", os.path.join(cache, "profiles"))


def pytest_unconfigure(config):
  """Removes the compilation cache this run made (a run per CI job must not fill /tmp)."""
  import shutil  # pylint: disable=g-import-not-at-top
  cache = config.stash.get(_OWNED_CACHE, None)
  if cache is not None:
    shutil.rmtree(cache, ignore_errors=True)


_OWNED_CACHE = pytest.StashKey[str]()


# The default suite's longest tests that need no expensive module fixture, longest first
# (seconds alone on the 2-core CI machine, 2026-12-01). pytest-xdist hands each worker a
# contiguous chunk and then refills both from the front of what is left, so a long test at the
# end of the collection (the TASO harness is in the last file) runs alone while the other worker
# idles; started first, the other worker works through short tests meanwhile.
_RUN_FIRST = (
    "tests/test_taso_rules.py::test_verify_a_sample_of_the_rules",
    "tests/test_cli_fuzz.py::test_cli_fuzz",  # ~120 s
    "tests/test_search.py::test_bucketed_expansion_equals_each_candidate_alone_on_a_zoo_model",
    "tests/test_experiments_cli.py::test_benchmark_quick_one_model",
    "tests/test_search.py::test_search_benchmark_times_cold_and_warm_calls",
)


def pytest_collection_modifyitems(config, items):
  """Moves `_RUN_FIRST` to the front, in that order (the same order on every xdist worker)."""
  del config
  rank = {nodeid: i for i, nodeid in enumerate(_RUN_FIRST)}
  items.sort(key=lambda item: rank.get(item.nodeid, len(rank)))  # stable: the rest keep order
