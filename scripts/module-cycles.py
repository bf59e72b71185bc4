#!/usr/bin/env python3
"""Reports import cycles among a crate's modules.

Usage: python3 scripts/module-cycles.py SRC_DIR   (e.g. crates/tether-client/src)

Each file under src/ is a module (lib.rs the crate, x/mod.rs the module x). A module depends
on another when its code names one of that module's items: in a `use` (re-exports included)
or in a path in the code, through `crate::`, `super::`, `self::` or the name of a child
module. Inline modules (`mod tests { ... }`, test code included) count as part of their
file. A path is charged to the longest module it names (`crate::watch::echo::Expected` is
an edge to watch/echo.rs, `super::Watcher` one to the parent that defines it). `mod x;`
declarations are not edges. Comments and string literals are ignored.

Prints the edges, then each strongly connected component with more than one module (a
cycle), and exits 1 if there is one. Also checks the graph of top-level modules
(crate::a::b counted as crate::a).
"""

import os
import re
import sys

if len(sys.argv) != 2:
    sys.exit(__doc__)
SRC = sys.argv[1]


def module_of(rel):
    parts = rel[:-3].split(os.sep)
    if parts == ["lib"]:
        return ("crate",)
    if parts[-1] == "mod":
        parts = parts[:-1]
    return ("crate",) + tuple(parts)


def strip(code):
    """Code without comments, string and char literals (replaced by spaces)."""
    out, i, n = [], 0, len(code)
    while i < n:
        c = code[i]
        if code.startswith("//", i):
            j = code.find("\n", i)
            i = n if j < 0 else j
        elif code.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if code.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif code.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', code[i:i + 10]) and not re.match(r"\w", code[i - 1:i] or " "):
            m = re.match(r'r(#*)"', code[i:])
            end = code.find('"' + m.group(1), i + len(m.group(0)))
            out.append(" ")
            i = n if end < 0 else end + 1 + len(m.group(1))
        elif c == '"':
            i += 1
            while i < n and code[i] != '"':
                i += 2 if code[i] == "\\" else 1
            out.append(" ")
            i += 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", code[i:i + 4]) or (c == "'" and code.startswith("'\\", i)):
            j = code.find("'", i + 2)
            out.append(" ")
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def expand_use(tree):
    """`a::{b, c::{self, D}}` -> ['a::b', 'a::c', 'a::c::D']."""
    tree = re.sub(r"\s+", "", tree)
    m = re.match(r"^(.*?)\{(.*)\}$", tree)
    if not m:
        tree = re.sub(r"as\w+$", "", tree) if "as" in tree else tree
        return [tree[:-6] if tree.endswith("::self") else tree]
    prefix, inner = m.group(1), m.group(2)
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    if cur:
        parts.append(cur)
    out = []
    for p in parts:
        if p == "self":
            out.append(prefix.rstrip(":"))
        else:
            out.extend(expand_use(prefix + p))
    return out


def main():
    files = {}
    for root, _, names in os.walk(SRC):
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(root, name)
                files[module_of(os.path.relpath(path, SRC))] = open(path).read()
    modules = set(files)

    def children(mod):
        return {m[-1] for m in modules if len(m) == len(mod) + 1 and m[:-1] == mod}

    def resolve(base, path):
        """The module an item path used in module `base` names, or None (std, crates)."""
        segs = [s for s in path.split("::") if s]
        if not segs:
            return None
        cur = base
        if segs[0] == "crate":
            cur, segs = ("crate",), segs[1:]
        elif segs[0] in ("super", "self"):
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super":
                    cur = cur[:-1]
                segs = segs[1:]
        elif segs[0] not in children(base):
            return None
        while segs and cur + (segs[0],) in modules:
            cur, segs = cur + (segs[0],), segs[1:]
        return cur

    edges = {m: set() for m in modules}
    for mod, text in files.items():
        code = strip(text)
        # Inline modules shift what super/self/children mean; track them by brace depth.
        inline, depth, pos = [], 0, 0
        tokens = re.finditer(r"\buse\s+([^;]+);|\bmod\s+(\w+)\s*\{|[{}]|"
                             r"\b((?:crate|super|self|\w+)(?:::\w+)+)", code)
        for t in tokens:
            here = mod + tuple(name for name, _ in inline)
            if t.group(0) == "{":
                depth += 1
            elif t.group(0) == "}":
                depth -= 1
                if inline and inline[-1][1] == depth:
                    inline.pop()
            elif t.group(2):
                inline.append((t.group(2), depth))
                depth += 1
            else:
                paths = expand_use(t.group(1)) if t.group(1) else [t.group(3)]
                for p in paths:
                    target = resolve(here, p)
                    # An inline module is part of its file.
                    while target is not None and target not in modules:
                        target = target[:-1]
                    if target is not None and target != mod:
                        edges[mod].add(target)

    def show(m):
        return "::".join(m)

    def sccs(graph):
        index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

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
                out.append(comp)

        sys.setrecursionlimit(10000)
        for v in sorted(graph):
            if v not in index:
                visit(v)
        return [c for c in out if len(c) > 1]

    for m in sorted(edges):
        print(f"{show(m)} -> {', '.join(show(t) for t in sorted(edges[m])) or '-'}")
    top = {}
    for m, ts in edges.items():
        a = m[:2]
        top.setdefault(a, set())
        for t in ts:
            if t[:2] != a:
                top[a].add(t[:2])
    found = False
    for title, graph in (("modules", edges), ("top-level modules", top)):
        cycles = sccs(graph)
        if cycles:
            found = True
            for c in cycles:
                print(f"CYCLE among {title}: {', '.join(sorted(show(m) for m in c))}")
        else:
            print(f"no cycles among {len(graph)} {title}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
