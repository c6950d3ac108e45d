"""The `nbxcert` command line: thin Typer commands that parse, call the engine, and render (Rich or `--json`).

No logic lives here. Every `NbxcertError` a command meets becomes one line on stderr through `ERROR_TABLE` (what
failed, then what to do next) and exit code 1; a traceback is shown only with `NBXCERT_DEBUG=1`.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Annotated, Callable

import typer
from rich.console import Console
from rich.table import Table

from nbxcert import errors
from nbxcert._version import __version__

app = typer.Typer(
    name="nbxcert",
    help="Certify Triton kernel launch configurations per GPU class against float64 oracles, and serve them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)

# One table: each error type -> the label its line starts with. The message names the file/key/value; the hint
# (carried by the exception) says what to do next.
ERROR_TABLE: dict[type[errors.NbxcertError], str] = {
    errors.DTypeError: "unknown dtype",
    errors.ViewError: "bad view",
    errors.ShapeMismatch: "shape mismatch",
    errors.DeviceNotFound: "no such device",
    errors.BackendUnavailable: "backend unavailable",
    errors.CudaError: "CUDA error",
    errors.LaunchError: "launch refused",
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
    errors.CertificateInvalid: "invalid certificate",
    errors.IndexCorrupt: "corrupt index",
    errors.UsageError: "usage",
}


def error_line(e: errors.NbxcertError) -> str:
    label = next((lab for cls, lab in ERROR_TABLE.items() if isinstance(e, cls)), "error")
    line = f"nbxcert: {label}: {e.message}"
    if e.hint:
        line += f" -> {e.hint}"
    return line


def handled(fn: Callable) -> Callable:
    """Turn an `NbxcertError` into one line on stderr and exit code 1 (traceback with NBXCERT_DEBUG=1)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except errors.NbxcertError as e:
            if os.environ.get("NBXCERT_DEBUG") == "1":
                raise
            print(error_line(e), file=sys.stderr)
            raise typer.Exit(1) from None

    return wrapper


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


def _yes(flag: bool) -> str:
    return "[green]yes[/green]" if flag else "[red]no[/red]"


@app.command()
@handled
def doctor(json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False):
    """Tell the truth about this machine: backend, GPUs on the PCI bus, runtimes, profile match, versions."""
    from nbxcert.doctor import run_doctor

    report = run_doctor()
    code = 0 if report.backend_usable else 1
    if json_out:
        print(json.dumps(report.as_dict(), indent=2, sort_keys=True))
        raise typer.Exit(code)
    t = Table(title="nbxcert doctor", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("backend", f"{report.backend} ({report.backend_reason})")
    t.add_row("backend usable", _yes(report.backend_usable))
    if not report.pci_gpus:
        t.add_row("GPUs on the PCI bus", "none")
    for g in report.pci_gpus:
        t.add_row(
            f"PCI {g.address}",
            f"{g.vendor} {g.vendor_id}:{g.device_id} (class {g.pci_class}); {g.runtime_library or 'no runtime'} "
            f"loads: {_yes(g.runtime_loads)}; Triton backend: {_yes(g.triton_backend)}",
        )
    for c in report.cuda_gpus:
        t.add_row(
            f"cuda:{c.index}",
            f"{c.name}, compute capability {c.compute_capability}, {c.total_memory_bytes / 2**30:.1f} GiB",
        )
        t.add_row(f"cuda:{c.index} profile", f"{c.profile} ({c.profile_match} match), memory class {c.memory_class}")
        if c.profile_notice:
            t.add_row(f"cuda:{c.index} notice", c.profile_notice)
        t.add_row(f"cuda:{c.index} certified keys", str(c.certified_keys))
    if report.cuda_gpus:
        t.add_row("driver / CUDA", f"{report.driver_version} / {report.cuda_version}")
    for name, version in report.versions.items():
        t.add_row(name, version)
    t.add_row("torch importable", f"{'yes' if report.torch_importable else 'no'} (information only: never imported)")
    for p in report.problems:
        t.add_row("[red]problem[/red]", p)
    for a in report.advice:
        t.add_row("[yellow]next step[/yellow]", a)
    out.print(t)
    raise typer.Exit(code)


@app.command()
@handled
def profiles(json_out: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False):
    """List the shipped device profiles."""
    from nbxcert.profiles import all_profiles

    rows = [
        {
            "profile": p.key,
            "backend": p.backend,
            "target": p.target_arch,
            "skus": [s.name for s in p.skus],
            "description": p.description,
        }
        for p in all_profiles()
    ]
    if json_out:
        print(json.dumps(rows, indent=2))
        return
    t = Table(title="device profiles")
    for col in ("profile", "backend", "target", "description"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["profile"], r["backend"], str(r["target"] or "-"), r["description"])
    out.print(t)


@app.command()
@handled
def kernels(json_out: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False):
    """List every registered kernel spec: name, dtypes, key fields, number of candidates."""
    from nbxcert.kernels.spec import load_all

    rows = [
        {
            "name": s.name,
            "family": s.family,
            "dtypes": ["/".join(c) for c in s.dtypes],
            "key_fields": [f.name + (f"~{f.ladder}" if f.ladder else "") for f in s.key_fields],
            "candidates": len(s.candidates),
            "default": s.default.label(),
        }
        for s in load_all().values()
    ]
    if json_out:
        print(json.dumps(rows, indent=2))
        return
    t = Table(title="registered kernels")
    for col in ("name", "family", "dtypes", "key fields", "candidates"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], r["family"], ", ".join(r["dtypes"]), ", ".join(r["key_fields"]), str(r["candidates"]))
    out.print(t)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
