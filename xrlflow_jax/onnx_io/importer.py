"""ONNX -> padded graph: `load(path_or_model, ...) -> (graph, params)`.

Steps: read the model (clear errors for corrupt files and bad opsets), bind weights (initializers,
external data, or seeded random values), fix the input shapes, keep only the nodes the outputs
need and order them topologically (any file order), then walk them once: a node whose inputs
are all known on import is folded on the host (shape sub-graphs, weight pre-processing), every
other node is converted into the project's ops through `GraphBuilder`. Unsupported ops are
collected and reported together.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import os
import time
import warnings
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import onnx

from xrlflow_jax import executor, ops
from xrlflow_jax.errors import (CapacityError, MissingWeightsError, OnnxImportError, ShapeError,
                                UnsupportedOnnxOpError)
from xrlflow_jax.graph import layout, transforms
from xrlflow_jax.graph.builder import GraphBuilder, Tensor
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.onnx_io import fold, restore, weights
from xrlflow_jax.onnx_io.common import (MAX_OPSET, MIN_OPSET, attributes, default_opset,
                                        onnx_to_numpy_dtype, project_dtype, tensor_to_numpy,
                                        unique_name)
from xrlflow_jax.onnx_io.convert import BUILDER_ERRORS, CONVERTERS, Const, Ctx
from xrlflow_jax.ops import MAX_RANK
from xrlflow_jax.ops.spec import INT32_MAX, checked_dims

_POISON = object()  # the value of a tensor downstream of an unsupported op


@dataclasses.dataclass
class ImportStats:
  """Figures of one import."""
  onnx_nodes: int = 0  # nodes in the file
  used_nodes: int = 0  # nodes the outputs depend on
  folded_nodes: int = 0  # of those, evaluated on import
  graph_nodes: int = 0  # alive nodes of the resulting graph (Input and Constant included)
  seconds: float = 0.0
  random_weights: int = 0  # initializers given random values
  # Remarks callers print as "note: ..." (e.g. a dynamic batch dim set to 1).
  notes: list[str] = dataclasses.field(default_factory=list)


class ImportedParams(ParamStore):
  """The parameter store of an imported model, with the names export restores.

  Attributes:
    input_names: ONNX names of the graph inputs, by input_index.
    output_names: ONNX names of the graph outputs, by output_index.
    node_names: a name per node slot (the ONNX tensor a node produces, where there is one).
    source: the file (or "<model>") the graph came from.
    opset: the model's default-domain opset.
    stats: `ImportStats`.
  """

  def __init__(self, arrays: Mapping[int, np.ndarray] | None = None,
               names: Mapping[int, str] | None = None):
    super().__init__(arrays, names)
    self.input_names: list[str] = []
    self.output_names: list[str] = []
    self.node_names: list[str] = []
    self.source = ""
    self.opset = 0
    self.stats = ImportStats()


def read_model(source: Any) -> tuple[onnx.ModelProto, str, str | None]:
  """(model, label for messages, directory external data is relative to).

  `source` is a path, the serialized bytes of a model, or a ModelProto.
  """
  if isinstance(source, onnx.ModelProto):
    return source, f"<model {source.graph.name or 'unnamed'}>", None
  if isinstance(source, (bytes, bytearray)):
    data, label, base = bytes(source), "<bytes>", None
  elif isinstance(source, (str, os.PathLike)):
    label = os.fspath(source)
    if not os.path.isfile(label):
      raise OnnxImportError(f"{label}: no such file")
    try:
      with open(label, "rb") as f:
        data = f.read()
    except OSError as e:
      raise OnnxImportError(f"{label}: cannot read: {e}") from None
    base = os.path.dirname(os.path.abspath(label))
  else:
    raise OnnxImportError(f"cannot load an ONNX model from a {type(source).__name__}")
  if not data:
    raise OnnxImportError(f"{label}: the file is empty")
  try:
    model = onnx.ModelProto()
    model.ParseFromString(data)
  except Exception as e:  # protobuf raises DecodeError (and RuntimeError from the C++ parser)
    raise OnnxImportError(f"{label}: not a valid ONNX model (truncated or corrupt file): "
                          f"{type(e).__name__}: {e}") from None
  if not model.HasField("graph"):
    raise OnnxImportError(f"{label}: not a valid ONNX model (it has no graph; truncated or "
                          "corrupt file?)")
  return model, label, base


def _given_shape(given: Any, where: str) -> tuple[int, ...]:
  """An `input_shapes` entry checked by `ops.spec.checked_dims`; OnnxImportError naming the
  input otherwise."""
  try:
    return checked_dims(given)
  except ShapeError as e:
    raise OnnxImportError(f"{where}input_shapes: {e}") from None


class ShapeOverrideWarning(UserWarning):
  """`input_shapes` replaced a dim the file fixes (allowed, but the model may not support it)."""


def _file_dims(tt: onnx.TypeProto.Tensor) -> list[int | str | None]:
  """Per dim of a tensor type: its size (a positive int); or, for a dynamic dim, its symbol
  (`dim_param`), "-1" for a negative `dim_value` (PaddlePaddle and some older exporters write
  -1), or None for a dim that gives nothing. A `dim_value` of 0 stays 0 (a zero-size dim)."""
  out: list[int | str | None] = []
  for d in tt.shape.dim:
    if d.HasField("dim_value"):
      out.append(int(d.dim_value) if d.dim_value >= 0 else str(int(d.dim_value)))
    elif d.HasField("dim_param") and d.dim_param:
      out.append(d.dim_param)
    else:
      out.append(None)
  return out


def _shape_flag(name: str, dims: Sequence[Any]) -> str:
  """The command-line flag and library argument that fix an input's shape, with the dims known
  so far filled in, e.g. "--input_shape=x=1,3,d2,d3 (library: input_shapes={'x': (...)})"."""
  shown = [str(d) if isinstance(d, int) and d >= 1 else f"d{i}" for i, d in enumerate(dims)]
  return (f"--input_shape={name}={','.join(shown)} (library: input_shapes={{'{name}': "
          f"({', '.join(shown)}{',' if len(shown) == 1 else ''})}})")


def _dynamic(d: str | None) -> str:
  """How the file writes a dynamic dim, for messages."""
  return "-1 in the file" if d == "-1" else f"{d!r} in the file" if d else "no size in the file"


def _input_shape(vi: onnx.ValueInfoProto, given: Sequence[int] | None, label: str,
                 notes: list[str]) -> tuple[tuple[int, ...], np.dtype]:
  """The static shape and dtype of one graph input.

  A dim is dynamic when the file writes a `dim_param`, a negative `dim_value`, or nothing.
  `given` (the input's `input_shapes` entry: the whole shape) fixes every dim; where it differs
  from a dim the file fixes, a `ShapeOverrideWarning` says so. Without `given`, a dynamic
  leading (batch) dim of an input of rank >= 2 is set to 1 and a line is appended to `notes`;
  any other dynamic dim is an error naming the input, the dim and the flag to use.
  """
  where = f"{label}: graph input '{vi.name}': "
  if not vi.type.HasField("tensor_type"):
    raise OnnxImportError(f"{where}only tensor inputs are supported")
  tt = vi.type.tensor_type
  dtype = onnx_to_numpy_dtype(tt.elem_type, where)
  if not tt.HasField("shape"):
    if given is None:
      raise OnnxImportError(f"{where}the file gives no shape (not even a rank); pass "
                            f"input_shapes={{'{vi.name}': (...)}} (on the command line: "
                            f"--input_shape={vi.name}=d0,d1,...)")
    file_dims: list[int | str | None] = [None] * len(given)
  else:
    file_dims = _file_dims(tt)
  if given is not None:
    given = _given_shape(given, where)
    if len(given) != len(file_dims):
      raise OnnxImportError(f"{where}input_shapes gives rank {len(given)} ({list(given)}) but "
                            f"the input has rank {len(file_dims)} (file dims "
                            f"{['?' if d is None else d for d in file_dims]})")
    changed = [(i, d, g) for i, (d, g) in enumerate(zip(file_dims, given))
               if isinstance(d, int) and d != g]
    if changed:
      shown = ", ".join(f"dim {i} from {d} to {g}" for i, d, g in changed)
      warnings.warn(f"{where}input_shapes {list(given)} changes dims the file fixes ({shown}); "
                    "the model may not be valid at that size (its output shapes are recomputed "
                    "and not checked against the file)", ShapeOverrideWarning, stacklevel=5)
    dims = list(given)
  else:
    dims = list(file_dims)
    if len(dims) >= 2 and not isinstance(dims[0], int):
      notes.append(f"graph input '{vi.name}': dim 0 is dynamic ({_dynamic(dims[0])}); batch "
                   f"size 1 is assumed (give another with "
                   f"{_shape_flag(vi.name, [None] + dims[1:])})")
      dims[0] = 1
  for i, d in enumerate(dims):
    if not isinstance(d, int):
      raise OnnxImportError(f"{where}dim {i} is dynamic ({_dynamic(d)}); give its size with "
                            f"{_shape_flag(vi.name, dims)}")
    if d < 1:
      raise OnnxImportError(f"{where}dim {i} is {d} in the file (zero-size tensors are not "
                            f"supported); give another size with {_shape_flag(vi.name, dims)}")
  if math.prod(dims) > INT32_MAX:
    raise OnnxImportError(f"{where}shape {list(dims)} has {math.prod(dims)} elements, more than "
                          f"{INT32_MAX} (the graph's int32 sizes)")
  if len(dims) > MAX_RANK:
    raise OnnxImportError(f"{where}rank {len(dims)} exceeds the project's maximum rank "
                          f"{MAX_RANK}")
  return tuple(int(d) for d in dims), dtype


def outer_names(node: onnx.NodeProto) -> list[str]:
  """The tensors of the enclosing scopes that the subgraphs of `node` (If's branches, Loop's
  and Scan's bodies) read: names used by their nodes and outputs that they do not define."""
  names: list[str] = []
  for attr in node.attribute:
    graphs = list(attr.graphs) + ([attr.g] if attr.HasField("g") else [])
    for g in graphs:
      defined = ({t.name for t in g.initializer} | {vi.name for vi in g.input}
                 | {o for n in g.node for o in n.output})
      for n in g.node:
        for name in list(n.input) + outer_names(n):
          if name and name not in defined and name not in names:
            names.append(name)
      for vi in g.output:
        if vi.name not in defined and vi.name not in names:
          names.append(vi.name)
  return names


def _reads(node: onnx.NodeProto) -> list[str]:
  """Every tensor `node` reads: its inputs, then what its subgraphs read from outside."""
  return list(node.input) + [n for n in outer_names(node) if n not in node.input]


def _plan(graph: onnx.GraphProto, available: set[str], label: str) -> tuple[
    list[int], dict[str, int]]:
  """Indices of the nodes the graph outputs need, in a topological order (file order on ties),
  and how many needed nodes read each tensor."""
  nodes = list(graph.node)
  producer: dict[str, int] = {}
  for i, node in enumerate(nodes):
    for out in node.output:
      if not out:
        continue
      if out in producer or out in available:
        raise OnnxImportError(f"{label}: node {i} '{node.name}' ({node.op_type}) defines tensor "
                              f"'{out}', which is already defined")
      producer[out] = i
  needed = [False] * len(nodes)
  stack = []
  for vi in graph.output:
    if vi.name in producer:
      stack.append(producer[vi.name])
    elif vi.name not in available:
      raise OnnxImportError(f"{label}: graph output '{vi.name}' is not produced by any node, "
                            "input or initializer")
  while stack:
    i = stack.pop()
    if needed[i]:
      continue
    needed[i] = True
    for name in _reads(nodes[i]):
      if not name:
        continue
      if name in producer:
        stack.append(producer[name])
      elif name not in available:
        raise OnnxImportError(f"{label}: node {i} '{nodes[i].name}' ({nodes[i].op_type}) reads "
                              f"'{name}', which no node, graph input or initializer defines")
  uses: dict[str, int] = {}
  indegree = [0] * len(nodes)
  consumers: dict[int, list[int]] = {}
  for i in (i for i, n in enumerate(needed) if n):
    for name in _reads(nodes[i]):
      if name:
        uses[name] = uses.get(name, 0) + 1
      if name in producer:
        indegree[i] += 1
        consumers.setdefault(producer[name], []).append(i)
  heap = [i for i, n in enumerate(needed) if n and indegree[i] == 0]
  heapq.heapify(heap)
  order = []
  while heap:
    i = heapq.heappop(heap)
    order.append(i)
    for j in consumers.get(i, []):
      indegree[j] -= 1
      if indegree[j] == 0:
        heapq.heappush(heap, j)
  if len(order) != sum(needed):
    stuck = [i for i, n in enumerate(needed) if n and indegree[i] > 0]
    shown = ", ".join(f"node {i} '{nodes[i].name}' ({nodes[i].op_type})" for i in stuck[:8])
    raise OnnxImportError(f"{label}: the graph has a cycle through {len(stuck)} node(s): {shown}"
                          + (" ..." if len(stuck) > 8 else ""))
  for vi in graph.output:
    uses[vi.name] = uses.get(vi.name, 0) + 1
  return order, uses


UPGRADE_OPSET = MIN_OPSET  # opsets below MIN_OPSET are converted to this one on import


def _upgrade_opset(model: onnx.ModelProto, label: str, notes: list[str]) -> onnx.ModelProto:
  """A model of default-domain opset 1..MIN_OPSET-1 converted to UPGRADE_OPSET by
  `onnx.version_converter` (a note says so); any other model unchanged. OnnxImportError when
  the converter fails (the message is the converter's)."""
  versions = [int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")]
  if not versions or not 1 <= max(versions) < MIN_OPSET:
    return model
  old = max(versions)
  from onnx import version_converter  # pylint: disable=g-import-not-at-top
  try:
    converted = version_converter.convert_version(model, UPGRADE_OPSET)
  except Exception as e:  # the converter raises RuntimeError/ValueError/C++ errors
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise OnnxImportError(f"{label}: opset {old} is older than the supported {MIN_OPSET} to "
                          f"{MAX_OPSET}, and onnx.version_converter cannot convert it to opset "
                          f"{UPGRADE_OPSET}: {first[:300]}") from None
  notes.append(f"the model is opset {old}; onnx.version_converter converted it to opset "
               f"{UPGRADE_OPSET} for import")
  return converted


def check_text_fields(model: onnx.ModelProto, label: str) -> None:
  """Every name of the main graph must be text (a corrupt file can hold invalid UTF-8)."""
  g = model.graph
  fields: list[Any] = [g.name]
  for node in g.node:
    fields += [node.name, node.op_type, node.domain, *node.input, *node.output]
    fields += [a.name for a in node.attribute]
  for t in g.initializer:
    fields += [t.name] + [e.key for e in t.external_data] + [e.value for e in t.external_data]
  fields += [vi.name for vi in list(g.input) + list(g.output)]
  fields += [o.domain for o in model.opset_import]
  for f in fields:
    if not isinstance(f, str):
      raise OnnxImportError(f"{label}: the model holds names that are not valid UTF-8 text "
                            f"({f[:40]!r}); the file is corrupt")


class _Importer:
  """One import: the builder, the value of every ONNX tensor name, and collected problems."""

  def __init__(self, model: onnx.ModelProto, label: str, base_dir: str | None,
               input_shapes: Mapping[str, Sequence[int]] | None, random_weights: bool,
               seed: int):
    self.model = model
    self.graph = model.graph
    self.label = label
    self.base_dir = base_dir
    self.input_shapes = dict(input_shapes or {})
    self.random_weights = random_weights
    self.seed = seed
    check_text_fields(model, label)
    self.stats = ImportStats(onnx_nodes=len(model.graph.node))
    self.source_opset = default_opset(model, f"{label}: ", min_opset=1)
    model = _upgrade_opset(model, label, self.stats.notes)
    self.model = model
    self.graph = model.graph
    self.opset = default_opset(model, f"{label}: ")
    self.b = GraphBuilder(name=label)  # K = DEFAULT_MAX_INPUTS fits every op (BatchNorm: 5)
    self.params = ImportedParams()
    self.b.params = self.params
    self.values: dict[str, Any] = {}
    self.names: dict[int, str] = {}
    self.unsupported: list[tuple[str, str]] = []
    self.const_names: set[str] = set()
    self.inlined_if = False
    self.restored = False

  # ---------------------------------------------------------------- weights and inputs
  def bind_initializers(self) -> None:
    missing, seen = [], set()
    inits = list(self.graph.initializer)
    for t in inits:
      where = f"{self.label}: initializer '{t.name}': "
      if not t.name:
        raise OnnxImportError(f"{self.label}: an initializer has no name")
      if t.name in seen:
        raise OnnxImportError(f"{self.label}: initializer '{t.name}' is defined twice")
      seen.add(t.name)
      if weights.is_external(t):
        value = weights.read_external(t, self.base_dir, where)
        if value is None:
          missing.append(t)
          continue
      else:
        value = tensor_to_numpy(t, self.base_dir, where)
      self.values[t.name] = Const(value, t.name)
    for st in self.graph.sparse_initializer:
      raise OnnxImportError(f"{self.label}: sparse initializer '{st.values.name}' is not "
                            "supported")
    if missing and not self.random_weights:
      files = sorted({weights.external_path(t, self.base_dir) for t in missing})
      raise MissingWeightsError(
          f"{self.label}: {len(missing)} initializer(s) (e.g. '{missing[0].name}') keep their "
          f"data in {', '.join(files)}, which is missing; put the file beside the model or ask "
          "for seeded random weights (random_weights=True)", tuple(files), len(missing))
    if missing:
      role_of = weights.roles(self.model)
      for t in missing:
        dtype = onnx_to_numpy_dtype(t.data_type, f"{self.label}: initializer '{t.name}': ")
        dims = [int(d) for d in t.dims]
        if any(d < 0 for d in dims):
          raise OnnxImportError(f"{self.label}: initializer '{t.name}' has dims {dims}")
        fold.check_size(dims, f"{self.label}: initializer '{t.name}': ")
        value = weights.random_value(t.name, dtype, dims, role_of.get(t.name), self.seed)
        self.values[t.name] = Const(value, t.name)
      self.stats.random_weights = len(missing)

  def bind_inputs(self) -> None:
    names = [vi.name for vi in self.graph.input]
    unknown = sorted(set(self.input_shapes) - set(names))
    if unknown:
      raise OnnxImportError(f"{self.label}: input_shapes names {unknown}, which are not graph "
                            f"inputs (inputs: {names})")
    seen = set()
    for vi in self.graph.input:
      if vi.name in self.values:  # an input with an initializer is a constant (IR < 4 style)
        continue
      if not vi.name or vi.name in seen:
        raise OnnxImportError(f"{self.label}: graph input name {vi.name!r} is empty or repeated")
      seen.add(vi.name)
      shape, dtype = _input_shape(vi, self.input_shapes.get(vi.name), self.label,
                                   self.stats.notes)
      try:
        t = self.b.input(shape, dtype=project_dtype(dtype, f"{self.label}: input '{vi.name}': "),
                         name=vi.name)
      except BUILDER_ERRORS as e:
        raise OnnxImportError(f"{self.label}: graph input '{vi.name}': {e}") from None
      self.values[vi.name] = t
      self.names[t.index] = vi.name
      self.params.input_names.append(vi.name)

  def materialize(self, c: Const) -> Tensor:
    if c.tensor is None:
      where = f"{self.label}: constant '{c.name}': "
      project_dtype(c.value.dtype, where)  # refuses dtypes the graph has no code for
      as_float64 = c.value.dtype == np.float64 and self._float64_constant(c, where)
      if c.value.ndim > MAX_RANK or 0 in c.value.shape:
        raise OnnxImportError(f"{where}shape {list(c.value.shape)} is not supported (rank <= "
                              f"{MAX_RANK}, no zero-size dims)")
      why = executor.integer_overflow(c.value)
      if why:
        raise OnnxImportError(f"{where}{why} to import this model")
      c.name = unique_name(c.name, self.const_names)
      try:
        c.tensor = self.b.constant(c.value, name=c.name)
        self.names[c.tensor.index] = c.name
        if as_float64:
          c.tensor = self.b.cast(c.tensor, "float64", name=f"{c.name}/float64")
          self.names[c.tensor.index] = f"{c.name}/float64"
      except BUILDER_ERRORS as e:
        raise OnnxImportError(f"{where}{e}") from None
    return c.tensor

  def _float64_constant(self, c: Const, where: str) -> bool:
    """Checks a float64 constant before the graph stores it as float32 (then cast back to
    float64, so the graph's dtypes stay the file's). Values float32 holds exactly pass; others
    pass with a note when JAX computes float64 as float32 anyway (x64 off); refused otherwise."""
    value = c.value
    largest = executor.float_overflow(value)
    if largest:
      raise OnnxImportError(f"{where}float64 values beyond float32's range (largest magnitude "
                            f"{largest:.3g}); the graph stores constants as float32")
    if np.array_equal(value.astype(np.float32).astype(np.float64), value, equal_nan=True):
      return True
    if jax.config.jax_enable_x64:
      raise OnnxImportError(f"{where}float64 values that float32 cannot hold exactly; the "
                            "graph stores constants as float32 and x64 is on, so the model "
                            "would silently compute with rounded constants")
    self.stats.notes.append(f"constant '{c.name}': float64, rounded to float32 (without x64, "
                            "JAX computes float64 as float32)")
    return True

  # ---------------------------------------------------------------- nodes
  def run_node(self, idx: int, node: onnx.NodeProto, uses: Mapping[str, int]) -> None:
    label = node.name or (node.output[0] if len(node.output) else "")
    op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
    where = f"{self.label}: node {idx} '{label}' ({op}): "
    inputs = [self.values[n] if n else None for n in node.input]
    outputs = list(node.output)
    needed = [bool(o) and uses.get(o, 0) > 0 for o in outputs]
    if any(v is _POISON for v in inputs):
      if op not in CONVERTERS and op not in ("Shape", "Size"):
        self.unsupported.append((op, f"{where}no converter for {op} in the importer"))
      self._set_outputs(outputs, [_POISON] * len(outputs))
      return
    if op == "If":
      self._inline_if(node, inputs, where)
      return
    attrs = attributes(node, where)
    consts = all(v is None or isinstance(v, Const) for v in inputs)
    if op in ("Shape", "Size") and inputs and isinstance(inputs[0], Tensor):
      shape = tuple(inputs[0].shape)
      value = (fold.shape_of(shape, attrs) if op == "Shape"
               else np.asarray(int(np.prod(shape)), np.int64))
      self._fold_done(outputs, [value])
      return
    if consts and op not in fold.NOT_FOLDABLE and node.domain in ("", "ai.onnx"):
      if op == "Constant":
        values = [self._constant(node, attrs, where)]
      else:
        arrays = [None if v is None else v.value for v in inputs]
        values = fold.evaluate(node, arrays, attrs, self.opset, where)
      if len(values) < sum(1 for o in outputs if o):
        raise OnnxImportError(f"{where}evaluation gave {len(values)} outputs for "
                              f"{len(outputs)} names")
      self._fold_done(outputs, values)
      return
    if op not in CONVERTERS:
      self.unsupported.append((op, f"{where}no converter for {op} in the importer"
                                   + (" (its inputs are constant, but it cannot be folded)"
                                      if consts else "")))
      self._set_outputs(outputs, [_POISON] * len(outputs))
      return
    if node.doc_string:  # a node this project's exporter spelled in several
      restored = restore.restore(self.b, node, inputs, uses)
      if restored is not None:
        self.restored = True
        self._set_outputs(outputs, [restored])
        return
    ctx = Ctx(self.b, node, attrs, inputs, needed, self.opset, where, self.materialize,
              source_opset=self.source_opset)
    try:
      outs = CONVERTERS[op](ctx)
    except UnsupportedOnnxOpError as e:
      self.unsupported.append((op, str(e)))
      self._set_outputs(outputs, [_POISON] * len(outputs))
      return
    except BUILDER_ERRORS as e:
      shown = ", ".join(f"'{n}' {self._describe(v)}" for n, v in zip(node.input, inputs) if n)
      raise OnnxImportError(f"{where}inputs {shown}: {e}") from None
    if len(outs) < len(outputs):
      outs = list(outs) + [None] * (len(outputs) - len(outs))
    for name, value, need in zip(outputs, outs, needed):
      if need and value is None:
        raise OnnxImportError(f"{where}output '{name}' is not produced")
    if node.doc_string and outs:
      remade = restore.restore_impl(self.b, node, outs[0])
      if remade is not None:
        self.restored = True
        outs = [remade] + list(outs[1:])
    self._set_outputs(outputs, outs)

  def _inline_if(self, node: onnx.NodeProto, inputs: list[Any], where: str) -> None:
    """An If whose condition is known at import (a constant, or folded from shapes, as
    exporters write shape checks): the chosen branch's nodes are imported in its place. A
    condition computed at run time is refused (the graph has no control flow)."""
    cond = inputs[0] if inputs else None
    if not isinstance(cond, Const):
      self.unsupported.append(("If", f"{where}the condition is computed at run time (only an "
                                     "If whose condition is known at import is supported)"))
      self._set_outputs(list(node.output), [_POISON] * len(node.output))
      return
    if cond.value.size != 1:
      raise OnnxImportError(f"{where}the condition must hold one value, has shape "
                            f"{list(cond.value.shape)}")
    name = "then_branch" if bool(cond.value.reshape(-1)[0]) else "else_branch"
    branch = next((a.g for a in node.attribute if a.name == name), None)
    if branch is None:
      raise OnnxImportError(f"{where}the {name} attribute is missing")
    if len(branch.output) != len(node.output):
      raise OnnxImportError(f"{where}{name} has {len(branch.output)} outputs for "
                            f"{len(node.output)}")
    inner = f"{where}{name}: "
    for t in branch.initializer:
      if t.name in self.values:
        raise OnnxImportError(f"{inner}initializer '{t.name}' shadows a tensor of the "
                              "enclosing graph")
      self.values[t.name] = Const(tensor_to_numpy(t, self.base_dir, inner), t.name)
    for n in branch.node:
      for out in n.output:
        if out and out in self.values:
          raise OnnxImportError(f"{inner}tensor '{out}' shadows a tensor of the enclosing "
                                "graph")
    self.inlined_if = True
    order, uses = _plan(branch, set(self.values), inner.rstrip(": "))
    nodes = list(branch.node)
    for i in order:
      self.run_node(i, nodes[i], uses)
    self._set_outputs(list(node.output), [self.values[vi.name] for vi in branch.output])

  def _describe(self, v: Any) -> str:
    if isinstance(v, Const):
      return f"{v.value.dtype.name}{list(v.value.shape)} (constant)"
    if isinstance(v, Tensor):
      return f"{ops.DType(int(v.dtype)).name.lower()}{list(v.shape)}"
    return "?"

  def _constant(self, node: onnx.NodeProto, attrs: dict[str, Any], where: str) -> np.ndarray:
    if len(attrs) != 1:
      raise OnnxImportError(f"{where}a Constant needs exactly one value attribute, has "
                            f"{sorted(attrs)}")
    (name, value), = attrs.items()
    if name == "value":
      return np.asarray(value)
    if name == "value_float":
      return np.asarray(value, np.float32)
    if name == "value_floats":
      return np.asarray(value, np.float32).reshape(-1)
    if name == "value_int":
      return np.asarray(value, np.int64)
    if name == "value_ints":
      return np.asarray(value, np.int64).reshape(-1)
    raise UnsupportedOnnxOpError(f"{where}Constant attribute {name} is not supported",
                                 ("Constant",))

  def _fold_done(self, outputs: list[str], values: list[np.ndarray]) -> None:
    self.stats.folded_nodes += 1
    self._set_outputs(outputs, [Const(np.asarray(v), name) for v, name in zip(values, outputs)])

  def _set_outputs(self, outputs: list[str], values: Sequence[Any]) -> None:
    for name, value in zip(outputs, values):
      if not name:
        continue
      self.values[name] = value
      if isinstance(value, Tensor) and value.index not in self.names:
        self.names[value.index] = name

  # ---------------------------------------------------------------- driver
  def run(self, capacity: int | None) -> tuple[layout.Graph, ImportedParams]:
    start = time.perf_counter()
    self.bind_initializers()
    self.bind_inputs()
    available = set(self.values)
    order, uses = _plan(self.graph, available, self.label)
    self.stats.used_nodes = len(order)
    nodes = list(self.graph.node)
    for i in order:
      self.run_node(i, nodes[i], uses)
    if self.unsupported:
      kinds = sorted({op for op, _ in self.unsupported})
      details = "\n  ".join(msg for _, msg in self.unsupported[:40])
      more = (f"\n  ... and {len(self.unsupported) - 40} more"
              if len(self.unsupported) > 40 else "")
      raise UnsupportedOnnxOpError(
          f"{self.label}: {len(self.unsupported)} node(s) use unsupported ops "
          f"({', '.join(kinds)}):\n  {details}{more}", tuple(kinds))
    self.mark_outputs()
    needed = len(self.b)
    cap = capacity
    if cap is None:
      cap = layout.DEFAULT_CAPACITY
      while cap < needed:
        cap *= 2
    try:
      graph, _ = self.b.build(capacity=cap)
    except CapacityError as e:
      raise CapacityError(f"{self.label}: {e}") from None
    except BUILDER_ERRORS as e:
      raise OnnxImportError(f"{self.label}: {e}") from None
    graph = self.canonical_param_ids(graph)
    if self.inlined_if or self.restored:  # what only a branch not taken, or a node restored
      graph = layout.to_host(transforms.remove_dead_code(graph))  # from several, read is dead
    node_names = self.b.node_names
    self.params.node_names = [self.names.get(i, n) for i, n in enumerate(node_names)]
    self.params.source = self.label
    self.params.opset = self.opset
    self.stats.graph_nodes = needed
    self.stats.seconds = time.perf_counter() - start
    self.params.stats = self.stats
    return graph, self.params

  def canonical_param_ids(self, graph: layout.Graph) -> layout.Graph:
    """Renumbers parameters in the order of their (unique) names.

    Param ids are part of a node's identity in `structural_hash`; numbering by name instead of
    by visiting order makes the graph of a model independent of its file's node order and keeps
    it through export and re-import (which restore the names).
    """
    old = self.params
    order = sorted(old, key=lambda pid: (old.names.get(pid, ""), pid))
    remap = np.full(max(order, default=-1) + 2, -1, np.int32)
    fresh = ImportedParams()
    for new_id, pid in enumerate(order):
      remap[pid] = new_id
      fresh.add(old[pid], old.names.get(pid))
    fresh.input_names, fresh.output_names = old.input_names, old.output_names
    self.params = fresh
    param_id = np.asarray(graph.nodes["param_id"])
    nodes = dict(graph.nodes)
    nodes["param_id"] = jnp.asarray(remap[param_id])  # remap[-1] == -1 keeps "no param"
    return graph._replace(nodes=nodes)

  def mark_outputs(self) -> None:
    marked: set[int] = set()
    for vi in self.graph.output:
      value = self.values.get(vi.name)
      if value is _POISON or value is None:
        raise OnnxImportError(f"{self.label}: graph output '{vi.name}' has no value")
      t = self.materialize(value) if isinstance(value, Const) else value
      if t.index in marked:  # the same tensor twice: a no-op reshape makes a second node
        padded, rank = ops.pad_shape(t.shape)
        t = self.b.node(ops.Op.RESHAPE, [t], name=f"{vi.name}/copy",
                        shape=tuple(int(v) for v in padded), rank=rank)
      self.check_declared(vi, t)
      self.b.output(t)
      marked.add(t.index)
      self.names[t.index] = vi.name
      self.params.output_names.append(vi.name)

  def check_declared(self, vi: onnx.ValueInfoProto, t: Tensor) -> None:
    """A graph output's static dims in the file must match what import computed."""
    tt = vi.type.tensor_type
    if self.input_shapes or not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
      return
    dims = [d if isinstance(d, int) else None for d in _file_dims(tt)]
    if len(dims) != len(t.shape) or any(d is not None and d != s for d, s in zip(dims, t.shape)):
      raise OnnxImportError(f"{self.label}: graph output '{vi.name}' is declared with dims "
                            f"{['?' if d is None else d for d in dims]} but computes "
                            f"{list(t.shape)}")


def load(source: Any, *, input_shapes: Mapping[str, Sequence[int]] | None = None,
         random_weights: bool = False, seed: int = 0,
         capacity: int | None = None) -> tuple[layout.Graph, ImportedParams]:
  """Imports an ONNX model as a padded graph and its parameters.

  Args:
    source: a path, serialized model bytes, or an `onnx.ModelProto` (external data of a proto
      is looked up relative to the working directory).
    input_shapes: whole shapes of inputs, e.g. {"x": (1, 3, 48, 320)}: they fix dynamic dims
      (a `dim_param`, a `dim_value` of -1, or no size); one that changes a dim the file fixes
      is used with a `ShapeOverrideWarning`. Without an entry, a dynamic leading (batch) dim of
      an input of rank >= 2 is 1 (recorded in `params.stats.notes`) and any other dynamic dim
      is an error naming the input, the dim and the flag to give.
    random_weights: give initializers whose external data file is absent seeded random values
      (see `onnx_io.weights`) instead of failing.
    seed: seed of those values.
    capacity: node slots of the graph; None picks DEFAULT_CAPACITY, doubled until it fits.
  Returns:
    (graph, params): the graph (jraph.GraphsTuple with N = capacity node slots) and an
    `ImportedParams` (a ParamStore that also carries the ONNX input/output/node names and
    import figures).
  Raises:
    OnnxImportError naming file, node and op (UnsupportedOnnxOpError lists every unsupported
    op at once); CapacityError when the graph exceeds an explicit capacity.
  """
  model, label, base_dir = read_model(source)
  importer = _Importer(model, label, base_dir, input_shapes, random_weights, seed)
  return importer.run(capacity)
