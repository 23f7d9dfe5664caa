r"""Command line of the cost package.

    python -m xrlflow_jax.cost profile --model=bert [--size=tiny] [--cache_dir=DIR]
    python -m xrlflow_jax.cost profile --model=../shared/models/squeezenet1_1.onnx
    python -m xrlflow_jax.cost fit --models=all --sizes=tiny,default --out=cost_cpu.json
    python -m xrlflow_jax.cost calibrate [--quick] [--out=FILE]
    python -m xrlflow_jax.cost cost --model=resnet18 --size=tiny [--measure]
    python -m xrlflow_jax.cost kernels --model=bert [--limit=20]

`profile` prints a per-op table (measuring only signatures not yet in the cache); `fit` profiles
the given models (and random rewritten variants of them, so merged and enlarged ops are covered)
and fits the cost model's coefficients for this device; `calibrate` does the same on a fixed
suite of zoo models and writes this machine's calibration for the device kind (what the
optimise job, the search API and training do on first use on a device kind the package has no
fit for); `cost` prints the modelled cost of a model (and, with --measure, its measured
latency); `kernels` prints where the whole compiled model spends its time, XLA's kernels by
kind (dot, convolution, reduction, data movement, elementwise), and the share outside dots and
convolutions: the most a rewrite can save without making a dot or convolution faster
(`fusion_profile`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

import jax
import numpy as np

from xrlflow_jax import models, workflow
from xrlflow_jax.cost import calibrate as calibrate_lib
from xrlflow_jax.cost import coefficient_files
from xrlflow_jax.cost import fit as fit_lib
from xrlflow_jax.cost import fusion_profile
from xrlflow_jax.measure import latency
from xrlflow_jax.cost import model as cost_model
from xrlflow_jax.cost import profiler as profiler_lib
from xrlflow_jax.rules.walk import RewriteWalker
from xrlflow_jax.errors import XrlflowError
from xrlflow_jax.graph import host


def _coeffs_or_none(device_kind: str, path: str | None) -> cost_model.CostCoefficients | None:
  try:
    return coefficient_files.load_coefficients(device_kind, path)
  except cost_model.CostModelError as e:
    print(f"(no model column: {e})", file=sys.stderr)
    return None


def cmd_profile(args: argparse.Namespace) -> int:
  loaded = workflow.load(args.model, size=args.size, random_weights=True)
  graph, name = loaded.graph, loaded.name
  prof = profiler_lib.Profiler(args.cache_dir, args.backend, repeats=args.repeats,
                               min_time_s=args.min_time_s)
  result = prof.profile_graph(graph, progress=args.verbose)
  print(f"# {name}: per-op profile (cache {prof.cache.path})")
  coeffs = _coeffs_or_none(prof.device.device_kind, args.coeffs)
  print(result.table(coeffs, limit=args.limit))
  return 0


def _model_list(spec: str) -> list[str]:
  return models.list_models() if spec == "all" else [m for m in spec.split(",") if m]


def cmd_fit(args: argparse.Namespace) -> int:
  prof = profiler_lib.Profiler(args.cache_dir, args.backend, repeats=args.repeats,
                               min_time_s=args.min_time_s)
  walker = None
  rng = np.random.default_rng(args.seed)
  samples, variants = [], []
  for size in args.sizes.split(","):
    for name in _model_list(args.models):
      loaded = workflow.load(name, size=size, random_weights=True)
      graph, params, label = loaded.graph, loaded.params, loaded.name
      samples.append(fit_lib.GraphSample(label, graph, params))
      vs, seen = [], {host.structural_hash(graph)}
      if args.variants:
        walker = walker or RewriteWalker()
        for _ in range(4 * args.variants):
          if len(vs) == args.variants:
            break
          g2, _ = walker.walk(graph, int(rng.integers(1, args.max_steps + 1)), rng)
          fp = host.structural_hash(g2)
          if fp not in seen:
            seen.add(fp)
            vs.append(g2)
      variants.append(vs)
  coeffs, report, details = fit_lib.fit_on_graphs(
      prof, samples, variants=variants, end_to_end=args.end_to_end,
      graph_weight=args.graph_weight, pair_weight=args.pair_weight,
      epilogue_fusion=args.epilogue_fusion, progress=args.verbose,
      log=lambda m: print(m, flush=True))
  print(f"fit on {report.rows} rows: median relative error {report.median_rel_err:.3f}, "
        f"90th percentile {report.p90_rel_err:.3f}; call {float(coeffs.call_ms):.4f} ms; "
        f"tied {list(report.tied)}")
  print({k: v for k, v in details.items() if k.startswith(("graph_model", "pair_sp"))})
  for n, v in coeffs.named().items():
    print(f"  {n:<22}{v:.6g}")
  out = args.out or coefficient_files.coefficients_path(prof.device.device_kind)
  path = coefficient_files.save_coefficients(
      coeffs, out, jax_version=jax.__version__, backend=prof.device.platform,
      fit={**report.to_json(), **details, "models": args.models, "sizes": args.sizes,
           "variants_per_model": args.variants, "seed": args.seed})
  print(f"wrote {path}")
  return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
  cal = calibrate_lib.calibrate(quick=args.quick, out=args.out, backend=args.backend,
                                profile_cache=args.cache_dir, repeats=args.repeats,
                                log=lambda m: print(m, flush=True))
  for n, v in cal.coeffs.named().items():
    print(f"  {n:<22}{v:.6g}")
  return 0


def cmd_cost(args: argparse.Namespace) -> int:
  loaded = workflow.load(args.model, size=args.size, random_weights=True)
  graph, params, name = loaded.graph, loaded.params, loaded.name
  device = latency.resolve_device(args.backend)
  coeffs = coefficient_files.load_coefficients(device.device_kind, args.coeffs)
  per_node = np.asarray(jax.jit(cost_model.node_costs)(graph, coeffs))
  total = float(jax.jit(cost_model.graph_cost)(graph, coeffs))
  print(f"{name}: modelled {total:.4f} ms ({int((per_node > 0).sum())} costed nodes, call "
        f"{float(coeffs.call_ms):.4f} ms)")
  if args.measure:
    stats = latency.measure_latency(graph, params, repeats=args.repeats, backend=args.backend)
    print(f"{name}: measured median {stats.median_ms:.4f} ms (IQR {stats.iqr_ms:.4f}, "
          f"{stats.runs} runs, {stats.backend})")
  return 0


def cmd_kernels(args: argparse.Namespace) -> int:
  loaded = workflow.load(args.model, size=args.size, random_weights=True)
  graph, params, name = loaded.graph, loaded.params, loaded.name
  prof = fusion_profile.profile(graph, params, runs=args.runs, backend=args.backend)
  print(f"# {name}: XLA kernels of the compiled graph, mean of {prof.runs} traced runs "
        f"({prof.platform})")
  print(prof.table(limit=args.limit))
  return 0


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m xrlflow_jax.cost", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = p.add_subparsers(dest="command", required=True)

  def common(q: argparse.ArgumentParser) -> None:
    q.add_argument("--backend", default=None, help="JAX platform (cpu, gpu); default: JAX's")
    q.add_argument("--cache_dir", default=None,
                   help=f"profile cache (default ${profiler_lib.CACHE_ENV} or "
                        f"{profiler_lib.DEFAULT_CACHE_DIR})")
    q.add_argument("--repeats", type=int, default=30, help="timed runs per signature")
    q.add_argument("--min_time_s", type=float, default=0.05, help="least timing per signature")
    q.add_argument("--coeffs", default=None, help="coefficients JSON (default: shipped)")
    q.add_argument("--verbose", action="store_true")

  q = sub.add_parser("profile", help="per-op profile of a model")
  q.add_argument("--model", required=True, help="zoo name or ONNX path")
  q.add_argument("--size", default="default", choices=models.SIZES)
  q.add_argument("--limit", type=int, default=None, help="rows shown (slowest first)")
  common(q)
  q.set_defaults(fn=cmd_profile)

  q = sub.add_parser("fit", help="fit the cost model's coefficients on this device")
  q.add_argument("--models", default="all", help="comma-separated zoo names, or 'all'")
  q.add_argument("--sizes", default="tiny,default")
  q.add_argument("--variants", type=int, default=6,
                 help="random rewritten variants per model, measured side by side with it")
  q.add_argument("--max_steps", type=int, default=8)
  q.add_argument("--seed", type=int, default=1234)
  q.add_argument("--end_to_end", action=argparse.BooleanOptionalAction, default=True,
                 help="also measure each graph whole and fit to it (calibrates overheads)")
  q.add_argument("--graph_weight", type=float, default=10.0,
                 help="weight of one whole-graph row relative to one op row")
  q.add_argument("--pair_weight", type=float, default=10.0,
                 help="weight of one side-by-side ratio row relative to one op row")
  q.add_argument("--epilogue_fusion", action="store_true",
                 help="the backend fuses bias/activation into MatMul/Conv2D (GPU)")
  q.add_argument("--out", default=None, help="output JSON (default: the package's data file)")
  common(q)
  q.set_defaults(fn=cmd_fit)

  q = sub.add_parser("calibrate", help="calibrate this device on a fixed suite of zoo models "
                     "(what the optimise job and training do on first use)")
  q.add_argument("--quick", action="store_true",
                 help="the quick suite (four tiny models; a rougher fit)")
  q.add_argument("--out", default=None, help="output JSON (default: this machine's calibration "
                                             "file for the device kind)")
  common(q)
  q.set_defaults(fn=cmd_calibrate)

  q = sub.add_parser("cost", help="modelled (and measured) latency of a model")
  q.add_argument("--model", required=True)
  q.add_argument("--size", default="default", choices=models.SIZES)
  q.add_argument("--measure", action="store_true")
  common(q)
  q.set_defaults(fn=cmd_cost)

  q = sub.add_parser("kernels", help="where the whole compiled model spends its time")
  q.add_argument("--model", required=True, help="zoo name or ONNX path")
  q.add_argument("--size", default="default", choices=models.SIZES)
  q.add_argument("--runs", type=int, default=10, help="traced runs (and untraced ones)")
  q.add_argument("--limit", type=int, default=20, help="kernels listed (slowest first)")
  q.add_argument("--backend", default=None, help="JAX platform (cpu, gpu); default: JAX's")
  q.set_defaults(fn=cmd_kernels)
  return p


def main(argv: Sequence[str] | None = None) -> int:
  args = build_parser().parse_args(argv)
  try:
    return args.fn(args)
  except XrlflowError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
