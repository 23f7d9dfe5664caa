r"""Validates the in-graph cost model against measured XLA latency on rewritten variants.

For each model: random variants from random valid rewrite sequences of the built-in rules, and
one-step neighbours of the original, all measured end to end side by side with the original and
costed by the model; reports Spearman rank correlation and sign accuracy (see
`xrlflow_jax.harness.cost_validation`). Every graph is measured in `--passes` independent passes (each
compiles it afresh); the agreement of the passes with each other ("retest Spearman", and the
Spearman-Brown "ceiling" of their average) says how far any cost model could rank these
variants on this machine, since separately compiled copies of one graph differ by a few
percent and most rewrites change latency by less.

    python -m experiments.cost_validation                          # a few minutes: two tiny models
    python -m experiments.cost_validation --models=all --size=tiny --out=/tmp/validation.json
    python -m experiments.cost_validation --models=squeezenet1_1,nasrnn --size=default
    python -m experiments.cost_validation --models= --onnx         # ../shared/models files
"""

from __future__ import annotations

import json
from pathlib import Path

from absl import app, flags

from xrlflow_jax import models, workflow
from xrlflow_jax.cli import flags as cli_flags
from xrlflow_jax.cost import coefficient_files
from xrlflow_jax.cost import fit as fit_lib
from xrlflow_jax.cost import kernel_table
from xrlflow_jax.measure import latency
from xrlflow_jax.cost import model as cost_model
from xrlflow_jax.harness import cost_validation as validate
from xrlflow_jax.harness import machine
from xrlflow_jax.cost.profiler import ProfileCache
from xrlflow_jax.rules.walk import RewriteWalker

_MODELS = flags.DEFINE_list("models", ["bert", "resnet18"], "Zoo models, or 'all'.")
_SIZE = flags.DEFINE_enum("size", "tiny", list(models.SIZES), "Zoo model size.")
_ONNX = flags.DEFINE_bool("onnx", False, "Also validate every ../shared/models/*.onnx file.")
_ONNX_DIR = flags.DEFINE_string(
    "onnx_dir", str(Path(__file__).resolve().parents[1].parent / "shared" / "models"),
    "Folder of ONNX models for --onnx.")
_VARIANTS = flags.DEFINE_integer("variants", 30, "Random-walk variants per model.")
_NEIGHBOURS = flags.DEFINE_integer("neighbours", 15, "One-step neighbours per model.")
_MAX_STEPS = flags.DEFINE_integer("max_steps", 8, "Longest random rewrite sequence.")
_TIMING = cli_flags.define_timing_flags(repeats_name="repeats")
_PASSES = flags.DEFINE_integer(
    "passes", 2, "Independent measurement passes (2 or more report how reproducible the "
    "measured ranking is: the ceiling for any cost model).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the rewrite sequences.")
_COEFFS = flags.DEFINE_string("coeffs", None, "Coefficients JSON (default: the shipped ones).")
_BACKEND = flags.DEFINE_string("backend", None, "JAX platform (default: JAX's default).")
_OUT = flags.DEFINE_string("out", None, "Write every measurement as JSON here.")
_KERNELS = flags.DEFINE_bool("kernel_table", True, "Also rank by the model with the measured "
                              "kernel table (each kernel measured once, cached on disk).")
_FIT_CACHE = flags.DEFINE_string(
    "fit_cache", None, "A profile cache folder the coefficients were fitted from: variants it "
    "measured side by side are excluded, so the validation is held out.")


def main(argv: list[str]) -> None:
  del argv
  device = latency.resolve_device(_BACKEND.value)
  coeffs = coefficient_files.load_coefficients(device.device_kind, _COEFFS.value)
  names = models.list_models() if _MODELS.value == ["all"] else list(_MODELS.value)
  sources = [(n, _SIZE.value) for n in names]
  if _ONNX.value:
    sources += [(str(p), "default") for p in sorted(Path(_ONNX_DIR.value).glob("*.onnx"))]
  exclude: set[str] = set()
  if _FIT_CACHE.value:
    cache = ProfileCache(_FIT_CACHE.value, device.device_kind)
    exclude = {k.split("|")[2] for k in cache.entries if k.startswith(fit_lib.PAIR_PREFIX)}
    print(f"excluding {len(exclude)} graphs the fit measured")
  kernels = kernel_table.shared() if _KERNELS.value else None
  walkers: dict[tuple[int, int], RewriteWalker] = {}
  results = []
  for spec, size in sources:
    loaded = workflow.load(spec, size=size, random_weights=True)
    graph, params, name = loaded.graph, loaded.params, loaded.name
    key = tuple(graph.senders.shape) + tuple(graph.nodes["op"].shape)
    if key not in walkers:  # one compiled matcher per capacity
      walkers[key] = RewriteWalker()
    if kernels is not None:
      kernels.use_for(graph)  # the kernel timing a search of this model costs with
    res = validate.validate_model(graph, params, coeffs, name=name, walker=walkers[key],
                                  variants=_VARIANTS.value, neighbours=_NEIGHBOURS.value,
                                  max_steps=_MAX_STEPS.value, seed=_SEED.value,
                                  **_TIMING.options(), passes=_PASSES.value,
                                  backend=_BACKEND.value,
                                  exclude=exclude, kernels=kernels)
    results.append(res)
    print(f"{name}: Spearman {res.spearman_all:.3f} (walks {res.spearman_walks:.3f}; "
          f"retest {res.retest_spearman:.3f}, ceiling {res.ceiling:.3f}), sign "
          f"accuracy {res.sign_accuracy:.2f} over {res.sign_pairs} pairs, spread "
          f"{res.latency_spread:.2f}x, control deviation {100 * res.control_dev:.1f}%, "
          f"{res.seconds:.0f}s", flush=True)
    if res.with_kernels is not None:
      k = res.with_kernels
      print(f"{name} with the kernel table: Spearman {k.spearman_all:.3f} (walks "
            f"{k.spearman_walks:.3f}), sign accuracy {k.sign_accuracy:.2f}", flush=True)
    if _OUT.value:  # after every model, so a long run that is stopped keeps what it measured
      _write(_OUT.value, results, coeffs)
  print()
  print(validate.markdown(results, machine.machine_description(_BACKEND.value)))
  if _OUT.value:
    print(f"wrote {_OUT.value}")


def _write(path: str, results: list[validate.ModelValidation],
           coeffs: cost_model.CostCoefficients) -> None:
  described = machine.machine_description(_BACKEND.value)
  Path(path).write_text(json.dumps(
      {"machine": described, "coefficients": coeffs.to_json(),
       "markdown": validate.markdown(results, described),
       "models": [r.to_json() for r in results]}, indent=1, default=str))


if __name__ == "__main__":
  app.run(main)
