"""The package as users install it: a wheel and an editable install find the same data through importlib.resources,
import names stay under `nbxcert`, and the README keeps exactly its two set-up commands."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = (
    "import json, nbxcert, nbxcert.profiles as p, nbxcert.kernels.tensor, nbxcert.oracles;"
    "from importlib.resources import files;"
    "print(json.dumps({'file': nbxcert.__file__, 'profiles': [x.key for x in p.all_profiles()],"
    "'devices': sorted(f.name for f in files('nbxcert.devices').iterdir() if not f.name.startswith('__'))}))"
)


def _probe(env_extra=None, cwd="/") -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(env_extra or {})
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_wheel_and_editable_install_find_the_same_data(tmp_path):
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr
    wheel = next((tmp_path / "dist").glob("nbxcert-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert not any(n.startswith(("kernels/", "oracles/", "devices/")) for n in names), "top-level package shipped"
    assert "nbxcert/devices/nvidia/hopper.yml" in names and "nbxcert/kernels/tensor.py" in names
    target = tmp_path / "site"
    inst = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert inst.returncode == 0, inst.stderr
    from_wheel = _probe({"PYTHONPATH": str(target)})
    installed = _probe()  # the install the tests run against (editable in the README's command)
    assert from_wheel["file"].startswith(str(target))
    assert from_wheel["profiles"] == installed["profiles"] and from_wheel["profiles"]
    assert from_wheel["devices"] == installed["devices"]


def _fenced(name: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(rf"<!-- {name} -->\n```\n(.*?)\n```\n<!-- /{name} -->", text, re.S)
    assert block, f"README.md has no {name} block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_readme_first_section_has_exactly_two_setup_commands():
    text = (ROOT / "README.md").read_text()
    first = text.split("\n## ")[1]
    assert first.startswith("Set up")
    assert first.count("```\n") == 4, "exactly two fenced commands in the set-up section"
    (main_cmd,) = _fenced("main-command")
    (test_cmd,) = _fenced("test-command")
    assert "nbxcert" in main_cmd and "pytest" in test_cmd
    assert "test-command" in (ROOT / ".ci" / "run").read_text(), ".ci/run must run the README's test command"


def test_no_top_level_kernels_package_is_importable_from_the_install():
    info = _probe()
    assert "nbxcert" in info["file"]
    r = subprocess.run([sys.executable, "-c", "import kernels"], capture_output=True, text=True, cwd="/")
    assert r.returncode != 0, "a top-level `kernels` package would clash with the PyPI package of that name"
