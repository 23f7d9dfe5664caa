"""Metric writers for training runs: a CSV file (always), TensorBoard event files (when
tensorboardX or TensorFlow is importable) and a PNG training curve (when matplotlib is).

None of the optional packages is a dependency of this project; `available()` says which writers
are active so a driver can report what it skipped.
"""

from __future__ import annotations

import csv
import importlib.util
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np


def available() -> dict[str, str | None]:
  """{"tensorboard": module used or None, "png": "matplotlib" or None}."""
  tb = None
  for name in ("tensorboardX", "tensorflow"):
    if importlib.util.find_spec(name) is not None:
      tb = name
      break
  png = "matplotlib" if importlib.util.find_spec("matplotlib") is not None else None
  return {"tensorboard": tb, "png": png}


class CsvWriter:
  """Appends one row per update to `path`; on resume drops rows past the resumed update.

  Args:
    path: the CSV file. columns: metric names (the header is "update", "seed", then these).
    resume_from: keep only existing rows with update <= this (None: start a new file).
  """

  def __init__(self, path: str | os.PathLike[str], columns: Sequence[str],
               resume_from: int | None = None):
    self.path = Path(path)
    self.columns = ["update", "seed", *columns]
    self.path.parent.mkdir(parents=True, exist_ok=True)
    kept: list[list[str]] = []
    if resume_from is not None and self.path.is_file():
      with self.path.open(newline="") as f:
        rows = list(csv.reader(f))
      if rows and rows[0] == self.columns:
        kept = [r for r in rows[1:] if r and int(r[0]) <= resume_from]
    with self.path.open("w", newline="") as f:
      w = csv.writer(f)
      w.writerow(self.columns)
      w.writerows(kept)

  def write(self, update: int, seed: int, metrics: Mapping[str, Any]) -> None:
    """One row; missing metrics are empty cells."""
    row = [str(update), str(seed)]
    for c in self.columns[2:]:
      v = metrics.get(c)
      row.append("" if v is None else repr(float(v)))
    with self.path.open("a", newline="") as f:
      csv.writer(f).writerow(row)


def read_csv(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
  """{column: float64[rows]} of a CsvWriter file (empty cells are NaN)."""
  with Path(path).open(newline="") as f:
    rows = list(csv.reader(f))
  header, body = rows[0], rows[1:]
  return {h: np.asarray([float(r[i]) if r[i] else math.nan for r in body]) for i, h in
          enumerate(header)}


class TensorBoardWriter:
  """Scalar summaries through tensorboardX or tf.summary; `active` is False when neither is
  importable (then `write` does nothing)."""

  def __init__(self, logdir: str | os.PathLike[str]):
    self.backend = available()["tensorboard"]
    self._writer: Any = None
    if self.backend == "tensorboardX":
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self._writer = SummaryWriter(str(logdir))
    elif self.backend == "tensorflow":
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      self._writer = tf.summary.create_file_writer(str(logdir))

  @property
  def active(self) -> bool:
    return self._writer is not None

  def write(self, step: int, metrics: Mapping[str, Any], prefix: str = "") -> None:
    if self.backend == "tensorboardX":
      for k, v in metrics.items():
        self._writer.add_scalar(prefix + k, float(v), step)
    elif self.backend == "tensorflow":
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      with self._writer.as_default():
        for k, v in metrics.items():
          tf.summary.scalar(prefix + k, float(v), step=step)

  def close(self) -> None:
    if self._writer is not None:
      self._writer.flush()
      self._writer.close()


def plot_curves(csv_path: str | os.PathLike[str], png_path: str | os.PathLike[str],
                keys: Sequence[str] = ("episode_return", "best_cost_ratio", "entropy")) -> bool:
  """A PNG of `keys` against env steps, one panel each, a line per seed; False (nothing
  written) when matplotlib is not installed."""
  if available()["png"] is None:
    return False
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  data = read_csv(csv_path)
  fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.5))
  for ax, key in zip(np.atleast_1d(axes), keys):
    for seed in np.unique(data["seed"]):
      sel = data["seed"] == seed
      ax.plot(data["env_steps"][sel], data[key][sel], label=f"seed {int(seed)}")
    ax.set_xlabel("environment steps")
    ax.set_title(key)
  np.atleast_1d(axes)[0].legend()
  fig.tight_layout()
  fig.savefig(png_path, dpi=100)
  plt.close(fig)
  return True
