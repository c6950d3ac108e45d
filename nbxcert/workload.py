"""Workloads: a model's real dimensions -> the launches a decoder-only transformer makes -> launch keys.

A workload file (YAML, `nbxcert/workloads/<name>.yml` when shipped, or any path) states the model's dimensions (with
the source they were taken from) and the phases to cover: prefill token counts, decode batch sizes, KV lengths.
`launches()` maps it to the kernels a decoder layer, the embedding and the LM head run, each with its problem; the
keys are formed by `keys.make_key`, exactly as the runtime forms them at a launch. An unknown kind or a missing field
is `WorkloadInvalid` naming the file and the field.
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
ACTIVATIONS = ("silu",)  # the gated MLP's activation (SwiGLU); GeGLU needs a gelu_and_mul kernel first
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


@dataclass(frozen=True)
class Workload:
    name: str
    path: str
    source: str
    model: dict[str, Any]
    dtypes: tuple[str, ...]
    phases: dict[str, Any]


@dataclass(frozen=True)
class Launch:
    """One launch a model makes: the kernel, its problem, its key dtypes, and where in the model it happens."""

    kernel: str
    problem: dict[str, Any]
    dtypes: tuple[str, ...]
    where: str


def _fail(path: str, field: str, reason: str) -> WorkloadInvalid:
    return WorkloadInvalid(f"{path}: field '{field}': {reason}")


def shipped() -> list[str]:
    base = resources.files("nbxcert").joinpath("workloads")
    return sorted(p.name[:-4] for p in base.iterdir() if p.name.endswith(".yml"))


def load_workload(name_or_path: str) -> Workload:
    """A shipped workload by name (`demo`, `llama-3-8b`, ...) or a YAML file by path."""
    p = Path(name_or_path)
    if p.suffix in (".yml", ".yaml") or p.exists():
        if not p.is_file():
            raise WorkloadInvalid(f"workload file {p} does not exist")
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:  # was a traceback (bug found by tests/test_fuzz.py::test_workload)
            raise WorkloadInvalid(f"{p}: not UTF-8 text (byte {e.start})") from None
        except OSError as e:
            raise WorkloadInvalid(f"{p}: cannot be read: {e.strerror}") from None
        return parse_workload(text, str(p))
    res = resources.files("nbxcert").joinpath("workloads", f"{name_or_path}.yml")
    if not res.is_file():
        raise WorkloadInvalid(
            f"no workload named '{name_or_path}'", hint=f"shipped workloads: {', '.join(shipped())}; or give a path"
        )
    return parse_workload(res.read_text(encoding="utf-8"), f"workloads/{name_or_path}.yml")


def parse_workload(text: str, path: str) -> Workload:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise WorkloadInvalid(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    except RecursionError:  # PyYAML's composer recurses per level (bug found by tests/test_fuzz.py::test_workload)
        raise WorkloadInvalid(f"{path}: not valid YAML: nested too deeply") from None
    except ValueError as e:  # an integer of more than 4300 digits (same bug hunt): int() refuses it inside PyYAML
        raise WorkloadInvalid(f"{path}: not valid YAML: {str(e)[:200]}") from None
    if not isinstance(doc, dict):
        raise WorkloadInvalid(f"{path}: a workload is a mapping, got {type(doc).__name__}")
    known = {"schema_version", "name", "source", "model", "dtypes", "phases"}
    for k in doc:
        if k not in known:
            raise _fail(path, k, "unknown field")
    for k in known:
        if k not in doc:
            raise _fail(path, k, "missing")
    if doc["schema_version"] != SCHEMA_VERSION:
        raise _fail(path, "schema_version", f"{doc['schema_version']!r} is not {SCHEMA_VERSION}")
    if not isinstance(doc["source"], str) or not doc["source"].strip():
        raise _fail(path, "source", "state where the dimensions come from (the model's published config)")
    model = doc["model"]
    if not isinstance(model, dict):
        raise _fail(path, "model", "must be a mapping")
    for k in model:
        if k not in MODEL_FIELDS:
            raise _fail(path, f"model.{k}", "unknown field")
    for k, kind in MODEL_FIELDS.items():
        if k not in model:
            raise _fail(path, f"model.{k}", "missing")
        v = model[k]
        if kind is int and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            raise _fail(path, f"model.{k}", f"must be a positive integer, got {v!r}")
        if kind is not int and not isinstance(v, kind):
            raise _fail(path, f"model.{k}", f"must be a {kind.__name__}, got {v!r}")
    for k, allowed in (("norm", NORMS), ("activation", ACTIVATIONS), ("rope", ROPE_LAYOUTS)):
        if model[k] not in allowed:
            raise _fail(path, f"model.{k}", f"unknown kind '{model[k]}' (one of {', '.join(allowed)})")
    if model["heads"] % model["kv_heads"]:
        raise _fail(path, "model.kv_heads", f"{model['kv_heads']} does not divide heads={model['heads']}")
    dtypes = doc["dtypes"]
    if not isinstance(dtypes, list) or not dtypes or not all(d in ("float16", "bfloat16", "float32") for d in dtypes):
        raise _fail(path, "dtypes", "a non-empty list of float16, bfloat16, float32")
    phases = doc["phases"]
    if not isinstance(phases, dict):
        raise _fail(path, "phases", "must be a mapping")
    for k in phases:
        if k not in PHASE_FIELDS:
            raise _fail(path, f"phases.{k}", "unknown field")
    for k in PHASE_FIELDS:
        if k not in phases:
            raise _fail(path, f"phases.{k}", "missing")
        _check_sizes(path, f"phases.{k}", phases[k])
    if not isinstance(doc["name"], str) or not doc["name"]:
        raise _fail(path, "name", "must be a non-empty string")
    return Workload(doc["name"], path, doc["source"], dict(model), tuple(dtypes), dict(phases))


def _check_sizes(path: str, field: str, v: Any) -> None:
    """A list of positive sizes, or `{ladder: NAME, max: N}` (the device file's ladder up to N)."""
    if isinstance(v, list):
        if not v or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v):
            raise _fail(path, field, "must be a non-empty list of positive integers")
        return
    if isinstance(v, dict):
        if set(v) - {"ladder", "max", "min"} or "ladder" not in v or "max" not in v:
            raise _fail(path, field, "a ladder range is {ladder: NAME, max: N} (optional min)")
        # checked here, not when the ladder is read: `max: x` raised TypeError from `sizes()`, and an unknown ladder
        # name was refused naming the device file instead of this one (bugs found by tests/test_fuzz.py)
        from nbxcert.profiles import LADDER_NAMES

        if v["ladder"] not in LADDER_NAMES:
            raise _fail(path, f"{field}.ladder", f"{v['ladder']!r} is not a ladder ({', '.join(LADDER_NAMES)})")
        for bound in ("max", "min"):
            b = v.get(bound, 1)
            if isinstance(b, bool) or not isinstance(b, int) or b <= 0:
                raise _fail(path, f"{field}.{bound}", f"must be a positive integer, got {b!r}")
        return
    raise _fail(path, field, "must be a list of sizes or {ladder: NAME, max: N}")


def sizes(w: Workload, phase: str, profile) -> list[int]:
    v = w.phases[phase]
    if isinstance(v, list):
        return list(v)
    ladder = profile.ladder(v["ladder"])
    return [x for x in ladder if v.get("min", 1) <= x <= v["max"]]


def launches(w: Workload, profile) -> list[Launch]:
    """Every launch of the model for each phase and dtype (duplicates removed, order kept)."""
    m = w.model
    h, inter, nh, nkv, d, vocab = m["hidden"], m["intermediate"], m["heads"], m["kv_heads"], m["head_dim"], m["vocab"]
    qkv = (nh + 2 * nkv) * d
    norm = m["norm"]
    out: list[Launch] = []
    seen = set()

    def add(kernel, problem, dt, where):
        ident = (kernel, tuple(sorted(problem.items())), dt)
        if ident not in seen:
            seen.add(ident)
            out.append(Launch(kernel, problem, dt, where))

    def matmul(tokens, n, k, dt, where, bias=False):
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
        matmul(tokens, qkv, h, dt, "qkv projection", bias=m["qkv_bias"])
        rope = {"n_tokens": tokens, "n_heads": nh, "n_kv_heads": nkv, "head_dim": d, "rot_dim": d, "style": m["rope"]}
        add("rope", rope, (dt,), "rotary embedding")
        attention()
        matmul(tokens, h, nh * d, dt, "output projection")
        add(f"add_{norm}", {"n_rows": tokens, "n_cols": h}, (dt, dt), "post-attention residual + norm")
        matmul(tokens, 2 * inter, h, dt, "gate/up projection")
        if m["activation"] == "silu":
            add("silu_and_mul", {"n_rows": tokens, "d": inter}, (dt,), "SwiGLU")
        else:
            raise WorkloadInvalid(f"{w.path}: field 'model.activation': {m['activation']} (GeGLU) has no kernel yet")
        matmul(tokens, h, inter, dt, "down projection")
        add(f"add_{norm}", {"n_rows": tokens, "n_cols": h}, (dt, dt), "residual + next norm")

    for dt in w.dtypes:
        for t in sizes(w, "prefill_tokens", profile):
            attn = {"batch": 1, "heads": nh, "kv_heads": nkv, "q_len": t, "kv_len": t, "head_dim": d, "causal": 1}
            attn["aligned"] = 1  # q/k/v rows of head_dim elements: 16-byte aligned for every shipped head dim
            layer(t, dt, lambda attn=attn: add("flash_attention", attn, (dt,), "prefill attention"))
            matmul(1, vocab, h, dt, "LM head (last token)")
            add("softmax", {"n_rows": 1, "n_cols": vocab, "mask": "none"}, (dt,), "logits softmax")
        for b in sizes(w, "decode_batch", profile):
            for kv in sizes(w, "kv_lens", profile):
                prob = {"batch": b, "heads": nh, "kv_heads": nkv, "kv_len": kv, "head_dim": d}
                layer(b, dt, lambda prob=prob: add("decode_attention", prob, (dt,), "decode attention"))
            matmul(b, vocab, h, dt, "LM head")
            add("softmax", {"n_rows": b, "n_cols": vocab, "mask": "none"}, (dt,), "logits softmax")
    return out


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
