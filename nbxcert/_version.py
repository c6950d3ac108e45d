"""The one place nbxcert's version is written (read by pyproject.toml and by provenance records)."""

__version__ = "0.4.0"
