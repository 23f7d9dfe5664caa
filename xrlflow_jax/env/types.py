"""Environment data: State, TimeStep, Observation (chex dataclasses) and specs."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import chex
import jax
import jax.numpy as jnp

from xrlflow_jax.rules.ruleset import RuleSetMatch


class StepType(enum.IntEnum):
  """Jumanji/dm_env step types."""
  FIRST = 0
  MID = 1
  LAST = 2


@chex.dataclass(frozen=True)
class Observation:
  """What an agent sees.

  Attributes:
    graph: the current padded graph (jraph.GraphsTuple; N slots).
    action_mask: bool[R * L + 1]: valid (rule, location) pairs, flattened rule-major, then the
      stop action (always valid).
    candidate_nodes: int32[R, L, P]: the node ids each candidate matched (-1 padding).
    candidate_removed_cost: float32[R, L]: modelled cost of the nodes each candidate removes
      (their current node costs), a cheap local feature.
    candidate_delta: float32[R, L]: the exact modelled cost change of each candidate (new cost -
      current cost); only computed when the environment is built with exact_candidate_delta,
      zeros otherwise.
    step_count: int32[]: rewrites applied so far in this episode.
    node_costs: float32[N]: modelled cost of every node of `graph` (0 for free slots), computed
      once per step by the environment (built with node_cost_fn) so that learners do not
      recompute it in every forward and gradient pass; None when the environment has no
      node_cost_fn.
  """
  graph: Any
  action_mask: jax.Array
  candidate_nodes: jax.Array
  candidate_removed_cost: jax.Array
  candidate_delta: jax.Array
  step_count: jax.Array
  node_costs: Any = None


@chex.dataclass(frozen=True)
class State:
  """The environment state (a pytree; pure functions of it only).

  Attributes:
    graph: the current graph; match: every location of every rule in it.
    cost: modelled cost of `graph`; initial_cost: C_0 of the episode; best_cost: lowest so far.
    best_graph: the graph with `best_cost`.
    step_count: steps taken this episode; graph_index: which pool graph the episode started from.
    key: PRNG key for the next reset.
    rewrites: int32[horizon, 2 + P]: the rewrites applied this episode, in order, one row each
      (rule index, location, the P bound node slots; -1 padding): replaying the first
      `num_rewrites` rows onto the pool graph rebuilds `graph` (`search.replay`).
    num_rewrites: int32[]: rows of `rewrites` in use.
  """
  graph: Any
  match: RuleSetMatch
  cost: jax.Array
  initial_cost: jax.Array
  best_cost: jax.Array
  best_graph: Any
  step_count: jax.Array
  graph_index: jax.Array
  key: jax.Array
  rewrites: jax.Array
  num_rewrites: jax.Array


@chex.dataclass(frozen=True)
class TimeStep:
  """One transition's outcome (dm_env convention: reward and discount of the step just taken).

  extras holds: "invalid_action" (a masked action was forced: the graph did not change),
  "cost", "best_cost", "graph_index", "rewrites" and "num_rewrites" (the episode's applied
  rewrites so far, see `State`), and what wrappers add.
  """
  step_type: jax.Array
  reward: jax.Array
  discount: jax.Array
  observation: Observation
  extras: dict

  def first(self) -> jax.Array:
    return self.step_type == StepType.FIRST

  def mid(self) -> jax.Array:
    return self.step_type == StepType.MID

  def last(self) -> jax.Array:
    return self.step_type == StepType.LAST


@dataclasses.dataclass(frozen=True)
class ArraySpec:
  """Shape and dtype of an array (batch dimensions excluded)."""
  shape: tuple[int, ...]
  dtype: Any
  name: str = ""

  def zeros(self) -> jax.Array:
    return jnp.zeros(self.shape, self.dtype)


@dataclasses.dataclass(frozen=True)
class DiscreteSpec(ArraySpec):
  """A scalar integer in [0, num_values)."""
  num_values: int = 0


@dataclasses.dataclass(frozen=True)
class ObservationSpec:
  """Specs of the observation fields (the graph's own arrays follow graph.layout)."""
  num_slots: int
  max_inputs: int
  action_mask: ArraySpec
  candidate_nodes: ArraySpec
  candidate_removed_cost: ArraySpec
  candidate_delta: ArraySpec
  node_costs: ArraySpec | None = None
