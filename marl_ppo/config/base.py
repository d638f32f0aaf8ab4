"""What every config section shares: strict dataclass settings, the positive number types and
`ConfigError`, the one-line error a bad value raises."""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field

from marl_ppo.faults import UserError

STRICT = ConfigDict(extra="forbid", use_attribute_docstrings=True)
"""Every section's settings: an unknown key is refused, and each field's docstring is its documentation."""

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


class ConfigError(UserError, ValueError):
    """A user-facing configuration problem; its message is one line naming the key and the fix."""

    __module__ = "marl_ppo.config"  # where users import it from, as tracebacks name it
