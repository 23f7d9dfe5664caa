"""Cost-model coefficients for the device at hand, calibrated on first use.

    coeffs = calibrate.coefficients()      # shipped fit, an earlier calibration, or one made now

In order: a file given by the caller (or `$XRLFLOW_COST_COEFFS`); the fit the package ships for
this device kind (`data/cost_<kind>.json`, today only "cpu"); a calibration made earlier on
this device kind (`calibrated_path`, under `$XRLFLOW_CALIBRATION_DIR` or
`$XDG_CACHE_HOME/xrlflow_jax/cost`); else a calibration now: the per-op profiler times every
op signature of a fixed suite of tiny zoo models (and each model whole), the non-negative
least-squares fit of `cost.fit` turns them into coefficients, and they are cached for every
later run. The same calibration on demand: `python -m xrlflow_jax.cost calibrate [--quick]
--out=FILE`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import jax

from xrlflow_jax import models
from xrlflow_jax.cost import coefficient_files
from xrlflow_jax.cost import fit as fit_lib
from xrlflow_jax.measure import latency
from xrlflow_jax.cost import model as cost_model
from xrlflow_jax.cost import profiler as profiler_lib

# The suites: (zoo model, size). Quick: tiny SqueezeNet (convolutions, concat, pooling),
# ResNeXt-50 (grouped convolutions, residual adds), BERT (matmuls, softmax, layer norm) and
# NasRNN (small matmuls, elementwise chains). Full (the default): those, ResNet-18 and
# Inception-v3 tiny, and four at default size. On the 2-core CPU (2026-12-01) the quick suite
# took 36 s and the full one 83 s; on seven default-size zoo models the full fit's modelled
# latency was within x1.14 of the measured one (median; worst x1.52), the quick fit's within
# x3.4 (tiny kernels overstate the per-FLOP cost of big ones), the shipped fit's within x1.61.
QUICK_SUITE: tuple[tuple[str, str], ...] = (
    ("squeezenet1_1", "tiny"), ("resnext50", "tiny"), ("bert", "tiny"), ("nasrnn", "tiny"))
FULL_SUITE: tuple[tuple[str, str], ...] = QUICK_SUITE + (
    ("resnet18", "tiny"), ("inception_v3", "tiny"), ("squeezenet1_1", "default"),
    ("resnext50", "default"), ("bert", "default"), ("nasrnn", "default"))


@dataclasses.dataclass(frozen=True)
class Calibration:
  """A calibration's result: the coefficients, where they were written, how long it took
  (profiling and fitting, seconds) and the fit's quality on its own rows."""
  coeffs: cost_model.CostCoefficients
  path: Path
  seconds: float
  report: fit_lib.FitReport
  suite: tuple[tuple[str, str], ...]


def calibrate(*, quick: bool = False, out: str | os.PathLike | None = None,
              backend: str | None = None, suite: Sequence[tuple[str, str]] | None = None,
              profile_cache: str | os.PathLike | None = None, repeats: int = 20,
              log: Callable[[str], None] | None = print) -> Calibration:
  """Profiles a fixed suite of zoo models on this device and fits the cost model to it.

  Args:
    quick: `QUICK_SUITE` (tiny models) instead of `FULL_SUITE`; suite: another list of
      (zoo model, size) pairs.
    out: the JSON file to write (default: this device kind's
      `cost.coefficient_files.calibrated_path`).
    backend: JAX platform to calibrate (default JAX's default device).
    profile_cache: the profiler's cache directory (default its own); measured signatures are
      kept there, so a second calibration measures only what is new.
    repeats: timed runs per op signature.
  """
  t0 = time.perf_counter()
  suite = tuple(suite or (QUICK_SUITE if quick else FULL_SUITE))
  prof = profiler_lib.Profiler(profile_cache, backend, repeats=repeats)
  kind = prof.device.device_kind
  if log:
    log(f"calibrating the cost model for {kind} on {len(suite)} models "
        f"({', '.join(f'{m}[{s}]' for m, s in suite)})")
  samples = []
  for name, size in suite:
    graph, params = models.build(name, size)
    samples.append(fit_lib.GraphSample(f"{name}[{size}]", graph, params))
  coeffs, report, details = fit_lib.fit_on_graphs(prof, samples, progress=log is not None,
                                                  log=log or (lambda _: None))
  seconds = time.perf_counter() - t0
  path = coefficient_files.save_coefficients(
      coeffs, out or coefficient_files.calibrated_path(kind), jax_version=jax.__version__,
      backend=prof.device.platform,
      fit={**report.to_json(), **details, "calibration": "quick" if quick else "full",
           "suite": [f"{m}[{s}]" for m, s in suite], "seconds": seconds})
  if log:
    log(f"calibrated {kind} in {seconds:.0f} s on {report.rows} rows (median relative error "
        f"{report.median_rel_err:.3f}, 90th percentile {report.p90_rel_err:.3f}); wrote {path}")
  return Calibration(coeffs, Path(path), seconds, report, suite)


def _stderr(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def coefficients(path: str | os.PathLike | None = None, *, backend: str | None = None,
                 calibrate_missing: bool = True, quick: bool = False,
                 log: Callable[[str], None] | None = _stderr) -> cost_model.CostCoefficients:
  """The coefficients of this device: `path` (or `$XRLFLOW_COST_COEFFS`), the shipped fit, an
  earlier calibration, or (`calibrate_missing`) a calibration made now and cached (logged).

  Raises:
    CostModelError: a bad file, or no coefficients and `calibrate_missing=False`.
  """
  if path is not None or os.environ.get(coefficient_files.COEFFS_ENV):
    return coefficient_files.load_coefficients(path=path)
  kind = latency.resolve_device(backend).device_kind
  if (not calibrate_missing or coefficient_files.coefficients_path(kind).is_file()
      or coefficient_files.calibrated_path(kind).is_file()):
    return coefficient_files.load_coefficients(kind)  # none: raises, saying how to calibrate
  if log:
    log(f"no cost-model coefficients for device kind {kind!r}: calibrating once on this device "
        f"(cached in {coefficient_files.calibrated_path(kind)}; `python -m xrlflow_jax.cost "
        "calibrate` does the same on demand)")
  return calibrate(quick=quick, backend=backend, log=log).coeffs
