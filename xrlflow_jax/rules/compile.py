"""Compiles a `Rule` into a vectorised matcher and an edit builder.

Matching, for one rule, with no Python loop over nodes:
  1. Candidates. A single-root pattern anchors its root at every slot (N candidates). A pattern
     with several roots (two matmuls reading one tensor; two slices of one concat) joins them
     on the element they share: each slot's join key is the node reached from it along the
     root's path to the shared element, slots are sorted by key, and roots are paired with the
     next `join_window` slots of equal key (searchsorted on the sorted keys). Symmetric rules
     of 4 or more roots take runs of consecutive slots of equal key. No N x N mask.
  2. Binding. From the roots, every source op and variable is bound by gathers over the input
     table; a variable reached twice must bind one node. Checks: op codes, arity, alive,
     distinct source nodes, constant variables, internal outputs used only inside the pattern
     and not graph outputs, enough free slots, no cycle after the rewrite (level test), and the
     rule's own constraint. All per candidate, `vmap`ped.
  3. Compaction of valid candidates into L locations (`jnp.nonzero(size=L)`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xrlflow_jax import ops
from xrlflow_jax.graph import layout
from xrlflow_jax.graph import transforms
from xrlflow_jax.ops import MAX_RANK as R
from xrlflow_jax.rules import edit as edit_lib
from xrlflow_jax.rules.pattern import MatchView, Ref, Rule, by_slot, encode_attrs_jit

DEFAULT_MAX_LOCATIONS = 64
DEFAULT_JOIN_WINDOW = 4


class Features:
  """What every rule's matcher needs, computed once per graph per step (inside the trace).

  `anchor_caps` (static, optional): {op code: the most alive nodes of that op the graph can
  hold} (`rules.op_count_bounds`); a rule then examines only that many nodes of its root op
  instead of `max_anchors` (never more), which finds the same matches for less work.
  """

  def __init__(self, graph: layout.Graph, need_depth: bool, max_anchors: int | None = None,
               anchor_caps: Mapping[int, int] | None = None):
    n = graph.nodes["op"].shape[-1]
    self.graph = graph
    self.n = n
    self.table = layout.input_table(graph)  # int32[N, K]
    self.k = self.table.shape[-1]
    self.n_inputs = (self.table >= 0).sum(-1).astype(jnp.int32)  # [N]
    self.columns = [self.table[:, k] for k in range(self.k)]  # K x int32[N]
    self.alive = graph.nodes["alive"]
    self.op = graph.nodes["op"]
    used = graph.edges["valid"] & self.alive[graph.receivers]
    self.consumers = jax.ops.segment_sum(used.astype(jnp.int32), graph.senders, num_segments=n)
    self.free = (~self.alive).sum().astype(jnp.int32)
    # The graph's maintained topological levels: level[a] < level[b] proves a does not
    # depend on b (exact longest-path depth would cost a depth-long loop every step).
    del need_depth
    self.depth = graph.nodes["level"]
    self._sorted: dict[Any, tuple[jax.Array, jax.Array]] = {}
    self._attr_columns: list[jax.Array] | None = None
    # Slots grouped by op code (dead slots last), so a rule only examines nodes of its root op.
    self.max_anchors = min(n, max_anchors if max_anchors else max(64, n // 4))
    self.anchor_caps = anchor_caps
    num_ops = len(ops.all_specs())
    op_key = jnp.where(self.alive, self.op, num_ops)
    self.op_order, sorted_ops = transforms.stable_sort_by_key(op_key, num_ops + 1)
    self.op_start = jnp.searchsorted(sorted_ops,
                                     jnp.arange(num_ops + 1, dtype=jnp.int32)).astype(jnp.int32)

  def rows_of(self, feature: str, index: jax.Array) -> jax.Array:
    """`take_rows(graph.nodes[feature], index)`; attribute rows are gathered column by column
    and stacked, so XLA drops the columns a constraint does not read (most read one attribute
    of the 16; the environment's matcher, BERT-base x 64 graphs, 143 -> 110 ms, 2026-12-04)."""
    x = self.graph.nodes[feature]
    if feature != "attrs":
      return take_rows(x, index)
    if self._attr_columns is None:
      self._attr_columns = [x[:, a] for a in range(x.shape[-1])]
    return jnp.stack([take_rows(col, index) for col in self._attr_columns], -1)

  def anchor_count(self, op: int) -> int:
    """C: how many slots of `op` a rule rooted at it examines (static)."""
    if self.anchor_caps is None or op not in self.anchor_caps:
      return self.max_anchors
    return max(1, min(self.max_anchors, int(self.anchor_caps[op])))

  def anchors(self, op: int) -> tuple[jax.Array, jax.Array]:
    """Up to `anchor_count(op)` alive slots holding `op`: (ids int32[C], valid bool[C])."""
    c = self.anchor_count(op)
    start = self.op_start[op]
    count = self.op_start[op + 1] - start
    ids = self.op_order[jnp.minimum(start + jnp.arange(c), self.n - 1)]
    return ids, jnp.arange(c) < count

  def anchors_dropped(self, op: int) -> jax.Array:
    """How many slots of `op` exceed `anchor_count(op)` (their matches are not searched)."""
    return jnp.maximum(self.op_start[op + 1] - self.op_start[op] - self.anchor_count(op), 0)

  def join_keys(self, op: int, path: tuple[int, ...]) -> jax.Array:
    """int32[N]: for slots holding `op`, the node reached along `path`; N elsewhere."""
    key = jnp.arange(self.n, dtype=jnp.int32)
    ok = self.alive & (self.op == op)
    for k in path:
      nxt = self.table[key, k]
      ok = ok & (nxt >= 0)
      key = jnp.maximum(nxt, 0)
    return jnp.where(ok, key, self.n)

  def sorted_keys(self, op: int, path: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """(order, sorted keys) of `join_keys`, cached so rules sharing a join sort once."""
    if (op, path) not in self._sorted:
      self._sorted[(op, path)] = transforms.stable_sort_by_key(self.join_keys(op, path),
                                                               self.n + 1)
    return self._sorted[(op, path)]


def take_rows(x: jax.Array, index: jax.Array) -> jax.Array:
  """x[index] along the first axis: x [N, ...], index int32[...] in [0, N) -> [..., ...].

  One `lax.gather` built directly (clamped, as jax clamps a scalar index): `jnp` indexing
  costs about a millisecond of Python per call to trace, and a matcher makes thousands.
  """
  dnums = jax.lax.GatherDimensionNumbers(offset_dims=tuple(range(index.ndim, index.ndim + x.ndim - 1)),
                                         collapsed_slice_dims=(0,), start_index_map=(0,))
  return jax.lax.gather(x, index[..., None], dnums, slice_sizes=(1, *x.shape[1:]),
                        mode=jax.lax.GatherScatterMode.CLIP)


def bound_rows(graph: layout.Graph, nodes: jax.Array) -> dict[str, jax.Array]:
  """The `MatchView.ROW_FEATURES` of bound nodes int32[..., P] (-1 reads slot 0, as a view
  does): {feature: [..., P, ...]}, one gather each."""
  nodes = jnp.maximum(nodes, 0)
  return {name: take_rows(graph.nodes[name], nodes) for name in MatchView.ROW_FEATURES}


def _stack(values: list[Any], dtype: Any) -> Any:
  """np.stack of `values` cast to `dtype` when none is traced (a constant), else jnp.stack."""
  if not values:
    return np.zeros([0], dtype)
  if any(isinstance(x, jax.Array) for x in values):
    return jnp.stack([jnp.asarray(x, dtype) for x in values])
  return np.stack([np.asarray(x, dtype) for x in values])


def node_depth(table: jax.Array, alive: jax.Array) -> jax.Array:
  """int32[N]: longest path from a source to each node (a fixed point of edge relaxation).

  An edge u -> v always has depth[u] < depth[v], so depth[a] <= depth[b] proves that a does
  not depend on b.
  """
  def body(state):
    depth, _ = state
    inputs = jnp.where(table >= 0, depth[jnp.maximum(table, 0)] + 1, 0)
    new = jnp.where(alive, inputs.max(-1), 0)
    return new, jnp.any(new != depth)
  depth0 = jnp.zeros(table.shape[0], jnp.int32)
  depth, _ = jax.lax.while_loop(lambda s: s[1], body, (depth0, jnp.asarray(True)))
  return depth


@dataclasses.dataclass(frozen=True)
class MatchResult:
  """Locations of one rule: valid bool[L], nodes int32[L, P] (-1 where invalid), found int32[]
  (valid candidates before truncation to L)."""
  valid: jax.Array
  nodes: jax.Array
  found: jax.Array


def compact_index(ok: jax.Array, size: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The first `size` valid candidates of G rules at once, in candidate order.

  Args:
    ok: bool[G, C] valid candidates.
  Returns:
    (index int32[G, size] of the valid candidates (0 past them), valid bool[G, size],
    found int32[G]: the valid candidates before truncation). Row g's index equals
    `jnp.nonzero(ok[g], size=size, fill_value=0)`; the rows are computed together, so a rule
    set compiles one compaction per candidate count C instead of one per rule (a sort would
    also do, but is slow on XLA:CPU under a batch of graphs: the environment's matcher took
    103 ms with one vs 66 ms with this, 64 BERT-base graphs, 2026-12-04).
  """
  found = ok.sum(-1).astype(jnp.int32)
  index = jax.vmap(lambda row: jnp.nonzero(row, size=size, fill_value=0)[0])(ok)
  valid = jnp.arange(size) < found[:, None]
  return index.astype(jnp.int32), valid, found


def compact(ok: jax.Array, nodes: jax.Array, size: int
            ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`compact_index` applied to the candidates' bound nodes: ok bool[G, C], nodes
  int32[G, C, P] -> (valid bool[G, size], nodes int32[G, size, P] (-1 where not valid),
  found int32[G])."""
  index, valid, found = compact_index(ok, size)
  picked = jnp.take_along_axis(nodes, index[:, :, None], axis=1)
  return valid, jnp.where(valid[:, :, None], picked, -1), found


def _paths(rule: Rule, root: int) -> dict[Ref, tuple[int, ...]]:
  """Shortest input-index path from a root to every element of its subtree."""
  out: dict[Ref, tuple[int, ...]] = {Ref("src", root): ()}
  frontier = [Ref("src", root)]
  while frontier:
    nxt = []
    for ref in frontier:
      for k, child in enumerate(rule.src[ref.index].inputs):
        if child not in out:
          out[child] = out[ref] + (k,)
          if child.kind == "src":
            nxt.append(child)
    frontier = nxt
  return out


class _RowRecorder(Mapping):
  """`MatchView` rows that record which (feature, slot) a constraint reads (zeros of the
  feature's row shape; under `jax.eval_shape` nothing runs)."""

  def __init__(self, specs: Mapping[str, jax.ShapeDtypeStruct]):
    self.specs, self.read = specs, set()

  def __getitem__(self, key: tuple[str, int]) -> jax.Array:
    self.read.add(key)
    spec = self.specs[key[0]]
    return jnp.zeros(spec.shape, spec.dtype)

  def __contains__(self, key: object) -> bool:
    return isinstance(key, tuple) and key[0] in self.specs

  def __iter__(self) -> Iterator[tuple[str, int]]:
    return iter(sorted(self.read))

  def __len__(self) -> int:
    return len(self.read)


class CompiledRule:
  """A rule compiled to `match(graph, features)` and `edit(graph, nodes)`."""

  def __init__(self, rule: Rule, max_locations: int = DEFAULT_MAX_LOCATIONS,
               join_window: int = DEFAULT_JOIN_WINDOW, max_anchors: int | None = None):
    self.rule = rule
    self.max_anchors = max_anchors
    self.max_locations = max_locations
    self.join_window = join_window
    self.roots = rule.roots()
    self.num_vars = len(rule.vars)
    self.uses = [sum(1 for s in rule.src for r in s.inputs if r == Ref("src", j))
                 for j in range(len(rule.src))]
    self.paths = [_paths(rule, r) for r in self.roots]
    reached = set().union(*[set(p) for p in self.paths])
    for i in range(len(rule.vars)):
      assert Ref("var", i) in reached, f"{rule.name}: variable {rule.vars[i].name} unreachable"
    self.join: list[tuple[int, tuple[int, ...]]] = []
    if len(self.roots) > 1:
      common = set(self.paths[0]).intersection(*self.paths[1:])
      assert common, f"{rule.name}: roots share no element to join on"
      shared = min(common, key=lambda ref: (max(len(p[ref]) for p in self.paths),
                                            ref.kind != "var", ref.index))
      self.join = [(int(rule.src[r].op), p[shared]) for r, p in zip(self.roots, self.paths)]
      if rule.symmetric:
        assert len(set(self.join)) == 1, f"{rule.name}: symmetric roots must join alike"
      else:
        assert len(self.roots) == 2, f"{rule.name}: 3 roots need symmetric=True"
    # Cycle safety: a variable the target reads must not depend on a root it does not feed.
    dst_reads = {r for d in rule.dst for r in d.inputs if r.kind == "var"}
    dst_reads |= {by for _, by in rule.replace if by.kind == "var"}
    self.depth_pairs = [(v.index, self.roots[i]) for v in sorted(dst_reads, key=lambda r: r.index)
                        for i, p in enumerate(self.paths)
                        if v not in p and not rule.vars[v.index].const]
    self.needs_depth = bool(self.depth_pairs) and len(self.roots) > 1
    self._reads: dict[Any, tuple[tuple[str, int], ...]] = {}

  # ------------------------------------------------------------------ matching
  def _candidates(self, f: Features) -> tuple[jax.Array, jax.Array]:
    """Root tuples int32[C, roots] and their validity bool[C] (C a multiple of the root op's
    `Features.anchor_count`)."""
    n, d = f.n, self.join_window
    if len(self.roots) == 1:
      ids, valid = f.anchors(int(self.rule.src[self.roots[0]].op))
      return ids[:, None], valid
    if self.rule.symmetric:
      # Valid keys sort first, so positions 0..C-1 of the sorted order cover every anchor.
      order, keys = f.sorted_keys(*self.join[0])
      i = jnp.arange(f.anchor_count(self.join[0][0]))
      if len(self.roots) == 2:
        offset_sets = [(a,) for a in range(1, d + 1)]
      elif len(self.roots) == 3:
        offset_sets = [(a, a + b) for a in range(1, d + 1) for b in range(1, d + 1)]
      else:  # 4 or more: only runs of consecutive equal keys (d^(r-1) windows would explode)
        offset_sets = [tuple(range(1, len(self.roots)))]
      cands, valid = [], []
      for offsets in offset_sets:
        pos = [i] + [i + o for o in offsets]
        ok = keys[i] < n
        for p in pos[1:]:
          ok = ok & (p < n) & (keys[jnp.minimum(p, n - 1)] == keys[i])
        cands.append(jnp.stack([order[jnp.minimum(p, n - 1)] for p in pos], -1))
        valid.append(ok)
      return jnp.concatenate(cands), jnp.concatenate(valid)
    anchor, anchor_ok = f.anchors(self.join[0][0])
    key0 = f.join_keys(*self.join[0])[anchor]
    order1, keys1 = f.sorted_keys(*self.join[1])
    start = jnp.searchsorted(keys1, key0, side="left").astype(jnp.int32)
    cands, valid = [], []
    for a in range(d):
      p = jnp.minimum(start + a, n - 1)
      ok = anchor_ok & (key0 < n) & (start + a < n) & (keys1[p] == key0)
      cands.append(jnp.stack([anchor, order1[p]], -1))
      valid.append(ok)
    return jnp.concatenate(cands), jnp.concatenate(valid)

  def _bind(self, f: Features, roots: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Binds every candidate at once: roots int32[C, roots] -> (ok bool[C], nodes int32[C, P]).

    Written over the candidate axis directly (each check is one gather or elementwise op on
    [C] arrays), not as a per-candidate function under `vmap`: batching thousands of scalar
    indexings would be most of the matcher's tracing time. Only the rule's own constraint,
    written for one match, is vmapped, over features gathered for all candidates beforehand.
    """
    rule, v = self.rule, self.num_vars
    c = roots.shape[0]
    bound: list[Any] = [None] * rule.num_bound
    ok = jnp.ones([c], bool)
    for i, r in enumerate(self.roots):
      bound[v + r] = roots[:, i]
    for j in reversed(range(len(rule.src))):
      s = rule.src[j]
      node = bound[v + j]
      assert node is not None, f"{rule.name}: src{j} unreachable from the roots"
      ok = (ok & take_rows(f.alive, node) & (take_rows(f.op, node) == int(s.op))
            & (take_rows(f.n_inputs, node) == len(s.inputs)))
      for k, ref in enumerate(s.inputs):
        child = (jnp.maximum(take_rows(f.columns[k], node), 0) if k < f.k
                 else jnp.zeros([c], jnp.int32))
        idx = ref.index if ref.kind == "var" else v + ref.index
        if bound[idx] is None:
          bound[idx] = child
        else:
          ok = ok & (bound[idx] == child)
    bound = [b.astype(jnp.int32) for b in bound]  # [P] arrays of [C]
    for a in range(len(rule.src)):
      for b in range(a + 1, len(rule.src)):
        ok = ok & (bound[v + a] != bound[v + b])
    removed = [v + j for j, s in enumerate(rule.src) if not s.keep]
    is_constant, is_output = f.graph.nodes["is_constant"], f.graph.nodes["is_output"]
    for i, var in enumerate(rule.vars):
      for j in removed:
        ok = ok & (bound[i] != bound[j])
      if var.const:
        ok = ok & take_rows(is_constant, bound[i])
    roots_set = set(self.roots)
    for j, s in enumerate(rule.src):
      if s.keep or j in roots_set:
        continue
      node = bound[v + j]
      ok = ok & (take_rows(f.consumers, node) == self.uses[j]) & ~take_rows(is_output, node)
    for root, by in rule.replace:
      if by.kind != "dst":  # replaced by an existing node: it cannot take a second output role
        idx = by.index if by.kind == "var" else v + by.index
        ok = ok & ~(take_rows(is_output, bound[v + root.index]) & take_rows(is_output, bound[idx]))
    ok = ok & (f.free >= len(rule.dst))
    if self.needs_depth:
      for var_i, root_j in self.depth_pairs:
        ok = ok & (take_rows(f.depth, bound[var_i]) < take_rows(f.depth, bound[v + root_j]))
    nodes = jnp.stack(bound, -1)  # [C, P]
    if rule.where is not None:
      # Gather for all candidates only the (feature, slot) rows the constraint reads: all
      # rows of all bound nodes cost more than the rest of a join rule's bind under a batch.
      rows = {key: f.rows_of(key[0], bound[key[1]])
              for key in self._where_reads(f.graph, nodes.shape[-1])}

      def where(bound_nodes, rows):
        view = MatchView(rule, f.graph, bound_nodes, rows=rows)
        return jnp.asarray(rule.where(view), bool)
      ok = ok & jax.vmap(where)(nodes, rows)
    return ok, nodes

  def _where_reads(self, graph: layout.Graph, p: int) -> tuple[tuple[str, int], ...]:
    """The (feature, slot) rows of `MatchView.ROW_FEATURES` the rule's constraint reads, found
    by tracing it once on abstract values (constraints cannot branch on values)."""
    node_specs = {name: jax.ShapeDtypeStruct(graph.nodes[name].shape[1:], graph.nodes[name].dtype)
                  for name in MatchView.ROW_FEATURES}
    key = tuple((name, s.shape, str(s.dtype)) for name, s in node_specs.items()) + (p,)
    if key not in self._reads:
      recorder = _RowRecorder(node_specs)
      graph_spec = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), graph)
      jax.eval_shape(lambda g, b: self.rule.where(MatchView(self.rule, g, b, rows=recorder)),
                     graph_spec, jax.ShapeDtypeStruct((p,), jnp.int32))
      self._reads[key] = tuple(recorder)
    return self._reads[key]

  def bind_all(self, f: Features) -> tuple[jax.Array, jax.Array]:
    """Every candidate of this rule, before compaction: (ok bool[C], nodes int32[C, P])."""
    cands, cvalid = self._candidates(f)
    ok, nodes = self._bind(f, cands)
    return ok & cvalid, nodes

  def match(self, graph: layout.Graph, f: Features | None = None) -> MatchResult:
    """All locations of this rule in `graph` (jittable; vmap over a batch of graphs)."""
    f = f or Features(graph, self.needs_depth, self.max_anchors)
    ok, nodes = self.bind_all(f)
    valid, nodes, found = compact(ok[None], nodes[None], self.max_locations)
    return MatchResult(valid[0], nodes[0], found[0])

  # ------------------------------------------------------------------ editing
  def plan(self, graph: layout.Graph, nodes: jax.Array, m: int, q: int,
           fr: int, rows: dict[str, jax.Array] | None = None) -> edit_lib.Edit:
    """The edit for one location (`nodes` int32[P] from `match`), padded to (m, q, fr), with
    shapes, dtypes and constness of the new nodes left for `edit_lib.complete` to fill in.

    Attribute functions see the matched (source) elements only, so this part is small: under
    `lax.switch` every rule compiles one of these, while the shape rules compile once.
    `rows`: the bound nodes' features, gathered beforehand (`MatchView`; `bound_rows`).
    """
    rule = self.rule
    k = layout.input_table(graph).shape[-1]
    n = graph.nodes["op"].shape[-1]
    nodes = jnp.maximum(nodes, 0)
    view = MatchView(rule, graph, nodes, rows=None if rows is None else by_slot(rows))
    rows = []
    for d in rule.dst:
      kinds = np.zeros([k], np.int32)
      refs: list[Any] = [np.int32(0)] * k
      for i, ref in enumerate(d.inputs):
        if ref.kind == "dst":
          kinds[i], refs[i] = edit_lib.NEW, np.int32(ref.index)
        else:
          kinds[i], refs[i] = edit_lib.EXISTING, view.node(ref)
      base = view.attrs(d.like) if d.like is not None else None
      values = {name: (fn(view) if callable(fn) else fn) for name, fn in d.attrs}
      rows.append((int(d.op), encode_attrs_jit(d.op, base, values), kinds, _stack(refs, np.int32)))
    red_old, red_kind, red_ref = [], [], []
    for root, by in rule.replace:
      red_old.append(view.node(root))
      if by.kind == "dst":
        red_kind.append(edit_lib.NEW)
        red_ref.append(np.int32(by.index))
      else:
        red_kind.append(edit_lib.EXISTING)
        red_ref.append(view.node(by))
    free = [view.node(Ref("src", j)) for j, s in enumerate(rule.src) if not s.keep]

    def pad(values, size, fill, dtype):
      return _stack(list(values) + [fill] * (size - len(values)), dtype)

    nd = len(rule.dst)
    # What the rule fixes (op codes, input kinds, padding) stays numpy: constants, not traced ops.
    return edit_lib.Edit(
        new_valid=np.arange(m) < nd,
        new_op=pad([r[0] for r in rows], m, 0, np.int32),
        new_attrs=pad([r[1] for r in rows], m, np.zeros([ops.ATTR_WIDTH]), np.int32),
        new_shape=np.ones([m, R], np.int32),
        new_rank=np.zeros([m], np.int32),
        new_dtype=np.zeros([m], np.int32),
        new_const=np.zeros([m], bool),
        in_kind=pad([r[2] for r in rows], m, np.zeros([k]), np.int32),
        in_ref=pad([r[3] for r in rows], m, np.zeros([k]), np.int32),
        red_old=pad(red_old, q, n, np.int32),
        red_kind=pad(red_kind, q, 0, np.int32),
        red_ref=pad(red_ref, q, 0, np.int32),
        free=pad(free, fr, n, np.int32),
        ok=np.asarray(True))

  def edit(self, graph: layout.Graph, nodes: jax.Array, m: int, q: int, fr: int) -> edit_lib.Edit:
    """The complete edit for one location (shapes from the shape rules)."""
    return edit_lib.complete(graph, self.plan(graph, nodes, m, q, fr))

  def apply(self, graph: layout.Graph, nodes: jax.Array) -> tuple[layout.Graph, jax.Array]:
    """Applies this rule at one location; returns (graph, applied)."""
    e = self.edit(graph, nodes, max(len(self.rule.dst), 1), max(len(self.rule.replace), 1),
                  max(len(self.rule.src), 1))
    return edit_lib.apply_edit(graph, e)

