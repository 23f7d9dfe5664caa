"""onnxruntime as a measured runtime: a graph (or an ONNX file) as an onnxruntime session that
`measure.compare` times side by side exactly as it times XLA executables.

    compiled = compile_onnxruntime(graph, params, seed=0)   # CompiledGraph: fn(*args) runs it

The session runs with every graph optimisation onnxruntime has (ORT_ENABLE_ALL), on the CUDA
execution provider where one is installed, else the CPU one: what a user deploying the file
would run. Its inputs are the XLA executable's fixed random inputs, so outputs compare.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np

from xrlflow_jax import executor
from xrlflow_jax.errors import UsageError, XrlflowError
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.measure.latency import CompiledGraph, resolve_device

RUNTIMES = ("xla", "onnxruntime")
_NUMPY_OF = {"tensor(float)": np.float32, "tensor(double)": np.float64,
             "tensor(float16)": np.float16, "tensor(int64)": np.int64,
             "tensor(int32)": np.int32, "tensor(bool)": np.bool_, "tensor(int8)": np.int8,
             "tensor(uint8)": np.uint8}


@functools.cache
def _onnxruntime() -> Any:
  try:
    import onnxruntime  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise UsageError("the onnxruntime target needs onnxruntime: pip install "
                     "'xrlflow_jax[onnxruntime]' (or onnxruntime)") from None
  return onnxruntime


def check_runtime(runtime: str) -> None:
  """UsageError naming an unknown runtime, or onnxruntime when it is not installed."""
  if runtime not in RUNTIMES:
    raise UsageError(f"unknown runtime {runtime!r}; runtimes are {', '.join(RUNTIMES)}")
  if runtime == "onnxruntime":
    _onnxruntime()


def providers() -> list[str]:
  """The execution providers a session uses: CUDA's where onnxruntime has it, then the CPU's."""
  have = _onnxruntime().get_available_providers()
  return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in have]


def compile_onnxruntime(graph: layout.Graph, params: ParamStore, *, seed: int = 0,
                        model: Any = None, what: str = "the graph") -> CompiledGraph:
  """An onnxruntime session of `graph` (exported with `onnx_io.to_model`), or of `model` (an
  ONNX file's path or bytes taking the graph's inputs, e.g. the user's own file), with the
  graph's fixed random inputs (`executor.lower(...).random_inputs(seed)`, cast to the dtypes
  the session's inputs declare). `fn(None, *inputs)` runs it; args[0] is a placeholder for the
  XLA executables' constants, so `compare` swaps inputs in the same way for both."""
  ort = _onnxruntime()
  from xrlflow_jax import onnx_io  # pylint: disable=g-import-not-at-top  (same layer)
  t0 = time.perf_counter()
  if model is None:
    model = onnx_io.to_model(graph, params).SerializeToString()
  options = ort.SessionOptions()
  options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
  options.log_severity_level = 3
  try:
    session = ort.InferenceSession(model, sess_options=options, providers=providers())
  except Exception as e:  # pylint: disable=broad-except  (onnxruntime's own error types)
    raise XrlflowError(f"onnxruntime cannot run {what}: {str(e).splitlines()[0][:300]}") from None
  specs = session.get_inputs()
  inputs = executor.lower(graph, params).random_inputs(seed)
  if len(specs) != len(inputs):
    raise XrlflowError(f"{what} takes {len(specs)} inputs in onnxruntime, the graph "
                       f"{len(inputs)}")
  inputs = [np.asarray(x, _NUMPY_OF.get(s.type, np.asarray(x).dtype))
            for x, s in zip(inputs, specs)]
  names = [s.name for s in specs]

  def run(_: Any, *xs: np.ndarray) -> list[np.ndarray]:
    return session.run(None, dict(zip(names, xs)))

  nbytes = int(sum(x.nbytes for x in inputs))
  return CompiledGraph(run, (None, *inputs), time.perf_counter() - t0,
                       resolve_device("cpu"), nbytes, backend="onnxruntime",
                       device_kind=session.get_providers()[0])
