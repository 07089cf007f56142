# SPDX-License-Identifier: MIT
"""sitecustomize.py — put on the PYTHONPATH of a program started by
`python -m libthrottle.run`: instruments it with the rules the launcher
left in LIBTHROTTLE_RULES, then runs the sitecustomize this one hides
(the interpreter's own, Debian's for instance), so nothing else changes."""

import importlib
import os
import sys


def _chain():
    here = os.path.dirname(os.path.abspath(__file__))
    mine = sys.modules.pop("sitecustomize", None)
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path
                   if os.path.abspath(p or ".") != here]
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved
        if mine is not None:
            sys.modules["sitecustomize"] = mine


try:
    from libthrottle.instrument import _from_environment
    _from_environment()
except Exception as e:  # never keep the program from starting
    sys.stderr.write("libthrottle.run: not instrumented: %s: %s\n"
                     % (type(e).__name__, e))
_chain()
