"""The learning-rate schedule: the factor on both configured learning rates at each update.

`linear` decays it from 1 to 0 over `total_steps`. A resumed run that changes `total_steps` keeps
the factor it had reached at the resume point and spreads the rest of the decay linearly over the
new remaining steps, so the learning rate does not jump; checkpoints carry the schedule for that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class LrSchedule:
    """Factor on the learning rates after `steps` env steps: constant 1, or linear down to 0 at total_steps.

    A linear schedule that was re-spread on resume runs from `start_scale` at env step `start_step`
    to 0 at `total_steps`; one that never was has start_step 0 and start_scale 1.
    """

    kind: Literal["constant", "linear"]
    total_steps: int
    start_step: int = 0
    start_scale: float = 1.0

    def scale(self, steps: int) -> float:
        """The factor for an update that starts after `steps` env steps."""
        if self.kind == "constant":
            return 1.0
        if self.start_step == 0:  # a straight run: 1 - steps/total, the same floats as ever
            return max(0.0, 1.0 - steps / self.total_steps)
        remaining = (self.total_steps - steps) / (self.total_steps - self.start_step)
        return max(0.0, self.start_scale * remaining)

    def resumed(self, total_steps: int, at_step: int) -> LrSchedule:
        """This schedule continued at env step `at_step` (< total_steps) to a run of `total_steps`."""
        if total_steps == self.total_steps:
            return self
        return LrSchedule(self.kind, total_steps, at_step, self.scale(at_step))

    def state_dict(self) -> dict[str, Any]:
        """Primitives for the checkpoint."""
        return asdict(self)

    @classmethod
    def from_checkpoint(cls, payload: Mapping[str, Any]) -> LrSchedule:
        """The schedule a checkpoint ran with."""
        return cls(**payload["lr_schedule"])
