"""Graphs several test files build."""

from __future__ import annotations

from xrlflow_jax import GraphBuilder


def toy_graph(capacity: int = 32):
  """out = concat(x @ w1, x @ w2) + z (x [8, 16], w1 and w2 [16, 16] weights): (graph, params).

  The search and learner tests' problem: merging the two MatMuls first, then cancelling the
  slices the merge leaves in the concat, is the optimum a greedy search does not reach."""
  b = GraphBuilder()
  x = b.input([8, 16])
  w1, w2 = b.weight([16, 16]), b.weight([16, 16])
  y = b.concat([b.matmul(x, w1), b.matmul(x, w2)], axis=1)
  b.output(b.add(y, b.input([8, 32])))
  return b.build(capacity=capacity)
