"""Padded graph -> standard ONNX: `save(graph, params, path)` and `to_model(graph, params)`.

Every op of the project maps to standard ONNX ops (opset `EXPORT_OPSET`):

  Conv2D / MatMul with a fused activation  Conv / MatMul followed by Relu, Sigmoid, Tanh or Gelu
  nodes computed from weights only         evaluated here and written as initializers (TASO's
    (Enlarge, MergeGConv, merged weights,  weight pre-processing: an enlarged kernel becomes a
    folded batch norm, ...)                padded initializer, merged matmul weights one tensor)
  Enlarge of a run-time tensor             Pad of the kernel's spatial dims
  attribute-like inputs                    int64 initializers (Reshape shapes, Slice bounds,
                                           Squeeze/Unsqueeze/Reduce axes, Pad pads)

Names come from an import (`ImportedParams`: graph inputs/outputs, initializers and node outputs
keep their ONNX names) or are made up (`input0`, `output0`, `<op>_<slot>`). Models whose weights
exceed 2 GB are written with external data beside the file.
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np
import onnx
from onnx import helper, numpy_helper

from xrlflow_jax import ops
from xrlflow_jax.errors import OnnxExportError, XrlflowError
from xrlflow_jax.graph import host, layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.onnx_io.common import (EXPORT_OPSET, FUSED_ACTIVATION, NHWC_LAYOUT,
                                        TAPS_IMPL, numpy_to_onnx_dtype, unique_name)
from xrlflow_jax.ops import MAX_RANK, Activation, Impl, Layout, Op
from xrlflow_jax.ops.tensor import PAD_MODES

_TWO_GB = 2 ** 31 - 1
_ACTIVATION_OPS = {Activation.RELU: "Relu", Activation.SIGMOID: "Sigmoid",
                   Activation.TANH: "Tanh", Activation.GELU: "Gelu"}
_SAME_NAME = {Op.ADD: "Add", Op.SUB: "Sub", Op.MUL: "Mul", Op.DIV: "Div", Op.POW: "Pow",
              Op.MAX: "Max", Op.MIN: "Min", Op.RELU: "Relu", Op.SIGMOID: "Sigmoid",
              Op.TANH: "Tanh", Op.ERF: "Erf", Op.EXP: "Exp", Op.LOG: "Log", Op.SQRT: "Sqrt",
              Op.NEG: "Neg", Op.RECIPROCAL: "Reciprocal", Op.HARD_SWISH: "HardSwish",
              Op.WHERE: "Where", Op.GLOBAL_AVG_POOL: "GlobalAveragePool",
              Op.EQUAL: "Equal", Op.LESS: "Less", Op.GREATER: "Greater",
              Op.LESS_OR_EQUAL: "LessOrEqual", Op.GREATER_OR_EQUAL: "GreaterOrEqual",
              Op.NOT: "Not", Op.AND: "And", Op.OR: "Or", Op.XOR: "Xor", Op.SIGN: "Sign",
              Op.ABS: "Abs", Op.FLOOR: "Floor", Op.CEIL: "Ceil", Op.ROUND: "Round",
              Op.IS_NAN: "IsNaN", Op.PRELU: "PRelu", Op.SOFTPLUS: "Softplus",
              Op.SOFTSIGN: "Softsign", Op.MISH: "Mish"}
# Ops written as the ONNX op of the same meaning with the same attributes (float attributes as
# decoded; bools as ints).
_WITH_ATTRS = {Op.LEAKY_RELU: "LeakyRelu", Op.ELU: "Elu", Op.SELU: "Selu", Op.CELU: "Celu",
               Op.SHRINK: "Shrink", Op.THRESHOLDED_RELU: "ThresholdedRelu", Op.MOD: "Mod",
               Op.IS_INF: "IsInf", Op.SOFTMAX: "Softmax", Op.LOG_SOFTMAX: "LogSoftmax",
               Op.HARD_SIGMOID: "HardSigmoid"}
_REDUCE_OPS = {Op.REDUCE_MEAN: "ReduceMean", Op.REDUCE_SUM: "ReduceSum",
               Op.REDUCE_MAX: "ReduceMax", Op.REDUCE_MIN: "ReduceMin",
               Op.REDUCE_PROD: "ReduceProd", Op.REDUCE_L1: "ReduceL1", Op.REDUCE_L2: "ReduceL2",
               Op.REDUCE_LOG_SUM_EXP: "ReduceLogSumExp"}


def _axes_from_bits(bits: int, rank: int) -> list[int]:
  return [a for a in range(rank) if (int(bits) >> a) & 1]


class _Writer:
  """Accumulates nodes and initializers with unique names."""

  def __init__(self):
    self.nodes: list[onnx.NodeProto] = []
    self.initializers: list[onnx.TensorProto] = []
    self.used: set[str] = set()

  def name(self, base: str) -> str:
    return unique_name(base, self.used)

  def initializer(self, value: np.ndarray, base: str) -> str:
    name = self.name(base)
    self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
    return name

  def ints(self, values: list[int], base: str) -> str:
    return self.initializer(np.asarray(values, np.int64), base)

  def node(self, op_type: str, inputs: list[str], output: str, *, doc_string: str = "",
           **attrs: Any) -> str:
    self.nodes.append(helper.make_node(op_type, inputs, [output], name=output,
                                       doc_string=doc_string or None, **attrs))
    return output


def _fold_value(g: layout.Graph, v: int, args: list[np.ndarray]) -> np.ndarray:
  """Evaluates a node whose inputs are all constant (weight pre-processing)."""
  nd = g.nodes
  spec = ops.get(int(nd["op"][v]))
  shape = ops.unpad_shape(nd["shape"][v], nd["rank"][v])
  dtype = ops.numpy_dtype(int(nd["dtype"][v]))
  attrs = spec.decode_attrs(nd["attrs"][v])
  out = spec.lower([jnp.asarray(a) for a in args], attrs, shape, jnp.dtype(dtype))
  return np.asarray(out).astype(dtype)


def to_model(graph: layout.Graph, params: ParamStore, *, opset: int = EXPORT_OPSET,
             name: str | None = None) -> onnx.ModelProto:
  """Builds the ONNX model of a graph (weights inside the proto; see `save` for big models).

  Args:
    graph: a valid padded graph.
    params: its parameter store (an `ImportedParams` restores ONNX names).
    opset: default-domain opset written (>= 20, for Gelu).
    name: the ONNX graph name.
  Raises:
    OnnxExportError for a graph or op that has no ONNX form (the message names node and op).
  """
  if opset < 20:
    raise OnnxExportError(f"export needs opset >= 20 (Gelu), got {opset}")
  g = layout.to_host(graph)
  try:
    host.validate(g, params)
  except XrlflowError as e:
    raise OnnxExportError(f"cannot export an invalid graph: {e}") from None
  nd = g.nodes
  table = layout.input_table(g)
  order = [int(v) for v in host.topological_order(g)]
  need = np.zeros(nd["op"].shape[0], bool)
  stack = [v for v in order if nd["is_output"][v] or nd["input_index"][v] >= 0]
  while stack:
    v = stack.pop()
    if need[v]:
      continue
    need[v] = True
    stack.extend(int(u) for u in table[v] if u >= 0)
  order = [v for v in order if need[v]]

  input_names = list(getattr(params, "input_names", []) or [])
  output_names = list(getattr(params, "output_names", []) or [])
  node_names = list(getattr(params, "node_names", []) or [])
  w = _Writer()
  names: dict[int, str] = {}
  # Graph inputs and outputs keep their names first; everything else gets a unique one.
  for v in order:
    if nd["input_index"][v] >= 0:
      i = int(nd["input_index"][v])
      names[v] = w.name(input_names[i] if i < len(input_names) else f"input{i}")
  for v in order:
    if nd["is_output"][v] and v not in names:
      i = int(nd["output_index"][v])
      names[v] = w.name(output_names[i] if i < len(output_names) else f"output{i}")
  for v in order:
    if v not in names:
      if nd["op"][v] == int(Op.CONSTANT):
        base = params.names.get(int(nd["param_id"][v]), "")
      else:
        base = node_names[v] if v < len(node_names) else ""
      names[v] = w.name(base or f"{ops.get(int(nd['op'][v])).name.lower()}_{v}")

  # Weight pre-processing: constant nodes read at run time become initializers, one per
  # distinct value (`host.constant_classes`: a merge rewrite may recompute one concat of shared
  # weights at every step of an unrolled RNN; the file keeps one copy).
  canon = host.constant_classes(g, order)
  folded: dict[int, np.ndarray] = {}
  boundary = {canon.get(int(u), int(u)) for v in order if not nd["is_constant"][v]
              for u in table[v] if u >= 0}
  for v in order:
    if not nd["is_constant"][v]:
      continue
    if canon[v] != v:
      if nd["is_output"][v]:  # an output keeps its own name: an Identity of the shared value
        w.nodes.append(helper.make_node("Identity", [names[canon[v]]], [names[v]]))
        boundary.add(canon[v])
      continue
    if nd["op"][v] == int(Op.CONSTANT):
      folded[v] = np.asarray(params[int(nd["param_id"][v])])
    else:
      folded[v] = _fold_value(g, v, [folded[canon[int(u)]] for u in table[v] if u >= 0])
  for v in order:
    if v in folded and (v in boundary or nd["is_output"][v]):
      w.initializers.append(numpy_helper.from_array(folded[v], names[v]))
  # Interior folded values are no longer needed once their consumers are folded.
  inputs_vi, outputs_vi = [], []
  for v in order:
    shape = list(ops.unpad_shape(nd["shape"][v], nd["rank"][v]))
    elem = numpy_to_onnx_dtype(ops.numpy_dtype(int(nd["dtype"][v])))
    if nd["input_index"][v] >= 0:
      inputs_vi.append((int(nd["input_index"][v]),
                        helper.make_tensor_value_info(names[v], elem, shape)))
    if nd["is_output"][v]:
      outputs_vi.append((int(nd["output_index"][v]),
                         helper.make_tensor_value_info(names[v], elem, shape)))
    if nd["is_constant"][v] or nd["op"][v] == int(Op.INPUT):
      continue
    _emit(w, g, v, [names[canon.get(int(u), int(u))] for u in table[v] if u >= 0],
          [int(u) for u in table[v] if u >= 0], names[v])

  graph_proto = helper.make_graph(
      w.nodes, name or (getattr(params, "source", "") and os.path.basename(params.source))
      or "xrlflow_jax", [vi for _, vi in sorted(inputs_vi, key=lambda t: t[0])],
      [vi for _, vi in sorted(outputs_vi, key=lambda t: t[0])], initializer=w.initializers)
  model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", opset)],
                            producer_name="xrlflow_jax", ir_version=10)
  return model


_TO_NCHW, _TO_NHWC, _HWIO_TO_OIHW = (0, 3, 1, 2), (0, 2, 3, 1), (3, 2, 0, 1)


def _emit(w: _Writer, g: layout.Graph, v: int, ins: list[str], srcs: list[int], out: str) -> None:
  """Writes the ONNX node(s) of project node v, its output named `out`.

  ONNX's Conv, pools and BatchNormalization are NCHW: a node in the NHWC layout is written as
  the NCHW op between transposes (and a Conv2D's HWIO weight transposed back to OIHW).
  """
  nd = g.nodes
  op = Op(int(nd["op"][v]))
  a = ops.get(op).decode_attrs(nd["attrs"][v])
  in_shapes = [ops.unpad_shape(nd["shape"][u], nd["rank"][u]) for u in srcs]
  if a.get("layout", Layout.NCHW) == Layout.NCHW:
    _emit_node(w, g, v, ins, srcs, out, a, in_shapes)
    return
  ins, in_shapes = list(ins), list(in_shapes)
  ins[0] = w.node("Transpose", [ins[0]], w.name(f"{out}/nchw_input"), perm=list(_TO_NCHW),
                  doc_string=NHWC_LAYOUT)
  in_shapes[0] = tuple(in_shapes[0][i] for i in _TO_NCHW)
  if op == Op.CONV2D:
    ins[1] = w.node("Transpose", [ins[1]], w.name(f"{out}/oihw_weight"),
                    perm=list(_HWIO_TO_OIHW), doc_string=NHWC_LAYOUT)
    in_shapes[1] = tuple(in_shapes[1][i] for i in _HWIO_TO_OIHW)
  nchw = w.name(f"{out}/nchw")
  _emit_node(w, g, v, ins, srcs, nchw, dict(a, layout=int(Layout.NCHW)), in_shapes)
  w.node("Transpose", [nchw], out, perm=list(_TO_NHWC), doc_string=NHWC_LAYOUT)


def _emit_node(w: _Writer, g: layout.Graph, v: int, ins: list[str], srcs: list[int], out: str,
               a: dict[str, Any], in_shapes: list[tuple[int, ...]]) -> None:
  """`_emit` of an NCHW node, with its decoded attributes and input shapes."""
  nd = g.nodes
  op = Op(int(nd["op"][v]))
  spec = ops.get(op)
  rank = int(nd["rank"][v])
  in_ranks = [int(nd["rank"][u]) for u in srcs]
  out_dtype = ops.numpy_dtype(int(nd["dtype"][v]))

  # ONNX has no kernel choice: the tap-by-tap implementation is said in the node's doc_string.
  impl = TAPS_IMPL if a.get("impl", Impl.XLA) == Impl.TAPS else ""

  def with_activation(op_type: str, inputs: list[str], **attrs: Any) -> None:
    act = Activation(int(a["activation"]))
    if act == Activation.NONE:
      w.node(op_type, inputs, out, doc_string=impl, **attrs)
      return
    pre = w.node(op_type, inputs, w.name(f"{out}/pre_activation"), doc_string=impl, **attrs)
    w.node(_ACTIVATION_OPS[act], [pre], out, doc_string=FUSED_ACTIVATION)

  if op in _SAME_NAME:
    w.node(_SAME_NAME[op], ins, out)
  elif op in _WITH_ATTRS:
    w.node(_WITH_ATTRS[op], ins, out,
           **{k: int(v) if isinstance(v, bool) else v for k, v in a.items()})
  elif op in _REDUCE_OPS:
    axes = w.ints(_axes_from_bits(a["axes"], in_ranks[0]), f"{out}/axes")
    w.node(_REDUCE_OPS[op], [ins[0], axes], out, keepdims=int(a["keepdims"]))
  elif op in (Op.ARG_MAX, Op.ARG_MIN):
    (axis,) = _axes_from_bits(a["axes"], in_ranks[0])
    w.node("ArgMax" if op == Op.ARG_MAX else "ArgMin", ins, out, axis=axis,
           keepdims=int(a["keepdims"]), select_last_index=int(a["select_last_index"]))
  elif op == Op.GATHER_ELEMENTS:
    w.node("GatherElements", ins, out, axis=a["axis"])
  elif op == Op.CUMSUM:
    axis = w.initializer(np.asarray(a["axis"], np.int64), f"{out}/axis")
    w.node("CumSum", [ins[0], axis], out, exclusive=int(a["exclusive"]), reverse=int(a["reverse"]))
  elif op == Op.TRILU:
    k = w.initializer(np.asarray(a["k"], np.int64), f"{out}/k")
    w.node("Trilu", [ins[0], k], out, upper=int(a["upper"]))
  elif op in (Op.TOP_K_VALUES, Op.TOP_K_INDICES):  # one TopK per node; the other output unused
    other = w.name(f"{out}/{'indices' if op == Op.TOP_K_VALUES else 'values'}")
    outs = [out, other] if op == Op.TOP_K_VALUES else [other, out]
    w.nodes.append(helper.make_node("TopK", [ins[0], w.ints([a["k"]], f"{out}/k")], outs,
                                    name=out, axis=a["axis"], largest=int(a["largest"]),
                                    sorted=1))
  elif op == Op.EXPAND:
    w.node("Expand", [ins[0], w.ints(list(ops.unpad_shape(nd["shape"][v], rank)),
                                     f"{out}/shape")], out)
  elif op == Op.TILE:
    reps = list(a["reps"][MAX_RANK - in_ranks[0]:]) if in_ranks[0] else []
    w.node("Tile", [ins[0], w.ints(reps, f"{out}/repeats")], out)
  elif op == Op.CONV2D:
    pt, pl, pb, pr = a["pads"]
    with_activation("Conv", ins, kernel_shape=list(in_shapes[1][2:]), strides=list(a["strides"]),
                    pads=[pt, pl, pb, pr], dilations=list(a["dilations"]), group=a["groups"])
  elif op == Op.CONV_TRANSPOSE:
    pt, pl, pb, pr = a["pads"]
    with_activation("ConvTranspose", ins, kernel_shape=list(in_shapes[1][2:]),
                    strides=list(a["strides"]), pads=[pt, pl, pb, pr],
                    dilations=list(a["dilations"]), group=a["groups"],
                    output_padding=list(a["output_padding"]))
  elif op == Op.MATMUL:
    with_activation("MatMul", ins)
  elif op == Op.GELU:
    w.node("Gelu", ins, out, approximate="tanh" if a["approximate"] else "none")
  elif op == Op.CLIP:
    lo, hi = a["min"], a["max"]
    args = [ins[0], "" if math.isinf(lo) and lo < 0 else
            w.initializer(np.asarray(lo, out_dtype), f"{out}/min"),
            "" if math.isinf(hi) and hi > 0 else
            w.initializer(np.asarray(hi, out_dtype), f"{out}/max")]
    while args[-1] == "":
      args.pop()
    w.node("Clip", args, out)
  elif op == Op.LAYER_NORM:
    w.node("LayerNormalization", ins, out, axis=a["axis"], epsilon=a["epsilon"])
  elif op == Op.BATCH_NORM:
    w.node("BatchNormalization", ins, out, epsilon=a["epsilon"])
  elif op in (Op.MAX_POOL, Op.AVG_POOL):
    pt, pl, pb, pr = a["pads"]
    attrs = dict(kernel_shape=list(a["kernel"]), strides=list(a["strides"]),
                 pads=[pt, pl, pb, pr], ceil_mode=int(a["ceil_mode"]),
                 dilations=[max(int(d), 1) for d in a["dilations"]])
    if op == Op.AVG_POOL:
      attrs["count_include_pad"] = int(a["count_include_pad"])
    w.node("MaxPool" if op == Op.MAX_POOL else "AveragePool", ins, out, doc_string=impl,
           **attrs)
  elif op == Op.CONCAT:
    w.node("Concat", ins, out, axis=a["axis"])
  elif op == Op.SLICE:
    args = [w.ints([a["start"]], f"{out}/starts"), w.ints([a["end"]], f"{out}/ends"),
            w.ints([a["axis"]], f"{out}/axes"), w.ints([a["step"]], f"{out}/steps")]
    w.node("Slice", [ins[0]] + args, out)
  elif op == Op.RESHAPE:
    shape = list(ops.unpad_shape(nd["shape"][v], rank))
    w.node("Reshape", [ins[0], w.ints(shape, f"{out}/shape")], out)
  elif op == Op.TRANSPOSE:
    w.node("Transpose", ins, out, perm=list(a["perm"][:in_ranks[0]]))
  elif op == Op.SQUEEZE:
    axes = w.ints(_axes_from_bits(a["axes"], in_ranks[0]), f"{out}/axes")
    w.node("Squeeze", [ins[0], axes], out)
  elif op == Op.UNSQUEEZE:
    axes = w.ints(_axes_from_bits(a["axes"], rank), f"{out}/axes")
    w.node("Unsqueeze", [ins[0], axes], out)
  elif op == Op.GATHER:
    w.node("Gather", ins, out, axis=a["axis"])
  elif op == Op.PAD:
    pads = list(a["pads"][:in_ranks[0]]) + list(a["pads"][MAX_RANK:MAX_RANK + in_ranks[0]])
    mode = PAD_MODES[a["mode"]]
    args = [ins[0], w.ints(pads, f"{out}/pads")]
    if mode == "constant":
      args.append(w.initializer(np.asarray(a["value"]).astype(out_dtype), f"{out}/value"))
    w.node("Pad", args, out, mode=mode)
  elif op == Op.CAST:
    w.node("Cast", ins, out, to=numpy_to_onnx_dtype(out_dtype))
  elif op == Op.ENLARGE:  # a kernel computed at run time: pad its spatial dims
    kh, kw = a["kernel"]
    h, wd = in_shapes[0][2], in_shapes[0][3]
    dh, dw = (kh - h) // 2, (kw - wd) // 2
    w.node("Pad", [ins[0], w.ints([0, 0, dh, dw, 0, 0, dh, dw], f"{out}/pads")], out,
           mode="constant")
  else:
    raise OnnxExportError(f"node {v} ({spec.name}) has no ONNX form when its input is computed "
                          "at run time (it is exported as an initializer when its inputs are "
                          "weights)")


def save(graph: layout.Graph, params: ParamStore, path: str | os.PathLike, *,
         opset: int = EXPORT_OPSET, external_data: bool | None = None,
         check: bool = True, metadata: Mapping[str, str] | None = None) -> onnx.ModelProto:
  """Writes a graph and its weights as an ONNX file and returns the model.

  Args:
    graph, params: the graph and its weights.
    path: the .onnx file to write.
    opset: default-domain opset (>= 20).
    external_data: keep weights in `<file>.data` beside the model; None does so only when they
      exceed 2 GB (the protobuf limit).
    check: run `onnx.checker.check_model` (full check, which includes strict shape inference)
      on the written file.
    metadata: {key: value} written as the model's metadata_props.
  Raises:
    OnnxExportError: the graph cannot be exported, or the written model fails the checker.
  """
  path = os.fspath(path)
  model = to_model(graph, params, opset=opset)
  if metadata:
    helper.set_model_props(model, {str(k): str(v) for k, v in metadata.items()})
  nbytes = sum(t.ByteSize() for t in model.graph.initializer)
  if external_data is None:
    external_data = nbytes > _TWO_GB - (64 << 20)
  try:
    if external_data:
      location = os.path.basename(path) + ".data"
      onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                      location=location, size_threshold=1024)
    else:
      onnx.save_model(model, path)
  except (OSError, ValueError) as e:
    raise OnnxExportError(f"cannot write {path}: {e}") from None
  if check:
    try:
      onnx.checker.check_model(path, full_check=True)
    except onnx.checker.ValidationError as e:
      raise OnnxExportError(f"{path}: the exported model fails the ONNX checker: {e}") from None
  return model
