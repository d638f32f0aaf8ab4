"""The NashConv of a league run's pool's average policy, as `marl-ppo eval` reports it beside the policy's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from marl_ppo.envs.spec import TeamSpec
from marl_ppo.eval.exploitability import pool_nash_conv
from marl_ppo.eval.from_checkpoint import PoolAverage
from marl_ppo.league.pool import Pool, pool_files, snapshot_name
from marl_ppo.league.sampling import latest_snapshots
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.settle import RunPlan


def pool_average(payload: dict[str, Any], plan: RunPlan, spec: TeamSpec, run_dir: Path) -> PoolAverage | None:
    """The pool average's NashConv of a league run (None for a run without a pool): over the snapshots
    the checkpoint lists, or for a policy-only file (`best.pt`, a pool snapshot) those in the run's
    pool taken up to its update; the latest `league.pool_size` of them, each weighted alike."""
    config = plan.config
    if config.league.opponents is None:
        return None
    league = payload.get("league")
    if league is not None:
        listed = [int(s) for s in league["pool"]["snapshots"]]
    else:
        listed = [s for s in pool_files(run_dir) if s <= int(payload.get("updates", 0))]
    snapshots = latest_snapshots(listed, config.league.pool_size)
    if not snapshots:
        return None
    names = [snapshot_name(s) for s in snapshots]
    present = set(pool_files(run_dir))
    missing = [snapshot_name(s) for s in snapshots if s not in present]
    if missing:
        return PoolAverage(names, None, missing)
    pool = Pool(run_dir, lambda: TeamModel(spec, config), plan.device, cache=len(snapshots))
    models = [pool.model(s) for s in snapshots]
    value = pool_nash_conv(models, [1.0] * len(models), config.env.id, config.env.kwargs)
    return PoolAverage(names, value, [])
