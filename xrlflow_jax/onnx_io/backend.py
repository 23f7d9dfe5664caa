"""The executor as an ONNX backend (`onnx.backend.base.Backend`), and the conformance table.

`XrlflowBackend.prepare(model)` imports the model with `onnx_io.load` and lowers it with the
executor; `rep.run(inputs)` runs the jitted function. The project's graphs have static shapes,
so inputs that steer shapes rather than carry data (integer tensors such as a Reshape target or
Slice bounds, scalars such as Clip bounds, and Resize's roi and scales) are bound to the values given at run time: the
model is specialised on them (and re-imported when they change), the way a static-shape compiler
treats them.

`node_cases()` lists the ONNX operator conformance cases (`onnx.backend.test`), `scope(case)`
says whether a case is a float32 case of an op the importer converts, `EXCLUDED` which of those
the project does not support and why, and `conformance()` runs the rest and tabulates passed /
failed / excluded per op (also `python -m xrlflow_jax.onnx_io conformance`).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import re
from typing import Any, Iterable, Sequence

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.base import Backend, BackendRep

from xrlflow_jax import executor, ops
from xrlflow_jax.errors import XrlflowError
from xrlflow_jax.onnx_io.convert import CONVERTERS
from xrlflow_jax.onnx_io.importer import load

# Ops of the conformance scope: every op with a converter, plus the ones folded on import.
SCOPE_OPS = frozenset(CONVERTERS) | {"Constant", "Shape", "Size"}


def _binds(value: np.ndarray) -> bool:
  """Inputs specialised into the model: integer/bool tensors and scalars."""
  return value.ndim == 0 or not np.issubdtype(value.dtype, np.floating)


class XrlflowRep(BackendRep):
  """A prepared model; imports (per distinct bound values) and runs through the executor."""

  def __init__(self, model: onnx.ModelProto):
    super().__init__()
    self.model = model
    inits = {t.name for t in model.graph.initializer}
    self.input_names = [vi.name for vi in model.graph.input if vi.name not in inits]
    # Float inputs that steer shapes too: Resize's roi and scales, Upsample's scales.
    self.shape_inputs = {name for node in model.graph.node
                         if node.op_type in ("Resize", "Upsample")
                         for name in list(node.input)[1:] if name}
    self._cache: dict[str, tuple[executor.LoweredGraph, list[str], list[np.dtype]]] = {}

  def _specialised(self, feeds: dict[str, np.ndarray]) -> tuple[executor.LoweredGraph, list[str],
                                                                list[np.dtype]]:
    bound = {k: v for k, v in feeds.items() if _binds(v) or k in self.shape_inputs}
    key = hashlib.sha1(b"".join(k.encode() + str(v.dtype).encode() + str(v.shape).encode()
                                + v.tobytes() for k, v in sorted(bound.items()))).hexdigest()
    if key not in self._cache:
      model = onnx.ModelProto()
      model.CopyFrom(self.model)
      kept = [vi for vi in model.graph.input if vi.name not in bound]
      del model.graph.input[:]
      model.graph.input.extend(kept)
      for name, value in bound.items():
        model.graph.initializer.append(numpy_helper.from_array(value, name))
      if model.ir_version < 4:
        model.ir_version = 4
      graph, params = load(model)
      lowered = executor.lower(graph, params, input_names=params.input_names)
      dtypes = [np.dtype(ops.numpy_dtype(int(d))) for d in executor.output_dtypes(graph)]
      self._cache[key] = (lowered, list(params.input_names), dtypes)
    return self._cache[key]

  def run(self, inputs: Any, **kwargs: Any) -> list[np.ndarray]:
    """Runs on inputs given as a list (graph input order) or a dict by name."""
    del kwargs
    if isinstance(inputs, dict):
      feeds = {k: np.asarray(v) for k, v in inputs.items()}
    else:
      if isinstance(inputs, np.ndarray):
        inputs = [inputs]
      feeds = {n: np.asarray(v) for n, v in zip(self.input_names, inputs)}
    lowered, names, dtypes = self._specialised(feeds)
    outs = lowered(*[feeds[n] for n in names])
    # int64 results (ArgMax, Shape) compute as int32 without x64: returned as the model's dtype.
    return [np.asarray(y).astype(d, copy=False) for y, d in zip(outs, dtypes)]


class XrlflowBackend(Backend):
  """`onnx.backend.base.Backend` running models through `onnx_io.load` and the executor."""

  @classmethod
  def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
    del kwargs
    return cls.supports_device(device)

  @classmethod
  def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> XrlflowRep:
    del kwargs
    if not cls.supports_device(device):
      raise XrlflowError(f"device {device!r} is not supported (CPU, or the default JAX device)")
    return XrlflowRep(model)

  @classmethod
  def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                **kwargs: Any) -> list[np.ndarray]:
    return cls.prepare(model, device, **kwargs).run(inputs)

  @classmethod
  def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
               outputs_info: Sequence[tuple[Any, Any]] | None = None,
               **kwargs: Any) -> list[np.ndarray]:
    """Runs one node: it becomes a one-node model with inputs typed from the given arrays."""
    del outputs_info
    arrays = [np.asarray(x) for x in (inputs.values() if isinstance(inputs, dict) else inputs)]
    names = [n for n in node.input if n]
    value_infos = [onnx.helper.make_tensor_value_info(
        n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
                   for n, a in zip(names, arrays)]
    graph = onnx.helper.make_graph(
        [node], "node", value_infos,
        [onnx.helper.make_empty_tensor_value_info(o) for o in node.output if o])
    opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    return cls.run_model(model, dict(zip(names, arrays)), device, **kwargs)

  @classmethod
  def supports_device(cls, device: str) -> bool:
    return device.upper().startswith("CPU") or device.upper() in ("", "DEFAULT")


# ------------------------------------------------------------------------- conformance table

@functools.lru_cache(maxsize=1)
def node_cases() -> tuple[Any, ...]:
  """The operator conformance cases of the installed onnx package (generated in memory)."""
  import warnings  # pylint: disable=g-import-not-at-top
  from onnx.backend.test.loader import load_model_tests  # pylint: disable=g-import-not-at-top
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    return tuple(load_model_tests(kind="node"))


@functools.lru_cache(maxsize=1)
def _ops_by_name() -> dict[str, str]:
  return {c.name: (c.model.graph.node[-1].op_type if c.model.graph.node else "?")
          for c in node_cases()}


def main_op(case: Any) -> str:
  """The op a case is about: its last node's op; for an expanded function case (the op written
  as its function body) the op of the matching plain case, marked "(expanded)"."""
  if "_expanded" in case.name:
    plain = case.name.replace("_expanded", "", 1)
    op = _ops_by_name().get(plain) or _ops_by_name().get(re.sub(r"_ver\d+$", "", plain), plain)
    return f"{op} (expanded)"
  nodes = case.model.graph.node
  return nodes[-1].op_type if nodes else "?"


def scope(case: Any) -> str | None:
  """None when the case is a float32 case of ops in scope (float32 data in or out; bool and
  integer tensors alongside, such as a comparison's result or ArgMax's indices); otherwise why
  it is out of scope."""
  graph = case.model.graph
  for node in graph.node:
    if node.domain not in ("", "ai.onnx"):
      return f"op {node.domain}::{node.op_type} is not in the default domain"
    if node.op_type not in SCOPE_OPS:
      return f"op {node.op_type} has no converter"
    if any(a.type == onnx.AttributeProto.GRAPH for a in node.attribute):
      return "sub-graphs"
  float_io = False
  for vi in list(graph.input) + list(graph.output):
    if not vi.type.HasField("tensor_type"):
      return "non-tensor inputs or outputs (sequences, optionals)"
    elem = vi.type.tensor_type.elem_type
    if elem == onnx.TensorProto.FLOAT:
      float_io = True
    elif elem not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL):
      return f"not float32 ({onnx.TensorProto.DataType.Name(elem)})"
  return None if float_io else "not a float32 case"


# In-scope cases the project does not support, by name pattern, with the reason. They must fail
# with the project's own errors (tests/test_onnx_conformance.py checks that).
EXCLUDED: dict[str, str] = {
    r"training_mode|^test_training_dropout":
        "training mode (the importer is for inference; random dropout has no static result)",
    r"_empty_set|zero_size|^test_reshape_allowzero_reordered|^test_slice_start_out_of_bounds"
    r"|^test_shape_start_greater_than_end"
    r"|^test_rotary_embedding(_3d_input|_interleaved|_no_position_ids(_interleaved)?)?_expanded$":
        "zero-size tensors (every dim of the project's tensors is >= 1)",
    r"^test_maxpool_with_argmax": "MaxPool's Indices output (not supported)",
    r"^test_pow_types_int(32|64)_float32": "integer Pow (the importer computes Pow on floats)",
    r"^test_nllloss_NCd1d2d3d4d5": "rank-7 tensors (the project's maximum rank is 6)",
}


def exclusion(name: str) -> str | None:
  """Why an in-scope case is excluded (see EXCLUDED), or None."""
  for pattern, reason in EXCLUDED.items():
    if re.search(pattern, name):
      return reason
  return None


@dataclasses.dataclass
class CaseResult:
  """One case: passed, or failed with a message, or excluded (not run) with the reason."""
  name: str
  op: str
  passed: bool
  message: str = ""
  excluded: bool = False


def _array(x: Any) -> np.ndarray:
  return np.asarray(numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x)


def run_case_or_raise(case: Any) -> None:
  """Runs one conformance case through the backend; AssertionError on wrong values."""
  rep = XrlflowBackend.prepare(case.model)
  for inputs, refs in case.data_sets:
    outs = rep.run([_array(x) for x in inputs])
    if len(outs) != len(refs):
      raise AssertionError(f"{len(outs)} outputs, expected {len(refs)}")
    for out, ref in zip(outs, refs):
      np.testing.assert_allclose(out, _array(ref), rtol=case.rtol, atol=case.atol)


def run_case(case: Any) -> CaseResult:
  """Runs one conformance case and compares as BackendTest does (same tolerances)."""
  op = main_op(case)
  try:
    run_case_or_raise(case)
  except XrlflowError as e:
    return CaseResult(case.name, op, False, f"{type(e).__name__}: {str(e).splitlines()[0]}")
  except AssertionError as e:
    return CaseResult(case.name, op, False, "wrong values: " + " ".join(str(e).split())[:200])
  return CaseResult(case.name, op, True)


def conformance(cases: Iterable[Any] | None = None,
                excluded: dict[str, str] | None = None) -> list[CaseResult]:
  """One result per in-scope case: run, or (matching EXCLUDED, or named in `excluded`)
  excluded without running, with the reason as its message."""
  excluded = excluded or {}
  out = []
  for case in cases if cases is not None else node_cases():
    if scope(case) is not None:
      continue
    reason = excluded.get(case.name) or exclusion(case.name)
    if reason:
      out.append(CaseResult(case.name, main_op(case), False, reason, excluded=True))
    else:
      out.append(run_case(case))
  return out


def table(results: Sequence[CaseResult]) -> str:
  """Passed / failed / excluded cases per op, as text (pass/total counts the cases run)."""
  per_op: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
  for r in results:
    per_op[r.op][0 if r.passed else 2 if r.excluded else 1] += 1
  lines = [f"{'op':32s} {'pass/total':>10s} {'failed':>6s} {'excluded':>8s}"]
  rows = sorted(per_op.items()) + [("all", [sum(v[i] for v in per_op.values())
                                           for i in range(3)])]
  for op, (p, f, x) in rows:
    lines.append(f"{op:32s} {f'{p}/{p + f}':>10s} {f:6d} {x:8d}")
  return "\n".join(lines)
