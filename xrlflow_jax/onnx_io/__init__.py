"""ONNX in and out.

  load(path_or_model, *, input_shapes=None, random_weights=False, seed=0, capacity=None)
      -> (graph, params)          import (static shapes, shape sub-graphs folded, decomposed)
  save(graph, params, path)       export to standard ONNX (weights included)
  round_trip(graph, params)       export and import back: does the file run what the graph runs
  python -m xrlflow_jax.onnx_io info model.onnx [--input-shape name=1,3,224,224]

See `importer`, `exporter`, `weights` (random weights for graph-only files) and `backend` (the
executor as an `onnx.backend.base.Backend`).
"""

from xrlflow_jax.errors import (MissingWeightsError, OnnxExportError, OnnxImportError,
                                UnsupportedOnnxOpError)
from xrlflow_jax.onnx_io.exporter import save, to_model
from xrlflow_jax.onnx_io.importer import (ImportedParams, ImportStats, ShapeOverrideWarning, load,
                                         read_model)
from xrlflow_jax.onnx_io.roundtrip import RoundTrip, round_trip, stands_for
from xrlflow_jax.onnx_io.weights import (fill_missing_weights, random_initializers,
                                         randomize_constant_weights)

__all__ = [
    "ImportStats", "ImportedParams", "MissingWeightsError", "OnnxExportError", "OnnxImportError",
    "UnsupportedOnnxOpError", "fill_missing_weights", "load", "random_initializers",
    "randomize_constant_weights", "read_model", "RoundTrip", "round_trip", "save", "stands_for", "ShapeOverrideWarning", "to_model",
]
