"""Training configs (ml_collections), shipped with the package so that an installed
`xrlflow_jax` (no checkout, no `experiments/`) can train: `configs.ppo.get_config(arg)`."""
