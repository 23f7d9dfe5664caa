"""The project's own exception types.

Every error a user can provoke with bad input (a model that does not fit, an unknown op,
inconsistent shapes, a cycle, a dangling input, a missing weight) is one of these, with a
message that names the node, op and shape involved.
"""

from __future__ import annotations


class XrlflowError(Exception):
  """Base class of every error raised on purpose by xrlflow_jax."""


class UsageError(XrlflowError):
  """Bad input from the user (a name, path, shape, flag or setting), refused before any work;
  the binaries print its message as one `error: ...` line."""


class CapacityError(XrlflowError):
  """A graph does not fit the padded capacity (node slots or input slots per node)."""


class UnknownOpError(XrlflowError):
  """An op name or op code that the project does not know."""


class ShapeError(XrlflowError):
  """Input shapes or attributes that an op's shape rule rejects."""


class GraphValidationError(XrlflowError):
  """`validate` found an inconsistency; the message lists every problem found."""


class CycleError(GraphValidationError):
  """The graph has a cycle, so it has no topological order."""


class DanglingInputError(GraphValidationError):
  """A node reads an input slot that is not alive (or out of range)."""


class ParamError(XrlflowError):
  """A constant node has no value in the parameter store, or a value of the wrong shape."""


class ModelError(XrlflowError):
  """An unknown zoo model or size."""


class OnnxImportError(XrlflowError):
  """An ONNX model that cannot be imported: corrupt file, bad opset, missing data, bad shapes.

  The message names the file and, where one is at fault, the node and its op.
  """


class MissingWeightsError(OnnxImportError):
  """Initializers keep their data in external files that are absent (a graph-only file), and
  seeded random weights were not asked for; `files` names every missing file, `count` the
  initializers."""

  def __init__(self, message: str, files: tuple[str, ...] = (), count: int = 0):
    super().__init__(message)
    self.files = tuple(files)
    self.count = int(count)


class UnsupportedOnnxOpError(OnnxImportError):
  """The model uses ops the importer cannot express; `ops` lists every one of them at once."""

  def __init__(self, message: str, ops: tuple[str, ...] = ()):
    super().__init__(message)
    self.ops = tuple(ops)


class OnnxExportError(XrlflowError):
  """A graph that cannot be written as ONNX (an op with no ONNX form, a missing weight)."""
