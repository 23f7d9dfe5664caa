"""Building a training run from a config (ml_collections.ConfigDict or nested dicts): the graph
pool, rules, cost model, environment, agent and trainer. Shared by `experiments/train.py`, the
training benchmark and tests; see `xrlflow_jax/configs/ppo.py` for the fields.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax

from xrlflow_jax import cost, workflow
from xrlflow_jax.agents.networks import Agent, AgentConfig, AgentError
from xrlflow_jax.agents.ppo import PPOConfig, Trainer
from xrlflow_jax.cost import calibrate
from xrlflow_jax.env import GraphRewriteEnv
from xrlflow_jax.graph import Graph, ParamStore
from xrlflow_jax.rules import RuleSet


@dataclasses.dataclass
class Run:
  """Everything a training run is made of.

  Attributes:
    names: one label per pool graph; graphs, params: the pool (graphs share one capacity).
    coeffs: the cost model's coefficients; ruleset, env, agent, trainer.
  """
  names: list[str]
  graphs: list[Graph]
  params: list[ParamStore]
  coeffs: cost.CostCoefficients
  ruleset: RuleSet
  env: GraphRewriteEnv
  agent: Agent
  trainer: Trainer


def load_pool(model_cfg: Any) -> tuple[list[str], list[Graph], list[ParamStore]]:
  """The graphs to optimise: an ONNX file, or a pool of models joined by "+", each a zoo name,
  an ONNX path or the stem of a file in ../shared/models, optionally followed by a size and
  shape variants after commas ("bert,default", "squeezenet1_1,image=96",
  "resnet18,tiny,batch=2"; size default model.size); loaded by `workflow.load_many` at one
  capacity (model.capacity, or 0: the largest fitted capacity). Names carry a zoo size other
  than the default ("bert[tiny]") where the pool mixes sizes."""
  capacity = int(model_cfg.capacity) or None
  if model_cfg.onnx:
    specs = [workflow.resolve(str(model_cfg.onnx))]
  else:
    names = [n for n in str(model_cfg.name).split("+") if n]
    if not names:
      raise AgentError("the config names no model (set model.name or model.onnx)")
    specs = []
    for n in names:
      name, *rest = [part.strip() for part in n.split(",")]
      sizes = [part for part in rest if "=" not in part]
      if len(sizes) > 1:
        raise AgentError(f"pool entry {n!r} names {len(sizes)} sizes; give at most one")
      spec = workflow.resolve(name, sizes[0] if sizes else str(model_cfg.size))
      shape = workflow.parse_shape("+".join(part for part in rest if "=" in part))
      specs.append(spec.with_shape(shape) if shape else spec)
  loaded = workflow.load_many(specs, capacity=capacity, seed=int(model_cfg.seed),
                              random_weights=True)
  mixed = len({x.size for x in loaded if x.kind == "zoo"}) > 1
  labels = [x.name if mixed else x.label for x in loaded]
  if len(set(labels)) < len(labels):
    raise AgentError(f"the pool names a graph twice: {labels}")
  return labels, [x.graph for x in loaded], [x.params for x in loaded]


select_rules = workflow.select_rules  # the one home: xrlflow_jax/workflow/rulesets.py


def load_cost(path: str) -> cost.CostCoefficients:
  """Coefficients from a JSON file, or (""): the default device's shipped fit or calibration,
  calibrated now when there is none (`cost.calibrate.coefficients`)."""
  return calibrate.coefficients(path or None)


def build(config: Any, devices: Sequence[jax.Device] | None = None,
          coeffs: cost.CostCoefficients | None = None, *,
          pool: tuple[Sequence[str], Sequence[Graph], Sequence[ParamStore]] | None = None,
          ruleset: RuleSet | None = None, kernels: cost.KernelTable | None = None) -> Run:
  """A Run from a config (see xrlflow_jax/configs/ppo.py): the one place an environment, agent
  and trainer are put together.

  Args:
    devices: the trainer's devices (default: every local device).
    coeffs: overrides the config's cost coefficients.
    pool: (names, graphs, params) to train on instead of loading `config.model`.
    ruleset: overrides `config.env.rules` / `max_locations`.
    kernels: measured kernel times for the environment's cost model (`cost.KernelTimes.table()`;
      kernels it lacks keep the roofline's estimate); None: the roofline alone.
  """
  names, graphs, params = pool if pool is not None else load_pool(config.model)
  coeffs = coeffs if coeffs is not None else load_cost(config.env.cost_coefficients)
  if ruleset is None:
    ruleset = workflow.ruleset(config.env.rules, int(config.env.max_locations))

  # The environment's graphs are pruned (`GraphRewriteEnv`); its exact candidate delta, when
  # on, costs the candidates incrementally (`cost.ModelCost.candidate_costs`).
  cost_fn = cost.ModelCost(coeffs, kernels=kernels, pruned=True)
  node_cost_fn = cost_fn.node_costs
  env = GraphRewriteEnv(list(graphs), ruleset, cost_fn, int(config.env.horizon),
                        reward_scale=float(config.env.reward_scale), node_cost_fn=node_cost_fn,
                        exact_candidate_delta=bool(config.env.exact_candidate_delta),
                        max_candidates=int(config.env.get("max_candidates", 0)))
  agent = Agent(ruleset, node_cost_fn, AgentConfig(**dict(config.agent)))
  trainer = Trainer(PPOConfig.from_mapping(config.ppo), env, agent, devices)
  return Run(list(names), list(graphs), list(params), coeffs, ruleset, env, agent, trainer)
