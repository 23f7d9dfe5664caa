"""PPO training configs for `--config=experiments/configs/ppo.py:<model>`; the configs live in
the package (`xrlflow_jax/configs/ppo.py`, which documents <model> and the fields)."""

from xrlflow_jax.configs.ppo import DEFAULT_RULES, TEST_RULES, get_config

__all__ = ["DEFAULT_RULES", "TEST_RULES", "get_config"]
