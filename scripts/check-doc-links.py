#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Checks the relative links of the repository's markdown files: every linked file exists, and
every #anchor names a heading of the target (GitHub's rule: lowercase, punctuation but '-' and
'_' dropped, spaces to '-', a repeated heading gets -1, -2, ...) or an <a name=...> / <a id=...>.
Links to web addresses are not followed. Prints one line per broken link and exits 1 if any.

    scripts/check-doc-links.py [FILE.md ...]   (default: README.md and docs/*.md)
"""

import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# [text](target) or [text](target "title"); the text may run over lines.
LINK = re.compile(r"\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")


def outside_fences(text):
    """The file's lines with those inside ``` blocks blanked (their '#' are not headings)."""
    lines, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return lines


def slug(heading):
    heading = re.sub(r"`", "", heading.strip().lower())
    heading = re.sub(r"[^\w\- ]", "", heading)
    return heading.replace(" ", "-")


_anchors = {}


def anchors(path):
    if path not in _anchors:
        found, seen = set(), {}
        with open(path, encoding="utf-8") as f:
            for line in outside_fences(f.read()):
                m = re.match(r"^#{1,6} (.*?)\s*#*\s*$", line)
                if m:
                    s = slug(m.group(1))
                    n = seen.get(s, 0)
                    seen[s] = n + 1
                    found.add(f"{s}-{n}" if n else s)
                found.update(re.findall(r'<a (?:name|id)="([^"]+)"', line))
        _anchors[path] = found
    return _anchors[path]


def check(path, counted):
    bad = []
    with open(path, encoding="utf-8") as f:
        text = "\n".join(outside_fences(f.read()))
    for match in LINK.finditer(text):
        target = match.group(1)
        counted.append(target)
        number = text.count("\n", 0, match.start()) + 1
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto:
        file_part, _, anchor = target.partition("#")
        linked = (os.path.normpath(os.path.join(os.path.dirname(path), file_part))
                  if file_part else path)
        if not os.path.exists(linked):
            bad.append(f"{path}:{number}: {target}: no file {os.path.relpath(linked, ROOT)}")
        elif anchor and linked.endswith(".md") and anchor not in anchors(linked):
            bad.append(f"{path}:{number}: {target}: no heading #{anchor} in "
                       f"{os.path.relpath(linked, ROOT)}")
    return bad


def main(argv):
    files = argv or [os.path.join(ROOT, "README.md")] + sorted(
        glob.glob(os.path.join(ROOT, "docs", "*.md")))
    counted = []
    bad = [b for f in files for b in check(f, counted)]
    for b in bad:
        print(b)
    print(f"check-doc-links: {len(files)} files, {len(counted)} links, {len(bad)} broken")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
