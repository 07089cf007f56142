# SPDX-License-Identifier: MIT
"""redis_lean.py SOCKET SRCDIR [CASES [SEED]] -- the lean path against the
whole script, on a real redis-server (tests/test_redis_lean.sh starts it).

Loads the scripts of SRCDIR (libthrottle/redis) as three Functions
libraries: the enter and leave scripts as they are (their lean path
first), the same with the lean path taken out (the whole script
decides every call), and one that only says whether the lean path would
answer.  Each library reads Redis's clock from the key lean:clock, so
that the same call at the same instant can be made twice.  Then, for
CASES random states of a key and its scopes (fields of every kind the
scripts read, holders alive, dead and malformed, waiters, a host's
reservations, settings, episodes, probes, not-befores) and random calls
(arrivals and looks, both classes and a foreign one, a host's kept
settings, reports of every outcome, give-backs), the state is written
twice under two prefixes, the call is made once through each library,
and the replies and everything stored afterwards (every key, field,
member, list and expiry) must be the same.  Fails too when fewer than a
fifth of the calls took the lean path, or fewer than a fifth did not
(a corpus that tests nothing).  Standard library only.
"""
import random
import socket
import sys


class Redis:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self.f = self.s.makefile('rb')

    def cmd(self, *args):
        out = [b'*%d\r\n' % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b'$%d\r\n%s\r\n' % (len(a), a))
        self.s.sendall(b''.join(out))
        return self.read()

    def read(self):
        line = self.f.readline()[:-2]
        t, rest = line[:1], line[1:]
        if t == b'+':
            return rest.decode()
        if t == b'-':
            return RedisError(rest.decode())
        if t == b':':
            return int(rest)
        if t == b'$':
            n = int(rest)
            return None if n < 0 else self.f.read(n + 2)[:-2].decode()
        if t == b'*':
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError('bad reply %r' % line)


class RedisError(str):
    pass


# Redis's clock, as the scripts read it: from lean:clock (every TIME of
# common.lua is made a call of this).
PREAMBLE = '''
local function lean_clock()
  local v = redis.call('GET', 'lean:clock')
  return {string.match(v, '^(%d+) (%d+)$')}
end
'''


def library(src, name, variant):
    common = open(src + '/common.lua').read()
    if common.count("redis.call('TIME')") < 2:
        sys.exit('redis_lean.py: common.lua reads the clock otherwise now')
    common = common.replace("redis.call('TIME')", 'lean_clock()')
    enter = open(src + '/enter.lua').read()
    leave = open(src + '/leave.lua').read()
    call_e = 'local lean, pre = lean_enter(KEYS, ARGV)'
    call_l = 'local lean, pre = lean_leave(KEYS, ARGV)'
    if call_e not in enter or call_l not in leave:
        sys.exit('redis_lean.py: the scripts no longer call the lean path '
                 'as this test expects')
    if variant == 'whole':
        enter = enter.replace(call_e, 'local lean, pre = nil, nil')
        leave = leave.replace(call_l, 'local lean, pre = nil, nil')
    elif variant == 'which':
        enter = 'do return lean_enter(KEYS, ARGV) and 1 or 0 end\n'
        leave = 'do return lean_leave(KEYS, ARGV) and 1 or 0 end\n'
    body = '#!lua name=%s\n%s\n%s' % (name, PREAMBLE, common)
    for op, text in (('enter', enter), ('leave', leave)):
        body += ("redis.register_function('%s_%s', function(KEYS, ARGV)\n"
                 '%s\nend)\n' % (name, op, text))
    return body


class Case:
    """One random state and call, written under any prefix."""

    def __init__(self, rnd, sec, us):
        self.r = rnd
        self.now = sec * 1000 + us // 1000
        self.now_us = sec * 1000000 + us
        self.name = rnd.choice(['t', 'ws/t', 'ws/t', 'ws/t', 'org/ws/t'])
        self.op = rnd.choice(['enter', 'enter', 'leave', 'leave'])
        self.ids = []
        if rnd.random() < 0.25:  # anything at all
            self.key = self.state_key()
            self.scopes = [self.state_scope() for _ in self.scope_names()]
            self.waiters = self.state_waiters()
            self.argv = self.call()
        else:  # a loader's usual state and call, then a few changes
            self.usual()
            for _ in range(rnd.choice([0, 0, 1, 1, 1, 2, 3])):
                self.change()

    def usual(self):
        r, now = self.r, self.now
        self.key = {'born': str(self.now_us - 10 ** 9), 'key': self.name,
                    'seq': str(self.now_us - r.randint(1, 10 ** 6)),
                    'admitted': str(r.randint(1, 10 ** 5)),
                    'last_use': str(now - r.randint(0, 9)),
                    'exp': str(now + 86400000 - r.randint(0, 9000000)),
                    'auto_cap': self.pick('2', '3', '4'), 'auto_good': '1'}
        for _ in range(self.pick(0, 1, 1, 2)):
            fid = str(self.now_us - r.randint(1000, 10 ** 7))
            self.ids.append(fid)
            self.key['h:' + fid] = '%s 0 1 %d %d %d 600000 10000 h2 77 tok' % (
                self.pick('0', '1'), now - 5, now + 9000, now + 599000)
        self.scopes = [{'key': n, 'last_use': str(now - 9), 'answered': '1',
                        'probes': '1', 'exp': str(now + 86400000)}
                       for n in self.scope_names()]
        self.waiters = []
        lens = [len(n) for n in self.scope_names()] or [0]
        if self.op == 'enter':
            self.argv = ['0', self.pick('0', '1'), '600000', '10000', 'h1',
                         '4242', self.pick('n', '-1', '5000'),
                         str(lens[0]), str(lens[-1]), 'tok3', '0', 'h1@/seg']
        else:
            self.argv = [self.ids[0] if self.ids else str(self.now_us - 5),
                         '0', '0', '4242', '', str(len(self.name))]

    def change(self):
        """One thing of the wider corpus into the usual state."""
        r = self.r
        wild_key, wild_scopes = self.state_key(), [
            self.state_scope() for _ in self.scope_names()]
        what = r.randint(0, 9)
        if what >= 7:  # one of the edges the lean path must see
            self.edge()
        elif what == 0 and wild_key:  # a field of any kind in the key
            f = r.choice(sorted(wild_key))
            self.key[f] = wild_key[f]
            if f.startswith('h:'):
                self.ids.append(f[2:])
        elif what == 1 and self.scopes:  # or in a scope
            i = r.randrange(len(self.scopes))
            if wild_scopes[i]:
                f = r.choice(sorted(wild_scopes[i]))
                self.scopes[i][f] = wild_scopes[i][f]
        elif what == 2:  # a new key, or a scope Redis never had
            if self.scopes and r.random() < 0.5:
                self.scopes[r.randrange(len(self.scopes))] = {}
            else:
                self.key = {}
        elif what == 3:
            self.waiters = self.state_waiters() or [
                (str(self.now_us - 3000), '0 %d 600000 10000 h3 88 w t' % (
                    self.now + 10000))]
        elif what == 4 and self.key:  # a holder more, alive or not
            fid = str(self.now_us - r.randint(1000, 10 ** 7))
            self.ids.append(fid)
            self.key['h:' + fid] = self.holder()
        else:  # one argument of the call
            wild = self.call()
            i = r.randrange(len(wild))
            if i < len(self.argv):
                self.argv[i] = wild[i]
            else:
                self.argv += wild[len(self.argv):i + 1]

    def scope_names(self):
        parts = self.name.split('/')
        return ['/'.join(parts[:i]) for i in range(1, len(parts))]

    def pick(self, *choices):
        return self.r.choice(choices)

    def t(self, far=60000):
        return str(self.now + self.r.randint(-far, far))

    def holder(self):
        r, now = self.r, self.now
        since = now - r.randint(0, 5000)
        live = now + r.choice([-100, 5000, 10000])
        lease = now + r.choice([-1, 600000])
        v = ' '.join([self.pick('0', '0', '1'), self.pick('0', '0', '1'),
                      str(r.randint(1, 3)), str(since), str(live), str(lease),
                      '600000', '10000', 'h2', '77', 'tok%d' % r.randint(0, 9)])
        return self.pick(v, v, v, v, v, v, 'junk', '1 0 x')

    def edge(self):
        r, now = self.r, self.now
        sc = self.scopes[r.randrange(len(self.scopes))] if self.scopes else None
        e = r.randint(0, 11)
        if e == 0 and sc is not None:
            sc['nb'] = str(now + self.pick(-1, 0, 1, 5000))
        elif e == 1:
            self.key['nb'] = str(now + self.pick(-1, 0, 1, 5000, -5000))
            if r.random() < 0.5:  # and the expiry written again
                self.key['exp'] = str(now + 1000)
        elif e == 2 and self.key:
            # reservations: another host's, counted as that many; this
            # host's, one field counting them, or one of the earlier form
            # (a field per caller)
            if r.random() < 0.4:
                self.key['h:R:h2@/seg'] = '0 0 %s %d %d %d 10000 10000 h2 0 -' % (
                    self.pick('1', '2', '3'), now - 1, now + 10000, now + 10000)
            elif r.random() < 0.7:
                self.key['h:R:h1@/seg'] = '0 0 %s %d %d %d 10000 10000 h1 0 -' % (
                    self.pick('1', '3', '40', 'x'), now - 1, now + self.pick(
                        10000, 4000), now + 10000)
            else:
                self.key['h:r:h1@/seg:1'] = '0 0 1 %d %d %d 10000 10000 h1 0 -' % (
                    now, now + 10000, now + 10000)
            if r.random() < 0.5 and self.op == 'enter':
                self.argv[10] = self.pick('0', '1', '3')
        elif e == 3 and sc is not None:
            sc.clear()
            if self.op == 'enter':
                if r.random() < 0.5:  # no cold-scope rule for it
                    self.argv[7:9] = ['0', '0']
                self.argv[11:] = ['h1@/seg', self.pick(
                    '-;1 0 1 0 0 0 0', '-;2 0 0 0 0 0 0', '-;- ;0 0 1 0 0 0 0',
                    '0 0 1 0 0 0 0;0 0 1 0 0 0 0')]
        elif e == 4 and sc is not None:
            sc[self.pick('episode', 'answered')] = self.pick('0', '1')
        elif e == 5:
            self.key['episode'] = self.pick('0', '1')
        elif e == 6:
            (sc if sc is not None and r.random() < 0.5 else self.key)[
                'probe'] = self.pick('0', 'x', *self.ids)
        elif e == 7:
            f = self.pick('fixed_cap', 'auto_max', 'paused', 'rate_n',
                          'rate_period', 'share_set', 'share')
            (sc if sc is not None and r.random() < 0.3 else self.key)[f] = \
                self.pick('0', '1', '2', '1000')
        elif e == 8:  # the cap reached, or learned at
            self.key['auto_cap'] = str(max(1, len(self.ids)))
        elif e == 9 and self.op == 'leave':
            self.argv[1] = self.pick('1', '2', '3', '4', '5', '6')
        elif e == 10 and self.op == 'leave':
            self.argv[4] = self.pick('pub', 'heal')
        elif e == 11 and self.ids:  # a holder at the cap when admitted
            f = 'h:' + self.ids[0]
            w = self.key.get(f, '').split(' ')
            if len(w) > 3:
                w[2] = self.pick('2', '3', '40', '-1')
                self.key[f] = ' '.join(w)

    def state_key(self):
        r = self.r
        h = {}
        if r.random() < 0.08:
            return h  # a new key
        h['born'] = str(self.now_us - 10 ** 9)
        h['key'] = self.pick(self.name, self.name, self.name, 'other')
        if r.random() < 0.9:
            h['seq'] = self.pick(str(self.now_us - 5000), str(self.now_us + 50),
                                 str(self.now_us - 1), 'x')
        if r.random() < 0.9:
            h['admitted'] = self.pick('1', '7', '120035', 'x')
        if r.random() < 0.9:
            h['last_use'] = self.pick(str(self.now), str(self.now - 1), 'x')
        if r.random() < 0.9:
            h['exp'] = self.pick(str(self.now + 86400000), str(self.now + 86400000 - 9000000),
                                 str(self.now + 1000), '-1', 'x')
        for f, p, vals in (
                ('auto_cap', 0.7, ['1', '2', '3', '40', '0', 'x', '2.5']),
                ('auto_good', 0.4, ['1', '2']),
                ('fixed_cap', 0.12, ['0', '1', '2', '3', 'x']),
                ('auto_max', 0.12, ['0', '1', '2', '99']),
                ('nb', 0.25, [self.t(5000), str(self.now - 1), str(self.now + 1)]),
                ('episode', 0.15, ['0', '1']),
                ('probe', 0.08, ['0', 'x']),
                ('paused', 0.05, ['0', '1']),
                ('rate_n', 0.05, ['2']), ('rate_period', 0.05, ['1000']),
                ('rate_tat', 0.05, [str(self.now)]),
                ('share_set', 0.05, ['1']), ('share', 0.05, ['500']),
                ('answered', 0.3, ['1']), ('probes', 0.3, ['3']),
                ('reclaims', 0.1, ['1']), ('cleared', 0.05, [self.t()]),
                ('seed_cap', 0.05, ['2'])):
            if r.random() < p:
                h[f] = r.choice(vals)
        for _ in range(self.pick(0, 0, 1, 1, 2, 3)):
            fid = str(self.now_us - r.randint(1000, 10 ** 7))
            self.ids.append(fid)
            h['h:' + fid] = self.holder()
        if r.random() < 0.05:
            h['h:r:seg:1'] = '0 0 1 %d %d %d 10000 10000 h2 0 -' % (
                self.now, self.now + 10000, self.now + 10000)
        if r.random() < 0.15:  # another host's, counted as that many
            h['h:R:h2@/seg'] = '0 0 %s %d %d %d 10000 10000 h2 0 -' % (
                self.pick('1', '2', '3', '40', 'x', '-1'), self.now,
                self.now + self.pick(10000, -1), self.now + 10000)
        if 'probe' in h and self.ids and r.random() < 0.5:
            h['probe'] = self.ids[0]
        return h

    def state_scope(self):
        r = self.r
        h = {}
        if r.random() < 0.15:
            return h
        h['key'] = 'scope'
        h['last_use'] = str(self.now - 5)
        h['exp'] = str(self.now + 86400000)
        for f, p, vals in (
                ('answered', 0.8, ['1', '1', '0']),
                ('episode', 0.2, ['0', '1']),
                ('nb', 0.2, [self.t(5000)]),
                ('probes', 0.5, ['1']),
                ('probe', 0.05, ['x']),
                ('fixed_cap', 0.08, ['2']),
                ('paused', 0.04, ['1']),
                ('auto_max', 0.04, ['3']),
                ('cancel_gen', 0.1, ['2']),
                ('seed_cap', 0.1, ['2'])):
            if r.random() < p:
                h[f] = r.choice(vals)
        if r.random() < 0.08:
            h['h:' + self.name + '#' + str(self.now_us - 7)] = self.holder()
        return h

    def state_waiters(self):
        if self.r.random() < 0.85:
            return []
        wid = str(self.now_us - 3000)
        rec = '%s %d 600000 10000 h3 88 w tokw' % (
            self.pick('0', '1'), self.now + self.pick(-10, 10000))
        return [(wid, rec)]

    def call(self):
        r = self.r
        if self.op == 'enter':
            wid = '0' if r.random() < 0.85 else self.pick(
                str(self.now_us - 3000), '12345')
            lens = [len(s) for s in self.scope_names()] + [len(self.name), 0]
            argv = [wid, self.pick('0', '0', '1', '2'),
                    self.pick('600000', '600000', 'x', '0600000', '6e5',
                              '0', '12345678901234'),
                    self.pick('10000', '10000', '1000', '010000', '1e4'),
                    'h1', '4242', self.pick('n', '-1', '0', '5000'),
                    str(r.choice(lens)), str(r.choice(lens)),
                    'tok%d' % r.randint(0, 9),
                    self.pick('0', '0', '0', '1', '3', 'nan'), 'h1@/seg']
            if r.random() < 0.2:
                argv.append(self.pick('', '2 0 0 0 0 0 0',
                                      '-;1 0 1 0 0 0 0', '0 3 0 0 0 0 0'))
            return argv
        fence = (r.choice(self.ids) if self.ids and r.random() < 0.8
                 else self.pick('-', str(self.now_us - 1), 'x'))
        argv = [fence, self.pick('0', '0', '0', '0', '1', '2', '4', '6'),
                self.pick('0', '5000'), '4242',
                self.pick('', '', '', 'pub', 'heal'),
                str(r.choice([len(s) for s in self.scope_names()] +
                             [len(self.name)]))]
        if r.random() < 0.3:
            argv += [self.pick('tok1', '100'), self.pick('0', '12345')]
        return argv

    def keys(self, p):
        ks = [p + x + self.name for x in ('k:', 'w:', 'wi:', 'x:', 'b:')]
        for s in self.scope_names():
            ks += [p + 'k:' + s, p + 'b:' + s]
        return ks

    def write(self, db, p):
        ks = self.keys(p)
        hashes = [(ks[0], self.key)] + [
            (ks[5 + 2 * i], h) for i, h in enumerate(self.scopes)]
        for k, h in hashes:
            if h:
                args = [x for kv in sorted(h.items()) for x in kv]
                db.cmd('HSET', k, *args)
                db.cmd('PEXPIRE', k, 86400000)
        for wid, rec in self.waiters:
            db.cmd('ZADD', ks[1], wid, wid)
            db.cmd('HSET', ks[2], wid, rec)
        argv = [p + 'q:' + self.name + ':', '86400000', '900000/900000',
                self.name] + self.argv
        return ks, argv


def dump(db, p):
    """Every key under prefix p, as (name, type, content, expiry ms or -1),
    with p taken out of every string."""
    out = []
    cursor = '0'
    names = []
    while True:
        cursor, batch = db.cmd('SCAN', cursor, 'MATCH', p + '*', 'COUNT', 1000)
        names += batch
        if cursor == '0':
            break
    for k in sorted(names):
        t = db.cmd('TYPE', k)
        if t == 'hash':
            a = db.cmd('HGETALL', k)
            v = sorted(zip(a[0::2], a[1::2]))
        elif t == 'zset':
            v = db.cmd('ZRANGE', k, 0, -1, 'WITHSCORES')
        elif t == 'list':
            v = db.cmd('LRANGE', k, 0, -1)
        else:
            v = db.cmd('GET', k)
        out.append((repr((k, t, v)).replace(p, 'P:'), db.cmd('PTTL', k)))
    return out


def same(a, b):
    """Two dumps alike: the same keys and contents, and expiries alike
    within the few ms of Redis's own clock between the two calls (each
    PEXPIRE counts from it; the scripts' clock is lean:clock)."""
    if len(a) != len(b):
        return False
    for (ka, ta), (kb, tb) in zip(a, b):
        if ka != kb or (ta < 0) != (tb < 0) or abs(ta - tb) > 2000:
            return False
    return True


def main():
    sock, src = sys.argv[1], sys.argv[2]
    cases = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 20261206
    db = Redis(sock)
    for name, variant in (('lon', 'lean'), ('loff', 'whole'),
                          ('lwhich', 'which')):
        rep = db.cmd('FUNCTION', 'LOAD', 'REPLACE', library(src, name, variant))
        if isinstance(rep, RedisError):
            sys.exit('loading %s: %s' % (name, rep))
    rnd = random.Random(seed)
    sec0 = int(db.cmd('TIME')[0])
    lean = {'enter': 0, 'leave': 0}
    total = {'enter': 0, 'leave': 0}
    bad = 0
    for n in range(cases):
        sec, us = sec0 + rnd.randint(0, 10 ** 6), rnd.randint(0, 999999)
        case = Case(rnd, sec, us)
        got = {}
        db.cmd('FLUSHALL')
        db.cmd('SET', 'lean:clock', '%d %d' % (sec, us))
        for lib, p in (('lon', 'lnA{t}:'), ('loff', 'lnB{t}:'),
                       ('lwhich', 'lnC{t}:')):
            ks, argv = case.write(db, p)
            rep = db.cmd('FCALL', '%s_%s' % (lib, case.op), len(ks), *ks, *argv)
            if isinstance(rep, RedisError):
                rep = 'error'  # the same failure, wherever the script stopped
            got[lib] = (repr(rep).replace(p, 'P:'), dump(db, p))
        total[case.op] += 1
        if got['lwhich'][0] == '1':
            lean[case.op] += 1
        if got['lon'][0] != got['loff'][0] or not same(got['lon'][1],
                                                       got['loff'][1]):
            bad += 1
            if bad <= 3:
                print('MISMATCH case %d (%s %s, seed %d)' % (n, case.op, case.name, seed))
                print('  key:   ', case.key)
                print('  scopes:', case.scopes, 'waiters:', case.waiters)
                print('  argv:  ', case.argv)
                print('  lean:  ', got['lon'][0])
                print('  whole: ', got['loff'][0])
                for a, b in zip(got['lon'][1], got['loff'][1]):
                    if not same([a], [b]):
                        print('  lean  ', a)
                        print('  whole ', b)
    db.cmd('DEL', 'lean:clock')
    for name in ('lon', 'loff', 'lwhich'):
        db.cmd('FUNCTION', 'DELETE', name)
    for op in ('enter', 'leave'):
        print('%s: %d calls, %d by the lean path' % (op, total[op], lean[op]))
    ok = bad == 0
    if bad:
        print('FAIL %d of %d calls differ' % (bad, cases))
    for op in ('enter', 'leave'):
        if not (total[op] // 5 <= lean[op] <= total[op] - total[op] // 5):
            print('FAIL the corpus does not test the %s lean path both ways' % op)
            ok = False
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
