"""Tests of the cost package: the in-graph cost model, the profiler and its cache, fitting, the
validation statistics, bad input and the CLI. The rewrite engine is compiled only for three
merge rules at a small capacity (seconds); the heavier rule tests are marked slow."""

from __future__ import annotations

import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats
import pytest

from xrlflow_jax import errors, measure, models
from xrlflow_jax import graph as G
from xrlflow_jax.cost import __main__ as cli
from xrlflow_jax.cost import calibrate
from xrlflow_jax.cost import coefficient_files as CF
from xrlflow_jax.cost import fit as fit_lib
from xrlflow_jax.cost import fusion_profile
from xrlflow_jax.cost import kernel_table
from xrlflow_jax.measure import latency
from xrlflow_jax.cost import model as M
from xrlflow_jax.cost import profiler as P
from xrlflow_jax.cost import signatures as S
from xrlflow_jax.graph import layout
from xrlflow_jax.harness import cost_validation as V


# Every test graph has this capacity, and the jitted functions are shared, so the cost model
# compiles only a few times (XLA:CPU compiles of the features take seconds on a small machine).
CAP = 32


@jax.jit
@chex.assert_max_traces(n=1)
def _graph_cost(graph, coeffs):
  return M.graph_cost(graph, coeffs)


_node_costs = jax.jit(M.node_costs)


def _coeffs(epilogue_fusion: bool = False, weights=None) -> M.CostCoefficients:
  """Round-number coefficients, every feature positive (tests of structure, not of the fit)."""
  w = np.full([M.NUM_FEATURES], 0.01, np.float32) if weights is None else weights
  return M.CostCoefficients(jnp.asarray(w, jnp.float32), jnp.asarray(0.005, jnp.float32), "cpu",
                            epilogue_fusion)


def _costs(graph, coeffs):
  return np.asarray(_node_costs(graph, coeffs))


def _feature(graph, name: str) -> np.ndarray:
  """float[N]: one feature of every node (node costs under a one-hot weight vector)."""
  onehot = np.zeros([M.NUM_FEATURES], np.float32)
  onehot[list(M.FEATURE_NAMES).index(name)] = 1.0
  return _costs(graph, _coeffs(weights=onehot))


def _mlp(capacity: int = CAP, hidden: int = 16):
  b = G.GraphBuilder(seed=0)
  x = b.input((4, 8))
  w1 = b.weight((8, hidden))
  both = b.concat([w1, b.weight((8, hidden))], axis=1)  # constant: folded at lowering
  h = b.matmul(x, both, activation="relu")
  b.tanh(h)  # unreachable: no output depends on it
  y = b.softmax(b.matmul(h, b.weight((2 * hidden, 8))))
  b.output(y)
  graph, params = b.build(capacity)
  return graph, params, {"x": x.index, "concat": both.index, "w1": w1.index, "h": h.index,
                         "y": y.index}


def test_node_costs_shape_and_zeros():
  graph, _, idx = _mlp()
  costs = _costs(graph, _coeffs())
  n_alive = G.num_nodes(graph)
  assert costs.shape == (CAP,) and costs.dtype == np.float32
  assert (costs[n_alive:] == 0).all()  # dead slots
  assert costs[idx["x"]] == 0 and costs[idx["w1"]] == 0  # Input and Constant
  # A folded weight read at run time costs only its bytes once (const.mb), nothing else.
  assert graph.nodes["is_constant"][idx["concat"]]
  concat_mb = 8 * 32 * 4 / 1e6
  assert costs[idx["concat"]] == pytest.approx(0.01 * concat_mb, rel=1e-5)
  assert costs[idx["h"] + 1] == 0  # the unreachable tanh
  assert costs[idx["h"]] > 0 and costs[idx["y"]] > 0
  total = float(_graph_cost(graph, _coeffs()))
  assert total == pytest.approx(0.005 + costs.sum(), rel=1e-5)


def test_jit_vmap_and_no_retrace_within_a_capacity():
  # _graph_cost is wrapped in chex.assert_max_traces(n=1): every graph of every test (one
  # capacity) and every coefficient set share one trace.
  g1, _, _ = _mlp(hidden=16)
  g2, _, _ = _mlp(hidden=64)
  coeffs = _coeffs()
  c1, c2 = float(_graph_cost(g1, coeffs)), float(_graph_cost(g2, coeffs))
  assert c2 > c1  # wider hidden layer
  assert float(_graph_cost(g1, _coeffs(weights=np.full([M.NUM_FEATURES], 0.02)))) > c1
  batch = jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), g1, g2)
  batched = np.asarray(jax.jit(jax.vmap(M.graph_cost, in_axes=(0, None)))(batch, coeffs))
  np.testing.assert_allclose(batched, [c1, c2], rtol=1e-5)


def _elementwise_after(producer: str, capacity: int = CAP):
  """x[64, 256] -> producer -> relu (output); returns (graph, relu slot)."""
  b = G.GraphBuilder(seed=0)
  x = b.input((64, 256))
  if producer == "input":
    y = x
  elif producer == "tanh":
    y = b.tanh(x)
  elif producer == "matmul":
    y = b.matmul(x, b.weight((256, 256)))
  elif producer == "matmul_act":
    y = b.matmul(x, b.weight((256, 256)), activation="tanh")
  else:
    raise ValueError(producer)
  r = b.relu(y)
  b.output(r)
  graph, _ = b.build(capacity)
  return graph, r.index


def test_fusion_awareness():
  cpu = _coeffs()
  standalone = _costs(*_elementwise_after("input")[:1], cpu)[_elementwise_after("input")[1]]
  for producer in ("tanh", "matmul_act"):  # fusible producers on XLA:CPU
    graph, relu = _elementwise_after(producer)
    assert _costs(graph, cpu)[relu] < standalone, producer
  # XLA:CPU does not fuse into a dot: the relu starts its own loop fusion.
  graph, relu = _elementwise_after("matmul")
  assert _costs(graph, cpu)[relu] == pytest.approx(standalone)
  # A backend with GEMM epilogue fusion folds it into the matmul.
  gpu = _coeffs(epilogue_fusion=True)
  standalone_gpu = _costs(_elementwise_after("input")[0], gpu)[_elementwise_after("input")[1]]
  assert _costs(graph, gpu)[relu] < standalone_gpu
  # Features: a fused op launches nothing and reads nothing of its producer.
  graph, relu = _elementwise_after("tanh")
  launch, mb = _feature(graph, "loop.launch"), _feature(graph, "loop.mb")
  assert launch[relu] == 0 and launch[relu - 1] == 1  # the tanh starts the fusion
  # The tanh reads x, its output stays in registers; the relu writes the result.
  assert mb[relu - 1] == pytest.approx(64 * 256 * 4 / 1e6)
  assert mb[relu] == pytest.approx(64 * 256 * 4 / 1e6)


def test_bigger_matmul_costs_more():
  coeffs = CF.load_coefficients("cpu")
  costs = []
  for n in (64, 256, 1024):
    b = G.GraphBuilder(seed=0)
    x = b.input((n, n))
    b.output(b.matmul(x, b.weight((n, n))))
    costs.append(float(_graph_cost(b.build(CAP)[0], coeffs)))
  assert costs[0] < costs[1] < costs[2]


def _qkv_params(seq: int, hidden: int):
  return _qkv_build(False, seq, hidden)[1]


def _qkv(merged: bool, seq: int = 64, hidden: int = 1024):
  return _qkv_build(merged, seq, hidden)[0]


def _qkv_build(merged: bool, seq: int, hidden: int):
  b = G.GraphBuilder(seed=0)
  x = b.input((seq, hidden))
  ws = [b.weight((hidden, hidden)) for _ in range(3)]
  if merged:
    big = b.matmul(x, b.concat(ws, axis=1))
    outs = [b.slice(big, 1, i * hidden, (i + 1) * hidden) for i in range(3)]
  else:
    outs = [b.matmul(x, w) for w in ws]
  heads = [b.transpose(b.reshape(o, (seq, 16, hidden // 16)), (1, 0, 2)) for o in outs]
  b.output(*heads)
  return b.build(CAP)


def test_sibling_features_and_groups():
  unmerged, merged = _qkv(False, 16, 64), _qkv(True, 16, 64)
  sib = _feature(unmerged, "matmul.gflop_sibling")
  lone = _feature(unmerged, "matmul.gflop")
  assert (sib > 0).sum() == 3 and lone.sum() == 0
  assert _feature(merged, "matmul.gflop_sibling").sum() == 0
  assert _feature(merged, "matmul.gflop").sum() == pytest.approx(sib.sum())
  groups = S.sibling_groups(unmerged)
  assert len(groups) == 1 and len(groups[0][0].members) == 3 and groups[0][1] == 1
  assert S.signature_from_key(groups[0][0].key) == groups[0][0]
  assert not S.sibling_groups(merged)


def test_merged_qkv_costs_more_under_shipped_cpu_coefficients():
  # What measurements show on the 2-core CPU at BERT-default size ([64, 1024] tokens, three
  # 1024x1024 projections): the merged projection is slower end to end, 1.07x in two
  # interleaved runs (1.11-1.15x at [128, 768]), because XLA:CPU runs the three independent
  # matmuls concurrently and the one wide matmul gains nothing in efficiency. The shipped
  # coefficients reproduce the direction (sibling GFLOPs are cheaper than lone ones).
  coeffs = CF.load_coefficients("cpu")
  unmerged = float(_graph_cost(_qkv(False), coeffs))
  merged = float(_graph_cost(_qkv(True), coeffs))
  assert merged > unmerged
  named = coeffs.named()
  assert named["matmul.gflop_sibling"] < named["matmul.gflop"]


def test_shipped_coefficients_and_json_roundtrip(tmp_path):
  coeffs = CF.load_coefficients("cpu")
  assert coeffs.device_kind == "cpu" and not coeffs.epilogue_fusion
  w = np.asarray(coeffs.weights)
  assert w.shape == (M.NUM_FEATURES,) and (w >= 0).all() and float(coeffs.call_ms) > 0
  path = CF.save_coefficients(coeffs, tmp_path / "c.json", note="x")
  again = CF.load_coefficients("anything", path)
  np.testing.assert_allclose(np.asarray(again.weights), w)
  with pytest.raises(M.CostModelError, match="python -m xrlflow_jax.cost calibrate"):
    CF.load_coefficients("Imaginary Accelerator 9000")
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps({"device_kind": "cpu", "call_ms": 0.1, "weights": {"x": 1}}))
  with pytest.raises(M.CostModelError, match="missing"):
    CF.load_coefficients("cpu", bad)


def test_nnls_and_fit_recover_known_coefficients():
  rng = np.random.default_rng(0)
  a = rng.random((40, 5))
  x_true = np.array([0.0, 2.0, 0.0, 0.5, 1.0])
  np.testing.assert_allclose(fit_lib.nnls(a, a @ x_true), x_true, atol=1e-8)
  x = fit_lib.nnls(a, a @ np.array([-1.0, 1, 1, 1, 1]))
  assert (x >= 0).all()
  feats = rng.random((200, M.NUM_FEATURES)) * (rng.random((200, M.NUM_FEATURES)) < 0.3)
  true_w = rng.random(M.NUM_FEATURES)
  times = 0.01 + feats @ true_w
  coeffs, report = fit_lib.fit_coefficients(feats, times, device_kind="cpu", ridge=0.0)
  np.testing.assert_allclose(np.asarray(coeffs.weights), true_w, rtol=1e-3, atol=1e-4)
  assert float(coeffs.call_ms) == pytest.approx(0.01, rel=1e-3)
  assert report.median_rel_err < 1e-4
  with pytest.raises(M.CostModelError):
    fit_lib.fit_coefficients(feats[:, :3], times, device_kind="cpu")


def test_spearman():
  assert measure.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
  assert measure.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
  np.testing.assert_allclose(scipy.stats.rankdata([3, 1, 3, 2]), [3.5, 1, 3.5, 2])
  assert measure.spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)
  assert np.isnan(measure.spearman([1, 1, 1], [1, 2, 3]))


def test_agreement_statistics():
  kinds = ["control", "neighbour", "neighbour", "neighbour", "walk", "walk"]
  # Two passes that agree on the order; the model ranks like the measurements.
  ratios = np.array([[1.00, 1.20, 0.80, 1.0, 1.5, 0.6],
                     [1.01, 1.22, 0.79, 1.0, 1.6, 0.62]])
  costs = np.array([10.0, 12.0, 8.0, 10.0, 15.0, 6.0])
  a = V.agreement(kinds, ratios, costs, 10.0)
  assert a.spearman_all == pytest.approx(1.0) and a.retest_spearman == pytest.approx(1.0)
  assert a.ceiling == pytest.approx(1.0)
  assert a.sign_pairs == 2 and a.sign_correct == 2
  assert a.tie_pairs == 1 and a.tie_quiet == 1  # the model's tie measured within noise
  assert a.noise_threshold >= 0.02 and a.control_dev == pytest.approx(np.sqrt(1.01) - 1)
  # A model that inverts the order gets -1 and every sign wrong; a change of 0.05% in cost
  # is a tie (no prediction), so a real measured change there counts as wrong.
  b = V.agreement(kinds, ratios, 20.0 - costs, 10.0)
  assert b.spearman_all == pytest.approx(-1.0) and b.sign_correct == 0
  c = V.agreement(kinds, ratios, np.array([10.0, 10.005, 8.0, 10.0, 15.0, 6.0]), 10.0)
  assert c.sign_pairs == 2 and c.sign_correct == 1 and c.tie_pairs == 2
  # Passes that disagree: the ceiling says no model can rank these.
  noisy = np.array([[1.0, 1.01, 0.99, 1.02, 0.98, 1.0], [1.0, 0.99, 1.01, 0.98, 1.02, 1.0]])
  d = V.agreement(kinds, noisy, costs, 10.0)
  assert d.retest_spearman < 0 and d.retest_dev > 0.01
  one = V.agreement(kinds, ratios[:1], costs, 10.0)
  assert np.isnan(one.retest_spearman) and np.isnan(one.ceiling)
  with pytest.raises(ValueError):
    V.agreement(kinds, ratios[:, :3], costs, 10.0)


def test_profiler_cache_second_run_measures_nothing(tmp_path, monkeypatch):
  calls = []
  real = latency._timed_runs  # pylint: disable=protected-access

  def counting(*a, **k):
    calls.append(1)
    return real(*a, **k)

  monkeypatch.setattr(latency, "_timed_runs", counting)
  graph, _ = models.build("nasrnn", "tiny", capacity=256)
  prof = P.Profiler(tmp_path, repeats=10, min_time_s=0.0, warmup=1)
  first = prof.profile_graph(graph)
  n_sigs = len(first.rows)
  assert n_sigs > 3 and first.measured == n_sigs
  assert prof.measure_count == n_sigs + 1  # and the empty call
  # One batch: every signature and the batch's empty call, timed in P.ROUNDS rounds.
  assert len(calls) >= (n_sigs + 1) * P.ROUNDS
  assert all(r.median_ms > 0 for r in first.rows)
  for r in first.rows:
    entry = prof.cache.get(r.signature.key)
    assert entry["timing"] == P.TIMING and len(entry["round_ms"]) == P.ROUNDS
    assert entry["median_ms"] == pytest.approx(np.median(entry["round_ms"]), abs=1e-5)
    assert entry["runs"] >= P.ROUNDS * 2 and 0 < entry["call_ms"] <= entry["median_ms"] * 10
  calls.clear()
  again = P.Profiler(tmp_path, repeats=10, min_time_s=0.0)
  second = again.profile_graph(graph)
  assert again.measure_count == 0 and second.measured == 0 and not calls
  assert [r.median_ms for r in second.rows] == [r.median_ms for r in first.rows]
  # One file per device kind and JAX version; keys round-trip to signatures.
  assert prof.cache.path.name == f"{CF.slug(prof.device.device_kind)}-jax{jax.__version__}.json"
  for r in first.rows:
    assert S.signature_from_key(r.signature.key) == r.signature
  monkeypatch.setenv(P.CACHE_ENV, str(tmp_path / "env"))
  assert P.Profiler().cache.dir == tmp_path / "env"


def test_profiler_outvotes_a_disturbed_round(tmp_path, monkeypatch):
  """A kernel's time is the median of its per-round medians: two rounds slowed by another
  process do not move it, and the empty call timed in the same rounds is recorded beside it."""
  sigs = [s for s, _ in S.graph_signatures(models.build("nasrnn", "tiny", capacity=256)[0])]
  base = {0: 0.01, 1: 0.5, 2: 0.2}  # the empty call, then two signatures

  def fake_rounds(compiled, *, rounds, repeats_per_round, warmup, seed, min_round_time_s):
    assert len(compiled) == 3 and rounds == P.ROUNDS
    out = []
    for g in range(3):
      # Two rounds slowed 4-5x (their mean would be 2.5x; the median round is 1.2x).
      slow = [1.1, 5.0, 1.0, 4.0, 1.2]
      out.append([np.full(repeats_per_round, base[g] * k) for k in slow])
    return out

  monkeypatch.setattr(latency, "time_interleaved", fake_rounds)
  prof = P.Profiler(tmp_path, repeats=10)
  entries = prof.profile_signatures(sigs[:2])
  for g, sig in enumerate(sigs[:2], start=1):
    e = entries[sig.key]
    assert e["median_ms"] == pytest.approx(1.2 * base[g])
    assert e["call_ms"] == pytest.approx(1.2 * base[0])
    assert max(e["round_ms"]) == pytest.approx(5 * base[g]) and e["timing"] == P.TIMING


def test_hot_loop_kernel_takes_its_least_disturbed_round(tmp_path, monkeypatch):
  """A hot-loop kernel's time is its least round median per iteration, less the least empty
  call: three disturbed rounds of five (the median's blind spot, which kept 1x512 @ 512x4096
  at 1.7x its time in the table) do not move it. An entry timed under the median is measured
  again."""
  sig = S.OpSignature("MatMul", (0,) * 16, ((1, 64), (64, 64)), ("float32", "float32"))
  base = {0: 0.01, 1: 0.6}  # the empty call, then the loop call
  slow = [1.0, 1.7, 1.65, 1.01, 1.8]

  def fake_rounds(compiled, *, rounds, repeats_per_round, warmup, seed, min_round_time_s):
    assert len(compiled) == 3 and rounds == P.ROUNDS  # the empty call, the canary, the loop
    return [[np.full(repeats_per_round, base[g] * k) for k in slow] for g in (0, 1, 1)]

  prof = P.Profiler(tmp_path, repeats=10)
  prof.cache.put(P.LOOP_PREFIX + sig.key, {"median_ms": 9.0, "timing": P.TIMING})
  assert prof.current_kernel(sig) is None  # the median's entry is measured again
  monkeypatch.setattr(latency, "time_interleaved", fake_rounds)
  entry = prof.profile_kernels([sig])[0][sig.key]
  k = entry["iterations"]
  assert entry["median_ms"] == pytest.approx((base[1] - base[0]) / k)
  assert entry["loop_call_ms"] == pytest.approx(base[0]) and entry["call_ms"] == 0.0
  assert entry["timing"] == P.LOOP_TIMING and prof.current_kernel(sig) == entry
  assert max(entry["round_ms"]) == pytest.approx(1.8 * base[1])


def test_a_batch_timed_under_load_is_timed_again_and_flagged(tmp_path, monkeypatch):
  """Load slows every round of a multi-threaded kernel alike, so the least round cannot see it;
  the canary timed in each batch can. A batch whose canary runs 30% over its best is timed
  again (each kernel keeps its least round of all takes); one loaded in every take (1 +
  RETAKES) keeps its load in the entry, which is then measured again when next needed."""
  sig = S.OpSignature("MatMul", (0,) * 16, ((1, 64), (64, 64)), ("float32", "float32"))
  prof = P.Profiler(tmp_path, repeats=10)
  _, k_canary = prof._canary()  # pylint: disable=protected-access
  call, canary_call, loop_call = 0.01, 2.0, 0.6
  prof.cache.put(P.CANARY_KEY, {"best_ms": (canary_call - call) / k_canary})
  takes = []

  def fake_rounds(compiled, *, rounds, repeats_per_round, warmup, seed, min_round_time_s):
    slow = 1.3 if len(takes) < loaded_takes else 1.0  # the machine is busy, then quiet
    takes.append(seed)
    return [[np.full(repeats_per_round, ms * (1.0 if g == 0 else slow))] * rounds
            for g, ms in enumerate((call, canary_call, loop_call))]

  monkeypatch.setattr(latency, "time_interleaved", fake_rounds)
  loaded_takes = 1
  entry = prof.measure_kernels([sig])[0][sig.key]
  assert len(takes) == 2 and len(set(takes)) == 2  # a second take, with other round orders
  assert entry["median_ms"] == pytest.approx((loop_call - call) / entry["iterations"])
  assert entry["load"] == pytest.approx(1.0) and len(entry["round_ms"]) == 2 * P.ROUNDS
  prof.cache.put(P.LOOP_PREFIX + sig.key, entry)
  assert prof.current_kernel(sig) == entry

  takes.clear()
  loaded_takes = 1 + P.RETAKES
  entry = prof.measure_kernels([sig])[0][sig.key]
  assert len(takes) == 1 + P.RETAKES and entry["load"] == pytest.approx(
      (1.3 * canary_call - call) / (canary_call - call), rel=1e-3)
  assert entry["median_ms"] == pytest.approx((1.3 * loop_call - call) / entry["iterations"])
  prof.cache.put(P.LOOP_PREFIX + sig.key, entry)
  assert prof.current_kernel(sig) is None  # measured again next time
  # The canary's best is its least time ever, not the loaded one.
  assert prof.cache.get(P.CANARY_KEY)["best_ms"] == pytest.approx(
      (canary_call - call) / k_canary)


def test_profiler_measures_again_what_was_timed_another_way(tmp_path):
  """A cache entry without the current `TIMING` tag (timed alone, in one window, by an older
  profiler) is measured again, and `KernelTimes` says it needs timing."""
  graph, _ = models.build("nasrnn", "tiny", capacity=256)
  prof = P.Profiler(tmp_path, repeats=4, min_time_s=0.0, warmup=1)
  sig = next(s for s, _ in S.graph_signatures(graph) if s.op == "MatMul")
  stale = {"median_ms": 123.0, "q1_ms": 100.0, "q3_ms": 150.0, "runs": 30, "compile_s": 0.1,
           "op": sig.op, "describe": sig.describe()}
  prof.cache.put(sig.key, stale)
  prof.cache.save()
  assert P.Profiler(tmp_path).current(sig) is None
  table = kernel_table.KernelTimes(P.Profiler(tmp_path, repeats=4, min_time_s=0.0, warmup=1))
  assert table.needs_timing(graph)
  fresh = prof.profile_signatures([sig])[sig.key]
  assert prof.measure_count == 1 and fresh["timing"] == P.TIMING and fresh["median_ms"] < 100
  assert P.Profiler(tmp_path).current(sig)["median_ms"] == fresh["median_ms"]


def test_kernels_are_timed_in_a_loop_that_runs_them_every_iteration(tmp_path):
  """The kernel table's times come from a loop of the op in one executable: cached under
  `LOOP_PREFIX`, per iteration, and not hoisted or dropped by XLA (a hoisted op would cost ~0
  per iteration; the bound is loose, the machine is shared)."""
  sig = S.OpSignature("MatMul", (0,) * 16, ((128, 512), (512, 512)), ("float32", "float32"))
  prof = P.Profiler(tmp_path, repeats=10, min_time_s=0.02, warmup=1)
  entries, errors = prof.profile_kernels([sig])
  assert not errors
  loop = entries[sig.key]
  assert prof.cache.get(P.LOOP_PREFIX + sig.key) == loop and prof.current_kernel(sig) == loop
  assert loop["iterations"] >= 2 and loop["call_ms"] == 0.0 and loop["timing"] == P.LOOP_TIMING
  alone = prof.profile_signatures([sig])[sig.key]
  assert prof.cache.get(sig.key) == alone and "iterations" not in alone
  assert loop["median_ms"] > 0.25 * (alone["median_ms"] - alone["call_ms"]) > 0
  table = kernel_table.KernelTimes(P.Profiler(tmp_path))
  before = table.profiler.measure_count  # the empty call's, if not cached yet
  graph = sig.single_op_graph()[0]
  assert not table.needs_timing(graph) and table.add(graph) == 1
  assert table.profiler.measure_count == before
  assert list(table.ms.values()) == [pytest.approx(loop["median_ms"])]
  # Convolutions are timed a call at a time (XLA:CPU runs them another way inside a loop).
  conv = S.OpSignature("Conv2D", (1, 1, 0, 0, 0, 0, 1, 1, 1) + (0,) * 7,
                       ((1, 8, 8, 8), (8, 8, 1, 1)), ("float32", "float32"))
  entries, errors = prof.profile_kernels([conv])
  assert not errors and "iterations" not in entries[conv.key]
  assert prof.cache.get(P.LOOP_PREFIX + conv.key) is None
  assert prof.current_kernel(conv) == prof.current(conv) == entries[conv.key]


def test_bad_input_gives_project_errors(tmp_path):
  graph, params, idx = _mlp()
  arrays = G.to_arrays(graph)
  arrays["shape"][idx["h"], -1] += 1  # a stored shape the shape rule disagrees with
  broken = layout.from_arrays(arrays)
  with pytest.raises(errors.GraphValidationError, match="shape"):
    P.Profiler(tmp_path).profile_graph(broken)
  with pytest.raises(errors.GraphValidationError):
    latency.measure_latency(broken, params)
  with pytest.raises(latency.BackendError, match="not available"):
    P.Profiler(tmp_path, backend="no_such_backend")
  with pytest.raises(latency.BackendError):
    latency.measure_latency(graph, params, backend="no_such_backend")
  with pytest.raises(errors.XrlflowError, match="repeats"):
    latency.time_callable(lambda: None, (), repeats=0)
  times = latency.time_callable(jax.jit(lambda a: a + 1), (jnp.ones(4),), repeats=5)
  assert times.shape == (5,) and (times > 0).all()
  stats = latency.measure_latency(graph, params, repeats=3)
  assert stats.median_ms > 0 and stats.compile_s > 0 and stats.runs == 3
  oom = latency._memory_error(RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating"),
                              "bert", jax.devices()[0], 10**9)
  assert isinstance(oom, latency.DeviceMemoryError) and "1000.0 MB" in str(oom)
  assert latency._is_out_of_memory(RuntimeError("RESOURCE_EXHAUSTED: x"))


def test_measure_interleaved_orders_by_work():
  small, params_s, _ = _mlp(hidden=16)
  b = G.GraphBuilder(seed=0)
  x = b.input((256, 256))
  b.output(b.matmul(b.matmul(x, b.weight((256, 256))), b.weight((256, 256))))
  big, params_b = b.build(CAP)
  compiled = [latency.compile_graph(small, params_s), latency.compile_graph(big, params_b)]
  res = latency.measure_interleaved(compiled, rounds=3, repeats_per_round=5)
  assert [r.runs for r in res] == [15, 15]
  assert res[0].median_ms < res[1].median_ms


def test_cli_profile(tmp_path, capsys):
  assert cli.main(["profile", "--model=nasrnn", "--size=tiny", f"--cache_dir={tmp_path}",
                   "--repeats=2", "--min_time_s=0"]) == 0
  out = capsys.readouterr().out
  assert "MatMul" in out and "signatures" in out and "model ms" in out
  assert " 0 measured now" not in out
  assert cli.main(["profile", "--model=nasrnn", "--size=tiny", f"--cache_dir={tmp_path}"]) == 0
  assert " 0 measured now" in capsys.readouterr().out
  assert cli.main(["profile", "--model=no_such_model", f"--cache_dir={tmp_path}"]) == 2
  assert "unknown model" in capsys.readouterr().err


def test_measure_side_by_side_ratios():
  # Variants share the reference's weights; a copy of the reference measures near 1. The bound
  # is a sanity check (a units or inverted-ratio bug), not a timing claim: on a loaded 2-core CI
  # machine a 16-wide MLP's copy measured 2.2x once (the A/A benchmark measures the spread).
  small, params, _ = _mlp(hidden=16)
  res = measure.measure_side_by_side(small, [small], params, rounds=5, min_round_ms=2.0)
  assert res.ratio.shape == (1,) and 0.2 < res.ratio[0] < 5.0 and res.reference_ms > 0
  assert res.latency_ms[0] == pytest.approx(res.ratio[0] * res.reference_ms)


@pytest.mark.slow
def test_apply_everywhere_and_walks():
  from xrlflow_jax import executor  # pylint: disable=g-import-not-at-top
  from xrlflow_jax.harness import rewrite_gains as gains  # pylint: disable=g-import-not-at-top
  from xrlflow_jax.rules import walk  # pylint: disable=g-import-not-at-top
  from xrlflow_jax.rules.library import merge  # pylint: disable=g-import-not-at-top
  walker = walk.RewriteWalker(
      [merge.merge_matmul_shared_input(3), merge.merge_matmul_shared_input(2),
       merge.split_matmul_shared_input()], max_locations=4)
  graph = _qkv(False, 16, 64)
  merged, count = gains.apply_everywhere(walker, graph, 0)
  assert count == 1 and G.op_histogram(merged)["MatMul"] == 1
  # The pair rule fires once too (the third matmul is left alone: one pass, no chaining).
  pair, count2 = gains.apply_everywhere(walker, graph, 1)
  assert count2 == 1 and G.op_histogram(pair)["MatMul"] == 2
  params = _qkv_params(16, 64)
  ref = executor.run(graph, params, np.ones((16, 64), np.float32))
  for g in (merged, pair):
    for a, b in zip(ref, executor.run(g, params, np.ones((16, 64), np.float32))):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  g3, trail = walker.walk(graph, 3, np.random.default_rng(0))
  assert 1 <= len(trail) <= 3 and G.structural_hash(g3) != G.structural_hash(graph)


@pytest.fixture(scope="module")
def qkv_walker():
  """Three merge rules at capacity 32: the rewrite engine compiles in seconds."""
  from xrlflow_jax.rules import walk  # pylint: disable=g-import-not-at-top
  from xrlflow_jax.rules.library import merge  # pylint: disable=g-import-not-at-top
  return walk.RewriteWalker(
      [merge.merge_matmul_shared_input(3), merge.merge_matmul_shared_input(2),
       merge.split_matmul_shared_input()], max_locations=4)


def test_validate_model_two_passes_end_to_end(qkv_walker, tmp_path):
  from xrlflow_jax.cost import kernel_table  # pylint: disable=g-import-not-at-top
  graph = _qkv(False, 16, 64)
  kernels = kernel_table.KernelTimes(P.Profiler(cache_dir=tmp_path, repeats=5,
                                                min_time_s=0.01))
  res = V.validate_model(graph, _qkv_params(16, 64), CF.load_coefficients("cpu"), name="qkv",
                         walker=qkv_walker, variants=3, neighbours=2, max_steps=2, rounds=2,
                         min_round_ms=2.0, passes=2, kernels=kernels, log=None)
  # The kernel-table ranking is of the same measurements: every variant's MatMuls measured.
  assert res.with_kernels is not None and -1.0 <= res.with_kernels.spearman_all <= 1.0
  assert len(kernels) >= 2 and kernels.measured == len(kernels)
  counts = res.to_json()["with_kernels"]
  assert all(type(counts[k]) is int for k in ("sign_pairs", "sign_correct", "tie_pairs",
                                               "tie_quiet"))
  kinds = [i.kind for i in res.items]
  assert kinds[0] == "control" and "neighbour" in kinds
  assert all(i.ratio > 0 and i.cost_ms > 0 for i in res.items)
  # Each variant's kernel-table cost is recorded: the control (an identical copy) costs exactly
  # what the original does, and the costs are the table's, not the roofline's.
  assert all(np.isfinite(i.kernel_cost_ms) and i.kernel_cost_ms > 0 for i in res.items)
  assert res.items[0].kernel_cost_ms == pytest.approx(res.original_kernel_cost_ms, rel=1e-6)
  assert any(abs(i.kernel_cost_ms / i.cost_ms - 1) > 1e-3 for i in res.items)  # not the roofline
  assert np.isfinite(res.retest_dev) and -1.0 <= res.retest_spearman <= 1.0
  assert res.noise_threshold >= 0.02
  text = V.markdown([res], "test machine")
  assert "| qkv |" in text and "ceiling" in text
  assert json.loads(json.dumps(res.to_json(), default=str))["model"] == "qkv"


def test_rewrite_gains_passes(qkv_walker):
  from xrlflow_jax.harness import rewrite_gains as gains  # pylint: disable=g-import-not-at-top
  graph = _qkv(False, 16, 64)
  rows = gains.rewrite_gains(graph, _qkv_params(16, 64), model="qkv", walker=qkv_walker,
                             coeffs=CF.load_coefficients("cpu"), rounds=2, min_round_ms=2.0,
                             passes=2, log=None)
  # Both merge rules fire on the three projections; the split rule has nothing to split.
  assert sorted(r.rule for r in rows) == ["merge_matmul_shared_input_2",
                                          "merge_matmul_shared_input_3"]
  for r in rows:
    assert len(r.pass_ratios) == 2 and r.pass_spread >= 1.0
    assert r.ratio == pytest.approx(np.sqrt(r.pass_ratios[0] * r.pass_ratios[1]))
    assert r.after_ms == pytest.approx(r.ratio * r.before_ms)
    assert 0 < r.cost_ratio < 2
  table = gains.markdown(rows, "test machine")
  assert "passes (min-max)" in table and "(2) |" in table


def test_first_of_each_class_marks_the_lowest_slot_of_each_key():
  """Classes of equal keys (many ties, NO_CLASS slots, one class, all distinct), batched: the
  lowest slot of each class and nothing else, as a stable sort would find them."""
  rng = np.random.default_rng(0)
  no_class = np.uint32(M.NO_CLASS)
  for n, distinct in ((1, 1), (16, 3), (300, 40), (1024, 2000)):
    keys = rng.integers(0, distinct, size=(3, n)).astype(np.uint32)
    keys[1, ::3] = no_class
    keys[2] = 7
    got = np.asarray(jax.jit(jax.vmap(M.first_of_each_class))(jnp.asarray(keys)))
    for row, marks in zip(keys, got):
      want = np.zeros(n, bool)
      for k in set(row.tolist()) - {int(no_class)}:
        want[np.flatnonzero(row == k)[0]] = True
      np.testing.assert_array_equal(marks, want)


def test_const_mb_counts_each_distinct_folded_weight_once():
  # Three unrolled steps share w1, w2 (4x4 f32 = 64 bytes each); after a merge every step
  # concatenates them again (one distinct 4x8 value); a different pairing is another value.
  def rnn(merged: bool, extra: bool = False):
    b = G.GraphBuilder(seed=0)
    h = b.input((1, 4))
    w1, w2, w3 = b.weight((4, 4)), b.weight((4, 4)), b.weight((4, 4))
    for _ in range(3):
      if merged:
        both = b.matmul(h, b.concat([w1, w2], axis=1))
        a, c = b.slice(both, 1, 0, 4), b.slice(both, 1, 4, 8)
      else:
        a, c = b.matmul(h, w1), b.matmul(h, w2)
      h = b.tanh(b.add(a, c))
    if extra:
      h = b.matmul(h, b.concat([w1, w3], axis=1))
    b.output(h)
    return b.build(CAP)[0]

  def const_mb(graph):
    return float(_feature(graph, "const.mb").sum())

  assert const_mb(rnn(False)) == pytest.approx(2 * 64 / 1e6)
  assert const_mb(rnn(True)) == pytest.approx(128 / 1e6)  # the concat once; w1, w2 unread
  assert const_mb(rnn(True, extra=True)) == pytest.approx(256 / 1e6)
  # Jittable, per node: the bytes sit on one representative slot per distinct value.
  per_node = _feature(rnn(True), "const.mb")
  assert (per_node > 0).sum() == 1


def test_calibrate_feature_recovers_one_weight_and_keeps_the_rest():
  rng = np.random.default_rng(0)
  truth = _coeffs(weights=np.full([M.NUM_FEATURES], 0.02, np.float32))
  j = list(M.FEATURE_NAMES).index("const.mb")
  w = np.asarray(truth.weights, np.float64).copy()
  w[j] = 0.3
  base = rng.uniform(0.0, 2.0, [12, M.NUM_FEATURES])
  variant = base + rng.uniform(-0.5, 0.5, [12, M.NUM_FEATURES])
  cost = lambda f: float(truth.call_ms) + f @ w
  ratio = np.array([cost(v) / cost(b) for b, v in zip(base, variant)])
  pairs = fit_lib.Pairs(base, variant, ratio, np.array([cost(b) for b in base]))
  start = _coeffs(weights=np.where(np.arange(M.NUM_FEATURES) == j, 0.0, 0.02))
  fitted, info = fit_lib.calibrate_feature(start, "const.mb", pairs)
  got = np.asarray(fitted.weights)
  assert got[j] == pytest.approx(0.3, rel=1e-4) and info["rms_after"] < 1e-6 < info["rms_before"]
  np.testing.assert_allclose(np.delete(got, j), 0.02, rtol=1e-6)
  with pytest.raises(M.CostModelError, match="unknown feature"):
    fit_lib.calibrate_feature(start, "no.such", pairs)


def test_calibration_on_first_use(tmp_path, monkeypatch):
  """A device kind the package ships no fit for is calibrated once (here on a one-model suite),
  cached per device kind, and loaded by later calls without calibrating again."""
  monkeypatch.setattr(CF, "coefficients_path",
                      lambda kind: tmp_path / "shipped" / f"cost_{CF.slug(kind)}.json")
  monkeypatch.setenv(CF.CALIBRATION_ENV, str(tmp_path / "calibrated"))
  monkeypatch.setenv(P.CACHE_ENV, str(tmp_path / "profiles"))
  monkeypatch.delenv(CF.COEFFS_ENV, raising=False)
  with pytest.raises(M.CostModelError, match="xrlflow_jax.cost calibrate"):
    CF.load_coefficients()
  with pytest.raises(M.CostModelError, match="no cost-model coefficients"):
    calibrate.coefficients(calibrate_missing=False)
  monkeypatch.setattr(calibrate, "FULL_SUITE", (("squeezenet1_1", "tiny"),))
  logs: list[str] = []
  coeffs = calibrate.coefficients(log=logs.append)
  assert logs[0].startswith("no cost-model coefficients for device kind 'cpu'"), logs
  assert any(m.startswith("calibrated cpu in ") for m in logs), logs
  path = tmp_path / "calibrated" / "cost_cpu.json"
  fit = json.loads(path.read_text())["fit"]
  assert fit["calibration"] == "full" and fit["suite"] == ["squeezenet1_1[tiny]"]
  assert fit["seconds"] > 0 and fit["rows"] > 5
  assert np.isfinite(np.asarray(coeffs.weights)).all() and float(coeffs.call_ms) >= 0
  graph, _ = models.build("squeezenet1_1", "tiny")
  assert float(M.graph_cost(graph, coeffs)) > 0
  monkeypatch.setattr(calibrate, "calibrate", lambda **_: pytest.fail("calibrated twice"))
  again = calibrate.coefficients(log=logs.append)
  np.testing.assert_array_equal(np.asarray(again.weights), np.asarray(coeffs.weights))
  assert CF.load_coefficients().device_kind == "cpu"


_HLO = """HloModule jit_apply, entry_computation_layout={(f32[4,8]{1,0})->f32[4]{0}}

%fused_computation (param_0: f32[4,8], param_1: f32[8,8]) -> f32[4,8] {
  %param_0 = f32[4,8]{1,0} parameter(0)
  %param_1 = f32[8,8]{1,0} parameter(1)
  ROOT %dot.1 = f32[4,8]{1,0} dot(f32[4,8]{1,0} %param_0, f32[8,8]{1,0} %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%region_0.2 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.3 = f32[] add(f32[] %a, f32[] %b)
}

%fused_computation.1 (param_0.1: f32[4,8]) -> f32[8,4] {
  %param_0.1 = f32[4,8]{1,0} parameter(0)
  ROOT %transpose.2 = f32[8,4]{1,0} transpose(f32[4,8]{1,0} %param_0.1), dimensions={1,0}
}

ENTRY %main.9 (x: f32[4,8], w: f32[8,8]) -> (f32[4], f32[8,4]) {
  %x = f32[4,8]{1,0} parameter(0)
  %w = f32[8,8]{1,0} parameter(1)
  %ynn_fusion = f32[4,8]{1,0} fusion(f32[4,8]{1,0} %x, f32[8,8]{1,0} %w), kind=kCustom, calls=%fused_computation
  %tanh.1 = f32[4,8]{1,0} tanh(f32[4,8]{1,0} %ynn_fusion)
  %reduce.5 = f32[4]{0} reduce(f32[4,8]{1,0} %tanh.1, f32[] %x), dimensions={1}, to_apply=%region_0.2
  %transpose_copy_fusion = f32[8,4]{1,0} fusion(f32[4,8]{1,0} %x), kind=kLoop, calls=%fused_computation.1
  ROOT %tuple = (f32[4]{0}, f32[8,4]{1,0}) tuple(f32[4]{0} %reduce.5, f32[8,4]{1,0} %transpose_copy_fusion)
}
"""


def test_fusion_profile_reads_each_kernels_ops_from_the_hlo():
  """A fusion is classified by the ops of the computation it calls; a reduction's combiner
  (`to_apply`) is not followed, so its `add` does not make it elementwise."""
  inst, comps = fusion_profile.hlo_instructions(_HLO), fusion_profile.hlo_computations(_HLO)
  assert inst["ynn_fusion"] == ("fusion", ("fused_computation",))
  assert comps["fused_computation.1"] == ["param_0.1", "transpose.2"]
  kinds = {name: fusion_profile.classify(fusion_profile.kernel_ops(name, inst, comps))
           for name in ("ynn_fusion", "tanh.1", "reduce.5", "transpose_copy_fusion")}
  assert kinds == {"ynn_fusion": "dot", "tanh.1": "elementwise", "reduce.5": "reduction",
                   "transpose_copy_fusion": "data"}
  assert fusion_profile.kernel_ops("reduce.5", inst, comps) == ("reduce",)


def test_fusion_profile_of_a_real_graph_and_its_cli(capsys):
  """The whole compiled graph traced on this backend: a MatMul-heavy graph's time is mostly in
  dot kernels, the kinds add up to the kernels' total, and the CLI prints the table."""
  b = G.GraphBuilder(seed=0)
  x = b.input((128, 512))
  for _ in range(3):
    x = b.node("Relu", [b.matmul(x, b.weight((512, 512)))])
  b.output(x)
  graph, params = b.build(capacity=16)
  prof = fusion_profile.profile(graph, params, runs=5)
  kinds = prof.by_kind()
  assert set(kinds) == set(fusion_profile.KINDS)
  assert kinds["dot"][0] == 3 and kinds["convolution"] == (0, 0.0)
  assert sum(ms for _, ms in kinds.values()) == pytest.approx(prof.kernel_ms)
  assert prof.share("dot") > 0.5 and prof.wall_ms > 0
  assert all(k.ms > 0 and k.calls >= 1 for k in prof.kernels)
  assert "outside dots and convolutions" in prof.table()
  assert cli.main(["kernels", "--model=nasrnn", "--size=tiny", "--runs=2", "--limit=3"]) == 0
  out = capsys.readouterr().out
  assert "# nasrnn[tiny]: XLA kernels" in out and "dot" in out
