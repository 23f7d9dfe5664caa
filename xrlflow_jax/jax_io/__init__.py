"""JAX functions in and out: `trace(fn, *example_args)` builds the padded graph of a function
(its jaxpr), `as_function(graph, params, signature)` turns a graph back into a jittable
function of the same signature."""

from xrlflow_jax.jax_io.function import as_function
from xrlflow_jax.jax_io.trace import JaxImportError, Signature, trace

__all__ = ["JaxImportError", "Signature", "as_function", "trace"]
