"""A JAX function as a padded graph: `trace(fn, *example_args)` -> (graph, params, Signature).

The function is traced to a jaxpr (`jax.make_jaxpr`) at the example arguments' shapes and
dtypes; every array leaf of the arguments becomes a graph input (in `jax.tree_util` order) and
every output leaf a graph output. Arrays the function closes over (a Flax model's variables
bound with `functools.partial(model.apply, variables)`) become the graph's weights: constants
the searches may fold and merge. Arrays passed as arguments stay inputs, read at run time.

Primitives become project ops: dot_general -> MatMul (with the transposes and reshapes a
general contraction needs), conv_general_dilated -> Conv2D (NCHW/OIHW or NHWC/HWIO, as Flax
writes it), reduce_window_max/_sum -> pools, elementwise maths, comparisons and selects,
reductions, reshapes, transposes, broadcasts, slices, concatenations, casts; calls (jit,
custom_jvp_call, custom_vjp_call, remat) are inlined. An equation whose inputs are all
constants is evaluated here, once (weight pre-processing). Anything else is refused with a
`JaxImportError` naming the primitive, its shapes and the line of the function it comes from.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax.extend import core as jax_core
import numpy as np

from xrlflow_jax import ops
from xrlflow_jax.errors import XrlflowError
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.builder import GraphBuilder, Tensor, axes_bits
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.ops import Layout, Op


class JaxImportError(XrlflowError):
  """A JAX function the graph cannot express: the message names the primitive, its operand
  shapes and where in the function it comes from."""


@dataclasses.dataclass(frozen=True)
class Signature:
  """How the graph's inputs and outputs map to the function's arguments and results.

  Attributes:
    in_tree, out_tree: the pytree structures of the arguments (a tuple) and of the result.
    in_avals: shape and dtype of each input leaf, in graph input order.
  """
  in_tree: Any
  out_tree: Any
  in_avals: tuple[jax.ShapeDtypeStruct, ...]


_UNARY = {"exp": Op.EXP, "log": Op.LOG, "tanh": Op.TANH, "logistic": Op.SIGMOID,
          "sqrt": Op.SQRT, "neg": Op.NEG, "abs": Op.ABS, "sign": Op.SIGN, "floor": Op.FLOOR,
          "ceil": Op.CEIL, "round": Op.ROUND, "erf": Op.ERF, "not": Op.NOT,
          "is_finite": None}
_BINARY = {"add": Op.ADD, "sub": Op.SUB, "mul": Op.MUL, "div": Op.DIV, "pow": Op.POW,
           "max": Op.MAX, "min": Op.MIN, "rem": Op.MOD, "and": Op.AND, "or": Op.OR,
           "xor": Op.XOR, "eq": Op.EQUAL, "lt": Op.LESS, "gt": Op.GREATER,
           "le": Op.LESS_OR_EQUAL, "ge": Op.GREATER_OR_EQUAL}
_REDUCE = {"reduce_sum": Op.REDUCE_SUM, "reduce_max": Op.REDUCE_MAX,
           "reduce_min": Op.REDUCE_MIN, "reduce_prod": Op.REDUCE_PROD}
_IDENTITY = ("stop_gradient", "copy", "copy_p", "optimization_barrier")
_CALLS = ("jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
          "custom_vjp_call_jaxpr", "remat", "checkpoint", "custom_lin")
_NCHW_SPECS = ((0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2, 3))
_NHWC_SPECS = ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))


def trace(fn: Callable[..., Any], *example_args: Any, capacity: int | None = None,
          name: str = "jax function") -> tuple[layout.Graph, ParamStore, Signature]:
  """The graph of `fn` at `example_args`' shapes (see the module docstring).

  Args:
    fn: a JAX-traceable function of arrays (pytrees of arrays).
    example_args: arguments of the shapes and dtypes the graph is built for.
    capacity: node slots (None: the default capacity, doubled until the nodes fit).
    name: how messages name the function.
  Raises:
    JaxImportError: a primitive, dtype or shape the graph cannot express.
  """
  leaves, in_tree = jax.tree_util.tree_flatten(example_args)
  avals = tuple(jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x)) for x in leaves)

  def flat(*xs):
    return fn(*jax.tree_util.tree_unflatten(in_tree, xs))

  try:
    closed, out_shape = jax.make_jaxpr(flat, return_shape=True)(*avals)
  except Exception as e:  # pylint: disable=broad-except  (the function's own error)
    raise JaxImportError(f"{name}: tracing failed: {type(e).__name__}: "
                         f"{str(e).splitlines()[0][:300]}") from None
  out_tree = jax.tree_util.tree_structure(out_shape)
  b = GraphBuilder(seed=0)
  env: dict[Any, Any] = {}
  for i, (v, aval) in enumerate(zip(closed.jaxpr.invars, avals)):
    env[v] = b.input(aval.shape, _dtype(aval.dtype, name), name=f"arg{i}")
  _Tracer(b, name).run(closed.jaxpr, closed.consts, env)
  outs = [_read(env, v) for v in closed.jaxpr.outvars]
  for i, out in enumerate(outs):
    if not isinstance(out, Tensor):  # a constant output: a graph output needs a node
      out = b.constant(np.asarray(out), name=f"output{i}")
    b.output(out)
  cap = capacity or layout.DEFAULT_CAPACITY
  while cap < len(b):
    cap *= 2
  graph, params = b.build(capacity=cap)
  return layout.to_host(graph), params, Signature(in_tree, out_tree, avals)


def _dtype(dtype: Any, name: str) -> str:
  dt = np.dtype(dtype)
  if dt == np.float64:
    return "float32"
  try:
    ops.dtype_code(dt)
  except Exception:  # pylint: disable=broad-except
    raise JaxImportError(f"{name}: dtype {dt} has no graph dtype") from None
  return dt.name


def _is_zero(x: Any) -> bool:
  """A constant of zeros (what jax.nn.relu takes the max with)."""
  return not isinstance(x, Tensor) and not np.asarray(x).any()


def _read(env: dict[Any, Any], v: Any) -> Any:
  if isinstance(v, jax_core.Literal):
    return np.asarray(v.val)
  return env[v]


class _Tracer:
  """Walks a jaxpr, building nodes; values are Tensors or numpy arrays (constants)."""

  def __init__(self, b: GraphBuilder, name: str):
    self.b = b
    self.name = name

  def run(self, jaxpr: Any, consts: Sequence[Any], env: dict[Any, Any]) -> None:
    for v, c in zip(jaxpr.constvars, consts):
      env[v] = np.asarray(c)
    for eqn in jaxpr.eqns:
      args = [_read(env, v) for v in eqn.invars]
      outs = self.eqn(eqn, args)
      for v, out in zip(eqn.outvars, outs):
        env[v] = out

  def tensor(self, x: Any) -> Tensor:
    if isinstance(x, Tensor):
      return x
    x = np.asarray(x)
    if x.dtype == np.float64:
      x = x.astype(np.float32)
    return self.b.constant(x)

  def operand(self, x: Any) -> Tensor:
    """`tensor` for an operand of an op that broadcasts (elementwise): a constant broadcast
    along some axes (a bias spread over a feature map) is kept with those axes of size 1."""
    if isinstance(x, Tensor):
      return x
    x = np.asarray(x)
    for axis in range(x.ndim):
      if x.shape[axis] > 1 and (x == x.take([0], axis=axis)).all():
        x = x.take([0], axis=axis)
    return self.tensor(x)

  def error(self, eqn: Any, why: str) -> JaxImportError:
    shapes = ", ".join(f"{v.aval.dtype}{list(v.aval.shape)}" for v in eqn.invars
                       if hasattr(v, "aval"))
    where = ""
    try:  # the line of the user's code that made the equation (best effort: a private API)
      from jax._src import source_info_util  # pylint: disable=g-import-not-at-top
      line = source_info_util.summarize(eqn.source_info)
      where = f" at {line}" if line else ""
    except Exception:  # pylint: disable=broad-except
      pass
    return JaxImportError(f"{self.name}: {eqn.primitive.name}({shapes}){where}: {why}")

  def eqn(self, eqn: Any, args: list[Any]) -> list[Any]:
    prim = eqn.primitive.name
    p = eqn.params
    if prim in _CALLS:
      sub = p.get("jaxpr") or p.get("call_jaxpr") or p.get("fun_jaxpr")
      inner = getattr(sub, "jaxpr", sub)
      consts = getattr(sub, "consts", ())
      env: dict[Any, Any] = dict(zip(inner.invars, args))
      self.run(inner, consts, env)
      return [_read(env, v) for v in inner.outvars]
    if all(not isinstance(a, Tensor) for a in args):  # weights only: evaluated once, here
      try:
        outs = eqn.primitive.bind(*[jnp.asarray(a) for a in args], **p)
      except Exception as e:  # pylint: disable=broad-except
        raise self.error(eqn, f"cannot evaluate on constants: {e}") from None
      outs = outs if eqn.primitive.multiple_results else [outs]
      return [np.asarray(o) for o in outs]
    out_aval = eqn.outvars[0].aval
    b = self.b
    if prim in _IDENTITY:
      return args
    if prim in _UNARY and _UNARY[prim] is not None:
      return [b.node(_UNARY[prim], [self.tensor(args[0])])]
    if prim in _BINARY:
      if prim == "max" and any(_is_zero(a) for a in args):  # jax.nn.relu
        (x,) = [a for a in args if not _is_zero(a)] or [args[0]]
        return [b.node(Op.RELU, [self.tensor(x)])]
      x, y = (self.operand(a) for a in args)
      return [b.node(_BINARY[prim], [x, y])]
    if prim == "rsqrt":
      return [b.node(Op.RECIPROCAL, [b.node(Op.SQRT, [self.tensor(args[0])])])]
    if prim == "square":
      x = self.tensor(args[0])
      return [b.node(Op.MUL, [x, x])]
    if prim == "integer_pow":
      x = self.tensor(args[0])
      n = int(p["y"])
      if n == 2:
        return [b.node(Op.MUL, [x, x])]
      if n == 3:
        return [b.node(Op.MUL, [b.node(Op.MUL, [x, x]), x])]
      return [b.node(Op.POW, [x, self.tensor(np.asarray(n, np.dtype(out_aval.dtype)))])]
    if prim == "convert_element_type":
      x = self.tensor(args[0])
      to = _dtype(p["new_dtype"], self.name)
      if ops.dtype_code(to) == x.dtype:
        return [x]
      return [b.cast(x, to)]
    if prim == "select_n":
      if len(args) != 3:
        raise self.error(eqn, "only a select between two cases is supported")
      pred, no, yes = (self.operand(a) for a in args)
      if pred.dtype != ops.dtype_code("bool"):
        pred = b.cast(pred, "bool")
      return [b.where(pred, yes, no)]
    if prim in _REDUCE:
      x = self.tensor(args[0])
      axes = tuple(int(a) for a in p["axes"])
      if not axes:
        return [x]
      return [b.node(_REDUCE[prim], [x], axes=axes_bits(axes), keepdims=False)]
    if prim in ("argmax", "argmin"):
      x = self.tensor(args[0])
      (axis,) = p["axes"]
      out = b.node(Op.ARG_MAX if prim == "argmax" else Op.ARG_MIN, [x],
                   axes=axes_bits([int(axis)]), keepdims=False)
      to = _dtype(p["index_dtype"], self.name)
      return [out if ops.dtype_code(to) == out.dtype else b.cast(out, to)]
    if prim == "reshape":
      if p.get("dimensions") not in (None, ()):
        raise self.error(eqn, "reshape with dimensions (a transpose first) is not supported")
      return [self.reshape(self.tensor(args[0]), tuple(p["new_sizes"]))]
    if prim == "squeeze":
      x = self.tensor(args[0])
      return [self.reshape(x, tuple(out_aval.shape))]
    if prim == "expand_dims":
      return [self.reshape(self.tensor(args[0]), tuple(out_aval.shape))]
    if prim == "transpose":
      return [self.transpose(self.tensor(args[0]), tuple(p["permutation"]))]
    if prim == "broadcast_in_dim":
      return [self.broadcast(self.tensor(args[0]), tuple(p["shape"]),
                             tuple(p["broadcast_dimensions"]))]
    if prim == "concatenate":
      return [b.concat([self.tensor(a) for a in args], int(p["dimension"]))]
    if prim == "slice":
      x = self.tensor(args[0])
      strides = p.get("strides") or (1,) * x.rank
      for axis, (lo, hi, st) in enumerate(zip(p["start_indices"], p["limit_indices"], strides)):
        if (lo, hi, st) != (0, x.shape[axis], 1):
          x = b.slice(x, axis, int(lo), int(hi), int(st))
      return [x]
    if prim == "pad":
      x, value = args
      if isinstance(value, Tensor):
        raise self.error(eqn, "a padding value computed at run time is not supported")
      config = p["padding_config"]
      if any(interior for _, _, interior in config) or any(lo < 0 or hi < 0
                                                           for lo, hi, _ in config):
        raise self.error(eqn, "interior or negative padding is not supported")
      return [b.pad(self.tensor(x), [(lo, hi) for lo, hi, _ in config],
                    value=float(np.asarray(value)))]
    if prim == "dot_general":
      return [self.dot_general(eqn, self.tensor(args[0]), self.tensor(args[1]))]
    if prim == "conv_general_dilated":
      return [self.conv(eqn, self.tensor(args[0]), self.tensor(args[1]))]
    if prim in ("reduce_window_max", "reduce_window_sum"):
      return [self.pool(eqn, self.tensor(args[0]))]
    if prim == "erf_inv" or prim == "is_finite":
      raise self.error(eqn, "no graph op computes it")
    raise self.error(eqn, "this primitive has no graph op")

  def reshape(self, x: Tensor, shape: tuple[int, ...]) -> Tensor:
    return x if tuple(x.shape) == tuple(shape) else self.b.reshape(x, shape)

  def transpose(self, x: Tensor, perm: tuple[int, ...]) -> Tensor:
    return x if tuple(perm) == tuple(range(len(perm))) else self.b.transpose(x, perm)

  def broadcast(self, x: Tensor, shape: tuple[int, ...], dims: tuple[int, ...]) -> Tensor:
    """x placed at `dims` of `shape` (a reshape to rank), then expanded where sizes differ."""
    aligned = [1] * len(shape)
    for d, n in zip(dims, x.shape):
      aligned[d] = n
    y = self.reshape(x, tuple(aligned))
    if tuple(aligned) == tuple(shape):
      return y
    return self.b.node(Op.EXPAND, [y], shape=(1,) * (ops.MAX_RANK - len(shape)) + tuple(shape),
                       rank=len(shape))

  def dot_general(self, eqn: Any, x: Tensor, y: Tensor) -> Tensor:
    """A general contraction as MatMul: [batch, free, contract] @ [batch, contract, free]."""
    (cx, cy), (bx, by) = eqn.params["dimension_numbers"]
    cx, cy, bx, by = (tuple(int(a) for a in t) for t in (cx, cy, bx, by))
    fx = tuple(a for a in range(x.rank) if a not in cx + bx)
    fy = tuple(a for a in range(y.rank) if a not in cy + by)
    out_shape = tuple(eqn.outvars[0].aval.shape)
    size = lambda t, axes: math.prod(t.shape[a] for a in axes)
    if not bx and cx == (x.rank - 1,) and cy == (0,) and y.rank >= 2:
      # x [..., K] @ y [K, ...]: y as [K, N] (a weight: folded), one MatMul.
      yk = self.reshape(y, (y.shape[0], size(y, fy)))
      z = self.b.matmul(x if x.rank >= 2 else self.reshape(x, (1, x.shape[0])), yk)
      return self.reshape(z, out_shape)
    xs = self.transpose(x, bx + fx + cx)
    ys = self.transpose(y, by + cy + fy)
    batch = tuple(x.shape[a] for a in bx)
    m, k, n = size(x, fx), size(x, cx), size(y, fy)
    lead = (math.prod(batch),) if batch else ()
    z = self.b.matmul(self.reshape(xs, lead + (m, k)), self.reshape(ys, lead + (k, n)))
    return self.reshape(z, out_shape)

  def conv(self, eqn: Any, x: Tensor, w: Tensor) -> Tensor:
    p = eqn.params
    dn = p["dimension_numbers"]
    specs = (tuple(dn.lhs_spec), tuple(dn.rhs_spec), tuple(dn.out_spec))
    if x.rank != 4:
      raise self.error(eqn, "only 2-D convolutions (rank-4 operands) are supported")
    if specs == _NCHW_SPECS:
      lay = Layout.NCHW
    elif specs == _NHWC_SPECS:
      lay = Layout.NHWC
    else:
      raise self.error(eqn, f"dimension numbers {specs} are neither NCHW/OIHW nor NHWC/HWIO")
    if tuple(p["lhs_dilation"]) != (1, 1) or int(p["batch_group_count"]) != 1:
      raise self.error(eqn, "input dilation and batch groups are not supported")
    pads = p["padding"]
    if isinstance(pads, str) or any(lo < 0 or hi < 0 for lo, hi in pads):
      raise self.error(eqn, "padding must be explicit and non-negative")
    (t, bt), (l, r) = pads
    return self.b.node(Op.CONV2D, [x, w], strides=tuple(p["window_strides"]),
                       pads=(int(t), int(l), int(bt), int(r)),
                       dilations=tuple(p["rhs_dilation"]),
                       groups=int(p["feature_group_count"]), layout=int(lay))

  def pool(self, eqn: Any, x: Tensor) -> Tensor:
    p = eqn.params
    window, strides = tuple(p["window_dimensions"]), tuple(p["window_strides"])
    pads = tuple(tuple(a) for a in p["padding"])
    if x.rank != 4 or any(d != 1 for d in tuple(p["base_dilation"]) + tuple(p["window_dilation"])):
      raise self.error(eqn, "only undilated 2-D pooling windows are supported")
    if window[0] == strides[0] == 1 and window[3] == strides[3] == 1 and \
        pads[0] == pads[3] == (0, 0):
      lay, hw = Layout.NHWC, (1, 2)
    elif window[:2] == strides[:2] == (1, 1) and pads[:2] == ((0, 0), (0, 0)):
      lay, hw = Layout.NCHW, (2, 3)
    else:
      raise self.error(eqn, "the window must span two spatial axes only")
    kernel = tuple(int(window[a]) for a in hw)
    attrs = dict(kernel=kernel, strides=tuple(int(strides[a]) for a in hw),
                 pads=(int(pads[hw[0]][0]), int(pads[hw[1]][0]), int(pads[hw[0]][1]),
                       int(pads[hw[1]][1])), layout=int(lay))
    if eqn.primitive.name == "reduce_window_max":
      return self.b.node(Op.MAX_POOL, [x], **attrs)
    mean = self.b.node(Op.AVG_POOL, [x], count_include_pad=True, **attrs)
    return self.b.node(Op.MUL, [mean, self.tensor(np.asarray(math.prod(kernel),
                                                             np.dtype(x.dtype.name.lower())))])
