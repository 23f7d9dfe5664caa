"""Many graphs against one reference (cost validation, rewrite gains, calibration pairs):
batched side-by-side runs and rank statistics."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import numpy as np
import scipy.stats

from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.measure import latency
from xrlflow_jax.measure.comparison import repeats_for



def spearman(x: Sequence[float], y: Sequence[float]) -> float:
  """Spearman's rank correlation (scipy's, average ranks for ties); nan if either side is
  constant or there are fewer than 3 points."""
  if len(x) != len(y):
    raise ValueError(f"spearman: {len(x)} values against {len(y)}")
  if len(x) < 3 or np.ptp(np.asarray(x, np.float64)) == 0 or np.ptp(np.asarray(y, np.float64)) == 0:
    return float("nan")
  return float(scipy.stats.spearmanr(x, y).statistic)


@dataclasses.dataclass(frozen=True)
class SideBySide:
  """Latencies of graphs measured in batches that each include the reference graph.

  Attributes:
    stats: LatencyStats per graph (in the order given).
    ratio: float64[n]: each graph's median over the reference's median in the same batch.
    reference_ms: median of the reference over all batches.
  """
  stats: list[latency.LatencyStats]
  ratio: np.ndarray
  reference_ms: float

  @property
  def latency_ms(self) -> np.ndarray:
    """float64[n]: ratio x reference median (drift between batches removed)."""
    return self.ratio * self.reference_ms


def measure_side_by_side(reference: layout.Graph, graphs: Sequence[layout.Graph],
                         params: ParamStore, *, rounds: int = 10, repeats_per_round: int = 3,
                         warmup: int = 2, min_round_ms: float = 30.0, batch_size: int = 16,
                         max_batch_mb: float = 2000.0, backend: str | None = None, seed: int = 0,
                         log: Callable[[str], None] | None = None,
                         precision: str | None = None) -> SideBySide:
  """Measures `graphs` against `reference`, interleaved, in batches bounded in count and memory.

  Every batch compiles two copies of the reference and up to `batch_size` graphs (fewer when
  their weights would exceed `max_batch_mb`), measures them in `rounds` interleaved rounds, and
  frees them. Ratios are to the geometric mean of the two reference copies of the same batch.
  Each graph runs at least `repeats_per_round` times per round, more for fast graphs so that a
  round of one graph lasts about `min_round_ms` (the reference's latency sets the count).
  """
  device = latency.resolve_device(backend)
  first = latency.compile_graph(reference, params, device=device, seed=seed,
                                precision=precision, what="the reference graph")
  repeats_per_round = repeats_for(first, repeats_per_round, min_round_ms, warmup)
  per_graph_mb = max(first.nbytes / 1e6, 1e-3)
  size = int(max(1, min(batch_size, max_batch_mb // per_graph_mb - 2)))
  del first
  stats: list[latency.LatencyStats | None] = [None] * len(graphs)
  ratio = np.zeros(len(graphs))
  ref_medians = []
  for start in range(0, len(graphs), size):
    chunk = list(range(start, min(start + size, len(graphs))))
    t0 = time.perf_counter()
    # Two copies of the reference, compiled afresh in every batch at a third and two thirds of
    # the compile order: identical executables differ by a few percent on a busy machine
    # (seen as a bias of the first-compiled copy), so the denominator is their geometric mean.
    order: list[int | None] = list(chunk)
    order.insert(2 * len(chunk) // 3, None)
    order.insert(len(chunk) // 3, None)
    built = [latency.compile_graph(reference if i is None else graphs[i], params,
                                   device=device, seed=seed, precision=precision,
                                   what="the reference" if i is None else f"variant {i}")
             for i in order]
    refs = [c for c, i in zip(built, order) if i is None]
    compiled = refs + [c for c, i in zip(built, order) if i is not None]
    t1 = time.perf_counter()
    res = latency.measure_interleaved(compiled, rounds=rounds, repeats_per_round=repeats_per_round,
                                      warmup=warmup, seed=seed + start)
    ref_ms = float(np.sqrt(res[0].median_ms * res[1].median_ms))
    ref_medians.append(ref_ms)
    for i, r in zip(chunk, res[2:]):
      stats[i] = r
      ratio[i] = r.median_ms / ref_ms
    del compiled, built, refs
    if log:
      log(f"  batch {start // size + 1}: {len(chunk)} graphs, compile {t1 - t0:.1f}s, measure "
          f"{time.perf_counter() - t1:.1f}s ({repeats_per_round} runs x {rounds} rounds each), "
          f"reference {ref_ms:.3f} ms (copies differ by "
          f"{100 * abs(res[0].median_ms / res[1].median_ms - 1):.1f}%)")
  ref_ms = float(np.median(ref_medians)) if ref_medians else float("nan")
  return SideBySide([s for s in stats if s is not None], ratio, ref_ms)


@dataclasses.dataclass(frozen=True)
class Passes:
  """Side-by-side measurements repeated in independent passes (see `measure_passes`).

  Attributes:
    ratio: float64[P, n]: each graph's median over the reference's, per pass.
    stats: P lists of n LatencyStats, in the graphs' order.
    reference_ms: geometric mean over the passes of the reference's median.
  """
  ratio: np.ndarray
  stats: list[list[latency.LatencyStats]]
  reference_ms: float

  @property
  def mean_ratio(self) -> np.ndarray:
    """float64[n]: the geometric mean of the passes' ratios."""
    return np.exp(np.log(self.ratio).mean(axis=0))


def measure_passes(reference: layout.Graph, graphs: Sequence[layout.Graph], params: ParamStore,
                   *, passes: int = 2, seed: int = 0, **side_by_side: Any) -> Passes:
  """`measure_side_by_side` repeated `passes` times, each compiling every graph afresh in
  another order (so other batch neighbours and another compile order): separately compiled
  copies of one graph differ by a few percent on a small CPU, which one pass cannot show.

  Args:
    side_by_side: rounds, repeats_per_round, min_round_ms, backend, log, ... (passed on).
  """
  n = len(graphs)
  ratios, stats, refs = [], [], []
  for p in range(max(1, passes)):
    order = np.random.default_rng(seed + 1000 * p).permutation(n) if p else np.arange(n)
    log = side_by_side.get("log")
    if log and passes > 1:
      log(f"  pass {p + 1}/{passes}")
    m = measure_side_by_side(reference, [graphs[i] for i in order], params, seed=seed + p,
                             **side_by_side)
    r = np.empty(n)
    r[order] = m.ratio
    st: list[Any] = [None] * n
    for i, s in zip(order, m.stats):
      st[int(i)] = s
    ratios.append(r)
    stats.append(st)
    refs.append(m.reference_ms)
  return Passes(np.stack(ratios), stats, float(np.exp(np.mean(np.log(refs)))))
