r"""PPO training throughput: environment steps per second, learning included, per policy head.

    python -m experiments.train_benchmark                                   # tiny BERT
    python -m experiments.train_benchmark --model=resnext50 --batches=16,64
    python -m experiments.train_benchmark --model=../shared/models/bert_base.onnx --updates=2
    python -m experiments.train_benchmark --heads=candidates --memory_locations=2,4,8

For each head and batch size (environments per rollout) it compiles one PPO update (rollout of
`num_steps` steps with `lax.scan`, GAE, `update_epochs` x `num_minibatches` Adam steps) ahead
of time and times `updates` calls. steps/s = updates * batch * num_steps / seconds.
The `candidates` head gets its own, smaller action space by default (--candidates_rules,
--candidates_max_locations): it encodes all R * L candidate graphs of every observation.
With --memory_locations it also reports XLA's memory estimate of the compiled update of the
`candidates` head (temporaries + arguments) against the number of candidate graphs R * L.
"""

from __future__ import annotations

import platform
import time

import jax
import numpy as np
from absl import app, flags

from xrlflow_jax import graph as G
from xrlflow_jax.agents import runs

from experiments.configs import ppo as ppo_configs

_MODEL = flags.DEFINE_string("model", "bert", "A zoo model name or an ONNX path.")
_SIZE = flags.DEFINE_enum("size", "tiny", ["default", "tiny"], "Zoo model size.")
_CAPACITY = flags.DEFINE_integer("capacity", 256, "Node slots (0: the loader's default).")
_HEADS = flags.DEFINE_list("heads", ["local", "candidates"], "Policy heads to time.")
_BATCHES = flags.DEFINE_list("batches", ["16", "64"], "Environments per rollout.")
_STEPS = flags.DEFINE_integer("num_steps", 8, "Rollout steps per update.")
_UPDATES = flags.DEFINE_integer("updates", 2, "Timed updates (after an ahead-of-time compile).")
_LOCATIONS = flags.DEFINE_integer("max_locations", 8, "L: locations kept per rule (local head).")
_RULES = flags.DEFINE_list("rules", list(ppo_configs.DEFAULT_RULES),
                           "Rule names or 'all' (local head).")
# The candidates head encodes every candidate graph (R * L of them per observation, in the
# rollout and again in every minibatch), so on a CPU it gets a smaller action space by default.
_CAND_LOCATIONS = flags.DEFINE_integer("candidates_max_locations", 2,
                                       "L for the candidates head.")
_CAND_RULES = flags.DEFINE_list("candidates_rules", [
    "merge_matmul_shared_input_2", "merge_matmul_shared_input_3", "split_matmul_shared_input_2",
    "matmul_gelu_fuse", "add_commute", "add_assoc_left"], "Rules for the candidates head.")
_HIDDEN = flags.DEFINE_integer("hidden", 64, "GNN width.")
_LAYERS = flags.DEFINE_integer("layers", 5, "GNN layers.")
_MEMORY = flags.DEFINE_list("memory_locations", [], "L values for the candidates-head memory "
                            "table (compile only).")
_COEFFS = flags.DEFINE_string("cost_coefficients", "", "Cost-model JSON ('' = shipped fit).")


def _config(head: str, batch: int, locations: int | None = None):
  c = ppo_configs.get_config(_MODEL.value)
  if _MODEL.value.endswith(".onnx"):
    c.model.onnx, c.model.name = _MODEL.value, ""
  c.model.size = _SIZE.value
  c.model.capacity = _CAPACITY.value
  cand = head == "candidates"
  c.env.rules = tuple(_CAND_RULES.value if cand else _RULES.value)
  c.env.max_locations = locations or (_CAND_LOCATIONS.value if cand else _LOCATIONS.value)
  c.env.cost_coefficients = _COEFFS.value
  c.agent.head = head
  c.agent.hidden = _HIDDEN.value
  c.agent.layers = _LAYERS.value
  c.agent.remat = head == "candidates"
  c.ppo.num_envs = batch
  c.ppo.num_steps = _STEPS.value
  c.ppo.num_minibatches = 4
  c.ppo.total_timesteps = batch * _STEPS.value * 1000
  return c


def _time_head(head: str, batch: int) -> dict:
  run = runs.build(_config(head, batch))
  tr = run.trainer
  t0 = time.perf_counter()
  state = jax.block_until_ready(tr.init(jax.random.PRNGKey(0)))
  t1 = time.perf_counter()
  update = jax.jit(tr._update).lower(state).compile()  # pylint: disable=protected-access
  t2 = time.perf_counter()
  metrics = None
  t3 = time.perf_counter()
  for _ in range(_UPDATES.value):
    state, metrics = update(state)
  jax.block_until_ready(metrics)
  seconds = time.perf_counter() - t3
  steps = _UPDATES.value * batch * _STEPS.value
  return {"head": head, "batch": batch, "init_s": t1 - t0, "compile_s": t2 - t1,
          "s_per_update": seconds / _UPDATES.value,
          "steps_per_s": steps / seconds, "candidates": run.ruleset.num_actions,
          "nodes": G.num_nodes(run.graphs[0]), "capacity": G.capacity(run.graphs[0]),
          "loss_finite": bool(np.isfinite(float(metrics["loss"])))}


def _memory(locations: int, batch: int) -> dict:
  run = runs.build(_config("candidates", batch, locations))
  tr = run.trainer
  state = jax.eval_shape(tr._init, jax.random.PRNGKey(0))  # pylint: disable=protected-access
  compiled = jax.jit(tr._update).lower(state).compile()  # pylint: disable=protected-access
  mem = compiled.memory_analysis()
  temp = getattr(mem, "temp_size_in_bytes", float("nan"))
  args = getattr(mem, "argument_size_in_bytes", float("nan"))
  return {"locations": locations, "candidates": run.ruleset.num_actions, "temp_mb": temp / 2**20,
          "args_mb": args / 2**20}


def main(argv: list[str]) -> None:
  del argv
  dev = jax.devices()[0]
  print(f"{_MODEL.value} ({_SIZE.value}); GNN {_LAYERS.value} x {_HIDDEN.value}; "
        f"{_STEPS.value} steps/update, 4 "
        f"epochs x 4 minibatches; {dev.platform} ({dev.device_kind}) x {len(jax.devices())}, "
        f"{platform.machine()}", flush=True)
  rows = []
  for head in _HEADS.value:
    for batch in (int(b) for b in _BATCHES.value):
      r = _time_head(head, batch)
      rows.append(r)
      print(f"{head:>10} ({r['candidates']} candidates) batch {batch:>3}: "
            f"{r['steps_per_s']:8.1f} env steps/s "
            f"({r['s_per_update']:.2f} s/update; compile {r['compile_s']:.0f}s)", flush=True)
  if rows:
    print(f"\ngraph: {rows[0]['nodes']} nodes, capacity {rows[0]['capacity']}\n")
    print("| head | R*L candidates | batch | env steps/s | s/update | compile s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
      print(f"| {r['head']} | {r['candidates']} | {r['batch']} | {r['steps_per_s']:.1f} | "
            f"{r['s_per_update']:.2f} | {r['compile_s']:.0f} |")
  if _MEMORY.value:
    batch = int(_BATCHES.value[0])
    print(f"\ncandidates head, batch {batch}: XLA memory of one compiled update")
    print("| L | candidates R*L | temporaries MiB | arguments MiB |")
    print("|---|---|---|---|")
    for loc in (int(x) for x in _MEMORY.value):
      m = _memory(loc, batch)
      print(f"| {m['locations']} | {m['candidates']} | {m['temp_mb']:.1f} | {m['args_mb']:.1f} |",
            flush=True)


if __name__ == "__main__":
  app.run(main)
