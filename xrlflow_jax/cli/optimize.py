r"""The optimise job's command line: optimises a model's graph and writes the result with
measured evidence. Installed as `xrlflow optimize`; `python -m experiments.optimize` is the same
binary in a checkout.

    xrlflow optimize                      # tiny NasRNN, a short PPO run
    xrlflow optimize --model=squeezenet1_1 --size=tiny --method=greedy
    xrlflow optimize --onnx=../shared/models/squeezenet1_1.onnx --method=taso --budget=50 \
        --output=/tmp/sq
    xrlflow optimize --onnx=model.onnx --input_shape=x=1,3,224,224
    xrlflow optimize --onnx=resnext50.onnx --method=taso --against=taso_resnext50.onnx

Writes into --output (default /tmp/xrlflow_optimize/<model>_<method>): optimized.onnx (ONNX
inputs), rewrites.json, report.json, best_graph.txt and graph.png (when matplotlib or graphviz is
installed). Prints a before/after table: nodes, modelled cost, XLA latency (median and spread),
speedup, the numerics check and the time spent. The logic lives in `xrlflow_jax.optimize`.

Bad input (unknown model, missing file or a folder, bad --input_shape, budget, capacity, timing
settings or --output, a model too big for this machine's memory) is refused before any work;
that and a failed numerics check exit with status 1 and one line `error: ...`; conflicting
flags are usage errors.
"""

from __future__ import annotations

from typing import Sequence

from absl import app, flags, logging

from xrlflow_jax import optimize as opt
from xrlflow_jax.cli import flags as cli_flags
from xrlflow_jax.errors import UsageError, XrlflowError

_MODEL = flags.DEFINE_string("model", None, "A zoo model name (default: nasrnn when "
                             "neither --model nor --onnx is given).")
_ONNX = flags.DEFINE_string("onnx", None, "An ONNX file to optimise (instead of --model).")
_SHAPES = flags.DEFINE_multi_string("input_shape", [], "ONNX input shape, name=d0,d1,...; "
                                    "repeat for several inputs.")
_METHOD = flags.DEFINE_enum("method", "ppo", list(opt.METHODS), "Search method.")
_OUTPUT = flags.DEFINE_string("output", "", "Output directory (default "
                              "/tmp/xrlflow_optimize/<model>_<method>).")
_SIZE = flags.DEFINE_enum("size", "tiny", list(opt.SIZES), "Zoo model size.")
_BUDGET = flags.DEFINE_integer("budget", None, "ppo: PPO updates (default 12); greedy: max "
                               "steps; taso: graphs expanded; beam/random: steps.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of weights, search and training.")
_CAPACITY = flags.DEFINE_integer("capacity", 0, "Node slots (0: 1.3 x the node count, "
                                 "rounded up to 64).")
_RULES = flags.DEFINE_list("rules", [], "Rules and rule sets: built-in rule names, 'builtin', "
                           "'family:<name>' (e.g. family:merge_conv), 'taso:<path to TASO's "
                           "graph_subst.pb>' (or 'taso' with $XRLFLOW_TASO_RULES), joined by "
                           "commas or '+' (default: every built-in rule for the searches; for "
                           "ppo the first of the job's rule sets that applies: the MatMul "
                           "merges with the transposed layout, else five conv rules). The "
                           "searches keep the rules that "
                           "can fire.")
_MEASURE = flags.DEFINE_bool("measure", True, "Measure XLA latency of both graphs.")
_TIMING = cli_flags.define_timing_flags(rounds_name="latency_rounds", looks_name="latency_looks",
                                        looks_default=opt.DEFAULT_LOOKS,
                                        repeats_default=opt.DEFAULT_REPEATS)
_PICTURE = flags.DEFINE_bool("picture", True, "Draw graph.png.")
_KEEP_SLOWER = flags.DEFINE_bool("keep_slower", False, "Keep the optimised graph even when XLA "
                                 "measures it no faster than the input (default: keep the input).")
_TARGET = flags.DEFINE_enum(
    "target", "xla", ["xla", "onnxruntime"], "The runtime the result is measured in and judged "
    "by: xla (XLA executables) or onnxruntime (sessions with all graph optimisations; the "
    "input timed as your own file, so what is written is never slower than it there).")
_RANDOM_WEIGHTS = flags.DEFINE_bool(
    "random_weights", False, "Run a graph-only ONNX file (its external data file absent, as in "
    "../shared/models) on seeded random weights; the written optimized.onnx then holds them and "
    "says so in its metadata (default: such a file is refused, naming the missing file).")
_CHECKPOINTS = flags.DEFINE_integer("checkpoints", 2, "Prefixes of the search's rewrites (where "
                                    "the rule family changes, the last ones) timed beside its "
                                    "graph; the fastest significantly faster one is returned.")
_CACHE = flags.DEFINE_string("compilation_cache", "", "JAX's persistent compilation cache "
                             "directory (default: $XRLFLOW_COMPILATION_CACHE, else "
                             "~/.cache/xrlflow_jax/xla); 'off' to compile afresh.")
_PRECISION = flags.DEFINE_enum("precision", "highest", ["highest", "high", "default"],
                               "Numerics policy of matmuls and convolutions for both graphs "
                               "(highest: full float32; high/default: faster on GPUs, bf16_3x/"
                               "TF32); the numerics tolerance follows it.")
_KERNELS = flags.DEFINE_bool("kernel_table", True, "Cost MatMuls and convolutions by their "
                              "measured time on this device (each measured once, cached on "
                              "disk); false: the cost model's roofline alone.")
_AGAINST = flags.DEFINE_string("against", "", "An ONNX file of the same model optimised by "
                               "another tool (e.g. TASO's output), same inputs: timed in the "
                               "same rounds as the input and the result, its outputs checked "
                               "against the input's when both files carry weights.")
_PROGRESS = flags.DEFINE_float("progress_seconds", 20.0, "While a phase prints nothing for this "
                               "many seconds, a line says how long it has run and what XLA "
                               "compiled meanwhile (0: no such lines).")
_COEFFS = flags.DEFINE_string("cost_coefficients", "", "Cost-model coefficients (JSON) to use "
                              "(default: the shipped fit for this device kind, else a "
                              "calibration made on first use and cached).")


def source_from_flags() -> str:
  """The model to optimise: --model or --onnx (exactly one), or the default model."""
  if _MODEL.value and _ONNX.value:
    raise app.UsageError("give either --model or --onnx, not both")
  if _SHAPES.value and not _ONNX.value:
    raise app.UsageError("--input_shape applies to --onnx files only")
  if _ONNX.value:
    return _ONNX.value
  return _MODEL.value or opt.DEFAULT_MODEL


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  source = source_from_flags()
  try:
    shapes = opt.parse_input_shapes(_SHAPES.value)
    options = opt.OptimizeOptions(
        method=_METHOD.value, size=_SIZE.value, input_shapes=shapes or None,
        output_dir=_OUTPUT.value or None, budget=_BUDGET.value, seed=_SEED.value,
        capacity=_CAPACITY.value or None, rules=_RULES.value or None, measure=_MEASURE.value,
        latency_rounds=_TIMING.rounds.value, latency_looks=_TIMING.looks.value,
        repeats_per_round=_TIMING.repeats.value,
        min_round_ms=_TIMING.min_round_ms.value, picture=_PICTURE.value,
        keep_slower=_KEEP_SLOWER.value, compilation_cache_dir=_CACHE.value or None,
        cost_coefficients=_COEFFS.value or None, precision=_PRECISION.value,
        kernel_table=_KERNELS.value, against=_AGAINST.value or None,
        checkpoints=_CHECKPOINTS.value, random_weights=_RANDOM_WEIGHTS.value,
        target=_TARGET.value, progress_seconds=_PROGRESS.value)
    report = opt.optimize_model(source, options)
  except UsageError as e:  # bad input: one line, no usage text, no traceback
    raise SystemExit(f"error: {e}") from None
  except XrlflowError as e:
    raise SystemExit(f"error: {type(e).__name__}: {e}") from None
  print()
  print(report.table())
  print(f"outputs in {report.output_dir}: " + ", ".join(
      sorted(p.rsplit("/", 1)[-1] for p in report.files.values())))
