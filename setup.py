"""Build glue for the one thing setup.cfg cannot say: install ddpwatch-startup.pth at the root of site-packages.

The .pth line is what makes `DDPWATCH=1 torchrun ...` work with no change to the user's code (see
ddpwatch/bootstrap). It must land next to the packages, not under the package and not in the data scheme, for
both `pip install .` (a wheel: build_lib's root is the wheel's root) and `pip install -e .` (PEP 660: setuptools
builds an editable wheel whose root is `install.install_lib`, where it also writes scripts and data).
"""

import os

from setuptools import Command, setup
from setuptools.command.build import build

PTH = "ddpwatch-startup.pth"
SOURCE = PTH  # next to _ddpwatch_startup.py, the module its one line imports


class build_pth(Command):
    """Put ddpwatch-startup.pth at the root of the wheel, editable or not."""

    description = "install ddpwatch's start-up .pth file at the root of site-packages"
    user_options = []

    def initialize_options(self):
        self.build_lib = None
        self.editable_mode = False

    def finalize_options(self):
        self.set_undefined_options("build_py", ("build_lib", "build_lib"))

    def _target_dir(self):
        if self.editable_mode:  # the editable wheel's root; build_lib is thrown away in this mode
            return self.get_finalized_command("install").install_lib
        return self.build_lib

    def run(self):
        target = self._target_dir()
        self.mkpath(target)
        self.copy_file(SOURCE, os.path.join(target, PTH), preserve_mode=False)

    def get_outputs(self):
        return [] if self.editable_mode else [os.path.join(self.build_lib, PTH)]

    def get_output_mapping(self):
        return {} if self.editable_mode else {os.path.join(self.build_lib, PTH): SOURCE}

    def get_source_files(self):
        return [SOURCE]


class build_with_pth(build):
    sub_commands = build.sub_commands + [("build_pth", None)]


setup(cmdclass={"build": build_with_pth, "build_pth": build_pth})
