"""Experiment binaries (absl flags); run from the repository root with `python -m experiments.X`."""
