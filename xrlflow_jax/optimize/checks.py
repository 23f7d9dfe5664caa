"""The optimise job's checks: every argument it can refuse is refused before loading or
searching, with an error naming the argument (and the flag) at fault."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from xrlflow_jax import ops
from xrlflow_jax import graph as G
from xrlflow_jax.errors import ShapeError, UsageError
from xrlflow_jax.graph import layout
from xrlflow_jax.measure import MeasurementError, check_settings
from xrlflow_jax.ops import precision as precision_lib
from xrlflow_jax.ops.spec import checked_dims
from xrlflow_jax.search.result import JOB_METHODS as METHODS
from xrlflow_jax.workflow import SIZES, Loaded, resolve

# The random inputs, the weights and the two largest tensors must fit in this share of the
# device's memory before any search starts.
MEMORY_SHARE = 0.8


class OptimizeError(UsageError):
  """Bad input to the optimise job: unknown method, bad shape text, budget, output path...
  (bad model names and files raise `workflow.LoadError`, also a UsageError)."""


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
  """"name=1,3,224,224" -> ("name", (1, 3, 224, 224)); OptimizeError names bad text."""
  name, sep, dims = text.rpartition("=")
  name = name.strip()
  if not sep or not name:
    raise OptimizeError(f"bad input shape {text!r}: expected name=d0,d1,... "
                        "(e.g. x=1,3,224,224)")
  parts = [d.strip() for d in dims.split(",")]
  if not parts or not all(re.fullmatch(r"\d+", d) for d in parts):
    raise OptimizeError(f"bad input shape {text!r}: the dims of {name!r} must be positive "
                        f"integers separated by commas, got {dims!r}")
  return name, check_shape(name, [int(d) for d in parts])


def check_shape(name: str, dims: Sequence[Any]) -> tuple[int, ...]:
  """A whole input shape checked by `ops.spec.checked_dims` (integers in [1, 2^31 - 1], at most
  2^31 - 1 elements); OptimizeError names the input and the flag."""
  try:
    return checked_dims(dims)
  except ShapeError as e:
    raise OptimizeError(f"input {name!r}: {e} (--input_shape={name}=d0,d1,...)") from None


def parse_input_shapes(texts: Sequence[str]) -> dict[str, tuple[int, ...]]:
  """Several `parse_input_shape` texts as {name: shape}; a repeated name is an error."""
  out: dict[str, tuple[int, ...]] = {}
  for t in texts:
    name, shape = parse_input_shape(t)
    if name in out:
      raise OptimizeError(f"input {name!r} is given two shapes ({out[name]} and {shape})")
    out[name] = shape
  return out


def _positive_int(value: Any, what: str) -> None:
  """OptimizeError unless `value` is None (the default) or an integer >= 1."""
  if value is None:
    return
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise OptimizeError(f"{what} must be a positive integer, got {value!r}")


def check_output_dir(path: str | os.PathLike) -> Path:
  """`path` can be written as the output folder: not an existing file, and its nearest existing
  ancestor is a writable folder. OptimizeError naming the path otherwise."""
  out = Path(path)
  if out.exists() and not out.is_dir():
    raise OptimizeError(f"output {str(out)!r} is an existing file, not a folder (--output)")
  parent = out
  while not parent.exists():
    parent = parent.parent
  if not parent.is_dir():
    raise OptimizeError(f"output {str(out)!r} cannot be created: {str(parent)!r} is a file "
                        "(--output)")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise OptimizeError(f"output {str(out)!r} is not writable: no write permission on "
                        f"{str(parent)!r} (--output)")
  return out


def check_request(source: str | None, *, method: str, size: str,
                  input_shapes: Mapping[str, Sequence[int]] | None, output_dir: Any,
                  budget: int | None, capacity: int | None, latency_rounds: int,
                  repeats_per_round: int, tolerance: float | None, write: bool,
                  precision: str | None = None, min_round_ms: float = 0.0,
                  against: str | None = None, measure: bool = True,
                  latency_looks: int = 1) -> dict[str, tuple[int, ...]]:
  """Every argument of `optimize_model` that can be checked without loading: OptimizeError
  (or MeasurementError) naming the argument (`source` None: a model given as a graph). Returns
  the input shapes as int tuples."""
  if method not in METHODS:
    raise OptimizeError(f"unknown method {method!r}; methods are {', '.join(METHODS)}")
  if size not in SIZES:
    raise OptimizeError(f"unknown size {size!r}; sizes are {', '.join(SIZES)}")
  _positive_int(budget, "the budget (--budget)")
  _positive_int(capacity, "the capacity (--capacity)")
  try:
    precision_lib.check(precision)
  except precision_lib.PrecisionError as e:
    raise OptimizeError(f"{e} (--precision)") from None
  if tolerance is not None and not (isinstance(tolerance, (int, float))
                                    and math.isfinite(tolerance) and tolerance >= 0):
    raise OptimizeError(f"the numerics tolerance must be a finite number >= 0, got "
                        f"{tolerance!r}")
  try:  # checked even with measure_latency=False: a bad value is a mistake either way
    check_settings(latency_rounds, repeats_per_round, min_round_ms=min_round_ms,
                   looks=latency_looks)
  except MeasurementError as e:
    raise OptimizeError(f"{e} (--latency_rounds, --repeats_per_round, --min_round_ms, "
                        "--latency_looks)") from None
  shapes = {}
  for name, dims in dict(input_shapes or {}).items():
    shapes[str(name)] = check_shape(str(name), dims)
  # A model given as a graph (a traced JAX function) has fixed shapes and nothing to resolve.
  is_onnx = source is not None and resolve(source, size).is_onnx  # LoadError: unknown name...
  if shapes and not is_onnx:
    raise OptimizeError("input shapes apply to ONNX files only; zoo models and traced "
                        "functions have fixed shapes")
  if against is not None:
    if not measure:
      raise OptimizeError("a graph to time against (--against) needs the latency measurement "
                          "(--measure)")
    if not resolve(str(against), size).is_onnx:
      raise OptimizeError(f"--against takes an ONNX file (another optimiser's output of the "
                          f"same model), got {against!r}")
  if write and output_dir:
    check_output_dir(output_dir)
  return shapes


def memory_need(graph: layout.Graph) -> tuple[int, int, int, str]:
  """(bytes of the graph's inputs, of its constants, of its largest tensor, that tensor as
  "node 12 (MATMUL) [1024, 4096] float32"). Padded dims are 1, so a row's product is its size;
  float64 keeps products of int32 dims exact enough for a memory estimate."""
  nd = G.to_arrays(graph)
  alive = nd["alive"]
  nbytes = np.prod(nd["shape"].astype(np.float64), axis=1) * \
      np.asarray(ops.dtype_size(np, nd["dtype"]), np.float64)
  nbytes = np.where(alive, nbytes, 0.0)
  inputs = int(nbytes[nd["op"] == int(ops.Op.INPUT)].sum())
  consts = int(nbytes[nd["op"] == int(ops.Op.CONSTANT)].sum())
  v = int(np.argmax(nbytes))
  shape = [int(d) for d in ops.unpad_shape(nd["shape"][v], nd["rank"][v])]
  what = (f"node {v} ({ops.Op(int(nd['op'][v])).name}) {shape} "
          f"{ops.DType(int(nd['dtype'][v])).name.lower()}")
  return inputs, consts, int(nbytes[v]), what


def device_memory_bytes() -> int:
  """Memory of the default device: its allocator's limit (GPUs), else the host's RAM."""
  try:
    stats = jax.devices()[0].memory_stats() or {}
  except Exception:  # pylint: disable=broad-except
    stats = {}
  if stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def check_memory(loaded: Loaded) -> None:
  """OptimizeError, before any search, when the graph cannot run here: its random inputs (a
  host copy and a device copy), its weights and two tensors the size of its largest above
  MEMORY_SHARE of the device's memory."""
  inputs, consts, largest, what = memory_need(loaded.graph)
  need, have = 2 * inputs + consts + 2 * largest, device_memory_bytes()
  if need > MEMORY_SHARE * have:
    gib = 2.0**30
    raise OptimizeError(f"{loaded.label} needs about {need / gib:.1f} GiB to run (inputs "
                        f"{inputs / gib:.1f} GiB, weights {consts / gib:.1f} GiB, largest "
                        f"tensor {what} {largest / gib:.1f} GiB), more than "
                        f"{MEMORY_SHARE:.0%} of the {have / gib:.1f} GiB here; give smaller "
                        "--input_shape dims")
