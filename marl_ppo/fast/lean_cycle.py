"""PettingZoo's AEC-to-parallel wrapper, stepped without the observations it computes and discards."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from pettingzoo.utils.conversions import aec_to_parallel_wrapper


def lean_cycle(env: Any) -> Any:
    """`env` stepped by `LeanCycleParallel` where it is PettingZoo's AEC-to-parallel wrapper around a
    core that keeps AECEnv's own `last()`; any other env is returned as it is.

    The parallel wrapper's `step` calls `last()` before each agent's move, which computes that
    agent's observation and throws it away (3 of simple_spread's 6 observations per step, one per
    piston in pistonball). The trajectories stay identical provided `observe()` only reads the env,
    as PettingZoo's API describes it (tested for every catalog env that steps through the wrapper).
    """
    from pettingzoo.utils.env import AECEnv

    if type(env) is aec_to_parallel_wrapper and getattr(type(env.aec_env), "last", None) is AECEnv.last:
        env.__class__ = LeanCycleParallel  # in place: whatever else the factory set on the env object stays
    return env


class LeanCycleParallel(aec_to_parallel_wrapper):
    """PettingZoo's AEC-to-parallel wrapper whose `step` skips the discarded `last()` observations.

    Otherwise the same cycle, step for step: each live agent moves in turn, rewards are summed
    over the cycle's moves, the observations are read after the cycle, and agents that ended are
    then stepped out with `None`.
    """

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        aec = self.aec_env
        rewards: dict[str, float] = defaultdict(int)
        for agent in aec.agents:
            if agent != aec.agent_selection:
                raise AssertionError(
                    f"expected agent {agent} got agent {aec.agent_selection}; the parallel wrapper "
                    "expects agents to step in a cycle and to end only at the end of one"
                )
            aec.step(actions[agent])
            for other in aec.agents:
                rewards[other] += aec.rewards[other]
        terminations = dict(aec.terminations)
        truncations = dict(aec.truncations)
        infos = dict(aec.infos)
        observations = {agent: aec.observe(agent) for agent in aec.agents}
        while aec.agents and (aec.terminations[aec.agent_selection] or aec.truncations[aec.agent_selection]):
            aec.step(None)
        self.agents = aec.agents
        return observations, rewards, terminations, truncations, infos
