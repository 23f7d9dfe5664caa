"""Numerics of every registered op against independent numpy references.

Each case builds a one-op graph with `GraphBuilder`, lowers it with `executor.lower` and runs it,
twice: once with the operands as graph inputs (the jitted path) and once with the operands as
constants (the weight pre-processing path, evaluated once at lowering). The references below are
written directly in numpy (float64), never by calling the lowering under test.

`CASE_BUILDERS` maps every op name to a function returning its cases; a meta-test fails when a
registered op has no entry, so a newly added op cannot go untested. `tests/test_shape_rules.py`
reuses `all_cases()`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import warnings
import zlib
from typing import Any, Callable, Sequence

import jax
import numpy as np
import pytest

from xrlflow_jax import GraphBuilder, executor, ops
from xrlflow_jax.ops import MAX_RANK, Activation, Impl, DType

Reference = Callable[..., np.ndarray]

MAX_INPUTS = 5  # input slots of the one-op graphs: BatchNorm takes 5 operands


@dataclasses.dataclass(frozen=True)
class Arg:
  """One operand of a case.

  Attributes:
    shape: the operand's shape.
    kind: value distribution: "normal" N(0, 1); "wide" U(-6, 6); "positive" U(0.5, 2); "away"
      +-U(0.5, 2) (a safe divisor); "sparse" N(0, 1) with about a third exact zeros; "special"
      N(0, 1) with NaN, +-inf and zeros; "halves" multiples of 0.5 in [-4, 4]; "bool"; "int"
      integers in [-10, 10]; "nonzero_int" integers in [-9, 9] but 0; "small_int" integers in
      [0, 3]; "index<b>" integers in [-b, b) (negative indices included).
    dtype: numpy dtype name.
  """
  shape: tuple[int, ...]
  kind: str = "normal"
  dtype: str = "float32"


@dataclasses.dataclass(frozen=True)
class OpCase:
  """One op applied to operands with attributes, and the numpy reference of its output.

  Attributes:
    op: op name (as registered).
    name: short description, unique per op.
    args: the operands.
    attrs: attributes exactly as `GraphBuilder.node` takes them (encoded form: bit masks, padded
      shapes and permutations).
    reference: numpy function of the operand values returning the expected output.
    rtol, atol: tolerances of the comparison.
    float64: hand the reference float64 copies of floating operands (False where the rounding of
      the original dtype is the point, as in Cast).
  """
  op: str
  name: str
  args: tuple[Arg, ...]
  attrs: dict[str, Any]
  reference: Reference
  rtol: float = 1e-5
  atol: float = 1e-5
  float64: bool = True

  @property
  def id(self) -> str:
    return f"{self.op}-{self.name}"


def make_values(case: OpCase) -> list[np.ndarray]:
  """Deterministic random operand values for `case` (seeded by its id)."""
  rng = np.random.default_rng(zlib.crc32(case.id.encode()))
  out = []
  for arg in case.args:
    shape = arg.shape
    if arg.kind == "normal":
      value = rng.standard_normal(shape)
    elif arg.kind == "wide":
      value = rng.uniform(-6.0, 6.0, shape)
    elif arg.kind == "positive":
      value = rng.uniform(0.5, 2.0, shape)
    elif arg.kind == "away":
      value = rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    elif arg.kind == "sparse":
      value = rng.standard_normal(shape) * (rng.random(shape) < 0.66)
    elif arg.kind == "bool":
      value = rng.random(shape) < 0.5
    elif arg.kind == "int":
      value = rng.integers(-10, 11, shape)
    elif arg.kind == "special":  # N(0, 1) with NaNs, +inf, -inf and zeros mixed in
      value = rng.standard_normal(shape)
      pick = rng.random(shape)
      value = np.where(pick < 0.15, np.nan, np.where(pick < 0.3, np.inf, np.where(
          pick < 0.45, -np.inf, np.where(pick < 0.55, 0.0, value))))
    elif arg.kind == "halves":  # multiples of 0.5 in [-4, 4]: ties of Round
      value = rng.integers(-8, 9, shape) / 2.0
    elif arg.kind == "nonzero_int":  # integers in [-9, 9] without 0 (a safe integer divisor)
      value = rng.integers(1, 10, shape) * rng.choice([-1, 1], shape)
    elif arg.kind == "small_int":  # integers in [0, 3]: many ties
      value = rng.integers(0, 4, shape)
    elif arg.kind.startswith("index"):
      bound = int(arg.kind[5:])
      value = rng.integers(-bound, bound, shape)
    else:
      raise ValueError(f"unknown value kind {arg.kind!r}")
    out.append(np.asarray(value).astype(arg.dtype))
  return out


def run_case(case: OpCase, values: Sequence[np.ndarray], *,
             as_constants: bool) -> tuple[np.ndarray, tuple[int, ...], DType]:
  """Builds the one-op graph of `case`, lowers and runs it.

  Returns:
    (output array, the node's stored shape, the node's stored dtype).
  """
  b = GraphBuilder(seed=0, max_inputs=MAX_INPUTS, name=case.id)
  if as_constants:
    operands = [b.constant(v) for v in values]
  else:
    operands = [b.input(v.shape, v.dtype) for v in values]
  y = b.node(case.op, operands, **case.attrs)
  b.output(y)
  graph, params = b.build(capacity=len(values) + 1)
  lowered = executor.lower(graph, params)
  (out,) = lowered(*([] if as_constants else values))
  return np.asarray(out), y.shape, y.dtype


# ------------------------------------------------------------------ numpy references

def _f64(x: np.ndarray) -> np.ndarray:
  return np.asarray(x, np.float64)


_erf = np.vectorize(math.erf, otypes=[np.float64])


def ref_sigmoid(x: np.ndarray) -> np.ndarray:
  """Logistic function, elementwise (any shape)."""
  return 1.0 / (1.0 + np.exp(-x))


def ref_gelu(x: np.ndarray, approximate: bool = False) -> np.ndarray:
  """GELU, elementwise: exact x * Phi(x) via math.erf, or the tanh approximation."""
  if approximate:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
  return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


ACTIVATION_REFS: dict[Activation, Reference] = {
    Activation.NONE: lambda x: x,
    Activation.RELU: lambda x: np.maximum(x, 0.0),
    Activation.SIGMOID: ref_sigmoid,
    Activation.TANH: np.tanh,
    Activation.GELU: ref_gelu,
}


def ref_conv2d(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None, *,
               strides: Sequence[int] = (1, 1), pads: Sequence[int] = (0, 0, 0, 0),
               dilations: Sequence[int] = (1, 1), groups: int = 1,
               activation: int = 0) -> np.ndarray:
  """Direct NCHW grouped convolution: a sum over kernel positions of strided input windows.

  x [N, C, H, W], w [O, C/groups, kh, kw], bias [O]; pads (top, left, bottom, right).
  """
  x, w = _f64(x), _f64(w)
  n, c, h, wd = x.shape
  o, cg, kh, kw = w.shape
  assert c == cg * groups and o % groups == 0
  pt, pl, pb, pr = pads
  (sh, sw), (dh, dw) = strides, dilations
  xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
  ho = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
  wo = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
  og = o // groups
  out = np.zeros((n, o, ho, wo))
  for g in range(groups):
    xg = xp[:, g * cg:(g + 1) * cg]
    for i in range(kh):
      for j in range(kw):
        window = xg[:, :, i * dh:i * dh + (ho - 1) * sh + 1:sh,
                    j * dw:j * dw + (wo - 1) * sw + 1:sw]  # [N, C/groups, Ho, Wo]
        out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", window,
                                                 w[g * og:(g + 1) * og, :, i, j])
  if bias is not None:
    out = out + _f64(bias)[None, :, None, None]
  return ACTIVATION_REFS[Activation(activation)](out)


def _pool_len(size: int, begin: int, end: int, k: int, s: int, ceil_mode: bool) -> int:
  span = size + begin + end - k
  out = (-(-span // s) if ceil_mode else span // s) + 1
  if ceil_mode and (out - 1) * s >= size + begin:
    out -= 1  # ONNX (as onnxruntime and PyTorch): no window may start in the end padding
  return out


def ref_pool(x: np.ndarray, kind: str, *, kernel: Sequence[int], strides: Sequence[int],
             pads: Sequence[int], ceil_mode: bool, count_include_pad: bool,
             dilations: Sequence[int] = (1, 1)) -> np.ndarray:
  """ONNX MaxPool / AveragePool on NCHW, one output cell at a time.

  A window covers input rows oh*sh - top + i*dh for i < kh. Max and (count_include_pad off)
  average use the cells inside the input; with count_include_pad the divisor counts the cells
  inside the explicitly padded input (never the extra cells ceil mode reaches).
  """
  x = _f64(x) if kind == "avg" else x
  n, c, h, w = x.shape
  (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
  pt, pl, pb, pr = pads
  ho = _pool_len(h, pt, pb, (kh - 1) * dh + 1, sh, ceil_mode)
  wo = _pool_len(w, pl, pr, (kw - 1) * dw + 1, sw, ceil_mode)
  out = np.zeros((n, c, ho, wo), x.dtype)
  for oh, ow in itertools.product(range(ho), range(wo)):
    r0, c0 = oh * sh - pt, ow * sw - pl
    window_rows = [r0 + i * dh for i in range(kh)]
    window_cols = [c0 + j * dw for j in range(kw)]
    rows = [r for r in window_rows if 0 <= r < h]
    cols = [q for q in window_cols if 0 <= q < w]
    cells = x[:, :, rows][:, :, :, cols]
    if kind == "max":
      out[:, :, oh, ow] = cells.max(axis=(2, 3))
    else:
      if count_include_pad:
        nr = len([r for r in window_rows if -pt <= r < h + pb])
        nc = len([q for q in window_cols if -pl <= q < w + pr])
      else:
        nr, nc = len(rows), len(cols)
      out[:, :, oh, ow] = cells.sum(axis=(2, 3)) / (nr * nc)
  return out


def ref_layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None = None, *,
                   axis: int, epsilon: float) -> np.ndarray:
  """Normalises x over axes [axis, rank); scale and bias broadcast against those axes."""
  axes = tuple(range(axis, x.ndim))
  mean = x.mean(axis=axes, keepdims=True)
  var = ((x - mean)**2).mean(axis=axes, keepdims=True)
  y = (x - mean) / np.sqrt(var + epsilon) * scale
  return y if bias is None else y + bias


def ref_batch_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray,
                   var: np.ndarray, *, epsilon: float) -> np.ndarray:
  """Inference batch norm of x [N, C, ...] with per-channel statistics of shape [C]."""
  shape = (1, -1) + (1,) * (x.ndim - 2)
  return ((x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + epsilon) * scale.reshape(shape)
          + bias.reshape(shape))


def to_dense_conv_weight(w: np.ndarray, groups: int) -> np.ndarray:
  """The block-diagonal dense weight [O, C, kh, kw] equivalent to a grouped one [O, C/g, ...]."""
  o, ig = w.shape[:2]
  dense = np.zeros((o, ig * groups) + w.shape[2:], w.dtype)
  for oc in range(o):
    g = oc // (o // groups)
    dense[oc, g * ig:(g + 1) * ig] = w[oc]
  return dense


def from_dense_conv_weight(dense: np.ndarray, groups: int) -> np.ndarray:
  """The grouped weight [O, C/g, ...] read off the diagonal blocks of a dense one."""
  o, c = dense.shape[:2]
  ig = c // groups
  return np.stack([dense[oc, (oc // (o // groups)) * ig:((oc // (o // groups)) + 1) * ig]
                   for oc in range(o)])


def ref_merge_gconv(w: np.ndarray, *, groups: int, count: int) -> np.ndarray:
  """TASO's merge_gconv: the weight with groups/count groups computing the same convolution."""
  return from_dense_conv_weight(to_dense_conv_weight(w, groups), groups // count)


# ------------------------------------------------------------------ attribute helpers

def axes_bits(axes: Sequence[int]) -> int:
  return sum(1 << a for a in axes)


def padded_perm(perm: Sequence[int]) -> tuple[int, ...]:
  return tuple(perm) + (0,) * (MAX_RANK - len(perm))


def reshape_attrs(shape: Sequence[int]) -> dict[str, Any]:
  padded, rank = ops.pad_shape(shape)
  return {"shape": tuple(int(v) for v in padded), "rank": rank}


def pad_attrs(pads: Sequence[tuple[int, int]]) -> tuple[int, ...]:
  flat = [0] * (2 * MAX_RANK)
  for i, (b, e) in enumerate(pads):
    flat[i], flat[MAX_RANK + i] = b, e
  return tuple(flat)


# ------------------------------------------------------------------ cases per op

UNARY_REFS: dict[str, tuple[Reference, str]] = {
    "Relu": (lambda x: np.maximum(x, 0.0), "normal"),
    "Sigmoid": (ref_sigmoid, "wide"),
    "Tanh": (np.tanh, "wide"),
    "Erf": (_erf, "normal"),
    "Exp": (np.exp, "normal"),
    "Log": (np.log, "positive"),
    "Sqrt": (np.sqrt, "positive"),
    "Neg": (np.negative, "normal"),
    "Reciprocal": (np.reciprocal, "away"),
}


def _unary_cases(op: str) -> list[OpCase]:
  ref, kind = UNARY_REFS[op]
  return [OpCase(op, f"rank{len(s)}", (Arg(s, kind),), {}, ref)
          for s in ((2, 3, 4), (), (1, 5), (2, 1, 3, 1, 2, 2))]


BINARY_REFS: dict[str, tuple[Reference, str, str]] = {
    "Add": (np.add, "normal", "normal"),
    "Sub": (np.subtract, "normal", "normal"),
    "Mul": (np.multiply, "normal", "normal"),
    "Div": (np.divide, "normal", "away"),
    "Pow": (np.power, "positive", "normal"),
    "Max": (np.maximum, "normal", "normal"),
    "Min": (np.minimum, "normal", "normal"),
}

BROADCAST_PAIRS = (
    ((3, 4), (3, 4)),
    ((2, 3, 4), (4,)),  # rank mismatch
    ((4,), (2, 3, 4)),
    ((2, 1, 4), (3, 1)),  # size-1 dims on both sides
    ((3, 4), ()),  # scalar
    ((2, 1, 3, 1, 2, 2), (3, 4, 1, 1)),  # rank 6
)


def _binary_cases(op: str) -> list[OpCase]:
  ref, ka, kb = BINARY_REFS[op]
  return [OpCase(op, f"{'x'.join(map(str, a)) or 's'}_{'x'.join(map(str, b)) or 's'}",
                 (Arg(a, ka), Arg(b, kb)), {}, ref, rtol=2e-5)
          for a, b in BROADCAST_PAIRS]


def _conv_cases() -> list[OpCase]:
  configs = [
      # name, x, w, bias, attrs
      ("plain", (2, 3, 6, 6), (4, 3, 3, 3), False, {}),
      ("asym_pads_strides_dilations_bias", (1, 3, 9, 8), (5, 3, 3, 2), True,
       {"strides": (2, 1), "pads": (1, 2, 0, 1), "dilations": (1, 2)}),
      ("groups2_bias", (1, 4, 5, 5), (6, 2, 3, 3), True, {"pads": (1, 1, 1, 1), "groups": 2}),
      ("depthwise_stride2", (1, 3, 7, 7), (3, 1, 3, 3), False,
       {"strides": (2, 2), "pads": (1, 1, 1, 1), "groups": 3}),
      ("groups3_dilated", (2, 6, 7, 5), (9, 2, 2, 3), True,
       {"pads": (0, 1, 1, 0), "dilations": (2, 1), "groups": 3}),
      ("pointwise_stride2", (1, 4, 5, 6), (3, 4, 1, 1), True, {"strides": (2, 2)}),
  ]
  cases = []
  for name, xs, ws, bias, attrs in configs:
    args = (Arg(xs), Arg(ws)) + ((Arg((ws[0],)),) if bias else ())
    cases.append(OpCase("Conv2D", name, args, dict(attrs),
                        lambda *v, a=dict(attrs): ref_conv2d(*v, **a), rtol=1e-4, atol=1e-4))
    # The same convolution lowered tap by tap (`Impl.TAPS`) against the same reference.
    cases.append(OpCase("Conv2D", f"{name}_taps", args, dict(attrs, impl=int(Impl.TAPS)),
                        lambda *v, a=dict(attrs): ref_conv2d(*v, **a), rtol=1e-4, atol=1e-4))
  cases.append(OpCase("Conv2D", "depthwise_multiplier2_taps", (Arg((1, 3, 6, 5)),
                      Arg((6, 1, 3, 3)), Arg((6,))),
                      {"pads": (1, 1, 1, 1), "groups": 3, "impl": int(Impl.TAPS),
                       "activation": int(Activation.RELU)},
                      lambda *v: ref_conv2d(*v, pads=(1, 1, 1, 1), groups=3, activation=1),
                      rtol=1e-4, atol=1e-4))
  for act in list(Activation)[1:]:
    attrs = {"pads": (1, 0, 1, 2), "activation": int(act)}
    cases.append(OpCase("Conv2D", f"bias_{act.name.lower()}",
                        (Arg((1, 2, 5, 5)), Arg((3, 2, 3, 3)), Arg((3,))), attrs,
                        lambda *v, a=attrs: ref_conv2d(*v, **a), rtol=1e-4, atol=1e-4))
  return cases


def _matmul_cases() -> list[OpCase]:
  configs = [
      ("2d", (3, 4), (4, 5)),
      ("batched", (2, 3, 4), (2, 4, 5)),
      ("broadcast_batch", (2, 1, 3, 4), (5, 4, 2)),
      ("rank_mismatch", (3, 4), (2, 4, 5)),
      ("rank5", (2, 1, 2, 3, 4), (3, 1, 4, 2)),
  ]
  cases = [OpCase("MatMul", name, (Arg(a), Arg(b)), {}, lambda x, y: np.matmul(x, y),
                  rtol=1e-4, atol=1e-4) for name, a, b in configs]
  for act in list(Activation)[1:]:
    cases.append(OpCase("MatMul", f"act_{act.name.lower()}", (Arg((2, 3, 4)), Arg((4, 5))),
                        {"activation": int(act)},
                        lambda x, y, f=ACTIVATION_REFS[act]: f(np.matmul(x, y)),
                        rtol=1e-4, atol=1e-4))
  return cases


POOL_CONFIGS = (
    # name, x, kernel, strides, pads, ceil_mode
    ("k2s2", (1, 2, 6, 6), (2, 2), (2, 2), (0, 0, 0, 0), False),
    ("k3s2_pads", (2, 3, 7, 5), (3, 3), (2, 2), (1, 1, 1, 1), False),
    ("asym", (1, 2, 7, 7), (3, 2), (2, 3), (1, 0, 2, 1), False),
    ("ceil", (1, 2, 6, 7), (3, 3), (2, 2), (0, 0, 0, 0), True),
    ("ceil_pads_drop_last", (1, 1, 5, 5), (2, 2), (2, 2), (1, 1, 1, 1), True),
    ("ceil_asym", (1, 2, 8, 6), (3, 2), (2, 2), (2, 0, 1, 1), True),
    ("overlap_s1", (1, 1, 4, 5), (3, 3), (1, 1), (1, 2, 1, 0), False),
)


def _pool_cases(op: str) -> list[OpCase]:
  kind = "max" if op == "MaxPool" else "avg"
  cases = []
  for name, xs, k, s, p, ceil in POOL_CONFIGS:
    for cip in ((False,) if kind == "max" else (False, True)):
      attrs = {"kernel": k, "strides": s, "pads": p, "ceil_mode": ceil, "count_include_pad": cip}
      cases.append(OpCase(op, name + ("_include_pad" if cip else ""), (Arg(xs),), attrs,
                          lambda x, a=attrs: ref_pool(x, kind, **a)))
  for cip in ((False,) if kind == "max" else (False, True)):  # dilated
    attrs = {"kernel": (2, 3), "strides": (2, 1), "pads": (1, 0, 1, 2), "ceil_mode": True,
             "count_include_pad": cip, "dilations": (3, 2)}
    cases.append(OpCase(op, "dilated" + ("_include_pad" if cip else ""), (Arg((1, 2, 9, 8)),),
                        attrs, lambda x, a=attrs: ref_pool(x, kind, **a)))
  if kind == "max":
    attrs = {"kernel": (2, 3), "strides": (1, 2), "pads": (1, 1, 0, 2), "ceil_mode": True}
    cases.append(OpCase(op, "int32", (Arg((1, 2, 5, 6), "int", "int32"),),
                        attrs, lambda x, a=attrs: ref_pool(x, "max", count_include_pad=False, **a),
                        float64=False))
  # Every case again lowered tap by tap (`Impl.TAPS`), against the same reference.
  return cases + [dataclasses.replace(c, name=f"{c.name}_taps",
                                      attrs=dict(c.attrs, impl=int(Impl.TAPS))) for c in cases]


def _layer_norm_cases() -> list[OpCase]:
  def case(name, xs, axis, ss, bs, eps=1e-5):
    args = (Arg(xs), Arg(ss)) + ((Arg(bs),) if bs is not None else ())
    return OpCase("LayerNorm", name, args, {"axis": axis, "epsilon": eps},
                  lambda *v: ref_layer_norm(*v, axis=axis, epsilon=eps), rtol=1e-4, atol=1e-5)
  return [
      case("last_axis", (2, 3, 8), 2, (8,), (8,)),
      case("two_axes", (2, 3, 4), 1, (3, 4), (3, 4)),
      case("two_axes_broadcast_scale", (2, 3, 4), 1, (3, 1), (4,)),
      case("no_bias_eps", (4, 6), 1, (6,), None, eps=1e-2),
      case("whole_tensor", (3, 5), 0, (3, 5), (1, 5)),
  ]


def _batch_norm_cases() -> list[OpCase]:
  cases = []
  for xs, eps in (((2, 3, 4, 5), 1e-5), ((4, 3), 1e-3), ((2, 3, 5), 0.1)):
    c = xs[1]
    args = (Arg(xs), Arg((c,)), Arg((c,)), Arg((c,)), Arg((c,), "positive"))
    cases.append(OpCase("BatchNorm", f"rank{len(xs)}", args, {"epsilon": eps},
                        lambda *v, e=eps: ref_batch_norm(*v, epsilon=e), rtol=1e-5, atol=1e-5))
  return cases


def _reduce_cases(op: str) -> list[OpCase]:
  fn = np.mean if op == "ReduceMean" else np.sum
  cases = []
  for xs, axes in (((2, 3, 4), (1,)), ((2, 3, 4), (0, 2)), ((2, 3, 4), (0, 1, 2)),
                   ((2, 1, 3, 2, 2), (1, 3, 4)), ((5,), (0,))):
    for keep in (True, False):
      cases.append(OpCase(op, f"rank{len(xs)}_axes{''.join(map(str, axes))}_keep{int(keep)}",
                          (Arg(xs),), {"axes": axes_bits(axes), "keepdims": keep},
                          lambda x, a=axes, k=keep: fn(x, axis=a, keepdims=k)))
  # Integers keep their dtype; a mean truncates towards zero (as ONNX runtimes do).
  cases.append(OpCase(op, "int32", (Arg((3, 5), "int", "int32"),), {"axes": axes_bits((1,))},
                      lambda x: np.trunc(fn(x.astype(np.float64), axis=1, keepdims=True))
                      .astype(np.int32), float64=False, rtol=0, atol=0))
  return cases


def _concat_cases() -> list[OpCase]:
  configs = [
      ("two_axis0", [(2, 3), (4, 3)], 0),
      ("three_axis1", [(2, 1, 4), (2, 3, 4), (2, 2, 4)], 1),
      ("four_last_axis", [(2, 3, 1), (2, 3, 2), (2, 3, 3), (2, 3, 1)], 2),
      ("rank1", [(3,), (5,)], 0),
  ]
  return [OpCase("Concat", name, tuple(Arg(s) for s in shapes), {"axis": axis},
                 lambda *v, a=axis: np.concatenate(v, axis=a)) for name, shapes, axis in configs]


def _slice_cases() -> list[OpCase]:
  configs = [
      ((5, 6), 1, 1, 6, 2),
      ((5, 6), 0, 0, 5, 3),
      ((2, 7, 3), 1, 2, 7, 1),
      ((2, 7, 3), 1, 1, 3, 5),  # step longer than the range: one element
      ((2, 3, 4, 9), 3, 0, 9, 4),
  ]
  cases = []
  for xs, axis, start, end, step in configs:
    index = tuple([slice(None)] * axis + [slice(start, end, step)])
    cases.append(OpCase("Slice", f"rank{len(xs)}_axis{axis}_{start}_{end}_{step}", (Arg(xs),),
                        {"axis": axis, "start": start, "end": end, "step": step},
                        lambda x, i=index: x[i]))
  return cases


def _reshape_cases() -> list[OpCase]:
  configs = [((2, 3, 4), (6, 4)), ((2, 3, 4), (24,)), ((2, 3, 4), (2, 1, 12, 1)),
             ((24,), (2, 3, 2, 2)), ((1, 1), ()), ((6, 2), (1, 2, 1, 3, 2, 1))]
  return [OpCase("Reshape", f"{'x'.join(map(str, a))}_to_{'x'.join(map(str, b)) or 's'}",
                 (Arg(a),), reshape_attrs(b), lambda x, s=b: np.reshape(x, s))
          for a, b in configs]


def _transpose_cases() -> list[OpCase]:
  configs = [((3, 4), (1, 0)), ((2, 3, 4), (2, 0, 1)), ((2, 3, 4, 5), (0, 2, 3, 1)),
             ((2, 3, 1, 4, 2), (4, 2, 0, 3, 1)), ((2, 1, 3, 1, 2, 3), (5, 4, 3, 2, 1, 0)),
             ((2, 3, 4), (0, 1, 2))]
  return [OpCase("Transpose", f"rank{len(s)}_{''.join(map(str, p))}", (Arg(s),),
                 {"perm": padded_perm(p)}, lambda x, q=p: np.transpose(x, q))
          for s, p in configs]


def _squeeze_cases() -> list[OpCase]:
  configs = [((1, 3, 1, 4, 1), (0, 2)), ((1, 3, 1, 4, 1), (0, 2, 4)), ((3, 1), (1,)),
             ((1, 1), (0, 1))]
  return [OpCase("Squeeze", f"{'x'.join(map(str, s))}_axes{''.join(map(str, a))}", (Arg(s),),
                 {"axes": axes_bits(a)}, lambda x, b=a: np.squeeze(x, axis=b)) for s, a in configs]


def _unsqueeze_cases() -> list[OpCase]:
  configs = [((3, 4), (0, 3)), ((3, 4), (1, 2)), ((), (0,)), ((2, 3), (0, 1, 2, 3)),
             ((2, 3), (1, 3))]
  return [OpCase("Unsqueeze", f"{'x'.join(map(str, s)) or 's'}_axes{''.join(map(str, a))}",
                 (Arg(s),), {"axes": axes_bits(a)}, lambda x, b=a: np.expand_dims(x, b))
          for s, a in configs]


def _gather_cases() -> list[OpCase]:
  configs = [
      ("axis0", (5, 4), (3,), 5, 0),
      ("axis1_rank2_indices", (3, 6, 2), (2, 4), 6, 1),
      ("axis1_scalar_index", (4, 3), (), 3, 1),
      ("axis0_embedding", (7, 3), (2, 5), 7, 0),
  ]
  return [OpCase("Gather", name, (Arg(ds), Arg(ix, f"index{bound}", "int32")), {"axis": axis},
                 lambda d, i, a=axis: np.take(d, i, axis=a), float64=False)
          for name, ds, ix, bound, axis in configs]


def _pad_cases() -> list[OpCase]:
  configs = [
      ("constant", (3, 4), ((1, 2), (0, 3)), 0, 1.5),
      ("constant_rank1", (5,), ((2, 1),), 0, 0.0),
      ("reflect", (2, 3, 4, 5), ((0, 0), (0, 1), (2, 1), (1, 3)), 1, 0.0),
      ("edge", (3, 4), ((2, 0), (1, 2)), 2, 0.0),
  ]
  modes = ("constant", "reflect", "edge")
  cases = []
  for name, xs, pads, mode, value in configs:
    def ref(x, p=pads, m=modes[mode], v=value):
      return np.pad(x, p, mode=m, constant_values=v) if m == "constant" else np.pad(x, p, mode=m)
    cases.append(OpCase("Pad", name, (Arg(xs),),
                        {"pads": pad_attrs(pads), "mode": mode, "value": value}, ref))
  return cases


def _cast_cases() -> list[OpCase]:
  configs = [("f32_to_i32", "wide", "float32", "int32"), ("f32_to_f16", "normal", "float32",
                                                          "float16"),
             ("f32_to_bool", "sparse", "float32", "bool"), ("i32_to_f32", "int", "int32",
                                                            "float32"),
             ("bool_to_f32", "bool", "bool", "float32"), ("f32_to_f32", "normal", "float32",
                                                          "float32")]
  return [OpCase("Cast", name, (Arg((3, 5), kind, src),), {"to": int(ops.dtype_code(dst))},
                 lambda x, d=dst: x.astype(d), float64=False, rtol=0, atol=0)
          for name, kind, src, dst in configs]


def _where_cases() -> list[OpCase]:
  configs = [("same", (3, 4), (3, 4), (3, 4)), ("broadcast", (3, 1), (1, 4), (2, 3, 4)),
             ("scalar_branch", (2, 3), (), (3,))]
  return [OpCase("Where", name, (Arg(c, "bool", "bool"), Arg(a), Arg(b)), {},
                 lambda c, x, y: np.where(c, x, y)) for name, c, a, b in configs]


def _clip_cases() -> list[OpCase]:
  cases = []
  for name, bounds in (("both", {"min": -0.5, "max": 0.7}), ("min_only", {"min": 0.2}),
                       ("max_only", {"max": -0.1})):
    lo, hi = bounds.get("min", -np.inf), bounds.get("max", np.inf)
    cases.append(OpCase("Clip", name, (Arg((3, 4)),), dict(bounds),
                        lambda x, lo=lo, hi=hi: np.clip(x, lo, hi)))
  cases.append(OpCase("Clip", "int32", (Arg((3, 4), "int", "int32"),), {"min": -3.0, "max": 4.0},
                      lambda x: np.clip(x, -3, 4), float64=False))
  cases.append(OpCase("Clip", "float16_default_min", (Arg((3, 4), "normal", "float16"),),
                      {"max": 0.7}, lambda x: np.minimum(x, np.float16(0.7)), float64=False,
                      rtol=0, atol=0))
  cases.append(OpCase("Clip", "int32_max_only", (Arg((3, 4), "int", "int32"),), {"max": 2.0},
                      lambda x: np.minimum(x, 2), float64=False))
  return cases


def _hard_sigmoid_cases() -> list[OpCase]:
  return [OpCase("HardSigmoid", name, (Arg((3, 7), "wide"),), attrs,
                 lambda x, a=attrs.get("alpha", 0.2), b=attrs.get("beta", 0.5):
                 np.maximum(0.0, np.minimum(1.0, a * x + b)))
          for name, attrs in (("default", {}), ("alpha_beta", {"alpha": 0.3, "beta": 0.4}))]


def _hard_swish_cases() -> list[OpCase]:
  return [OpCase("HardSwish", "wide", (Arg((4, 7), "wide"),), {},
                 lambda x: x * np.maximum(0.0, np.minimum(1.0, x / 6.0 + 0.5)))]


def _gelu_cases() -> list[OpCase]:
  return [OpCase("Gelu", "exact", (Arg((3, 7), "wide"),), {"approximate": False},
                 lambda x: ref_gelu(x, False)),
          OpCase("Gelu", "tanh", (Arg((3, 7), "wide"),), {"approximate": True},
                 lambda x: ref_gelu(x, True))]


def _softmax_cases() -> list[OpCase]:
  def ref(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)
  configs = [((2, 3, 4), 0), ((2, 3, 4), 1), ((2, 3, 4), 2), ((5,), 0)]
  return [OpCase("Softmax", f"rank{len(s)}_axis{a}", (Arg(s, "wide"),), {"axis": a},
                 lambda x, a=a: ref(x, a)) for s, a in configs]


def _global_avg_pool_cases() -> list[OpCase]:
  return [OpCase("GlobalAvgPool", "x".join(map(str, s)), (Arg(s),), {},
                 lambda x: x.mean(axis=(2, 3), keepdims=True))
          for s in ((2, 3, 5, 4), (1, 1, 1, 1))] + [
              OpCase("GlobalAvgPool", "int32", (Arg((1, 2, 3, 4), "int", "int32"),), {},
                     lambda x: np.trunc(x.astype(np.float64).mean(axis=(2, 3), keepdims=True))
                     .astype(np.int32), float64=False, rtol=0, atol=0)]


def _enlarge_cases() -> list[OpCase]:
  configs = [((4, 2, 1, 1), (3, 3)), ((3, 2, 3, 1), (5, 3)), ((2, 1, 3, 3), (3, 3)),
             ((2, 2, 1, 3), (5, 7))]
  cases = []
  for ws, k in configs:
    dh, dw = (k[0] - ws[2]) // 2, (k[1] - ws[3]) // 2
    def ref(w, dh=dh, dw=dw, k=k):
      out = np.zeros(w.shape[:2] + tuple(k), w.dtype)
      out[:, :, dh:dh + w.shape[2], dw:dw + w.shape[3]] = w
      return out
    cases.append(OpCase("Enlarge", f"{ws[2]}x{ws[3]}_to_{k[0]}x{k[1]}", (Arg(ws),),
                        {"kernel": k}, ref))
  return cases


MERGE_GCONV_CONFIGS = (
    # weight shape [O, I/g, kh, kw], groups, count
    ((8, 2, 3, 3), 4, 2),
    ((8, 2, 3, 3), 4, 4),
    ((12, 1, 1, 1), 6, 3),
    ((6, 3, 2, 2), 2, 1),
    ((12, 2, 3, 1), 6, 2),
)


def _merge_gconv_cases() -> list[OpCase]:
  return [OpCase("MergeGConv", f"O{ws[0]}_g{g}_c{c}", (Arg(ws),), {"groups": g, "count": c},
                 lambda w, g=g, c=c: ref_merge_gconv(w, groups=g, count=c))
          for ws, g, c in MERGE_GCONV_CONFIGS]


# ------------------------------------------------------------------ ONNX-import ops
# One or two small cases per op keep the default suite cheap; the compare/logic and activation
# references are plain numpy, written from the ONNX definitions.

def ref_elu(x: np.ndarray, alpha: float = 1.0) -> np.ndarray:
  """ONNX Elu: x for x >= 0, alpha * (exp(x) - 1) below."""
  return np.where(x >= 0, x, alpha * (np.exp(np.minimum(x, 0)) - 1.0))


def ref_softplus(x: np.ndarray) -> np.ndarray:
  """ln(exp(x) + 1), computed without overflow."""
  return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


_SELU_ALPHA, _SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875

# op: (reference, value kind, attributes)
ONNX_UNARY_REFS: dict[str, tuple[Reference, str, dict[str, Any]]] = {
    "Sign": (np.sign, "sparse", {}),
    "Abs": (np.abs, "normal", {}),
    "Floor": (np.floor, "halves", {}),
    "Ceil": (np.ceil, "halves", {}),
    "Round": (np.round, "halves", {}),  # numpy rounds halves to even, as ONNX does
    "LeakyRelu": (lambda x: np.where(x < 0, 0.1 * x, x), "normal", {"alpha": 0.1}),
    "Elu": (lambda x: ref_elu(x, 0.7), "wide", {"alpha": 0.7}),
    "Selu": (lambda x: _SELU_GAMMA * ref_elu(x, _SELU_ALPHA), "wide", {}),
    "Celu": (lambda x: np.maximum(x, 0) + np.minimum(0.5 * (np.exp(np.minimum(x, 0) / 0.5) - 1),
                                                     0), "wide", {"alpha": 0.5}),
    "Softplus": (ref_softplus, "wide", {}),
    "Softsign": (lambda x: x / (1 + np.abs(x)), "wide", {}),
    "Mish": (lambda x: x * np.tanh(ref_softplus(x)), "wide", {}),
    "Shrink": (lambda x: np.where(x < -0.6, x + 0.3, np.where(x > 0.6, x - 0.3, 0.0)), "wide",
               {"bias": 0.3, "lambd": 0.6}),
    "ThresholdedRelu": (lambda x: np.where(x > 0.4, x, 0.0), "normal", {"alpha": 0.4}),
}


def _activation_cases(op: str) -> list[OpCase]:
  ref, kind, attrs = ONNX_UNARY_REFS[op]
  cases = [OpCase(op, "rank3", (Arg((2, 3, 4), kind),), attrs, ref)]
  if op in ("Sign", "Abs"):  # integers too
    cases.append(OpCase(op, "int32", (Arg((3, 5), "int", "int32"),), attrs,
                        lambda x, f=ref: f(x).astype(np.int32), float64=False, rtol=0, atol=0))
  return cases


COMPARE_REFS: dict[str, Reference] = {
    "Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
    "GreaterOrEqual": np.greater_equal,
}


def _compare_cases(op: str) -> list[OpCase]:
  ref = COMPARE_REFS[op]
  # "small_int" makes ties, so == and <= differ from < on some elements.
  return [OpCase(op, "f32_broadcast", (Arg((2, 3, 4), "small_int"), Arg((3, 1), "small_int")),
                 {}, ref, rtol=0, atol=0),
          OpCase(op, "int32", (Arg((3, 4), "int", "int32"), Arg((4,), "int", "int32")), {}, ref,
                 rtol=0, atol=0)]


LOGIC_REFS: dict[str, Reference] = {
    "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor,
}


def _logic_cases(op: str) -> list[OpCase]:
  return [OpCase(op, "broadcast", (Arg((2, 3, 4), "bool", "bool"), Arg((3, 1), "bool", "bool")),
                 {}, LOGIC_REFS[op], rtol=0, atol=0)]


def _not_cases() -> list[OpCase]:
  return [OpCase("Not", "rank2", (Arg((3, 4), "bool", "bool"),), {}, np.logical_not, rtol=0,
                 atol=0)]


def _mod_cases() -> list[OpCase]:
  return [OpCase("Mod", "fmod_float", (Arg((3, 4), "wide"), Arg((4,), "away")), {"fmod": True},
                 np.fmod),
          OpCase("Mod", "int32_sign_of_divisor",
                 (Arg((3, 4), "int", "int32"), Arg((3, 4), "nonzero_int", "int32")),
                 {"fmod": False}, np.mod, float64=False, rtol=0, atol=0),
          OpCase("Mod", "int32_fmod", (Arg((3, 4), "int", "int32"), Arg((4,), "nonzero_int",
                                                                         "int32")),
                 {"fmod": True}, np.fmod, float64=False, rtol=0, atol=0)]


def _is_nan_cases() -> list[OpCase]:
  return [OpCase("IsNaN", "special", (Arg((4, 5), "special"),), {}, np.isnan, rtol=0, atol=0)]


def _is_inf_cases() -> list[OpCase]:
  return [OpCase("IsInf", f"pos{int(p)}_neg{int(n)}", (Arg((4, 5), "special"),),
                 {"detect_positive": p, "detect_negative": n},
                 lambda x, p=p, n=n: (np.isposinf(x) & p) | (np.isneginf(x) & n), rtol=0, atol=0)
          for p, n in ((True, True), (False, True), (True, False))]


def _prelu_cases() -> list[OpCase]:
  return [OpCase("PRelu", "per_channel", (Arg((2, 3, 4, 4)), Arg((3, 1, 1))), {},
                 lambda x, s: np.where(x < 0, s * x, x))]


def _log_softmax_cases() -> list[OpCase]:
  def ref(x, axis):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))
  return [OpCase("LogSoftmax", f"rank{len(s)}_axis{a}", (Arg(s, "wide"),), {"axis": a},
                 lambda x, a=a: ref(x, a)) for s, a in (((2, 3, 4), 1), ((5,), 0))]


def _ref_logsumexp(x, axis, keepdims):
  m = np.max(x, axis=axis, keepdims=True)
  out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
  return out if keepdims else np.squeeze(out, axis=axis)


REDUCE_REFS: dict[str, tuple[Reference, str]] = {
    "ReduceMax": (np.max, "normal"), "ReduceMin": (np.min, "normal"),
    "ReduceProd": (np.prod, "positive"),
    "ReduceL1": (lambda x, axis, keepdims: np.sum(np.abs(x), axis=axis, keepdims=keepdims),
                 "normal"),
    "ReduceL2": (lambda x, axis, keepdims: np.sqrt(np.sum(x * x, axis=axis, keepdims=keepdims)),
                 "normal"),
    "ReduceLogSumExp": (_ref_logsumexp, "wide"),
}


def _more_reduce_cases(op: str) -> list[OpCase]:
  fn, kind = REDUCE_REFS[op]
  cases = [OpCase(op, f"rank{len(xs)}_axes{''.join(map(str, axes))}_keep{int(keep)}",
                  (Arg(xs, kind),), {"axes": axes_bits(axes), "keepdims": keep},
                  lambda x, a=axes, k=keep: fn(x, axis=a, keepdims=k))
           for xs, axes, keep in (((2, 3, 4), (1,), True), ((2, 3, 4), (0, 2), False))]
  if op in ("ReduceMax", "ReduceMin", "ReduceProd"):
    cases.append(OpCase(op, "int32", (Arg((3, 4), "int", "int32"),), {"axes": axes_bits((1,))},
                        lambda x: fn(x, axis=(1,), keepdims=True).astype(np.int32),
                        float64=False, rtol=0, atol=0))
  return cases


def _ref_arg(x: np.ndarray, fn: Callable[..., np.ndarray], axis: int, keepdims: bool,
             last: bool) -> np.ndarray:
  """ONNX ArgMax/ArgMin: the first (or last) index of the extreme value along `axis`."""
  if last:
    idx = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis)
  else:
    idx = fn(x, axis=axis)
  return np.expand_dims(idx, axis) if keepdims else idx


def _arg_cases(op: str) -> list[OpCase]:
  fn = np.argmax if op == "ArgMax" else np.argmin
  cases = []
  for name, xs, kind, axis, keep, last in (("axis1_keep", (2, 5, 3), "normal", 1, True, False),
                                           ("ties_first", (4, 6), "small_int", 1, False, False),
                                           ("ties_last", (4, 6), "small_int", 0, True, True)):
    cases.append(OpCase(op, name, (Arg(xs, kind),),
                        {"axes": axes_bits((axis,)), "keepdims": keep, "select_last_index": last},
                        lambda x, a=axis, k=keep, l=last: _ref_arg(x, fn, a, k, l), rtol=0,
                        atol=0))
  return cases


def _expand_cases() -> list[OpCase]:
  configs = [("to_rank3", (3, 1), (2, 3, 4)), ("same_rank", (1, 4), (3, 4))]
  cases = [OpCase("Expand", name, (Arg(xs),), reshape_attrs(out),
                  lambda x, o=out: np.broadcast_to(x, o)) for name, xs, out in configs]
  cases.append(OpCase("Expand", "bool", (Arg((1, 3), "bool", "bool"),), reshape_attrs((2, 3)),
                      lambda x: np.broadcast_to(x, (2, 3)), rtol=0, atol=0))
  return cases


def _tile_cases() -> list[OpCase]:
  configs = [("rank2", (2, 3), (2, 3)), ("rank3_one_axis", (2, 1, 3), (1, 4, 1))]
  return [OpCase("Tile", name, (Arg(xs),), {"reps": (1,) * (MAX_RANK - len(r)) + r},
                 lambda x, r=r: np.tile(x, r)) for name, xs, r in configs]


def _gather_elements_cases() -> list[OpCase]:
  def ref(data, idx, axis):
    size = data.shape[axis]
    idx = np.where(idx < 0, idx + size, idx)
    crop = tuple(slice(None) if d == axis else slice(0, idx.shape[d]) for d in range(data.ndim))
    return np.take_along_axis(data[crop], idx, axis=axis)
  return [OpCase("GatherElements", "axis1", (Arg((3, 4)), Arg((3, 5), "index4", "int32")),
                 {"axis": 1}, lambda d, i: ref(d, i, 1)),
          OpCase("GatherElements", "axis0_smaller", (Arg((4, 3, 2)), Arg((2, 2, 2), "index4",
                                                                        "int32")),
                 {"axis": 0}, lambda d, i: ref(d, i, 0))]


def _ref_cumsum(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
  """ONNX CumSum by explicit loops over the axis (not np.cumsum's flip/shift tricks)."""
  out = np.zeros_like(x)
  n = x.shape[axis]
  for i in range(n):
    js = [j for j in range(n) if (j > i if reverse else j < i) or (j == i and not exclusive)]
    sel = np.take(x, js, axis=axis).sum(axis=axis) if js else 0
    idx = [slice(None)] * x.ndim
    idx[axis] = i
    out[tuple(idx)] = sel
  return out


def _cumsum_cases() -> list[OpCase]:
  return [OpCase("CumSum", f"axis{a}_excl{int(e)}_rev{int(r)}", (Arg((3, 4)),),
                 {"axis": a, "exclusive": e, "reverse": r},
                 lambda x, a=a, e=e, r=r: _ref_cumsum(x, a, e, r))
          for a, e, r in ((1, False, False), (0, True, True), (1, True, False))]


def _trilu_cases() -> list[OpCase]:
  def ref(x, upper, k):
    i = np.arange(x.shape[-2])[:, None]
    j = np.arange(x.shape[-1])[None, :]
    keep = (j - i >= k) if upper else (j - i <= k)
    return np.where(keep, x, 0.0)
  return [OpCase("Trilu", f"{'upper' if u else 'lower'}_k{k}", (Arg((2, 4, 5)),),
                 {"upper": u, "k": k}, lambda x, u=u, k=k: ref(x, u, k))
          for u, k in ((True, 0), (False, -1), (True, 2))]


def _ref_top_k(x: np.ndarray, axis: int, k: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
  """Values and indices of the k largest (smallest) along axis, equal values by lower index."""
  moved = np.moveaxis(x, axis, -1)
  order = np.argsort(-moved if largest else moved, axis=-1, kind="stable")[..., :k]
  values = np.take_along_axis(moved, order, axis=-1)
  return np.moveaxis(values, -1, axis), np.moveaxis(order, -1, axis)


def _top_k_cases(which: int) -> list[OpCase]:
  op = ("TopKValues", "TopKIndices")[which]
  exact = dict(rtol=0, atol=0) if which else {}
  return [OpCase(op, name, (Arg(xs, kind),), {"axis": a, "k": k, "largest": big},
                 lambda x, a=a, k=k, big=big: _ref_top_k(x, a, k, big)[which], **exact)
          for name, xs, kind, a, k, big in (("largest_axis1", (3, 6, 2), "normal", 1, 3, True),
                                            ("smallest_ties", (4, 5), "small_int", 1, 2, False),
                                            ("largest_ties_axis0", (6, 3), "small_int", 0, 4,
                                             True))]


def ref_conv_transpose(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None, *,
                       strides: Sequence[int] = (1, 1), pads: Sequence[int] = (0, 0, 0, 0),
                       dilations: Sequence[int] = (1, 1), groups: int = 1,
                       output_padding: Sequence[int] = (0, 0)) -> np.ndarray:
  """ONNX ConvTranspose by scattering: every input value adds value * kernel at its strided
  position into the full output, which is then cropped by the pads (x NCHW, w [C, O/g, kh, kw])."""
  n, c, h, wd = x.shape
  _, og, kh, kw = w.shape
  (sh, sw), (dh, dw), (oph, opw) = strides, dilations, output_padding
  full = np.zeros((n, og * groups, sh * (h - 1) + dh * (kh - 1) + 1 + oph,
                   sw * (wd - 1) + dw * (kw - 1) + 1 + opw))
  cg = c // groups
  for g in range(groups):
    xg, wg = x[:, g * cg:(g + 1) * cg], w[g * cg:(g + 1) * cg]
    for p in range(kh):
      for q in range(kw):
        full[:, g * og:(g + 1) * og, p * dh:p * dh + sh * (h - 1) + 1:sh,
             q * dw:q * dw + sw * (wd - 1) + 1:sw] += np.einsum("ncij,co->noij", xg, wg[:, :, p, q])
  pt, pl, pb, pr = pads
  out = full[:, :, pt:full.shape[2] - pb, pl:full.shape[3] - pr]
  return out if bias is None else out + bias[None, :, None, None]


def _conv_transpose_cases() -> list[OpCase]:
  configs = [("stride2_pads", (2, 4, 5, 6), (4, 3, 3, 3), True,
              dict(strides=(2, 2), pads=(1, 0, 0, 1))),
             ("groups_dilations_output_padding", (1, 4, 4, 5), (4, 2, 3, 2), False,
              dict(strides=(2, 3), dilations=(2, 1), groups=2, output_padding=(1, 2)))]
  cases = []
  for name, xs, ws, bias, attrs in configs:
    args = (Arg(xs), Arg(ws)) + ((Arg((ws[1] * attrs.get("groups", 1),)),) if bias else ())
    cases.append(OpCase("ConvTranspose", name, args, attrs,
                        lambda *v, a=attrs: ref_conv_transpose(*v, **a), rtol=1e-4, atol=1e-4))
  return cases


CASE_BUILDERS: dict[str, Callable[[], list[OpCase]]] = {
    **{op: (lambda op=op: _unary_cases(op)) for op in UNARY_REFS},
    **{op: (lambda op=op: _binary_cases(op)) for op in BINARY_REFS},
    "Conv2D": _conv_cases,
    "MatMul": _matmul_cases,
    "MaxPool": lambda: _pool_cases("MaxPool"),
    "AvgPool": lambda: _pool_cases("AvgPool"),
    "GlobalAvgPool": _global_avg_pool_cases,
    "Softmax": _softmax_cases,
    "LayerNorm": _layer_norm_cases,
    "BatchNorm": _batch_norm_cases,
    "ReduceMean": lambda: _reduce_cases("ReduceMean"),
    "ReduceSum": lambda: _reduce_cases("ReduceSum"),
    "Concat": _concat_cases,
    "Slice": _slice_cases,
    "Reshape": _reshape_cases,
    "Transpose": _transpose_cases,
    "Squeeze": _squeeze_cases,
    "Unsqueeze": _unsqueeze_cases,
    "Gather": _gather_cases,
    "Pad": _pad_cases,
    "Cast": _cast_cases,
    "Where": _where_cases,
    "Clip": _clip_cases,
    "HardSigmoid": _hard_sigmoid_cases,
    "HardSwish": _hard_swish_cases,
    "Gelu": _gelu_cases,
    "Enlarge": _enlarge_cases,
    "MergeGConv": _merge_gconv_cases,
    **{op: (lambda op=op: _activation_cases(op)) for op in ONNX_UNARY_REFS},
    **{op: (lambda op=op: _compare_cases(op)) for op in COMPARE_REFS},
    **{op: (lambda op=op: _logic_cases(op)) for op in LOGIC_REFS},
    "Not": _not_cases,
    "Mod": _mod_cases,
    "IsNaN": _is_nan_cases,
    "IsInf": _is_inf_cases,
    "PRelu": _prelu_cases,
    "LogSoftmax": _log_softmax_cases,
    **{op: (lambda op=op: _more_reduce_cases(op)) for op in REDUCE_REFS},
    "ArgMax": lambda: _arg_cases("ArgMax"),
    "ArgMin": lambda: _arg_cases("ArgMin"),
    "Expand": _expand_cases,
    "Tile": _tile_cases,
    "GatherElements": _gather_elements_cases,
    "CumSum": _cumsum_cases,
    "Trilu": _trilu_cases,
    "TopKValues": lambda: _top_k_cases(0),
    "TopKIndices": lambda: _top_k_cases(1),
    "ConvTranspose": _conv_transpose_cases,
}


def all_cases() -> list[OpCase]:
  """Every numerics case of every op in `CASE_BUILDERS` that is registered, in table order."""
  registered = {s.name for s in ops.all_specs()}
  return [c for op, build in CASE_BUILDERS.items() if op in registered for c in build()]


ALL_CASES = all_cases()


# ------------------------------------------------------------------ tests

def test_every_registered_op_has_a_numerics_case():
  registered = {s.name for s in ops.all_specs() if not s.source}
  untested = sorted(registered - set(CASE_BUILDERS))
  assert not untested, (f"registered ops without a numerics test: {untested}; add a case builder "
                        "to CASE_BUILDERS in tests/test_ops.py")
  stale = sorted(set(CASE_BUILDERS) - registered)
  assert not stale, f"CASE_BUILDERS names ops that are not registered: {stale}"
  for op, build in CASE_BUILDERS.items():
    cases = build()
    assert cases, f"no cases for {op}"
    assert all(c.op == op for c in cases), op
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), f"duplicate case names for {op}: {ids}"


# The folded (all-constant) path runs op by op outside `jit`, which costs more per case: it runs
# the first case of every op, and every case of the weight transforms that rewrites always fold.
FOLDED_CASES = [c for i, c in enumerate(ALL_CASES)
                if i == 0 or c.op != ALL_CASES[i - 1].op or c.op in ("Enlarge", "MergeGConv")]


def _check_case(case: OpCase, as_constants: bool) -> None:
  values = make_values(case)
  with warnings.catch_warnings():
    # An overflow or invalid-value warning from a lowering on valid operands is a bug.
    warnings.simplefilter("error", RuntimeWarning)
    out, stored_shape, stored_dtype = run_case(case, values, as_constants=as_constants)
  ref_args = [_f64(v) if case.float64 and np.issubdtype(v.dtype, np.floating) else v
              for v in values]
  expected = np.asarray(case.reference(*ref_args))
  assert out.shape == expected.shape == stored_shape, (
      f"{case.id}: lowering gives {out.shape}, reference {expected.shape}, node {stored_shape}")
  # int64 nodes (ArgMax, ArgMin) compute in int32 unless jax_enable_x64 is on.
  assert out.dtype == jax.dtypes.canonicalize_dtype(ops.numpy_dtype(stored_dtype)), (
      out.dtype, stored_dtype)
  if not case.float64:
    assert out.dtype == expected.dtype, (out.dtype, expected.dtype)
  if case.rtol == 0 and case.atol == 0:
    np.testing.assert_array_equal(out, expected, err_msg=case.id)
  else:
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=case.rtol, atol=case.atol,
                               err_msg=case.id)


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.id)
def test_op_numerics(case: OpCase):
  """The op on graph inputs: the jitted path every timed graph takes."""
  _check_case(case, as_constants=False)


# Ops that exist for ONNX import: rewrites never fold them, so their folded path (the same
# lowering, op by op) runs under -m slow.
IMPORT_OPS = {*ONNX_UNARY_REFS, *COMPARE_REFS, *LOGIC_REFS, *REDUCE_REFS, "Not", "Mod", "IsNaN",
              "IsInf", "PRelu", "LogSoftmax", "ArgMax", "ArgMin", "Expand", "Tile",
              "GatherElements", "CumSum", "Trilu", "TopKValues", "TopKIndices", "ConvTranspose"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c.op in IMPORT_OPS
                                  else c for c in FOLDED_CASES], ids=lambda c: c.id)
def test_op_numerics_folded(case: OpCase):
  """The op on constants: evaluated once at lowering (weight pre-processing)."""
  _check_case(case, as_constants=True)


# Ops whose output a positive rescaling of the operands need not change (the check below
# rescales): Cast (rounding), Sign and the NaN/inf tests; comparisons of integer-valued floats
# and ties of ArgMax/ArgMin are checked against hand-made values in test_issue17_references.
SCALE_INVARIANT = {"Cast", "Sign", "IsNaN", "IsInf", *COMPARE_REFS, "ArgMax", "ArgMin",
                   "TopKIndices"}


def test_issue17_references():
  """Hand-checked values for references the rescaling check cannot guard."""
  x = np.asarray([[1.0, 3.0, 3.0, 0.0]])
  assert _ref_arg(x, np.argmax, 1, False, False).tolist() == [1]
  assert _ref_arg(x, np.argmax, 1, True, True).tolist() == [[2]]
  assert _ref_arg(x, np.argmin, 1, False, True).tolist() == [3]
  assert np.sign(np.asarray([-2.0, 0.0, 3.0])).tolist() == [-1.0, 0.0, 1.0]
  assert np.round(np.asarray([0.5, 1.5, 2.5, -0.5])).tolist() == [0.0, 2.0, 2.0, -0.0]
  assert np.mod(np.asarray([-7, 7]), np.asarray([3, -3])).tolist() == [2, -2]
  assert np.fmod(np.asarray([-7, 7]), np.asarray([3, -3])).tolist() == [-1, 1]
  v, i = _ref_top_k(np.asarray([[2.0, 5.0, 5.0, 1.0]]), 1, 3, True)
  assert v.tolist() == [[5.0, 5.0, 2.0]] and i.tolist() == [[1, 2, 0]]
  v, i = _ref_top_k(np.asarray([[2.0, 1.0, 1.0]]), 1, 2, False)
  assert v.tolist() == [[1.0, 1.0]] and i.tolist() == [[1, 2]]
  assert _ref_cumsum(np.asarray([1.0, 2.0, 4.0]), 0, True, True).tolist() == [6.0, 4.0, 0.0]
  # A 1x1 input spreads the kernel; stride 2 leaves zeros between two inputs' kernels.
  k = np.arange(4.0).reshape(1, 1, 2, 2)
  assert ref_conv_transpose(np.ones((1, 1, 1, 1)), k)[0, 0].tolist() == [[0, 1], [2, 3]]
  two = ref_conv_transpose(np.ones((1, 1, 1, 2)), k, strides=(1, 3))[0, 0]
  assert two.tolist() == [[0, 1, 0, 0, 1], [2, 3, 0, 2, 3]]
  values = make_values(_is_inf_cases()[0])[0]
  assert np.isnan(values).any() and np.isposinf(values).any() and np.isneginf(values).any()


def test_references_are_not_trivial():
  """Guards the harness: a reference that ignores its operands would let a case pass anything."""
  rng = np.random.default_rng(0)
  for case in ALL_CASES:
    values = make_values(case)
    ref_args = [_f64(v) if case.float64 and np.issubdtype(v.dtype, np.floating) else v
                for v in values]
    expected = np.asarray(case.reference(*ref_args))
    assert np.all(np.isfinite(expected.astype(np.float64))), f"{case.id}: non-finite reference"
    floats = [i for i, v in enumerate(ref_args) if np.issubdtype(v.dtype, np.floating)]
    if case.op in SCALE_INVARIANT or not floats:
      continue
    # A random relative change of the first floating operand (keeps signs, so the domains of
    # Log, Sqrt and divisors are respected) must change the expected output.
    i = floats[0]
    perturbed = list(ref_args)
    perturbed[i] = ref_args[i] * rng.uniform(1.1, 1.5, ref_args[i].shape).astype(
        ref_args[i].dtype)
    changed = np.asarray(case.reference(*perturbed))
    assert not np.allclose(changed, expected), f"{case.id}: reference ignores operand {i}"


@pytest.mark.parametrize("shape,groups,count", MERGE_GCONV_CONFIGS,
                         ids=[f"O{s[0]}_g{g}_c{c}" for s, g, c in MERGE_GCONV_CONFIGS])
@pytest.mark.parametrize("weight_is_input", [False, True], ids=["folded", "dynamic"])
def test_merge_gconv_preserves_grouped_convolution(shape: tuple[int, ...], groups: int,
                                                   count: int, weight_is_input: bool):
  """conv(x, merge_gconv(w, g, c), groups=g/c) == conv(x, w, groups=g): TASO's merge rule."""
  rng = np.random.default_rng(groups * 10 + count)
  o, ig, kh, kw = shape
  x = rng.standard_normal((2, ig * groups, 6, 5)).astype(np.float32)
  w = rng.standard_normal(shape).astype(np.float32)
  pads = (kh // 2, kw // 2, (kh - 1) // 2, (kw - 1) // 2)
  b = GraphBuilder(seed=0)
  xt = b.input(x.shape)
  wt = b.input(w.shape) if weight_is_input else b.constant(w)
  merged = b.merge_gconv(wt, groups=groups, count=count)
  y_merged = b.conv2d(xt, merged, padding=pads, groups=groups // count)
  y_grouped = b.conv2d(xt, wt, padding=pads, groups=groups)
  b.output(y_merged, y_grouped)
  graph, params = b.build(capacity=8)
  feeds = [x, w] if weight_is_input else [x]
  out_merged, out_grouped = (np.asarray(v) for v in executor.lower(graph, params)(*feeds))
  expected = ref_conv2d(x, w, pads=pads, groups=groups)
  np.testing.assert_allclose(out_grouped, expected, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(out_merged, expected, rtol=1e-4, atol=1e-4)
