"""A host-side graph builder in the spirit of TASO's Python API.

    b = GraphBuilder(seed=0)
    x = b.input((1, 3, 224, 224))
    w = b.weight((64, 3, 7, 7))
    y = b.conv2d(x, w, strides=(2, 2), padding="SAME", activation="relu")
    b.output(y)
    graph, params = b.build(capacity=1024)

Every node's shape comes from the op's shape rule when it is added, so inconsistent shapes fail
at once with a `ShapeError` naming the node, op and shapes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Sequence

import numpy as np

from xrlflow_jax import ops
from xrlflow_jax.errors import CapacityError, ShapeError, UnknownOpError
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.ops import MAX_RANK, Activation, DType, Op
from xrlflow_jax.ops.tensor import PAD_MODES


@dataclasses.dataclass(frozen=True)
class Tensor:
  """A node's output while building: its builder index, shape and dtype."""
  index: int
  shape: tuple[int, ...]
  dtype: DType
  is_constant: bool

  @property
  def rank(self) -> int:
    return len(self.shape)


@dataclasses.dataclass
class _Node:
  op: Op
  inputs: list[int]
  attrs: np.ndarray
  shape: tuple[int, ...]
  dtype: DType
  is_constant: bool
  name: str
  param_id: int = -1
  input_index: int = -1


_ACTIVATIONS = {"none": Activation.NONE, None: Activation.NONE, "relu": Activation.RELU,
                "sigmoid": Activation.SIGMOID, "tanh": Activation.TANH, "gelu": Activation.GELU}


def _activation(value: Any) -> int:
  if isinstance(value, (int, np.integer)):
    return int(Activation(int(value)))
  try:
    return int(_ACTIVATIONS[value])
  except KeyError:
    raise ShapeError(f"unknown activation {value!r}; use one of none/relu/sigmoid/tanh/gelu") from None


def axes_bits(axes: Iterable[int]) -> int:
  """The bitmask attribute (`axes`) of a set of axes: bit a set for each axis a."""
  out = 0
  for a in axes:
    out |= 1 << int(a)
  return out


class GraphBuilder:
  """Builds a graph node by node, checking shapes as it goes.

  Args:
    seed: seed of the random weights `weight()` creates.
    max_inputs: K of the graph to build; Concat with more inputs is split into a chain.
    name: model name used in error messages.
  """

  def __init__(self, seed: int = 0, max_inputs: int = layout.DEFAULT_MAX_INPUTS,
               name: str = "model"):
    self._nodes: list[_Node] = []
    self._outputs: list[int] = []
    self._num_inputs = 0
    self.params = ParamStore()
    self.max_inputs = max_inputs
    self.name = name
    self._rng = np.random.default_rng(seed)

  # ------------------------------------------------------------------ core
  def __len__(self) -> int:
    return len(self._nodes)

  def _tensor(self, index: int) -> Tensor:
    node = self._nodes[index]
    return Tensor(index, node.shape, node.dtype, node.is_constant)

  def producer(self, t: Tensor) -> tuple[Op, list[Tensor], dict[str, Any]]:
    """(op, input tensors, decoded attributes) of the node that makes `t`."""
    node = self._nodes[t.index]
    return (node.op, [self._tensor(i) for i in node.inputs],
            ops.get(node.op).decode_attrs(node.attrs))

  def remake(self, t: Tensor, inputs: Sequence[Tensor] | None = None, **attrs: Any) -> Tensor:
    """A new node like the one that makes `t` (op, name, inputs, attributes) with `inputs`
    and `attrs` replaced; `t`'s node stays, dead unless something else reads it."""
    op, old_inputs, old_attrs = self.producer(t)
    return self.node(op, list(old_inputs if inputs is None else inputs),
                     name=self._nodes[t.index].name, **{**old_attrs, **attrs})

  def _where(self, op: str, name: str) -> str:
    return f"{self.name}: node {len(self._nodes)} '{name}' ({op}): "

  def node(self, op: Op | str, inputs: Sequence[Tensor], *, name: str | None = None,
          **attrs: Any) -> Tensor:
    """Adds a node of any op with named attributes; returns its output tensor."""
    spec = ops.get(op)
    name = name or f"{spec.name.lower()}_{len(self._nodes)}"
    where = self._where(spec.name, name)
    if spec.source:
      raise ShapeError(f"{where}use input() or weight() to add {spec.name} nodes")
    for t in inputs:
      if not isinstance(t, Tensor) or not 0 <= t.index < len(self._nodes):
        raise ShapeError(f"{where}input {t!r} is not a tensor of this builder")
    if len(inputs) > self.max_inputs:
      raise CapacityError(f"{where}{len(inputs)} inputs exceed the {self.max_inputs} input slots "
                          "per node (raise max_inputs)")
    try:
      vec = spec.encode_attrs(**attrs)
    except UnknownOpError as e:
      raise ShapeError(f"{where}{e}") from None
    k = max(len(inputs), 3)
    in_shapes = np.ones([k, MAX_RANK], np.int32)
    in_ranks = np.zeros([k], np.int32)
    for i, t in enumerate(inputs):
      in_shapes[i], in_ranks[i] = ops.pad_shape(t.shape)
    self._check_dtypes(spec, inputs, where)
    shape, rank = ops.infer_shape(spec.code, in_shapes, in_ranks, vec, len(inputs), where=where)
    dtype = DType(ops.infer_dtype(spec.code, [int(t.dtype) for t in inputs], vec))
    is_constant = bool(inputs) and all(t.is_constant for t in inputs)
    self._nodes.append(_Node(Op(spec.code), [t.index for t in inputs], vec,
                             ops.unpad_shape(shape, rank), dtype, is_constant, name))
    return self._tensor(len(self._nodes) - 1)

  def _check_dtypes(self, spec: ops.OpSpec, inputs: Sequence[Tensor], where: str) -> None:
    same = {Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.POW, Op.MAX, Op.MIN, Op.MATMUL, Op.CONCAT,
            Op.CONV2D}
    if spec.code in same and len({t.dtype for t in inputs}) > 1:
      names = ", ".join(DType(t.dtype).name.lower() for t in inputs)
      raise ShapeError(f"{where}inputs have different dtypes ({names})")
    if spec.code == Op.WHERE and inputs[0].dtype != DType.BOOL:
      raise ShapeError(f"{where}the condition must be bool")
    if spec.code == Op.WHERE and inputs[1].dtype != inputs[2].dtype:
      raise ShapeError(f"{where}both branches must have one dtype ({DType(inputs[1].dtype).name} "
                       f"vs {DType(inputs[2].dtype).name})")
    float_only = {Op.SIGMOID, Op.TANH, Op.GELU, Op.ERF, Op.EXP, Op.LOG, Op.SQRT, Op.SOFTMAX,
                  Op.LAYER_NORM, Op.BATCH_NORM, Op.HARD_SIGMOID, Op.HARD_SWISH, Op.RECIPROCAL}
    floats = (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16, DType.FLOAT64)
    if spec.code in float_only and any(t.dtype not in floats for t in inputs):
      raise ShapeError(f"{where}needs floating-point inputs, got "
                       f"{[DType(t.dtype).name.lower() for t in inputs]}")
    if spec.code in (Op.BATCH_NORM, Op.LAYER_NORM) and len({t.dtype for t in inputs}) > 1:
      raise ShapeError(f"{where}input and parameters must share one dtype")
    if spec.code == Op.GATHER and inputs[1].dtype not in (DType.INT32, DType.INT64):
      raise ShapeError(f"{where}indices must be int32 or int64")

  def input(self, shape: Sequence[int], dtype: Any = "float32", name: str | None = None) -> Tensor:
    """Adds a graph input (positional in the order of calls)."""
    dt = ops.dtype_code(dtype) if not isinstance(dtype, DType) else dtype
    name = name or f"input_{self._num_inputs}"
    self._check_shape(shape, "Input", name)
    self._nodes.append(_Node(Op.INPUT, [], np.zeros([ops.ATTR_WIDTH], np.int32),
                             tuple(int(s) for s in shape), dt, False, name,
                             input_index=self._num_inputs))
    self._num_inputs += 1
    return self._tensor(len(self._nodes) - 1)

  def constant(self, value: Any, name: str | None = None, dtype: Any = None) -> Tensor:
    """Adds a Constant node holding `value` (stored in the ParamStore)."""
    value = np.asarray(value) if dtype is None else np.asarray(value, dtype=dtype)
    if value.dtype == np.float64:
      value = value.astype(np.float32)
    name = name or f"const_{len(self._nodes)}"
    self._check_shape(value.shape, "Constant", name)
    pid = self.params.add(value, name)
    self._nodes.append(_Node(Op.CONSTANT, [], np.zeros([ops.ATTR_WIDTH], np.int32),
                             tuple(value.shape), ops.dtype_code(value.dtype), True, name,
                             param_id=pid))
    return self._tensor(len(self._nodes) - 1)

  def weight(self, shape: Sequence[int], name: str | None = None, *, fan_in: int | None = None,
             init: str = "normal", dtype: Any = "float32") -> Tensor:
    """Adds a random weight.

    init: "normal" (normal / sqrt(fan_in)), "bias" (0.1 * normal), "scale" (1 + 0.1 * normal),
    "ones" or "zeros". Random biases and scales (not 0 and 1) keep numerical checks sharp.
    """
    shape = tuple(int(s) for s in shape)
    if init == "ones":
      value = np.ones(shape, dtype)
    elif init == "zeros":
      value = np.zeros(shape, dtype)
    elif init == "bias":
      value = (0.1 * self._rng.standard_normal(shape)).astype(dtype)
    elif init == "scale":
      value = (1.0 + 0.1 * self._rng.standard_normal(shape)).astype(dtype)
    else:
      fan = fan_in or (int(np.prod(shape[1:])) if len(shape) > 1 else 1)
      value = (self._rng.standard_normal(shape) / math.sqrt(max(fan, 1))).astype(dtype)
    return self.constant(value, name or f"weight_{len(self._nodes)}")

  def _check_shape(self, shape: Sequence[int], op: str, name: str) -> None:
    if len(shape) > MAX_RANK or any(int(s) < 1 for s in shape):
      raise ShapeError(f"{self._where(op, name)}shape {tuple(shape)} must have rank <= "
                       f"{MAX_RANK} and every dim >= 1")

  def output(self, *tensors: Tensor) -> None:
    """Marks tensors as graph outputs, in order."""
    for t in tensors:
      if t.index in self._outputs:
        raise ShapeError(f"{self.name}: node {t.index} '{self._nodes[t.index].name}' is already "
                         "an output")
      self._outputs.append(t.index)

  @property
  def node_names(self) -> list[str]:
    return [n.name for n in self._nodes]

  def build(self, capacity: int | None = None) -> tuple[layout.Graph, ParamStore]:
    """Returns the padded graph (capacity N node slots; default DEFAULT_CAPACITY) and params."""
    n_needed = len(self._nodes)
    cap = layout.DEFAULT_CAPACITY if capacity is None else int(capacity)
    if n_needed > cap:
      raise CapacityError(f"{self.name}: the graph needs {n_needed} node slots but the capacity "
                          f"is {cap}; build with capacity >= {n_needed}")
    if not self._outputs:
      raise ShapeError(f"{self.name}: the graph has no outputs; call output()")
    arrays = layout.empty_arrays(cap, self.max_inputs)
    for i, node in enumerate(self._nodes):
      arrays["op"][i] = int(node.op)
      arrays["attrs"][i] = node.attrs
      arrays["shape"][i], arrays["rank"][i] = ops.pad_shape(node.shape)
      arrays["dtype"][i] = int(node.dtype)
      arrays["is_constant"][i] = node.is_constant
      arrays["input_index"][i] = node.input_index
      arrays["param_id"][i] = node.param_id
      arrays["alive"][i] = True
      arrays["inputs"][i, :len(node.inputs)] = node.inputs
      arrays["level"][i] = layout.LEVEL_GAP + max((arrays["level"][u] for u in node.inputs),
                                                  default=-layout.LEVEL_GAP)
    for pos, idx in enumerate(self._outputs):
      arrays["is_output"][idx] = True
      arrays["output_index"][idx] = pos
    return layout.from_arrays(arrays), self.params

  # ------------------------------------------------------------------ op helpers
  def conv2d(self, x: Tensor, w: Tensor, b: Tensor | None = None, *,
             strides: Sequence[int] = (1, 1), padding: Any = "SAME",
             dilations: Sequence[int] = (1, 1), groups: int = 1, activation: Any = "none",
             name: str | None = None) -> Tensor:
    """NCHW convolution; padding is "SAME", "VALID", an int or (top, left, bottom, right)."""
    kh, kw = w.shape[2], w.shape[3]
    if isinstance(padding, str):
      if padding.upper() == "VALID":
        pads = (0, 0, 0, 0)
      elif padding.upper() == "SAME":
        pads = _same_pads(x.shape[2:], (kh, kw), strides, dilations)
      else:
        raise ShapeError(f"unknown padding {padding!r}")
    elif isinstance(padding, int):
      pads = (padding,) * 4
    else:
      pads = tuple(padding)
    inputs = [x, w] + ([b] if b is not None else [])
    return self.node(Op.CONV2D, inputs, name=name, strides=tuple(strides), pads=pads,
                    dilations=tuple(dilations), groups=groups, activation=_activation(activation))

  def matmul(self, a: Tensor, b: Tensor, activation: Any = "none",
             name: str | None = None) -> Tensor:
    return self.node(Op.MATMUL, [a, b], name=name, activation=_activation(activation))

  def dense(self, x: Tensor, units: int, *, bias: bool = True, activation: Any = "none",
            name: str | None = None) -> Tensor:
    """x @ W (+ b) (activation): a weight [in, units] and bias [units] are created."""
    w = self.weight((x.shape[-1], units), fan_in=x.shape[-1])
    if not bias:
      return self.matmul(x, w, activation=activation, name=name)
    y = self.matmul(x, w)
    y = self.node(Op.ADD, [y, self.weight((units,), init="bias")])
    return self._act(y, activation)

  def _act(self, x: Tensor, activation: Any) -> Tensor:
    act = Activation(_activation(activation))
    return {Activation.NONE: lambda: x, Activation.RELU: lambda: self.relu(x),
            Activation.SIGMOID: lambda: self.sigmoid(x), Activation.TANH: lambda: self.tanh(x),
            Activation.GELU: lambda: self.gelu(x)}[act]()

  def _binary(op):  # pylint: disable=no-self-argument
    def method(self, a: Tensor, b: Tensor, name: str | None = None) -> Tensor:
      return self.node(op, [a, b], name=name)
    method.__doc__ = f"Elementwise {op.name.lower()} with numpy broadcasting."
    return method

  def _unary(op):  # pylint: disable=no-self-argument
    def method(self, x: Tensor, name: str | None = None, **attrs: Any) -> Tensor:
      return self.node(op, [x], name=name, **attrs)
    method.__doc__ = f"Elementwise {op.name.lower()}."
    return method

  add = _binary(Op.ADD)
  sub = _binary(Op.SUB)
  mul = _binary(Op.MUL)
  div = _binary(Op.DIV)
  pow = _binary(Op.POW)
  maximum = _binary(Op.MAX)
  minimum = _binary(Op.MIN)
  relu = _unary(Op.RELU)
  sigmoid = _unary(Op.SIGMOID)
  tanh = _unary(Op.TANH)
  gelu = _unary(Op.GELU)
  erf = _unary(Op.ERF)
  exp = _unary(Op.EXP)
  log = _unary(Op.LOG)
  sqrt = _unary(Op.SQRT)
  neg = _unary(Op.NEG)
  reciprocal = _unary(Op.RECIPROCAL)
  clip = _unary(Op.CLIP)
  hard_sigmoid = _unary(Op.HARD_SIGMOID)
  hard_swish = _unary(Op.HARD_SWISH)

  def cast(self, x: Tensor, dtype: Any, name: str | None = None) -> Tensor:
    return self.node(Op.CAST, [x], name=name, to=int(ops.dtype_code(dtype)))

  def where(self, cond: Tensor, a: Tensor, b: Tensor, name: str | None = None) -> Tensor:
    return self.node(Op.WHERE, [cond, a, b], name=name)

  def softmax(self, x: Tensor, axis: int = -1, name: str | None = None) -> Tensor:
    return self.node(Op.SOFTMAX, [x], name=name, axis=axis % x.rank)

  def layer_norm(self, x: Tensor, scale: Tensor | None = None, bias: Tensor | None = None, *,
                 axis: int = -1, epsilon: float = 1e-5, name: str | None = None) -> Tensor:
    """LayerNorm over the dims from `axis` on; scale/bias default to new random weights."""
    axis = axis % x.rank
    norm_shape = x.shape[axis:]
    scale = scale if scale is not None else self.weight(norm_shape, init="scale")
    bias = bias if bias is not None else self.weight(norm_shape, init="bias")
    return self.node(Op.LAYER_NORM, [x, scale, bias], name=name, axis=axis, epsilon=epsilon)

  def batch_norm(self, x: Tensor, *, epsilon: float = 1e-5, name: str | None = None) -> Tensor:
    """Inference batch norm with new random statistics (variance positive)."""
    c = x.shape[1]
    scale = self.constant(self._rng.uniform(0.5, 1.5, c).astype(np.float32))
    bias = self.constant(self._rng.uniform(-0.1, 0.1, c).astype(np.float32))
    mean = self.constant(self._rng.uniform(-0.1, 0.1, c).astype(np.float32))
    var = self.constant(self._rng.uniform(0.5, 1.5, c).astype(np.float32))
    return self.node(Op.BATCH_NORM, [x, scale, bias, mean, var], name=name, epsilon=epsilon)

  def max_pool(self, x: Tensor, kernel: Sequence[int], strides: Sequence[int] | None = None,
               padding: Any = "VALID", *, ceil_mode: bool = False,
               name: str | None = None) -> Tensor:
    return self._pool(Op.MAX_POOL, x, kernel, strides, padding, ceil_mode, False, name)

  def avg_pool(self, x: Tensor, kernel: Sequence[int], strides: Sequence[int] | None = None,
               padding: Any = "VALID", *, ceil_mode: bool = False,
               count_include_pad: bool = False, name: str | None = None) -> Tensor:
    return self._pool(Op.AVG_POOL, x, kernel, strides, padding, ceil_mode, count_include_pad,
                      name)

  def _pool(self, op, x, kernel, strides, padding, ceil_mode, count_include_pad, name):
    strides = tuple(strides or kernel)
    if isinstance(padding, str):
      pads = (0, 0, 0, 0) if padding.upper() == "VALID" else _same_pads(
          x.shape[2:], kernel, strides, (1, 1))
    elif isinstance(padding, int):
      pads = (padding,) * 4
    else:
      pads = tuple(padding)
    return self.node(op, [x], name=name, kernel=tuple(kernel), strides=strides, pads=pads,
                    ceil_mode=ceil_mode, count_include_pad=count_include_pad)

  def global_avg_pool(self, x: Tensor, name: str | None = None) -> Tensor:
    return self.node(Op.GLOBAL_AVG_POOL, [x], name=name)

  def reduce_mean(self, x: Tensor, axes: Sequence[int], keepdims: bool = True,
                  name: str | None = None) -> Tensor:
    return self.node(Op.REDUCE_MEAN, [x], name=name, axes=axes_bits(a % x.rank for a in axes),
                    keepdims=keepdims)

  def reduce_sum(self, x: Tensor, axes: Sequence[int], keepdims: bool = True,
                 name: str | None = None) -> Tensor:
    return self.node(Op.REDUCE_SUM, [x], name=name, axes=axes_bits(a % x.rank for a in axes),
                    keepdims=keepdims)

  def concat(self, xs: Sequence[Tensor], axis: int, name: str | None = None) -> Tensor:
    """Concatenation; more inputs than input slots become a chain of concats."""
    xs = list(xs)
    axis = axis % xs[0].rank
    while len(xs) > self.max_inputs:
      head = self.node(Op.CONCAT, xs[:self.max_inputs], axis=axis)
      xs = [head] + xs[self.max_inputs:]
    return self.node(Op.CONCAT, xs, name=name, axis=axis)

  def slice(self, x: Tensor, axis: int, start: int, end: int, step: int = 1,
            name: str | None = None) -> Tensor:
    """x[start:end:step] along one axis (ONNX-style negative / out-of-range indices clamped)."""
    axis = axis % x.rank
    size = x.shape[axis]
    start = min(max(start + size if start < 0 else start, 0), size)
    end = min(max(end + size if end < 0 else end, 0), size)
    return self.node(Op.SLICE, [x], name=name, axis=axis, start=start, end=max(end, start),
                    step=step)

  def split(self, x: Tensor, axis: int, sizes: Sequence[int]) -> list[Tensor]:
    """Splits along `axis` into pieces of `sizes` (as Slice nodes)."""
    axis = axis % x.rank
    if sum(sizes) != x.shape[axis]:
      raise ShapeError(f"{self.name}: split sizes {list(sizes)} do not sum to dim {axis} of "
                       f"{list(x.shape)}")
    out, start = [], 0
    for s in sizes:
      out.append(self.slice(x, axis, start, start + s))
      start += s
    return out

  def reshape(self, x: Tensor, shape: Sequence[int], name: str | None = None) -> Tensor:
    """Reshape; one -1 is resolved, 0 copies the input dim (ONNX semantics)."""
    shape = [x.shape[i] if s == 0 else int(s) for i, s in enumerate(shape)]
    total = int(np.prod(x.shape))
    if shape.count(-1) > 1:
      raise ShapeError(f"{self.name}: reshape to {shape}: at most one -1")
    if -1 in shape:
      known = int(np.prod([s for s in shape if s != -1]))
      if known == 0 or total % known:
        raise ShapeError(f"{self.name}: cannot reshape {list(x.shape)} to {shape}")
      shape[shape.index(-1)] = total // known
    padded, rank = ops.pad_shape(shape)
    return self.node(Op.RESHAPE, [x], name=name, shape=tuple(padded), rank=rank)

  def transpose(self, x: Tensor, perm: Sequence[int], name: str | None = None) -> Tensor:
    perm = [int(p) % x.rank for p in perm]
    return self.node(Op.TRANSPOSE, [x], name=name,
                    perm=tuple(perm) + (0,) * (MAX_RANK - len(perm)))

  def squeeze(self, x: Tensor, axes: Sequence[int], name: str | None = None) -> Tensor:
    return self.node(Op.SQUEEZE, [x], name=name, axes=axes_bits(a % x.rank for a in axes))

  def unsqueeze(self, x: Tensor, axes: Sequence[int], name: str | None = None) -> Tensor:
    out_rank = x.rank + len(axes)
    return self.node(Op.UNSQUEEZE, [x], name=name, axes=axes_bits(a % out_rank for a in axes))

  def gather(self, data: Tensor, indices: Tensor, axis: int = 0,
             name: str | None = None) -> Tensor:
    return self.node(Op.GATHER, [data, indices], name=name, axis=axis % data.rank)

  def pad(self, x: Tensor, pads: Sequence[tuple[int, int]], mode: str = "constant",
          value: float = 0.0, name: str | None = None) -> Tensor:
    """pads: one (begin, end) pair per axis."""
    flat = [0] * (2 * MAX_RANK)
    for i, (b, e) in enumerate(pads):
      flat[i], flat[MAX_RANK + i] = int(b), int(e)
    if mode not in PAD_MODES:
      raise ShapeError(f"{self.name}: unknown pad mode {mode!r}; use one of {PAD_MODES}")
    return self.node(Op.PAD, [x], name=name, pads=tuple(flat), mode=PAD_MODES.index(mode),
                    value=value)

  def enlarge(self, w: Tensor, kernel: Sequence[int], name: str | None = None) -> Tensor:
    return self.node(Op.ENLARGE, [w], name=name, kernel=tuple(kernel))

  def merge_gconv(self, w: Tensor, groups: int, count: int, name: str | None = None) -> Tensor:
    return self.node(Op.MERGE_GCONV, [w], name=name, groups=groups, count=count)


def _same_pads(spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
               dilations: Sequence[int]) -> tuple[int, int, int, int]:
  """TensorFlow/TASO SAME padding (extra padding at the end): (top, left, bottom, right)."""
  out = []
  for size, k, s, d in zip(spatial, kernel, strides, dilations):
    eff = (k - 1) * d + 1
    o = -(-size // s)
    total = max((o - 1) * s + eff - size, 0)
    out.append((total // 2, total - total // 2))
  (t, b), (l, r) = out
  return (t, l, b, r)
