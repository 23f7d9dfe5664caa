"""Rule sets by name, the one home of it: `select_rules(names)` and a bounded cache of RuleSets,
so a job that builds the same set twice reuses its compiled matchers (the search's Expander and
the environment are cached per RuleSet object)."""

from __future__ import annotations

import functools
from typing import Sequence

from xrlflow_jax.errors import UsageError
from xrlflow_jax.rules import RuleSet
from xrlflow_jax.rules.library import builtin_rules
from xrlflow_jax.rules.pattern import Rule


class RuleSelectionError(UsageError):
  """A rule name that is not a built-in rule (the message lists them)."""


def select_rules(names: Sequence[str]) -> list[Rule]:
  """Built-in rules by name (("all",) for every one), in the order given."""
  rules = builtin_rules()
  if tuple(names) == ("all",):
    return list(rules)
  by_name = {r.name: r for r in rules}
  unknown = [n for n in names if n not in by_name]
  if unknown:
    raise RuleSelectionError(f"unknown rules {unknown}; built-in rules are {sorted(by_name)}")
  return [by_name[n] for n in names]


@functools.lru_cache(maxsize=8)
def _cached(names: tuple[str, ...], max_locations: int) -> RuleSet:
  return RuleSet(select_rules(names), max_locations=max_locations)


def ruleset(names: Sequence[str], max_locations: int = 16) -> RuleSet:
  """The RuleSet of built-in rules `names` with `max_locations` locations per rule: one object
  per (names, max_locations) among the 8 most recent in a process."""
  return _cached(tuple(str(n) for n in names), int(max_locations))
