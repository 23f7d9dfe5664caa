"""Generalised advantage estimation with correct truncation and termination.

Conventions (dm_env / Jumanji, time-major arrays [T, ...]): the transition at step t goes from
observation o_t (value `values[t]`) with reward `rewards[t]` and discount `discounts[t]` to the
next state. `lasts[t]` marks the step that ended an episode:
  * terminated (stop action, no rule left): discount 0, nothing is bootstrapped;
  * truncated (horizon): discount 1, the return continues past the cut, so the target
    bootstraps from the value of the observation the episode ended on (`bootstrap_values[t]`,
    the value of `extras["final_observation"]`), not from the next episode's first
    observation (which is what the rollout holds at t + 1 after an auto-reset).
The recursion never carries an advantage across an episode boundary (unlike the original
X-RLflow's last-step GAE).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def gae(rewards: jax.Array, values: jax.Array, discounts: jax.Array, lasts: jax.Array,
        bootstrap_values: jax.Array, last_value: jax.Array, gamma: float,
        lam: float) -> tuple[jax.Array, jax.Array]:
  """Advantages and value targets.

  Args:
    rewards, values, discounts: float32[T, ...] per step.
    lasts: bool[T, ...] the step ended an episode (terminated or truncated).
    bootstrap_values: float32[T, ...] value of the observation an episode ended on (used only
      where `lasts` and the discount is non-zero, i.e. truncation).
    last_value: float32[...] value of the observation after the last step of the rollout.
    gamma: discount factor; lam: GAE lambda.
  Returns:
    (advantages float32[T, ...], targets = advantages + values).
  """
  lasts = lasts.astype(values.dtype)
  next_values = jnp.concatenate([values[1:], last_value[None]], 0)
  next_values = lasts * bootstrap_values + (1.0 - lasts) * next_values
  deltas = rewards + gamma * discounts * next_values - values
  carry_on = gamma * lam * discounts * (1.0 - lasts)

  def body(next_adv, x):
    delta, c = x
    adv = delta + c * next_adv
    return adv, adv

  _, advantages = jax.lax.scan(body, jnp.zeros_like(last_value), (deltas, carry_on),
                               reverse=True)
  return advantages, advantages + values
