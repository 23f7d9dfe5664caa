"""The in-graph cost model: a pure, jittable estimate of a graph's XLA latency in milliseconds.

    coeffs = load_coefficients()                 # the shipped CPU fit (or this device's refit);
                                                 #   `cost.coefficient_files` reads the files
    per_node = node_costs(graph, coeffs)         # float32[N], ms
    total = graph_cost(graph, coeffs)            # float32[], ms; jit and vmap freely
    total = graph_cost(graph, coeffs, kernels=table)  # MatMuls/convolutions as measured
                                                      # (`KernelTable`, `cost.kernel_table`)

Every node gets a feature vector that is linear in the coefficients (`FEATURE_NAMES`): for each
kernel class (matmul, conv, grouped conv, norm, reduce, loop) a kernel count ("launch"), GFLOPs
and megabytes moved, plus the megabytes written by transposes (strided writes cost more than
streaming ones). `node_costs = features @ weights` and `graph_cost = call_ms + sum(node_costs)`,
where `call_ms` is the fixed cost of one call of a compiled executable. Because the cost is
linear in the coefficients, one least-squares fit serves single-op profiles and whole graphs.

Fusion model (what XLA does with the graph, checked against compiled HLO on CPU):
  * Input nodes, dead slots and nodes from which no output is reachable cost nothing; constant
    nodes (`is_constant`: evaluated once at lowering) cost only `const.mb` (below).
  * Reshape, Squeeze and Unsqueeze are bitcasts: no kernel and no traffic; fusion decisions look
    through them (`BITCAST_DEPTH` levels).
  * MatMul, Conv2D, Softmax, LayerNorm, pools and reductions are kernels of their own: one
    launch, their FLOPs, and the bytes of all inputs plus the output.
  * Elementwise ops and cheap data movement (Transpose, Slice, Concat, Pad, Gather, Cast, Where,
    BatchNorm) are "loop" ops. A loop op whose producer (through bitcasts) is a non-constant op
    it can fuse into (another loop op, or the epilogue of a MatMul/Conv2D) joins that producer's
    fusion: it costs no launch, reads nothing of that producer from memory, and writes its own
    output only if something outside the fusion needs it in memory (a graph output, or a
    MatMul/Conv2D consumer). Otherwise it starts a loop fusion (one launch).
  * A MatMul with a fused activation, or a Conv2D with a bias or activation, has an epilogue.
    On XLA:CPU the epilogue is a separate loop fusion that reads the raw result (measured: an
    activation after a dot is not fused into it; the compiled HLO shows the dot alone in its
    fusion). With `epilogue_fusion=True` (GPU backends that fuse bias and activation into the
    GEMM) the epilogue and elementwise consumers join the kernel and cost only their traffic.
  * Reductions, Softmax and LayerNorm absorb elementwise producers (XLA fuses producers into
    reduction inputs), so they do not force those producers to be written.
  * A MatMul or Conv2D (not grouped) that shares its first input with another one counts its
    GFLOPs under `*.gflop_sibling` instead of `*.gflop`: XLA:CPU's runtime executes independent
    kernels concurrently, so the three Q/K/V projections of attention overlap, and merging them
    into one wide MatMul measured ~10% slower on the 2-core CPU, not faster. The sibling
    coefficients can only be fitted from whole graphs (profiles time ops alone); `fit` uses
    side-by-side ratios of rewritten variants for that.
  * `const.mb`: the bytes of every distinct folded constant read by the computation, counted
    once per graph (not per use): constant nodes with the same op and attributes on the same
    constant inputs are one value (as `host.constant_classes` makes them at lowering; here a
    32-bit hash of constant sub-trees up to `_CONST_HASH_DEPTH` deep; deeper ones are counted
    once per node, an overestimate). Measured on
    NasRNN, whose 10 unrolled steps share 16 MB of weights: each merge that adds a new folded
    weight (up to 3 MB) costs 2-3%, which per-use byte counts do not see.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from xrlflow_jax import ops
from xrlflow_jax.errors import XrlflowError
from xrlflow_jax.graph import layout, transforms
from xrlflow_jax.ops import Activation, Op

CLASSES = ("matmul", "conv", "gconv", "norm", "reduce", "loop")
PER_CLASS = ("launch", "gflop", "mb")
# GFLOPs of MatMuls and Conv2Ds that have a sibling (another MatMul/Conv2D reading the same
# tensor): XLA:CPU runs independent kernels concurrently, so siblings overlap and a group of
# them runs faster than one merged kernel of the same size (measured on the 2-core CPU).
SIBLING = ("matmul.gflop_sibling", "conv.gflop_sibling")
# Megabytes of distinct folded constants (weights) the graph reads per call, attributed to one
# representative node of each distinct value: a call must bring each distinct weight into
# cache at least once, so a rewrite that adds a new folded weight (the concat of a merge, an
# enlarged kernel) costs that traffic even though the weight is "free" to compute.
CONST = ("const.mb",)
FEATURE_NAMES = (tuple(f"{c}.{p}" for c in CLASSES for p in PER_CLASS) + ("transpose.mb",)
                 + SIBLING + CONST)
NUM_FEATURES = len(FEATURE_NAMES)

_MATMUL, _CONV, _GCONV, _NORM, _REDUCE, _LOOP = range(len(CLASSES))
_SOURCE, _BITCAST = len(CLASSES), len(CLASSES) + 1  # cost nothing
BITCAST_DEPTH = 4
_CONST_HASH_DEPTH = 4
_ACT_FLOPS = np.zeros([len(Activation)], np.float32)
_ACT_FLOPS[[Activation.RELU, Activation.SIGMOID, Activation.TANH, Activation.GELU]] = [1, 4, 4, 8]


class CostModelError(XrlflowError):
  """Coefficients that are missing, malformed, or for another device; a fit that cannot run."""


def _op_class_table() -> np.ndarray:
  """int32[num_ops]: the base class of every op code (Conv2D is refined by its groups)."""
  table = np.full([len(Op)], _LOOP, np.int32)
  table[[Op.INPUT, Op.CONSTANT]] = _SOURCE
  table[[Op.RESHAPE, Op.SQUEEZE, Op.UNSQUEEZE]] = _BITCAST
  table[Op.MATMUL] = _MATMUL
  table[[Op.CONV2D, Op.CONV_TRANSPOSE]] = _CONV  # same attribute layout (groups, activation)
  table[[Op.SOFTMAX, Op.LOG_SOFTMAX, Op.LAYER_NORM]] = _NORM
  table[[Op.MAX_POOL, Op.AVG_POOL, Op.GLOBAL_AVG_POOL, Op.REDUCE_MEAN, Op.REDUCE_SUM,
         Op.REDUCE_MAX, Op.REDUCE_MIN, Op.REDUCE_PROD, Op.REDUCE_L1, Op.REDUCE_L2,
         Op.REDUCE_LOG_SUM_EXP, Op.ARG_MAX, Op.ARG_MIN, Op.CUMSUM, Op.TOP_K_VALUES,
         Op.TOP_K_INDICES]] = _REDUCE
  return table


OP_CLASS = _op_class_table()
_CONV_GROUPS = ops.get(Op.CONV2D).attr_offsets()["groups"][0]
_CONV_ACT = ops.get(Op.CONV2D).attr_offsets()["activation"][0]
_MATMUL_ACT = ops.get(Op.MATMUL).attr_offsets()["activation"][0]


def op_class_name(op: int, attrs: Sequence[int] | None = None) -> str:
  """The cost class of an op code ("matmul", ..., "loop", "source" or "bitcast")."""
  c = int(OP_CLASS[int(op)])
  if c == _CONV and attrs is not None and int(attrs[_CONV_GROUPS]) > 1:
    c = _GCONV
  return (CLASSES + ("source", "bitcast"))[c]


# ----------------------------------------------------------------------------------------------
# Coefficients (their files: `cost.coefficient_files`)
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CostCoefficients:
  """Coefficients of the cost model for one device kind (a pytree: jit and vmap see arrays).

  Attributes:
    weights: float32[F], ms per unit of each feature of `FEATURE_NAMES` (launch: ms per kernel;
      gflop: ms per GFLOP; mb: ms per megabyte moved). Non-negative.
    call_ms: float32[], fixed cost of one call of a compiled executable.
    device_kind: what the coefficients were fitted on (e.g. "cpu", "NVIDIA H200"); static.
    epilogue_fusion: whether the backend fuses bias/activation epilogues and elementwise
      consumers into MatMul/Conv2D kernels (static; False for XLA:CPU).
  """
  weights: Any
  call_ms: Any
  device_kind: str = "cpu"
  epilogue_fusion: bool = False

  def named(self) -> dict[str, float]:
    """{feature name: weight} (host)."""
    return {n: float(w) for n, w in zip(FEATURE_NAMES, np.asarray(self.weights))}

  def to_json(self, **extra: Any) -> dict[str, Any]:
    """A JSON-able dict (weights by name), with `extra` fields (fit statistics) added."""
    return {"device_kind": self.device_kind, "epilogue_fusion": bool(self.epilogue_fusion),
            "units": "ms per launch / per GFLOP / per MB", "call_ms": float(self.call_ms),
            "weights": self.named(), **extra}

  @classmethod
  def from_json(cls, data: dict[str, Any], where: str = "coefficients") -> "CostCoefficients":
    """Inverse of `to_json`; CostModelError names a missing or unknown feature."""
    try:
      named = data["weights"]
      missing = [n for n in FEATURE_NAMES if n not in named]
      unknown = [n for n in named if n not in FEATURE_NAMES]
      if missing or unknown:
        raise CostModelError(f"{where}: features missing {missing}, unknown {unknown}; expected "
                             f"{list(FEATURE_NAMES)}")
      weights = np.asarray([float(named[n]) for n in FEATURE_NAMES], np.float32)
      if (weights < 0).any() or not np.isfinite(weights).all():
        raise CostModelError(f"{where}: weights must be finite and >= 0, got {named}")
      return cls(jnp.asarray(weights), jnp.asarray(float(data["call_ms"]), jnp.float32),
                 str(data["device_kind"]), bool(data.get("epilogue_fusion", False)))
    except (KeyError, TypeError, ValueError) as e:
      raise CostModelError(f"{where}: malformed coefficients ({type(e).__name__}: {e})") from None


jax.tree_util.register_dataclass(CostCoefficients, data_fields=["weights", "call_ms"],
                                 meta_fields=["device_kind", "epilogue_fusion"])


# ----------------------------------------------------------------------------------------------
# Features (jittable)
# ----------------------------------------------------------------------------------------------

@chex.dataclass(frozen=True)
class RowKinds:
  """What the cost model makes of each slot's own fields (any leading shape [...]).

  Attributes:
    cls: int32, the cost class (`CLASSES`, then source and bitcast; grouped Conv2D is gconv).
    active: bool, alive, computed at run time (not a folded constant) and not a source.
    is_bitcast, is_loop, is_mm, is_conv: bool, active slots of those classes (conv: grouped
      or not).
    mmconv: bool, active MatMuls and ungrouped Conv2Ds (the sibling candidates).
    act: int32, the fused activation of a MatMul/Conv2D (0 elsewhere).
    has_bias, epilogue: bool, a Conv2D with a bias; a MatMul/Conv2D with an epilogue.
    loop_out: bool, consumers can join the fusion that produces this output.
  """
  cls: jax.Array
  active: jax.Array
  is_bitcast: jax.Array
  is_loop: jax.Array
  is_mm: jax.Array
  is_conv: jax.Array
  mmconv: jax.Array
  act: jax.Array
  has_bias: jax.Array
  epilogue: jax.Array
  loop_out: jax.Array


def row_kinds(op: jax.Array, attrs: jax.Array, alive: jax.Array, is_constant: jax.Array,
              num_inputs: jax.Array, epilogue_fusion: bool = False) -> RowKinds:
  """The `RowKinds` of slots from their op [...], attrs [..., A], alive, is_constant and number
  of used input slots [...] (`alive` is the liveness to use: see `node_features(pruned=)`)."""
  cls = jnp.asarray(OP_CLASS)[op]
  cls = jnp.where((cls == _CONV) & (attrs[..., _CONV_GROUPS] > 1), _GCONV, cls)
  active = alive & ~is_constant & (cls != _SOURCE)
  is_mm = active & (cls == _MATMUL)
  is_conv = active & ((cls == _CONV) | (cls == _GCONV))
  is_loop = active & (cls == _LOOP)
  act = jnp.where(is_mm, attrs[..., _MATMUL_ACT], jnp.where(is_conv, attrs[..., _CONV_ACT], 0))
  act = jnp.clip(act, 0, len(Activation) - 1)
  has_bias = is_conv & (num_inputs >= 3)
  epilogue = (is_mm | is_conv) & ((act != 0) | has_bias)
  heavy_fuses = (is_mm | is_conv) if epilogue_fusion else epilogue
  return RowKinds(cls=cls, active=active, is_bitcast=active & (cls == _BITCAST),
                  is_loop=is_loop, is_mm=is_mm, is_conv=is_conv,
                  mmconv=is_mm | (active & (cls == _CONV)), act=act, has_bias=has_bias,
                  epilogue=epilogue, loop_out=is_loop | heavy_fuses)


def row_out_mb(shape: jax.Array, dtype: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(numel, megabytes) of outputs of shape [..., R] and dtype [...]."""
  numel = jnp.prod(shape.astype(jnp.float32), axis=-1)
  return numel, numel * ops.dtype_size(jnp, dtype).astype(jnp.float32) / 1e6


def row_columns(kinds: RowKinds, op: jax.Array, numel: jax.Array, out_mb: jax.Array,
                valid: jax.Array, in_mb: jax.Array, src_loop_out: jax.Array,
                materialise: jax.Array, sibling: jax.Array, flops: jax.Array,
                epilogue_fusion: bool = False) -> jax.Array:
  """float32[M, F - 1]: every feature but `const.mb` of M slots, from their kinds, op,
  numel, out_mb [M], their input slots' validity and megabytes [M, K], whether each input's
  producer (through bitcasts) fuses consumers ([M, K], `RowKinds.loop_out` of it), whether
  their output must be written to memory and whether they have a sibling [M], and FLOPs [M].
  The one formula of a row's features: `node_features` and the incremental cost
  (`cost.incremental`) both call it."""
  k = valid.shape[-1]
  is_loop = kinds.is_loop
  # Constants (and sources) are read from memory; fused inputs come from a loop producer.
  fused_in = valid & is_loop[:, None] & src_loop_out
  gflop = jnp.where(kinds.active, flops, 0.0) / 1e9
  partial_read = (op == Op.SLICE) | (op == Op.GATHER)
  read_mb = jnp.where(partial_read[:, None], jnp.minimum(in_mb, out_mb[:, None]), in_mb)
  loop_read = jnp.sum(jnp.where(valid & ~fused_in, read_mb, 0.0), axis=-1)
  loop_launch = is_loop & ~jnp.any(fused_in, axis=-1)
  loop_mb = jnp.where(is_loop, loop_read + out_mb * materialise, 0.0)
  loop_gflop = jnp.where(is_loop, gflop, 0.0)
  transpose_mb = jnp.where(is_loop & (op == Op.TRANSPOSE), out_mb, 0.0)

  # Kernels; a Conv2D bias is read by the epilogue.
  has_bias, epilogue = kinds.has_bias, kinds.epilogue
  heavy = kinds.active & ~is_loop & ~kinds.is_bitcast
  kernel_in = jnp.where(has_bias[:, None] & (jnp.arange(k) == 2)[None, :], 0.0, in_mb)
  heavy_mb = jnp.where(heavy, kernel_in.sum(-1) + out_mb, 0.0)
  bias_mb = jnp.where(has_bias, in_mb[:, jnp.minimum(2, k - 1)], 0.0)
  epi_gflop = (jnp.asarray(_ACT_FLOPS)[kinds.act] * numel / 1e9
               + jnp.where(has_bias, numel / 1e9, 0.0))
  if epilogue_fusion:
    epi_launch = jnp.zeros_like(epilogue)
    epi_mb = jnp.where(epilogue, bias_mb, 0.0)
  else:
    epi_launch = epilogue
    epi_mb = jnp.where(epilogue, out_mb + bias_mb + out_mb * materialise, 0.0)
  loop_launch = loop_launch | epi_launch
  loop_mb = loop_mb + epi_mb
  loop_gflop = loop_gflop + jnp.where(epilogue, epi_gflop, 0.0)

  cls = kinds.cls
  cols = []
  for c in range(len(CLASSES)):
    if c == _LOOP:
      cols += [loop_launch.astype(jnp.float32), loop_gflop, loop_mb]
    else:
      in_c = heavy & (cls == c)
      cols += [in_c.astype(jnp.float32), jnp.where(in_c & ~sibling, gflop, 0.0),
               jnp.where(in_c, heavy_mb, 0.0)]
  cols.append(transpose_mb)
  cols.append(jnp.where(sibling & (cls == _MATMUL), gflop, 0.0))
  cols.append(jnp.where(sibling & (cls == _CONV), gflop, 0.0))
  return jnp.stack(cols, axis=-1).astype(jnp.float32)


def resolve_bitcasts(x: jax.Array, is_bitcast: jax.Array, first_input: jax.Array
                     ) -> jax.Array:
  """int32[...]: the producer each slot id `x` resolves to through chains of bitcasts
  (`BITCAST_DEPTH` levels), given every slot's `is_bitcast` and first input [N]."""
  for _ in range(BITCAST_DEPTH):
    x = jnp.where(is_bitcast[x], first_input[x], x)
  return x


@chex.dataclass(frozen=True)
class GraphContext:
  """What the features of one graph's slots read from their neighbours (every slot, [N]).

  Attributes:
    live: bool[N], the liveness used (`alive`, or reaching an output).
    kinds: `RowKinds` of every slot; numel, out_mb: float32[N].
    table: int32[N, K] (-1 unused); valid: bool[N, K].
    self_ids: int32[N], the producer each slot resolves to through bitcasts (itself if none).
    src: int32[N, K], each input's producer through bitcasts (`self_ids` of the input).
    force: bool[N, K], the input is read from memory by a MatMul/Conv2D.
    need_count: int32[N], inputs of MatMuls/Conv2Ds resolving to each slot.
    out_node: bool[N], alive graph outputs; out_count: int32[N], those resolving to each slot.
    first_src: int32[N], the first input's producer of each sibling candidate
      (`RowKinds.mmconv`), N elsewhere; readers: int32[N + 1], candidates per producer.
  """
  live: jax.Array
  kinds: RowKinds
  numel: jax.Array
  out_mb: jax.Array
  table: jax.Array
  valid: jax.Array
  self_ids: jax.Array
  src: jax.Array
  force: jax.Array
  need_count: jax.Array
  out_node: jax.Array
  out_count: jax.Array
  first_src: jax.Array
  readers: jax.Array

  @property
  def materialise(self) -> jax.Array:
    """bool[N]: the output must be in memory (a MatMul/Conv2D reads it, or a graph output)."""
    return (self.need_count > 0) | (self.out_count > 0)

  @property
  def sibling(self) -> jax.Array:
    """bool[N]: a MatMul/Conv2D sharing its first input's producer with another."""
    return self.kinds.mmconv & (self.readers[self.first_src] >= 2)


def graph_context(graph: layout.Graph, epilogue_fusion: bool = False, *,
                  pruned: bool = False) -> GraphContext:
  """The `GraphContext` of every slot of `graph` (`pruned`: see `node_features`)."""
  nd = graph.nodes
  n = nd["op"].shape[-1]
  table = layout.input_table(graph)  # [N, K]
  valid = table >= 0
  safe = jnp.maximum(table, 0)
  live = nd["alive"] if pruned else transforms.live_nodes(graph)
  kinds = row_kinds(nd["op"], nd["attrs"], live, nd["is_constant"], valid.sum(-1),
                    epilogue_fusion)
  numel, out_mb = row_out_mb(nd["shape"], nd["dtype"])
  self_ids = resolve_bitcasts(jnp.arange(n, dtype=jnp.int32), kinds.is_bitcast, safe[:, 0])
  src = self_ids[safe]  # [N, K]
  # Which outputs must be written to memory: graph outputs (through bitcasts) and inputs of
  # MatMul/Conv2D, which read their operands from memory.
  force = valid & (kinds.is_mm | kinds.is_conv)[:, None]
  need_count = jax.ops.segment_sum(force.reshape(-1).astype(jnp.int32),
                                   jnp.where(force, src, n).reshape(-1),
                                   num_segments=n + 1)[:n]
  out_node = nd["alive"] & nd["is_output"]
  out_count = jax.ops.segment_sum(out_node.astype(jnp.int32), jnp.where(out_node, self_ids, n),
                                  num_segments=n + 1)[:n]
  # Siblings: MatMul/Conv2D nodes whose first input (through bitcasts) feeds another of them.
  first_src = jnp.where(kinds.mmconv & valid[:, 0], src[:, 0], n)
  readers = jax.ops.segment_sum(kinds.mmconv.astype(jnp.int32), first_src, num_segments=n + 1)
  return GraphContext(live=live, kinds=kinds, numel=numel, out_mb=out_mb, table=table,
                      valid=valid, self_ids=self_ids, src=src, force=force, need_count=need_count,
                      out_node=out_node, out_count=out_count, first_src=first_src,
                      readers=readers)


def node_features(graph: layout.Graph, epilogue_fusion: bool = False, *,
                  pruned: bool = False, flops: jax.Array | None = None,
                  const_mb: jax.Array | None = None) -> jax.Array:
  """float32[N, F]: the cost features of every node slot (see the module docstring).

  Pure and jittable; vmap it over a batch of graphs of one capacity. Rows of dead slots,
  unreachable nodes and sources are zero; constant nodes have only `const.mb`.

  Args:
    pruned: the caller guarantees that every alive node other than a graph input or output has
      an alive consumer (what `rules.edit.apply_edit` leaves behind: its cascade frees every
      unread node). Then every alive node reaches an output, so liveness is `alive` and the
      backward-reachability loop (a depth-long `while_loop`, most of the model's time) is
      skipped. Exact under that guarantee; `tests/test_cost.py` checks it on rewritten graphs.
    flops: float32[N], every slot's FLOPs when the caller has them (`cost.incremental` reuses
      the rows a rewrite did not change); default `flops_all(graph)`.
    const_mb: float32[N], the `const.mb` column to use instead of computing it (the
      incremental cost passes zeros and adds the graph's distinct-constant total itself).
  """
  ctx = graph_context(graph, epilogue_fusion, pruned=pruned)
  feats = context_features(graph, ctx, epilogue_fusion,
                           flops_all(graph) if flops is None else flops)
  if const_mb is None:
    const_mb = distinct_constant_mb(graph, ctx.table, ctx.live, ctx.out_mb)
  return jnp.concatenate([feats, const_mb[:, None].astype(jnp.float32)], axis=-1)


def context_features(graph: layout.Graph, ctx: GraphContext, epilogue_fusion: bool,
                     flops: jax.Array) -> jax.Array:
  """float32[N, F - 1]: every slot's features but `const.mb`, from its `graph_context`."""
  safe = jnp.maximum(ctx.table, 0)
  return row_columns(ctx.kinds, graph.nodes["op"], ctx.numel, ctx.out_mb, ctx.valid,
                     jnp.where(ctx.valid, ctx.out_mb[safe], 0.0), ctx.kinds.loop_out[ctx.src],
                     ctx.materialise, ctx.sibling, flops, epilogue_fusion)


def _mix(h: jax.Array, x: jax.Array) -> jax.Array:
  """One round of a 32-bit multiplicative (FNV-style) hash; uint32 arithmetic wraps."""
  return (h ^ x.astype(jnp.uint32)) * jnp.uint32(0x01000193) + jnp.uint32(0x9E3779B9)


_NO_INPUT = 7  # what an unused input slot mixes into a hash
# Class key of a slot that is not a folded constant read at run time (hash keys are 31-bit).
NO_CLASS = 0xFFFFFFFF


def constant_key_base(graph: layout.Graph, rows: jax.Array | None = None) -> jax.Array:
  """uint32[N]: the part of each slot's constant-class hash that is its own (op, parameter id,
  attributes), before its inputs' hashes are mixed in; with `rows` (int32[M]), those slots'."""
  nd = graph.nodes
  op, param, attrs = nd["op"], nd["param_id"], nd["attrs"]
  if rows is not None:
    op, param, attrs = op[rows], param[rows], attrs[rows]
  base = _mix(jnp.full(op.shape, 0x811C9DC5, jnp.uint32), op)
  base = _mix(base, jnp.where(op == Op.CONSTANT, param, -1))
  for a in range(attrs.shape[-1]):
    base = _mix(base, attrs[:, a])
  return base


def constant_hash_rounds(table: jax.Array, base: jax.Array) -> jax.Array:
  """uint32[H + 1, N] (H = `_CONST_HASH_DEPTH`): round r of every slot's sub-tree hash, from
  round 0 = `base` (`constant_key_base`): round r mixes the slot's own part with its inputs'
  round r - 1, so a constant sub-tree of depth d is exact after d rounds. A collision between
  two distinct weights (probability ~ pairs / 2^31, below 1e-5 for BERT-base's ~200 weights)
  would count them once; one lane keeps the batched cost model cheap.

  The rounds run as a `lax.scan`, not unrolled: unrolled, XLA:CPU fuses the computation of
  `base` (a mix of every attribute) into each round's gather and repeats it for every gathered
  input, which made this 14x slower (BERT-base, capacity 1024, 64 graphs: 21.3 vs 1.5 ms,
  2-core x86_64, 2026-12-05); the loop hands each round a materialised `base`."""
  valid = table >= 0
  safe = jnp.maximum(table, 0)

  def one_round(h: jax.Array, _) -> tuple[jax.Array, jax.Array]:
    h = hash_round(base, h[safe], valid)
    return h, h

  _, rounds = jax.lax.scan(one_round, base, None, length=_CONST_HASH_DEPTH)
  return jnp.concatenate([base[None], rounds])


def hash_round(own: jax.Array, inputs: jax.Array, valid: jax.Array) -> jax.Array:
  """uint32[M]: one round of the constant sub-tree hash: each slot's own part `own` [M] mixed
  with its inputs' previous round `inputs` [M, K] (where `valid` [M, K])."""
  h = own
  for j in range(inputs.shape[-1]):
    h = _mix(h, jnp.where(valid[:, j], inputs[:, j], jnp.uint32(_NO_INPUT)))
  return h


def computed_nodes(nodes: dict[str, jax.Array], live: jax.Array) -> jax.Array:
  """bool[N]: live nodes computed at run time (not folded constants, not graph inputs)."""
  return live & ~nodes["is_constant"] & (nodes["op"] != Op.INPUT)


def computed_reads(graph: layout.Graph, table: jax.Array, live: jax.Array) -> jax.Array:
  """int32[N]: how many input edges of live computed nodes read each slot: a folded constant
  with any is read at run time."""
  n = table.shape[0]
  read = (table >= 0) & computed_nodes(graph.nodes, live)[:, None]
  return jax.ops.segment_sum(read.reshape(-1).astype(jnp.int32),
                             jnp.maximum(table, 0).reshape(-1), num_segments=n)


def constant_keys(graph: layout.Graph, table: jax.Array, live: jax.Array,
                  base: jax.Array | None = None) -> jax.Array:
  """uint32[N]: the value class of every folded constant read by a live computed node (a
  31-bit hash of its constant sub-tree, see `CONST`), NO_CLASS for every other slot. `base`:
  `constant_key_base(graph)` when the caller has it."""
  nd = graph.nodes
  boundary = nd["alive"] & nd["is_constant"] & (computed_reads(graph, table, live) > 0)
  base = constant_key_base(graph) if base is None else base
  return class_key(boundary, constant_hash_rounds(table, base)[-1])


def class_key(boundary: jax.Array, final_hash: jax.Array) -> jax.Array:
  """The class key of slots from their last hash round: NO_CLASS where not `boundary`."""
  return jnp.where(boundary, final_hash >> 1, jnp.uint32(NO_CLASS))


def distinct_constant_mb(graph: layout.Graph, table: jax.Array, live: jax.Array,
                          out_mb: jax.Array) -> jax.Array:
  """float32[N]: MB of each distinct folded constant read by a live computed node, on the
  first slot of its value class (0 elsewhere). See `CONST`."""
  key = constant_keys(graph, table, live)
  return jnp.where(first_of_each_class(key), out_mb, 0.0)


def first_of_each_class(key: jax.Array) -> jax.Array:
  """bool[N]: the lowest slot of each class of equal keys uint32[N] (NO_CLASS: no class).

  The keys are sorted alone and each slot finds its class's first position in them by binary
  search; the lowest slot per class then wins a scatter-min. No argsort: XLA:CPU sorts one
  operand several times faster than the two an argsort carries (`transforms.stable_sort_by_key`).
  """
  n = key.shape[-1]
  slots = jnp.arange(n, dtype=jnp.int32)
  cls = jnp.searchsorted(jnp.sort(key), key, side="left").astype(jnp.int32)  # [N], in [0, N)
  lowest = jnp.full([n], n, jnp.int32).at[cls].min(slots)
  return (key != jnp.uint32(NO_CLASS)) & (lowest[cls] == slots)


def flop_operands(graph: layout.Graph, rows: jax.Array | None = None
                  ) -> tuple[jax.Array, ...]:
  """What a node's FLOPs depend on, per slot: (op int32[N], input shapes int32[N, K', R],
  input ranks int32[N, K'], shape int32[N, R], attrs int32[N, A]) with K' = max(K, 3). With
  `rows` (int32[M], in range), those slots' ([M, ...])."""
  nd = graph.nodes
  table = layout.input_table(graph)
  op, shape, attrs = nd["op"], nd["shape"], nd["attrs"]
  if rows is not None:
    table, op, shape, attrs = table[rows], op[rows], shape[rows], attrs[rows]
  safe = jnp.maximum(table, 0)
  valid = table >= 0
  k = table.shape[-1]
  in_shapes = jnp.where(valid[..., None], nd["shape"][safe], 1)  # [N, K, R]
  in_ranks = jnp.where(valid, nd["rank"][safe], 0)  # [N, K]
  if k < 3:
    pad = 3 - k
    in_shapes = jnp.pad(in_shapes, ((0, 0), (0, pad), (0, 0)), constant_values=1)
    in_ranks = jnp.pad(in_ranks, ((0, 0), (0, pad)))
  return op, in_shapes, in_ranks, shape, attrs


def flops_all(graph: layout.Graph) -> jax.Array:
  """float32[N]: FLOPs of every node slot from its op, input shapes and attributes."""
  return jax.vmap(ops.flops_jit)(*flop_operands(graph))


# ----------------------------------------------------------------------------------------------
# Measured kernels (jittable lookups; `cost.kernel_table` measures and fills the table)
# ----------------------------------------------------------------------------------------------

# Ops whose time a measured kernel table gives instead of the roofline: their speed varies with
# shapes and groups far more than one per-FLOP coefficient can say (XLA:CPU, 2-core x86_64,
# 2026-12-02: a 3x3 convolution of 128 channels at 56x56 takes 13.4 ms with 32 groups and 8.1 ms
# with 16, twice the FLOPs; at 14x14 the same change goes from 1.9 to 3.2 ms).
# Pools too: XLA:CPU's reduce-window emitter runs a 3x3 stride-2 max pool of 1 x 111 x 111 x 64
# in 0.46 ms and the same pool as nine strided slices (`ops.Impl.TAPS`) in 0.10 ms, a ratio the
# roofline cannot see, so the `impl` rules' pool choice is priced by measurement.
KERNEL_OPS = (Op.MATMUL, Op.CONV2D, Op.CONV_TRANSPOSE, Op.MAX_POOL, Op.AVG_POOL)
NO_KERNEL = 0xFFFFFFFF  # table padding (keys are 31-bit)
UNMEASURED_MS = -1.0  # a kernel the profiler could not time alone: it keeps the roofline
_LAUNCH = [FEATURE_NAMES.index(f"{c}.launch") for c in CLASSES]
_SIBLING_COLS = [FEATURE_NAMES.index(f) for f in SIBLING]
_SIBLING_OF = [FEATURE_NAMES.index(f) for f in ("matmul.gflop", "conv.gflop")]
_EPILOGUE_COLS = [FEATURE_NAMES.index(f"loop.{p}") for p in PER_CLASS]  # on a kernel's row
KERNEL_OPERANDS = 2  # a kernel is timed on its data and weight, without bias or activation
_KERNEL_ACT = {int(Op.MATMUL): _MATMUL_ACT, int(Op.CONV2D): _CONV_ACT,
               int(Op.CONV_TRANSPOSE): _CONV_ACT}


@chex.dataclass(frozen=True)
class KernelTable:
  """Measured times of kernel signatures (`kernel_keys`), for the jitted cost model.

  Attributes:
    keys: uint32[T], the signature keys, ascending; `NO_KERNEL` pads the unused tail.
    ms: float32[T], each kernel's measured time alone (data and weight only: its bias and
      activation epilogue stays the model's, where fusion decides it), less the cost of an
      empty call; `UNMEASURED_MS` for a known kernel that could not be timed alone (it keeps
      the model's estimate and is not reported missing).
  A pytree of fixed capacity T: a table that grows within T reuses compiled code.
  """
  keys: jax.Array
  ms: jax.Array


def kernel_keys(graph: layout.Graph, rows: jax.Array | None = None) -> jax.Array:
  """uint32[N] (or [M] for `rows`): a 31-bit key of every slot's bare kernel (`KERNEL_OPS`):
  op, attributes with the activation cleared, and its first `KERNEL_OPERANDS` inputs' shapes,
  ranks and dtypes (what `cost.kernel_table.bare_kernel` makes of a signature). Unused input
  slots mix nothing, so graphs of any input capacity K agree. Meaningless on other ops."""
  op, in_shapes, in_ranks, _, attrs = flop_operands(graph, rows)
  table = layout.input_table(graph)
  if rows is not None:
    table = table[rows]
  act = jnp.full(op.shape, -1, jnp.int32)
  for code, offset in _KERNEL_ACT.items():
    act = jnp.where(op == code, offset, act)
  attrs = jnp.where(jnp.arange(attrs.shape[-1])[None, :] == act[:, None], 0, attrs)
  valid = (table >= 0) & (jnp.arange(table.shape[-1]) < KERNEL_OPERANDS)[None, :]
  in_dtypes = jnp.where(valid, graph.nodes["dtype"][jnp.maximum(table, 0)], 0)
  h = _mix(jnp.full(op.shape, 0x811C9DC5, jnp.uint32), op)
  for a in range(attrs.shape[-1]):
    h = _mix(h, attrs[:, a])
  for j in range(valid.shape[-1]):
    g = _mix(_mix(h, in_ranks[:, j]), in_dtypes[:, j])
    for d in range(in_shapes.shape[-1]):
      g = _mix(g, in_shapes[:, j, d])
    h = jnp.where(valid[:, j], g, h)
  return h >> 1


def kernel_activation_offset(op: int | str) -> int | None:
  """The attribute index of a kernel op's (`KERNEL_OPS`) fused activation (None: a pool)."""
  return _KERNEL_ACT.get(int(ops.get(op).code))


def lookup_kernels(table: KernelTable, keys: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(bool[M] found, float32[M] measured ms (0 where not)) of `keys` in `table`."""
  pos = jnp.minimum(jnp.searchsorted(table.keys, keys), table.keys.shape[0] - 1)
  hit = table.keys[pos] == keys
  return hit, jnp.where(hit, table.ms[pos], 0.0)


def kernel_rows(op: jax.Array, feats: jax.Array) -> jax.Array:
  """bool[N]: the slots (op codes int32[N], `node_features` rows [N, F]) that launch a kernel
  of `KERNEL_OPS` (a dead, source or unreachable slot launches nothing)."""
  return jnp.isin(op, jnp.asarray(KERNEL_OPS, jnp.int32)) & (jnp.sum(feats[:, _LAUNCH], -1) > 0)


def measured_costs(costs: jax.Array, feats: jax.Array, op: jax.Array, hit: jax.Array,
                   ms: jax.Array, coeffs: CostCoefficients) -> tuple[jax.Array, jax.Array]:
  """(float32[N] node costs, bool[] a kernel missing from the table): each kernel slot whose
  signature the table has (`hit`) costs its measured time `ms`, scaled by the fitted sibling
  discount when it runs beside a sibling (`SIBLING`: concurrency is a property of the graph,
  not of the kernel), plus the model's cost of its epilogue (bias and activation, a loop
  fusion); other slots keep the model's `costs`. `op`: int32[N], the slots' op codes."""
  kernel = kernel_rows(op, feats)
  w = jnp.asarray(coeffs.weights, jnp.float32)
  sib_w, own_w = w[jnp.asarray(_SIBLING_COLS)], w[jnp.asarray(_SIBLING_OF)]
  ratio = jnp.where(own_w > 0, jnp.minimum(sib_w / jnp.where(own_w > 0, own_w, 1.0), 1.0), 1.0)
  sibling = feats[:, _SIBLING_COLS] > 0  # [N, 2]: a MatMul or a Conv2D sibling
  factor = jnp.prod(jnp.where(sibling, ratio[None, :], 1.0), axis=-1)
  epilogue = feats[:, _EPILOGUE_COLS] @ w[jnp.asarray(_EPILOGUE_COLS)]
  use = kernel & hit & (ms >= 0)
  return jnp.where(use, ms * factor + epilogue, costs), jnp.any(kernel & ~hit)


# ----------------------------------------------------------------------------------------------
# Costs (jittable)
# ----------------------------------------------------------------------------------------------

def node_costs_and_misses(graph: layout.Graph, coeffs: CostCoefficients, *,
                          pruned: bool = False,
                          kernels: KernelTable | None = None) -> tuple[jax.Array, jax.Array]:
  """(float32[N] `node_costs`, bool[] some kernel's signature is not in `kernels`)."""
  feats = node_features(graph, coeffs.epilogue_fusion, pruned=pruned)
  costs = feats @ jnp.asarray(coeffs.weights, jnp.float32)
  if kernels is None:
    return costs, jnp.asarray(False)
  return measured_costs(costs, feats, graph.nodes["op"],
                        *lookup_kernels(kernels, kernel_keys(graph)), coeffs)


def node_costs(graph: layout.Graph, coeffs: CostCoefficients, *,
               pruned: bool = False, kernels: KernelTable | None = None) -> jax.Array:
  """float32[N]: the modelled cost in ms of every node slot (0 for dead, source and unreachable
  nodes and for bitcasts; a constant node costs only the once-per-call read of its value when
  it is the representative of a distinct folded weight). Pure; jit and vmap it (no retrace
  within a capacity). `pruned`: see `node_features`. `kernels`: measured kernel times
  (`measured_costs`; signatures not in it keep the model's estimate)."""
  return node_costs_and_misses(graph, coeffs, pruned=pruned, kernels=kernels)[0]


def graph_cost_and_misses(graph: layout.Graph, coeffs: CostCoefficients, *,
                          pruned: bool = False,
                          kernels: KernelTable | None = None) -> tuple[jax.Array, jax.Array]:
  """(float32[] `graph_cost`, bool[] some kernel's signature is not in `kernels`)."""
  costs, missing = node_costs_and_misses(graph, coeffs, pruned=pruned, kernels=kernels)
  return jnp.asarray(coeffs.call_ms, jnp.float32) + jnp.sum(costs), missing


def graph_cost(graph: layout.Graph, coeffs: CostCoefficients, *,
               pruned: bool = False, kernels: KernelTable | None = None) -> jax.Array:
  """float32[]: modelled latency in ms, `call_ms + sum(node_costs)`. Pure and jittable.
  `pruned`, `kernels`: see `node_costs`."""
  return graph_cost_and_misses(graph, coeffs, pruned=pruned, kernels=kernels)[0]


def graph_features(graph: layout.Graph, epilogue_fusion: bool = False) -> jax.Array:
  """float32[F]: the features of the whole graph (sum over nodes); cost = call + w . f."""
  return jnp.sum(node_features(graph, epilogue_fusion), axis=0)
