"""The env side: the registry and catalog of env ids, adapters, vector envs and VMAS.

`marl_ppo.envs.GymnasiumTeamEnv` wraps a Gymnasium env as a team (its home is `adapters.gymnasium`).
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "GymnasiumTeamEnv":  # imported on first use: gymnasium and pettingzoo are not light
        from marl_ppo.envs.adapters.gymnasium import GymnasiumTeamEnv

        return GymnasiumTeamEnv
    raise AttributeError(f"module 'marl_ppo.envs' has no attribute {name!r}")
