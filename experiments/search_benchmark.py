r"""Search speed: warm and cold expansions per second of the TASO-style search, per model,
beside TASO's own figure on this machine class.

    python -m experiments.search_benchmark                      # the ../shared models + NasRNN
    python -m experiments.search_benchmark --models=squeezenet1_1 --size=tiny --budget=20
    python -m experiments.search_benchmark --compilation_cache=off   # cold = a fresh compile
    python -m experiments.search_benchmark --fast_compile=false       # the fastest code

Models are zoo names or ONNX paths (loaded as the optimise job loads them). Each model is
searched twice in this process with a fresh Expander: the first call compiles (or loads from
JAX's persistent compilation cache), the second is warm.
"""

from __future__ import annotations

import platform
from pathlib import Path

import jax
from absl import app, flags

from xrlflow_jax import compilation_cache
from xrlflow_jax import optimize as opt
from xrlflow_jax.cost import kernel_table
from xrlflow_jax.harness import search_benchmark as bench
from xrlflow_jax.search.expand import FAST_COMPILE_MAX_EXPANSIONS

_SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "models"
_DEFAULT_MODELS = [str(_SHARED / f) for f in ("squeezenet1_1.onnx", "bert_base.onnx",
                                               "resnext50_32x4d.onnx", "inception_v3.onnx")]
_MODELS = flags.DEFINE_list("models", _DEFAULT_MODELS + ["nasrnn"],
                            "Zoo model names or ONNX paths.")
_SIZE = flags.DEFINE_enum("size", "default", list(opt.SIZES), "Zoo model size.")
_METHOD = flags.DEFINE_enum("method", "taso", ["taso", "beam", "greedy"], "Search method.")
_BUDGET = flags.DEFINE_integer("budget", 100, "taso: graphs expanded; beam/greedy: steps.")
_ALPHA = flags.DEFINE_float("alpha", 1.05, "taso: relaxation.")
_KERNELS = flags.DEFINE_bool("kernel_table", True, "Cost MatMuls and convolutions by their "
                              "measured time (the optimise job's default); false: the roofline.")
_FAST_COMPILE = flags.DEFINE_enum("fast_compile", "auto", ["auto", "true", "false"],
                                  "Compile the search's functions for a fast compile (XLA:CPU's "
                                  "classic emitters) or the fastest code; auto: fast compile "
                                  f"for searches of at most {FAST_COMPILE_MAX_EXPANSIONS} "
                                  "expansions (as the optimise job does).")
_CACHE = flags.DEFINE_string("compilation_cache", "", "JAX's persistent compilation cache "
                             "(default: the per-user directory); 'off' to compile afresh.")


def main(argv: list[str]) -> None:
  del argv
  cache = compilation_cache.enable(_CACHE.value or None)
  dev = jax.devices()[0]
  print(f"{_METHOD.value} search, budget {_BUDGET.value}" +
        (f", alpha {_ALPHA.value}" if _METHOD.value == "taso" else "") +
        f"; {dev.platform} ({dev.device_kind}), {platform.machine()}, jax {jax.__version__}; "
        f"compilation cache {cache or 'off'}; cost model "
        f"{'measured kernel table' if _KERNELS.value else 'roofline'}", flush=True)
  kernels = kernel_table.shared() if _KERNELS.value else None
  options = {"taso": {"budget": _BUDGET.value, "alpha": _ALPHA.value},
             "beam": {"steps": _BUDGET.value}, "greedy": {"max_steps": _BUDGET.value}}
  rows = []
  for model in _MODELS.value:
    loaded = opt.load_source(model, size=_SIZE.value, random_weights=True)
    rows.append(bench.time_search(loaded.label, loaded.graph, loaded.params,
                                  method=_METHOD.value, kernels=kernels,
                                  fast_compile={"auto": None, "true": True,
                                                "false": False}[_FAST_COMPILE.value],
                                  **options[_METHOD.value]))
    r = rows[-1]
    print(f"{r.label}: {r.expansions} expansions, warm {r.warm_expansions_per_s:.1f}/s, cold "
          f"{r.cold_seconds:.1f} s (compile {r.compile_seconds:.1f} s)", flush=True)
  print()
  print(bench.markdown(rows))


if __name__ == "__main__":
  app.run(main)
