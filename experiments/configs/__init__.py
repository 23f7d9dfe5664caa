"""Training configs: ml_collections config files, `--config=experiments/configs/<file>.py:<arg>`."""
