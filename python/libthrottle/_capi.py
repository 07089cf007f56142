# SPDX-License-Identifier: MIT
"""_capi.py — the C library as ctypes sees it: where the shared libraries
are found, and every prototype the package calls, declared once, here.

The prototypes are written below as C declarations, copied from
include/throttle.h and include/throttle_curl.h, and turned into ctypes
argtypes/restype by a small type table.  tests/python/test_capi.py reads
both headers and fails when a declaration here differs from the header's,
or when a function of throttle.h is missing here: a changed signature
cannot drift into a wrong ctypes call (a missing restype alone truncates
a pointer to an int and crashes later).

Finding the libraries (the first that exists wins; all are named in the
ImportError otherwise):
  1. $LIBTHROTTLE_LIBRARY, the path of libthrottle.so.1 (libthrottle-curl
     is then looked for next to it, or at $LIBTHROTTLE_CURL_LIBRARY); when
     set, nothing else is tried;
  2. the package's own directory: `pip install` / a wheel put the
     libraries there (setup.py);
  3. a built checkout: build/ at the top of the tree this package sits in
     (PYTHONPATH=python from the top after `make`);
  4. the library directory `make install` recorded in _installed.py;
  5. the dynamic loader's own search (ld.so.cache, LD_LIBRARY_PATH).
The Redis module (libthrottle-redis.so.1) is the C library's to find: it
looks beside the libthrottle.so.1 it was loaded from first.
libthrottle.so.1 is loaded first, by path: libthrottle-curl.so.1 needs it
by soname, and the loader then uses the copy already loaded instead of
searching for another one (so no rpath and no LD_LIBRARY_PATH are needed).

Rejected: ctypes.util.find_library("throttle") (it runs ldconfig or gcc,
finds nothing in a checkout or before ldconfig has run, and returns a name,
not a path); parsing the installed header at import time (headers are not
always installed next to the library; the test does it instead).

libthrottle-curl (classification, Retry-After) is optional at import: a
build without libcurl still gives the core API, and the functions that need
it raise ImportError naming what was looked for.
"""

import ctypes
import os
import re

CORE_SONAME = "libthrottle.so.1"
CURL_SONAME = "libthrottle-curl.so.1"

# ---- the prototypes ---------------------------------------------------------

# Every function of throttle.h, as declared there.
CORE_DECLS = """
unsigned throttle_version(void);
const char *throttle_version_string(void);
const char *throttle_strerror(int err);
const char *throttle_err_name(int err);
throttle_config_t *throttle_config_new(void);
void throttle_config_free(throttle_config_t *cfg);
int throttle_config_set_segment(throttle_config_t *cfg, const char *name);
int throttle_config_set_capacity(throttle_config_t *cfg, uint32_t keys);
int throttle_config_set_max_delay(throttle_config_t *cfg, uint64_t ms);
int throttle_config_set_lock_timeout(throttle_config_t *cfg, uint32_t ms);
int throttle_config_set_lease(throttle_config_t *cfg, uint32_t ms);
int throttle_config_set_flags(throttle_config_t *cfg, unsigned flags);
int throttle_config_set_backend(throttle_config_t *cfg, const char *url);
int throttle_config_set_interrupt(throttle_config_t *cfg,
                                  int (*check)(void *arg), void *arg,
                                  uint32_t period_ms);
int throttle_open(const throttle_config_t *cfg, throttle_t **out);
void throttle_close(throttle_t *h);
int throttle_is_shared(const throttle_t *h);
const char *throttle_segment_name(const throttle_t *h);
const char *throttle_backend(const throttle_t *h);
int throttle_backend_status(const throttle_t *h, int *up, uint64_t *down_ms,
                            uint64_t *served);
const char *throttle_errmsg(const throttle_t *h);
int throttle_unlink(const char *segment_name);
int throttle_backoff(throttle_t *h, const char *key, uint64_t delay_ms);
int throttle_remaining(throttle_t *h, const char *key, uint64_t *ms_left);
int throttle_wait(throttle_t *h, const char *key, uint64_t timeout_ms);
int throttle_clear(throttle_t *h, const char *key);
int throttle_reset(throttle_t *h);
int throttle_enter(throttle_t *h, const char *key, throttle_class_t cls,
                   uint64_t timeout_ms, throttle_ticket_t **ticket);
int throttle_try_enter(throttle_t *h, const char *key, throttle_class_t cls,
                       throttle_ticket_t **ticket, uint64_t *wait_ms);
int throttle_ticket_is_probe(const throttle_ticket_t *ticket);
int throttle_leave(throttle_t *h, throttle_ticket_t *ticket,
                   throttle_outcome_t outcome, uint64_t retry_after_ms);
int throttle_requeue(throttle_t *h, throttle_ticket_t **ticket,
                     throttle_outcome_t outcome, uint64_t retry_after_ms,
                     uint64_t timeout_ms);
int throttle_set_max_parallel(throttle_t *h, const char *key, uint32_t n);
int throttle_set_publish_level(throttle_t *h, throttle_outcome_t outcome,
                               int level);
int throttle_check_key(const char *key);
int throttle_set_max_parallel_auto(throttle_t *h, const char *key,
                                   uint32_t max);
int throttle_set_rate(throttle_t *h, const char *key, uint32_t n,
                      uint64_t period_ms);
int throttle_set_backfill_share(throttle_t *h, const char *key,
                                double share);
int throttle_pause(throttle_t *h, const char *key);
int throttle_resume(throttle_t *h, const char *key);
int throttle_cancel(throttle_t *h, const char *key);
int throttle_set_segment_max_delay(throttle_t *h, uint64_t ms);
int throttle_segment_max_delay(throttle_t *h, uint64_t *ms);
const char *throttle_field_name(throttle_field_t f);
const char *throttle_info_key(const throttle_info_t *info);
int64_t throttle_info_get(const throttle_info_t *info, throttle_field_t f);
int throttle_info_holder(const throttle_info_t *info, size_t i, int64_t *pid,
                         int64_t *age_ms, throttle_class_t *cls, int *probe);
const char *throttle_info_holder_host(const throttle_info_t *info,
                                      size_t i);
int throttle_info_waiter(const throttle_info_t *info, size_t i, int64_t *pid,
                         int64_t *age_ms, throttle_class_t *cls);
const char *throttle_info_waiter_host(const throttle_info_t *info,
                                      size_t i);
int throttle_info_refusal(const throttle_info_t *info, int *http_status,
                          const char **code, const char **message,
                          const char **retry_after, int64_t *at_ms,
                          int64_t *pid, const char **host);
int throttle_note_refusal(throttle_t *h, const char *key, int http_status,
                          const char *code, const char *message,
                          const char *retry_after);
int throttle_info(throttle_t *h, const char *key, throttle_info_t **out);
void throttle_info_free(throttle_info_t *info);
int throttle_foreach(throttle_t *h,
                     int (*fn)(const throttle_info_t *info, void *arg),
                     void *arg);
int throttle_stats(throttle_t *h, uint32_t *capacity, uint32_t *used,
                   uint64_t *evictions, uint64_t *repairs);
"""

# Functions of throttle.h that a library built from an older tree may lack:
# the package works without them (see _throttle.py) and says so.
OPTIONAL = frozenset([
    "throttle_config_set_interrupt",
])

# The part of throttle_curl.h the package uses (the perform loop and its
# result need a CURL handle; Python sends with urllib or requests instead).
CURL_DECLS = """
int throttle_parse_retry_after(const char *value, time_t now, uint64_t *ms);
int throttle_curl_policy_new(throttle_curl_policy_t **out);
void throttle_curl_policy_free(throttle_curl_policy_t *p);
int throttle_curl_policy_set_locked_codes(throttle_curl_policy_t *p,
                                          const char *const *codes, size_t n);
int throttle_classify(const throttle_curl_policy_t *policy, long status,
                      const char *body, size_t len,
                      throttle_outcome_t *outcome, char *code,
                      size_t code_len);
"""

# ---- C declarations to ctypes ----------------------------------------------

_SCALARS = {
    "void": None,
    "int": ctypes.c_int,
    "unsigned": ctypes.c_uint,
    "long": ctypes.c_long,
    "double": ctypes.c_double,
    "size_t": ctypes.c_size_t,
    "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64,
    "int64_t": ctypes.c_int64,
    # glibc: time_t is a long on every ABI the library builds for
    "time_t": ctypes.c_long,
}
_ENUMS = ("throttle_class_t", "throttle_outcome_t", "throttle_field_t",
          "throttle_curl_status_t")

_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\*|\(|\)|,|\[|\]")


def tokens(text):
    return _TOKEN.findall(text)


def _split_params(toks):
    """Split a parameter token list at the commas outside parentheses."""
    out, cur, depth = [], [], 0
    for t in toks:
        if t == "," and depth == 0:
            out.append(cur)
            cur = []
            continue
        depth += t == "("
        depth -= t == ")"
        cur.append(t)
    if cur:
        out.append(cur)
    return out


def _is_word(t):
    return t[0].isalpha() or t[0] == "_"


def _strip_name(toks):
    """A parameter without its name: ['const', 'char', '*', 'key'] ->
    ['const', 'char', '*'];  a function pointer keeps its shape."""
    if "(" in toks:  # int (*fn)(args): drop the name after '*'
        i = toks.index("(")
        inner = [t for t in toks[i + 1:toks.index(")", i)] if t == "*"]
        rest = toks[toks.index(")", i) + 1:]
        args = _split_params(rest[1:-1])
        return (toks[:i] + ["("] + inner + [")", "("] +
                _join_params([_strip_name(a) for a in args]) + [")"])
    if len(toks) > 1 and _is_word(toks[-1]) and toks[-1] not in _SCALARS \
            or (len(toks) > 1 and toks[-2] == "*" and _is_word(toks[-1])):
        return toks[:-1]
    return toks


def _join_params(params):
    out = []
    for p in params:
        if out:
            out.append(",")
        out.extend(p)
    return out


def parse_decls(text, marker=None):
    """C declarations -> {name: (return type, [parameter types])}, each
    type a normalised string ("const char *", "int ( * ) ( void * )").
    With a marker (a header's export macro), only the statements that
    carry it count, from its last occurrence on (so that macros and
    typedefs before a declaration are skipped)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    out = {}
    for stmt in text.split(";"):
        if marker is not None:
            if marker not in stmt:
                continue
            stmt = stmt[stmt.rindex(marker) + len(marker):]
        toks = tokens(stmt)
        if "(" not in toks:
            continue
        i = toks.index("(")
        if i < 2 or not _is_word(toks[i - 1]):
            continue
        name, ret = toks[i - 1], " ".join(toks[:i - 1])
        depth, j = 0, i
        for j in range(i, len(toks)):
            depth += toks[j] == "("
            depth -= toks[j] == ")"
            if depth == 0:
                break
        params = [" ".join(_strip_name(p))
                  for p in _split_params(toks[i + 1:j])]
        if params == ["void"]:
            params = []
        out[name] = (ret, params)
    return out


def ctype_of(ctype):
    """The ctypes type for a normalised C type string."""
    t = ctype.split()
    if "(" in t:  # function pointer: ret ( * ) ( args )
        i = t.index("(")
        args = _split_params(t[t.index(")") + 2:-1])
        argtypes = [ctype_of(" ".join(a)) for a in args if a != ["void"]]
        return ctypes.CFUNCTYPE(ctype_of(" ".join(t[:i])), *argtypes)
    base = [w for w in t if w not in ("const", "*")]
    stars = t.count("*")
    if stars == 0:
        if len(base) == 1 and base[0] in _ENUMS:
            return ctypes.c_int
        if len(base) == 1 and base[0] in _SCALARS:
            return _SCALARS[base[0]]
        raise TypeError("no ctypes type for %r" % ctype)
    if base == ["char"] and stars == 1:
        # const char * is a string in and out; a writable char * is a
        # buffer the callee fills (create_string_buffer)
        return ctypes.c_char_p if t[0] == "const" else ctypes.POINTER(
            ctypes.c_char)
    if base == ["char"] and stars == 2:
        return ctypes.POINTER(ctypes.c_char_p)
    if stars == 1 and base[0] in _ENUMS:
        return ctypes.POINTER(ctypes.c_int)
    if stars == 1 and base[0] in _SCALARS and base[0] != "void":
        return ctypes.POINTER(_SCALARS[base[0]])
    if stars == 1:
        return ctypes.c_void_p  # an opaque object (or void *)
    if stars == 2:
        return ctypes.POINTER(ctypes.c_void_p)  # an opaque object, out
    raise TypeError("no ctypes type for %r" % ctype)


def _declare(lib, decls, optional=()):
    missing = []
    for name, (ret, params) in parse_decls(decls).items():
        fn = getattr(lib, name, None)
        if fn is None:
            if name in optional:
                missing.append(name)
                continue
            raise ImportError("%s has no %s(): it is older than this "
                              "package" % (lib._name, name))
        fn.restype = ctype_of(ret)
        fn.argtypes = [ctype_of(p) for p in params]
    return missing


# ---- finding the libraries -------------------------------------------------

_HERE = os.path.dirname(os.path.abspath(__file__))


def _candidates(soname, env):
    """Where to look for soname, in order."""
    given = os.environ.get(env)
    if given:
        return [given]  # named: that one or none, never a surprise
    core = os.environ.get("LIBTHROTTLE_LIBRARY")
    if core and env != "LIBTHROTTLE_LIBRARY":
        return [os.path.join(os.path.dirname(core), soname)]
    out = [os.path.join(_HERE, soname)]  # inside the package (pip, wheel)
    # a built checkout: python/libthrottle/ -> the top of the tree
    out.append(os.path.join(os.path.dirname(os.path.dirname(_HERE)),
                            "build", soname))
    try:
        from . import _installed  # written by `make install`
        out.append(os.path.join(_installed.LIBDIR, soname))
    except ImportError:
        pass
    out.append(soname)  # the dynamic loader's own search
    return out


def _load(soname, env):
    tried = []
    for path in _candidates(soname, env):
        if os.sep in path and not os.path.exists(path):
            tried.append(path + " (absent)")
            continue
        try:
            return ctypes.CDLL(path), tried
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    return None, tried


def load():
    """(core CDLL, curl CDLL or None, what was tried for curl, optional
    functions the core lacks)."""
    core, tried = _load(CORE_SONAME, "LIBTHROTTLE_LIBRARY")
    if core is None:
        raise ImportError(
            "libthrottle: cannot load %s; looked at: %s.  Build it (make), "
            "install it (make install), or set LIBTHROTTLE_LIBRARY to its "
            "path." % (CORE_SONAME, "; ".join(tried)))
    missing = _declare(core, CORE_DECLS, OPTIONAL)
    curl, curl_tried = _load(CURL_SONAME, "LIBTHROTTLE_CURL_LIBRARY")
    if curl is not None:
        _declare(curl, CURL_DECLS)
    return core, curl, curl_tried, missing
