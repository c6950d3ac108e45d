"""Hugging Face model configs: a `config.json` as published -> the workload a workload file would state.

`load_hf_config(path)` reads the config of a decoder-only model (`model_type` llama, mistral, qwen2, qwen3, mixtral,
qwen3_moe, phi3), forms the document a workload file holds (`nbxcert/workloads/llama-3-8b.yml`) and hands it to
`workload.workload_from_doc`, the path every workload file takes: the launches and keys are then exactly those of a
workload file with the same dimensions. Correct or refuse: every field of the config is either read (below), known
to leave the launches unchanged (`_NO_LAUNCH`, each with the reason), or refused by name (`HfConfigInvalid`: the file,
the field, what to do). A value that is neither in the config nor derived by one of the rules below is an error,
never a guess.

Fields read (transformers' configuration classes name them; the defaults are theirs, cited where one applies):

    hidden_size, intermediate_size, vocab_size,
    num_hidden_layers, num_attention_heads     -> hidden, intermediate, vocab, layers, heads
    num_key_value_heads                        -> kv_heads; absent or null: num_attention_heads (every one of these
                                                  config classes: "If it is not specified, will default to
                                                  num_attention_heads")
    head_dim                                   -> head_dim; absent or null: hidden_size / num_attention_heads,
                                                  refused when that does not divide (the classes' `hidden_size //
                                                  num_attention_heads`)
    hidden_act                                 -> activation: `silu` (SwiGLU) is the only gated MLP nbxcert has a
                                                  kernel for (silu_and_mul); any other value is refused naming it
    attention_bias, mlp_bias                   -> must be false where given: in llama, qwen3 and qwen3_moe they add a
                                                  bias to the output projection (and the MLP), which no workload
                                                  launch has
    torch_dtype (transformers >= 4.56: dtype)  -> dtypes: [that dtype] (float16, bfloat16 or float32)
    max_position_embeddings                    -> caps the phases' sizes (below)
    num_local_experts (mixtral), num_experts (qwen3_moe), num_experts_per_tok, moe_intermediate_size (qwen3_moe;
    mixtral's experts are `intermediate_size` wide: MixtralBlockSparseTop2MLP) -> experts, top_k, moe_intermediate
    quantization_config                        -> quantization: quant_method gptq with bits 4, group_size 128 and
                                                  desc_act false (absent: false) is `gptq-int4-g128`; awq with bits
                                                  4, group_size 128, zero_point true and version gemm (absent: true,
                                                  gemm) is `awq-int4-g128`; any other method or value is refused
                                                  naming its field (`quantization_config.bits`, ...), and so is a
                                                  checkpoint quantizing only some projections or the LM head too
                                                  (`modules_in_block_to_quantize` naming fewer than all of a layer's
                                                  projections, `modules_to_not_convert` naming one but `lm_head`,
                                                  `lm_head` true) or packed otherwise (`checkpoint_format` not gptq):
                                                  a workload's `quantization` is every projection, in GPTQ's layout
    layer_types                                -> each `full_attention` or `sliding_attention` (transformers >= 4.53
                                                  writes it for qwen2 and qwen3: which layers mask with the window, as
                                                  `max_window_layers` says; not a shape); any other kind is refused

Rules of the model type (what transformers' modeling code does with no field to say so):

    norm: rmsnorm, rope: neox for all of them (their RMSNorm and their `rotate_half` rotary embedding);
    qwen2: qkv_bias true (Qwen2Attention: q/k/v projections with bias, the output projection without);
    qwen3, qwen3_moe: qk_norm true (their attention's q_norm and k_norm);
    qwen3_moe: every layer sparse only when decoder_sparse_step is 1 and mlp_only_layers is empty, else refused (a
    workload's MoE fields make every layer sparse);
    phi3: qkv_proj and gate_up_proj are single fused weights, and nbxcert's workload launches those two projections
    fused already (one matmul of N = (heads + 2 kv_heads) head_dim, one of N = 2 intermediate): the same launches.

Phases: those of every shipped decoder workload but `demo` (nbxcert/workloads/{tinyllama-1.1b, llama-3-8b,
mistral-7b, qwen2.5-7b, mixtral-8x7b, qwen3-30b-a3b}.yml): prefill tokens on the `tokens` ladder up to 4096, decode
batches on the `batch` ladder up to 64, KV lengths on the `kv_len` ladder from 128 to 8192; a model whose
max_position_embeddings is smaller has its prefill and KV maxima capped to it (no launch past the positions it has).

Not modelled, as the shipped workloads do not model them: `sliding_window` (a mask over KV positions, not a shape:
the attention keys have no window field, and the shipped mistral-7b workload of Mistral-7B-v0.1, whose window is
4096, launches full attention at every KV length up to 8192; a windowed model's keys above its window are those of
full attention at that length).

gemma: the MLP is GeGLU (`gelu_and_mul`): `hidden_activation` when given (`gelu_pytorch_tanh`: the tanh form;
`gelu`: the erf form), else the tanh form whatever `hidden_act` says (transformers' GemmaMLP). Its embedding scaled by
sqrt(hidden_size) and its RMSNorm weight offset by one are the same launches as llama's with the factor and the offset
folded into the weights once at load (the scaled gather is the gather of the scaled table, element for element), so
the workload states the llama family's launches; the LM head shares the embedding's shape. gemma2, gemma3 and
gemma3_text
(soft-capped attention logits, alternating sliding and global layers, norms after attention and MLP) have launches
the workload format cannot state: refused naming `model_type`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nbxcert.errors import HfConfigInvalid, WorkloadInvalid
from nbxcert.workload import SCHEMA_VERSION, Workload, workload_from_doc

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe", "gemma", "phi3")
MOE_TYPES = ("mixtral", "qwen3_moe")
REFUSED_TYPES = {
    t: "soft-capped attention logits, alternating sliding-window and global layers and norms after attention and MLP "
    "have no launch in the workload format"
    for t in ("gemma2", "gemma3", "gemma3_text")
}
DTYPES = ("float16", "bfloat16", "float32")
# a published hidden_act / hidden_activation -> the workload's activation (nbxcert.workload.ACTIVATIONS)
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}

# The shipped decoder workloads' phases (module doc), before the max_position_embeddings cap.
PREFILL_MAX = 4096
DECODE_MAX = 64
KV_MIN, KV_MAX = 128, 8192

# Fields that leave every launch unchanged, each with the reason (a field in neither this table nor those read is
# refused by name).
_NO_LAUNCH = {
    "_name_or_path": "names the workload",
    "architectures": "the class name; model_type says which mapping applies",
    "auto_map": "remote-code class names",
    "transformers_version": "the version that wrote the file",
    "bos_token_id": "a token id",
    "eos_token_id": "a token id",
    "pad_token_id": "a token id",
    "use_cache": "whether a KV cache is kept: the decode phases assume one",
    "initializer_range": "training initialisation",
    "attention_dropout": "training only",
    "embd_pdrop": "training only",
    "resid_pdrop": "training only",
    "router_aux_loss_coef": "training loss",
    "output_router_logits": "training loss",
    "router_jitter_noise": "training only",
    "rms_norm_eps": "a value of the norm, not a shape (no key field)",
    "rope_theta": "the rotary tables' values, not a shape",
    "rope_scaling": "the rotary tables' values, not a shape",
    "rope_parameters": "the rotary tables' values, not a shape",
    "original_max_position_embeddings": "the rotary scaling's reference length",
    "tie_word_embeddings": "the LM head reads the embedding's [vocab, hidden] matrix: the same matmul launch",
    "sliding_window": "a mask over KV positions, not a shape (module doc)",
    "use_sliding_window": "a mask over KV positions, not a shape (module doc)",
    "max_window_layers": "which layers mask with the window: not a shape",
    "norm_topk_prob": "the renormalisation of the top-k weights, not listed (nbxcert.workload)",
    "decoder_sparse_step": "read: 1 is every layer sparse",
    "mlp_only_layers": "read: empty is every layer sparse",
}
_READ = (
    "model_type",
    "hidden_size",
    "intermediate_size",
    "vocab_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "attention_bias",
    "mlp_bias",
    "torch_dtype",
    "dtype",
    "max_position_embeddings",
    "pretraining_tp",
    "partial_rotary_factor",
    "use_mrope",
    "quantization_config",
    "layer_types",
)
_MOE_FIELDS = {
    "mixtral": ("num_local_experts", "num_experts_per_tok"),
    "qwen3_moe": (
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "decoder_sparse_step",
        "mlp_only_layers",
    ),
}
_GEMMA_FIELDS = ("hidden_activation",)
_REFUSED_FIELDS = {
    "text_config": (
        "a multimodal model's wrapper: give the text model's own config",
        "write the text_config object to a config.json of its own (with the wrapper's torch_dtype) and give that; "
        "the vision tower's launches are not in a workload",
    ),
}
# attention kinds of `layer_types` that are the same launches (the window is a mask: module doc)
LAYER_TYPES = ("full_attention", "sliding_attention")
# a decoder layer's projections as a quantized checkpoint names them (`modules_in_block_to_quantize`)
_PROJECTIONS = {
    "phi3": ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"),
    None: (
        *(f"self_attn.{x}_proj" for x in "qkvo"),
        *(f"mlp.{x}_proj" for x in ("gate", "up", "down")),
    ),
}
# a workload field a refusal of `workload_from_doc` names -> the config field it was formed from
_FORMED_FROM = {
    "model.top_k": "num_experts_per_tok",
    "model.quantization": "quantization_config",
    "model.kv_heads": "num_key_value_heads",
}
_NOT_A_CONFIG = "give the model's config.json as published (a JSON object of its fields), or the directory holding it"
_NOT_QUANTIZED = (
    "a quantized checkpoint of this model cannot be certified yet: give its unquantized checkpoint's config (no "
    "quantization_config)"
)


def load_hf_config(path: str | Path) -> Workload:
    """The workload of a Hugging Face `config.json` (or of the directory holding one), or `HfConfigInvalid` naming
    the file and the field (module doc)."""
    from nbxcert.options import reachable

    p = reachable(Path(path), "Hugging Face config")
    if p.is_dir():
        p = reachable(p / "config.json", "Hugging Face config")
    if not p.is_file():
        what = "is not a regular file" if p.exists() else "does not exist"
        raise HfConfigInvalid(f"{p} {what}", hint="give a model's config.json, or the directory holding it")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise HfConfigInvalid(f"{p}: not UTF-8 text (byte {e.start})", hint=_NOT_A_CONFIG) from None
    except OSError as e:
        raise HfConfigInvalid(f"{p}: cannot be read: {e.strerror}", hint="give a config you can read") from None
    try:
        config = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise HfConfigInvalid(f"{p}: not valid JSON: {str(e).splitlines()[0][:200]}", hint=_NOT_A_CONFIG) from None
    return workload_of(config, str(p))


def workload_of(config: Any, path: str) -> Workload:
    """The workload of a parsed config (`path` names it in messages and gives the name when `_name_or_path` is not
    there: the directory holding the file, as a model's files are kept)."""
    if not isinstance(config, dict):
        raise HfConfigInvalid(f"{path}: a model config is a JSON object, got {_json_kind(config)}", hint=_NOT_A_CONFIG)
    get = _Fields(config, path)
    for field, (reason, hint) in _REFUSED_FIELDS.items():  # before model_type: a wrapper's own (llava, ...) is not
        if field in config:  # what to fix
            raise get.fail(field, reason, hint)
    model_type = get.text("model_type")
    if model_type in REFUSED_TYPES:
        raise get.fail("model_type", f"'{model_type}' is not mapped: {REFUSED_TYPES[model_type]}")
    if model_type not in MODEL_TYPES:
        raise get.fail("model_type", f"'{model_type}' is not mapped (mapped: {', '.join(MODEL_TYPES)})")
    known = {*_READ, *_NO_LAUNCH, *_MOE_FIELDS.get(model_type, ()), *(_GEMMA_FIELDS if model_type == "gemma" else ())}
    for field in config:
        if field not in known:
            raise get.fail(field, f"not a field nbxcert maps for model_type {model_type}")

    hidden, heads = get.size("hidden_size"), get.size("num_attention_heads")
    # absent or null: the config classes' rule (module doc)
    kv_heads = heads if config.get("num_key_value_heads") is None else get.size("num_key_value_heads")
    if heads % kv_heads:
        raise get.fail("num_key_value_heads", f"{kv_heads} does not divide num_attention_heads={heads}")
    if config.get("head_dim") is not None:
        head_dim = get.size("head_dim")
    elif hidden % heads:
        raise get.fail(
            "head_dim", f"missing, and hidden_size={hidden} is not a multiple of num_attention_heads={heads}"
        )
    else:
        head_dim = hidden // heads
    model: dict[str, Any] = {
        "hidden": hidden,
        "intermediate": get.size("intermediate_size"),
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "vocab": get.size("vocab_size"),
        "layers": get.size("num_hidden_layers"),
        "norm": "rmsnorm",
        "activation": _activation(get, model_type),
        "rope": "neox",
        "qkv_bias": model_type == "qwen2",
    }
    for field in ("attention_bias", "mlp_bias"):
        if field in config and get.flag(field):
            raise get.fail(field, "true: a bias on the output projection or the MLP has no launch in a workload")
    # (true and 1.0 equal 1 in Python: the kinds are checked first)
    if "pretraining_tp" in config and get.size("pretraining_tp") != 1:
        raise get.fail(
            "pretraining_tp", f"{config['pretraining_tp']!r}: slices every projection into that many launches"
        )
    rotary = config.get("partial_rotary_factor", 1.0)
    if isinstance(rotary, bool) or not isinstance(rotary, int | float) or rotary != 1.0:
        raise get.fail("partial_rotary_factor", f"{rotary!r}: the rotary launch rotates the whole head")
    _check_layer_types(get, config)
    if config.get("use_mrope", False) is not False:
        raise get.fail("use_mrope", f"{config['use_mrope']!r}: multimodal rotary sections have no launch in a workload")
    if model_type in ("qwen3", "qwen3_moe"):
        model["qk_norm"] = True
    if model_type in MOE_TYPES:
        model.update(_experts(get, model_type, config))
    if "quantization_config" in config:
        model["quantization"] = _quantization(get, config["quantization_config"], model_type)
    positions = get.size("max_position_embeddings")
    if positions < KV_MIN:
        raise get.fail("max_position_embeddings", f"{positions} is below the shortest KV length covered ({KV_MIN})")
    phases = {
        "prefill_tokens": {"ladder": "tokens", "max": min(PREFILL_MAX, positions)},
        "decode_batch": {"ladder": "batch", "max": DECODE_MAX},
        "kv_lens": {"ladder": "kv_len", "min": KV_MIN, "max": min(KV_MAX, positions)},
    }
    doc = {
        "schema_version": SCHEMA_VERSION,
        "name": _name(config, path),
        "source": f"{path} (Hugging Face config, model_type {model_type})",
        "model": model,
        "dtypes": [_dtype(get, config)],
        "phases": phases,
    }
    try:
        return workload_from_doc(doc, path)
    except WorkloadInvalid as e:  # a value the checks above let through: one line naming the config's field
        raise _formed_from(get, e, config) from None


class _Fields:
    """The config's fields read by name, each refused naming the file and the field."""

    def __init__(self, config: dict, path: str):
        self.config, self.path = config, path

    def fail(self, field: str, reason: str, hint: str | None = None) -> HfConfigInvalid:
        # a field name is the file's text: one holding a line break or a quote is written escaped, so the error
        # stays one line
        shown = field if field.isprintable() and "'" not in field else repr(field)[1:-1]
        return HfConfigInvalid(f"{self.path}: field '{shown}': {reason}", hint=hint)

    def present(self, field: str) -> Any:
        if field not in self.config:
            raise self.fail(field, "missing")
        return self.config[field]

    def size(self, field: str) -> int:
        v = self.present(field)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise self.fail(field, f"must be a positive integer, got {v!r}")
        return v

    def text(self, field: str) -> str:
        v = self.present(field)
        if not isinstance(v, str) or not v:
            raise self.fail(field, f"must be a non-empty string, got {v!r}")
        return v

    def flag(self, field: str) -> bool:
        v = self.present(field)
        if not isinstance(v, bool):
            raise self.fail(field, f"must be true or false, got {v!r}")
        return v


def _quantization(get: _Fields, q: Any, model_type: str) -> str:
    """The workload's `quantization` of a checkpoint's `quantization_config` as transformers writes it: GPTQ (4 bits,
    group size 128, no act-order) or AWQ (4 bits, group size 128, zero points, GEMM packing); any other is refused
    naming what the dequantizing kernels do not serve."""
    field = "quantization_config"
    hint = "serve a GPTQ (no act-order) or AWQ checkpoint of 4 bits, group size 128: the formats the kernels take"
    if not isinstance(q, dict):
        raise get.fail(field, f"must be an object, got {_json_kind(q)}", hint)
    method, bits, group = q.get("quant_method"), q.get("bits"), q.get("group_size")
    if method not in ("gptq", "awq"):
        raise get.fail(
            f"{field}.quant_method", f"{method!r}: the dequantizing kernels serve gptq and awq checkpoints", hint
        )
    if type(bits) is not int or bits != 4:  # (4.0 and 4 compare equal)
        raise get.fail(f"{field}.bits", f"{bits!r}: {method} checkpoints are served at 4 bits", hint)
    if type(group) is not int or group != 128:
        raise get.fail(f"{field}.group_size", f"{group!r}: the int4 kernels' group size is 128", hint)
    _check_quantized_modules(get, q, model_type, hint)
    if method == "gptq":
        if q.get("checkpoint_format", "gptq") != "gptq":
            packing = f"{q['checkpoint_format']!r}: the int4 kernels read GPTQ's own packing and zero points (gptq)"
            raise get.fail(f"{field}.checkpoint_format", packing, hint)
        if q.get("desc_act", False) is not False:
            act_order = f"{q['desc_act']!r}: act-order (groups over permuted rows) is not served"
            raise get.fail(f"{field}.desc_act", act_order, hint)
        return "gptq-int4-g128"
    if q.get("zero_point", True) is not True:
        raise get.fail(f"{field}.zero_point", f"{q['zero_point']!r}: the int4 kernels subtract a zero point", hint)
    version = q.get("version", "gemm")
    if not isinstance(version, str) or version.lower() != "gemm":
        raise get.fail(f"{field}.version", f"{version!r}: AWQ's GEMM packing is the one repacked for the kernels", hint)
    return "awq-int4-g128"


def _check_quantized_modules(get: _Fields, q: dict, model_type: str, hint: str) -> None:
    """Every projection of every decoder layer quantized, and nothing else: what a workload's `quantization` launches
    (the LM head and the embedding stay in the activations' dtype)."""
    field = "quantization_config"
    blocks = q.get("modules_in_block_to_quantize")
    if blocks is not None:
        # a list of lists of module names (transformers' GPTQConfig); any other shape is refused, not read
        names = [n for b in blocks for n in b] if isinstance(blocks, list) and all(_names(b) for b in blocks) else []
        every = _PROJECTIONS.get(model_type, _PROJECTIONS[None])
        if sorted(names) != sorted(every):
            why = f"{blocks!r}: a workload quantizes every projection of a layer ({', '.join(every)}), no other"
            raise get.fail(f"{field}.modules_in_block_to_quantize", why, hint)
    kept = q.get("modules_to_not_convert")
    if kept is not None and (not _names(kept) or set(kept) - {"lm_head"}):
        why = f"{kept!r}: modules left unquantized; a workload quantizes every projection (only lm_head may be named)"
        raise get.fail(f"{field}.modules_to_not_convert", why, hint)
    if q.get("lm_head", False) is not False:
        why = f"{q['lm_head']!r}: a quantized LM head; a workload's LM head is a matmul in the activations' dtype"
        raise get.fail(f"{field}.lm_head", why, hint)


def _names(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(n, str) for n in v)


def _check_layer_types(get: _Fields, config: dict) -> None:
    if "layer_types" not in config:
        return
    kinds = config["layer_types"]
    if not isinstance(kinds, list) or not kinds:
        raise get.fail("layer_types", f"must be a list of {', '.join(LAYER_TYPES)}, got {kinds!r}")
    other = next((k for k in kinds if k not in LAYER_TYPES), None)
    if other is not None:
        raise get.fail("layer_types", f"{other!r}: no launch of a workload (mapped: {', '.join(LAYER_TYPES)})")
    if len(kinds) != get.size("num_hidden_layers"):
        raise get.fail("layer_types", f"{len(kinds)} kinds for num_hidden_layers={config['num_hidden_layers']}")


def _formed_from(get: _Fields, e: WorkloadInvalid, config: dict) -> HfConfigInvalid:
    """A refusal of the workload formed, naming the config's field it came from (not the workload's)."""
    field = getattr(e, "field", None)
    if field == "dtypes":
        source = "torch_dtype" if "torch_dtype" in config else "dtype"
    elif field == "model.experts":
        source = "num_local_experts" if "num_local_experts" in config else "num_experts"
    else:
        source = _FORMED_FROM.get(field)
    if source is None:
        return HfConfigInvalid(e.message)
    quantized = field in ("dtypes", "model.quantization") and "quantization_config" in config
    hint = (
        _NOT_QUANTIZED
        if quantized
        else "the config is not one of a model that loads: compare it with the published one"
    )
    return get.fail(source, e.reason, hint)


def _json_kind(v: Any) -> str:
    """A value's kind as JSON names it."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true or false"
    for kind, name in ((str, "a string"), (int | float, "a number"), (list, "an array"), (dict, "an object")):
        if isinstance(v, kind):
            return name
    return type(v).__name__


def _activation(get: _Fields, model_type: str) -> str:
    # gemma's MLP uses hidden_activation when given (transformers' GemmaMLP), else the tanh gelu whatever hidden_act
    # says (module doc)
    if model_type == "gemma" and get.config.get("hidden_activation") is None:
        return "gelu_tanh"
    field = "hidden_activation" if model_type == "gemma" else "hidden_act"
    act = get.text(field)
    if act not in ACTIVATIONS:
        raise get.fail(
            field,
            f"'{act}': nbxcert has no gated-MLP kernel for it (silu_and_mul is SwiGLU's, gelu_and_mul GeGLU's; "
            f"mapped: {', '.join(ACTIVATIONS)})",
            hint="a model with this MLP cannot be certified yet: its activation-and-multiply kernel is not in nbxcert",
        )
    return ACTIVATIONS[act]


def _experts(get: _Fields, model_type: str, config: dict) -> dict[str, int]:
    top_k = get.size("num_experts_per_tok")
    if model_type == "mixtral":
        return {
            "experts": get.size("num_local_experts"),
            "top_k": top_k,
            "moe_intermediate": get.size("intermediate_size"),
        }
    if get.size("decoder_sparse_step") != 1:
        raise get.fail("decoder_sparse_step", f"{config['decoder_sparse_step']}: dense and sparse layers mixed")
    if get.present("mlp_only_layers") != []:
        raise get.fail("mlp_only_layers", f"{config['mlp_only_layers']!r}: dense and sparse layers mixed")
    return {"experts": get.size("num_experts"), "top_k": top_k, "moe_intermediate": get.size("moe_intermediate_size")}


def _dtype(get: _Fields, config: dict) -> str:
    fields = [f for f in ("torch_dtype", "dtype") if f in config]
    if not fields:
        raise get.fail("torch_dtype", f"missing (nor dtype): say the weights' dtype, one of {', '.join(DTYPES)}")
    values = {config[f] for f in fields if isinstance(config[f], str)}
    for f in fields:
        if config[f] not in DTYPES:
            raise get.fail(f, f"{config[f]!r} is not a dtype nbxcert launches (one of {', '.join(DTYPES)})")
    if len(values) > 1:
        raise get.fail("dtype", f"{config['dtype']!r} differs from torch_dtype {config['torch_dtype']!r}")
    return values.pop()


def _name(config: dict, path: str) -> str:
    name = config.get("_name_or_path")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise HfConfigInvalid(f"{path}: field '_name_or_path': must be a non-empty string, got {name!r}")
    return name or Path(path).absolute().parent.name
