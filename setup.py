"""Builds the wheel so that it shares no file with PyPI's ``cycler`` (see _torch_cycler.py):
``cycler/__init__.py`` ships as ``cycler/_torch_cycler_init.py``, with ``torch_cycler.pth``
beside the packages. Editable installs keep the source tree as it is."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class SharedNameBuild(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        init = Path(self.build_lib, "cycler", "__init__.py")
        init.replace(init.with_name("_torch_cycler_init.py"))
        shutil.copy(Path(__file__).with_name("torch_cycler.pth"), self.build_lib)


setup(cmdclass={"build_py": SharedNameBuild})
