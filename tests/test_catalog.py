"""Every catalog id has an experiment file and trains one update (skipped, with the reason, where its extra
is missing)."""

from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from marl_ppo.config import load_config
from marl_ppo.envs.factory import team_spec
from marl_ppo.envs.registry import registered_specs
from marl_ppo.eval.versus import sides_of
from marl_ppo.run.loop import train

CATALOG = [spec for spec in registered_specs() if spec.family != "envs"]
ONE_UPDATE = [
    "vector=sync",
    "num_envs=2",
    "rollout_steps=16",
    "total_steps=32",
    "log.progress=false",
    "eval_every=0",  # the evaluations' scores are tested in test_evaluate.py and test_versus.py
    "ppo.train_pi_iters=1",
    "ppo.train_vf_iters=1",
    "ppo.num_minibatches=1",
]


def _experiments() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / "experiments").rglob("*.yaml")):
        env_id = (yaml.safe_load(path.read_text()).get("env") or {}).get("id")
        found.setdefault(env_id, path)
    return found


def test_every_catalog_id_has_an_experiment_file():
    missing = [spec.id for spec in CATALOG if spec.id not in _experiments()]
    assert not missing, f"no experiments/*.yaml for {missing}"


@pytest.mark.parametrize("spec", CATALOG, ids=lambda spec: spec.id)
def test_catalog_env_trains_one_update(spec, tmp_path):
    if not spec.installed:
        pytest.skip(
            f"{spec.id}: missing {', '.join(spec.missing_modules)} (pip install 'marl-ppo[{spec.extra}]')"
        )
    config = load_config(_experiments()[spec.id], ONE_UPDATE)
    if load_config(_experiments()[spec.id]).eval_vs_random is not None:  # its sides exist in the env
        assert len(sides_of(team_spec(config), load_config(_experiments()[spec.id]).eval_vs_random)) >= 2
    result = train(config, tmp_path)
    assert result.updates == 1 and result.env_steps == 32
    assert (tmp_path / "checkpoints/final.pt").is_file()
