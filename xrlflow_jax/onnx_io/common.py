"""Helpers shared by the ONNX importer and exporter: dtypes, attributes, opsets, names."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper

from xrlflow_jax.errors import OnnxImportError
from xrlflow_jax.ops import DType

# doc_strings of the ONNX nodes the exporter writes for what ONNX cannot say (a fused activation,
# an NHWC convolution, pool or batch norm, the tap-by-tap kernel); the importer reads them back
# as the project node they stand for (`onnx_io.restore`).
FUSED_ACTIVATION = "xrlflow_jax: the activation fused into the node before"
NHWC_LAYOUT = "xrlflow_jax: NHWC layout of the node between these transposes"
TAPS_IMPL = "xrlflow_jax: computed tap by tap (impl=taps)"

# Opsets of the default domain the importer reads (older ones, down to 1, are converted to
# MIN_OPSET by onnx.version_converter first). The light models shipped with the onnx package
# are opset 9; the newest is whatever the installed onnx package knows (each converter
# checks the attributes it understands, so an op version with new semantics fails loudly).
MIN_OPSET = 9
MAX_OPSET = onnx.defs.onnx_opset_version()
# Opset the exporter writes (Gelu needs 20; LayerNormalization 17; ReduceMean with axes input 18).
EXPORT_OPSET = 21

_T = onnx.TensorProto
_ONNX_TO_NUMPY: dict[int, np.dtype] = {
    _T.FLOAT: np.dtype("float32"), _T.DOUBLE: np.dtype("float64"),
    _T.FLOAT16: np.dtype("float16"), _T.INT8: np.dtype("int8"), _T.INT16: np.dtype("int16"),
    _T.INT32: np.dtype("int32"), _T.INT64: np.dtype("int64"), _T.UINT8: np.dtype("uint8"),
    _T.UINT16: np.dtype("uint16"), _T.UINT32: np.dtype("uint32"),
    _T.UINT64: np.dtype("uint64"), _T.BOOL: np.dtype("bool"),
}


def onnx_to_numpy_dtype(elem_type: int, where: str = "") -> np.dtype:
  """The numpy dtype of an ONNX element type; `OnnxImportError` for unsupported types."""
  if elem_type == _T.BFLOAT16:
    import ml_dtypes  # pylint: disable=g-import-not-at-top
    return np.dtype(ml_dtypes.bfloat16)
  try:
    return _ONNX_TO_NUMPY[int(elem_type)]
  except KeyError:
    name = _T.DataType.Name(elem_type) if elem_type in _T.DataType.values() else str(elem_type)
    raise OnnxImportError(f"{where}element type {name} is not supported") from None


def numpy_to_onnx_dtype(dtype: Any) -> int:
  """The ONNX element type of a numpy dtype."""
  dtype = np.dtype(dtype)
  if dtype.name == "bfloat16":
    return _T.BFLOAT16
  for code, dt in _ONNX_TO_NUMPY.items():
    if dt == dtype:
      return code
  raise OnnxImportError(f"numpy dtype {dtype} has no ONNX element type")


def project_dtype(dtype: np.dtype, where: str = "") -> DType:
  """The project's `DType` of a numpy dtype; `OnnxImportError` when the project lacks it."""
  name = np.dtype(dtype).name
  for code in DType:
    if code.name.lower() == name:
      return code
  raise OnnxImportError(f"{where}tensors of dtype {name} cannot be represented in the graph "
                        f"(supported: {', '.join(d.name.lower() for d in DType)})")


def attributes(node: onnx.NodeProto, where: str = "") -> dict[str, Any]:
  """The node's attributes as Python values (bytes decoded, tensors as numpy arrays)."""
  out: dict[str, Any] = {}
  for attr in node.attribute:
    if attr.ref_attr_name:
      raise OnnxImportError(f"{where}attribute {attr.name} refers to a function attribute")
    try:
      value = helper.get_attribute_value(attr)
    except Exception as e:  # onnx raises ValueError/TypeError on malformed attributes
      raise OnnxImportError(f"{where}attribute {attr.name!r} is malformed: {e}") from None
    if isinstance(value, bytes):
      value = value.decode("utf-8", errors="replace")
    elif isinstance(value, onnx.TensorProto):
      value = tensor_to_numpy(value, where=f"{where}attribute {attr.name}: ")
    elif isinstance(value, list):
      value = [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v for v in value]
    out[attr.name] = value
  return out


def tensor_to_numpy(t: onnx.TensorProto, base_dir: str | None = None,
                    where: str = "") -> np.ndarray:
  """Reads a TensorProto stored inside the model (not external data) as a numpy array."""
  if t.data_location == _T.EXTERNAL:
    raise OnnxImportError(f"{where}tensor {t.name!r} keeps its data in an external file")
  if t.data_type == _T.STRING:
    raise OnnxImportError(f"{where}string tensor {t.name!r} is not supported")
  dtype = onnx_to_numpy_dtype(t.data_type, where)
  dims = tuple(int(d) for d in t.dims)
  if any(d < 0 for d in dims):
    raise OnnxImportError(f"{where}tensor {t.name!r} has negative dims {list(dims)}")
  try:
    from onnx import numpy_helper  # pylint: disable=g-import-not-at-top
    value = numpy_helper.to_array(t, base_dir or "")
  except Exception as e:  # corrupt payloads raise ValueError/TypeError from numpy
    raise OnnxImportError(f"{where}tensor {t.name!r} ({dtype.name}{list(dims)}) has a corrupt "
                          f"payload: {e}") from None
  if tuple(value.shape) != dims:
    raise OnnxImportError(f"{where}tensor {t.name!r} holds {value.size} values for dims "
                          f"{list(dims)}")
  return np.asarray(value).astype(dtype, copy=False)


def default_opset(model: onnx.ModelProto, where: str = "", min_opset: int = MIN_OPSET) -> int:
  """The model's default-domain opset, checked against min_opset..MAX_OPSET (the importer
  converts opsets 1..MIN_OPSET-1 first, see `importer._upgrade_opset`)."""
  versions = [int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")]
  if not versions:
    raise OnnxImportError(f"{where}the model imports no opset of the default ONNX domain")
  opset = max(versions)
  if not min_opset <= opset <= MAX_OPSET:
    raise OnnxImportError(f"{where}opset {opset} is not supported (supported: {min_opset} to "
                          f"{MAX_OPSET}" + (f"; opsets below {MIN_OPSET} are converted"
                                            if min_opset < MIN_OPSET else "") + ")")
  return opset


def unique_name(name: str, used: set[str]) -> str:
  """`name`, or `name_1`, `name_2`, ... when taken; records the result in `used`."""
  base = name or "t"
  out, i = base, 0
  while out in used:
    i += 1
    out = f"{base}_{i}"
  used.add(out)
  return out
