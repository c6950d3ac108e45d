"""Nothing read is ever executed: the source tree is scanned (`ast`) for pickle, eval/exec and data-named imports."""

from __future__ import annotations

from pathlib import Path

from reliabilitytools import (
    ROOT,
)

# Where a module named at run time may be imported: exactly where a user names their own spec module on the command
# line (`--spec`), and the worker processes that import the same modules for certify (and for the census), plus the
# registry's import of its own constant list of kernel families. Nothing read from a file names a module.
IMPORT_ALLOWED = {
    ("nbxcert/dirscan.py", "load_specs"),  # `--spec MODULE` of certify/validate/merge
    ("nbxcert/worker.py", "_serve"),  # the modules certify passes to its workers (its own `--spec`)
    ("nbxcert/worker.py", "serve_cross_compiling"),  # the modules `nbxcert census/bundle --spec` pass to their workers
    ("kernels/spec.py", "load_all"),  # f"nbxcert.kernels.{module}" over the constant FAMILY_MODULES
    ("nbxcert/ops.py", "_family"),  # f"nbxcert.kernels.{module}", the module checked against FAMILY_MODULES first
    # a kernel module's own `__digest_modules__` (its source's constant tuple), each refused unless it is one of
    # nbxcert's kernel or oracle modules
    ("nbxcert/fingerprint.py", "_reachable"),
}
BANNED_MODULES = {"pickle", "_pickle", "cPickle", "marshal", "shelve", "dill", "cloudpickle", "jsonpickle", "runpy"}
BANNED_BUILTINS = {"eval", "exec", "compile", "__import__"}
UNSAFE_YAML = {"unsafe_load", "full_load", "load_all", "unsafe_load_all", "full_load_all", "Loader", "FullLoader"}


def _findings(path: Path, rel: str | None = None) -> list[str]:
    import ast

    rel = rel or path.relative_to(ROOT).as_posix()
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    function_of: dict[int, str] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                function_of.setdefault(id(node), fn.name)  # outermost function first: walk order is breadth-first
    for node in ast.walk(tree):
        where = f"{rel}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            found += [f"{where}: imports {a.name}" for a in node.names if a.name.split(".")[0] in BANNED_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in BANNED_MODULES:
            found.append(f"{where}: imports from {node.module}")
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in BANNED_BUILTINS:
                found.append(f"{where}: calls {f.id}()")
            if isinstance(f, ast.Attribute) and f.attr in ("import_module", "__import__"):
                constant = node.args and isinstance(node.args[0], ast.Constant)
                if not constant and (rel, function_of.get(id(node))) not in IMPORT_ALLOWED:
                    found.append(f"{where}: imports a module named at run time ({ast.unparse(node)})")
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "yaml":
                if f.attr in UNSAFE_YAML:
                    found.append(f"{where}: yaml.{f.attr}")
                if f.attr == "load":
                    loader = next((k.value for k in node.keywords if k.arg == "Loader"), None)
                    if loader is None or "Safe" not in ast.unparse(loader):
                        found.append(f"{where}: yaml.load without a safe loader")
            for k in node.keywords:
                if k.arg == "allow_pickle" and not (isinstance(k.value, ast.Constant) and k.value.value is False):
                    found.append(f"{where}: allow_pickle")
    return found


def test_nothing_read_is_ever_executed_no_pickle_eval_exec_or_data_named_import():
    files = [p for d in ("nbxcert", "kernels", "oracles") for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 20
    findings = [f for p in files for f in _findings(p)]
    assert findings == [], "\n".join(findings)
    # the allow-list names real places (a stale entry would allow a new one unnoticed)
    for rel, fn in IMPORT_ALLOWED:
        path = ROOT / rel
        if path.exists():  # census.py is optional
            assert f"def {fn}(" in path.read_text(), (rel, fn)


def test_the_scan_finds_what_it_looks_for(tmp_path):
    bad = tmp_path / "probe.py"
    bad.write_text(
        "import pickle\nimport importlib, yaml\n"
        "def f(name, text):\n"
        "    eval(text)\n    exec(text)\n    importlib.import_module(name)\n    yaml.load(text, Loader=yaml.Loader)\n"
    )
    found = "\n".join(_findings(bad, "nbxcert/probe.py"))
    for what in ("imports pickle", "calls eval()", "calls exec()", "named at run time", "without a safe loader"):
        assert what in found, found
