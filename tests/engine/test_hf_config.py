"""Hugging Face configs as published -> workloads (`nbxcert.hf_config`): the same launches as the shipped workload
files of the same models, every field the mapping cannot state refused in one line naming the file and the field.

The configs under tests/fixtures/hf_configs/ hold the published fields of each model (their README says where they
were read). No GPU, no kernel run: keys are formed on the hopper profile's ladders.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nbxcert.errors import HfConfigInvalid, NbxcertError
from nbxcert.hf_config import load_hf_config, workload_of
from nbxcert.profiles import get_profile
from nbxcert.workload import launches, load_workload, workload_keys

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"
SHIPPED = {  # the published config -> the shipped workload file written from it
    "Meta-Llama-3-8B": "llama-3-8b",
    "Mistral-7B-v0.1": "mistral-7b",
    "Qwen2.5-7B": "qwen2.5-7b",
    "Mixtral-8x7B-v0.1": "mixtral-8x7b",
    "Qwen3-30B-A3B": "qwen3-30b-a3b",
}


@pytest.fixture(scope="module")
def hopper():
    return get_profile("hopper")


def published(name: str) -> dict:
    return json.loads((CONFIGS / name / "config.json").read_text())


def written(tmp_path: Path, config: dict, name: str = "model") -> Path:
    path = tmp_path / name / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    return path


def refusal(path: Path) -> str:
    with pytest.raises(HfConfigInvalid) as e:
        load_hf_config(path)
    line = str(e.value)
    assert "\n" not in line and str(path) in line, line
    return line


# --- the shipped workloads' keys, from their models' published configs -----------------------------------------------
@pytest.mark.parametrize("config, shipped", sorted(SHIPPED.items()))
def test_a_published_config_forms_the_shipped_workloads_keys(config, shipped, hopper):
    hf, yml = load_hf_config(CONFIGS / config / "config.json"), load_workload(shipped)
    assert hf.model == yml.model and hf.phases == yml.phases
    # the config says bfloat16 (torch_dtype); the shipped files list float16 too: at the same dtypes the key sets are
    # the same, and the config's keys are exactly the shipped file's keys at bfloat16
    assert hf.dtypes == ("bfloat16",) and yml.dtypes == ("float16", "bfloat16")
    same_dtypes = dataclasses.replace(hf, dtypes=yml.dtypes)
    assert set(workload_keys(same_dtypes, hopper)) == set(workload_keys(yml, hopper))
    at_bf16 = dataclasses.replace(yml, dtypes=("bfloat16",))
    assert workload_keys(hf, hopper) == workload_keys(at_bf16, hopper)
    assert hf.name == config  # no _name_or_path in these files: the directory's name


def test_llama_3_8b_key_set_is_the_shipped_one(hopper):
    # the issue's own check, stated without the helpers above: every key of llama-3-8b.yml at bfloat16, and no other
    keys = {k.text() for k in workload_keys(load_hf_config(CONFIGS / "Meta-Llama-3-8B"), hopper)}
    shipped = {k.text() for k in workload_keys(load_workload("llama-3-8b"), hopper) if "bfloat16" in k.dtypes}
    assert keys == shipped and len(keys) > 200


def test_positions_between_two_rungs_keep_the_rung_they_bucket_to(tmp_path, hopper):
    """A model of 3000 positions makes 2500-token prefills and 2500-long KV caches, which bucket to the 3072-token
    and 4096-long keys: those rungs are the workload's, though above its positions (they were left out)."""
    w = load_hf_config(written(tmp_path, {**published("Meta-Llama-3-8B"), "max_position_embeddings": 3000}))
    from nbxcert.workload import sizes

    tokens, kv = sizes(w, "prefill_tokens", hopper), sizes(w, "kv_lens", hopper)
    assert max(tokens) == 3072 and 2048 in tokens and 4096 not in tokens
    assert max(kv) == 4096 and 2048 in kv and 8192 not in kv
    keys = {k.text() for k in workload_keys(w, hopper)}
    assert any("M=3072" in k for k in keys) and any("kv_len=4096" in k for k in keys)


def test_qwen3_dense_has_q_and_k_norms_and_no_bias(hopper):
    w = load_hf_config(CONFIGS / "Qwen3-8B" / "config.json")
    assert w.model["qk_norm"] is True and w.model["qkv_bias"] is False
    assert (w.model["heads"], w.model["kv_heads"], w.model["head_dim"]) == (32, 8, 128)
    assert (w.model["hidden"], w.model["intermediate"], w.model["layers"]) == (4096, 12288, 36)
    where = {launch.where for launch in launches(w, hopper)}
    assert {"q norm (per head)", "k norm (per head)"} <= where
    assert not any(launch.kernel == "addmm" for launch in launches(w, hopper))


def test_qwen2_projects_q_k_v_with_a_bias(hopper):
    w = load_hf_config(CONFIGS / "Qwen2.5-7B")
    qkv = [launch for launch in launches(w, hopper) if launch.where == "qkv projection"]
    assert qkv and all(launch.kernel == "addmm" for launch in qkv)
    assert all(launch.problem["N"] == (28 + 2 * 4) * 128 for launch in qkv)


def test_phi3_fused_projections_are_the_workloads_own(hopper):
    # Phi-3's qkv_proj [(32 + 2*32) * 96, 3072] and gate_up_proj [2 * 8192, 3072] are the fused matmuls every workload
    # launches; its 4096 positions cap the phases
    w = load_hf_config(CONFIGS / "Phi-3-mini-4k-instruct")
    assert w.name == "Phi-3-mini-4k-instruct"  # its _name_or_path
    assert w.model["head_dim"] == 3072 // 32 and w.model["kv_heads"] == 32
    assert w.phases["kv_lens"]["max"] == 4096 and w.phases["prefill_tokens"]["max"] == 4096
    made = {(launch.where, launch.problem.get("N")) for launch in launches(w, hopper)}
    assert ("qkv projection", 96 * 96) in made and ("gate/up projection", 2 * 8192) in made
    kv = {launch.problem["kv_len"] for launch in launches(w, hopper) if launch.kernel == "decode_attention"}
    assert max(kv) == 4096


def test_mixtral_experts_are_intermediate_size_wide():
    w = load_hf_config(CONFIGS / "Mixtral-8x7B-v0.1")
    assert (w.model["experts"], w.model["top_k"], w.model["moe_intermediate"]) == (8, 2, 14336)


# --- refused, by name ------------------------------------------------------------------------------------------------
def test_gemma_is_geglu_in_gelus_tanh_form_whatever_hidden_act_says(tmp_path):
    """transformers' GemmaMLP: hidden_activation when given, else the tanh gelu (gemma-2b publishes hidden_act
    "gelu" and no hidden_activation); its keys carry gelu_and_mul in that form and attention at head_dim 256."""
    w = load_hf_config(CONFIGS / "gemma-2b")
    assert (w.model["activation"], w.model["head_dim"], w.model["kv_heads"]) == ("gelu_tanh", 256, 1)
    keys = [str(k) for k in workload_keys(w, get_profile("hopper"))]
    assert any(k.startswith("gelu_and_mul[approximate=tanh,d=16384,") for k in keys)
    assert not any(k.startswith("silu_and_mul") for k in keys)
    erf = load_hf_config(written(tmp_path, {**published("gemma-2b"), "hidden_activation": "gelu"}))
    assert erf.model["activation"] == "gelu"
    line = refusal(written(tmp_path, {**published("gemma-2b"), "hidden_activation": "relu"}, "relu"))
    assert "field 'hidden_activation'" in line and "'relu'" in line


@pytest.mark.parametrize("model_type", ["gemma2", "gpt2", "deepseek_v3"])
def test_an_unmapped_model_type_is_refused_naming_it(tmp_path, model_type):
    line = refusal(written(tmp_path, {**published("Meta-Llama-3-8B"), "model_type": model_type}))
    assert "field 'model_type'" in line and f"'{model_type}'" in line


@pytest.mark.parametrize(
    "field", ["hidden_size", "num_attention_heads", "vocab_size", "max_position_embeddings", "model_type"]
)
def test_a_missing_field_is_refused_naming_it(tmp_path, field):
    config = published("Meta-Llama-3-8B")
    del config[field]
    assert f"field '{field}': missing" in refusal(written(tmp_path, config))


def test_a_missing_dtype_is_refused_naming_it(tmp_path):
    config = published("Qwen3-8B")
    del config["torch_dtype"]
    assert "field 'torch_dtype': missing" in refusal(written(tmp_path, config))


@pytest.mark.parametrize(
    "config_name, field, value, says",
    [
        ("Meta-Llama-3-8B", "hidden_act", "gelu_new", "'gelu_new'"),
        ("Meta-Llama-3-8B", "attention_bias", True, "output projection"),
        ("Meta-Llama-3-8B", "mlp_bias", True, "output projection or the MLP"),
        ("Meta-Llama-3-8B", "torch_dtype", "float8_e4m3fn", "float8_e4m3fn"),
        ("Meta-Llama-3-8B", "num_key_value_heads", 5, "does not divide"),
        ("Meta-Llama-3-8B", "hidden_size", 4096.0, "positive integer"),
        ("Meta-Llama-3-8B", "pretraining_tp", 2, "slices"),
        ("Meta-Llama-3-8B", "pretraining_tp", True, "positive integer, got True"),  # True == 1 in Python
        ("Meta-Llama-3-8B", "pretraining_tp", 1.0, "positive integer, got 1.0"),
        ("Meta-Llama-3-8B", "partial_rotary_factor", True, "whole head"),
        ("Qwen3-8B", "layer_types", ["linear_attention"] * 36, "'linear_attention': no launch"),
        ("Qwen3-8B", "layer_types", ["full_attention"] * 35, "35 kinds for num_hidden_layers=36"),
        ("Qwen3-8B", "layer_types", "full_attention", "must be a list"),
        ("Meta-Llama-3-8B", "quantization_config", ["gptq"], "must be an object"),
        ("Meta-Llama-3-8B", "num_experts", 8, "not a field nbxcert maps for model_type llama"),
        ("Meta-Llama-3-8B", "max_position_embeddings", 64, "below the shortest KV length"),
        ("Phi-3-mini-4k-instruct", "partial_rotary_factor", 0.75, "whole head"),
        ("Qwen3-30B-A3B", "decoder_sparse_step", 2, "dense and sparse layers mixed"),
        ("Qwen3-30B-A3B", "mlp_only_layers", [0], "dense and sparse layers mixed"),
        ("Mixtral-8x7B-v0.1", "some_new_field", 1, "not a field nbxcert maps for model_type mixtral"),
    ],
)
def test_a_field_it_cannot_map_is_refused_naming_it(tmp_path, config_name, field, value, says):
    line = refusal(written(tmp_path, {**published(config_name), field: value}))
    assert f"field '{field}'" in line and says in line, line


def test_a_missing_moe_field_is_refused_naming_it(tmp_path):
    config = published("Qwen3-30B-A3B")
    del config["moe_intermediate_size"]
    assert "field 'moe_intermediate_size': missing" in refusal(written(tmp_path, config))


def test_absent_kv_heads_and_head_dim_follow_the_config_classes_rule(tmp_path):
    config = published("Meta-Llama-3-8B")
    del config["num_key_value_heads"]
    w = load_hf_config(written(tmp_path, {**config, "head_dim": None}))
    assert (w.model["kv_heads"], w.model["head_dim"]) == (32, 128)
    config["num_attention_heads"] = 48  # 4096 / 48 is not whole: nothing to derive head_dim from
    assert "field 'head_dim': missing" in refusal(written(tmp_path, config, "other"))


@pytest.mark.parametrize(
    "text, says",
    [("[1, 2]", "a model config is a JSON object"), ("{", "not valid JSON"), ("[" * 100_000, "not valid JSON")],
)
def test_a_file_that_is_not_a_config_is_refused(tmp_path, text, says):
    path = tmp_path / "config.json"
    path.write_text(text)
    assert says in refusal(path)


@pytest.mark.parametrize("text, says", [("[1, 2]", "got an array"), ("null", "got null"), ("{", "not valid JSON")])
def test_a_file_that_is_not_a_config_says_to_give_the_config(tmp_path, text, says):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(HfConfigInvalid) as e:
        load_hf_config(path)
    assert says in str(e.value) and "config.json as published" in e.value.hint, (str(e.value), e.value.hint)


def test_a_multimodal_wrapper_is_refused_naming_text_config_whatever_its_type(tmp_path):
    config = {"model_type": "llava", "torch_dtype": "float16", "text_config": published("Meta-Llama-3-8B")}
    with pytest.raises(HfConfigInvalid) as e:
        load_hf_config(written(tmp_path, config))
    assert "field 'text_config'" in str(e.value) and "text_config object" in e.value.hint, str(e.value)


@pytest.mark.parametrize("kinds", [["full_attention"] * 36, ["full_attention"] * 18 + ["sliding_attention"] * 18])
def test_layer_types_of_full_and_sliding_attention_are_the_same_launches(tmp_path, hopper, kinds):
    # transformers >= 4.53 writes layer_types into every qwen2/qwen3 config it saves
    w = load_hf_config(written(tmp_path, {**published("Qwen3-8B"), "layer_types": kinds}))
    plain = load_hf_config(CONFIGS / "Qwen3-8B" / "config.json")
    assert [k.text() for k in workload_keys(w, hopper)] == [k.text() for k in workload_keys(plain, hopper)]


@pytest.mark.parametrize(
    "config_name, edits, field, says",
    [  # refused by the workload the config forms: named by the config's field, not the workload's
        ("Qwen2.5-7B", {"quantization_config": "GPTQ"}, "quantization_config", "add no bias, and qkv_bias is true"),
        ("Meta-Llama-3-8B", {"quantization_config": "GPTQ", "torch_dtype": "float32"}, "torch_dtype", "float32"),
        (
            "Meta-Llama-3-8B",
            {"quantization_config": "GPTQ", "torch_dtype": None, "dtype": "float32"},
            "dtype",
            "float32",
        ),
        (
            "Meta-Llama-3-8B",
            {"quantization_config": "GPTQ", "intermediate_size": 14000},
            "quantization_config",
            "14000",
        ),
        ("Mixtral-8x7B-v0.1", {"num_experts_per_tok": 9}, "num_experts_per_tok", "9 is more than experts=8"),
    ],
)
def test_a_refusal_of_the_workload_formed_names_the_configs_field(tmp_path, config_name, edits, field, says):
    config = {**published(config_name), **edits}
    if config.get("quantization_config") == "GPTQ":
        config["quantization_config"] = GPTQ
    config = {k: v for k, v in config.items() if v is not None}
    with pytest.raises(HfConfigInvalid) as e:
        load_hf_config(written(tmp_path, config))
    line = str(e.value)
    assert f"field '{field}': " in line and says in line and "model." not in line, line
    assert "workload file" not in e.value.hint, e.value.hint  # a workload file of the model is refused the same way


def test_a_path_with_no_config_is_refused(tmp_path):
    with pytest.raises(HfConfigInvalid, match="does not exist"):
        load_hf_config(tmp_path)  # a directory with no config.json
    with pytest.raises(NbxcertError, match="does not exist"):
        load_hf_config(tmp_path / "nothing.json")


# --- any edit of a published config: a workload or one refusal, never another exception -------------------------------
_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.sampled_from(sorted(p.name for p in CONFIGS.iterdir() if p.is_dir())),
    edits=st.dictionaries(
        st.one_of(
            st.sampled_from(sorted({f for p in CONFIGS.glob("*/config.json") for f in published(p.parent.name)})),
            st.text(max_size=8),
        ),
        _values,
        max_size=3,
    ),
    dropped=st.integers(min_value=0, max_value=40),
)
def test_any_edit_of_a_config_is_a_workload_or_one_refusal(tmp_path, name, edits, dropped):
    config = {**published(name), **edits}
    config.pop(sorted(config)[dropped % len(config)], None)
    try:
        w = workload_of(config, str(tmp_path / name / "config.json"))
    except HfConfigInvalid as e:
        assert "\n" not in str(e) and "field '" in str(e), str(e)
        return
    assert w.dtypes and w.model["heads"] % w.model["kv_heads"] == 0


# --- quantized checkpoints: quantization_config as transformers writes it --------------------------------------------
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True, "damp_percent": 0.01}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}


@pytest.mark.parametrize("q, shipped", [(GPTQ, "llama-3-8b-gptq-int4"), (AWQ, "llama-3-8b-awq-int4")])
def test_a_quantized_checkpoints_config_gives_the_shipped_quantized_workloads_keys(tmp_path, hopper, q, shipped):
    config = {**published("Meta-Llama-3-8B"), "quantization_config": q, "torch_dtype": "float16"}
    got = workload_keys(load_hf_config(written(tmp_path, config)), hopper)
    assert [k.text() for k in got] == [k.text() for k in workload_keys(load_workload(shipped), hopper)]


@pytest.mark.parametrize(
    "q, field, says",
    [
        ({**GPTQ, "quant_method": "bitsandbytes"}, "quantization_config.quant_method", "serve gptq and awq"),
        ({**GPTQ, "bits": 8}, "quantization_config.bits", "8: gptq checkpoints are served at 4 bits"),
        ({**AWQ, "group_size": 64}, "quantization_config.group_size", "group size is 128"),
        ({**GPTQ, "group_size": -1}, "quantization_config.group_size", "-1"),
        ({**GPTQ, "desc_act": True}, "quantization_config.desc_act", "act-order"),
        ({**AWQ, "zero_point": False}, "quantization_config.zero_point", "zero point"),
        ({**AWQ, "version": "gemv"}, "quantization_config.version", "GEMM packing"),
        ({**GPTQ, "bits": 4.0}, "quantization_config.bits", "4.0"),
        ({**GPTQ, "checkpoint_format": "gptq_v2"}, "quantization_config.checkpoint_format", "'gptq_v2'"),
        ({**GPTQ, "lm_head": True}, "quantization_config.lm_head", "a quantized LM head"),
        (
            {**GPTQ, "modules_in_block_to_quantize": [["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]]},
            "quantization_config.modules_in_block_to_quantize",
            "every projection of a layer",
        ),
        ({**GPTQ, "modules_in_block_to_quantize": "all"}, "quantization_config.modules_in_block_to_quantize", "'all'"),
        ({**AWQ, "modules_to_not_convert": ["mlp"]}, "quantization_config.modules_to_not_convert", "left unquantized"),
        ({**AWQ, "modules_to_not_convert": [["mlp"]]}, "quantization_config.modules_to_not_convert", "[['mlp']]"),
    ],
)
def test_a_quantization_it_cannot_serve_is_refused_naming_the_field(tmp_path, q, field, says):
    line = refusal(written(tmp_path, {**published("Meta-Llama-3-8B"), "quantization_config": q}))
    assert f"field '{field}'" in line and says in line, line


EVERY_PROJECTION = [
    ["self_attn.k_proj", "self_attn.v_proj", "self_attn.q_proj"],
    ["self_attn.o_proj"],
    ["mlp.up_proj", "mlp.gate_proj"],
    ["mlp.down_proj"],
]


@pytest.mark.parametrize(
    "q, shipped",
    [
        ({**GPTQ, "modules_in_block_to_quantize": EVERY_PROJECTION, "lm_head": False}, "llama-3-8b-gptq-int4"),
        ({**GPTQ, "modules_in_block_to_quantize": None, "checkpoint_format": "gptq"}, "llama-3-8b-gptq-int4"),
        ({**AWQ, "modules_to_not_convert": ["lm_head"]}, "llama-3-8b-awq-int4"),
        ({**AWQ, "modules_to_not_convert": None}, "llama-3-8b-awq-int4"),
    ],
)
def test_a_checkpoint_quantizing_every_projection_by_name_is_the_shipped_quantized_workload(
    tmp_path, hopper, q, shipped
):
    config = {**published("Meta-Llama-3-8B"), "quantization_config": q, "torch_dtype": "float16"}
    got = workload_keys(load_hf_config(written(tmp_path, config)), hopper)
    assert [k.text() for k in got] == [k.text() for k in workload_keys(load_workload(shipped), hopper)]
