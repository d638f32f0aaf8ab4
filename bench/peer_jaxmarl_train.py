"""JaxMARL's own training script, from a JaxMARL checkout, compiled and run once; prints env steps/s.

Runs with the Python the user names for JaxMARL's baselines (their packages: `jaxmarl[algs]`),
never inside marl_ppo. It imports the script's `make_train` from the checkout (nothing of it is
copied here), loads the script's own config file, sets `TOTAL_TIMESTEPS`, starts wandb disabled
(the script logs through it every update), and times `jax.jit(make_train(config))` in two parts:
lowering and compiling for one seed's key, then the compiled call until its results are ready.
One seed is trained, as marl_ppo trains one; the scripts' `main` may vmap several.

    python peer_jaxmarl_train.py --repo JAXMARL_CHECKOUT --script baselines/IPPO/ippo_ff_mpe.py \
        --config baselines/IPPO/config/ippo_ff_mpe.yaml --total-timesteps 204800
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any


def load_script(path: Path) -> Any:
    """The training script as a module, its folder importable (a script may import its neighbours)."""
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    """Compile the script's `train` for one seed, run it, print the result line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True, help="a JaxMARL checkout")
    parser.add_argument("--script", required=True, help="the training script, inside the checkout")
    parser.add_argument("--config", required=True, help="the script's config file, inside the checkout")
    parser.add_argument("--total-timesteps", type=int, required=True, help="env steps of the run")
    options = parser.parse_args()

    import jax
    import wandb
    from omegaconf import OmegaConf  # type: ignore[import-not-found]

    script = load_script(options.repo / options.script)
    config = OmegaConf.to_container(OmegaConf.load(options.repo / options.config))
    config["TOTAL_TIMESTEPS"] = options.total_timesteps
    config["WANDB_MODE"] = "disabled"
    wandb.init(mode="disabled")
    key = jax.random.PRNGKey(config["SEED"])
    train = jax.jit(script.make_train(config))  # make_train sets NUM_UPDATES and NUM_ACTORS
    started = time.perf_counter()
    compiled = train.lower(key).compile()
    compile_seconds = time.perf_counter() - started
    started = time.perf_counter()
    jax.block_until_ready(compiled(key))
    seconds = time.perf_counter() - started
    record = {
        "env_steps": int(config["NUM_UPDATES"] * config["NUM_STEPS"] * config["NUM_ENVS"]),
        "seconds": seconds,
        "agents": int(config["NUM_ACTORS"] // config["NUM_ENVS"]),
        "compile_seconds": compile_seconds,
    }
    print("PEER_RESULT " + json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
