"""The settings that decide a refusal, compared across ranks once per world, before any creation.

Each rank decides alone how a group is made and whether it is refused, from its own settings:
the mode (``suspend`` and ``native`` refuse a group their one way cannot take), the NCCL
variables suspend depends on (``NCCL_CUMEM_ENABLE=0`` on one node), and whether a framework's
lifecycle is adopted (an adopting rank's registration creates one group more). Where one rank's
settings differ, it refuses or creates where its peers do not, and from there the ranks'
creations no longer line up: the others block in torch's next group creation, which waits the
group's own timeout (30 minutes on gloo), or their first collective finds the peer gone.

So at the world's first registration or group creation, which every rank reaches as it reaches
``new_group``, every rank publishes those settings in one store round (bounded by WORLD's
timeout), and where they differ so that a refusal or a creation could diverge, every rank
raises the same ``ModeRefusedError`` naming each setting that differs with its values and
ranks, before anything is created. The verdict is kept for the world: later creations read it
and cost nothing. A rank where the package is not active (the gate off there) never takes part:
its peers name it within WORLD's timeout.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ... import _env
from ...errors import ModeRefusedError, PeerMissingError, format_ranks
from .. import mode, process
from ..agreement import merge_by_rank, ranks_of
from ..stepping import threaded_world
from ..store import channel
from ..ways import MODES as WAYS_OF_MODE
from ..ways.suspend.capability import VARIABLES as NCCL_VARIABLES

#: The mode whose one way depends on NCCL's variables.
SUSPEND = "suspend"

#: What the error of a rank that never took part adds.
NOT_ACTIVE = (
    "; a rank where reloadpg_autopatch is not active never takes part in this round, the first "
    f"of a world: the gate ({_env.GATE}) unset or off there, or the package not installed in "
    "its interpreter. Give every rank the same environment (the runtime_env of every node)"
)


def _adopting() -> str:
    """Whether this rank adopts a framework's lifecycle (``SLIME_RELOADABLE_PG_ADOPT``; a value
    not understood adopts nothing, as the adoption itself reads it)."""
    try:
        return "on" if _env.parse_adopt(os.environ.get(_env.ADOPT_ENV)) else "off"
    except ValueError:
        return "off"


def local() -> dict[str, str]:
    """This rank's settings that decide a refusal ("" for a variable unset)."""
    settings = {_env.MODE_ENV: mode.get_reload_mode(), _env.ADOPT_ENV: _adopting()}
    settings.update({name: os.environ.get(name, "").strip() for name in NCCL_VARIABLES})
    return settings


def _strict(name: str) -> bool:
    """A mode with one way, which refuses a group that way cannot take (not the wrapper's)."""
    return len(WAYS_OF_MODE.get(name, ())) == 1 and name != "wrapper"


def _merge(entries: list[bytes]) -> bytes:
    """Only the settings whose values differ, with the ranks of each value."""
    differ = merge_by_rank([(rank, json.loads(entry)) for rank, entry in enumerate(entries)])
    return json.dumps(differ, separators=(",", ":")).encode()


def _shown(variable: str, value: str, ranks: list[int]) -> str:
    setting = f"{variable}={value}" if value else f"{variable} unset"
    return f"{setting} on ranks {format_ranks(ranks)}"


def refusal(differ: dict[str, Any], mine: dict[str, str]) -> str | None:
    """Why the settings that differ make the ranks' creations diverge (None: they do not).

    Adoption differing always does (the adopting ranks' registration creates a group more); a
    mode, where some rank's mode refuses (``suspend``, ``native``); an NCCL variable, where
    some rank is in ``suspend`` mode. Other differences (``auto`` beside ``wrapper``, NCCL's
    variables outside suspend mode) are taken up by the destroy's agreement.
    """
    modes = set(differ.get(_env.MODE_ENV, {mine[_env.MODE_ENV]: None}))
    why = []
    if _env.ADOPT_ENV in differ:
        why.append("a framework's lifecycle adopted on some ranks only creates a group more there")
    if _env.MODE_ENV in differ and any(_strict(m) for m in modes):
        strict = sorted(m for m in modes if _strict(m))
        why.append(f"mode {', '.join(strict)} refuses a group its one way cannot take")
    nccl = sorted(name for name in NCCL_VARIABLES if name in differ)
    if SUSPEND in modes and nccl:
        why.append(f"in suspend mode {', '.join(nccl)} decide(s) whether a group can suspend")
    if not why:
        return None
    shown = "; ".join(
        ", ".join(_shown(name, value, ranks_of(r)) for value, r in sorted(values.items()))
        for name, values in sorted(differ.items())
    )
    return (
        f"the ranks' settings differ: {shown}. The ranks would create or refuse groups "
        f"differently ({'; '.join(why)}), and their creations would no longer line up: nothing "
        "was created on any rank. Give every rank the same environment (the mode, "
        f"{_env.ADOPT_ENV} and NCCL's variables in the runtime_env of every node)"
    )


def agree_once(call: str) -> None:
    """Compare the settings across ranks once per world (at ``call``); raise the refusal every
    rank raises where they differ, now and at every later call in this world."""
    holder = process.current()
    world = holder.world
    if world.settings_error is not None:
        raise world.settings_error.with_traceback(None)
    if world.settings_agreed or holder.in_parents_world or threaded_world():
        return
    mine = local()
    world.settings_agreed = True  # one round per world, whatever it gives
    try:
        merged = channel.agree("world", "settings", json.dumps(mine).encode(), _merge)
    except PeerMissingError as error:
        world.settings_error = PeerMissingError(
            f"{call}: {error}{NOT_ACTIVE if error.missing else ''}", error.missing, error.step
        )
        raise world.settings_error from error
    with channel.agreed_outcome():
        why = refusal(json.loads(merged), mine)
        if why is not None:
            world.settings_error = ModeRefusedError(f"{call}: {why}")
            raise world.settings_error


def forget(world: process.World) -> None:
    """A new world compares its settings again."""
    world.settings_agreed = False
    world.settings_error = None
