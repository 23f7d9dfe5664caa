"""Rule sets by name, the one home of it: `select_rules(names)` and a bounded cache of RuleSets,
so a job that builds the same set twice reuses its compiled matchers (the search's Expander and
the environment are cached per RuleSet object).

A selection is a list of entries; each entry is one of (and entries may be joined by "+" in one
string, e.g. "builtin+taso:../shared/taso/graph_subst.pb"):

  "all", "builtin"    every built-in rule
  "layout"            the layout rules (NCHW to NHWC and the transposes carried through the
                      graph) with the transpose rules that cancel them (part of "builtin")
  "family:<name>"     the built-in rules of one family (merge_conv, merge_matmul, group_conv,
                      transpose, ...: `Rule.family`), or of an opt-in family that "builtin"
                      leaves out (`rules.library.OPT_IN_FAMILIES`: "dedupe")
  "taso:<path>"       TASO's rule collection, translated from that `graph_subst.pb`
  "taso"              the same from the file named by $XRLFLOW_TASO_RULES
  "<rule name>"       one built-in rule, or one TASO rule ("taso_<index>") when a TASO file is
                      known (an entry above, the `taso_file` argument or $XRLFLOW_TASO_RULES)

Rules keep the order of the entries; a rule named twice is kept once.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Sequence

from xrlflow_jax.errors import UsageError
from xrlflow_jax.graph import layout
from xrlflow_jax.rules import RuleSet
from xrlflow_jax.rules import taso
from xrlflow_jax.rules.library import OPT_IN_FAMILIES, builtin_rules
from xrlflow_jax.rules.pattern import Rule
from xrlflow_jax.rules.ruleset import graph_op_codes, rules_that_can_fire

TASO_ENV = "XRLFLOW_TASO_RULES"
SETS = ("all", "builtin", "layout", "family:<name>", "taso:<path>", "taso")
LAYOUT_FAMILIES = ["layout", "transpose"]


class RuleSelectionError(UsageError):
  """A rule name or rule set that does not exist, or a TASO file that cannot be read (the
  message lists what exists)."""


@functools.lru_cache(maxsize=4)
def _taso_rules(path: str, mtime_ns: int) -> tuple[Rule, ...]:
  del mtime_ns  # part of the key: an edited file is read again
  return tuple(taso.load_taso(path).rules)


def taso_file(names: Sequence[str] = (), given: str | os.PathLike | None = None) -> str | None:
  """The TASO rule file a selection uses: its first "taso:<path>" entry, else `given`, else
  $XRLFLOW_TASO_RULES (absolute path), or None when there is none."""
  for entry in _entries(names):
    if entry.startswith("taso:") and entry[5:]:
      return str(Path(entry[5:]).expanduser().resolve())
  path = given or os.environ.get(TASO_ENV)
  return str(Path(path).expanduser().resolve()) if path else None


def taso_rules(path: str | os.PathLike | None) -> list[Rule]:
  """TASO's translated rules from `path` (read once per file and modification time)."""
  if not path:
    raise RuleSelectionError(f"the rule set 'taso' needs TASO's rule file: name it as "
                             f"'taso:<path to graph_subst.pb>' or set ${TASO_ENV}")
  path = Path(path)
  try:
    return list(_taso_rules(str(path), path.stat().st_mtime_ns))
  except FileNotFoundError:
    raise RuleSelectionError(f"TASO's rule file {str(path)!r} does not exist") from None
  except (OSError, taso.RuleImportError) as e:
    raise RuleSelectionError(str(e)) from None


def _entries(names: Sequence[str]) -> list[str]:
  if isinstance(names, str):
    names = [names]
  return [e.strip() for n in names for e in str(n).split("+") if e.strip()]


def select_rules(names: Sequence[str], *, taso_file_path: str | os.PathLike | None = None
                 ) -> list[Rule]:
  """The rules a selection names (see the module docstring), in the order given.

  Raises:
    RuleSelectionError: unknown names or families, no rules at all, or a TASO file that is
      missing, unreadable or corrupt.
  """
  entries = _entries(names)
  builtin = builtin_rules()
  by_name = {r.name: r for r in builtin + builtin_rules(list(OPT_IN_FAMILIES))}
  path = taso_file(entries, taso_file_path)
  out: list[Rule] = []
  seen: set[str] = set()
  unknown: list[str] = []

  def add(rules: Sequence[Rule]) -> None:
    for r in rules:
      if r.name not in seen:
        seen.add(r.name)
        out.append(r)

  for entry in entries:
    if entry in ("all", "builtin"):
      add(builtin)
    elif entry == "layout":
      add(builtin_rules(LAYOUT_FAMILIES))
    elif entry.startswith("family:"):
      try:
        add(builtin_rules([entry[len("family:"):]]))
      except ValueError as e:
        raise RuleSelectionError(str(e)) from None
    elif entry == "taso":
      add(taso_rules(path))
    elif entry.startswith("taso:"):
      add(taso_rules(Path(entry[5:]).expanduser().resolve() if entry[5:] else None))
    elif entry in by_name:
      add([by_name[entry]])
    elif re.fullmatch(r"taso_\d+", entry):
      translated = {r.name: r for r in taso_rules(path)}
      if entry not in translated:
        raise RuleSelectionError(f"{entry!r} is not among the {len(translated)} rules translated "
                                 f"from {path} (some of TASO's rules are skipped: see "
                                 "`rules.load_taso(path).summary()`)")
      add([translated[entry]])
    else:
      unknown.append(entry)
  if unknown:
    raise RuleSelectionError(f"unknown rules {unknown}; rule sets are {', '.join(SETS)}; "
                             f"built-in rules are {sorted(by_name)}")
  if not out:
    raise RuleSelectionError("no rules selected")
  return out


@functools.lru_cache(maxsize=8)
def _cached(names: tuple[str, ...], max_locations: int, path: str | None) -> RuleSet:
  return RuleSet(select_rules(names, taso_file_path=path), max_locations=max_locations)


def ruleset(names: Sequence[str], max_locations: int = 16, *,
            taso_file_path: str | os.PathLike | None = None) -> RuleSet:
  """The RuleSet of the selection `names` with `max_locations` locations per rule: one object
  per (names, max_locations, TASO file) among the 8 most recent in a process."""
  entries = tuple(_entries(names))
  return _cached(entries, int(max_locations), taso_file(entries, taso_file_path))


def subset(rules: RuleSet, names: Sequence[str]) -> RuleSet:
  """A RuleSet of some of `rules`' rules (by name, in `rules`' order), cached like `ruleset`."""
  keep = set(names)
  return _subset(rules, tuple(n for n in rules.names if n in keep))


def that_can_fire(rules: RuleSet, graphs: Sequence[layout.Graph]) -> RuleSet:
  """`subset` of the rules that can fire on `graphs` (`rules.rules_that_can_fire` over their
  op codes; rules whose source ops cannot occur would be compiled for nothing): what the
  optimise job and the benchmark search with. Keeps the first rule when none can fire (a
  RuleSet needs one; it then finds nothing)."""
  firing = rules_that_can_fire(rules.rules, graph_op_codes(graphs)) or rules.rules[:1]
  return subset(rules, [r.name for r in firing])


@functools.lru_cache(maxsize=8)
def _subset(rules: RuleSet, names: tuple[str, ...]) -> RuleSet:
  if names == tuple(rules.names):
    return rules
  by_name = {r.name: r for r in rules.rules}
  first = rules.compiled[0]
  return RuleSet([by_name[n] for n in names], max_locations=rules.max_locations,
                 join_window=first.join_window,
                 max_anchors=rules.max_anchors)
