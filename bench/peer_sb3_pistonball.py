"""Stable-Baselines3's PPO on pistonball at the settings of PettingZoo's SB3 tutorial; prints env steps/s.

Runs in the sb3 peer's venv (`bench/peers.py`), never inside marl_ppo: it imports only
SB3, SuperSuit and PettingZoo. The tutorial's settings: 20 pistons, 25-cycle episodes, SuperSuit's
colour reduction (the blue channel), 84x84 resize and 3 stacked frames, every piston a slot of one
vector env (`pettingzoo_env_to_vec_env_v1`), 4 copies in 2 processes (`concat_vec_envs_v1`), and
PPO with `CnnPolicy`, n_steps 256, batch 256, 5 epochs and the tutorial's coefficients.

SB3 counts agent-steps (every piston is a slot), so the env steps printed are its `num_timesteps`
over the 20 pistons. Only `model.learn` is timed, not building the envs and the model.

    python peer_sb3_pistonball.py --env-steps 1024
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

PISTONS = 20
ENV_KWARGS = {
    "n_pistons": PISTONS,
    "time_penalty": -0.1,
    "continuous": True,
    "random_drop": True,
    "random_rotate": True,
    "ball_mass": 0.75,
    "ball_friction": 0.3,
    "ball_elasticity": 1.5,
    "max_cycles": 25,
}
PPO_KWARGS = {
    "gamma": 0.95,
    "n_steps": 256,
    "ent_coef": 0.0905168,
    "learning_rate": 0.00062211,
    "vf_coef": 0.042202,
    "max_grad_norm": 0.9,
    "gae_lambda": 0.99,
    "n_epochs": 5,
    "clip_range": 0.3,
    "batch_size": 256,
}


def result_record(agent_steps: int, seconds: float, piston_returns: list[float]) -> dict[str, object]:
    """The result line's fields: SB3's agent-steps as env steps (over the pistons), the time, the returns
    (per piston episode, and as a team return over the 20 pistons)."""
    piston_mean = sum(piston_returns) / len(piston_returns) if piston_returns else None
    return {
        "env_steps": agent_steps // PISTONS,
        "seconds": seconds,
        "agents": PISTONS,
        "agent_steps": agent_steps,
        "piston_return_mean": piston_mean,
        # every piston is paid its own reward: the team return is the sum over the 20 slots of an episode
        "team_return": None if piston_mean is None else piston_mean * PISTONS,
    }


def main() -> None:
    """Build the tutorial's vector env and PPO, time `learn` for the env steps asked, print the result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-steps", type=int, default=1024, help="rounded up to whole rollouts (1,024)")
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--cpus", type=int, default=2, help="processes stepping the copies")
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()

    import supersuit as ss  # type: ignore[import-not-found]
    from pettingzoo.butterfly import pistonball_v6
    from stable_baselines3 import PPO  # type: ignore[import-not-found]
    from stable_baselines3.common.utils import set_random_seed  # type: ignore[import-not-found]
    from stable_baselines3.common.vec_env import VecMonitor  # type: ignore[import-not-found]

    env = pistonball_v6.parallel_env(**ENV_KWARGS)
    env = ss.color_reduction_v0(env, mode="B")
    env = ss.resize_v1(env, x_size=84, y_size=84)
    env = ss.frame_stack_v1(env, 3)
    env.reset(seed=options.seed)
    vector = ss.pettingzoo_env_to_vec_env_v1(env)
    vector = ss.concat_vec_envs_v1(
        vector, options.copies, num_cpus=options.cpus, base_class="stable_baselines3"
    )
    vector = VecMonitor(vector)  # episode returns per piston slot, for `ep_info_buffer`
    set_random_seed(options.seed)  # PPO(seed=...) would call the vector env's seed(), which SuperSuit's lacks
    model = PPO("CnnPolicy", vector, verbose=0, **PPO_KWARGS)

    started = time.perf_counter()
    model.learn(total_timesteps=options.env_steps * PISTONS)
    seconds = time.perf_counter() - started
    returns = [float(episode["r"]) for episode in model.ep_info_buffer]  # the last 100 pistons' episodes
    print("PEER_RESULT " + json.dumps(result_record(model.num_timesteps, seconds, returns)), flush=True)


if __name__ == "__main__":
    # SuperSuit's env worker processes wait for commands until closed, and closing them can fail, so
    # the script leaves without waiting for them, after an error too.
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)
