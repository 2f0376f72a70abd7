"""Functions whose group parameter is named only by a string annotation through dotted aliases.

``tests/ranks/test_patching.py`` reads them with the package's rule and, in a rank, hands them
to the patch as if a future torch had added them to ``torch.distributed``. The parameter is
called ``handle`` so that only its annotation can tell that it takes a group, and the object
chain's last name is ``PG``, so that only looking the chain up (not reading its spelling) finds
``ProcessGroup`` behind it. No ``from __future__ import annotations``: the quotes are the
point.
"""

import typing
from types import SimpleNamespace

import torch.distributed as td

#: ``chain.b.c.PG`` is ``ProcessGroup`` under another name, three attributes deep.
chain = SimpleNamespace(b=SimpleNamespace(c=SimpleNamespace(PG=td.ProcessGroup, Other=int)))

assert typing  # named by a string annotation below


def through_module_alias(tensor, handle: "td.distributed_c10d.ProcessGroup" = None):
    """``td`` is ``torch.distributed``; ``td.distributed_c10d.ProcessGroup`` is the class."""
    return handle


def through_module_alias_union(tensor, handle: "td.distributed_c10d.ProcessGroup | None" = None):
    return handle


def through_object_chain(tensor, handle: "chain.b.c.PG" = None):
    """``chain.b.c.PG`` is ``ProcessGroup``; no part of the spelling says so."""
    return handle


def through_object_chain_in_a_union(tensor, handle: "typing.Union[chain.b.c.PG, None]" = None):
    return handle


def through_object_chain_on_the_right(tensor, handle: "int | chain.b.c.PG" = None):
    """The group on the right of a union: both sides are read."""
    return handle


def through_module_alias_last_in_a_union(
    tensor, handle: "typing.Union[int, td.distributed_c10d.ProcessGroup]" = None
):
    return handle


def not_a_group(tensor, handle: "chain.b.c.Other" = None):
    """The same chain, ending at ``int``: no group parameter."""
    return handle


#: Every function above that takes a group, by name.
TAKE_A_GROUP = (
    "through_module_alias",
    "through_module_alias_union",
    "through_object_chain",
    "through_object_chain_in_a_union",
    "through_object_chain_on_the_right",
    "through_module_alias_last_in_a_union",
)
