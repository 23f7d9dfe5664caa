"""The graph-rewrite environment: a pure, jittable MDP (Jumanji-style) and its wrappers."""

from xrlflow_jax.env.env import (EnvError, GraphRewriteEnv, observe, offered_candidates,
                                 removed_cost, stack_graphs)
from xrlflow_jax.env.types import (ArraySpec, DiscreteSpec, Observation, ObservationSpec, State,
                                   StepType, TimeStep)
from xrlflow_jax.env.wrappers import AutoResetWrapper, LoggingWrapper, LogState, VmapWrapper

__all__ = [
    "ArraySpec", "AutoResetWrapper", "DiscreteSpec", "EnvError", "GraphRewriteEnv", "LogState",
    "LoggingWrapper", "Observation", "ObservationSpec", "State", "StepType", "TimeStep",
    "VmapWrapper", "observe", "offered_candidates", "removed_cost", "stack_graphs",
]
