"""What torch's own ``ProcessGroup`` class learns once the program holds torch's objects.

Behind a wrapper a group is a handle: ``copy.copy``/``copy.deepcopy`` give the group itself
(Megatron deep-copies configs that hold groups). The ways that keep torch's own object (in
place, suspend) hand the program torch's class, which cannot be copied (``cannot pickle
ProcessGroup``) until it is taught the same. Teaching torch's classes is the patching layer's
job (``patching.classes.copy_as_handle``), and this layer never imports it: the patch registers
its lesson here when it lands (``when_handed``), and the lifecycle says when the first group
that keeps torch's object is handed out (``handed``: at its creation, or WORLD's
registration). Until then torch's class is left as torch made it, as in wrapper mode always.
"""

from __future__ import annotations

from collections.abc import Callable

#: What the patching layer asked to do once torch's objects are handed out (each idempotent).
_LESSONS: list[Callable[[], None]] = []
#: Whether this process has handed one out (a forked child inherits it with the taught class).
_HANDED: list[bool] = [False]


def when_handed(lesson: Callable[[], None]) -> None:
    """Run ``lesson`` when the lifecycle first hands out torch's own group object (now, if it
    has already); registering the same lesson again changes nothing."""
    if lesson not in _LESSONS:
        _LESSONS.append(lesson)
    if _HANDED[0]:
        lesson()


def handed() -> None:
    """The lifecycle hands the program a group that keeps torch's own object."""
    _HANDED[0] = True
    for lesson in tuple(_LESSONS):
        lesson()
