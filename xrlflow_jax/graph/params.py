"""The host-side parameter store: weight values of Constant nodes, keyed by `param_id`."""

from __future__ import annotations

from typing import Iterator, Mapping

import numpy as np

from xrlflow_jax.errors import ParamError


class ParamStore(Mapping[int, np.ndarray]):
  """Maps a Constant node's `param_id` to its value (a numpy array).

  Weights never live in the graph state; rewrites that need new weights create ops on constants,
  which the executor evaluates once at lowering, so the store never changes during a search.
  Names (from ONNX initializers or the builder) are kept for export and error messages.
  """

  def __init__(self, arrays: Mapping[int, np.ndarray] | None = None,
               names: Mapping[int, str] | None = None):
    self._arrays: dict[int, np.ndarray] = dict(arrays or {})
    self.names: dict[int, str] = dict(names or {})

  def add(self, value: np.ndarray, name: str | None = None) -> int:
    """Stores a value and returns its new param id."""
    pid = len(self._arrays)
    while pid in self._arrays:
      pid += 1
    self._arrays[pid] = np.asarray(value)
    if name is not None:
      self.names[pid] = name
    return pid

  def __getitem__(self, pid: int) -> np.ndarray:
    try:
      return self._arrays[int(pid)]
    except KeyError:
      raise ParamError(f"param {pid} is not in the parameter store "
                       f"({len(self._arrays)} params)") from None

  def __iter__(self) -> Iterator[int]:
    return iter(self._arrays)

  def __len__(self) -> int:
    return len(self._arrays)

  def nbytes(self) -> int:
    """Total bytes of all stored values."""
    return int(sum(a.nbytes for a in self._arrays.values()))

  def __repr__(self) -> str:
    return f"ParamStore({len(self)} params, {self.nbytes() / 1e6:.1f} MB)"
