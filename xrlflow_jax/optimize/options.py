"""The optimise job's settings: `OptimizeOptions`, one frozen record checked once
(`OptimizeOptions.checked`) before any work."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Sequence

from xrlflow_jax.errors import UsageError
from xrlflow_jax.measure import ort
from xrlflow_jax.measure.guard import DEFAULT_CHECKPOINTS
from xrlflow_jax.ops import precision as precision_lib
from xrlflow_jax.optimize import checks
from xrlflow_jax.optimize.checks import OptimizeError

# Sets of latency rounds the guard may time (`measure.compare`'s looks): a second set only
# while the verdict is "no change". At 10 rounds, NasRNN's gate merges (1.1 ms a call) measured
# x1.185 [1.036, 1.348] against a control spanning 0.930-1.147, "no change" (2026-12-05).
DEFAULT_LOOKS = 2
# Timed runs per graph per round, at least (more for a graph under `min_round_ms`, so a round
# lasts about that long): a round's median is the verdict's paired unit, and a graph of 30 ms
# or more fills a round in one run. Three runs of a real model (BERT-base ONNX 125 ms,
# ResNeXt-50 230 ms a call) made the guard 40-46 s of a ~95-140 s cold job (2026-12-07).
DEFAULT_REPEATS = 1


@dataclasses.dataclass(frozen=True)
class OptimizeOptions:
  """Every setting of `optimize_model`.

  Attributes:
    method: "ppo" (short training + policy), "greedy", "taso", "beam" or "random".
    size: zoo size; input_shapes: ONNX dynamic input shapes {name: shape}.
    output_dir: where to write (default `report.default_output_dir`).
    budget: "ppo": PPO updates (default: the job config's 12); other methods: greedy's
      max_steps, taso's budget (graphs expanded), beam's and random's steps (see
      `methods.BUDGET_OPTION`); None: the search's default.
    seed: weights, search and training seed; capacity: node slots (default auto).
    rules: rule names (default: every built-in rule for the searches; for "ppo"
      `methods.default_ppo_rules`: the first of `configs.ppo.JOB_RULES` that applies).
    search_options: extra keyword options of `search.optimize`.
    measure: time the input and the result with XLA (latency_rounds rounds of
      repeats_per_round runs each, more runs per round for a fast graph so that a round lasts
      about min_round_ms; up to latency_looks such sets while the verdict is "no change",
      `measure.compare`'s looks), and return the input unless the result is measured
      significantly faster (`search.guard.measured_guard`).
    tolerance: bound on max |a - b| / (1 + |a|) of the outputs (None: the policy's,
      `ops.precision.tolerance`: 1e-3 at "highest").
    precision: numerics policy of matmuls and convolutions for both graphs ("highest",
      default; "high", "default": faster on GPUs, TF32/bf16), recorded in the report.
    picture: draw graph.png; cost_coefficients: a JSON file (None: this device's shipped fit
      or calibration, calibrated on first use: `cost.calibrate.coefficients`).
    write: write the output files (False: only return the report).
    keep_slower: keep the optimised graph even when XLA measured it no faster than the input.
    compilation_cache_dir: JAX's persistent compilation cache (None: `$XRLFLOW_COMPILATION_CACHE`
      or the per-user default; "off": none), see `compilation_cache.enable`.
    kernel_table: the searches cost MatMuls and convolutions by their measured time on this
      device (`cost.kernel_table`; each kernel measured once and kept in the profiler's
      on-disk cache, `$XRLFLOW_PROFILE_CACHE` or ~/.cache/xrlflow_jax/profiles); False: the
      model's roofline alone. "ppo": training's environment costs with the table too, filled
      first by a TASO-style search from the input (`search.fill_kernel_table`).
    against: an ONNX file of the same model optimised by another tool (e.g. TASO's output),
      taking the same inputs: timed in the same interleaved rounds as the input and the
      result, its outputs checked against the input's when both files carry their weights
      (`OptimizeReport.against`); needs `measure`.
    checkpoints: prefixes of the search's rewrites timed beside its graph (where the rule
      family changes, the last ones: `measure.guard.checkpoint_lengths`); the guard returns the
      fastest of them and the whole path among those measured significantly faster, every
      verdict at the level 1 - 0.05 / (1 + checkpoints) (0: the whole path alone); for "ppo",
      prefixes of the returned path (the policy's or training's best).
    target: the runtime the result is measured in, and so judged by: "xla" (XLA executables,
      CPU or GPU) or "onnxruntime" (onnxruntime sessions with all its graph optimisations, the
      CUDA execution provider where present, else the CPU one: `measure.ort`). Under
      "onnxruntime" an ONNX input is timed as the user's own file, so the result written is
      never slower than it in onnxruntime (the input is returned otherwise). The searches cost
      with the XLA-measured kernel table either way.
    random_weights: run an ONNX file whose external data is absent (a graph-only file) on
      seeded random weights (`workflow.load`); the report and the written file's metadata say
      so. False: such a file (the model or `against`) is refused, naming the missing file.
    progress_seconds: while a phase (loading, searching, checking and measuring, writing)
      prints nothing for this long, a line says how long it has run and what XLA compiled
      meanwhile (`optimize.heartbeat`); 0: no such lines.
  """
  method: str = "ppo"
  size: str = "tiny"
  input_shapes: Mapping[str, Sequence[int]] | None = None
  output_dir: str | os.PathLike | None = None
  budget: int | None = None
  seed: int = 0
  capacity: int | None = None
  rules: Sequence[str] | None = None
  search_options: Mapping[str, Any] | None = None
  measure: bool = True
  latency_rounds: int = 10
  repeats_per_round: int = DEFAULT_REPEATS
  min_round_ms: float = 30.0
  latency_looks: int = DEFAULT_LOOKS
  tolerance: float | None = None
  precision: str | None = None
  picture: bool = True
  cost_coefficients: str | None = None
  write: bool = True
  keep_slower: bool = False
  compilation_cache_dir: str | None = None
  kernel_table: bool = True
  against: str | None = None
  checkpoints: int = DEFAULT_CHECKPOINTS
  random_weights: bool = False
  target: str = "xla"
  progress_seconds: float = 20.0

  @classmethod
  def of(cls, options: OptimizeOptions | None = None, **settings: Any) -> OptimizeOptions:
    """`options` (default: every default) with `settings` replaced; OptimizeError naming an
    unknown setting."""
    unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
      raise OptimizeError(f"unknown optimise option(s) {unknown}; the options are the fields "
                          "of OptimizeOptions")
    return dataclasses.replace(options or cls(), **settings)

  def checked(self, source: str | None) -> OptimizeOptions:
    """These options (for `source`; None: a model given as a graph) with every one that can be
    checked without loading checked
    (`checks.check_request`: OptimizeError naming the option at fault), input shapes as int
    tuples, the precision policy and the tolerance resolved."""
    shapes = checks.check_request(
        None if source is None else str(source), method=self.method, size=self.size, input_shapes=self.input_shapes,
        output_dir=self.output_dir, budget=self.budget, capacity=self.capacity,
        latency_rounds=self.latency_rounds, repeats_per_round=self.repeats_per_round,
        min_round_ms=self.min_round_ms, tolerance=self.tolerance, precision=self.precision,
        write=self.write, against=self.against, measure=self.measure,
        latency_looks=self.latency_looks)
    if isinstance(self.checkpoints, bool) or not isinstance(self.checkpoints, int) \
        or self.checkpoints < 0:
      raise OptimizeError(f"checkpoints must be >= 0 (prefixes timed beside the found graph), "
                          f"got {self.checkpoints!r}")
    try:
      ort.check_runtime(self.target)
    except UsageError as e:
      raise OptimizeError(f"{e} (--target)") from None
    if isinstance(self.progress_seconds, bool) or not isinstance(
        self.progress_seconds, (int, float)) or not self.progress_seconds >= 0:
      raise OptimizeError(f"progress_seconds must be a number >= 0 (0: no progress lines), got "
                          f"{self.progress_seconds!r}")
    if self.target != "xla" and not self.measure:
      raise OptimizeError(f"--target={self.target} judges the result by measuring it: it "
                          "needs --measure")
    policy = precision_lib.check(self.precision)
    tolerance = precision_lib.tolerance(policy) if self.tolerance is None else self.tolerance
    return dataclasses.replace(self, input_shapes=shapes, precision=policy,
                               tolerance=float(tolerance))

  def compare_options(self) -> dict[str, Any]:
    """The keyword options of `measure.compare` (and so of the measured guard) these give."""
    return {"rounds": self.latency_rounds, "looks": self.latency_looks,
            "repeats_per_round": self.repeats_per_round, "min_round_ms": self.min_round_ms,
            "seed": self.seed, "tolerance": self.tolerance, "precision": self.precision,
            "runtime": self.target}
