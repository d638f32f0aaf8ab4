"""The complete state of an env copy as bytes, so that a resumed run continues the very same episodes.

Gymnasium's and PettingZoo's envs inherit `EzPickle`, which pickles only the constructor's
arguments: unpickling builds a fresh env, not the one that was running. `dump_env_state` pickles
such objects by their whole `__dict__` instead (positions, step counters, the env's own
`np_random`). PettingZoo envs create pygame surfaces and fonts even when they never render; those
are saved as their pixels and their font file. The bytes are compressed (image spaces' bounds and
blank canvases shrink to almost nothing). Envs holding objects that cannot be pickled (C pointers,
simulator handles, classes defined inside functions), or that pickle without being restored
exactly (pymunk spaces lose their contact cache), raise `EnvStateError`; the caller then falls
back to reseeding.

Unpickling runs code named in the bytes: only load states that this process's own run wrote.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import sys
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from gymnasium.utils import EzPickle


class EnvStateError(RuntimeError):
    """An env copy's state cannot be pickled; the message says which object stopped it."""


def states_or_reason(dump: Callable[[], list[bytes]]) -> list[bytes] | str:
    """In a worker process: `dump()`'s states, or the reason they cannot be pickled. That is not a
    failure of the worker (the parent falls back), so it travels as a reply, not as an error."""
    try:
        return dump()
    except EnvStateError as err:
        return str(err)


def gathered_states(replies: Sequence[list[bytes] | str]) -> list[bytes]:
    """In the parent: the workers' `states_or_reason` replies flattened in worker order; raises
    EnvStateError with the first worker's reason when any could not pickle its envs."""
    states: list[bytes] = []
    for reply in replies:
        if isinstance(reply, str):
            raise EnvStateError(reply)
        states.extend(reply)
    return states


def _restore_dict(obj: Any, state: dict[str, Any]) -> None:
    """State setter that bypasses EzPickle's `__setstate__` (which would rebuild a fresh object)."""
    obj.__dict__.update(state)


class _StatePickler(pickle.Pickler):
    """A pickler that saves EzPickle objects by their full state instead of their constructor arguments."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, EzPickle) and hasattr(obj, "__dict__"):
            # copyreg.__newobj__ (pickle's NEWOBJ opcode) is missing from typeshed's copyreg stub
            newobj = copyreg.__newobj__  # type: ignore[attr-defined]
            return newobj, (type(obj),), obj.__dict__, None, None, _restore_dict
        pymunk = sys.modules.get("pymunk")
        if pymunk is not None and isinstance(obj, pymunk.Space):
            raise pickle.PicklingError(
                "a pymunk.Space pickles without its contact cache, so a restored one would step differently"
            )
        return _pygame_reduction(obj) or NotImplemented


def _pygame_reduction(obj: Any) -> tuple[Any, tuple[Any, ...]] | None:
    """How to rebuild a pygame Surface (same format and pixels) or freetype Font (same file and size)."""
    pygame = sys.modules.get("pygame")  # never imported here: only envs that use pygame hold its objects
    if pygame is None:
        return None
    if isinstance(obj, pygame.Surface):
        layout = (obj.get_size(), obj.get_flags(), obj.get_bitsize(), obj.get_masks())
        return _rebuild_surface, (layout, obj.get_buffer().raw)
    freetype = sys.modules.get("pygame.freetype")
    if freetype is not None and isinstance(obj, freetype.Font) and obj.path:
        return _rebuild_font, (obj.path, obj.size)
    return None


def _rebuild_surface(layout: tuple[Any, ...], pixels: bytes) -> Any:
    import pygame

    size, flags, depth, masks = layout
    surface = pygame.Surface(size, flags, depth, masks)
    surface.get_buffer().write(pixels)
    return surface


def _rebuild_font(path: str, size: float) -> Any:
    import pygame.freetype

    if not pygame.freetype.get_init():
        pygame.freetype.init()
    return pygame.freetype.Font(path, size)


def dump_env_state(obj: Any) -> bytes:
    """Pickle `obj` (an adapter or a simulator) with its complete state, compressed, or raise EnvStateError."""
    buffer = io.BytesIO()
    try:
        _StatePickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    except Exception as err:  # pickle raises PicklingError, TypeError, ValueError, AttributeError...
        raise EnvStateError(f"{type(err).__name__}: {err}") from None
    return zlib.compress(buffer.getbuffer(), 1)


REMOVED_CLASSES = {
    ("marl_ppo.fast.lean_cycle", "LeanCycleParallel"): (
        "pettingzoo.utils.conversions",
        "aec_to_parallel_wrapper",
    ),
}
"""Classes that states written by an earlier marl_ppo name and that are gone -> the class that takes
their place. The lean AEC cycle was PettingZoo's AEC-to-parallel wrapper with another `step` (the
same trajectories), swapped onto the env object, so a run checkpointed with it resumes on the
wrapper itself."""


class _StateUnpickler(pickle.Unpickler):
    """An unpickler that reads an earlier marl_ppo's states: a removed class is read as its stand-in."""

    def find_class(self, module: str, name: str) -> Any:
        module, name = REMOVED_CLASSES.get((module, name), (module, name))
        return super().find_class(module, name)


def load_env_state(blob: bytes) -> Any:
    """Rebuild an object pickled by `dump_env_state` (runs code: trusted, self-written bytes only)."""
    return _StateUnpickler(io.BytesIO(zlib.decompress(blob))).load()
