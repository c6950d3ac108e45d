"""Quantized workloads -> launch keys: a model served from a GPTQ, AWQ or int8 checkpoint launches the dequantizing
products for its four decoder projections (dequant_gemv up to 4 tokens, dequant_matmul above), and keeps matmul for
the LM head; the `quantization` field is validated by name; AWQ's keys are GPTQ's (its weights are repacked once)."""

from __future__ import annotations

import pytest

from nbxcert.errors import WorkloadInvalid
from nbxcert.profiles import get_profile
from nbxcert.workload import launches, load_workload, parse_workload, workload_keys


@pytest.fixture(scope="module")
def hopper():
    return get_profile("nvidia/hopper")


def _texts(name, profile) -> list[str]:
    return [k.text() for k in workload_keys(load_workload(name), profile)]


def test_gptq_llama_launches_the_dequantizing_products_for_its_projections(hopper):
    keys = _texts("llama-3-8b-gptq-int4", hopper)
    dense = set(_texts("llama-3-8b", hopper))
    # decode (M <= 4): the SIMT gemv; above: the tensor-core product; every projection of a llama layer
    for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
        assert f"dequant_gemv[K={k},M=1,N={n},format=int4;float16]@v1" in keys
        assert f"dequant_gemv[K={k},M=4,N={n},format=int4;float16]@v1" in keys
        assert f"dequant_matmul[K={k},M=8,N={n},format=int4;float16]@v1" in keys
        assert f"dequant_matmul[K={k},M=4096,N={n},format=int4;float16]@v1" in keys
        assert not any(t.startswith(f"matmul[K={k},") and f",N={n}," in t for t in keys), (n, k)
    # the LM head stays a matmul in the activations' dtype, and everything but the projections is the dense model's
    assert "matmul[K=4096,M=1,N=128256,aligned=1,trans_a=0,trans_b=1;float16,float16]@v1" in keys
    rest = {t for t in keys if not t.startswith(("dequant_gemv[", "dequant_matmul["))}
    assert rest <= dense and len(keys) == len(set(keys))
    assert not any("bfloat16" in t for t in keys)  # the checkpoints' scales are float16


def test_awq_keys_are_gptqs_and_int8_keys_name_their_format(hopper):
    assert _texts("llama-3-8b-awq-int4", hopper) == _texts("llama-3-8b-gptq-int4", hopper)
    keys = _texts("llama-3-8b-w8a16", hopper)
    assert "dequant_gemv[K=4096,M=1,N=6144,format=int8;bfloat16]@v1" in keys
    assert "dequant_matmul[K=14336,M=512,N=4096,format=int8;float16]@v1" in keys
    assert not any("format=int4" in t for t in keys)


def test_the_layer_order_of_a_quantized_model(hopper):
    w = load_workload("llama-3-8b-gptq-int4")
    one = [
        x for x in launches(w, hopper) if x.problem.get("M", x.problem.get("n_tokens", x.problem.get("n_rows"))) == 1
    ]
    kernels = [x.kernel for x in one][:12]
    assert kernels[:4] == ["embedding", "rmsnorm", "dequant_gemv", "rope"]
    assert "(gptq-int4-g128)" in next(x.where for x in one if x.kernel == "dequant_gemv")


BASE = """schema_version: 1
name: t
source: test
model: {hidden: %d, intermediate: 256, heads: 2, kv_heads: 1, head_dim: 64, vocab: 256, layers: 1, norm: rmsnorm,
        activation: silu, rope: neox, qkv_bias: %s, quantization: %s%s}
dtypes: %s
phases: {prefill_tokens: [8], decode_batch: [2], kv_lens: [32]}
"""


def _doc(hidden=128, bias="false", quant="gptq-int4-g128", extra="", dtypes="[float16]") -> str:
    return BASE % (hidden, bias, quant, extra, dtypes)


@pytest.mark.parametrize(
    "doc, field, message",
    [
        (_doc(quant="gptq-int4-g64"), "model.quantization", "unknown format 'gptq-int4-g64'"),
        (_doc(quant="4"), "model.quantization", "must be a str, got 4"),
        (_doc(quant="awq"), "model.quantization", "unknown format 'awq'"),
        (_doc(bias="true"), "model.quantization", "add no bias"),
        (_doc(extra=", experts: 4, top_k: 1, moe_intermediate: 32"), "model.quantization", "fused_moe"),
        (_doc(dtypes="[float32]"), "dtypes", "float16 or bfloat16"),
        (_doc(hidden=136), "model.quantization", "K (hidden = 136) is not a multiple of 128"),
    ],
)
def test_the_quantization_field_is_validated_by_name(doc, field, message):
    with pytest.raises(WorkloadInvalid) as e:
        parse_workload(doc, "t.yml")
    assert f"field '{field}'" in e.value.message and message in e.value.message


def test_a_small_quantized_workload_lists_its_keys_on_the_interpreter():
    w = parse_workload(_doc(), "t.yml")
    got = {(x.kernel, x.problem["M"]) for x in launches(w, get_profile("cpu/interpreter")) if "format" in x.problem}
    assert got == {("dequant_matmul", 8), ("dequant_gemv", 2)}
