"""A padded graph as a JAX function with the traced function's signature."""

from __future__ import annotations

from typing import Any, Callable

import jax

from xrlflow_jax import executor
from xrlflow_jax.graph import layout
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.jax_io.trace import JaxImportError, Signature


def as_function(graph: layout.Graph, params: ParamStore, signature: Signature,
                *, precision: str | None = None) -> Callable[..., Any]:
  """A jitted function taking the traced function's arguments (same pytree, shapes and dtypes)
  and returning its result's pytree, computed by `graph` (`executor.lower`; its constants, the
  weights, bound). JaxImportError names an argument of another shape."""
  lowered = executor.lower(graph, params, precision=precision)
  consts = lowered.consts
  apply = jax.jit(lowered.apply)

  def fn(*args: Any) -> Any:
    leaves, tree = jax.tree_util.tree_flatten(args)
    if tree != signature.in_tree:
      raise JaxImportError(f"the function takes arguments shaped like {signature.in_tree}, "
                           f"got {tree}")
    for i, (x, aval) in enumerate(zip(leaves, signature.in_avals)):
      if tuple(jax.numpy.shape(x)) != tuple(aval.shape):
        raise JaxImportError(f"argument leaf {i} has shape {list(jax.numpy.shape(x))}, the "
                             f"function was optimised for {list(aval.shape)}")
    outs = apply(consts, *leaves)
    return jax.tree_util.tree_unflatten(signature.out_tree, list(outs))

  return fn
