"""The learner: a Flax GNN policy/value network over the padded graph, and PPO (PureJaxRL-style,
one jitted training run, data-parallel across devices).

  networks      Agent, AgentConfig, ActorCritic, GraphEncoder (GAT + global update), heads
  distributions MaskedCategorical (invalid actions have probability 0)
  gae           gae (truncation bootstraps, termination does not)
  ppo           PPOConfig, make_train / Trainer, RunnerState, Transition
  checkpoint    save / restore a RunnerState (orbax when installed, else msgpack)
  distributed   multi-process runs on jax.distributed: initialize, is_main, to_host
  summaries     metric writers: CSV, TensorBoard event files
"""

from xrlflow_jax.agents.distributions import MASKED_LOGIT, MaskedCategorical
from xrlflow_jax.agents.gae import gae
from xrlflow_jax.agents.networks import (HEADS, ActorCritic, Agent, AgentConfig, AgentError,
                                         CandidateInputs, EncoderInputs, GraphEncoder,
                                         LocalCandidates, encoder_inputs)
from xrlflow_jax.agents.ppo import (METRICS, PPOConfig, RunnerState, Trainer, Transition,
                                    make_train)

__all__ = [
    "ActorCritic", "Agent", "AgentConfig", "AgentError", "EncoderInputs", "GraphEncoder", "HEADS",
    "MASKED_LOGIT", "METRICS", "MaskedCategorical", "PPOConfig", "RunnerState", "Trainer",
    "Transition", "CandidateInputs", "LocalCandidates", "encoder_inputs", "gae", "make_train",
]
