"""What the tests share: rank starting, venvs, stand-in backends and programs (one home each)."""

from pathlib import Path

#: The checkout the tests run from.
ROOT = Path(__file__).resolve().parent.parent.parent
#: Programs the tests run as scripts or modules (ray drivers, stand-ins of a framework).
PROGRAMS = Path(__file__).resolve().parent / "programs"
