#!/usr/bin/env python3
"""Import cycles among a crate's modules, from the code's own paths.

Usage: scripts/module-cycles.py crates/tether-client/src [crates/tether-server/src ...]

Each .rs file is a module (`a/mod.rs` is `a`). An edge a -> b is any `crate::...` or
`super::...` path in a (outside its `#[cfg(test)]` module) that names b or something in b;
a path resolves to the longest module it names. A parent module declaring its children
(`mod x;`) is not an edge. Prints each cycle (strongly connected set of files) and exits 1
if there is one; prints the layering and exits 0 otherwise.
"""

import os
import re
import sys


def modules(src):
    """Module path (tuple) -> file, for every .rs file under src."""
    found = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, f), src)[:-3].split(os.sep)
            if rel[-1] == "mod":
                rel = rel[:-1]
            if rel in (["lib"], ["main"]):
                rel = []
            found[tuple(rel)] = os.path.join(root, f)
    return found


PATH = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^}]*)\}", re.S)


def code_of(path):
    text = open(path, encoding="utf-8").read()
    cut = re.search(r"#\[cfg\(test\)\]\s*(pub(\(crate\))?\s+)?mod\s+\w+\s*\{", text)
    if cut:
        text = text[: cut.start()]
    # Comments name modules in prose; only code counts.
    return re.sub(r"//[^\n]*", "", text)


def resolve(mods, base, parts):
    """The longest module named by `parts` under `base`, if any."""
    for n in range(len(parts), -1, -1):
        cand = tuple(base) + tuple(parts[:n])
        if cand in mods:
            return cand
    return None


def edges(mods):
    out = {m: set() for m in mods}
    for m, path in mods.items():
        text = code_of(path)
        refs = []
        for kind, prefix, inner in GROUP.findall(text):
            for item in inner.split(","):
                item = item.strip().split(" as ")[0]
                if item and item != "self":
                    refs.append((kind, prefix + "::" + item.replace(" ", "")))
                elif item == "self":
                    refs.append((kind, prefix))
        refs += PATH.findall(text)
        for kind, rest in refs:
            parts = [p for p in rest.split("::") if p]
            if kind == "crate":
                base = ()
            else:
                # `super` is the parent of this module (for a/b.rs and a/b/mod.rs alike).
                base = m[:-1]
                while parts and parts[0] == "super":
                    base, parts = base[:-1], parts[1:]
            target = resolve(mods, base, parts)
            if target is not None and target != m and target != ():
                # A module using its own ancestor's items (re-exports) is not a layer edge
                # worth drawing when the ancestor is the crate root.
                out[m].add(target)
    return out


def sccs(graph):
    index, low, stack, on, result, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            result.append(comp)

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return result


def name(m):
    return "::".join(m) or "(crate root)"


def main():
    bad = False
    for src in sys.argv[1:]:
        mods = modules(src)
        graph = edges(mods)
        cycles = [c for c in sccs(graph) if len(c) > 1]
        if cycles:
            bad = True
            for c in cycles:
                print(f"{src}: import cycle among {len(c)} modules:")
                for m in sorted(c):
                    inside = sorted(name(t) for t in graph[m] if t in c)
                    print(f"  {name(m)} -> {', '.join(inside)}")
        else:
            print(f"{src}: no import cycle among {len(mods)} modules")
            # Depth of each module: 0 for those that import nothing of the crate.
            depth = {}

            def d(m):
                if m not in depth:
                    depth[m] = 0
                    depth[m] = 1 + max((d(t) for t in graph[m]), default=-1)
                return depth[m]

            for m in sorted(mods, key=lambda m: (d(m), m)):
                if m == ():
                    continue
                uses = ", ".join(sorted(name(t) for t in graph[m])) or "-"
                print(f"  {d(m)}  {name(m):32} uses {uses}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
