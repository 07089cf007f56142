#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""objgraph.py — which object of a library uses which, read from the objects.

    tools/objgraph.py [--check] [--dot] OBJ...

An edge A -> B means that A has an undefined symbol that B defines (nm's
'U' against T/D/B/R/...).  The report lists every object with what it uses,
then the strongly connected components of more than one object: each is a
circle, a set of objects none of which can be understood, tested or
replaced without the others.  With --check the exit status is 1 when there
is any circle (for make check, once the library is layered); without it the
report is only printed.  --dot prints the graph for graphviz instead.

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


def main(argv):
    check = "--check" in argv
    dot = "--dot" in argv
    objs = [a for a in argv if not a.startswith("--")]
    if not objs:
        print(__doc__.strip(), file=sys.stderr)
        return 64
    nm = os.environ.get("NM", "nm")
    name = {o: os.path.splitext(os.path.basename(o))[0] for o in objs}
    table = {o: symbols(nm, o) for o in objs}
    owner = {}
    for o, (defs, _) in table.items():
        for s in defs:
            owner.setdefault(s, o)
    edges = {name[o]: set() for o in objs}
    for o, (_, uses) in table.items():
        for s in uses:
            d = owner.get(s)
            if d is not None and d != o:
                edges[name[o]].add(name[d])
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
    return 1 if (check and found) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
