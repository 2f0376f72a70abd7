"""The choice of way from what a backend answers, never from its name or class (issue 31).

torch 2.15's plain ``nccl`` is nccl2 (``ProcessGroupNCCL2``), which supports ``reconfigure``; so
no decision may key on a backend's class or name. NCCL cannot run on CPU: the backends and
groups here are plain objects that answer what torch's would (their NCCL version getters,
``wrapped_pg``, ``supports_reconfigure``), named to mislead a check that reads names. What
``nccl`` resolves to is a table of torch's own rule per version (read from its source), and
torch's ``split_group`` is read to show where every split passes.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
import torch.distributed as dist

from reloadpg_autopatch.groups.ways import inplace
from reloadpg_autopatch.groups.ways import suspend as suspended
from reloadpg_autopatch.tools.doctor import implementations

CAN_RECONFIGURE = inplace.torch_can_reconfigure()


def _versioned(name: str, version: tuple[int, ...]) -> Any:
    """A backend class called ``name`` whose NCCL getters answer ``version``."""

    def getter() -> tuple[int, ...]:
        return version

    body = {
        "get_build_nccl_version": staticmethod(getter),
        "get_runtime_nccl_version": staticmethod(getter),
    }
    return type(name, (), body)()


def test_an_old_nccl_is_refused_whatever_the_backend_class_is_called() -> None:
    """A backend that answers NCCL 2.28 is refused even when its class says nothing of NCCL
    (a vendor's plugin, a renamed class), and one that answers 2.30 is taken even when it is
    called ProcessGroupNCCL2."""
    refusal = suspended.version_refusal(_versioned("VendorCollectives", (2, 28, 0)))
    assert "2.29.7" in str(refusal), refusal
    assert suspended.version_refusal(_versioned("ProcessGroupNCCL2", (2, 30, 7))) is None


class _Group:
    """A native group as ``in_place_refusal`` reads it: its devices, backends and answer."""

    def __init__(self, backend: Any, supports: bool) -> None:
        self._device_types = [torch.device("cpu")]
        self._backend = backend
        self.supports_reconfigure = supports

    def _get_backend(self, device: Any) -> Any:
        return self._backend


@pytest.mark.skipif(not CAN_RECONFIGURE, reason="torch 2.13 has no ProcessGroup.reconfigure")
def test_in_place_asks_the_backend_not_its_class() -> None:
    """A backend called ``_ProcessGroupWrapper`` that wraps nothing and reconfigures is taken
    in place; one that wraps another backend (``wrapped_pg``, as torch's debug wrapper has) is
    refused, naming TORCH_DISTRIBUTED_DEBUG, whatever it is called; one that answers
    ``supports_reconfigure=False`` is refused without a claim about which NCCL does (torch
    2.15's ``nccl`` does reconfigure)."""
    misleading = type("_ProcessGroupWrapper", (), {})()
    assert inplace.in_place_refusal(_Group(misleading, True)) is None
    wrapping = type("DebugChecks", (), {"wrapped_pg": object()})()
    refusal = inplace.in_place_refusal(_Group(wrapping, True))
    assert "TORCH_DISTRIBUTED_DEBUG" in str(refusal), refusal
    refusal = inplace.in_place_refusal(_Group(type("ProcessGroupNCCL2", (), {})(), False))
    assert "supports_reconfigure" in str(refusal), refusal
    assert "nccl does not" not in str(refusal), refusal


@pytest.mark.parametrize(
    ("version", "value", "means"),
    [
        ("2.13.0", None, "classic"),
        ("2.14.1", None, "classic"),
        ("2.14.1", "0", "classic"),
        ("2.14.1", "true", "classic"),
        ("2.14.1", "1", "nccl2"),
        ("2.15.0", None, "nccl2"),
        ("2.15.0+cu132", "1", "nccl2"),
        ("2.15.0", "false", "nccl2"),
        ("2.15.0", "0", "classic"),
        ("2.16.0a0", None, "nccl2"),
    ],
)
def test_what_nccl_means_per_torch_and_variable(version: str, value: str, means: str) -> None:
    """torch's rule (``_register_builtin_nccl_backend``): 2.14 takes nccl2 for exactly "1",
    2.15 the classic backend for exactly "0"."""
    assert implementations.predicted(version, value) == means
    assert implementations.predicted(version, "1", has_nccl2=False) == "classic"


def test_the_implementation_is_what_the_backend_answers() -> None:
    """``name()`` decides ("nccl" is the classic backend's answer, also under nccl-legacy);
    the class only where ``name()`` does not answer; the debug wrapper is looked through."""

    def backend(cls: str, name: str | None) -> Any:
        body = {} if name is None else {"name": lambda self: name}
        return type(cls, (), body)()

    assert implementations.implementation(backend("Renamed", "nccl2")) == "nccl2"
    assert implementations.implementation(backend("Anything", "nccl")) == "classic"
    assert implementations.implementation(backend("ProcessGroupNCCLLazy", None)) == "nccl-lazy"
    wrapper = type("_ProcessGroupWrapper", (), {"wrapped_pg": backend("X", "nccl2")})()
    assert implementations.implementation(wrapper) == "nccl2"
    assert implementations.implementation(backend("ProcessGroupGloo", "gloo")) == "gloo"


def test_every_split_group_call_ends_in_the_method_the_package_guards() -> None:
    """torch's ``split_group()`` (which DeviceMesh binds by name) splits by calling
    ``ProcessGroup.split_group`` on the parent: the class attribute the package replaces."""
    from torch.distributed import distributed_c10d as c10d

    source = inspect.getsource(inspect.unwrap(c10d.split_group))
    assert "parent_pg.split_group(" in source
    assert hasattr(dist.ProcessGroup, "split_group")
