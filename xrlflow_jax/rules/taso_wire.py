"""TASO's substitution file (`graph_subst.pb`) as data: its enums, the rule dataclasses, and a
small proto2 wire-format decoder (no generated protobuf code). Translation into the project's
rule language is `rules.taso`.

    rules = parse_rule_collection(Path("../shared/taso/graph_subst.pb").read_bytes(), "file.pb")
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Sequence

from xrlflow_jax.errors import XrlflowError


class RuleImportError(XrlflowError):
  """A rule file that cannot be read: missing, truncated or corrupt, or a malformed rule in it.

  The message names the file and, where one is at fault, the rule index.
  """


# ---------------------------------------------------------------------------------------------
# TASO's enums (../shared/taso/README.md).

TASO_OP_NAMES = ("Input", "Weight", "Any", "Conv2D", "Dropout", "Linear", "MaxPool2D", "AvgPool2D",
                 "Relu", "Sigmoid", "Tanh", "BatchNorm", "Concat", "Split", "Reshape", "Transpose",
                 "EwAdd", "EwMul", "MatMul", "Mul", "Enlarge", "MergeGConv")
TASO_PARAM_NAMES = ("OpType", "NumInputs", "NumOutputs", "Group", "KernelH", "KernelW", "StrideH",
                    "StrideW", "Pad", "Activation", "NumDim", "Axis", "Perm", "OutShuffle",
                    "MergeGConvCount", "Axes", "KeepDims", "Epsilon")

CONV2D, RELU, SIGMOID, TANH, CONCAT, SPLIT = 3, 8, 9, 10, 12, 13
TRANSPOSE, EW_ADD, EW_MUL, MATMUL, SCALAR_MUL, ENLARGE = 15, 16, 17, 18, 19, 20
PM = {name: i for i, name in enumerate(TASO_PARAM_NAMES)}
PAD_SAME, PAD_VALID = 0, 1
# TASO activation codes -> names, for `TasoRule.pretty`.
_ACT_NAME = {0: "", 1: "sigmoid", 2: "relu", 3: "tanh"}


def taso_op_name(code: int) -> str:
  """TASO's name of an op code (or 'op#<code>' beyond the documented enum)."""
  return TASO_OP_NAMES[code] if 0 <= code < len(TASO_OP_NAMES) else f"op#{code}"


# ---------------------------------------------------------------------------------------------
# The rule file as data.

@dataclasses.dataclass(frozen=True)
class TasoTensor:
  """An op input: a pattern variable (op < 0, named by its id) or output `ts` of earlier op `op`."""
  op: int
  ts: int

  @property
  def is_var(self) -> bool:
    return self.op < 0


@dataclasses.dataclass(frozen=True)
class TasoOp:
  """One operator of a pattern: TASO op code, inputs and (key, value) parameters."""
  type: int
  inputs: tuple[TasoTensor, ...]
  params: tuple[tuple[int, int], ...]

  @property
  def name(self) -> str:
    return taso_op_name(self.type)

  def param(self, name: str) -> int | None:
    """The value of parameter `name` (TASO_PARAM_NAMES), or None when absent."""
    key = PM[name]
    value = None
    for k, v in self.params:
      if k == key:
        value = v
    return value

  @property
  def num_outputs(self) -> int:
    if self.type == SPLIT:
      return self.param("NumOutputs") or 0
    return 1


@dataclasses.dataclass(frozen=True)
class TasoMapping:
  """Target output (dst_op, dst_ts) replaces source output (src_op, src_ts)."""
  src_op: int
  src_ts: int
  dst_op: int
  dst_ts: int


@dataclasses.dataclass(frozen=True)
class TasoRule:
  """One substitution of the file, as stored (index = position in the file)."""
  index: int
  src: tuple[TasoOp, ...]
  dst: tuple[TasoOp, ...]
  mapped: tuple[TasoMapping, ...]

  def variables(self) -> list[int]:
    """Variable ids in order of first use in the source pattern."""
    seen: list[int] = []
    for op in self.src:
      for t in op.inputs:
        if t.is_var and t.op not in seen:
          seen.append(t.op)
    return seen

  def self_convolutions(self) -> list[str]:
    """'src<i>'/'dst<i>' of every Conv2D whose input and weight are the same tensor."""
    out = []
    for side, pattern in (("src", self.src), ("dst", self.dst)):
      for i, op in enumerate(pattern):
        if op.type == CONV2D and len(op.inputs) == 2 and op.inputs[0] == op.inputs[1]:
          out.append(f"{side}{i}")
    return out

  def pretty(self) -> str:
    """The rule as expressions, e.g. 'EwAdd(MatMul(v1, v4), MatMul(v2, v4)) => ...'."""
    def expr(pattern: Sequence[TasoOp], t: TasoTensor) -> str:
      if t.is_var:
        return f"v{-t.op}"
      op = pattern[t.op]
      args = ", ".join(expr(pattern, x) for x in op.inputs)
      extra = []
      if op.type in (CONV2D, MATMUL) and op.param("Activation"):
        extra.append(_ACT_NAME.get(op.param("Activation"), "?"))
      if op.type in (CONCAT, SPLIT):
        extra.append(f"axis={op.param('Axis')}")
      suffix = f"[{t.ts}]" if op.type == SPLIT else ""
      return f"{op.name}{'<' + ','.join(extra) + '>' if extra else ''}({args}){suffix}"
    src = ", ".join(expr(self.src, TasoTensor(m.src_op, m.src_ts)) for m in self.mapped)
    dst = ", ".join(expr(self.dst, TasoTensor(m.dst_op, m.dst_ts)) for m in self.mapped)
    return f"{src} => {dst}"


# ---------------------------------------------------------------------------------------------
# Protobuf wire format (proto2; only varint and length-delimited fields carry data here).

_WIRE_VARINT, _WIRE_I64, _WIRE_LEN, _WIRE_I32 = 0, 1, 2, 5


def _varint(buf: bytes, pos: int, end: int, where: str) -> tuple[int, int]:
  result, shift = 0, 0
  while True:
    if pos >= end:
      raise RuleImportError(f"{where}: truncated varint at byte {pos}")
    byte = buf[pos]
    pos += 1
    result |= (byte & 0x7F) << shift
    if not byte & 0x80:
      return result, pos
    shift += 7
    if shift >= 70:
      raise RuleImportError(f"{where}: varint longer than 10 bytes at byte {pos}")


def _fields(buf: bytes, start: int, end: int, where: str) -> Iterator[tuple[int, int, Any]]:
  """(field number, wire type, value) of a message in buf[start:end]; value is an int for
  varints and a (start, end) span for length-delimited fields."""
  pos = start
  while pos < end:
    key, pos = _varint(buf, pos, end, where)
    field, wire = key >> 3, key & 7
    if field == 0:
      raise RuleImportError(f"{where}: field number 0 at byte {pos}")
    if wire == _WIRE_VARINT:
      value, pos = _varint(buf, pos, end, where)
    elif wire == _WIRE_LEN:
      size, pos = _varint(buf, pos, end, where)
      if pos + size > end:
        raise RuleImportError(f"{where}: field {field} claims {size} bytes at byte {pos} but only "
                              f"{end - pos} remain (truncated file?)")
      value, pos = (pos, pos + size), pos + size
    elif wire in (_WIRE_I64, _WIRE_I32):
      size = 8 if wire == _WIRE_I64 else 4
      if pos + size > end:
        raise RuleImportError(f"{where}: truncated fixed-width field {field} at byte {pos}")
      value, pos = None, pos + size
    else:
      raise RuleImportError(f"{where}: unsupported wire type {wire} (field {field}) at byte "
                            f"{pos}; the data is not a RuleCollection")
    yield field, wire, value


def _int32(value: int, where: str) -> int:
  """A proto int32 from its varint (negative values are sign-extended to 64 bits)."""
  value &= (1 << 64) - 1
  if value >= 1 << 63:
    value -= 1 << 64
  if not -(1 << 31) <= value < (1 << 31):
    raise RuleImportError(f"{where}: value {value} does not fit an int32")
  return value


def _scalars(buf: bytes, span: tuple[int, int], where: str, names: dict[int, str]
             ) -> dict[str, int]:
  """A message of int32 fields (Tensor, Parameter, MapOutput) as {name: value}."""
  out: dict[str, int] = {}
  for field, wire, value in _fields(buf, span[0], span[1], where):
    if field in names:
      if wire != _WIRE_VARINT:
        raise RuleImportError(f"{where}: field {names[field]} has wire type {wire}, not varint")
      out[names[field]] = _int32(value, where)
  return out


def _operator(buf: bytes, span: tuple[int, int], where: str) -> TasoOp:
  op_type, inputs, params = None, [], []
  for field, wire, value in _fields(buf, span[0], span[1], where):
    if field == 1:
      if wire != _WIRE_VARINT:
        raise RuleImportError(f"{where}: op type has wire type {wire}, not varint")
      op_type = _int32(value, where)
    elif field in (2, 3):
      if wire != _WIRE_LEN:
        raise RuleImportError(f"{where}: field {field} has wire type {wire}, not a message")
      if field == 2:
        t = _scalars(buf, value, where, {1: "opId", 2: "tsId"})
        inputs.append(TasoTensor(t.get("opId", 0), t.get("tsId", 0)))
      else:
        p = _scalars(buf, value, where, {1: "key", 2: "value"})
        params.append((p.get("key", 0), p.get("value", 0)))
  if op_type is None:
    raise RuleImportError(f"{where}: operator without a type")
  return TasoOp(op_type, tuple(inputs), tuple(params))


def parse_rule_collection(data: bytes, source: str = "<bytes>") -> list[TasoRule]:
  """Decodes a serialised `RuleCollection` and checks that every reference in it resolves.

  Raises `RuleImportError` (naming `source` and the rule) on truncated or corrupt data.
  """
  rules = []
  for field, wire, value in _fields(data, 0, len(data), source):
    if field != 1:
      continue
    where = f"{source}: rule {len(rules)}"
    if wire != _WIRE_LEN:
      raise RuleImportError(f"{where}: has wire type {wire}, not a message")
    src, dst, mapped = [], [], []
    for f2, w2, v2 in _fields(data, value[0], value[1], where):
      if f2 in (1, 2, 3) and w2 != _WIRE_LEN:
        raise RuleImportError(f"{where}: field {f2} has wire type {w2}, not a message")
      if f2 == 1:
        src.append(_operator(data, v2, f"{where} srcOp {len(src)}"))
      elif f2 == 2:
        dst.append(_operator(data, v2, f"{where} dstOp {len(dst)}"))
      elif f2 == 3:
        m = _scalars(data, v2, where, {1: "srcOpId", 2: "dstOpId", 3: "srcTsId", 4: "dstTsId"})
        mapped.append(TasoMapping(m.get("srcOpId", 0), m.get("srcTsId", 0), m.get("dstOpId", 0),
                                  m.get("dstTsId", 0)))
    rule = TasoRule(len(rules), tuple(src), tuple(dst), tuple(mapped))
    _check_references(rule, where)
    rules.append(rule)
  if not rules:
    raise RuleImportError(f"{source}: holds no rules (empty or not a RuleCollection)")
  return rules


def _check_references(rule: TasoRule, where: str) -> None:
  """Every input names a variable or an earlier op's existing output; mappings resolve."""
  if not rule.src or not rule.dst or not rule.mapped:
    raise RuleImportError(f"{where}: needs source ops, target ops and mapped outputs "
                          f"(has {len(rule.src)}, {len(rule.dst)}, {len(rule.mapped)})")
  src_vars = set(rule.variables())
  for side, pattern in (("srcOp", rule.src), ("dstOp", rule.dst)):
    for i, op in enumerate(pattern):
      if op.type == SPLIT and op.num_outputs < 1:
        raise RuleImportError(f"{where} {side} {i}: Split without NumOutputs")
      for t in op.inputs:
        if t.is_var:
          if t.ts != 0 or (side == "dstOp" and t.op not in src_vars):
            raise RuleImportError(f"{where} {side} {i}: variable v{-t.op} (output {t.ts}) is not "
                                  "a variable of the source pattern")
        elif not (t.op < i and 0 <= t.ts < pattern[t.op].num_outputs):
          raise RuleImportError(f"{where} {side} {i}: input ({t.op}, {t.ts}) does not name an "
                                "output of an earlier op")
  for m in rule.mapped:
    if not (0 <= m.src_op < len(rule.src) and 0 <= m.src_ts < rule.src[m.src_op].num_outputs
            and 0 <= m.dst_op < len(rule.dst)
            and 0 <= m.dst_ts < rule.dst[m.dst_op].num_outputs):
      raise RuleImportError(f"{where}: mapped output {m} does not resolve")
