"""The `model` section: the actor and critic networks, their sharing, encoders and recurrence."""

from __future__ import annotations

from typing import Literal

from pydantic.dataclasses import dataclass

from marl_ppo.config.base import STRICT, PositiveInt


@dataclass(frozen=True, config=STRICT)
class ModelConfig:
    share_actor: bool = False
    """One actor per agent group with an agent-id input, instead of one actor per agent."""
    share_critic: bool = True
    """One critic network per group with an agent-id input, instead of one per agent."""
    hidden_sizes: tuple[PositiveInt, ...] = (64, 64)
    """Hidden layer widths of every actor and critic MLP."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Hidden-layer nonlinearity."""
    input_layer_norm: bool = True
    """Normalize each network's input with LayerNorm (MAPPO's feature normalization)."""
    orthogonal_init: bool = True
    """Orthogonal weight init (gain sqrt(2) hidden, 0.01 policy head, 1 value head); else PyTorch's default."""
    log_std_init: float = -0.5
    """Initial log standard deviation of diagonal-Gaussian (Box) action heads."""
    precision: Literal["fp32", "bf16", "auto"] = "fp32"
    """Arithmetic of the networks' layers, when acting and when learning alike: `bf16` runs their
    matrix products, convolutions and activations in bfloat16 (torch autocast). Weights, gradients,
    optimizer state, action distributions and losses stay float32. Pays off with large batches and
    CNNs on CPUs with AVX512-BF16 or AMX and on GPUs with bfloat16 tensor cores; elsewhere it is
    slower. `auto` picks `bf16` on such hardware, else `fp32` (the choice is written to the run's
    config.yaml). On a CPU the MLPs act with float32 products on bfloat16's grid, which is faster
    on acting's few rows (`models.acting.ActingMLP`)."""
    recurrent: Literal["gru", "lstm"] | None = None
    """A recurrent layer between each network's MLP trunk and its head (`gru` or `lstm`, torch's cell
    equations), for tasks that need memory; null: feed-forward networks. Training then runs on
    sequence chunks of `ppo.chunk_length` steps, each from its stored state."""
    recurrent_size: PositiveInt = 64
    """Hidden units of the recurrent layer (an LSTM carries twice as many numbers: h and c)."""
    recurrent_critic: bool | None = None
    """Whether the critic is recurrent too; null: true when `recurrent` is set."""

    encoder: Literal["auto", "mlp", "cnn"] = "auto"
    """What reads an image observation or state (a Box of rank 3, HWC or CHW; also an image inside a
    Dict observation, whose other keys join as vectors) before the MLP: `auto` and `cnn`, a CNN per
    image input (its own for the critic's state), its uint8 frames stored as uint8 and scaled to
    [0, 1] inside the model; `mlp`, the image flattened into the MLP's input. `cnn` refuses an env
    without images; envs without images are unchanged by `auto`."""
    cnn_channels: tuple[PositiveInt, ...] = (16, 32, 32)
    """Output channels of the CNN's convolutions, one per layer (ReLU after each)."""
    cnn_kernels: tuple[PositiveInt, ...] = (8, 4, 3)
    """Kernel size of each convolution (padded as `cnn_padding` says)."""
    cnn_strides: tuple[PositiveInt, ...] = (4, 2, 1)
    """Stride of each convolution."""
    cnn_padding: Literal["same", "valid"] = "same"
    """`same`: each convolution is padded by half its kernel, so small frames keep a pixel; `valid`: no
    padding, as the Nature DQN CNN that SB3's CnnPolicy and CleanRL's Atari PPO use (84x84 frames through
    kernels 8/4/3 and strides 4/2/1 leave 7x7 maps where `same` leaves 12x12, for about half the
    compute)."""
    cnn_features: PositiveInt = 128
    """Width of the linear layer (ReLU) after the convolutions: each image's feature vector for the MLP."""
    shared_cnn: bool = False
    """The critic reads the actor's CNN features of the observations: one CNN per group, learning from
    both losses and stepped by the actor's optimizer, evaluated once per minibatch and acting step
    for both (as SB3's CnnPolicy and CleanRL's Atari PPO). Needs `ppo.critic: obs` and `share_critic`
    equal to `share_actor`. false: the actor and the critic each have their own CNN (as MAPPO)."""

    init_from: str | None = None
    """Start the networks from another run's weights instead of a fresh initialization (a warm start):
    its run directory (its final, else latest checkpoint) or a checkpoint file. Every other setting is
    this run's: learning rates, the task, its kwargs. A team of another size is mapped where the
    networks are shared and the observations keep their size (a new agent takes an existing agent's
    id input, named as the run starts); other mismatches are refused. null: a fresh start."""
    init_networks: Literal["both", "actors", "critics"] = "both"
    """Which of `init_from`'s networks to start from: `actors`, `critics` (with their value
    normalizers) or `both`; the others start fresh."""
    init_optimizer: bool = False
    """Also carry `init_from`'s optimizer state (Adam's moments and step counts) and its minibatch
    shuffling generator, so that the same settings continue its learning update for update. Needs
    `init_networks: both`, the same team and a checkpoint written with that state (latest or final,
    not best). false: the optimizers start fresh, as in any new run."""

    @property
    def critic_recurrent(self) -> bool:
        """Whether the critic has a recurrent layer (`recurrent_critic` resolved)."""
        if self.recurrent is None:
            return False
        return True if self.recurrent_critic is None else self.recurrent_critic

    def __post_init__(self) -> None:
        if self.recurrent is None and self.recurrent_critic:
            raise ValueError(
                "model.recurrent_critic=true needs a recurrent layer; set model.recurrent: gru or lstm"
            )
        if self.init_from is None and (self.init_optimizer or self.init_networks != "both"):
            raise ValueError(
                "model.init_networks and model.init_optimizer choose what a warm start carries; set "
                "model.init_from to a run directory or checkpoint, or drop them"
            )
        if self.init_optimizer and self.init_networks != "both":
            raise ValueError(
                f"model.init_optimizer=true carries the optimizer state of every network, but "
                f"model.init_networks={self.init_networks}; set model.init_networks: both or drop init_optimizer"
            )
        layers = {len(self.cnn_channels), len(self.cnn_kernels), len(self.cnn_strides)}
        if len(layers) != 1:
            raise ValueError(
                f"model.cnn_channels, model.cnn_kernels and model.cnn_strides give {len(self.cnn_channels)}, "
                f"{len(self.cnn_kernels)} and {len(self.cnn_strides)} layers; give each one value per layer"
            )
