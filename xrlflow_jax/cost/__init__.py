"""Cost and latency: XLA-measured latency (the ground truth of every speed claim)."""

from xrlflow_jax.cost.latency import (BackendError, LatencyStats, measure_latency, resolve_device,
                                      time_callable)

__all__ = ["BackendError", "LatencyStats", "measure_latency", "resolve_device", "time_callable"]
