# SPDX-License-Identifier: MIT
"""test_errors.py — one exception class per C error code, made from the
C table, carrying the code, its name and the handle's message."""

import pickle

import pytest

import libthrottle
from libthrottle import _base


def test_errors_one_class_per_code_of_the_c_table():
    names = []
    code = -1
    while True:
        name = _base._text(_base._core.throttle_err_name(code))
        if name == "THROTTLE_UNKNOWN":
            break
        names.append((code, name))
        code -= 1
    assert len(names) >= 22  # ... through THROTTLE_EINTR
    assert len(libthrottle.ERRORS) == len(names)
    for code, name in names:
        cls = libthrottle.ERRORS[code]
        assert cls.code == code and cls.name == name
        assert cls.__name__ == name[len("THROTTLE_"):]
        assert getattr(libthrottle, cls.__name__) is cls
        assert issubclass(cls, libthrottle.Error)
        assert cls.description == _base._text(
            _base._core.throttle_strerror(code))


def test_errors_python_kinds():
    assert issubclass(libthrottle.EINVAL, ValueError)
    assert issubclass(libthrottle.EKEY, ValueError)
    assert issubclass(libthrottle.ETIMEDOUT, TimeoutError)
    assert libthrottle.EINTR.code == -22


def test_errors_carry_the_handle_message(t):
    with pytest.raises(libthrottle.EKEY) as e:
        t.backoff(b"x" * 256, 1)
    assert e.value.code == -3 and e.value.name == "THROTTLE_EKEY"
    assert "more than 255 bytes" in str(e.value)  # the C message


@pytest.mark.parametrize("key,why", [
    ("ws1//orders", "empty name"), ("/ws1", "empty name"),
    ("ws1/", "empty name"), ("ws1/or\tders", "control byte"),
    ("/".join("s%d" % i for i in range(18)), "THROTTLE_KEY_MAX_SCOPES")])
def test_errors_key_syntax_is_the_libraries(t, key, why):
    for call in (lambda: t.backoff(key, 1), lambda: t.remaining(key),
                 lambda: t.wait(key, 0)):
        with pytest.raises(libthrottle.EKEY) as e:
            call()
        assert why in str(e.value)


def test_errors_unknown_code_is_still_an_error():
    e = libthrottle.error(-999)
    assert type(e) is libthrottle.Error and e.code == -999
    assert "-999" in str(e)


def test_errors_pickle_across_processes():
    e = libthrottle.EFULL("key table is full: /seg")
    f = pickle.loads(pickle.dumps(e))
    assert type(f) is libthrottle.EFULL and str(f) == str(e)
    g = pickle.loads(pickle.dumps(libthrottle.GaveUp("x", 409)))
    assert isinstance(g, libthrottle.GaveUp)


def test_errors_written_out_as_the_header_has_them():
    """The classes a type checker sees are written in _errors.py: every
    code of include/throttle.h's table has its class there, same value."""
    import os
    import re
    from libthrottle import _errors
    from conftest import TOP
    with open(os.path.join(TOP, "include", "throttle.h")) as f:
        table = re.findall(r"XX\((E[A-Z]+), (-\d+),", f.read())
    assert len(table) >= 25
    for name, code in table:
        cls = _errors.WRITTEN.get(name)
        assert cls is not None, "%s is not written out in _errors.py" % name
        assert cls.code == int(code) and cls.name == "THROTTLE_" + name
        assert libthrottle.ERRORS[int(code)] is cls
    assert set(_errors.WRITTEN) == {n for n, _ in table}


def test_errors_enokey_is_a_key_error(t):
    with pytest.raises(KeyError) as e:
        t.info("never-seen")
    assert isinstance(e.value, libthrottle.ENOKEY)
    assert str(e.value) and not str(e.value).startswith("'")  # not repr'd


def test_errors_closed_throttle_has_its_own_exception(segment):
    th = libthrottle.Throttle(segment=segment)
    th.close()
    with pytest.raises(libthrottle.ThrottleClosed):
        th.remaining("k")
    assert issubclass(libthrottle.ThrottleClosed, libthrottle.EINVAL)
