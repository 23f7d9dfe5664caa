"""Rewrite rules: a rule language, its compiler to vectorised matchers/appliers, a built-in
library (`rules.library.builtin_rules()`), TASO's collection (`load_taso`), and the verification
harness every rule passes (`rules.verify.verify_rule`)."""
from xrlflow_jax.rules.compile import CompiledRule, Features, MatchResult, node_depth
from xrlflow_jax.rules.edit import Edit, apply_edit
from xrlflow_jax.rules.pattern import MatchView, Ref, Rule, RuleBuilder
from xrlflow_jax.rules.ruleset import (RuleSet, RuleSetMatch, firing_rules, graph_op_codes,
                                       graph_op_counts, op_count_bounds, rules_that_can_fire)
from xrlflow_jax.rules.taso import RuleImportError, TasoImport, load_taso

__all__ = ["CompiledRule", "Edit", "Features", "MatchResult", "MatchView", "Ref", "Rule",
           "RuleBuilder", "RuleImportError", "RuleSet", "RuleSetMatch", "TasoImport",
           "apply_edit", "firing_rules", "graph_op_codes", "graph_op_counts", "load_taso",
           "node_depth", "op_count_bounds", "rules_that_can_fire"]
