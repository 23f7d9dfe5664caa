"""Operators: codes, attributes, shape rules (host and jit), JAX lowerings and FLOP counts.

Public entry points:
  Op, DType, Activation, Layout, Impl  enums
  get(op) -> OpSpec, all_specs()          the registry
  infer_shape(op, in_shapes, ...)         host-side shape rule with named errors
  infer_shape_jit(op, in_shapes, ...)     the same rule for a traced op code (lax.switch)
  flops_jit(op, ...)                      FLOP count for a traced op code
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from xrlflow_jax.errors import ShapeError
from xrlflow_jax.ops import elementwise as _elementwise  # noqa: F401  (registers ops)
from xrlflow_jax.ops import nn as _nn  # noqa: F401
from xrlflow_jax.ops import tensor as _tensor  # noqa: F401
from xrlflow_jax.ops.codes import SOURCE_OPS, Op
from xrlflow_jax.ops.nn import apply_activation
from xrlflow_jax.ops.spec import (ATTR_WIDTH, MAX_RANK, Activation, AttrField, Impl, DType,
                                  Layout, OpSpec, all_specs, bits_to_float, dtype_code, dtype_size,
                                  fixed_dtype, float_to_bits, fmt_shape, get, numpy_dtype,
                                  pad_shape, unpad_shape)

__all__ = [
    "ATTR_WIDTH", "MAX_RANK", "Activation", "AttrField", "Impl", "DType", "Layout", "Op",
    "OpSpec",
    "SOURCE_OPS",
    "all_specs", "apply_activation", "bits_to_float", "dtype_code", "dtype_size", "fixed_dtype",
    "float_to_bits",
    "flops_jit", "fmt_shape", "get", "infer_dtype", "infer_shape", "infer_shape_jit", "numpy_dtype",
    "pad_shape", "unpad_shape",
]

assert [s.code for s in all_specs()] == list(range(len(Op))), "op codes must be dense"


def infer_shape(op: int | str, in_shapes: np.ndarray, in_ranks: np.ndarray, attrs: np.ndarray,
                n_inputs: int, *, where: str = "") -> tuple[np.ndarray, int]:
  """Host-side shape rule: returns (shape int32[R], rank) or raises `ShapeError`.

  Args:
    op: op code or name.
    in_shapes: int32[K, R] right-aligned input shapes (rows >= n_inputs are ignored).
    in_ranks: int32[K].
    attrs: int32[ATTR_WIDTH].
    n_inputs: number of real inputs.
    where: text naming the node, prefixed to error messages.
  """
  spec = get(op)
  if spec.source:
    raise ShapeError(f"{where}{spec.name} nodes carry their own shape")
  in_shapes = np.asarray(in_shapes, np.int32)
  in_ranks = np.asarray(in_ranks, np.int32)
  if not spec.min_inputs <= n_inputs <= spec.max_inputs:
    shown = ", ".join(fmt_shape(in_shapes[i], in_ranks[i])
                      for i in range(min(n_inputs, in_shapes.shape[0])))
    raise ShapeError(f"{where}{spec.name} takes {spec.min_inputs}..{spec.max_inputs} inputs, "
                     f"got {n_inputs} (input shapes {shown})")
  if in_shapes.shape[0] < 3:  # rules may peek at an optional third input
    extra = 3 - in_shapes.shape[0]
    in_shapes = np.concatenate([in_shapes, np.ones([extra, MAX_RANK], np.int32)])
    in_ranks = np.concatenate([in_ranks, np.zeros([extra], np.int32)])
  shape, rank, checks = spec.shape_rule(np, in_shapes, in_ranks, np.asarray(attrs, np.int32),
                                        n_inputs)
  failed = [msg for ok, msg in checks if not bool(ok)]
  if failed:
    shown = ", ".join(fmt_shape(in_shapes[i], in_ranks[i]) for i in range(n_inputs))
    raise ShapeError(f"{where}{spec.name} with input shapes {shown} and attributes "
                     f"{spec.decode_attrs(attrs)}: " + "; ".join(failed))
  return np.asarray(shape, np.int32), int(rank)


def infer_dtype(op: int | str, in_dtypes: list[int], attrs: np.ndarray) -> int:
  """Output dtype code of a node given its inputs' dtype codes."""
  spec = get(op)
  rule = spec.dtype_rule
  fixed = fixed_dtype(rule)
  if fixed is not None:
    return fixed
  if rule.startswith("attr:"):
    return int(spec.decode_attrs(attrs)[rule[5:]])
  return int(in_dtypes[1 if rule == "input1" else 0])


def _shared_branches(key: Callable[[OpSpec], Any]) -> tuple[np.ndarray, list[OpSpec]]:
  """Groups op codes whose `key` (a rule function) is the same object: (int32[num_ops] branch
  index of every op code, one representative spec per branch). Under `vmap` a `lax.switch`
  evaluates every branch, so ops that share a rule share one branch."""
  index, reps, seen = [], [], {}
  for s in all_specs():
    k = key(s)
    if k not in seen:
      seen[k] = len(reps)
      reps.append(s)
    index.append(seen[k])
  return np.asarray(index, np.int32), reps


@functools.lru_cache(maxsize=None)
def _shape_branches() -> tuple[np.ndarray, list[OpSpec], np.ndarray, np.ndarray]:
  index, reps = _shared_branches(lambda s: (s.source, s.shape_rule))
  lo = np.asarray([s.min_inputs for s in all_specs()], np.int32)
  hi = np.asarray([min(s.max_inputs, 2**31 - 1) for s in all_specs()], np.int32)
  lo = np.where([s.source for s in all_specs()], np.iinfo(np.int32).min, lo).astype(np.int32)
  hi = np.where([s.source for s in all_specs()], np.iinfo(np.int32).max, hi).astype(np.int32)
  return index, reps, lo, hi  # source ops: no arity check (their shape is stored)


@functools.lru_cache(maxsize=None)
def _flop_branches() -> tuple[np.ndarray, list[OpSpec]]:
  return _shared_branches(lambda s: s.flops)


def infer_shape_jit(op: jax.Array, in_shapes: jax.Array, in_ranks: jax.Array, attrs: jax.Array,
                    n_inputs: jax.Array, own_shape: jax.Array,
                    own_rank: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Shape rule for a traced op code, usable inside `jit` and `vmap`.

  Ops that share a shape rule share one `lax.switch` branch (see `_shared_branches`); the
  arity check is a table lookup.

  Args:
    op: int32[] op code.
    in_shapes: int32[K, R] (K >= 3); in_ranks: int32[K]; attrs: int32[A]; n_inputs: int32[].
    own_shape, own_rank: the node's stored shape, returned for Input/Constant.
  Returns:
    (shape int32[R], rank int32[], ok bool[]) where ok is false when a check of the rule fails.
  """
  index, reps, lo, hi = _shape_branches()

  def branch(spec: OpSpec):
    def fn(operands):
      shapes, ranks, a, n, s, r = operands
      if spec.source:
        return s.astype(jnp.int32), r.astype(jnp.int32), jnp.asarray(True)
      shape, rank, checks = spec.shape_rule(jnp, shapes, ranks, a, n)
      ok = jnp.asarray(True)
      for c, _ in checks:
        ok = ok & c
      return shape.astype(jnp.int32), jnp.asarray(rank, jnp.int32), jnp.asarray(ok)
    return fn
  code = jnp.clip(jnp.asarray(op, jnp.int32), 0, len(index) - 1)
  operands = (in_shapes, in_ranks, attrs, n_inputs, own_shape, own_rank)
  shape, rank, ok = jax.lax.switch(jnp.asarray(index)[code], [branch(s) for s in reps], operands)
  arity = (n_inputs >= jnp.asarray(lo)[code]) & (n_inputs <= jnp.asarray(hi)[code])
  return shape, rank, ok & arity


def flops_jit(op: jax.Array, in_shapes: jax.Array, in_ranks: jax.Array, out_shape: jax.Array,
              attrs: jax.Array) -> jax.Array:
  """FLOPs of one node for a traced op code: float32[] (ops sharing a FLOP rule share a
  branch)."""
  index, reps = _flop_branches()

  def branch(spec: OpSpec):
    def fn(operands):
      shapes, ranks, out, a = operands
      return jnp.asarray(spec.flops(jnp, shapes, ranks, out, a), jnp.float32)
    return fn
  code = jnp.clip(jnp.asarray(op, jnp.int32), 0, len(index) - 1)
  return jax.lax.switch(jnp.asarray(index)[code], [branch(s) for s in reps],
                        (in_shapes, in_ranks, out_shape, attrs))


def flops(op: int | str, in_shapes: Any, in_ranks: Any, out_shape: Any, attrs: Any) -> float:
  """Host-side FLOP count of one node."""
  return float(get(op).flops(np, np.asarray(in_shapes), np.asarray(in_ranks),
                             np.asarray(out_shape), np.asarray(attrs)))
