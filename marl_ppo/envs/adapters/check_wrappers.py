"""PettingZoo's assertion wrappers, removed where the adapter already guarantees what they check."""

from __future__ import annotations

from typing import Any

from pettingzoo.utils.conversions import aec_to_parallel_wrapper


def without_check_wrappers(env: Any) -> Any:
    """`env` without PettingZoo's order and action-bounds assertion wrappers around its AEC core.

    Catalog envs are usually `aec_to_parallel(OrderEnforcingWrapper(AssertOutOfBoundsWrapper(raw)))`.
    Those two wrappers only assert (reset before step, Discrete actions in range) and forward every
    attribute access through Python `__getattr__`. The adapter already guarantees both, so it steps
    the same core without them. Wrappers that change behaviour (e.g. clipping) and any other env are
    kept as they are.
    """
    from pettingzoo.utils.wrappers import AssertOutOfBoundsWrapper, OrderEnforcingWrapper

    if type(env) is not aec_to_parallel_wrapper:
        return env
    core = env.aec_env
    while isinstance(core, (OrderEnforcingWrapper, AssertOutOfBoundsWrapper)):
        core = core.env
    env.aec_env = core  # in place: whatever else the factory set on the env object stays
    return env
