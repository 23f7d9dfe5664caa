"""Training a PPO policy on a pool of graphs: the one training path of the optimise job's "ppo"
method, the benchmark's PPO column and the generalisation experiment.

    policy = training.train_ppo(["squeezenet"], [graph], [params], config, coeffs,
                                kernels=kernel_table.shared())
    policy.best(0)  # (best graph training met, its modelled cost)

With `kernels` (a `cost.KernelTimes`), the environment costs graphs with the measured kernel
table that the searches, the policy's rollouts and the measured guard are judged by, so the
policy can learn the layout and grouped-convolution changes that only measured kernels show;
without it, with the analytic roofline.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from xrlflow_jax import cost
from xrlflow_jax import graph as G
from xrlflow_jax.agents import ppo, runs
from xrlflow_jax.env import wrappers
from xrlflow_jax.graph import Graph, ParamStore

Log = Callable[[str], None]

@dataclasses.dataclass
class TrainedPolicy:
  """A PPO run's result.

  Attributes:
    run: `agents.runs.Run` (names, graphs, params, coeffs, ruleset, env, agent, trainer).
    state: the final RunnerState (network params in `state.params`; best graphs per pool graph).
    metrics: {metric: float32[updates run]} (see `agents.METRICS`).
    seconds: wall time of the kernel table, initialisation and training (compiles included);
    env_steps: steps taken.
    costs_with: "measured kernels" or "the roofline" (the environment's cost model).
    kernels_added: kernels measured during training for graphs it met that the environment's
      table lacked (`KernelCompletion`).
    chunk_programs: instances of the jitted training chunk made (traced or loaded from the
      disk), over every trainer the run used: 1 when the kernel table grew within the compiled
      program.
    seed: the seed of the run kept (`config.seed` plus its restart's index).
    restart_ratios: per restart run, in order, the mean over the pool of training's best cost
      over the initial cost (the lowest was kept).
  """
  run: Any
  state: Any
  metrics: dict[str, np.ndarray]
  seconds: float
  env_steps: int
  costs_with: str = "the roofline"
  kernels_added: int = 0
  chunk_programs: int = 0
  seed: int = 0
  restart_ratios: tuple[float, ...] = ()

  def best(self, index: int) -> tuple[Graph, float]:
    """(best graph seen during training, host arrays; its cost under the environment's model)
    of pool graph `index`."""
    graph = jax.tree_util.tree_map(lambda a: np.asarray(a[index]), self.state.best_graph)
    return graph, float(np.asarray(self.state.best_cost)[index])


def train_ppo(names: Sequence[str], graphs: Sequence[Graph], params: Sequence[ParamStore],
              config: Any, coeffs: cost.CostCoefficients, ruleset=None,
              log: Log | None = None, *, max_seconds: float | None = None,
              updates_per_chunk: int = 10, kernels: cost.KernelTimes | None = None,
              started: float | None = None,
              devices: Sequence[jax.Device] | None = None) -> TrainedPolicy:
  """Trains PPO on a pool of graphs (one capacity), in jitted chunks of `updates_per_chunk`
  updates (the largest divisor of the run's updates not above it; one compile), logging after
  each chunk.

  Args:
    config: a PPO config (xrlflow_jax/configs/ppo.py); `ruleset` overrides its
      `env.rules` / `max_locations`.
    max_seconds: a wall-clock budget from `started` (`time.perf_counter()`; None: now), the
      compiles included: training stops after the first chunk that ends past it (None: the
      config's whole run); `TrainedPolicy.env_steps` says how far it got.
    kernels: the measured kernel times the environment costs with, as the searches and the
      policy's rollouts do (`search.fill_kernel_table` fills them from the graphs a TASO-style
      search meets); None: the roofline. After every chunk the kernels of the graphs training
      holds (each pool graph's best, each environment's current and episode-best graph) that
      the table lacks are measured, and the grown table replaces the state's (an input of the
      compiled chunk) with those costs redone (`KernelCompletion`), so no graph training keeps
      is costed by the roofline: training's best has the cost the searches' model gives it.
    devices: the trainer's devices (default: every local device).

  A short run can collapse to stopping at once on an unlucky seed (its episodes then return
  nothing). Up to `config.restarts` runs (default 1) are trained in turn from seeds
  `config.seed`, `config.seed + 1`, ... with the same compiled programs (a restart costs its
  updates' run time, no compile): the next only after a run whose last chunk's mean episode
  return is not above 0, and while the time budget lasts. The run whose best graphs cost
  least (mean over the pool of best / initial cost; the earlier on a tie) is kept.
  """
  t0 = time.perf_counter() if started is None else started
  pool = (names, graphs, params)
  run = runs.build(config, devices, coeffs=coeffs, pool=pool, ruleset=ruleset,
                   kernels=kernels.table() if kernels is not None else None)
  cfg = run.trainer.config
  costs_with = "measured kernels" if kernels is not None else "the roofline"
  completion = None
  if kernels is not None:
    completion = KernelCompletion(kernels, lambda table: runs.build(
        config, devices, coeffs=coeffs, pool=pool, ruleset=run.ruleset, kernels=table), run)
  if log:
    budget = f", stopping after {max_seconds:.0f}s" if max_seconds else ""
    log(f"PPO on {list(names)} (capacity {G.capacity(graphs[0])}): {len(run.ruleset)} rules x "
        f"{run.ruleset.max_locations} locations, {cfg.num_updates} updates of {cfg.batch_size} "
        f"steps{budget}; environment costs with {costs_with}")
  restarts = max(1, int(config.get("restarts", 1)))

  def progress_of(label):
    def progress(done, state, metrics, elapsed):
      if log:
        ratio = np.asarray(state.best_cost) / np.asarray(state.initial_cost)
        ret = metrics["episode_return"]
        ret = float(np.nanmean(ret)) if np.isfinite(ret).any() else float("nan")
        log(f"  {label}update {done}/{cfg.num_updates}: episode return {ret:.3f}, best cost "
            f"ratio per graph {', '.join(f'{r:.4f}' for r in ratio)} ({elapsed:.0f}s)")
    return progress

  trainer = run.trainer
  kept = None  # (ratio, seed, state, metrics, done)
  last_chunk = ppo.chunk_size(cfg.num_updates, updates_per_chunk)
  ratios: list[float] = []
  env_steps = 0
  for restart in range(restarts):
    seed = int(config.seed) + restart
    label = f"seed {seed}: " if restarts > 1 else ""
    state = trainer.init(jax.random.PRNGKey(seed))
    state, metrics, done = ppo.train_in_chunks(trainer, state, updates_per_chunk,
                                               max_seconds=max_seconds, started=t0,
                                               on_chunk=progress_of(label), refresh=completion)
    if completion is not None:
      trainer = completion.run.trainer
    env_steps += done * cfg.batch_size
    last = state
    ratio = float(np.mean(np.asarray(state.best_cost) / np.asarray(state.initial_cost)))
    ratios.append(ratio)
    if kept is None or ratio < kept[0]:
      kept = (ratio, seed, state, metrics, done)
    out_of_time = max_seconds is not None and time.perf_counter() - t0 > max_seconds
    if out_of_time or learned_something(metrics["episode_return"][-last_chunk:]):
      break
  _, seed, state, metrics, done = kept
  if completion is not None and state is not last:
    # Costed with the table as it stood then; the entries never change, so this only redoes
    # the costs a rebuild since (a pool graph's own kernels measured later) changed.
    state = recost(completion.run.env.cost_fn, completion.run.env.pool,
                   state.replace(kernels=last.kernels))
  if log and len(ratios) > 1:
    log(f"  kept seed {seed}, the best of {len(ratios)} runs (best cost ratios "
        f"{', '.join(f'{r:.4f}' for r in ratios)}; a run is followed by the next seed's "
        f"when its episodes return nothing)")
  if completion is not None:
    run = completion.final_run()
    if log and completion.added:
      rebuilt = (f", the environment rebuilt {completion.rebuilds} time(s)"
                 if completion.rebuilds else "")
      log(f"  kernel table completed during training: {completion.added} kernels of graphs "
          f"training met measured{rebuilt}")
  if log and done < cfg.num_updates:
    log(f"  stopped at the time budget ({max_seconds:.0f}s) after {done} of "
        f"{cfg.num_updates} updates")
  seconds = time.perf_counter() - t0
  if log:
    log(f"PPO trained {env_steps} steps in {seconds:.1f}s (compile "
        f"included); final episode return {float(metrics['episode_return'][-1]):.3f}")
  trainers = completion.trainers if completion is not None else [run.trainer]
  return TrainedPolicy(run, state, metrics, seconds, env_steps, costs_with,
                       completion.added if completion is not None else 0,
                       sum(t.run.instances for t in trainers), seed, tuple(ratios))


def learned_something(episode_returns: np.ndarray) -> bool:
  """Whether a run's episodes (float[U] mean return per update, NaN where none ended) return
  a gain on average: False for a run that collapsed to stopping at once (return 0) or that
  only makes its graphs worse."""
  returns = np.asarray(episode_returns, np.float64)
  returns = returns[np.isfinite(returns)]
  return returns.size > 0 and float(np.mean(returns)) > 0.0


class KernelCompletion:
  """Keeps a training environment's kernel table complete for the graphs training holds: a
  `ppo.train_in_chunks` refresh hook. Inside the jitted environment a kernel the table lacks
  keeps the roofline's estimate, which can rank graphs differently from the measured model
  the searches and the report use; after each chunk this measures those kernels of every
  graph the state holds (pool bests [G], environments' current and episode-best graphs [B]),
  puts the grown table in the state (`RunnerState.kernels`, an input of the compiled update:
  no retrace while it fits its capacity) and recosts those graphs. Only when a pool graph's own
  cost changes (its kernels were missing at the start) is the run rebuilt, since the
  environment keeps its pool's first observations. The observations keep their node costs
  until the next step.

  Attributes:
    run: the current `runs.Run`; added: kernels measured so far; rebuilds: runs rebuilt;
    trainers: the trainers chunks ran on (the first, then one per rebuild).
  """

  def __init__(self, kernels: cost.KernelTimes, build: Callable[[cost.KernelTable], Any],
               run: Any):
    self.kernels, self.build, self.run = kernels, build, run
    self.added = 0
    self.rebuilds = 0
    self.trainers = [run.trainer]  # every trainer a chunk ran on
    self._run_table: Any = None  # the table `run` was built on, once the state's outgrew it

  def __call__(self, state: ppo.RunnerState) -> tuple[ppo.Trainer, ppo.RunnerState] | None:
    inner = wrappers.inner_state(state.env_state)
    added = 0
    for batch in (state.best_graph, inner.graph, inner.best_graph):
      host = jax.tree_util.tree_map(np.asarray, batch)
      for i in range(int(np.shape(host.nodes["op"])[0])):
        added += self.kernels.add(jax.tree_util.tree_map(lambda a, i=i: a[i], host))
    if not added:
      return None
    self.added += added
    # Placed as the state's table is, so the compiled chunk takes it as it is (an uncommitted
    # array would make the next chunk compile again).
    table = jax.tree_util.tree_map(lambda new, old: jax.device_put(new, old.sharding),
                                   self.kernels.table(), state.kernels)
    pool = self.run.env.pool
    pool_cost = batch_costs(self.run.env.cost_fn, table, pool)
    if not np.allclose(np.asarray(pool_cost), np.asarray(state.initial_cost), rtol=1e-6,
                       atol=0.0):
      self.rebuilds += 1
      self.run = self.build(table)
      self.trainers.append(self.run.trainer)
      self._run_table = None
    else:
      self._run_table = table
    return self.run.trainer, recost(self.run.env.cost_fn, pool, state.replace(kernels=table))

  def final_run(self) -> Any:
    """The run with an environment and agent built on the state's table (rebuilt when the
    table grew since `run` was built: what a policy driver after training costs with)."""
    if self._run_table is not None:
      self.run = self.build(self._run_table)
      self._run_table = None
    return self.run


@functools.lru_cache(maxsize=8)
def _batch_cost_fn(cost_fn: Callable[[Graph], jax.Array]) -> Callable[..., jax.Array]:
  def costs(table: Any, graphs: Graph) -> jax.Array:
    with cost.bound_kernels(table):
      return jax.vmap(lambda g: jnp.asarray(cost_fn(g), jnp.float32))(graphs)
  return jax.jit(costs)


def batch_costs(cost_fn: Callable[[Graph], jax.Array], table: Any, graphs: Graph) -> jax.Array:
  """float32[M]: `cost_fn` of each of `graphs` (leading [M]) with the kernel table `table`
  bound (`cost.bound_kernels`; None: `cost_fn`'s own); jitted once per cost function and M."""
  return _batch_cost_fn(cost_fn)(table, graphs)


def recost(cost_fn: Callable[[Graph], jax.Array], pool: Graph,
           state: ppo.RunnerState) -> ppo.RunnerState:
  """`state` with every cost it carries (pool graphs' initial and best costs; each
  environment's current, episode-initial and episode-best cost) redone by `cost_fn` with the
  state's kernel table; `pool` is the environment's stacked pool graphs [G]. One batched call
  over all 2G + 2B graphs."""
  inner = wrappers.inner_state(state.env_state)
  parts = (pool, state.best_graph, inner.graph, inner.best_graph)
  sizes = [int(np.shape(p.nodes["op"])[0]) for p in parts]
  joined = jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs, axis=0), *parts)
  costs = batch_costs(cost_fn, state.kernels, joined)
  initial, best, current, episode_best = jnp.split(costs, np.cumsum(sizes)[:-1])
  best, (best_graph, best_rewrites, best_num) = no_worse_than_start(
      best, (state.best_graph, state.best_rewrites, state.best_num_rewrites), initial,
      (pool, -1, 0))

  def fix(inner):
    start = initial[inner.graph_index]
    start_graph = jax.tree_util.tree_map(lambda a: a[inner.graph_index], pool)
    episode, (episode_graph,) = no_worse_than_start(episode_best, (inner.best_graph,), start,
                                                    (start_graph,))
    return inner.replace(cost=current, best_cost=episode, best_graph=episode_graph,
                         initial_cost=start)
  return state.replace(initial_cost=initial, best_cost=best, best_graph=best_graph,
                       best_rewrites=best_rewrites, best_num_rewrites=best_num,
                       env_state=wrappers.replace_inner_state(state.env_state, fix))


def no_worse_than_start(best_cost: jax.Array, best: Any, start_cost: jax.Array, start: Any
                        ) -> tuple[jax.Array, Any]:
  """(best_cost, best) where each recosted best (float32[M], with `best`: a pytree of leading
  [M]) that now costs more than its start (`start_cost` float32[M]) is the start again:
  `start`'s matching leaf ([M, ...], or a scalar filling, e.g. -1 for no rewrite rows). A
  graph that looked cheaper on a table's roofline fallback can cost more once its kernels are
  measured; the start is then the better graph held."""
  worse = best_cost > start_cost  # [M]

  def pick(held: jax.Array, fallback: Any) -> jax.Array:
    mask = worse.reshape(worse.shape + (1,) * (jnp.ndim(held) - 1))
    return jnp.where(mask, jnp.asarray(fallback, jnp.asarray(held).dtype), held)
  kept = jax.tree_util.tree_map(pick, best, start)
  return jnp.where(worse, start_cost, best_cost), kept
