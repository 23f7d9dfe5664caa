"""Multi-process training on JAX's own distributed runtime (`jax.distributed`).

    distributed.initialize("10.0.0.1:1234", num_processes=2, process_id=0)  # or initialize()
    trainer = runs.build(config).trainer       # its mesh spans every process's devices
    distributed.check_same_program(trainer)    # every process built the same environment
    state, metrics = trainer.run(trainer.init(key), n)   # one SPMD program, gradients all-reduced
    host = distributed.to_host(state.best_cost)          # a collective: every process calls it

Every process runs the same Python program on the same inputs (JAX's multi-controller model):
the trainer's 1-D "data" mesh then covers the devices of all processes, each process steps the
environments of its own devices, and XLA's collectives (gloo on CPUs, NCCL on GPUs, ICI on TPUs)
average the gradients. Only process 0 writes metrics and reports (`is_main`); checkpoints are
written by all (`checkpoint.save`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from xrlflow_jax import trace_cache
from xrlflow_jax.cost.model import KernelTable
from xrlflow_jax.errors import XrlflowError


# Process 0 alone checks and times the best graphs after training while the others wait at
# JAX's shutdown barrier (300 s by default): an hour covers a large model's measurement.
SHUTDOWN_TIMEOUT_S = 3600


class DistributedError(XrlflowError):
  """Processes of one run that disagree, or a runtime that could not start."""


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> None:
  """Starts JAX's distributed runtime; call it before anything touches a device.

  With no arguments JAX detects the cluster (SLURM, Open MPI, Kubernetes, Cloud TPU); otherwise
  all three name the coordinator ("host:port", served by process 0), the number of processes
  and this one's index.
  """
  if jax.distributed.is_initialized():
    return
  try:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id,
                               shutdown_timeout_seconds=SHUTDOWN_TIMEOUT_S)
  except (RuntimeError, ValueError) as e:
    raise DistributedError(
        f"jax.distributed.initialize(coordinator_address={coordinator_address!r}, "
        f"num_processes={num_processes}, process_id={process_id}) failed: {e}") from None


def is_main() -> bool:
  """Whether this is the process that writes metrics, reports and checkpoint metadata."""
  return jax.process_index() == 0


def multi_process() -> bool:
  return jax.process_count() > 1


def barrier(name: str) -> None:
  """Waits until every process reaches the barrier `name` (nothing with one process)."""
  if multi_process():
    multihost_utils.sync_global_devices(name)


def to_host(tree: Any) -> Any:
  """The whole value of every array of `tree` as numpy, on every process. Arrays whose shards
  live on other processes are gathered (a collective: every process must call this)."""

  def one(x: Any) -> Any:
    if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)

  return jax.tree_util.tree_map(one, tree)


def from_main(tree: Any, like: Any = None) -> Any:
  """Process 0's value of `tree` on every process (a collective). The other processes pass
  `like`, a pytree of the same structure whose leaves have the shapes of process 0's (e.g.
  zeros), or None when `tree` already has them there."""
  if not multi_process():
    return tree
  source = tree if is_main() or like is None else like
  return jax.tree_util.tree_map(np.asarray, multihost_utils.broadcast_one_to_all(source))


def broadcast_kernel_table(table: Any) -> Any:
  """Process 0's measured kernel table (`cost.KernelTable`) on every process; the others pass
  None. Kernel times differ between processes that each measure, and each would then trace
  another environment: one process measures, all cost with its times."""
  if not multi_process():
    return table
  size = int(from_main(np.int32(table.keys.shape[0] if is_main() else 0)))
  blank = KernelTable(keys=np.zeros([size], np.uint32), ms=np.zeros([size], np.float32))
  out = from_main(table if is_main() else blank, like=blank)
  return KernelTable(keys=jnp.asarray(out.keys), ms=jnp.asarray(out.ms))


def check_same_program(trainer: Any) -> None:
  """Raises DistributedError unless every process built a trainer with the same fingerprint
  (graphs, rules, cost model, agent, PPO config): processes that traced different programs
  would run one SPMD step on different environments, silently."""
  if not multi_process():
    return
  digest = trace_cache.fingerprint(trainer)
  mine = np.frombuffer(bytes.fromhex(digest)[:16], np.uint8)
  everyone = np.asarray(multihost_utils.process_allgather(mine))  # [processes, 16]
  differ = [i for i in range(everyone.shape[0]) if not np.array_equal(everyone[i], everyone[0])]
  if differ:
    raise DistributedError(
        f"processes {differ} built another trainer than process 0 (graphs, rules, cost "
        "coefficients, agent or PPO config differ; give every process the same config and a "
        "cost coefficients file, --config.env.cost_coefficients, rather than calibrating in each)")
