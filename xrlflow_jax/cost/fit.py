"""Fitting the cost model's coefficients: non-negative least squares on measured latencies.

The cost is linear in the coefficients (`graph_cost = call_ms + w . features`), so a fit is one
NNLS problem over rows of (features, measured ms). Rows are single-op profiles (the profiler's
measurements of each op alone) and, optionally, whole graphs measured end to end. Rows are
weighted by 1 / measured time so that the fit minimises relative error: a 10 us op and a 10 ms
op count alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np
import scipy.optimize

from xrlflow_jax import measure
from xrlflow_jax.measure import latency
from xrlflow_jax.cost import model as cost_model
from xrlflow_jax.cost import profiler as profiler_lib
from xrlflow_jax.cost import signatures
from xrlflow_jax.cost.model import CostCoefficients, CostModelError
from xrlflow_jax.graph import ParamStore, host, layout


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """argmin_x ||a x - b||_2 subject to x >= 0 (scipy's Lawson-Hanson active set).

  Args:
    a: float[M, F]; b: float[M].
  Returns:
    float64[F], the non-negative solution.
  """
  a = np.asarray(a, np.float64)
  b = np.asarray(b, np.float64)
  if a.ndim != 2 or b.shape != (a.shape[0],):
    raise CostModelError(f"nnls: a is {a.shape} but b is {b.shape}")
  return scipy.optimize.nnls(a, b)[0]


@dataclasses.dataclass(frozen=True)
class FitReport:
  """How well a fit reproduces the rows it was fitted on.

  Attributes:
    rows: number of rows; median_rel_err / p90_rel_err: of |model - measured| / measured.
    active: names of the features with a non-zero weight.
    tied: features no row exercised, given their parent's weight (FEATURE_PARENT).
  """
  rows: int
  median_rel_err: float
  p90_rel_err: float
  active: tuple[str, ...]
  tied: tuple[str, ...] = ()

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


# A feature no fitted row exercises takes its parent's weight (e.g. with no whole-graph data the
# GFLOPs of sibling MatMuls cost what lone ones do) instead of the ridge's zero.
FEATURE_PARENT = {"matmul.gflop_sibling": "matmul.gflop", "conv.gflop_sibling": "conv.gflop"}


@dataclasses.dataclass(frozen=True)
class Pairs:
  """Side-by-side measurements: variant latency / base latency, measured interleaved.

  Attributes:
    base: float[P, F] features of each base graph; variant: float[P, F] of each variant.
    ratio: float[P] measured variant / base; base_ms: float[P] the base's measured latency.
    base_calls: float[P] executable calls the base takes (1 for a graph; k for k ops run one
      at a time, as when a sibling group is compared with its members alone); default ones.
  """
  base: np.ndarray
  variant: np.ndarray
  ratio: np.ndarray
  base_ms: np.ndarray
  base_calls: np.ndarray | None = None

  @staticmethod
  def concat(*parts: "Pairs | None") -> "Pairs | None":
    parts = [p for p in parts if p is not None and len(p.ratio)]
    if not parts:
      return None
    calls = [p.base_calls if p.base_calls is not None else np.ones(len(p.ratio)) for p in parts]
    return Pairs(*(np.concatenate([getattr(p, f) for p in parts])
                   for f in ("base", "variant", "ratio", "base_ms")),
                 np.concatenate(calls))


def fit_coefficients(features: np.ndarray, times_ms: np.ndarray, *, device_kind: str,
                     epilogue_fusion: bool = False, row_weights: np.ndarray | None = None,
                     pairs: Pairs | None = None, pair_weight: float = 1.0,
                     ridge: float = 1e-6) -> tuple[CostCoefficients, FitReport]:
  """Fits non-negative coefficients to measured latencies.

  Args:
    features: float[M, F]: the features of each measured row (single-op graphs or whole graphs;
      see `model.graph_features`). Every row also pays one `call_ms`.
    times_ms: float[M]: the measured medians.
    device_kind: recorded in the result.
    epilogue_fusion: the fusion model the features were computed with.
    row_weights: float[M] multipliers of each row's relative-error weight (default ones).
    pairs: side-by-side ratios; each gives the homogeneous row
      (cost(variant) - ratio * cost(base)) / base_ms = 0, which pins down how costs *change*
      under rewrites (including what only whole graphs show, such as concurrent siblings).
    pair_weight: weight of each pair row relative to one op row.
    ridge: a small pull of every coefficient towards zero, relative to the problem's scale,
      so features that never occur stay at zero (or take their parent's weight, see
      FEATURE_PARENT).
  Returns:
    (coefficients, report).
  """
  x = np.asarray(features, np.float64)
  y = np.asarray(times_ms, np.float64)
  f = cost_model.NUM_FEATURES
  if x.ndim != 2 or x.shape[1] != f or y.shape != (x.shape[0],):
    raise CostModelError(f"fit_coefficients: features must be [M, {f}] and times [M]; got "
                         f"{x.shape} and {y.shape}")
  if x.shape[0] == 0:
    raise CostModelError("fit_coefficients: no measurements to fit")
  if not (y > 0).all() or not np.isfinite(x).all():
    raise CostModelError("fit_coefficients: measured times must be > 0 and features finite")
  design = np.concatenate([np.ones([x.shape[0], 1]), x], axis=1)  # column 0: call_ms
  w = 1.0 / y
  if row_weights is not None:
    w = w * np.asarray(row_weights, np.float64)
  a = design * w[:, None]
  b = y * w
  if pairs is not None and len(pairs.ratio):
    r = np.asarray(pairs.ratio, np.float64)[:, None]
    calls = (np.ones_like(r) if pairs.base_calls is None
             else np.asarray(pairs.base_calls, np.float64)[:, None])
    rows = np.concatenate([1.0 - r * calls,
                           np.asarray(pairs.variant) - r * np.asarray(pairs.base)],
                          axis=1) / np.asarray(pairs.base_ms, np.float64)[:, None]
    a = np.concatenate([a, pair_weight * rows])
    b = np.concatenate([b, np.zeros(len(r))])
  used = np.abs(a).max(axis=0) > 0
  # Column scaling makes the problem well conditioned (features span many orders).
  col = np.where(used, np.abs(a).max(axis=0), 1.0)
  a_s = a / col
  if ridge > 0:
    n_cols = a_s.shape[1]
    a_s = np.concatenate([a_s, np.sqrt(ridge * a.shape[0]) * np.eye(n_cols)])
    b = np.concatenate([b, np.zeros(n_cols)])
  sol = nnls(a_s, b) / col
  names = ("call",) + cost_model.FEATURE_NAMES
  tied = []
  for child, parent in FEATURE_PARENT.items():
    i, j = names.index(child), names.index(parent)
    if not used[i]:
      sol[i] = sol[j]
      tied.append(child)
  coeffs = CostCoefficients(jax.numpy.asarray(sol[1:], jax.numpy.float32),
                            jax.numpy.asarray(sol[0], jax.numpy.float32), device_kind,
                            epilogue_fusion)
  pred = design @ sol
  rel = np.abs(pred - y) / y
  active = tuple(n for n, v in zip(cost_model.FEATURE_NAMES, sol[1:]) if v > 0)
  return coeffs, FitReport(int(y.size), float(np.median(rel)), float(np.percentile(rel, 90)),
                           active, tuple(tied))


def calibrate_feature(coeffs: CostCoefficients, name: str,
                      pairs: Pairs) -> tuple[CostCoefficients, dict[str, float]]:
  """Fits one coefficient to side-by-side ratios, every other coefficient held fixed.

  For a new feature that only whole graphs exercise (such as `const.mb`), without disturbing
  a fit already validated: each pair gives the residual
  (cost(variant) - ratio * cost(base)) / base_ms, linear in the one weight; the non-negative
  least-squares weight is closed-form.

  Args:
    coeffs: the fixed coefficients; name: the feature to fit (in FEATURE_NAMES).
    pairs: side-by-side measurements (features of base and variant, measured ratio, base ms).
  Returns:
    (coefficients with that weight replaced, {"weight", "rms_before", "rms_after", "pairs"}).
  """
  names = list(cost_model.FEATURE_NAMES)
  if name not in names:
    raise CostModelError(f"calibrate_feature: unknown feature {name!r}; features: {names}")
  j = names.index(name)
  w = np.asarray(coeffs.weights, np.float64).copy()
  w[j] = 0.0
  c = float(coeffs.call_ms)
  r = np.asarray(pairs.ratio, np.float64)
  scale = np.asarray(pairs.base_ms, np.float64)
  fixed = ((c + np.asarray(pairs.variant, np.float64) @ w)
           - r * (c + np.asarray(pairs.base, np.float64) @ w)) / scale
  slope = (np.asarray(pairs.variant, np.float64)[:, j]
           - r * np.asarray(pairs.base, np.float64)[:, j]) / scale
  denom = float(slope @ slope)
  x = max(0.0, -float(fixed @ slope) / denom) if denom > 0 else 0.0
  w[j] = x
  out = dataclasses.replace(coeffs, weights=jax.numpy.asarray(w, jax.numpy.float32))
  rms = lambda v: float(np.sqrt(np.mean(v * v))) if v.size else float("nan")
  return out, {"weight": x, "rms_before": rms(fixed + slope * float(coeffs.weights[j])),
               "rms_after": rms(fixed + slope * x), "pairs": int(r.size)}


def profile_rows(entries: dict[str, dict[str, Any]], *, epilogue_fusion: bool = False,
                 keys: Sequence[str] | None = None
                 ) -> tuple[np.ndarray, np.ndarray, list[signatures.OpSignature]]:
  """(features [S, F], median ms [S], signatures) of cached op and sibling-group profiles (the
  call entry and whole-graph and side-by-side entries are skipped)."""
  sigs, times = [], []
  for key in keys if keys is not None else sorted(entries):
    if (key == profiler_lib.CALL_KEY
        or key.startswith((GRAPH_PREFIX, PAIR_PREFIX, profiler_lib.LOOP_PREFIX))
        or key not in entries):
      continue
    sigs.append(signatures.signature_from_key(key))
    times.append(float(entries[key]["median_ms"]))
  feats = signatures.single_op_features(sigs, epilogue_fusion)
  return feats, np.asarray(times), sigs


def group_pairs(entries: dict[str, dict[str, Any]], *,
                epilogue_fusion: bool = False) -> Pairs | None:
  """Pair rows from sibling groups timed interleaved with their members alone (variant: the
  group in one executable; base: the members one call each)."""
  sigs, base_ms, ratio, calls = [], [], [], []
  for key, entry in sorted(entries.items()):
    if not key.startswith(signatures.GROUP_PREFIX) or "members_ms" not in entry:
      continue
    total = float(sum(entry["members_ms"]))
    sigs.append(signatures.signature_from_key(key))
    base_ms.append(total)
    ratio.append(float(entry["median_ms"]) / total)
    calls.append(len(entry["members_ms"]))
  if not sigs:
    return None
  variant = signatures.single_op_features(sigs, epilogue_fusion)
  base = np.stack([signatures.single_op_features(list(g.members), epilogue_fusion).sum(0)
                   for g in sigs])
  return Pairs(base, variant, np.asarray(ratio), np.asarray(base_ms), np.asarray(calls, float))


def fit_from_profiles(entries: dict[str, dict[str, Any]], *, device_kind: str,
                      epilogue_fusion: bool = False, call_ms: float | None = None,
                      graph_rows: tuple[np.ndarray, np.ndarray] | None = None,
                      graph_weight: float = 1.0, pairs: Pairs | None = None,
                      pair_weight: float = 1.0) -> tuple[CostCoefficients, FitReport]:
  """Fits coefficients to profiler measurements (a cache's entries), plus optional whole graphs.

  Args:
    entries: profile cache entries (`ProfileCache.entries`).
    call_ms: the measured cost of an empty call; when given, an extra row pins the intercept.
    graph_rows: optional (features [G, F], measured ms [G]) of whole graphs.
    graph_weight: weight of each graph row relative to a single-op row.
    pairs, pair_weight: side-by-side ratios (see `fit_coefficients`).
  """
  feats, times, _ = profile_rows(entries, epilogue_fusion=epilogue_fusion)
  pairs = Pairs.concat(pairs, group_pairs(entries, epilogue_fusion=epilogue_fusion))
  weights = np.ones(len(times))
  if call_ms is not None:
    feats = np.concatenate([feats, np.zeros([1, feats.shape[1]], np.float32)])
    times = np.concatenate([times, [call_ms]])
    weights = np.concatenate([weights, [float(len(weights)) ** 0.5]])
  if graph_rows is not None:
    gf, gt = graph_rows
    feats = np.concatenate([feats, np.asarray(gf, np.float32)])
    times = np.concatenate([times, np.asarray(gt, np.float64)])
    weights = np.concatenate([weights, np.full(len(gt), graph_weight)])
  return fit_coefficients(feats, times, device_kind=device_kind,
                          epilogue_fusion=epilogue_fusion, row_weights=weights, pairs=pairs,
                          pair_weight=pair_weight)


GRAPH_PREFIX = "graph|"  # profile-cache keys of whole graphs measured end to end


def measure_graph_cached(prof: profiler_lib.Profiler, graph: layout.Graph, params: ParamStore,
                         label: str, *, repeats: int = 5, min_time_s: float = 0.5) -> float:
  """Median end-to-end latency (ms) of a whole graph, cached in the profiler's cache under its
  structural hash (weights do not change latency)."""
  key = f"{GRAPH_PREFIX}{host.structural_hash(graph)}"
  entry = prof.cache.get(key)
  if entry is None:
    prof.measure_count += 1
    stats = latency.measure_latency(graph, params, repeats=repeats, min_time_s=min_time_s,
                                    backend=prof.device.platform)
    entry = {"median_ms": stats.median_ms, "q1_ms": stats.q1_ms, "q3_ms": stats.q3_ms,
             "runs": stats.runs, "compile_s": round(stats.compile_s, 4), "op": "graph",
             "describe": label}
    prof.cache.put(key, entry)
    prof.cache.save()
  return float(entry["median_ms"])


@dataclasses.dataclass(frozen=True)
class GraphSample:
  """A graph used for fitting: a label, the graph and its weights."""
  label: str
  graph: layout.Graph
  params: ParamStore


PAIR_PREFIX = "pair|"  # profile-cache keys of side-by-side ratios


def collect_pairs(prof: profiler_lib.Profiler, base: GraphSample,
                  variants: Sequence[layout.Graph], *, rounds: int = 10,
                  min_round_ms: float = 30.0, log: Any = None) -> list[tuple[float, float]]:
  """(ratio variant / base, base ms) of each variant, measured side by side with the base
  (interleaved) and cached under the two structural hashes."""
  h0 = host.structural_hash(base.graph)
  keys = [f"{PAIR_PREFIX}{h0}|{host.structural_hash(v)}" for v in variants]
  todo = [i for i, k in enumerate(keys) if prof.cache.get(k) is None]
  if todo:
    prof.measure_count += len(todo)
    res = measure.measure_side_by_side(base.graph, [variants[i] for i in todo], base.params,
                                        rounds=rounds, min_round_ms=min_round_ms,
                                        backend=prof.device.platform, log=log)
    for i, ratio in zip(todo, res.ratio):
      prof.cache.put(keys[i], {"ratio": float(ratio), "base_ms": res.reference_ms, "op": "pair",
                               "describe": f"{base.label} variant {i}"})
    prof.cache.save()
  return [(float(prof.cache.get(k)["ratio"]), float(prof.cache.get(k)["base_ms"]))
          for k in keys]


def fit_on_graphs(prof: profiler_lib.Profiler, samples: Sequence[GraphSample], *,
                  variants: Sequence[Sequence[layout.Graph]] = (), end_to_end: bool = True,
                  graph_weight: float = 10.0, pair_weight: float = 10.0,
                  epilogue_fusion: bool = False, sibling_groups: bool = True,
                  progress: bool = False,
                  log: Any = print) -> tuple[CostCoefficients, FitReport, dict[str, Any]]:
  """Profiles every op signature of `samples` (and their variants) and fits this device.

  Args:
    prof: the profiler (its cache also keeps whole-graph and side-by-side measurements, so a
      refit measures only what is new).
    samples: the models.
    variants: for each sample, rewritten variants of it (may be empty). Each is measured side
      by side with its sample and enters the fit as a ratio row (see `fit_coefficients`).
    end_to_end: also measure each sample whole and fit to it (weight `graph_weight` relative
      to one op row): ops timed alone overstate the per-kernel overhead that consecutive
      kernels of one executable share.
    sibling_groups: also profile groups of sibling MatMuls/Conv2Ds together (see
      `signatures.GroupSignature`): the rows the `*.gflop_sibling` coefficients come from.
  Returns:
    (coefficients, report, details) where details records the rows used.
  """
  variants = list(variants) or [[] for _ in samples]
  if len(variants) != len(samples):
    raise CostModelError(f"fit_on_graphs: {len(samples)} samples but {len(variants)} variant "
                         "lists")
  keys: dict[str, None] = {}
  for s, vs in zip(samples, variants):
    sigs: dict[Any, None] = {}
    for g in [s.graph, *vs]:
      sigs.update((sig, None) for sig, _ in signatures.graph_signatures(g))
      if sibling_groups:
        sigs.update((grp, None) for grp, _ in signatures.sibling_groups(g))
    before = prof.measure_count
    prof.profile_signatures(list(sigs), progress=progress)
    keys.update((sig.key, None) for sig in sigs)
    if log:
      log(f"{s.label}: {len(sigs)} signatures, {prof.measure_count - before} measured")
  call = prof.call_overhead()
  entries = {k: prof.cache.get(k) for k in keys}
  feats_fn = jax.jit(lambda g: cost_model.graph_features(g, epilogue_fusion))
  graph_rows = None
  if end_to_end:
    gf, gt = [], []
    for s in samples:
      gt.append(measure_graph_cached(prof, s.graph, s.params, s.label))
      gf.append(np.asarray(feats_fn(s.graph)))
      if log:
        log(f"{s.label}: end to end {gt[-1]:.4f} ms")
    graph_rows = (np.stack(gf), np.asarray(gt))
  pb, pv, pr, pm = [], [], [], []
  for s, vs in zip(samples, variants):
    if not vs:
      continue
    measured = collect_pairs(prof, s, vs, log=log)
    fb = np.asarray(feats_fn(s.graph))
    for g, (ratio, base_ms) in zip(vs, measured):
      pb.append(fb)
      pv.append(np.asarray(feats_fn(g)))
      pr.append(ratio)
      pm.append(base_ms)
    if log:
      log(f"{s.label}: {len(vs)} side-by-side ratios, "
          f"{min(r for r, _ in measured):.3f}..{max(r for r, _ in measured):.3f}")
  pairs = Pairs(np.asarray(pb), np.asarray(pv), np.asarray(pr), np.asarray(pm)) if pr else None
  coeffs, report = fit_from_profiles(entries, device_kind=prof.device.device_kind,
                                     epilogue_fusion=epilogue_fusion, call_ms=call,
                                     graph_rows=graph_rows, graph_weight=graph_weight,
                                     pairs=pairs, pair_weight=pair_weight)
  details: dict[str, Any] = {"op_rows": len(entries), "measured_call_ms": call,
                             "graph_rows": len(samples) if end_to_end else 0,
                             "graph_weight": graph_weight, "pair_rows": len(pr),
                             "pair_weight": pair_weight}
  w = np.asarray(coeffs.weights, np.float64)
  if graph_rows is not None:
    rel = (float(coeffs.call_ms) + graph_rows[0] @ w) / graph_rows[1]
    details["graph_model_over_measured"] = {
        "median": float(np.median(rel)), "p10": float(np.percentile(rel, 10)),
        "p90": float(np.percentile(rel, 90))}
  if pairs is not None:
    c = float(coeffs.call_ms)
    model_ratio = (c + pairs.variant @ w) / (c + pairs.base @ w)
    details["pair_spearman"] = float(measure.spearman(model_ratio, pairs.ratio))
  return coeffs, report, details



