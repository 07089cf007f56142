# SPDX-License-Identifier: MIT
"""test_pypi_install.py — the package as pip users get it: `pip install
<checkout>` into a fresh venv builds the C core into the package, and
`pip wheel` makes a wheel that installs into another fresh venv and works
there with no checkout, no `make install` and no environment, from
another directory; its metadata version is the C library's.  pip fetches
the build backend pyproject.toml pins (build isolation), so this runs in
the PyPI venv only."""

import os
import re
import subprocess
import sys

from conftest import TOP, pypi_only
from test_install import package_files

pypi_only()

USE = r'''
import importlib.metadata, os, sys
import libthrottle as L, libthrottle._base as b
here = os.path.dirname(L.__file__)
assert b._core._name == os.path.join(here, "libthrottle.so.1"), b._core._name
assert b._curl._name == os.path.join(here, "libthrottle-curl.so.1")
assert os.path.exists(os.path.join(here, "libthrottle-redis.so.1"))
assert os.path.exists(os.path.join(here, "py.typed"))
assert os.path.exists(os.path.join(here, "_boot", "sitecustomize.py"))
assert not here.startswith(sys.argv[1])  # not the checkout's
for f in sys.argv[3].split(","):  # every file of the package
    assert os.path.exists(os.path.join(here, f)), f
t = L.Throttle(segment=sys.argv[2])
t.backoff("hotdata:ws1/orders", 5)
assert 4 < t.remaining("hotdata:ws1/orders") <= 5 and t.shared
assert L.classify(409, b'{"error": {"code": "RESOURCE_LOCKED"}}') == "locked"
t.close()
L.unlink(sys.argv[2])
print(importlib.metadata.version("libthrottle"), L.version())
'''


def run(cmd, env=None, **kw):
    # never the suite's PYTHONPATH: pip would take the checkout's package
    # (and a build's egg-info beside it) for an installed one
    env = dict(os.environ if env is None else env)
    env.pop("PYTHONPATH", None)
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT,
                         text=True, timeout=900, **kw)
    assert out.returncode == 0, "%s\n%s" % (" ".join(cmd), out.stdout[-4000:])
    return out.stdout


def fresh_venv(path):
    run(["/usr/bin/python3", "-m", "venv", str(path)])
    return os.path.join(str(path), "bin", "python")


def makefile_version():
    with open(os.path.join(TOP, "Makefile")) as f:
        return re.search(r"^VERSION\s*:?=\s*(\S+)", f.read(), re.M).group(1)


def use(py, tmp_path, name):
    seg = "/tt-py-pip-%d-%s" % (os.getpid(), name)
    env = {"PATH": "/usr/bin:/bin"}  # no LIBTHROTTLE_*, no PYTHONPATH
    try:
        return run([py, "-c", USE, TOP, seg, ",".join(package_files())],
                   cwd=str(tmp_path), env=env)
    finally:
        if os.path.exists("/dev/shm" + seg):
            os.unlink("/dev/shm" + seg)


def test_pip_install_checkout_builds_the_core_into_the_package(tmp_path):
    py = fresh_venv(tmp_path / "a")
    env = dict(os.environ, LIBTHROTTLE_REQUIRE="curl,redis")
    run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check",
         TOP], env=env)
    meta, lib = use(py, tmp_path, "a").split()
    assert meta == lib == makefile_version()


def test_pip_wheel_installs_and_works_without_the_checkout(tmp_path):
    builder = fresh_venv(tmp_path / "builder")
    dist = tmp_path / "dist"
    env = dict(os.environ, LIBTHROTTLE_REQUIRE="curl,redis")
    run([builder, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
         "--no-deps", "-w", str(dist), TOP], env=env)
    wheels = os.listdir(str(dist))
    assert len(wheels) == 1 and re.match(
        r"libthrottle-%s-py3-none-linux_\w+\.whl$" % re.escape(
            makefile_version()), wheels[0]), wheels
    py = fresh_venv(tmp_path / "b")
    run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "--no-index", str(dist / wheels[0])])
    meta, lib = use(py, tmp_path, "b").split()
    assert meta == lib == makefile_version()
