"""`nbxcert.autotune` refuses, in one line naming the kernel and the value, what a user porting `triton.autotune` code
can get wrong and nbxcert could otherwise only ignore or fail on with a traceback: a launch argument the configs set
or the kernel does not take, a key argument not given, a config that leaves a meta-parameter unset, an
`early_config_prune` that reads a non-key argument or returns no config of the kernel's, `reset_to_zero` and
`restore_value` of a non-tensor, and declaration slips (a string key, a misspelt `prune_configs_by` key, only some of
`make_inputs`/`oracle`/`grid`). The launch key's dtypes are those of `dtype_args`, in their order, as `nbxcert
certify --key` takes them. Kernels are interpreted on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import triton
import triton.language as tl

import nbxcert
from nbxcert.errors import KernelSpecInvalid, LaunchError
from nbxcert.kernels import tensor as T
from nbxcert.kernels.jit import jit

N = 100
CONFIGS = [triton.Config({"BLOCK": 32}, num_warps=1), triton.Config({"BLOCK": 64}, num_warps=2)]


def grid(meta):
    return (triton.cdiv(meta["n"], meta["BLOCK"]),)


def scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out = 3 x over n elements (stored in out's dtype)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, (3.0 * tl.load(x_ptr + offs, mask=mask)).to(out_ptr.dtype.element_ty), mask=mask)


def declare(name, configs=CONFIGS, key=("n",), **kwargs):
    """`scale` under nbxcert.autotune, named `name` (each test registers kernels of its own)."""
    return nbxcert.autotune(configs=configs, key=list(key), name=name, **kwargs)(jit(scale))


@pytest.fixture
def sweeping(backend, monkeypatch, tmp_path):
    """Serving with no certificate: every key swept at run time, its cache in the test's own directory."""
    if backend.name != "interpreter":
        pytest.skip("launches under the interpreter")
    from nbxcert import serving

    monkeypatch.setenv("NBXCERT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NBXCERT_CERTIFIED_DIR", str(tmp_path / "empty"))
    monkeypatch.delenv("NBXCERT_CERTIFIED_ONLY", raising=False)
    monkeypatch.setenv("NBXCERT_UNCERTIFIED", "sweep")
    serving.reset()
    yield serving
    serving.reset()


LAUNCHED = declare("refusals_launch")


def _tensors(dtype="float32"):
    x = T.from_numpy(np.random.default_rng(0).standard_normal(N), dtype)
    return x, T.full((N,), float("nan"), "float32")


def test_the_launch_keys_dtypes_are_those_of_dtype_args_in_their_order(sweeping, monkeypatch):
    """dtype_args=("x_ptr",): `nbxcert certify --key 'k[n=100;float16]@v1'` certifies a key of one dtype, so the
    launch must look that key up, not one listing every tensor argument's dtype (it was never served)."""
    from nbxcert import dropin

    looked_up = []
    real = dropin.serving.config_for

    def spy(spec, problem, dtypes, runtime=None):
        looked_up.append(tuple(dtypes))
        return real(spec, problem, dtypes, runtime)

    monkeypatch.setattr(dropin.serving, "config_for", spy)
    k = declare("refusals_dtype_args", dtypes=[("float16",), ("float32",)], dtype_args=("x_ptr",))
    x, out = _tensors("float16")
    k[grid](x, out, N)
    assert looked_up == [("float16",)]
    assert np.allclose(out.numpy(), 3 * x.numpy().astype(np.float32), rtol=1e-3)

    swapped = declare("refusals_dtype_args_order", dtypes=[("float32", "float16")], dtype_args=("out_ptr", "x_ptr"))
    swapped[grid](x, out, N)
    assert looked_up[-1] == ("float32", "float16"), "in dtype_args' order, not the arguments'"
    with pytest.raises(KernelSpecInvalid, match=r"dtype_args arguments \['y_ptr'\] are not arguments of the kernel"):
        declare("refusals_dtype_args_unknown", dtypes=[("float32",)], dtype_args=("y_ptr",))


def test_a_certifiable_kernel_whose_dtypes_cannot_form_the_launchs_key_is_refused_at_the_launch(sweeping):
    """Declared certifiable with no dtype_args and a dtype tuple of one, launched with two tensors: the key printed
    for `nbxcert certify` would be refused there, and a certified one never served."""
    k = declare("refusals_star", make_inputs=lambda *a: None, oracle=lambda i: {}, grid=grid)
    x, out = _tensors()
    refused = r"the launch has 2 tensor arguments \(x_ptr, out_ptr\) but the kernel's dtypes= list 1 per key"
    with pytest.raises(KernelSpecInvalid, match=refused):
        k[grid](x, out, N)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((N,), {"BLOCK": 16}, r"gives BLOCK, which config BLOCK=32,warps=1,stages=3 sets too"),
        ((N,), {"num_warps": 8}, r"gives num_warps=8, which each config sets"),
        ((), {"n_elements": N}, r"gives n_elements=, which is not an argument of the kernel \(x_ptr, out_ptr, n, B"),
        ((N, 5, 6), {}, r"gives 5 positional arguments; the kernel takes 4"),
        ((), {}, r"gives no key argument n"),
        ((N,), {"n": N}, r"argument 'n' is given twice"),
    ],
)
def test_a_launch_argument_the_configs_set_or_the_kernel_does_not_take_is_refused(sweeping, args, kwargs, message):
    """Triton refuses each of these launches; nbxcert dropped the argument (a meta-parameter or num_warps silently
    replaced by the config's, a misspelt keyword ignored) or failed with a KeyError traceback."""
    x, out = _tensors()
    with pytest.raises(LaunchError, match=message):
        LAUNCHED[grid](x, out, *args, **kwargs)


def test_a_key_argument_left_to_its_default_forms_the_key(sweeping):
    @nbxcert.autotune(configs=CONFIGS, key=["n"], name="refusals_default_key")
    @jit
    def defaulted(x_ptr, out_ptr, n=N, BLOCK: tl.constexpr = 16):
        """out = 3 x over n float32 elements."""
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, 3.0 * tl.load(x_ptr + offs, mask=mask), mask=mask)

    x, out = _tensors()
    defaulted[lambda meta: (triton.cdiv(N, meta["BLOCK"]),)](x, out)
    assert np.allclose(out.numpy(), 3 * x.numpy())
    assert defaulted.spec.problem_of(x, out) == {"n": N}
    assert list(defaulted.cache) == [("float32", "float32")], "Triton's tuning key skips a key argument not given"


def test_a_config_that_leaves_a_meta_parameter_unset_is_refused_by_name(sweeping):
    """Before: the sweep rejected such a config with a bare 'KeyError' (or every config, then 'no candidate ran')."""
    x, out = _tensors()
    holed = declare("refusals_holed", configs=[CONFIGS[0], triton.Config({})])
    with pytest.raises(KernelSpecInvalid, match=r"config warps=4,stages=3 sets no BLOCK, which other configs set"):
        holed[grid](x, out, N)
    unset = declare("refusals_unset", configs=[])  # Triton's default config: BLOCK must come from the launch
    with pytest.raises(LaunchError, match=r"the launch gives no BLOCK, and no config sets it"):
        unset[grid](x, out, N)
    unset[lambda meta: (triton.cdiv(N, meta["BLOCK"]),)](x, out, N, BLOCK=32)
    assert np.allclose(out.numpy(), 3 * x.numpy())
    with pytest.raises(LaunchError, match=r"the launch gives no out_ptr"):
        unset[grid](x, n=N, BLOCK=32)
    with pytest.raises(KernelSpecInvalid, match=r"config BLOK=32,warps=4,stages=3 sets BLOK, not arguments of"):
        declare("refusals_misspelt", configs=[triton.Config({"BLOK": 32})])


def test_early_config_prune_mistakes_are_refused_by_name(sweeping):
    """Before: a KeyError traceback from the user's prune, or PruneEmpty's 'no candidate fits this device'."""
    x, out = _tensors()
    cases = [
        (
            lambda configs, named_args: [c for c in configs if named_args["x_ptr"] is not None],
            r"read named_args\['x_ptr'\], but it is given the key arguments only \(n\)",
        ),
        (lambda configs, named_args: [], r"returned no config for \{'n': 100\}"),
        (lambda configs, named_args: None, "returned no config"),
        (lambda configs, named_args: [triton.Config({"BLOCK": 128})], "returned BLOCK=128,warps=4,stages=3 for"),
    ]
    for i, (prune, message) in enumerate(cases):
        k = declare(f"refusals_prune_{i}", prune_configs_by={"early_config_prune": prune})
        with pytest.raises(KernelSpecInvalid, match=message) as e:
            k[grid](x, out, N)
        assert "\n" not in str(e.value)


def test_reset_to_zero_and_restore_value_of_a_non_tensor_are_refused_by_name(sweeping):
    """Before: every candidate rejected with a bare 'AttributeError', then 'no candidate ran at run time'."""
    x, out = _tensors()
    for what in ("reset_to_zero", "restore_value"):
        k = declare(f"refusals_{what}", **{what: ["n"]})
        with pytest.raises(LaunchError, match=rf"{what} names argument 'n', which is not a tensor \(int\)"):
            k[grid](x, out, N)


def test_declaration_slips_are_refused_in_one_line(backend):
    with pytest.raises(KernelSpecInvalid, match=r"key='n' is a string; Triton's key is a list of argument names"):
        nbxcert.autotune(configs=CONFIGS, key="n", name="refusals_str_key")(jit(scale))
    with pytest.raises(KernelSpecInvalid, match=r"prune_configs_by keys \['early_config_prun'\] are not Triton's"):
        declare("refusals_prune_typo", prune_configs_by={"early_config_prun": lambda c, a: c})
    with pytest.raises(KernelSpecInvalid, match=r"make_inputs, oracle given without grid"):
        declare("refusals_partial", make_inputs=lambda *a: None, oracle=lambda i: {})
    k = declare("refusals_certify_with")
    with pytest.raises(KernelSpecInvalid, match=r"certify_with needs make_inputs, oracle and grid; grid not given"):
        k.certify_with(make_inputs=lambda *a: None, oracle=lambda i: {}, grid=None)


def test_warmup_true_is_refused_rather_than_launching(sweeping):
    """Triton's `kernel.run(..., warmup=True)` and `kernel.warmup(...)` compile without launching; nbxcert launched
    the first and had no `warmup` (an AttributeError)."""
    k = declare("refusals_warmup")
    x, out = _tensors()
    with pytest.raises(LaunchError, match=r"warmup \(compile without launching\) is not taken"):
        k.run(x, out, N, grid=grid, warmup=True)
    with pytest.raises(LaunchError, match=r"warmup \(compile without launching\) is not taken") as e:
        k.warmup(x, out, N, grid=grid)  # Triton's Autotuner.warmup
    assert "nbxcert warm" in e.value.hint
    k.run(x, out, N, grid=grid, warmup=False)
    assert np.allclose(out.numpy(), 3 * x.numpy())
