"""`nbxcert verify` and `nbxcert coverage`: prove certificates hold, and measure how much of a workload they cover.

verify launches every key through the serving path (exactly as an application would) on fresh random inputs (a seed
other than the certification's), at the bucket's smallest and largest member, and checks each output against the
oracle. It counts keys served from certificates, swept at run time, run on the kernel's untuned default
(NBXCERT_UNCERTIFIED=default), missing (certified-only) and mismatched.

coverage needs no GPU: it reads the certificate files of a profile and says which of the requested keys they hold.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nbxcert import serving
from nbxcert.errors import KeyNotCertified, NbxcertError
from nbxcert.keys import LaunchKey, key_problems

VERIFY_SEED = 777_2026  # not the certification seed: verification uses inputs the certificate never saw


@dataclass
class KeyVerdict:
    """What verify (or coverage) found for one key: `verdict` passed | mismatched | missing | failed (verify), or
    certified | missing (coverage); `served` certificate | sweep | default (where verify's config came from: a
    certificate, a run-time sweep, or the kernel's untuned default under NBXCERT_UNCERTIFIED=default); the config; the
    measured error (the worst output's max_scaled, max_abs, max_rel; for coverage the certificate's); and why, when
    it did not pass."""

    key: str
    verdict: str
    served: str | None = None
    config: str | None = None
    error: dict[str, float] | None = None
    reason: str = ""

    def as_dict(self) -> dict:
        return dict(vars(self))


@dataclass
class VerifyReport:
    profile: str
    keys: int = 0
    served: int = 0
    swept: int = 0
    defaulted: int = 0  # keys with no certificate run on the kernel's default (NBXCERT_UNCERTIFIED=default)
    missing: list[str] = field(default_factory=list)
    mismatched: list[tuple[str, str, str]] = field(default_factory=list)  # key, config, report
    failed: list[tuple[str, str]] = field(default_factory=list)  # key, reason: making inputs or launching raised
    shard: str = ""  # "i/n" when only a share of the keys was verified
    interrupted_of: int = 0  # the keys asked for, when an interrupt (Ctrl-C, `timeout -s INT`) stopped the run early
    results: list[KeyVerdict] = field(default_factory=list)  # one per key reached, in order

    @property
    def ok(self) -> bool:
        return not self.missing and not self.mismatched and not self.failed and not self.interrupted_of

    def line(self) -> str:
        share = f" (shard {self.shard})" if self.shard else ""
        cut = f"; interrupted: {self.keys} of {self.interrupted_of} keys reached" if self.interrupted_of else ""
        failed = f", {len(self.failed)} failed" if self.failed else ""
        default = f", {self.defaulted} on the kernel's default" if self.defaulted else ""
        return (
            f"[nbxcert] verify{share}: {self.keys} keys, {self.served} served, {self.swept} swept at run time"
            f"{default}, {len(self.missing)} missing, {len(self.mismatched)} mismatched{failed}{cut}"
        )


def verify(
    profile_name: str,
    keys: Sequence[LaunchKey],
    dirs: Sequence[Path] | None,
    certified_only: bool,
    seed: int = VERIFY_SEED,
    progress=None,
    jobs: int | None = None,
    on_warmed=None,
    modules: Sequence[str] = (),
) -> VerifyReport:
    """Each key through the serving path, checked against its oracle at its bucket's smallest and largest member.
    The certified winners are first compiled in a pool of `jobs` processes (`nbxcert.warm`; `on_warmed(report)` is
    told when that is done); `progress(key text)` as each key starts. An interrupt while the keys are checked ends
    the run with what it found so far (`interrupted_of` set). `modules`: the user's own specs (`--spec`), imported
    by the compile workers too."""
    from nbxcert.certify import resolve_profile
    from nbxcert.kernels.backends import select
    from nbxcert.kernels.spec import get_spec
    from nbxcert.keys import check_key
    from nbxcert.options import check_environment, existing_dirs
    from nbxcert.options import jobs as check_jobs
    from nbxcert.warm import warm

    # every input checked before anything is compiled or launched
    profile, _how = resolve_profile(profile_name)
    dirs = existing_dirs(dirs)
    check_environment(search_path=dirs is None)
    jobs = check_jobs(jobs)
    for k in keys:
        check_key(get_spec(k.kernel), k, profile)
    with serving.configured(dirs=dirs, certified_only=certified_only):  # the process's settings come back after
        warmed = warm(profile.key, keys, None, jobs, modules, check_env=False)  # the serving state just configured
        if on_warmed:
            on_warmed(warmed)
        device = select().device
        report = VerifyReport(profile.key)
        try:
            _verify_keys(report, profile, keys, certified_only, seed, device, progress)
        except KeyboardInterrupt:  # what was verified so far is reported (the key in hand counts, unjudged)
            report.interrupted_of = len(keys)
    return report


def _verify_keys(report: VerifyReport, profile, keys, certified_only: bool, seed: int, device, progress) -> None:
    from nbxcert.kernels.check import run_checked
    from nbxcert.kernels.spec import get_spec

    for key in keys:
        report.keys += 1
        if progress:
            progress(key.text())
        spec = get_spec(key.kernel)
        problems = key_problems(spec, key, profile)
        st = serving.state()
        certified = st.index.get(key.text()) is not None
        # a key with no certificate under NBXCERT_UNCERTIFIED=default runs the kernel's default: before, it was
        # reported as swept at run time (`served: sweep`, counted in `swept`), though nothing was swept
        if certified:
            served = "certificate"
        elif st.uncertified == "default" and key.text() not in st.runtime_cache:
            served = "default"
        else:
            served = "sweep"
        cfg = None
        try:
            # the inputs of a run-time sweep, made only if one runs: a certified key's config is looked up, and
            # NBXCERT_UNCERTIFIED=default takes the kernel's default (the checks make inputs of their own). Before,
            # they were made for every key with no certificate: minutes under the interpreter for a workload's
            # largest problems (tinyllama-1.1b's), for nothing.
            def runtime(spec=spec, problem=problems["largest"], dtypes=key.dtypes):
                inputs = spec.make_inputs(problem, dtypes, seed, device)
                return serving.RuntimeLaunch(
                    run=lambda c: spec.launch(c, inputs),
                    outputs=[inputs.tensors[o] for o in inputs.outputs],
                    restore=[inputs.tensors[o] for o in inputs.inplace],
                )

            try:
                cfg = serving.config_for(spec, problems["largest"], key.dtypes, runtime)
            except KeyNotCertified:
                report.missing.append(key.text())
                report.results.append(KeyVerdict(key.text(), "missing", reason="no certificate (certified-only)"))
                continue
            if certified:
                report.served += 1
            elif served == "default":
                report.defaulted += 1
            else:
                report.swept += 1
            worst, bad = None, None
            for role in ("smallest", "largest"):
                verdicts = run_checked(spec, cfg, problems[role], key.dtypes, profile, seed, device)
                for v in verdicts.values():
                    if worst is None or v.max_scaled > worst.max_scaled:
                        worst = v
                bad = next((v for v in verdicts.values() if not v.ok), None)
                if bad is not None:
                    report.mismatched.append((key.text(), cfg.label(), bad.report))
                    break
        except NbxcertError:  # a refusal (provenance under NBXCERT_STRICT_PROVENANCE=1, a bad launch) ends the run
            raise
        except Exception as e:  # noqa: BLE001 - a key whose inputs or launch raise is that key's verdict, not a crash
            if os.environ.get("NBXCERT_DEBUG") == "1":
                raise
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]
            report.failed.append((key.text(), reason))
            label = cfg.label() if cfg is not None else None
            report.results.append(KeyVerdict(key.text(), "failed", served, label, None, reason))
            continue
        error = worst.as_dict() if worst is not None else None
        if bad is not None:
            first = next((line for line in bad.report.splitlines() if line.startswith("Mismatched")), "mismatched")
            report.results.append(KeyVerdict(key.text(), "mismatched", served, cfg.label(), bad.as_dict(), first))
        else:
            report.results.append(KeyVerdict(key.text(), "passed", served, cfg.label(), error))


@dataclass
class CoverageReport:
    profile: str
    keys: list[str]
    certified: list[str]
    missing: list[str]
    results: list[KeyVerdict] = field(default_factory=list)  # one per key, in order
    dirs: list[str] = field(default_factory=list)
    older_code: list[str] = field(default_factory=list)  # certified keys whose entry code has changed since
    memory_class: str | None = None  # the class counted (None: any)
    # without a class asked, of a profile whose cards are of several classes: the keys certified for each class (a
    # card is served only its own class's entries, so "any" can read complete where one class is not)
    by_class: dict[str, int] = field(default_factory=dict)

    @property
    def fraction(self) -> float:
        """The covered fraction; 0.0 for no keys at all (a gate never passes on nothing)."""
        return len(self.certified) / len(self.keys) if self.keys else 0.0

    @property
    def older_fraction(self) -> float:
        """The fraction of the keys certified by code that has changed since (`--max-older`'s measure)."""
        return len(self.older_code) / len(self.keys) if self.keys else 0.0


def coverage(
    profile_name: str, keys: Sequence[LaunchKey], dirs: Sequence[Path] | None, memory_class: str | None = None
) -> CoverageReport:
    """Which of `keys` are certified for a profile in `dirs` (default: serving's search path); with `memory_class`,
    which have an entry of that class (what a card of the class is served: an H100 reads the 80GB class only). No
    keys, a directory that is not there, or a class none of the profile's cards has, is refused (`UsageError`):
    before, the first two counted as 100% or as every key missing."""
    from nbxcert import certificates
    from nbxcert.errors import UsageError
    from nbxcert.options import check_environment, existing_dirs
    from nbxcert.profiles import get_profile

    profile = get_profile(profile_name)
    if not keys:
        raise UsageError("no keys to count", hint="give --workload NAME|FILE, --keys FILE or --key TEXT")
    from nbxcert.memory_class import check_class, classes_of

    check_class(profile, memory_class)
    classes = classes_of(profile)
    dirs = existing_dirs(dirs)
    check_environment(search_path=dirs is None)
    searched = list(dirs) if dirs else [d for d in serving.search_path() if d.is_dir()]
    files = list(certificates.profile_certificates(searched, profile.key))  # read once, for every class counted
    have = {k: entry for k, (_path, _cert, entry) in certificates.first_entries_of(files, memory_class).items()}
    texts = [k.text() for k in keys]
    report = CoverageReport(profile.key, texts, [t for t in texts if t in have], [t for t in texts if t not in have])
    report.dirs = [str(d) for d in searched]
    report.memory_class = memory_class
    where = ", ".join(report.dirs)
    target = profile.key + (f" ({memory_class} class)" if memory_class else "")
    for t in texts:
        entry = have.get(t)
        if entry is None:
            report.results.append(KeyVerdict(t, "missing", reason=f"not certified for {target} in {where}"))
        else:
            err = {k: entry["error"][k] for k in ("max_scaled", "max_abs", "max_rel")}
            label = certificates.config_label(entry["winner"]["config"])
            report.results.append(KeyVerdict(t, "certified", "certificate", label, err))
    from nbxcert.certify import older_code

    report.older_code = older_code(profile, have, keys)
    if memory_class is None and len(classes) > 1:
        for c in classes:
            held = certificates.first_entries_of(files, c)
            report.by_class[c] = sum(t in held for t in texts)
    return report


def junit_xml(report: CoverageReport, min_fraction: float, max_older: float | None = None) -> str:
    """A JUnit report that fails as the command's exit code does: a test case per key (a missing one a failure where
    the coverage is below `min_fraction`, skipped where the gate allows it), one for the gate's minimum, and, with
    `max_older`, one for the keys certified by older code."""
    from xml.sax.saxutils import quoteattr

    below = report.fraction < min_fraction
    cases = []
    for t in report.keys:
        name = quoteattr(t)
        if t in report.missing and below:
            cases.append(
                f'  <testcase classname="nbxcert.coverage" name={name}><failure message="not certified"/></testcase>'
            )
        elif t in report.missing:
            why = quoteattr(f"not certified (allowed: coverage {report.fraction:.4f} >= --min {min_fraction})")
            cases.append(f'  <testcase classname="nbxcert.coverage" name={name}><skipped message={why}/></testcase>')
        else:
            cases.append(f'  <testcase classname="nbxcert.coverage" name={name}/>')

    def gate(name: str, failed: bool, message: str) -> str:
        inner = f"<failure message={quoteattr(message)}/>" if failed else ""
        return f'  <testcase classname="nbxcert.coverage.gate" name={quoteattr(name)}>{inner}</testcase>'

    cases.append(
        gate(f"coverage >= {min_fraction}", below, f"coverage {report.fraction:.4f} is below --min {min_fraction}")
    )
    failures = (len(report.missing) if below else 0) + below
    if max_older is not None:
        older = report.older_fraction
        cases.append(
            gate(
                f"older code <= {max_older}",
                older > max_older,
                f"{len(report.older_code)} keys ({older:.4f}) certified by code that has changed since, above "
                f"--max-older {max_older}",
            )
        )
        failures += older > max_older
    skipped = 0 if below else len(report.missing)
    head = (
        f'<testsuite name={quoteattr("nbxcert coverage " + report.profile)} tests="{len(cases)}" '
        f'failures="{failures}" skipped="{skipped}">'
    )
    return "\n".join(['<?xml version="1.0" encoding="utf-8"?>', head, *cases, "</testsuite>"]) + "\n"
