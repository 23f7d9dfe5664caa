"""Op codes, as stored in a graph's `op` feature."""

from __future__ import annotations

import enum


class Op(enum.IntEnum):
  """Every operator of the project. The values are stable: they are stored in graphs."""
  INPUT = 0
  CONSTANT = 1
  CONV2D = 2
  MATMUL = 3
  ADD = 4
  SUB = 5
  MUL = 6
  DIV = 7
  POW = 8
  MAX = 9
  MIN = 10
  RELU = 11
  SIGMOID = 12
  TANH = 13
  GELU = 14
  ERF = 15
  EXP = 16
  LOG = 17
  SQRT = 18
  NEG = 19
  RECIPROCAL = 20
  CLIP = 21
  HARD_SIGMOID = 22
  HARD_SWISH = 23
  SOFTMAX = 24
  LAYER_NORM = 25
  BATCH_NORM = 26
  MAX_POOL = 27
  AVG_POOL = 28
  GLOBAL_AVG_POOL = 29
  REDUCE_MEAN = 30
  REDUCE_SUM = 31
  CONCAT = 32
  SLICE = 33
  RESHAPE = 34
  TRANSPOSE = 35
  SQUEEZE = 36
  UNSQUEEZE = 37
  GATHER = 38
  PAD = 39
  CAST = 40
  WHERE = 41
  ENLARGE = 42
  MERGE_GCONV = 43


SOURCE_OPS = (Op.INPUT, Op.CONSTANT)
