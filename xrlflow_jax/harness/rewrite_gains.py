"""Which rewrites pay under XLA: each rule applied at all of its locations, measured end to end.

For every model and every rule that fires on it, the rule is applied at each of its locations in
the original graph (one pass: a location that binds a node an earlier application created or
changed is skipped, so self-inverse rules such as commuting an addition do not undo themselves
and merges do not chain). The rewritten graphs are measured side by side with the original
(interleaved rounds, the original in every batch) in several independent passes (each compiles
every graph afresh, in another order), and the geometric mean of the passes' ratios after /
before is reported with the range over passes and the cost model's prediction of the same
ratio. One pass is not enough on a small CPU: separately compiled copies of one graph differ by
a few percent, and a single pass has shown a 9% "gain" that two more passes did not reproduce.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import jax
import numpy as np

from xrlflow_jax.cost import model as cost_model
from xrlflow_jax.measure import measure_passes
from xrlflow_jax.rules.walk import RewriteWalker
from xrlflow_jax.graph import ParamStore, layout


def _changed(before: layout.Graph, after: layout.Graph) -> np.ndarray:
  """bool[N]: slots whose node differs (born, freed, or a different op/attrs/inputs)."""
  a, b = before.nodes, after.nodes
  out = np.asarray(a["alive"]) != np.asarray(b["alive"])
  for f in ("op", "attrs", "shape"):
    x, y = np.asarray(a[f]), np.asarray(b[f])
    out |= (x != y).reshape(x.shape[0], -1).any(axis=1)
  ta, tb = np.asarray(layout.input_table(before)), np.asarray(layout.input_table(after))
  return out | (ta != tb).any(axis=1)


def apply_everywhere(walker: RewriteWalker, graph: layout.Graph, rule: int,
                     max_apply: int = 200) -> tuple[layout.Graph, int]:
  """Applies rule index `rule` at every location of the original graph (see module docstring).

  Returns:
    (graph, number of applications).
  """
  fresh = np.zeros([layout.capacity(graph)], bool)
  failed: set[tuple[int, ...]] = set()
  count = 0
  while count < max_apply:
    mask, nodes = walker.matches(graph)
    pick = None
    for loc in np.flatnonzero(mask[rule]):
      bound = nodes[rule, loc]
      key = tuple(int(v) for v in bound)
      if key in failed or fresh[bound[bound >= 0]].any():
        continue
      pick = bound
      break
    if pick is None:
      break
    g2, ok = walker.apply(graph, rule, pick)
    if not ok:
      failed.add(tuple(int(v) for v in pick))
      continue
    fresh |= _changed(graph, g2)
    graph = g2
    count += 1
  return graph, count


@dataclasses.dataclass(frozen=True)
class GainRow:
  """One rule on one model: applications, measured latencies and the model's predicted ratio."""
  family: str
  rule: str
  model: str
  applied: int
  before_ms: float
  after_ms: float
  ratio: float
  iqr_rel: float
  cost_ratio: float
  pass_ratios: tuple[float, ...] = ()

  @property
  def pass_spread(self) -> float:
    """max/min of the passes' ratios (1.0 with one pass): how far one pass can be trusted."""
    return max(self.pass_ratios) / min(self.pass_ratios) if self.pass_ratios else 1.0


def rewrite_gains(graph: layout.Graph, params: ParamStore, *, model: str,
                  walker: RewriteWalker, coeffs: cost_model.CostCoefficients | None = None,
                  families: Sequence[str] | None = None, max_apply: int = 200,
                  rounds: int = 10, repeats_per_round: int = 3, min_round_ms: float = 30.0,
                  passes: int = 3, backend: str | None = None,
                  seed: int = 0, log: Callable[[str], None] | None = print) -> list[GainRow]:
  """The gain of every rule (of `families`, default all) that fires on one model, measured in
  `passes` independent passes (see the module docstring)."""
  mask, _ = walker.matches(graph)
  cost_fn = jax.jit(cost_model.graph_cost)
  c0 = float(cost_fn(graph, coeffs)) if coeffs is not None else math.nan
  rows_meta, graphs = [], []
  for r, rule in enumerate(walker.rules):
    if (families is not None and rule.family not in families) or not mask[r].any():
      continue
    g2, count = apply_everywhere(walker, graph, r, max_apply)
    if count == 0:
      continue
    c2 = float(cost_fn(g2, coeffs)) if coeffs is not None else math.nan
    rows_meta.append((rule.family, rule.name, count, c2 / c0))
    graphs.append(g2)
  if log:
    log(f"{model}: {len(graphs)} rules fire")
  if not graphs:
    return []
  measured = measure_passes(graph, graphs, params, passes=passes, seed=seed, rounds=rounds,
                            repeats_per_round=repeats_per_round, min_round_ms=min_round_ms,
                            backend=backend, log=log)
  ratio, ref_ms = measured.mean_ratio, measured.reference_ms
  iqr = np.median([[s.iqr_ms / max(s.median_ms, 1e-12) for s in st] for st in measured.stats],
                  axis=0)
  rows = []
  for i, (family, name, count, cr) in enumerate(rows_meta):
    rows.append(GainRow(family, name, model, count, ref_ms, float(ratio[i] * ref_ms),
                        float(ratio[i]), float(iqr[i]), float(cr),
                        tuple(float(x) for x in measured.ratio[:, i])))
  return rows


def markdown(rows: Sequence[GainRow], machine: str) -> str:
  """Per-rule rows grouped by family, then a per-family summary (geometric mean of ratios)."""
  rows = sorted(rows, key=lambda r: (r.family, r.rule, r.model))
  lines = [f"Which rewrites pay under XLA ({machine}); ratio = after / before (< 1 is faster)",
           "", "| family | rule | model | applied | before ms | after ms | measured ratio | "
           "passes (min-max) | IQR/median | model ratio |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    span = (f"{min(r.pass_ratios):.3f}-{max(r.pass_ratios):.3f} ({len(r.pass_ratios)})"
            if r.pass_ratios else "-")
    lines.append(f"| {r.family} | {r.rule} | {r.model} | {r.applied} | {r.before_ms:.3f} | "
                 f"{r.after_ms:.3f} | {r.ratio:.3f} | {span} | {r.iqr_rel:.3f} | "
                 f"{r.cost_ratio:.3f} |")
  lines += ["", "| family | rule | models | geo-mean measured ratio | range | geo-mean model "
                "ratio |", "|---|---|---:|---:|---:|---:|"]
  by_rule: dict[tuple[str, str], list[GainRow]] = {}
  for r in rows:
    by_rule.setdefault((r.family, r.rule), []).append(r)
  for (family, rule), rs in by_rule.items():
    ratios = np.asarray([r.ratio for r in rs])
    model = np.asarray([r.cost_ratio for r in rs])
    lines.append(f"| {family} | {rule} | {len(rs)} | {np.exp(np.log(ratios).mean()):.3f} | "
                 f"{ratios.min():.3f}-{ratios.max():.3f} | {np.exp(np.log(model).mean()):.3f} |")
  return "\n".join(lines)
