r"""The table "which rewrites pay under XLA": every rule at all its locations, measured.

For each zoo model and each built-in rule that fires on it, the rule is applied at all of its
locations in the original graph and the rewritten graph is measured side by side with the
original (see `xrlflow_jax.harness.rewrite_gains`); the table gives after / before ratios per rule and model
and a per-rule summary, with the cost model's predicted ratio beside each.

    python -m experiments.rewrite_gains                            # a few minutes: tiny models
    python -m experiments.rewrite_gains --models=all --size=default --out=/tmp/gains.json
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from absl import app, flags

from xrlflow_jax import models, workflow
from xrlflow_jax.cli import flags as cli_flags
from xrlflow_jax.harness import rewrite_gains as gains
from xrlflow_jax.measure import latency
from xrlflow_jax.cost import coefficient_files
from xrlflow_jax.cost import model as cost_model
from xrlflow_jax.harness import machine
from xrlflow_jax.rules.walk import RewriteWalker

_MODELS = flags.DEFINE_list("models", ["bert", "resnet18", "squeezenet1_1"],
                            "Zoo models, or 'all'.")
_SIZE = flags.DEFINE_enum("size", "tiny", list(models.SIZES), "Zoo model size.")
_FAMILIES = flags.DEFINE_list("families", None, "Rule families (default: all).")
_MAX_APPLY = flags.DEFINE_integer("max_apply", 200, "Most applications of one rule per model.")
_TIMING = cli_flags.define_timing_flags(repeats_name="repeats")
_PASSES = flags.DEFINE_integer(
    "passes", 3, "Independent measurement passes (each compiles every graph afresh); the ratio "
    "is their geometric mean and the table shows their range.")
_COEFFS = flags.DEFINE_string("coeffs", None, "Coefficients JSON (default: the shipped ones).")
_BACKEND = flags.DEFINE_string("backend", None, "JAX platform (default: JAX's default).")
_OUT = flags.DEFINE_string("out", None, "Write the rows as JSON here.")


def main(argv: list[str]) -> None:
  del argv
  device = latency.resolve_device(_BACKEND.value)
  try:
    coeffs = coefficient_files.load_coefficients(device.device_kind, _COEFFS.value)
  except cost_model.CostModelError as e:
    print(f"(no model column: {e})")
    coeffs = None
  names = models.list_models() if _MODELS.value == ["all"] else list(_MODELS.value)
  walkers: dict[tuple[int, ...], RewriteWalker] = {}
  rows = []
  for spec in names:
    loaded = workflow.load(spec, size=_SIZE.value, random_weights=True)
    graph, params, name = loaded.graph, loaded.params, loaded.name
    key = tuple(graph.senders.shape) + tuple(graph.nodes["op"].shape)
    if key not in walkers:
      walkers[key] = RewriteWalker()
    rows += gains.rewrite_gains(graph, params, model=name, walker=walkers[key], coeffs=coeffs,
                                families=_FAMILIES.value, max_apply=_MAX_APPLY.value,
                                **_TIMING.options(), passes=_PASSES.value,
                                backend=_BACKEND.value)
  print()
  print(gains.markdown(rows, machine.machine_description(_BACKEND.value)))
  if _OUT.value:
    Path(_OUT.value).write_text(json.dumps(
        {"machine": machine.machine_description(_BACKEND.value),
         "rows": [dataclasses.asdict(r) for r in rows]}, indent=1))
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  app.run(main)
