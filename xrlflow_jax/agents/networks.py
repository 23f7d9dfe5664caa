"""The agent's networks: a GAT-style graph encoder with a global update, two policy heads and a
value head, in Flax linen over the padded graph of `xrlflow_jax.graph.layout`.

Message passing is written directly on the layout's arrays (jraph's GraphsTuple fields:
`senders`, `receivers`, `edges["valid"]`, node `alive`) with `jax.ops.segment_*`; padding edges
(sender N) and dead slots are masked everywhere, so a graph's embedding does not depend on its
capacity or on which slots happen to be free.

Each layer attends in both directions of every edge: a consumer over its inputs (producer ->
consumer) and a producer over its consumers (consumer -> producer), multi-head, with edge
features (the tensor's log shape and the input slot) in keys and values. A global vector is
updated from the mean of the alive nodes and fed back to every node (X-RLflow's global update).

Policy heads over the environment's flat action space (R * L rewrites, then stop):
  * "local": each (rule, location) is scored from the embeddings of the nodes it matched
    (one projection per pattern slot), a learned rule embedding, its cost features
    (`candidate_removed_cost`, `candidate_delta`) and the graph embedding.
  * "candidates" (X-RLflow's): every valid candidate graph one rewrite would produce is built
    (`RuleSet.candidates`: the valid (rule, location) pairs compacted into
    `AgentConfig.max_candidates` slots, one vmapped edit kernel for all rules; empty slots are
    never encoded) and encoded by the same
    GNN; a shared scorer maps the candidate's embedding, its difference to the current graph's,
    the rule embedding and its exact modelled cost change to a logit.
The stop action has its own logit from the graph embedding; the value comes from the same
embedding. Invalid actions are masked by `distributions.MaskedCategorical`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from xrlflow_jax import ops
from xrlflow_jax.agents.distributions import MASKED_LOGIT
from xrlflow_jax.errors import XrlflowError
from xrlflow_jax.graph import layout
from xrlflow_jax.rules.ruleset import RuleSet

HEADS = ("local", "candidates")
NodeCostFn = Callable[[layout.Graph], jax.Array]  # graph -> float32[N]


class AgentError(XrlflowError):
  """A bad agent or training configuration (unknown head, sizes that do not divide, ...)."""


# ----------------------------------------------------------------------------------------------
# Inputs (no parameters)
# ----------------------------------------------------------------------------------------------

@chex.dataclass(frozen=True)
class EncoderInputs:
  """What the encoder reads of one graph (N node slots, E = N * K edge slots).

  Attributes:
    op: int32[N] op codes; dtype: int32[N] dtypes.
    node_feats: float32[N, F]: signed-log attributes, log shape, rank one-hot, flags, level,
      node cost as a fraction of the reference cost.
    tensor_feats: float32[N, Ft]: features of each node's output tensor as it travels along
      the node's out-edges (log shape, constness, dtype); an edge's features are those of its
      sender's tensor plus an embedding of its input slot (edge slot e is slot e % K).
    senders: int32[E] producer slot (N for padding); receivers: int32[E] consumer slot.
    edge_valid: bool[E] the edge exists between two alive nodes; alive: bool[N].
    has_consumer: bool[N] the node is the sender of a valid edge.
  """
  op: jax.Array
  dtype: jax.Array
  node_feats: jax.Array
  tensor_feats: jax.Array
  senders: jax.Array
  receivers: jax.Array
  edge_valid: jax.Array
  alive: jax.Array
  has_consumer: jax.Array


def _signed_log(x: jax.Array) -> jax.Array:
  return jnp.sign(x) * jnp.log1p(jnp.abs(x))


def encoder_inputs(graph: layout.Graph, node_cost: jax.Array, scale: jax.Array) -> EncoderInputs:
  """Features of one graph for the encoder.

  Args:
    graph: a padded graph (N slots, K input slots).
    node_cost: float32[N] modelled per-node costs.
    scale: float32[] the reference cost (the current graph's total); node costs enter as
      fractions of it so features do not depend on the device's absolute speed.
  Returns:
    EncoderInputs of that graph.
  """
  nd = graph.nodes
  n = nd["op"].shape[-1]
  r = ops.MAX_RANK
  alive = nd["alive"]
  rank = jnp.clip(nd["rank"], 0, r)
  pos = jnp.arange(r)
  in_rank = pos[None, :] >= (r - rank)[:, None]  # shapes are right-aligned
  log_shape = jnp.where(in_rank, jnp.log(jnp.maximum(nd["shape"], 1).astype(jnp.float32)), 0.0)
  level = nd["level"].astype(jnp.float32)
  max_level = jnp.max(jnp.where(alive, level, 0.0))
  frac = node_cost / jnp.maximum(scale, 1e-12)
  feats = jnp.concatenate([
      _signed_log(nd["attrs"].astype(jnp.float32)) / 4.0,
      log_shape / 4.0,
      jnp.sum(log_shape, -1, keepdims=True) / 10.0,
      jax.nn.one_hot(rank, r + 1),
      jnp.stack([nd["is_constant"], nd["is_output"], nd["op"] == ops.Op.INPUT,
                 nd["op"] == ops.Op.CONSTANT], -1).astype(jnp.float32),
      (level / (max_level + 1.0))[:, None],
      frac[:, None] * 10.0,
      jnp.log1p(100.0 * jnp.maximum(frac, 0.0))[:, None],
  ], axis=-1)
  feats = jnp.where(alive[:, None], feats, 0.0)

  senders = graph.senders
  safe = jnp.minimum(senders, n - 1)
  edge_valid = graph.edges["valid"] & (senders < n) & alive[safe] & alive[graph.receivers]
  tensor_feats = jnp.concatenate([
      log_shape / 4.0,
      nd["is_constant"][:, None].astype(jnp.float32),
      jax.nn.one_hot(nd["dtype"], len(ops.DType)),
  ], axis=-1)
  tensor_feats = jnp.where(alive[:, None], tensor_feats, 0.0)
  senders = jnp.where(edge_valid, senders, n)
  has_consumer = jnp.zeros([n + 1], bool).at[senders].set(True)[:n]
  return EncoderInputs(op=jnp.where(alive, nd["op"], 0), dtype=jnp.where(alive, nd["dtype"], 0),
                       node_feats=feats, tensor_feats=tensor_feats, senders=senders,
                       receivers=graph.receivers, edge_valid=edge_valid, alive=alive,
                       has_consumer=has_consumer)


@chex.dataclass(frozen=True)
class CandidateInputs:
  """The `candidates` head's built candidates (C compacted slots).

  Attributes:
    graphs: EncoderInputs with a leading axis C.
    index: int32[C], the flat action (rule * L + location) of each slot.
    used: bool[C], the slot holds a built candidate (the rest are padding).
  """
  graphs: Any
  index: jax.Array
  used: jax.Array


@chex.dataclass(frozen=True)
class LocalCandidates:
  """The valid (rule, location) pairs the `local` head scores, compacted into C slots.

  Attributes:
    index: int32[C], the flat action (rule * L + location) of each slot (0 where unused).
    used: bool[C], the slot holds a valid candidate.
  """
  index: jax.Array
  used: jax.Array


# ----------------------------------------------------------------------------------------------
# Modules
# ----------------------------------------------------------------------------------------------

def _masked_mean(h: jax.Array, mask: jax.Array) -> jax.Array:
  """float32[H]: mean of rows of h[N, H] where mask[N] (zeros if none)."""
  w = mask.astype(h.dtype)[:, None]
  return jnp.sum(h * w, 0) / jnp.maximum(jnp.sum(w), 1.0)


def _masked_max(h: jax.Array, mask: jax.Array) -> jax.Array:
  """float32[H]: max of rows of h[N, H] where mask[N] (zeros if none)."""
  m = jnp.max(jnp.where(mask[:, None], h, -1e9), 0)
  return jnp.where(jnp.any(mask), m, 0.0)


def segment_softmax_sum(logits: jax.Array, values: jax.Array, valid: jax.Array,
                        segments: jax.Array, num_segments: int) -> jax.Array:
  """Attention-weighted sum of `values` per segment (softmax over each segment's valid rows).

  Args:
    logits: float32[E, h] attention logits; values: float32[E, h, d].
    valid: bool[E] rows that take part; segments: int32[E] in [0, num_segments] (the extra
      segment `num_segments` collects padding and is dropped).
    num_segments: S.
  Returns:
    float32[S, h, d]; zero for segments with no valid row.
  """
  logits = jnp.where(valid[:, None], logits, -1e9)
  top = jax.ops.segment_max(logits, segments, num_segments + 1)
  # Empty segments give -inf; keep every exponent finite so masked rows have zero gradient.
  top = jax.lax.stop_gradient(jnp.where(jnp.isfinite(top), top, 0.0))
  w = jnp.where(valid[:, None], jnp.exp(logits - top[segments]), 0.0)
  den = jax.ops.segment_sum(w, segments, num_segments + 1)
  num = jax.ops.segment_sum(w[..., None] * values, segments, num_segments + 1)
  return (num / jnp.maximum(den, 1e-9)[..., None])[:num_segments]


def _scatter_scores(scores: jax.Array, index: jax.Array, used: jax.Array, actions: int
                    ) -> jax.Array:
  """float32[actions]: the scores float32[C] of compacted slots at their flat actions
  int32[C] (slots not `used` bool[C] scatter nowhere); MASKED_LOGIT everywhere else."""
  target = jnp.where(used, index, actions)
  return jnp.full([actions], MASKED_LOGIT, scores.dtype).at[target].set(scores, mode="drop")


class MLP(nn.Module):
  """Dense layers with ReLU between them (none after the last)."""
  features: tuple[int, ...]

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    for i, f in enumerate(self.features):
      x = nn.Dense(f)(x)
      if i + 1 < len(self.features):
        x = nn.relu(x)
    return x


def _head_sum(x: jax.Array, heads: int) -> jax.Array:
  """float32[..., heads]: sums of the `heads` contiguous blocks of x float32[..., H]."""
  return jnp.sum(x.reshape(x.shape[:-1] + (heads, x.shape[-1] // heads)), -1)


def _head_repeat(w: jax.Array, hid: int) -> jax.Array:
  """float32[..., H]: each of w's float32[..., heads] entries repeated over its head's block."""
  return jnp.repeat(w, hid // w.shape[-1], axis=-1)


def gat_update(h: jax.Array, g: jax.Array, fwd: jax.Array, bwd: jax.Array,
               alive: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The end of a GAT layer, called in its compact `__call__` (the parameters "global",
  "global_norm", "update" and "norm" are that layer's): the global embedding g float32[H] is
  updated from the mean of the alive nodes, then every node of h float32[N, H] from itself, its
  forward and backward messages fwd, bwd float32[N, H] and the new global one. alive: bool[N].
  Returns (h' float32[N, H], zero where not alive; g' float32[H])."""
  n, hid = h.shape
  g_new = g + MLP((hid, hid), name="global")(jnp.concatenate([g, _masked_mean(h, alive)]))
  g_new = nn.LayerNorm(name="global_norm")(g_new)
  upd = MLP((2 * hid, hid), name="update")(
      jnp.concatenate([h, fwd, bwd, jnp.broadcast_to(g_new, (n, hid))], -1))
  h = nn.LayerNorm(name="norm")(h + upd)
  return jnp.where(alive[:, None], h, 0.0), g_new


class GATLayer(nn.Module):
  """One round of two-way multi-head edge attention with a global update.

  Keys and values of an edge are linear in [neighbour embedding, edge embedding], and an edge's
  embedding is its sender's tensor embedding plus its slot embedding. Edge n * K + k ends at
  node n, so everything that depends on the receiver or the slot is a broadcast over the
  reshaped [N, K] edge axis; what depends on the sender is summed per node first and fetched
  with three gathers per layer (forward keys, forward values, backward queries: [N * K, H]
  each).

  In the backward direction (a producer over its consumers), the sender's tensor term of a key
  is the same for every edge of the producer's softmax, so it cancels and is not computed; the
  tensor term of the values has weights summing to one, so it is added once per producer that
  has a consumer. Both are exact rewrites of attention over per-edge keys and values
  (`tests/test_agents.py` keeps that formulation as a reference).

  Attributes:
    hidden: H (divisible by `heads`); heads: attention heads.
  """
  hidden: int
  heads: int

  @nn.compact
  def __call__(self, h: jax.Array, g: jax.Array, t: jax.Array, slot: jax.Array,
               x: EncoderInputs) -> tuple[jax.Array, jax.Array]:
    """h: float32[N, H] nodes; g: float32[H] global; t: float32[N, H] tensor embeddings;
    slot: float32[K, H] input-slot embeddings -> (h', g')."""
    n, hid = h.shape
    k = slot.shape[0]
    heads, d = self.heads, hid // self.heads
    scale = 1.0 / math.sqrt(d)

    def proj(name, a, bias=True):
      return nn.Dense(hid, use_bias=bias, name=name)(a)

    q_f, q_b = proj("fwd_q", h), proj("bwd_q", h)
    k_b, v_b = proj("bwd_k", h), proj("bwd_v", h)  # at the receiver: a broadcast over K
    # What each edge needs of its sender, summed per node and gathered (row N, zeros, for
    # padding edges): [N, K, H] each. Three gathers, not one of a concatenation: the backward
    # pass then scatter-adds each cotangent as it is.
    fek, fev = nn.Dense(hid, False, name="fwd_ek"), nn.Dense(hid, False, name="fwd_ev")
    bek, bev = nn.Dense(hid, False, name="bwd_ek"), nn.Dense(hid, False, name="bwd_ev")
    key_f, val_f, q_e = (jnp.concatenate([a, jnp.zeros([1, hid], a.dtype)])[x.senders]
                         .reshape(n, k, hid)
                         for a in (proj("fwd_k", h) + fek(t), proj("fwd_v", h) + fev(t), q_b))
    valid = x.edge_valid.reshape(n, k, 1)

    # Forward: each consumer attends over its K input slots (a softmax over the K axis).
    key = key_f + fek(slot)
    val = val_f + fev(slot)
    logits = jnp.where(valid, _head_sum(q_f[:, None, :] * key, heads) * scale, -1e9)
    w = jnp.where(valid, jax.nn.softmax(logits, axis=1), 0.0)  # [N, K, heads]
    fwd = jnp.sum(_head_repeat(w, hid) * val, 1)
    # Backward: each producer attends over its consumers (any number): segment softmax.
    key = k_b[:, None, :] + bek(slot)  # [N, K, H]: receiver and slot terms
    logits = _head_sum(q_e * key, heads) * scale
    val = v_b[:, None, :] + bev(slot)
    bwd = segment_softmax_sum(logits.reshape(n * k, heads), val.reshape(n * k, heads, d),
                              x.edge_valid, x.senders, n).reshape(n, hid)
    bwd = bwd + jnp.where(x.has_consumer[:, None], bev(t), 0.0)

    return gat_update(h, g, fwd, bwd, x.alive)


class GraphEncoder(nn.Module):
  """The GNN: embeddings of the node inputs, `layers` GAT layers, pooled graph embedding.

  Returns (node embeddings float32[N, H], graph embedding float32[H]). With `remat`, each
  layer's activations are recomputed in the backward pass instead of stored (the `candidates`
  head encodes R * L graphs per observation; without it their edge activations dominate memory).
  `gat_layer`: the layer's module class, built as `gat_layer(hidden, heads, name=...)` and
  called as `GATLayer` is (a reference formulation with the same parameters can stand in).
  """
  hidden: int = 64
  layers: int = 5
  heads: int = 4
  remat: bool = False
  gat_layer: type[nn.Module] = GATLayer

  @nn.compact
  def __call__(self, x: EncoderInputs) -> tuple[jax.Array, jax.Array]:
    hid = self.hidden
    layer = nn.remat(self.gat_layer) if self.remat else self.gat_layer
    op = nn.Embed(len(ops.Op), hid, name="op_embed")(x.op)
    dt = nn.Embed(len(ops.DType), hid // 4, name="dtype_embed")(x.dtype)
    h = MLP((hid, hid), name="node_in")(jnp.concatenate([op, dt, x.node_feats], -1))
    h = jnp.where(x.alive[:, None], nn.LayerNorm(name="node_in_norm")(h), 0.0)
    n = x.op.shape[0]
    t = MLP((hid, hid), name="tensor_in")(x.tensor_feats)
    slot = nn.Embed(x.senders.shape[0] // n, hid, name="slot_embed")(
        jnp.arange(x.senders.shape[0] // n))
    g = MLP((hid,), name="global_in")(_masked_mean(h, x.alive))
    for i in range(self.layers):
      h, g = layer(hid, self.heads, name=f"gat_{i}")(h, g, t, slot, x)
    pooled = jnp.concatenate([_masked_mean(h, x.alive), _masked_max(h, x.alive), g])
    return h, MLP((hid, hid), name="pool")(pooled)


class ActorCritic(nn.Module):
  """Policy logits over R * L + 1 actions and a value, for one observation.

  Attributes:
    head: "local" or "candidates"; num_rules: R; max_locations: L; hidden, layers, heads:
    encoder sizes; remat: recompute encoder activations in the backward pass.
    rule_widths: the nodes each rule binds (P_r <= P, `Rule.num_bound`), R of them; the `local`
      head reads only those slots of a location (None: all P of every rule).
    gat_layer: the encoder's layer class (`GraphEncoder.gat_layer`).
  """
  head: str
  num_rules: int
  max_locations: int
  hidden: int = 64
  layers: int = 5
  heads: int = 4
  remat: bool = False
  rule_widths: tuple[int, ...] | None = None
  gat_layer: type[nn.Module] = GATLayer

  def setup(self):
    hid = self.hidden
    # One set of encoder parameters, applied to a leading batch of graphs (the current graph,
    # then candidates for the `candidates` head).
    self.encoder = nn.vmap(GraphEncoder, in_axes=0, out_axes=0,
                           variable_axes={"params": None}, split_rngs={"params": False})(
                               hid, self.layers, self.heads, self.remat, self.gat_layer,
                               name="encoder")
    self.value_head = MLP((hid, hid, 1), name="value_head")
    self.stop_head = MLP((hid, 1), name="stop_head")
    self.rule_embed = nn.Embed(self.num_rules, hid, name="rule_embed")
    self.cost_in = nn.Dense(hid, name="cost_in")
    if self.head == "local":
      self.slot_in = nn.DenseGeneral(hid, axis=(-2, -1), name="slot_in")
      self.context_in = nn.Dense(hid, name="context_in")
      self.scorer = MLP((hid, hid, 1), name="local_scorer")
    elif self.head == "candidates":
      self.scorer = MLP((hid, hid, 1), name="candidate_scorer")
    else:
      raise AgentError(f"unknown policy head {self.head!r}; use one of {HEADS}")

  def encode(self, current: EncoderInputs) -> tuple[jax.Array, jax.Array]:
    """(node embeddings float32[N, H], graph embedding float32[H]) of one graph."""
    h, emb = self.encoder(jax.tree_util.tree_map(lambda a: a[None], current))
    return h[0], emb[0]

  def value(self, current: EncoderInputs) -> jax.Array:
    """float32[]: the value of the current graph alone (no policy head)."""
    return self.value_head(self.encode(current)[1])[0]

  def local_scores(self, h: jax.Array, emb: jax.Array, cand_nodes: jax.Array,
                   cost_feats: jax.Array, compact: LocalCandidates | None = None) -> jax.Array:
    """The `local` head: float32[R, L] scores from node embeddings h float32[N, H], the graph
    embedding float32[H], matched nodes int32[R, L, P] and cost features float32[R, L, C].

    With `compact`, only the C compacted candidates are scored (-1e9 elsewhere: masked, or not
    offered): the same scores as the dense head at those actions."""
    r, l = self.num_rules, self.max_locations
    if compact is not None:
      return self._compact_scores(h, emb, cand_nodes, cost_feats, compact)
    rules = self.rule_embed(jnp.arange(r))[:, None, :]  # [R, 1, H], broadcast over L
    z = (self._slot_terms(h, cand_nodes) + rules + self.cost_in(cost_feats)
         + self.context_in(emb)[None, None, :])
    return self.scorer(nn.relu(z))[..., 0].reshape(r, l)

  def _compact_scores(self, h: jax.Array, emb: jax.Array, cand_nodes: jax.Array,
                      cost_feats: jax.Array, compact: LocalCandidates) -> jax.Array:
    """float32[R, L]: the local head over C compacted (rule, location) slots, scattered back.

    Every slot gathers all P matched nodes (unbound ones, -1, read the zero row), so its
    `slot_in` term equals the dense head's per-width product."""
    r, l = self.num_rules, self.max_locations
    n, hid = h.shape[0], self.hidden
    index = compact.index  # [C]
    nodes = cand_nodes.reshape(r * l, -1)[index]  # [C, P]
    h_pad = jnp.concatenate([h, jnp.zeros([1, hid], h.dtype)])
    slots = self.slot_in(h_pad[jnp.where(nodes >= 0, nodes, n)])  # [C, H]
    z = (slots + self.rule_embed(index // l) + self.cost_in(cost_feats.reshape(r * l, -1)[index])
         + self.context_in(emb)[None, :])
    scores = self.scorer(nn.relu(z))[..., 0]  # [C]
    return _scatter_scores(scores, index, compact.used, r * l).reshape(r, l)

  def _slot_terms(self, h: jax.Array, cand_nodes: jax.Array) -> jax.Array:
    """float32[R, L, H]: `slot_in` (a DenseGeneral over the P matched nodes' embeddings) of every
    (rule, location), reading only the P_r slots rule r binds: rules are grouped by width and
    each group is one gather and one product over its own P_r slots. The slots beyond P_r are
    always unmatched (-1, a zero embedding), so this is the same function as the product over all
    P slots, without gathering zeros: with the 120 built-in rules (P = 17, sum of P_r = 564) a
    third of the rows."""
    r, l = self.num_rules, self.max_locations
    n, p, hid = h.shape[0], cand_nodes.shape[-1], self.hidden
    h_pad = jnp.concatenate([h, jnp.zeros([1, hid], h.dtype)])
    widths = self.rule_widths
    if widths is None:
      slots = h_pad[jnp.where(cand_nodes >= 0, cand_nodes, n)]  # [R, L, P, H]
      return self.slot_in(slots)
    if len(widths) != r or max(widths) > p or min(widths) < 1:
      raise AgentError(f"rule_widths {widths} do not fit {r} rules binding at most {p} nodes")
    self.slot_in(jnp.zeros([1, p, hid], h.dtype))  # creates the parameters at init (dead code after)
    kernel = self.slot_in.variables["params"]["kernel"]  # [P, H, H]
    bias = self.slot_in.variables["params"]["bias"]
    groups: dict[int, list[int]] = {}
    for rule, w in enumerate(widths):
      groups.setdefault(int(w), []).append(rule)
    parts, order = [], []
    for w, members in sorted(groups.items()):
      nodes = cand_nodes[np.asarray(members), :, :w]  # [R_w, L, w]
      slots = h_pad[jnp.where(nodes >= 0, nodes, n)]  # [R_w, L, w, H]
      parts.append(slots.reshape(len(members), l, w * hid) @ kernel[:w].reshape(w * hid, hid))
      order.extend(members)
    z = jnp.concatenate(parts, 0)  # [R, L, H] in group order
    if order != list(range(r)):
      z = z[np.argsort(np.asarray(order))]
    return z + bias

  def __call__(self, current: EncoderInputs, cand_nodes: jax.Array, cost_feats: jax.Array,
               candidates: CandidateInputs | LocalCandidates | None = None
               ) -> tuple[jax.Array, jax.Array]:
    """Logits float32[R * L + 1] (unmasked; stop last) and value float32[].

    Args:
      current: the current graph's encoder inputs.
      cand_nodes: int32[R, L, P] matched nodes of every (rule, location).
      cost_feats: float32[R, L, C] cost features of every candidate.
      candidates: (the `candidates` head) the C built candidates: their encoder inputs, flat
        actions and whether each was built (`CandidateInputs`); (the `local` head, optional)
        the C compacted valid candidates it scores (`LocalCandidates`; None: all R * L).
    """
    r, l = self.num_rules, self.max_locations
    if self.head == "local":
      h, emb = self.encode(current)
      scores = self.local_scores(h, emb, cand_nodes, cost_feats, candidates)
    else:
      rules = jnp.broadcast_to(self.rule_embed(jnp.arange(r))[:, None, :], (r, l, self.hidden))
      if candidates is None:
        raise AgentError("the candidates head needs the candidate graphs' encoder inputs")
      both = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a[None], b], 0), current,
                                    candidates.graphs)
      _, embs = self.encoder(both)
      emb, cand = embs[0], embs[1:]  # [H], [C, H]
      idx = candidates.index
      cost_c = cost_feats.reshape(r * l, -1)[idx]
      z = jnp.concatenate([cand, cand - emb, rules.reshape(r * l, -1)[idx],
                           self.cost_in(cost_c)], -1)
      scores = _scatter_scores(self.scorer(z)[..., 0], idx, candidates.used, r * l)
    logits = jnp.concatenate([scores.reshape(-1), self.stop_head(emb)])
    return logits, self.value_head(emb)[0]


# ----------------------------------------------------------------------------------------------
# The agent: observation -> (logits, value)
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AgentConfig:
  """Network configuration: 5 GAT layers of width 32 with 4 heads. Width 32 learned as width 64
  did on tiny BERT at ~2.7x the PPO throughput on a 2-core CPU (docs/results/learner.md).

  Attributes:
    head: "local" (scales to large graphs) or "candidates" (X-RLflow's; builds and encodes
      every valid candidate graph: one encoder pass per candidate slot, see max_candidates).
    hidden: H; layers: GAT layers; heads: attention heads (divides H).
    remat: recompute the encoder's activations in the backward pass (less memory, ~1/3 more
      compute; worth it for the `candidates` head).
    max_candidates: the head scores only the valid candidates, compacted in action order into
      this many slots (X-RLflow capped its candidates at 500); valid candidates beyond it are
      not offered (their logits are -1e9). The `candidates` head builds and encodes each slot's
      graph; the `local` head scores C slots instead of all R * L (most of which are invalid
      where many rules are loaded: SqueezeNet with every built-in rule has 2,624). 0: R * L
      slots, every candidate. The default, 256, is twice the most valid candidates a random
      30-step rollout met on the zoo's default-size SqueezeNet, ResNeXt-50 and Inception-v3
      with every built-in rule, tiny BERT and BERT-base ONNX (58, 126, 87, 20, 68).
  """
  head: str = "local"
  hidden: int = 32
  layers: int = 5
  heads: int = 4
  remat: bool = False
  max_candidates: int = 256

  def validate(self) -> None:
    if self.head not in HEADS:
      raise AgentError(f"unknown policy head {self.head!r}; use one of {HEADS}")
    if self.hidden < 4 or self.hidden % self.heads or self.hidden % 4:
      raise AgentError(f"hidden ({self.hidden}) must be a multiple of 4 and of heads "
                       f"({self.heads})")
    if self.layers < 1:
      raise AgentError(f"layers must be >= 1, got {self.layers}")
    if self.max_candidates < 0:
      raise AgentError(f"max_candidates must be >= 0 (0: every candidate), got "
                       f"{self.max_candidates}")


class Agent:
  """Binds the network to one RuleSet and cost model: `apply(params, obs) -> (logits, value)`.

  Functions take ONE observation (`env.Observation`, unbatched); vmap them over a batch.

  Args:
    ruleset: the environment's RuleSet (R rules, L locations).
    node_cost_fn: graph -> float32[N] modelled per-node costs (node features and cost scale
      when an observation does not carry `node_costs`, and the exact cost change of candidates
      in the `candidates` head).
    config: AgentConfig.
  """

  def __init__(self, ruleset: RuleSet, node_cost_fn: NodeCostFn, config: AgentConfig):
    config.validate()
    self.ruleset = ruleset
    self.node_cost_fn = node_cost_fn
    self.config = config
    self.num_actions = ruleset.num_actions + 1
    self.network = ActorCritic(config.head, len(ruleset), ruleset.max_locations, config.hidden,
                               config.layers, config.heads, config.remat,
                               tuple(rule.num_bound for rule in ruleset.rules))

  def __fingerprint__(self) -> tuple:
    """`trace_cache.fingerprint`: the network is built from these (its layer and rule widths
    too: a caller may swap them in with `network.clone`)."""
    layer = self.network.gat_layer
    return (self.ruleset, self.node_cost_fn, self.config,
            f"{layer.__module__}.{layer.__qualname__}", self.network.rule_widths)

  def _node_costs(self, obs: Any) -> jax.Array:
    """float32[N]: the observation's node costs (computed once per step by the environment),
    or, for observations without them, `node_cost_fn` of the graph."""
    costs = getattr(obs, "node_costs", None)
    return self.node_cost_fn(obs.graph) if costs is None else costs

  def _inputs(self, obs: Any) -> tuple[Any, ...]:
    graph = obs.graph
    costs = self._node_costs(obs)
    scale = jnp.sum(costs) + 1e-9
    current = encoder_inputs(graph, costs, scale)
    r, l = len(self.ruleset), self.ruleset.max_locations
    mask = obs.action_mask[:-1].reshape(r, l)
    if self.config.head == "candidates":
      graphs, index, ok = self.ruleset.candidates(graph, obs.candidate_nodes, mask,
                                                  self.config.max_candidates or None)
      cand_costs = jax.vmap(self.node_cost_fn)(graphs)
      target = jnp.where(ok, index, r * l)  # slots without a built candidate scatter nowhere
      delta = jnp.zeros([r * l], jnp.float32).at[target].set(
          jnp.where(ok, jnp.sum(cand_costs, -1) - jnp.sum(costs), 0.0), mode="drop")
      delta = delta.reshape(r, l)
      candidates = CandidateInputs(
          graphs=jax.vmap(encoder_inputs, in_axes=(0, 0, None))(graphs, cand_costs, scale),
          index=index, used=ok)
    else:
      delta, candidates = obs.candidate_delta, None
      slots = self.config.max_candidates
      if slots and slots < r * l:
        index, used = self.ruleset.compact_actions(mask, slots)
        candidates = LocalCandidates(index=index, used=used)
    removed = obs.candidate_removed_cost / scale
    delta = delta / scale
    cost_feats = jnp.stack([removed * 10.0, delta * 10.0, _signed_log(100.0 * delta),
                            mask.astype(jnp.float32)], -1)
    return current, obs.candidate_nodes, jnp.where(mask[..., None], cost_feats, 0.0), candidates

  def init(self, key: jax.Array, obs: Any) -> Any:
    """Parameters from one (unbatched) example observation."""
    return self.network.init(key, *self._inputs(obs))

  def apply(self, params: Any, obs: Any) -> tuple[jax.Array, jax.Array]:
    """(logits float32[R * L + 1], value float32[]) for one observation; mask the logits with
    `obs.action_mask` (`distributions.MaskedCategorical`)."""
    return self.network.apply(params, *self._inputs(obs))

  def value(self, params: Any, obs: Any) -> jax.Array:
    """float32[]: the value alone (cheaper: no policy head, no candidate graphs)."""
    costs = self._node_costs(obs)
    current = encoder_inputs(obs.graph, costs, jnp.sum(costs) + 1e-9)
    return self.network.apply(params, current, method=ActorCritic.value)
