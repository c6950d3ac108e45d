"""Workloads: a model's real dimensions -> the launches a decoder-only transformer makes -> launch keys.

A workload file (YAML, `nbxcert/workloads/<name>.yml` when shipped, or any path) states the model's dimensions (with
the source they were taken from) and the phases to cover: prefill token counts, decode batch sizes, KV lengths.
`launches()` maps it to the kernels a decoder layer, the embedding and the LM head run, each with its problem; the
keys are formed by `keys.make_key`, exactly as the runtime forms them at a launch. An unknown kind or a missing field
is `WorkloadInvalid` naming the file and the field.

Optional model fields: `experts`, `top_k` and `moe_intermediate` (all three or none) make every layer's MLP a
mixture of experts (Mixtral, Qwen3-MoE: every layer sparse; `intermediate` is then not launched): the router's
matmul, `moe_align` (one key per block size fused_moe's candidates align to, since the certified fused_moe config
picks it), `fused_moe` gate/up, `silu_and_mul` on each (token, expert) pair, `fused_moe` down with the router
weights, `moe_sum`; the routing is the `softmax` over the experts' logits and the `topk` of its probabilities (the
renormalisation of the k weights some models apply is not listed). `qk_norm` (Qwen3) adds the per-head RMSNorm of
q and k after their projection. `quantization` makes the decoder layers' four projections (qkv, output, gate/up,
down) dequantizing products of quantized weights, as a model served from a quantized checkpoint launches them:
`dequant_gemv` for up to `GEMV_MAX_M` (4) tokens, `dequant_matmul` above (`nbxcert.kernels.quant`); the embedding and
the LM head keep the activations' dtype, as the published checkpoints keep them. Its values name the checkpoint
formats the kernels serve (QUANTIZATIONS): GPTQ int4 with group size 128 and no act-order, AWQ int4 with group size 128
(repacked once into GPTQ's layout when the weights load: `awq_to_gptq`, so its keys are GPTQ's), and int8 per output
channel. A workload without these fields makes exactly the launches it made before they existed.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from nbxcert.errors import WorkloadInvalid

SCHEMA_VERSION = 1
NORMS = ("rmsnorm", "layernorm")
# the gated MLP's activation: SwiGLU (silu_and_mul), or GeGLU (gelu_and_mul) in gelu's tanh form (Gemma's
# gelu_pytorch_tanh) or its erf form
ACTIVATIONS = ("silu", "gelu_tanh", "gelu")
ROPE_LAYOUTS = ("neox", "gptj")
MODEL_FIELDS = {
    "hidden": int,
    "intermediate": int,
    "heads": int,
    "kv_heads": int,
    "head_dim": int,
    "vocab": int,
    "layers": int,
    "norm": str,
    "activation": str,
    "rope": str,
    "qkv_bias": bool,
}
PHASE_FIELDS = ("prefill_tokens", "decode_batch", "kv_lens")
OPTIONAL_MODEL_FIELDS = {"experts": int, "top_k": int, "moe_intermediate": int, "qk_norm": bool, "quantization": str}
# a checkpoint format -> the dequantizing kernels' `format` (kernels/quant.py's module doc says what each stores)
QUANTIZATIONS = {"gptq-int4-g128": "int4", "awq-int4-g128": "int4", "int8-per-channel": "int8"}
MOE_FIELDS = ("experts", "top_k", "moe_intermediate")


@dataclass(frozen=True)
class Workload:
    name: str
    path: str
    source: str
    model: dict[str, Any]
    dtypes: tuple[str, ...]
    phases: dict[str, Any]
    kind: str = "decoder"  # or "unet-block" (`parse_unet_block`)


@dataclass(frozen=True)
class Launch:
    """One launch a model makes: the kernel, its problem, its key dtypes, and where in the model it happens."""

    kernel: str
    problem: dict[str, Any]
    dtypes: tuple[str, ...]
    where: str


def _fail(path: str, field: str, reason: str) -> WorkloadInvalid:
    e = WorkloadInvalid(f"{path}: field '{field}': {reason}")
    # the field and the reason apart, for a caller that formed the document from a file of other field names
    # (`nbxcert.hf_config` names the config's field instead)
    e.field, e.reason = field, reason
    return e


class _UniqueKeySafeLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last silently: `heads: 32`
    then `heads: 16` was a workload of 16 heads)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` merges; the keys after it override
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                again = key in seen
            except TypeError:  # an unhashable key: PyYAML's own refusal below names it
                break
            if again:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice (line {key_node.start_mark.line + 1})", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


_NAME_HINT = "give a workload file (YAML), or the name of a shipped workload (`--workload demo`)"


def shipped() -> list[str]:
    base = resources.files("nbxcert").joinpath("workloads")
    return sorted(p.name[:-4] for p in base.iterdir() if p.name.endswith(".yml"))


def load_workload(name_or_path: str) -> Workload:
    """A shipped workload by name (`demo`, `llama-3-8b`, ...) or a YAML file by path."""
    from nbxcert.options import reachable

    p = reachable(Path(name_or_path), "workload file")
    if p.suffix in (".yml", ".yaml") or p.exists():
        if not p.is_file():  # a directory was said not to exist
            what = "is not a regular file" if p.exists() else "does not exist"
            raise WorkloadInvalid(f"workload file {p} {what}", hint=_NAME_HINT)
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:  # was a traceback (bug found by tests/cli/test_fuzz.py::test_workload)
            raise WorkloadInvalid(f"{p}: not UTF-8 text (byte {e.start})") from None
        except OSError as e:
            raise WorkloadInvalid(
                f"{p}: cannot be read: {e.strerror}", hint="give a workload file you can read"
            ) from None
        return parse_workload(text, str(p))
    res = resources.files("nbxcert").joinpath("workloads", f"{name_or_path}.yml")
    if not res.is_file():
        raise WorkloadInvalid(
            f"no workload named '{name_or_path}'", hint=f"shipped workloads: {', '.join(shipped())}; or give a path"
        )
    return parse_workload(res.read_text(encoding="utf-8"), f"workloads/{name_or_path}.yml")


def parse_workload(text: str, path: str) -> Workload:
    try:
        doc = yaml.load(text, Loader=_UniqueKeySafeLoader)  # a SafeLoader: no object is built from a tag
    except yaml.YAMLError as e:
        raise WorkloadInvalid(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    except RecursionError:  # PyYAML's composer recurses per level (bug found by tests/cli/test_fuzz.py::test_workload)
        raise WorkloadInvalid(f"{path}: not valid YAML: nested too deeply") from None
    except ValueError as e:  # an integer of more than 4300 digits (same bug hunt): int() refuses it inside PyYAML
        raise WorkloadInvalid(f"{path}: not valid YAML: {str(e)[:200]}") from None
    return workload_from_doc(doc, path)


def workload_from_doc(doc: Any, path: str) -> Workload:
    """The workload a parsed document states, every field checked and refused by name: the one path a workload file
    and a Hugging Face config (`nbxcert.hf_config`, which forms the same document from the config's fields) take."""
    if not isinstance(doc, dict):
        raise WorkloadInvalid(f"{path}: a workload is a mapping, got {type(doc).__name__}")
    if "kind" in doc:
        return parse_unet_block(doc, path)
    _check_head(path, doc, {"schema_version", "name", "source", "model", "dtypes", "phases"})
    model = _checked_model(path, doc, MODEL_FIELDS, OPTIONAL_MODEL_FIELDS)
    for k, allowed in (("norm", NORMS), ("activation", ACTIVATIONS), ("rope", ROPE_LAYOUTS)):
        if model[k] not in allowed:
            raise _fail(path, f"model.{k}", f"unknown kind '{model[k]}' (one of {', '.join(allowed)})")
    if model["heads"] % model["kv_heads"]:
        raise _fail(path, "model.kv_heads", f"{model['kv_heads']} does not divide heads={model['heads']}")
    given = [k for k in MOE_FIELDS if k in model]
    if given and len(given) != len(MOE_FIELDS):
        missing = next(k for k in MOE_FIELDS if k not in model)
        raise _fail(path, f"model.{missing}", f"missing: a mixture of experts states all of {', '.join(MOE_FIELDS)}")
    if given and model["top_k"] > model["experts"]:
        raise _fail(path, "model.top_k", f"{model['top_k']} is more than experts={model['experts']}")
    dtypes, phases = _dtypes_and_phases(path, doc, ("float16", "bfloat16", "float32"), "", PHASE_FIELDS)
    if "quantization" in model:
        _check_quantization(path, model, dtypes)
    for k in PHASE_FIELDS:
        _check_sizes(path, f"phases.{k}", phases[k])
    if not isinstance(doc["name"], str) or not doc["name"]:
        raise _fail(path, "name", "must be a non-empty string")
    return Workload(doc["name"], path, doc["source"], dict(model), tuple(dtypes), dict(phases))


def _check_quantization(path: str, model: dict, dtypes) -> None:
    """A quantized model's format is one the dequantizing kernels serve, and its projections meet their shapes."""
    q = model["quantization"]
    if q not in QUANTIZATIONS:
        raise _fail(path, "model.quantization", f"unknown format '{q}' (one of {', '.join(QUANTIZATIONS)})")
    if "experts" in model:
        raise _fail(path, "model.quantization", "no dequantizing kernel serves a mixture of experts' fused_moe")
    if model["qkv_bias"]:
        raise _fail(path, "model.quantization", "the dequantizing kernels add no bias, and qkv_bias is true")
    bad = [d for d in dtypes if d not in ("float16", "bfloat16")]
    if bad:
        raise _fail(path, "dtypes", f"{bad[0]}: the dequantizing kernels' activations are float16 or bfloat16")
    h, d = model["hidden"], model["head_dim"]
    qkv = (model["heads"] + 2 * model["kv_heads"]) * d
    inputs = {"hidden": h, "intermediate": model["intermediate"], "heads x head_dim": model["heads"] * d}
    outputs = {"hidden": h, "2 x intermediate": 2 * model["intermediate"], "(heads + 2 kv_heads) x head_dim": qkv}
    for name, k in inputs.items():
        if k % 128:
            raise _fail(path, "model.quantization", f"a projection's K ({name} = {k}) is not a multiple of 128")
    for name, n in outputs.items():
        if n % 8:
            raise _fail(path, "model.quantization", f"a projection's N ({name} = {n}) is not a multiple of 8")


def _check_names(path: str, where: str, given: dict, known) -> None:
    """Every name in `given` is one of `known`, and every one of `known` (in its order: the first missing is the one
    named) is in `given`; `where` prefixes the field named ("model.", "phases.")."""
    for k in given:
        if k not in known:
            raise _fail(path, f"{where}{k}", "unknown field")
    for k in known:
        if k not in given:
            raise _fail(path, f"{where}{k}", "missing")


def _check_head(path: str, doc: dict, known) -> None:
    """A workload file's top-level fields are exactly `known`, and its schema version is this one."""
    _check_names(path, "", doc, known)
    v = doc["schema_version"]
    if isinstance(v, bool) or not isinstance(v, int) or v != SCHEMA_VERSION:  # 1.0 and true equal 1 in Python
        raise _fail(path, "schema_version", f"{doc['schema_version']!r} is not {SCHEMA_VERSION}")


def _checked_model(path: str, doc: dict, fields: dict[str, type], optional: dict[str, type] | None = None) -> dict:
    """The `source` of a workload file stated, and its `model` mapping: each field one of `fields` or `optional`,
    every one of `fields` given, each of its kind (an int a positive one)."""
    if not isinstance(doc["source"], str) or not doc["source"].strip():
        raise _fail(path, "source", "state where the dimensions come from (the model's published config)")
    model = doc["model"]
    if not isinstance(model, dict):
        raise _fail(path, "model", "must be a mapping")
    optional = optional or {}
    for k in model:
        if k not in fields and k not in optional:
            raise _fail(path, f"model.{k}", "unknown field")
    for k, kind in {**fields, **optional}.items():
        if k not in model:
            if k in optional:
                continue
            raise _fail(path, f"model.{k}", "missing")
        v = model[k]
        if kind is int and not _positive_int(v):
            raise _fail(path, f"model.{k}", f"must be a positive integer, got {v!r}")
        if kind is not int and not isinstance(v, kind):
            raise _fail(path, f"model.{k}", f"must be a {kind.__name__}, got {v!r}")
    return model


def _dtypes_and_phases(path: str, doc: dict, allowed: tuple[str, ...], why: str, fields: tuple[str, ...]):
    """The `dtypes` list (each one of `allowed`) and the `phases` mapping (exactly `fields`) of a workload file."""
    dtypes = doc["dtypes"]
    if not isinstance(dtypes, list) or not dtypes or not all(d in allowed for d in dtypes):
        raise _fail(path, "dtypes", f"a non-empty list of {', '.join(allowed)}{why}")
    phases = doc["phases"]
    if not isinstance(phases, dict):
        raise _fail(path, "phases", "must be a mapping")
    _check_names(path, "phases.", phases, fields)
    return dtypes, phases


def _check_sizes(path: str, field: str, v: Any) -> None:
    """A list of positive sizes, or `{ladder: NAME, max: N}` (the device file's ladder up to N, and the rung N rounds up
    to where N is none: a size up to N buckets there)."""
    if isinstance(v, list):
        if not v or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v):
            raise _fail(path, field, "must be a non-empty list of positive integers")
        return
    if isinstance(v, dict):
        if set(v) - {"ladder", "max", "min"} or "ladder" not in v or "max" not in v:
            raise _fail(path, field, "a ladder range is {ladder: NAME, max: N} (optional min)")
        # checked here, not when the ladder is read: `max: x` raised TypeError from `sizes()`, and an unknown ladder
        # name was refused naming the device file instead of this one (bugs found by tests/cli/test_fuzz.py)
        from nbxcert.profiles import LADDER_NAMES

        if v["ladder"] not in LADDER_NAMES:
            raise _fail(path, f"{field}.ladder", f"{v['ladder']!r} is not a ladder ({', '.join(LADDER_NAMES)})")
        for bound in ("max", "min"):
            b = v.get(bound, 1)
            if isinstance(b, bool) or not isinstance(b, int) or b <= 0:
                raise _fail(path, f"{field}.{bound}", f"must be a positive integer, got {b!r}")
        if v.get("min", 1) > v["max"]:  # was taken as the one rung above max, silently
            raise _fail(path, f"{field}.min", f"{v['min']} is above max {v['max']}")
        return
    raise _fail(path, field, "must be a list of sizes or {ladder: NAME, max: N}")


def resolve(workload: str | Workload) -> Workload:
    """A workload already formed (`nbxcert.hf_config.load_hf_config`) as it is, else `load_workload` of the name."""
    return workload if isinstance(workload, Workload) else load_workload(workload)


def sizes(w: Workload, phase: str, profile) -> list[int]:
    v = w.phases[phase]
    if isinstance(v, list):
        return list(v)
    ladder = sorted(profile.ladder(v["ladder"]))
    lo, hi = v.get("min", 1), v["max"]
    kept = [x for x in ladder if lo <= x <= hi]
    # a size between the last rung kept and `max` buckets up to the next rung: that rung's launch is the model's too
    # (a 2500-token prefill of a model of 3000 positions forms the 3072 key)
    above = [x for x in ladder if x > hi]
    if above and (not kept or kept[-1] < hi):
        kept.append(above[0])
    return kept


class _LaunchList(list):
    """Launches in the order first made, each (kernel, problem, dtype) once."""

    def __init__(self):
        super().__init__()
        self._seen: set = set()

    def add(self, kernel: str, problem: dict, dt, where: str) -> None:
        ident = (kernel, tuple(sorted(problem.items())), dt)
        if ident not in self._seen:
            self._seen.add(ident)
            self.append(Launch(kernel, problem, dt, where))


def launches(w: Workload, profile) -> list[Launch]:
    """Every launch of the model for each phase and dtype (duplicates removed, order kept)."""
    if w.kind == UNET_BLOCK:
        return unet_block_launches(w, profile)
    m = w.model
    h, inter, nh, nkv, d, vocab = m["hidden"], m["intermediate"], m["heads"], m["kv_heads"], m["head_dim"], m["vocab"]
    qkv = (nh + 2 * nkv) * d
    norm = m["norm"]
    out = _LaunchList()
    add = out.add

    def matmul(tokens, n, k, dt, where, bias=False, projection=False):
        if projection and "quantization" in m:
            from nbxcert.kernels.quant import GEMV_MAX_M

            kernel = "dequant_gemv" if tokens <= GEMV_MAX_M else "dequant_matmul"
            fmt = QUANTIZATIONS[m["quantization"]]
            add(kernel, {"M": tokens, "N": n, "K": k, "format": fmt}, (dt,), f"{where} ({m['quantization']})")
            return
        # activations [tokens, k] row-major times a weight stored [n, k] (nn.Linear's layout): B = Wᵀ is
        # column-major; model dimensions are multiples of 8, so operands are 16-byte aligned (TMA-legal)
        problem = {"M": tokens, "N": n, "K": k, "trans_a": 0, "trans_b": 1, "aligned": 1}
        if bias:
            add("addmm", {**problem, "activation": "none"}, (dt, dt, dt), where)
        else:
            add("matmul", problem, (dt, dt), where)

    def layer(tokens, dt, attention):
        add("embedding", {"n_tokens": tokens, "dim": h}, (dt, "int32"), "token embedding")
        add(norm, {"n_rows": tokens, "n_cols": h}, (dt, dt), "input norm")
        matmul(tokens, qkv, h, dt, "qkv projection", bias=m["qkv_bias"], projection=True)
        rope = {"n_tokens": tokens, "n_heads": nh, "n_kv_heads": nkv, "head_dim": d, "rot_dim": d, "style": m["rope"]}
        if m.get("qk_norm"):
            add(norm, {"n_rows": tokens * nh, "n_cols": d}, (dt, dt), "q norm (per head)")
            add(norm, {"n_rows": tokens * nkv, "n_cols": d}, (dt, dt), "k norm (per head)")
        add("rope", rope, (dt,), "rotary embedding")
        attention()
        matmul(tokens, h, nh * d, dt, "output projection", projection=True)
        add(f"add_{norm}", {"n_rows": tokens, "n_cols": h}, (dt, dt), "post-attention residual + norm")
        if "experts" in m:
            moe_block(tokens, dt)
            add(f"add_{norm}", {"n_rows": tokens, "n_cols": h}, (dt, dt), "residual + next norm")
            return
        matmul(tokens, 2 * inter, h, dt, "gate/up projection", projection=True)
        if m["activation"] == "silu":
            add("silu_and_mul", {"n_rows": tokens, "d": inter}, (dt,), "SwiGLU")
        else:
            approximate = "tanh" if m["activation"] == "gelu_tanh" else "none"
            add("gelu_and_mul", {"n_rows": tokens, "d": inter, "approximate": approximate}, (dt,), "GeGLU")
        matmul(tokens, h, inter, dt, "down projection", projection=True)
        add(f"add_{norm}", {"n_rows": tokens, "n_cols": h}, (dt, dt), "residual + next norm")

    def moe_block(tokens, dt):
        from nbxcert.kernels.moe import align_blocks

        experts, top_k, moe_inter = m["experts"], m["top_k"], m["moe_intermediate"]
        matmul(tokens, experts, h, dt, "router logits")
        # routing: softmax over the experts' logits, then the top_k experts of each token (the renormalisation of
        # the k weights some models apply is a division of k numbers, left to the caller)
        add("softmax", {"n_rows": tokens, "n_cols": experts, "mask": "none"}, (dt,), "router softmax")
        add("topk", {"n_rows": tokens, "n_cols": experts, "k": top_k}, (dt,), "router top-k")
        for block in align_blocks():
            align = {"M": tokens, "top_k": top_k, "experts": experts, "block": block}
            add("moe_align", align, ("int32",), "expert alignment")
        expert = {"M": tokens, "experts": experts, "top_k": top_k}
        up = {**expert, "N": 2 * moe_inter, "K": h, "mul_weight": 0, "pair_rows": 0}
        add("fused_moe", up, (dt, dt), "experts' gate/up projection")
        add("silu_and_mul", {"n_rows": tokens * top_k, "d": moe_inter}, (dt,), "experts' SwiGLU")
        # the down projection reads one row per (token, expert) pair; with top_k = 1 that is one per token
        down = {**expert, "N": h, "K": moe_inter, "mul_weight": 1, "pair_rows": int(top_k > 1)}
        add("fused_moe", down, (dt, dt), "experts' down projection (router weights applied)")
        add("moe_sum", {"M": tokens, "N": h, "top_k": top_k}, (dt,), "sum of the top-k experts' outputs")

    for dt in w.dtypes:
        for t in sizes(w, "prefill_tokens", profile):
            attn = {"batch": 1, "heads": nh, "kv_heads": nkv, "q_len": t, "kv_len": t, "head_dim": d, "causal": 1}
            attn["aligned"] = 1  # q/k/v rows of head_dim elements: 16-byte aligned for every shipped head dim
            layer(t, dt, lambda attn=attn, dt=dt: add("flash_attention", attn, (dt,), "prefill attention"))
            matmul(1, vocab, h, dt, "LM head (last token)")
            add("softmax", {"n_rows": 1, "n_cols": vocab, "mask": "none"}, (dt,), "logits softmax")
        for b in sizes(w, "decode_batch", profile):
            for kv in sizes(w, "kv_lens", profile):
                prob = {"batch": b, "heads": nh, "kv_heads": nkv, "kv_len": kv, "head_dim": d}
                layer(b, dt, lambda prob=prob, dt=dt: add("decode_attention", prob, (dt,), "decode attention"))
            matmul(b, vocab, h, dt, "LM head")
            add("softmax", {"n_rows": b, "n_cols": vocab, "mask": "none"}, (dt,), "logits softmax")
    return list(out)


def workload_keys(w: Workload, profile, kernels: set[str] | None = None):
    """The distinct launch keys of a workload (optionally only for some kernels), in first-seen order."""
    from nbxcert.kernels.spec import get_spec
    from nbxcert.keys import make_key

    keys, seen = [], set()
    for launch in launches(w, profile):
        if kernels is not None and launch.kernel not in kernels:
            continue
        key = make_key(get_spec(launch.kernel), launch.problem, launch.dtypes, profile)
        if key not in seen:
            seen.add(key)
            keys.append(key)
    return keys


# --- UNet blocks (`kind: unet-block`) ---------------------------------------------------------------------------------
# A diffusion UNet block is not a decoder layer: its file states `kind: unet-block` and its own model fields, and its
# launches are the vision kernels' (`kernels/vision.py`). Decoder workloads carry no `kind` and are untouched.
#
#     model:
#       resnet_in_channels: [320, 640]   # input channels of each ResnetBlock2D, in order (an up block's include the
#                                        # skip connection concatenated to it)
#       out_channels: 640                # every resnet's output channels
#       norm_groups: 32                  # GroupNorm groups (diffusers' norm_num_groups)
#       cross_attention: true            # a Transformer2DModel after each resnet (CrossAttn*Block2D)
#       resample: down                   # down: Downsample2D (3x3 conv, stride 2, padding 1); up: Upsample2D
#                                        # (nearest 2x, then a 3x3 conv, padding 1); none
#       layout: nchw                     # nchw or nhwc (torch's channels_last)
#     phases:
#       batch: {ladder: batch, max: 8}   # or a list
#       sizes: [32]                      # the block's input height = width (latent pixels)
#
# Each resnet launches group_norm + SiLU, its 3x3 conv (padding 1, bias), group_norm + SiLU, its second 3x3 conv, and
# a 1x1 shortcut conv when its input and output channels differ. With cross_attention, the transformer's GroupNorm (no
# SiLU) and its proj_in / proj_out 1x1 convs (SD 1.5 projects with convs: use_linear_projection false) are listed;
# what runs between them (LayerNorm, self- and cross-attention, the GEGLU feed-forward) and the time embedding's
# projection and broadcast add are not: they are the transformer families' launches, at shapes this file does not
# state (text length, heads).
UNET_BLOCK = "unet-block"
UNET_MODEL_FIELDS = {
    "resnet_in_channels": list,
    "out_channels": int,
    "norm_groups": int,
    "cross_attention": bool,
    "resample": str,
    "layout": str,
}
UNET_RESAMPLE = ("down", "up", "none")
UNET_LAYOUTS = ("nchw", "nhwc")
UNET_PHASE_FIELDS = ("batch", "sizes")


def parse_unet_block(doc: dict, path: str) -> Workload:
    """A `kind: unet-block` workload (the section comment above), every field checked and refused by name."""
    if doc["kind"] != UNET_BLOCK:
        raise _fail(path, "kind", f"unknown kind {doc['kind']!r} (one of {UNET_BLOCK}; leave it out for a decoder)")
    _check_head(path, doc, sorted({"schema_version", "kind", "name", "source", "model", "dtypes", "phases"}))
    if not isinstance(doc["name"], str) or not doc["name"]:
        raise _fail(path, "name", "must be a non-empty string")
    model = _checked_model(path, doc, UNET_MODEL_FIELDS)
    if not model["resnet_in_channels"] or not all(_positive_int(c) for c in model["resnet_in_channels"]):
        raise _fail(path, "model.resnet_in_channels", "must be a non-empty list of positive integers")
    for k, allowed in (("resample", UNET_RESAMPLE), ("layout", UNET_LAYOUTS)):
        if model[k] not in allowed:
            raise _fail(path, f"model.{k}", f"unknown kind '{model[k]}' (one of {', '.join(allowed)})")
    groups = model["norm_groups"]
    for c in [*model["resnet_in_channels"], model["out_channels"]]:
        if c % groups:
            raise _fail(path, "model.norm_groups", f"{groups} groups do not divide {c} channels")
    dtypes, phases = _dtypes_and_phases(path, doc, ("float16", "bfloat16"), " (conv2d's dtypes)", UNET_PHASE_FIELDS)
    _check_sizes(path, "phases.batch", phases["batch"])
    spatial = phases["sizes"]
    if not isinstance(spatial, list) or not spatial or not all(_positive_int(s) for s in spatial):
        raise _fail(path, "phases.sizes", "must be a non-empty list of positive integers (input height = width)")
    if model["resample"] == "down" and any(s < 2 for s in spatial):
        raise _fail(path, "phases.sizes", "a down block's input must be at least 2 pixels wide")
    return Workload(doc["name"], path, doc["source"], dict(model), tuple(dtypes), dict(phases), UNET_BLOCK)


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def unet_block_launches(w: Workload, profile) -> list[Launch]:
    """Every vision launch of a UNet block for each batch, input size and dtype (duplicates removed, order kept)."""
    m = w.model
    out_c, groups, layout = m["out_channels"], m["norm_groups"], m["layout"]
    out = _LaunchList()
    add = out.add

    def conv(b, c, size, k, kernel, dt, where, stride=1):
        pad = kernel // 2
        problem = {"batch": b, "C": c, "H": size, "W": size, "K": k, "R": kernel, "S": kernel, "stride": stride}
        problem.update(padding=pad, dilation=1, groups=1, bias=1, layout=layout)
        add("conv2d", problem, (dt,), where)

    def norm(b, c, size, silu, dt, where):
        problem = {"batch": b, "C": c, "H": size, "W": size, "groups": groups, "silu": int(silu), "layout": layout}
        add("group_norm", problem, (dt,), where)

    for dt in w.dtypes:
        for b in sizes(w, "batch", profile):
            for size in w.phases["sizes"]:
                for i, cin in enumerate(m["resnet_in_channels"]):
                    norm(b, cin, size, True, dt, f"resnet {i} norm1 + SiLU")
                    conv(b, cin, size, out_c, 3, dt, f"resnet {i} conv1")
                    norm(b, out_c, size, True, dt, f"resnet {i} norm2 + SiLU")
                    conv(b, out_c, size, out_c, 3, dt, f"resnet {i} conv2")
                    if cin != out_c:
                        conv(b, cin, size, out_c, 1, dt, f"resnet {i} shortcut (1x1)")
                    if m["cross_attention"]:
                        norm(b, out_c, size, False, dt, f"transformer {i} norm")
                        conv(b, out_c, size, out_c, 1, dt, f"transformer {i} proj_in / proj_out (1x1)")
                if m["resample"] == "down":
                    conv(b, out_c, size, out_c, 3, dt, "downsampler (3x3, stride 2)", stride=2)
                elif m["resample"] == "up":
                    problem = {"batch": b, "C": out_c, "H": size, "W": size, "scale_h": 2, "scale_w": 2}
                    add("upsample_nearest2d", {**problem, "layout": layout}, (dt,), "upsampler (nearest 2x)")
                    conv(b, out_c, 2 * size, out_c, 3, dt, "upsampler conv (3x3)")
    return list(out)
