"""BenchMARL's MAPPO on PettingZoo's simple_spread at the bench's shared settings; prints env steps/s.

Runs in the benchmarl peer's venv (`bench/peers.py`), never inside marl_ppo: it imports
only BenchMARL and its dependencies. Settings: 3 agents, 25-cycle episodes, discrete actions, 800
frames a batch from 32 env copies, 10 epochs of minibatches of 200 (4 a batch), lr 1e-3, gamma
0.95, one torch thread, no evaluation, loggers or checkpoints, and MLPs of the widths asked for the
actor and the critic (BenchMARL's own default is 256x256). Everything else is BenchMARL's default.

A BenchMARL frame is one env step of all agents. Only `Experiment.run` is timed, not building it.

    python peer_benchmarl_spread.py --frames 24000 --hidden 64 64
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

AGENTS = 3


def main() -> None:
    """Build BenchMARL's MAPPO experiment on simple_spread, time its run, print the result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=24_000, help="env steps, a multiple of 800")
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 256], help="MLP widths")
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from benchmarl.algorithms import MappoConfig  # type: ignore[import-not-found]
    from benchmarl.environments import PettingZooTask  # type: ignore[import-not-found]
    from benchmarl.experiment import Experiment, ExperimentConfig  # type: ignore[import-not-found]
    from benchmarl.models.mlp import MlpConfig  # type: ignore[import-not-found]

    with tempfile.TemporaryDirectory() as folder:
        config = ExperimentConfig.get_from_yaml()
        settings = {
            "max_n_frames": options.frames,
            "on_policy_collected_frames_per_batch": 800,
            "on_policy_n_envs_per_worker": 32,
            "on_policy_n_minibatch_iters": 10,
            "on_policy_minibatch_size": 200,
            "lr": 1e-3,
            "gamma": 0.95,
            "prefer_continuous_actions": False,
            "evaluation": False,
            "render": False,
            "loggers": [],
            "create_json": False,
            "checkpoint_interval": 0,
            "checkpoint_at_end": False,
            "save_folder": folder,
        }
        for key, value in settings.items():
            setattr(config, key, value)
        task = PettingZooTask.SIMPLE_SPREAD.get_from_yaml()
        task.config.update({"max_cycles": 25, "N": AGENTS})
        actor, critic = MlpConfig.get_from_yaml(), MlpConfig.get_from_yaml()
        actor.num_cells = critic.num_cells = list(options.hidden)
        experiment = Experiment(
            task=task,
            algorithm_config=MappoConfig.get_from_yaml(),
            model_config=actor,
            critic_model_config=critic,
            seed=options.seed,
            config=config,
        )
        started = time.perf_counter()
        experiment.run()
        seconds = time.perf_counter() - started
        record = {"env_steps": int(experiment.total_frames), "seconds": seconds, "agents": AGENTS}
    print("PEER_RESULT " + json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
