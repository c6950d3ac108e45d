"""Mixture-of-experts workloads -> launch keys: mixtral-8x7b and qwen3-30b-a3b list their MoE launches (router,
moe_align per block size, fused_moe gate/up and down, silu_and_mul per pair, moe_sum) beside the attention and norms of
a dense model; the optional model fields are validated by name; dense workloads' keys are unchanged byte for byte.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from nbxcert.errors import WorkloadInvalid
from nbxcert.profiles import get_profile
from nbxcert.workload import launches, load_workload, parse_workload, workload_keys


@pytest.fixture(scope="module")
def hopper():
    return get_profile("nvidia/hopper")


def _texts(name, profile):
    return [k.text() for k in workload_keys(load_workload(name), profile)]


def test_mixtral_keys_have_the_moe_launches(hopper):
    from nbxcert.kernels.moe import align_blocks

    keys = _texts("mixtral-8x7b", hopper)
    assert "fused_moe[K=4096,M=512,N=28672,experts=8,mul_weight=0,pair_rows=0,top_k=2;float16,float16]@v1" in keys
    assert "fused_moe[K=14336,M=512,N=4096,experts=8,mul_weight=1,pair_rows=1,top_k=2;bfloat16,bfloat16]@v1" in keys
    assert "moe_sum[M=512,N=4096,top_k=2;float16]@v1" in keys
    assert "silu_and_mul[d=14336,n_rows=1024;float16]@v1" in keys  # one row per (token, expert) pair
    assert "matmul[K=4096,M=512,N=8,aligned=1,trans_a=0,trans_b=1;float16,float16]@v1" in keys  # the router
    for block in align_blocks():
        assert f"moe_align[M=512,block={block},experts=8,top_k=2;int32]@v1" in keys
    # attention and norms as for a dense model; no dense MLP
    assert any(k.startswith("flash_attention[") for k in keys) and any(k.startswith("add_rmsnorm[") for k in keys)
    assert not any(k.startswith("matmul[K=4096,M=512,N=28672,") for k in keys)
    assert len(keys) == len(set(keys))


def test_qwen3_moe_keys(hopper):
    keys = _texts("qwen3-30b-a3b", hopper)
    assert "fused_moe[K=2048,M=1,N=1536,experts=128,mul_weight=0,pair_rows=0,top_k=8;float16,float16]@v1" in keys
    assert "fused_moe[K=768,M=1,N=2048,experts=128,mul_weight=1,pair_rows=1,top_k=8;float16,float16]@v1" in keys
    assert "moe_align[M=1,block=16,experts=128,top_k=8;int32]@v1" in keys
    # q_norm / k_norm: RMSNorm over head_dim, one row per token and head
    assert "rmsnorm[n_cols=128,n_rows=32;float16,float16]@v1" in keys  # 1 token x 32 query heads
    assert "rmsnorm[n_cols=128,n_rows=4;float16,float16]@v1" in keys  # 1 token x 4 KV heads
    # 32 heads x 128 = 4096 wide attention output in a 2048 hidden model
    assert "matmul[K=4096,M=1,N=2048,aligned=1,trans_a=0,trans_b=1;float16,float16]@v1" in keys


def test_moe_launch_order_in_a_layer(hopper):
    w = load_workload("mixtral-8x7b")
    # the prefill of 512 tokens: its pairs' SwiGLU has 1024 rows
    mine = {"softmax": 512, "topk": 512, "silu_and_mul": 1024}  # n_rows of the 512-token prefill's launches
    where = [
        x.where
        for x in launches(w, hopper)
        if x.problem.get("M") == 512 or x.problem.get("n_rows") == mine.get(x.kernel, -1)
    ]
    order = [
        "router logits",
        "router softmax",
        "router top-k",
        "expert alignment",
        "experts' gate/up projection",
        "experts' SwiGLU",
        "experts' down projection (router weights applied)",
        "sum of the top-k experts' outputs",
    ]
    positions = [where.index(name) for name in order]
    assert positions == sorted(positions)


# sha256 of the '\n'-joined key texts on hopper, taken before the MoE fields existed (the shipped certificates and
# other tests depend on these keys)
DENSE_PINS = {
    "llama-3-8b": (526, "31216557b1e3379681b074c03feb5c64f7d8110b7041169d5c7744e60d04edab"),
    "qwen2.5-7b": (526, "090c0ee9668720652c75912599737e806df1ab3559ec346f809cdd0e31daf611"),
    "demo": (23, "462245eeb7f7932aafea3090ccb66b7ee94844f2d5c2f3b2db0d0d741f9e5d7a"),
}


@pytest.mark.parametrize("name", list(DENSE_PINS))
def test_dense_workload_keys_unchanged(name, hopper):
    keys = _texts(name, hopper)
    assert (len(keys), hashlib.sha256("\n".join(keys).encode()).hexdigest()) == DENSE_PINS[name]


BASE = """schema_version: 1
name: t
source: test
model: {hidden: 64, intermediate: 128, heads: 1, kv_heads: 1, head_dim: 64, vocab: 256, layers: 1, norm: rmsnorm,
        activation: silu, rope: neox, qkv_bias: false%s}
dtypes: [float16]
phases: {prefill_tokens: [8], decode_batch: [2], kv_lens: [32]}
"""


@pytest.mark.parametrize(
    "extra, field, message",
    [
        (", experts: 8, top_k: 2", "model.moe_intermediate", "all of experts, top_k, moe_intermediate"),
        (", experts: 8, top_k: 9, moe_intermediate: 32", "model.top_k", "more than experts=8"),
        (", experts: 0, top_k: 1, moe_intermediate: 32", "model.experts", "positive integer"),
        (", experts: 8, top_k: 2, moe_intermediate: x", "model.moe_intermediate", "positive integer"),
        (", qk_norm: 1", "model.qk_norm", "must be a bool"),
        (", expert: 8", "model.expert", "unknown field"),
    ],
)
def test_moe_fields_are_validated_by_name(extra, field, message):
    with pytest.raises(WorkloadInvalid) as e:
        parse_workload(BASE % extra, "t.yml")
    assert f"field '{field}'" in e.value.message and message in e.value.message


def test_a_small_moe_workload_parses_and_lists_keys():
    w = parse_workload(BASE % ", experts: 4, top_k: 1, moe_intermediate: 32, qk_norm: true", "t.yml")
    kernels = {x.kernel for x in launches(w, get_profile("cpu/interpreter"))}
    assert {"moe_align", "fused_moe", "moe_sum", "silu_and_mul", "rmsnorm"} <= kernels
    down = [x for x in launches(w, get_profile("cpu/interpreter")) if x.kernel == "fused_moe" and x.problem["K"] == 32]
    assert down and all(x.problem["pair_rows"] == 0 for x in down)  # top_k 1: one row per token is one per pair


def test_keys_command_lists_mixtral():
    env = dict(os.environ, NBXCERT_BACKEND="interpreter", COLUMNS="250")
    r = subprocess.run(
        [sys.executable, "-m", "nbxcert", "keys", "--profile", "hopper", "--workload", "mixtral-8x7b"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    text = r.stdout + r.stderr
    assert r.returncode == 0, text
    assert "Traceback" not in text
    for line in (
        "moe_align[M=1,block=16,experts=8,top_k=2;int32]@v1",
        "moe_sum[M=1,N=4096,top_k=2;float16]@v1",
        "flash_attention",
    ):
        assert line in text, f"missing {line!r}"
