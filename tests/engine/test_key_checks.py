"""`keys.check_key` and `keys.check_prune`: a key text is held to its kernel's key fields, value kinds and dtypes and
to the profile's ladders before any command works with it, and `nbxcert validate` refuses exactly what it refuses
(`dirscan._key_against_spec` calls it), so certify never writes an entry validate rejects."""

from __future__ import annotations

import pytest

from nbxcert import dirscan
from nbxcert.errors import KeyParseError
from nbxcert.kernels.spec import get_spec
from nbxcert.keyfile import gather_keys
from nbxcert.keys import MAX_SIZE, check_key, check_prune, parse_key
from nbxcert.profiles import get_profile

INTERPRETER = get_profile("cpu/interpreter")


@pytest.mark.parametrize(
    "text, message",
    [
        # bug: a key missing a field reached `key_problems` and raised KeyError: 'n_rows' (a traceback from certify)
        ("rmsnorm[n_cols=64;float16,float16]@v1", "lacks key field n_rows"),
        ("rmsnorm[n_cols=64,n_rows=8,zz=1;float16,float16]@v1", "has field zz that rmsnorm does not key on"),
        ("rmsnorm[n_cols=64,n_rows=7;float16,float16]@v1", "n_rows=7 is not a rung"),  # certified, then refused
        ("rmsnorm[n_cols=64,n_rows=0;float16,float16]@v1", "n_rows=0 is not a rung"),
        ("rmsnorm[n_cols=64,n_rows=8;float16]@v1", "dtypes float16 are not among"),
        ("rmsnorm[n_cols=x,n_rows=8;float16,float16]@v1", "n_cols=x is a word"),
        ("softmax[mask=0,n_cols=64,n_rows=8;float16]@v1", "mask=0 is a number"),
        (f"rmsnorm[n_cols={MAX_SIZE + 1},n_rows=8;float16,float16]@v1", "above 2**63 - 1"),
    ],
)
def test_keys_no_launch_forms_are_refused_by_name(text, message):
    key = parse_key(text)
    with pytest.raises(KeyParseError, match=message.replace("*", r"\*")) as e:
        check_key(get_spec(key.kernel), key, INTERPRETER)
    assert text in e.value.message


def test_every_key_a_workload_forms_passes_and_sizes_above_the_top_rung_are_their_own_bucket():
    for name in ("demo", "tinyllama-1.1b"):
        for profile in (INTERPRETER, get_profile("nvidia/hopper")):
            for key in gather_keys(profile, workload=name):
                check_prune(get_spec(key.kernel), check_key(get_spec(key.kernel), key, profile), profile)
    top = parse_key("rmsnorm[n_cols=64,n_rows=65537;float16,float16]@v1")
    assert check_key(get_spec("rmsnorm"), top, INTERPRETER) == top


def test_a_prune_that_raises_on_a_keys_sizes_refuses_the_key():
    # bug: `kv_heads=0` made decode attention's prune divide by zero, a ZeroDivisionError traceback from certify
    key = parse_key("decode_attention[batch=2,head_dim=64,heads=1,kv_heads=0,kv_len=32;float16]@v1")
    spec = get_spec("decode_attention")
    check_key(spec, key, INTERPRETER)
    with pytest.raises(KeyParseError, match="cannot take these sizes .*ZeroDivisionError"):
        check_prune(spec, key, INTERPRETER)


@pytest.mark.parametrize(
    "text",
    [
        "rmsnorm[n_cols=64,n_rows=8;float16,float16]@v1",
        "rmsnorm[n_cols=64,n_rows=7;float16,float16]@v1",
        "rmsnorm[n_cols=64,n_rows=70000;float16,float16]@v1",
        "rmsnorm[n_cols=64;float16,float16]@v1",
        "rmsnorm[n_cols=64,n_rows=8;bfloat16,bfloat16]@v1",
        "rmsnorm[n_cols=64,n_rows=8;float16]@v1",
        "rmsnorm[n_cols=z,n_rows=8;float16,float16]@v1",
    ],
)
def test_validate_refuses_exactly_the_keys_certify_refuses(text, tmp_path):
    key, spec = parse_key(text), get_spec("rmsnorm")
    try:
        check_key(spec, key, INTERPRETER)
        certify_takes = True
    except KeyParseError:
        certify_takes = False
    dtype = spec.output_dtypes(key.dtypes)[0] if key.dtypes in spec.dtypes else "float16"
    problem = dirscan._key_against_spec(tmp_path / "f.json", text, dtype, spec, INTERPRETER)
    assert (problem is None) == certify_takes, problem
