r"""Optimises a model's graph and writes the result with measured evidence: the `xrlflow
optimize` command (`xrlflow_jax.cli.optimize`, which documents the flags) run from a checkout.

    python -m experiments.optimize                      # tiny SqueezeNet, a short PPO run
    python -m experiments.optimize --onnx=model.onnx --method=taso
"""

from absl import app

from xrlflow_jax.cli.optimize import main, source_from_flags  # noqa: F401  (defines the flags)

if __name__ == "__main__":
  app.run(main)
