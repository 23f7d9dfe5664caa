"""The built-in rule library, by family (merge, fusion, algebra, movement, layout,
implementation choice, dedupe, narrowing)."""

from __future__ import annotations

from xrlflow_jax.rules.library import (algebra, dedupe, fusion, impl, layout, merge, movement,
                                       narrowing)
from xrlflow_jax.rules.pattern import Rule


# Families left out of the default set (named to use them, e.g. "family:dedupe"): correct and
# verified, but not measured to pay under XLA:CPU (see each module's docstring).
OPT_IN_FAMILIES = ("dedupe",)


def builtin_rules(families: list[str] | None = None) -> list[Rule]:
  """Every built-in rule outside `OPT_IN_FAMILIES` (or the rules of the given families, opt-in
  ones included), in a stable order."""
  rules = (merge.rules() + fusion.rules() + algebra.rules() + movement.rules()
           + layout.rules() + impl.rules() + dedupe.rules() + narrowing.rules())
  if families is None:
    return [r for r in rules if r.family not in OPT_IN_FAMILIES]
  unknown = set(families) - {r.family for r in rules}
  if unknown:
    raise ValueError(f"unknown rule families {sorted(unknown)}; known: "
                     f"{sorted({r.family for r in rules})}")
  return [r for r in rules if r.family in families]


__all__ = ["OPT_IN_FAMILIES", "algebra", "builtin_rules", "dedupe", "fusion", "impl", "layout",
           "merge", "movement", "narrowing"]
