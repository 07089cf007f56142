# SPDX-License-Identifier: MIT
"""test_install.py — `make install` installs the package so that the
interpreter imports it from any directory with no environment, and the
package finds the installed libraries by itself; uninstall-python removes
it.  Installed into a
virtual environment (PREFIX=the venv): the system is left alone."""

import os
import subprocess
import sys

import pytest

from conftest import BUILD, TOP


def package_files():
    """The package's files as git has them, relative to python/libthrottle."""
    out = subprocess.run(["git", "-C", TOP, "ls-files", "python/libthrottle"],
                         stdout=subprocess.PIPE, text=True)
    files = [f[len("python/libthrottle/"):] for f in out.stdout.split()]
    if out.returncode != 0 or not files:  # not a git checkout
        top = os.path.join(TOP, "python", "libthrottle")
        files = [os.path.relpath(os.path.join(d, f), top)
                 for d, _, fs in os.walk(top) if "__pycache__" not in d
                 for f in fs if not f.endswith(".pyc")]
    return files


def make(target, prefix, py):
    """make TARGET for one interpreter, into PREFIX; its output on failure."""
    out = subprocess.run(["make", "--no-print-directory", "-C", TOP,
                          "B=" + BUILD, target, "PREFIX=" + prefix,
                          "PYTHONS=" + py],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout


def test_install_import_from_anywhere_without_environment(tmp_path):
    venv = str(tmp_path / "venv")
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip",
                           venv], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if made.returncode != 0:
        pytest.skip("no venv module: %s" % made.stdout.strip())
    py = os.path.join(venv, "bin", "python3")
    make("install", venv, py)
    code = ("import libthrottle, libthrottle._base as t; "
            "print(t._core._name); print(t._curl._name); "
            "print(libthrottle.classify(409, b'{\"error\": {\"code\": "
            "\"RESOURCE_LOCKED\"}}'))")
    run = subprocess.run([py, "-c", code], env={}, cwd="/",
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    assert run.returncode == 0, run.stderr
    core, curl, kind = run.stdout.split()
    assert core == os.path.join(venv, "lib", "libthrottle.so.1")
    assert curl == os.path.join(venv, "lib", "libthrottle-curl.so.1")
    assert kind == "locked"
    # every file of the package is there (a subdirectory's too)
    pkg = os.path.join(venv, "lib", "python%d.%d" % sys.version_info[:2],
                       "site-packages", "libthrottle")
    for f in package_files():
        assert os.path.exists(os.path.join(pkg, f)), f
    # and uninstall-python (part of `make uninstall`) takes it away again
    assert os.path.isdir(pkg)
    make("uninstall-python", venv, py)
    assert not os.path.exists(pkg)


def test_install_python_stays_inside_prefix_and_destdir(tmp_path):
    """make install-python with a PREFIX the interpreter does not search
    writes only beneath DESTDIR/PREFIX (it wrote into /usr/local, outside
    PREFIX, for Debian's python3), and says how to reach it."""
    stage = tmp_path / "stage"
    prefix = "/opt/libthrottle-test"
    out = subprocess.run(["make", "--no-print-directory", "-C", TOP,
                          "B=" + BUILD, "install-python", "DESTDIR=%s" % stage,
                          "PREFIX=" + prefix, "PYTHONS=" + sys.executable],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout
    files = [os.path.join(d, f) for d, _, fs in os.walk(str(stage))
             for f in fs]
    inside = str(stage) + prefix + "/lib/"
    assert files and all(f.startswith(inside) for f in files), files
    assert any(f.endswith("/libthrottle/py.typed") for f in files)
    assert any(f.endswith(".dist-info/METADATA") for f in files)
    assert "PYTHONPATH=" in out.stdout
