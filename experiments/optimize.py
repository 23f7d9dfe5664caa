r"""Optimises a model's graph and writes the result with measured evidence: the `xrlflow
optimize` command (`xrlflow_jax.cli.optimize`, which documents the flags) run from a checkout.

    python -m experiments.optimize                      # tiny SqueezeNet, a short PPO run
    python -m experiments.optimize --onnx=model.onnx --method=taso
"""

from absl import app

from xrlflow_jax.cli.optimize import main  # defines the optimise job's flags

if __name__ == "__main__":
  app.run(main)
