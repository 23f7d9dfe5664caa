"""The executor: lowers a padded graph and its parameters to a jitted JAX function.

`lower(graph, params)` validates the graph, orders the nodes needed for the outputs on the host,
evaluates every node whose inputs are all constant once (weight pre-processing: concatenated or
enlarged kernels created by rewrites cost nothing at run time), and compiles the rest, a function
of the graph inputs, with `jax.jit`. Folded weights are passed to the compiled function as
arguments rather than baked into the program, so large models compile quickly.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from xrlflow_jax import ops
from xrlflow_jax.errors import ShapeError
from xrlflow_jax.graph import host, layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.ops import DType, Op
from xrlflow_jax.ops import precision as precision_lib


@dataclasses.dataclass(frozen=True)
class InputSpec:
  """A graph input: shape, dtype and, for integer indices, the exclusive upper bound of values."""
  name: str
  shape: tuple[int, ...]
  dtype: np.dtype
  index_bound: int | None = None


def _needed(g: layout.Graph, table: np.ndarray) -> np.ndarray:
  """bool[N]: nodes that some graph output depends on (graph inputs always included)."""
  nd = g.nodes
  need = nd["alive"] & (nd["is_output"] | (nd["input_index"] >= 0))
  stack = list(np.flatnonzero(need))
  while stack:
    v = stack.pop()
    for u in table[v]:
      if u >= 0 and not need[u]:
        need[u] = True
        stack.append(int(u))
  return need


def _attrs(g: layout.Graph, v: int) -> dict[str, Any]:
  return ops.get(int(g.nodes["op"][v])).decode_attrs(g.nodes["attrs"][v])


def _eval_node(g: layout.Graph, v: int, args: list[Any]) -> jax.Array:
  spec = ops.get(int(g.nodes["op"][v]))
  shape = ops.unpad_shape(g.nodes["shape"][v], g.nodes["rank"][v])
  dtype = jnp.dtype(ops.numpy_dtype(int(g.nodes["dtype"][v])))
  return spec.lower(args, _attrs(g, v), shape, dtype)


class LoweredGraph:
  """A graph as a callable: `lowered(*inputs) -> tuple of outputs` (positional, in order).

  Attributes:
    input_specs: one InputSpec per graph input, in order.
    num_outputs: number of graph outputs.
    consts: folded constant operands passed to the compiled function.
    apply: the pure function `apply(consts, *inputs)`, for composing under other transforms.
    compiled: `jax.jit(apply)`.
    precision: the numerics policy it was lowered with (`ops.precision`).
  """

  def __init__(self, apply: Callable[..., tuple[jax.Array, ...]], consts: tuple[jax.Array, ...],
               input_specs: list[InputSpec], num_outputs: int, *, jit: bool = True,
               precision: str = precision_lib.DEFAULT_POLICY):
    self.apply = apply
    self.precision = precision
    self.consts = consts
    self.input_specs = input_specs
    self.num_outputs = num_outputs
    self.compiled = jax.jit(apply) if jit else apply

  def check_inputs(self, inputs: Sequence[Any]) -> list[jax.Array]:
    """Converts inputs to the graph's dtypes; ShapeError names a wrong count or shape."""
    if len(inputs) != len(self.input_specs):
      raise ShapeError(f"the graph takes {len(self.input_specs)} inputs "
                       f"({', '.join(s.name for s in self.input_specs)}), got {len(inputs)}")
    out = []
    for x, s in zip(inputs, self.input_specs):
      shape = tuple(np.shape(x))
      if shape != s.shape:
        raise ShapeError(f"input {s.name} has shape {list(shape)}, the graph expects "
                         f"{list(s.shape)}")
      dtype = jax.dtypes.canonicalize_dtype(s.dtype)  # 64 -> 32 bits unless x64 is enabled
      if dtype != s.dtype and np.issubdtype(s.dtype, np.integer):
        info = np.iinfo(dtype)
        values = np.asarray(x)
        if values.size and (values.min() < info.min or values.max() > info.max):
          raise ShapeError(f"input {s.name} is {s.dtype} with values outside {dtype} "
                           f"[{values.min()}, {values.max()}]; enable jax_enable_x64 to run it")
      if dtype != s.dtype and np.issubdtype(s.dtype, np.floating):
        # Finite values beyond float32's range would become infinities: refused, not run.
        largest = float_overflow(np.asarray(x, s.dtype), dtype)
        if largest:
          raise ShapeError(f"input {s.name} is {s.dtype} with finite values beyond {dtype}'s "
                           f"range (largest magnitude {largest:.3g}); enable jax_enable_x64 "
                           "to run it")
      out.append(jnp.asarray(x, dtype=dtype))
    return out

  def __call__(self, *inputs: Any) -> tuple[jax.Array, ...]:
    return self.compiled(self.consts, *self.check_inputs(inputs))

  def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
    """Fixed random inputs: floats ~ N(0, 1), index inputs in [0, bound), bools uniform."""
    rng = np.random.default_rng(seed)
    out = []
    for s in self.input_specs:
      if np.issubdtype(s.dtype, np.floating):
        out.append(rng.standard_normal(s.shape).astype(s.dtype))
      elif s.dtype == np.bool_:
        out.append(rng.random(s.shape) < 0.5)
      else:
        out.append(rng.integers(0, s.index_bound or 10, s.shape).astype(s.dtype))
    return out


def input_signature(graph: layout.Graph) -> list[tuple[tuple[int, ...], str]]:
  """(shape, dtype name) of each graph input, in input order: what two graphs must agree on to
  run on the same inputs (host arrays only, no lowering)."""
  nd = layout.to_host(graph).nodes
  inputs = sorted((int(nd["input_index"][v]), int(v)) for v in
                  np.flatnonzero(nd["alive"] & (nd["op"] == int(Op.INPUT))))
  return [(tuple(int(d) for d in ops.unpad_shape(nd["shape"][v], nd["rank"][v])),
           np.dtype(jnp.dtype(ops.numpy_dtype(int(nd["dtype"][v])))).name) for _, v in inputs]


def input_mismatch(reference: layout.Graph, other: layout.Graph) -> str | None:
  """None when `other` takes the same inputs as `reference` (count, shapes, dtypes), else
  "<other's inputs> against <reference's inputs>" for an error message."""
  ref, its = input_signature(reference), input_signature(other)
  if ref == its:
    return None
  def text(signature):
    return ", ".join(f"{list(shape)} {dtype}" for shape, dtype in signature) or "no inputs"
  return f"{text(its)} against {text(ref)}"


def _index_bounds(g: layout.Graph, table: np.ndarray) -> dict[int, int]:
  """For Input nodes used as Gather indices: the size of the gathered axis (smallest use)."""
  nd = g.nodes
  bounds: dict[int, int] = {}
  for v in np.flatnonzero(nd["alive"] & (nd["op"] == int(Op.GATHER))):
    data, idx = int(table[v][0]), int(table[v][1])
    if nd["op"][idx] == int(Op.INPUT):
      axis = _attrs(g, v)["axis"]
      size = int(ops.unpad_shape(nd["shape"][data], nd["rank"][data])[axis])
      bounds[idx] = min(bounds.get(idx, size), size)
  return bounds


def float_overflow(value: Any, dtype: Any = np.float32) -> float:
  """The largest finite magnitude of float `value` when it exceeds `dtype`'s range (its cast
  would give infinities), else 0.0."""
  values = np.asarray(value)
  finite = np.abs(values[np.isfinite(values)])
  largest = float(finite.max()) if finite.size else 0.0
  return largest if largest > float(np.finfo(dtype).max) else 0.0


def integer_overflow(value: Any) -> str:
  """"" when `value` fits the dtype JAX computes it in; else why not (int64 values outside
  int32 while jax_enable_x64 is off would wrap)."""
  value = np.asarray(value)
  run = np.dtype(jax.dtypes.canonicalize_dtype(value.dtype))
  if run == value.dtype or not np.issubdtype(value.dtype, np.integer) or not value.size:
    return ""
  info = np.iinfo(run)
  lo, hi = int(value.min()), int(value.max())
  if lo >= info.min and hi <= info.max:
    return ""
  return (f"{value.dtype} values in [{lo}, {hi}] do not fit {run.name}, which JAX computes "
          f"{value.dtype.name} in without x64; enable jax_enable_x64 (JAX_ENABLE_X64=1)")


def _constant_operand(value: Any, node: int) -> jax.Array:
  """A Constant node's value as a JAX array; ShapeError when integers would wrap."""
  why = integer_overflow(value)
  if why:
    raise ShapeError(f"constant node {node} holds {why} to run this graph")
  return jnp.asarray(value)


def lower(graph: layout.Graph, params: ParamStore, *, jit: bool = True,
          input_names: Sequence[str] | None = None,
          precision: str | None = None) -> LoweredGraph:
  """Lowers `graph` with weights from `params` to a callable.

  Args:
    graph: a padded graph (validated here; errors are the project's own).
    params: values of the Constant nodes.
    jit: compile with `jax.jit` (True) or run op by op (False, for debugging).
    input_names: names for error messages (default input0, input1, ...).
    precision: the numerics policy of matmuls and convolutions, "highest" (default), "high"
      or "default" (`ops.precision`); folded constants and the compiled program both use it.
  Returns:
    LoweredGraph: call it with the inputs positionally (in input_index order); it returns a
    tuple of the outputs in output_index order.
  """
  policy = precision_lib.check(precision)
  with precision_lib.scope(policy):
    return _lower(layout.to_host(graph), params, jit, input_names, policy)


def _lower(g: layout.Graph, params: ParamStore, jit: bool, input_names: Sequence[str] | None,
           policy: str) -> LoweredGraph:
  host.validate(g, params)
  nd = g.nodes
  table = layout.input_table(g)
  order = [int(v) for v in host.topological_order(g)]
  need = _needed(g, table)
  order = [v for v in order if need[v]]
  bounds = _index_bounds(g, table)

  # Weight pre-processing: every distinct constant node is evaluated once, here. Constant nodes
  # that compute the same thing share one value and one operand (`host.constant_classes`):
  # otherwise the compiled program reads a copy per use, and a merge rewrite that concatenates
  # an unrolled RNN's shared weights at every step turns a cache-resident model into a
  # DRAM-bound one (measured: NasRNN 1.5x slower with a copy per step, 1.07x with one).
  canon = host.constant_classes(g, order)
  folded: dict[int, jax.Array] = {}
  for v in order:
    if not nd["is_constant"][v] or canon[v] != v:
      continue
    if nd["op"][v] == int(Op.CONSTANT):
      folded[v] = _constant_operand(params[int(nd["param_id"][v])], v)
    else:
      folded[v] = _eval_node(g, v, [folded[canon[int(u)]] for u in table[v] if u >= 0])

  dynamic = [v for v in order if not nd["is_constant"][v]]
  # Constants read by the dynamic part (or returned as outputs) become operands of `apply`.
  boundary = sorted({int(u) for v in dynamic for u in table[v] if u >= 0 and nd["is_constant"][u]}
                    | {v for v in order if nd["is_constant"][v] and nd["is_output"][v]})
  distinct = sorted({canon[v] for v in boundary})
  slot = {c: i for i, c in enumerate(distinct)}
  const_pos = {v: slot[canon[v]] for v in boundary}
  consts = tuple(folded[c] for c in distinct)
  inputs = sorted((int(nd["input_index"][v]), v) for v in order if nd["op"][v] == int(Op.INPUT))
  outputs = sorted((int(nd["output_index"][v]), v) for v in order if nd["is_output"][v])
  names = list(input_names) if input_names is not None else [f"input{i}" for i, _ in inputs]
  specs = [InputSpec(names[i], ops.unpad_shape(nd["shape"][v], nd["rank"][v]),
                     np.dtype(jnp.dtype(ops.numpy_dtype(int(nd["dtype"][v])))), bounds.get(v))
           for i, v in inputs]
  input_pos = {v: i for i, v in inputs}
  pinned = _pinned_dots(g, table, dynamic)

  def apply(const_args: tuple[jax.Array, ...], *input_args: jax.Array) -> tuple[jax.Array, ...]:
    with precision_lib.scope(policy):  # traced later, outside `lower`'s scope
      return _apply(const_args, input_args)

  def _apply(const_args: tuple[jax.Array, ...],
             input_args: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
    env: dict[int, jax.Array] = {}
    def value(u: int) -> jax.Array:
      if u in env:
        return env[u]
      return const_args[const_pos[u]]
    for v in dynamic:
      if nd["op"][v] == int(Op.INPUT):
        env[v] = input_args[input_pos[v]]
      else:
        args = [value(int(u)) for u in table[v] if u >= 0]
        if v in pinned:
          args = [jax.lax.optimization_barrier(args[0])]
        env[v] = _eval_node(g, v, args)
    return tuple(value(v) for _, v in outputs)

  return LoweredGraph(apply, consts, specs, len(outputs), jit=jit, precision=policy)


def _pinned_dots(g: layout.Graph, table: np.ndarray, dynamic: list[int]) -> set[int]:
  """The Transposes that read a computed MatMul: their input passes an optimization barrier.

  XLA's algebraic simplifier rewrites transpose(dot(a, b)) as dot(b, a) with the operands'
  roles swapped, undoing a graph that computes a MatMul transposed on purpose (the layout
  rules' `matmul_transposed`: the weight as the left operand, measured up to 0.65x the time of
  x @ w on XLA:CPU). The barrier keeps the dot the graph wrote, so the compiled program runs
  the kernels that the cost model priced."""
  nd = g.nodes
  out = set()
  for v in dynamic:
    if nd["op"][v] == int(Op.TRANSPOSE):
      u = int(table[v][0])
      if nd["op"][u] == int(Op.MATMUL) and not nd["is_constant"][u]:
        out.add(v)
  return out


def run(graph: layout.Graph, params: ParamStore, *inputs: Any) -> tuple[np.ndarray, ...]:
  """Lowers and runs once; returns numpy outputs (convenience for tests and scripts)."""
  return tuple(np.asarray(y) for y in lower(graph, params)(*inputs))


def output_dtypes(graph: layout.Graph) -> list[DType]:
  """Dtype codes of the graph outputs, in order."""
  g = layout.to_host(graph)
  nd = g.nodes
  outs = sorted((int(nd["output_index"][v]), int(nd["dtype"][v]))
                for v in np.flatnonzero(nd["alive"] & nd["is_output"]))
  return [DType(d) for _, d in outs]
