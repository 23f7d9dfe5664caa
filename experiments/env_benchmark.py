r"""Environment throughput: random-policy env steps per second against batch size, peak memory,
and a breakdown of one step (which part is the bottleneck).

    python -m experiments.env_benchmark                     # BERT-base and ResNeXt-50 ONNX
    python -m experiments.env_benchmark --models=resnet18 --batches=1,16 --size=tiny

Models are ONNX paths, names of files in ../shared/models (bert_base, resnext50, ...), or zoo
names (`workflow.load`), at the loader's capacity (1.3 x the nodes rounded up to 64; the README's
figures used --capacity=1024); whole built-in rule set, L locations per rule.
"""

from __future__ import annotations

import datetime
import platform
from pathlib import Path

import jax
from absl import app, flags

from xrlflow_jax import cost, workflow
from xrlflow_jax import graph as G
from xrlflow_jax.harness import env_benchmark as bench
from xrlflow_jax.rules import RuleSet
from xrlflow_jax.rules.library import builtin_rules

_MODELS = flags.DEFINE_list("models", ["bert_base", "resnext50"],
                            "ONNX paths, ../shared/models stems, or zoo names.")
_SIZE = flags.DEFINE_enum("size", "default", ["default", "tiny"], "Zoo model size.")
_CAPACITY = flags.DEFINE_integer("capacity", None, "Node slots (default: the loader's, 1.3 x "
                                 "the nodes rounded up to 64).")
_BATCHES = flags.DEFINE_list("batches", ["1", "16", "64", "256"], "Environments per batch.")
_STEPS = flags.DEFINE_integer("steps", 10, "Steps per timed rollout (one lax.scan).")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Timed rollouts (best is reported).")
_LOCATIONS = flags.DEFINE_integer("max_locations", 64, "L: locations kept per rule.")
_HORIZON = flags.DEFINE_integer("horizon", 50, "Episode horizon.")
_PARTS = flags.DEFINE_integer("parts_batch", 16, "Batch for the per-part breakdown (0: skip).")


def main(argv: list[str]) -> None:
  del argv
  dev = jax.devices()[0]
  coeffs = cost.coefficients()
  ruleset = RuleSet(builtin_rules(), max_locations=_LOCATIONS.value)
  print(f"{datetime.date.today()}; {dev.platform} ({dev.device_kind}), {platform.machine()}, "
        f"{len(jax.devices())} device(s); {len(ruleset)} rules x {ruleset.max_locations} "
        f"locations; random valid policy, horizon {_HORIZON.value}, auto-reset", flush=True)
  tables = []
  for model in _MODELS.value:
    graph = workflow.load(model, size=_SIZE.value, capacity=_CAPACITY.value,
                          random_weights=True).graph
    env = bench.make_env(graph, ruleset, coeffs, _HORIZON.value)
    print(f"\n{model}: {G.num_nodes(graph)} nodes, capacity {G.capacity(graph)}", flush=True)
    rows = []
    for batch in (int(b) for b in _BATCHES.value):
      rows.append(bench.time_env(env, batch, steps=_STEPS.value, repeats=_REPEATS.value))
      r = rows[-1]
      print(f"  batch {batch:>4}: {r.steps_per_s:8.1f} steps/s ({r.seconds_per_step * 1e3:.1f} "
            f"ms/step; compile {r.compile_s:.0f}s; XLA temp {r.temp_mb:.0f} MB; peak RSS "
            f"{r.peak_rss_mb:.0f} MB)", flush=True)
    tables.append(bench.markdown(Path(model).stem, rows))
    if _PARTS.value:
      parts = bench.time_parts(env, _PARTS.value)
      print(f"  one step at batch {_PARTS.value}, ms per batched call: "
            + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()), flush=True)
  print("\n" + "\n\n".join(tables))


if __name__ == "__main__":
  app.run(main)
