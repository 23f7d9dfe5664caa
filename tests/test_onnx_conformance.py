"""ONNX operator conformance: the executor as an ONNX backend under `onnx.backend.test`.

The cases in scope are the float32 node cases of every op the importer converts (plus Constant,
Shape and Size, which are folded; bool and integer tensors may appear beside float32 ones, as a
comparison's result or ArgMax's indices), including the "expanded" cases that spell a function
op out in supported ops. By default one case per op runs (fast); `-m slow` runs them all. What is excluded,
and why, is listed in EXCLUDED; excluded cases must still fail cleanly with the project's own
errors. Run `python -m xrlflow_jax.onnx_io conformance` for the pass / total table per op.
"""

from __future__ import annotations

import re
import unittest

import pytest

pytest.importorskip("onnx.backend.test")

import onnx.backend.test  # noqa: E402

from xrlflow_jax import errors  # noqa: E402
from xrlflow_jax.onnx_io import backend as xb  # noqa: E402

EXCLUDED = xb.EXCLUDED  # what is excluded, and why (the CLI's table counts them per op)


def _exclusion(name: str) -> str | None:
  return xb.exclusion(name)


_CASES = {c.name: c for c in xb.node_cases()}
_IN_SCOPE = sorted(n for n, c in _CASES.items() if xb.scope(c) is None)
_RUN = [n for n in _IN_SCOPE if _exclusion(n) is None]
_EXCLUDED_CASES = [n for n in _IN_SCOPE if _exclusion(n) is not None]
# The expanded (function body) cases of these ONNX-import ops run under -m slow only: the
# default keeps one plain case of each.
_SLOW_EXPANDED = {"Celu", "GreaterOrEqual", "LessOrEqual", "LogSoftmax", "Mish", "Shrink",
                  "Softplus", "ThresholdedRelu", "ReduceLogSumExp", "GroupNormalization"}
_FIRST_PER_OP: dict[str, str] = {}
for _name in _RUN:
  _op = xb.main_op(_CASES[_name])
  if _op.removesuffix(" (expanded)") not in _SLOW_EXPANDED or not _op.endswith("(expanded)"):
    _FIRST_PER_OP.setdefault(_op, _name)
_DEFAULT = set(_FIRST_PER_OP.values())

_backend_test = onnx.backend.test.BackendTest(xb.XrlflowBackend, __name__)
for _name in _RUN:
  _backend_test.include(f"^{re.escape(_name)}_cpu$")
for _pattern in EXCLUDED:
  _backend_test.exclude(_pattern)
# Kept in a dict: a TestCase class at module level would be collected by pytest as a whole.
_SUITES = {"node": _backend_test.test_cases["OnnxBackendNodeModelTest"]}


@pytest.mark.parametrize("name", [n if n in _DEFAULT else pytest.param(n, marks=pytest.mark.slow)
                                  for n in _RUN])
def test_node_case(name: str):
  """One onnx.backend.test node case, run by BackendTest's own test method."""
  result = unittest.TestResult()
  _SUITES["node"](f"{name}_cpu").run(result)
  problems = [text for _, text in result.errors + result.failures]
  assert not problems, problems[0][-2000:]
  assert not result.skipped, result.skipped


def test_scope_is_substantial():
  ops = {xb.main_op(_CASES[n]) for n in _RUN}
  for op in ("Conv", "Gemm", "MatMul", "MaxPool", "AveragePool", "BatchNormalization",
             "LayerNormalization", "Softmax", "Reshape", "Slice", "Split", "Pad", "LRN"):
    assert op in ops, op
  assert len(_RUN) > 300


@pytest.mark.parametrize("name", _EXCLUDED_CASES)
def test_excluded_case_fails_cleanly(name: str):
  """Excluded cases are refused with the project's own errors, never a crash or a wrong value."""
  with pytest.raises(errors.XrlflowError):
    xb.run_case_or_raise(_CASES[name])


@pytest.mark.slow
def test_conformance_table():
  results = xb.conformance([_CASES[n] for n in _RUN])
  print(xb.table(results))
  failed = [(r.name, r.message) for r in results if not r.passed]
  assert not failed, failed


def test_backend_api_run_node_and_dict_inputs():
  import numpy as np  # pylint: disable=g-import-not-at-top
  from onnx import helper  # pylint: disable=g-import-not-at-top
  x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
  node = helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.25)
  (y,) = xb.XrlflowBackend.run_node(node, [x])
  np.testing.assert_allclose(y, np.where(x > 0, x, 0.25 * x), rtol=1e-6)
  shape = np.asarray([2, 6], np.int64)
  node = helper.make_node("Reshape", ["x", "s"], ["y"])
  (y,) = xb.XrlflowBackend.run_node(node, {"x": x, "s": shape})
  np.testing.assert_array_equal(y, x.reshape(2, 6))
  assert xb.XrlflowBackend.supports_device("CPU")
  assert not xb.XrlflowBackend.supports_device("CUDA")
