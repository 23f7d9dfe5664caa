"""Evidence that a rewritten graph computes the same thing and is faster: the bottom of the
measurement stack, below the cost model and everything that claims a speedup.

    check = measure.check_numerics(original, optimised, params)      # NaN-aware
    cmp = measure.compare(original, [optimised], params)             # interleaved, with control
    cmp.speedups[0].verdict                                          # "faster" | "no change" | ...
    measure.guard.decide(cmp.speedups[0], len(rewrites))             # what may be returned

Modules:
  latency     compiling a graph and timing executables in interleaved rounds (`LatencyStats`).
  numerics    outputs compared NaN-aware within a tolerance (`check_numerics`).
  verdict     the paired speedup statistic and its verdict (`Speedup`, `speedup`, looks).
  comparison  `compare`: candidates against a reference and its identical copy, one call.
  guard       the measured guard's one decision (`decide` -> `GuardDecision`).
  bulk        many graphs against one reference (`measure_side_by_side`, `measure_passes`,
              `spearman`).
"""

from xrlflow_jax.measure import guard, latency
from xrlflow_jax.measure.bulk import (Passes, SideBySide, measure_passes, measure_side_by_side,
                                      spearman)
from xrlflow_jax.measure.comparison import (MIN_ROUNDS, Comparison, MeasurementError,
                                            check_settings, compare, repeats_for)
from xrlflow_jax.measure.guard import GuardDecision, decide
from xrlflow_jax.measure.latency import (BackendError, CompiledGraph, DeviceMemoryError,
                                         LatencyStats)
from xrlflow_jax.measure.numerics import (DEFAULT_TOLERANCE, NumericsCheck, NumericsError,
                                          check_numerics, compare_outputs)
from xrlflow_jax.measure.verdict import (LEVEL, RESAMPLES, VERDICTS, Speedup, expanded_tail,
                                         look_level, look_verdicts, sequential_verdicts,
                                         settled, speedup)

__all__ = [
    "BackendError", "Comparison", "CompiledGraph", "DEFAULT_TOLERANCE", "DeviceMemoryError",
    "GuardDecision", "LEVEL", "LatencyStats", "MIN_ROUNDS", "MeasurementError", "NumericsCheck",
    "NumericsError", "Passes", "RESAMPLES", "SideBySide", "Speedup", "VERDICTS", "check_numerics",
    "check_settings", "compare", "compare_outputs", "decide", "expanded_tail", "guard",
    "latency", "look_level", "look_verdicts", "measure_passes", "measure_side_by_side",
    "repeats_for", "sequential_verdicts", "settled", "speedup", "spearman",
]
