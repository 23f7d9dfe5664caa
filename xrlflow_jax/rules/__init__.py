"""Rewrite rules: a rule language, its compiler to vectorised matchers/appliers, and a library."""
from xrlflow_jax.rules.compile import CompiledRule, Features, MatchResult, node_depth
from xrlflow_jax.rules.edit import Edit, apply_edit
from xrlflow_jax.rules.pattern import MatchView, Ref, Rule, RuleBuilder
from xrlflow_jax.rules.ruleset import RuleSet, RuleSetMatch
