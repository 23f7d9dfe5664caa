"""ONNX op converters: each turns one ONNX node into the project's ops through `GraphBuilder`.

A converter receives a `Ctx` (the node, its decoded attributes, its inputs as `Const` values or
builder `Tensor`s) and returns one operand per node output (None for outputs nobody reads).
Decompositions are chosen to compute the same numbers as the ONNX definition (up to float
rounding), e.g. LeakyRelu as max(x, alpha * x), Expand of a tensor as a product with ones, LRN as
an average pool over channels. Ops the project cannot express raise `UnsupportedOnnxOpError`,
which the importer collects so every unsupported op is reported at once.

The converters are grouped by op family, as the project's ops are (`xrlflow_jax.ops`): `common`
holds `Const`, `Ctx`, the registry `CONVERTERS` and the helpers the families share; `elementwise`,
`matmul`, `conv`, `resize`, `pool`, `norm`, `reduce` and `tensor` each register their ops'
converters when imported, which importing this package does.
"""

from xrlflow_jax.onnx_io.convert import conv as _conv  # noqa: F401  (registers converters)
from xrlflow_jax.onnx_io.convert import elementwise as _elementwise  # noqa: F401
from xrlflow_jax.onnx_io.convert import matmul as _matmul  # noqa: F401
from xrlflow_jax.onnx_io.convert import norm as _norm  # noqa: F401
from xrlflow_jax.onnx_io.convert import pool as _pool  # noqa: F401
from xrlflow_jax.onnx_io.convert import reduce as _reduce  # noqa: F401
from xrlflow_jax.onnx_io.convert import resize as _resize  # noqa: F401
from xrlflow_jax.onnx_io.convert import tensor as _tensor  # noqa: F401
from xrlflow_jax.onnx_io.convert.common import (BUILDER_ERRORS, CONVERTERS, Const, Converter, Ctx,
                                                Operand, converter)

__all__ = ["BUILDER_ERRORS", "CONVERTERS", "Const", "Converter", "Ctx", "Operand", "converter"]
