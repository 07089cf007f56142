#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""objgraph.py — which object of a library uses which, read from the objects.

    tools/objgraph.py [--check] [--dot] [--order L1,L2,...]
                      [--public L,...] [--exports LIB] OBJ...

An edge A -> B means that A has an undefined symbol that B defines (nm's
'U' against T/D/B/R/...).  The report lists every object with what it uses,
then the strongly connected components of more than one object: each is a
circle, a set of objects none of which can be understood, tested or
replaced without the others.  --dot prints the graph for graphviz instead.

An object is named by its path below the objects' common directory, so
the first part of a name is its layer (the folder: core/clock).  The
layers' rules, each broken use reported as a line "layer: ...":
  --order L1,L2,...  an object of a listed layer uses only objects of its
                     own layer or of layers listed before it (downward);
  --public L,...     an object of such a layer uses, outside its layer,
                     only the library's exported symbols: those the shared
                     library LIB exports (--exports LIB, as nm -D lists
                     them), else any symbol not named throttle__*.
With --check the exit status is 1 when there is any circle or broken rule
(make check runs it: tests/test_layers.sh); without it the report is only
printed.

Standard library only; nm comes from binutils (NM overrides it).
"""
import os
import subprocess
import sys

DEFINED = set("TDBRVWGSiu")


def symbols(nm, path):
    out = subprocess.run([nm, "-P", path], check=True, capture_output=True,
                         text=True).stdout
    defs, uses = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            uses.add(name)
        elif kind in DEFINED:
            defs.add(name)
    return defs, uses


def circles(nodes, edges):
    """Tarjan's strongly connected components, iterative; only those > 1."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out, key=lambda c: (-len(c), c))


def exported(nm, lib):
    """The symbols a shared library exports (nm -D --defined-only)."""
    out = subprocess.run([nm, "-D", "--defined-only", lib], check=True,
                         capture_output=True, text=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines()
            if line.strip()}


def broken_rules(edges_by_sym, order, public, exports):
    """Uses that go up the --order or past a --public layer's API."""
    rank = {layer: i for i, layer in enumerate(order)}
    out = []
    for (a, b), syms in sorted(edges_by_sym.items()):
        la, lb = a.split("/")[0], b.split("/")[0]
        if la == lb:
            continue
        if la in rank and (lb not in rank or rank[lb] > rank[la]):
            out.append(f"layer: {a} -> {b} goes up the order "
                       f"({' < '.join(order)}): {' '.join(sorted(syms))}")
        if la in public:
            bad = sorted(x for x in syms if (x not in exports if exports
                                             else x.startswith("throttle__")))
            if bad:
                out.append(f"layer: {a} -> {b} uses what the library does "
                           f"not export: {' '.join(bad)}")
    return out


def option(argv, flag):
    if flag not in argv:
        return None
    i = argv.index(flag)
    if i + 1 >= len(argv):
        raise SystemExit(f"objgraph.py: {flag} needs a value")
    return argv[i + 1]


def main(argv):
    check = "--check" in argv
    dot = "--dot" in argv
    order = (option(argv, "--order") or "").split(",")
    order = [x for x in order if x]
    public = set(x for x in (option(argv, "--public") or "").split(",") if x)
    lib = option(argv, "--exports")
    valued = {option(argv, f) for f in ("--order", "--public", "--exports")}
    objs = [a for a in argv if not a.startswith("--") and a not in valued]
    if not objs:
        print(__doc__.strip(), file=sys.stderr)
        return 64
    nm = os.environ.get("NM", "nm")
    # Named by the path below the objects' common directory, without .o:
    # a library built from folders shows its layer (core/clock).
    top = os.path.commonpath([os.path.dirname(os.path.abspath(o))
                              for o in objs])
    name = {o: os.path.splitext(os.path.relpath(os.path.abspath(o), top))[0]
            for o in objs}
    table = {o: symbols(nm, o) for o in objs}
    owner = {}
    for o, (defs, _) in table.items():
        for s in defs:
            owner.setdefault(s, o)
    edges = {name[o]: set() for o in objs}
    by_sym = {}
    for o, (_, uses) in table.items():
        for s in uses:
            d = owner.get(s)
            if d is not None and d != o:
                edges[name[o]].add(name[d])
                by_sym.setdefault((name[o], name[d]), set()).add(s)
    nodes = sorted(edges)
    found = circles(nodes, edges)
    if dot:
        print("digraph objects {")
        for n in nodes:
            for m in sorted(edges[n]):
                print(f'  "{n}" -> "{m}";')
        print("}")
        return 0
    nedges = sum(len(v) for v in edges.values())
    print(f"objects: {len(nodes)}, edges: {nedges}, circles: {len(found)}, "
          f"largest: {len(found[0]) if found else 0}")
    for n in nodes:
        print(f"  {n} -> {' '.join(sorted(edges[n])) or '-'}")
    for c in found:
        print(f"circle of {len(c)}: {' '.join(c)}")
    broken = broken_rules(by_sym, order, public,
                          exported(nm, lib) if lib else None)
    for b in broken:
        print(b)
    if order or public:
        print(f"layers: {len(broken)} broken "
              f"(order {' < '.join(order) or '-'}; "
              f"public API only: {','.join(sorted(public)) or '-'})")
    return 1 if (check and (found or broken)) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
