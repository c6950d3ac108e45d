"""The `nbxcert` command line: thin Typer commands that parse, call the engine, and render (Rich or `--json`).

No logic lives here. Every `NbxcertError` a command meets becomes one line on stderr through `ERROR_TABLE` (what
failed, then what to do next) and exit code 1; a traceback is shown only with `NBXCERT_DEBUG=1`.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Callable, Optional

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


def _backend_line() -> None:
    """The first line of every command that launches kernels: which backend, and why."""
    from nbxcert.kernels.backends import select

    print(select().line(), file=sys.stderr)


@app.command()
@handled
def keys(
    profile: Annotated[str, typer.Option(help="Device profile whose ladders bucket the sizes (e.g. hopper).")],
    workload: Annotated[Optional[str], typer.Option(help="A shipped workload name or a workload YAML file.")] = None,
    keys_file: Annotated[Optional[Path], typer.Option("--keys", help="A keys file (JSON lines).")] = None,
    key: Annotated[Optional[list[str]], typer.Option(help="A launch key text (repeatable).")] = None,
    kernels: Annotated[Optional[str], typer.Option(help="Only these kernels (comma-separated).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print as JSON lines (a keys file).")] = False,
):
    """Print the launch keys of a workload (the launches a model makes), a keys file or key texts."""
    from nbxcert.keyfile import gather_keys
    from nbxcert.profiles import get_profile

    prof = get_profile(profile)
    wanted = kernels.split(",") if kernels else None
    found = gather_keys(prof, key or (), keys_file, workload, wanted)
    if json_out:
        for k in found:
            print(json.dumps({"key": k.text()}))
        return
    t = Table(title=f"{len(found)} launch keys ({prof.key})")
    t.add_column("kernel")
    t.add_column("key")
    for k in found:
        t.add_row(k.kernel, k.text())
    out.print(t)


@app.command()
@handled
def certify(
    profile: Annotated[str, typer.Option(help="The profile to certify for; must match the device in force.")],
    workload: Annotated[Optional[str], typer.Option(help="A shipped workload name or a workload YAML file.")] = None,
    keys_file: Annotated[Optional[Path], typer.Option("--keys", help="A keys file (JSON lines).")] = None,
    key: Annotated[Optional[list[str]], typer.Option(help="A launch key text (repeatable).")] = None,
    kernels: Annotated[Optional[str], typer.Option(help="Only these kernels (comma-separated).")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Certificate directory (<out>/<vendor>/<profile>/).")] = Path(
        "certificates"
    ),
    shard: Annotated[Optional[str], typer.Option(help="Certify a deterministic share i/n of the keys.")] = None,
    force: Annotated[bool, typer.Option(help="Re-certify keys already certified for this card and versions.")] = False,
    jobs: Annotated[Optional[int], typer.Option(help="Parallel compile workers (default: the CPU count).")] = None,
    spec: Annotated[Optional[list[str]], typer.Option(help="Import a module registering your own KernelSpec.")] = None,
    timeout: Annotated[
        Optional[float], typer.Option(help="Seconds one candidate may take to compile, or to check and time.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON; no progress bar.")] = False,
):
    """Sweep every requested key on this device and write certificates (resumable; exit 0 only if all certified)."""
    import importlib

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from nbxcert.certify import certify as run_certify
    from nbxcert.certify import parse_shard, resolve_profile
    from nbxcert.keyfile import gather_keys

    _backend_line()
    modules = [s.split(":")[0] for s in spec or ()]
    for m in modules:
        importlib.import_module(m)
    prof, how = resolve_profile(profile)
    if how != "exact":
        print(f"[nbxcert] notice: this device runs on the {prof.key} profile by a {how} match", file=sys.stderr)
    found = gather_keys(prof, key or (), keys_file, workload, kernels.split(",") if kernels else None)
    if json_out:
        report = run_certify(
            prof.key, found, out_dir, force, parse_shard(shard), jobs, modules=modules, timeout_s=timeout
        )
    else:
        columns = [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}")]
        with Progress(*columns, TimeElapsedColumn(), TimeRemainingColumn(), console=err, transient=True) as bar:
            overall = bar.add_task("keys", total=len(found))
            current = bar.add_task("", total=None)

            def progress(text: str) -> None:
                bar.update(current, description=text[:110])

            report = run_certify(
                prof.key,
                found,
                out_dir,
                force,
                parse_shard(shard),
                jobs,
                modules=modules,
                progress=progress,
                on_key=lambda kr: bar.advance(overall),
                timeout_s=timeout,
            )
    totals = report.totals()
    if json_out:
        print(
            json.dumps(
                {
                    "profile": report.profile,
                    "out": report.out_dir,
                    "totals": totals,
                    "keys": [vars(k) for k in report.keys],
                },
                indent=2,
            )
        )
    else:
        t = Table(title=f"certify {report.profile} ({report.backend}) -> {out_dir}")
        for col in ("key", "status", "winner", "x default", "refusals", "seconds"):
            t.add_column(col)
        for k in report.keys:
            refused = ", ".join(f"{n} {v}" for n, v in k.counts.items() if v and n != "correct")
            speed = f"{k.speedup_over_default:.2f}" if k.speedup_over_default else "-"
            secs = f"{k.seconds.get('total', 0):.1f}" if k.seconds else "-"
            t.add_row(k.key, k.status, k.winner or k.reason[:80], speed, refused, secs)
        out.print(t)
        out.print(
            f"certified {totals['certified']}, skipped {totals['skipped']} (already certified), "
            f"failed {totals['failed']}; files under {Path(out_dir) / report.profile}"
        )
    raise typer.Exit(0 if report.ok else 1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
