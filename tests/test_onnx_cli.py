"""`python -m xrlflow_jax.onnx_io info|conformance`."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from xrlflow_jax.onnx_io import cli

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
REPO = Path(__file__).resolve().parents[1]


def _save(tmp_path: Path, nodes, inputs, outputs, inits=None, name="m.onnx") -> Path:
  graph = helper.make_graph(
      nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
      [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
      initializer=[numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
  path = tmp_path / name
  onnx.save_model(model, str(path))
  return path


def _info(*args: str) -> tuple[int, str]:
  out = io.StringIO()
  status = cli.main(["info", *args], out=out)
  return status, out.getvalue()


def test_info_on_a_shared_model():
  path = SHARED / "models" / "squeezenet1_1.onnx"
  if not path.is_file():
    pytest.skip(f"../shared/models is absent (looked for {path})")
  status, text = _info(str(path))
  assert status == 0, text
  assert "nodes: 65" in text and "Conv                     26" in text
  assert "x: float[1, 3, 224, 224]" in text and "y: float[1, 1000]" in text
  assert "import: 92 graph nodes" in text and "26 weights absent" in text
  assert "unsupported ops: none" in text


def test_info_lists_every_unsupported_op(tmp_path: Path):
  nodes = [helper.make_node("Sin", ["x"], ["a"]), helper.make_node("Cos", ["a"], ["b"]),
           helper.make_node("Relu", ["b"], ["c"]), helper.make_node("Tan", ["c"], ["y"])]
  path = _save(tmp_path, nodes, [("x", [2, 3])], ["y"])
  status, text = _info(str(path))
  assert status == 1
  assert "unsupported ops (3): Cos, Sin, Tan" in text


def test_info_with_input_shapes(tmp_path: Path):
  path = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [("x", [3, "n"])], ["y"])
  status, text = _info(str(path))
  assert status == 1 and "dim 1 is dynamic" in text and "x: float[3, n]" in text
  status, text = _info(str(path), "--input-shape", "x=3,4")
  assert status == 0 and "import: 2 graph nodes" in text
  path = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [("x", ["n", 3])], ["y"])
  status, text = _info(str(path))  # a dynamic batch dim is 1, with a note
  assert status == 0 and "note: graph input 'x': dim 0 is dynamic" in text


def test_info_on_a_corrupt_file(tmp_path: Path):
  path = tmp_path / "bad.onnx"
  path.write_bytes(b"\x12\x34not onnx at all")
  status, text = _info(str(path))
  assert status == 1 and "bad.onnx" in text and "error" in text


def test_bad_input_shape_argument():
  with pytest.raises(SystemExit):
    cli.main(["info", "m.onnx", "--input-shape", "x=a,b"], out=io.StringIO())


def test_conformance_subcommand():
  out = io.StringIO()
  assert cli.main(["conformance", "--filter", r"^test_(relu|softmax_axis_0)$"], out=out) == 0
  text = out.getvalue()
  assert "Relu" in text and "Softmax" in text
  assert text.splitlines()[0].split() == ["op", "pass/total", "failed", "excluded"]
  assert [line.split() for line in text.splitlines() if line.startswith("all")] == [
      ["all", "2/2", "0", "0"]]
  out = io.StringIO()  # excluded cases are counted with their reason, not run
  assert cli.main(["conformance", "--filter", r"^test_(relu|reduce_max_empty_set)$"],
                  out=out) == 0
  text = out.getvalue()
  assert ["ReduceMax", "0/0", "0", "1"] in [line.split() for line in text.splitlines()]
  assert "excluded: 1 cases" in text and "zero-size tensors" in text


def test_module_entry_point(tmp_path: Path):
  path = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [("x", [2, 3])], ["y"],
               {"unused": np.zeros([1], np.float32)})
  proc = subprocess.run([sys.executable, "-m", "xrlflow_jax.onnx_io", "info", str(path)],
                        cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr
  assert "nodes: 1" in proc.stdout and "Relu" in proc.stdout
