"""Environment wrappers: vmap over a batch, auto-reset, and episode logging."""

from __future__ import annotations

from typing import Any, Callable

import chex
import jax
import jax.numpy as jnp

from xrlflow_jax.env.types import State, StepType, TimeStep


class Wrapper:
  """Forwards everything to the wrapped environment."""

  def __init__(self, env: Any):
    self.env = env

  def __getattr__(self, name: str) -> Any:
    return getattr(self.env, name)

  def reset(self, key: jax.Array):
    return self.env.reset(key)

  def step(self, state, action):
    return self.env.step(state, action)


def _select(pred: jax.Array, a: Any, b: Any) -> Any:
  return jax.tree_util.tree_map(lambda x, y: jnp.where(pred, x, y), a, b)


class AutoResetWrapper(Wrapper):
  """Starts a new episode after a LAST step.

  The LAST timestep keeps its reward and discount, carries the next episode's first
  observation (so a rollout can continue), and puts the observation it ended on in
  `extras["final_observation"]` (learners bootstrap truncated episodes from it).
  """

  def step(self, state, action):
    state, timestep = self.env.step(state, action)
    key, reset_key = jax.random.split(inner_state(state).key)
    new_state, first = self.env.reset(reset_key)
    done = timestep.last()
    state = _select(done, new_state, _with_key(state, key))
    extras = dict(timestep.extras)
    extras["final_observation"] = timestep.observation
    timestep = timestep.replace(observation=_select(done, first.observation, timestep.observation),
                                extras=extras)
    return state, timestep


@chex.dataclass(frozen=True)
class LogState:
  """A state with running episode statistics."""
  env_state: Any
  episode_return: jax.Array
  episode_length: jax.Array

  @property
  def key(self):
    return inner_state(self.env_state).key


def inner_state(state: Any) -> State:
  """The environment `State` under any `LogState`s of a wrapped state."""
  while isinstance(state, LogState):
    state = state.env_state
  return state


def replace_inner_state(state: Any, fn: Callable[[State], State]) -> Any:
  """`state` with its innermost environment `State` (under any `LogState`s) replaced by
  `fn(inner)`."""
  if isinstance(state, LogState):
    return state.replace(env_state=replace_inner_state(state.env_state, fn))
  return fn(state)


def _with_key(state: Any, key: jax.Array) -> Any:
  if isinstance(state, LogState):
    return state.replace(env_state=_with_key(state.env_state, key))
  return state.replace(key=key)


class LoggingWrapper(Wrapper):
  """Records episode return, length and best cost; on LAST steps `extras` gets
  "episode_return", "episode_length", "episode_best_cost" and "episode_done"."""

  def reset(self, key):
    state, timestep = self.env.reset(key)
    log = LogState(env_state=state, episode_return=jnp.float32(0.0), episode_length=jnp.int32(0))
    return log, self._extend(timestep, log, jnp.asarray(False))

  def step(self, state: LogState, action):
    inner, timestep = self.env.step(state.env_state, action)
    ret = state.episode_return + timestep.reward
    length = state.episode_length + 1
    done = timestep.step_type == StepType.LAST
    log = LogState(env_state=inner, episode_return=jnp.where(done, 0.0, ret),
                   episode_length=jnp.where(done, 0, length))
    timestep = timestep.replace(extras={**timestep.extras, "episode_return": ret,
                                        "episode_length": length, "episode_done": done,
                                        "episode_best_cost": timestep.extras["best_cost"]})
    return log, timestep

  def _extend(self, timestep: TimeStep, log: LogState, done: jax.Array) -> TimeStep:
    return timestep.replace(extras={**timestep.extras, "episode_return": log.episode_return,
                                    "episode_length": log.episode_length, "episode_done": done,
                                    "episode_best_cost": timestep.extras["best_cost"]})


class VmapWrapper(Wrapper):
  """reset(keys[B]) and step(states[B], actions[B]) over a batch of environments."""

  def reset(self, keys: jax.Array):
    return jax.vmap(self.env.reset)(keys)

  def step(self, state, action):
    return jax.vmap(self.env.step)(state, action)
