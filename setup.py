"""Build hook: put reloadpg_autopatch.pth and .start at the root of site-packages.

No declarative setuptools option installs a file there (``data_files`` lands under the
prefix), so ``build_py`` copies both files next to the top-level package in ``build_lib``,
which a wheel installs into site-packages and ``pip uninstall`` removes through RECORD. A
PEP 660 editable install runs ``build_py`` in editable mode and packs only what the install
command's ``install_lib`` (the unpacked editable wheel) holds, so there the files go to
``install_lib``. All metadata is in setup.cfg, except the long description: the README with
its relative links made absolute under setup.cfg's ``url``, because the package index shows it
where no relative link resolves.
"""

import configparser
import os
import re
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT_FILES = ("reloadpg_autopatch.pth", "reloadpg_autopatch.start")


class build_py_with_site_files(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            target = self.get_finalized_command("install").install_lib
        else:
            target = self.build_lib
        os.makedirs(target, exist_ok=True)
        for name in ROOT_FILES:
            shutil.copyfile(name, os.path.join(target, name))

    def get_outputs(self, include_bytecode=1):
        outputs = super().get_outputs(include_bytecode)
        if not getattr(self, "editable_mode", False):
            outputs += [os.path.join(self.build_lib, name) for name in ROOT_FILES]
        return outputs


#: A Markdown link whose target is relative: no scheme (``https:``, ``mailto:``) and no
#: leading ``#`` (a heading of the README itself, which the index renders).
RELATIVE_LINK = re.compile(r"\]\((?![A-Za-z][A-Za-z0-9+.-]*:|#)([^)\s]+)\)")


def long_description():
    """README.md with every relative link made absolute: ``<url>/blob/main/<path>`` (code
    blocks are left as they are)."""
    config = configparser.ConfigParser()
    config.read("setup.cfg", encoding="utf-8")
    base = config["metadata"]["url"].rstrip("/") + "/blob/main/"
    with open("README.md", encoding="utf-8") as readme:
        lines = readme.read().split("\n")
    fenced = False
    for index, line in enumerate(lines):
        if line.strip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced:
            lines[index] = RELATIVE_LINK.sub(lambda link: f"]({base}{link.group(1)})", line)
    return "\n".join(lines)


setup(
    long_description=long_description(),
    cmdclass={"build_py": build_py_with_site_files},
)
