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
  # Comparisons and logic; comparisons produce bool.
  EQUAL = 44
  LESS = 45
  GREATER = 46
  LESS_OR_EQUAL = 47
  GREATER_OR_EQUAL = 48
  NOT = 49
  AND = 50
  OR = 51
  XOR = 52
  # Reductions.
  REDUCE_MAX = 53
  REDUCE_MIN = 54
  REDUCE_PROD = 55
  REDUCE_L1 = 56
  REDUCE_L2 = 57
  REDUCE_LOG_SUM_EXP = 58
  ARG_MAX = 59
  ARG_MIN = 60
  LOG_SOFTMAX = 61
  # Elementwise maths.
  SIGN = 62
  ABS = 63
  FLOOR = 64
  CEIL = 65
  ROUND = 66
  MOD = 67
  IS_NAN = 68
  IS_INF = 69
  # Activations.
  PRELU = 70
  LEAKY_RELU = 71
  ELU = 72
  SELU = 73
  CELU = 74
  SOFTPLUS = 75
  SOFTSIGN = 76
  MISH = 77
  SHRINK = 78
  THRESHOLDED_RELU = 79
  # Data movement with shapes known at import.
  EXPAND = 80
  TILE = 81
  # Further ops of ONNX import: GatherElements, CumSum, Trilu, TopK and ConvTranspose.
  GATHER_ELEMENTS = 82
  CUMSUM = 83
  TRILU = 84
  TOP_K_VALUES = 85
  TOP_K_INDICES = 86
  CONV_TRANSPOSE = 87


SOURCE_OPS = (Op.INPUT, Op.CONSTANT)
