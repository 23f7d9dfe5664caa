"""Transformer benchmark models of X-RLflow: BERT, ViT, mini-DALL-E and Transformer-Transducer.

Sequences are 2-D [tokens, width] (batch 1 folded away, as in TASO's BERT example), so every
projection is a plain [S, D] @ [D, D'] matmul. Unlike TASO's BERT example, each layer's output
feeds the next layer. Attention keeps Q, K and V as separate matmuls (see `layers.attention`).
"""

from __future__ import annotations

import dataclasses

from xrlflow_jax.errors import ModelError
from xrlflow_jax.graph import GraphBuilder, Tensor
from xrlflow_jax.models import registry
from xrlflow_jax.models.layers import (activate, attention, causal_mask, check_positive,
                                       layer_norm, linear)


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  """A stack of transformer layers: `seq` tokens of width `hidden`, FFN width `mlp`."""
  seq: int
  hidden: int
  layers: int
  heads: int
  mlp: int


def _ffn(b: GraphBuilder, x: Tensor, mlp: int, name: str) -> Tensor:
  """Feed-forward x [S, D] -> [S, D]: linear to `mlp`, GELU, linear back."""
  h = linear(b, x, mlp, f"{name}.fc1", act="gelu")
  return linear(b, h, x.shape[-1], f"{name}.fc2")


def post_ln_layer(b: GraphBuilder, x: Tensor, heads: int, mlp: int, name: str) -> Tensor:
  """BERT's layer: x = LN(x + attn(x)); x = LN(x + ffn(x)), on x [S, D]."""
  a = attention(b, x, heads, f"{name}.attention")
  x = layer_norm(b, b.add(x, a, name=f"{name}.attention.residual"), f"{name}.attention.norm")
  f = _ffn(b, x, mlp, f"{name}.ffn")
  return layer_norm(b, b.add(x, f, name=f"{name}.ffn.residual"), f"{name}.ffn.norm")


def pre_ln_layer(b: GraphBuilder, x: Tensor, heads: int, mlp: int, name: str,
                 mask: Tensor | None = None) -> Tensor:
  """ViT / T-T layer: x = x + attn(LN(x), mask); x = x + ffn(LN(x)), on x [S, D]."""
  a = attention(b, layer_norm(b, x, f"{name}.norm1"), heads, f"{name}.attention", mask=mask)
  x = b.add(x, a, name=f"{name}.attention.residual")
  f = _ffn(b, layer_norm(b, x, f"{name}.norm2"), mlp, f"{name}.ffn")
  return b.add(x, f, name=f"{name}.ffn.residual")


def _position_embedding(b: GraphBuilder, x: Tensor, name: str) -> Tensor:
  """Adds a learned position embedding [S, D] to x [S, D]."""
  pos = b.weight(x.shape, name=name, fan_in=2500)  # std 1/sqrt(2500) = 0.02, BERT's init range
  return b.add(x, pos, name=f"{name}.add")


# ------------------------------------------------------------------ BERT

def bert(b: GraphBuilder, cfg: EncoderConfig) -> None:
  """BERT encoder (post-LN): embeddings [seq, hidden] -> hidden states [seq, hidden]."""
  check_positive(b.name, **dataclasses.asdict(cfg))
  x = b.input((cfg.seq, cfg.hidden), name="embeddings")
  for i in range(cfg.layers):
    x = post_ln_layer(b, x, cfg.heads, cfg.mlp, f"encoder.layer.{i}")
  b.output(x)


# ------------------------------------------------------------------ ViT

@dataclasses.dataclass(frozen=True)
class ViTConfig:
  """ViT on an image of `image` pixels cut into `patch`-pixel patches ((image/patch)^2 tokens)."""
  image: int
  patch: int
  hidden: int
  layers: int
  heads: int
  mlp: int
  classes: int


def vit(b: GraphBuilder, cfg: ViTConfig) -> None:
  """ViT (pre-LN, mean-pooled tokens, no class token): [1, 3, image, image] -> [1, classes]."""
  check_positive(b.name, **dataclasses.asdict(cfg))
  if cfg.image % cfg.patch:
    raise ModelError(f"{b.name}: image {cfg.image} is not a multiple of patch {cfg.patch}")
  grid = cfg.image // cfg.patch
  tokens = grid * grid
  img = b.input((1, 3, cfg.image, cfg.image), name="image")
  w = b.weight((cfg.hidden, 3, cfg.patch, cfg.patch), name="patch_embed.weight")
  bias = b.weight((cfg.hidden,), name="patch_embed.bias", init="bias")
  x = b.conv2d(img, w, bias, strides=(cfg.patch, cfg.patch), padding="VALID", name="patch_embed")
  x = b.transpose(b.reshape(x, (cfg.hidden, tokens)), (1, 0), name="tokens")  # [T, D]
  x = _position_embedding(b, x, "pos_embed")
  for i in range(cfg.layers):
    x = pre_ln_layer(b, x, cfg.heads, cfg.mlp, f"encoder.layer.{i}")
  x = layer_norm(b, x, "norm")
  x = b.reduce_mean(x, axes=(0,), keepdims=True, name="pool")  # [1, D]
  b.output(linear(b, x, cfg.classes, "head"))


# ------------------------------------------------------------------ mini-DALL-E

@dataclasses.dataclass(frozen=True)
class DalleConfig:
  """mini-DALL-E decoder: `seq` image tokens from a `vocab`-entry codebook, GEGLU FFN `ffn`."""
  seq: int
  hidden: int
  layers: int
  heads: int
  ffn: int
  vocab: int


def _geglu(b: GraphBuilder, x: Tensor, width: int, name: str) -> Tensor:
  """Gated FFN (GEGLU, bias-free as in dalle-mini): (gelu(x W0) * (x W1)) W2, x [S, D]."""
  gate = activate(b, linear(b, x, width, f"{name}.wi_0", bias=False), "gelu", f"{name}.gelu")
  up = linear(b, x, width, f"{name}.wi_1", bias=False)
  h = b.mul(gate, up, name=f"{name}.gated")
  h = layer_norm(b, h, f"{name}.norm")  # NormFormer's LN on the gated activations
  return linear(b, h, x.shape[-1], f"{name}.wo", bias=False)


def mini_dalle(b: GraphBuilder, cfg: DalleConfig) -> None:
  """mini-DALL-E decoder stack: token ids int32 [seq] -> next-token logits [seq, vocab].

  Pre-LN layers with causal self-attention (a constant additive mask on the scores) and a GEGLU
  feed-forward; projections are bias-free.
  """
  check_positive(b.name, **dataclasses.asdict(cfg))
  ids = b.input((cfg.seq,), dtype="int32", name="tokens")
  table = b.weight((cfg.vocab, cfg.hidden), name="embed_tokens", fan_in=1)
  x = b.gather(table, ids, axis=0, name="embed")  # [S, D]
  x = _position_embedding(b, x, "embed_positions")
  mask = causal_mask(b, cfg.seq, "causal_mask")
  for i in range(cfg.layers):
    name = f"decoder.layer.{i}"
    a = attention(b, layer_norm(b, x, f"{name}.norm1"), cfg.heads, f"{name}.attention",
                  mask=mask, bias=False)
    x = b.add(x, a, name=f"{name}.attention.residual")
    f = _geglu(b, layer_norm(b, x, f"{name}.norm2"), cfg.ffn, f"{name}.glu")
    x = b.add(x, f, name=f"{name}.glu.residual")
  x = layer_norm(b, x, "final_norm")
  b.output(linear(b, x, cfg.vocab, "lm_head", bias=False))


# ------------------------------------------------------------------ Transformer-Transducer

@dataclasses.dataclass(frozen=True)
class TransducerConfig:
  """Transformer-Transducer: an audio encoder over `frames` x `features` acoustic frames, a label
  encoder over `labels` previous tokens of a `vocab`-entry vocabulary, and a joint network."""
  frames: int
  features: int
  labels: int
  vocab: int
  hidden: int
  audio_layers: int
  label_layers: int
  heads: int
  mlp: int


def transformer_transducer(b: GraphBuilder, cfg: TransducerConfig) -> None:
  """T-T: audio float [frames, features] and label ids int32 [labels] -> logits
  [frames, labels, vocab].

  Audio encoder: input projection, position embedding, pre-LN layers with full attention.
  Label encoder: token embedding, position embedding, pre-LN layers with causal attention.
  Joint: project both, broadcast add [T, 1, D] + [1, U, D], tanh, project to the vocabulary.
  """
  check_positive(b.name, **dataclasses.asdict(cfg))
  audio = b.input((cfg.frames, cfg.features), name="audio")
  labels = b.input((cfg.labels,), dtype="int32", name="labels")

  a = linear(b, audio, cfg.hidden, "audio.input_proj")
  a = _position_embedding(b, a, "audio.pos_embed")
  for i in range(cfg.audio_layers):
    a = pre_ln_layer(b, a, cfg.heads, cfg.mlp, f"audio.layer.{i}")
  a = layer_norm(b, a, "audio.norm")

  table = b.weight((cfg.vocab, cfg.hidden), name="label.embed", fan_in=1)
  u = b.gather(table, labels, axis=0, name="label.embed_lookup")
  u = _position_embedding(b, u, "label.pos_embed")
  mask = causal_mask(b, cfg.labels, "label.causal_mask")
  for i in range(cfg.label_layers):
    u = pre_ln_layer(b, u, cfg.heads, cfg.mlp, f"label.layer.{i}", mask=mask)
  u = layer_norm(b, u, "label.norm")

  ja = b.reshape(linear(b, a, cfg.hidden, "joint.audio_proj"), (cfg.frames, 1, cfg.hidden))
  ju = b.reshape(linear(b, u, cfg.hidden, "joint.label_proj", bias=False),
                 (1, cfg.labels, cfg.hidden))
  j = b.tanh(b.add(ja, ju, name="joint.add"), name="joint.tanh")  # [T, U, D]
  b.output(linear(b, j, cfg.vocab, "joint.out"))


registry.register(
    "bert", "transformer",
    "BERT as in X-RLflow: 8 post-LN layers, seq 64, hidden 1024, 16 heads, MLP 4096",
    bert,
    {"default": EncoderConfig(seq=64, hidden=1024, layers=8, heads=16, mlp=4096),
     "tiny": EncoderConfig(seq=16, hidden=64, layers=2, heads=4, mlp=256)})
registry.register(
    "vit", "transformer",
    "ViT-Base: 64 patches (128x128 image, 16x16 patches) x 768, 12 layers, 12 heads, MLP 3072",
    vit,
    {"default": ViTConfig(image=128, patch=16, hidden=768, layers=12, heads=12, mlp=3072,
                          classes=1000),
     "tiny": ViTConfig(image=32, patch=8, hidden=64, layers=2, heads=4, mlp=128, classes=10)})
registry.register(
    "mini_dalle", "transformer",
    "mini-DALL-E decoder: 16 tokens x 768, 8 layers, 12 heads, GEGLU 2048, causal mask",
    mini_dalle,
    {"default": DalleConfig(seq=16, hidden=768, layers=8, heads=12, ffn=2048, vocab=16384),
     "tiny": DalleConfig(seq=8, hidden=64, layers=2, heads=4, ffn=128, vocab=64)})
registry.register(
    "transformer_transducer", "transformer",
    "Transformer-Transducer: 80 audio frames, d 512, 12 audio + 2 label layers, 8 heads, MLP "
    "2048, joint net",
    transformer_transducer,
    {"default": TransducerConfig(frames=80, features=80, labels=16, vocab=512, hidden=512,
                                 audio_layers=12, label_layers=2, heads=8, mlp=2048),
     "tiny": TransducerConfig(frames=16, features=16, labels=4, vocab=32, hidden=64,
                              audio_layers=2, label_layers=1, heads=4, mlp=128)})
