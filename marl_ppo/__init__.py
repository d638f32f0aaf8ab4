"""marl_ppo: multi-agent PPO (MAPPO / IPPO) for PettingZoo and Gymnasium environments.

The Python API, each name with its own docstring:

- `load_config(path=None, overrides=())` -> `ExperimentConfig`: an experiment file plus key=value overrides;
- `train(config, run_dir=None, *, resume=False)` -> `TrainResult`: one run, as `marl-ppo train`;
- `evaluate(target, *, episodes=10, deterministic=False, ...)`: a run's checkpoint, as `marl-ppo eval`;
- `load_policy(source)`: a run's (or an exported) policy, `act(observations_by_agent, state)`;
- `register_env(env_id, factory)` and `make_env(env_id, **kwargs)`: environment ids;
- `GymnasiumTeamEnv`: a Gymnasium env as a team.

`import marl_ppo` stays light: everything but `register_env` and `make_env` is imported on first use
(torch, Gymnasium, PettingZoo, TensorBoard and pydantic are not light).
"""

import importlib
from typing import TYPE_CHECKING, Any

from marl_ppo.envs.registry import make_env, register_env

if TYPE_CHECKING:
    from marl_ppo.api import evaluate, train
    from marl_ppo.config import ExperimentConfig, load_config
    from marl_ppo.envs.adapters.gymnasium import GymnasiumTeamEnv
    from marl_ppo.export.policy import load_policy
    from marl_ppo.run.loop import TrainResult

__all__ = [
    "ExperimentConfig",
    "GymnasiumTeamEnv",
    "TrainResult",
    "evaluate",
    "load_config",
    "load_policy",
    "make_env",
    "register_env",
    "train",
]
__version__ = "0.1.0"

_LAZY = {
    "ExperimentConfig": "marl_ppo.config",
    "load_config": "marl_ppo.config",
    "train": "marl_ppo.api",
    "evaluate": "marl_ppo.api",
    "TrainResult": "marl_ppo.run.loop",
    "GymnasiumTeamEnv": "marl_ppo.envs.adapters.gymnasium",
    "load_policy": "marl_ppo.export.policy",
}
"""Public names imported on first use (PEP 562), and their modules."""


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'marl_ppo' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
