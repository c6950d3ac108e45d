"""`nbxcert.autotune` as a drop-in for `triton.autotune`: its whole signature, no `name=` needed, Triton's
`configs`/`cache`/`best_config`, configs with `maxnreg` and `pre_hook`, and the hooks, reset and restore around the
candidate runs of a run-time sweep; then the same kernel certified and served. The kernel is Triton's first tutorial
(tests/fixtures/tutorial_kernel.py), interpreted on the CPU."""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import triton
import triton.language as tl

import nbxcert
from nbxcert.kernels import tensor as T
from nbxcert.kernels.jit import jit

FIXTURES = str(Path(__file__).resolve().parents[1] / "fixtures")
NAME = "tutorial_kernel_add_kernel"  # module tutorial_kernel, function add_kernel: nbxcert's default name


@pytest.fixture(scope="module")
def tutorial(backend):
    if backend.name != "interpreter":
        pytest.skip("sweeps and certifies under the interpreter profile")
    sys.path.insert(0, FIXTURES)  # spawned certify workers inherit sys.path
    import tutorial_kernel

    return tutorial_kernel


@pytest.fixture
def launches(tutorial, monkeypatch, tmp_path):
    """Serving with no certificate (every key swept at run time), the fixture's records emptied and every launch of
    the kernel seen by a spy: its keyword arguments and whether `output_ptr` was all zero when it started."""
    from nbxcert import serving

    monkeypatch.setenv("NBXCERT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NBXCERT_CERTIFIED_DIR", str(tmp_path / "empty"))
    monkeypatch.delenv("NBXCERT_CERTIFIED_ONLY", raising=False)
    monkeypatch.setenv("NBXCERT_UNCERTIFIED", "sweep")
    for seen in tutorial.SEEN.values():
        seen.clear()
    seen = []
    original = tutorial.add_kernel.fn.run

    def spy(*args, grid, warmup, **kwargs):
        zero = bool((kwargs["output_ptr"].float64() == 0).all())
        seen.append({**{k: v for k, v in kwargs.items() if not hasattr(v, "data_ptr")}, "output_zero": zero})
        return original(*args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(tutorial.add_kernel.fn, "run", spy)
    serving.reset()
    yield seen
    serving.reset()


def _inputs(n):
    gen = np.random.default_rng(n)
    return T.from_numpy(gen.standard_normal(n), "float32"), T.from_numpy(gen.standard_normal(n), "float32")


def _add(tutorial, n):
    x, y = _inputs(n)
    out = tutorial.add(x, y)
    assert np.array_equal(out.numpy(), x.numpy() + y.numpy()), "the tutorial's sum"
    return out


def test_it_takes_triton_autotunes_whole_signature_in_triton_order():
    """`nbxcert.autotune(configs, key, prune_configs_by, ...)` positionally as Triton's; nbxcert's own arguments
    (name, make_inputs, ...) by keyword only, so a call written for Triton means the same thing."""
    from nbxcert.dropin import autotune as dropin_autotune

    theirs = [(p.name, p.kind, p.default) for p in inspect.signature(triton.autotune).parameters.values()]
    assert " ".join(n for n, _, _ in theirs) == (
        "configs key prune_configs_by reset_to_zero restore_value pre_hook post_hook warmup rep use_cuda_graph "
        "do_bench cache_results"
    )
    for ours in (nbxcert.autotune, dropin_autotune):
        params = inspect.signature(ours).parameters
        assert [(p.name, p.kind, p.default) for p in list(params.values())[: len(theirs)]] == theirs, ours
        assert params["name"].kind is inspect.Parameter.KEYWORD_ONLY and params["name"].default is None, ours


def test_without_name_the_kernel_is_named_by_its_module_and_qualname(tutorial):
    from nbxcert.dropin import default_name
    from nbxcert.keys import parse_key

    assert tutorial.add_kernel.spec.name == NAME
    assert parse_key(f"{NAME}[n_elements=1000;float32,float32,float32]@v1").kernel == NAME

    def Add_Kernel():  # a name with capitals, in a script run as __main__
        pass

    Add_Kernel.__module__ = "__main__"
    here = "test_without_name_the_kernel_is_named_by_its_module_and_qualname"
    assert default_name(Add_Kernel) == f"k___main___{here}__locals__add_kernel"
    Add_Kernel.__module__, Add_Kernel.__qualname__ = "mypkg.kernels", "Add_Kernel"
    assert default_name(Add_Kernel) == "mypkg_kernels_add_kernel"


def test_a_sweep_fills_best_config_configs_and_cache_as_triton_does(tutorial, launches):
    kernel = tutorial.add_kernel
    kernel.best_config = None
    kernel.cache.clear()  # other tests launch it too
    _add(tutorial, 1000)
    assert kernel.configs == tutorial.CONFIGS and all(
        a is b for a, b in zip(kernel.configs, tutorial.CONFIGS, strict=True)
    )
    assert any(kernel.best_config is c for c in tutorial.CONFIGS), kernel.best_config
    assert kernel.cache[(1000, "float32", "float32", "float32")] is kernel.best_config
    assert launches[-1]["BLOCK_SIZE"] == kernel.best_config.kwargs["BLOCK_SIZE"], "the last launch is the best config"
    assert {launch["BLOCK_SIZE"] for launch in launches[:-1]} == {32, 64, 128}, "every candidate ran in the sweep"


def test_maxnreg_goes_to_the_launch_and_a_configs_pre_hook_runs_before_each_launch_of_it(tutorial, launches):
    _add(tutorial, 1000)
    assert [c.label() for c in tutorial.add_kernel.spec.candidates] == [
        "BLOCK_SIZE=32,warps=1,stages=3",
        "BLOCK_SIZE=64,maxnreg=128,warps=2,stages=3",
        "BLOCK_SIZE=128,pre_hook=mark_block_128,warps=4,stages=3",
    ]
    for launch in launches:
        assert launch.get("maxnreg") == (128 if launch["BLOCK_SIZE"] == 64 else None), launch
        assert "pre_hook" not in launch, "the hook's name is a certificate's field, not a kernel argument"
    assert tutorial.SEEN["config_pre_hook"] == [128] * sum(launch["BLOCK_SIZE"] == 128 for launch in launches)


def test_reset_to_zero_zeroes_the_output_before_each_candidate_run_and_the_hooks_run_around_it(tutorial, launches):
    """The output starts NaN (poisoned by the tutorial's host function): each candidate run of the sweep, and the
    launch after it, must find it zeroed, as Triton's reset_to_zero does."""
    _add(tutorial, 1000)
    runs = launches[:-1]
    assert len(runs) >= 3 and all(launch["output_zero"] for launch in launches), launches
    pre, post = tutorial.SEEN["pre_hook"], tutorial.SEEN["post_hook"]
    assert [(p["block"], p["warps"]) for p in pre[:-1]] == [(r["BLOCK_SIZE"], r["num_warps"]) for r in runs]
    assert [p["reset_only"] for p in pre] == [False] * len(runs) + [True], "then once with reset_only, as Triton"
    assert [(p["block"], p["exception"]) for p in post] == [(r["BLOCK_SIZE"], None) for r in runs]


def test_triton_timing_knobs_are_recorded_not_used_and_said_once(tutorial, launches, capfd):
    kernel = tutorial.add_kernel
    _add(tutorial, 1000)
    assert tutorial.SEEN["do_bench"] == [], "nbxcert times candidates with its own timer"
    assert (kernel.num_warmups, kernel.num_reps, kernel.use_cuda_graph) == (25, 100, False)
    assert kernel.do_bench is tutorial.do_bench and kernel.cache_results is True
    err = capfd.readouterr().err
    assert err.count("warmup, rep, do_bench given to nbxcert.autotune are not used") == 1, err


def test_early_config_prune_gets_the_users_configs_and_the_key_arguments(tutorial, launches):
    """n_elements=4096 keeps the hooked config only: it is the best config, and its hook ran before the launch."""
    _add(tutorial, 4096)
    configs, named_args = tutorial.SEEN["early_prune"][-1]
    assert all(a is b for a, b in zip(configs, tutorial.CONFIGS, strict=True)) and named_args == {"n_elements": 4096}
    assert tutorial.add_kernel.best_config is tutorial.CONFIGS[2]
    assert {launch["BLOCK_SIZE"] for launch in launches} == {128}
    assert len(tutorial.SEEN["config_pre_hook"]) == len(launches)


def test_restore_value_puts_an_in_place_argument_back_before_each_candidate_run(launches):
    """x += y in place: every candidate runs (twice: checked, then timed) on the original x, and the launch after
    the sweep too, so x ends as x + y once (without the restore it ends x + 5 y)."""

    @nbxcert.autotune(
        configs=[triton.Config({"BLOCK_SIZE": 32}, num_warps=1), triton.Config({"BLOCK_SIZE": 64}, num_warps=2)],
        key=["n_elements"],
        restore_value=["x_ptr"],
    )
    @jit
    def add_in_place_kernel(x_ptr, y_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
        """x += y over n_elements float32 elements."""
        offsets = tl.program_id(axis=0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_elements
        tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)

    x, y = _inputs(300)
    x0 = x.numpy().copy()
    add_in_place_kernel[lambda meta: (triton.cdiv(300, meta["BLOCK_SIZE"]),)](x, y, 300)
    assert np.array_equal(x.numpy(), x0 + y.numpy())


def test_post_hook_gets_the_exception_of_a_candidate_that_fails(launches):
    """BLOCK_SIZE=48 is no power of two, so `tl.arange` refuses it: the post_hook is given that exception, the sweep
    refuses the candidate, and the other one is served."""
    seen = []

    @nbxcert.autotune(
        configs=[triton.Config({"BLOCK_SIZE": 48}), triton.Config({"BLOCK_SIZE": 64})],
        key=["n_elements"],
        post_hook=lambda nargs, exception: seen.append((nargs["BLOCK_SIZE"], exception)),
    )
    @jit
    def copy_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
        """out = x over n_elements float32 elements."""
        offsets = tl.program_id(axis=0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_elements
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask), mask=mask)

    x, _ = _inputs(100)
    out = T.full((100,), float("nan"), "float32")
    copy_kernel[lambda meta: (triton.cdiv(100, meta["BLOCK_SIZE"]),)](x, out, 100)
    assert np.array_equal(out.numpy(), x.numpy()) and copy_kernel.best_config.kwargs == {"BLOCK_SIZE": 64}
    failed = [e for block, e in seen if block == 48]
    assert len(failed) == 1 and isinstance(failed[0], Exception), seen
    assert all(e is None for block, e in seen if block == 64), seen


def test_a_certified_maxnreg_and_pre_hook_config_is_recorded_and_served(tutorial, launches, monkeypatch, tmp_path):
    """Certify n_elements=2048 (the prune keeps the maxnreg and the hooked config): the certificate records both
    configs' fields, the hook by name; serving it in certified-only mode launches the user's own triton.Config, with
    no sweep, so neither reset_to_zero nor the kernel's hooks run (a cached launch in Triton runs neither)."""
    from nbxcert import serving
    from nbxcert.certify import certify
    from nbxcert.keys import parse_key

    key = f"{NAME}[n_elements=2048;float32,float32,float32]@v1"
    out = tmp_path / "certs"
    report = certify("interpreter", [parse_key(key)], out, modules=["tutorial_kernel"], jobs=1)
    assert report.ok, report.keys
    launches.clear()  # whatever the certification ran in this process (its prune check) is not the launch below
    for seen in tutorial.SEEN.values():
        seen.clear()
    (path,) = out.rglob("*.json")
    entry = json.loads(path.read_text())["entries"][key]
    assert sorted([entry["winner"]["config"], entry["runner_up"]["config"]], key=lambda c: c["num_warps"]) == [
        {"kwargs": {"BLOCK_SIZE": 64, "maxnreg": 128}, "num_warps": 2, "num_stages": 3},
        {"kwargs": {"BLOCK_SIZE": 128, "pre_hook": "mark_block_128"}, "num_warps": 4, "num_stages": 3},
    ]

    monkeypatch.setenv("NBXCERT_CERTIFIED_DIR", str(out))
    monkeypatch.setenv("NBXCERT_CERTIFIED_ONLY", "1")
    serving.reset()
    _add(tutorial, 2048)
    winner = tutorial.CONFIGS[2] if "pre_hook" in entry["winner"]["config"]["kwargs"] else tutorial.CONFIGS[1]
    assert tutorial.add_kernel.best_config is winner
    assert len(launches) == 1 and not launches[0]["output_zero"], "one launch, on the poisoned output"
    assert tutorial.SEEN["pre_hook"] == [] and tutorial.SEEN["post_hook"] == []
    assert tutorial.SEEN["config_pre_hook"] == ([128] if winner.pre_hook else [])


def test_a_kernel_declared_as_triton_users_declare_it_is_certified_from_a_module_of_its_own(
    backend, monkeypatch, tmp_path
):
    """tutorial_plain.py is the tutorial with triton.autotune replaced and nothing else; tutorial_plain_certify.py
    gives its inputs, oracle and grid (`certify_with`). Certified, it is served certified-only with no sweep."""
    if backend.name != "interpreter":
        pytest.skip("certifies under the interpreter profile")
    from nbxcert import serving
    from nbxcert.certify import certify
    from nbxcert.errors import UsageError
    from nbxcert.keys import parse_key

    sys.path.insert(0, FIXTURES)
    import tutorial_plain

    with pytest.raises(UsageError, match="without make_inputs"):
        tutorial_plain.add_kernel.spec.make_inputs({"n_elements": 8}, ("float32",) * 3, 0, None)
    import tutorial_plain_certify  # what `--spec tutorial_plain_certify` imports before the key is read

    assert tutorial_plain.add_kernel.spec is tutorial_plain_certify.SPEC
    key = "tutorial_plain_add_kernel[n_elements=1000;float32,float32,float32]@v1"
    out = tmp_path / "certs"
    report = certify("interpreter", [parse_key(key)], out, modules=["tutorial_plain_certify"], jobs=1)
    assert report.ok, report.keys
    (path,) = out.rglob("*.json")
    entry = json.loads(path.read_text())["entries"][key]
    assert entry["winner"]["config"]["kwargs"]["BLOCK_SIZE"] in (32, 128)

    monkeypatch.setenv("NBXCERT_CERTIFIED_DIR", str(out))
    monkeypatch.setenv("NBXCERT_CERTIFIED_ONLY", "1")
    monkeypatch.setenv("NBXCERT_CACHE_DIR", str(tmp_path / "cache"))
    serving.reset()
    try:
        x, y = _inputs(1000)
        z = T.empty((1000,), "float32")
        tutorial_plain.add_kernel[lambda meta: (triton.cdiv(1000, meta["BLOCK_SIZE"]),)](x, y, z, 1000)
        assert np.array_equal(z.numpy(), x.numpy() + y.numpy())
        won = tutorial_plain.add_kernel.best_config
        assert won.kwargs["BLOCK_SIZE"] == entry["winner"]["config"]["kwargs"]["BLOCK_SIZE"]
    finally:
        serving.reset()
