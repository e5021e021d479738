#!/usr/bin/env python3
"""Checks that the repository is self-contained and that its pointers into docs/ resolve.

1. No tracked file cites a document the repository does not ship: the project's historical design
   notes or the session reference notes (their file names are assembled below so this script
   does not match itself), or a path into a `shared` folder beside the checkout.
2. Every `docs/<page>.md#<anchor>` in any tracked text file, and every `(<page>.md#<anchor>)` /
   `(#<anchor>)` link inside docs/*.md, names an existing page and a heading of it (GitHub's
   anchor rule: lower case, punctuation other than `-` and `_` dropped, spaces to `-`, `-1`,
   `-2`, ... for repeated headings). A `docs/<page>.md` without an anchor must exist.

Usage: check_docs.py REPO_ROOT     (exit 1 and one line per problem: file:line: what)
       check_docs.py --self-test   (proves each rule reports a planted violation)
"""
import os
import re
import subprocess
import sys
import tempfile

# Names of documents that exist only outside the repository.
FORBIDDEN = [
    re.compile(r"DESIGN" + r"\.md"),
    re.compile(r"(?<![\w-])megatron" + r"\.md"),
    re.compile(r"megatron-" + r"oracle"),
    re.compile(r"(?<![\w-])anchors" + r"\.md"),
    re.compile(r"reference/tokenizers" + r"\.md"),
    re.compile(r"\.\./" + r"shared"),
    re.compile(r"shared/" + r"(reference|peers)"),
    re.compile(r"/work/" + r"shared"),
]
DOC_REF = re.compile(r"docs/([A-Za-z0-9_.-]+\.md)(#[A-Za-z0-9_-]+)?")
MD_LINK = re.compile(r"\]\(([A-Za-z0-9_.-]+\.md)?(#[A-Za-z0-9_-]+)?\)")
SKIP_PREFIXES = ("bench/results/", "third_party/")


def anchors_of(text):
    """GitHub heading anchors of a markdown text (fenced code blocks skipped)."""
    out, seen, fenced = set(), {}, False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        a = re.sub(r"[^\w\- ]", "", m.group(2).lower()).replace(" ", "-")
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else f"{a}-{n}")
    return out


def tracked_files(root):
    r = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True, check=True)
    return [f for f in r.stdout.decode().split("\0") if f and not f.startswith(SKIP_PREFIXES)]


def check(root, files):
    problems, cache = [], {}
    me = os.path.relpath(os.path.abspath(__file__), os.path.abspath(root))

    def page_anchors(page):
        if page not in cache:
            p = os.path.join(root, "docs", page)
            cache[page] = anchors_of(open(p, encoding="utf-8").read()) if os.path.isfile(p) else None
        return cache[page]

    def check_ref(where, page, anchor):
        a = page_anchors(page)
        if a is None:
            problems.append(f"{where}: docs/{page} does not exist")
        elif anchor and anchor[1:] not in a:
            problems.append(f"{where}: docs/{page} has no heading for {anchor}")

    for f in files:
        path = os.path.join(root, f)
        if f == me or not os.path.isfile(path):
            continue
        try:
            text = open(path, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue  # binary fixture
        in_docs = f.startswith("docs/") and f.endswith(".md")
        for no, line in enumerate(text.splitlines(), 1):
            where = f"{f}:{no}"
            for rx in FORBIDDEN:
                if rx.search(line):
                    problems.append(f"{where}: cites a document the repository does not ship "
                                    f"({rx.search(line).group(0)}); point to docs/ instead")
            for m in DOC_REF.finditer(line):
                check_ref(where, m.group(1), m.group(2))
            if in_docs:
                for m in MD_LINK.finditer(line):
                    page = m.group(1) or os.path.basename(f)
                    if m.group(1) or m.group(2):
                        check_ref(where, page, m.group(2))
    return problems


def self_test():
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "docs"))
        open(os.path.join(d, "docs", "a.md"), "w").write("# A page\n## Some `x` (y) heading\n## Dup\n## Dup\n")
        cases = {
            "ok.cpp": ("// see docs/a.md#some-x-y-heading and docs/a.md#dup-1\n", 0),
            "bad_anchor.cpp": ("// docs/a.md#nope\n", 1),
            "bad_page.cpp": ("// docs/missing.md\n", 1),
            "cite.cpp": ("// (" + "DESIGN" + ".md) and ../" + "shared/x\n", 2),
            "docs/link.md": ("[x](a.md#dup) [y](#nothing) [z](a.md#zz)\n", 2),
        }
        failed = False
        for name, (body, want) in cases.items():
            open(os.path.join(d, name), "w").write(body)
            got = len(check(d, [name]))
            if got != want:
                print(f"self-test: {name}: {got} problems, expected {want}")
                failed = True
        print("self-test " + ("FAILED" if failed else "passed"))
        return 1 if failed else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    root = sys.argv[1]
    problems = check(root, tracked_files(root))
    for p in problems:
        print(p)
    print(f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
