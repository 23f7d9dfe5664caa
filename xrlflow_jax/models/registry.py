"""The zoo's registry: model name -> family, description, and one config per size.

A model is a function `fn(builder, config)` that adds the model's nodes and outputs to an empty
`GraphBuilder`; its configs are frozen dataclasses, one per size ("default" is the benchmark
model, "tiny" the same structure with small dims for tests).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from xrlflow_jax.errors import ModelError
from xrlflow_jax.graph import DEFAULT_CAPACITY, Graph, GraphBuilder, ParamStore

SIZES = ("default", "tiny")
FAMILIES = ("cnn", "transformer", "nas")

# Rewrites add nodes before dead ones are freed; a graph gets at least this factor of free room.
HEADROOM = 1.25
CAPACITY_QUANTUM = 256


@dataclasses.dataclass(frozen=True)
class ModelInfo:
  """What the zoo knows about a model.

  Attributes:
    name: registry name, e.g. "resnet50".
    family: "cnn", "transformer" or "nas".
    summary: one line: architecture, input and what it is a benchmark of.
    fn: `fn(builder, config)` adds the model to an empty builder.
    configs: size -> frozen config dataclass.
  """
  name: str
  family: str
  summary: str
  fn: Callable[[GraphBuilder, Any], None] = dataclasses.field(repr=False)
  configs: dict[str, Any] = dataclasses.field(repr=False)

  def config(self, size: str) -> Any:
    """The config of `size`; ModelError lists the known sizes."""
    if size not in self.configs:
      raise ModelError(f"model {self.name!r} has no size {size!r}; known sizes: "
                       f"{', '.join(self.configs)}")
    return self.configs[size]


_REGISTRY: dict[str, ModelInfo] = {}


def register(name: str, family: str, summary: str, fn: Callable[[GraphBuilder, Any], None],
             configs: dict[str, Any]) -> ModelInfo:
  """Adds a model to the zoo (at import of its family module)."""
  if name in _REGISTRY:
    raise ModelError(f"model {name!r} is registered twice")
  if family not in FAMILIES:
    raise ModelError(f"model {name!r}: unknown family {family!r}; use one of {FAMILIES}")
  missing = [s for s in SIZES if s not in configs]
  if missing:
    raise ModelError(f"model {name!r} lacks sizes {missing}")
  info = ModelInfo(name, family, summary, fn, dict(configs))
  _REGISTRY[name] = info
  return info


def list_models() -> list[str]:
  """Names of every zoo model: CNNs, then transformers, then NAS models (each in registration
  order)."""
  order = {family: i for i, family in enumerate(FAMILIES)}
  infos = sorted(_REGISTRY.values(), key=lambda m: order[m.family])  # stable
  return [m.name for m in infos]


def model_info(name: str) -> ModelInfo:
  """The registry entry of `name`; ModelError lists the known models."""
  if name not in _REGISTRY:
    raise ModelError(f"unknown model {name!r}; known models: {', '.join(list_models())}")
  return _REGISTRY[name]


def default_capacity(num_nodes: int) -> int:
  """Node slots for a graph of `num_nodes` nodes with room for rewrites.

  DEFAULT_CAPACITY when HEADROOM x num_nodes fits in it, else HEADROOM x num_nodes rounded up to
  a multiple of CAPACITY_QUANTUM.
  """
  need = math.ceil(HEADROOM * num_nodes)
  if need <= DEFAULT_CAPACITY:
    return DEFAULT_CAPACITY
  return -(-need // CAPACITY_QUANTUM) * CAPACITY_QUANTUM


def builder(name: str, size: str = "default", *, seed: int = 0) -> GraphBuilder:
  """A GraphBuilder holding the model (not yet padded; `len()` is its node count)."""
  info = model_info(name)
  cfg = info.config(size)
  b = GraphBuilder(seed=seed, name=f"{name}[{size}]")
  info.fn(b, cfg)
  return b


def build(name: str, size: str = "default", *, seed: int = 0,
          capacity: int | None = None) -> tuple[Graph, ParamStore]:
  """Builds a zoo model as a padded graph and its weights.

  Args:
    name: one of `list_models()`.
    size: "default" (the benchmark model) or "tiny" (same structure, small dims, for tests).
    seed: seed of the random weights (fan-in scaled normals, random biases and norm scales).
    capacity: node slots; default `default_capacity(node count)`.
  Returns:
    (graph, params): the padded GraphsTuple and the ParamStore of its Constant nodes.
  Raises:
    ModelError: unknown name or size (the message lists the known ones).
    CapacityError: `capacity` is smaller than the node count (the message names the count).
  """
  b = builder(name, size, seed=seed)
  cap = default_capacity(len(b)) if capacity is None else capacity
  return b.build(cap)
