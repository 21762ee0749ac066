"""fusebox_tools by purpose (issue 30): subpackages core, bench, models and crosscheck, each
module with a docstring; every `fusebox_tools.X.Y` a script, doc, test or the CLI names is a
module that exists (GPU scripts are run where this cannot be tested: a stale name would only
fail there); and no sys.path edits anywhere."""
import ast
import os
import re
import subprocess

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
PKG = os.path.join(ROOT, "python", "fusebox_tools")
SUBPACKAGES = {"core", "bench", "models", "crosscheck"}


def modules():
    out = set()
    for dirpath, _, names in os.walk(PKG):
        rel = os.path.relpath(dirpath, os.path.join(ROOT, "python")).replace(os.sep, ".")
        for n in names:
            if n.endswith(".py"):
                out.add(rel if n == "__init__.py" else f"{rel}.{n[:-3]}")
    return out


def test_subpackages_only_and_every_module_says_what_it_is_for():
    top = {n for n in os.listdir(PKG) if not n.startswith(("_", "."))}
    assert top == SUBPACKAGES, "modules belong in a subpackage: " + ", ".join(sorted(top - SUBPACKAGES))
    for dirpath, _, names in os.walk(PKG):
        for n in names:
            if n.endswith(".py"):
                path = os.path.join(dirpath, n)
                assert ast.get_docstring(ast.parse(open(path).read())), f"{path}: no docstring"


def tracked_text_files():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    for f in files:
        if f.endswith((".py", ".sh", ".md", ".cpp", ".h", ".toml", ".txt", ".ini")) or f in ("Makefile",):
            try:
                yield f, open(os.path.join(ROOT, f)).read()
            except (OSError, UnicodeDecodeError):
                continue


def test_every_named_module_exists():
    known = modules()
    bad = []
    for f, text in tracked_text_files():
        for m in re.finditer(r"fusebox_tools(?:\.[a-z_0-9]+)+", text):
            name = m.group(0)
            # a name may go on to an attribute: fusebox_tools.core.graph.REPO_ROOT
            if name not in known and not any(name.startswith(k + ".") for k in known if k.count(".") >= 2):
                bad.append(f"{f}: {name}")
    assert not bad, "names of modules that do not exist:\n" + "\n".join(sorted(set(bad)))


def test_no_sys_path_edits():
    bad = [f for f, text in tracked_text_files()
           if f.endswith(".py") and re.search(r"sys\.path\.(insert|append)", text)
           and not f.endswith("test_tools_layout.py")]
    assert not bad, "sys.path edits (run with PYTHONPATH=python, or `python3 -m`): " + ", ".join(bad)
