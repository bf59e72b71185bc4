#!/usr/bin/env python3
"""Keeps at most N inputs of a corpus when `cargo fuzz cmin` keeps more.

Reads a libFuzzer merge control file (run the target with
`-merge=1 -merge_control_file=CTL NEWDIR corpus/TARGET`), then picks inputs greedily, each
time the one adding the most new coverage edges, then the most new features, then the
smallest, and copies them to OUT.

usage: fuzz/select-corpus.py CTL OUT N
"""
import os
import shutil
import sys


def main():
    ctl, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    lines = open(ctl).read().split("\n")
    count = int(lines[0])
    files = lines[2 : 2 + count]
    features, edges = {}, {}
    for line in lines[2 + count :]:
        parts = line.split()
        if parts and parts[0] == "FT":
            features[int(parts[1])] = set(map(int, parts[2:]))
        elif parts and parts[0] == "COV":
            edges[int(parts[1])] = set(map(int, parts[2:]))
    size = {i: os.path.getsize(files[i]) for i in features}
    have_f, have_e, chosen = set(), set(), []
    while len(chosen) < n:
        best, best_key = None, None
        for i in features:
            if i in chosen:
                continue
            key = (len(edges.get(i, set()) - have_e), len(features[i] - have_f), -size[i])
            if best_key is None or key > best_key:
                best, best_key = i, key
        if best is None or best_key[:2] == (0, 0):
            break
        chosen.append(best)
        have_f |= features[best]
        have_e |= edges.get(best, set())
    os.makedirs(out, exist_ok=True)
    for i in chosen:
        shutil.copy(files[i], out)
    all_f = set().union(*features.values())
    all_e = set().union(*edges.values())
    print(
        f"{len(chosen)} of {len(features)} inputs: "
        f"{len(have_e)}/{len(all_e)} edges, {len(have_f)}/{len(all_f)} features"
    )


if __name__ == "__main__":
    main()
