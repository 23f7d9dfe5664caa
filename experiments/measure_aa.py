r"""A/A test of the speedup verdict: how often does `measure.compare` call a graph faster or
slower than an identical one?

    python -m experiments.measure_aa --models=squeezenet1_1,resnet18 --runs=50

For each model, --runs times: compile the graph three times (reference, control copy, and the
"candidate", a third identical copy: `compare(..., time_unchanged=True)`), time them in
--rounds interleaved rounds of --repeats_per_round runs, and record the verdict. Every verdict
other than "no change" is a false positive; the count of lower candidate medians (what a bare
comparison of medians would call faster) is printed beside it. With --neutral, a second series
uses as candidate the graph after one rewrite that does not change the work (add_commute:
a + b -> b + a), the case the measured guard meets most. Prints the false-positive rate per
model with a 95% Wilson interval and writes --output (JSON).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
from absl import app, flags

from xrlflow_jax.cli import flags as cli_flags
from xrlflow_jax.harness import machine
from xrlflow_jax import cost, measure, search, workflow

_MODELS = flags.DEFINE_list("models", ["squeezenet1_1", "resnet18"], "Zoo models or .onnx files.")
_SIZE = flags.DEFINE_enum("size", "tiny", ["tiny", "default"], "Zoo model size.")
_RUNS = flags.DEFINE_integer("runs", 50, "A/A comparisons per model (and per series).")
_TIMING = cli_flags.define_timing_flags(looks_default=1,
                                        looks_note="the optimise job's guard uses 2")
_SEED = flags.DEFINE_integer("seed", 0, "Comparison i uses seed --seed + i (round orders, random "
                             "inputs, bootstrap): a second run with another --seed adds "
                             "independent comparisons.")
_LEVEL = flags.DEFINE_float(
    "level", 0.95, "Interval level of the verdict over all looks (0.95: `measure.compare`'s "
    "default; the optimise job's guard, choosing among the path and its 2 checkpoint "
    "prefixes, uses 1 - 0.05 / 3 = 0.98333).")
_NEUTRAL = flags.DEFINE_bool("neutral", True, "Also time a neutral rewrite (add_commute).")
_OUTPUT = flags.DEFINE_string("output", "/tmp/xrlflow_measure_aa.json", "JSON results.")


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
  """95% Wilson score interval of a rate k / n."""
  if n == 0:
    return 0.0, 1.0
  p = k / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return max(0.0, centre - half), min(1.0, centre + half)


def neutral_rewrite(graph, coeffs):
  """The graph after one add_commute (a + b -> b + a), or None when it has no Add."""
  expander = search.get_expander(workflow.ruleset(["add_commute"]), coeffs)
  mask, nodes = expander.match(graph)
  hits = np.argwhere(mask)
  if not hits.size:
    return None
  r, loc = hits[0]
  return expander.apply_at(graph, int(r), nodes[r, loc])[0]


def series(graph, candidate, params, label: str) -> dict:
  verdicts, ratios, lower = [], [], 0
  t0 = time.perf_counter()
  for i in range(_RUNS.value):
    cmp = measure.compare(graph, [candidate], params, **_TIMING.options(),
                          seed=_SEED.value + i, time_unchanged=True, level=_LEVEL.value)
    verdicts.append(cmp.speedups[0].verdict)
    ratios.append(cmp.speedups[0].ratio)
    lower += cmp.candidates[0].median_ms < cmp.reference.median_ms  # a bare median comparison
  wrong = sum(v != "no change" for v in verdicts)
  lo, hi = wilson(wrong, len(verdicts))
  r = np.asarray(ratios)
  print(f"{label}: {wrong}/{len(verdicts)} false positives ({100 * wrong / len(verdicts):.1f}%, "
        f"95% CI {100 * lo:.1f}-{100 * hi:.1f}%); ratio median {np.median(r):.4f}, range "
        f"{r.min():.4f}-{r.max():.4f}; a lower median (the rule before the verdict) in "
        f"{lower}/{len(verdicts)}; {time.perf_counter() - t0:.0f}s", flush=True)
  return {"series": label, "runs": len(verdicts), "false_positives": wrong,
          "rate": wrong / len(verdicts), "rate_ci95": [lo, hi],
          "verdicts": {v: verdicts.count(v) for v in set(verdicts)},
          "ratio_median": float(np.median(r)), "ratio_min": float(r.min()),
          "ratio_max": float(r.max()), "lower_median": lower}


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  timing = _TIMING.options()
  try:
    measure.check_settings(**timing)
  except measure.MeasurementError as e:
    raise app.UsageError(str(e)) from None
  if not 0.5 < _LEVEL.value < 1:
    raise app.UsageError(f"--level must lie in (0.5, 1), got {_LEVEL.value}")
  print(machine.machine_header(), flush=True)
  print(f"- verdict: {measure.look_level(_LEVEL.value, timing['looks']):.2%} bootstrap interval "
        f"over {timing['rounds']} rounds (up to {timing['looks']} sets of them) x "
        f"{timing['repeats_per_round']} runs (or more, a round lasting >= "
        f"{timing['min_round_ms']:g} ms), an identical copy as control", flush=True)
  coeffs = cost.coefficients()
  results = []
  for name in _MODELS.value:
    spec = workflow.resolve(name, _SIZE.value)
    loaded = workflow.load(spec, random_weights=True)
    graph, params = loaded.graph, loaded.params
    results.append({"model": spec.label, **series(graph, graph, params,
                                                  f"{spec.label} identical copy")})
    if _NEUTRAL.value:
      other = neutral_rewrite(graph, coeffs)
      if other is not None:
        results.append({"model": spec.label, **series(graph, other, params,
                                                      f"{spec.label} add_commute")})
  total = sum(r["false_positives"] for r in results)
  n = sum(r["runs"] for r in results)
  lo, hi = wilson(total, n)
  print(f"all: {total}/{n} false positives ({100 * total / max(n, 1):.1f}%, 95% CI "
        f"{100 * lo:.1f}-{100 * hi:.1f}%)")
  Path(_OUTPUT.value).write_text(json.dumps({"machine": machine.machine_info(), **timing,
                                             "level": _LEVEL.value, "series": results,
                                             "false_positives": total, "runs": n},
                                            indent=2) + "\n")
  print(f"wrote {_OUTPUT.value}")


if __name__ == "__main__":
  app.run(main)
