"""Tests of the model zoo: every model builds, validates, lowers and runs; structure checks
against torchvision's ONNX exports and against a numpy reference; bad names, sizes and
capacities give the project's own errors."""

from __future__ import annotations

import collections
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import special

from xrlflow_jax import errors, executor, models, ops
from xrlflow_jax import graph as G
from xrlflow_jax.graph import layout
from xrlflow_jax.ops import Op

SHARED = Path(__file__).resolve().parents[1].parent / "shared"

# Expected output shapes of the tiny and default variants.
TINY_OUTPUTS = {
    "inception_v3": [(1, 10)], "squeezenet1_1": [(1, 10)], "resnext50": [(1, 10)],
    "resnet18": [(1, 10)], "resnet50": [(1, 10)], "bert": [(16, 64)], "vit": [(1, 10)],
    "mini_dalle": [(8, 64)], "transformer_transducer": [(16, 4, 32)], "nasnet_a": [(1, 10)],
    "nasrnn": [(1, 16)],
}
DEFAULT_OUTPUTS = {
    "inception_v3": [(1, 1000)], "squeezenet1_1": [(1, 1000)], "resnext50": [(1, 1000)],
    "resnet18": [(1, 1000)], "resnet50": [(1, 1000)], "bert": [(64, 1024)], "vit": [(1, 1000)],
    "mini_dalle": [(16, 16384)], "transformer_transducer": [(80, 16, 512)],
    "nasnet_a": [(1, 1000)], "nasrnn": [(1, 512)],
}
DEFAULT_INPUTS = {
    "inception_v3": [(1, 3, 299, 299)], "squeezenet1_1": [(1, 3, 224, 224)],
    "resnext50": [(1, 3, 224, 224)], "resnet18": [(1, 3, 224, 224)],
    "resnet50": [(1, 3, 224, 224)], "bert": [(64, 1024)], "vit": [(1, 3, 128, 128)],
    "mini_dalle": [(16,)], "transformer_transducer": [(80, 80), (16,)],
    "nasnet_a": [(1, 3, 224, 224)], "nasrnn": [(1, 512)] * 6,
}
CHEAP_DEFAULTS = ("squeezenet1_1", "nasrnn")  # run at full size in the default test run


def _named_params(params: G.ParamStore) -> dict[str, np.ndarray]:
  return {params.names[pid]: np.asarray(params[pid], np.float64) for pid in params}


def _dead_nodes(graph: G.Graph) -> list[int]:
  """Alive slots that no graph output depends on."""
  g = layout.to_host(graph)
  table = layout.input_table(g)
  alive = g.nodes["alive"]
  need = alive & g.nodes["is_output"]
  stack = list(np.flatnonzero(need))
  while stack:
    for u in table[stack.pop()]:
      if u >= 0 and not need[u]:
        need[u] = True
        stack.append(int(u))
  return [int(v) for v in np.flatnonzero(alive & ~need)]


def _run_and_check(name: str, size: str, expected: list[tuple[int, ...]]) -> None:
  graph, params = models.build(name, size)
  G.validate(graph, params)
  lowered = executor.lower(graph, params)
  outs = [np.asarray(y) for y in lowered(*lowered.random_inputs(0))]
  assert [y.shape for y in outs] == expected
  for y in outs:
    assert np.isfinite(y).all(), f"{name}[{size}] output has non-finite values"
    assert y.std() > 1e-3, f"{name}[{size}] output is (nearly) constant: std {y.std()}"
  # A different input gives a different output: the output really depends on the input.
  outs2 = [np.asarray(y) for y in lowered(*lowered.random_inputs(1))]
  assert any(not np.allclose(a, b) for a, b in zip(outs, outs2))


# ------------------------------------------------------------------ registry


def test_list_models_names_every_benchmark():
  assert models.list_models() == [
      "inception_v3", "squeezenet1_1", "resnext50", "resnet18", "resnet50", "bert", "vit",
      "mini_dalle", "transformer_transducer", "nasnet_a", "nasrnn"]
  for name in models.list_models():
    info = models.model_info(name)
    assert info.name == name and info.summary and info.family in ("cnn", "transformer", "nas")
    assert set(models.SIZES) <= set(info.configs)


def test_unknown_model_and_size_raise_model_error():
  with pytest.raises(errors.ModelError, match="unknown model 'alexnet'.*resnet50.*nasrnn"):
    models.build("alexnet")
  with pytest.raises(errors.ModelError, match="unknown model"):
    models.model_info("Bert")
  with pytest.raises(errors.ModelError, match="no size 'huge'.*default, tiny"):
    models.build("bert", "huge")
  assert issubclass(errors.ModelError, errors.XrlflowError)


def test_capacity_too_small_names_slots_needed():
  needed = len(models.builder("resnet18", "tiny"))
  with pytest.raises(errors.CapacityError, match=f"needs {needed} node slots.*capacity is 16"):
    models.build("resnet18", "tiny", capacity=16)
  graph, _ = models.build("resnet18", "tiny", capacity=needed)  # exactly enough is fine
  assert layout.capacity(graph) == needed and G.num_nodes(graph) == needed


def test_default_capacity_rule():
  assert models.default_capacity(1) == G.DEFAULT_CAPACITY
  assert models.default_capacity(819) == 1024  # 1.25 * 819 = 1023.75 still fits
  assert models.default_capacity(820) == 1280  # next multiple of 256 above 1025
  assert models.default_capacity(2000) == 2560
  for n in (900, 1500, 3333):
    cap = models.default_capacity(n)
    assert cap % 256 == 0 and cap >= 1.25 * n


def test_explicit_capacity_and_seed():
  g1, p1 = models.build("nasrnn", "tiny", seed=0, capacity=200)
  g2, p2 = models.build("nasrnn", "tiny", seed=1)
  g3, p3 = models.build("nasrnn", "tiny", seed=0)
  assert layout.capacity(g1) == 200 and layout.capacity(g2) == G.DEFAULT_CAPACITY
  assert G.structural_hash(g1) == G.structural_hash(g2)  # same structure for every seed
  assert any(not np.array_equal(p1[k], p2[k]) for k in p1)
  assert all(np.array_equal(p1[k], p3[k]) for k in p1)


# ------------------------------------------------------------------ every model


@pytest.mark.parametrize("name", sorted(TINY_OUTPUTS))
def test_tiny_model_validates_lowers_and_runs(name):
  _run_and_check(name, "tiny", TINY_OUTPUTS[name])


@pytest.mark.parametrize("name", sorted(TINY_OUTPUTS))
def test_every_node_feeds_an_output(name):
  """No dead branches: e.g. every transformer layer's attention feeds the next layer."""
  graph, _ = models.build(name, "tiny")
  assert _dead_nodes(graph) == []


@pytest.mark.parametrize("name", sorted(DEFAULT_INPUTS))
def test_default_model_builds_and_validates(name):
  graph, params = models.build(name)
  G.validate(graph, params)
  n = G.num_nodes(graph)
  assert layout.capacity(graph) == models.default_capacity(n) >= 1.25 * n
  g = layout.to_host(graph)
  nd = g.nodes
  inputs = sorted((int(nd["input_index"][v]), ops.unpad_shape(nd["shape"][v], nd["rank"][v]))
                  for v in np.flatnonzero(nd["alive"] & (nd["op"] == int(Op.INPUT))))
  outputs = sorted((int(nd["output_index"][v]), ops.unpad_shape(nd["shape"][v], nd["rank"][v]))
                   for v in np.flatnonzero(nd["alive"] & nd["is_output"]))
  assert [s for _, s in inputs] == DEFAULT_INPUTS[name]
  assert [s for _, s in outputs] == DEFAULT_OUTPUTS[name]
  assert _dead_nodes(graph) == []


@pytest.mark.parametrize("name", CHEAP_DEFAULTS)
def test_cheap_default_model_runs(name):
  _run_and_check(name, "default", DEFAULT_OUTPUTS[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(DEFAULT_OUTPUTS) - set(CHEAP_DEFAULTS)))
def test_default_model_runs(name):
  _run_and_check(name, "default", DEFAULT_OUTPUTS[name])


# ------------------------------------------------------------------ structure


def _node_attrs(graph: G.Graph, op: Op) -> list[dict]:
  g = layout.to_host(graph)
  nd = g.nodes
  spec = ops.get(op)
  return [spec.decode_attrs(nd["attrs"][v])
          for v in np.flatnonzero(nd["alive"] & (nd["op"] == int(op)))]


def _onnx_layers(path: Path) -> collections.Counter:
  """Multiset of (op, weight dims, strides, pads, groups/pool flags) of Conv and pool nodes."""
  onnx = pytest.importorskip("onnx")
  model = onnx.load(str(path), load_external_data=False)
  dims = {t.name: tuple(t.dims) for t in model.graph.initializer}
  out = collections.Counter()
  for node in model.graph.node:
    a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
    pads = tuple(a.get("pads", (0, 0, 0, 0)))
    pads = (pads[0], pads[1], pads[2], pads[3])  # ONNX (top, left, bottom, right) as ours
    strides = tuple(a.get("strides", (1, 1)))
    if node.op_type == "Conv":
      out[("conv", dims[node.input[1]], strides, pads, a.get("group", 1))] += 1
    elif node.op_type in ("MaxPool", "AveragePool"):
      out[(node.op_type, tuple(a["kernel_shape"]), strides, pads, a.get("ceil_mode", 0),
           a.get("count_include_pad", 0) if node.op_type == "AveragePool" else 0)] += 1
  return out


def _our_layers(graph: G.Graph) -> collections.Counter:
  g = layout.to_host(graph)
  nd = g.nodes
  table = layout.input_table(g)
  out = collections.Counter()
  for v in np.flatnonzero(nd["alive"]):
    op = int(nd["op"][v])
    if op == Op.CONV2D:
      a = ops.get(op).decode_attrs(nd["attrs"][v])
      w = table[v][1]
      out[("conv", ops.unpad_shape(nd["shape"][w], nd["rank"][w]), tuple(a["strides"]),
           tuple(a["pads"]), a["groups"])] += 1
    elif op in (Op.MAX_POOL, Op.AVG_POOL):
      a = ops.get(op).decode_attrs(nd["attrs"][v])
      kind = "MaxPool" if op == Op.MAX_POOL else "AveragePool"
      out[(kind, tuple(a["kernel"]), tuple(a["strides"]), tuple(a["pads"]), int(a["ceil_mode"]),
           int(a["count_include_pad"]) if op == Op.AVG_POOL else 0)] += 1
  return out


@pytest.mark.parametrize("name,file", [
    ("squeezenet1_1", "squeezenet1_1.onnx"), ("resnext50", "resnext50_32x4d.onnx"),
    ("resnet50", "resnet50_keepbn.onnx"), ("inception_v3", "inception_v3.onnx")])
def test_cnn_layers_match_torchvision_export(name, file):
  """Every conv (weight shape, strides, pads, groups) and pool matches torchvision's model."""
  if not SHARED.is_dir():
    pytest.skip(f"../shared is absent (looked for {SHARED}); it holds the torchvision exports")
  graph, _ = models.build(name)
  theirs, ours = _onnx_layers(SHARED / "models" / file), _our_layers(graph)
  assert sum(1 for k in theirs.elements() if k[0] == "conv") > 20
  assert ours == theirs, f"only ours: {ours - theirs}; only torchvision's: {theirs - ours}"


def test_resnext_and_nasnet_use_grouped_convs():
  cfg = models.model_info("resnext50").config("tiny")
  groups = collections.Counter(a["groups"] for a in _node_attrs(
      models.build("resnext50", "tiny")[0], Op.CONV2D))
  assert groups[cfg.groups] == sum(cfg.layers) and set(groups) == {1, cfg.groups}
  assert models.model_info("resnext50").config("default").groups == 32
  graph, _ = models.build("nasnet_a", "tiny")
  g = layout.to_host(graph)
  table = layout.input_table(g)
  depthwise = 0
  for v in np.flatnonzero(g.nodes["alive"] & (g.nodes["op"] == int(Op.CONV2D))):
    a = ops.get(Op.CONV2D).decode_attrs(g.nodes["attrs"][v])
    channels = g.nodes["shape"][table[v][0]][-3]
    depthwise += a["groups"] > 1 and a["groups"] == channels
  cfg = models.model_info("nasnet_a").config("tiny")
  assert depthwise == 5 * cfg.stages * (cfg.normal_cells + 1)  # 5 separable convs per cell


def test_transformer_op_counts():
  """Separate Q/K/V matmuls, 2 batched attention matmuls, softmax and LN per layer."""
  layers = models.model_info("bert").config("tiny").layers
  hist = G.op_histogram(models.build("bert", "tiny")[0])
  assert hist["MatMul"] == layers * (3 + 2 + 1 + 2)
  assert hist["Softmax"] == layers and hist["LayerNorm"] == 2 * layers
  assert hist["Gelu"] == layers and hist["Transpose"] == 4 * layers
  layers = models.model_info("mini_dalle").config("tiny").layers
  hist = G.op_histogram(models.build("mini_dalle", "tiny")[0])
  assert hist["Gelu"] == layers and hist["Gather"] == 1
  assert hist["MatMul"] == layers * (3 + 2 + 1 + 3) + 1
  cfg = models.model_info("transformer_transducer").config("tiny")
  hist = G.op_histogram(models.build("transformer_transducer", "tiny")[0])
  assert hist["Softmax"] == cfg.audio_layers + cfg.label_layers and hist["Tanh"] == 1


def _softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
  m = x.mean(-1, keepdims=True)
  v = ((x - m) ** 2).mean(-1, keepdims=True)
  return (x - m) / np.sqrt(v + 1e-5) * w + b


def _attention(x: np.ndarray, p: dict[str, np.ndarray], name: str, heads: int) -> np.ndarray:
  s, d = x.shape
  dh = d // heads
  q, k, v = (x @ p[f"{name}.{t}.weight"] + p[f"{name}.{t}.bias"] for t in "qkv")
  q, k, v = (t.reshape(s, heads, dh).transpose(1, 0, 2) for t in (q, k, v))
  probs = _softmax(q @ k.transpose(0, 2, 1) / math.sqrt(dh))  # [H, S, S]
  ctx = (probs @ v).transpose(1, 0, 2).reshape(s, d)
  return ctx @ p[f"{name}.out.weight"] + p[f"{name}.out.bias"]


def test_tiny_bert_matches_numpy_reference():
  """The whole encoder, recomputed in float64 numpy from the named weights."""
  graph, params = models.build("bert", "tiny", seed=3)
  cfg = models.model_info("bert").config("tiny")
  p = _named_params(params)
  lowered = executor.lower(graph, params)
  (x,) = lowered.random_inputs(5)
  (got,) = lowered(x)
  h = x.astype(np.float64)
  for i in range(cfg.layers):
    n = f"encoder.layer.{i}"
    h = _layer_norm(h + _attention(h, p, f"{n}.attention", cfg.heads),
                    p[f"{n}.attention.norm.weight"], p[f"{n}.attention.norm.bias"])
    f = h @ p[f"{n}.ffn.fc1.weight"] + p[f"{n}.ffn.fc1.bias"]
    f = 0.5 * f * (1 + special.erf(f / math.sqrt(2)))
    f = f @ p[f"{n}.ffn.fc2.weight"] + p[f"{n}.ffn.fc2.bias"]
    h = _layer_norm(h + f, p[f"{n}.ffn.norm.weight"], p[f"{n}.ffn.norm.bias"])
  np.testing.assert_allclose(np.asarray(got), h, rtol=1e-4, atol=1e-4)


def test_tiny_nasrnn_matches_numpy_reference():
  graph, params = models.build("nasrnn", "tiny", seed=2)
  p = _named_params(params)
  lowered = executor.lower(graph, params)
  inputs = lowered.random_inputs(4)
  (got,) = lowered(*inputs)
  sig, tanh, relu = special.expit, np.tanh, lambda z: np.maximum(z, 0)
  *xs, h = [np.asarray(a, np.float64) for a in inputs]
  for x in xs:
    t = [x @ p[f"cell.w_x{i}"] + h @ p[f"cell.w_h{i}"] for i in range(8)]
    m0 = relu(t[0]) + sig(t[3])
    m1 = sig(t[1]) + tanh(t[2])
    m2 = sig(t[4]) * tanh(t[5])
    m3 = sig(t[6]) * relu(t[7])
    m4 = sig(m1) + tanh(m2)
    m5 = tanh(m0) * tanh(m3)
    h = tanh(tanh(m4) * tanh(m5))
  np.testing.assert_allclose(np.asarray(got), h, rtol=1e-5, atol=1e-6)


def test_mini_dalle_is_causal():
  """Changing token j changes the logits at positions >= j only (the additive causal mask)."""
  graph, params = models.build("mini_dalle", "tiny")
  lowered = executor.lower(graph, params)
  (ids,) = lowered.random_inputs(0)
  j = 5
  changed = ids.copy()
  changed[j] = (ids[j] + 1) % lowered.input_specs[0].index_bound
  (a,), (b,) = lowered(ids), lowered(changed)
  a, b = np.asarray(a), np.asarray(b)
  np.testing.assert_allclose(a[:j], b[:j], rtol=1e-5, atol=1e-5)
  assert not np.allclose(a[j:], b[j:], atol=1e-3)


def test_transducer_label_encoder_is_causal_and_joint_broadcasts():
  graph, params = models.build("transformer_transducer", "tiny")
  lowered = executor.lower(graph, params)
  audio, labels = lowered.random_inputs(0)
  changed = labels.copy()
  changed[2] = (labels[2] + 1) % lowered.input_specs[1].index_bound
  (a,), (b,) = lowered(audio, labels), lowered(audio, changed)
  a, b = np.asarray(a), np.asarray(b)  # [T, U, V]
  np.testing.assert_allclose(a[:, :2], b[:, :2], rtol=1e-5, atol=1e-5)
  assert not np.allclose(a[:, 2:], b[:, 2:], atol=1e-3)
  # Changing one audio frame changes every output (full attention in the audio encoder).
  audio2 = audio.copy()
  audio2[-1] += 1.0
  (c,) = lowered(audio2, labels)
  assert (np.abs(np.asarray(c) - a).max(axis=(1, 2)) > 1e-4).all()
