"""Checkpoints of a training run's state (any pytree of arrays, e.g. `ppo.RunnerState`).

    save(workdir, step, state)                  # workdir/step_00000012/{state, meta.json}
    state, step = restore(workdir, target)      # the latest step, into target's structure

Two backends: orbax (`orbax.checkpoint.StandardCheckpointer`: sharded arrays, multi-host,
restores onto the target's shardings) when it is importable, otherwise flax's msgpack bytes of
the host arrays. In a multi-process run (`distributed`) every process calls `save` with the
same folder on a shared file system: orbax writes each process's shards, msgpack gathers them
and process 0 writes the file, the metadata and the final rename. Both store the leaves of the
flattened pytree and check on restore that the structure, shapes and dtypes match the target,
so a checkpoint from another config is a clear error rather than a silent mismatch. A step
directory appears only once fully written.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from xrlflow_jax.agents import distributed
from xrlflow_jax.errors import XrlflowError

try:  # orbax ships with flax but is not one of this package's declared dependencies
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
except ImportError:  # pragma: no cover - depends on the environment
  ocp = None

BACKENDS = ("auto", "orbax", "msgpack")
_STEP_DIR = re.compile(r"^step_(\d{8})$")


class CheckpointError(XrlflowError):
  """A missing, unreadable or mismatched checkpoint."""


def _backend(backend: str) -> str:
  if backend not in BACKENDS:
    raise CheckpointError(f"unknown checkpoint backend {backend!r}; use one of {BACKENDS}")
  if backend == "auto":
    return "orbax" if ocp is not None else "msgpack"
  if backend == "orbax" and ocp is None:
    raise CheckpointError("the orbax backend was requested but orbax.checkpoint is not installed")
  return backend


def _describe(leaves: list[Any]) -> list[list[Any]]:
  return [[list(np.shape(x)), str(np.asarray(x).dtype if not hasattr(x, "dtype") else x.dtype)]
          for x in leaves]


def steps(workdir: str | os.PathLike[str]) -> list[int]:
  """Completed checkpoint steps in `workdir`, ascending."""
  root = Path(workdir)
  if not root.is_dir():
    return []
  out = []
  for p in root.iterdir():
    m = _STEP_DIR.match(p.name)
    if m and (p / "meta.json").is_file():
      out.append(int(m.group(1)))
  return sorted(out)


def save(workdir: str | os.PathLike[str], step: int, state: Any, *, backend: str = "auto",
         max_to_keep: int | None = 3) -> Path:
  """Writes `state` as checkpoint `step` (replacing one of that step); returns its directory.

  Keeps the newest `max_to_keep` steps (None: all).
  """
  backend = _backend(backend)
  root = Path(workdir)
  final = root / f"step_{step:08d}"
  # A run over several processes (`distributed`) saves from all of them into one folder on a
  # file system they share: orbax writes each process's shards, process 0 the rest.
  many = distributed.multi_process()
  tmp = root / (f".tmp_step_{step:08d}" if many else f".tmp_step_{step:08d}_{os.getpid()}")
  main = distributed.is_main()
  if main:
    root.mkdir(parents=True, exist_ok=True)
    if tmp.exists():
      shutil.rmtree(tmp)
    tmp.mkdir()
  distributed.barrier(f"checkpoint {step}: folder")
  leaves, treedef = jax.tree_util.tree_flatten(state)
  if backend == "orbax":
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save((tmp / "state").resolve(), {f"{i:06d}": x for i, x in enumerate(leaves)})
    checkpointer.wait_until_finished()
    checkpointer.close()
  else:
    host = {f"{i:06d}": x for i, x in enumerate(distributed.to_host(leaves))}
    if main:
      (tmp / "state.msgpack").write_bytes(serialization.msgpack_serialize(host))
  if main:
    meta = {"step": int(step), "backend": backend, "treedef": str(treedef),
            "leaves": _describe(leaves)}
    (tmp / "meta.json").write_text(json.dumps(meta))
    if final.exists():
      shutil.rmtree(final)
    os.replace(tmp, final)
    if max_to_keep is not None:
      for old in steps(root)[:-max_to_keep]:
        shutil.rmtree(root / f"step_{old:08d}", ignore_errors=True)
  distributed.barrier(f"checkpoint {step}: written")
  return final


def restore(workdir: str | os.PathLike[str], target: Any,
            step: int | None = None) -> tuple[Any, int]:
  """Loads checkpoint `step` (default the latest) into the structure of `target`.

  Args:
    workdir: the directory `save` wrote to.
    target: a pytree with the structure of the saved state (arrays or jax.ShapeDtypeStruct;
      with orbax, leaves that carry a sharding are restored onto it).
    step: which step; None for the latest.
  Returns:
    (state, step).
  Raises:
    CheckpointError: no checkpoint, or one whose structure, shapes or dtypes differ.
  """
  available = steps(workdir)
  if not available:
    raise CheckpointError(f"no checkpoint in {workdir}")
  step = available[-1] if step is None else step
  folder = Path(workdir) / f"step_{step:08d}"
  if step not in available:
    raise CheckpointError(f"no checkpoint for step {step} in {workdir}; have {available}")
  try:
    meta = json.loads((folder / "meta.json").read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise CheckpointError(f"{folder}/meta.json: unreadable ({e})") from None
  leaves, treedef = jax.tree_util.tree_flatten(target)
  if meta["treedef"] != str(treedef):
    raise CheckpointError(f"{folder}: the saved state has another structure than the target "
                          "(a checkpoint of a different config?)")
  want = _describe(leaves)
  if meta["leaves"] != want:
    bad = next(i for i, (a, b) in enumerate(zip(meta["leaves"], want)) if a != b)
    raise CheckpointError(f"{folder}: leaf {bad} is {meta['leaves'][bad]} in the checkpoint "
                          f"but {want[bad]} in the target")
  if meta["backend"] == "orbax":
    if ocp is None:
      raise CheckpointError(f"{folder} was written by orbax, which is not installed here")
    abstract = {f"{i:06d}": jax.ShapeDtypeStruct(np.shape(x), x.dtype,
                                                 sharding=getattr(x, "sharding", None))
                for i, x in enumerate(leaves)}
    checkpointer = ocp.StandardCheckpointer()
    loaded = checkpointer.restore((folder / "state").resolve(), abstract)
    checkpointer.close()
    loaded = {k: _uncommit(v, leaves[int(k)]) for k, v in loaded.items()}
  else:
    try:
      loaded = serialization.msgpack_restore((folder / "state.msgpack").read_bytes())
    except (OSError, ValueError) as e:
      raise CheckpointError(f"{folder}/state.msgpack: unreadable ({e})") from None
    loaded = {k: _place(v, leaves[int(k)]) for k, v in loaded.items()}
  state = jax.tree_util.tree_unflatten(treedef, [loaded[f"{i:06d}"] for i in range(len(leaves))])
  return state, step


def _uncommitted(like: Any) -> bool:
  """A jit output not pinned to a device (placing the restored value there would make jit
  compile the next call anew: committed-ness is part of its cache key)."""
  return not getattr(like, "committed", True)


def _uncommit(value: Any, like: Any) -> Any:
  return jnp.asarray(np.asarray(value)) if _uncommitted(like) else value


def _place(value: np.ndarray, like: Any) -> Any:
  sharding = getattr(like, "sharding", None)
  if sharding is None or _uncommitted(like):
    return jnp.asarray(value)
  return jax.device_put(value, sharding)
