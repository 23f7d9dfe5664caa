"""`python -m xrlflow_jax.onnx_io info model.onnx [--input-shape name=1,3,224,224]`.

Prints the model's node count and op histogram, its inputs and outputs with shapes, what the
import makes of it (graph nodes, folded nodes, time) and every unsupported op at once.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from typing import Sequence, TextIO

import onnx

from xrlflow_jax.errors import OnnxImportError, UnsupportedOnnxOpError, XrlflowError
from xrlflow_jax.graph import host
from xrlflow_jax.onnx_io import backend, fold, importer
from xrlflow_jax.onnx_io.convert import CONVERTERS


def _parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
  name, sep, dims = text.rpartition("=")
  if not sep or not name:
    raise argparse.ArgumentTypeError(f"expected name=d0,d1,..., got {text!r}")
  try:
    shape = tuple(int(d) for d in dims.split(",") if d.strip())
  except ValueError:
    raise argparse.ArgumentTypeError(f"dims of {name!r} must be integers, got {dims!r}") from None
  return name, shape


def _fmt_value_info(vi: onnx.ValueInfoProto) -> str:
  tt = vi.type.tensor_type
  elem = onnx.TensorProto.DataType.Name(tt.elem_type) if tt.elem_type in (
      onnx.TensorProto.DataType.values()) else str(tt.elem_type)
  if not tt.HasField("shape"):
    return f"{vi.name}: {elem.lower()}[?]"
  dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
          for d in tt.shape.dim]
  return f"{vi.name}: {elem.lower()}[{', '.join(dims)}]"


def no_converter_ops(model: onnx.ModelProto) -> list[str]:
  """Op types (with domain for non-standard ones) that have no converter: the import accepts
  them only when every input is known on import (then they are folded)."""
  out = set()
  for node in model.graph.node:
    op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
    if op not in CONVERTERS and op not in ("Constant", "Shape", "Size"):
      out.add(op)
  return sorted(out)


def info(path: str, input_shapes: dict[str, tuple[int, ...]], out: TextIO) -> int:
  """Writes the report of one model; returns the exit status (0: the model imports)."""
  try:
    model, label, _ = importer.read_model(path)
    importer.check_text_fields(model, label)
  except OnnxImportError as e:
    print(f"error: {e}", file=out)
    return 1
  inits = {t.name for t in model.graph.initializer}
  opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)
  print(f"model: {label}", file=out)
  print(f"ir_version {model.ir_version}, opsets: {opsets or 'none'}, producer: "
        f"{model.producer_name} {model.producer_version}".rstrip(), file=out)
  hist = collections.Counter(n.op_type for n in model.graph.node)
  print(f"nodes: {len(model.graph.node)}", file=out)
  for op, count in sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])):
    print(f"  {op:24s} {count}", file=out)
  print(f"initializers: {len(inits)}", file=out)
  print("inputs:", file=out)
  for vi in model.graph.input:
    if vi.name not in inits:
      print(f"  {_fmt_value_info(vi)}", file=out)
  print("outputs:", file=out)
  for vi in model.graph.output:
    print(f"  {_fmt_value_info(vi)}", file=out)
  maybe = [op for op in no_converter_ops(model) if op not in fold.NOT_FOLDABLE]
  status = 0
  try:
    graph, params = importer.load(path, input_shapes=input_shapes or None, random_weights=True)
  except UnsupportedOnnxOpError as e:
    print(f"unsupported ops ({len(e.ops)}): {', '.join(e.ops)}", file=out)
    print(f"details: {e}", file=out)
    return 1
  except XrlflowError as e:
    print(f"import failed: {e}", file=out)
    status = 1
  else:
    s = params.stats
    print(f"import: {s.graph_nodes} graph nodes from {s.used_nodes} used ONNX nodes "
          f"({s.folded_nodes} folded on import) in {s.seconds:.2f}s"
          + (f"; {s.random_weights} weights absent, given random values" if s.random_weights
             else ""), file=out)
    for op, count in sorted(host.op_histogram(graph).items(), key=lambda kv: (-kv[1], kv[0])):
      print(f"  {op:24s} {count}", file=out)
    print("unsupported ops: none", file=out)
    for note in s.notes:
      print(f"note: {note}", file=out)
  if maybe and status:
    print(f"ops without a converter (fine only on inputs known on import): {', '.join(maybe)}",
          file=out)
  return status


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
  """Entry point of `python -m xrlflow_jax.onnx_io`."""
  parser = argparse.ArgumentParser(prog="python -m xrlflow_jax.onnx_io",
                                   description="ONNX tools of xrlflow_jax.")
  sub = parser.add_subparsers(dest="command", required=True)
  p_info = sub.add_parser("info", help="summarise a model and check that it imports")
  p_info.add_argument("model", help="path of the .onnx file")
  p_info.add_argument("--input-shape", "--input_shape", dest="input_shape", action="append", default=[], type=_parse_shape,
                      metavar="NAME=D0,D1,...", help="size of an input with dynamic dims")
  p_conf = sub.add_parser("conformance", help="run the onnx.backend.test node cases in scope "
                          "and print passed / failed / excluded per op")
  p_conf.add_argument("--filter", default="", help="regex on case names")
  args = parser.parse_args(argv)
  out = out or sys.stdout
  if args.command == "conformance":
    return conformance(args.filter, out)
  return info(args.model, dict(args.input_shape), out)


def conformance(pattern: str, out: TextIO) -> int:
  """Runs the in-scope conformance cases matching `pattern`; prints the table and failures."""
  cases = [c for c in backend.node_cases() if re.search(pattern, c.name)]
  skipped = collections.Counter(backend.scope(c) for c in cases)
  del skipped[None]
  results = backend.conformance(cases)
  print(backend.table(results), file=out)
  for r in results:
    if not r.passed and not r.excluded:
      print(f"FAILED {r.name} ({r.op}): {r.message}", file=out)
  excluded = collections.Counter(r.message for r in results if r.excluded)
  print(f"excluded: {sum(excluded.values())} cases", file=out)
  for reason, count in excluded.most_common():
    print(f"  {count:5d}  {reason}", file=out)
  print(f"out of scope: {sum(skipped.values())} cases", file=out)
  for reason, count in skipped.most_common(8):
    print(f"  {count:5d}  {reason}", file=out)
  return 0 if all(r.passed or r.excluded for r in results) else 1
