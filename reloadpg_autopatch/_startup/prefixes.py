"""What ``SLIME_RELOADABLE_PG_REBIND`` means: the one parser for the start-up watcher and the sweep.

It imports nothing, so the start-up layer can read the variable before torch exists.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not loaded at start-up; type checkers read this name
if TYPE_CHECKING:
    from collections.abc import Iterable

DEFAULT_PREFIXES: tuple[str, ...] = ("megatron",)


def parse_prefixes(prefixes: str | Iterable[str] | None) -> tuple[str, ...]:
    """Normalise a prefix spec: None (the default), ``"*"``, ``"a,b"`` or an iterable of names."""
    if prefixes is None:
        return DEFAULT_PREFIXES
    items = prefixes.split(",") if isinstance(prefixes, str) else list(prefixes)
    out = []
    for raw in items:
        if not isinstance(raw, str):
            raise TypeError(
                "rebind prefixes must be module names (str), '*' or a comma-separated "
                f"string; got {raw!r}"
            )
        item = raw.strip()
        if not item:
            continue
        if item != "*" and not all(part.isidentifier() for part in item.split(".")):
            raise ValueError(
                f"rebind prefix {item!r} is not a module name; use dotted names like "
                "'megatron' or 'megatron.core', or '*' for every module"
            )
        out.append(item)
    if not out:
        raise ValueError("rebind prefixes are empty; use module names such as 'megatron', or '*'")
    return tuple(out)
