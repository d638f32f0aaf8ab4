"""The `fast` section: switches between our hand-written pieces and the library's."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_validator
from pydantic.dataclasses import dataclass
from pydantic_core import ArgsKwargs

from marl_ppo.config.base import STRICT


@dataclass(frozen=True, config=STRICT)
class FastConfig:
    """Hand-written replacements of library pieces (`marl_ppo/fast/`), each with a switch back to the
    library, which of torch's Adam implementations the trainer steps, and which learner updates."""

    optimizer: Literal["adam", "adam_foreach", "adam_fused"] = "adam"
    """torch.optim.Adam with its single-tensor (`adam`), multi-tensor (`adam_foreach`) or fused
    (`adam_fused`) implementation, and nn.utils.clip_grad_norm_."""
    screen_copy: bool = True
    """Pistonball and cooperative_pong: every agent's observation and the state are views of one copy
    of the screen per frame (the same arrays), and cooperative_pong's step draws without the copies
    its renders throw away; false: the envs' own observe(), state() and render(), one copy each."""
    mamujoco_gather: bool = True
    """Multi-agent MuJoCo: each step maps the agents' actions to the robot's and reads their
    observations and the state by index arrays found once per env copy (`fast/mamujoco_gather.py`;
    the same numbers); false: Gymnasium-Robotics' own step, which walks the joint graph each time."""
    recurrent_cell: bool = True
    """With `model.recurrent`: our agent-stacked GRU/LSTM step (batched products over the agents'
    weights, each sequence's input product taken at once); false: torch's nn.GRUCell / nn.LSTMCell
    on the same weights, called once per agent (per-agent weights) or once (shared)."""
    learner: Literal["torch", "jax"] = "torch"
    """The PPO update's implementation: torch (`algo.trainer.Trainer`, every run), or `jax`: the whole
    update (every epoch's minibatch steps, the KL stop, gradient clipping, Adam, the before/after
    diagnostics) as one compiled JAX program per update (`algo.jax_trainer.JaxTrainer`), with the
    weights and Adam moments written back into torch after it. `jax` covers the runs whose rollout is
    compiled (`rollout.compiled`: Discrete actions, fp32) with feed-forward networks, a simultaneous
    actor update and no policy lag; any other run is refused with the reason (`plan.compiled`)."""

    @model_validator(mode="before")
    @classmethod
    def _removed_keys(cls, data: Any) -> Any:
        keys = data.kwargs if isinstance(data, ArgsKwargs) else data
        for key, library in REMOVED_FAST_KEYS.items():
            if isinstance(keys, dict) and key in keys:
                raise ValueError(
                    f"config key 'fast.{key}' was removed: {library} is always used now; "
                    "delete the key from the experiment file or the overrides"
                )
        if isinstance(keys, dict) and keys.get("optimizer") in REMOVED_OPTIMIZERS:
            raise ValueError(
                f"fast.optimizer={keys['optimizer']} was removed: torch.optim.Adam's single-tensor step "
                "computes the same numbers; set fast.optimizer=adam (the default) or drop the key"
            )
        return data


REMOVED_FAST_KEYS = {
    "distributions": "torch.distributions",
    "event_writer": "torch.utils.tensorboard's SummaryWriter",
    "allocator": "glibc's default malloc",
    "sigmoid_tanh": "torch.tanh",
    "lean_cycle": "PettingZoo's aec_to_parallel wrapper",
}
"""`fast` switches whose hand-written piece was removed, and the library piece that replaced it."""

REMOVED_OPTIMIZERS = {"flat_adam": "adam"}
"""`fast.optimizer` values whose hand-written optimizer was removed -> the value with the same numbers."""
