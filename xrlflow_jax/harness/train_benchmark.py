"""How fast the learner is next to the environment it learns from: used by
`experiments/train_benchmark.py`.

Two measurements, both compiled ahead of time (`lower().compile()`, compile excluded) and timed
with `block_until_ready` after every call:

  * `profile`: milliseconds per batched call of each part of the learner (environment step,
    node costs, the agent's inputs, encoder, local head, value, forward pass, gradient of the PPO
    loss) over one batch of observations;
  * `time_updates`: PPO environment steps per second, learning included (one jitted update:
    rollout, GAE, epochs of minibatch Adam steps).

Both take several variants and time them interleaved in one process (round r times every
variant once; medians over rounds), so that a shared, noisy machine slows every variant alike
and the ratios between variants (and to the environment step) are what to read.

The `before` variant is a reference learner for these side by side measurements only: it
shows what the library learner's choices gain. It has the per-edge attention formulation
(`PerEdgeGATLayer` as the network's `gat_layer`, numerically the same network:
tests/test_agents.py checks it), node costs
recomputed inside every forward and gradient pass, XLA's default compiler options, and the
local head over all P slots of every rule (`ActorCritic.rule_widths=None`; the library's head
reads each rule's own slots). `after` is the library's learner as built. A variant named
`agent:<field>=<value>[+<field>=<value>...]` (or `ppo:...`) is the library's learner with
those `AgentConfig` (or `PPOConfig`) fields changed, on the same environment: e.g.
`agent:max_candidates=0` for the local head over all R * L candidates, `agent:hidden=64`,
`ppo:num_minibatches=2`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from xrlflow_jax.agents import networks
from xrlflow_jax.agents.distributions import MaskedCategorical
from xrlflow_jax.agents.networks import Agent, EncoderInputs
from xrlflow_jax.agents.ppo import Trainer, Transition
from xrlflow_jax.env import VmapWrapper

VARIANTS = ("before", "after")
PARTS = ("env step", "auto-reset env step", "node costs", "agent inputs", "encoder",
         "local head", "value", "forward", "gradient")


# ----------------------------------------------------------------------------------------------
# The per-edge reference formulation (for tests and side-by-side timing)
# ----------------------------------------------------------------------------------------------

class PerEdgeGATLayer(networks.GATLayer):
  """`networks.GATLayer` written per edge, the `before` variant's encoder: every edge's key and
  value are built from gathered node, tensor and slot projections (about thirteen [N * K, H]
  gathers per layer) and the backward direction keeps the sender's tensor term in keys and
  values. Same attributes, parameters (names and shapes) and, up to float rounding, the same
  outputs as `networks.GATLayer`.
  """

  @nn.compact
  def __call__(self, h: jax.Array, g: jax.Array, t: jax.Array, slot: jax.Array,
               x: EncoderInputs) -> tuple[jax.Array, jax.Array]:
    """h: float32[N, H]; g: float32[H]; t: float32[N, H]; slot: float32[K, H] -> (h', g')."""
    n, hid = h.shape
    k = slot.shape[0]
    d = hid // self.heads
    edge_slot = jnp.arange(x.senders.shape[0]) % k

    def pad(a):  # row N is zero: what padding edges (sender N) gather
      return jnp.concatenate([a, jnp.zeros([1, a.shape[-1]], a.dtype)])

    def project(name, kv_at):
      def proj(part, bias=True):
        return nn.Dense(hid, use_bias=bias, name=f"{name}_{part}")

      edge_k, edge_v = proj("ek", False), proj("ev", False)
      key = pad(proj("k")(h))[kv_at] + pad(edge_k(t))[x.senders] + edge_k(slot)[edge_slot]
      val = pad(proj("v")(h))[kv_at] + pad(edge_v(t))[x.senders] + edge_v(slot)[edge_slot]
      return proj("q")(h), key.reshape(-1, self.heads, d), val.reshape(-1, self.heads, d)

    q, key, val = project("fwd", x.senders)
    logits = jnp.sum(q.reshape(n, 1, self.heads, d) * key.reshape(n, k, self.heads, d), -1)
    valid = x.edge_valid.reshape(n, k, 1)
    logits = jnp.where(valid, logits / math.sqrt(d), -1e9)
    w = jnp.where(valid, jax.nn.softmax(logits, axis=1), 0.0)
    fwd = jnp.sum(w[..., None] * val.reshape(n, k, self.heads, d), 1).reshape(n, hid)
    q, key, val = project("bwd", x.receivers)
    logits = jnp.sum(pad(q)[x.senders].reshape(-1, self.heads, d) * key, -1) / math.sqrt(d)
    bwd = networks.segment_softmax_sum(logits, val, x.edge_valid, x.senders, n).reshape(n, hid)
    return networks.gat_update(h, g, fwd, bwd, x.alive)


class RecomputingAgent(Agent):
  """An Agent that ignores the observation's node costs and recomputes them in every pass (the
  `before` variant's agent)."""

  def _node_costs(self, obs: Any) -> jax.Array:
    return self.node_cost_fn(obs.graph)


@dataclasses.dataclass
class Variant:
  """One learner to time: its name and trainer (environment, agent, XLA options).

  Attributes:
    name: "before" or "after" (see the module docstring).
    trainer: the PPO trainer (its agent, environment and compiler options).
  """
  name: str
  trainer: Trainer

  def compile(self, fn: Callable, *args: Any) -> Any:
    """fn jitted with the trainer's compiler options, compiled."""
    return jax.jit(fn, compiler_options=self.trainer.compiler_options).lower(*args).compile()


def _overrides(spec: str, config: Any) -> Any:
  """The dataclass `config` (AgentConfig, PPOConfig) with the fields of
  "field=value+field=value" replaced (values parsed as the field's type). ValueError naming an
  unknown field or a bad value."""
  fields = {f.name: f for f in dataclasses.fields(config)}
  changes: dict[str, Any] = {}
  for item in filter(None, spec.split("+")):
    key, sep, value = item.partition("=")
    if not sep or key not in fields:
      raise ValueError(f"bad override {item!r}: use field=value with a field of "
                       f"{type(config).__name__} ({', '.join(fields)})")
    old = getattr(config, key)
    if isinstance(old, bool):
      if value.lower() not in ("true", "false"):
        raise ValueError(f"override {item!r}: {key} is true or false")
      changes[key] = value.lower() == "true"
    else:
      try:
        changes[key] = type(old)(value)
      except ValueError:
        raise ValueError(f"override {item!r}: {key} is a {type(old).__name__}") from None
  return dataclasses.replace(config, **changes)


def variant(name: str, trainer: Trainer) -> Variant:
  """`after`: `trainer` as built; `before`: the same environment and configuration with the
  reference learner; `agent:...` / `ppo:...`: the library's learner with `AgentConfig` /
  `PPOConfig` fields changed (see the module docstring)."""
  if name == "after":
    return Variant(name, trainer)
  kind, sep, spec = name.partition(":")
  if sep and kind in ("agent", "ppo"):
    a, config = trainer.agent, trainer.config
    if kind == "agent":
      a = Agent(a.ruleset, a.node_cost_fn, _overrides(spec, a.config))
    else:
      config = _overrides(spec, config)
    return Variant(name, Trainer(config, trainer.env, a, trainer.devices,
                                 xla_options=trainer.compiler_options))
  if name != "before":
    raise ValueError(f"unknown variant {name!r}; use one of {VARIANTS}, agent:field=value or "
                     "ppo:field=value")
  a = trainer.agent
  agent = RecomputingAgent(a.ruleset, a.node_cost_fn, a.config)
  # The per-edge encoder layer, and a local head that reads all P slots per rule.
  agent.network = agent.network.clone(rule_widths=None, gat_layer=PerEdgeGATLayer)
  before = Trainer(trainer.config, trainer.env, agent, trainer.devices, xla_options=None)
  return Variant(name, before)


# ----------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------

def _interleaved(calls: dict[tuple[str, str], Callable[[], Any]], repeats: int
                 ) -> dict[tuple[str, str], list[float]]:
  """Seconds of each call, `repeats` rounds, every call once per round (after one warm-up)."""
  for fn in calls.values():
    jax.block_until_ready(fn())
  out: dict[tuple[str, str], list[float]] = {k: [] for k in calls}
  for _ in range(repeats):
    for k, fn in calls.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn())
      out[k].append(time.perf_counter() - t0)
  return out


def _loss_batch(trainer: Trainer, params: Any, obs: Any, key: jax.Array) -> dict[str, Any]:
  """A PPO minibatch over the observations obs [B]: valid sampled actions, their log-probs and
  values under `params`, random advantages and targets."""
  logits, value = jax.jit(jax.vmap(trainer.agent.apply, in_axes=(None, 0)))(params, obs)
  dist = MaskedCategorical(logits, obs.action_mask)
  k_act, k_adv, k_tgt = jax.random.split(key, 3)
  action = dist.sample(k_act)
  b = action.shape[0]
  trans = Transition(obs=obs, action=action, log_prob=dist.log_prob(action), value=value,
                     reward=jnp.zeros([b]), discount=jnp.ones([b]), last=jnp.zeros([b], bool),
                     bootstrap=jnp.zeros([b]))
  return {"trans": trans, "advantages": jax.random.normal(k_adv, (b,)),
          "targets": value + jax.random.normal(k_tgt, (b,))}


def _part_calls(v: Variant, state: Any, batch: dict[str, Any]) -> dict[str, Callable[[], Any]]:
  """The parts of `PARTS` for one variant, compiled, as zero-argument calls."""
  tr, agent = v.trainer, v.trainer.agent
  env, net = tr.env, v.trainer.agent.network
  params, obs = state.params, state.obs
  mask = obs.action_mask
  action = jax.vmap(lambda k, m: jax.random.categorical(k, jnp.where(m, 0.0, -jnp.inf)))(
      jax.random.split(jax.random.PRNGKey(1), mask.shape[0]), mask).astype(jnp.int32)
  plain = VmapWrapper(env)  # the environment alone: no auto-reset, no episode statistics

  def inputs(o):
    return jax.vmap(agent._inputs)(o)  # pylint: disable=protected-access

  def encode(p, current):
    return jax.vmap(lambda c: net.apply(p, c, method=networks.ActorCritic.encode))(current)

  def head(p, h, emb, nodes, feats, compact):  # compact: the LocalCandidates, or None
    return jax.vmap(lambda *a: net.apply(p, *a, method=networks.ActorCritic.local_scores))(
        h, emb, nodes, feats, compact)

  def forward(p, o):
    return jax.vmap(agent.apply, in_axes=(None, 0))(p, o)

  def value(p, o):
    return jax.vmap(agent.value, in_axes=(None, 0))(p, o)

  def gradient(p, b):
    return jax.grad(lambda q: tr._loss(q, b)[0])(p)  # pylint: disable=protected-access

  fns: dict[str, tuple[Callable, tuple]] = {
      "env step": (plain.step, (state.env_state.env_state, action)),  # inside the LogState
      "auto-reset env step": (tr.venv.step, (state.env_state, action)),
      "node costs": (jax.vmap(env.node_cost_fn), (obs.graph,)),
      "agent inputs": (inputs, (obs,)),
      "value": (value, (params, obs)),
      "forward": (forward, (params, obs)),
      "gradient": (gradient, (params, batch)),
  }
  current, nodes, feats, compact = jax.jit(inputs)(obs)
  fns["encoder"] = (encode, (params, current))
  if agent.config.head == "local":
    h, emb = jax.jit(encode)(params, current)
    fns["local head"] = (head, (params, h, emb, nodes, feats, compact))
  out = {}
  for part in PARTS:
    if part in fns:
      fn, args = fns[part]
      compiled = v.compile(fn, *args)
      out[part] = (lambda c=compiled, a=args: c(*a))
  return out


def profile(variants: Sequence[Variant], repeats: int = 7, seed: int = 0
            ) -> dict[str, dict[str, float]]:
  """Median milliseconds per batched call of each part, per variant: {variant: {part: ms}}.

  Every variant is timed on the same observations (one fresh `init` of the first variant's
  trainer: its environments' first observations) and the same minibatch for the gradient.
  """
  state0 = variants[0].trainer.init(jax.random.PRNGKey(seed))
  calls = {}
  for v in variants:
    state = v.trainer.init(jax.random.PRNGKey(seed))  # this variant's parameters
    state = state.replace(obs=state0.obs, env_state=state0.env_state)
    batch = _loss_batch(v.trainer, state.params, state.obs, jax.random.PRNGKey(seed + 1))
    for part, fn in _part_calls(v, state, batch).items():
      calls[(v.name, part)] = fn
  times = _interleaved(calls, repeats)
  out: dict[str, dict[str, float]] = {v.name: {} for v in variants}
  for (name, part), t in times.items():
    out[name][part] = float(np.median(t)) * 1e3
  return out


@dataclasses.dataclass(frozen=True)
class UpdateTiming:
  """PPO throughput of one variant.

  Attributes:
    variant: its name; batch: environments; num_steps: rollout steps per update.
    compile_s: ahead-of-time compile of one update; s_per_update: median seconds per update.
    steps_per_s: batch * num_steps / s_per_update; loss_finite: the last update's loss.
  """
  variant: str
  batch: int
  num_steps: int
  compile_s: float
  s_per_update: float
  steps_per_s: float
  loss_finite: bool


def time_updates(variants: Sequence[Variant], repeats: int = 3, seed: int = 0
                 ) -> list[UpdateTiming]:
  """PPO updates of every variant, compiled ahead of time, timed interleaved (median)."""
  calls, compile_s, states, last = {}, {}, {}, {}
  for v in variants:
    tr = v.trainer
    states[v.name] = jax.block_until_ready(tr.init(jax.random.PRNGKey(seed)))
    t0 = time.perf_counter()
    compiled = tr.update.lower(states[v.name]).compile()
    compile_s[v.name] = time.perf_counter() - t0

    def call(c=compiled, name=v.name):
      states[name], last[name] = c(states[name])
      return last[name]
    calls[(v.name, "update")] = call
  times = _interleaved(calls, repeats)
  out = []
  for v in variants:
    cfg = v.trainer.config
    s = float(np.median(times[(v.name, "update")]))
    out.append(UpdateTiming(v.name, cfg.num_envs, cfg.num_steps, compile_s[v.name], s,
                            cfg.num_envs * cfg.num_steps / s,
                            bool(np.isfinite(float(last[v.name]["loss"])))))
  return out


def profile_markdown(prof: dict[str, dict[str, float]]) -> str:
  """A markdown table: one row per part, ms and multiple of one environment step per variant
  (and the ratio of the first variant to the last when there are several)."""
  names = list(prof)
  head = " | ".join(f"{n} ms | {n} / env step" for n in names)
  lines = [f"| part | {head} |" + (f" {names[0]} / {names[-1]} |" if len(names) > 1 else ""),
           "|---|" + "---:|" * (2 * len(names) + (len(names) > 1))]
  for part in PARTS:
    if not all(part in prof[n] for n in names):
      continue
    cells = " | ".join(f"{prof[n][part]:.1f} | {prof[n][part] / prof[n]['env step']:.1f}x"
                       for n in names)
    ratio = f" {prof[names[0]][part] / prof[names[-1]][part]:.2f}x |" if len(names) > 1 else ""
    lines.append(f"| {part} | {cells} |{ratio}")
  return "\n".join(lines)
