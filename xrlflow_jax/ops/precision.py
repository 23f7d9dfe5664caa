"""The numerics policy of matrix multiplications and convolutions.

On NVIDIA GPUs `Precision.HIGHEST` computes float32 matmuls and convolutions in full float32
(no TF32), which is exact but slow; "high" (bf16_3x) and "default" (TF32 / bf16 on GPUs and
TPUs) are faster and less exact. On a CPU all three compute float32 alike. The policy is an
option of the executor (`executor.lower(..., precision=)`), of timing and numerics checks
(`measure`), and of the optimise job, and is recorded in its report; the numerics check's
default tolerance follows it (`tolerance`). Both graphs of a comparison always use one policy.

    with precision.scope("default"):   # lowerings traced inside use Precision.DEFAULT
      ...
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

from jax import lax

from xrlflow_jax.errors import UsageError

POLICIES: dict[str, lax.Precision] = {
    "highest": lax.Precision.HIGHEST, "high": lax.Precision.HIGH,
    "default": lax.Precision.DEFAULT}
DEFAULT_POLICY = "highest"
# Default bound on max |a - b| / (1 + |a|) between an original and a rewritten graph: a rewrite
# reorders float32 sums (1e-3 is ample at full precision); TF32 and bf16 passes round operands
# to 10 and 8 mantissa bits.
TOLERANCE = {"highest": 1e-3, "high": 1e-2, "default": 5e-2}

_CURRENT: contextvars.ContextVar[str] = contextvars.ContextVar("xrlflow_precision",
                                                               default=DEFAULT_POLICY)


class PrecisionError(UsageError):
  """An unknown numerics policy."""


def check(policy: str | None) -> str:
  """The policy name (None: the default); PrecisionError listing the policies otherwise."""
  if policy is None:
    return DEFAULT_POLICY
  if policy not in POLICIES:
    raise PrecisionError(f"unknown precision policy {policy!r}; policies are "
                         f"{', '.join(POLICIES)}")
  return policy


@contextlib.contextmanager
def scope(policy: str | None) -> Iterator[str]:
  """Lowerings traced inside use `policy` for matmuls and convolutions."""
  token = _CURRENT.set(check(policy))
  try:
    yield _CURRENT.get()
  finally:
    _CURRENT.reset(token)


def current() -> lax.Precision:
  """The `lax.Precision` of the policy in scope (what the MatMul/Conv2D lowerings use)."""
  return POLICIES[_CURRENT.get()]


def tolerance(policy: str | None) -> float:
  """The numerics check's default tolerance under `policy`."""
  return TOLERANCE[check(policy)]
