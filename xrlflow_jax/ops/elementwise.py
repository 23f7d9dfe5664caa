"""Elementwise operators: unary maths and activations, binary ops with broadcasting, Where, Cast."""

from __future__ import annotations

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


def _flops_per_element(cost: float) -> spec.FlopRule:
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
           attrs: tuple[AttrField, ...] = ()) -> OpSpec:
  return spec.register(OpSpec(
      code=code, name=name, min_inputs=1, max_inputs=1, attrs=attrs,
      shape_rule=_same_shape_rule,
      lower=lambda inputs, a, out_shape, out_dtype: fn(inputs[0], **a),
      flops=_flops_per_element(cost), elementwise=True))


def _binary(code: Op, name: str, fn: Callable[[Any, Any], Any]) -> OpSpec:
  return spec.register(OpSpec(
      code=code, name=name, min_inputs=2, max_inputs=2, attrs=(),
      shape_rule=_broadcast_rule,
      lower=lambda inputs, a, out_shape, out_dtype: fn(inputs[0], inputs[1]),
      flops=_flops_per_element(1.0), elementwise=True))


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
  del a, out_shape
  return inputs[0].astype(out_dtype)


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
