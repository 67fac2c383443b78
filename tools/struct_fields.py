#!/usr/bin/env python3
"""struct_fields.py [--max N] [--all] [DIR...] — no struct or union with more than N members (default 30).

Counts each member declaration of every struct and union body in the C/CUDA sources and headers of src/,
cuda/, comm/ and include/ (or the DIRs given): one per `;` at the body's own depth, so `int a, b;` is one
member and a nested struct or union is one member of its parent (and is counted on its own). Comments,
strings and preprocessor lines are ignored. Prints each struct over the limit (file:line name count) and
exits 1 when there is one; --all lists every struct with its count, largest first."""
import glob
import re
import sys

DIRS = ("src", "cuda", "comm", "include")
EXTS = ("c", "h", "cu", "cuh")


def strip(text):
    """The text with comments, string and char literals and preprocessor lines blanked; newlines kept."""
    def blank(m):
        return re.sub(r"[^\n]", " ", m.group(0))
    text = re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', blank, text, flags=re.S)
    return re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", blank, text, flags=re.M)


def structs(path):
    """(line, name, members) for each struct/union body of a file."""
    text = strip(open(path, encoding="utf-8", errors="replace").read())
    out = []
    for m in re.finditer(r"\b(struct|union)\b\s*(\w*)\s*\{", text):
        depth, members, i = 0, 0, m.end() - 1
        while i < len(text):
            c = text[i]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    break
            elif c == ";" and depth == 1:
                members += 1
            i += 1
        name = m.group(2)
        if not name:  # typedef struct { ... } name;  or  struct { ... } member;
            after = re.match(r"\}\s*(\w+)", text[i:])
            name = after.group(1) if after else "(anonymous)"
        out.append((text.count("\n", 0, m.start()) + 1, name, members))
    return out


def main():
    args = sys.argv[1:]
    limit, show_all = 30, False
    if "--all" in args:
        args.remove("--all")
        show_all = True
    if "--max" in args:
        k = args.index("--max")
        limit = int(args[k + 1])
        del args[k:k + 2]
    rows = []
    for d in args or DIRS:
        for ext in EXTS:
            for path in sorted(glob.glob(d + "/**/*." + ext, recursive=True)):
                rows += [(n, path, line, name) for line, name, n in structs(path)]
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    over = [r for r in rows if r[0] > limit]
    for n, path, line, name in rows if show_all else over:
        print(f"{path}:{line}: {name}: {n} members" + (f" (more than {limit})" if n > limit else ""))
    if over:
        print(f"struct_fields: {len(over)} struct(s) with more than {limit} members: group members that belong "
              "together into named sub-structs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
