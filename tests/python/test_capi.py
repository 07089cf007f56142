# SPDX-License-Identifier: MIT
"""test_capi.py — the prototypes in libthrottle/_capi.py are the headers'
own, the library is found as documented, and import needs nothing but the
standard library."""

import ctypes
import os
import shutil
import subprocess
import sys

import pytest

from conftest import TOP, child_env

from libthrottle import _capi


def header(name):
    with open(os.path.join(TOP, "include", name)) as f:
        return _capi.parse_decls(f.read(), "THROTTLE_EXTERN")


def test_capi_core_declarations_are_the_header_s():
    ours = _capi.parse_decls(_capi.CORE_DECLS)
    theirs = header("throttle.h")
    assert sorted(ours) == sorted(theirs), \
        "declared here but not in throttle.h, or the reverse: %s" % (
            sorted(set(ours) ^ set(theirs)))
    for name in theirs:
        assert ours[name] == theirs[name], name


def test_capi_curl_declarations_are_the_header_s():
    ours = _capi.parse_decls(_capi.CURL_DECLS)
    theirs = header("throttle_curl.h")
    assert ours, "no curl declarations"
    for name in ours:
        assert name in theirs, name
        assert ours[name] == theirs[name], name


def test_capi_parser_sees_every_exported_function():
    # the parser must not silently skip a declaration it cannot read: count
    # the THROTTLE_EXTERN statements by hand
    for name in ("throttle.h", "throttle_curl.h"):
        with open(os.path.join(TOP, "include", name)) as f:
            text = f.read()
        n = text.count("THROTTLE_EXTERN ") - text.count(
            "#define THROTTLE_EXTERN ")
        assert len(header(name)) == n, name


def test_capi_every_pointer_return_has_a_pointer_restype():
    import libthrottle._base as base
    for decls, lib in ((_capi.CORE_DECLS, base._core),
                       (_capi.CURL_DECLS, base._curl)):
        for name, (ret, params) in _capi.parse_decls(decls).items():
            fn = getattr(lib, name)
            assert fn.restype == _capi.ctype_of(ret), name
            assert len(fn.argtypes) == len(params), name
            if "*" in ret:
                assert fn.restype in (ctypes.c_char_p, ctypes.c_void_p), name


def test_capi_ctype_of_rejects_unknown_types():
    with pytest.raises(TypeError):
        _capi.ctype_of("struct foo")
    assert _capi.ctype_of("throttle_class_t") is ctypes.c_int
    assert _capi.ctype_of("const char * const *") == ctypes.POINTER(
        ctypes.c_char_p)


def _copy_package(tmp_path):
    """The package alone, away from any built checkout."""
    dst = tmp_path / "site"
    shutil.copytree(os.path.join(TOP, "python", "libthrottle"),
                    str(dst / "libthrottle"),
                    ignore=shutil.ignore_patterns("__pycache__",
                                                  "_installed.py"))
    return str(dst)


def test_capi_library_named_by_environment(tmp_path):
    site = _copy_package(tmp_path)
    lib = os.environ.get("LIBTHROTTLE_LIBRARY") or os.path.join(
        TOP, "build", _capi.CORE_SONAME)
    env = child_env(LIBTHROTTLE_LIBRARY=lib, PYTHONPATH=site)
    out = subprocess.run(
        [sys.executable, "-c", "import libthrottle, libthrottle._base as t;"
         "print(t._core._name, t._curl._name)"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    core, curl = out.stdout.split()
    assert core == lib
    assert curl == os.path.join(os.path.dirname(lib), _capi.CURL_SONAME)


def test_capi_missing_library_is_a_clear_import_error(tmp_path):
    site = _copy_package(tmp_path)
    env = child_env(LIBTHROTTLE_LIBRARY=str(tmp_path / "nowhere.so.1"),
                    PYTHONPATH=site)
    env.pop("LD_LIBRARY_PATH", None)
    out = subprocess.run([sys.executable, "-c", "import libthrottle"],
                         env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         cwd=str(tmp_path))
    # named and absent: an error, not a library found elsewhere
    assert out.returncode != 0
    assert "ImportError" in out.stderr
    assert "nowhere.so.1" in out.stderr  # names what it looked for
    assert "LIBTHROTTLE_LIBRARY" in out.stderr  # and how to point at it


def test_capi_built_checkout_found_without_environment(tmp_path):
    # PYTHONPATH=python from the top after `make`: no LIBTHROTTLE_LIBRARY
    if not os.path.exists(os.path.join(TOP, "build", _capi.CORE_SONAME)):
        pytest.skip("no build/ at the top of the tree")
    env = child_env(PYTHONPATH=os.path.join(TOP, "python"))
    env.pop("LIBTHROTTLE_LIBRARY", None)
    out = subprocess.run(
        [sys.executable, "-c", "import libthrottle._base as t;"
         "print(t._core._name)"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == os.path.join(TOP, "build",
                                              _capi.CORE_SONAME)


def test_capi_import_needs_only_the_standard_library(tmp_path):
    # -S: no site-packages at all; -I: no user site, no PYTHON* variables
    lib = os.environ.get("LIBTHROTTLE_LIBRARY") or os.path.join(
        TOP, "build", _capi.CORE_SONAME)
    code = ("import sys; sys.path.insert(0, %r); import libthrottle; "
            "print(libthrottle.classify(409, b'{\"error\": {\"code\": "
            "\"RESOURCE_LOCKED\"}}'))" % os.path.join(TOP, "python"))
    out = subprocess.run([sys.executable, "-S", "-I", "-c", code],
                         env={"LIBTHROTTLE_LIBRARY": lib},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "locked"
