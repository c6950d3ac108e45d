"""What a certification's result depends on in nbxcert's own code: a digest per kernel spec.

A certificate's winner is a function of the kernel's code (its module and every `nbxcert.kernels` / `nbxcert.oracles`
module it draws on: launch code, inputs, oracle, shared helpers), of the engine that runs, judges, times and chooses
(ENGINE_MODULES), and of the profile's device file (its prune facts and tolerances). `code_digest` hashes exactly
those source files (their code: comments and docstrings left out, `code_text`), so `certify` sweeps a key again when
any of them changed and skips it when none did, whatever nbxcert's version says (a release that touches one family
re-certifies that family only). Entries made before this digest existed carry none: they are compared by nbxcert's
version, as then.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import io
import sys
import tokenize
import types
from importlib import resources
from pathlib import Path

# Modules whose code decides, for every kernel, which problems a key stands for, which candidates run, how they are
# judged and timed, and which wins (listed, not followed: some are imported lazily, and only in the workers). Not
# listed: the worker processes' plumbing (`nbxcert.worker`: starting, feeding and replacing them, labelling a dead or
# hung one's refusal), the compile pools (`ahead`, `crosspool`) and `certify`'s own scheduling, which decide no verdict.
ENGINE_MODULES = (
    "nbxcert.keys",
    "nbxcert.profiles",
    "nbxcert.sweep",
    "nbxcert.runner",
    "nbxcert.kernels.check",
    "nbxcert.kernels.compare",
    "nbxcert.kernels.judge",
    "nbxcert.kernels.dtypes",
    "nbxcert.kernels.spec",
    "nbxcert.kernels.backends.cuda",
    "nbxcert.kernels.backends.triton_cuda",
    "nbxcert.kernels.backends.interpreter",
    # the oracles' float64 products (matmul, fused MoE, the dequantizing products, attention), which their families
    # import inside the oracle adapters, where no module's globals show them
    "nbxcert.kernels.products",
    "nbxcert.kernels.backends.cublas",
)
# Only modules under these prefixes are followed from a kernel's own module (the engine is listed above).
FOLLOWED = ("nbxcert.kernels.", "nbxcert.oracles.")

_memo: dict[tuple[str, str], str] = {}
_texts: dict[tuple[Path, bytes], bytes] = {}


def code_text(source: bytes) -> bytes:
    """`source` as the digest reads it: without its comments, its docstrings (module, class and function) and its
    blank lines and trailing spaces, so that an edit of prose alone keeps every digest (and no key is swept again for
    it). What is left is hashed as written: a change of code, its layout included, changes the digest. A docstring
    that shares a line with code is kept (removing whole lines only is what makes this exact)."""
    # lines as Python counts them: only \r\n, \r and \n end one (str.splitlines also breaks at a form feed)
    text = source.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    cut: dict[int, int] = {}  # 0-based line -> the column its comment starts at
    dropped: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) or not body:
            continue
        first = body[0]
        if not (
            isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
        ):
            continue
        start, end = first.lineno - 1, first.end_lineno - 1
        after = lines[end].encode("utf-8")[first.end_col_offset :].decode("utf-8").strip()
        if lines[start][: first.col_offset].strip() == "" and (after == "" or after.startswith("#")):
            dropped.update(range(start, end + 1))
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            cut[token.start[0] - 1] = token.start[1]
    kept = []
    for i, line in enumerate(lines):
        if i in dropped:
            continue
        line = line[: cut[i]] if i in cut else line
        if line.strip():
            kept.append(line.rstrip())
    return "\n".join(kept).encode("utf-8")


def _source_code(path: Path) -> bytes:
    raw = path.read_bytes()
    key = (path, hashlib.sha256(raw).digest())
    if key not in _texts:
        _texts[key] = code_text(raw)
    return _texts[key]


def _module_file(name: str) -> Path | None:
    """The module's source file, found without importing it (the engine's modules need not be loaded here)."""
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None) if module is not None else None
    if path is None:
        found = importlib.util.find_spec(name)
        path = found.origin if found is not None else None
    return Path(path) if path else None


def _reachable(start: str) -> set[str]:
    """`start` and every module under FOLLOWED its globals refer to (modules, or functions and classes defined in
    one), followed transitively, and those a module names in `__digest_modules__`: the modules it imports only when
    it runs (no global shows them), such as the pointwise kernels' oracle module and type promotion."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen or name not in sys.modules:
            continue
        seen.add(name)
        module = sys.modules[name]
        package = hasattr(module, "__path__")
        for declared in getattr(module, "__digest_modules__", ()):
            if not declared.startswith(FOLLOWED):
                raise RuntimeError(f"{name}.__digest_modules__ names {declared}, which is outside {FOLLOWED}")
            importlib.import_module(declared)
            todo.append(declared)
        for value in vars(module).values():
            if isinstance(value, types.ModuleType):
                other = value.__name__
                if package and other.startswith(name + "."):
                    # a package's submodule appears among its globals once anything imports it (`backends.cuda`
                    # after a lazy import): following it would make the digest depend on what ran first
                    continue
            else:
                other = getattr(value, "__module__", None)
                if not isinstance(other, str):
                    continue
            if other.startswith(FOLLOWED) and other not in seen:
                todo.append(other)
    return seen


def code_digest(spec, profile) -> str:
    """A digest (16 hex digits) of the source files a certification of `spec` on `profile` depends on."""
    home = spec.launch.__module__
    memo_key = (spec.name, profile.key)
    if memo_key in _memo:
        return _memo[memo_key]
    modules = _reachable(home) | _reachable(spec.oracle.__module__) | set(ENGINE_MODULES)
    for kernel in spec.kernels:  # a @triton.jit kernel's own module (JITFunction keeps the function as .fn)
        module = getattr(getattr(kernel, "fn", kernel), "__module__", None)
        modules |= _reachable(module) if isinstance(module, str) else set()
    digest = hashlib.sha256()
    for name in sorted(modules):
        path = _module_file(name)
        if path is None:
            raise RuntimeError(f"the code digest of kernel {spec.name} needs module {name}, which has no source file")
        digest.update(name.encode() + b"\0" + _source_code(path) + b"\0")
    device_file = resources.files("nbxcert.devices").joinpath(*Path(profile.path).parts[1:])
    digest.update(profile.path.encode() + b"\0" + device_file.read_bytes())
    _memo[memo_key] = value = digest.hexdigest()[:16]
    return value
