"""Weights of ONNX models: external data, and seeded random values for graph-only files.

The graph-only models in ../shared/models keep every initializer's name, dtype and dims but not
its bytes (the external data file is absent), and the light models shipped with the onnx package
fill every weight with one value through ConstantOfShape. To run either, each such weight gets a
seeded random value here. Values depend only on (seed, tensor name, dtype, dims, how the tensor
is used), never on file order, so the importer and a copy of the model handed to onnxruntime see
the same numbers:

  float weights   normal / sqrt(fan_in) (fan-in from how the weight is used: Conv, MatMul, Gemm)
  rank <= 1       0.1 * normal (biases), batch-norm scale / variance uniform in [0.5, 1.5],
                  layer-norm scale 1 + 0.1 * normal
  integer         indices in [0, bound) where the tensor (or what it flows into) indexes an
                  axis of a known size (Gather, GatherElements); [0, 10) otherwise
  bool            uniform
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import zlib
from typing import Iterable

import numpy as np
import onnx
from onnx import numpy_helper

from xrlflow_jax.errors import OnnxImportError
from xrlflow_jax.onnx_io.common import onnx_to_numpy_dtype

# Ops whose first output carries values of their first input (index bounds flow backwards).
_PASS_THROUGH = {"Identity", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "Expand", "Slice",
                 "Concat", "Cast", "Flatten", "Gather", "GatherElements", "Tile", "Split"}


@dataclasses.dataclass
class Role:
  """How a weight is used, which decides the distribution of its random value."""
  kind: str = "weight"  # weight | bias | bn_scale | bn_var | ln_scale | index
  fan_in: int | None = None
  bound: int | None = None


def _external_info(t: onnx.TensorProto) -> dict[str, str]:
  out = {}
  for e in t.external_data:
    key, value = e.key, e.value
    if not isinstance(key, str) or not isinstance(value, str):  # invalid UTF-8 in a corrupt file
      raise OnnxImportError(f"external data fields of tensor {t.name!r} are not valid text")
    out[key] = value
  return out


def is_external(t: onnx.TensorProto) -> bool:
  """True when the tensor keeps its bytes in an external file."""
  return t.data_location == onnx.TensorProto.EXTERNAL


def external_path(t: onnx.TensorProto, base_dir: str | None) -> str:
  """The path of a tensor's external data file (relative locations resolve against base_dir)."""
  location = _external_info(t).get("location", "")
  if "\0" in location:
    raise OnnxImportError(f"external data location of tensor {t.name!r} is not a valid path")
  return os.path.join(base_dir or os.getcwd(), location)


def read_external(t: onnx.TensorProto, base_dir: str | None, where: str = "") -> np.ndarray | None:
  """Reads an external tensor; None when its data file is absent.

  Raises:
    OnnxImportError: the file exists but is too short, or the offset/length fields are bad.
  """
  info = _external_info(t)
  dtype = onnx_to_numpy_dtype(t.data_type, where)
  dims = tuple(int(d) for d in t.dims)
  if any(d < 0 for d in dims) or "location" not in info:
    raise OnnxImportError(f"{where}external tensor {t.name!r} has dims {list(dims)} and fields "
                          f"{sorted(info)} (needs a location and dims >= 0)")
  path = external_path(t, base_dir)
  try:
    if not os.path.isfile(path):
      return None
    offset = int(info.get("offset", 0))
    count = int(np.prod(dims, dtype=np.int64))
    nbytes = count * dtype.itemsize
    if "length" in info and int(info["length"]) != nbytes:
      raise OnnxImportError(f"{where}external tensor {t.name!r} ({dtype.name}{list(dims)}) "
                            f"needs {nbytes} bytes but its length field says {info['length']}")
    with open(path, "rb") as f:
      f.seek(offset)
      raw = f.read(nbytes)
  except (OSError, ValueError, OverflowError) as e:
    raise OnnxImportError(f"{where}cannot read external data of {t.name!r} from {path}: "
                          f"{e}") from None
  if len(raw) != nbytes:
    raise OnnxImportError(f"{where}external data file {path} is too short for tensor "
                          f"{t.name!r}: needs {nbytes} bytes at offset {offset}, has {len(raw)}")
  # ONNX stores external data little-endian, as numpy does on the hosts JAX runs on.
  return np.frombuffer(raw, dtype=dtype).reshape(dims).copy()


def _known_dims(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
  """Static dims of initializers, inputs and (after shape inference) intermediate tensors."""
  dims: dict[str, tuple[int, ...]] = {}
  try:
    inferred = onnx.shape_inference.infer_shapes(model)
    infos = list(inferred.graph.value_info) + list(inferred.graph.input)
  except Exception:  # shape inference is a hint here; a model it rejects keeps initializer dims
    infos = list(model.graph.input)
  for vi in infos:
    tt = vi.type.tensor_type
    if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
      dims[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
  for t in model.graph.initializer:
    dims[t.name] = tuple(int(d) for d in t.dims)
  for n in model.graph.node:
    if n.op_type == "Constant":
      for a in n.attribute:
        if a.name == "value" and a.HasField("t"):
          dims[n.output[0]] = tuple(int(d) for d in a.t.dims)
  return dims


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
  for a in node.attribute:
    if a.name == name and a.type == onnx.AttributeProto.INT:
      return int(a.i)
  return default


def roles(model: onnx.ModelProto) -> dict[str, Role]:
  """The role of every tensor name consumed by a node (weights of interest are among them)."""
  graph = model.graph
  dims = _known_dims(model)
  uses: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
  for node in graph.node:
    for i, name in enumerate(node.input):
      if name:
        uses.setdefault(name, []).append((node, i))

  bounds: dict[str, int | None] = {}

  def bound(name: str, depth: int = 0) -> int | None:
    if name in bounds:
      return bounds[name]
    bounds[name] = None  # guards against cycles in malformed graphs
    best: int | None = None
    for node, i in uses.get(name, []):
      b = None
      if node.op_type in ("Gather", "GatherElements") and i == 1 and len(node.input) > 0:
        data = dims.get(node.input[0])
        if data:
          axis = _attr(node, "axis", 0)
          if -len(data) <= axis < len(data):
            b = data[axis]
      elif node.op_type in _PASS_THROUGH and i == 0 and depth < 64:
        for out in node.output:
          ob = bound(out, depth + 1)
          if ob is not None:
            b = ob if b is None else min(b, ob)
      if b is not None:
        best = b if best is None else min(best, b)
    bounds[name] = best
    return best

  out: dict[str, Role] = {}
  for name, consumers in uses.items():
    role = Role()
    node, i = consumers[0]
    shape = dims.get(name)
    op = node.op_type
    if op == "BatchNormalization" and i in (1, 4):
      role.kind = "bn_scale" if i == 1 else "bn_var"
    elif op in ("LayerNormalization", "InstanceNormalization") and i == 1:
      role.kind = "ln_scale"
    elif shape is not None and len(shape) <= 1:
      role.kind = "bias"
    elif shape is not None:
      if op == "MatMul" and i == 1:
        role.fan_in = shape[-2]
      elif op == "Gemm" and i == 1 and len(shape) == 2:
        role.fan_in = shape[1] if _attr(node, "transB", 0) else shape[0]
      elif op == "Gemm" and i == 0 and len(shape) == 2:
        role.fan_in = shape[0] if _attr(node, "transA", 0) else shape[1]
      else:
        role.fan_in = int(np.prod(shape[1:]))
    role.bound = bound(name)
    out[name] = role
  return out


def _rng(seed: int, name: str) -> np.random.Generator:
  return np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(name.encode("utf-8"))])


def random_value(name: str, dtype: np.dtype, dims: Iterable[int], role: Role | None,
                 seed: int) -> np.ndarray:
  """A seeded random value for one weight (see the module docstring for the distributions)."""
  dims = tuple(int(d) for d in dims)
  dtype = np.dtype(dtype)
  role = role or Role()
  rng = _rng(seed, name)
  if dtype == np.bool_:
    return rng.random(dims) < 0.5
  if np.issubdtype(dtype, np.integer):
    hi = role.bound if role.bound is not None else 10
    return rng.integers(0, max(int(hi), 1), dims).astype(dtype)
  if role.kind in ("bn_scale", "bn_var"):
    value = rng.uniform(0.5, 1.5, dims)
  elif role.kind == "ln_scale":
    value = 1.0 + 0.1 * rng.standard_normal(dims)
  elif role.kind == "bias" or len(dims) <= 1:
    value = 0.1 * rng.standard_normal(dims)
  else:
    fan_in = role.fan_in or (int(np.prod(dims[1:])) if len(dims) > 1 else 1)
    value = rng.standard_normal(dims) / math.sqrt(max(fan_in, 1))
  return value.astype(dtype)


def missing_initializers(model: onnx.ModelProto, base_dir: str | None) -> list[onnx.TensorProto]:
  """Initializers whose external data file is absent."""
  return [t for t in model.graph.initializer
          if is_external(t) and not os.path.isfile(external_path(t, base_dir))]


def random_initializers(model: onnx.ModelProto, seed: int = 0,
                        base_dir: str | None = None) -> dict[str, np.ndarray]:
  """Seeded random values of every initializer whose external data file is absent."""
  missing = missing_initializers(model, base_dir)
  if not missing:
    return {}
  role_of = roles(model)
  return {t.name: random_value(t.name, onnx_to_numpy_dtype(t.data_type), t.dims,
                               role_of.get(t.name), seed) for t in missing}


def fill_missing_weights(model: onnx.ModelProto, seed: int = 0,
                         base_dir: str | None = None) -> onnx.ModelProto:
  """A copy of `model` whose initializers with absent external data hold random values.

  The values are those `onnx_io.load(..., random_weights=True, seed=seed)` uses, so onnxruntime
  can run the copy and be compared with the executor.
  """
  values = random_initializers(model, seed, base_dir)
  out = copy.deepcopy(model)
  for t in out.graph.initializer:
    if t.name in values:
      t.CopyFrom(numpy_helper.from_array(values[t.name], t.name))
  return out


def randomize_constant_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
  """A copy where every weight made by ConstantOfShape (one value repeated) is random instead.

  The light models of the onnx package build their weights this way; with one value everywhere
  a wrong channel order or transposed kernel would go unnoticed, so tests randomise them. The
  ConstantOfShape nodes become initializers of the same names (listed as graph inputs too for
  IR version < 4 models, which require it).
  """
  out = copy.deepcopy(model)
  graph = out.graph
  inits = {t.name: t for t in graph.initializer}
  role_of = roles(out)
  keep, added = [], []
  for node in graph.node:
    shape_name = node.input[0] if node.op_type == "ConstantOfShape" and node.input else ""
    if shape_name in inits and not is_external(inits[shape_name]):
      dims = numpy_helper.to_array(inits[shape_name]).astype(np.int64).tolist()
      dtype = np.dtype("float32")
      for a in node.attribute:
        if a.name == "value":
          dtype = onnx_to_numpy_dtype(a.t.data_type)
      name = node.output[0]
      value = random_value(name, dtype, dims, role_of.get(name), seed)
      added.append(numpy_helper.from_array(value, name))
    else:
      keep.append(node)
  del graph.node[:]
  graph.node.extend(keep)
  # Shape initializers only the replaced nodes read go too (with their IR < 4 input entries).
  read = {name for node in keep for name in node.input} | {o.name for o in graph.output}
  consumed = {n.input[0] for n in model.graph.node if n.op_type == "ConstantOfShape" and n.input}
  dropped = {name for name in consumed if name not in read and name in inits}
  kept_inits = [t for t in graph.initializer if t.name not in dropped]
  del graph.initializer[:]
  graph.initializer.extend(kept_inits + added)
  kept_inputs = [vi for vi in graph.input if vi.name not in dropped]
  del graph.input[:]
  graph.input.extend(kept_inputs)
  if out.ir_version < 4:
    for t in added:
      graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
  return out
