"""The layer above the core that every job shares: loading a model (`load`), rule sets by name
(`ruleset`, `select_rules`: built-in rules, families and TASO's collection)."""

from xrlflow_jax.workflow.load import (CAPACITY_QUANTUM, HEADROOM, SHAPE_KEYS_ONNX,
                                       SHARED_MODELS, SIZES, LoadError, Loaded, ModelSpec,
                                       as_graph_params, default_models, fit_capacity,
                                       fitted_capacity, load, load_many, parse_shape, resolve,
                                       shared_model_paths)
from xrlflow_jax.workflow.rulesets import (TASO_ENV, RuleSelectionError, ruleset, select_rules,
                                           subset, taso_file, taso_rules, that_can_fire)

__all__ = [
    "CAPACITY_QUANTUM", "HEADROOM", "SHAPE_KEYS_ONNX", "SHARED_MODELS", "SIZES", "LoadError",
    "Loaded", "ModelSpec", "as_graph_params", "default_models", "fit_capacity",
    "fitted_capacity", "load", "load_many", "parse_shape", "resolve", "shared_model_paths",
    "RuleSelectionError", "TASO_ENV", "ruleset", "select_rules", "subset", "taso_file",
    "taso_rules", "that_can_fire",
]
