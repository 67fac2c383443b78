#!/usr/bin/env python3
"""test_struct_tools.py — tools/struct_fields.py (no struct over 30 members: the tree passes, a 31-member struct
fails, nested structs and multi-declarator lines counted as the tool says) and tools/mode_flags.py (reads of
memory-mode flags counted; assignments, enumerators, comments and the excluded files not)."""
import os
import subprocess
import sys

from qt_test import ROOT, run_tests


def tool(name, args, cwd):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", name), *args], cwd=cwd, capture_output=True,
                       text=True)
    return r.returncode, r.stdout + r.stderr


def write(root, path, text):
    os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
    with open(os.path.join(root, path), "w") as f:
        f.write(text)


def test_tree_has_no_struct_over_30(tmp):
    rc, out = tool("struct_fields.py", [], ROOT)
    assert rc == 0, out


def test_struct_fields_counts(tmp):
    members = "".join(f"    int x{i};\n" for i in range(29))
    write(tmp, "src/a.c", "typedef struct {\n" + members +                     # 29 + 1 nested + 1 pair line = 31
          "    struct { int y; /* int z; */ } inner;\n    float a, b;\n} big;\n"
          "struct ok {\n" + members + "#ifdef X\n    int p;\n#endif\n};\n"     # 30: the directive lines do not count
          'static const char *s = "struct fake { int a; int b; }";\n')
    rc, out = tool("struct_fields.py", ["--all"], tmp)
    assert rc == 1, out
    assert "src/a.c:1: big: 31 members (more than 30)" in out, out
    assert "ok: 30 members\n" in out and "inner: 1 members" in out and "fake" not in out, out
    rc, out = tool("struct_fields.py", ["--max", "31"], tmp)
    assert rc == 0 and out == "", out


def test_mode_flags_counts(tmp):
    write(tmp, "src/gpu/x.c",
          "void f(const qt_plan *p, qt_config *c) {\n"
          "    if (p->weights.host_one) g();\n"              # read: counts
          "    int z = p->parallel.zero >= 2 ? 1 : 0;\n"     # read: counts
          "    c->memory.zero_copy = 1;\n"                   # assignment only: does not count
          "    /* p->grads.sharded in a comment */\n"
          '    puts("optimizer.host");\n'
          "    h(c->memory.offload & QT_OFF_WEIGHTS, p->acts.recompute);\n"  # one line, two reads: counts once
          "    k(p->weights.overlap, p->precision.fp8);\n"  # not memory-mode flags
          "}\n")
    write(tmp, "include/y.h", "typedef enum {\n    QT_DP_ONE,\n    QT_DP_SHARDED = 2,\n} m;\n")
    write(tmp, "src/plan/plan.c", "int g(const qt_plan *p) { return p->weights.slots; }\n")
    rc, out = tool("mode_flags.py", ["--list"], tmp)
    assert rc == 0, out
    assert "    3  src/gpu/x.c" in out and "mode_flags: 3 lines" in out and "plan.c" not in out, out
    assert "src/gpu/x.c:2:" in out and "src/gpu/x.c:3:" in out and "src/gpu/x.c:7:" in out, out
    rc, out = tool("mode_flags.py", ["--max", "2"], tmp)
    assert rc == 1, out
    rc, out = tool("mode_flags.py", ["--max", "2", "--exclude", "src/gpu"], tmp)
    assert rc == 0 and "mode_flags: 0 lines" in out, out


if __name__ == "__main__":
    sys.exit(run_tests(globals(), sys.argv[1:]))
