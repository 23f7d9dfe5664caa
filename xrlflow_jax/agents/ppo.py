"""PPO in the PureJaxRL shape: a whole training run is one jitted program.

    trainer = make_train(PPOConfig(...), env, agent)   # env: GraphRewriteEnv (unwrapped)
    state, metrics = trainer(jax.random.PRNGKey(0))    # = run(init(key), num_updates), one jit
    states, metrics = trainer.train_seeds(keys)         # several seeds at once (vmap)

Each update collects a rollout with `lax.scan` over `num_steps` steps of `num_envs`
environments (`VmapWrapper(LoggingWrapper(AutoResetWrapper(env)))`), computes GAE (truncated
episodes bootstrap from the value of their final observation, see `gae.py`), then runs
`update_epochs` epochs of shuffled minibatches of the clipped surrogate, a (clipped) value loss
and an entropy bonus with optax Adam behind global-norm clipping. `init`, `update` and `run` are
exposed separately (all jitted, no retrace across calls) so a driver can log, checkpoint and
resume between chunks of updates; a resumed run reproduces the uninterrupted one.

Data parallelism: the trainer builds a 1-D mesh ("data") over `devices` (default all of
`jax.devices()`). Environment states, observations and rollouts are sharded along the
environment axis and minibatches along their sample axis with sharding constraints; parameters
and optimiser state are replicated. XLA's SPMD partitioner then runs each device's environments
and minibatch share locally and all-reduces the gradients (the loss is a mean over the global
minibatch, so that is the average of the per-device gradients). The program is the same for any
number of devices, so results match a single device up to float reduction order. Multi-process
(several hosts, or several processes on one): `distributed.initialize` first; `jax.devices()`
then spans every process, the mesh covers them and the same code runs unchanged, each process
stepping its own devices' environments (`experiments.train --num_processes`; host copies of
sharded results through `distributed.to_host`, checkpoints written by all processes).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from xrlflow_jax import cost, trace_cache
from xrlflow_jax.agents.distributions import MaskedCategorical
from xrlflow_jax.agents.gae import gae
from xrlflow_jax.agents.networks import Agent, AgentError
from xrlflow_jax.env import AutoResetWrapper, GraphRewriteEnv, LoggingWrapper, VmapWrapper
from xrlflow_jax.xla_options import for_cpu

METRICS = (
    "env_steps", "episodes", "episode_return", "episode_length", "episode_best_ratio",
    "best_cost_ratio", "reward", "stop_frac", "invalid_frac", "value", "loss", "policy_loss",
    "value_loss", "entropy", "approx_kl", "clip_frac", "grad_norm", "learning_rate")


# XLA:CPU hands reductions, and the elementwise work fused into them, to its YNNPACK library
# fusions by default. For the GNN's many small per-edge reductions (sums over a head's 16
# channels or a node's K = 5 input slots, [B, N, K, H] tensors) those run several times slower
# than XLA's own loop fusions: on the 2-core CPU (2026-12-01), tiny BERT at 256 slots, batch 16,
# the agent's forward pass took 2.0x and its gradient 1.5-1.7x the time they take without
# library fusions (compiled both ways, timed interleaved in one process). The learner's
# programs are therefore compiled without them; everything else in the process (graph
# executables, the cost model's profiles) keeps XLA's defaults.
CPU_COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}


def compiler_options(devices: Sequence[jax.Device] | None = None) -> dict[str, str] | None:
  """XLA options for the learner's jitted programs on `devices` (default: jax.devices()):
  `CPU_COMPILER_OPTIONS` on CPUs whose XLA accepts them, else None (XLA's defaults)."""
  return for_cpu(CPU_COMPILER_OPTIONS, devices)


@dataclasses.dataclass(frozen=True)
class PPOConfig:
  """PPO hyper-parameters. The defaults are the project's CPU defaults and the single source of
  the PPO configs (`xrlflow_jax.configs.ppo` copies them and overrides only its `test` run).

  Attributes:
    num_envs: environments per rollout (the global batch; split across devices).
    num_steps: steps per environment per update.
    total_timesteps: environment steps of the whole run; num_updates = total // (envs * steps).
    update_epochs: passes over each rollout; num_minibatches: minibatches per pass.
    gamma, gae_lambda: discount and GAE lambda.
    learning_rate: Adam step size; anneal_lr: linear decay to 0 over the run.
    clip_eps: PPO ratio clip (also the value clip when clip_value).
    ent_coef, vf_coef: loss weights; max_grad_norm: global-norm gradient clipping.
    normalize_advantages: per-minibatch advantage normalisation.
  """
  num_envs: int = 16
  num_steps: int = 32
  total_timesteps: int = 16 * 32 * 200
  # Two passes over each rollout, not X-RLflow's four: on a 2-core CPU the gradient is most of
  # an update. In a short training comparison (`experiments.train` on tiny BERT, the 21 default
  # rules, 16 updates of 16 x 16 steps, 2 seeds each; runs one after the other on the loaded
  # 2-core machine, 2026-12-01) 2 epochs reached training's best graph in every episode of the
  # last 4 updates (episode best ratio 0.9406 / 0.9406) where 4 epochs got 0.9450 / 0.9428 (both
  # found the same best graph, 0.9406), in 0.40x the wall time (387 s vs 976 s, compiles
  # included).
  update_epochs: int = 2
  num_minibatches: int = 4
  gamma: float = 0.99
  gae_lambda: float = 0.95
  learning_rate: float = 5e-4
  anneal_lr: bool = False
  clip_eps: float = 0.2
  clip_value: bool = True
  ent_coef: float = 0.01
  vf_coef: float = 0.5
  max_grad_norm: float = 0.5
  normalize_advantages: bool = True

  @property
  def batch_size(self) -> int:
    return self.num_envs * self.num_steps

  @property
  def minibatch_size(self) -> int:
    return self.batch_size // self.num_minibatches

  @property
  def num_updates(self) -> int:
    return self.total_timesteps // self.batch_size

  @classmethod
  def from_mapping(cls, values: Any) -> "PPOConfig":
    """From a dict or ml_collections.ConfigDict (unknown keys are an AgentError)."""
    values = dict(values)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
      raise AgentError(f"unknown PPO config keys {unknown}; known: {sorted(names)}")
    return cls(**values)

  def validate(self, num_devices: int = 1) -> None:
    """AgentError naming the first inconsistent setting."""
    if min(self.num_envs, self.num_steps, self.update_epochs, self.num_minibatches) < 1:
      raise AgentError(f"num_envs, num_steps, update_epochs, num_minibatches must be >= 1: {self}")
    if self.batch_size % self.num_minibatches:
      raise AgentError(f"num_envs * num_steps = {self.batch_size} is not divisible by "
                       f"num_minibatches = {self.num_minibatches}")
    if self.num_envs % num_devices or self.minibatch_size % num_devices:
      raise AgentError(f"num_envs ({self.num_envs}) and the minibatch size "
                       f"({self.minibatch_size}) must be divisible by the number of devices "
                       f"({num_devices})")
    if self.num_updates < 1:
      raise AgentError(f"total_timesteps ({self.total_timesteps}) is less than one rollout "
                       f"({self.batch_size} steps)")


@chex.dataclass(frozen=True)
class Transition:
  """One rollout step of a batch (leading [B]; a rollout stacks them to [T, B])."""
  obs: Any
  action: jax.Array
  log_prob: jax.Array
  value: jax.Array
  reward: jax.Array
  discount: jax.Array
  last: jax.Array
  bootstrap: jax.Array


@chex.dataclass(frozen=True)
class RunnerState:
  """Everything a run carries between updates (a pytree; checkpoint it to resume exactly).

  Attributes:
    params, opt_state: network parameters and optimiser state.
    env_state: the batched wrapped environment state; obs: the current observations [B].
    key: PRNG key; update: updates done (int32[]).
    best_cost: float32[G] lowest modelled cost seen per pool graph; best_graph: those graphs
      (leading [G]); initial_cost: float32[G] the pool graphs' costs.
    best_rewrites: int32[G, horizon, 2 + P] the rewrites that made each best graph from its
      pool graph (rows of the environment's `State.rewrites`); best_num_rewrites: int32[G]
      rows in use (0: the pool graph itself).
    kernels: the measured kernel table the environment and the agent cost with
      (`cost.KernelTable`, keys uint32[T], ms float32[T]; bound by `cost.bound_kernels` in every
      update), or None (the environment's cost function has none). An input of the compiled
      update, so a table grown within its capacity T (`agents.training.KernelCompletion`)
      reuses it.
  """
  params: Any
  opt_state: Any
  env_state: Any
  obs: Any
  key: jax.Array
  update: jax.Array
  best_cost: jax.Array
  best_graph: Any
  initial_cost: jax.Array
  best_rewrites: Any = None
  best_num_rewrites: Any = None
  kernels: Any = None


class Trainer:
  """A compiled PPO run over one environment and agent (see the module docstring).

  Args:
    config: PPOConfig.
    env: the unwrapped GraphRewriteEnv (wrapped here with auto-reset, logging and vmap).
    agent: the Agent (network bound to the env's RuleSet).
    devices: devices of the data-parallel mesh (default: all of `jax.devices()`).
    xla_options: XLA compiler options of the jitted programs: "auto" (`compiler_options`),
      None (XLA's defaults) or a dict.
  """

  def __init__(self, config: PPOConfig, env: GraphRewriteEnv, agent: Agent,
               devices: Sequence[jax.Device] | None = None, xla_options: Any = "auto"):
    devices = list(devices) if devices is not None else jax.devices()
    config.validate(len(devices))
    if agent.num_actions != env.num_actions:
      raise AgentError(f"the agent has {agent.num_actions} actions but the environment has "
                       f"{env.num_actions}; build both from the same RuleSet")
    self.config = config
    self.env = env
    self.agent = agent
    self.devices = devices
    self.mesh = Mesh(np.asarray(devices), ("data",))
    self.venv = VmapWrapper(LoggingWrapper(AutoResetWrapper(env)))
    steps_per_update = config.update_epochs * config.num_minibatches
    if config.anneal_lr:
      self.schedule = optax.linear_schedule(config.learning_rate, 0.0,
                                            config.num_updates * steps_per_update)
    else:
      self.schedule = optax.constant_schedule(config.learning_rate)
    self.optimizer = optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                                 optax.adam(self.schedule, eps=1e-5))
    self.compiler_options = compiler_options(devices) if xla_options == "auto" else xla_options
    jit = functools.partial(jax.jit, compiler_options=self.compiler_options)
    self.jit = jit
    # The two programs every driver compiles are stored on disk (`trace_cache`): a later
    # process loads them instead of tracing (single-device runs; sharded ones are traced).
    persist = len(devices) == 1
    self.init = trace_cache.PersistentJit(self._init, "ppo.init", self,
                                          compiler_options=self.compiler_options, persist=persist)
    self.update = jit(self._update)
    self.run = trace_cache.PersistentJit(self._run, "ppo.run", self, static_argnums=(1,),
                                         compiler_options=self.compiler_options, persist=persist)
    self.train = jit(self._train)
    self.init_seeds = jit(jax.vmap(self._init))
    self.run_seeds = jit(jax.vmap(self._run, in_axes=(0, None)), static_argnums=1)
    self.train_seeds = jit(jax.vmap(self._train))

  def __fingerprint__(self) -> tuple:
    """What decides the traced programs (`trace_cache.fingerprint`); the optimiser, schedule
    and wrappers are built from these."""
    return (self.config, self.env, self.agent, self.compiler_options,
            [(d.platform, getattr(d, "device_kind", "")) for d in self.devices])

  def __call__(self, key: jax.Array) -> tuple[RunnerState, dict[str, jax.Array]]:
    """The whole run: (final RunnerState, metrics {name: float32[num_updates]})."""
    return self.train(key)

  # ------------------------------------------------------------------ sharding
  def _shard(self, tree: Any, axis: int) -> Any:
    """Constrains every array of `tree` to be split over devices along `axis`."""
    if len(self.devices) == 1:
      return tree
    spec = PartitionSpec(*([None] * axis), "data")
    return jax.lax.with_sharding_constraint(tree, NamedSharding(self.mesh, spec))

  def _replicate(self, tree: Any) -> Any:
    if len(self.devices) == 1:
      return tree
    return jax.lax.with_sharding_constraint(tree, NamedSharding(self.mesh, PartitionSpec()))

  # ------------------------------------------------------------------ pieces
  def _init(self, key: jax.Array) -> RunnerState:
    """A fresh run: parameters, optimiser, environments reset with `key`."""
    key, k_init, k_env = jax.random.split(key, 3)
    env_state, ts = self.venv.reset(jax.random.split(k_env, self.config.num_envs))
    env_state, obs = self._shard((env_state, ts.observation), 0)
    params = self._replicate(
        self.agent.init(k_init, jax.tree_util.tree_map(lambda x: x[0], obs)))
    pool = self.env.pool
    initial = jax.vmap(self.env.cost_fn)(pool).astype(jnp.float32)
    g = self.env.pool_size
    rows = jnp.full([g, self.env.horizon, 2 + self.env.ruleset.num_bound], -1, jnp.int32)
    return RunnerState(params=params, opt_state=self._replicate(self.optimizer.init(params)),
                       env_state=env_state, obs=obs, key=key, update=jnp.int32(0),
                       best_cost=initial, best_graph=pool, initial_cost=initial,
                       best_rewrites=rows, best_num_rewrites=jnp.zeros([g], jnp.int32),
                       kernels=self._replicate(getattr(self.env.cost_fn, "kernels", None)))

  def _policy(self, params: Any, obs: Any) -> tuple[MaskedCategorical, jax.Array]:
    logits, value = jax.vmap(self.agent.apply, in_axes=(None, 0))(params, obs)
    return MaskedCategorical(logits, obs.action_mask), value

  def _values(self, params: Any, obs: Any) -> jax.Array:
    return jax.vmap(self.agent.value, in_axes=(None, 0))(params, obs)

  @staticmethod
  def _track_best(best_cost, best, costs, found, index):
    """Keeps, per pool graph, what came with the lowest cost seen: best_cost float32[G], best
    (a pytree with leading [G]: graph, rewrites, ...), costs float32[B], found (the same pytree
    with leading [B]), index int32[B] pool graph of each. Returns (best_cost, best)."""
    g = best_cost.shape[0]
    mine = index[None, :] == jnp.arange(g)[:, None]  # [G, B]
    c = jnp.where(mine, costs[None, :], jnp.inf)
    j = jnp.argmin(c, axis=1)
    cmin = jnp.take_along_axis(c, j[:, None], 1)[:, 0]
    better = cmin < best_cost * (1.0 - 1e-6)  # float noise of equal-cost graphs is not better
    best = jax.tree_util.tree_map(
        lambda new, old: jnp.where(better.reshape((-1,) + (1,) * (old.ndim - 1)), new[j], old),
        found, best)
    return jnp.where(better, cmin, best_cost), best

  def _rollout(self, runner: RunnerState):
    """num_steps steps of every environment: (runner, Transition [T, B], info [T, B])."""
    params = runner.params

    def step(carry, _):
      env_state, obs, key, best_cost, best = carry
      key, k_act = jax.random.split(key)
      dist, value = self._policy(params, obs)
      action = dist.sample(k_act)
      log_prob = dist.log_prob(action)
      env_state, ts = self.venv.step(env_state, action)
      final_obs = ts.extras["final_observation"]
      truncated = ts.last() & (ts.discount > 0)
      # Truncation is rare (only at the horizon): evaluate V(final observation) only when some
      # environment of the batch was truncated at this step.
      boot = jax.lax.cond(jnp.any(truncated), lambda: self._values(params, final_obs),
                          lambda: jnp.zeros_like(value))
      boot = jnp.where(truncated, boot, 0.0)
      ex = ts.extras  # of the step taken (before any auto-reset): its graph and rewrites
      best_cost, best = self._track_best(
          best_cost, best, ex["cost"], (final_obs.graph, ex["rewrites"], ex["num_rewrites"]),
          ex["graph_index"])
      env_state, next_obs = self._shard((env_state, ts.observation), 0)
      trans = Transition(obs=obs, action=action, log_prob=log_prob, value=value,
                         reward=ts.reward, discount=ts.discount, last=ts.last(), bootstrap=boot)
      info = {"done": ex["episode_done"], "return": ex["episode_return"],
              "length": ex["episode_length"].astype(jnp.float32),
              "best_ratio": ex["episode_best_cost"] / ex["initial_cost"],
              "invalid": ex["invalid_action"], "stop": action == self.env.stop_action}
      return (env_state, next_obs, key, best_cost, best), (trans, info)

    best = (runner.best_graph, runner.best_rewrites, runner.best_num_rewrites)
    carry = (runner.env_state, runner.obs, runner.key, runner.best_cost, best)
    carry, (traj, info) = jax.lax.scan(step, carry, None, self.config.num_steps)
    env_state, obs, key, best_cost, (best_graph, best_rewrites, best_num) = carry
    runner = runner.replace(env_state=env_state, obs=obs, key=key, best_cost=best_cost,
                            best_graph=best_graph, best_rewrites=best_rewrites,
                            best_num_rewrites=best_num)
    return runner, self._shard(traj, 1), info

  def _loss(self, params: Any, batch: dict[str, Any]) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The PPO loss of one minibatch (leading [M]) and its statistics."""
    cfg = self.config
    trans: Transition = batch["trans"]
    dist, value = self._policy(params, trans.obs)
    log_prob = dist.log_prob(trans.action)
    entropy = dist.entropy().mean()
    log_ratio = log_prob - trans.log_prob
    ratio = jnp.exp(log_ratio)
    adv = batch["advantages"]
    if cfg.normalize_advantages:
      adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    surrogate = jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv)
    policy_loss = -surrogate.mean()
    targets = batch["targets"]
    value_loss = jnp.square(value - targets)
    if cfg.clip_value:
      clipped = trans.value + jnp.clip(value - trans.value, -cfg.clip_eps, cfg.clip_eps)
      value_loss = jnp.maximum(value_loss, jnp.square(clipped - targets))
    value_loss = 0.5 * value_loss.mean()
    loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy
    stats = {"loss": loss, "policy_loss": policy_loss, "value_loss": value_loss,
             "entropy": entropy, "approx_kl": jnp.mean((ratio - 1.0) - log_ratio),
             "clip_frac": jnp.mean((jnp.abs(ratio - 1.0) > cfg.clip_eps).astype(jnp.float32))}
    return loss, stats

  def _learn(self, runner: RunnerState, traj: Transition, advantages: jax.Array,
             targets: jax.Array):
    """update_epochs epochs of shuffled minibatches: (params, opt_state, key, stats)."""
    cfg = self.config
    n, m = cfg.batch_size, cfg.num_minibatches
    data = {"trans": traj, "advantages": advantages, "targets": targets}
    data = jax.tree_util.tree_map(lambda x: x.reshape((n,) + x.shape[2:]), data)

    def minibatch(carry, batch):
      params, opt_state = carry
      (_, stats), grads = jax.value_and_grad(self._loss, has_aux=True)(params, batch)
      updates, opt_state = self.optimizer.update(grads, opt_state, params)
      params = optax.apply_updates(params, updates)
      stats["grad_norm"] = jnp.sqrt(sum(jnp.sum(jnp.square(g))
                                        for g in jax.tree_util.tree_leaves(grads)))
      return (params, opt_state), stats

    def epoch(carry, _):
      params, opt_state, key = carry
      key, k_perm = jax.random.split(key)
      perm = jax.random.permutation(k_perm, n)
      batches = jax.tree_util.tree_map(
          lambda x: x[perm].reshape((m, n // m) + x.shape[1:]), data)
      batches = self._shard(batches, 1)
      (params, opt_state), stats = jax.lax.scan(minibatch, (params, opt_state), batches)
      return (params, opt_state, key), stats

    (params, opt_state, key), stats = jax.lax.scan(
        epoch, (runner.params, runner.opt_state, runner.key), None, cfg.update_epochs)
    return params, opt_state, key, jax.tree_util.tree_map(jnp.mean, stats)

  def _update(self, runner: RunnerState) -> tuple[RunnerState, dict[str, jax.Array]]:
    """One PPO update: rollout, GAE, learning, costing with the state's kernel table. Returns
    (runner, {metric: float32[]})."""
    with cost.bound_kernels(runner.kernels):
      return self._update_bound(runner)

  def _update_bound(self, runner: RunnerState) -> tuple[RunnerState, dict[str, jax.Array]]:
    cfg = self.config
    runner, traj, info = self._rollout(runner)
    last_value = self._values(runner.params, runner.obs)
    advantages, targets = gae(traj.reward, traj.value, traj.discount, traj.last, traj.bootstrap,
                              last_value, cfg.gamma, cfg.gae_lambda)
    opt_count = runner.update * cfg.update_epochs * cfg.num_minibatches
    params, opt_state, key, stats = self._learn(runner, traj, advantages, targets)
    runner = runner.replace(params=self._replicate(params),
                            opt_state=self._replicate(opt_state), key=key,
                            update=runner.update + 1)

    done = info["done"].astype(jnp.float32)
    episodes = done.sum()

    def over_episodes(x):
      return jnp.where(episodes > 0, jnp.sum(x * done) / jnp.maximum(episodes, 1.0), jnp.nan)

    metrics = {
        "env_steps": (runner.update * cfg.batch_size).astype(jnp.float32),
        "episodes": episodes,
        "episode_return": over_episodes(info["return"]),
        "episode_length": over_episodes(info["length"]),
        "episode_best_ratio": over_episodes(info["best_ratio"]),
        "best_cost_ratio": jnp.mean(runner.best_cost / runner.initial_cost),
        "reward": traj.reward.mean(),
        "stop_frac": info["stop"].astype(jnp.float32).mean(),
        "invalid_frac": info["invalid"].astype(jnp.float32).mean(),
        "value": traj.value.mean(),
        "learning_rate": jnp.asarray(self.schedule(opt_count), jnp.float32),
        **stats,
    }
    return runner, {k: jnp.asarray(metrics[k], jnp.float32) for k in METRICS}

  def _run(self, runner: RunnerState, num_updates: int):
    """`num_updates` updates in one scan: (runner, {metric: float32[num_updates]})."""
    return jax.lax.scan(lambda r, _: self._update(r), runner, None, num_updates)

  def _train(self, key: jax.Array):
    return self._run(self._init(key), self.config.num_updates)


def chunk_size(num_updates: int, wanted: int) -> int:
  """The largest divisor of `num_updates` that is <= `wanted`: the length of the jitted chunks a
  driver runs a training in (`Trainer.run(state, chunk)` compiles once per length)."""
  wanted = max(1, min(wanted, num_updates))
  return max(d for d in range(1, wanted + 1) if num_updates % d == 0)


def train_in_chunks(trainer: Trainer, state: RunnerState, updates_per_chunk: int, *,
                    max_seconds: float | None = None, started: float | None = None,
                    on_chunk: Callable[[int, RunnerState, dict[str, np.ndarray], float], None]
                    | None = None,
                    refresh: Callable[[RunnerState], tuple[Trainer, RunnerState] | None]
                    | None = None) -> tuple[RunnerState, dict[str, np.ndarray], int]:
  """The rest of the trainer's run from `state` in jitted chunks (`chunk_size`, one compile).

  Args:
    updates_per_chunk: the wished chunk length.
    max_seconds: stop after the first chunk that ends more than this after `started` (None: the
      whole run); started: a `time.perf_counter()` (default: now).
    refresh: called after each chunk (before `on_chunk`) with the state; a (trainer, state)
      it returns replaces both for the chunks that follow (e.g. an environment whose kernel
      table grew: `agents.training`); None keeps them.
    on_chunk: called after each chunk with (updates done, state, that chunk's metrics, seconds
      since `started`), e.g. to log progress.
  Returns:
    (state, metrics {name: float[updates run]}, updates done in all).
  """
  started = time.perf_counter() if started is None else started
  total = trainer.config.num_updates
  chunk = chunk_size(total, updates_per_chunk)
  done = int(state.update)
  chunks: list[dict[str, np.ndarray]] = []
  while done < total:
    state, m = trainer.run(state, chunk)
    chunks.append({k: np.asarray(v) for k, v in m.items()})
    done += chunk
    if refresh is not None:
      renewed = refresh(state)
      if renewed is not None:
        trainer, state = renewed
    elapsed = time.perf_counter() - started
    if on_chunk is not None:
      on_chunk(done, state, chunks[-1], elapsed)
    if max_seconds is not None and elapsed > max_seconds:
      break
  metrics = {k: np.concatenate([c[k] for c in chunks]) for k in METRICS} if chunks else {
      k: np.zeros([0], np.float32) for k in METRICS}
  return state, metrics, done


def make_train(config: PPOConfig, env: GraphRewriteEnv, agent: Agent,
               devices: Sequence[jax.Device] | None = None) -> Trainer:
  """PureJaxRL's entry point: `make_train(config, env, agent)(key) -> (RunnerState, metrics)`."""
  return Trainer(config, env, agent, devices)
