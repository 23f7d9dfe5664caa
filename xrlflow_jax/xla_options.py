"""XLA compile options meant for XLA:CPU only: the one home of checking that this process's
devices are CPUs and that its XLA still accepts the options (flags come and go between XLA
versions; an unknown one fails the compile)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax

_ACCEPTED: dict[tuple[tuple[str, Any], ...], bool] = {}


def for_cpu(options: Mapping[str, Any], devices: Sequence[jax.Device] | None = None
            ) -> dict[str, Any] | None:
  """`options` (a new dict) when `devices` (default: `jax.devices()`) are CPUs whose XLA accepts
  them (checked once per process by compiling a tiny function), else None (XLA's defaults)."""
  devices = list(devices) if devices is not None else jax.devices()
  if not devices or devices[0].platform != "cpu":
    return None
  key = tuple(sorted(options.items()))
  if key not in _ACCEPTED:
    try:
      jax.jit(lambda x: x + 1, compiler_options=dict(options)).lower(1.0).compile()
      _ACCEPTED[key] = True
    except Exception:  # pylint: disable=broad-except  (an XLA that no longer knows a flag)
      _ACCEPTED[key] = False
  return dict(options) if _ACCEPTED[key] else None
