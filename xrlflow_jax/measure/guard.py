"""The measured guard: which graph a speed claim may return, decided once for every caller.

A search (or training) found a path of rewrites; the guard has timed the path's graph and up to
k of its prefixes (checkpoints, `checkpoint_lengths`) beside the input and an identical copy
(`measure.compare`, each verdict at `checkpoint_level(k)`). `decide` keeps the fastest of them
among those measured significantly faster (the whole path on a tie), else the whole path when it
is the input unchanged, else the input. The search drivers (`search.guard.finish`), the optimise
job (`optimize.pipeline`) and the benchmark (`harness.benchmark`, replaying the job's sets of
rounds) all call `decide`; none decides on its own.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from xrlflow_jax.measure.verdict import LEVEL, Speedup

# Prefixes of a found path timed beside it by a measured guard (`checkpoint_lengths`).
DEFAULT_CHECKPOINTS = 2
KEPT = ("path", "checkpoint", "input")


def checkpoint_lengths(families: Sequence[str], count: int) -> list[int]:
  """The last `count` prefix lengths of a path of rewrites at which the rule family changes
  (each step's family in order; 0 and the whole path excluded), ascending: a run of one
  family (converting convolutions to NHWC, merging a cell's gates) is one transformation, so
  its ends are where a path can be cut with its gains whole. The cost model can rate a late
  run a gain that XLA does not measure; a guard that times these prefixes beside the whole
  path need not then drop all of it."""
  ends = [i for i in range(1, len(families)) if families[i] != families[i - 1]]
  return ends[-count:] if count > 0 else []


def checkpoint_level(count: int) -> float:
  """The interval level of each verdict when the best of the whole path and `count` prefixes
  is chosen: 1 - (1 - LEVEL) / (1 + count) (Bonferroni), so choosing does not raise the
  false-positive rate."""
  return 1 - (1 - LEVEL) / (1 + count)


def fastest_faster(speedups: Sequence[Speedup]) -> int | None:
  """The index of the highest ratio among `speedups` measured significantly faster (the first
  on a tie: the whole path, listed first, over its prefixes), or None when none is."""
  best = None
  for i, s in enumerate(speedups):
    if s.faster and (best is None or s.ratio > speedups[best].ratio):
      best = i
  return best


@dataclasses.dataclass(frozen=True)
class GuardDecision:
  """What the measured guard keeps, and why.

  Attributes:
    kept: "path" (the whole path found), "checkpoint" (a prefix of it) or "input".
    rewrites: rewrites of the graph kept (0 for the input); of: rewrites of the whole path
      (None where the caller does not know them: then `rewrites` too for the path).
    speedup: the kept graph's measured Speedup (`Speedup.unchanged()` for the input).
    path_speedup: the whole path's verdict; checkpoint_speedups: each prefix's, in the order
      the prefixes were given.
    index: the kept graph's place among [path, *prefixes] (None: the input).
  """
  kept: str
  rewrites: int | None
  of: int | None
  speedup: Speedup
  path_speedup: Speedup
  checkpoint_speedups: tuple[Speedup, ...]
  index: int | None

  @property
  def returns_input(self) -> bool:
    """The graph returned computes the input's way: the input, or a path that left it
    unchanged."""
    return self.kept == "input" or self.speedup.verdict == "unchanged"


def decide(path: Speedup, path_rewrites: int | None, checkpoints: Sequence[Speedup] = (),
           lengths: Sequence[int] = ()) -> GuardDecision:
  """The guard's decision from the verdicts of the whole path (`path_rewrites` rewrites) and of
  its prefixes of `lengths` rewrites (`checkpoints`, one verdict each, all measured in the same
  rounds at `checkpoint_level(len(checkpoints))`)."""
  checkpoints, lengths = tuple(checkpoints), tuple(int(k) for k in lengths)
  if len(checkpoints) != len(lengths):
    raise ValueError(f"{len(checkpoints)} checkpoint verdicts for {len(lengths)} prefixes")
  i = fastest_faster([path, *checkpoints])
  if i:  # a prefix measured faster than the whole path
    return GuardDecision("checkpoint", lengths[i - 1], path_rewrites, checkpoints[i - 1], path,
                         checkpoints, i)
  if path.keeps:
    return GuardDecision("path", path_rewrites, path_rewrites, path, path, checkpoints, 0)
  return GuardDecision("input", 0, path_rewrites, Speedup.unchanged(), path, checkpoints, None)
