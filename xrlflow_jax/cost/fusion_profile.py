"""Where a whole compiled graph spends its time: XLA's own per-kernel trace, by kernel kind.

The per-op profiler (`profiler`) times each op alone; this module times the graph as XLA
compiled it, fusions and all, so it answers "how much of this model's time could a rewrite
save at most without making a dot or convolution faster". The graph is compiled once with
per-kernel trace events (on XLA:CPU the `xla_cpu_enable_xprof_traceme` option), run `runs`
times under `jax.profiler.trace`, and every event that names an HLO instruction of this
executable (its `hlo_op` argument, else its name) is summed per instruction. Checked on XLA:CPU
only: a backend whose trace names no instruction raises `FusionProfileError`. Each instruction
is classified from the HLO ops it runs (a fusion's called computations included):

  dot          it contains a `dot` (matmul, batched matmul, or a library fusion around one)
  convolution  it contains a `convolution`
  reduction    a `reduce`/`reduce-window` (softmax, norms, pools), no dot or convolution
  data         only moves data (copy, transpose, slice, concatenate, pad, gather, ...)
  elementwise  everything else (activations, bias adds, scalings)

Kernels of one run can overlap (XLA:CPU runs independent kernels concurrently), so the summed
kernel time can exceed the wall time; shares are of the summed kernel time.

    prof = fusion_profile.profile(graph, params)
    print(prof.table(limit=20))
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import gzip
import json
import re
import tempfile
from typing import Any, Mapping

import jax
import numpy as np

from xrlflow_jax import xla_options
from xrlflow_jax.measure import latency
from xrlflow_jax.errors import XrlflowError
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore

KINDS = ("dot", "convolution", "reduction", "data", "elementwise")
TRACE_OPTIONS = {"xla_cpu_enable_xprof_traceme": True}
_DATA_OPS = frozenset({
    "parameter", "constant", "bitcast", "broadcast", "copy", "transpose", "reshape", "slice",
    "dynamic-slice", "dynamic-update-slice", "concatenate", "pad", "gather", "scatter", "tuple",
    "get-tuple-element", "iota", "reverse", "copy-start", "copy-done", "bitcast-convert"})
# `%name = <shape> opcode(` ; the shape may be a tuple with spaces, so match lazily up to the
# first lower-case word directly followed by "(".
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = .*? ([a-z][a-z0-9\-]*)\((.*)$")
_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+) .*\{\s*$")
# Computations whose ops run as part of the caller's kernel (a reduction's `to_apply` combiner
# is not followed: its ops are the reduction's).
_CALLS = re.compile(r"(?:calls|body|condition)=%?([\w.\-]+)")
_CALLERS = frozenset({"fusion", "call", "while", "conditional", "async-start"})


class FusionProfileError(XrlflowError):
  """The trace held no kernel of the executable (a backend whose kernels are not traced)."""


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One HLO instruction of the executable as run: `ms` is its mean time per run."""
  name: str
  kind: str  # one of KINDS
  ops: tuple[str, ...]  # distinct HLO ops it runs, sorted
  calls: int  # trace events per run
  ms: float


@dataclasses.dataclass(frozen=True)
class FusionProfile:
  """A graph's kernels, slowest first; `wall_ms`: median wall time of one untraced run."""
  kernels: tuple[Kernel, ...]
  wall_ms: float
  runs: int
  platform: str

  @property
  def kernel_ms(self) -> float:
    return float(sum(k.ms for k in self.kernels))

  def by_kind(self) -> dict[str, tuple[int, float]]:
    """kind -> (kernels, ms per run), for every kind in KINDS."""
    out = {k: (0, 0.0) for k in KINDS}
    for k in self.kernels:
      n, ms = out[k.kind]
      out[k.kind] = (n + 1, ms + k.ms)
    return out

  def share(self, *kinds: str) -> float:
    """Fraction of the summed kernel time spent in kernels of `kinds`."""
    total = self.kernel_ms
    return sum(self.by_kind()[k][1] for k in kinds) / total if total > 0 else 0.0

  def table(self, limit: int | None = 20) -> str:
    lines = [f"{'kind':<12} {'kernels':>7} {'ms/run':>9} {'share':>6}"]
    for kind, (n, ms) in self.by_kind().items():
      lines.append(f"{kind:<12} {n:>7} {ms:>9.3f} {ms / max(self.kernel_ms, 1e-12):>6.1%}")
    lines.append(f"{'all':<12} {len(self.kernels):>7} {self.kernel_ms:>9.3f}   (wall "
                 f"{self.wall_ms:.3f} ms a run; kernels overlap where independent)")
    rest = 1.0 - self.share("dot", "convolution")
    lines.append(f"outside dots and convolutions: {rest:.1%} of the kernel time (the most a "
                 f"rewrite can save without making a dot or convolution faster)")
    shown = self.kernels if limit is None else self.kernels[:limit]
    if shown:
      lines.append("")
      lines.append(f"{'ms/run':>9} {'calls':>5} {'kind':<12} kernel: ops")
      for k in shown:
        lines.append(f"{k.ms:>9.3f} {k.calls:>5} {k.kind:<12} {k.name}: {','.join(k.ops)}")
    return "\n".join(lines)


def hlo_instructions(hlo_text: str) -> dict[str, tuple[str, tuple[str, ...]]]:
  """Every instruction of an HLO module's text: name -> (opcode, computations it calls)."""
  out = {}
  for line in hlo_text.splitlines():
    m = _INSTRUCTION.match(line)
    if m:
      out[m.group(1)] = (m.group(2), tuple(_CALLS.findall(m.group(3))))
  return out


def hlo_computations(hlo_text: str) -> dict[str, list[str]]:
  """Every computation of an HLO module's text: name -> names of its instructions."""
  out: dict[str, list[str]] = {}
  current = None
  for line in hlo_text.splitlines():
    if current is None or not line.startswith(" "):
      m = _COMPUTATION.match(line)
      if m and "=" not in line.split("{")[0]:
        current = m.group(1)
        out[current] = []
        continue
    m = _INSTRUCTION.match(line)
    if m and current is not None:
      out[current].append(m.group(1))
  return out


def kernel_ops(name: str, instructions: Mapping[str, tuple[str, tuple[str, ...]]],
               computations: Mapping[str, list[str]]) -> tuple[str, ...]:
  """The distinct HLO ops instruction `name` runs, through every computation it calls."""
  ops: set[str] = set()
  stack, seen = [name], set()
  while stack:
    inst = stack.pop()
    if inst in seen or inst not in instructions:
      continue
    seen.add(inst)
    opcode, calls = instructions[inst]
    if opcode not in _CALLERS and opcode != "parameter":
      ops.add(opcode)
    for comp in calls if opcode in _CALLERS else ():
      stack.extend(computations.get(comp, ()))
  return tuple(sorted(ops))


def classify(ops: tuple[str, ...]) -> str:
  """The KINDS entry of a kernel running `ops`."""
  if "dot" in ops:
    return "dot"
  if "convolution" in ops:
    return "convolution"
  if "reduce" in ops or "reduce-window" in ops:
    return "reduction"
  if all(o in _DATA_OPS for o in ops):
    return "data"
  return "elementwise"


def _trace_events(fn: Any, args: tuple[Any, ...], runs: int) -> list[dict[str, Any]]:
  with tempfile.TemporaryDirectory(prefix="xrlflow-trace-") as d:
    with jax.profiler.trace(d, create_perfetto_trace=True):
      for _ in range(runs):
        jax.block_until_ready(fn(*args))
    files = glob.glob(f"{d}/**/*.trace.json.gz", recursive=True)
    if not files:
      raise FusionProfileError(f"jax.profiler wrote no trace under {d}")
    with gzip.open(files[0]) as f:
      return json.load(f).get("traceEvents", [])


def profile(graph: layout.Graph, params: ParamStore, *, runs: int = 10,
            backend: str | None = None, seed: int = 0) -> FusionProfile:
  """Compiles `graph` with kernel tracing, times `runs` untraced runs (their median is the wall
  time) and `runs` traced ones, and returns its kernels by mean time per run.

  Raises:
    FusionProfileError: no traced event named an instruction of the executable.
  """
  if runs < 1:
    raise XrlflowError(f"need runs >= 1 (got {runs})")
  device = latency.resolve_device(backend)
  options = xla_options.for_cpu(TRACE_OPTIONS, [device]) or {}
  compiled = latency.compile_graph(graph, params, device=device, seed=seed,
                                   compiler_options=options)
  fn, args = compiled.fn, compiled.args
  walls = latency.time_callable(fn, args, warmup=1, repeats=runs)
  hlo = fn.as_text()
  instructions, computations = hlo_instructions(hlo), hlo_computations(hlo)
  total: dict[str, float] = collections.defaultdict(float)
  count: collections.Counter[str] = collections.Counter()
  for e in _trace_events(fn, args, runs):
    name = e.get("args", {}).get("hlo_op") or e.get("name")
    if e.get("ph") != "X" or name not in instructions or str(e.get("name", "")).startswith("end:"):
      continue
    total[name] += float(e.get("dur", 0.0)) / 1e3
    count[name] += 1
  if not total:
    raise FusionProfileError(
        f"the {device.platform} trace named no instruction of the compiled graph (this backend "
        f"does not trace its kernels)")
  kernels = []
  for name, ms in total.items():
    ops = kernel_ops(name, instructions, computations)
    kernels.append(Kernel(name, classify(ops), ops, max(1, round(count[name] / runs)),
                          ms / runs))
  kernels.sort(key=lambda k: -k.ms)
  return FusionProfile(tuple(kernels), float(np.median(walls)), runs, device.platform)
