r"""PPO training throughput: environment steps per second, learning included, per policy head.

    python -m experiments.train_benchmark                                   # tiny BERT
    python -m experiments.train_benchmark --model=resnext50 --batches=16,64
    python -m experiments.train_benchmark --model=../shared/models/bert_base.onnx --updates=2
    python -m experiments.train_benchmark --heads=candidates --memory_locations=2,4,8
    python -m experiments.train_benchmark --heads=local --batches=16 --profile \
        --variants=before,after                      # per part, side by side

For each head and batch size (environments per rollout) it compiles one PPO update (rollout of
`num_steps` steps with `lax.scan`, GAE, `update_epochs` x `num_minibatches` Adam steps) ahead
of time and times `updates` calls. steps/s = batch * num_steps / (median seconds per update).
Epochs default to the training config's (2; --update_epochs=4 for the README's 4-epoch
throughput figures).
--variants times several learners interleaved in one process (`xrlflow_jax.harness.train_benchmark`:
"after" is the library's learner, "before" a reference learner without its choices) and --profile
adds, per variant, milliseconds per batched call of each part (environment step, node costs,
agent inputs, encoder, local head, value, forward pass, gradient of the PPO loss over `batch`
observations) and each part as a multiple of one environment step.
The `candidates` head gets its own, smaller action space by default (--candidates_rules,
--candidates_max_locations): it encodes all R * L candidate graphs of every observation.
With --memory_locations it also reports XLA's memory estimate of the compiled update of the
`candidates` head (temporaries + arguments) against the number of candidate graphs R * L.
"""

from __future__ import annotations

import datetime

import jax
from absl import app, flags

from xrlflow_jax import graph as G
from xrlflow_jax.harness import train_benchmark as bench
from xrlflow_jax.harness import machine
from xrlflow_jax.agents import runs

from experiments.configs import ppo as ppo_configs

_MODEL = flags.DEFINE_string("model", "bert", "A zoo model name or an ONNX path.")
_SIZE = flags.DEFINE_enum("size", "tiny", ["default", "tiny"], "Zoo model size.")
_CAPACITY = flags.DEFINE_integer("capacity", 256, "Node slots (0: the loader's default).")
_HEADS = flags.DEFINE_list("heads", ["local", "candidates"], "Policy heads to time.")
_BATCHES = flags.DEFINE_list("batches", ["16", "64"], "Environments per rollout.")
_STEPS = flags.DEFINE_integer("num_steps", 8, "Rollout steps per update.")
_UPDATES = flags.DEFINE_integer("updates", 3, "Timed updates per variant (after an ahead-of-time "
                                "compile and one warm-up; interleaved across variants).")
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
_HIDDEN = flags.DEFINE_integer("hidden", None, "GNN width (default: the config's).")
_LAYERS = flags.DEFINE_integer("layers", None, "GNN layers (default: the config's).")
_MAX_CANDIDATES = flags.DEFINE_integer(
    "max_candidates", None, "Slots of the valid candidates the head scores (0: all R * L; "
    "default: the config's).")
_MEMORY = flags.DEFINE_list("memory_locations", [], "L values for the candidates-head memory "
                            "table (compile only).")
_COEFFS = flags.DEFINE_string("cost_coefficients", "", "Cost-model JSON ('' = shipped fit).")
_VARIANTS = flags.DEFINE_list("variants", ["after"], "Learners to time side by side: after (the "
                              "library's), before (before issue 14's changes), "
                              "agent:<field>=<value>[+...] or ppo:<field>=<value>[+...] (the "
                              "library's with AgentConfig or PPOConfig fields changed).")
_PROFILE = flags.DEFINE_bool("profile", False, "Also time each part of the learner per variant.")
_REPEATS = flags.DEFINE_integer("repeats", 7, "Interleaved rounds of the --profile timings.")
_EPOCHS = flags.DEFINE_integer("update_epochs", None, "PPO epochs per update (default: the "
                                "config's).")
_MINIBATCHES = flags.DEFINE_integer("num_minibatches", 4, "PPO minibatches per epoch.")


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
  if _HIDDEN.value:
    c.agent.hidden = _HIDDEN.value
  if _LAYERS.value:
    c.agent.layers = _LAYERS.value
  c.agent.remat = head == "candidates"
  if _MAX_CANDIDATES.value is not None:
    c.agent.max_candidates = _MAX_CANDIDATES.value
  c.ppo.num_envs = batch
  c.ppo.num_steps = _STEPS.value
  if _EPOCHS.value:
    c.ppo.update_epochs = _EPOCHS.value
  c.ppo.num_minibatches = _MINIBATCHES.value
  c.ppo.total_timesteps = batch * _STEPS.value * 1000
  return c


def _time_head(head: str, batch: int) -> list[dict]:
  run = runs.build(_config(head, batch))
  variants = [bench.variant(v, run.trainer) for v in _VARIANTS.value]
  rows = []
  for t in bench.time_updates(variants, repeats=_UPDATES.value):
    rows.append({"head": head, "variant": t.variant, "batch": batch, "compile_s": t.compile_s,
                 "s_per_update": t.s_per_update, "steps_per_s": t.steps_per_s,
                 "candidates": run.ruleset.num_actions, "nodes": G.num_nodes(run.graphs[0]),
                 "capacity": G.capacity(run.graphs[0]), "loss_finite": t.loss_finite})
  if _PROFILE.value:
    prof = bench.profile(variants, repeats=_REPEATS.value)
    print(f"\n{head} head, batch {batch}: ms per batched call (median of {_REPEATS.value} "
          f"interleaved rounds)\n{bench.profile_markdown(prof)}\n", flush=True)
  return rows


def _memory(locations: int, batch: int) -> dict:
  run = runs.build(_config("candidates", batch, locations))
  tr = run.trainer
  state = jax.eval_shape(tr._init, jax.random.PRNGKey(0))  # pylint: disable=protected-access
  compiled = tr.update.lower(state).compile()
  mem = compiled.memory_analysis()
  temp = getattr(mem, "temp_size_in_bytes", float("nan"))
  args = getattr(mem, "argument_size_in_bytes", float("nan"))
  return {"locations": locations, "candidates": run.ruleset.num_actions, "temp_mb": temp / 2**20,
          "args_mb": args / 2**20}


def main(argv: list[str]) -> None:
  del argv
  config = _config(_HEADS.value[0], 16)
  epochs = config.ppo.update_epochs
  print(f"{_MODEL.value} ({_SIZE.value}); GNN {config.agent.layers} x {config.agent.hidden}; "
        f"{_STEPS.value} steps/update, {epochs} epochs x {_MINIBATCHES.value} "
        f"minibatches; {machine.machine_description()}; {datetime.date.today()}", flush=True)
  rows = []
  for head in _HEADS.value:
    for batch in (int(b) for b in _BATCHES.value):
      for r in _time_head(head, batch):
        rows.append(r)
        print(f"{head:>10} ({r['candidates']} candidates) batch {batch:>3} [{r['variant']}]: "
              f"{r['steps_per_s']:8.1f} env steps/s "
              f"({r['s_per_update']:.2f} s/update; compile {r['compile_s']:.0f}s)", flush=True)
  if rows:
    print(f"\ngraph: {rows[0]['nodes']} nodes, capacity {rows[0]['capacity']}\n")
    print("| head | variant | R*L candidates | batch | env steps/s | s/update | compile s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
      print(f"| {r['head']} | {r['variant']} | {r['candidates']} | {r['batch']} | "
            f"{r['steps_per_s']:.1f} | {r['s_per_update']:.2f} | {r['compile_s']:.0f} |")
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
