"""nbxcert: certify Triton kernel launch configurations per GPU class against float64 oracles, then serve them.

Importing `nbxcert` loads almost nothing (no Triton, no CUDA): the engine's modules are imported where they are used.
"""

from nbxcert._version import __version__

__all__ = ["__version__"]
