"""The `nbxcert` command line: thin Typer commands that parse, call the engine, and render (Rich or `--json`).

No logic lives here. Every `NbxcertError` a command meets becomes one line on stderr through `ERROR_TABLE` (what
failed, then what to do next) and exit code 1; a traceback is shown only with `NBXCERT_DEBUG=1`. Typer's own usage
errors (an unknown option, a value that is not a number) keep Typer's exit code 2.

Output is never cut: key texts, paths and certificate text are printed verbatim (never read as Rich markup), tables
wrap a long cell on a terminal and print each row on one line when piped (`_show`), and long commands say what they
are doing on stderr at least every `PROGRESS_S` seconds when it is not a terminal (`_Heartbeat`).
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from nbxcert import errors
from nbxcert._version import __version__

_PIPED_WIDTH = 100_000  # piped, a table row is one line however long: no key, path or number is cut


def _sane_widths() -> None:
    """COLUMNS and TERMINAL_WIDTH (Typer's) that no table or help text can be drawn in are dropped, so the terminal's
    own width is used: `COLUMNS=99999999999 nbxcert --help` ended in MemoryError, `TERMINAL_WIDTH=abc` in ValueError,
    and on a terminal `COLUMNS=0` printed no table at all."""
    for name in ("COLUMNS", "TERMINAL_WIDTH"):
        value = os.environ.get(name)
        if value is not None and not (value.isascii() and value.isdigit() and 1 <= int(value[:7]) <= _PIPED_WIDTH):
            del os.environ[name]


_sane_widths()  # before the consoles below read COLUMNS
app = typer.Typer(
    name="nbxcert",
    help="Certify Triton kernel launch configurations per GPU class against float64 oracles, and serve them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)

# The options several commands take, declared once (Typer reads an `Annotated` alias as it reads the annotation).
WorkloadOption = Annotated[str | None, typer.Option(help="A shipped workload name or a workload YAML file.")]
HfConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--hf-config",
        help="A Hugging Face model config.json (or its directory): the workload of the model as published.",
    ),
]
KeysFileOption = Annotated[Path | None, typer.Option("--keys", help="A keys file (JSON lines).")]
KeyOption = Annotated[list[str] | None, typer.Option(help="A launch key text (repeatable).")]
KernelsOption = Annotated[str | None, typer.Option(help="Only these kernels (comma-separated).")]
SpecOption = Annotated[
    list[str] | None, typer.Option(help="Import a module registering your own KernelSpec (repeatable).")
]
SpecModuleOption = Annotated[list[str] | None, typer.Option(help="Import a module registering your own KernelSpec.")]
DirOption = Annotated[list[Path] | None, typer.Option("--dir", help="Certificate directory (repeatable).")]
SearchDirOption = Annotated[
    list[Path] | None,
    typer.Option("--dir", help="Certificate directory (repeatable; default: the serving search path)."),
]
JobsOption = Annotated[int | None, typer.Option(help="Parallel compile workers (default: the CPU count).")]
OnlyProfileOption = Annotated[str | None, typer.Option(help="Only this profile (default: every profile).")]
CertDirArgument = Annotated[Path, typer.Argument(help="A certificate directory (<vendor>/<profile>/*.json).")]
IndexDirArgument = Annotated[Path | None, typer.Argument(help="Certificate directory (default: the shipped one).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print as JSON.")]
JsonReportOption = Annotated[bool, typer.Option("--json", help="Print the report as JSON.")]
JsonKeysOption = Annotated[
    bool, typer.Option("--json", help="Print the report as JSON: totals and one record per key.")
]


# One table: each error type -> the label its line starts with. The message names the file/key/value; the hint
# (carried by the exception) says what to do next.
ERROR_TABLE: dict[type[errors.NbxcertError], str] = {
    errors.DTypeError: "unknown dtype",
    errors.ViewError: "bad view",
    errors.ShapeMismatch: "shape mismatch",
    errors.DeviceNotFound: "no such device",
    errors.DTypeNotSupported: "dtype not supported",
    errors.CastRefused: "cast refused",
    errors.ArgumentNotSupported: "argument not supported",
    errors.BackendUnavailable: "backend unavailable",
    errors.DeviceOutOfMemory: "out of device memory",
    errors.CudaError: "CUDA error",
    errors.LaunchError: "launch refused",
    errors.GraphRefused: "graph refused",
    errors.DeviceFileInvalid: "invalid device file",
    errors.DeviceFactMissing: "missing device fact",
    errors.ProfileNotFound: "unknown profile",
    errors.ProfileMismatch: "wrong profile for this device",
    errors.KernelSpecInvalid: "invalid kernel spec",
    errors.KernelNotFound: "unknown kernel",
    errors.PruneEmpty: "no candidate left",
    errors.OracleMismatch: "mismatch",
    errors.KeyParseError: "bad launch key",
    errors.KeyNotCertified: "key not certified",
    errors.WorkloadInvalid: "invalid workload",
    errors.HfConfigInvalid: "invalid Hugging Face config",
    errors.CertificateInvalid: "invalid certificate",
    errors.IndexCorrupt: "corrupt index",
    errors.BundleCorrupt: "corrupt bundle",
    errors.ProvenanceMismatch: "provenance mismatch",
    errors.UsageError: "usage",
}


def error_line(e: errors.NbxcertError) -> str:
    """The one line an error is: control characters in the values it names escaped (a key or path holding a newline
    made it two lines; an undecodable byte of a path made printing it raise)."""
    from nbxcert.text import printable

    label = next((lab for cls, lab in ERROR_TABLE.items() if isinstance(e, cls)), "error")
    line = f"nbxcert: {label}: {e.message}"
    if e.hint:
        line += f" -> {e.hint}"
    return printable(line)


def os_error_line(e: OSError) -> str:
    """The one line an error of the OS is: what failed, on which path, and what to do."""
    from nbxcert.text import printable

    where = "".join(f" {p}" for p in (e.filename, e.filename2) if p is not None)
    what = e.strerror or type(e).__name__
    return printable(
        f"nbxcert: system error: {what}:{where or ' (no path)'} -> check that path (permissions, free space) and run "
        "the command again; NBXCERT_DEBUG=1 shows the traceback"
    )


def handled(fn: Callable, interrupted: str = "") -> Callable:
    """Turn an `NbxcertError` (or an `OSError`) into one line on stderr and exit code 1 (traceback with
    NBXCERT_DEBUG=1); an interrupt into "nbxcert: interrupted" plus `interrupted` (what the command keeps) and exit
    code 130."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            from nbxcert.options import env_flag

            env_flag("NBXCERT_DEBUG")  # `=yes` or `=true` refused by name: read as off, it showed no traceback
            return fn(*args, **kwargs)
        except errors.NbxcertError as e:
            if os.environ.get("NBXCERT_DEBUG") == "1":
                raise
            print(error_line(e), file=sys.stderr)
            raise typer.Exit(1) from None
        except BrokenPipeError:  # the reader went away (`nbxcert keys ... | head -1`): no error of nbxcert's
            _quiet_stdout()
            raise typer.Exit(141) from None  # as a process ended by SIGPIPE reports it (128 + 13)
        except OSError as e:  # what the checks cannot foresee (a disk full, a file removed meanwhile): one line too
            if os.environ.get("NBXCERT_DEBUG") == "1":
                raise
            print(os_error_line(e), file=sys.stderr)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            if os.environ.get("NBXCERT_DEBUG") == "1":
                raise
            print(f"nbxcert: interrupted{interrupted}", file=sys.stderr)
            raise typer.Exit(130) from None

    return wrapper


def _quiet_stdout() -> None:
    """Point stdout at /dev/null once its reader has gone, so that flushing it at exit raises no second error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout with no file descriptor (a test's capture): nothing to flush into a pipe
        pass


def resumable(fn: Callable) -> Callable:
    """`handled` for a command whose work survives an interrupt (certify writes each key's entry as it is done)."""
    return handled(
        fn,
        "; every certificate entry written so far is kept (a rerun of the same command resumes where this one stopped)",
    )


def _key_line(kr, bar, task, elapsed: float) -> str:
    """One line per key as it finishes (a log reader sees progress and where the time goes); `elapsed`: seconds since
    the run began, `at T s` (the progress lines' clock: what passes between keys is in it, not in any key's time)."""
    done = int(bar.tasks[task].completed)
    total = int(bar.tasks[task].total or 0)
    s = kr.seconds or {}
    line = f"[nbxcert] {done}/{total} {kr.status} {kr.key}"
    if s:
        # wall-time parts that add up to the key's time (`sweep.sweep_key`): compile (its wait beyond the inputs and
        # the oracle, made meanwhile), inputs, oracle, checks, timing, record
        parts = [(n, s.get(n)) for n in ("compile", "inputs", "oracle", "checks", "timing", "record")]
        line += f" in {s.get('total', 0.0):.1f} s (" + ", ".join(f"{n} {v:.1f}" for n, v in parts if v is not None)
        line += ")"
    line += f" at {elapsed:.1f} s"
    if kr.winner:
        line += f": {kr.winner}"
    if kr.reason:
        line += f": {kr.reason}"
    return line


# A long command run with stderr not a terminal (CI, a log file) says what it is doing at least this often.
PROGRESS_S = 5.0
_MIN_CELL = 4  # a terminal narrower than this many characters per column (plus borders) gets one row per line


def _show(table: Table) -> None:
    """Print a table whole. On a terminal a long cell wraps inside its column (Rich cut it with '…': keys lost their
    shape, numbers read `2.223e+…`); piped, or on a terminal too narrow for a few characters a column (at 5 columns
    Rich printed empty cells: the keys were lost), every row is one line, so a key, a path or a number is whole and
    can be grepped."""
    for column in table.columns:
        column.overflow = "fold"
    if out.is_terminal and out.width >= (_MIN_CELL + 3) * len(table.columns) + 1:
        out.print(table)
    else:
        Console(file=out.file, width=_PIPED_WIDTH, force_terminal=out.is_terminal or None).print(table)


class _Heartbeat:
    """While a long command works with stderr not a terminal, a line on stderr every PROGRESS_S seconds: what it is
    doing and for how long (piped, `census` printed nothing for minutes; on a terminal the progress bar says it)."""

    def __init__(self, what: str, state: str = "starting"):
        self.what, self.state = what, state
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _Heartbeat:
        if not err.is_terminal:
            self._thread = threading.Thread(target=self._run, name="nbxcert-heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def elapsed(self) -> float:
        """Seconds since the work began (the clock of its progress lines)."""
        return time.monotonic() - self._t0

    def _run(self) -> None:
        from nbxcert.text import printable

        while not self._stop.wait(PROGRESS_S):
            line = f"[nbxcert] {self.what}: {self.state} ({self.elapsed():.0f} s)"
            sys.stderr.write(printable(line) + "\n")  # one write: never split by another thread's line
            sys.stderr.flush()


def _progress():
    """The progress bar of a long command, on stderr: description, bar, done/total, elapsed and remaining time; shown
    only on a terminal (piped, `_Heartbeat` says what is being done) and gone when finished."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    columns = [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}")]
    return Progress(
        *columns,
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )


def _version_callback(value: bool):
    if value:
        print(f"nbxcert {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", help="Print nbxcert's version and exit.", callback=_version_callback)
    ] = False,
):
    """nbxcert: certified Triton launch configurations, per GPU class."""
    from nbxcert.worker import quiet_interpreter

    quiet_interpreter()  # the interpreter's numpy warnings leaked into certify's and verify's output


def _oracle_products() -> str:
    """Which float64 product the oracles of this run use (`kernels.products`), for certify's log."""
    from nbxcert.kernels import products
    from nbxcert.kernels.backends import select

    return products.describe(select().device)


def _compile_pool() -> str:
    """Where this run's candidates compile (`crosspool.describe`), for certify's log; a bad NBXCERT_COMPILE_POOL is
    refused here, before any key."""
    from nbxcert import crosspool
    from nbxcert.kernels.backends import select

    return crosspool.describe(select().name)


def _yes(flag: bool) -> str:
    return "[green]yes[/green]" if flag else "[red]no[/red]"


@app.command()
@handled
def doctor(json_out: JsonReportOption = False):
    """Tell the truth about this machine: backend, GPUs on the PCI bus, runtimes, profile match, versions."""
    from nbxcert.doctor import run_doctor

    with _Heartbeat("doctor", "looking at the machine and reading the certificates"):
        report = run_doctor()
    code = 0 if report.backend_usable else 1
    if json_out:
        print(json.dumps(report.as_dict(), indent=2, sort_keys=True))
        raise typer.Exit(code)
    t = Table(title="nbxcert doctor", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    # every value from the machine through _cell: a path holding `[bold]` in a problem was read as markup
    t.add_row("backend", _cell(f"{report.backend} ({report.backend_reason})"))
    t.add_row("backend usable", _yes(report.backend_usable))
    if not report.pci_gpus:
        t.add_row("GPUs on the PCI bus", "none")
    for g in report.pci_gpus:
        t.add_row(
            _cell(f"PCI {g.address}"),
            _cell(f"{g.vendor} {g.vendor_id}:{g.device_id} (class {g.pci_class}); {g.runtime_library or 'no runtime'} ")
            + Text.from_markup(f"loads: {_yes(g.runtime_loads)}; Triton backend: {_yes(g.triton_backend)}"),
        )
    for c in report.cuda_gpus:
        t.add_row(
            f"cuda:{c.index}",
            _cell(f"{c.name}, compute capability {c.compute_capability}, {c.total_memory_bytes / 2**30:.1f} GiB"),
        )
        profile_row = f"{c.profile} ({c.profile_match} match), memory class {c.memory_class}"
        t.add_row(f"cuda:{c.index} profile", _cell(profile_row))
        if c.profile_notice:
            t.add_row(f"cuda:{c.index} notice", _cell(c.profile_notice))
        t.add_row(f"cuda:{c.index} certified keys", str(c.certified_keys))
    if report.cuda_gpus:
        t.add_row("driver / CUDA", _cell(f"{report.driver_version} / {report.cuda_version}"))
    for name, version in report.versions.items():
        t.add_row(_cell(name), _cell(version))
    t.add_row("torch importable", f"{'yes' if report.torch_importable else 'no'} (information only: never imported)")
    if report.oracle_products:
        t.add_row("oracle products", _cell(report.oracle_products))
    if report.compile_pool:
        t.add_row("compile pool", _cell(report.compile_pool))
    _serving_row(t, report.serving)
    _certificate_rows(t, report.certificates)
    for p in report.problems:
        t.add_row("[red]problem[/red]", _cell(p))
    for a in report.advice:
        t.add_row("[yellow]next step[/yellow]", _cell(a))
    _show(t)
    raise typer.Exit(code)


def _serving_row(t: Table, serving: dict) -> None:
    """`nbxcert doctor`'s row for the settings a serving process reads (a refused one is also a problem row)."""
    if not serving:
        return

    def flag(name: str) -> str:
        value = serving.get(name)
        return "refused" if isinstance(value, str) else "on" if value else "off"

    uncertified = serving.get("uncertified", "")
    line = (
        f"certified-only {flag('certified_only')} (NBXCERT_CERTIFIED_ONLY); strict provenance "
        f"{flag('strict_provenance')} (NBXCERT_STRICT_PROVENANCE); a key with no certificate: "
        f"{'refused' if uncertified.startswith('refused') else uncertified} (NBXCERT_UNCERTIFIED); "
        f"index cache {serving['cache_dir']} ({'writable' if serving['cache_writable'] else 'not writable'}); "
        f"search path {':'.join(serving['search_path'])}"
    )
    t.add_row("serving", _cell(line))


def _certificate_rows(t: Table, certs: dict) -> None:
    """`nbxcert doctor`'s rows for the certificates that apply to this machine and the ones it rejects."""
    if not certs:
        return
    m = certs["machine"]
    applies = sum(row["apply"] for row in certs["profiles"].values())
    rejected = sum(row["rejected"] for row in certs["profiles"].values())
    t.add_row(
        "certificates",
        _cell(
            f"{applies} apply to this machine ({m['profile']}, {m['memory_class']} class, Triton {m['triton_major']}, "
            f"driver {m['driver_major']}); {rejected} rejected; {certs['invalid_count']} problems; "
            f"read from {', '.join(certs['dirs']) or 'no directory'}"
        ),
    )
    for profile, row in sorted(certs["profiles"].items()):
        reasons = "; ".join(f"{reason} ({n})" for reason, n in sorted(row["reasons"].items()))
        line = f"{row['apply']} apply, {row['rejected']} rejected" + (f": {reasons}" if reasons else "")
        t.add_row(_cell(f"certificates {profile}"), _cell(line))
    if certs["rejected"]:
        mode = "refused: NBXCERT_STRICT_PROVENANCE=1" if certs["strict"] else "served with a notice"
        t.add_row("made elsewhere", _cell(f"{len(certs['rejected'])} of this machine's profile ({mode})"))
    for problem in certs["invalid"][:5]:
        t.add_row("[red]invalid certificate[/red]", _cell(f"{problem['file']}: {problem['reason']}"))


@app.command()
@handled
def profiles(json_out: JsonOption = False):
    """List the shipped device profiles: backend, target, memory classes (what --memory-class takes), cards."""
    from nbxcert.memory_class import classes_of
    from nbxcert.profiles import all_profiles

    rows = [
        {
            "profile": p.key,
            "backend": p.backend,
            "target": p.target_arch,
            "memory_classes": classes_of(p),
            "skus": [s.name for s in p.skus],
            "description": p.description,
        }
        for p in all_profiles()
    ]
    if json_out:
        print(json.dumps(rows, indent=2))
        return
    t = Table(title="device profiles")
    for col in ("profile", "backend", "target", "memory classes", "cards", "description"):
        t.add_column(col)
    for r in rows:
        t.add_row(
            _cell(r["profile"]),
            _cell(r["backend"]),
            _cell(r["target"] or "-"),
            _cell(", ".join(r["memory_classes"])),
            _cell("; ".join(r["skus"]) or "-"),
            _cell(r["description"]),
        )
    _show(t)


@app.command()
@handled
def kernels(
    spec: SpecModuleOption = None,
    json_out: JsonOption = False,
):
    """List every registered kernel spec: name, dtypes, key fields, number of candidates."""
    from nbxcert.dirscan import load_specs

    rows = [
        {
            "name": s.name,
            "family": s.family,
            "dtypes": ["/".join(c) for c in s.dtypes],
            "key_fields": [f.name + (f"~{f.ladder}" if f.ladder else "") for f in s.key_fields],
            "candidates": len(s.candidates),
            "default": s.default.label(),
        }
        for s in load_specs(spec or ()).values()
    ]
    if json_out:
        print(json.dumps(rows, indent=2))
        return
    t = Table(title="registered kernels")
    for col in ("name", "family", "dtypes", "key fields", "candidates"):
        t.add_column(col)
    for r in rows:
        t.add_row(
            _cell(r["name"]),
            _cell(r["family"]),
            _cell(", ".join(r["dtypes"])),
            _cell(", ".join(r["key_fields"])),
            str(r["candidates"]),
        )
    _show(t)


def _backend_line() -> None:
    """The first line of every command that launches kernels: which backend, and why."""
    from nbxcert.kernels.backends import select

    print(select().line(), file=sys.stderr)


def _workload(workload, hf_config, keys_file, key):
    """The workload asked for: `--workload`'s name or path, or the one `--hf-config`'s config forms (alone: with another
    source of keys, which one was meant is not known)."""
    from nbxcert.options import hf_config_alone

    if hf_config_alone(hf_config, workload=workload, keys=keys_file, key=key) is None:
        return workload
    from nbxcert.hf_config import load_hf_config

    return load_hf_config(hf_config)


def _asked_keys(profile, key, keys_file, workload, kernels, spec, hf_config=None):
    """(the user's spec modules, the kernels filter, the keys asked for), each checked (`keyfile.gather_keys`)."""
    from nbxcert.dirscan import load_specs
    from nbxcert.keyfile import gather_keys, parse_kernels

    workload = _workload(workload, hf_config, keys_file, key)
    modules = [m.split(":")[0] for m in spec or ()]
    load_specs(modules)  # before the keys: a key of the user's own kernel is checked against its spec
    wanted = parse_kernels(kernels)
    return modules, wanted, gather_keys(profile, key or (), keys_file, workload, wanted)


@app.command()
@handled
def keys(
    profile: Annotated[str, typer.Option(help="Device profile whose ladders bucket the sizes (e.g. hopper).")],
    workload: WorkloadOption = None,
    hf_config: HfConfigOption = None,
    keys_file: KeysFileOption = None,
    key: KeyOption = None,
    kernels: KernelsOption = None,
    spec: SpecOption = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print as JSON lines (a keys file).")] = False,
):
    """Print the launch keys of a workload (the launches a model makes), a keys file or key texts."""
    from nbxcert.profiles import get_profile

    prof = get_profile(profile)
    _modules, _wanted, found = _asked_keys(prof, key, keys_file, workload, kernels, spec, hf_config)
    if json_out:
        for k in found:
            print(json.dumps({"key": k.text()}))
        return
    t = Table(title=_cell(f"{len(found)} launch keys ({prof.key})"))
    t.add_column("kernel")
    t.add_column("key")
    for k in found:
        t.add_row(_cell(k.kernel), _cell(k.text()))
    _show(t)


@app.command()
@resumable
def certify(
    profile: Annotated[str, typer.Option(help="The profile to certify for; must match the device in force.")],
    workload: WorkloadOption = None,
    hf_config: HfConfigOption = None,
    keys_file: KeysFileOption = None,
    key: KeyOption = None,
    kernels: KernelsOption = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="The certificate directory to write (<out>/<vendor>/<profile>/).")
    ] = None,
    shard: Annotated[str | None, typer.Option(help="Certify a deterministic share i/n of the keys.")] = None,
    force: Annotated[bool, typer.Option(help="Re-certify keys certified for this card, versions and code.")] = False,
    jobs: JobsOption = None,
    spec: SpecOption = None,
    timeout: Annotated[
        float | None, typer.Option(help="Seconds one candidate may take to compile, or to check and time.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON; no progress bar.")] = False,
    ahead: Annotated[
        int | None,
        typer.Option(help="How many keys' compiles run ahead of the key on the GPU (default 16; a GPU run only)."),
    ] = None,
):
    """Sweep every requested key on this device and write certificates under --out (resumable; exit 0 only if all
    certified)."""
    from nbxcert.certify import certify as run_certify
    from nbxcert.certify import check_out_dir, keys_ahead, parse_shard, resolve_profile
    from nbxcert.options import jobs as check_jobs
    from nbxcert.options import seconds

    _backend_line()
    share, jobs, timeout = parse_shard(shard), check_jobs(jobs), seconds(timeout)
    if ahead is not None:
        keys_ahead(ahead)
    prof, how = resolve_profile(profile)
    modules, _wanted, found = _asked_keys(prof, key, keys_file, workload, kernels, spec, hf_config)
    check_out_dir(out_dir)
    if how != "exact":
        print(f"[nbxcert] notice: this device runs on the {prof.key} profile by a {how} match", file=sys.stderr)
    total = len(found)
    print(f"[nbxcert] oracle products: {_oracle_products()}", file=sys.stderr)
    print(f"[nbxcert] compile pool: {_compile_pool()}", file=sys.stderr)
    with _Heartbeat(f"certify {prof.key}", f"0/{total} keys done") as beat:
        finished = [0]

        def key_done(kr) -> str:
            finished[0] += 1
            beat.state = f"{finished[0]}/{total} keys done, last {kr.key} {kr.status}"
            return kr.key

        def noted(text: str) -> str:
            beat.state = f"{finished[0]}/{total} keys done; {text}"
            return text

        run = functools.partial(
            run_certify, prof.key, found, out_dir, force, share, jobs, modules=modules, ahead_keys=ahead
        )
        if json_out:
            report = run(timeout_s=timeout, progress=noted, on_key=key_done)
        else:
            with _progress() as bar:
                overall = bar.add_task("keys", total=total)
                current = bar.add_task("", total=None)

                def progress(text: str) -> None:
                    bar.update(current, description=_cell(noted(text)[:110]))

                def on_key(kr) -> None:
                    key_done(kr)
                    bar.advance(overall)
                    line = _key_line(kr, bar, overall, beat.elapsed())
                    bar.console.print(line, markup=False, soft_wrap=True)

                report = run(progress=progress, on_key=on_key, timeout_s=timeout)
    totals = report.totals()
    if json_out:
        print(
            json.dumps(
                {
                    "profile": report.profile,
                    "out": report.out_dir,
                    "totals": totals,
                    "seconds": {k: round(v, 3) for k, v in report.seconds.items()},
                    "keys": [vars(k) for k in report.keys],
                },
                indent=2,
            )
        )
    else:
        t = Table(title=_cell(f"certify {report.profile} ({report.backend}) -> {out_dir}"))
        for col in ("key", "status", "winner", "x default", "refusals", "seconds"):
            t.add_column(col)
        for k in report.keys:
            refused = ", ".join(f"{n} {v}" for n, v in k.counts.items() if v and n != "correct")
            speed = f"{k.speedup_over_default:.2f}" if k.speedup_over_default else "-"
            secs = f"{k.seconds.get('total', 0):.1f}" if k.seconds else "-"
            t.add_row(_cell(k.key), k.status, _cell(k.winner or k.reason), speed, _cell(refused), secs)
        _show(t)
        print(
            _plain(
                f"certified {totals['certified']}, skipped {totals['skipped']} (already certified), "
                f"failed {totals['failed']}; files under {Path(out_dir) / report.profile}; "
                + ", ".join(f"{k} {v:.1f} s" for k, v in report.seconds.items())
            )
        )
    raise typer.Exit(0 if report.ok else 1)


def _keys_to_serve(profile, dirs, key, keys_file, workload, kernels, spec, hf_config=None, nothing=""):
    """(profile, certificate directories, the user's spec modules, keys) of a command serving keys from `dirs` (default:
    the search path) on this device, each checked in this order: directories, environment, profile, the directories'
    certificates of the profile, keys. `nothing`: what the command has to do without them (the refusal's words)."""
    from nbxcert.certificates import iter_files
    from nbxcert.certify import resolve_profile
    from nbxcert.options import check_environment, existing_dirs

    dirs = existing_dirs(dirs)
    check_environment(search_path=dirs is None)
    prof, _how = resolve_profile(profile)
    if dirs and not any(next(iter_files(d, prof.key), None) for d in dirs):
        # a --dir one level too deep (the profile's own folder) served nothing: verify swept every key and passed,
        # warm compiled nothing, listed every key missing and passed
        from nbxcert.dirscan import NO_CERTS_HINT

        where = ", ".join(_plain(d) for d in dirs)
        raise errors.UsageError(f"--dir {where} holds no {prof.key} certificate files: {nothing}", hint=NO_CERTS_HINT)
    modules, _wanted, found = _asked_keys(prof, key, keys_file, workload, kernels, spec, hf_config)
    return prof, dirs, modules, found


def _print_unserved(report, mismatched=()) -> None:
    """The keys a run could not serve, on stderr (missing: no certificate; mismatched: a certified config its oracle
    refused; failed: why), then the report's line on stdout."""
    for k in report.missing:
        print(f"missing: {k}", file=sys.stderr)
    for k, c, r in mismatched:
        print(f"mismatched: {k} with config {c}\n{r}", file=sys.stderr)
    for k, r in report.failed:
        print(_plain(f"failed: {k}: {r}"), file=sys.stderr)
    print(report.line())


def _verdicts(results) -> list[dict]:
    return [r.as_dict() for r in results]


@app.command()
@handled
def verify(
    profile: Annotated[str, typer.Option(help="The profile to verify; must match the device in force.")],
    workload: WorkloadOption = None,
    hf_config: HfConfigOption = None,
    keys_file: KeysFileOption = None,
    key: KeyOption = None,
    kernels: KernelsOption = None,
    dirs: DirOption = None,
    certified_only: Annotated[
        bool,
        typer.Option(
            "--certified-only",
            help="A key with no certificate fails the run (never a sweep); also NBXCERT_CERTIFIED_ONLY=1, as serving "
            "reads it.",
        ),
    ] = False,
    shard: Annotated[
        str | None, typer.Option(help="Verify a deterministic share i/n of the keys (as certify --shard).")
    ] = None,
    jobs: JobsOption = None,
    spec: SpecOption = None,
    json_out: JsonKeysOption = False,
):
    """Launch every key through the serving path on fresh inputs and check each output against its oracle."""
    from nbxcert.certify import parse_shard, shard_keys
    from nbxcert.options import jobs as check_jobs
    from nbxcert.verify import verify as run_verify

    _backend_line()
    share, jobs = parse_shard(shard), check_jobs(jobs)
    # the application's own setting is the run's too: a verify that swept where the application would refuse said
    # nothing of that application
    from nbxcert.options import env_flag

    certified_only = env_flag("NBXCERT_CERTIFIED_ONLY") or certified_only  # `=yes` is refused, not read as off
    prof, dirs, modules, found = _keys_to_serve(
        profile, dirs, key, keys_file, workload, kernels, spec, hf_config, "nothing to verify"
    )
    found = shard_keys(found, share)

    with _Heartbeat(f"verify {prof.key}", "compiling the certified winners ahead") as beat:
        # the certified winners are compiled in parallel first (on the H200 a verify that compiled them one by one
        # printed nothing for 390 s and had not finished); then one line per key as it is verified
        def warmed(w) -> None:
            if not json_out and w.backend == "cuda":
                line = f"[nbxcert] verify: compiled {w.compiled} certified winners in {w.seconds:.1f} s"
                print(line, file=sys.stderr)

        done = iter(range(1, len(found) + 1))

        def progress(text: str) -> None:
            line = f"{next(done)}/{len(found)} {text}"
            beat.state = f"verifying {line}"
            if not json_out:
                print(f"[nbxcert] verify {line}", file=sys.stderr, flush=True)

        report = run_verify(
            prof.key, found, dirs, certified_only, progress=progress, jobs=jobs, on_warmed=warmed, modules=modules
        )
    if share is not None:
        report.shard = f"{share[0]}/{share[1]}"
    if json_out:
        print(
            json.dumps(
                {
                    "profile": report.profile,
                    "shard": report.shard or None,  # the table's line says "(shard i/n)"; the JSON said nothing
                    "certified_only": certified_only,
                    "keys": report.keys,
                    "served": report.served,
                    "swept": report.swept,
                    "defaulted": report.defaulted,
                    "missing": report.missing,
                    "mismatched": [{"key": k, "config": c, "report": r} for k, c, r in report.mismatched],
                    "failed": [{"key": k, "reason": r} for k, r in report.failed],
                    "interrupted_of": report.interrupted_of,
                    "results": _verdicts(report.results),
                },
                indent=2,
            )
        )
    else:
        _print_unserved(report, report.mismatched)
    raise typer.Exit(130 if report.interrupted_of else 0 if report.ok else 1)


@app.command()
@handled
def warm(
    profile: Annotated[str, typer.Option(help="The profile whose certificates to compile; must match the device.")],
    workload: WorkloadOption = None,
    hf_config: HfConfigOption = None,
    keys_file: KeysFileOption = None,
    key: KeyOption = None,
    kernels: KernelsOption = None,
    dirs: DirOption = None,
    jobs: Annotated[int | None, typer.Option(help="Parallel compile workers (default: one per core).")] = None,
    spec: SpecOption = None,
    json_out: JsonReportOption = False,
):
    """Compile the certified winners of the keys ahead, in parallel, into Triton's cache (first launches only load)."""
    from nbxcert.options import jobs as check_jobs
    from nbxcert.warm import warm as run_warm

    _backend_line()
    jobs = check_jobs(jobs)
    prof, dirs, modules, found = _keys_to_serve(
        profile, dirs, key, keys_file, workload, kernels, spec, hf_config, "nothing to compile"
    )
    with _Heartbeat(f"warm {prof.key}", f"compiling the certified winners of {len(found)} keys"):
        report = run_warm(prof.key, found, dirs, jobs, modules)
    if json_out:
        print(json.dumps({**vars(report), "failed": [{"key": k, "reason": r} for k, r in report.failed]}, indent=2))
    else:
        _print_unserved(report)
    raise typer.Exit(1 if report.failed else 0)


@app.command()
@handled
def coverage(
    profile: Annotated[str, typer.Option(help="The profile whose certificates are counted.")],
    workload: WorkloadOption = None,
    hf_config: HfConfigOption = None,
    keys_file: KeysFileOption = None,
    key: KeyOption = None,
    kernels: KernelsOption = None,
    dirs: DirOption = None,
    min_fraction: Annotated[float, typer.Option("--min", help="Fail (exit 1) below this covered fraction.")] = 1.0,
    spec: SpecOption = None,
    json_out: JsonKeysOption = False,
    junit_xml: Annotated[Path | None, typer.Option("--junit-xml", help="Also write a JUnit XML report.")] = None,
    memory_class: Annotated[
        str | None,
        typer.Option(help="Count only entries of this memory class (80GB: what an H100 is served); default any."),
    ] = None,
    max_older: Annotated[
        float | None,
        typer.Option(
            "--max-older",
            help="Fail (exit 1) above this fraction of the keys certified by code that has changed since "
            "(0: every entry made by today's code); default no limit.",
        ),
    ] = None,
):
    """How many of a workload's (or keys file's) keys are certified for a profile; the missing ones listed. No keys,
    or a directory that is not there, is an error (exit 1), never 100%."""
    from nbxcert.files import write_text
    from nbxcert.options import check_environment, existing_dirs, fraction, writable_file
    from nbxcert.profiles import get_profile
    from nbxcert.verify import coverage as run_coverage
    from nbxcert.verify import junit_xml as to_junit

    min_fraction, dirs = fraction(min_fraction), existing_dirs(dirs)
    if max_older is not None:
        max_older = fraction(max_older, "--max-older", "0 (every entry by today's code) or 0.25")
    check_environment(search_path=dirs is None)
    if junit_xml is not None:
        writable_file(junit_xml, "--junit-xml")
    prof = get_profile(profile)
    _modules, _wanted, found = _asked_keys(prof, key, keys_file, workload, kernels, spec, hf_config)
    with _Heartbeat(f"coverage {prof.key}", f"reading the certificates of {len(found)} keys"):
        report = run_coverage(prof.key, found, dirs, memory_class)
    too_old = max_older is not None and report.older_fraction > max_older
    if junit_xml:
        write_text(junit_xml, to_junit(report, min_fraction, max_older))
    if json_out:
        print(
            json.dumps(
                {
                    "profile": report.profile,
                    "memory_class": report.memory_class,
                    "by_memory_class": report.by_class,
                    "dirs": report.dirs,
                    "keys": len(report.keys),
                    "certified": len(report.certified),
                    "fraction": report.fraction,
                    "min": min_fraction,
                    "missing": report.missing,
                    "older_code": report.older_code,
                    "older_code_fraction": report.older_fraction,
                    "max_older": max_older,
                    "results": _verdicts(report.results),
                },
                indent=2,
            )
        )
    else:
        for k in report.missing:
            print(f"missing: {k}")
        line = (
            f"[nbxcert] coverage {report.profile}"
            + (f" ({report.memory_class} class)" if report.memory_class else "")
            + f": {len(report.certified)}/{len(report.keys)} keys certified "
            f"({100 * report.fraction:.1f}%), minimum {100 * min_fraction:.1f}%"
        )
        if report.fraction < min_fraction:  # the keys it takes, since a rounded percentage can read as the minimum
            needed = math.ceil(min_fraction * len(report.keys) - 1e-9)
            line += f": below it, {needed - len(report.certified)} more certified keys needed ({needed})"
        if report.missing:  # which kernels lack them, the most first (the `missing:` lines above name each key)
            line += f"; missing by kernel: {_by_kernel(report.missing)}"
        if report.older_code:
            line += (
                f"; {len(report.older_code)} of the certified made by code that has changed since "
                f"({_by_kernel(report.older_code)}; served as they are, certify sweeps them again)"
            )
        if too_old:  # the keys past the limit, as for --min
            allowed = math.floor(max_older * len(report.keys) + 1e-9)
            line += (
                f": above the maximum of {100 * max_older:.1f}% of the keys by older code, "
                f"{len(report.older_code) - allowed} more to certify again (at most {allowed})"
            )
        if report.by_class:  # a card is served its own class's entries only
            each = ", ".join(f"{c} {n}/{len(report.keys)}" for c, n in report.by_class.items())
            line += f"; by memory class (a card is served its own): {each}"
        print(line)
    raise typer.Exit(0 if report.fraction >= min_fraction and not too_old else 1)


def _by_kernel(key_texts) -> str:
    """ "softmax 3, matmul 1": how many of the keys each kernel has, the most first."""
    from nbxcert.keys import parse_key

    kernels = Counter(parse_key(k).kernel for k in key_texts)
    return ", ".join(f"{name} {n}" for name, n in kernels.most_common())


# --- certificate directories: validate, show, diff, merge -------------------------------------------------------------
def _cell(value):
    """Certificate text as a table cell: never read as Rich markup, control characters escaped."""
    return Text(_plain(value))


def _plain(value) -> str:
    """Text with a path or a key in it, as one printable line (control characters and undecodable bytes escaped)."""
    from nbxcert.text import printable

    return printable(value)


# What a timing kind means for a reader, where it is not plain (`certificates.TIMING_KINDS`).
_KIND_NOTES = {
    "cuda_events": "ungated, nbxcert < 0.3.0: a kernel shorter than its host launch was timed by the launch",
    "cuda_events_waiting": "ungated: the launch waits for the device itself",
}


def _timing_text(t: dict) -> str:
    note = _KIND_NOTES.get(t["kind"])
    return (
        f"median {t['median_us']:.4g} us, min {t['min_us']:.4g} us, spread {100 * t['spread']:.1f}%, "
        f"{t['reps']} reps ({t['kind']}{'; ' + note if note else ''})"
    )


@app.command()
@handled
def validate(
    directory: CertDirArgument,
    spec: SpecModuleOption = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the problems as JSON objects.")] = False,
):
    """List every problem of every certificate file under DIRECTORY (exit 1 if there is any)."""
    from nbxcert.validate import validate as run_validate

    with _Heartbeat(f"validate {_plain(directory)}", "reading the certificate files"):
        scan = run_validate(directory, spec or ())
    if json_out:
        doc = {"dir": str(directory), "files": scan.files, "entries": scan.entries}
        print(json.dumps({**doc, "problems": [p.as_dict() for p in scan.problems]}, indent=2))
    else:
        for p in scan.problems:
            print(p.line())
        print(scan.line())
    raise typer.Exit(0 if scan.ok else 1)


@app.command()
@handled
def show(
    key: Annotated[str, typer.Argument(help="A launch key, as `nbxcert keys` prints it.")],
    profile: OnlyProfileOption = None,
    dirs: SearchDirOption = None,
    spec: SpecOption = None,
    json_out: JsonOption = False,
    memory_class: Annotated[
        str | None,
        typer.Option(
            help="That memory class's entry, as a card of it is served (80GB: an H100); default each key's first."
        ),
    ] = None,
):
    """Show the certification of one key: winner, timings, runner-up, default, error, refusals, provenance."""
    from nbxcert.certificates import config_label
    from nbxcert.show import show as run_show
    from nbxcert.show import summary

    with _Heartbeat(f"show {_plain(key)}", "reading the certificate files"):
        shown = run_show(key, profile, dirs or (), spec or (), memory_class)
    if json_out:
        rows = [
            {
                "key": s.found.key,
                "profile": s.found.profile,
                "dir": str(s.found.root),
                "file": str(s.found.path),
                "shadowed": [str(d) for d in s.shadowed],
                "summary": summary(s.found.entry),
                "entry": s.found.entry,
            }
            for s in shown
        ]
        print(json.dumps(rows, indent=2, sort_keys=True))
        return
    for s in shown:
        e, sm = s.found.entry, summary(s.found.entry)
        t = Table(title=_cell(f"{s.found.key} on {s.found.profile}"), show_header=False)
        t.add_column("what", style="bold")
        t.add_column("value")
        t.add_row("file", _cell(s.found.path))
        for d in s.shadowed:
            t.add_row("shadowed", _cell(f"also certified in {d} (the first directory wins)"))
        t.add_row("winner", _cell(sm["winner"]))
        t.add_row("winner timing", _cell(_timing_text(e["winner"]["timing"])))
        if e["runner_up"]:
            t.add_row("runner-up", _cell(f"{sm['runner_up']}: {_timing_text(e['runner_up']['timing'])}"))
            t.add_row("margin", _cell(f"runner-up {100 * e['margin']:.1f}% slower"))
        else:
            t.add_row("runner-up", "none (one correct candidate)")
        if e["default"]:
            speed = f"{sm['speedup_over_default']:.2f}x" if sm["speedup_over_default"] else "-"
            same = " (the default won)" if sm["default_is_winner"] else ""
            t.add_row("default", _cell(f"{sm['default']}{same}: {_timing_text(e['default']['timing'])}"))
            t.add_row("speed-up over default", speed)
        else:
            t.add_row("default", "refused on this device (see the refusals)")
        err_ = e["error"]
        t.add_row(
            "error",
            _cell(
                f"max scaled {err_['max_scaled']:.3g} (<= 1 passes), max abs {err_['max_abs']:.3g}, "
                f"max rel {err_['max_rel']:.3g}, tolerance {err_['tolerance']:.3g}"
            ),
        )
        refused = ", ".join(f"{k} {v}" for k, v in sm["refused"].items()) or "none"
        t.add_row("candidates", _cell(f"{sm['correct']} correct; refused: {refused}"))
        for r in e["refused"]:
            t.add_row(_cell(f"refused ({r['status']})"), _cell(f"{config_label(r['config'])}: {r['reason']}"))
        t.add_row("reproducible", _yes(e["reproducible"]))
        others = sorted(e.get("other_classes", {}))
        also = f" (the key also holds entries of the {', '.join(others)} class)" if others else ""
        t.add_row("memory class", _cell(e["memory_class"] + also))
        t.add_row("seed / oracle", _cell(f"{e['seed']} / {e['oracle']}"))
        problems = "; ".join(
            f"{role} " + ",".join(f"{n}={v}" for n, v in p.items()) for role, p in e["certified_problems"].items()
        )
        t.add_row("certified problems", _cell(problems))
        for name, value in sorted(e["provenance"].items()):
            t.add_row(f"provenance {name}", _cell(value))
        _show(t)


@app.command()
@handled
def diff(
    old: Annotated[Path, typer.Argument(help="The certificate directory before.")],
    new: Annotated[Path, typer.Argument(help="The certificate directory after.")],
    json_out: JsonOption = False,
):
    """Keys added, removed, and whose winner changed (old and new config and median, new/old), per profile and memory
    class (each class's entry of a key compared with its own)."""
    from nbxcert.certificates import config_label
    from nbxcert.diff import diff as run_diff
    from nbxcert.diff import ratio

    with _Heartbeat(f"diff {_plain(old)} {_plain(new)}", "reading both directories"):
        report = run_diff(old, new)

    def side(f):
        w = f.entry["winner"]
        return {"winner": config_label(w["config"]), "median_us": w["timing"]["median_us"], "kind": w["timing"]["kind"]}

    def cls(f):
        return {"memory_class": f.entry["memory_class"]}

    if json_out:
        doc = {
            p: {
                "added": [{"key": f.key, **cls(f), **side(f)} for f in pd.added],
                "removed": [{"key": f.key, **cls(f), **side(f)} for f in pd.removed],
                "changed": [
                    {"key": a.key, **cls(a), "old": side(a), "new": side(b), "ratio": ratio(a.entry, b.entry)}
                    for a, b in pd.changed
                ],
                "unchanged": pd.unchanged,
            }
            for p, pd in report.profiles.items()
        }
        print(json.dumps({"old": str(old), "new": str(new), "profiles": doc}, indent=2))
        return
    for p, pd in report.profiles.items():
        if pd.added or pd.removed or pd.changed:
            t = Table(title=_cell(f"{p}: {old} -> {new}"))
            for col in ("change", "key", "class", "old winner", "old us", "new winner", "new us", "new/old"):
                t.add_column(col)
            for f in pd.added:
                s = side(f)
                t.add_row(
                    "added",
                    _cell(f.key),
                    f.entry["memory_class"],
                    "",
                    "",
                    _cell(s["winner"]),
                    f"{s['median_us']:.4g}",
                    "",
                )
            for f in pd.removed:
                s = side(f)
                t.add_row(
                    "removed",
                    _cell(f.key),
                    f.entry["memory_class"],
                    _cell(s["winner"]),
                    f"{s['median_us']:.4g}",
                    "",
                    "",
                    "",
                )
            for a, b in pd.changed:
                sa, sb, r = side(a), side(b), ratio(a.entry, b.entry)
                t.add_row(
                    "winner changed",
                    _cell(a.key),
                    a.entry["memory_class"],
                    _cell(sa["winner"]),
                    f"{sa['median_us']:.4g}",
                    _cell(sb["winner"]),
                    f"{sb['median_us']:.4g}",
                    f"{r:.3f}" if r is not None else "timing kinds differ",
                )
            _show(t)
        print(
            f"{p}: {len(pd.added)} added, {len(pd.removed)} removed, {len(pd.changed)} winners changed, "
            f"{pd.unchanged} unchanged (entries: one a key and memory class)"
        )
    if not report.profiles:
        print("no certifications in either directory")


@app.command()
@handled
def stale(
    directory: CertDirArgument,
    profile: OnlyProfileOption = None,
    keys_out: Annotated[
        Path | None,
        typer.Option("--out", help="Write the stale keys as a keys file, for `nbxcert certify --keys F --force`."),
    ] = None,
    json_out: JsonReportOption = False,
):
    """Certified winners the winner rule would not choose from their entry's own timings (no device; exit 1 if any)."""
    from nbxcert.certificates import config_label
    from nbxcert.files import write_text
    from nbxcert.options import writable_file
    from nbxcert.stale import find_stale

    if keys_out is not None:
        writable_file(keys_out, "--out")
    with _Heartbeat(f"stale {_plain(directory)}", "reading the certificate files"):
        report = find_stale(directory, profile)
    if keys_out is not None:
        write_text(keys_out, report.keys_jsonl())
    if json_out:
        doc = {"dir": str(directory), "profile": report.profile, "entries": report.entries, "judged": report.judged}
        print(json.dumps({**doc, "stale": [s.as_dict() for s in report.stale]}, indent=2))
    else:
        if report.stale:
            t = Table(title=_cell(f"stale winners in {directory}"))
            cols = ("profile", "key", "class", "certified winner", "us", "the rule's choice", "us", "winner/choice")
            for col in cols:
                t.add_column(col)
            for s in report.stale:
                t.add_row(
                    _cell(s.profile),
                    _cell(s.key),
                    _cell(s.memory_class),
                    _cell(config_label(s.winner)),
                    f"{s.winner_us:.4g}",
                    _cell(config_label(s.chosen)),
                    f"{s.chosen_us:.4g}",
                    f"{s.ratio:.3f}",
                )
            _show(t)
        print(report.line())
    raise typer.Exit(0 if report.ok else 1)


@app.command()
@handled
def merge(
    out_dir: Annotated[Path, typer.Argument(help="The certificate directory to merge into (created if missing).")],
    dirs: Annotated[list[Path] | None, typer.Argument(help="Shard certificate directories (same layout).")] = None,
    prefer: Annotated[
        str | None,
        typer.Option(help="Resolve a key certified on different cards or versions: 'newest' or 'fastest'."),
    ] = None,
    spec: SpecModuleOption = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
):
    """Merge shard directories into OUT_DIR; a key certified on different cards or versions needs --prefer."""
    from nbxcert.merge import merge as run_merge

    with _Heartbeat(f"merge into {_plain(out_dir)}", "reading and merging the shard directories"):
        report = run_merge(out_dir, dirs or (), prefer, spec or ())
    if json_out:
        keys = [
            {
                "profile": k.profile,
                "file": k.file,
                "key": k.key,
                "memory_class": k.memory_class,
                "kind": k.kind,
                "outcome": k.outcome,
                "chosen": k.chosen.source if k.chosen else None,
                "candidates": [c.source for c in k.candidates],
                "note": k.note,
            }
            for k in report.keys
        ]
        summary_doc = {"out": str(out_dir), "prefer": prefer, "totals": report.totals()}
        print(json.dumps({**summary_doc, "written": [str(p) for p in report.written], "keys": keys}, indent=2))
    else:
        notable = [k for k in report.keys if k.kind != "single" or k.outcome == "refused"]
        if notable:
            t = Table(title="merge decisions")
            for col in ("profile", "key", "decision", "why"):
                t.add_column(col)
            for k in notable:
                decision = "refused" if k.outcome == "refused" else f"{k.kind}: kept {k.chosen.source}"
                t.add_row(_cell(k.profile), _cell(f"{k.key} ({k.memory_class})"), _cell(decision), _cell(k.note))
            _show(t)
        print(report.line())
    report.raise_if_refused()


index_app = typer.Typer(help="Build or check the binary indexes of a certificate directory.", no_args_is_help=True)
app.add_typer(index_app, name="index")


def _index_targets(dirs: list[Path]) -> list[tuple[str, str]]:
    """(profile, memory class) of every certification in the directories."""
    from nbxcert import certificates
    from nbxcert.profiles import all_profiles

    targets = set()
    for p in all_profiles():
        for directory in dirs:
            for path in certificates.iter_files(directory, p.key):
                for entry in certificates.load_file(path).entries.values():
                    targets.update((p.key, cls) for cls in certificates.class_entries(entry))
    return sorted(targets)


def _index_dirs(directory: Path | None, cache: Path | None, write: bool) -> list[Path]:
    """The certificate directories an index command reads, every path it is given checked first: the directory, the
    cache (`--cache`, else NBXCERT_CACHE_DIR). Without a directory, serving's search path (NBXCERT_CERTIFIED_DIR, then
    the shipped certificates): the index a serving process reads is built over all of it, first directory first, so
    one of the shipped directory alone (as this was) was never read where NBXCERT_CERTIFIED_DIR is set, and every
    cold start built its own."""
    from nbxcert.index import cache_dir
    from nbxcert.options import check_environment, existing_dirs, reachable, writable_dir

    if cache is not None:
        writable_dir(cache, "--cache", write=write)
    check_environment(search_path=directory is None)
    if cache is None and not os.environ.get("NBXCERT_CACHE_DIR"):  # the default, under XDG_CACHE_HOME or ~/.cache
        reachable(cache_dir(), "the index cache (XDG_CACHE_HOME, else ~/.cache)")
    if directory is not None:  # a file was said not to exist; a directory that cannot be searched raised
        return existing_dirs([directory], "certificate directory")
    from nbxcert.serving import search_path

    return search_path()


def _no_certificates(dirs: list[Path], what: str) -> errors.UsageError:
    from nbxcert.dirscan import NO_CERTS_HINT

    where = ", ".join(_plain(d) for d in dirs)
    return errors.UsageError(
        f"{where} {'holds' if len(dirs) == 1 else 'hold'} no certificates: {what}", hint=NO_CERTS_HINT
    )


@index_app.command("build")
@handled
def index_build(
    directory: IndexDirArgument = None,
    cache: Annotated[Path | None, typer.Option(help="Where to write (default: NBXCERT_CACHE_DIR).")] = None,
):
    """Build the indexes of a directory ahead of time (for read-only installs and cold starts)."""
    from nbxcert.files import is_file
    from nbxcert.index import load_index

    dirs = _index_dirs(directory, cache, write=True)
    shown = ":".join(_plain(d) for d in dirs)
    with _Heartbeat(f"index build {shown}", "reading the certificate files") as beat:
        targets = _index_targets(dirs)
        if not targets:  # a build of nothing (a wrong path in a deploy script) passed, and every cold start indexed
            raise _no_certificates(dirs, "no index to build")
        for profile_key, memory_class in targets:
            beat.state = f"building the index of {profile_key} {memory_class}"
            notices: list[str] = []
            index = load_index(dirs, profile_key, memory_class, cache, notices)
            unwritten = [n for n in notices if n.startswith("cannot write the index cache")]
            if unwritten or not is_file(index.path):  # said "N keys -> PATH" and exited 0, though PATH was not written
                why = unwritten[0].split("; serving from memory")[0] if unwritten else f"{index.path} is not there"
                raise errors.UsageError(
                    f"the index of {profile_key} {memory_class} was not written: {why}",
                    hint="give --cache (or NBXCERT_CACHE_DIR) a directory you can write",
                )
            for n in notices:
                print(f"[nbxcert] {n}", file=sys.stderr)
            print(_plain(f"{profile_key} {memory_class}: {len(index)} keys -> {index.path}"))


@index_app.command("check")
@handled
def index_check(
    directory: IndexDirArgument = None,
    cache: Annotated[Path | None, typer.Option(help="Where the indexes are (default: NBXCERT_CACHE_DIR).")] = None,
):
    """Check that every index of a directory is built, current (its name matches the JSON) and intact."""
    from nbxcert.index import CertifiedIndex, cache_dir, fingerprint, index_path

    dirs = _index_dirs(directory, cache, write=False)
    shown = ":".join(_plain(d) for d in dirs)
    with _Heartbeat(f"index check {shown}", "reading the certificate files"):
        targets = _index_targets(dirs)
    if not targets:  # a check never passes on nothing
        raise _no_certificates(dirs, "no index to check")
    build = f"nbxcert index build {_plain(directory)}" if directory is not None else "nbxcert index build"
    bad = 0
    for profile_key, memory_class in targets:
        expected = fingerprint(dirs, profile_key)
        path = index_path(cache or cache_dir(), profile_key, memory_class, expected)
        if not path.exists():
            print(_plain(f"{profile_key} {memory_class}: not built (run `{build}`)"), file=sys.stderr)
            bad += 1
            continue
        try:
            with CertifiedIndex.open(path) as index:
                index.verify()
                # an index of other certificates, or of another profile or class, put under this name passed as
                # "intact", while serving rebuilt it (`index.load_index` compares the three)
                if (index.fingerprint, index.profile_key, index.memory_class) != (expected, profile_key, memory_class):
                    raise errors.IndexCorrupt(
                        f"{path}: built for {index.profile_key} {index.memory_class} from certificates "
                        f"{index.fingerprint[:32]}, not for {profile_key} {memory_class} from {expected[:32]} "
                        "(its name)"
                    )
                print(_plain(f"{profile_key} {memory_class}: {len(index)} keys, intact ({path})"))
        except errors.IndexCorrupt as e:
            print(_plain(f"{profile_key} {memory_class}: {e} (run `{build}`)"), file=sys.stderr)
            bad += 1
    raise typer.Exit(1 if bad else 0)


# --- census: every candidate compiled for a GPU class, without the GPU ------------------------------------------------
_CENSUS_ROWS = 30  # rows of each findings table on the terminal; --json lists every case


@app.command()
@handled
def census(
    profile: Annotated[str, typer.Option(help="The GPU profile to compile for (e.g. hopper); no GPU needed.")],
    kernels: KernelsOption = None,
    keys_file: KeysFileOption = None,
    workload: WorkloadOption = None,
    key: KeyOption = None,
    jobs: JobsOption = None,
    strict: Annotated[bool, typer.Option("--strict", help="Over-prunes fail the run too.")] = False,
    spec: SpecModuleOption = None,
    timeout: Annotated[float | None, typer.Option(help="Seconds one candidate may take to compile.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON; no progress bar.")] = False,
):
    """Compile every candidate for PROFILE's GPU on this machine and hold the compiler's figures to the device file:
    a kept candidate over a limit is a prune defect, a dropped one that fits an over-prune (exit 1 on a defect or a
    compile failure; on an over-prune too with --strict). Without keys: each kernel's example problems."""
    from rich.text import Text

    from nbxcert.census import load_census_specs, run_census
    from nbxcert.keyfile import gather_keys, parse_kernels
    from nbxcert.options import jobs as check_jobs
    from nbxcert.options import seconds
    from nbxcert.profiles import get_profile

    prof = get_profile(profile)
    jobs, timeout = check_jobs(jobs), seconds(timeout)
    modules = [m.split(":")[0] for m in spec or ()]
    load_census_specs(prof, modules)  # before the keys: a key of the user's own kernel parses against its spec
    wanted = parse_kernels(kernels)
    found = gather_keys(prof, key or (), keys_file, workload, wanted) if key or keys_file or workload else None
    with _Heartbeat(f"census {prof.key}", "choosing the cases to compile") as beat:

        def counted(done: int, total: int) -> None:
            beat.state = f"{done}/{total} compiled"

        if json_out:
            report = run_census(prof, wanted, found, jobs, strict, modules, timeout, counted)
            print(json.dumps(report.as_dict(), indent=2))
            raise typer.Exit(0 if report.ok else 1)
        with _progress() as bar:
            task = bar.add_task(f"compiling for {prof.key}", total=None)

            def progress(done: int, total: int) -> None:
                counted(done, total)
                bar.update(task, completed=done, total=total)

            report = run_census(prof, wanted, found, jobs, strict, modules, timeout, progress)
    t = Table(title=_cell(f"census {report.profile} ({report.target.text()}, Triton {report.triton_version})"))
    t.add_column("kernel")
    for col in ("candidates", "kept", "compiled", "prune defects", "over-prunes", "compile failures"):
        t.add_column(col, justify="right")
    t.add_column("kept spilling", justify="right")
    t.add_column("compile s", justify="right")
    for k in report.summaries():
        t.add_row(
            _cell(k.kernel),
            str(k.cases),
            str(k.kept),
            str(k.compiled),
            f"[red]{k.defects}[/red]" if k.defects else "0",
            str(k.over_prunes),
            f"[red]{k.failures}[/red]" if k.failures else "0",
            str(k.spilling),
            f"{k.seconds:.1f}",
        )
    _show(t)
    for title, cases in (
        ("prune defects: {} (kept, over a device limit)", report.defects),
        ("compile failures: {} (kept; the first line of each error)", report.failures),
    ):
        if cases:
            ft = Table(title=_cell(title.format(len(cases))))
            for col in ("kernel", "config", "problem / key", "why"):
                ft.add_column(col)
            for c in cases[:_CENSUS_ROWS]:
                ft.add_row(_cell(c.kernel), _cell(c.config.label()), _cell(c.where()), _cell(c.reason))
            _show(ft)
            if len(cases) > _CENSUS_ROWS:
                print(f"... {len(cases) - _CENSUS_ROWS} more (--json lists every one)")
    groups = report.over_prune_groups()
    if groups:
        ot = Table(title=f"over-prunes: {len(report.over_prunes)} (dropped, yet compiled within the limits)")
        for col in ("kernel", "config", "cases", "the prune said", "the compiler says"):
            ot.add_column(col)
        for c, n in groups[:_CENSUS_ROWS]:
            said = (
                Text("refuted: ", style="yellow") + _cell(c.prune_reason) if c.refutes_claim else _cell(c.prune_reason)
            )
            ot.add_row(_cell(c.kernel), _cell(c.config.label()), str(n), said, _cell(c.figures()))
        _show(ot)
        if len(groups) > _CENSUS_ROWS:
            print(f"... {len(groups) - _CENSUS_ROWS} more configs (--json lists every one)")
    print(report.line())
    raise typer.Exit(0 if report.ok else 1)


@app.command()
@handled
def bundle(
    profile: Annotated[
        str | None, typer.Option(help="The GPU profile to compile for (e.g. hopper); no GPU needed.")
    ] = None,
    workload: WorkloadOption = None,
    hf_config: HfConfigOption = None,
    keys_file: KeysFileOption = None,
    key: KeyOption = None,
    kernels: KernelsOption = None,
    dirs: SearchDirOption = None,
    out_file: Annotated[Path | None, typer.Option("--out", help="The bundle file to write.")] = None,
    check_file: Annotated[
        Path | None, typer.Option("--check", help="Check this bundle against the certificates of --dir instead.")
    ] = None,
    jobs: JobsOption = None,
    spec: SpecOption = None,
    json_out: JsonReportOption = False,
    memory_class: Annotated[
        str | None,
        typer.Option(
            help="Bundle (or check against) this memory class's winners (80GB: an H100's); default each key's first "
            "class's."
        ),
    ] = None,
    launches_of: Annotated[
        str | None,
        typer.Option(
            "--launches-of",
            help="Also compile each key at these workloads' launches of it (comma-separated names or files): a "
            "bundle of every key in --dir that serves several models at their real shapes.",
        ),
    ] = None,
):
    """Compile the certified winners of PROFILE for its GPU (cross-compiling, no GPU needed) into one bundle file that
    serving loads instead of compiling: the keys of --workload, --hf-config, --keys or --key, or every key certified in
    --dir. A card of another memory class is served its own class's winners: bundle those with --memory-class.
    With --check FILE: exit 1 naming each key whose certificate in --dir changed, is gone, or is not bundled."""
    from nbxcert import bundling
    from nbxcert.census import load_census_specs
    from nbxcert.keyfile import gather_keys, parse_kernels
    from nbxcert.options import check_environment, existing_dirs, existing_file, writable_file
    from nbxcert.options import jobs as check_jobs
    from nbxcert.profiles import get_profile

    jobs, dirs = check_jobs(jobs), existing_dirs(dirs)
    asked_keys = bool(key or keys_file or workload or hf_config)
    if check_file is not None:
        if out_file is not None or jobs is not None or launches_of:
            raise errors.UsageError(
                "--check reads a bundle and compiles nothing: --out, --jobs and --launches-of are for building one",
                hint="nbxcert bundle --check FILE --dir CERTDIR",
            )
        if dirs is None:
            raise errors.UsageError("--check needs the certificate directory to compare with: give --dir DIR")
        existing_file(check_file, "--check", "give a bundle file")
    else:
        if profile is None:
            raise errors.UsageError("no profile: give --profile P (e.g. hopper)")
        if out_file is None:
            raise errors.UsageError("no bundle file to write: give --out FILE (e.g. hopper.nbxbundle)")
        if not asked_keys and dirs is None:
            raise errors.UsageError(
                "no keys asked for: give --workload NAME|FILE, --hf-config CONFIG.json, --keys FILE or --key TEXT, or "
                "--dir DIR for every key certified there"
            )
        writable_file(out_file, "--out")
    check_environment(search_path=dirs is None)
    if asked_keys:
        workload = _workload(workload, hf_config, keys_file, key)
    prof = get_profile(profile) if profile is not None else None
    modules = [m.split(":")[0] for m in spec or ()]
    wanted = parse_kernels(kernels)
    found = None
    if check_file is not None:
        if asked_keys:
            if prof is None:
                raise errors.UsageError("--workload, --hf-config, --keys and --key need --profile to form their keys")
            load_census_specs(prof, modules)
            found = gather_keys(prof, key or (), keys_file, workload, wanted)
        report = bundling.check(check_file, dirs, found, profile, wanted, modules, memory_class)
        if json_out:
            print(json.dumps(report.as_dict(), indent=2))
        else:
            for line in report.lines():
                print(line, file=sys.stderr)
            print(report.line())
            if not report.ok:
                from nbxcert.serving.bundles import rebuild_command

                rebuild = rebuild_command(report.profile, check_file, dirs, report.memory_class)
                print(_plain(f"rebuild it: {rebuild} (the keys and --launches-of it was built with)"), file=sys.stderr)
        raise typer.Exit(0 if report.ok else 1)
    bundling.bundle_target(prof)  # a profile that compiles nothing for a CUDA GPU is refused before any work
    load_census_specs(prof, modules)  # before the keys: a key of the user's own kernel parses against its spec
    if asked_keys:
        found = gather_keys(prof, key or (), keys_file, workload, wanted)
    with _Heartbeat(f"bundle {prof.key}", "reading the certificates") as beat:

        def progress(done: int, total: int) -> None:
            beat.state = f"{done}/{total} keys compiled"

        shapes_of = [w.strip() for w in (launches_of or "").split(",") if w.strip()]
        report = bundling.build(
            prof.key, found, dirs, out_file, workload, wanted, jobs, modules, progress, memory_class, shapes_of
        )
    if json_out:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        for k in report.skipped:
            print(_plain(f"skipped: {k} (no certificate)"), file=sys.stderr)
        for k, r in report.failed:
            print(_plain(f"failed: {k}: {r}"), file=sys.stderr)
        print(report.line())
    raise typer.Exit(0 if report.ok else 1)


@app.command()
@handled
def export(
    fmt: Annotated[str, typer.Option("--format", help="vllm-fused-moe or triton-autotune.")],
    profile: Annotated[str, typer.Option(help="The GPU profile whose certificates to export (e.g. hopper).")],
    out_dir: Annotated[Path, typer.Option("--out", help="The directory to write (created if missing).")],
    dirs: SearchDirOption = None,
    kernels: KernelsOption = None,
    spec: SpecOption = None,
    json_out: JsonReportOption = False,
):
    """Write certified configs as files other tools read: vLLM's fused-MoE config files (vllm-fused-moe), or Triton's
    autotune cache for kernels declared with nbxcert.autotune (triton-autotune)."""
    from nbxcert.export import export as run_export

    with _Heartbeat(f"export {_plain(fmt)}", "reading the certificates and writing the files"):
        report = run_export(fmt, profile, dirs or (), out_dir, kernels, [m.split(":")[0] for m in spec or ()])
    if json_out:
        print(json.dumps(report.as_dict(), indent=2))
        return
    t = Table(title=_cell(f"export {report.format} {report.profile} -> {report.out}"))
    for col in ("file", "keys", "written"):
        t.add_column(col)
    for w in report.written:
        t.add_row(_cell(w.path), str(len(w.keys)), _cell(w.summary))
    _show(t)
    for s in report.skipped:
        print(_plain(f"skipped: {s.key}: {s.reason}"), file=sys.stderr)
    print(_plain(report.line()))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
