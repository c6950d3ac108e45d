"""`nbxcert verify` and `nbxcert coverage`: prove certificates hold, and measure how much of a workload they cover.

verify launches every key through the serving path (exactly as an application would) on fresh random inputs (a seed
other than the certification's), at the bucket's smallest and largest member, and checks each output against the
oracle. It counts keys served from certificates, swept at run time, missing (certified-only) and mismatched.

coverage needs no GPU: it reads the certificate files of a profile and says which of the requested keys they hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from nbxcert import serving
from nbxcert.errors import KeyNotCertified
from nbxcert.keys import LaunchKey, key_problems

VERIFY_SEED = 777_2026  # not the certification seed: verification uses inputs the certificate never saw


@dataclass
class VerifyReport:
    profile: str
    keys: int = 0
    served: int = 0
    swept: int = 0
    missing: list[str] = field(default_factory=list)
    mismatched: list[tuple[str, str, str]] = field(default_factory=list)  # key, config, report
    shard: str = ""  # "i/n" when only a share of the keys was verified
    interrupted_of: int = 0  # the keys asked for, when an interrupt (Ctrl-C, `timeout -s INT`) stopped the run early

    @property
    def ok(self) -> bool:
        return not self.missing and not self.mismatched and not self.interrupted_of

    def line(self) -> str:
        share = f" (shard {self.shard})" if self.shard else ""
        cut = f"; interrupted: {self.keys} of {self.interrupted_of} keys reached" if self.interrupted_of else ""
        return (
            f"[nbxcert] verify{share}: {self.keys} keys, {self.served} served, {self.swept} swept at run time, "
            f"{len(self.missing)} missing, {len(self.mismatched)} mismatched{cut}"
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
) -> VerifyReport:
    """Each key through the serving path, checked against its oracle at its bucket's smallest and largest member.
    The certified winners are first compiled in a pool of `jobs` processes (`nbxcert.warm`; `on_warmed(report)` is
    told when that is done); `progress(key text)` as each key starts. An interrupt while the keys are checked ends
    the run with what it found so far (`interrupted_of` set)."""
    from nbxcert.certify import resolve_profile
    from nbxcert.kernels.backends import select
    from nbxcert.warm import warm

    profile, _how = resolve_profile(profile_name)
    serving.configure(dirs=dirs, certified_only=certified_only)
    warmed = warm(profile.key, keys, None, jobs)  # the serving state just configured (None: not made again)
    if on_warmed:
        on_warmed(warmed)
    device = select().device
    report = VerifyReport(profile.key)
    try:
        _verify_keys(report, profile, keys, certified_only, seed, device, progress)
    except KeyboardInterrupt:  # what was verified so far is reported (the key in hand counts as reached, unjudged)
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
        runtime = None  # a certified key's config is looked up: no inputs are made for it here (the checks make theirs)
        if not certified and not certified_only:
            inputs = spec.make_inputs(problems["largest"], key.dtypes, seed, device)
            runtime = serving.RuntimeLaunch(
                run=lambda c, inputs=inputs: spec.launch(c, inputs),
                outputs=[inputs.tensors[o] for o in inputs.outputs],
                restore=[inputs.tensors[o] for o in inputs.inplace],
            )
        try:
            cfg = serving.config_for(spec, problems["largest"], key.dtypes, runtime)
        except KeyNotCertified:
            report.missing.append(key.text())
            continue
        if certified:
            report.served += 1
        else:
            report.swept += 1
        for role in ("smallest", "largest"):
            verdicts = run_checked(spec, cfg, problems[role], key.dtypes, profile, seed, device)
            bad = next((v for v in verdicts.values() if not v.ok), None)
            if bad is not None:
                report.mismatched.append((key.text(), cfg.label(), bad.report))
                break


@dataclass
class CoverageReport:
    profile: str
    keys: list[str]
    certified: list[str]
    missing: list[str]

    @property
    def fraction(self) -> float:
        return len(self.certified) / len(self.keys) if self.keys else 1.0


def certified_keys(profile_key: str, dirs: Sequence[Path]) -> set[str]:
    """Every key certified for a profile (any memory class) in `dirs`; each file validated."""
    from nbxcert import certificates

    found: set[str] = set()
    for d in dirs:
        for path in certificates.iter_files(Path(d), profile_key):
            found.update(certificates.load_file(path).entries)
    return found


def coverage(profile_name: str, keys: Sequence[LaunchKey], dirs: Sequence[Path] | None) -> CoverageReport:
    from nbxcert.profiles import get_profile

    profile = get_profile(profile_name)
    have = certified_keys(profile.key, list(dirs) if dirs else serving.search_path())
    texts = [k.text() for k in keys]
    return CoverageReport(profile.key, texts, [t for t in texts if t in have], [t for t in texts if t not in have])


def junit_xml(report: CoverageReport, min_fraction: float) -> str:
    """A JUnit report: one test case per key, a failure for each missing one."""
    from xml.sax.saxutils import quoteattr

    cases = []
    for t in report.keys:
        name = quoteattr(t)
        if t in report.missing:
            cases.append(
                f'  <testcase classname="nbxcert.coverage" name={name}><failure message="not certified"/></testcase>'
            )
        else:
            cases.append(f'  <testcase classname="nbxcert.coverage" name={name}/>')
    failures = len(report.missing)
    head = (
        f'<testsuite name={quoteattr("nbxcert coverage " + report.profile)} tests="{len(report.keys)}" '
        f'failures="{failures}">'
    )
    return "\n".join(['<?xml version="1.0" encoding="utf-8"?>', head, *cases, "</testsuite>"]) + "\n"
