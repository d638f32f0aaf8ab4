"""marl_ppo: multi-agent PPO (MAPPO / IPPO) for PettingZoo environments."""

from marl_ppo.config import ExperimentConfig, load_config
from marl_ppo.envs.registry import make_env, register_env

__all__ = ["ExperimentConfig", "load_config", "make_env", "register_env"]
__version__ = "0.1.0"
