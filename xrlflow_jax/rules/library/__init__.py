"""The built-in rule library, by family (merge, fusion, algebra, movement, layout)."""

from __future__ import annotations

from xrlflow_jax.rules.library import algebra, fusion, layout, merge, movement
from xrlflow_jax.rules.pattern import Rule


def builtin_rules(families: list[str] | None = None) -> list[Rule]:
  """Every built-in rule (or those of the given families), in a stable order."""
  rules = (merge.rules() + fusion.rules() + algebra.rules() + movement.rules()
           + layout.rules())
  if families is not None:
    unknown = set(families) - {r.family for r in rules}
    if unknown:
      raise ValueError(f"unknown rule families {sorted(unknown)}; known: "
                       f"{sorted({r.family for r in rules})}")
    rules = [r for r in rules if r.family in families]
  return rules


__all__ = ["algebra", "builtin_rules", "fusion", "layout", "merge", "movement"]
