"""Coefficient files: where `CostCoefficients` are kept on disk, and reading and writing them.

    coeffs = load_coefficients()                 # $XRLFLOW_COST_COEFFS, the shipped fit, or a
                                                 #   calibration made on this machine
    save_coefficients(coeffs, calibrated_path(coeffs.device_kind), fit={...})

The package ships fits as `data/cost_<slug>.json` (`coefficients_path`); calibrations made on
this machine (`cost.calibrate`) go to `calibration_dir()`. A file is `CostCoefficients.to_json`
written as JSON, with any fit statistics beside it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax

from xrlflow_jax.cost.model import CostCoefficients, CostModelError

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
COEFFS_ENV = "XRLFLOW_COST_COEFFS"  # a JSON file of coefficients to use instead of the shipped one
CALIBRATION_ENV = "XRLFLOW_CALIBRATION_DIR"  # where calibrations made on this machine are kept


def coefficients_path(device_kind: str) -> Path:
  """Where the package keeps coefficients for `device_kind` (data/cost_<slug>.json)."""
  return DATA_DIR / f"cost_{slug(device_kind)}.json"


def calibration_dir() -> Path:
  """Where calibrations made on this machine are kept (`cost.calibrate`):
  `$XRLFLOW_CALIBRATION_DIR`, else `$XDG_CACHE_HOME/xrlflow_jax/cost` (`~/.cache/...`)."""
  if os.environ.get(CALIBRATION_ENV):
    return Path(os.environ[CALIBRATION_ENV]).expanduser()
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return Path(base) / "xrlflow_jax" / "cost"


def calibrated_path(device_kind: str) -> Path:
  """The calibration file of one device kind (cost_<slug>.json in `calibration_dir()`)."""
  return calibration_dir() / f"cost_{slug(device_kind)}.json"


def slug(text: str) -> str:
  """A file-name-safe form of a device kind: 'NVIDIA H200' -> 'nvidia_h200'."""
  return "".join(ch if ch.isalnum() else "_" for ch in text.strip().lower()) or "unknown"


def save_coefficients(coeffs: CostCoefficients, path: str | os.PathLike[str],
                      **extra: Any) -> Path:
  """Writes `coeffs` (and fit statistics in `extra`) as JSON; returns the path."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
  tmp.write_text(json.dumps(coeffs.to_json(**extra), indent=2, sort_keys=False) + "\n")
  os.replace(tmp, path)
  return path


def load_coefficients(device_kind: str | None = None,
                      path: str | os.PathLike[str] | None = None) -> CostCoefficients:
  """Coefficients for a device kind.

  Args:
    device_kind: e.g. "cpu" or "NVIDIA H200"; default the kind of JAX's default device.
    path: a JSON file to read instead (default: $XRLFLOW_COST_COEFFS if set, else the file the
      package ships for that device kind, `data/cost_<slug>.json`, else a calibration made on
      this machine, `calibrated_path(device_kind)`).
  Raises:
    CostModelError: no coefficients for that device kind (the message says how to calibrate:
      `python -m xrlflow_jax.cost calibrate`; `cost.calibrate.coefficients` calibrates
      automatically), or a malformed file.
  """
  if device_kind is None:
    device_kind = jax.devices()[0].device_kind
  if path is None and os.environ.get(COEFFS_ENV):
    path = os.environ[COEFFS_ENV]
  file = Path(path) if path is not None else coefficients_path(device_kind)
  if path is None and not file.is_file():
    file = calibrated_path(device_kind)
  if not file.is_file():
    shipped = sorted(p.name for p in DATA_DIR.glob("cost_*.json")) if DATA_DIR.is_dir() else []
    looked = file if path is not None else f"{coefficients_path(device_kind)} and {file}"
    raise CostModelError(
        f"no cost-model coefficients for device kind {device_kind!r} (looked for {looked}; the "
        f"package ships {shipped}); calibrate this device with `python -m xrlflow_jax.cost "
        f"calibrate` (a few minutes; the optimise job and training do it on first use)")
  try:
    data = json.loads(file.read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise CostModelError(f"{file}: cannot read coefficients ({e})") from None
  return CostCoefficients.from_json(data, where=str(file))
