#!/usr/bin/env python3
"""docs/ENVIRONMENT.md lists exactly the ZIMAGE_* variables the engine reads.

The engine's variables are the "ZIMAGE_..." string literals in the C++ sources of src/ (the
library), apps/ (the zimage program) and include/ (every one there is a variable name given to
getenv or env_switch; the Python package and the ComfyUI nodes read none). The documented ones are the first cells of the tables in
docs/ENVIRONMENT.md. The test fails, naming them, for a variable read but not documented, one
documented but no longer read, one documented twice, and a README that does not link the page.
It also checks itself: the same check on a doc with one row removed and one made up must find
both.

Usage: test_environment_doc.py SOURCE_DIR
"""
import pathlib
import re
import sys

LITERAL = re.compile(r'"(ZIMAGE_[A-Z0-9_]+)"')
ROW = re.compile(r"^\|\s*`(ZIMAGE_[A-Z0-9_]+)`\s*\|", re.MULTILINE)
SOURCES = (".h", ".cpp", ".cu", ".cuh")


def read_in_source(root: pathlib.Path) -> set:
    names = set()
    for folder in ("src", "apps", "include"):
        for path in (root / folder).rglob("*"):
            if path.suffix in SOURCES and path.is_file():
                names.update(LITERAL.findall(path.read_text(encoding="utf-8", errors="replace")))
    return names


def problems(read: set, doc: str) -> list:
    rows = ROW.findall(doc)
    documented = set(rows)
    out = [f"{n}: read in the sources but not in docs/ENVIRONMENT.md" for n in sorted(read - documented)]
    out += [f"{n}: in docs/ENVIRONMENT.md but no longer read in the sources"
            for n in sorted(documented - read)]
    out += [f"{n}: documented {rows.count(n)} times" for n in sorted(documented)
            if rows.count(n) > 1]
    return out


def main() -> int:
    root = pathlib.Path(sys.argv[1])
    read = read_in_source(root)
    doc = (root / "docs" / "ENVIRONMENT.md").read_text(encoding="utf-8")
    failures = []
    if len(read) < 30:
        failures.append(f"only {len(read)} variables found in the sources: the scan is broken")
    failures += problems(read, doc)
    readme = (root / "README.md").read_text(encoding="utf-8")
    if "docs/ENVIRONMENT.md" not in readme:
        failures.append("README.md does not link docs/ENVIRONMENT.md")

    # The check itself: a removed row and a made-up one are both found.
    first = ROW.search(doc)
    mutated = doc.replace(first.group(0), "| `ZIMAGE_NOT_A_SETTING` |", 1)
    found = problems(read, mutated)
    if not any(first.group(1) in p and "not in docs" in p for p in found) or \
            not any("ZIMAGE_NOT_A_SETTING" in p and "no longer read" in p for p in found):
        failures.append(f"the check missed a removed or made-up row: {found}")

    for f in failures:
        print("FAIL:", f)
    if not failures:
        print(f"docs/ENVIRONMENT.md lists the {len(read)} variables the sources read")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
