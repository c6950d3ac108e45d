"""Checks of the attention oracles (oracles/attention.py) against independent derivations: mpmath at 50 digits for
the values, an explicit per-row loop for the masks (bottom-right causal alignment, per-sequence lengths), repeated KV
heads for GQA, and a hand-gathered cache for the paged form. Fully masked rows are zeros with a zero error scale."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest

from nbxcert.oracles import attention as oracle


def _mp_row(q_row, k, v, visible, scale):
    """softmax(q·kᵀ·scale) v over the visible keys, and Σ p |v|, at 50 digits."""
    with mpmath.workdps(50):
        keys = [j for j in range(k.shape[0]) if visible[j]]
        if not keys:
            return np.zeros(v.shape[1]), np.zeros(v.shape[1])
        s = [
            mpmath.fsum(mpmath.mpf(float(a)) * mpmath.mpf(float(b)) for a, b in zip(q_row, k[j], strict=False)) * scale
            for j in keys
        ]
        top = max(s)
        e = [mpmath.exp(x - top) for x in s]
        total = mpmath.fsum(e)
        p = [x / total for x in e]
        out = [
            float(mpmath.fsum(p[i] * mpmath.mpf(float(v[j, d])) for i, j in enumerate(keys))) for d in range(v.shape[1])
        ]
        err = [
            float(mpmath.fsum(p[i] * abs(mpmath.mpf(float(v[j, d]))) for i, j in enumerate(keys)))
            for d in range(v.shape[1])
        ]
    return np.array(out), np.array(err)


@pytest.mark.parametrize("q_len,kv_len,causal", [(5, 5, True), (3, 7, True), (6, 4, True), (4, 6, False)])
def test_attention_matches_mpmath_row_by_row(q_len, kv_len, causal):
    """Every row against 50-digit arithmetic, with the mask written out per row: causal row i sees key j iff
    j <= i + kv_len - q_len (bottom-right); rows that see nothing are zeros."""
    gen = np.random.default_rng(q_len * 10 + kv_len)
    q = gen.standard_normal((1, 2, q_len, 8)) * 3
    k = gen.standard_normal((1, 2, kv_len, 8))
    v = gen.standard_normal((1, 2, kv_len, 8))
    out, err = oracle.attention(q, k, v, 0.4, causal)
    for h in range(2):
        for i in range(q_len):
            visible = [not causal or j <= i + kv_len - q_len for j in range(kv_len)]
            want, want_err = _mp_row(q[0, h, i], k[0, h], v[0, h], visible, 0.4)
            np.testing.assert_allclose(out[0, h, i], want, rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(err[0, h, i], want_err, rtol=1e-12, atol=1e-14)
    if causal and q_len > kv_len:
        assert np.all(out[:, :, : q_len - kv_len] == 0) and np.all(err[:, :, : q_len - kv_len] == 0)


def test_rows_average_and_scale_bounds():
    """With V = 1 every visible row is 1 (the probabilities sum to 1), and |out| <= error scale everywhere."""
    gen = np.random.default_rng(1)
    q = gen.standard_normal((2, 4, 9, 16)) * 5
    k = gen.standard_normal((2, 2, 9, 16))
    out, err = oracle.attention(q, k, np.ones((2, 2, 9, 16)), 0.25, True)
    np.testing.assert_allclose(out, 1.0, rtol=1e-14)
    np.testing.assert_allclose(err, 1.0, rtol=1e-14)
    v = gen.standard_normal((2, 2, 9, 16))
    out, err = oracle.attention(q, k, v, 0.25, False)
    assert np.all(np.abs(out) <= err * (1 + 1e-12))


def test_gqa_repeats_kv_heads():
    gen = np.random.default_rng(2)
    q = gen.standard_normal((2, 8, 5, 16))
    k = gen.standard_normal((2, 2, 7, 16))
    v = gen.standard_normal((2, 2, 7, 16))
    out, err = oracle.attention(q, k, v, 0.3, True)
    rep_out, rep_err = oracle.attention(q, np.repeat(k, 4, axis=1), np.repeat(v, 4, axis=1), 0.3, True)
    # the 4 query heads sharing a KV head are one product there, 4 products here: float64 rounding apart, no more
    np.testing.assert_allclose(out, rep_out, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(err, rep_err, rtol=1e-13, atol=1e-15)
    with pytest.raises(ValueError, match="not a multiple"):
        oracle.attention(q, k[:, :1].repeat(3, axis=1), v[:, :1].repeat(3, axis=1), 0.3, False)


def test_large_scores_do_not_overflow():
    """Scores of several hundred: the maximum is subtracted before exp, so nothing overflows."""
    q = np.full((1, 1, 2, 4), 30.0)
    k = np.array([[[[30.0] * 4, [29.0] * 4, [-30.0] * 4]]])
    v = np.array([[[[1.0] * 4, [2.0] * 4, [3.0] * 4]]])
    out, _ = oracle.attention(q, k, v, 1.0, False)
    p1 = 1 / (1 + np.exp(-120.0))
    np.testing.assert_allclose(out[0, 0, 0], p1 * 1 + (1 - p1) * 2, rtol=1e-15)


def test_decode_lengths_and_empty_sequences():
    """Keys at or past a sequence's length are not part of it, whatever they hold (NaN here); length 0 is zeros."""
    gen = np.random.default_rng(3)
    q = gen.standard_normal((3, 4, 16))
    k = gen.standard_normal((3, 2, 10, 16))
    v = gen.standard_normal((3, 2, 10, 16))
    lengths = np.array([10, 4, 0])
    k[1, :, 4:] = np.nan
    v[1, :, 4:] = np.nan
    out, err = oracle.decode_attention(q, k, v, lengths, 0.25)
    assert np.all(np.isfinite(out))
    full, _ = oracle.attention(q[:1, :, None], k[:1], v[:1], 0.25, False)
    np.testing.assert_array_equal(out[0], full[0, :, 0])
    short, _ = oracle.attention(q[1:2, :, None], k[1:2, :, :4], v[1:2, :, :4], 0.25, False)
    np.testing.assert_array_equal(out[1], short[0, :, 0])
    assert np.all(out[2] == 0) and np.all(err[2] == 0)


def test_paged_gathers_the_block_table():
    """A shuffled pool gathered by hand equals the contiguous decode; table entries past the last block are unread."""
    gen = np.random.default_rng(4)
    batch, kv_heads, d, bs = 2, 2, 8, 4
    lengths = np.array([9, 3])
    contiguous_k = gen.standard_normal((batch, kv_heads, 12, d))
    contiguous_v = gen.standard_normal((batch, kv_heads, 12, d))
    table = np.array([[5, 0, 3], [2, -1, -1]])
    pool_k = np.full((6, bs, kv_heads, d), np.nan)
    pool_v = np.full((6, bs, kv_heads, d), np.nan)
    for b in range(batch):
        for t in range(lengths[b]):
            pool_k[table[b, t // bs], t % bs] = contiguous_k[b, :, t]
            pool_v[table[b, t // bs], t % bs] = contiguous_v[b, :, t]
    q = gen.standard_normal((batch, 4, d))
    got, got_err = oracle.paged_decode_attention(q, pool_k, pool_v, table, lengths, 0.5)
    want, want_err = oracle.decode_attention(q, contiguous_k, contiguous_v, lengths, 0.5)
    np.testing.assert_allclose(got, want, rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(got_err, want_err, rtol=1e-15, atol=1e-15)


def test_stacked_query_heads_agree_with_one_head_at_a_time(monkeypatch):
    """Decode-sized problems stack the query heads of a KV head into one product; the result is the per-head one."""
    gen = np.random.default_rng(5)
    q = gen.standard_normal((3, 8, 1, 16))
    k = gen.standard_normal((3, 2, 40, 16))
    v = gen.standard_normal((3, 2, 40, 16))
    lengths = np.array([40, 1, 17])
    stacked = oracle.attention(q, k, v, 0.25, False, kv_lengths=lengths)
    monkeypatch.setattr(oracle, "STACK_ELEMENTS", 0)
    per_head = oracle.attention(q, k, v, 0.25, False, kv_lengths=lengths)
    for a, b in zip(stacked, per_head, strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("q_len, kv_len", [(37, 37), (37, 50), (50, 37)])
def test_causal_row_blocks_agree_with_whole_heads(monkeypatch, q_len, kv_len):
    """A causal head is computed in blocks of query rows, each against the keys it can see; the result is the whole
    head's (rows that see no key stay zeros)."""
    gen = np.random.default_rng(6)
    q = gen.standard_normal((1, 2, q_len, 8))
    k = gen.standard_normal((1, 2, kv_len, 8))
    v = gen.standard_normal((1, 2, kv_len, 8))
    monkeypatch.setattr(oracle, "STACK_ELEMENTS", 0)
    monkeypatch.setattr(oracle, "CAUSAL_ROWS", 8)
    blocked = oracle.attention(q, k, v, 0.3, True)
    monkeypatch.setattr(oracle, "CAUSAL_ROWS", 1 << 30)
    whole = oracle.attention(q, k, v, 0.3, True)
    for a, b in zip(blocked, whole, strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
