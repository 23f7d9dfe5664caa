"""Experiment harnesses: the logic of the benchmark binaries in `experiments/`, above the core.

  benchmark          the optimisation benchmark and the evaluation (methods side by side)
  variants           random valid rewrite walks of a model (RewriteWalker), for validation
  cost_validation    does the cost model rank rewritten variants as XLA's latency does?
  rewrite_gains      which rewrites pay under XLA (each applied everywhere, measured)
  env_benchmark      environment steps per second against batch size
  rewrite_benchmark  the matcher and the edit kernel, per rule
  search_benchmark   graphs expanded per second by the TASO-style search
  train_benchmark    the learner: forward, gradient and PPO updates, per part
  zoo_summary        build, compile and XLA latency of every zoo model
  device_report      one report of a device: calibration, env and PPO throughput, the optimise
                     job, cost-model validation, multi-device scaling
  machine            the machine line of every report

Each is imported by its module name (`from xrlflow_jax.harness import cost_validation`); none is
imported by the core packages.
"""
