"""A categorical distribution over the valid actions only."""

from __future__ import annotations

import jax
import jax.numpy as jnp

# A finite stand-in for -inf: exp() of it is exactly 0 in float32, and unlike -inf it never
# turns a masked entry into NaN (inf - inf) in log-softmax or its gradient.
MASKED_LOGIT = -1e9


class MaskedCategorical:
  """Categorical over actions with `mask` true; masked actions have probability exactly 0.

  Args:
    logits: float32[..., A] unnormalised scores.
    mask: bool[..., A] valid actions (at least one per row; the environment's stop action is
      always valid).
  """

  def __init__(self, logits: jax.Array, mask: jax.Array):
    self.mask = mask
    self.logits = jnp.where(mask, logits, MASKED_LOGIT)
    self.log_probs = jax.nn.log_softmax(self.logits, axis=-1)

  def sample(self, key: jax.Array) -> jax.Array:
    """int32[...]: Gumbel-max over the valid actions (a masked action can never win)."""
    g = jax.random.gumbel(key, self.logits.shape, self.logits.dtype)
    return jnp.argmax(jnp.where(self.mask, self.logits + g, -jnp.inf), axis=-1).astype(jnp.int32)

  def mode(self) -> jax.Array:
    """int32[...]: the most likely valid action."""
    return jnp.argmax(jnp.where(self.mask, self.logits, -jnp.inf), axis=-1).astype(jnp.int32)

  def log_prob(self, action: jax.Array) -> jax.Array:
    """float32[...]: log-probability of `action` (int32[...])."""
    return jnp.take_along_axis(self.log_probs, action[..., None].astype(jnp.int32), -1)[..., 0]

  def entropy(self) -> jax.Array:
    """float32[...]: entropy over the valid actions (masked terms contribute 0, not NaN)."""
    p = jnp.exp(self.log_probs)
    return -jnp.sum(jnp.where(self.mask, p * self.log_probs, 0.0), axis=-1)
