"""`python -m xrlflow_jax <command> [flags]`: the `xrlflow` console script."""

from xrlflow_jax.cli import run

if __name__ == "__main__":
  run()
