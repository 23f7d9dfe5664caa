"""The machine a figure was measured on: one description for every harness and binary."""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

import jax

from xrlflow_jax.measure import latency
from xrlflow_jax.ops import precision


def _cpu_name() -> str:
  try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def machine_info() -> dict[str, str]:
  """Date (UTC), host, CPU, Python, JAX and the backend every figure was measured on."""
  dev = jax.devices()[0]
  return {
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "host": f"{platform.system()} {platform.release()} {platform.machine()}",
      "cpu": f"{_cpu_name()} ({os.cpu_count()} logical cores)",
      "python": platform.python_version(),
      "jax": f"jax {jax.__version__}, jaxlib {getattr(jax.lib, '__version__', '?')}",
      "backend": f"{dev.platform} ({dev.device_kind}) x {jax.device_count()}",
      "precision": f"{precision.DEFAULT_POLICY} (matmul and convolution numerics policy)",
  }


def machine_header() -> str:
  """`machine_info` as markdown lines."""
  return "\n".join(f"- {k}: {v}" for k, v in machine_info().items())


def machine_description(backend: str | None = None) -> str:
  """e.g. 'cpu backend (cpu), 2 CPU cores, x86_64, jax 0.10.2'."""
  device = latency.resolve_device(backend)
  return (f"{device.platform} backend ({device.device_kind}), {os.cpu_count()} CPU cores, "
          f"{platform.machine()}, jax {jax.__version__}")
