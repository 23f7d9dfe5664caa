"""A RuleSet: all rules matched in one call, any (rule, location) applied by `lax.switch`."""

from __future__ import annotations

from collections import Counter
from typing import Collection, Iterable, Mapping, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from xrlflow_jax.graph import layout
from xrlflow_jax.rules import edit as edit_lib
from xrlflow_jax.rules.compile import (DEFAULT_JOIN_WINDOW, DEFAULT_MAX_LOCATIONS, CompiledRule,
                                       Features)
from xrlflow_jax.rules.compile import bound_rows, compact_index, take_rows
from xrlflow_jax.rules.pattern import Rule


@chex.dataclass(frozen=True)
class RuleSetMatch:
  """Every location of every rule in one graph.

  Attributes:
    mask: bool[R, L], location l of rule r is valid.
    nodes: int32[R, L, P], the bound node ids (variables then source ops; -1 padding).
    found: int32[R], valid locations before truncation to L (found > L means some were cut).
    anchors_dropped: int32[R], nodes of the rule's root op beyond `max_anchors` (not searched).
  """
  mask: jax.Array
  nodes: jax.Array
  found: jax.Array
  anchors_dropped: jax.Array


class RuleSet:
  """A compiled collection of rules with a flat action space of R * L (rule, location) pairs.

  Args:
    rules: the rules (names must be unique).
    max_locations: L, locations kept per rule.
    join_window: how many equal-key partners a multi-root pattern tries per anchor.
    max_anchors: how many nodes of one op a rule examines (default max(64, N // 4)); nodes of
      an op beyond it are not searched (`RuleSetMatch.anchors_dropped` counts them).
  """

  def __init__(self, rules: Sequence[Rule], max_locations: int = DEFAULT_MAX_LOCATIONS,
               join_window: int = DEFAULT_JOIN_WINDOW, max_anchors: int | None = None):
    names = [r.name for r in rules]
    dup = {x for x in names if names.count(x) > 1}
    if dup:
      raise ValueError(f"duplicate rule names: {sorted(dup)}")
    if not rules:
      raise ValueError("a RuleSet needs at least one rule")
    self.rules = list(rules)
    self.compiled = [CompiledRule(r, max_locations, join_window, max_anchors) for r in rules]
    self.max_anchors = max_anchors
    self.max_locations = max_locations
    self.num_bound = max(r.num_bound for r in rules)  # P: nodes bound per candidate
    self.max_new = max(max(len(r.dst) for r in rules), 1)  # M
    self.max_redirects = max(len(r.replace) for r in rules)  # Q
    self.max_freed = max(len(r.src) for r in rules)  # F
    self.need_depth = any(c.needs_depth for c in self.compiled)
    self.jit_match = jax.jit(self.match)
    self.jit_apply = jax.jit(self.apply)
    self.jit_apply_action = jax.jit(self.apply_action)

  def __len__(self) -> int:
    return len(self.rules)

  def __fingerprint__(self) -> tuple:
    """What decides the traced match and apply (`trace_cache.fingerprint`): the rules and
    the settings they were compiled with."""
    return (self.rules, self.max_locations, self.compiled[0].join_window, self.max_anchors)

  @property
  def names(self) -> list[str]:
    return [r.name for r in self.rules]

  @property
  def num_actions(self) -> int:
    """R * L rewrite actions (an environment adds one stop action)."""
    return len(self.rules) * self.max_locations

  def index(self, name: str) -> int:
    return self.names.index(name)

  def match(self, graph: layout.Graph, only: Collection[int] | None = None,
            anchor_caps: Mapping[int, int] | None = None) -> RuleSetMatch:
    """Matches every rule (jittable; `vmap` it over a batch of graphs).

    Two static hints make the same result cheaper when the caller knows which graphs it will
    see (an environment does, from its pool and horizon):
      only: the indices of the rules to match; every other rule gets no location without
        being traced (`firing_rules`: rules that cannot fire on any such graph).
      anchor_caps: {op code: the most alive nodes of that op such a graph holds}
        (`op_count_bounds`): a rule examines that many nodes of its root op, not `max_anchors`.
    """
    f = Features(graph, self.need_depth, self.max_anchors, anchor_caps)
    l, p = self.max_locations, self.num_bound
    # Bind every rule's candidates, then compact the rules with the same candidate count C
    # together (one compaction per C, not one per rule: per-rule compactions would make a third
    # of the matcher's XLA kernels); only the kept candidates' nodes are gathered, per rule.
    groups: dict[int, list[tuple[int, jax.Array, jax.Array]]] = {}
    for i, c in enumerate(self.compiled):
      if only is not None and i not in only:
        continue
      ok, nodes = c.bind_all(f)
      groups.setdefault(ok.shape[0], []).append((i, ok, nodes))
    order: list[int] = []
    masks, bound, found = [], [], []
    for members in groups.values():
      index, valid, count = compact_index(jnp.stack([m[1] for m in members]), l)
      for row, (i, _, nodes) in enumerate(members):
        picked = take_rows(nodes, index[row])  # [L, P_rule]
        picked = jnp.pad(picked, ((0, 0), (0, p - picked.shape[-1])), constant_values=-1)
        bound.append(jnp.where(valid[row][:, None], picked, -1)[None])
        order.append(i)
      masks.append(valid)
      found.append(count)
    skipped = [i for i in range(len(self.compiled)) if i not in order]
    if skipped:  # rules not matched (`only`): no location, nothing traced
      order += skipped
      masks.append(jnp.zeros([len(skipped), l], bool))
      bound.append(jnp.full([len(skipped), l, p], -1, jnp.int32))
      found.append(jnp.zeros([len(skipped)], jnp.int32))
    back = np.argsort(np.asarray(order))  # rows back into rule order
    mask, nodes, count = (jnp.concatenate(x)[back] for x in (masks, bound, found))
    dropped = jnp.stack([f.anchors_dropped(int(c.rule.src[c.roots[0]].op))
                         for c in self.compiled])
    return RuleSetMatch(mask=mask, nodes=nodes, found=count, anchors_dropped=dropped)

  def edit(self, graph: layout.Graph, rule_index: jax.Array, nodes: jax.Array) -> edit_lib.Edit:
    """The padded edit of rule `rule_index` at `nodes` (int32[P]).

    Every rule's small plan is built at `nodes` and the rule's is selected (an index clamped
    into range, as `lax.switch` clamps): one flat computation, cheaper to trace and compile
    than a switch over the rules, and what a switch under `vmap` would run anyway. Shapes come
    from one shared pass over the shape rules (`edit_lib.complete`).
    """
    rows = bound_rows(graph, nodes)
    plans = [c.plan(graph, nodes[:c.rule.num_bound], self.max_new, self.max_redirects,
                    self.max_freed, {k: v[:c.rule.num_bound] for k, v in rows.items()})
             for c in self.compiled]
    index = jnp.clip(rule_index, 0, len(self.compiled) - 1)
    plan = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs)[index], *plans)
    return edit_lib.complete(graph, plan)

  def plans(self, graph: layout.Graph, nodes: jax.Array) -> edit_lib.Edit:
    """The plans (edits before `edit_lib.complete`) of every (rule, location): leaves with a
    leading axis R * L (action order), from `nodes` int32[R, L, P] (`RuleSetMatch.nodes`).

    Each rule's small plan is vmapped over its own L locations, so no `lax.switch` over rules
    is batched (which would run, and trace a select for, every rule's plan per candidate);
    gather the plans of the candidates to build, then `complete` and apply them.
    """
    out = []
    for r, c in enumerate(self.compiled):
      def plan(bound, rows, c=c):
        return c.plan(graph, bound, self.max_new, self.max_redirects, self.max_freed, rows)
      bound = nodes[r][:, :c.rule.num_bound]
      out.append(jax.vmap(plan)(bound, bound_rows(graph, bound)))
    return jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs, 0), *out)

  def valid_actions(self, mask: jax.Array, pad: int = 0) -> tuple[jax.Array, jax.Array]:
    """(int32[R * L + pad] the flat actions of the valid candidates in action order, then 0s;
    int32[] their count C) from `mask` bool[R, L]."""
    flat = mask.reshape(-1)
    (every,) = jnp.nonzero(flat, size=flat.shape[0] + pad, fill_value=0)
    return every.astype(jnp.int32), flat.sum().astype(jnp.int32)

  def compact_actions(self, mask: jax.Array, slots: int | None = None
                      ) -> tuple[jax.Array, jax.Array]:
    """The valid candidates of `mask` bool[R, L] compacted (action order) into C = `slots`
    slots (None: R * L): (index int32[C] the flat action of each slot (0 where unused), used
    bool[C]: the slot holds a valid candidate). Valid candidates past C are left out."""
    a = mask.size
    c = min(slots or a, a)
    every, count = self.valid_actions(mask)
    return every[:c], jnp.arange(c) < count

  def candidate_edits(self, graph: layout.Graph, nodes: jax.Array, mask: jax.Array,
                      slots: int | None = None) -> tuple[edit_lib.Edit, jax.Array, jax.Array]:
    """The plans of the valid candidates only, compacted (action order) into `slots` slots;
    `build` turns each into its graph. Valid candidates past `slots` are left out.

    Args:
      graph: the current graph; nodes: int32[R, L, P] bound nodes (`RuleSetMatch.nodes`);
      mask: bool[R, L] valid candidates; slots: C (None: R * L, every candidate).
    Returns:
      (plans with a leading axis C, index int32[C] the flat action of each slot (0 where
      unused), used bool[C]: the slot holds a valid candidate).
    """
    index, used = self.compact_actions(mask, slots)
    plans = jax.tree_util.tree_map(lambda x: x[index], self.plans(graph, nodes))
    return plans, index, used

  def build(self, graph: layout.Graph, plan: edit_lib.Edit, keep: jax.Array
            ) -> tuple[layout.Graph, jax.Array]:
    """(graph after `plan`, applied): the plan completed by the shared shape rules and applied
    by the shared edit kernel where `keep`, else `graph` unchanged (and applied False). vmap it
    over the plans of `candidate_edits`: the shape rules and the edit kernel, the expensive
    part, then run once per candidate."""
    n = layout.capacity(graph)
    edit = edit_lib.neutralize(edit_lib.complete(graph, plan), keep, n)
    return edit_lib.apply_edit(graph, edit)

  def candidates(self, graph: layout.Graph, nodes: jax.Array, mask: jax.Array,
                 slots: int | None = None) -> tuple[layout.Graph, jax.Array, jax.Array]:
    """The graphs one rewrite of `graph` would produce, for the valid candidates only
    (`candidate_edits`, then `build` vmapped over them).

    Args:
      graph: the current graph; nodes: int32[R, L, P] bound nodes (`RuleSetMatch.nodes`);
      mask: bool[R, L] valid candidates; slots: C (None: R * L, every candidate).
    Returns:
      (graphs with a leading axis C, index int32[C] the flat action of each slot (0 where
      unused), ok bool[C]: the slot holds a valid candidate that applied).
    """
    plans, index, used = self.candidate_edits(graph, nodes, mask, slots)
    graphs, ok = jax.vmap(lambda e, keep: self.build(graph, e, keep))(plans, used)
    return graphs, index, ok  # applied only where used (`build`)

  def apply(self, graph: layout.Graph, rule_index: jax.Array, nodes: jax.Array,
            allowed: jax.Array | bool = True) -> tuple[layout.Graph, jax.Array]:
    """Applies one rule at one location; returns (graph, applied). Unapplicable: unchanged."""
    n = graph.nodes["op"].shape[-1]
    edit = self.edit(graph, rule_index, nodes)
    edit = edit_lib.neutralize(edit, jnp.asarray(allowed) & jnp.all(nodes[:1] >= 0), n)
    graph2, ok = edit_lib.apply_edit(graph, edit)
    return jax.tree_util.tree_map(lambda a, b: jnp.where(ok, a, b), graph2, graph), ok

  def apply_action(self, graph: layout.Graph, match: RuleSetMatch,
                   action: jax.Array) -> tuple[layout.Graph, jax.Array]:
    """Applies flat action `action` = rule * L + location; an unmasked action changes nothing."""
    r = action // self.max_locations
    loc = action % self.max_locations
    return self.apply(graph, r, match.nodes[r, loc], match.mask[r, loc])


def firing_rules(rules: Sequence[Rule], op_codes: Iterable[int]) -> frozenset[int]:
  """The indices of the rules whose source ops can all occur in a graph holding `op_codes`,
  counting the ops that kept rules create (a closure to a fixed point): a rule that merges
  Concats is kept for a graph without one when another kept rule makes a Concat.

  Only op codes are considered (not attributes or shapes), so every rule that can ever match a
  graph reachable from one with these ops by these rules is kept: a rule left out matches no
  such graph.
  """
  present = {int(o) for o in op_codes}
  kept: set[int] = set()
  changed = True
  while changed:
    changed = False
    for i, r in enumerate(rules):
      if i not in kept and all(int(s.op) in present for s in r.src):
        kept.add(i)
        present |= {int(d.op) for d in r.dst}
        changed = True
  return frozenset(kept)


def rules_that_can_fire(rules: Sequence[Rule], op_codes: Iterable[int]) -> list[Rule]:
  """The rules of `firing_rules`, in their order."""
  kept = firing_rules(rules, op_codes)
  return [r for i, r in enumerate(rules) if i in kept]


def op_count_bounds(rules: Sequence[Rule], counts: Mapping[int, int],
                    rewrites: int) -> dict[int, int]:
  """{op code: the most alive nodes of that op} in any graph `rewrites` rewrites by `rules` away
  from graphs holding at most `counts[op]` nodes of each op.

  A rewrite adds its target's nodes and frees its non-kept source nodes (then maybe more,
  never fewer), so each op grows by at most the largest net gain of one rule per rewrite.
  """
  gain: dict[int, int] = {}
  for r in rules:
    added = Counter(int(d.op) for d in r.dst)
    removed = Counter(int(s.op) for s in r.src if not s.keep)
    for op, k in added.items():
      gain[op] = max(gain.get(op, 0), k - removed.get(op, 0))
  ops = {int(o) for o in counts} | set(gain)
  return {op: int(counts.get(op, 0)) + rewrites * max(gain.get(op, 0), 0) for op in ops}


def graph_op_counts(graphs: Iterable[layout.Graph]) -> dict[int, int]:
  """{op code: the most alive nodes of it in one graph} over some (host or device, unbatched
  or batched) graphs."""
  counts: dict[int, int] = {}
  for g in graphs:
    op = np.asarray(g.nodes["op"]).reshape(-1, np.shape(g.nodes["op"])[-1])
    alive = np.asarray(g.nodes["alive"], bool).reshape(op.shape)
    for row, live in zip(op, alive):
      codes, k = np.unique(row[live], return_counts=True)
      for c, m in zip(codes.tolist(), k.tolist()):
        counts[c] = max(counts.get(c, 0), m)
  return counts


def graph_op_codes(graphs: Iterable[layout.Graph]) -> set[int]:
  """The op codes of the alive nodes of some (host or device, unbatched or batched) graphs."""
  return set(graph_op_counts(graphs))

