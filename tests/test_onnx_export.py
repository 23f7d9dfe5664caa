"""ONNX export: valid files, project-only ops mapped to standard ONNX, round trips, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from xrlflow_jax import errors, executor
from xrlflow_jax import graph as G
from xrlflow_jax import onnx_io
from xrlflow_jax.graph import GraphBuilder, host
from xrlflow_jax.ops import Impl, Op

ort = pytest.importorskip("onnxruntime")

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
MODELS = SHARED / "models"
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def _ort_outputs(path: Path, names: list[str], inputs: list[np.ndarray],
                 optimize: bool = True) -> list[np.ndarray]:
  options = ort.SessionOptions()
  options.log_severity_level = 3
  if not optimize:
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
  session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
  feeds = {i.name: x for i, x in zip(session.get_inputs(), inputs)}
  assert [i.name for i in session.get_inputs()] == names[:len(inputs)] or not names
  return session.run(None, feeds)


def _ours(graph, params, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
  lowered = executor.lower(graph, params)
  inputs = lowered.random_inputs(seed)
  return inputs, [np.asarray(y) for y in lowered(*inputs)]


def _assert_close(ours: list[np.ndarray], theirs: list[np.ndarray], rtol: float = 1e-5) -> None:
  assert len(ours) == len(theirs)
  for a, b in zip(ours, theirs):
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    scale = max(float(np.abs(b).max(initial=0.0)), 1.0)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale)


def _round_trip(tmp_path: Path, source, name: str, **load_kw) -> None:
  g1, p1 = onnx_io.load(source, **load_kw)
  path = tmp_path / f"{name}.onnx"
  model = onnx_io.save(g1, p1, path)
  onnx.checker.check_model(str(path), full_check=True)
  onnx.shape_inference.infer_shapes_path(str(path), str(tmp_path / "inferred.onnx"),
                                         strict_mode=True)
  g2, p2 = onnx_io.load(path)
  assert host.structural_hash(g1) == host.structural_hash(g2)
  assert p2.input_names == p1.input_names and p2.output_names == p1.output_names
  assert {p1.names[i] for i in p1} == {t.name for t in model.graph.initializer} - {
      t.name for t in model.graph.initializer if "/" in t.name and t.name not in
      set(p1.names.values())}
  inputs, ours = _ours(g1, p1)
  _assert_close(ours, _ort_outputs(path, p1.input_names, inputs))


def _shared(name: str) -> Path:
  path = MODELS / name
  if not path.is_file():
    pytest.skip(f"../shared/models/{name} is absent (looked in {MODELS})")
  return path


@pytest.mark.parametrize("name", ["squeezenet1_1.onnx"] + [
    pytest.param(n, marks=pytest.mark.slow) for n in
    ("resnet50_keepbn.onnx", "resnext50_32x4d.onnx", "inception_v3.onnx", "vit_b_16.onnx",
     "bert_base.onnx")])
def test_shared_model_round_trip(tmp_path: Path, name: str):
  _round_trip(tmp_path, _shared(name), name, random_weights=True)


@pytest.mark.parametrize("name", ["light_squeezenet.onnx"] + [
    pytest.param(f"light_{n}.onnx", marks=pytest.mark.slow) for n in (
        "bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
        "vgg19", "zfnet512")])
def test_light_model_round_trip(tmp_path: Path, name: str):
  """Opset 9 in (Softmax with pre-13 semantics, Unsqueeze attributes), opset 21 out."""
  path = LIGHT / name
  if not path.is_file():
    pytest.skip(f"the onnx package ships no {name}")
  model = onnx_io.randomize_constant_weights(onnx.load(str(path)), seed=0)
  _round_trip(tmp_path, model, name)


def _project_ops_graph(enlarge_runtime: bool = False):
  """A graph using the project's own ops: fused activations, Enlarge, MergeGConv, and more."""
  b = GraphBuilder(seed=0)
  x = b.input((2, 8, 6, 6), name="image")
  k = b.input((8, 8, 1, 1), name="kernel") if enlarge_runtime else None
  w1 = b.weight((8, 8, 1, 1))
  bias = b.weight((8,), init="bias")
  y1 = b.conv2d(x, b.enlarge(w1, (3, 3)), bias, padding="SAME", activation="relu")
  wg = b.weight((8, 2, 3, 3))
  y2 = b.conv2d(y1, b.merge_gconv(wg, groups=4, count=2), padding="SAME", groups=2,
                activation="sigmoid")
  if enlarge_runtime:
    y2 = b.add(y2, b.conv2d(x, b.enlarge(k, (3, 3)), padding="SAME", activation="tanh"))
  y3 = b.max_pool(y2, (3, 3), (2, 2), padding="VALID", ceil_mode=True)
  y4 = b.avg_pool(y2, (2, 2), (2, 2), padding=(1, 1, 0, 0), count_include_pad=True)
  y5 = b.concat([y3, y4], axis=1)
  y6 = b.batch_norm(y5)
  flat = b.reshape(b.transpose(y6, (0, 2, 3, 1)), (2, -1, 16))
  h = b.matmul(flat, b.weight((16, 12)), activation="gelu")
  h = b.layer_norm(h)
  h = b.clip(h, min=-0.5, max=0.75)
  h = b.hard_sigmoid(h, alpha=0.3, beta=0.4)
  h = b.softmax(b.pad(h, ((0, 0), (1, 2), (0, 0)), mode="reflect"), axis=1)
  s = b.slice(h, 2, 1, 11, 2)
  g = b.gather(s, b.constant(np.asarray([3, 0, 1], np.int64)), axis=1)
  u = b.squeeze(b.unsqueeze(g, [0]), [0])
  r = b.reduce_mean(u, [1], keepdims=False)
  c = b.cast(b.reduce_sum(u, [2]), "float16")
  m = b.where(b.cast(r, "bool"), r, b.neg(r))
  b.output(m, c, b.hard_swish(b.global_avg_pool(y2)))
  return b.build(capacity=128)


@pytest.mark.parametrize("enlarge_runtime", [False, True])
def test_project_ops_export_and_run_in_onnxruntime(tmp_path: Path, enlarge_runtime: bool):
  graph, params = _project_ops_graph(enlarge_runtime)
  path = tmp_path / "ops.onnx"
  model = onnx_io.save(graph, params, path)
  ops = {n.op_type for n in model.graph.node}
  assert {"Conv", "Relu", "Sigmoid", "MatMul", "Gelu", "Clip", "LayerNormalization",
          "BatchNormalization", "Pad", "Slice", "Gather", "Cast", "Where"} <= ops
  assert ("Pad" in ops) and (enlarge_runtime or all(
      n.op_type != "Pad" or n.input[0] != "kernel" for n in model.graph.node))
  # Weight pre-processing: the enlarged and merged kernels are initializers of the new shapes.
  dims = {tuple(t.dims) for t in model.graph.initializer}
  assert (8, 8, 3, 3) in dims and (8, 4, 3, 3) in dims
  inputs, ours = _ours(graph, params)
  # onnxruntime's Pad+Conv fusion mistakes a Pad feeding Conv's *weight* for padding of its
  # data input and then fails to load the (valid) model, so that case runs unoptimised.
  theirs = _ort_outputs(path, [], inputs, optimize=not enlarge_runtime)
  _assert_close(ours, theirs, rtol=1e-5)
  # Re-import runs and computes the same.
  g2, p2 = onnx_io.load(path)
  lowered = executor.lower(g2, p2)
  _assert_close([np.asarray(y) for y in lowered(*inputs)], ours, rtol=1e-5)


def test_external_data_round_trip(tmp_path: Path):
  graph, params = _project_ops_graph()
  path = tmp_path / "ext.onnx"
  onnx_io.save(graph, params, path, external_data=True)
  assert (tmp_path / "ext.onnx.data").stat().st_size > 0
  stored = onnx.load(str(path), load_external_data=False)
  external = [t.name for t in stored.graph.initializer
              if t.data_location == onnx.TensorProto.EXTERNAL]
  assert {n.split("_")[0] for n in external} >= {"mergegconv", "enlarge"}, external
  g2, p2 = onnx_io.load(path)
  inputs, ours = _ours(graph, params)
  lowered = executor.lower(g2, p2)
  _assert_close([np.asarray(y) for y in lowered(*inputs)], ours)


def test_default_names_and_checker(tmp_path: Path):
  graph, params = _project_ops_graph()
  model = onnx_io.to_model(graph, params)
  assert [i.name for i in model.graph.input] == ["input0"]
  assert [o.name for o in model.graph.output] == ["output0", "output1", "output2"]
  onnx.checker.check_model(model, full_check=True)


def test_unexportable_graph_is_a_clear_error(tmp_path: Path):
  b = GraphBuilder()
  w = b.input((8, 2, 3, 3), name="w")
  b.output(b.merge_gconv(w, groups=4, count=2))
  graph, params = b.build(capacity=8)
  with pytest.raises(errors.OnnxExportError, match=r"MergeGConv"):
    onnx_io.save(graph, params, tmp_path / "bad.onnx")
  with pytest.raises(errors.OnnxExportError, match="opset"):
    onnx_io.to_model(graph, params, opset=13)


def test_identical_folded_constants_export_once(tmp_path: Path):
  # A merge rewrite on an unrolled RNN concatenates the same shared weights at every step;
  # the file keeps one initializer per distinct value, and a constant output stays named.
  b = GraphBuilder()
  h = b.input((1, 4))
  w1, w2 = b.weight((4, 4)), b.weight((4, 4))
  for _ in range(3):
    both = b.matmul(h, b.concat([w1, w2], axis=1))
    h = b.tanh(b.add(b.slice(both, 1, 0, 4), b.slice(both, 1, 4, 8)))
  b.output(h, b.concat([w1, w2], axis=1))
  graph, params = b.build(64)
  path = tmp_path / "rnn.onnx"
  model = onnx_io.save(graph, params, path)
  weights = [tuple(t.dims) for t in model.graph.initializer if len(t.dims) == 2]
  assert weights == [(4, 8)], weights  # (Slice's starts/ends are 1-D initializers)
  inputs, ours = _ours(graph, params)
  _assert_close(ours, _ort_outputs(path, [], inputs))


def _issue17_model() -> onnx.ModelProto:
  """One model with every op that exists for ONNX import: comparisons and logic, maths,
  activations, reductions, ArgMax/ArgMin, LogSoftmax, Expand, Tile, GatherElements, CumSum,
  Trilu, TopK and ConvTranspose (one compile for all of them)."""
  from onnx import TensorProto, helper, numpy_helper  # pylint: disable=g-import-not-at-top
  n = helper.make_node
  f = TensorProto.FLOAT
  nodes = [
      n("Floor", ["x"], ["fx"]), n("Floor", ["r"], ["fr"]), n("Equal", ["fx", "fr"], ["eq"]),
      n("Less", ["fx", "fr"], ["lt"]), n("Greater", ["fx", "fr"], ["gt"]),
      n("LessOrEqual", ["fx", "fr"], ["le"]), n("GreaterOrEqual", ["fx", "fr"], ["ge"]),
      n("Not", ["eq"], ["ne"]), n("And", ["le", "ge"], ["an"]), n("Or", ["lt", "ne"], ["oo"]),
      n("Xor", ["an", "oo"], ["xo"]), n("Where", ["xo", "x", "fx"], ["w"]),
      n("Sign", ["x"], ["sg"]), n("Abs", ["w"], ["ab"]), n("Ceil", ["ab"], ["ce"]),
      n("Round", ["x"], ["rd"]), n("Mod", ["x", "d"], ["md"], fmod=1),
      n("Log", ["x"], ["lg"]), n("IsNaN", ["lg"], ["nan"]), n("Reciprocal", ["fx"], ["rc"]),
      n("IsInf", ["rc"], ["inf"], detect_negative=0),
      n("PRelu", ["x", "s"], ["a1"]), n("LeakyRelu", ["a1"], ["a2"], alpha=0.2),
      n("Elu", ["a2"], ["a3"], alpha=0.5), n("Selu", ["x"], ["a4"]),
      n("Celu", ["a4"], ["a5"], alpha=0.7), n("Softplus", ["a5"], ["a6"]),
      n("Softsign", ["a6"], ["a7"]), n("Mish", ["x"], ["a8"]),
      n("Shrink", ["a8"], ["a9"], bias=0.1, lambd=0.3),
      n("ThresholdedRelu", ["a9"], ["a10"], alpha=0.05),
      n("ReduceMax", ["x", "ax"], ["r1"]), n("ReduceMin", ["x", "ax"], ["r2"], keepdims=0),
      n("ReduceProd", ["sg", "ax"], ["r3"]), n("ReduceL1", ["x", "ax2"], ["r4"]),
      n("ReduceL2", ["x", "ax2"], ["r5"], keepdims=0), n("ReduceLogSumExp", ["x", "ax"], ["r6"]),
      n("ArgMax", ["fx"], ["i1"], axis=1, select_last_index=1),
      n("ArgMin", ["x"], ["i2"], axis=3, keepdims=0), n("LogSoftmax", ["x"], ["ls"], axis=1),
      n("Expand", ["col", "shp"], ["ex"]), n("Greater", ["col", "zero"], ["pos"]),
      n("Expand", ["pos", "shp"], ["exb"]), n("Tile", ["col", "reps"], ["ti"]),
      n("GatherElements", ["x", "gi"], ["gel"], axis=2), n("CumSum", ["x", "cax"], ["cs"],
                                                          exclusive=1),
      n("Trilu", ["x", "tk"], ["tl"], upper=0), n("TopK", ["fx", "kk"], ["tv", "ti2"], axis=3),
      n("TopK", ["x", "kk"], ["tv2", "unused"], largest=0),
      n("ConvTranspose", ["x", "wt"], ["ct"], strides=[2, 1], pads=[1, 0, 0, 1], group=3),
  ]
  outputs = ["xo", "ce", "rd", "md", "nan", "inf", "a3", "a7", "a10", "r1", "r2", "r3", "r4",
             "r5", "r6", "i1", "i2", "ls", "ex", "exb", "ti", "gel", "cs", "tl", "tv", "ti2",
             "tv2", "ct"]
  inits = {"r": np.asarray([0.1, -1.2, 0.5, 2.2, -0.3, 0.0, 1.0, -2.5], np.float32),
           "d": np.asarray([0.7, -0.7, 1.3, -2.0, 0.4, 3.0, -0.3, 1.0], np.float32),
           "s": np.asarray([0.1, 0.2, 0.3], np.float32).reshape(3, 1, 1),
           "ax": np.asarray([1], np.int64), "ax2": np.asarray([2, 3], np.int64),
           "shp": np.asarray([2, 3, 4, 5], np.int64), "zero": np.float32(0.0),
           "reps": np.asarray([1, 2, 3], np.int64),
           "gi": np.random.default_rng(0).integers(-8, 8, (2, 3, 5, 8)).astype(np.int64),
           "cax": np.asarray(1, np.int64), "tk": np.asarray(1, np.int64),
           "kk": np.asarray([3], np.int64),
           "wt": np.random.default_rng(1).standard_normal((3, 2, 3, 2)).astype(np.float32)}
  graph = helper.make_graph(
      nodes, "issue17", [helper.make_tensor_value_info("x", f, [2, 3, 8, 8]),
                         helper.make_tensor_value_info("col", f, [3, 1, 1])],
      [helper.make_empty_tensor_value_info(o) for o in outputs],
      [numpy_helper.from_array(v, k) for k, v in inits.items()])
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def test_issue17_ops_round_trip(tmp_path: Path):
  """Import, export (checker with strict shape inference), re-import to the same graph, and
  onnxruntime on the exported file computes what the executor computes (exactly, for bool and
  integer results)."""
  model = _issue17_model()
  g1, p1 = onnx_io.load(model)
  path = tmp_path / "issue17.onnx"
  exported = onnx_io.save(g1, p1, path)
  written = {nd.op_type for nd in exported.graph.node}
  wanted = {nd.op_type for nd in model.graph.node} - {"Log", "Reciprocal", "Where"}
  assert wanted <= written, wanted - written
  onnx.shape_inference.infer_shapes_path(str(path), str(tmp_path / "inferred.onnx"),
                                         strict_mode=True)
  g2, _ = onnx_io.load(path)
  assert host.structural_hash(g1) == host.structural_hash(g2)
  inputs, ours = _ours(g1, p1)
  theirs = _ort_outputs(path, p1.input_names, inputs)
  original = _ort_outputs_of_model(model, inputs)
  for name, a, b, c in zip(p1.output_names, ours, theirs, original):
    assert a.shape == b.shape == c.shape, (name, a.shape, b.shape, c.shape)
    if not np.issubdtype(b.dtype, np.floating):
      np.testing.assert_array_equal(a, b, err_msg=name)
      np.testing.assert_array_equal(b, c, err_msg=name)
    else:
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5, err_msg=name)
      np.testing.assert_allclose(b, c, rtol=2e-5, atol=2e-5, err_msg=name)


def _ort_outputs_of_model(model: onnx.ModelProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
  session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
  return session.run(None, {i.name: x for i, x in zip(session.get_inputs(), inputs)})


def test_round_trip_compares_what_the_file_runs(tmp_path):
  """A weight computed from weights (a Concat of two parameters) is one folded initializer in the
  file: the structural hash differs, the run-time hash does not, and the round trip is exact.
  A fused activation is written as its own node, tagged, and read back fused; the same file
  without the tags (as another tool would write it) imports as written, and the round trip's
  comparison names the difference."""
  b = G.GraphBuilder(seed=0)
  x = b.input((4, 16))
  w = b.concat([b.weight((16, 8)), b.weight((16, 8))], 1)
  b.output(b.matmul(x, w))
  graph, params = b.build(capacity=16)
  trip = onnx_io.round_trip(graph, params)
  assert G.structural_hash(trip.graph) != G.structural_hash(graph)
  assert trip.exact and G.runtime_hash(trip.graph) == G.runtime_hash(graph)
  assert trip.describe() == "re-imports to the graph measured"
  b = G.GraphBuilder(seed=0)
  x = b.input((1, 3, 8, 8))
  y = b.conv2d(x, b.weight((4, 3, 3, 3)), padding=1, activation="relu")
  b.output(b.matmul(b.reshape(y, (4, 64)), b.weight((64, 5)), activation="gelu"))
  graph, params = b.build(capacity=16)
  assert onnx_io.round_trip(graph, params).exact
  # The tap-by-tap kernel of a grouped convolution and of a pool, which ONNX has no word for.
  tb = G.GraphBuilder(seed=0)
  y = tb.node(Op.CONV2D, [tb.input((1, 4, 8, 8)), tb.weight((4, 2, 3, 3))], pads=(1, 1, 1, 1),
              groups=2, activation=1, impl=int(Impl.TAPS))
  tb.output(tb.node(Op.MAX_POOL, [y], kernel=(2, 2), strides=(2, 2), impl=int(Impl.TAPS)))
  assert onnx_io.round_trip(*tb.build(capacity=16)).exact
  path = tmp_path / "m.onnx"
  model = onnx_io.save(graph, params, path)
  assert sorted(n.op_type for n in model.graph.node if n.doc_string) == ["Gelu", "Relu"]
  for n in model.graph.node:
    n.doc_string = ""
  untagged, untagged_params = onnx_io.load(model.SerializeToString())
  assert G.runtime_hash(untagged) != G.runtime_hash(graph)
  assert host.op_histogram(untagged)["Relu"] == 1 and host.op_histogram(untagged)["Gelu"] == 1
  x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
  np.testing.assert_allclose(executor.run(untagged, untagged_params, x)[0],
                             executor.run(graph, params, x)[0], rtol=1e-5, atol=1e-6)


def test_a_users_file_stands_for_its_graph_only_at_its_own_shapes(tmp_path, shared_dir):
  """The job hands back (and times) the user's own file only where it holds its weights and
  takes the graph's input shapes."""
  b = G.GraphBuilder(seed=0)
  x = b.input((1, 3, 8, 8))
  b.output(b.conv2d(x, b.weight((4, 3, 3, 3)), padding=1))
  graph, params = b.build(capacity=16)
  path = tmp_path / "m.onnx"
  onnx_io.save(graph, params, path)
  same, _ = onnx_io.load(str(path))
  assert onnx_io.stands_for(str(path), same)
  with pytest.warns(onnx_io.ShapeOverrideWarning):
    bigger, _ = onnx_io.load(str(path), input_shapes={"input0": (1, 3, 9, 9)})
  assert not onnx_io.stands_for(str(path), bigger)
  shared = shared_dir / "models" / "squeezenet1_1.onnx"  # graph-only: no weights to hand back
  assert not onnx_io.stands_for(str(shared), onnx_io.load(str(shared), random_weights=True)[0])
