"""One loader for every job: a zoo model by name or an ONNX file by path, at one capacity rule.

    spec = resolve("squeezenet1_1", size="tiny")         # or an .onnx path, or a shared stem
    loaded = load(spec)                                  # Loaded: graph, params, label, kind
    loaded = load("model.onnx", input_shapes={"x": (1, 3, 224, 224)})
    many = load_many([spec_a, spec_b])                   # one capacity for a training pool

The capacity rule (`fitted_capacity`): HEADROOM x the node count (room for rewrites that add
nodes), rounded up to a multiple of CAPACITY_QUANTUM; small capacities keep matching, search and
training cheap (the zoo's own default is 1024 slots).
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from xrlflow_jax import models, onnx_io
from xrlflow_jax import graph as G
from xrlflow_jax.errors import CapacityError, UsageError, XrlflowError
from xrlflow_jax.graph import GraphBuilder, ParamStore, layout

SIZES = ("tiny", "default")
HEADROOM = 1.3
CAPACITY_QUANTUM = 64
SHARED_MODELS_ENV = "XRLFLOW_SHARED_MODELS"
# The repository's sibling `shared/models` (graph-only real networks), if present.
SHARED_MODELS = Path(os.environ.get(SHARED_MODELS_ENV,
                                    Path(__file__).resolve().parents[3] / "shared" / "models"))
SHAPE_KEYS_ONNX = ("batch", "image", "seq")


class LoadError(UsageError):
  """A model that cannot be loaded as asked: unknown name or size, a missing file or a folder,
  input shapes for a zoo model, a shape variant the model does not have."""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """A model to load: a zoo model (with a size) or an ONNX file, and an optional shape variant.

  Attributes:
    label: name in reports ("squeezenet1_1", "resnet50_keepbn.onnx", ...).
    source: the zoo name, or the ONNX path.
    size: zoo size ("default" or "tiny"; ignored for ONNX).
    shape: a shape variant, e.g. (("image", 96),) or (("batch", 2),); () = as built/exported.
  """
  label: str
  source: str
  size: str = "default"
  shape: tuple[tuple[str, int], ...] = ()

  @property
  def is_onnx(self) -> bool:
    return self.source.endswith(".onnx") or _looks_like_path(self.source)

  @property
  def shape_label(self) -> str:
    """"default", or the variant as "key=value" joined by "+"."""
    return "+".join(f"{k}={v}" for k, v in self.shape) or "default"

  def with_shape(self, shape: Sequence[tuple[str, int]]) -> "ModelSpec":
    return dataclasses.replace(self, shape=tuple(shape))


@dataclasses.dataclass
class Loaded:
  """A loaded model.

  Attributes:
    label: a short name (zoo name, or the ONNX file's stem); kind: "zoo" or "onnx".
    graph, params: the padded graph (capacity N) and its weights.
    path: the ONNX file (kind "onnx"), else "".
    random_weights: initializers given seeded random values (graph-only ONNX files).
    size: the zoo size it was built at ("" for ONNX files).
  """
  label: str
  kind: str
  graph: layout.Graph
  params: ParamStore
  path: str = ""
  random_weights: int = 0
  size: str = ""

  @property
  def name(self) -> str:
    """The label with the zoo size when it is not the default ("bert[tiny]"): what reports
    that mix sizes print."""
    return f"{self.label}[{self.size}]" if self.kind == "zoo" and self.size != "default" \
        else self.label


def _looks_like_path(source: str) -> bool:
  return source.endswith(".onnx") or os.sep in source or "/" in source or os.path.exists(source)


def shared_model_paths(directory: str | os.PathLike[str] | None = None) -> list[Path]:
  """The ONNX files of ../shared/models (sorted; [] when the directory is absent)."""
  d = Path(directory) if directory is not None else SHARED_MODELS
  return sorted(d.glob("*.onnx")) if d.is_dir() else []


def resolve(text: str, size: str = "default") -> ModelSpec:
  """A ModelSpec from a zoo name, an ONNX path, or the stem of a file in ../shared/models.

  Raises:
    LoadError: nothing of that name (the message lists the zoo and the shared files), a folder,
      a missing file, an unknown size.
  """
  text = str(text).strip()
  if size not in SIZES:
    raise LoadError(f"unknown size {size!r}; sizes are {', '.join(SIZES)}")
  if text in models.list_models():
    return ModelSpec(text, text, size)
  path = Path(text)
  if _looks_like_path(text):
    if path.is_dir():
      raise LoadError(f"{text!r} is a folder, not an ONNX file")
    if not path.is_file():
      raise LoadError(f"ONNX file not found: {text}")
    return ModelSpec(path.name, str(path), size)
  shared = SHARED_MODELS / f"{text}.onnx"
  if shared.is_file():
    return ModelSpec(shared.name, str(shared), size)
  raise LoadError(f"unknown model {text!r}; known models: {', '.join(models.list_models())} "
                  f"(or give a path to an .onnx file, or the name of a file in {SHARED_MODELS}: "
                  f"{', '.join(p.stem for p in shared_model_paths()) or 'absent'})")


def default_models(size: str = "default") -> list[ModelSpec]:
  """Every zoo model (at `size`) and every ONNX file of ../shared/models."""
  return ([ModelSpec(n, n, size) for n in models.list_models()]
          + [ModelSpec(p.name, str(p), size) for p in shared_model_paths()])


def parse_shape(text: str) -> tuple[tuple[str, int], ...]:
  """A shape variant from "default" / "" or "key=value[+key=value]" (e.g. "image=96+batch=2").

  Zoo models take any integer field of their config (image, seq, frames, ...); ONNX files take
  batch (dim 0 of every input), image (the last two dims of 4-D inputs) and seq (dim 1 of 2-D
  inputs).
  """
  text = text.strip()
  if text in ("", "default"):
    return ()
  out = []
  for part in text.split("+"):
    key, sep, value = part.partition("=")
    if not sep or not value.strip().lstrip("-").isdigit():
      raise LoadError(f"bad shape variant {part!r}: use key=integer, e.g. image=96")
    out.append((key.strip(), int(value)))
  return tuple(out)


def fitted_capacity(num_nodes: int) -> int:
  """Node slots for a graph of `num_nodes`: HEADROOM x its size rounded up to a multiple of
  CAPACITY_QUANTUM (tiny SqueezeNet's 92 nodes get 128)."""
  need = math.ceil(HEADROOM * num_nodes)
  return max(CAPACITY_QUANTUM, -(-need // CAPACITY_QUANTUM) * CAPACITY_QUANTUM)


def fit_capacity(graph: layout.Graph, capacity: int) -> layout.Graph:
  """The same graph with `capacity` node slots (alive nodes keep their slots when they all lie
  below `capacity`; otherwise they are compacted first). CapacityError if it cannot fit."""
  n = G.num_nodes(graph)
  if n > capacity:
    raise CapacityError(f"the graph has {n} nodes, more than the capacity {capacity}")
  if G.capacity(graph) == capacity:
    return layout.to_host(graph)
  arrays = G.to_arrays(graph)
  alive = np.flatnonzero(arrays["alive"])
  if alive.size and alive.max() >= capacity:
    compacted, _ = G.compact(graph)
    arrays = G.to_arrays(compacted)
  if capacity > arrays["op"].shape[0]:
    grown = G.empty_arrays(capacity, G.max_inputs(graph))
    for k, v in arrays.items():
      grown[k][: v.shape[0]] = v
    arrays = grown
  else:
    arrays = {k: v[:capacity] for k, v in arrays.items()}
  return layout.from_arrays(arrays, as_numpy=True)


def _zoo_builder(spec: ModelSpec, seed: int) -> GraphBuilder:
  """A builder holding the zoo model of `spec`, its config fields replaced by `spec.shape`."""
  info = models.registry.model_info(spec.source)
  cfg = info.config(spec.size)
  if spec.shape:
    fields = {f.name for f in dataclasses.fields(cfg)}
    unknown = [k for k, _ in spec.shape if k not in fields]
    if unknown:
      raise LoadError(f"{spec.source}: no config field {unknown} to vary (zoo models fold "
                      f"batch 1 away; fields: {sorted(fields)})")
    cfg = dataclasses.replace(cfg, **dict(spec.shape))
  b = GraphBuilder(seed=seed, name=f"{spec.source}[{spec.size}]")
  info.fn(b, cfg)
  return b


def _onnx_with_shape(path: str, shape: Sequence[tuple[str, int]]):
  """(ModelProto with dynamic dims where `shape` changes them, {input: new shape})."""
  import onnx  # pylint: disable=g-import-not-at-top
  model = onnx.load(path, load_external_data=False)
  inits = {i.name for i in model.graph.initializer}
  changes = dict(shape)
  unknown = [k for k in changes if k not in SHAPE_KEYS_ONNX]
  if unknown:
    raise LoadError(f"{Path(path).name}: ONNX shape variants take {SHAPE_KEYS_ONNX}, "
                    f"not {unknown}")
  shapes = {}
  for inp in model.graph.input:
    if inp.name in inits:
      continue
    dims = inp.type.tensor_type.shape.dim
    new = [d.dim_value for d in dims]
    if "batch" in changes and new:
      new[0] = changes["batch"]
    if "image" in changes and len(new) == 4:
      new[2] = new[3] = changes["image"]
    if "seq" in changes and len(new) == 2:
      new[1] = changes["seq"]
    for i, d in enumerate(dims):
      if new[i] != d.dim_value:
        d.dim_param = f"{inp.name}_dim{i}"
    shapes[inp.name] = tuple(new)
  for out in model.graph.output:  # static output shapes of the export no longer hold
    out.type.tensor_type.ClearField("shape")
  del model.graph.value_info[:]
  return model, shapes


def load(source: str | ModelSpec, *, size: str = "default",
         input_shapes: Mapping[str, Sequence[int]] | None = None,
         capacity: int | None = None, seed: int = 0, random_weights: bool = False) -> Loaded:
  """A zoo model or an ONNX file.

  Args:
    source: a ModelSpec, or text for `resolve` (zoo name, .onnx path, shared stem).
    size: zoo size when `source` is text ("tiny" or "default"; ignored for ONNX files).
    input_shapes: ONNX only: {input name: whole shape} for dynamic dims.
    capacity: node slots; None: `fitted_capacity(node count)`.
    seed: seed of zoo weights and of random weights for graph-only ONNX files.
    random_weights: give initializers whose external data file is absent (graph-only files,
      such as `../shared/models`) seeded random values (`Loaded.random_weights` counts them);
      False: such a file is refused. Structure and latency do not depend on the values; a
      result that a user takes away does.
  Raises:
    LoadError: see `resolve`; shapes given for a zoo model; a bad shape variant.
    MissingWeightsError (an OnnxImportError): external data absent without `random_weights`.
    OnnxImportError: the file cannot be imported. CapacityError: it does not fit `capacity`.
  """
  spec = source if isinstance(source, ModelSpec) else resolve(source, size)
  if spec.is_onnx:
    path = Path(spec.source)
    if spec.shape:
      if input_shapes:
        raise LoadError("give either a shape variant or input shapes, not both")
      model, input_shapes = _onnx_with_shape(spec.source, spec.shape)
      graph, params = onnx_io.load(model, input_shapes=input_shapes,
                                   random_weights=random_weights, seed=seed)
    else:
      graph, params = onnx_io.load(str(path), input_shapes=dict(input_shapes or {}),
                                   random_weights=random_weights, seed=seed)
    graph = fit_capacity(graph, capacity or fitted_capacity(G.num_nodes(graph)))
    return Loaded(path.stem, "onnx", graph, params, str(path),
                  int(params.stats.random_weights))
  if input_shapes:
    raise LoadError("input shapes apply to ONNX files only; zoo models have fixed shapes")
  b = _zoo_builder(spec, seed)
  graph, params = b.build(capacity or fitted_capacity(len(b)))
  label = spec.label if not spec.shape else f"{spec.label}[{spec.shape_label}]"
  return Loaded(label, "zoo", layout.to_host(graph), params, size=spec.size)


def load_many(specs: Sequence[ModelSpec], *, capacity: int | None = None, seed: int = 0,
              errors: str = "raise", random_weights: bool = False) -> list[Loaded | Exception]:
  """Models sharing one capacity (a trained policy needs one): `capacity`, or None for the
  largest `fitted_capacity` among them; `random_weights`: see `load`.

  Args:
    errors: "raise", or "return" to put the exception (a project error) in place of a model
      that does not load (e.g. a shape variant the export cannot take) and carry on.
  """
  def one(spec: ModelSpec, cap: int | None) -> Loaded | Exception:
    try:
      return load(spec, capacity=cap, seed=seed, random_weights=random_weights)
    except XrlflowError as e:  # a bug (any other exception) always propagates
      if errors == "raise":
        raise
      return e

  if capacity:
    return [one(s, capacity) for s in specs]
  loaded = [one(s, None) for s in specs]
  ok = [x for x in loaded if isinstance(x, Loaded)]
  if not ok:
    return loaded
  cap = max(G.capacity(x.graph) for x in ok)
  return [dataclasses.replace(x, graph=fit_capacity(x.graph, cap)) if isinstance(x, Loaded)
          else x for x in loaded]


def as_graph_params(items: Sequence[Loaded | Exception]) -> list[Any]:
  """(graph, params) per Loaded, the exception where loading failed."""
  return [(x.graph, x.params) if isinstance(x, Loaded) else x for x in items]
