"""The padded graph shared by every part of xrlflow_jax (see `layout` for the array layout)."""

from xrlflow_jax.graph.builder import GraphBuilder, Tensor
from xrlflow_jax.graph.host import (dump, node_signature, num_nodes, op_histogram, permute_slots,
                                    runtime_hash, structural_hash, to_arrays, topological_order,
                                    validate)
from xrlflow_jax.graph.layout import (DEFAULT_CAPACITY, DEFAULT_MAX_INPUTS, NODE_FIELDS, Graph,
                                      capacity, empty_arrays, from_arrays, input_table, max_inputs,
                                      num_inputs, to_host)
from xrlflow_jax.graph.params import ParamStore
from xrlflow_jax.graph.transforms import (allocate_slots, compact, consumer_counts, live_nodes,
                                          remove_dead_code)

__all__ = [
    "DEFAULT_CAPACITY", "DEFAULT_MAX_INPUTS", "Graph", "GraphBuilder", "NODE_FIELDS", "ParamStore",
    "Tensor", "allocate_slots", "capacity", "compact", "consumer_counts", "dump", "empty_arrays",
    "from_arrays", "input_table", "live_nodes", "max_inputs", "node_signature", "num_inputs",
    "num_nodes", "op_histogram", "permute_slots", "remove_dead_code", "runtime_hash", "structural_hash", "to_arrays", "to_host",
    "topological_order", "validate",
]
