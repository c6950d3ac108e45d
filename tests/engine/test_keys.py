"""Launch keys: one canonical text that round-trips, refusals by name, and buckets at the ladder's edges."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbxcert.errors import KeyParseError
from nbxcert.keys import KEY_VERSION, LaunchKey, bucket, bucket_range, make_key, parse_key

names = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True)
values = st.one_of(st.integers(min_value=0, max_value=2**40), names)


@st.composite
def keys(draw):
    fields = draw(st.dictionaries(names, values, max_size=8))
    dtypes = draw(st.lists(st.sampled_from(["float16", "bfloat16", "float32", "int32"]), min_size=1, max_size=4))
    return LaunchKey(draw(names), tuple(sorted(fields.items())), tuple(dtypes))


@settings(max_examples=300, deadline=None)
@given(keys())
def test_canonical_text_round_trips(key):
    text = key.text()
    assert parse_key(text) == key
    assert parse_key(text).text() == text
    assert text.endswith(f"@v{KEY_VERSION}")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_any_text_parses_or_is_refused_by_name(text):
    try:
        key = parse_key(text)
    except KeyParseError as e:
        assert e.message and "\n" not in e.message
    else:
        assert key.text() == text.strip()


def test_example_key_text():
    key = LaunchKey("rmsnorm", (("n_cols", 2048), ("n_rows", 512)), ("float16", "float16"))
    assert key.text() == "rmsnorm[n_cols=2048,n_rows=512;float16,float16]@v1"


@pytest.mark.parametrize(
    "text, message",
    [
        ("rmsnorm[n_rows=512;float16]@v0", "older than"),
        ("rmsnorm[n_rows=512;float16]@v9", "newer than"),
        ("rmsnorm[n_rows=512,n_cols=2;float16]@v1", "must be unique and sorted"),
        ("rmsnorm[n_rows=0512;float16]@v1", "leading zeros"),
        ("rmsnorm[n_rows;float16]@v1", "has no '='"),
        ("RMSNorm[n_rows=1;float16]@v1", "is not a launch key"),
        ("rmsnorm[n_rows=-1;float16]@v1", "must be a lower-case word"),
        ("rmsnorm[n_rows=1;float16]", "is not a launch key"),
    ],
)
def test_bad_keys_are_refused_with_the_reason(text, message):
    with pytest.raises(KeyParseError, match=message):
        parse_key(text)


LADDER = (1, 2, 4, 8, 16, 24, 32, 48, 64)


@pytest.mark.parametrize(
    "value, rung", [(1, 1), (2, 2), (3, 4), (16, 16), (17, 24), (24, 24), (25, 32), (64, 64), (65, 65), (1000, 1000)]
)
def test_bucket_edges(value, rung):
    assert bucket(value, LADDER) == rung


def test_bucket_range_is_certified_at_both_ends():
    assert bucket_range(24, LADDER) == (17, 24)
    assert bucket_range(1, LADDER) == (1, 1)
    assert bucket_range(65, LADDER) == (65, 65), "above the top rung a size is its own bucket"
    for lo_rung, hi_rung in zip(LADDER, LADDER[1:], strict=False):
        lo, hi = bucket_range(hi_rung, LADDER)
        assert lo == lo_rung + 1 and hi == hi_rung
        assert bucket(lo, LADDER) == hi_rung and bucket(lo - 1, LADDER) == lo_rung


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=10**6))
def test_every_size_lies_inside_its_bucket(value):
    from nbxcert.profiles import get_profile

    ladder = get_profile("nvidia/hopper").ladder("tokens")
    lo, hi = bucket_range(bucket(value, ladder), ladder)
    assert lo <= value <= hi


def test_make_key_uses_the_device_file_ladder():
    from nbxcert.kernels.spec import KeyField
    from nbxcert.profiles import get_profile

    class Spec:
        name = "matmul"
        key_fields = (KeyField("M", "tokens"), KeyField("N"), KeyField("trans_b"))

    profile = get_profile("nvidia/hopper")
    key = make_key(Spec, {"M": 300, "N": 4096, "trans_b": True}, ["float16"], profile)
    assert key.text() == "matmul[M=512,N=4096,trans_b=1;float16]@v1"
    with pytest.raises(KeyParseError, match="lacks key field 'N'"):
        make_key(Spec, {"M": 3, "trans_b": 0}, ["float16"], profile)
