"""The worker pool both process pools run on: replies in order, failures and hangs stop every worker."""

import time

import pytest

from marl_ppo.envs.adapters.contract import EnvContractError
from marl_ppo.envs.vector.pool import RemoteTraceback, WorkerPool, context
from marl_ppo.faults import WorkerError


class _Echo:
    """A handler that answers `(worker, argument)`, raises on 'fail' and 'breach', and sleeps on 'sleep'."""

    def __init__(self, worker: int) -> None:
        self.worker = worker

    def __call__(self, command, argument):
        if command == "fail" and self.worker == argument:
            raise ValueError(f"worker {self.worker}\nbroke")
        if command == "breach" and self.worker == argument:
            raise EnvContractError("copy 1 broke the contract")
        if command == "sleep" and self.worker == argument:
            time.sleep(30)
        return self.worker, argument


def _pool(num_workers: int) -> WorkerPool:
    args = [(k,) for k in range(num_workers)]
    return WorkerPool("Owner", context(None), _Echo, args, "marl_ppo-test-worker", None, "the limit")


def test_replies_come_in_worker_order_and_a_closed_pool_refuses_commands():
    pool = _pool(3)
    try:
        assert pool.ask("echo", ["a", "b", "c"]) == [(0, "a"), (1, "b"), (2, "c")]
        pool.send("echo", [1, 2, 3])
        assert pool.gather("echo") == [(0, 1), (1, 2), (2, 3)]
    finally:
        pool.close()
    assert not pool.alive and not any(p.is_alive() for p in pool.processes)
    with pytest.raises(RuntimeError, match="Owner is closed"):
        pool.ask("echo", [None] * 3)


def test_a_failure_in_a_worker_stops_every_worker_and_names_it():
    pool = _pool(3)
    with pytest.raises(
        WorkerError, match=r"^Owner: worker 1 failed during 'fail': ValueError: worker 1 broke$"
    ) as info:
        pool.ask("fail", [1] * 3)
    assert isinstance(info.value.__cause__, RemoteTraceback)
    assert not pool.alive and not any(p.is_alive() for p in pool.processes)


def test_a_contract_error_in_a_worker_is_raised_as_such():
    pool = _pool(2)
    with pytest.raises(EnvContractError, match=r"^copy 1 broke the contract$"):
        pool.ask("breach", [1] * 2)
    assert not pool.alive


def test_a_worker_that_does_not_answer_in_time_stops_the_pool():
    """The limit is per step: a command of two steps may take twice `timeout_s`."""
    pool = _pool(2)
    pool.timeout_s = 0.25  # only now: a loaded machine may take longer to start the workers
    pool.send("sleep", [0] * 2)
    with pytest.raises(
        WorkerError, match=r"worker 0 \(pid \d+\) did not answer 'sleep' within 0.5 s \(the limit\)"
    ):
        pool.gather("sleep", steps=2)  # the pool's own limit ends the wait; the message names it
    assert not any(p.is_alive() for p in pool.processes)
