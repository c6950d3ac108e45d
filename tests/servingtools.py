"""What the serving tests share: serving with no certificate and the untuned default served for every key."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def defaults_served(monkeypatch, tmp_path):
    """Serving with no certificate directory and the untuned default served for every key (a served path with no
    sweep); no directory override left for the tests after it."""
    from nbxcert import serving

    monkeypatch.setenv("NBXCERT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NBXCERT_CERTIFIED_ONLY", "0")
    monkeypatch.setenv("NBXCERT_UNCERTIFIED", "default")
    serving.configure(dirs=[tmp_path / "none"])
    try:
        yield
    finally:
        serving.configure()
