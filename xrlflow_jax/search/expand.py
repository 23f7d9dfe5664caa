"""Vectorised expansion: every valid (rule, location) candidate of a graph built and costed in one
jitted call over a compacted bucket, and the host helpers every driver shares (graph checks,
steps, replay)."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import concurrent.futures
import contextvars
import dataclasses
import functools
import itertools
import threading
import time

import chex
import jax
import jax.numpy as jnp
import numpy as np

from xrlflow_jax import trace_cache, xla_options
from xrlflow_jax.cost import incremental
from xrlflow_jax.cost.kernel_table import KernelTimes
from xrlflow_jax.cost import model as cost_model
from xrlflow_jax.graph import host as graph_host
from xrlflow_jax.graph import identity
from xrlflow_jax.graph import layout
from xrlflow_jax.rules.ruleset import RuleSet, RuleSetMatch
from xrlflow_jax.search.cache import IdentityCache
from xrlflow_jax.search.result import RewriteStep, SearchError


@chex.dataclass(frozen=True)
class Expansion:
  """Every one-step candidate of one graph (A = R * L, action = rule * L + location).

  Attributes:
    valid: bool[A], the candidate exists and its rewrite applies.
    cost: float32[A], its modelled cost in ms (+inf where not valid).
    nodes: int32[R, L, P], the bound nodes of every location (as `RuleSet.match`).
    current: float32[], the modelled cost of the graph itself.
  """
  valid: jax.Array
  cost: jax.Array
  nodes: jax.Array
  current: jax.Array


@dataclasses.dataclass(frozen=True)
class Children:
  """The candidates of one expansion, costed and hashed by the call that built them, kept
  unbuilt: `child(i)` rebuilds candidate `i` from its parent on demand (one small jitted call,
  the same edit the bucket applied), so a search pays host work only for the children it pops,
  not for the hundreds it pushes.

  Attributes:
    actions: int32[C], the flat actions of the C matched candidates, in bucket order.
    ok: bool[C], the rewrite applied (shape rules, capacity, no cycle).
    nodes: int32[C, P], each candidate's bound nodes (`RuleSet.match`).
    hashes: list[int] (length C), their graph hashes (`identity.graph_hash`).
    parent: the expanded graph (host arrays, capacity N); parent_ids: uint32[N, 2], its node
      identities.
    build: (parent, parent_ids, rule, nodes) -> (child graph, its identities uint32[N, 2]).
    num_locations: L (action = rule * L + location).
  """
  actions: np.ndarray
  ok: np.ndarray
  nodes: np.ndarray
  hashes: list[int]
  parent: layout.Graph
  parent_ids: np.ndarray
  build: Callable[..., tuple[layout.Graph, np.ndarray]]
  num_locations: int
  position: dict[int, int] = dataclasses.field(init=False, repr=False)

  def __post_init__(self):
    object.__setattr__(self, "position",
                       {int(a): i for i, a in enumerate(self.actions.tolist())})

  def index(self, action: int) -> int:
    """The bucket position of flat `action` (ValueError if it was not a candidate)."""
    i = self.position.get(int(action))
    if i is None:
      raise ValueError(f"action {action} is not a candidate of this expansion")
    return i

  def child(self, i: int) -> tuple[layout.Graph, np.ndarray]:
    """Candidate `i` (bucket position): (unbatched host graph, its node identities)."""
    rule = int(self.actions[i]) // self.num_locations
    return self.build(self.parent, self.parent_ids, rule, self.nodes[i])

  def graph(self, i: int) -> layout.Graph:
    """Candidate `i` as an unbatched host graph."""
    return self.child(i)[0]

  def fresh(self, action: int, seen: set) -> int | None:
    """The bucket position of candidate `action` when its edit applied and its identity hash
    is not in `seen` (then added), else None."""
    i = self.index(action)
    if not self.ok[i] or self.hashes[i] in seen:
      return None
    seen.add(self.hashes[i])
    return i


# Background compiles of `Expander.prepare`: two threads (one traces while XLA compiles in the
# other, which releases Python's lock).
_BACKGROUND = concurrent.futures.ThreadPoolExecutor(max_workers=2,
                                                    thread_name_prefix="xrlflow-compile")

# A graph is better only if cheaper by this relative margin: candidates costed inside one jitted
# call and graphs costed alone differ by float rounding, and noise is not a gain.
MIN_GAIN = 1e-6
# Candidates are compacted into buckets of this size x (1, 1.5, 2, 3, 4, ...) (64, 96, 128,
# 192, ...): a few compiled shapes serve every graph of a capacity, and a bucket wastes
# under a third of its slots (powers of two alone wasted up to half: BERT-base's 173 candidates
# filled 256 slots).
MIN_BUCKET = 64
# Most candidates a bucket builds and costs at once (a larger bucket runs as a `lax.map` over
# equal chunks, `bucket_chunk`): per candidate the work is a few full-capacity arrays, and a
# whole bucket of them at once outgrows the caches. Measured in one process, interleaved
# (2-core x86_64, XLA:CPU, 2026-12-04): BERT-base's 256-slot bucket 52.2 ms as one vmap, 32.1
# in chunks of 64, 29.7 of 128; its 192-slot bucket 39.8 as one vmap, 26.3 in chunks of 64,
# 23.8 of 96, 40.6 as 128 + 64 (`lax.map`'s partial last chunk is slow); NasRNN's 384-slot
# bucket 49.7, 38.1 (64), 33.2 (128).
BUCKET_CHUNK = 128
# XLA:CPU options of a short search's functions (`Expander.plan`). Its classic emitters compile
# the search's matcher and bucket a third faster, and the code runs 10-30% slower (compiled
# both ways in one process, timed interleaved with a copy; 2-core x86_64, 2026-12-05): tiny
# SqueezeNet's matcher 8.4 -> 5.4 s and bucket (64) 9.5 -> 7.1 s of compile, 0.56 -> 0.65 and
# 6.4 -> 7.1 ms a call; BERT-base's matcher 8.6 -> 5.8 s and bucket (256) 17.3 -> 13.9 s,
# 1.3 -> 1.9 and 26.6 -> 31.8 ms; NasRNN's bucket (384) 14.0 -> 11.4 s, 30.4 -> 37.3 ms. Outputs
# identical. A search of a few hundred expansions gains more compile time than it loses.
FAST_COMPILE_OPTIONS = {"xla_cpu_use_fusion_emitters": False}
# Searches expected to expand at most this many graphs compile with FAST_COMPILE_OPTIONS: up to
# 500 x 7 ms = 3.5 s slower on BERT-base when every function is already compiled, tens of
# seconds faster when they are not. Measured (2026-12-05, 2-core x86_64, XLA:CPU, ResNeXt-50
# ONNX, random search of 16 x 20 = 320 expansions, no persistent cache, alternating runs): 52.5
# and 49.3 s (compile 45.9, 43.7) with these options against 77.5 and 80.0 s (72.1, 75.2) with
# XLA's defaults, the same result; the rest of the search 5.6-6.6 s against 4.8-5.4 s. The
# limit covers the benchmark's random search (320): below it, that search would compile every
# function a second time, with XLA's defaults, after the other methods had compiled them fast.
FAST_COMPILE_MAX_EXPANSIONS = 500


@dataclasses.dataclass(frozen=True)
class _Compiled:
  """The search's jitted functions under one set of XLA options (a tier)."""
  bucket: trace_cache.PersistentJit
  apply_at: trace_cache.PersistentJit
  match: trace_cache.PersistentJit
  identities: trace_cache.PersistentJit
  graph_hash: trace_cache.PersistentJit


@dataclasses.dataclass
class ExpanderStats:
  """What an Expander did since it was built (or `reset`).

  Attributes:
    candidates: valid (rule, location) pairs of each expansion, in order.
    buckets: the bucket sizes used (each compiled once per capacity).
    compile_seconds: wall time of each instance's first call (trace or load from the trace
      cache, compile or load from the persistent compilation cache, or wait for `prepare`'s
      compile, plus one run) and of waits for the background compiles (`drain`).
    recosted: candidates whose rewrite changed more slots than the incremental cost covers
      (`cost.incremental.MAX_CHANGED`), costed again alone with the full model.
    rehashed: candidates whose rewrite changed more rows than the incremental graph hash
      covers (`graph.identity.MAX_CHANGED_ROWS`), hashed again alone.
    kernels_added: kernel signatures added to the measured kernel table (from the profiler's
      cache or measured now); kernel_seconds: the time that took.
    kernel_recosted: candidates with kernels new to the table: measured, then their bucket
      was costed again.
  """
  candidates: list[int] = dataclasses.field(default_factory=list)
  buckets: set[int] = dataclasses.field(default_factory=set)
  compile_seconds: float = 0.0
  recosted: int = 0
  rehashed: int = 0
  kernels_added: int = 0
  kernel_seconds: float = 0.0
  kernel_recosted: int = 0

  def reset(self) -> None:
    self.candidates.clear()
    self.buckets.clear()
    self.compile_seconds = 0.0
    self.recosted = 0
    self.rehashed = 0
    self.kernels_added = 0
    self.kernel_seconds = 0.0
    self.kernel_recosted = 0


def improves(cost: float, reference: float) -> bool:
  """cost < reference by more than float noise (relative MIN_GAIN)."""
  return float(cost) < float(reference) * (1.0 - MIN_GAIN)


def _ladder() -> Iterator[int]:
  """The bucket sizes MIN_BUCKET x (1, 1.5, 2, 3, 4, 6, ...), ascending, without end."""
  for k in itertools.count():
    yield (MIN_BUCKET << (k // 2)) * (3 if k % 2 else 2) // 2


def bucket_size(count: int, num_actions: int) -> int:
  """The bucket for `count` candidates: the smallest of MIN_BUCKET x (1, 1.5, 2, 3, 4, 6, ...)
  >= count, at most `num_actions` (A)."""
  size = next(s for s in _ladder() if s >= count)
  return max(1, min(size, num_actions))


def bucket_chunk(size: int) -> int:
  """The chunk a bucket of `size` slots runs in: its largest divisor up to BUCKET_CHUNK (equal
  chunks: 192 in two of 96), or `size` (one vmap) when that divisor is under a quarter of
  BUCKET_CHUNK (a bucket capped at an odd number of actions)."""
  best = max(d for d in range(1, BUCKET_CHUNK + 1) if size % d == 0)
  return best if 4 * best >= BUCKET_CHUNK else size


class Expander:
  """Costs and hashes every candidate of a graph in one compiled call per expansion.

  An expansion matches every rule (`RuleSet.match`, one jitted call), counts the valid
  (rule, location) pairs on the host, and hands them, compacted into a bucket of
  `bucket_size(count)` slots, to one jitted call that builds each candidate's edit (every
  rule's small plan at its L locations, `RuleSet.plans`, gathered for the bucket), completes
  it with the shared shape rules, applies it with the shared edit kernel, and costs the result
  (a bucket larger than `BUCKET_CHUNK` in equal chunks, one after the other: `bucket_chunk`).
  The expensive parts never run on an empty (rule, location) slot. From capacity
  `cost.incremental.MIN_CAPACITY` up, each candidate is costed incrementally from the parent
  (FLOPs and distinct constants only where the rewrite changed slots; a candidate that changed
  more slots than that covers is costed again alone with the full model); below it, by the
  full model, pruned (exact on `apply_edit` outputs). Either way every cost equals
  `graph_cost` of the child.

  Each jitted function has one instance per graph capacity (N, K) and bucket size, so a search
  compiles a few (`trace_counts` counts them); they are `trace_cache.PersistentJit`s, so a
  later process loads what this one traced instead of tracing it again. A short search
  compiles them for a fast compile instead of the fastest code (`plan`: a separate set of
  instances, the same outputs) and compiles one bucket, beside the match (`prepare`): an
  expansion whose bucket is not compiled yet runs a smaller one on consecutive windows of the
  candidates (`bucket_plan`).

  With `kernels`, MatMuls and convolutions cost their measured time (`cost.kernel_table`): an
  expanded or costed graph with a kernel the table does not have (the jitted cost says so) has
  it measured and is costed again, and so is a candidate with one, so every cost is the
  measured model's; a graph whose kernels are all known costs no host work for it.

  Args:
    ruleset: the rules (R rules, L locations, P bound slots).
    coeffs: cost-model coefficients (`cost.load_coefficients()`).
    kernels: measured kernel times (None: the model's roofline for every kernel).
  """

  def __init__(self, ruleset: RuleSet, coeffs: cost_model.CostCoefficients,
               kernels: KernelTimes | None = None):
    self.ruleset = ruleset
    self._names = tuple(ruleset.names)
    self.coeffs = coeffs
    self.kernels = kernels
    self._tiers = {False: self._compiled(None), True: self._compiled(FAST_COMPILE_OPTIONS)}
    self.fast_compile = False  # the tier in use (`plan`)
    self.stats = ExpanderStats()
    self._pending: list[concurrent.futures.Future] = []
    self._pending_lock = threading.Lock()
    self._available: dict[tuple[bool, int, bool, int], bool] = {}  # `_bucket_available`

  def _compiled(self, options: dict[str, Any] | None) -> _Compiled:
    closure = (self.ruleset, self.coeffs)  # what the traced bodies close over (the disk key)
    jit = functools.partial(trace_cache.PersistentJit, compiler_options=options)
    return _Compiled(
        bucket=jit(self._bucket_impl, "search.bucket", closure, static_argnames=("size",)),
        apply_at=jit(self._apply_at_impl, "search.apply_at", closure),
        match=jit(self._match_impl, "search.match", closure),
        identities=jit(self._identities_impl, "search.identities"),
        graph_hash=jit(identity.graph_hash, "search.graph_hash"))

  def plan(self, expansions: int | None = None, *, fast_compile: bool | None = None) -> bool:
    """Chooses how the next calls compile (before `prepare`): for a fast compile
    (`FAST_COMPILE_OPTIONS`) when `fast_compile`, or, when that is None, when the search is
    expected to expand at most `FAST_COMPILE_MAX_EXPANSIONS` graphs; otherwise with XLA's
    defaults (fastest code). Only on XLA:CPU (elsewhere, and on an XLA that refuses the
    options, always XLA's defaults). Every tier computes the same outputs. Returns the choice."""
    if fast_compile is None:
      fast_compile = expansions is not None and expansions <= FAST_COMPILE_MAX_EXPANSIONS
    self.fast_compile = bool(fast_compile) and xla_options.for_cpu(FAST_COMPILE_OPTIONS) is not None
    self._available.clear()
    return self.fast_compile

  @property
  def _fn(self) -> _Compiled:
    """The jitted functions of the tier in use."""
    return self._tiers[self.fast_compile]

  def prepare(self, graph: layout.Graph) -> None:
    """Starts compiling, in background threads, the functions every search of `graph`'s
    capacity needs: one thread traces them, in the order a search needs them (the input's
    identities and hash, the match, for a short search (`plan`) the one bucket its
    expansions run, on the match's output shapes (`bucket_plan`), the child rebuild), and hands each
    compile to the second thread (XLA compiles without holding Python's lock), so the bucket
    compiles beside the match instead of after it. Calls wait for what they need; a kernel
    timing and the end of the search (`guard.finish`) wait for all of it (nothing compiles
    beside a timing). A graph the drivers would refuse is left to them."""
    try:
      graph = check_graph(graph, self.ruleset)
    except SearchError:
      return
    n = layout.capacity(graph)
    ids = jax.ShapeDtypeStruct((n, identity.LANES), jnp.uint32)
    scalar = jax.ShapeDtypeStruct((), jnp.int32)
    nodes = jax.ShapeDtypeStruct((self.ruleset.num_bound,), jnp.int32)
    table = self._kernel_table()
    fn = self._fn
    one_bucket = bucket_size(1, self.num_actions) if self.fast_compile else None
    context = contextvars.copy_context()  # this thread's context (precision scope)

    def pipeline() -> None:  # traces here; each compile goes to the other thread, in order
      compile_in = lambda f, *args, **static: self._add_pending(
          f.compile_in(_BACKGROUND, *args, **static))
      compile_in(fn.identities, graph)  # needed first, and compiled in a fraction of a second
      compile_in(fn.graph_hash, graph, ids)
      match = fn.match.output_shapes(graph, table)[0]
      compile_in(fn.match, graph, table)
      if one_bucket is not None:
        compile_in(fn.bucket, graph, ids, match, table, size=one_bucket)
      compile_in(fn.apply_at, graph, ids, scalar, nodes)

    self._add_pending(_BACKGROUND.submit(context.run, pipeline))

  def _add_pending(self, future: concurrent.futures.Future | None) -> None:
    if future is not None:
      with self._pending_lock:
        self._pending.append(future)

  def drain(self) -> None:
    """Waits for the background compiles `prepare` started, and those they started (their
    errors are left to the calls that need them); the wait is charged to
    `stats.compile_seconds`."""
    t = time.perf_counter()
    while True:
      with self._pending_lock:
        pending, self._pending = self._pending, []
      if not pending:
        break
      concurrent.futures.wait(pending)
    self.stats.compile_seconds += time.perf_counter() - t

  def bucket_plan(self, count: int, available: Callable[[int], bool] | None = None) -> int:
    """The bucket size for `count` valid candidates: `bucket_size(count)` (the bucket's call
    loops over ceil(count / size) windows of its size, one for this size).

    A search compiled for a fast compile (`plan`) compiles no bucket beyond the one `prepare`
    compiles beside the match (`bucket_size(1)` slots; each size is a compile of 20-30 s on a
    2-core CPU, and a short search gains far less from it): it runs `bucket_size(count)` only
    where `available(size)` says that bucket is compiled in this process or traced by an
    earlier one, and otherwise the largest available smaller bucket, or `prepare`'s, on
    consecutive windows of the candidates."""
    size = bucket_size(count, self.num_actions)
    small = bucket_size(1, self.num_actions)
    if not self.fast_compile or size == small:
      return size
    between = [s for s in itertools.takewhile(lambda s: s < size, _ladder()) if s > small]
    for s in [size, *reversed(between)]:
      if available is not None and available(s):
        return s
    return small

  @property
  def trace_counts(self) -> dict[str, int]:
    """Compiled instances of each jitted function: traced in this process, or loaded from the
    trace cache (`trace_cache`); one per capacity (and bucket size) is the goal."""
    tiers = self._tiers.values()
    return {name: sum(getattr(t, attr).instances for t in tiers)
            for name, attr in (("costs", "bucket"), ("apply_at", "apply_at"), ("match", "match"),
                               ("identities", "identities"), ("graph_hash", "graph_hash"))}

  def _first_calls(self) -> int:
    return sum(getattr(t, f.name).first_calls for t in self._tiers.values()
               for f in dataclasses.fields(_Compiled))

  def _call(self, fn, *args, **kwargs):
    """Calls a jitted function; an instance's first call (traced, or loaded from the trace
    cache, here or by `prepare` in the background) is charged to `stats.compile_seconds`
    (that, then compiling or loading from the persistent compilation cache, or waiting for
    `prepare`'s compile, and one run)."""
    before = self._first_calls()
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    if self._first_calls() != before:
      jax.block_until_ready(out)
      self.stats.compile_seconds += time.perf_counter() - t
    return out

  # ------------------------------------------------------------------ properties
  @property
  def num_rules(self) -> int:
    return len(self.ruleset)

  @property
  def max_locations(self) -> int:
    return self.ruleset.max_locations

  @property
  def num_actions(self) -> int:
    """A = R * L."""
    return self.ruleset.num_actions

  # ------------------------------------------------------------------ traced bodies
  def _match_impl(self, graph: layout.Graph, table: cost_model.KernelTable | None
                  ) -> tuple[RuleSetMatch, jax.Array, jax.Array, jax.Array]:
    match = self.ruleset.match(graph)
    current, missing = cost_model.graph_cost_and_misses(graph, self.coeffs, kernels=table)
    return match, match.mask.sum().astype(jnp.int32), current.astype(jnp.float32), missing

  def _identities_impl(self, graph: layout.Graph) -> jax.Array:
    return identity.identities(graph)

  def _bucket_impl(self, graph: layout.Graph, ids: jax.Array, match: RuleSetMatch,
                   table: cost_model.KernelTable | None, size: int):
    """Builds and costs every valid (rule, location) pair of `match`, `size` at a time: C valid
    pairs run as ceil(C / size) consecutive windows in a loop, so one compiled bucket serves any
    C, and what every window shares (each rule's plans at every location, the parent's cost
    base and row hashes) is computed once. Per-slot outputs have A + size rows, slot i being
    the i-th valid pair (rows from C on are unused)."""
    rs = self.ruleset
    n = layout.capacity(graph)
    a = rs.num_actions
    every, count = rs.valid_actions(match.mask, pad=size)  # [A + size]: a window fits anywhere
    # Each rule's plan vmapped over its locations, then gathered per window, not a
    # `lax.switch` over the rules under a vmap: that would run every rule's plan for every slot.
    all_plans = rs.plans(graph, match.nodes)  # leaves [A, ...]
    incremental_cost = n >= incremental.MIN_CAPACITY
    base = incremental.cost_base(graph, self.coeffs, table) if incremental_cost else None
    parent_rows = identity.row_hashes(graph, ids)

    def one(candidate):
      plan, keep = candidate
      new, applied = rs.build(graph, plan, keep)
      if incremental_cost:
        cost, exact, missing = incremental.candidate_cost(graph, base, new, self.coeffs,
                                                          kernels=table)
      else:
        cost, missing = cost_model.graph_cost_and_misses(new, self.coeffs, pruned=True,
                                                         kernels=table)
        exact = jnp.asarray(True)
      child_ids = identity.child_identities(graph, ids, new, rs.max_new)
      h, hashed = identity.child_graph_hash(graph, parent_rows, new, child_ids)
      return cost, exact & ~missing, h, hashed, missing, applied  # applied: keep too

    chunk = bucket_chunk(size)

    def window(k, carry):
      valid, cost, per_slot = carry
      first = k * size
      idx = jax.lax.dynamic_slice(every, (first,), (size,))
      used = first + jnp.arange(size) < count
      plans = jax.tree_util.tree_map(lambda x: x[idx], all_plans)
      if chunk == size:  # one vmap: a window of at most BUCKET_CHUNK slots is a single chunk
        c, exact, hashes, hashed, missing, ok = jax.vmap(one)((plans, used))
      else:
        c, exact, hashes, hashed, missing, ok = jax.lax.map(one, (plans, used),
                                                            batch_size=chunk)
      slot = jnp.where(ok, idx, a)  # unused or refused slots scatter nowhere
      valid = valid.at[slot].set(ok, mode="drop")
      cost = cost.at[slot].set(jnp.where(ok, c.astype(jnp.float32), jnp.inf), mode="drop")
      rows = (idx, ok, exact | ~ok, hashes, hashed | ~ok, missing & ok)
      per_slot = tuple(jax.lax.dynamic_update_slice_in_dim(whole, part.astype(whole.dtype),
                                                           first, axis=0)
                       for whole, part in zip(per_slot, rows))
      return valid, cost, per_slot

    def rows_like(shape, dtype):
      return jnp.zeros((a + size, *shape), dtype)
    per_slot = (rows_like((), jnp.int32), rows_like((), bool), rows_like((), bool),
                rows_like((identity.LANES,), jnp.uint32), rows_like((), bool),
                rows_like((), bool))
    windows = (count + size - 1) // size
    valid, cost, per_slot = jax.lax.fori_loop(
        0, windows, window,
        (jnp.zeros([a], bool), jnp.full([a], jnp.inf, jnp.float32), per_slot))
    return (valid, cost, *per_slot)

  def _apply_at_impl(self, graph: layout.Graph, ids: jax.Array, rule: jax.Array,
                     nodes: jax.Array) -> tuple[layout.Graph, jax.Array, jax.Array]:
    """(child, applied, child identities): one compiled edit serves `apply_at`, replays and
    the children a search rebuilds (`Children.child`)."""
    child, ok = self.ruleset.apply(graph, rule, nodes)
    return child, ok, identity.child_identities(graph, ids, child, self.ruleset.max_new)

  def _build_child(self, parent: layout.Graph, parent_ids: np.ndarray, rule: int,
                   nodes: np.ndarray) -> tuple[layout.Graph, np.ndarray]:
    """`Children.build`: a candidate rebuilt on the host from its parent."""
    child, _, ids = self._call(self._fn.apply_at, parent, parent_ids, np.int32(rule), nodes)
    return layout.to_host(child), np.asarray(ids)

  # ------------------------------------------------------------------ public
  def costs(self, graph: layout.Graph) -> Expansion:
    """Every candidate of `graph` (capacity N): valid bool[A], cost float32[A] (+inf where
    invalid), nodes int32[R, L, P], and the graph's own cost float32[]. No de-duplication:
    the input graph's identities (a depth-long loop) are not computed."""
    n = layout.capacity(graph)
    return self.expand(graph, np.zeros([n, identity.LANES], np.uint32))[0]

  def identities(self, graph: layout.Graph) -> np.ndarray:
    """uint32[N, 2]: the node identities of a search's input graph (`graph.identity`)."""
    return np.asarray(self._call(self._fn.identities, graph))

  def graph_hash(self, graph: layout.Graph, ids: Any) -> int:
    """The identity hash of `graph` with node identities `ids` (an int, for `seen` sets)."""
    return identity.as_ints(np.asarray(self._call(self._fn.graph_hash, graph, ids))[None])[0]

  def expand(self, graph: layout.Graph,
             ids: Any | None = None) -> tuple[Expansion, Children]:
    """Every candidate of `graph`, costed and hashed: (Expansion, Children).

    Two jitted calls: the match (with the graph's own cost and the number C of valid
    (rule, location) pairs), then one call over a bucket of `bucket_size(C)` slots (in a short
    search whose bucket of that size is not compiled, a compiled bucket of B slots over ceil(C /
    B) windows, `bucket_plan`).

    Args:
      graph: one graph of capacity N.
      ids: its node identities uint32[N, 2] (`identities` for a search's input graph, then
        the `Children.ids` of the expansion that built it); default: computed.
    """
    if ids is None:
      ids = self._call(self._fn.identities, graph)
    table = self._kernel_table()
    match, count, current, missing = self._call(self._fn.match, graph, table)
    if bool(missing):  # a kernel the table does not have: measured, then matched again (the
      # graph's cost from the same call a warm expansion makes, so it rounds the same)
      table = self._measure_kernels(graph)
      match, count, current, missing = self._call(self._fn.match, graph, table)
    count = int(count)
    size = self.bucket_plan(count, lambda s: self._bucket_available(graph, ids, match, table,
                                                                   s))
    valid, cost, idx, ok, exact, hashes, hashed, missing = self._buckets(
        graph, ids, match, table, size)
    misses = np.flatnonzero(np.asarray(missing)[:count])
    if misses.size:
      # Children with kernels the table does not have: measured, then the whole bucket costed
      # again with the grown table. Every cost then comes from the computation a later
      # (warm) expansion of this graph runs, so a search takes the same path whether or not
      # its kernels were new (costing them alone differs in float rounding, which reorders
      # the queue between equal-cost candidates).
      actions = np.asarray(idx)[misses]
      nodes = np.asarray(match.nodes).reshape(self.num_actions, -1)[actions]
      parent, parent_ids = layout.to_host(graph), np.asarray(ids)
      for a, bound in zip(actions, nodes):
        child, _ = self._build_child(parent, parent_ids, int(a) // self.max_locations, bound)
        table = self._measure_kernels(child)
      valid, cost, idx, ok, exact, hashes, hashed, missing = self._buckets(
          graph, ids, match, table, size)
      self.stats.kernel_recosted += int(misses.size)
    self.stats.candidates.append(count)
    self.stats.buckets.add(size)
    actions = np.asarray(idx)[:count]
    children = Children(actions=actions, ok=np.asarray(ok)[:count],
                        nodes=np.asarray(match.nodes).reshape(self.num_actions, -1)[actions],
                        hashes=identity.as_ints(np.asarray(hashes)[:count]),
                        parent=layout.to_host(graph), parent_ids=np.asarray(ids),
                        build=self._build_child, num_locations=self.max_locations)
    for i in np.flatnonzero(~np.asarray(hashed)[:count]):  # too many changed rows
      children.hashes[i] = self.graph_hash(*children.child(int(i)))
      self.stats.rehashed += 1
    inexact = np.flatnonzero(~np.asarray(exact)[:count])
    if inexact.size:  # too many changed slots (or a kernel still missing): costed alone
      cost = np.array(cost)
      for i in inexact:
        cost[children.actions[i]] = self.cost(children.graph(int(i)))
      self.stats.recosted += int(inexact.size)
      cost = jnp.asarray(cost)
    exp = Expansion(valid=valid, cost=cost, nodes=match.nodes, current=current)
    return exp, children

  def _bucket_available(self, graph: layout.Graph, ids: Any, match: RuleSetMatch,
                        table: cost_model.KernelTable | None, size: int) -> bool:
    """Whether the bucket of `size` slots for these arguments is cheap to have
    (`trace_cache.PersistentJit.available`), remembered per tier, capacity and size until the
    next `plan`."""
    key = (self.fast_compile, layout.capacity(graph), table is None, size)
    if key not in self._available:
      self._available[key] = self._fn.bucket.available(graph, ids, match, table, size=size)
    return self._available[key]

  def _buckets(self, graph: layout.Graph, ids: Any, match: RuleSetMatch,
               table: cost_model.KernelTable | None, size: int) -> tuple[Any, ...]:
    """The bucket's outputs (`_bucket_impl`): valid and cost over every action, and the
    per-slot outputs of the valid candidates in order."""
    return self._call(self._fn.bucket, graph, ids, match, table, size=size)

  def apply(self, graph: layout.Graph, action: int) -> layout.Graph:
    """The graph after flat action `action` (rule * L + location of `RuleSet.match(graph)`).

    Matches (jitted `RuleSet.match`), then applies with the same compiled kernel as `apply_at`.
    An invalid action returns the graph unchanged.
    """
    mask, nodes = self.match(graph)
    r, loc = divmod(int(action), self.max_locations)
    if not (0 <= r < self.num_rules and mask[r, loc]):
      return graph
    return self.apply_at(graph, r, nodes[r, loc])[0]

  def apply_at(self, graph: layout.Graph, rule: int, nodes: Any) -> tuple[layout.Graph, bool]:
    """Applies rule index `rule` at bound `nodes` (int32[P], from `Expansion.nodes[r, l]`).

    Returns (graph, applied: bool); unchanged when it does not apply.
    """
    nodes = np.asarray(nodes, np.int32)
    p = self.ruleset.num_bound
    if nodes.shape[0] < p:
      nodes = np.concatenate([nodes, np.full([p - nodes.shape[0]], -1, np.int32)])
    no_ids = np.zeros([layout.capacity(graph), identity.LANES], np.uint32)
    new, ok, _ = self._call(self._fn.apply_at, graph, no_ids, np.int32(rule), nodes)
    return new, bool(ok)

  def cost(self, graph: layout.Graph) -> float:
    """Modelled cost of `graph` in ms (float); with `kernels`, a kernel the table does not
    have is measured first. From the match call, which costs its graph too (the cost an
    expansion of `graph` reports as `current`): no function compiles for costing alone (a
    separate one cost a cold job ~5 s of XLA's time for the few graphs a search costs alone:
    checkpoints, seeds, a child the incremental cost cannot cover)."""
    _, _, cost, missing = self._call(self._fn.match, graph, self._kernel_table())
    if bool(missing):
      _, _, cost, _ = self._call(self._fn.match, graph, self._measure_kernels(graph))
    return float(cost)

  def _kernel_table(self) -> cost_model.KernelTable | None:
    """The measured kernel table as it is (None without one)."""
    return self.kernels.table() if self.kernels is not None else None

  def _measure_kernels(self, graph: layout.Graph) -> cost_model.KernelTable:
    """Adds every kernel of `graph` to the table (measured now or from the profiler's cache);
    returns the table."""
    if self.kernels.needs_timing(graph):
      self.drain()  # kernels are timed on a machine that compiles nothing beside them
    t = time.perf_counter()
    self.stats.kernels_added += self.kernels.add(graph)
    self.stats.kernel_seconds += time.perf_counter() - t
    return self.kernels.table()

  def match(self, graph: layout.Graph) -> tuple[np.ndarray, np.ndarray]:
    """(mask bool[R, L], nodes int32[R, L, P]) on the host."""
    m = self._call(self._fn.match, graph, self._kernel_table())[0]  # its costs are unused here
    return np.array(m.mask), np.array(m.nodes)

  def saturate(self, graph: layout.Graph, ids: Any, rule: int, max_steps: int
               ) -> tuple[layout.Graph, np.ndarray, tuple[RewriteStep, ...]]:
    """Applies rule index `rule` again and again, each time at the first location the matcher
    finds on the current graph (matched afresh: an earlier application can move or remove
    later locations), until none applies or after `max_steps` applications.

    Returns (host graph, its node identities uint32[N, 2], the steps taken, replayable).
    """
    g, ids, steps = layout.to_host(graph), np.asarray(ids), []
    while len(steps) < max_steps:
      mask, nodes = self.match(g)
      for loc in np.flatnonzero(mask[rule]).tolist():
        new, ok, new_ids = self._call(self._fn.apply_at, g, ids, np.int32(rule), nodes[rule, loc])
        if bool(ok):
          steps.append(self.step(rule, loc, nodes[rule, loc]))
          g, ids = layout.to_host(new), np.asarray(new_ids)
          break
      else:
        break
    return g, ids, tuple(steps)

  def step(self, rule: int, location: int, nodes: Any) -> RewriteStep:
    """The RewriteStep record of rule index `rule` at `location` with bound `nodes`."""
    return RewriteStep(self._names[rule], int(rule), int(location),
                       tuple(int(v) for v in np.asarray(nodes)))

  def new_child(self, children: Children, action: int, nodes: Any,
                seen: set) -> tuple[layout.Graph, np.ndarray, RewriteStep] | None:
    """(host graph, its node identities, step) of candidate `action` of an expansion, or None
    when its edit was refused or its identity hash is in `seen` (it is added)."""
    i = children.fresh(action, seen)
    if i is None:
      return None
    r, loc = divmod(int(action), self.max_locations)
    return (*children.child(i), self.step(r, loc, nodes))

  def apply_step(self, graph: layout.Graph, step: RewriteStep) -> layout.Graph:
    """Applies a recorded step; SearchError if it no longer applies."""
    if not 0 <= step.rule_index < len(self.ruleset) or \
        self.ruleset.names[step.rule_index] != step.rule:
      raise SearchError(f"rewrite {step.rule!r} (index {step.rule_index}) is not rule "
                        f"{step.rule_index} of this rule set; replay with the rule set the "
                        "search used")
    new, ok = self.apply_at(graph, step.rule_index, step.nodes)
    if not ok:
      raise SearchError(f"rewrite {step.rule} at nodes {list(step.nodes)} does not apply; the "
                        "sequence must be replayed on the graph it was found on")
    return new


def check_graph(graph: layout.Graph, ruleset: RuleSet) -> layout.Graph:
  """Checks that `graph` is one unbatched graph with room for a rewrite; returns it on the host.

  Raises:
    SearchError: a batched graph, or a capacity with fewer free slots than the largest rule
      adds (the message names the capacity needed).
  """
  if not isinstance(graph, layout.Graph):
    raise SearchError(f"expected a Graph (jraph.GraphsTuple), got {type(graph).__name__}")
  if np.ndim(graph.nodes["op"]) != 1:
    raise SearchError(f"expected one graph, got a batch of shape "
                      f"{tuple(np.shape(graph.nodes['op']))[:-1]}; search graphs one at a time")
  host = layout.to_host(graph)
  n = layout.capacity(host)
  used = graph_host.num_nodes(host)
  need = used + ruleset.max_new
  if need > n:
    raise SearchError(f"the graph has {used} nodes in a capacity of {n}: no room for a rewrite "
                      f"(rules add up to {ruleset.max_new} nodes before freeing any); rebuild it "
                      f"with capacity >= {need} (e.g. {max(need, int(used * 1.25) + 8)})")
  return host


def replay(graph: layout.Graph, ruleset: RuleSet | Expander,
           rewrites: Sequence[RewriteStep]) -> layout.Graph:
  """Re-applies `rewrites` (a SearchResult's) to `graph` in order: the best graph, as host numpy
  arrays (same capacity). SearchError if a step does not apply or names another rule."""
  expander = ruleset if isinstance(ruleset, Expander) else _replayer(ruleset)
  g = layout.to_host(graph)
  for step in rewrites:
    g = expander.apply_step(g, step)
  return layout.to_host(g)


_REPLAYERS: IdentityCache[Expander] = IdentityCache()


def _replayer(ruleset: RuleSet) -> Expander:
  return _REPLAYERS.get((ruleset,), lambda: Expander(ruleset, None))  # apply only: no costs
