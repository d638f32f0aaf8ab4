"""The `ppo` section: the returns, the critic's input and the PPO update."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from marl_ppo.config.base import STRICT, PositiveFloat, PositiveInt

AUTO_EPOCHS = 10
"""`ppo.train_pi_iters` and `train_vf_iters` under `auto` (MAPPO's range for vector observations)."""

AUTO_EPOCHS_CNN = 4
"""The same where a network has a CNN encoder (the epochs of PPO's usual Atari settings)."""


@dataclass(frozen=True, config=STRICT)
class PPOConfig:
    gamma: Annotated[float, Field(gt=0, le=1)] = 0.99
    """Discount factor."""
    gae_lambda: Annotated[float, Field(ge=0, le=1)] = 0.95
    """GAE lambda."""
    critic: Literal["state", "state+obs", "obs", "team"] = "state"
    """Critic input: `state` (MAPPO), `state+obs` (agent-specific global state), `obs` (IPPO), or `team`:
    V(state), one value per env step shared by the group's agents (one network per group, no agent id;
    its first layer and the rest run once per env step, not once per agent). `team` suits a reward the
    agents share (see team_reward)."""
    team_reward: Literal["mean", "refuse"] = "mean"
    """With `critic: team`, what the group's one value V(state) learns and every agent's advantage comes
    from: `mean` runs GAE on the group as one learner, on the mean of its agents' rewards (an absent
    agent's counts as 0; exactly the shared reward where all are equal) until the group's episode ends,
    so every agent that acted at a step gets the same advantage and the policies climb the group's
    mean return (a cooperative objective: an agent's own reward counts only through that mean); `refuse`
    stops the run (exit 2) at the first step where the agents' rewards differ. Per-agent objectives
    need per-agent values: `critic: state`."""
    pi_lr: PositiveFloat = 7e-4
    """Adam learning rate of the actors."""
    vf_lr: PositiveFloat = 1e-3
    """Adam learning rate of the critic."""
    lr_schedule: Literal["constant", "linear"] = "constant"
    """`linear` decays both learning rates to zero over total_steps; `constant` keeps them."""
    clip_ratio: PositiveFloat = 0.2
    """PPO probability-ratio clip epsilon."""
    train_pi_iters: PositiveInt | Literal["auto"] = "auto"
    """Epochs over the batch for the actors (they stop early at the KL bound, see target_kl); `auto`:
    10, or 4 where a network has a CNN encoder, as pixel PPO usually runs (each pass over the frames
    is such a run's largest cost). The choice is written to the run's config.yaml."""
    train_vf_iters: PositiveInt | Literal["auto"] = "auto"
    """Epochs over the batch for the critic; `auto` as train_pi_iters."""
    num_minibatches: PositiveInt = 4
    """Minibatches per epoch; the batch (rollout.rollout_steps * rollout.num_envs env steps) is split evenly."""
    target_kl: PositiveFloat | None = 0.05
    """Stop the actors at once when, after an actor step, the approximate KL of the updated policy from
    the policy at the start of the update exceeds 1.5 * target_kl in any group (the largest over groups
    decides: the groups' actors step together, and none may pass the bound); the critic finishes its
    epochs. The KL is read on the next minibatch, from the forward its loss needs anyway, before the
    actors step on it; null disables."""
    entropy_coef: Annotated[float, Field(ge=0)] = 0.01
    """Weight of the entropy bonus in the actor loss (at the start, with entropy_schedule: linear)."""
    entropy_schedule: Literal["constant", "linear"] = "constant"
    """`linear` moves the entropy weight from entropy_coef to entropy_final over total_steps (an annealed
    temperature: in two-player zero-sum games, entropy-regularised self-play settles near a regularised
    equilibrium whose distance from a Nash equilibrium shrinks with the weight); `constant` keeps
    entropy_coef. A resumed run with a changed total_steps spreads the rest of the change over the new
    remaining steps, as lr_schedule does."""
    entropy_final: Annotated[float, Field(ge=0)] = 0.0
    """The entropy weight reached at total_steps with entropy_schedule: linear."""
    max_grad_norm: PositiveFloat | None = 10.0
    """Clip the gradient norm of the actors and of the critics to this value (see grad_clip); null disables."""
    grad_clip: Literal["global", "per_group"] = "global"
    """What max_grad_norm bounds: `global`, one norm over every group's actors and one over every
    group's critics; `per_group`, each group's actor and each group's critic apart (MAPPO clips each
    policy on its own)."""
    normalize_advantages: bool = True
    """Standardize advantages over live samples of the batch (never across groups; see advantage_norm)."""
    advantage_norm: Literal["group", "agent"] = "group"
    """What normalize_advantages standardizes over: `group`, all of an agent group's live samples;
    `agent`, each agent's own (MAPPO's separated mode)."""
    value_norm: bool = True
    """Train the critic on running-mean/std normalized returns (MAPPO's ValueNorm)."""
    value_norm_var_floor: PositiveFloat = 1e-2
    """Smallest variance ValueNorm divides by: the std is at least its square root (MAPPO's 1e-2 gives
    std >= 0.1). With sparse rewards a long run of zero returns otherwise shrinks the std until the
    first rewards become targets of hundreds; a smaller floor (1e-5) follows small-variance returns closer."""
    huber_delta: PositiveFloat | None = 10.0
    """Huber loss delta for the value loss; null uses the squared error."""
    value_clip: PositiveFloat | None = 0.2
    """Clip the new value to old value +- this (in normalized units when value_norm); null disables."""
    lagged_ratio: Literal["decoupled", "behaviour"] = "decoupled"
    """How an update treats a batch collected with rollout.policy_lag 1, by the policy one update behind the
    one being updated. `decoupled` (Hilton, Cobbe and Schulman 2021, "Batch size-invariance for policy
    optimization"): the ratio and its clip are taken against the policy at the start of the update,
    each sample's term is weighted by start policy / acting policy (see behaviour_weight_max), the
    value clip is centred on the critic's output at the start of the update, and the KL stop measures
    the update's own movement. `behaviour`: ratio, value clip and KL stop use the acting policy's
    log-probabilities and values, as for an on-policy batch. Without policy lag neither applies."""
    behaviour_weight_max: PositiveFloat | None = None
    """Truncation of decoupled PPO's weight pi_start(a|s) / pi_acting(a|s). null (the default, as in
    the paper) leaves the weights untruncated: the update's objective stays the start policy's. A
    ceiling such as V-trace's 1.0 lets no sample count more than once, which bounds the variance and
    biases the update slightly towards the acting policy where the start policy favours an action
    more; on the default experiment it learnt a little slower (docs/design.md)."""
    chunk_length: PositiveInt | None = 10
    """With `model.recurrent`: minibatches are sequences of this many consecutive steps of one env
    copy (every agent of a group together), each unrolled from the recurrent state stored when it was
    collected; null: the whole rollout is one sequence per env copy. A rollout that does not divide
    evenly ends in a shorter chunk (padded, left out of the losses). Unused by feed-forward networks."""
    actor_update: Literal["simultaneous", "sequential"] = "simultaneous"
    """How the actors learn in an update: `simultaneous`, every agent's actor from the same batch at
    once (MAPPO, IPPO); `sequential`, HAPPO (Kuba et al., ICLR 2022): one agent after another in a
    fresh random order each update, every agent (across groups) in one sequence, each agent's
    clipped objective weighted by the product of the probability ratios new / old of the agents
    updated before it. Needs an actor per agent (model.share_actor=false). The critic learns alongside the
    first agent of the order."""
    on_nonfinite: Literal["error", "skip"] = "error"
    """A NaN or inf loss, gradient or return: `error` stops the run naming the group, term and update;
    `skip` drops that minibatch step (or the update's value-norm statistics) and counts it in
    `train/nonfinite_skips`."""
    update_stats: Literal["batch", "minibatches"] = "batch"
    """How the update's `train/` losses, KL, entropy and clip fraction are measured: `batch`, two
    extra forwards over the batch (up to 8,192 agent-steps), before and after the update, logging
    the after values and the losses' change over the update; `minibatches`, the means over the
    update's minibatch steps of what each step's forward computed anyway (as CleanRL, SB3 and
    JaxMARL log them), each at the weights before its step: no extra forwards (about 15% of a small
    network's learner time; with `rollout.policy_lag` the forward before the update still runs, for
    `kl_behaviour_start`), no `delta_loss_pi` / `delta_loss_v`. Learning is the same either way."""

    def settled(self, *, convolutional: bool) -> SettledPPO:
        """This config with `auto` epochs replaced by their choice for a model with (`convolutional`) or
        without a CNN encoder: what the trainer takes."""
        epochs = AUTO_EPOCHS_CNN if convolutional else AUTO_EPOCHS
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        fields["train_pi_iters"] = epochs if self.train_pi_iters == "auto" else self.train_pi_iters
        fields["train_vf_iters"] = epochs if self.train_vf_iters == "auto" else self.train_vf_iters
        return SettledPPO(**fields)


@dataclass(frozen=True, config=STRICT)
class SettledPPO(PPOConfig):
    """PPO settings with their epochs settled (`PPOConfig.settled`; a run's plan settles them): the
    trainer's type, whose epochs are numbers."""

    train_pi_iters: PositiveInt = AUTO_EPOCHS
    """Epochs over the batch for the actors (see `PPOConfig.train_pi_iters`), settled."""
    train_vf_iters: PositiveInt = AUTO_EPOCHS
    """Epochs over the batch for the critic, settled."""
