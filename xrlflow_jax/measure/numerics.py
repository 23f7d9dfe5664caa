"""Whether a rewritten graph computes what the original does: outputs compared NaN-aware,
within the numerics policy's tolerance."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np

from xrlflow_jax import executor
from xrlflow_jax.errors import XrlflowError
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.measure.verdict import MeasurementError
from xrlflow_jax.ops import precision as precision_lib

DEFAULT_TOLERANCE = precision_lib.TOLERANCE[precision_lib.DEFAULT_POLICY]  # 1e-3


class NumericsError(XrlflowError):
  """The optimised graph computes something else than the original (nothing is written)."""


@dataclasses.dataclass(frozen=True)
class NumericsCheck:
  """Outputs of the original and the optimised graph on the same inputs.

  Attributes:
    max_abs_error: max |a - b| over the finite entries of all outputs (NaN propagates);
    max_rel_error: max |a - b| / (1 + |a|) likewise.
    outputs: number of outputs compared; tolerance: the bound on max_rel_error.
    passed: every output has the same shape, the same non-finite values in the same places and
      max_rel_error <= tolerance.
    nonfinite: what was found non-finite ("" when every value is finite): a mismatch (the check
      fails) or non-finite values shared by both graphs at the same places (reported, allowed).
  """
  max_abs_error: float
  max_rel_error: float
  outputs: int
  tolerance: float
  passed: bool
  nonfinite: str = ""

  def describe(self) -> str:
    """One line: PASS/FAIL, the errors, the tolerance, and any non-finite values."""
    text = (f"{'PASS' if self.passed else 'FAIL'} on {self.outputs} output(s): max abs error "
            f"{self.max_abs_error:.2e}, max rel error {self.max_rel_error:.2e} (tolerance "
            f"{self.tolerance:.0e})")
    return text + (f"; {self.nonfinite}" if self.nonfinite else "")


def _nan_max(current: float, value: float) -> float:
  """max() that propagates NaN (Python's max(0.0, nan) is 0.0)."""
  return value if math.isnan(value) or value > current else current


def compare_outputs(reference: Sequence[Any], candidate: Sequence[Any], *,
                    tolerance: float = DEFAULT_TOLERANCE) -> NumericsCheck:
  """Compares two graphs' outputs (arrays in output order).

  Integer and boolean outputs must be equal; float outputs must agree to
  max |a - b| / (1 + |a|) <= tolerance on their finite entries and carry the same NaN and
  +-Inf at the same places. NumericsError when the count or a shape differs.
  """
  if len(reference) != len(candidate):
    raise NumericsError(f"the optimised graph has {len(candidate)} outputs, the original "
                        f"{len(reference)}")
  if not (tolerance >= 0):
    raise MeasurementError(f"the numerics tolerance must be >= 0, got {tolerance}")
  max_abs = max_rel = 0.0
  notes: list[str] = []
  ok = True
  for i, (a, b) in enumerate(zip(reference, candidate)):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
      raise NumericsError(f"output {i} has shape {list(b.shape)} in the optimised graph, "
                          f"{list(a.shape)} in the original")
    if not a.size:
      continue
    if not (np.issubdtype(a.dtype, np.inexact) or np.issubdtype(b.dtype, np.inexact)):
      differ = a != b
      if differ.any():
        ok = False
        wide = np.abs(a.astype(np.float64) - b.astype(np.float64))[differ]
        max_abs = _nan_max(max_abs, float(wide.max()))
        max_rel = _nan_max(max_rel, float((wide / (1.0 + np.abs(a.astype(np.float64))[differ]))
                                          .max()))
        notes.append(f"output {i}: {int(differ.sum())} integer value(s) differ")
      continue
    a, b = a.astype(np.float64), b.astype(np.float64)
    fa, fb = np.isfinite(a), np.isfinite(b)
    same_special = (~fa & ~fb) & ((a == b) | (np.isnan(a) & np.isnan(b)))
    bad = ~(fa & fb) & ~same_special
    if bad.any():
      ok = False
      where = "the optimised graph" if (~fb & fa).any() else "the original"
      notes.append(f"output {i}: {int(bad.sum())} non-finite value(s) in {where} where the "
                   "other graph differs")
      max_abs = max_rel = float("nan")
    elif same_special.any():
      notes.append(f"output {i}: {int(same_special.sum())} non-finite value(s) in both graphs "
                   "at the same places")
    both = fa & fb
    if both.any():
      diff = np.abs(a[both] - b[both])
      max_abs = _nan_max(max_abs, float(diff.max()))
      max_rel = _nan_max(max_rel, float((diff / (1.0 + np.abs(a[both]))).max()))
  passed = bool(ok and max_rel <= tolerance)  # NaN compares False
  return NumericsCheck(max_abs, max_rel, len(reference), float(tolerance), passed,
                       "; ".join(notes))


def check_numerics(reference: layout.Graph, candidate: layout.Graph, params: ParamStore, *,
                   seed: int = 0, tolerance: float = DEFAULT_TOLERANCE,
                   precision: str | None = None,
                   candidate_params: ParamStore | None = None) -> NumericsCheck:
  """Runs both graphs on the same random inputs (`executor.lower(...).random_inputs(seed)`),
  both under the numerics policy `precision`, and compares every output (`compare_outputs`).
  `candidate_params`: the candidate's own weights (a graph loaded apart, e.g. a written file
  read back); None: `params`."""
  ref = executor.lower(reference, params, precision=precision)
  new = executor.lower(candidate, params if candidate_params is None else candidate_params,
                       precision=precision)
  inputs = ref.random_inputs(seed)
  return compare_outputs(ref(*inputs), new(*inputs), tolerance=tolerance)
