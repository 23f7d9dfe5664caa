"""Shape rules: the jitted rule agrees with the host rule and with what the lowering produces.

Valid cases are the numerics cases of `tests/test_ops.py`; invalid cases are listed here. The
jitted rule (`ops.infer_shape_jit`, a `lax.switch` over op codes) is checked one case at a time
under `jax.jit` and on all cases at once under `jax.vmap`, so one batch mixes every op.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xrlflow_jax import GraphBuilder, ops
from xrlflow_jax.errors import CapacityError, ShapeError
from xrlflow_jax.ops import ATTR_WIDTH, MAX_RANK

if str(Path(__file__).parent) not in sys.path:
  sys.path.insert(0, str(Path(__file__).parent))
import test_ops  # pylint: disable=g-import-not-at-top,wrong-import-position

K = test_ops.MAX_INPUTS  # input rows handed to the rules (BatchNorm needs 5)


@dataclasses.dataclass(frozen=True)
class RuleInput:
  """The padded operands of one shape-rule call."""
  op: int
  in_shapes: np.ndarray  # int32[K, R]
  in_ranks: np.ndarray  # int32[K]
  attrs: np.ndarray  # int32[A]
  n_inputs: int


def rule_input(op: str, shapes: Sequence[Sequence[int]], attrs: dict[str, Any]) -> RuleInput:
  """Right-aligns `shapes` into K rows and encodes `attrs`."""
  spec = ops.get(op)
  in_shapes = np.ones([K, MAX_RANK], np.int32)
  in_ranks = np.zeros([K], np.int32)
  for i, s in enumerate(shapes):
    in_shapes[i], in_ranks[i] = ops.pad_shape(s)
  return RuleInput(spec.code, in_shapes, in_ranks, spec.encode_attrs(**attrs), len(shapes))


@dataclasses.dataclass(frozen=True)
class BadCase:
  """Operands a shape rule must reject, and a fragment of the expected message."""
  op: str
  name: str
  shapes: tuple[tuple[int, ...], ...]
  attrs: dict[str, Any]
  fragment: str
  dtypes: tuple[str, ...] = ()

  @property
  def id(self) -> str:
    return f"{self.op}-{self.name}"

  def dtype(self, i: int) -> str:
    return self.dtypes[i] if i < len(self.dtypes) else "float32"


def _pool(kernel, strides=(1, 1), pads=(0, 0, 0, 0)) -> dict[str, Any]:
  return {"kernel": kernel, "strides": strides, "pads": pads}


def _pads(axis: int, begin: int, end: int) -> dict[str, Any]:
  flat = [0] * (2 * MAX_RANK)
  flat[axis], flat[MAX_RANK + axis] = begin, end
  return {"pads": tuple(flat)}


_B = test_ops.axes_bits
_PERM = test_ops.padded_perm

BAD_CASES = [
    BadCase("Conv2D", "channel_mismatch", ((1, 3, 8, 8), (4, 2, 3, 3)), {},
            "input channels must equal weight in-channels x groups"),
    BadCase("Conv2D", "outputs_not_divisible_by_groups", ((1, 4, 8, 8), (5, 2, 3, 3)),
            {"groups": 2}, "output channels must be divisible by groups"),
    BadCase("Conv2D", "kernel_too_large", ((1, 2, 3, 3), (4, 2, 5, 5)), {},
            "kernel larger than the padded input"),
    BadCase("Conv2D", "bias_size", ((1, 2, 5, 5), (4, 2, 3, 3), (3,)), {},
            "bias must be rank 1"),
    BadCase("Conv2D", "rank3_input", ((2, 5, 5), (4, 2, 3, 3)), {}, "must be rank 4"),
    BadCase("Conv2D", "zero_stride", ((1, 2, 5, 5), (4, 2, 3, 3)), {"strides": (0, 1)},
            "strides and dilations must be >= 1"),
    BadCase("MatMul", "contracted_mismatch", ((3, 4), (5, 6)), {}, "contracted dimensions differ"),
    BadCase("MatMul", "batch_not_broadcastable", ((2, 3, 4), (3, 4, 5)), {},
            "batch dimensions do not broadcast"),
    BadCase("MatMul", "rank1_operand", ((4,), (4, 5)), {}, "operands must be rank >= 2"),
    BadCase("Add", "not_broadcastable", ((3, 4), (5, 4)), {}, "do not broadcast"),
    BadCase("Mul", "rank_mismatch_not_broadcastable", ((2, 3, 4), (3, 1, 5)), {},
            "do not broadcast"),
    BadCase("Where", "not_broadcastable", ((3, 1), (1, 4), (2, 4)), {}, "do not broadcast",
            ("bool",)),
    BadCase("Transpose", "repeated_axis", ((2, 3, 4),), {"perm": _PERM((0, 0, 1))},
            "not a permutation"),
    BadCase("Transpose", "axis_out_of_range", ((2, 3),), {"perm": _PERM((0, 2))},
            "not a permutation"),
    BadCase("Slice", "end_beyond_dim", ((4, 5),), {"axis": 1, "start": 0, "end": 6},
            "end <= dim"),
    BadCase("Slice", "start_after_end", ((4, 5),), {"axis": 1, "start": 3, "end": 2},
            "start <= end"),
    BadCase("Slice", "empty", ((4, 5),), {"axis": 0, "start": 2, "end": 2}, "slice is empty"),
    BadCase("Slice", "zero_step", ((4, 5),), {"axis": 0, "start": 0, "end": 4, "step": 0},
            "step must be >= 1"),
    BadCase("Slice", "axis_out_of_range", ((4, 5),), {"axis": 2, "start": 0, "end": 1},
            "axis out of range"),
    BadCase("Reshape", "count_change", ((2, 3, 4),), test_ops.reshape_attrs((5, 5)),
            "element count changes"),
    BadCase("Reshape", "dims_beyond_rank", ((2, 3, 4),),
            {"shape": (1, 1, 1, 2, 3, 4), "rank": 2}, "dims beyond its rank"),
    BadCase("Squeeze", "non_unit_dim", ((1, 3, 1),), {"axes": _B((0, 1))},
            "squeezed dims must be 1"),
    BadCase("Squeeze", "axis_out_of_range", ((1, 3),), {"axes": _B((2,))},
            "axes must name existing axes"),
    BadCase("Unsqueeze", "rank_overflow", ((1, 2, 3, 4, 5),), {"axes": _B((0, 6))},
            "axes out of range"),
    BadCase("Concat", "dim_mismatch", ((2, 3), (2, 4)), {"axis": 0},
            "agree on every dimension but the concat axis"),
    BadCase("Concat", "rank_mismatch", ((2, 3), (3,)), {"axis": 0},
            "agree on every dimension but the concat axis"),
    BadCase("Concat", "axis_out_of_range", ((2, 3), (2, 3)), {"axis": 2}, "axis out of range"),
    BadCase("Gather", "axis_out_of_range", ((4, 3), (2,)), {"axis": 2}, "axis out of range",
            ("float32", "int32")),
    BadCase("Gather", "rank_overflow", ((2, 2, 2, 2), (2, 2, 2, 2)), {"axis": 1},
            "exceeds the maximum rank", ("float32", "int32")),
    BadCase("Pad", "negative", ((3, 4),), _pads(1, -1, 0), "pads must be >= 0"),
    BadCase("Pad", "beyond_rank", ((3, 4),), _pads(2, 1, 1), "pads given for axes beyond the rank"),
    BadCase("Pad", "unknown_mode", ((3, 4),), {"mode": 5}, "unknown mode"),
    BadCase("Softmax", "axis_out_of_range", ((2, 3),), {"axis": 2}, "axis out of range"),
    BadCase("LayerNorm", "scale_shape", ((2, 3, 4), (3,)), {"axis": 2},
            "scale must broadcast over the normalised dims"),
    BadCase("LayerNorm", "bias_shape", ((2, 3, 4), (4,), (5,)), {"axis": 2},
            "bias must broadcast over the normalised dims"),
    BadCase("LayerNorm", "scale_rank_too_high", ((2, 3, 4), (3, 4)), {"axis": 2},
            "scale must broadcast"),
    BadCase("BatchNorm", "channel_mismatch", ((2, 3, 4, 4), (3,), (3,), (4,), (3,)), {},
            "rank 1 of size C"),
    BadCase("BatchNorm", "rank1_input", ((3,), (3,), (3,), (3,), (3,)), {},
            "input must be rank >= 2"),
    BadCase("MaxPool", "pad_not_below_kernel", ((1, 1, 5, 5),), _pool((2, 2), pads=(2, 0, 0, 0)),
            "pads must be in [0, dilated kernel)"),
    BadCase("AvgPool", "kernel_too_large", ((1, 1, 3, 3),), _pool((4, 4)),
            "kernel larger than the padded input"),
    BadCase("MaxPool", "rank3", ((1, 5, 5),), _pool((2, 2)), "input must be rank 4"),
    BadCase("AvgPool", "zero_stride", ((1, 1, 5, 5),), _pool((2, 2), strides=(1, 0)),
            "kernel and strides must be >= 1"),
    BadCase("GlobalAvgPool", "rank3", ((1, 5, 5),), {}, "input must be rank 4"),
    BadCase("ReduceSum", "axis_beyond_rank", ((2, 3),), {"axes": _B((2,))},
            "axes must name existing axes"),
    BadCase("ReduceMean", "no_axes", ((2, 3),), {"axes": 0}, "axes must name existing axes"),
    BadCase("Enlarge", "smaller_kernel", ((4, 2, 3, 3),), {"kernel": (1, 1)},
            "target kernel smaller than weight"),
    BadCase("Enlarge", "odd_growth", ((4, 2, 1, 1),), {"kernel": (2, 3)},
            "kernel growth must be even"),
    BadCase("Enlarge", "rank2_weight", ((4, 2),), {"kernel": (3, 3)}, "weight must be rank 4"),
    BadCase("MergeGConv", "groups_not_multiple_of_count", ((8, 2, 3, 3),),
            {"groups": 4, "count": 3}, "groups must be a multiple of count"),
    BadCase("MergeGConv", "outputs_not_divisible", ((6, 2, 3, 3),), {"groups": 4, "count": 2},
            "output channels must divide by groups"),
    BadCase("Add", "one_input", ((3,),), {}, "takes 2..2 inputs, got 1"),
    BadCase("Relu", "two_inputs", ((3,), (3,)), {}, "takes 1..1 inputs, got 2"),
    BadCase("Conv2D", "one_input", ((1, 2, 5, 5),), {}, "takes 2..3 inputs, got 1"),
    BadCase("Equal", "not_broadcastable", ((3, 4), (5, 4)), {}, "do not broadcast"),
    BadCase("PRelu", "not_broadcastable", ((2, 3, 4), (2,)), {}, "do not broadcast"),
    BadCase("ReduceMax", "axis_beyond_rank", ((2, 3),), {"axes": _B((2,))},
            "axes must name existing axes"),
    BadCase("ArgMax", "two_axes", ((2, 3),), {"axes": _B((0, 1))},
            "exactly one axis must be reduced"),
    BadCase("LogSoftmax", "axis_out_of_range", ((2, 3),), {"axis": 2}, "axis out of range"),
    BadCase("Expand", "not_broadcastable", ((3, 2),), test_ops.reshape_attrs((3, 4)),
            "does not broadcast to the target shape"),
    BadCase("Expand", "lower_rank", ((2, 3, 4),), test_ops.reshape_attrs((3, 4)),
            "rank must lie in [input rank, 6]"),
    BadCase("Tile", "zero_repeats", ((2, 3),), {"reps": (1, 1, 1, 1, 0, 2)},
            "repeats must be >= 1"),
    BadCase("GatherElements", "rank_mismatch", ((3, 4), (3,)), {"axis": 0},
            "indices must have the data's rank", ("float32", "int32")),
    BadCase("GatherElements", "too_large_off_axis", ((3, 4), (5, 2)), {"axis": 1},
            "must not exceed the data's", ("float32", "int32")),
    BadCase("CumSum", "axis_out_of_range", ((3, 4),), {"axis": 2}, "axis out of range"),
    BadCase("Trilu", "rank1", ((4,),), {}, "input must have rank >= 2"),
    BadCase("TopKValues", "k_too_large", ((3, 4),), {"axis": 1, "k": 5},
            "k must lie in [1, dim of the axis]"),
    BadCase("TopKIndices", "axis_out_of_range", ((3, 4),), {"axis": 2, "k": 1},
            "axis out of range"),
    BadCase("ConvTranspose", "channel_mismatch", ((1, 3, 4, 4), (4, 2, 3, 3)), {},
            "input channels must equal the weight's first dim"),
    BadCase("ConvTranspose", "output_padding_too_big", ((1, 2, 4, 4), (2, 2, 3, 3)),
            {"strides": (2, 2), "output_padding": (2, 0)}, "output_padding must be >= 0"),
    BadCase("MaxPool", "pad_not_below_dilated_kernel", ((1, 1, 9, 9),),
            {"kernel": (2, 2), "pads": (4, 0, 0, 0), "dilations": (3, 1)},
            "pads must be in [0, dilated kernel)"),
    BadCase("Tile", "repeats_beyond_rank", ((2, 3),), {"reps": (1, 1, 1, 2, 1, 2)},
            "repeats given for axes beyond the rank"),
]

VALID = [(c.id, rule_input(c.op, [a.shape for a in c.args], c.attrs), c)
         for c in test_ops.ALL_CASES]
INVALID = [(c.id, rule_input(c.op, c.shapes, c.attrs), c) for c in BAD_CASES]


def _host(ri: RuleInput) -> tuple[np.ndarray, int]:
  return ops.infer_shape(ri.op, ri.in_shapes, ri.in_ranks, ri.attrs, ri.n_inputs)


BATCH = 512  # every vmapped call is padded to this size, so the batched rule compiles once


def _stack(items: Sequence[RuleInput], size: int | None = None) -> tuple[jax.Array, ...]:
  """The batched operands of `infer_shape_jit`, padded to `size` rows by repeating the last.

  Own shape/rank are ones/0: they only matter for Input/Constant, which no case uses.
  """
  size = len(items) if size is None else size
  assert 0 < len(items) <= size, (len(items), size)
  items = list(items) + [items[-1]] * (size - len(items))
  return (jnp.asarray([r.op for r in items], jnp.int32),
          jnp.asarray(np.stack([r.in_shapes for r in items])),
          jnp.asarray(np.stack([r.in_ranks for r in items])),
          jnp.asarray(np.stack([r.attrs for r in items])),
          jnp.asarray([r.n_inputs for r in items], jnp.int32),
          jnp.ones([size, MAX_RANK], jnp.int32), jnp.zeros([size], jnp.int32))


_jit_rule = jax.jit(ops.infer_shape_jit)
_vmap_rule = jax.jit(jax.vmap(ops.infer_shape_jit))


def _jit_one(ri: RuleInput) -> tuple[np.ndarray, int, bool]:
  shape, rank, ok = _jit_rule(*(x[0] for x in _stack([ri])))
  return np.asarray(shape), int(rank), bool(ok)


def test_cases_cover_every_non_source_op():
  covered = {c.op for c in test_ops.ALL_CASES}
  missing = sorted({s.name for s in ops.all_specs() if not s.source} - covered)
  assert not missing, f"ops without valid shape-rule cases: {missing}"
  assert all(c.op in {s.name for s in ops.all_specs()} for c in BAD_CASES)


@pytest.mark.parametrize("ri,case", [(ri, c) for _, ri, c in VALID], ids=[i for i, _, _ in VALID])
def test_jit_rule_matches_host_rule(ri: RuleInput, case: test_ops.OpCase):
  shape, rank = _host(ri)
  jshape, jrank, ok = _jit_one(ri)
  assert ok, f"{case.id}: jit rule rejects a case the host rule accepts"
  assert jrank == rank and np.array_equal(jshape, shape), (
      f"{case.id}: jit gives {ops.fmt_shape(jshape, jrank)}, host {ops.fmt_shape(shape, rank)}")
  assert np.all(shape[:MAX_RANK - rank] == 1), f"{case.id}: padding is not ones: {shape}"


@pytest.mark.parametrize("ri,case", [(ri, c) for _, ri, c in VALID], ids=[i for i, _, _ in VALID])
def test_rule_matches_lowering_shape(ri: RuleInput, case: test_ops.OpCase):
  """The shape and dtype the rules predict are those of the array the lowering builds."""
  spec = ops.get(case.op)
  shape, rank = _host(ri)
  out_shape = ops.unpad_shape(shape, rank)
  in_dtypes = [int(ops.dtype_code(a.dtype)) for a in case.args]
  out_dtype = ops.numpy_dtype(ops.infer_dtype(case.op, in_dtypes, ri.attrs))
  attrs = spec.decode_attrs(ri.attrs)
  structs = [jax.ShapeDtypeStruct(a.shape, jnp.dtype(a.dtype)) for a in case.args]
  got = jax.eval_shape(lambda *xs: spec.lower(list(xs), attrs, out_shape, out_dtype), *structs)
  assert tuple(got.shape) == out_shape, f"{case.id}: lowering {got.shape}, rule {out_shape}"
  want = jax.dtypes.canonicalize_dtype(out_dtype)  # int64 (ArgMax) is int32 without x64
  assert got.dtype == want, f"{case.id}: lowering {got.dtype}, dtype rule {out_dtype}"


def test_vmap_rule_over_mixed_batch():
  """One vmapped call over every valid and invalid case (all ops in one batch)."""
  items = [ri for _, ri, _ in VALID] + [ri for _, ri, _ in INVALID]
  ids = [i for i, _, _ in VALID] + [i for i, _, _ in INVALID]
  shapes, ranks, oks = (np.asarray(v) for v in _vmap_rule(*_stack(items, BATCH)))
  for j, (_, ri, _) in enumerate(VALID):
    shape, rank = _host(ri)
    assert oks[j], f"{ids[j]}: vmapped rule rejects a valid case"
    assert ranks[j] == rank and np.array_equal(shapes[j], shape), (
        f"{ids[j]}: vmapped {ops.fmt_shape(shapes[j], ranks[j])}, host "
        f"{ops.fmt_shape(shape, rank)}")
  bad = [ids[j] for j in range(len(VALID), len(items)) if oks[j]]
  assert not bad, f"vmapped rule accepts invalid cases: {bad}"


@pytest.mark.parametrize("ri,case", [(ri, c) for _, ri, c in INVALID],
                         ids=[i for i, _, _ in INVALID])
def test_invalid_case_rejected(ri: RuleInput, case: BadCase):
  with pytest.raises(ShapeError) as info:
    _host(ri)
  msg = str(info.value)
  assert case.op in msg, f"message does not name the op: {msg}"
  for s in case.shapes:
    assert ops.fmt_shape(*ops.pad_shape(s)) in msg, f"message does not name shape {s}: {msg}"
  assert case.fragment in msg, f"expected {case.fragment!r} in: {msg}"
  _, _, ok = _jit_one(ri)
  assert not ok, f"{case.id}: the jit rule accepts what the host rule rejects ({msg})"


@pytest.mark.parametrize("case", BAD_CASES, ids=lambda c: c.id)
def test_builder_names_the_node(case: BadCase):
  b = GraphBuilder(max_inputs=K, name="bad")
  inputs = [b.input(s, case.dtype(i)) for i, s in enumerate(case.shapes)]
  with pytest.raises(ShapeError) as info:
    b.node(case.op, inputs, name="culprit", **case.attrs)
  msg = str(info.value)
  assert f"node {len(inputs)} 'culprit' ({case.op})" in msg, msg
  assert case.fragment in msg, msg


def test_jit_rule_rejects_arity_beyond_inputs():
  """n_inputs outside [min_inputs, max_inputs] makes ok False for every non-source op."""
  items, names = [], []
  for spec in ops.all_specs():
    if spec.source:
      continue
    for n in (spec.min_inputs - 1, spec.max_inputs + 1):
      if 0 <= n <= K:
        ri = rule_input(spec.name, [(2, 2)] * n, {})
        items.append(ri)
        names.append(f"{spec.name}/{n}")
  assert items
  _, _, oks = (np.asarray(v) for v in _vmap_rule(*_stack(items, BATCH)))
  assert not oks.any(), [n for n, ok in zip(names, oks) if ok]


def test_source_ops_return_their_stored_shape():
  own = np.asarray([1, 1, 1, 2, 3, 4], np.int32)
  for op in (ops.Op.INPUT, ops.Op.CONSTANT):
    shape, rank, ok = _jit_rule(jnp.int32(op), jnp.ones([K, MAX_RANK], jnp.int32),
                                jnp.zeros([K], jnp.int32), jnp.zeros([ATTR_WIDTH], jnp.int32),
                                jnp.int32(0), jnp.asarray(own), jnp.int32(3))
    assert bool(ok) and int(rank) == 3 and np.array_equal(np.asarray(shape), own)
    with pytest.raises(ShapeError, match="carry their own shape"):
      ops.infer_shape(op, np.ones([3, MAX_RANK]), np.zeros([3]), np.zeros([ATTR_WIDTH]), 0)


def test_builder_rejects_too_many_inputs_for_slots():
  b = GraphBuilder(max_inputs=4)
  xs = [b.input((2, 3)) for _ in range(5)]
  with pytest.raises(CapacityError, match="5 inputs exceed the 4 input slots"):
    b.node("Concat", xs, axis=0)
