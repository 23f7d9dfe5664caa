r"""Summarises the model zoo: node count, build time, lower + compile time, XLA latency.

    python -m experiments.zoo_summary                       # the default model (resnet18)
    python -m experiments.zoo_summary --models=all --repeats=30
    python -m experiments.zoo_summary --models=bert,vit --size=tiny
"""

from __future__ import annotations

from absl import app, flags

from xrlflow_jax import models
from xrlflow_jax.harness import zoo_summary as report

_MODELS = flags.DEFINE_list("models", ["resnet18"], "Zoo models to summarise, or 'all'.")
_SIZE = flags.DEFINE_enum("size", "default", ["default", "tiny"], "Model size.")
_REPEATS = flags.DEFINE_integer("repeats", 20, "Timed runs per model.")
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed runs before timing.")


def main(argv: list[str]) -> None:
  del argv
  names = models.list_models() if _MODELS.value == ["all"] else _MODELS.value
  rows = []
  for name in names:
    rows.append(report.summarize_model(name, _SIZE.value, repeats=_REPEATS.value,
                                       warmup=_WARMUP.value))
    print(f"{name}: {rows[-1].nodes} nodes, {rows[-1].latency.median_ms:.3f} ms", flush=True)
  print()
  print(report.markdown(rows))


if __name__ == "__main__":
  app.run(main)
