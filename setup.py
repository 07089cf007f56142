# SPDX-License-Identifier: MIT
"""setup.py — the build steps pyproject.toml cannot say: the package's
version is the C library's (the Makefile's VERSION), and building the
package builds the C core with the project's own Makefile and puts its
shared libraries inside the package, where libthrottle._capi looks first.

    pip install .            # from the top of a checkout
    pip wheel . -w dist/     # a wheel for machines of the same kind

The Makefile is run as `make B=<setuptools' build_temp>/c <libraries>`,
so a checkout's own build/ is left alone.  libthrottle.so.1 must build;
libthrottle-curl.so.1 (classification, Retry-After: libcurl, jansson,
zlib) and libthrottle-redis.so.1 (hiredis) are left out with a warning
when their headers are missing, unless LIBTHROTTLE_REQUIRE names them
(LIBTHROTTLE_REQUIRE=curl,redis: a missing one fails the build).  MAKE,
CC, CFLAGS and LDFLAGS from the environment are the Makefile's.

The wheel is tagged py3-none-<platform>: the package is ctypes over a C
library, so any CPython 3 of the platform loads it, but the libraries are
the platform's (they need the libc, libcurl, jansson and hiredis the
build machine had, by soname).

Rejected: compiling the sources from here as setuptools Extensions (the
Makefile is the one place that knows the flags, the version script and the
generated Lua strings; a second list of sources would drift), and a
Python extension module (the binding is ctypes on purpose: the standard
library only, one C API for every language).
"""

import os
import re
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

TOP = os.path.dirname(os.path.abspath(__file__))


def version():
    with open(os.path.join(TOP, "Makefile")) as f:
        m = re.search(r"^VERSION\s*:?=\s*(\S+)", f.read(), re.M)
    if m is None:
        sys.exit("setup.py: no VERSION in the Makefile")
    return m.group(1)


# (library, what it needs, name in LIBTHROTTLE_REQUIRE)
LIBRARIES = [
    ("libthrottle.so.1", "a C compiler and make", None),
    ("libthrottle-curl.so.1",
     "libcurl, jansson and zlib headers (Debian: libcurl4-openssl-dev "
     "libjansson-dev zlib1g-dev)", "curl"),
    ("libthrottle-redis.so.1",
     "the hiredis headers (Debian: libhiredis-dev)", "redis"),
]


class BuildWithCore(build_py):
    """build_py, then the C core into the package."""

    def run(self):
        super().run()
        required = set(filter(None, os.environ.get(
            "LIBTHROTTLE_REQUIRE", "").replace(",", " ").split()))
        out = os.path.abspath(os.path.join(self.get_finalized_command(
            "build").build_temp, "c"))
        dest = os.path.join(self.build_lib, "libthrottle")
        make = os.environ.get("MAKE", "make")
        jobs = "-j%d" % max(1, min(4, os.cpu_count() or 1))
        for lib, needs, name in LIBRARIES:
            cmd = [make, "--no-print-directory", "-C", TOP, jobs, "B=" + out,
                   os.path.join(out, lib)]
            print("building %s: %s" % (lib, " ".join(cmd)))
            rc = subprocess.call(cmd)
            if rc != 0:
                if name is None or name in required:
                    sys.exit("setup.py: building %s failed (it needs %s)"
                             % (lib, needs))
                print("WARNING: %s was not built (it needs %s); the package "
                      "works without it, see the README" % (lib, needs),
                      file=sys.stderr)
                continue
            # a copy, not the symlink make may have made beside it
            shutil.copyfile(os.path.join(out, lib), os.path.join(dest, lib))
            os.chmod(os.path.join(dest, lib), 0o755)


class PlatformDistribution(Distribution):
    """The wheel carries shared libraries: it is not pure Python."""

    def has_ext_modules(self):
        return True


cmdclass = {"build_py": BuildWithCore}
try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1: the wheel package's
    from wheel.bdist_wheel import bdist_wheel


class PlatformWheel(bdist_wheel):
    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        plat = super().get_tag()[2]
        return "py3", "none", plat


cmdclass["bdist_wheel"] = PlatformWheel

setup(version=version(), cmdclass=cmdclass, distclass=PlatformDistribution)
