"""Measured kernel times for the cost model: every distinct MatMul and convolution signature a
search meets is compiled alone and timed once per device (through the profiler's on-disk cache),
and the jitted cost model looks kernels up in a `model.KernelTable` instead of estimating them.

    kernels = KernelTimes()                      # the profiler's cache: $XRLFLOW_PROFILE_CACHE
    kernels.add(graph)                           # measures the graph's kernels not yet known
    cost = model.graph_cost(graph, coeffs, kernels=kernels.table())

A roofline with one coefficient per FLOP cannot say that XLA:CPU runs a grouped convolution with
4 channels per group at half the speed of one with 8 (see `model.KERNEL_OPS`); a measurement
can. Fusion stays the model's: elementwise and data-movement ops, what is written to memory,
distinct weights and the sibling discount are estimated as they are without a table. A kernel
the table does not have keeps the model's estimate, and `model.measured_costs` reports it
missing, so a search can measure it (`search.Expander` does) and cost again what it costed
without it.

Times are the profiler's (`Profiler.profile_kernels`: MatMuls per iteration of a hot loop,
convolutions a call at a time less the cost of an empty call timed in the same rounds, which
the model adds once per graph; each the median of its interleaved rounds' medians), and never
change once in the table: a cost computed when all of a graph's kernels were known stays valid
as the table grows. A graph whose weights are each read once (a transformer's) is costed with
MatMuls timed a call at a time too, in a table of its own (`KernelTimes.use_for`,
`Profiler.profile_kernels(streamed=True)`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xrlflow_jax.cost import model
from xrlflow_jax.cost.profiler import Profiler
from xrlflow_jax.cost.signatures import OpSignature, node_signature
from xrlflow_jax.graph import host, layout, transforms
from xrlflow_jax.ops import Op

DEFAULT_CAPACITY = 1024


def bare_kernel(sig: OpSignature) -> OpSignature:
  """The kernel of a MatMul, convolution or pool signature without its epilogue: activation
  cleared, only the data and weight operands (what `model.kernel_keys` keys)."""
  attrs = list(sig.attrs)
  act = model.kernel_activation_offset(sig.op)
  if act is not None:
    attrs[act] = 0
  n = model.KERNEL_OPERANDS
  return dataclasses.replace(sig, attrs=tuple(attrs), in_shapes=sig.in_shapes[:n],
                             in_dtypes=sig.in_dtypes[:n])


class KernelTimes:
  """The measured kernels of one device, served to jitted code as a `model.KernelTable`.

  Args:
    profiler: measures signatures (default `Profiler()`: this device, the on-disk cache).
    capacity: table size T; it doubles (a new compiled shape) when more kernels are known.
    streamed: time MatMuls a call at a time (`Profiler.profile_kernels(streamed=True)`)
      rather than in a hot loop; `use_for(graph)` sets it for a graph. Each timing keeps its
      own table.
  Attributes:
    measured: signatures measured by this object (not found in the profiler's cache).
    seconds: wall time spent measuring (and reading the cache).
    ms: {key: measured ms} of the current timing; unmeasured: {key: reason} of kernels the
      profiler could not time alone (they keep the model's estimate: `model.UNMEASURED_MS`).
  """

  def __init__(self, profiler: Profiler | None = None, capacity: int = DEFAULT_CAPACITY,
               streamed: bool = False):
    self.profiler = profiler if profiler is not None else Profiler()
    self.capacity = int(capacity)
    self.call_ms = self.profiler.call_overhead()
    self.streamed = bool(streamed)
    self._ms: dict[bool, dict[int, float]] = {False: {}, True: {}}
    self._unmeasured: dict[bool, dict[int, str]] = {False: {}, True: {}}
    self.signatures: dict[int, OpSignature] = {}
    self.measured = 0
    self.seconds = 0.0
    self._keys = jax.jit(model.kernel_keys)
    self._table: model.KernelTable | None = None

  @property
  def ms(self) -> dict[int, float]:
    return self._ms[self.streamed]

  @property
  def unmeasured(self) -> dict[int, str]:
    return self._unmeasured[self.streamed]

  def use_for(self, graph: layout.Graph) -> bool:
    """Chooses the timing for searches of `graph` (streamed when no weight is read by two
    MatMuls: `weights_read_once`) and returns it; the table served changes with it."""
    streamed = weights_read_once(graph)
    if streamed != self.streamed:
      self.streamed, self._table = streamed, None
    return streamed

  def __len__(self) -> int:
    return len(self.ms)

  def table(self) -> model.KernelTable:
    """The known kernels as a device table (capacity T, keys ascending)."""
    if self._table is None:
      while len(self.ms) > self.capacity:
        self.capacity *= 2
      keys = np.full([self.capacity], model.NO_KERNEL, np.uint32)
      ms = np.zeros([self.capacity], np.float32)
      order = sorted(self.ms)
      keys[:len(order)] = order
      ms[:len(order)] = [self.ms[k] for k in order]
      self._table = model.KernelTable(keys=jnp.asarray(keys), ms=jnp.asarray(ms))
    return self._table

  def missing(self, graph: layout.Graph) -> dict[int, OpSignature]:
    """{key: signature} of the graph's alive computed kernels (`model.KERNEL_OPS`) that the
    table does not have."""
    g = layout.to_host(graph)
    nd = g.nodes
    rows = np.flatnonzero(nd["alive"] & ~nd["is_constant"]
                          & np.isin(nd["op"], np.asarray(model.KERNEL_OPS)))
    if not rows.size:
      return {}
    keys = np.asarray(self._keys(g))
    table = layout.input_table(g)
    out: dict[int, OpSignature] = {}
    for v in rows:
      key = int(keys[v])
      if key not in self.ms and key not in out:
        out[key] = bare_kernel(node_signature(g, table, int(v)))
    return out

  def needs_timing(self, graph: layout.Graph) -> bool:
    """Whether `add(graph)` would time a kernel: one the table lacks that the profiler's cache
    does not hold either."""
    return any(self.profiler.current_kernel(sig, self.streamed) is None
               for sig in self.missing(graph).values())

  def add(self, graph: layout.Graph) -> int:
    """Measures the graph's kernels the table does not have; returns how many were new to it
    (served from the profiler's cache or measured now)."""
    todo = self.missing(graph)
    if not todo:
      return 0
    t = time.perf_counter()
    before = self.profiler.measure_count
    entries, errors = self.profiler.profile_kernels(todo.values(), streamed=self.streamed)
    for key, sig in todo.items():
      self.signatures[key] = sig
      if sig.key in errors:  # e.g. too big for memory alone: the roofline estimates it
        e = errors[sig.key]
        self.ms[key] = model.UNMEASURED_MS
        self.unmeasured[key] = f"{type(e).__name__}: {e}"
        continue
      entry = entries[sig.key]
      # Less the empty call of its rounds (a loop's entry has it taken off already: call_ms 0).
      self.ms[key] = max(float(entry["median_ms"]) - float(entry["call_ms"]), 0.0)
    self.measured += self.profiler.measure_count - before
    self._table = None
    self.seconds += time.perf_counter() - t
    return len(todo)

  def rows(self) -> list[dict[str, Any]]:
    """The table for a report: one dict per kernel (signature, measured ms), slowest first."""
    out = [{"kernel": self.signatures[k].describe(), "ms": round(self.ms[k], 4),
            **({"unmeasured": self.unmeasured[k]} if k in self.unmeasured else {})}
           for k in self.ms]
    return sorted(out, key=lambda r: -r["ms"])


def weights_read_once(graph: layout.Graph) -> bool:
  """Whether no constant (a weight, or one folded from weights) is read by two live MatMuls:
  each weight then streams into cache once a call, as a transformer's do, and a hot loop over
  one MatMul (which keeps its weight in cache) would misjudge it
  (`Profiler.profile_kernels(streamed=True)`).
  Constants that compute the same value count as one (`host.constant_classes`)."""
  g = layout.to_host(graph)
  nd = g.nodes
  table = layout.input_table(g)
  order = [int(v) for v in host.topological_order(g)]
  canon = host.constant_classes(g, order)
  readers: dict[int, int] = {}
  live = np.asarray(transforms.live_nodes(g))
  for v in np.flatnonzero(live & (nd["op"] == int(Op.MATMUL)) & ~nd["is_constant"]):
    for u in {canon.get(int(u), int(u)) for u in table[v] if u >= 0 and nd["is_constant"][u]}:
      readers[u] = readers.get(u, 0) + 1
      if readers[u] > 1:
        return False
  return True


_SHARED: dict[str, KernelTimes] = {}


def shared(graph: layout.Graph | None = None) -> KernelTimes:
  """This process's kernel table for JAX's default device (one per device kind, the
  profiler's default cache): repeated jobs share what was measured and the compiled code.
  `graph`: a model every graph costed next belongs to; the table times kernels as it reads
  its weights (`KernelTimes.use_for`), as a search of it does."""
  kind = jax.devices()[0].device_kind
  if kind not in _SHARED:
    _SHARED[kind] = KernelTimes()
  if graph is not None:
    _SHARED[kind].use_for(graph)
  return _SHARED[kind]
