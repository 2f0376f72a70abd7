"""Which signal the watchdog's backstop sends, by what the program did with SIGABRT.

The backstop fires while a stuck call holds the GIL, so a Python handler for SIGABRT could
never run and the process would hang: then it must be SIGKILL. The whole path (a real stuck
rank ended by the backstop) is ``tests/ranks/test_faults_watchdog.py``; this checks the choice
for each state of SIGABRT's handler in a second, against the ``signal`` module's own values.
"""

from __future__ import annotations

import signal

import pytest

from reloadpg_autopatch.groups import watchdog


@pytest.fixture
def sigabrt():
    saved = signal.getsignal(signal.SIGABRT)
    yield
    signal.signal(signal.SIGABRT, saved)


@pytest.mark.usefixtures("sigabrt")
@pytest.mark.parametrize(
    ("handler", "want"),
    [
        (signal.SIG_DFL, signal.SIGABRT),  # the default: ends the process, faulthandler dumps
        (signal.SIG_IGN, signal.SIGKILL),  # ignored: SIGABRT would do nothing
        (lambda signum, frame: None, signal.SIGKILL),  # a Python handler: never runs in time
    ],
    ids=["default", "ignored", "python-handler"],
)
def test_the_backstop_sends_sigkill_where_sigabrt_would_not_end_the_process(handler, want):
    signal.signal(signal.SIGABRT, handler)
    assert watchdog._backstop_signal() == int(want)
