"""Does the cost model rank graphs the way XLA's measured latency does?

For a model: random variants from random valid rewrite sequences, and one-step neighbours of the
original; each compiled and measured end to end, side by side with the original (interleaved
rounds, so load drift hits every graph alike), and costed by the model. Reports the Spearman rank
correlation of modelled cost against measured latency, how often the model gets the sign of the
latency change between the original and a one-step neighbour right, and the measurement noise:
a second, separately compiled copy of the original is measured as a control, and the whole set
is measured in two independent passes (each compiling every graph afresh), whose agreement with
each other bounds what any cost model can reach against these measurements.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Collection, Sequence

import jax
import numpy as np

from xrlflow_jax.cost import model as cost_model
from xrlflow_jax.cost.kernel_table import KernelTimes
from xrlflow_jax.graph import host
from xrlflow_jax.rules.walk import RewriteWalker, Step
from xrlflow_jax.measure import measure_passes, spearman
from xrlflow_jax.graph import ParamStore, layout


# ----------------------------------------------------------------------------------------------
# Validation of one model
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Item:
  """One measured graph: its role, the rewrites that made it, measured ratio and modelled cost.

  kind: "control" (a second copy of the original), "walk" (random rewrite sequence) or
  "neighbour" (one rewrite of the original). cost_ms: the roofline model's cost;
  kernel_cost_ms: the model's with the measured kernel table (nan when not asked for).
  """
  kind: str
  steps: tuple[Step, ...]
  ratio: float
  latency_ms: float
  iqr_ms: float
  cost_ms: float
  kernel_cost_ms: float = float("nan")


@dataclasses.dataclass(frozen=True)
class Agreement:
  """How modelled costs agree with measured ratios (see `agreement`).

  Attributes:
    spearman_all: rank correlation of modelled cost against measured latency over the original
      and all distinct variants.
    spearman_walks: the same over the original and the random-walk variants only.
    retest_spearman: rank correlation of the two independent measurement passes against each
      other (nan with one pass): how reproducible the measured ranking itself is.
    ceiling: the Spearman-Brown reliability of the two passes averaged, 2r / (1 + r): roughly
      the highest rank correlation any cost model can reach against these measurements.
    retest_dev: median |ratio_A / ratio_B - 1| between the passes (typical measurement noise).
    sign_pairs / sign_correct: one-step neighbours whose measured change exceeds the noise
      threshold, and how many of those the model gives the right sign (a predicted change
      within `model_tie_tol` counts as no prediction, i.e. wrong).
    tie_pairs / tie_quiet: neighbours the model says change nothing (within `model_tie_tol`),
      and how many of those measure within the noise threshold.
    noise_threshold: relative change below which a measured difference counts as noise.
    control_dev: |1 - ratio| of the control copy of the original.
  """
  spearman_all: float
  spearman_walks: float
  retest_spearman: float
  ceiling: float
  retest_dev: float
  sign_pairs: int
  sign_correct: int
  tie_pairs: int
  tie_quiet: int
  noise_threshold: float
  control_dev: float

  @property
  def sign_accuracy(self) -> float:
    return self.sign_correct / self.sign_pairs if self.sign_pairs else float("nan")


@dataclasses.dataclass(frozen=True)
class ModelValidation(Agreement):
  """The validation of one model (see `validate_model`): its `Agreement` statistics, plus

  Attributes:
    model: its name; nodes: alive nodes of the original.
    original_ms / original_cost_ms: measured and modelled latency of the original;
      original_kernel_cost_ms: modelled with the kernel table (nan when not asked for).
    items: every measured graph but the original.
    seconds: wall time of the whole validation.
    with_kernels: the same `Agreement` for the model with the measured kernel table (None
      when not asked for); items carry both costs (`cost_ms`, `kernel_cost_ms`).
  """
  model: str
  nodes: int
  original_ms: float
  original_cost_ms: float
  items: list[Item]
  seconds: float
  with_kernels: Agreement | None = None
  original_kernel_cost_ms: float = float("nan")

  @property
  def latency_spread(self) -> float:
    """max/min measured latency over the original and its variants."""
    r = [1.0] + [i.ratio for i in self.items if i.kind != "control"]
    return max(r) / min(r)

  def to_json(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d["sign_accuracy"] = self.sign_accuracy
    d["latency_spread"] = self.latency_spread
    return d


def agreement(kinds: Sequence[str], ratios: np.ndarray, costs: np.ndarray, original_cost: float,
              *, noise_floor: float = 0.02, model_tie_tol: float = 1e-3) -> Agreement:
  """Rank and sign agreement between a cost model and measurements (host, pure).

  Args:
    kinds: str[n], "control", "walk" or "neighbour" per measured graph.
    ratios: float[P, n]: each graph's measured latency over the original's, from P >= 1
      independent passes (each pass compiled and timed separately).
    costs: float[n]: modelled cost of each graph; original_cost: of the original.
    noise_floor: the smallest relative change counted as real in the sign test; the threshold
      is max(noise_floor, 2 x the control's deviation, 2 x the median pass-to-pass deviation).
    model_tie_tol: modelled relative changes at most this are "the model predicts no change".
  """
  ratios = np.atleast_2d(np.asarray(ratios, np.float64))
  costs = np.asarray(costs, np.float64)
  kinds = list(kinds)
  if ratios.shape[1] != len(kinds) or costs.shape != (len(kinds),):
    raise ValueError(f"agreement: {len(kinds)} kinds, ratios {ratios.shape}, costs {costs.shape}")
  ratio = np.exp(np.log(ratios).mean(axis=0))  # geometric mean over the passes
  is_control = np.asarray([k == "control" for k in kinds])
  control_dev = float(np.max(np.abs(1.0 - ratio[is_control]), initial=0.0))
  others = ~is_control
  walks = np.asarray([k == "walk" for k in kinds])
  sp_all = spearman(np.r_[original_cost, costs[others]], np.r_[1.0, ratio[others]])
  sp_walk = spearman(np.r_[original_cost, costs[walks]], np.r_[1.0, ratio[walks]])
  if ratios.shape[0] >= 2:
    retest = spearman(np.r_[1.0, ratios[0, others]], np.r_[1.0, ratios[1, others]])
    ceiling = 2 * retest / (1 + retest) if retest > -1 else float("nan")
    retest_dev = float(np.median(np.abs(ratios[0] / ratios[1] - 1.0)))
  else:
    retest = ceiling = retest_dev = float("nan")
  threshold = max(noise_floor, 2.0 * control_dev,
                  2.0 * retest_dev if np.isfinite(retest_dev) else 0.0)
  sign_pairs = sign_correct = tie_pairs = tie_quiet = 0
  scale = max(abs(original_cost), 1e-9)
  for k, r, c in zip(kinds, ratio, costs):
    if k != "neighbour":
      continue
    d_cost, d_lat = (c - original_cost) / scale, r - 1.0
    tie = abs(d_cost) <= model_tie_tol
    if tie:
      tie_pairs += 1
      tie_quiet += int(abs(d_lat) <= threshold)
    if abs(d_lat) > threshold:
      sign_pairs += 1
      sign_correct += int((not tie) and (np.sign(d_cost) == np.sign(d_lat)))  # JSON: ints
  return Agreement(sp_all, sp_walk, float(retest), float(ceiling), retest_dev, sign_pairs,
                   sign_correct, tie_pairs, tie_quiet, float(threshold), control_dev)


def _costs(graphs: Sequence[layout.Graph], coeffs: cost_model.CostCoefficients,
           kernels: KernelTimes | None = None) -> np.ndarray:
  """float64[G]: the modelled cost of each graph (with `kernels`: every graph's kernels
  measured first, then costed with the table)."""
  table = None
  if kernels is not None:
    for g in graphs:
      kernels.add(g)
    table = kernels.table()
  fn = jax.jit(lambda g, c, t: cost_model.graph_cost(g, c, kernels=t))
  return np.asarray([float(fn(g, coeffs, table)) for g in graphs], np.float64)


def validate_model(graph: layout.Graph, params: ParamStore, coeffs: cost_model.CostCoefficients,
                   *, name: str = "model", walker: RewriteWalker | None = None,
                   variants: int = 30, neighbours: int = 15, max_steps: int = 8, seed: int = 0,
                   rounds: int = 10, repeats_per_round: int = 3, min_round_ms: float = 30.0,
                   passes: int = 2, noise_floor: float = 0.02, model_tie_tol: float = 1e-3,
                   backend: str | None = None, exclude: Collection[str] = (),
                   kernels: KernelTimes | None = None,
                   log: Callable[[str], None] | None = print) -> ModelValidation:
  """Validates the cost model on random rewritten variants of one model.

  Args:
    graph, params: the original model.
    coeffs: the cost model's coefficients.
    walker: a RewriteWalker for the graph's capacity (built here if None: built-in rules).
    variants: distinct random-walk variants wanted (walk lengths uniform in 1..max_steps).
    neighbours: one-step neighbours of the original for the sign test.
    rounds, repeats_per_round, min_round_ms: interleaved timing (see `measure_side_by_side`).
    passes: independent measurement passes (each compiles every graph afresh, in another
      order); with 2 or more the result says how reproducible the measured ranking is.
    noise_floor, model_tie_tol: see `agreement`.
    exclude: structural hashes of graphs not to use (e.g. those the coefficients were fitted
      on, so the validation is held out).
    kernels: also rank the graphs by the model with this measured kernel table
      (`ModelValidation.with_kernels`), against the same measurements.
  """
  t_start = time.perf_counter()
  walker = walker or RewriteWalker()
  rng = np.random.default_rng(seed)
  seen = {host.structural_hash(graph)} | set(exclude)
  graphs: list[layout.Graph] = [graph]  # the control copy: the same graph, compiled again
  kinds: list[str] = ["control"]
  trails: list[tuple[Step, ...]] = [()]
  for g2, step in walker.neighbours(graph, neighbours, rng):
    fp = host.structural_hash(g2)
    if fp not in seen:
      seen.add(fp)
      graphs.append(g2)
      kinds.append("neighbour")
      trails.append((step,))
  attempts = 0
  n_walks = 0
  while n_walks < variants and attempts < 4 * variants:
    attempts += 1
    g2, trail = walker.walk(graph, int(rng.integers(1, max_steps + 1)), rng)
    fp = host.structural_hash(g2)
    if not trail or fp in seen:
      continue
    seen.add(fp)
    graphs.append(g2)
    kinds.append("walk")
    trails.append(tuple(trail))
    n_walks += 1
  if log:
    log(f"{name}: {len(graphs) - 1} distinct variants ({n_walks} walks, "
        f"{kinds.count('neighbour')} neighbours) in {time.perf_counter() - t_start:.1f}s")
  measured = measure_passes(graph, graphs, params, passes=passes, seed=seed, rounds=rounds,
                            repeats_per_round=repeats_per_round, min_round_ms=min_round_ms,
                            backend=backend, log=log)
  costs = _costs([graph] + graphs, coeffs)
  c0, cost = costs[0], costs[1:]
  agree = agreement(kinds, measured.ratio, cost, c0, noise_floor=noise_floor,
                    model_tie_tol=model_tie_tol)
  with_kernels = None
  kcosts = np.full(len(graphs) + 1, np.nan)
  if kernels is not None:
    kcosts = _costs([graph] + graphs, coeffs, kernels)
    with_kernels = agreement(kinds, measured.ratio, kcosts[1:], kcosts[0],
                             noise_floor=noise_floor, model_tie_tol=model_tie_tol)
  iqr = np.median([[s.iqr_ms for s in st] for st in measured.stats], axis=0)
  items = [Item(k, t, float(r), float(r * measured.reference_ms), float(q), float(c), float(kc))
           for k, t, r, q, c, kc in zip(kinds, trails, measured.mean_ratio, iqr, cost,
                                        kcosts[1:])]
  nodes = int(np.asarray(graph.nodes["alive"]).sum())
  return ModelValidation(**dataclasses.asdict(agree), model=name, nodes=nodes,
                         original_ms=measured.reference_ms, original_cost_ms=float(c0),
                         items=items, seconds=time.perf_counter() - t_start,
                         with_kernels=with_kernels, original_kernel_cost_ms=float(kcosts[0]))


def markdown(rows: Sequence[ModelValidation], machine: str) -> str:
  """The summary table of a validation run."""
  lines = [f"Cost model vs measured XLA latency ({machine})", "",
           "| model | nodes | graphs | measured ms | model ms | latency spread | Spearman (all) "
           "| Spearman (walks) | retest Spearman | ceiling | sign acc. (pairs) "
           "| model ties quiet | noise thr. | control dev. | Spearman, kernel table "
           "| sign acc., kernel table |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    n = sum(i.kind != "control" for i in r.items) + 1
    k = r.with_kernels
    kernel_cols = ("- | - |" if k is None else
                   f"{k.spearman_all:.3f} | {k.sign_accuracy:.2f} ({k.sign_pairs}) |")
    lines.append(
        f"| {r.model} | {r.nodes} | {n} | {r.original_ms:.3f} | {r.original_cost_ms:.3f} | "
        f"{r.latency_spread:.2f}x | {r.spearman_all:.3f} | {r.spearman_walks:.3f} | "
        f"{r.retest_spearman:.3f} | {r.ceiling:.3f} | {r.sign_accuracy:.2f} ({r.sign_pairs}) | "
        f"{r.tie_quiet}/{r.tie_pairs} | "
        f"{100 * r.noise_threshold:.1f}% | {100 * r.control_dev:.1f}% | " + kernel_cols)
  return "\n".join(lines)
