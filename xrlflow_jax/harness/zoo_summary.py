"""Reports: the zoo summary table (build, compile and XLA latency per model)."""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import jax

from xrlflow_jax import models
from xrlflow_jax.measure import latency
from xrlflow_jax import graph as G


@dataclasses.dataclass(frozen=True)
class ZooRow:
  """One model of the zoo summary."""
  model: str
  size: str
  nodes: int
  capacity: int
  params_mb: float
  build_s: float
  compile_s: float
  latency: latency.LatencyStats


def summarize_model(name: str, size: str = "default", *, repeats: int = 20,
                    warmup: int = 3) -> ZooRow:
  """Builds `name`, validates it, lowers + compiles it and measures its XLA latency."""
  t0 = time.perf_counter()
  graph, params = models.build(name, size)
  jax.block_until_ready(graph)
  build_s = time.perf_counter() - t0
  G.validate(graph, params)
  stats = latency.measure_latency(graph, params, repeats=repeats, warmup=warmup)
  return ZooRow(name, size, G.num_nodes(graph), G.capacity(graph), params.nbytes() / 1e6,
                build_s, stats.compile_s, stats)


def markdown(rows: Sequence[ZooRow]) -> str:
  """The rows as a markdown table."""
  lines = ["| model | size | nodes | capacity | params (MB) | build (s) | lower+compile (s) | "
           "XLA latency median (ms) | IQR (ms) | backend |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
  for r in rows:
    lines.append(f"| {r.model} | {r.size} | {r.nodes} | {r.capacity} | {r.params_mb:.1f} | "
                 f"{r.build_s:.2f} | {r.compile_s:.2f} | {r.latency.median_ms:.3f} | "
                 f"{r.latency.iqr_ms:.3f} | {r.latency.backend} ({r.latency.device_kind}) |")
  return "\n".join(lines)
