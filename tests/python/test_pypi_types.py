# SPDX-License-Identifier: MIT
"""test_pypi_types.py — the package's type hints as a user's type checker
reads them: `mypy --strict` passes on a small program that uses the public
API (the error classes, Throttle, AsyncThrottle, request, classifiers,
the results' types) and fails on one that misuses it.  The package's own
modules are read as an installed package's are (errors in them are not
the user's: follow_imports = silent for libthrottle)."""

import os
import subprocess
import sys
import textwrap

from conftest import TOP, pypi_only

pypi_only()

GOOD = '''
import asyncio
import datetime
from typing import Any, Optional

import libthrottle
from libthrottle import AsyncThrottle, Outcome, Throttle


def classifier(status: int, headers: Any, body: bytes) -> Optional[str]:
    return "locked" if status == 423 else None


def load(t: Throttle, data: bytes) -> int:
    try:
        with t.admit("hotdata:ws1/orders", timeout=datetime.timedelta(
                seconds=30)) as adm:
            out: Outcome = adm.report(200, {"Retry-After": "1"}, b"{}",
                                      classifier=classifier)
            return 0 if out.retry_after is None else int(out.retry_after)
    except libthrottle.ETIMEDOUT as e:
        code: int = e.code
        return code
    except libthrottle.ENOKEY:
        return -1


def hint(t: Throttle) -> float:
    adm, wait = t.try_admit("k", hint=True)
    if adm is not None:
        adm.leave("ok")
    plain: Optional[libthrottle.Admission] = t.try_admit("k")
    del plain
    return wait


async def main(at: AsyncThrottle) -> bool:
    async with at.admit("k", timeout=5) as adm:
        adm.leave("ok")
    return await at.wait("k", timeout=1.5)


def fetch() -> bytes:
    status, headers, body = libthrottle.request(
        "k", "http://127.0.0.1:9/x", data=b"x", classifier=classifier)
    left: float = Throttle().remaining("k")
    kind: str = libthrottle.classify(status, body)
    del headers, left, kind
    return body


if __name__ == "__main__":
    print(load(Throttle(), b"x"), asyncio.run(main(AsyncThrottle())))
'''

BAD = '''
import libthrottle

t = libthrottle.Throttle()
t.remaining(5)
x: str = t.wait("k")
libthrottle.ETIMEDOUT_TYPO
'''


def mypy(tmp_path, source):
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(source))
    cfg = tmp_path / "mypy.ini"
    cfg.write_text("[mypy]\n[mypy-libthrottle.*]\nfollow_imports = silent\n")
    env = dict(os.environ, MYPYPATH=os.path.join(TOP, "python"))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "--cache-dir", str(tmp_path / "cache"), "--config-file", str(cfg),
         str(prog)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env=env, cwd=str(tmp_path), timeout=600)


def test_types_mypy_strict_passes_on_a_user_program(tmp_path):
    out = mypy(tmp_path, GOOD)
    assert out.returncode == 0, out.stdout


def test_types_mypy_strict_catches_misuse(tmp_path):
    out = mypy(tmp_path, BAD)
    assert out.returncode == 1, out.stdout
    assert 'Argument 1 to "remaining"' in out.stdout
    assert 'Incompatible types in assignment' in out.stdout
    assert 'ETIMEDOUT_TYPO' in out.stdout
