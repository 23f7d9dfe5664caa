r"""Rewrite-engine throughput: "match every rule + apply one random rewrite" steps per second.

    python -m experiments.rewrite_benchmark                                  # BERT-base ONNX
    python -m experiments.rewrite_benchmark --model=resnext50 --batches=1,16,64
    python -m experiments.rewrite_benchmark --per_rule                       # slowest matchers

The default model is ../shared/models/bert_base.onnx (`workflow.load`: a zoo name, an ONNX path
or a ../shared/models stem) at the loader's capacity (1.3 x its nodes, rounded up to 64; the
README's figures used --capacity=1024).
"""

from __future__ import annotations

import platform
from pathlib import Path

import jax
from absl import app, flags

from xrlflow_jax import graph as G
from xrlflow_jax import workflow
from xrlflow_jax.rules import RuleSet
from xrlflow_jax.harness import rewrite_benchmark as bench
from xrlflow_jax.rules.library import builtin_rules

_MODEL = flags.DEFINE_string("model", "bert_base", "A zoo name, an ONNX path or a "
                             "../shared/models stem.")
_SIZE = flags.DEFINE_enum("size", "default", ["default", "tiny"], "Zoo model size.")
_CAPACITY = flags.DEFINE_integer("capacity", None, "Node slots (default: the loader's, 1.3 x "
                                 "the nodes rounded up to 64).")
_BATCHES = flags.DEFINE_list("batches", ["1", "64"], "Batch sizes (vmapped graphs).")
_STEPS = flags.DEFINE_integer("steps", 10, "Steps per timed rollout (one lax.scan).")
_LOCATIONS = flags.DEFINE_integer("max_locations", 64, "L: locations kept per rule.")
_PER_RULE = flags.DEFINE_bool("per_rule", False, "Also time each rule's matcher alone.")


def main(argv: list[str]) -> None:
  del argv
  graph = workflow.load(_MODEL.value, size=_SIZE.value, capacity=_CAPACITY.value,
                        random_weights=True).graph
  ruleset = RuleSet(builtin_rules(), max_locations=_LOCATIONS.value)
  print(f"model {Path(_MODEL.value).name}: {G.num_nodes(graph)} nodes, capacity "
        f"{G.capacity(graph)}; {len(ruleset)} rules x {ruleset.max_locations} locations; "
        f"{jax.devices()[0].platform} ({jax.devices()[0].device_kind}), {platform.machine()}")
  rows = []
  for batch in (int(b) for b in _BATCHES.value):
    rows.append(bench.time_steps(ruleset, graph, batch, steps=_STEPS.value))
    print(f"batch {batch}: {rows[-1].seconds_per_step * 1e3:.2f} ms/step, "
          f"{rows[-1].rewrites_per_s:.0f} rewrites/s", flush=True)
  print()
  print(bench.markdown(rows))
  if _PER_RULE.value:
    print("\nslowest matchers (ms per match, batch 1):")
    for name, seconds in bench.time_rule_matches(ruleset, graph)[:15]:
      print(f"  {name:40s} {seconds * 1e3:8.3f}")


if __name__ == "__main__":
  app.run(main)
