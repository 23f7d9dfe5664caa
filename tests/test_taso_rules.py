"""TASO's rule collection: decoding, translation counts, the shared verification harness on the
imported rules, near misses that must not match, synthetic rules for the ops TASO's file does not
use, and corrupt files."""

from __future__ import annotations

import collections
import functools
from pathlib import Path

import jax
import numpy as np
import pytest

from xrlflow_jax import GraphBuilder, workflow
from xrlflow_jax.ops import Op
from xrlflow_jax.rules import RuleSet
from xrlflow_jax.rules import taso, taso_wire
from xrlflow_jax.rules.library import builtin_rules
from xrlflow_jax.rules.taso import RuleImportError
from xrlflow_jax.rules.verify import verify_rule

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
RULE_FILE = SHARED / "taso" / "graph_subst.pb"
NEVER_MATCHING = [32, 33, 34, 35, 53, 54, 55, 56, 92, 93, 106, 107, 108, 109]

needs_file = pytest.mark.skipif(
    not RULE_FILE.is_file(),
    reason=f"TASO's rule file is absent (looked for {RULE_FILE}); ../shared holds it")


def _load() -> taso.TasoImport | None:
  return taso.load_taso(RULE_FILE) if RULE_FILE.is_file() else None


_IMPORTED = _load()  # at collection time, so the rule names can parametrize the harness test
_BY_NAME = {r.name: r for r in _IMPORTED.rules} if _IMPORTED else {}


@pytest.fixture(scope="module")
def imported() -> taso.TasoImport:
  if _IMPORTED is None:
    pytest.skip(f"TASO's rule file is absent (looked for {RULE_FILE}); ../shared holds it")
  return _IMPORTED


# ---------------------------------------------------------------------------------------------
# The file and the counts.

@needs_file
def test_counts(imported):
  src = imported.source
  assert len(src) == 133
  assert sum(1 for t in src if len(t.mapped) == 2) == 13
  assert max(max(len(t.src), len(t.dst)) for t in src) == 3
  assert max(len(t.variables()) for t in src) == 4
  assert imported.never_matching == NEVER_MATCHING
  done = [int(r.name.split("_")[1]) for r in imported.rules]
  skipped = [i for i, _ in imported.skipped]
  assert sorted(done + skipped + imported.never_matching) == list(range(133))
  assert (len(done), len(skipped)) == (113, 6), imported.summary()
  assert all(r.family == "taso" and r.example is not None for r in imported.rules)
  text = imported.summary()
  assert "133 rules (13 with two mapped outputs)" in text
  assert f"translated: {len(done)}" in text and "never matching" in text


@needs_file
def test_never_matching_are_exactly_the_self_convolutions(imported):
  for t in imported.source:
    assert bool(t.self_convolutions()) == (t.index in NEVER_MATCHING), t.pretty()


@needs_file
def test_skips_have_reasons_and_split_rules_are_translated(imported):
  for index, reason in imported.skipped:
    assert reason and "disconnected" in reason, (index, reason)
  two_outputs = [t.index for t in imported.source if len(t.mapped) == 2]
  translated = {r.name for r in imported.rules}
  # Every two-output rule that is connected (a join on a shared tensor) is translated.
  assert {f"taso_{i}" for i in (9, 77, 79, 116, 118, 127, 129)} <= translated
  rule = _BY_NAME["taso_77"]
  assert [d.op for d in rule.dst] == [Op.CONCAT, Op.MATMUL, Op.SLICE, Op.SLICE]
  assert len(rule.replace) == 2 and len(two_outputs) == 13


@needs_file
def test_decoder_reads_parameters_and_negative_ids(imported):
  t = imported.source[0]  # MatMul(MatMul(v1, v4), v5) => MatMul(v1, MatMul(v4, v5))
  assert [op.name for op in t.src] == ["MatMul", "MatMul"]
  assert t.src[0].inputs == (taso_wire.TasoTensor(-1, 0), taso_wire.TasoTensor(-4, 0))
  assert t.src[1].param("Activation") == 0
  assert t.mapped == (taso_wire.TasoMapping(1, 0, 1, 0),)
  conv = imported.source[59].dst[0]
  assert (conv.param("StrideH"), conv.param("Pad"), conv.param("KernelH")) == (1, 0, 3)


# ---------------------------------------------------------------------------------------------
# The shared harness on imported rules.

_IN_ORDER = sorted(_BY_NAME, key=lambda n: int(n.split("_")[1]))
# The default suite's sample: every fourth translated rule (29 of 113; its RuleSet compiles in
# about a quarter of the full one's ~3 minutes). Every rule: `-m slow`.
_SAMPLE = tuple(_IN_ORDER[::4])


@functools.lru_cache(maxsize=None)
def _harness(names: tuple[str, ...]) -> RuleSet:
  """The rules `names` in one RuleSet: one compilation serves the harness over all of them."""
  return RuleSet([_BY_NAME[n] for n in names], max_locations=16)


def _check(name: str, seeds: range, names: tuple[str, ...] = tuple(sorted(_BY_NAME))) -> None:
  report = verify_rule(_BY_NAME[name], seeds=seeds, ruleset=_harness(names))
  assert report.ok, (name, _BY_NAME[name].description, report.problems[:5])
  assert report.applied >= len(seeds)


# One test for the sample, so one xdist worker compiles its shared RuleSet. Every failing rule
# is listed.
@needs_file
def test_verify_a_sample_of_the_rules():
  assert len(_SAMPLE) == 29
  failed = []
  for name in _SAMPLE:
    try:
      _check(name, range(2), _SAMPLE)
    except AssertionError as e:
      failed.append(f"{name}: {e}")
  assert not failed, "\n".join(failed)


@needs_file
@pytest.mark.slow
@pytest.mark.parametrize("name", _IN_ORDER)
def test_verify_every_rule_more_seeds(name):
  _check(name, range(6))


# ---------------------------------------------------------------------------------------------
# Near misses: TASO's semantics must hold where a rule matches.

@functools.lru_cache(maxsize=None)
def _matcher(name: str):
  return jax.jit(RuleSet([_BY_NAME[name]], max_locations=8).match)


def _count(name: str, build) -> int:
  """Locations of rule `name` in the graph `build(builder)` outputs (capacity 32)."""
  b = GraphBuilder(seed=0)
  b.output(*build(b))
  graph, _ = b.build(capacity=32)
  return int(_matcher(name)(graph).found[0])


@needs_file
def test_near_misses_do_not_match():
  # taso_64: relu(conv(x, w)) -> conv<relu>(x, w) needs stride 1, SAME padding, one group.
  fuse = "taso_64"
  def conv_relu(**kw):
    def build(b):
      x = b.input((1, 4, 6, 6))
      return [b.relu(b.conv2d(x, b.weight((4, 4 // kw.get("groups", 1), 3, 3)), **kw))]
    return build
  assert _count(fuse, conv_relu()) == 1
  assert _count(fuse, conv_relu(strides=(2, 2))) == 0
  assert _count(fuse, conv_relu(padding="VALID")) == 0
  assert _count(fuse, conv_relu(groups=2)) == 0
  # taso_22: x1 @ w + x2 @ w -> (x1 + x2) @ w: TASO's MatMul and EwAdd do not broadcast.
  factor = "taso_22"
  def mm(lead1, lead2):
    def build(b):
      w = b.weight((3, 2))
      return [b.add(b.matmul(b.input(lead1 + (4, 3)), w), b.matmul(b.input(lead2 + (4, 3)), w))]
    return build
  assert _count(factor, mm((), ())) == 1
  assert _count(factor, mm((2,), ())) == 0


@needs_file
def test_grouped_target_conv_needs_equal_halves():
  # taso_99: concat_C(conv(a, p), conv(b, q)) -> conv(concat_C(a, b), concat_O(p, q)) runs as a
  # two-group conv, exact only when p and q have as many output channels.
  rule = "taso_99"
  def build(o1, o2):
    def fn(b):
      c1 = b.conv2d(b.input((1, 3, 5, 5)), b.weight((o1, 3, 3, 3)))
      c2 = b.conv2d(b.input((1, 3, 5, 5)), b.weight((o2, 3, 3, 3)))
      return [b.concat([c1, c2], axis=1)]
    return fn
  assert _count(rule, build(2, 2)) == 1
  assert _count(rule, build(2, 3)) == 0


# ---------------------------------------------------------------------------------------------
# Synthetic rule files: ops TASO's file does not use, skip reasons, corrupt data.

def _varint(value: int) -> bytes:
  value &= (1 << 64) - 1
  out = bytearray()
  while True:
    byte = value & 0x7F
    value >>= 7
    out.append(byte | (0x80 if value else 0))
    if not value:
      return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
  if isinstance(value, bytes):
    return _varint(number << 3 | 2) + _varint(len(value)) + value
  return _varint(number << 3) + _varint(value)


def _op(op_type: int, inputs: list[tuple[int, int]], **params: int) -> bytes:
  out = _field(1, op_type)
  for op_id, ts in inputs:
    out += _field(2, _field(1, op_id) + _field(2, ts))
  for name, value in params.items():
    out += _field(3, _field(1, taso_wire.PM[name]) + _field(2, value))
  return out


def _rule(src: list[bytes], dst: list[bytes], mapped: list[tuple[int, int, int, int]]) -> bytes:
  out = b"".join(_field(1, s) for s in src) + b"".join(_field(2, d) for d in dst)
  for so, st, do, dt in mapped:
    out += _field(3, _field(1, so) + _field(2, do) + _field(3, st) + _field(4, dt))
  return out


def _collection(*rules: bytes) -> bytes:
  return b"".join(_field(1, r) for r in rules)


V1, V2, X, W1, W2, S = (-1, 0), (-2, 0), (-7, 0), (-10, 0), (-11, 0), (-20, 0)
CONV = dict(StrideH=1, StrideW=1, Pad=0, KernelH=3, KernelW=3)
SYNTHETIC = {
    # (A^T B^T) = (B A)^T; perm (1, 0) packs to 1 * 2 + 0 = 2.
    "transpose": _rule(
        [_op(taso_wire.TRANSPOSE, [V1], NumDim=2, Perm=2, OutShuffle=0),
         _op(taso_wire.TRANSPOSE, [V2], NumDim=2, Perm=2, OutShuffle=0),
         _op(taso_wire.MATMUL, [(0, 0), (1, 0)], Activation=0)],
        [_op(taso_wire.MATMUL, [V2, V1], Activation=0),
         _op(taso_wire.TRANSPOSE, [(0, 0)], NumDim=2, Perm=2, OutShuffle=1)], [(2, 0, 1, 0)]),
    # (x * s) @ w = (x @ w) * s for a scalar s.
    "scalar_mul": _rule(
        [_op(taso_wire.SCALAR_MUL, [V1, S]), _op(taso_wire.MATMUL, [(0, 0), V2], Activation=0)],
        [_op(taso_wire.MATMUL, [V1, V2], Activation=0), _op(taso_wire.SCALAR_MUL, [(0, 0), S])],
        [(1, 0, 1, 0)]),
    # TASO's enlarge-and-merge: conv(x, w1), conv(x, w2) -> split(conv(x, concat(enlarge(w1), w2))).
    "enlarge_merge": _rule(
        [_op(taso_wire.CONV2D, [X, W1], Activation=0, **CONV),
         _op(taso_wire.CONV2D, [X, W2], Activation=0, **CONV)],
        [_op(taso_wire.ENLARGE, [W1, W2]),
         _op(taso_wire.CONCAT, [(0, 0), W2], NumInputs=2, Axis=0, NumDim=4),
         _op(taso_wire.CONV2D, [X, (1, 0)], Activation=0, **CONV),
         _op(taso_wire.SPLIT, [(2, 0)], NumOutputs=2, Axis=1)], [(0, 0, 3, 0), (1, 0, 3, 1)]),
    # tanh(conv(x, w)) -> conv<tanh>(x, w); sigmoid moved through a concat.
    "conv_tanh": _rule(
        [_op(taso_wire.CONV2D, [X, W1], Activation=0, **CONV), _op(taso_wire.TANH, [(0, 0)])],
        [_op(taso_wire.CONV2D, [X, W1], Activation=3, **CONV)], [(1, 0, 0, 0)]),
    "sigmoid_concat": _rule(
        [_op(taso_wire.SIGMOID, [V1]), _op(taso_wire.SIGMOID, [V2]),
         _op(taso_wire.CONCAT, [(0, 0), (1, 0)], NumInputs=2, Axis=1, NumDim=2)],
        [_op(taso_wire.CONCAT, [V1, V2], NumInputs=2, Axis=1, NumDim=2), _op(taso_wire.SIGMOID, [(0, 0)])],
        [(2, 0, 1, 0)]),
    # A Split in the source: relu(concat(split(x))) -> relu(x).
    "source_split": _rule(
        [_op(taso_wire.SPLIT, [V1], NumOutputs=2, Axis=1),
         _op(taso_wire.CONCAT, [(0, 0), (0, 1)], NumInputs=2, Axis=1, NumDim=2),
         _op(taso_wire.RELU, [(1, 0)])],
        [_op(taso_wire.RELU, [V1])], [(2, 0, 0, 0)]),
}


def _translate(*rules: bytes) -> taso.TasoImport:
  return taso.translate(taso_wire.parse_rule_collection(_collection(*rules), "synthetic"), "synthetic")


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_rules_translate_and_verify(name):
  result = _translate(SYNTHETIC[name])
  assert not result.skipped and len(result.rules) == 1, result.summary()
  report = verify_rule(result.rules[0], seeds=range(2))
  assert report.ok, (name, result.rules[0].description, report.problems[:5])


def test_unsupported_rules_are_skipped_with_reasons():
  batchnorm = _rule([_op(11, [X])], [_op(taso_wire.RELU, [X])], [(0, 0, 0, 0)])
  src_enlarge = _rule([_op(taso_wire.ENLARGE, [W1, W2])], [_op(taso_wire.RELU, [W1])], [(0, 0, 0, 0)])
  free_split = _rule(  # the split sizes of relu(x) are not determined by any Concat
      [_op(taso_wire.RELU, [V1])],
      [_op(taso_wire.SPLIT, [V1], NumOutputs=2, Axis=1), _op(taso_wire.CONCAT, [(0, 0), (0, 1)],
                                                         NumInputs=2, Axis=1, NumDim=2),
       _op(taso_wire.RELU, [(1, 0)])], [(0, 0, 2, 0)])
  self_conv = _rule([_op(taso_wire.CONV2D, [X, X], Activation=0, **CONV)],
                    [_op(taso_wire.CONV2D, [X, X], Activation=2, **CONV)], [(0, 0, 0, 0)])
  result = _translate(batchnorm, src_enlarge, free_split, self_conv)
  reasons = dict(result.skipped)
  assert "BatchNorm" in reasons[0]
  assert "Enlarge in the source" in reasons[1]
  assert "split sizes" in reasons[2]
  assert result.never_matching == [3] and not result.rules
  groups = collections.Counter(reasons.values())
  assert sum(groups.values()) == 3


@needs_file
def test_truncated_and_corrupt_files_raise(tmp_path):
  data = RULE_FILE.read_bytes()
  cases = {"truncated": data[:-3], "half": data[:len(data) // 2 + 1],
           "group_wire_type": bytes([0x0B]) + data[1:], "garbage": b"\xff" * 16,
           "empty": b""}
  for name, blob in cases.items():
    path = tmp_path / f"{name}.pb"
    path.write_bytes(blob)
    with pytest.raises(RuleImportError, match=name + ".pb"):
      taso.load_taso(path)
  with pytest.raises(RuleImportError, match="cannot read"):
    taso.load_taso(tmp_path / "missing.pb")


def test_dangling_reference_names_the_rule():
  bad = _rule([_op(taso_wire.RELU, [(1, 0)]), _op(taso_wire.RELU, [V1])], [_op(taso_wire.RELU, [V1])],
              [(0, 0, 0, 0)])
  ok = SYNTHETIC["conv_tanh"]
  with pytest.raises(RuleImportError, match=r"rule 1 srcOp 0: input \(1, 0\)"):
    taso_wire.parse_rule_collection(_collection(ok, bad), "file.pb")
  unknown_var = _rule([_op(taso_wire.RELU, [V1])], [_op(taso_wire.RELU, [V2])], [(0, 0, 0, 0)])
  with pytest.raises(RuleImportError, match="v2"):
    taso_wire.parse_rule_collection(_collection(unknown_var), "file.pb")


def test_example_shapes_vary_and_satisfy_the_rule():
  rule = _translate(SYNTHETIC["enlarge_merge"]).rules[0]
  shapes = set()
  for seed in range(6):
    b = GraphBuilder(seed=seed)
    outs = rule.example(b, np.random.default_rng(seed))
    shapes.add(tuple(t.shape for t in outs))
  assert len(shapes) >= 3


# ---------------------------------------------------------------------------------------------
# Rule sets by name (`workflow.select_rules`): TASO's collection beside the built-in rules.

@needs_file
def test_rule_sets_by_name(monkeypatch):
  builtin = [r.name for r in builtin_rules()]
  spec = f"taso:{RULE_FILE}"
  got = [r.name for r in workflow.select_rules([spec])]
  assert got == [r.name for r in _IMPORTED.rules] and len(got) == 113
  both = [r.name for r in workflow.select_rules([f"builtin+{spec}", "taso_0", builtin[0]])]
  assert both == builtin + got  # order of the entries, each rule once
  merge = [r.name for r in workflow.select_rules(["family:merge_conv"])]
  assert merge and set(merge) < set(builtin)
  lay = [r for r in workflow.select_rules(["layout"])]
  assert {r.family for r in lay} == {"layout", "transpose"}
  assert {"conv_to_nhwc", "transpose_cancel"} <= {r.name for r in lay} < set(builtin)
  assert [r.name for r in workflow.select_rules(["taso_5"], taso_file_path=RULE_FILE)] == ["taso_5"]
  monkeypatch.setenv(workflow.TASO_ENV, str(RULE_FILE))
  assert len(workflow.select_rules(["taso"])) == 113
  rs = workflow.ruleset([spec], 4)
  assert rs is workflow.ruleset([spec], 4) and len(rs) == 113  # one compiled object
  small = workflow.subset(rs, ["taso_9", "taso_0"])
  assert small.names == ["taso_0", "taso_9"] and small.max_locations == 4
  monkeypatch.delenv(workflow.TASO_ENV)
  for bad, words in [(["taso"], "XRLFLOW_TASO_RULES"), (["taso:/no/such/file.pb"], "does not exist"),
                     (["family:nope"], "unknown rule families"), (["no_such_rule"], "taso:<path>"),
                     ([f"{spec}+taso_32"], "not among the 113"), ([], "no rules")]:
    with pytest.raises(workflow.RuleSelectionError, match=words):
      workflow.select_rules(bad)


def test_opt_in_family_is_selected_only_by_name():
  builtin = [r.name for r in workflow.select_rules(["builtin"])]
  assert not any(n.startswith("dedupe_") for n in builtin)
  both = [r.name for r in workflow.select_rules(["builtin+family:dedupe"])]
  assert both[:len(builtin)] == builtin
  assert both[len(builtin):] == ["dedupe_concat_2", "dedupe_concat_3", "dedupe_concat_4",
                                 "dedupe_transpose_1"]
  assert [r.name for r in workflow.select_rules(["dedupe_transpose_1"])] == ["dedupe_transpose_1"]


@needs_file
def test_corrupt_rule_file_is_a_selection_error(tmp_path):
  bad = tmp_path / "graph_subst.pb"
  bad.write_bytes(RULE_FILE.read_bytes()[:1000])
  with pytest.raises(workflow.RuleSelectionError, match="graph_subst.pb"):
    workflow.select_rules([f"taso:{bad}"])
