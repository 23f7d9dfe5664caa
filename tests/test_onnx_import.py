"""ONNX import: real models against onnxruntime, op decompositions, bad input and a fuzz test."""

from __future__ import annotations

import copy
import os
import random
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Sequence

import jax
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from xrlflow_jax import errors, executor, ops
from xrlflow_jax import graph as G
from xrlflow_jax import onnx_io
from xrlflow_jax.graph import host
from xrlflow_jax.onnx_io import verify

ort = pytest.importorskip("onnxruntime")

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
MODELS = SHARED / "models"
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
RTOL = 1e-4  # float32: max |ours - onnxruntime| / max |onnxruntime| per output


def _shared_model(name: str) -> Path:
  path = MODELS / name
  if not path.is_file():
    pytest.skip(f"../shared/models/{name} is absent (looked in {MODELS})")
  return path


def _light_model(name: str) -> Path:
  path = LIGHT / name
  if not path.is_file():
    pytest.skip(f"the onnx package ships no {name} (looked in {LIGHT})")
  return path


# ------------------------------------------------------------------------------ real models

_SHARED_FAST = ["squeezenet1_1.onnx", "resnext50_32x4d.onnx"]
_SHARED_SLOW = ["resnet50_keepbn.onnx", "inception_v3.onnx", "vit_b_16.onnx", "bert_base.onnx"]
_LIGHT_FAST = ["light_squeezenet.onnx"]
_LIGHT_SLOW = ["light_bvlc_alexnet.onnx", "light_densenet121.onnx", "light_inception_v1.onnx",
               "light_inception_v2.onnx", "light_resnet50.onnx", "light_shufflenet.onnx",
               "light_vgg19.onnx", "light_zfnet512.onnx"]


def _check_against_onnxruntime(path: Path, light: bool) -> verify.Comparison:
  result = verify.compare_with_onnxruntime(path, seed=0, randomize_constant_of_shape=light)
  print(f"{path.name}: nodes {result.onnx_nodes} -> {result.graph_nodes}, import "
        f"{result.import_seconds:.2f}s, max abs {result.max_abs:.2e}, max rel "
        f"{result.max_rel:.2e}")
  assert result.max_rel < RTOL, result
  return result


@pytest.mark.parametrize("name", _SHARED_FAST + [
    pytest.param(n, marks=pytest.mark.slow) for n in _SHARED_SLOW])
def test_shared_model_matches_onnxruntime(name: str):
  _check_against_onnxruntime(_shared_model(name), light=False)


@pytest.mark.parametrize("name", _LIGHT_FAST + [
    pytest.param(n, marks=pytest.mark.slow) for n in _LIGHT_SLOW])
def test_light_model_matches_onnxruntime(name: str):
  _check_against_onnxruntime(_light_model(name), light=True)


def test_shape_subgraphs_are_folded_on_import():
  """resnet50_keepbn has Shape/Expand/CastLike chains: none may survive import."""
  path = _shared_model("resnet50_keepbn.onnx")
  graph, params = onnx_io.load(path, random_weights=True)
  hist = host.op_histogram(graph)
  assert set(hist) <= {"Input", "Constant", "Conv2D", "BatchNorm", "Relu", "MaxPool", "Add",
                       "ReduceMean", "Reshape", "MatMul"}, hist
  assert hist["Conv2D"] == 53 and hist["BatchNorm"] == 53
  assert params.stats.folded_nodes >= 53 * 4  # Shape, Expand x2, CastLike per conv bias
  assert params.input_names == ["x"] and params.output_names == ["y"]
  assert "conv1.weight" in params.names.values()
  host.validate(graph, params)


def test_random_weights_are_seeded_and_named():
  path = _shared_model("squeezenet1_1.onnx")
  _, p0 = onnx_io.load(path, random_weights=True, seed=0)
  _, p0b = onnx_io.load(path, random_weights=True, seed=0)
  _, p1 = onnx_io.load(path, random_weights=True, seed=1)
  by_name = lambda p: {p.names[i]: p[i] for i in p}  # noqa: E731
  a, b, c = by_name(p0), by_name(p0b), by_name(p1)
  assert a.keys() == b.keys() == c.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  assert any(not np.array_equal(a[k], c[k]) for k in a)
  # Scaled by fan-in: a 3x3 conv over 64 channels has std about 1 / sqrt(576).
  w = a["features.3.squeeze.weight"]
  assert 0.5 / np.sqrt(np.prod(w.shape[1:])) < w.std() < 2.0 / np.sqrt(np.prod(w.shape[1:]))
  # The same values as the copy handed to onnxruntime.
  model = onnx.load(path, load_external_data=False)
  filled = onnx_io.fill_missing_weights(model, seed=0, base_dir=str(MODELS))
  init = {t.name: numpy_helper.to_array(t) for t in filled.graph.initializer}
  for k in a:
    if k in init:
      np.testing.assert_array_equal(a[k], init[k])


def test_missing_external_data_without_flag_names_the_file():
  path = _shared_model("squeezenet1_1.onnx")
  with pytest.raises(errors.OnnxImportError, match=r"squeezenet1_1\.onnx\.data.*random_weights"):
    onnx_io.load(path)


def test_index_weights_stay_in_range():
  """BERT's int64 buffers become valid indices (token types < 2, positions < 512)."""
  path = _shared_model("bert_base.onnx")
  model = onnx.load(path, load_external_data=False)
  values = onnx_io.random_initializers(model, seed=0, base_dir=str(MODELS))
  assert values["expand"].dtype == np.int64 and values["expand"].max() < 2
  assert values["slice_1"].max() < 512 and values["slice_1"].min() >= 0
  assert values["expand_2"].dtype == np.bool_


# ------------------------------------------------------------------------------ op cases

def _model(nodes: Sequence[onnx.NodeProto], inputs: Sequence[tuple[str, int, Sequence[Any]]],
           outputs: Sequence[str], inits: dict[str, np.ndarray] | None = None,
           opset: int = 18) -> onnx.ModelProto:
  graph = helper.make_graph(
      list(nodes), "case",
      [helper.make_tensor_value_info(n, t, list(s)) for n, t, s in inputs],
      [helper.make_empty_tensor_value_info(o) for o in outputs],
      initializer=[numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                           ir_version=8)


def _run_both(model: onnx.ModelProto, seed: int = 0, **load_kw: Any) -> None:
  graph, params = onnx_io.load(model, **load_kw)
  lowered = executor.lower(graph, params, input_names=params.input_names)
  inputs = lowered.random_inputs(seed)
  ours = [np.asarray(y) for y in lowered(*inputs)]
  options = ort.SessionOptions()
  options.log_severity_level = 3
  session = ort.InferenceSession(model.SerializeToString(), options,
                                 providers=["CPUExecutionProvider"])
  theirs = session.run(params.output_names, dict(zip(params.input_names, inputs)))
  for name, a, b in zip(params.output_names, ours, theirs):
    assert a.shape == b.shape, (name, a.shape, b.shape)
    if not np.issubdtype(b.dtype, np.floating):  # bool and integer results must be equal
      np.testing.assert_array_equal(a, b, err_msg=name)
      continue
    finite = np.abs(b[np.isfinite(b)])
    scale = max(1.0, float(finite.max())) if finite.size else 1.0
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5 * scale, err_msg=name)


_F = TensorProto.FLOAT
_rng = np.random.default_rng(0)


def _w(*shape: int) -> np.ndarray:
  return _rng.standard_normal(shape).astype(np.float32)


def _i(*values: int) -> np.ndarray:
  return np.asarray(values, np.int64)


_N = helper.make_node
_X = [("x", _F, (2, 3, 8, 8))]
_CASES = {
    "gemm_trans_alpha_beta": (
        [_N("Gemm", ["a", "b", "c"], ["y"], transA=1, transB=1, alpha=0.5, beta=2.0)],
        [("a", _F, (5, 4))], {"b": _w(6, 5), "c": _w(6)}, 18),
    "gemm_runtime_c": ([_N("Gemm", ["a", "b", "a2"], ["y"], beta=0.25)],
                       [("a", _F, (3, 4)), ("a2", _F, (3, 5))], {"b": _w(4, 5)}, 13),
    "conv_bias_same_upper": (
        [_N("Conv", ["x", "w", "b"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])],
        _X, {"w": _w(4, 3, 3, 3), "b": _w(4)}, 18),
    "conv_grouped_dilated": (
        [_N("Conv", ["x", "w"], ["y"], group=3, dilations=[2, 2], pads=[1, 2, 2, 1])],
        _X, {"w": _w(6, 1, 3, 3)}, 18),
    "conv1d": ([_N("Conv", ["x", "w", "b"], ["y"], pads=[1, 1])],
               [("x", _F, (2, 3, 10))], {"w": _w(5, 3, 3), "b": _w(5)}, 18),
    "matmul_1d": ([_N("MatMul", ["v", "m"], ["y"])], [("v", _F, (4,))], {"m": _w(2, 4, 3)}, 18),
    "matmul_batched": ([_N("MatMul", ["a", "m"], ["y"])], [("a", _F, (2, 3, 4))],
                       {"m": _w(4, 5)}, 18),
    "split_attr_opset11": ([_N("Split", ["x"], ["y0", "y1"], axis=1, split=[1, 2])], _X, {}, 11),
    "split_input": ([_N("Split", ["x", "s"], ["y0", "y1", "y2"], axis=-1)], _X,
                    {"s": _i(2, 3, 3)}, 13),
    "split_num_outputs": ([_N("Split", ["x"], ["y0", "y1", "y2"], axis=2, num_outputs=3)], _X,
                          {}, 18),
    "slice_steps_negative": ([_N("Slice", ["x", "st", "en", "ax", "sp"], ["y"])], _X,
                             {"st": _i(-1, 1), "en": _i(-100, 7), "ax": _i(3, 1),
                              "sp": _i(-2, 1)}, 18),
    "slice_opset9": ([_N("Slice", ["x"], ["y"], starts=[1], ends=[1000], axes=[2])], _X, {}, 9),
    "softmax_opset11_axis1": ([_N("Softmax", ["x"], ["y"], axis=1)], _X, {}, 11),
    "softmax_opset13": ([_N("Softmax", ["x"], ["y"], axis=1)], _X, {}, 13),
    "layer_norm": ([_N("LayerNormalization", ["x", "s", "b"], ["y"], axis=-2, epsilon=1e-3)],
                   _X, {"s": _w(8, 8), "b": _w(8)}, 18),
    "instance_norm": ([_N("InstanceNormalization", ["x", "s", "b"], ["y"])], _X,
                      {"s": _w(3), "b": _w(3)}, 18),
    "batch_norm": ([_N("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3)],
                   _X, {"s": _w(3), "b": _w(3), "m": _w(3),
                        "v": np.abs(_w(3)) + 0.5}, 15),
    "pools_ceil": ([_N("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                       ceil_mode=1),
                    _N("AveragePool", ["x"], ["q"], kernel_shape=[3, 2], pads=[1, 0, 1, 1],
                       count_include_pad=1)], _X, {}, 18),
    "global_pools": ([_N("GlobalAveragePool", ["x"], ["p"]), _N("GlobalMaxPool", ["x"], ["q"])],
                     _X, {}, 18),
    "lrn": ([_N("LRN", ["x"], ["y"], size=3, alpha=1e-2, beta=0.6, bias=2.0)], _X, {}, 13),
    "activations": ([_N("LeakyRelu", ["x"], ["a"], alpha=0.1),
                     _N("LeakyRelu", ["x"], ["a2"], alpha=-0.5),
                     _N("Elu", ["x"], ["b"], alpha=0.7), _N("Selu", ["x"], ["c"]),
                     _N("PRelu", ["x", "s"], ["d"]), _N("Softsign", ["x"], ["e"]),
                     _N("Abs", ["x"], ["f"]), _N("HardSigmoid", ["x"], ["g"]),
                     _N("HardSwish", ["x"], ["h"]), _N("Gelu", ["x"], ["i"]),
                     _N("Gelu", ["x"], ["j"], approximate="tanh")],
                    _X, {"s": _w(3, 1, 1)}, 20),
    "clip_inputs_and_attrs": ([_N("Clip", ["x", "lo", "hi"], ["y"]),
                               _N("Clip", ["x", "", "hi"], ["z"])], _X,
                              {"lo": np.float32(-0.5), "hi": np.float32(0.7)}, 13),
    "clip_opset9": ([_N("Clip", ["x"], ["y"], min=-0.2, max=0.3)], _X, {}, 9),
    "reductions": ([_N("ReduceMean", ["x", "ax"], ["a"], keepdims=0),
                    _N("ReduceSum", ["x", "ax"], ["b"]),
                    _N("ReduceSumSquare", ["x", "ax"], ["c"]),
                    _N("ReduceL2", ["x"], ["d"], keepdims=0)], _X, {"ax": _i(-1, 1)}, 18),
    "reduce_mean_opset13_attr": ([_N("ReduceMean", ["x"], ["a"], axes=[2, 3])], _X, {}, 13),
    "reshape_flatten_transpose": ([_N("Reshape", ["x", "s"], ["a"]),
                                   _N("Flatten", ["a"], ["b"], axis=2),
                                   _N("Transpose", ["a"], ["c"])], _X,
                                  {"s": _i(0, -1, 4)}, 18),
    "squeeze_unsqueeze": ([_N("Unsqueeze", ["x", "u"], ["a"]), _N("Squeeze", ["a", "q"], ["b"]),
                           _N("Squeeze", ["a"], ["c"])], _X, {"u": _i(0, -1), "q": _i(5)}, 18),
    "squeeze_unsqueeze_opset11": ([_N("Unsqueeze", ["x"], ["a"], axes=[0, 5]),
                                   _N("Squeeze", ["a"], ["b"], axes=[0])], _X, {}, 11),
    "pad_modes": ([_N("Pad", ["x", "p", "v"], ["a"], mode="constant"),
                   _N("Pad", ["x", "p2"], ["b"], mode="reflect"),
                   _N("Pad", ["x", "p3", "", "ax"], ["c"], mode="edge")], _X,
                  {"p": _i(0, 0, 1, -2, 0, 1, 2, 3), "v": np.float32(1.5),
                   "p2": _i(0, 0, 2, 1, 0, 0, 1, 3), "p3": _i(2, 1, 0, 3), "ax": _i(2, -1)}, 18),
    "gather_concat_tile_expand": (
        [_N("Gather", ["x", "gi"], ["a"], axis=1), _N("Concat", ["x", "a", "x", "x", "x"], ["b"],
                                                      axis=1),
         _N("Tile", ["x", "reps"], ["c"]), _N("Expand", ["col", "shp"], ["d"])],
        _X + [("col", _F, (3, 1, 1))], {"gi": _i(2, -3), "reps": _i(1, 2, 1, 3),
                                         "shp": _i(2, 1, 8, 8)}, 18),
    # One constant index: imported as Slice (+ Squeeze for a scalar), see the next test.
    "gather_one_index": (
        [_N("Gather", ["x", "g0"], ["a"], axis=1), _N("Gather", ["x", "g1"], ["b"], axis=3),
         _N("Gather", ["x", "g2"], ["c"], axis=0)],
        _X, {"g0": np.asarray(-1, np.int64), "g1": _i(5), "g2": np.asarray(1, np.int32)}, 18),
    "arith_broadcast_pow_int_exponent": (
        [_N("Add", ["x", "r"], ["a"]), _N("Sub", ["a", "x"], ["b"]), _N("Mul", ["b", "r"], ["c"]),
         _N("Div", ["c", "r2"], ["d"]), _N("Pow", ["d", "e"], ["f"]),
         _N("Sum", ["x", "a", "b"], ["g"]), _N("Mean", ["x", "a"], ["h"]),
         _N("Max", ["x", "a", "r"], ["i"]), _N("Min", ["x", "r"], ["j"])],
        _X, {"r": _w(8), "r2": np.abs(_w(3, 1, 1)) + 1, "e": np.asarray(2, np.int64)}, 18),
    "where_cast_identity_dropout": (
        [_N("Cast", ["x"], ["xi"], to=TensorProto.INT32), _N("Cast", ["xi"], ["xf"], to=_F),
         _N("Where", ["m", "x", "xf"], ["a"]), _N("Identity", ["a"], ["b"]),
         _N("Dropout", ["b"], ["c"]), _N("CastLike", ["xi", "x"], ["d"])],
        _X + [("m", TensorProto.BOOL, (8,))], {}, 18),
    # Comparisons, logic, maths, activations and reductions. Floor makes ties (so ==, <= and
    # ArgMax's select_last_index matter), Log of negatives NaNs and Reciprocal of zeros
    # infinities.
    "compare_logic": (
        [_N("Floor", ["x"], ["fx"]), _N("Floor", ["r"], ["fr"]),
         _N("Equal", ["fx", "fr"], ["eq"]), _N("Less", ["fx", "fr"], ["lt"]),
         _N("Greater", ["fx", "fr"], ["gt"]), _N("LessOrEqual", ["fx", "fr"], ["le"]),
         _N("GreaterOrEqual", ["fx", "fr"], ["ge"]), _N("Not", ["eq"], ["ne"]),
         _N("And", ["le", "ge"], ["an"]), _N("Or", ["lt", "eq"], ["oo"]),
         _N("Xor", ["lt", "gt"], ["xo"]), _N("Where", ["xo", "x", "fx"], ["w"]),
         _N("Cast", ["fx"], ["ix"], to=TensorProto.INT32),
         _N("Less", ["ix", "ic"], ["ilt"]), _N("Equal", ["lt", "bc"], ["beq"])],
        _X + [("r", _F, (8,))], {"ic": np.asarray([0, 1, -1, 2, 0, 0, 1, -2], np.int32),
                                 "bc": np.asarray([True, False] * 4)}, 18),
    "math": (
        [_N("Sign", ["x"], ["sg"]), _N("Abs", ["x"], ["ab"]), _N("Floor", ["x"], ["fl"]),
         _N("Ceil", ["x"], ["ce"]), _N("Round", ["h"], ["rd"]),
         _N("Mul", ["x", "half"], ["xh"]), _N("Round", ["xh"], ["rd2"]),
         _N("Mod", ["x", "d"], ["mf"], fmod=1),
         _N("Log", ["x"], ["lg"]), _N("IsNaN", ["lg"], ["nan"]),
         _N("Reciprocal", ["fl"], ["rc"]), _N("IsInf", ["rc"], ["inf"]),
         _N("IsInf", ["rc"], ["pinf"], detect_negative=0)],
        _X, {"h": np.asarray([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 0.25], np.float32),
             "half": np.float32(4.0), "d": np.asarray([0.7, -0.7, 1.3, -2.0, 0.4, 3.0, -0.3,
                                                       1.0], np.float32)}, 18),
    "more_activations": (
        [_N("Celu", ["x"], ["a"], alpha=0.6), _N("Softplus", ["x"], ["b"]),
         _N("Mish", ["x"], ["c"]), _N("Shrink", ["x"], ["d"], bias=0.2, lambd=0.4),
         _N("Shrink", ["x"], ["e"]), _N("ThresholdedRelu", ["x"], ["f"], alpha=0.3),
         _N("Selu", ["x"], ["g"], alpha=1.2, gamma=0.9), _N("Elu", ["x"], ["h"]),
         _N("LeakyRelu", ["x"], ["i"]), _N("PRelu", ["x", "s"], ["j"])],
        _X, {"s": _w(8)}, 18),
    "more_reductions": (
        [_N("ReduceMax", ["x", "ax"], ["a"]), _N("ReduceMin", ["x"], ["b"], keepdims=0),
         _N("ReduceProd", ["x", "ax2"], ["c"], keepdims=0), _N("ReduceL1", ["x", "ax"], ["d"]),
         _N("ReduceL2", ["x", "ax2"], ["e"]), _N("ReduceLogSumExp", ["x", "ax"], ["f"]),
         _N("ReduceL1", ["x", "none"], ["g"], noop_with_empty_axes=1),
         _N("ArgMax", ["x"], ["h"], axis=1), _N("ArgMin", ["x"], ["i"], axis=-1, keepdims=0),
         _N("Floor", ["x"], ["fx"]), _N("ArgMax", ["fx"], ["j"], axis=3, select_last_index=1),
         _N("ArgMin", ["fx"], ["k"], axis=2, keepdims=0)],
        _X, {"ax": _i(-1, 1), "ax2": _i(2), "none": np.zeros([0], np.int64)}, 18),
    "reductions_opset13_attrs": (
        [_N("ReduceMax", ["x"], ["a"], axes=[1, 2]), _N("ReduceLogSumExp", ["x"], ["b"],
                                                        axes=[-1], keepdims=0),
         _N("ReduceL2", ["x"], ["c"], axes=[0])], _X, {}, 13),
    "log_softmax": ([_N("LogSoftmax", ["x"], ["a"], axis=1), _N("LogSoftmax", ["x"], ["b"])],
                    _X, {}, 13),
    "log_softmax_opset11_axis1": ([_N("LogSoftmax", ["x"], ["a"], axis=1)], _X, {}, 11),
    "expand_tile_bool": (
        [_N("Expand", ["col", "shp"], ["a"]), _N("Greater", ["col", "zero"], ["pos"]),
         _N("Expand", ["pos", "shp2"], ["b"]), _N("Tile", ["col", "reps"], ["c"]),
         _N("Tile", ["pos", "reps"], ["d"])],
        [("col", _F, (3, 1, 1))], {"shp": _i(2, 1, 8, 8), "shp2": _i(3, 4, 5),
                                   "zero": np.float32(0.0), "reps": _i(2, 3, 4)}, 18),
    "einsum": (
        [_N("Einsum", ["q", "k"], ["a"], equation="bhqd,bhkd->bhqk"),
         _N("Einsum", ["a", "k"], ["b"], equation="bhqk,bhkd->bqhd")],
        [("q", _F, (2, 3, 4, 5)), ("k", _F, (2, 3, 4, 5))], {}, 18),
    "einsum_more": (
        [_N("Einsum", ["q", "w"], ["c"], equation="...d,de->...e"),
         _N("Einsum", ["q"], ["d"], equation="bhqd->bd"),
         _N("Einsum", ["q", "k", "w"], ["e"], equation="bhqd,bhkd,de->bhqe")],
        [("q", _F, (2, 3, 4, 5)), ("k", _F, (2, 3, 4, 5))], {"w": _w(5, 6)}, 18),
    "einsum_diagonal_broadcast": (
        [_N("Einsum", ["m"], ["a"], equation="bii->bi"),
         _N("Einsum", ["m"], ["b"], equation="bii"),
         _N("Einsum", ["m", "m"], ["c"], equation="bij,bjj->bi"),
         _N("Einsum", ["c3"], ["d"], equation="iji->ij"),
         _N("Einsum", ["q1", "k"], ["e"], equation="...qd,...kd->...qk"),
         _N("Einsum", ["r1", "k"], ["f"], equation="...d,bhkd->...bhk")],
        [("m", _F, (2, 4, 4)), ("c3", _F, (3, 2, 3)), ("q1", _F, (2, 1, 4, 5)),
         ("k", _F, (2, 3, 4, 5)), ("r1", _F, (1, 5))], {}, 18),
    "resize": (
        [_N("Resize", ["x", "", "s2"], ["b"], mode="linear"),
         _N("Resize", ["x", "", "", "z1"], ["c"], mode="cubic",
            coordinate_transformation_mode="align_corners")],
        _X, {"s2": np.asarray([1, 1, 0.6, 1.75], np.float32), "z1": _i(2, 3, 5, 12)}, 19),
    "resize_more": (
        [_N("Resize", ["x", "", "s1"], ["a"], mode="nearest"),
         _N("Resize", ["x", "", "", "z2"], ["d"], mode="nearest",
            coordinate_transformation_mode="asymmetric", nearest_mode="ceil"),
         _N("Resize", ["x", "", "s3"], ["e"], mode="linear",
            coordinate_transformation_mode="pytorch_half_pixel"),
         _N("Resize", ["x", "", "", "z3"], ["f"], mode="linear", axes=[3, 2],
            keep_aspect_ratio_policy="not_larger"),
         _N("Resize", ["x", "", "s4"], ["g"], mode="cubic", exclude_outside=1,
            cubic_coeff_a=-0.5)],
        _X, {"s1": np.asarray([1, 1, 2, 1.5], np.float32), "z2": _i(2, 3, 3, 13), "s3": np.asarray([1, 1, 0.25, 0.5], np.float32),
             "z3": _i(5, 7), "s4": np.asarray([1, 1, 1.5, 0.75], np.float32)}, 19),
    "conv_transpose": (
        [_N("ConvTranspose", ["x", "wt", "bt"], ["a"], strides=[2, 2], pads=[1, 0, 0, 1]),
         _N("ConvTranspose", ["x", "wg"], ["b"], strides=[2, 3], dilations=[2, 1], group=3,
            output_padding=[1, 2]),
         _N("ConvTranspose", ["x", "wt"], ["c"], strides=[2, 2], output_shape=[18, 18]),
         _N("ConvTranspose", ["x1", "w1"], ["d"], strides=[2], auto_pad="SAME_UPPER")],
        _X + [("x1", _F, (2, 3, 7))], {"wt": _w(3, 4, 3, 3), "bt": _w(4),
                                        "wg": _w(3, 2, 3, 2), "w1": _w(3, 2, 3)}, 18),
    "conv_3d": (
        [_N("Conv", ["v", "w3", "b3"], ["a"], strides=[2, 1, 2], pads=[1, 0, 1, 0, 2, 1]),
         _N("Conv", ["v", "wg3"], ["b"], group=3, dilations=[2, 1, 2], pads=[0, 1, 1, 2, 0, 1]),
         _N("Conv", ["v", "wg3"], ["e"], group=3, auto_pad="SAME_LOWER"),
         _N("Conv", ["v", "w3"], ["c"], strides=[3, 2, 1], auto_pad="SAME_UPPER")],
        [("v", _F, (2, 3, 7, 6, 5))], {"w3": _w(4, 3, 3, 2, 3), "b3": _w(4),
                                        "wg3": _w(6, 1, 2, 3, 2)}, 18),
    "conv_transpose_3d": (
        [_N("ConvTranspose", ["v", "wt3", "bt3"], ["a"], strides=[2, 1, 3],
            pads=[1, 0, 1, 0, 1, 2], output_padding=[1, 0, 2]),
         _N("ConvTranspose", ["v", "wg3"], ["b"], group=3, dilations=[2, 1, 2]),
         _N("ConvTranspose", ["v", "wt3"], ["c"], strides=[2, 2, 1], output_shape=[12, 9, 6]),
         _N("ConvTranspose", ["v", "wt3"], ["d"], strides=[3, 1, 2], auto_pad="SAME_LOWER")],
        [("v", _F, (2, 3, 6, 5, 4))], {"wt3": _w(3, 4, 3, 2, 3), "bt3": _w(4),
                                        "wg3": _w(3, 2, 2, 3, 2)}, 18),
    "pools_dilated": (
        [_N("MaxPool", ["x"], ["a"], kernel_shape=[2, 3], dilations=[2, 2], pads=[1, 1, 0, 2],
            ceil_mode=1, strides=[2, 1]),
         _N("AveragePool", ["x"], ["b"], kernel_shape=[3, 2], dilations=[1, 3],
            count_include_pad=1, pads=[1, 0, 1, 1]),
         _N("MaxPool", ["v"], ["c"], kernel_shape=[2, 2, 2], dilations=[2, 1, 2])],
        _X + [("v", _F, (1, 2, 5, 6, 7))], {}, 19),
    "pools_3d": (
        [_N("MaxPool", ["v"], ["a"], kernel_shape=[2, 3, 2], strides=[2, 1, 2],
            pads=[1, 0, 1, 0, 1, 0], ceil_mode=1),
         _N("AveragePool", ["v"], ["b"], kernel_shape=[3, 2, 2], strides=[1, 2, 2],
            pads=[1, 1, 0, 1, 0, 1], count_include_pad=1),
         _N("AveragePool", ["v"], ["c"], kernel_shape=[2, 2, 3], pads=[1, 0, 1, 0, 1, 1],
            ceil_mode=1, strides=[2, 2, 2])],
        [("v", _F, (2, 3, 5, 6, 7))], {}, 18),
    "upsample_opset9": ([_N("Upsample", ["x", "s"], ["a"]),
                         _N("Upsample", ["x", "s2"], ["b"], mode="linear")], _X,
                        {"s": np.asarray([1, 1, 2, 3], np.float32),
                         "s2": np.asarray([1, 1, 2, 1.5], np.float32)}, 9),
    "group_norm": ([_N("GroupNormalization", ["x6", "s", "b"], ["a"], num_groups=3,
                       epsilon=1e-3)],
                   [("x6", _F, (2, 6, 4, 3))], {"s": _w(6), "b": _w(6)}, 21),
    "gather_elements_cumsum_trilu_topk": (
        [_N("GatherElements", ["x", "gi"], ["a"], axis=3),
         _N("CumSum", ["x", "ax"], ["b"]), _N("CumSum", ["x", "ax0"], ["c"], exclusive=1,
                                              reverse=1),
         _N("Trilu", ["x"], ["d"]), _N("Trilu", ["x", "k"], ["e"], upper=0),
         _N("TopK", ["x", "kk"], ["f", "g"], axis=1),
         _N("Floor", ["x"], ["fx"]), _N("TopK", ["fx", "kk"], ["h", "i"], largest=0),
         _N("TopK", ["fx", "kk"], ["jv", "j"], axis=2)],
        _X, {"gi": np.random.default_rng(1).integers(-8, 8, (2, 3, 8, 5)).astype(np.int64),
             "ax": np.asarray(-1, np.int64), "ax0": np.asarray(0, np.int32),
             "k": np.asarray(2, np.int64), "kk": _i(2)}, 18),
    "unary": ([_N(op, ["p"], [op.lower()]) for op in
               ("Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Log", "Sqrt", "Neg", "Reciprocal")],
              [("p", _F, (4, 5))], {}, 18),
}


_SLOW_CASES = {"einsum_more", "resize_more"}  # more of what the default cases check


@pytest.mark.parametrize("case", [c if c not in _SLOW_CASES else
                                  pytest.param(c, marks=pytest.mark.slow) for c in sorted(_CASES)])
def test_op_matches_onnxruntime(case: str):
  nodes, inputs, inits, opset = _CASES[case]
  produced = [o for n in nodes for o in n.output]
  model = _model(nodes, inputs, produced, {k: np.asarray(v) for k, v in inits.items()}, opset)
  if case == "unary":  # keep Log/Sqrt/Reciprocal in their domain
    model.graph.node.insert(0, _N("Abs", ["p0"], ["p1"]))
    model.graph.node.insert(1, _N("Add", ["p1", "one"], ["p"]))
    model.graph.input[0].name = "p0"
    model.graph.initializer.append(numpy_helper.from_array(np.float32(1.0), "one"))
  _run_both(model)


def test_gather_of_one_constant_index_is_imported_as_a_slice():
  """So the narrowing rules can move it up (a class token read by a classifier head)."""
  nodes, inputs, inits, opset = _CASES["gather_one_index"]
  model = _model(nodes, inputs, ["a", "b", "c"], inits, opset)
  graph, _ = onnx_io.load(model)
  hist = G.op_histogram(graph)
  assert "Gather" not in hist and hist["Slice"] == 3 and hist["Squeeze"] == 2, hist
  text = G.dump(graph)
  assert "Slice(%0) {axis=1, start=2, end=3}" in text, text  # -1 wrapped to 2
  # A run-time index stays a Gather.
  model = _model([_N("Gather", ["x", "i"], ["a"], axis=1)],
                 _X + [("i", TensorProto.INT64, ())], ["a"], {}, 18)
  assert G.op_histogram(onnx_io.load(model)[0])["Gather"] == 1


@pytest.mark.parametrize("opset", range(13, 22))
def test_small_cnn_in_every_opset(opset: int):
  """The same network written for each opset 13..21 (ReduceMean axes move to an input at 18)."""
  reduce = (_N("ReduceMean", ["p", "rax"], ["r"], keepdims=0) if opset >= 18 else
            _N("ReduceMean", ["p"], ["r"], axes=[2, 3], keepdims=0))
  nodes = [_N("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), _N("Relu", ["c"], ["a"]),
           _N("Pad", ["a", "pads"], ["ap"], mode="edge"),
           _N("MaxPool", ["ap"], ["p"], kernel_shape=[2, 2], strides=[2, 2]), reduce,
           _N("Unsqueeze", ["r", "uax"], ["ru"]), _N("Flatten", ["ru"], ["f"]),
           _N("Split", ["f", "sp"], ["f0", "f1"], axis=1),
           _N("Gemm", ["f0", "g", "gb"], ["h"], transB=1), _N("Softmax", ["h"], ["y"])]
  inits = {"w": _w(4, 3, 3, 3), "b": _w(4), "pads": _i(0, 0, 1, 1, 0, 0, 1, 1),
           "rax": _i(2, 3), "uax": _i(1), "sp": _i(3, 1), "g": _w(5, 3), "gb": _w(5)}
  _run_both(_model(nodes, _X, ["y", "f1"], inits, opset))


def test_shape_arithmetic_is_folded():
  """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, ConstantOfShape, Range, Equal/Where."""
  nodes = [
      _N("Shape", ["x"], ["s"]), _N("Gather", ["s", "zero"], ["n"]),
      _N("Unsqueeze", ["n", "axis0"], ["n1"]), _N("Concat", ["n1", "minus1"], ["shape"], axis=0),
      _N("Reshape", ["x", "shape"], ["flat"]),
      _N("Shape", ["flat"], ["fs"], start=1), _N("ConstantOfShape", ["fs"], ["ones"],
                                                 value=numpy_helper.from_array(
                                                     np.ones([1], np.float32))),
      _N("Range", ["r0", "r1", "r2"], ["rng"]), _N("Cast", ["rng"], ["rngf"], to=_F),
      _N("Equal", ["rng", "r0"], ["eq"]), _N("Where", ["eq", "rngf", "ones"], ["mask"]),
      _N("Mul", ["flat", "mask"], ["y"]),
  ]
  inits = {"zero": np.asarray(0, np.int64), "axis0": _i(0), "minus1": _i(-1),
           "r0": np.asarray(0, np.int64), "r1": np.asarray(192, np.int64),
           "r2": np.asarray(1, np.int64)}
  model = _model(nodes, _X, ["y"], inits)
  graph, params = onnx_io.load(model)
  assert host.op_histogram(graph) == {"Constant": 1, "Input": 1, "Mul": 1, "Reshape": 1}
  assert params.stats.folded_nodes == 10
  _run_both(model)


def test_nodes_in_any_order_give_the_same_graph():
  path = _shared_model("squeezenet1_1.onnx")
  model = onnx.load(path, load_external_data=False)
  g0, _ = onnx_io.load(model, random_weights=True)
  shuffled = copy.deepcopy(model)
  nodes = list(shuffled.graph.node)
  random.Random(3).shuffle(nodes)
  del shuffled.graph.node[:]
  shuffled.graph.node.extend(nodes)
  g1, _ = onnx_io.load(shuffled, random_weights=True)
  assert host.structural_hash(g0) == host.structural_hash(g1)


def _dynamic_model(dims: Sequence[Any] | None) -> onnx.ModelProto:
  """Relu of one input whose file dims are `dims` (ints, -1, symbols, None = no size; None for
  the whole list = no shape at all)."""
  x = helper.make_tensor_value_info("x", _F, None)
  if dims is not None:
    shape = x.type.tensor_type.shape
    for d in dims:
      dim = shape.dim.add()
      if isinstance(d, int):
        dim.dim_value = d
      elif isinstance(d, str):
        dim.dim_param = d
  graph = helper.make_graph([_N("Relu", ["x"], ["y"])], "dyn", [x],
                            [helper.make_tensor_value_info("y", _F, [-1, 3, 8])])
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def _input_shape_of(model: onnx.ModelProto, **load_kw: Any) -> tuple[tuple[int, ...], list[str]]:
  graph, params = onnx_io.load(model, **load_kw)
  return executor.lower(graph, params).input_specs[0].shape, params.stats.notes


@pytest.mark.parametrize("batch", [-1, "batch", None], ids=["minus1", "dim_param", "missing"])
def test_dynamic_batch_dim_defaults_to_one_with_a_note(batch: Any):
  """-1 (PaddlePaddle), a dim_param and a dim with no size are all dynamic: a leading one with
  no input_shapes entry is 1, with a note that says how to choose another."""
  model = _dynamic_model([batch, 3, 8])
  shape, notes = _input_shape_of(model)
  assert shape == (1, 3, 8)
  how = {-1: "-1 in the file", "batch": "'batch' in the file", None: "no size in the file"}[batch]
  assert notes == [f"graph input 'x': dim 0 is dynamic ({how}); batch size 1 is assumed (give "
                   "another with --input_shape=x=d0,3,8 (library: input_shapes={'x': "
                   "(d0, 3, 8)}))"]
  shape, notes = _input_shape_of(model, input_shapes={"x": (5, 3, 8)})
  assert shape == (5, 3, 8) and notes == []


@pytest.mark.parametrize("dim", [-1, "width", None], ids=["minus1", "dim_param", "missing"])
def test_other_dynamic_dims_need_input_shapes(dim: Any):
  """A dynamic dim past the batch: the error names input, dim, what the file says and the flag
  (with the dims known so far filled in); input_shapes fixes it."""
  model = _dynamic_model([-1, 3, dim])
  how = {-1: "-1 in the file", "width": "'width' in the file", None: "no size in the file"}[dim]
  with pytest.raises(errors.OnnxImportError) as info:
    onnx_io.load(model)
  assert str(info.value) == (
      f"<model dyn>: graph input 'x': dim 2 is dynamic ({how}); give its size with "
      "--input_shape=x=1,3,d2 (library: input_shapes={'x': (1, 3, d2)})")
  assert _input_shape_of(model, input_shapes={"x": (2, 3, 7)})[0] == (2, 3, 7)


def test_paddle_style_minus_one_with_input_shapes():
  """A Paddle-exported OCR classifier's input: [-1, 3, 48, 192] with --input_shape=x=1,3,48,192."""
  model = _dynamic_model([-1, 3, 48, 192])
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # fixing a dynamic dim is not worth a warning
    shape, notes = _input_shape_of(model, input_shapes={"x": (1, 3, 48, 192)})
  assert shape == (1, 3, 48, 192) and notes == []
  _run_both(model, input_shapes={"x": (1, 3, 48, 192)})


def test_overriding_a_fixed_dim_warns():
  model = _dynamic_model([-1, 3, 8])
  with pytest.warns(onnx_io.ShapeOverrideWarning) as record:
    shape, _ = _input_shape_of(model, input_shapes={"x": (5, 4, 8)})
  assert shape == (5, 4, 8)
  assert [str(w.message) for w in record] == [
      "<model dyn>: graph input 'x': input_shapes [5, 4, 8] changes dims the file fixes (dim 1 "
      "from 3 to 4); the model may not be valid at that size (its output shapes are recomputed "
      "and not checked against the file)"]


def test_bad_input_shapes_are_refused():
  model = _dynamic_model(["n", 3, 8])
  with pytest.raises(errors.OnnxImportError, match=r"input_shapes gives rank 2 \(\[5, 3\]\) "
                     r"but the input has rank 3 \(file dims \['n', 3, 8\]\)"):
    onnx_io.load(model, input_shapes={"x": (5, 3)})
  with pytest.raises(errors.OnnxImportError, match=r"not graph inputs"):
    onnx_io.load(model, input_shapes={"y": (1,)})
  with pytest.raises(errors.OnnxImportError, match=r"dim 0 is 0 in the file \(zero-size"):
    onnx_io.load(_dynamic_model([0, 3]))
  with pytest.raises(errors.OnnxImportError, match=r"gives no shape \(not even a rank\).*"
                     r"--input_shape=x=d0,d1"):
    onnx_io.load(_dynamic_model(None))
  assert _input_shape_of(_dynamic_model(None), input_shapes={"x": (2, 3)})[0] == (2, 3)
  with pytest.raises(errors.OnnxImportError, match=r"dim 0 is dynamic \('n' in the file\).*"
                     r"--input_shape=x=d0 "):  # rank 1: no batch dim to assume
    onnx_io.load(_dynamic_model(["n"]))


# ------------------------------------------------------------------------------ bad input

def test_float_mod_with_fmod_0_needs_opset_28():
  """onnxruntime refuses it before opset 28 as well; from 28 on it takes the divisor's sign."""
  model = _model([_N("Mod", ["x", "d"], ["y"])], _X, ["y"], {"d": np.float32(0.7)})
  with pytest.raises(errors.OnnxImportError, match=r"node 0 'y' \(Mod\): fmod=0 on floats is "
                     r"defined from opset 28 on \(the model is opset 18\)"):
    onnx_io.load(model)


def test_truncated_corrupt_empty_and_missing_files(tmp_path: Path):
  data = _model([_N("Relu", ["x"], ["y"])], _X, ["y"], {}).SerializeToString()
  cases = {"truncated.onnx": data[: len(data) // 2], "garbage.onnx": b"\x8f\xff\x00garbage" * 9,
           "empty.onnx": b""}
  for name, payload in cases.items():
    path = tmp_path / name
    path.write_bytes(payload)
    with pytest.raises(errors.OnnxImportError, match=name):
      onnx_io.load(path)
  with pytest.raises(errors.OnnxImportError, match="no such file"):
    onnx_io.load(tmp_path / "absent.onnx")
  with pytest.raises(errors.OnnxImportError):
    onnx_io.load(12345)


@pytest.mark.parametrize("opset", [None, 0, 10_000])
def test_wrong_or_missing_opset(opset: int | None):
  model = _model([_N("Relu", ["x"], ["y"])], _X, ["y"])
  del model.opset_import[:]
  if opset is not None:
    model.opset_import.append(helper.make_opsetid("", opset))
  with pytest.raises(errors.OnnxImportError, match="opset"):
    onnx_io.load(model)


def test_opset_6_is_converted_with_its_old_semantics():
  """PyTorch's old exports: Add with broadcast/axis attributes and a per-channel PRelu slope."""
  nodes = [_N("Add", ["x", "b"], ["a"], broadcast=1), _N("PRelu", ["a", "s"], ["y"])]
  b, slope = _w(8), _w(3)
  model = _model(nodes, _X, ["y"], {"b": b, "s": slope}, opset=6)
  graph, params = onnx_io.load(model)
  assert params.stats.notes == ["the model is opset 6; onnx.version_converter converted it to "
                                "opset 9 for import"]
  x = executor.lower(graph, params).random_inputs(0)[0]
  a = x + b
  want = np.where(a < 0, slope[None, :, None, None] * a, a)
  np.testing.assert_allclose(np.asarray(executor.run(graph, params, x)[0]), want, rtol=1e-6)


def test_opset_conversion_failure_is_named():
  """onnx.version_converter cannot rewrite an opset-6 Add broadcast along a middle axis."""
  model = _model([_N("Add", ["x", "b"], ["y"], broadcast=1, axis=1)], _X, ["y"], {"b": _w(3)},
                 opset=6)
  with pytest.raises(errors.OnnxImportError, match=r"^<model case>: opset 6 is older than the "
                     r"supported 9 to \d+, and onnx.version_converter cannot convert it to "
                     r"opset 9: .*not match"):
    onnx_io.load(model)


_BACKEND_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
_BACKEND_DIRS = ("pytorch-operator", "pytorch-converted", "simple")
# The backend-test model files out of scope, each with the project error that refuses it (a
# pattern of its message). Every other file of the three folders must import, compute its
# stored outputs and round-trip through export.
_BACKEND_REFUSED = {
    r"simple/test_expand_shape_model\d": (errors.UnsupportedOnnxOpError, r"\(Expand\)"),
    r"simple/test_gradient_of_add(_and_mul)?": (errors.UnsupportedOnnxOpError, "Gradient"),
    r"simple/test_sequence_model[1-7]": (errors.UnsupportedOnnxOpError, "Sequence"),
    r"simple/test_sequence_model8": (errors.OnnxImportError, r"dim 0 is dynamic"),
    r"simple/test_strnorm_model_.*": (errors.OnnxImportError, "element type STRING"),
}
# float64 inputs beyond float32's range: refused at run time without x64 (tested below).
_BACKEND_X64 = {f"pytorch-operator/test_operator_{n}" for n in (
    "add_broadcast", "add_size1_right_broadcast", "add_size1_singleton_broadcast",
    "addconstant")}
_BACKEND_FAST = {"pytorch-operator/test_operator_add_size1_broadcast",
                 "pytorch-operator/test_operator_selu", "simple/test_shrink",
                 "simple/test_sign_model", "simple/test_expand_shape_model1",
                 "pytorch-converted/test_Conv3d_stride_padding",
                 "pytorch-converted/test_ConvTranspose2d"}
_BACKEND_FILES = sorted(f"{d}/{case.name}" for d in _BACKEND_DIRS
                        for case in (_BACKEND_DATA / d).glob("test_*")
                        if (case / "model.onnx").is_file())


def _stored_cases(case: Path, model: onnx.ModelProto):
  """(feeds by input name, stored outputs) of each test_data_set_* of a backend-test case."""
  inits = {t.name for t in model.graph.initializer}
  names = [vi.name for vi in model.graph.input if vi.name not in inits]
  for data in sorted(case.glob("test_data_set_*")):
    feeds = dict(zip(names, [numpy_helper.to_array(onnx.load_tensor(str(f)))
                             for f in sorted(data.glob("input_*.pb"))]))
    yield feeds, [numpy_helper.to_array(onnx.load_tensor(str(f)))
                  for f in sorted(data.glob("output_*.pb"))]


def _assert_stored(got: Sequence[Any], want: Sequence[np.ndarray], name: str) -> None:
  assert len(got) == len(want), name
  for a, b in zip(got, want):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                               rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("name", [n if n in _BACKEND_FAST else
                                  pytest.param(n, marks=pytest.mark.slow)
                                  for n in _BACKEND_FILES] or ["(none)"])
def test_backend_model_file_matches_its_outputs_and_round_trips(name: str, tmp_path: Path):
  """Every model file of onnx's backend-test data (pytorch-operator, pytorch-converted, simple):
  refused by its named project error when out of scope; else it imports, computes its stored
  outputs, and its export passes the checker with strict shape inference, re-imports to the
  same graph and computes the same outputs in onnxruntime."""
  if name == "(none)":
    pytest.skip(f"the onnx package ships no backend-test model files under {_BACKEND_DATA}")
  case = _BACKEND_DATA / name
  refused = [v for k, v in _BACKEND_REFUSED.items() if re.fullmatch(k, name)]
  if refused:
    (error, pattern), = refused
    with pytest.raises(error, match=pattern):
      onnx_io.load(str(case / "model.onnx"))
    return
  if name in _BACKEND_X64 and not jax.config.jax_enable_x64:
    pytest.skip("feeds float64 values beyond float32's range (refused without x64, tested "
                "by test_backend_float64_inputs_beyond_float32_are_refused_by_name)")
  model = onnx.load(str(case / "model.onnx"))
  graph, params = onnx_io.load(model)
  path = tmp_path / "exported.onnx"
  onnx_io.save(graph, params, path)
  onnx.checker.check_model(str(path), full_check=True)
  onnx.shape_inference.infer_shapes_path(str(path), str(tmp_path / "inferred.onnx"),
                                         strict_mode=True)
  graph2, params2 = onnx_io.load(path)
  assert host.structural_hash(graph) == host.structural_hash(graph2)
  options = ort.SessionOptions()
  options.log_severity_level = 3
  session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
  for feeds, want in _stored_cases(case, model):
    inputs = [feeds[n] for n in params.input_names]
    _assert_stored(executor.run(graph, params, *inputs), want, name)
    ort_feeds = dict(zip([i.name for i in session.get_inputs()], inputs))
    _assert_stored(session.run(None, ort_feeds), want, f"{name} (exported, onnxruntime)")


def test_backend_float64_inputs_beyond_float32_are_refused_by_name():
  """onnx's add_broadcast feeds float64 values float32 cannot hold: without x64 the executor
  refuses them, naming the input, rather than rounding them to infinities."""
  if jax.config.jax_enable_x64:
    pytest.skip("x64 is enabled: float64 runs as float64")
  case = _BACKEND_DATA / "pytorch-operator/test_operator_add_broadcast"
  if not (case / "model.onnx").is_file():
    pytest.skip("the onnx package ships no test_operator_add_broadcast")
  model = onnx.load(str(case / "model.onnx"))
  graph, params = onnx_io.load(model)
  feeds = [numpy_helper.to_array(onnx.load_tensor(str(f)))
           for f in sorted((case / "test_data_set_0").glob("input_*.pb"))]
  with pytest.raises(errors.ShapeError, match=r"input \S+ is float64 with finite values beyond "
                     r"float32's range"):
    executor.run(graph, params, *feeds)


_D = TensorProto.DOUBLE


def test_float64_constants_exact_in_float32_run_and_others_are_noted_or_refused():
  """A float64 constant float32 holds exactly (1.0) imports as a float32 constant cast back to
  float64; one it rounds (0.1) imports with a note (without x64 JAX computes float64 as
  float32 anyway); one beyond float32's range is refused naming the constant."""
  def model(value: float) -> onnx.ModelProto:
    return _model([_N("Add", ["x", "c"], ["y"])], [("x", _D, (2, 3))], ["y"],
                  {"c": np.full((3,), value, np.float64)})
  graph, params = onnx_io.load(model(1.0))
  assert not params.stats.notes
  x = np.arange(6, dtype=np.float64).reshape(2, 3)
  (y,) = executor.run(graph, params, x)
  np.testing.assert_array_equal(np.asarray(y, np.float64), x + 1.0)
  if jax.config.jax_enable_x64:
    with pytest.raises(errors.OnnxImportError, match=r"constant 'c'.*float32 cannot hold "
                       r"exactly"):
      onnx_io.load(model(0.1))
  else:
    graph, params = onnx_io.load(model(0.1))
    assert any("constant 'c': float64, rounded to float32" in n for n in params.stats.notes)
    (y,) = executor.run(graph, params, x)
    np.testing.assert_allclose(np.asarray(y, np.float64), x + 0.1, rtol=1e-6)
  with pytest.raises(errors.OnnxImportError, match=r"constant 'c': float64 values beyond "
                     r"float32's range \(largest magnitude 1e\+300\)"):
    onnx_io.load(model(1e300))


def _if_model(cond_nodes: list[onnx.NodeProto], inputs: list[tuple[str, int, Any]],
              inits: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
  """y = If(c): the then branch computes Relu(x) * k (k its own initializer), the else branch
  Neg(x) + x2 (both read the enclosing graph's tensors); `cond_nodes` make c."""
  out = [helper.make_tensor_value_info("b", _F, None)]
  then_g = helper.make_graph([_N("Relu", ["x"], ["r"]), _N("Mul", ["r", "k"], ["b"])], "then",
                             [], out, initializer=[numpy_helper.from_array(
                                 np.float32(1.5), "k")])
  else_g = helper.make_graph([_N("Neg", ["x"], ["n"]), _N("Add", ["n", "x2"], ["b"])], "else",
                             [], out)
  nodes = cond_nodes + [helper.make_node("If", ["c"], ["y"], then_branch=then_g,
                                         else_branch=else_g)]
  return _model(nodes, inputs, ["y"], inits)


@pytest.mark.parametrize("value", [True, False])
def test_if_with_a_constant_condition_imports_the_chosen_branch(value: bool):
  """Only the chosen branch is imported; what only the other branch read (Exp for the then
  branch) is not left in the graph."""
  model = _if_model([_N("Relu", ["x0"], ["x"]), _N("Exp", ["x0"], ["x2"])],
                    [("x0", _F, (2, 3))], {"c": np.asarray(value)})
  _run_both(model)
  graph, _ = onnx_io.load(model)
  alive_ops = [ops.Op(int(o)) for o, a in zip(graph.nodes["op"], graph.nodes["alive"]) if a]
  assert (ops.Op.EXP in alive_ops) == (not value) and (ops.Op.NEG in alive_ops) == (not value)
  G.validate(graph)


def test_if_on_a_shape_check_folds_and_imports():
  """Exporters guard reshapes with If on a shape test: the condition folds from the static
  shape, so the If disappears."""
  cond = [_N("Shape", ["x"], ["s"]), _N("Gather", ["s", "zero"], ["d0"]),
          _N("Equal", ["d0", "two"], ["c"])]
  model = _if_model(cond, [("x", _F, (2, 3)), ("x2", _F, (2, 3))],
                    {"zero": np.asarray(0, np.int64), "two": np.asarray(2, np.int64)})
  _run_both(model)


def test_if_with_a_run_time_condition_is_refused_by_name():
  model = _if_model([], [("c", TensorProto.BOOL, ()), ("x", _F, (2, 3)), ("x2", _F, (2, 3))])
  with pytest.raises(errors.UnsupportedOnnxOpError, match=r"\(If\).*condition is computed "
                     r"at run time"):
    onnx_io.load(model)


def test_einsum_size_mismatch_of_a_named_label_is_refused():
  nodes = [_N("Einsum", ["a", "b"], ["y"], equation="ij,jk->ik")]
  with pytest.raises(errors.OnnxImportError, match=r"label 'j' has sizes 1 and 4 \(only dims "
                     r"of '\.\.\.' broadcast"):
    onnx_io.load(_model(nodes, [("a", _F, (3, 1)), ("b", _F, (4, 5))], ["y"]))


def test_unsupported_ops_are_listed_together():
  nodes = [_N("Relu", ["x"], ["a"]), _N("Unique", ["a"], ["v", "i"]),
           _N("Sin", ["v"], ["b"]), _N("Cos", ["x"], ["c"]),
           _N("MyOp", ["c"], ["d"], domain="com.example"), _N("Add", ["b", "d"], ["y"])]
  model = _model(nodes, _X, ["y"], {"k": _i(2)})
  model.opset_import.append(helper.make_opsetid("com.example", 1))
  with pytest.raises(errors.UnsupportedOnnxOpError) as info:
    onnx_io.load(model)
  assert set(info.value.ops) == {"Unique", "Sin", "Cos", "com.example::MyOp"}
  assert "4 node(s)" in str(info.value) and "node 1" in str(info.value)


def test_cycle_is_reported_with_its_nodes():
  nodes = [_N("Add", ["x", "c"], ["a"], name="first"), _N("Relu", ["a"], ["c"], name="second"),
           _N("Relu", ["a"], ["y"])]
  with pytest.raises(errors.OnnxImportError, match=r"cycle.*'first' \(Add\).*'second'"):
    onnx_io.load(_model(nodes, _X, ["y"]))


def test_undefined_tensor_and_undefined_output():
  with pytest.raises(errors.OnnxImportError, match=r"node 0 'n' \(Relu\) reads 'nowhere'"):
    onnx_io.load(_model([_N("Relu", ["nowhere"], ["y"], name="n")], _X, ["y"]))
  with pytest.raises(errors.OnnxImportError, match=r"graph output 'z'"):
    onnx_io.load(_model([_N("Relu", ["x"], ["y"])], _X, ["z"]))


def test_over_capacity_names_the_size_needed():
  path = _shared_model("squeezenet1_1.onnx")
  with pytest.raises(errors.CapacityError, match=r"squeezenet1_1\.onnx.*needs 92 node slots"):
    onnx_io.load(path, random_weights=True, capacity=64)
  graph, _ = onnx_io.load(path, random_weights=True, capacity=92)
  assert host.num_nodes(graph) == 92


def test_initializer_dims_that_disagree_with_use():
  bad_conv = _model([_N("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], name="conv")], _X, ["y"],
                    {"w": _w(4, 3, 3, 2)})
  with pytest.raises(errors.OnnxImportError, match=r"'conv' \(Conv\).*'w' has dims \[4, 3, 3, 2\]"):
    onnx_io.load(bad_conv)
  bad_matmul = _model([_N("MatMul", ["x", "w"], ["y"], name="mm")], _X, ["y"], {"w": _w(7, 2)})
  with pytest.raises(errors.OnnxImportError, match=r"'mm' \(MatMul\).*'w' float32\[7, 2\]"):
    onnx_io.load(bad_matmul)
  bad_channels = _model([_N("Conv", ["x", "w"], ["y"], name="c2")], _X, ["y"],
                        {"w": _w(4, 5, 1, 1)})
  with pytest.raises(errors.OnnxImportError, match=r"'c2' \(Conv\).*input channels"):
    onnx_io.load(bad_channels)


def test_declared_output_shape_must_match():
  model = _model([_N("Relu", ["x"], ["y"])], _X, ["y"])
  model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", _F, [2, 3, 8, 9]))
  with pytest.raises(errors.OnnxImportError, match=r"'y' is declared with dims \[2, 3, 8, 9\]"):
    onnx_io.load(model)


def test_external_data_is_loaded_when_present(tmp_path: Path):
  w = _w(4, 3, 3, 3)
  model = _model([_N("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], _X, ["y"], {"w": w})
  path = tmp_path / "ext.onnx"
  onnx.save_model(model, str(path), save_as_external_data=True, location="ext.onnx.data",
                  size_threshold=0)
  assert (tmp_path / "ext.onnx.data").is_file()
  graph, params = onnx_io.load(path)
  stored = {params.names[i]: params[i] for i in params}
  np.testing.assert_array_equal(stored["w"], w)
  assert params.stats.random_weights == 0
  # A data file that is too short is an error, not random weights.
  (tmp_path / "ext.onnx.data").write_bytes(b"\0" * 10)
  with pytest.raises(errors.OnnxImportError, match=r"too short|length"):
    onnx_io.load(path, random_weights=True)
  del graph


# ------------------------------------------------------------------------------ fuzz

_OPS = ["Relu", "Conv", "Add", "Concat", "MaxPool", "Reshape", "Gemm", "TopK", "Softmax", "Expand",
        "Shape", "Squeeze", "Identity", "Transpose"]


def _mutate(model: onnx.ModelProto, rng: random.Random) -> tuple[str, bytes | onnx.ModelProto]:
  """One random mutation: (description, mutated model or raw bytes)."""
  m = copy.deepcopy(model)
  g = m.graph
  kind = rng.choice(["drop_node", "init_dim", "input_dim", "bytes", "truncate", "rename_input",
                     "rename_graph_input", "attr", "op_type", "swap_inputs", "opset", "dtype",
                     "reorder"])
  if kind == "drop_node":
    i = rng.randrange(len(g.node))
    del g.node[i]
    return f"{kind} {i}", m
  if kind == "init_dim":
    t = rng.choice(list(g.initializer))
    if not t.dims:
      return kind + " (scalar, skipped)", m
    j = rng.randrange(len(t.dims))
    t.dims[j] = max(0, t.dims[j] + rng.choice([-2, -1, 1, 3, 1000]))
    return f"{kind} {t.name}[{j}]={t.dims[j]}", m
  if kind == "input_dim":
    d = g.input[0].type.tensor_type.shape.dim[rng.randrange(4)]
    choice = rng.choice([0, 1, 7, -3, None])
    if choice is None:
      d.dim_param = "dyn"
    else:
      d.dim_value = choice
    return f"{kind} {choice}", m
  if kind in ("bytes", "truncate"):
    data = bytearray(m.SerializeToString())
    if kind == "truncate":
      return kind, bytes(data[: rng.randrange(len(data))])
    for _ in range(rng.randint(1, 8)):
      data[rng.randrange(len(data))] = rng.randrange(256)
    return kind, bytes(data)
  if kind == "rename_input":
    node = rng.choice(list(g.node))
    if node.input:
      node.input[rng.randrange(len(node.input))] = rng.choice(["ghost", "x", ""])
    return f"{kind} {node.name}", m
  if kind == "rename_graph_input":
    g.input[0].name = "renamed"
    return kind, m
  if kind == "attr":
    node = rng.choice([n for n in g.node if n.attribute] or list(g.node))
    for a in node.attribute:
      if a.ints:
        a.ints[rng.randrange(len(a.ints))] = rng.choice([-1, 0, 2, 50, 1 << 20])
      elif a.type == onnx.AttributeProto.INT:
        a.i = rng.choice([-5, 0, 3, 99])
    return f"{kind} {node.name}", m
  if kind == "op_type":
    node = rng.choice(list(g.node))
    node.op_type = rng.choice(_OPS)
    return f"{kind} {node.name} -> {node.op_type}", m
  if kind == "swap_inputs":
    node = rng.choice([n for n in g.node if len(n.input) > 1] or list(g.node))
    ins = list(node.input)[::-1]
    del node.input[:]
    node.input.extend(ins)
    return f"{kind} {node.name}", m
  if kind == "opset":
    m.opset_import[0].version = rng.choice([1, 7, 12, 13, 21, 40])
    return f"{kind} {m.opset_import[0].version}", m
  if kind == "dtype":
    t = rng.choice(list(g.initializer))
    t.data_type = rng.choice([TensorProto.DOUBLE, TensorProto.INT64, TensorProto.STRING, 99,
                              TensorProto.FLOAT16])
    return f"{kind} {t.name}", m
  nodes = list(g.node)
  rng.shuffle(nodes)
  del g.node[:]
  g.node.extend(nodes)
  return kind, m


def _fuzz(path: Path, count: int, seed: int) -> dict[str, int]:
  model = onnx.load(path, load_external_data=False)
  reference = host.structural_hash(onnx_io.load(model, random_weights=True)[0])
  rng = random.Random(seed)
  outcomes: dict[str, int] = {"ok": 0, "error": 0}
  for i in range(count):
    what, mutated = _mutate(model, rng)
    try:
      graph, params = onnx_io.load(mutated, random_weights=True)
    except errors.XrlflowError as e:
      assert str(e), what
      outcomes["error"] += 1
      continue
    except Exception as e:  # pragma: no cover - the assertion is the point
      raise AssertionError(f"mutation {i} ({what}) raised {type(e).__name__}: {e}") from e
    host.validate(graph, params)
    if what == "reorder":
      assert host.structural_hash(graph) == reference, what
    outcomes["ok"] += 1
  return outcomes


def test_fuzz_mutated_models_import_or_fail_cleanly():
  outcomes = _fuzz(_shared_model("squeezenet1_1.onnx"), count=150, seed=0)
  assert outcomes["ok"] > 0 and outcomes["error"] > 0, outcomes


@pytest.mark.slow
@pytest.mark.parametrize("name,count", [("squeezenet1_1.onnx", 1000),
                                        ("resnet50_keepbn.onnx", 300)])
def test_fuzz_many_mutations(name: str, count: int):
  outcomes = _fuzz(_shared_model(name), count=count, seed=1)
  assert outcomes["ok"] > 0 and outcomes["error"] > 0, outcomes


def test_error_types_are_the_projects():
  assert issubclass(errors.OnnxImportError, errors.XrlflowError)
  assert issubclass(errors.UnsupportedOnnxOpError, errors.OnnxImportError)
  assert issubclass(errors.OnnxExportError, errors.XrlflowError)


# ------------------------------------------------------------------------------ integer paths

_INT_CASES = {
    "add": ([_N("Add", ["x", "c"], ["y"])], True), "sub": ([_N("Sub", ["x", "c"], ["y"])], True),
    "mul": ([_N("Mul", ["x", "c"], ["y"])], True), "max": ([_N("Max", ["x", "c"], ["y"])], True),
    "neg": ([_N("Neg", ["x"], ["y"])], False), "abs": ([_N("Abs", ["x"], ["y"])], False),
    "concat": ([_N("Concat", ["x", "c"], ["y"], axis=0)], True),
    "gather": ([_N("Gather", ["c", "i"], ["y"])], True),
    "reshape": ([_N("Reshape", ["x", "s"], ["y"])], False),
    "reducesum": ([_N("ReduceSum", ["x"], ["y"], keepdims=0)], False),
    "cast_float": ([_N("Cast", ["x"], ["y"], to=_F)], False),
    "sign": ([_N("Sign", ["x"], ["y"])], False),
    "mod": ([_N("Mod", ["x", "c"], ["y"])], True),
    "mod_fmod": ([_N("Mod", ["x", "c"], ["y"], fmod=1)], True),
    "reducemax": ([_N("ReduceMax", ["x"], ["y"], keepdims=0)], False),
    "argmax": ([_N("ArgMax", ["x"], ["y"])], False),
    "equal": ([_N("Equal", ["x", "c"], ["y"])], True),
}


@pytest.mark.parametrize("dtype", [TensorProto.INT64, TensorProto.INT32])
@pytest.mark.parametrize("case", sorted(_INT_CASES))
def test_integer_paths_match_onnxruntime(case: str, dtype: int):
  """Every integer op path gives onnxruntime's values (int64 runs as int32 without x64; values
  inside int32 must be equal; a product that leaves int32 at run time is a documented limit)."""
  nodes, uses_c = _INT_CASES[case]
  np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
  inits = {"c": np.asarray([3, -7, 2**20, 2**28], np_dtype)} if uses_c else {}
  if case == "reshape":
    inits["s"] = _i(2, 2)
  inputs = [("x", dtype, (4,))]
  if case == "gather":
    inputs = [("i", TensorProto.INT64, (4,))]
  model = _model(nodes, inputs, ["y"], inits)
  graph, params = onnx_io.load(model)
  x = np.asarray([0, 1, 3, 2], np_dtype if case != "gather" else np.int64)
  ours = np.asarray(executor.run(graph, params, x)[0])
  theirs = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {inputs[0][0]: x})[0]
  np.testing.assert_array_equal(ours, theirs)


def test_int64_constant_beyond_int32_is_refused_not_wrapped():
  """2^40 + x: refused by name without x64, not wrapped to int32 (which gives [5, 6, 8, 10])."""
  model = _model([_N("Add", ["x", "big"], ["y"])], [("x", TensorProto.INT64, (4,))], ["y"],
                 {"big": np.asarray(2**40, np.int64)})
  with pytest.raises(errors.OnnxImportError, match=r"constant 'big'.*do not fit int32"):
    onnx_io.load(model)


def test_int64_constant_beyond_int32_runs_exactly_with_x64(tmp_path: Path):
  """With JAX_ENABLE_X64=1 the same model computes onnxruntime's int64 result."""
  model = _model([_N("Add", ["x", "big"], ["y"])], [("x", TensorProto.INT64, (4,))], ["y"],
                 {"big": np.asarray(2**40, np.int64)})
  path = tmp_path / "big.onnx"
  onnx.save(model, path)
  script = ("import numpy as np; from xrlflow_jax import onnx_io, executor; "
            f"g, p = onnx_io.load({str(path)!r}); "
            "print(executor.run(g, p, np.array([5, 6, 8, 10], np.int64))[0].tolist())")
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        env={**os.environ, "JAX_ENABLE_X64": "1"}, timeout=300, check=True)
  want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
      None, {"x": np.array([5, 6, 8, 10], np.int64)})[0].tolist()
  assert proc.stdout.strip() == str(want) and want[0] == 2**40 + 5
