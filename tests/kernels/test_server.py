"""The seam between the kernel layer and serving (`nbxcert.kernels.server`): a launch given no config asks the server
registered from above, the kernel layer imports no engine module to find it, and with none registered a launch is
refused by name."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from nbxcert.errors import ServerNotRegistered
from nbxcert.kernels import rows, server
from nbxcert.kernels.spec import choose_config
from nbxcert.kernels.tensor import from_numpy


@pytest.fixture
def registered():
    """Put back whatever server was registered before the test."""
    before = server.registered()
    yield
    server.set_server(before)


def test_a_registered_server_is_what_a_launch_with_no_config_asks(registered):
    asked = []

    def fake(spec, problem, dtypes, runtime):
        asked.append((spec.name, dict(problem), tuple(dtypes), sorted(runtime or {})))
        return spec.default

    server.set_server(fake)
    assert server.registered() is fake
    problem = {"n_rows": 3, "n_cols": 37}
    assert choose_config(rows.RMSNORM, problem, ("float16", "float16"), run=print) == rows.RMSNORM.default
    assert asked == [("rmsnorm", problem, ("float16", "float16"), ["run"])]
    given = rows.RMSNORM.candidates[-1]
    assert choose_config(rows.RMSNORM, problem, ("float16", "float16"), given) is given  # the caller's: never asked
    assert len(asked) == 1

    gen = np.random.default_rng(3)
    x = from_numpy(gen.standard_normal((3, 41)).astype(np.float16), "float16")
    w = from_numpy(gen.standard_normal(41).astype(np.float16), "float16")
    rows.rmsnorm(x, w)  # a user-facing launch goes through the same seam
    assert asked[-1][0] == "rmsnorm" and asked[-1][1]["n_cols"] == 41, asked


def test_with_no_server_registered_a_launch_is_refused_by_name(registered):
    assert server.set_server(None) is not None  # `import nbxcert` had registered serving's
    assert server.registered() is None
    with pytest.raises(ServerNotRegistered, match="kernel rmsnorm: no config was given") as e:
        choose_config(rows.RMSNORM, {"n_rows": 3, "n_cols": 37}, ("float16", "float16"))
    assert "set_server" in e.value.hint
    assert choose_config(rows.RMSNORM, {"n_rows": 3, "n_cols": 37}, ("float16", "float16"), rows.RMSNORM.default)


def test_importing_the_kernel_layer_imports_no_serving():
    code = (
        "import sys; import nbxcert.kernels.spec, nbxcert.kernels.check;"
        "bad = sorted(m for m in sys.modules if m.startswith(('nbxcert.serving', 'nbxcert.sweep', 'nbxcert.warm')));"
        "assert not bad, bad;"
        "from nbxcert.kernels import server; assert server.registered() is not None, 'import nbxcert registers one'"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_importing_nbxcert_loads_no_numpy_triton_or_serving():
    code = (
        "import sys; import nbxcert;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'triton', 'torch')"
        " or m.startswith('nbxcert.serving'));"
        "assert not bad, bad"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
