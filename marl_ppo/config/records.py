"""The configuration records: one frozen, validated dataclass per section, every default documented
at its field, and `ConfigError`, the one-line error a bad value raises."""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic.dataclasses import dataclass
from pydantic_core import ArgsKwargs

from marl_ppo.faults import UserError

_STRICT = ConfigDict(extra="forbid", use_attribute_docstrings=True)

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


class ConfigError(UserError, ValueError):
    """A user-facing configuration problem; its message is one line naming the key and the fix."""

    __module__ = "marl_ppo.config"  # where users import it from, as tracebacks name it


@dataclass(frozen=True, config=_STRICT)
class EnvConfig:
    id: str = "mpe2/simple_spread_v3"
    """Environment: a registered id (`family/name`), `package.module:callable` or `path/to/file.py:callable`."""
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments passed to the environment factory."""
    groups: dict[str, list[str]] | None = None
    """Agent groups by name (`{group: [agent, ...]}`; a name without its number, `red`, stands for
    every `red_<n>`); default: agents with identical spaces and the same name without the number form a group."""
    state: Literal["auto", "env", "concat"] = "auto"
    """Global state for the critic: `env` calls env.state(), `concat` concatenates all observations,
    `auto` uses env.state() when the env declares a state_space."""
    image_pool: PositiveInt | Literal["auto"] = "auto"
    """Average-pool image observations and states (Boxes of rank 3, HWC or CHW) over k x k pixel blocks;
    `auto` picks the smallest k that brings every image observation's longer side to at most 64 pixels
    (1 without images). For a CNN (model.encoder) uint8 frames stay uint8; for an MLP they become floats in [0, 1]."""
    greyscale: bool = False
    """Turn image observations (uint8 Boxes of rank 3) into one grey channel, 0.299 R + 0.587 G + 0.114 B,
    before `resize` and `frame_stack` (parallel envs; the state is left to `image_pool`)."""
    resize: tuple[PositiveInt, PositiveInt] | None = None
    """Resize image observations to `[height, width]` (Pillow): where both sides shrink, each output pixel
    is the mean of the source pixels whose centres fall in it; else bilinear. `image_pool: auto` then
    leaves them at that size and pools only an image state."""
    frame_stack: PositiveInt = 1
    """Each agent observes its last k processed frames stacked on the channel axis, newest last, with
    zero frames before its episode's first."""
    skip_check_wrappers: bool = True
    """Step an AEC-converted env without PettingZoo's OrderEnforcing/AssertOutOfBounds wrappers, which
    only assert what the adapter already guarantees, and without the observations the parallel
    wrapper computes before each agent's move and discards (same trajectories while the env's
    `observe()` only reads it; faster steps). false steps the env exactly as its factory built it."""


@dataclass(frozen=True, config=_STRICT)
class ModelConfig:
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
    on acting's few rows (`AgentMLP.hold_weights`)."""
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
    for both (as SB3's CnnPolicy and CleanRL's Atari PPO). Needs `critic: obs` and `share_critic`
    equal to `share_actor`. false: the actor and the critic each have their own CNN (as MAPPO)."""

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
        layers = {len(self.cnn_channels), len(self.cnn_kernels), len(self.cnn_strides)}
        if len(layers) != 1:
            raise ValueError(
                f"model.cnn_channels, model.cnn_kernels and model.cnn_strides give {len(self.cnn_channels)}, "
                f"{len(self.cnn_kernels)} and {len(self.cnn_strides)} layers; give each one value per layer"
            )


AUTO_EPOCHS = 10
"""`ppo.train_pi_iters` and `train_vf_iters` under `auto` (MAPPO's range for vector observations)."""

AUTO_EPOCHS_CNN = 4
"""The same where a network has a CNN encoder (the epochs of PPO's usual Atari settings)."""


@dataclass(frozen=True, config=_STRICT)
class PPOConfig:
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
    """Minibatches per epoch; the batch (rollout_steps * num_envs env steps) is split evenly."""
    target_kl: PositiveFloat | None = 0.05
    """Stop the actors at once when, after an actor step, the approximate KL of the updated policy from
    the policy at the start of the update exceeds 1.5 * target_kl in any group (the largest over groups
    decides: the groups' actors step together, and none may pass the bound); the critic finishes its
    epochs. The KL is read on the next minibatch, from the forward its loss needs anyway, before the
    actors step on it; null disables."""
    entropy_coef: Annotated[float, Field(ge=0)] = 0.01
    """Weight of the entropy bonus in the actor loss."""
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
    """How an update treats a batch collected with policy_lag 1, by the policy one update behind the
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
    updated before it. Needs an actor per agent (share_actor=false). The critic learns alongside the
    first agent of the order."""
    on_nonfinite: Literal["error", "skip"] = "error"
    """A NaN or inf loss, gradient or return: `error` stops the run naming the group, term and update;
    `skip` drops that minibatch step (or the update's value-norm statistics) and counts it in
    `train/nonfinite_skips`."""

    def settled(self, *, convolutional: bool) -> PPOConfig:
        """This config with `auto` epochs replaced by their choice for a model with (`convolutional`) or
        without a CNN encoder."""
        epochs = AUTO_EPOCHS_CNN if convolutional else AUTO_EPOCHS
        return dataclasses.replace(
            self,
            train_pi_iters=epochs if self.train_pi_iters == "auto" else self.train_pi_iters,
            train_vf_iters=epochs if self.train_vf_iters == "auto" else self.train_vf_iters,
        )

    def require_settled(self) -> PPOConfig:
        """This config, after refusing (ValueError) epochs still `auto`: PPO runs on a settled config
        (`settled`; a run's plan settles it)."""
        for key in ("train_pi_iters", "train_vf_iters"):
            if getattr(self, key) == "auto":
                raise ValueError(
                    f"ppo.{key} is still auto; settle it first with ppo.settled(convolutional=...) "
                    "(a run's plan, run.plan.plan_run, does)"
                )
        return self


LOG_BACKENDS = ("tensorboard", "csv", "wandb", "mlflow")
"""Where a run's scalars go (`log.backends`); docs/tracking.md shows how to view each."""


@dataclass(frozen=True, config=_STRICT)
class WandbConfig:
    """Weights & Biases (`log.backends: [..., wandb]`, needs `pip install 'marl-ppo[wandb]'`)."""

    project: str | None = None
    """W&B project; null: `WANDB_PROJECT`, else `marl-ppo`."""
    entity: str | None = None
    """W&B team or user; null: `WANDB_ENTITY`, else the account's default."""
    group: str | None = None
    """Group of runs (e.g. the seeds of one configuration); null: `WANDB_RUN_GROUP`, else none."""
    tags: tuple[str, ...] = ()
    """Tags of the run (added to those in `WANDB_TAGS`)."""
    mode: Literal["auto", "online", "offline"] = "auto"
    """`online` streams to the W&B server; `offline` writes the run under `<run_dir>/wandb` for a later
    `wandb sync`; `auto`: `WANDB_MODE` when set, else online when a W&B login exists (`wandb login` or
    `WANDB_API_KEY`), else offline."""
    init_timeout_s: PositiveFloat = 60.0
    """Seconds `wandb.init` may take to reach the server; past that the run goes on without W&B."""


@dataclass(frozen=True, config=_STRICT)
class MlflowConfig:
    """MLflow (`log.backends: [..., mlflow]`, needs `pip install 'marl-ppo[mlflow]'`)."""

    tracking_uri: str | None = None
    """MLflow tracking URI (`http://host:5000`, `sqlite:///path.db`, ...); null: `MLFLOW_TRACKING_URI`,
    else a sqlite store in the run directory, `sqlite:///<run_dir>/mlflow.db`."""
    experiment: str | None = None
    """MLflow experiment name; null: `MLFLOW_EXPERIMENT_NAME`, else `marl-ppo`."""


@dataclass(frozen=True, config=_STRICT)
class LogConfig:
    backends: tuple[Literal["tensorboard", "csv", "wandb", "mlflow"], ...] = ("tensorboard",)
    """Where scalars, the resolved config and the final summary go, any combination of
    `tensorboard` (`<run_dir>/tensorboard`), `csv` (`<run_dir>/csv`), `wandb` and `mlflow`: each gets
    the same scalars under the same names. A tracker that fails (no network, a server down) costs a
    one-line warning and the run goes on with the others. `report` and `compare` read TensorBoard or CSV."""
    video: Literal["gif", "mp4"] | None = None
    """At the end of the run, record one deterministic episode of the best evaluated policy (the final
    one without eval_every) as `<run_dir>/videos/episode_<step>.<gif|mp4>` and show it in the backends
    that show videos: TensorBoard's Images tab (GIF), W&B, MLflow (an artifact). An env that cannot
    render costs a one-line warning. null: no video."""
    wandb: WandbConfig = dataclasses.field(default_factory=WandbConfig)
    """Weights & Biases settings (used when `backends` names wandb)."""
    mlflow: MlflowConfig = dataclasses.field(default_factory=MlflowConfig)
    """MLflow settings (used when `backends` names mlflow)."""
    checkpoint_every: PositiveInt = 50
    """Write a checkpoint (`checkpoints/update_<N>.pt` and `latest.pt`) every this many updates, at the end,
    and when stopped by Ctrl-C or SIGTERM."""
    keep_last: PositiveInt | None = 3
    """Periodic checkpoints `update_<N>.pt` to keep (older ones are deleted); null keeps all.
    `latest.pt` and `final.pt` are always kept."""
    progress: bool = True
    """Show progress on stderr: a redrawn bar on a terminal; in a log file or a pipe, a plain line each 5%
    of total_steps (steps, steps/s, recent team return)."""
    per_agent: bool = True
    """Also log per-agent returns under `agents/<agent_id>/`."""
    return_window: PositiveInt = 100
    """Episodes averaged for `team_return_mean` in the progress bar and summary.json."""

    def __post_init__(self) -> None:
        if len(set(self.backends)) != len(self.backends):
            raise ValueError(f"log.backends names a backend twice: {list(self.backends)}; name each once")


@dataclass(frozen=True, config=_STRICT)
class FastConfig:
    """Hand-written replacements of library pieces (`marl_ppo/fast/`), each with a switch back to the library."""

    optimizer: Literal["flat_adam", "adam", "adam_foreach", "adam_fused"] = "flat_adam"
    """`flat_adam`: Adam over one flat buffer per network (one clip norm, a few ops per step; the same
    numbers as `adam`); `adam`, `adam_foreach`, `adam_fused`: torch.optim.Adam with its single-tensor,
    multi-tensor or fused implementation, and nn.utils.clip_grad_norm_."""
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
        return data


REMOVED_FAST_KEYS = {
    "distributions": "torch.distributions",
    "event_writer": "torch.utils.tensorboard's SummaryWriter",
    "allocator": "glibc's default malloc",
    "sigmoid_tanh": "torch.tanh",
    "lean_cycle": "PettingZoo's aec_to_parallel wrapper",
}
"""`fast` switches whose hand-written piece was removed, and the library piece that replaced it."""


@dataclass(frozen=True, config=_STRICT)
class RayConfig:
    """Rollout workers as Ray actors (`vector: ray`), on this machine or across a Ray cluster."""

    address: str | None = None
    """The Ray cluster to join: null starts a Ray instance on this machine for the run (and stops it
    after); `auto` joins the cluster started on this machine with `ray start`; `host:port` joins the
    head node there (its GCS port, 6379 unless `ray start --head --port` set another)."""
    num_cpus_per_worker: PositiveFloat = 1.0
    """CPUs Ray reserves for each rollout worker actor (the learner runs in this process, outside them)."""
    max_worker_restarts: Annotated[int, Field(ge=-1)] = 1000
    """Times Ray restarts a lost worker actor (its process or node died) before giving it up; -1: no limit.
    A restarted worker rejoins at the next update with the current weights and fresh episodes."""
    min_workers: PositiveInt = 1
    """Workers whose rollouts an update needs: while fewer are lost, updates go on with the rollouts of
    the others (a smaller batch); when fewer than this answer, the run writes a checkpoint and stops
    (exit status 1) to be resumed once the cluster is back."""
    placement: Literal["pack", "spread"] = "pack"
    """Where the workers go: `pack` fills as few nodes as possible (less traffic), `spread` puts them on
    as many nodes as possible (a lost node takes fewer workers with it)."""


@dataclass(frozen=True, config=_STRICT)
class ExpectedConfig:
    """The result an experiment file promises, checked by `marl-ppo reproduce` (ignored by `train`)."""

    steps: PositiveInt
    """Env steps each seed trains for (reproduce runs them with total_steps set to this)."""
    seeds: PositiveInt
    """Seeds 0..seeds-1 (reproduce --seeds overrides it)."""
    team_return: tuple[float, float] | None = None
    """[low, high]: the band the IQM over seeds of the final team return (the mean of each run's last
    `log.return_window` training episodes) must fall in."""
    eval: dict[str, tuple[float, float]] | None = None
    """Bands for the last periodic evaluation (`eval_every`): a tag under `eval/` to the [low, high]
    band the IQM over seeds of its last value must fall in, e.g. `{vs_random/win_rate: [0.8, 1.0]}`
    for a game, where the team return says nothing."""

    def __post_init__(self) -> None:
        if self.team_return is None and not self.eval:
            raise ValueError(
                "config key 'expected' needs a band: team_return: [low, high], or eval: {TAG: [low, high]} "
                "for a tag under eval/ (e.g. vs_random/win_rate)"
            )
        bands = {"expected.team_return": self.team_return} if self.team_return is not None else {}
        for tag, band in (self.eval or {}).items():
            if not tag or tag.startswith("eval/"):
                raise ValueError(
                    f"config key 'expected.eval' names tags under eval/ without the prefix "
                    f"(vs_random/win_rate, not eval/vs_random/win_rate), got '{tag}'"
                )
            bands[f"expected.eval.{tag}"] = band
        for key, (low, high) in bands.items():
            if not (math.isfinite(low) and math.isfinite(high) and low <= high):
                raise ValueError(
                    f"config key '{key}' must be [low, high] with finite low <= high, got {[low, high]}"
                )


@dataclass(frozen=True, config=_STRICT)
class ExperimentConfig:
    """One experiment, validated: the env, the run's length and seed, PPO, the networks and logging."""

    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    """Which environment to train on."""
    seed: Annotated[int, Field(ge=0)] = 0
    """Seed for Python, NumPy, torch and the environments."""
    total_steps: PositiveInt = 1_000_000
    """Environment steps to train for (one step of one env copy counts once, not once per agent)."""
    num_envs: PositiveInt = 16
    """Environment copies stepped in parallel. An env registered with a number of copies of its own
    (a batched simulator: `vmas/*` 1,024, `jaxmarl/*` 64) gets that number when a config does not set
    `num_envs`."""
    vector: Literal["auto", "sync", "subprocess", "workers", "ray"] = "auto"
    """Where the env copies run: `sync` in this process; `subprocess` in `num_workers` processes that
    step them while this process acts; `workers` in `num_workers` processes that also act, each with a
    copy of the policy (no per-step round trips; see policy_lag); `ray` in `num_workers` such workers
    as Ray actors, on any node of a Ray cluster (see `ray.*`; needs `pip install 'marl-ppo[ray]'`); `auto` picks `workers` when there
    are 2+ cores, 2+ env copies per worker and an env step costs 50 us or more, or a worker per copy
    when a step costs 2 ms or more (pistonball), else `sync` (the choice is written to the run's
    config.yaml). Batched simulators (VMAS) ignore it."""
    num_workers: PositiveInt = 2
    """Worker processes for `vector: subprocess|workers|ray` (each owns a contiguous slice of the env copies)."""
    policy_lag: Literal[0, 1] = 0
    """With `vector: workers|ray`, 1 collects the next rollout with the pre-update policy while the learner
    updates (collection overlaps learning; `ppo.lagged_ratio` says how the update treats such a batch); 0 waits.
    Other vector modes (and `auto` when it picks `sync`) run with 0, and record 0 in config.yaml."""
    worker_timeout_s: PositiveFloat = 60.0
    """Seconds a worker process (`vector: subprocess|workers|ray`) may take to answer (build, reset or
    step its envs; rollout workers get this per step of a rollout) before it is reported as hung and
    every worker is stopped. A Ray worker's start (Ray starting its process on a node) gets at least
    300 s."""
    rollout_steps: PositiveInt = 100
    """Steps per env copy collected before each update (batch = rollout_steps * num_envs)."""
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
    share_actor: bool = False
    """One actor per agent group with an agent-id input, instead of one actor per agent."""
    share_critic: bool = True
    """One critic network per group with an agent-id input, instead of one per agent."""
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    """Torch device for the networks."""
    torch_threads: PositiveInt | Literal["auto"] = "auto"
    """torch.set_num_threads for the learner; `auto`: with a batched simulator (VMAS) or a CNN encoder, the
    cores the run's env or rollout worker processes leave (at least 1) while it acts, and every core
    while it updates unless the workers collect meanwhile (policy_lag 1); else 1 (the small MLPs gain
    nothing from more, and threads contending with busy cores slow them down)."""
    memory_check: bool = True
    """Before allocating, estimate the memory the run holds (rollout buffer, networks and optimizer
    state, the update's copies) and stop (exit 2) when it exceeds the memory available; false runs anyway."""
    eval_every: Annotated[int, Field(ge=0)] | None = None
    """Evaluate the policy deterministically every this many env steps (at the first update that reaches
    each multiple, and at the end), logged under `eval/`; 0 or null disables."""
    eval_episodes: PositiveInt = 10
    """Episodes per periodic evaluation, on their own env copies seeded apart from training's."""
    eval_absolute: Annotated[int, Field(ge=0)] = 10
    """The evaluation protocol's absolute metric: with eval_every, the best evaluated policy (kept as
    `checkpoints/best.pt`) plays this many times eval_episodes fresh deterministic episodes at the end of
    the run, written to `absolute_metric.json` and logged as `eval/absolute_team_return`; 0: none."""
    eval_vs_random: Literal["seats", "teams"] | None = None
    """Also score the policy against a uniformly random opponent at each evaluation (periodic, logged
    under `eval/vs_random/`, and `marl-ppo eval`, in eval.json). `seats`: every agent is a player of a
    game (classic games); the policy plays each seat in turn for eval_episodes episodes against random
    moves, scored as win, draw and loss rates (a win: its return above every other seat's). `teams`:
    agents form teams by their names without the trailing number (simple_tag's adversary and agent,
    battle's red and blue); the policy plays each team in turn, scored as that team's return and its
    random opponents'. null: no such score."""
    eval_teams: dict[str, list[str]] | None = None
    """The sides of `eval_vs_random: teams` where agents' names do not tell them apart: `{team: [name,
    ...]}`, each name an agent (`alice_0`) or agents' name without the trailing number (`alice`), every
    agent on exactly one team (simple_crypto: `{speakers: [alice, bob], eavesdropper: [eve]}`). null:
    teams by the agents' names without the trailing number."""
    expected: ExpectedConfig | None = None
    """The experiment's measured result, `{steps: N, seeds: K, team_return: [low, high]}` (or bands on
    the last evaluation, `eval: {vs_random/win_rate: [low, high]}`), checked by `marl-ppo reproduce`;
    training ignores it."""
    ppo: PPOConfig = dataclasses.field(default_factory=PPOConfig)
    """PPO optimisation settings."""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """Network architecture."""
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    """Logging and checkpointing."""
    fast: FastConfig = dataclasses.field(default_factory=FastConfig)
    """Switches between our hand-written pieces and the library's."""
    ray: RayConfig = dataclasses.field(default_factory=RayConfig)
    """Rollout workers on a Ray cluster (`vector: ray`)."""

    def __post_init__(self) -> None:
        if self.critic == "team" and not self.share_critic:
            raise ValueError(
                "critic: team is one network per group (one value per env step, for every agent), so "
                "share_critic=false (one critic per agent) cannot apply; drop it, or use critic: state"
            )
        if self.ppo.actor_update == "sequential" and self.share_actor:
            raise ValueError(
                "ppo.actor_update=sequential (HAPPO) updates each agent's own actor in turn, and a shared "
                "actor has one set of weights for a group's agents; set share_actor=false"
            )
        if self.model.shared_cnn and self.ppo.actor_update == "sequential":
            raise ValueError(
                "model.shared_cnn=true trains one CNN from the critic's loss and every actor's, which "
                "ppo.actor_update=sequential (HAPPO) cannot give to one agent's turn; set model.shared_cnn=false"
            )
        if self.model.shared_cnn and (self.critic != "obs" or self.share_critic != self.share_actor):
            raise ValueError(
                "model.shared_cnn=true gives the critic the actor's CNN of the observations, so it needs "
                "critic: obs and share_critic equal to share_actor; set those, or model.shared_cnn=false"
            )
        if self.eval_teams is not None and self.eval_vs_random != "teams":
            raise ValueError(
                "eval_teams names the sides of eval_vs_random: teams; set eval_vs_random: teams, or drop eval_teams"
            )
        chunks = self.sequence_chunks
        if chunks is not None and self.ppo.num_minibatches > chunks:
            raise ValueError(
                f"ppo.num_minibatches={self.ppo.num_minibatches} exceeds the {chunks} sequence chunks of a "
                f"rollout (num_envs={self.num_envs} x ceil(rollout_steps / ppo.chunk_length)); lower "
                "ppo.num_minibatches or ppo.chunk_length, or raise num_envs"
            )
        if self.ppo.num_minibatches > self.batch_steps:
            raise ValueError(
                f"ppo.num_minibatches={self.ppo.num_minibatches} exceeds the batch of "
                f"rollout_steps*num_envs={self.batch_steps} env steps; lower ppo.num_minibatches"
            )

        if self.vector == "ray" and self.ray.min_workers > self.num_workers:
            raise ValueError(
                f"ray.min_workers={self.ray.min_workers} exceeds num_workers={self.num_workers}; "
                "lower ray.min_workers or raise num_workers"
            )

    @property
    def sequence_chunks(self) -> int | None:
        """Sequence chunks per rollout with a recurrent model (None for feed-forward networks)."""
        if self.model.recurrent is None:
            return None
        length = self.ppo.chunk_length or self.rollout_steps
        return self.num_envs * -(-self.rollout_steps // length)

    @property
    def batch_steps(self) -> int:
        """Env steps per update, over all env copies."""
        return self.rollout_steps * self.num_envs


def config_to_dict(config: ExperimentConfig) -> dict[str, Any]:
    """Plain nested dict of primitives (lists, not tuples), ready for YAML or a checkpoint."""
    return _plain(dataclasses.asdict(config))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value
