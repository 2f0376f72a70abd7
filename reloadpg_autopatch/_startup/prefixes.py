"""Where the ``SLIME_RELOADABLE_PG_REBIND`` parser used to live; it is in ``_env`` now.

Kept so that ``from reloadpg_autopatch._startup.prefixes import parse_prefixes`` goes on working.
"""

from .._env import DEFAULT_PREFIXES, parse_prefixes

__all__ = ["DEFAULT_PREFIXES", "parse_prefixes"]
