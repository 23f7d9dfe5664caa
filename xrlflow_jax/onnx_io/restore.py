"""Reading back the nodes the exporter spells in several ONNX nodes.

ONNX has no Conv or MatMul with a fused activation and no NHWC convolution, pool or batch norm:
`exporter` writes them as the plain op followed by the activation, or as the NCHW op between
two Transposes, and tags those ONNX nodes (`common.FUSED_ACTIVATION`, `common.NHWC_LAYOUT` in
their doc_string). The importer calls `restore` on each tagged node: where the tagged node
and the node before it still have the exporter's shape (the inner result read by nothing
else), it builds the one project node again, so a file this project wrote re-imports to the
graph it was written from. A kernel choice ONNX has no attribute for (`common.TAPS_IMPL`) is restored on the converted node
(`restore_impl`). Files written by other tools carry no tags and import as written.
"""

from __future__ import annotations

from typing import Any, Mapping

import onnx

from xrlflow_jax.graph.builder import GraphBuilder, Tensor
from xrlflow_jax.onnx_io.common import FUSED_ACTIVATION, NHWC_LAYOUT, TAPS_IMPL
from xrlflow_jax.ops import Activation, Impl, Layout, Op

_ACTIVATIONS = {"Relu": Activation.RELU, "Sigmoid": Activation.SIGMOID,
                "Tanh": Activation.TANH, "Gelu": Activation.GELU}
_FUSES = (Op.CONV2D, Op.MATMUL)  # the ops with an `activation` attribute
_HAS_LAYOUT = (Op.CONV2D, Op.MAX_POOL, Op.AVG_POOL, Op.GLOBAL_AVG_POOL, Op.BATCH_NORM)
_TO_NCHW, _TO_NHWC, _OIHW_TO_HWIO = (0, 3, 1, 2), (0, 2, 3, 1), (2, 3, 1, 0)


def restore(b: GraphBuilder, node: onnx.NodeProto, inputs: list[Any],
            uses: Mapping[str, int]) -> Tensor | None:
  """The one project node that the tagged ONNX `node` ends (its output's value), or None when
  `node` is not tagged or no longer has the exporter's shape (then it imports as written).

  Args:
    b: the importer's builder; node: the ONNX node; inputs: its operands (Const or Tensor);
    uses: how many nodes read each ONNX tensor.
  """
  tag = node.doc_string
  if tag not in (FUSED_ACTIVATION, NHWC_LAYOUT) or not inputs:
    return None
  x = inputs[0]
  if not isinstance(x, Tensor) or uses.get(node.input[0], 0) != 1:
    return None
  op, ins, attrs = b.producer(x)
  if tag == FUSED_ACTIVATION:
    act = _ACTIVATIONS.get(node.op_type)
    if act is None or op not in _FUSES or attrs.get("activation") != Activation.NONE:
      return None
    return b.remake(x, activation=int(act))
  if node.op_type != "Transpose" or _perm(node) != _TO_NHWC or op not in _HAS_LAYOUT \
      or attrs.get("layout") != Layout.NCHW or not ins:
    return None
  t_op, t_ins, t_attrs = b.producer(ins[0])
  if t_op != Op.TRANSPOSE or tuple(t_attrs["perm"][:4]) != _TO_NCHW:
    return None
  new = [t_ins[0]] + list(ins[1:])
  if op == Op.CONV2D:
    new[1] = b.transpose(ins[1], _OIHW_TO_HWIO)
  return b.remake(x, new, layout=int(Layout.NHWC))


def restore_impl(b: GraphBuilder, node: onnx.NodeProto, out: Any) -> Tensor | None:
  """The converted output `out` of a node tagged `TAPS_IMPL` remade with impl=taps (None when
  `node` is not so tagged or `out` is not a node with that attribute)."""
  if node.doc_string != TAPS_IMPL or not isinstance(out, Tensor):
    return None
  _, _, attrs = b.producer(out)
  if "impl" not in attrs:
    return None
  return b.remake(out, impl=int(Impl.TAPS))


def _perm(node: onnx.NodeProto) -> tuple[int, ...]:
  for a in node.attribute:
    if a.name == "perm":
      return tuple(int(p) for p in a.ints)
  return ()
