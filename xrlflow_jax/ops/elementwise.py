"""Elementwise operators: unary maths and activations, binary ops with broadcasting,
comparisons and logic (bool results), Where, Cast.

Every op here keeps its (broadcast) input shape; the shape rules are shared, so under `vmap`
they cost one `lax.switch` branch each (see `ops.infer_shape_jit`)."""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from xrlflow_jax.ops import spec
from xrlflow_jax.ops.codes import Op
from xrlflow_jax.ops.spec import AttrField, OpSpec


def _same_shape_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del attrs, n_inputs
  return in_shapes[0].astype(xp.int32), in_ranks[0], []


@functools.lru_cache(maxsize=None)
def _flops_per_element(cost: float) -> spec.FlopRule:
  """`cost` FLOPs per output element (one function per cost: ops with equal costs share it)."""
  def rule(xp, in_shapes, in_ranks, out_shape, attrs):
    del in_shapes, in_ranks, attrs
    return cost * spec.numel(xp, out_shape)
  return rule


def _broadcast_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del attrs, n_inputs
  return spec.broadcast_shapes(xp, in_shapes, in_ranks, 2)


def _where_rule(xp, in_shapes, in_ranks, attrs, n_inputs):
  del attrs, n_inputs
  return spec.broadcast_shapes(xp, in_shapes, in_ranks, 3)


def _unary(code: Op, name: str, fn: Callable[..., Any], cost: float = 1.0,
           attrs: tuple[AttrField, ...] = (), dtype_rule: str = "input0") -> OpSpec:
  return spec.register(OpSpec(
      code=code, name=name, min_inputs=1, max_inputs=1, attrs=attrs,
      shape_rule=_same_shape_rule,
      lower=lambda inputs, a, out_shape, out_dtype: fn(inputs[0], **a),
      flops=_flops_per_element(cost), dtype_rule=dtype_rule, elementwise=True))


def _binary(code: Op, name: str, fn: Callable[..., Any], cost: float = 1.0,
            attrs: tuple[AttrField, ...] = (), dtype_rule: str = "input0") -> OpSpec:
  return spec.register(OpSpec(
      code=code, name=name, min_inputs=2, max_inputs=2, attrs=attrs,
      shape_rule=_broadcast_rule,
      lower=lambda inputs, a, out_shape, out_dtype: fn(inputs[0], inputs[1], **a),
      flops=_flops_per_element(cost), dtype_rule=dtype_rule, elementwise=True))


def _hard_sigmoid(x, alpha, beta):
  return jnp.clip(alpha * x + beta, 0.0, 1.0).astype(x.dtype)


def _clip(x, min, max):  # pylint: disable=redefined-builtin
  # The bounds are float32 attributes (the defaults are +-float32 max): clamp them to the range
  # of x's dtype (rounding inwards for integers), which a direct cast would overflow.
  if jnp.issubdtype(x.dtype, jnp.integer):
    info = jnp.iinfo(x.dtype)
    min = int(np.clip(np.ceil(min), info.min, info.max))
    max = int(np.clip(np.floor(max), info.min, info.max))
  elif jnp.issubdtype(x.dtype, jnp.floating):
    info = jnp.finfo(x.dtype)
    min = float(np.clip(min, float(info.min), float(info.max)))
    max = float(np.clip(max, float(info.min), float(info.max)))
  return jnp.clip(x, jnp.asarray(min, x.dtype), jnp.asarray(max, x.dtype))


ADD = _binary(Op.ADD, "Add", jnp.add)
SUB = _binary(Op.SUB, "Sub", jnp.subtract)
MUL = _binary(Op.MUL, "Mul", jnp.multiply)
DIV = _binary(Op.DIV, "Div", jnp.divide)
POW = _binary(Op.POW, "Pow", jnp.power)
MAX = _binary(Op.MAX, "Max", jnp.maximum)
MIN = _binary(Op.MIN, "Min", jnp.minimum)

RELU = _unary(Op.RELU, "Relu", lambda x: jax.nn.relu(x))
SIGMOID = _unary(Op.SIGMOID, "Sigmoid", lambda x: jax.nn.sigmoid(x), 4.0)
TANH = _unary(Op.TANH, "Tanh", lambda x: jnp.tanh(x), 4.0)
GELU = _unary(Op.GELU, "Gelu", lambda x, approximate: jax.nn.gelu(x, approximate=approximate),
              8.0, (AttrField("approximate", kind="bool", default=False),))
ERF = _unary(Op.ERF, "Erf", lambda x: jax.lax.erf(x), 4.0)
EXP = _unary(Op.EXP, "Exp", lambda x: jnp.exp(x), 2.0)
LOG = _unary(Op.LOG, "Log", lambda x: jnp.log(x), 2.0)
SQRT = _unary(Op.SQRT, "Sqrt", lambda x: jnp.sqrt(x), 2.0)
NEG = _unary(Op.NEG, "Neg", lambda x: jnp.negative(x))
RECIPROCAL = _unary(Op.RECIPROCAL, "Reciprocal", lambda x: jnp.reciprocal(x))
CLIP = _unary(Op.CLIP, "Clip", _clip, 2.0,
              (AttrField("min", kind="float", default=float(np.finfo(np.float32).min)),
               AttrField("max", kind="float", default=float(np.finfo(np.float32).max))))
HARD_SIGMOID = _unary(Op.HARD_SIGMOID, "HardSigmoid", _hard_sigmoid, 3.0,
                      (AttrField("alpha", kind="float", default=0.2),
                       AttrField("beta", kind="float", default=0.5)))
HARD_SWISH = _unary(Op.HARD_SWISH, "HardSwish",
                    lambda x: x * _hard_sigmoid(x, 1.0 / 6.0, 0.5), 4.0)


def _lower_cast(inputs, a, out_shape, out_dtype):
  del a, out_shape  # float64/int64 become float32/int32 without x64, as JAX computes them
  return inputs[0].astype(jax.dtypes.canonicalize_dtype(out_dtype))


CAST = spec.register(OpSpec(
    code=Op.CAST, name="Cast", min_inputs=1, max_inputs=1,
    attrs=(AttrField("to", default=int(spec.DType.FLOAT32)),),
    shape_rule=_same_shape_rule, lower=_lower_cast, flops=_flops_per_element(0.0),
    dtype_rule="attr:to", elementwise=True))

WHERE = spec.register(OpSpec(
    code=Op.WHERE, name="Where", min_inputs=3, max_inputs=3, attrs=(),
    shape_rule=_where_rule,
    lower=lambda inputs, a, out_shape, out_dtype: jnp.where(inputs[0], inputs[1], inputs[2]),
    flops=_flops_per_element(1.0), dtype_rule="input1", elementwise=True))


# ------------------------------------------------------------------ comparisons and logic
# Comparisons take two operands of one dtype and give bool; Not/And/Or/Xor take bools.

_BOOL = "dtype:bool"
EQUAL = _binary(Op.EQUAL, "Equal", lambda a, b: jnp.equal(a, b), dtype_rule=_BOOL)
LESS = _binary(Op.LESS, "Less", lambda a, b: jnp.less(a, b), dtype_rule=_BOOL)
GREATER = _binary(Op.GREATER, "Greater", lambda a, b: jnp.greater(a, b), dtype_rule=_BOOL)
LESS_OR_EQUAL = _binary(Op.LESS_OR_EQUAL, "LessOrEqual", lambda a, b: jnp.less_equal(a, b),
                        dtype_rule=_BOOL)
GREATER_OR_EQUAL = _binary(Op.GREATER_OR_EQUAL, "GreaterOrEqual",
                           lambda a, b: jnp.greater_equal(a, b), dtype_rule=_BOOL)
NOT = _unary(Op.NOT, "Not", lambda x: jnp.logical_not(x))
AND = _binary(Op.AND, "And", lambda a, b: jnp.logical_and(a, b))
OR = _binary(Op.OR, "Or", lambda a, b: jnp.logical_or(a, b))
XOR = _binary(Op.XOR, "Xor", lambda a, b: jnp.logical_xor(a, b))


# ------------------------------------------------------------------ maths

def _mod(a, b, fmod):
  """ONNX Mod: fmod=1 is C's fmod (the sign of the dividend); fmod=0 takes the sign of the
  divisor, like Python's %."""
  return jnp.fmod(a, b) if fmod else jnp.remainder(a, b)


def _is_inf(x, detect_positive, detect_negative):
  return ((x == jnp.inf) & bool(detect_positive)) | ((x == -jnp.inf) & bool(detect_negative))


SIGN = _unary(Op.SIGN, "Sign", lambda x: jnp.sign(x))
ABS = _unary(Op.ABS, "Abs", lambda x: jnp.abs(x))
FLOOR = _unary(Op.FLOOR, "Floor", lambda x: jnp.floor(x))
CEIL = _unary(Op.CEIL, "Ceil", lambda x: jnp.ceil(x))
ROUND = _unary(Op.ROUND, "Round", lambda x: jnp.round(x))  # halves to even, as ONNX
MOD = _binary(Op.MOD, "Mod", _mod, 2.0, (AttrField("fmod", kind="bool", default=False),))
IS_NAN = _unary(Op.IS_NAN, "IsNaN", lambda x: jnp.isnan(x), dtype_rule=_BOOL)
IS_INF = _unary(Op.IS_INF, "IsInf", _is_inf, 2.0,
                (AttrField("detect_positive", kind="bool", default=True),
                 AttrField("detect_negative", kind="bool", default=True)), dtype_rule=_BOOL)


# ------------------------------------------------------------------ activations (ONNX's)

def _c(x, value):
  """A float attribute as a scalar of x's dtype."""
  return jnp.asarray(value, x.dtype)


def _elu(x, alpha):
  return jnp.where(x > 0, x, _c(x, alpha) * jnp.expm1(jnp.minimum(x, 0)))


def _selu(x, alpha, gamma):
  return _c(x, gamma) * _elu(x, alpha)


def _celu(x, alpha):
  a = _c(x, alpha)
  return jnp.maximum(x, 0) + jnp.minimum(a * jnp.expm1(jnp.minimum(x, 0) / a), 0)


def _shrink(x, bias, lambd):
  lam, b = _c(x, lambd), _c(x, bias)
  return jnp.where(x < -lam, x + b, jnp.where(x > lam, x - b, jnp.zeros_like(x)))


def _softplus(x):
  return jnp.logaddexp(x, jnp.zeros_like(x))


_ALPHA = AttrField("alpha", kind="float", default=1.0)
PRELU = _binary(Op.PRELU, "PRelu", lambda x, slope: jnp.where(x < 0, slope * x, x), 2.0)
LEAKY_RELU = _unary(Op.LEAKY_RELU, "LeakyRelu",
                    lambda x, alpha: jnp.where(x < 0, _c(x, alpha) * x, x), 2.0,
                    (AttrField("alpha", kind="float", default=0.01),))
ELU = _unary(Op.ELU, "Elu", _elu, 3.0, (_ALPHA,))
SELU = _unary(Op.SELU, "Selu", _selu, 4.0,
              (AttrField("alpha", kind="float", default=1.67326319217681884765625),
               AttrField("gamma", kind="float", default=1.05070102214813232421875)))
CELU = _unary(Op.CELU, "Celu", _celu, 4.0, (_ALPHA,))
SOFTPLUS = _unary(Op.SOFTPLUS, "Softplus", _softplus, 4.0)
SOFTSIGN = _unary(Op.SOFTSIGN, "Softsign", lambda x: x / (1 + jnp.abs(x)), 3.0)
MISH = _unary(Op.MISH, "Mish", lambda x: x * jnp.tanh(_softplus(x)), 8.0)
SHRINK = _unary(Op.SHRINK, "Shrink", _shrink, 3.0,
                (AttrField("bias", kind="float", default=0.0),
                 AttrField("lambd", kind="float", default=0.5)))
THRESHOLDED_RELU = _unary(Op.THRESHOLDED_RELU, "ThresholdedRelu",
                          lambda x, alpha: jnp.where(x > _c(x, alpha), x, jnp.zeros_like(x)),
                          2.0, (_ALPHA,))
