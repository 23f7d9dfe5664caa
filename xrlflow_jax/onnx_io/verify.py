"""Side-by-side check of an imported model against onnxruntime (same weights, same inputs).

`compare_with_onnxruntime` imports a model with the project's importer, runs it through the
executor, runs the same model (with the same seeded random weights written into it) through
onnxruntime, and reports the largest errors and, optionally, both latencies. onnxruntime is a
test dependency, imported only here.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from xrlflow_jax import executor
from xrlflow_jax.errors import UsageError
from xrlflow_jax.onnx_io import weights
from xrlflow_jax.onnx_io.importer import _Importer, read_model


@dataclasses.dataclass
class Comparison:
  """The outcome of one comparison.

  max_abs: largest |ours - onnxruntime| over every output element.
  max_rel: largest (max |ours - onnxruntime|) / (max |onnxruntime|) over the outputs.
  ours_ms / ort_ms: median latency of one run (0 when not timed).
  """
  label: str
  onnx_nodes: int
  graph_nodes: int
  import_seconds: float
  max_abs: float
  max_rel: float
  outputs: list[str]
  ours_ms: float = 0.0
  ort_ms: float = 0.0

  @property
  def latency_ratio(self) -> float:
    return self.ours_ms / self.ort_ms if self.ort_ms else float("nan")


def expose_softmax_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
  """A copy whose graph also outputs the input of every Softmax that produces a graph output.

  Classifier outputs are probabilities; with random weights they are often near one-hot, which
  hides errors, so comparisons also look at the logits.
  """
  out = copy.deepcopy(model)
  producer = {o: n for n in out.graph.node for o in n.output}
  names = {o.name for o in out.graph.output}
  for vi in list(out.graph.output):
    node = producer.get(vi.name)
    if node is not None and node.op_type == "Softmax" and node.input[0] not in names:
      elem = vi.type.tensor_type.elem_type or onnx.TensorProto.FLOAT
      out.graph.output.append(onnx.helper.make_tensor_value_info(node.input[0], elem, None))
      names.add(node.input[0])
  return out


def onnxruntime_model(model: onnx.ModelProto, seed: int, base_dir: str | None) -> onnx.ModelProto:
  """A self-contained copy for onnxruntime: present external data embedded, absent data random
  (the values `load(..., random_weights=True, seed=seed)` uses)."""
  out = weights.fill_missing_weights(model, seed, base_dir)
  for t in out.graph.initializer:
    if weights.is_external(t):
      value = weights.read_external(t, base_dir)
      t.CopyFrom(numpy_helper.from_array(value, t.name))
  return out


def _median_ms(fn: Any, runs: int) -> float:
  fn()  # warm-up
  times = []
  for _ in range(runs):
    start = time.perf_counter()
    fn()
    times.append((time.perf_counter() - start) * 1e3)
  return statistics.median(times)


def compare_with_onnxruntime(source: Any, *, seed: int = 0,
                             input_shapes: Mapping[str, Sequence[int]] | None = None,
                             randomize_constant_of_shape: bool = False, logits: bool = True,
                             timing_runs: int = 0, threads: int = 0) -> Comparison:
  """Imports `source`, runs executor and onnxruntime on the same random inputs, compares.

  Args:
    source: path, bytes or ModelProto (read without loading external data).
    seed: seed of random weights (for absent external data) and of the inputs.
    input_shapes: as for `load`.
    randomize_constant_of_shape: first replace ConstantOfShape weights by random initializers
      (the light models of the onnx package).
    logits: also compare the inputs of output Softmaxes (see `expose_softmax_inputs`).
    timing_runs: when > 0, time that many runs of each side (median, after a warm-up).
    threads: onnxruntime intra-op threads (0: its default).
  Returns:
    A `Comparison`.
  """
  try:
    import onnxruntime as ort  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise UsageError("comparing with onnxruntime needs the onnxruntime package "
                     "(pip install onnxruntime, or the test extra)") from None

  model, label, base_dir = read_model(source)
  onnx_nodes = len(model.graph.node)
  if randomize_constant_of_shape:
    model = weights.randomize_constant_weights(model, seed)
  if logits:
    model = expose_softmax_inputs(model)
  start = time.perf_counter()
  graph, params = _Importer(model, label, base_dir, input_shapes, True, seed).run(None)
  import_seconds = time.perf_counter() - start
  lowered = executor.lower(graph, params, input_names=params.input_names)
  inputs = lowered.random_inputs(seed)
  ours = [np.asarray(y) for y in lowered(*inputs)]

  options = ort.SessionOptions()
  options.log_severity_level = 3
  if threads:
    options.intra_op_num_threads = threads
  ort_model = onnxruntime_model(model, seed, base_dir)
  session = ort.InferenceSession(ort_model.SerializeToString(), options,
                                 providers=["CPUExecutionProvider"])
  feeds = {n: np.asarray(x) for n, x in zip(params.input_names, inputs)}
  theirs = session.run(params.output_names, feeds)
  max_abs, max_rel = 0.0, 0.0
  for a, b in zip(ours, theirs):
    if a.shape != b.shape:
      raise AssertionError(f"{label}: output shapes differ: {a.shape} vs {b.shape}")
    if a.dtype == np.bool_ or np.issubdtype(a.dtype, np.integer):
      err = float(np.sum(a != b))
      scale = 1.0
    else:
      err = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0.0))
      scale = float(np.max(np.abs(b.astype(np.float64)), initial=0.0))
    if np.isnan(err):
      err = float("inf")
    max_abs = max(max_abs, err)
    max_rel = max(max_rel, err / scale if scale > 0 else err)
  result = Comparison(label, onnx_nodes, params.stats.graph_nodes, import_seconds, max_abs,
                      max_rel, list(params.output_names))
  if timing_runs > 0:
    args = lowered.check_inputs(inputs)

    def run_ours() -> None:
      for y in lowered.compiled(lowered.consts, *args):
        y.block_until_ready()

    result.ours_ms = _median_ms(run_ours, timing_runs)
    result.ort_ms = _median_ms(lambda: session.run(params.output_names, feeds), timing_runs)
  return result

