"""One decoder layer of a model made of served nbxcert calls, next to the same layer in torch eager (in its own
process), on the same inputs: outputs checked against a float64 reference, GPU and host time per op and per layer.

    python3 benchmarks/bench_model.py --out DIR                        # llama-3-8b, fp16 and bf16, on a GPU
    NBXCERT_BACKEND=interpreter python3 benchmarks/bench_model.py --workload demo --out DIR   # the check alone

The layer (`nbx_layer`) is written as an application writes it, each op's output allocated by the call: embedding,
rmsnorm, the fused qkv projection, rope (in place on the q and k columns), attention (flash attention at prefill,
decode attention at decode), the o projection, add_rmsnorm (the residual add fused with the post-attention norm),
the fused gate/up projection, silu_and_mul and the down projection. Weights are held as nn.Linear holds them, [out,
in], and passed as `w.T` (the certified keys' trans_b = 1). Two outputs are the caller's buffers, where the layout
the next op reads is not the one the call would allocate and nbxcert's tensor layer has no device-side strided copy
(its strided copies go through the host):
- prefill attention writes into a token-major [1, T, heads, dim] buffer (seen by the call as [1, heads, T, dim]), so
  the o projection reads [T, heads·dim] as it lies (torch's SDPA output is token-major in memory too);
- at decode the KV cache holds whole qkv rows, position-major ([kv_len, batch, (heads + 2 kv_heads)·dim]), and the
  qkv projection writes the new token's row into it: the cache append costs no copy, and decode attention reads the
  k and v columns as [batch, kv_heads, kv_len, dim] views. Every sequence is kv_len long, the new token included
  (the key's kv_len); the positions before it hold seeded random keys and values.
The torch layer (`PEER_LAYER`) is the same data flow written for torch eager (HF's RMSNorm, SDPA with
enable_gqa, `torch.mm` with the same out= at decode), on the same inputs (written as .npy files, read there).

Dimensions come from the workload file (`--workload`, read by nbxcert's loader); the rope base and the norm epsilon,
which workload files do not state, from `MODEL_CONSTANTS` (or --rope-base / --norm-eps). Points: `--points`
(default prefill:512, prefill:4096 and decode:1, 16, 64 at `--kv-len` 4096; a workload whose phases are lists, such
as `demo`, defaults to its own prefill_tokens and decode_batch x kv_lens). Inputs are seeded random (never zeros).

Checks: both layers' outputs (the down projection and the residual stream) against the float64 reference of the
same data flow (`nbxcert.oracles.model`): elementwise, `|out - ref| <= tol · scale + half an ulp` with the dtype's
tolerance from the device file and the last op's error scale, and the relative norm error ||out - ref|| / ||ref||
against NORM_UNITS tolerances; and nbxcert's output against torch's (relative norm difference).

Timing, the same method on both sides, in the same run (`time_layer`, whose source the peer runs too): per op, host
time is the wall time the call takes to return (perf_counter around it, the GPU not waited for; the mean over the
iterations) and GPU time the CUDA events recorded between consecutive ops (the median); before each timed iteration
a spin of about twice the instrumented layer's host time is queued (`spin.spin_body` on nbxcert's side,
`torch.cuda._sleep` on torch's, each calibrated in microseconds), so the GPU runs the layer's ops back to back and
an event time is the device's alone, never a wait for the host. Per layer: wall time per iteration of
`--batch` iterations synchronised at the end of each batch (what the application sees; the median over batches),
and the sum of the per-op GPU times. Ratios are torch time / nbxcert time (>= 1.0: nbxcert is faster).
Targets (reported as met or not, never enforced by the exit code): the layer's wall time at least LAYER_TARGET x
torch eager at every point, every op's GPU time at least OP_TARGET x. Serving is certified-only
(`NBXCERT_CERTIFIED_ONLY=1`, set before the first launch) unless --allow-uncertified.

On the interpreter (no GPU) only the check runs: no timing and no peer.

    python3 benchmarks/bench_model.py --graphs --out DIR       # decode steps as CUDA graphs: DIR/graphs.json, .md

`--graphs` times decode steps (default decode:1, 16, 64 at --kv-len 4096; float16 unless --dtypes), eager and
replayed as CUDA graphs, on both sides in the same run: the one-layer step (`nbx_layer`) and the whole decode step of
the workload's `layers` (DEFAULT_LAYERS when the file states none; llama-3-8b: 32), each layer's output and residual
stream the next layer's input (`nbx_decode_step`; the next layer adds and normalises them with one add_rmsnorm in place
of the embedding). All the layers of that step SHARE ONE LAYER'S WEIGHTS AND ONE KV CACHE: the same launches and the
same work per layer as distinct layers, in the memory of one (a cache of whole qkv rows at batch 64 and kv_len 4096 is
3.2 GB a layer: 32 of them and the capture's copy of them do not fit an H200). nbxcert's graphs are
`nbxcert.graphs.capture` of the step over the point's inputs (the KV cache it writes is restored for the capture's
check); torch's (`PEER_GRAPHS_MAIN`, its own process) `torch.cuda.CUDAGraph` by torch's recipe: warm-up iterations on
a side stream, `with torch.cuda.graph(g)`, then `g.replay()`. Both sides time every step with `time_step`: wall time
per step over batches of --batch steps synchronised at the end (median), host time per call (perf_counter around the
call, made with the device idle, the GPU not waited for; mean) -- a replay's host time is `g.replay()`'s. Checks: the
capture's own (the first replay byte-equal to an eager run, else `GraphRefused`, recorded), the graph's outputs
byte-equal to the eager step's again after the timed replays, and each step's output against torch's eager one
(relative norm difference, as above; recorded, not judged: no bound is derived for 32 chained layers, and a wrong data
flow differs by the size of the output). Targets (reported as met or not, never enforced by the exit code): nbxcert's
graph >= GRAPH_TARGET x torch's graph in wall time per step, nbxcert's host time <= REPLAY_HOST_TARGET_US per replay.
On any backend but cuda, --graphs refuses with one line and exit code 1.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' common helpers
import common  # noqa: E402
import spin  # noqa: E402

OPS = ("embedding", "input_norm", "qkv", "rope", "attention", "o_proj", "add_norm", "gate_up", "silu_and_mul", "down")
DEFAULT_POINTS = "prefill:512,prefill:4096,decode:1,decode:16,decode:64"
DEFAULT_KV_LEN = 4096
LAYER_TARGET = 1.0
OP_TARGET = 0.95
# The relative norm error a layer output may have, in tolerances of its dtype (one epsilon each): about ten roundings
# to the dtype lie on the path from the embedding to the output, each at most half an epsilon and independent, so a
# correct layer sits near one or two; a skipped op or a wrong weight is of the size of the output.
NORM_UNITS = 8.0
# What workload files do not state, from each model's published config (HF config.json: rope_theta, rms_norm_eps).
MODEL_CONSTANTS = {
    "llama-3-8b": {"rope_base": 500000.0, "norm_eps": 1e-5},
    "tinyllama-1.1b": {"rope_base": 10000.0, "norm_eps": 1e-5},
    "mistral-7b": {"rope_base": 1000000.0, "norm_eps": 1e-5},
    "qwen2.5-7b": {"rope_base": 1000000.0, "norm_eps": 1e-6},
}
DEFAULT_CONSTANTS = {"rope_base": 10000.0, "norm_eps": 1e-6}  # the rope and rmsnorm kernels' own defaults
INTERPRETER_MAX_WEIGHTS = 1 << 20  # hidden x intermediate above which the interpreter would take hours: refused
# --graphs
DEFAULT_GRAPH_POINTS = "decode:1,decode:16,decode:64"
DEFAULT_LAYERS = 32  # llama-3-8b's num_hidden_layers: the step's depth when a workload file states no `layers`
GRAPH_TARGET = 1.0  # nbxcert's graph against torch's CUDA graph, wall time per step
REPLAY_HOST_TARGET_US = 50.0  # nbxcert's host time per replayed step
SHARED_NOTE = (
    "The {layers}-layer step runs all {layers} layers on ONE layer's weights and ONE KV cache, each layer's output "
    "and residual the next layer's input: the same launches and the same work per layer as {layers} distinct layers, "
    "in the memory of one (one layer's cache of whole qkv rows at {largest} is {gb:.1f} GB)."
)


@dataclass(frozen=True)
class Model:
    """The layer's dimensions (from the workload file) and the two constants workload files leave out."""

    name: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    rope: str
    rope_base: float
    eps: float  # as the kernels use it: float32(eps)

    @property
    def qkv_width(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim


@dataclass(frozen=True)
class Point:
    """A prefill of `tokens` tokens (one sequence), or a decode step of `tokens` sequences, each `kv_len` long."""

    phase: str
    tokens: int
    kv_len: int = 0

    @property
    def label(self) -> str:
        return f"prefill:{self.tokens}" if self.phase == "prefill" else f"decode:{self.tokens}@{self.kv_len}"


def model_of(workload, rope_base: float | None = None, norm_eps: float | None = None) -> Model:
    """The layer of a decoder workload (`nbxcert.workload.Workload`); refuses what this layer does not build."""
    m = workload.model
    if workload.kind != "decoder" or "experts" in m or m.get("qk_norm") or m.get("qkv_bias"):
        raise SystemExit(f"bench_model: workload {workload.name} is not a dense decoder without qkv bias or qk norm")
    if m["norm"] != "rmsnorm" or m["activation"] != "silu":
        raise SystemExit(f"bench_model: workload {workload.name} uses {m['norm']}/{m['activation']}, not rmsnorm/silu")
    constants = MODEL_CONSTANTS.get(workload.name, DEFAULT_CONSTANTS)
    base = constants["rope_base"] if rope_base is None else rope_base
    eps = constants["norm_eps"] if norm_eps is None else norm_eps
    return Model(
        workload.name,
        m["hidden"],
        m["intermediate"],
        m["heads"],
        m["kv_heads"],
        m["head_dim"],
        m["vocab"],
        m["rope"],
        float(base),
        float(np.float32(eps)),
    )


def parse_points(text: str, kv_len: int) -> list[Point]:
    """`prefill:T`, `decode:B` (at kv_len) or `decode:B@KV`, comma-separated."""
    points = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        phase, _, size = item.partition(":")
        size, _, kv = size.partition("@")
        try:
            tokens, kv = int(size), int(kv) if kv else kv_len
        except ValueError:
            raise SystemExit(f"bench_model: point {item!r} is not prefill:T, decode:B or decode:B@KV") from None
        if phase not in ("prefill", "decode") or tokens < 1 or (phase == "decode" and kv < 2):
            raise SystemExit(f"bench_model: point {item!r} is not prefill:T, decode:B or decode:B@KV (KV >= 2)")
        points.append(Point(phase, tokens, kv if phase == "decode" else 0))
    return points


def workload_points(workload) -> list[Point] | None:
    """The points of a workload whose phases are lists (its own prefill sizes, decode batches x KV lengths); None
    when they are ladder ranges (the defaults apply)."""
    ph = workload.phases
    if not all(isinstance(ph[k], list) for k in ("prefill_tokens", "decode_batch", "kv_lens")):
        return None
    return [Point("prefill", t) for t in ph["prefill_tokens"]] + [
        Point("decode", b, kv) for b in ph["decode_batch"] for kv in ph["kv_lens"] if kv >= 2
    ]


# --- inputs (host storage arrays: float16 values, bfloat16 bits) ---------------------------------------------------
def _stored(values: np.ndarray, dtype: str) -> np.ndarray:
    from nbxcert.kernels.dtypes import encode, get_dtype

    return encode(values, get_dtype(dtype))


def _decoded(storage: np.ndarray, dtype: str) -> np.ndarray:
    from nbxcert.kernels.dtypes import decode, get_dtype

    return decode(storage, get_dtype(dtype))


def rope_cache(head_dim: int, max_position: int, base: float) -> np.ndarray:
    """The cos/sin cache the rope kernel reads, [max_position, head_dim] float32: frequency i is
    base^(-2i / head_dim), cos in the first half of a row, sin in the second."""
    inv_freq = base ** (-np.arange(0, head_dim, 2) / head_dim)
    angles = np.arange(max_position)[:, None] * inv_freq[None, :]
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)


def make_weights(model: Model, dtype: str, seed: int) -> dict[str, np.ndarray]:
    """Seeded random weights as storage arrays of `dtype`, products [out, in] with entries of standard deviation
    1/sqrt(in) (activations stay of order one through the layer), norm weights 1 + 0.1 N(0, 1), the embedding
    N(0, 1). The same seed gives the same values in every dtype (rounded to each)."""
    gen = np.random.default_rng(seed)
    h, inter, w = model.hidden, model.intermediate, model.qkv_width

    def normal(shape, std=1.0, mean=0.0):
        return _stored(gen.standard_normal(shape, dtype=np.float32) * np.float32(std) + np.float32(mean), dtype)

    return {
        "embed": normal((model.vocab, h)),
        "input_norm": normal((h,), 0.1, 1.0),
        "qkv": normal((w, h), 1 / math.sqrt(h)),
        "o": normal((h, model.heads * model.head_dim), 1 / math.sqrt(model.heads * model.head_dim)),
        "post_norm": normal((h,), 0.1, 1.0),
        "gate_up": normal((2 * inter, h), 1 / math.sqrt(h)),
        "down": normal((h, inter), 1 / math.sqrt(inter)),
    }


def make_inputs(model: Model, point: Point, dtype: str, seed: int) -> dict[str, np.ndarray]:
    """ids (random, int32) and positions (int32) of a point; at decode also `kv`, the cache's k and v columns
    [kv_len, batch, 2 kv_heads dim] as storage (seeded random; the last position is the new token's and is
    written by the layer)."""
    gen = np.random.default_rng(seed)
    n = point.tokens
    inputs = {"ids": gen.integers(0, model.vocab, n).astype(np.int32)}
    if point.phase == "prefill":
        inputs["positions"] = np.arange(n, dtype=np.int32)
        return inputs
    inputs["positions"] = np.full(n, point.kv_len - 1, dtype=np.int32)
    kv_cols = 2 * model.kv_heads * model.head_dim
    inputs["kv"] = _stored(gen.standard_normal((point.kv_len, n, kv_cols), dtype=np.float32), dtype)
    return inputs


def max_position(points: list[Point]) -> int:
    return max(p.tokens if p.phase == "prefill" else p.kv_len for p in points)


# --- the layer, in nbxcert --------------------------------------------------------------------------------------------
def call(name: str, fn, *args, **kwargs):
    """How the layer calls an op: plainly (the timing harness passes its own, which times each op)."""
    return fn(*args, **kwargs)


def prefill_attention(q, k, v):
    """Causal flash attention of q [T, heads, dim] and k, v [T, kv_heads, dim] (views of the qkv projection) into a
    token-major buffer: returns [T, heads·dim], as the o projection reads it."""
    from nbxcert.kernels.attention import flash_attention
    from nbxcert.kernels.tensor import empty

    t, heads, d = q.shape
    out = empty((1, t, heads, d), q.dtype, q.device)
    flash_attention(*(x.unsqueeze(0).permute(0, 2, 1, 3) for x in (q, k, v)), out=out.permute(0, 2, 1, 3), causal=True)
    return out.view(t, heads * d)


def nbx_layer(weights: dict, inputs: dict, phase: str, run=call, prev=None):
    """One decoder layer of served nbxcert calls; returns (output, residual stream), each [tokens, hidden].

    weights: device tensors `embed`, `input_norm`, `qkv`, `o`, `post_norm`, `gate_up`, `down` ([out, in]),
    `cos_sin` (float32) and `model` (a `Model`). inputs: `ids`, `positions`; at decode also `slot` (the new token's
    qkv row of the cache), `k_cache`, `v_cache` ([batch, kv_heads, kv_len, dim] views of the cache), `lengths` and
    `max_len`. `run(name, fn, *args, **kwargs)` makes each call (`call`: plainly). `prev`: the (output, residual
    stream) of the layer before, for a layer after the first: its input is then their sum, added and normalised by one
    add_rmsnorm (`input_add_norm`, the residual add serving engines fuse into the next layer's norm) in place of the
    embedding and rmsnorm; None (the default): the first layer, from the ids."""
    from nbxcert.kernels.attention import decode_attention
    from nbxcert.kernels.elementwise import embedding, rope, silu_and_mul
    from nbxcert.kernels.matmul import matmul
    from nbxcert.kernels.rows import add_rmsnorm, rmsnorm

    m = weights["model"]
    nh, nkv, d = m.heads, m.kv_heads, m.head_dim
    if prev is None:
        x = run("embedding", embedding, weights["embed"], inputs["ids"])
        h = run("input_norm", rmsnorm, x, weights["input_norm"], m.eps)
    else:
        x, h = run("input_add_norm", add_rmsnorm, prev[0], prev[1], weights["input_norm"], m.eps)
    if phase == "prefill":
        qkv = run("qkv", matmul, h, weights["qkv"].T)
    else:
        qkv = run("qkv", matmul, h, weights["qkv"].T, out=inputs["slot"])  # the new token's row of the cache
    t = qkv.shape[0]
    q = qkv[:, : nh * d].view(t, nh, d)
    k = qkv[:, nh * d : (nh + nkv) * d].view(t, nkv, d)
    run("rope", rope, q, k, inputs["positions"], weights["cos_sin"], style=m.rope)
    if phase == "prefill":
        a = run("attention", prefill_attention, q, k, qkv[:, (nh + nkv) * d :].view(t, nkv, d))
    else:
        a = run(
            "attention",
            decode_attention,
            q,
            inputs["k_cache"],
            inputs["v_cache"],
            inputs["lengths"],
            max_len=inputs["max_len"],
        ).view(t, nh * d)
    o = run("o_proj", matmul, a, weights["o"].T)
    residual, h2 = run("add_norm", add_rmsnorm, o, x, weights["post_norm"], m.eps)
    gu = run("gate_up", matmul, h2, weights["gate_up"].T)
    y = run("silu_and_mul", silu_and_mul, gu)
    out = run("down", matmul, y, weights["down"].T)
    return out, residual


def nbx_decode_step(weights: dict, inputs: dict, layers: int):
    """A decode step of `layers` layers, each layer's (output, residual) the next one's `prev`; returns the last
    layer's. Every layer runs on the same `weights` and the same KV cache (`inputs`): the same launches and the same
    work as `layers` distinct layers, in the memory of one (32 distinct caches of whole qkv rows at batch 64 and kv_len
    4096 would take 3.2 GB each, before the graph capture's copy of its inputs)."""
    prev = nbx_layer(weights, inputs, "decode")
    for _ in range(layers - 1):
        prev = nbx_layer(weights, inputs, "decode", prev=prev)
    return prev


def device_weights(model: Model, host: dict, cos_sin: np.ndarray, dtype: str, device: str) -> dict:
    from nbxcert.kernels.tensor import from_bits, from_numpy

    weights = {name: from_bits(bits, dtype, device) for name, bits in host.items()}
    weights["cos_sin"] = from_numpy(cos_sin, "float32", device)
    weights["model"] = model
    return weights


def device_inputs(model: Model, point: Point, host: dict, dtype: str, device: str) -> dict:
    """The point's inputs on the device; at decode the cache of whole qkv rows (q columns of past positions unused,
    zero) with the k and v columns written, and its views."""
    from nbxcert.kernels.dtypes import get_dtype
    from nbxcert.kernels.tensor import from_bits, from_numpy

    inputs = {
        "ids": from_numpy(host["ids"], "int32", device),
        "positions": from_numpy(host["positions"], "int32", device),
    }
    if point.phase == "decode":
        nh, nkv, d, length, b = model.heads, model.kv_heads, model.head_dim, point.kv_len, point.tokens
        rows = np.zeros((length, b, model.qkv_width), dtype=get_dtype(dtype).storage)
        rows[:, :, nh * d :] = host["kv"]
        cache = from_bits(rows, dtype, device)
        del rows
        inputs["slot"] = cache[length - 1]
        for name, lo in (("k_cache", nh * d), ("v_cache", (nh + nkv) * d)):
            inputs[name] = cache[:, :, lo : lo + nkv * d].view(length, b, nkv, d).permute(1, 2, 0, 3)
        inputs["lengths"] = from_numpy(np.full(b, length, dtype=np.int32), "int32", device)
        inputs["max_len"] = length
    return inputs


# --- the float64 reference and the checks -----------------------------------------------------------------------------
class _Rows:
    """Rows of a storage array as float64 on indexing (a vocabulary-sized table is never widened whole)."""

    def __init__(self, storage: np.ndarray, dtype: str):
        self.storage, self.dtype = storage, dtype

    def __getitem__(self, index):
        return _decoded(self.storage[index], self.dtype)


def reference(
    model: Model,
    host_weights: dict,
    cos_sin: np.ndarray,
    point: Point,
    host_inputs: dict,
    dtype: str,
    last: int | None = None,
) -> dict:
    """The float64 reference of the point (`nbxcert.oracles.model.decoder_layer`): {"out": (ref, scale),
    "residual": (ref, scale)}."""
    from nbxcert.kernels.dtypes import finfo, get_dtype
    from nbxcert.oracles.model import decoder_layer

    weights = {
        name: (_Rows(bits, dtype) if name == "embed" else _decoded(bits, dtype)) for name, bits in host_weights.items()
    }
    past = None
    if point.phase == "decode":
        kv, nkv, d, length = host_inputs["kv"], model.kv_heads, model.head_dim, point.kv_len

        def past(b):
            cols = _decoded(kv[: length - 1, b], dtype).reshape(length - 1, 2, nkv, d)
            return cols[:, 0].transpose(1, 0, 2), cols[:, 1].transpose(1, 0, 2)

    return decoder_layer(
        weights,
        host_inputs["ids"],
        host_inputs["positions"],
        cos_sin,
        heads=model.heads,
        kv_heads=model.kv_heads,
        head_dim=model.head_dim,
        eps=model.eps,
        style=model.rope,
        out_eps=finfo(get_dtype(dtype))["eps"],
        past=past,
        last=last,
    )


def judge(got: np.ndarray, expected: tuple[np.ndarray, np.ndarray], dtype: str, tol: float, what: str) -> dict:
    """`got` (float64 values of an output) against the reference: the elementwise rule (`compare`, the dtype's
    tolerance) and the relative norm error against NORM_UNITS tolerances. ok when both hold."""
    from nbxcert.kernels.compare import compare
    from nbxcert.kernels.dtypes import get_dtype

    ref, scale = expected
    got = np.asarray(got, dtype=np.float64)[-ref.shape[0] :]  # the rows the reference judges (prefill: the last)
    verdict = compare(got, ref, scale, get_dtype(dtype), tol, what)
    with np.errstate(invalid="ignore"):
        rel = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), np.finfo(np.float64).tiny))
    rel = rel if math.isfinite(rel) else math.inf
    bound = NORM_UNITS * tol
    return {
        "ok": bool(verdict.ok and rel <= bound),
        "elementwise_ok": bool(verdict.ok),
        "rel_norm_error": rel,
        "rel_norm_bound": bound,
        "max_abs": verdict.max_abs,
        "max_scaled": verdict.max_scaled,
        "mismatched": verdict.n_mismatched,
        "total": verdict.n_total,
        "tolerance": tol,
        "report": "" if verdict.ok else verdict.report,
    }


def check_outputs(outputs: dict[str, np.ndarray], ref: dict, dtype: str, tol: float, what: str) -> dict:
    """Both outputs (`out`, `residual`, float64 values) judged; ok when both are."""
    checks = {name: judge(outputs[name], ref[name], dtype, tol, f"{what} {name}") for name in ("out", "residual")}
    return {"ok": all(c["ok"] for c in checks.values()), **checks}


def difference(a: np.ndarray, b: np.ndarray) -> dict:
    """||a - b|| / ||b|| and max |a - b| of two layers' outputs."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        rel = float(np.linalg.norm(a - b) / max(np.linalg.norm(b), np.finfo(np.float64).tiny))
    return {"rel_norm": rel, "max_abs": float(np.nanmax(np.abs(a - b))) if a.size else 0.0}


# --- timing (the same source runs in the torch peer) ---------------------------------------------------------------
def wall_times(call, args: tuple, sync, iters: int, batch: int) -> list[float]:
    """Wall microseconds per call of `call(*args)`, made `iters` times in batches of `batch` (the last one shorter):
    each batch's calls back to back, `sync()` at its end. Self-contained: the torch peers run this function's source
    beside `time_layer`'s and `time_step`'s."""
    import time

    walls = []
    done = 0
    while done < iters:
        n = min(batch, iters - done)
        t0 = time.perf_counter()
        for _ in range(n):
            call(*args)
        sync()
        walls.append((time.perf_counter() - t0) / n * 1e6)
        done += n
    return walls


def time_layer(layer, clock, ops, warmup: int, iters: int, batch: int) -> dict:
    """Per-op host and GPU times and per-layer wall time of `layer(run)` (a layer calling the ops named `ops`, in
    order, each through `run(name, fn, *args, **kwargs)`), through `clock`: `event()`, `record(event)`,
    `elapsed(a, b)` (ms), `sync()` and `delay(us)` (a spin queued on the GPU). Self-contained: the torch peer runs
    this function's source.

    Per op: host = perf_counter around the call (mean over `iters`), GPU = the events recorded before the first op
    and after each op (median). Each instrumented iteration is preceded by a delay of twice the instrumented layer's
    host time, so the GPU runs its ops back to back. Layer: wall time of `batch` plain iterations synchronised at the
    end (median over the batches, per iteration) and the sum of the per-op GPU medians."""
    import statistics
    import time

    def plain(name, fn, *args, **kwargs):
        return fn(*args, **kwargs)

    for _ in range(max(1, warmup)):
        layer(plain)
    clock.sync()
    names: list = []
    batch = max(1, min(batch, iters))
    marks = [[clock.event() for _ in range(len(ops) + 1)] for _ in range(batch)]
    host = {}

    def instrumented(events):
        index = [0]

        def run(name, fn, *args, **kwargs):
            i = index[0]
            if i == 0:
                clock.record(events[0])
            t0 = time.perf_counter()
            result = fn(*args, **kwargs)
            host.setdefault(name, []).append(time.perf_counter() - t0)
            clock.record(events[i + 1])
            index[0] = i + 1
            names.append(name)
            return result

        return run

    t0 = time.perf_counter()
    layer(instrumented(marks[0]))
    host_s = time.perf_counter() - t0  # the instrumented layer's host time, the GPU not waited for
    clock.sync()
    delay_us = max(100.0, 2e6 * host_s)
    order = list(names)
    if order != list(ops):
        raise RuntimeError(f"the layer called {order}, not the ops {list(ops)}")
    host.clear()
    gpu = {name: [] for name in order}
    done = 0
    while done < iters:
        n = min(batch, iters - done)
        for it in range(n):
            names.clear()
            clock.delay(delay_us)
            layer(instrumented(marks[it]))
            if names != order:
                raise RuntimeError(f"an iteration called {names}, not {order}")
        clock.sync()
        for it in range(n):
            for i, name in enumerate(order):
                gpu[name].append(clock.elapsed(marks[it][i], marks[it][i + 1]))
        done += n
    walls = wall_times(layer, (plain,), clock.sync, iters, batch)
    per_op = {
        name: {
            "host_us": statistics.mean(host[name]) * 1e6,
            "host_us_median": statistics.median(host[name]) * 1e6,
            "gpu_us": statistics.median(gpu[name]) * 1e3,
            "gpu_us_mean": statistics.mean(gpu[name]) * 1e3,
        }
        for name in order
    }
    layer_times = {
        "wall_us": statistics.median(walls),
        "wall_us_batches": walls,
        "gpu_sum_us": sum(o["gpu_us"] for o in per_op.values()),
        "host_sum_us": sum(o["host_us"] for o in per_op.values()),
    }
    return {"ops": per_op, "layer": layer_times, "delay_us": delay_us, "iters": iters, "batch": batch, "warmup": warmup}


def time_step(step, sync, warmup: int, iters: int, batch: int) -> dict:
    """Host and wall time of `step()` (a decode step made of eager calls, or one graph replay), `sync()` waiting for
    the device. Self-contained: the torch peer runs this function's source.

    Host: perf_counter around each of `iters` calls, each made with the device idle (synchronised before it), so a
    call's time is its own (its launches queued, the GPU not waited for), never a wait on a full launch queue (the
    mean). Wall: `batch` calls synchronised at the end (per call, what the application sees; the median over the
    batches)."""
    import statistics
    import time

    for _ in range(max(1, warmup)):
        step()
    sync()
    host = []
    for _ in range(iters):
        sync()
        t0 = time.perf_counter()
        step()
        host.append(time.perf_counter() - t0)
    sync()
    batch = max(1, min(batch, iters))
    walls = wall_times(step, (), sync, iters, batch)
    return {
        "wall_us": statistics.median(walls),
        "wall_us_batches": walls,
        "host_us": statistics.mean(host) * 1e6,
        "host_us_median": statistics.median(host) * 1e6,
        "iters": iters,
        "batch": batch,
        "warmup": warmup,
    }


SPIN_CALIBRATION = (1 << 16, 1 << 18)  # the spin's steps timed to find its steps per microsecond


class NbxClock:
    """`time_layer`'s clock on nbxcert's side: cuda events on the stream Triton launches on, and a spin kernel
    calibrated to microseconds."""

    def __init__(self, device: str):
        from nbxcert.kernels.backends import cuda, triton_cuda
        from nbxcert.kernels.jit import jit
        from nbxcert.kernels.tensor import empty

        self._cuda, self._stream = cuda, triton_cuda.current_stream()
        self._spin = jit(spin.spin_body)
        self._out = empty((1,), "float32", device)
        self._launch(SPIN_CALIBRATION[0])  # compiled here, not inside a timing
        self.sync()
        # the slope between two lengths: the launch's own latency, in both, cancels
        short, long = (self._timed(steps) for steps in SPIN_CALIBRATION)
        self.steps_per_us = (SPIN_CALIBRATION[1] - SPIN_CALIBRATION[0]) / max((long - short) * 1e3, 1e-3)

    def _launch(self, steps: int) -> None:
        # a multiple of 16 always: Triton specialises an int argument on its divisibility by 16 (and on 1), so one
        # compiled spin serves every delay
        self._spin[(1,)](self._out, max(16, -(-int(steps) // 16) * 16), num_warps=1)

    def _timed(self, steps: int) -> float:
        start, end = self.event(), self.event()
        self.record(start)
        self._launch(steps)
        self.record(end)
        self.sync()
        return self.elapsed(start, end)

    def event(self):
        return self._cuda.Event()

    def record(self, event) -> None:
        event.record(self._stream)

    def elapsed(self, start, end) -> float:
        return self._cuda.Event.elapsed_ms(start, end)

    def sync(self) -> None:
        self._cuda.synchronize()

    def delay(self, us: float) -> None:
        self._launch(us * self.steps_per_us)


# --- the torch peer ---------------------------------------------------------------------------------------------------
# The torch layer, run with `python3 -c` in its own process (nbxcert never imports torch). argv[1]: JSON with the
# exchange folder, the model, the dtype, the points and the timing counts. Reads the inputs nbxcert's side wrote there
# (w_<name>.npy, cos_sin.npy, <point>_ids.npy, <point>_positions.npy, <point>_kv.npy; bfloat16 as uint16 bits),
# writes each point's outputs (<point>_out.npy, <point>_residual.npy, the same storage) and prints one JSON line.
# `time_layer`'s source is put before it (`peer_script()`). PEER_TORCH (the torch layer) is shared with --graphs' peer
# (`graphs_peer_script()`), whose main is PEER_GRAPHS_MAIN.
PEER_TORCH = (
    r"""
import json, os, sys
import numpy as np
import torch
import torch.nn.functional as F

args = json.loads(sys.argv[1])
m = args["model"]
H, I, NH, NKV, D = m["hidden"], m["intermediate"], m["heads"], m["kv_heads"], m["head_dim"]
EPS, HALF = m["eps"], m["head_dim"] // 2
DTYPE = getattr(torch, args["dtype"])
FOLDER = args["dir"]


def load(name):
    a = np.load(os.path.join(FOLDER, name + ".npy"))
    if a.dtype == np.uint16:  # bfloat16 bits
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).cuda()
    return torch.from_numpy(a).cuda()


def save(name, t):
    t = t.detach().cpu()
    a = t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()
    np.save(os.path.join(FOLDER, name + ".npy"), a)
"""
    + common.TORCH_SDPA
    + r"""


def rmsnorm(x, w):  # transformers' LlamaRMSNorm
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return w * xf.to(x.dtype)


def add_rmsnorm(x, residual, w):
    s = x + residual
    return s, rmsnorm(s, w)


def rope(q, k, positions, cos_sin):  # neox pairs (i, i + dim/2), in float32, written back in place
    cos, sin = cos_sin.index_select(0, positions).chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    for x in (q, k):
        x1, x2 = x[..., :HALF].float(), x[..., HALF:].float()
        x.copy_(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1))
    return q, k


def prefill_attention(q, k, v):  # [T, heads, dim] views of qkv -> [T, heads * dim]
    out = sdpa(*(x.transpose(0, 1).unsqueeze(0) for x in (q, k, v)), True)
    return out.transpose(1, 2).reshape(q.shape[0], NH * D)


def decode_attention(q, k_cache, v_cache):  # q [B, heads, dim]; caches [B, kv_heads, kv_len, dim]
    return sdpa(q.unsqueeze(2), k_cache, v_cache, False).reshape(q.shape[0], NH * D)


def silu_and_mul(x):
    return F.silu(x[:, :I]) * x[:, I:]


def torch_layer(w, inp, phase, run, prev=None):
    if prev is None:
        x = run("embedding", F.embedding, inp["ids"], w["embed"])
        h = run("input_norm", rmsnorm, x, w["input_norm"])
    else:  # a later layer: the layer before's output added to its residual stream, then normed (as nbx_layer)
        x, h = run("input_add_norm", add_rmsnorm, prev[0], prev[1], w["input_norm"])
    if phase == "prefill":
        qkv = run("qkv", torch.mm, h, w["qkv"].t())
    else:
        qkv = run("qkv", torch.mm, h, w["qkv"].t(), out=inp["slot"])
    t = qkv.shape[0]
    q, k = qkv[:, : NH * D].view(t, NH, D), qkv[:, NH * D : (NH + NKV) * D].view(t, NKV, D)
    run("rope", rope, q, k, inp["positions"], w["cos_sin"])
    if phase == "prefill":
        a = run("attention", prefill_attention, q, k, qkv[:, (NH + NKV) * D :].view(t, NKV, D))
    else:
        a = run("attention", decode_attention, q, inp["k_cache"], inp["v_cache"])
    o = run("o_proj", torch.mm, a, w["o"].t())
    residual, h2 = run("add_norm", add_rmsnorm, o, x, w["post_norm"])
    gu = run("gate_up", torch.mm, h2, w["gate_up"].t())
    y = run("silu_and_mul", silu_and_mul, gu)
    out = run("down", torch.mm, y, w["down"].t())
    return out, residual


def plain(name, fn, *a, **k):
    return fn(*a, **k)


def load_weights():
    names = ("embed", "input_norm", "qkv", "o", "post_norm", "gate_up", "down")
    weights = {name: load("w_" + name) for name in names}
    weights["cos_sin"] = load("cos_sin")
    return weights


def load_inputs(point):
    stem = point["stem"]
    inp = {"ids": load(stem + "_ids").long(), "positions": load(stem + "_positions").long()}
    if point["phase"] == "decode":
        length, b = point["kv_len"], point["tokens"]
        cache = torch.zeros((length, b, (NH + 2 * NKV) * D), dtype=DTYPE, device="cuda")
        cache[:, :, NH * D :] = load(stem + "_kv")
        inp["slot"] = cache[length - 1]
        inp["k_cache"] = cache[:, :, NH * D : (NH + NKV) * D].view(length, b, NKV, D).permute(1, 2, 0, 3)
        inp["v_cache"] = cache[:, :, (NH + NKV) * D :].view(length, b, NKV, D).permute(1, 2, 0, 3)
    return inp


def versions():
    return {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "enable_gqa": GQA,
            "fp16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
            "sdp_enabled": {n: getattr(torch.backends.cuda, n + "_sdp_enabled", lambda: None)()
                            for n in ("flash", "mem_efficient", "cudnn", "math")}}
"""
)
PEER_LAYER_MAIN = r"""
# class Clock: common.TORCH_CLOCK, put before this script


with torch.inference_mode():
    weights = load_weights()
    clock = Clock()
    result = dict(versions(), sleep_cycles_per_us=clock.cycles_per_us, points={})
    for point in args["points"]:
        label, phase = point["label"], point["phase"]
        stem = point["stem"]
        inp = load_inputs(point)
        out, residual = torch_layer(weights, inp, phase, plain)
        torch.cuda.synchronize()
        save(stem + "_out", out)
        save(stem + "_residual", residual)
        del out, residual
        layer = lambda run, inp=inp, phase=phase: torch_layer(weights, inp, phase, run)
        result["points"][label] = time_layer(layer, clock, OPS, args["warmup"], args["iters"], args["batch"])
        del inp, layer
        torch.cuda.empty_cache()
print(json.dumps(result))
"""


# --graphs' torch peer: per decode point the one-layer step and the `layers`-layer step (every layer on the same
# weights and cache, as `nbx_decode_step`), each eager and as a torch.cuda.CUDAGraph made by torch's recipe (warm-up
# iterations on a side stream, then `with torch.cuda.graph(g)`), timed by `time_step`. Writes each step's eager
# outputs (<point>_out.npy, <point>_residual.npy; <point>_model_out.npy, <point>_model_residual.npy) and prints one
# JSON line.
PEER_GRAPHS_MAIN = r"""
GRAPH_WARMUP = 3  # the eager iterations on a side stream before capture in torch's CUDA graphs recipe (its docs)
LAYERS = args["layers"]
TIMING = (torch.cuda.synchronize, args["warmup"], args["iters"], args["batch"])


def decode_step(inp):
    prev = torch_layer(weights, inp, "decode", plain)
    for _ in range(LAYERS - 1):
        prev = torch_layer(weights, inp, "decode", plain, prev)
    return prev


def cuda_graph(step):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(GRAPH_WARMUP):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    return graph, outputs


def eager_and_graph(step, save_as):
    eager = step()
    torch.cuda.synchronize()
    for name, t in zip(("out", "residual"), eager):
        save(save_as + "_" + name, t)
    times = {"eager": time_step(step, *TIMING)}
    graph, outputs = cuda_graph(step)
    graph.replay()
    torch.cuda.synchronize()
    times["graph_equals_eager"] = all(bool(torch.equal(a, b)) for a, b in zip(outputs, eager))
    times["graph"] = time_step(graph.replay, *TIMING)
    del graph, outputs, eager
    return times


with torch.inference_mode():
    weights = load_weights()
    result = dict(versions(), layers=LAYERS, graph_warmup=GRAPH_WARMUP, points={})
    for point in args["points"]:
        inp = load_inputs(point)
        result["points"][point["label"]] = {
            "layer": eager_and_graph(lambda: torch_layer(weights, inp, "decode", plain), point["stem"]),
            "model": eager_and_graph(lambda: decode_step(inp), point["stem"] + "_model"),
        }
        del inp
        torch.cuda.empty_cache()
print(json.dumps(result))
"""


def peer_script() -> str:
    """The peer's source: the op names, `wall_times` and `time_layer` (the same timing as nbxcert's side), then the
    torch layer."""
    timing = inspect.getsource(wall_times) + "\n\n" + inspect.getsource(time_layer)
    return common.TORCH_CLOCK + f"OPS = {OPS!r}\n\n" + timing + PEER_TORCH + PEER_LAYER_MAIN


def graphs_peer_script() -> str:
    """--graphs' peer source: `wall_times` and `time_step` (the same timing as nbxcert's side), the torch layer, its
    graphs main."""
    return inspect.getsource(wall_times) + "\n\n" + inspect.getsource(time_step) + PEER_TORCH + PEER_GRAPHS_MAIN


def stem(point: Point) -> str:
    """A point's file stem in the exchange folder."""
    return point.label.replace(":", "_").replace("@", "_kv")


def write_exchange(folder: str, host_weights: dict, cos_sin: np.ndarray, points: list[Point], inputs: dict) -> None:
    """The inputs as .npy files for the peer (storage arrays as they are)."""
    for name, bits in host_weights.items():
        np.save(os.path.join(folder, f"w_{name}.npy"), bits)
    np.save(os.path.join(folder, "cos_sin.npy"), cos_sin)
    for point in points:
        for name, array in inputs[point.label].items():
            np.save(os.path.join(folder, f"{stem(point)}_{name}.npy"), array)


def run_peer(folder: str, model: Model, dtype: str, points: list[Point], args, script=None, **extra) -> dict:
    """torch's layer on the inputs in `folder` (`script`: the peer's source, default `peer_script()`; `extra`: more of
    its arguments): its JSON ({"error": ...} when the process fails)."""
    payload = {
        "dir": folder,
        "model": asdict(model),
        "dtype": dtype,
        "warmup": args.warmup,
        "iters": args.iters,
        "batch": args.batch,
        "points": [dict(asdict(p), label=p.label, stem=stem(p)) for p in points],
        **extra,
    }
    script = peer_script() if script is None else script
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script, json.dumps(payload)], capture_output=True, text=True, timeout=3600
        )
    except subprocess.TimeoutExpired:
        return {"error": "the torch peer ran past 3600 s"}
    return common.last_json(proc)


def peer_outputs(folder: str, point: Point, dtype: str, suffix: str = "") -> dict[str, np.ndarray] | None:
    """The peer's outputs of a point as float64 values (`suffix` "_model": --graphs' whole decode step's), or None
    when it wrote none."""
    found = {}
    for name in ("out", "residual"):
        path = os.path.join(folder, f"{stem(point)}{suffix}_{name}.npy")
        if not os.path.exists(path):
            return None
        found[name] = _decoded(np.load(path), dtype)
    return found


# --- ratios, targets, tables ------------------------------------------------------------------------------------------
def _ratio(peer: float | None, ours: float | None) -> float | None:
    return peer / ours if peer and ours else None


def compare_times(ours: dict, peer: dict | None) -> dict:
    """torch time / nbxcert time per op (GPU and host) and per layer (wall and GPU sum), and the targets: the layer's
    wall ratio >= LAYER_TARGET, every op's GPU ratio >= OP_TARGET (None where torch's side has no time)."""
    peer = peer or {}
    ops = {}
    for name, mine in ours["ops"].items():
        theirs = peer.get("ops", {}).get(name, {})
        gpu = _ratio(theirs.get("gpu_us"), mine["gpu_us"])
        ops[name] = {
            "gpu": gpu,
            "host": _ratio(theirs.get("host_us"), mine["host_us"]),
            "met": None if gpu is None else gpu >= OP_TARGET,
        }
    theirs = peer.get("layer", {})
    wall = _ratio(theirs.get("wall_us"), ours["layer"]["wall_us"])
    layer = {
        "wall": wall,
        "gpu_sum": _ratio(theirs.get("gpu_sum_us"), ours["layer"]["gpu_sum_us"]),
        "met": None if wall is None else wall >= LAYER_TARGET,
    }
    verdicts = [layer["met"]] + [o["met"] for o in ops.values()]
    met = None if any(v is None for v in verdicts) else all(verdicts)
    return {"ops": ops, "layer": layer, "targets_met": met}


def _f(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _met(value) -> str:
    return "-" if value is None else ("met" if value else "MISSED")


def op_table(entries: list[dict]) -> list[str]:
    """The markdown table of every op of every point: nbxcert's and torch's host and GPU times and the ratios."""
    lines = [
        "| dtype | point | op | nbx host us | nbx GPU us | torch host us | torch GPU us | GPU ratio | host ratio "
        "| target |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        if "nbxcert" not in e:
            continue
        ours, peer, ratios = e["nbxcert"], e.get("torch") or {}, e["ratios"]
        for name in ours["ops"]:
            mine, theirs, r = ours["ops"][name], peer.get("ops", {}).get(name, {}), ratios["ops"][name]
            lines.append(
                f"| {e['dtype']} | {e['point']} | {name} | {mine['host_us']:.1f} | {mine['gpu_us']:.1f} | "
                f"{_f(theirs.get('host_us'), '.1f')} | {_f(theirs.get('gpu_us'), '.1f')} | "
                f"{_f(r['gpu'], '.3f')} | {_f(r['host'], '.3f')} | {OP_TARGET} ({_met(r['met'])}) |"
            )
        mine, theirs, r = ours["layer"], peer.get("layer", {}), ratios["layer"]
        lines.append(
            f"| {e['dtype']} | {e['point']} | **layer** (wall; GPU sum) | {mine['wall_us']:.1f} | "
            f"{mine['gpu_sum_us']:.1f} | {_f(theirs.get('wall_us'), '.1f')} | "
            f"{_f(theirs.get('gpu_sum_us'), '.1f')} | {_f(r['gpu_sum'], '.3f')} | {_f(r['wall'], '.3f')} "
            f"(wall) | {LAYER_TARGET} ({_met(r['met'])}) |"
        )
    return lines


def summary_table(entries: list[dict]) -> list[str]:
    """One line per (dtype, point): the layer's wall times and ratio, its slowest op by GPU ratio, how many ops meet
    their target, and each layer's relative norm error against the float64 reference."""
    header = (
        f"{'dtype':<9} {'point':<15} {'nbx us':>9} {'torch us':>9} {'ratio':>6} {'layer':>6} {'ops met':>7} "
        f"{'slowest op':<20} {'nbx err':>9} {'torch err':>9}  check"
    )
    lines = [header, "-" * len(header)]
    for e in entries:
        nbx_check, peer_check = e["check"]["nbxcert"], e["check"].get("torch")
        err = _f(nbx_check["out"]["rel_norm_error"], ".2e")
        peer_err = _f(peer_check["out"]["rel_norm_error"], ".2e") if peer_check else "-"
        check = "ok" if nbx_check["ok"] else "FAILED"
        if "nbxcert" not in e:
            lines.append(
                f"{e['dtype']:<9} {e['point']:<15} {'-':>9} {'-':>9} {'-':>6} {'-':>6} {'-':>7} {'-':<20} "
                f"{err:>9} {peer_err:>9}  {check}"
            )
            continue
        r = e["ratios"]
        known = {n: o["gpu"] for n, o in r["ops"].items() if o["gpu"] is not None}
        slowest = min(known, key=known.get) if known else None
        slow = f"{slowest} {known[slowest]:.2f}" if slowest else "-"
        n_met = sum(1 for o in r["ops"].values() if o["met"])
        theirs = (e.get("torch") or {}).get("layer", {}).get("wall_us")
        lines.append(
            f"{e['dtype']:<9} {e['point']:<15} {e['nbxcert']['layer']['wall_us']:>9.1f} "
            f"{_f(theirs, '.1f'):>9} {_f(r['layer']['wall'], '.3f'):>6} {_met(r['layer']['met']):>6} "
            f"{n_met:>3}/{len(r['ops']):<3} {slow:<20} {err:>9} {peer_err:>9}  {check}"
        )
    return lines


def write_report(folder: str, stem: str, doc: dict, title: str, body) -> None:
    """`stem`.json (everything) and `stem`.md (`title`, the profile, serving and torch, then the lines `body()` makes)
    in `folder`. The JSON is written first: a fault in making the tables loses no measurement."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{stem}.json"), "w") as f:
        json.dump(doc, f, indent=1)
    md = [
        f"# {title}",
        "",
        f"Profile {doc['profile']}; serving {doc['serving']}; torch {doc.get('torch', {}).get('torch', '-')}.",
        "",
        *body(),
    ]
    with open(os.path.join(folder, f"{stem}.md"), "w") as f:
        f.write("\n".join(md))


def write_results(folder: str, doc: dict) -> None:
    """bench_model.json (everything) and bench_model.md (the tables) in `folder`."""

    def tables() -> list[str]:
        entries = doc["points"]
        md = [
            "Ratios are torch eager time / nbxcert time (>= 1.0: nbxcert faster). Targets: the layer's wall time "
            f">= {LAYER_TARGET}x at every point, every op's GPU time >= {OP_TARGET}x.",
            "",
            "## Summary",
            "",
            "```",
            *summary_table(entries),
            "```",
            "",
        ]
        if any("nbxcert" in e for e in entries):
            md += ["## Per op", "", *op_table(entries), ""]
        return md

    write_report(folder, "bench_model", doc, f"bench_model: {doc['workload']} on {doc['device']}", tables)


# --- --graphs: decode steps replayed as CUDA graphs ---------------------------------------------------------------
STEPS = {"layer": "1 layer", "model": "{layers} layers"}  # the two steps timed per point, as the tables name them


def _same_bytes(got: list, expected: list[np.ndarray]) -> bool:
    return len(got) == len(expected) and all(
        t.numpy().tobytes() == e.tobytes() for t, e in zip(got, expected, strict=True)
    )


def graph_point(model, weights, point, host_inputs, dtype, device, args, layers, peer, folder) -> dict:
    """One (dtype, decode point) of --graphs: nbxcert's one-layer step and `layers`-layer step (`nbx_decode_step`:
    every layer on the same weights and cache), each timed eager and as a graph (`nbxcert.graphs.capture`, whose
    first replay is checked byte-equal to an eager run; a `GraphRefused` is recorded), the graph's outputs checked
    byte-equal to the eager step's again after the timed replays, and each step's outputs compared with torch's."""
    from functools import partial

    from nbxcert import graphs
    from nbxcert.errors import GraphRefused
    from nbxcert.kernels.backends import cuda

    inputs = device_inputs(model, point, host_inputs, dtype, device)
    timing = (cuda.synchronize, args.warmup, args.iters, args.batch)

    def one_layer(inputs):
        return nbx_layer(weights, inputs, "decode")

    def decode_step(inputs):
        return nbx_decode_step(weights, inputs, layers)

    entry = {"dtype": dtype, "point": point.label, "batch": point.tokens, "kv_len": point.kv_len, "nbxcert": {}}
    entry["check"] = {}
    for name, step, suffix in (("layer", one_layer, ""), ("model", decode_step, "_model")):
        eager = step(inputs)
        expected = [t.numpy() for t in eager]
        ours = {"out": eager[0].float64(), "residual": eager[1].float64()}
        del eager
        side = {"eager": time_step(partial(step, inputs), *timing)}
        check = {}
        try:
            graph = graphs.capture(step, inputs)  # the inputs dict: the cache it writes is restored for the check
        except GraphRefused as e:
            check["first_replay_byte_equal"] = False
            side["graph_refused"] = str(e)
            print(f"   {STEPS[name].format(layers=layers)}: graph refused: {e}", flush=True)
        else:
            check["first_replay_byte_equal"] = True  # capture raises GraphRefused otherwise
            side["graph_info"] = {"nodes": graph.nodes, "launches": len(graph.launches), "pool_bytes": graph.pool_bytes}
            side["graph"] = time_step(graph.replay, *timing)
            graph.synchronize()
            check["after_timing_byte_equal"] = _same_bytes(list(graph.outputs), expected)
            del graph
        theirs = peer_outputs(folder, point, dtype, suffix) if peer is not None and "error" not in peer else None
        if theirs is not None:
            check["vs_torch"] = {k: difference(ours[k], theirs[k]) for k in ours}
        entry["nbxcert"][name] = side
        entry["check"][name] = check
    del inputs
    if peer is not None:
        entry["torch"] = peer.get("points", {}).get(point.label) or {"error": peer.get("error", "no times")}
    entry["ratios"] = graph_ratios(entry["nbxcert"], entry.get("torch"))
    return entry


def _wall(times: dict | None, kind: str) -> float | None:
    return ((times or {}).get(kind) or {}).get("wall_us")


def graph_ratios(ours: dict, peer: dict | None) -> dict:
    """Per step (`layer`, `model`): torch time / nbxcert time, eager against eager and graph against graph (wall), and
    the two targets: nbxcert's graph >= GRAPH_TARGET x torch's graph, nbxcert's host time per replay <=
    REPLAY_HOST_TARGET_US (None where a time is missing)."""
    out = {}
    for name, mine in ours.items():
        theirs = (peer or {}).get(name)
        graph = _ratio(_wall(theirs, "graph"), _wall(mine, "graph"))
        host = (mine.get("graph") or {}).get("host_us")
        out[name] = {
            "eager": _ratio(_wall(theirs, "eager"), _wall(mine, "eager")),
            "graph": graph,
            "graph_vs_torch_eager": _ratio(_wall(theirs, "eager"), _wall(mine, "graph")),
            "graph_target_met": None if graph is None else graph >= GRAPH_TARGET,
            "host_target_met": None if host is None else host <= REPLAY_HOST_TARGET_US,
        }
    return out


def _all_met(verdicts: list) -> bool | None:
    return None if not verdicts or any(v is None for v in verdicts) else all(verdicts)


def graphs_table(entries: list[dict], layers: int) -> list[str]:
    """The markdown table of --graphs: per (dtype, point, step) the wall time per step of nbxcert and torch, eager and
    graph, the ratios, nbxcert's and torch's host time per replay, the two targets and the checks."""
    lines = [
        "| dtype | point | step | nbx eager us | nbx graph us | torch eager us | torch graph us | eager ratio | graph "
        "ratio | nbx replay host us | torch replay host us | graph >= torch graph | replay host <= "
        f"{REPLAY_HOST_TARGET_US:g} us | graph = eager | rel diff vs torch |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        for name, mine in e["nbxcert"].items():
            theirs = (e.get("torch") or {}).get(name) or {}
            r, c = e["ratios"][name], e["check"][name]
            same = c.get("first_replay_byte_equal") and c.get("after_timing_byte_equal")
            same = "refused" if "graph_refused" in mine else ("yes" if same else "NO")
            diff = (c.get("vs_torch") or {}).get("out", {}).get("rel_norm")
            lines.append(
                f"| {e['dtype']} | {e['point']} | {STEPS[name].format(layers=layers)} | "
                f"{_f(_wall(mine, 'eager'), '.1f')} | {_f(_wall(mine, 'graph'), '.1f')} | "
                f"{_f(_wall(theirs, 'eager'), '.1f')} | {_f(_wall(theirs, 'graph'), '.1f')} | "
                f"{_f(r['eager'], '.3f')} | {_f(r['graph'], '.3f')} | "
                f"{_f((mine.get('graph') or {}).get('host_us'), '.1f')} | "
                f"{_f((theirs.get('graph') or {}).get('host_us'), '.1f')} | {_met(r['graph_target_met'])} | "
                f"{_met(r['host_target_met'])} | {same} | {_f(diff, '.2e')} |"
            )
    return lines


def write_graph_results(folder: str, doc: dict) -> None:
    """graphs.json (everything) and graphs.md (the table) in `folder`."""

    def table() -> list[str]:
        return [
            doc["shared_note"],
            "",
            "Wall time per step over batches of synchronised steps (median); host time per replay: the call's "
            "return, the GPU not waited for (mean). Ratios are torch time / nbxcert time (>= 1.0: nbxcert faster); "
            "the graph ratio is torch with CUDA graphs against nbxcert's graph. Targets (reported, not enforced): "
            f"nbxcert's graph >= {GRAPH_TARGET}x torch's graph, nbxcert's host time <= {REPLAY_HOST_TARGET_US:g} us "
            "per replayed step. graph = eager: the graph's outputs byte-equal to the eager step's at its first replay "
            "and after the timed ones; rel diff vs torch: ||nbx - torch|| / ||torch|| of the step's output (eager, the "
            "same inputs).",
            "",
            *graphs_table(doc["points"], doc["layers"]),
            "",
            f"Targets: graph >= torch graph {_met(doc.get('graph_target_met'))}; replay host time "
            f"{_met(doc.get('host_target_met'))}.",
            "",
        ]

    write_report(
        folder, "graphs", doc, f"bench_model --graphs: {doc['workload']} decode steps on {doc['device']}", table
    )


def run_graphs(args, choice, workload, model: Model) -> int:
    """--graphs: the torch peer first (its own process, on inputs written to a scratch folder), then nbxcert's side,
    per dtype and decode point (`graph_point`); graphs.json and graphs.md in --out, the table printed."""
    from nbxcert.kernels.backends import cuda
    from nbxcert.kernels.dtypes import get_dtype
    from nbxcert.profiles import match_nvidia

    points = parse_points(args.points, args.kv_len) if args.points else None
    points = points or [p for p in workload_points(workload) or [] if p.phase == "decode"]
    points = points or parse_points(DEFAULT_GRAPH_POINTS, args.kv_len)
    if any(p.phase != "decode" for p in points):
        raise SystemExit("bench_model: --graphs times decode steps only (points decode:B or decode:B@KV)")
    if args.dtypes:
        dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    else:
        dtypes = ["float16"] if "float16" in workload.dtypes else [workload.dtypes[0]]
    layers = int(workload.model.get("layers", DEFAULT_LAYERS))
    info = cuda.device_info(0)
    profile, how = match_nvidia(info.compute_capability)
    serving = "certified-only" if os.environ.get("NBXCERT_CERTIFIED_ONLY") == "1" else "uncertified allowed"
    print(
        f"device: {info.name} ({profile.key}, {how}); workload {model.name}; serving {serving}; --graphs at "
        f"{', '.join(p.label for p in points)}; dtypes {', '.join(dtypes)}",
        flush=True,
    )
    largest = max(points, key=lambda p: p.kv_len * p.tokens)
    itemsize = max(np.dtype(get_dtype(d).storage).itemsize for d in dtypes)
    cache_gb = largest.kv_len * largest.tokens * model.qkv_width * itemsize / 1e9
    note = SHARED_NOTE.format(layers=layers, largest=largest.label, gb=cache_gb)
    print(note, flush=True)
    doc = {
        "workload": model.name,
        "model": asdict(model),
        "layers": layers,
        "shared_weights_and_cache": True,
        "shared_note": note,
        "device": info.name,
        "profile": profile.key,
        "profile_match": how,
        "serving": serving,
        "backend": choice.name,
        "timing": {"warmup": args.warmup, "iters": args.iters, "batch": args.batch},
        "points": [],
    }
    cos_sin = rope_cache(model.head_dim, max_position(points), model.rope_base)
    for dtype in dtypes:
        host_weights = make_weights(model, dtype, args.seed)
        host_inputs = {p.label: make_inputs(model, p, dtype, args.seed + 1 + i) for i, p in enumerate(points)}
        peer = None
        with tempfile.TemporaryDirectory(dir=args.scratch, prefix="bench_model_graphs_") as folder:
            if not args.no_torch:  # first, while nothing of ours holds the GPU's memory
                print(f"== torch peer ({dtype}, own process): eager and CUDA graphs", flush=True)
                write_exchange(folder, host_weights, cos_sin, points, host_inputs)
                peer = run_peer(folder, model, dtype, points, args, graphs_peer_script(), layers=layers)
                if "error" in peer:
                    print(f"   torch peer failed: {peer['error']}", flush=True)
                doc.setdefault("torch", {k: v for k, v in peer.items() if k != "points"})
            weights = device_weights(model, host_weights, cos_sin, dtype, choice.device)
            for point in points:
                print(f"== {point.label} ({dtype})", flush=True)
                entry = graph_point(
                    model, weights, point, host_inputs[point.label], dtype, choice.device, args, layers, peer, folder
                )
                for name, r in entry["ratios"].items():
                    mine = entry["nbxcert"][name]
                    print(
                        f"   {STEPS[name].format(layers=layers)}: nbx eager {_f(_wall(mine, 'eager'), '.1f')} us, "
                        f"graph {_f(_wall(mine, 'graph'), '.1f')} us (host "
                        f"{_f((mine.get('graph') or {}).get('host_us'), '.1f')} us/replay); ratio to torch graph "
                        f"{_f(r['graph'], '.3f')}",
                        flush=True,
                    )
                doc["points"].append(entry)
                write_graph_results(args.out, doc)  # what is measured so far survives a run cut short
            del weights
    ratios = [r for e in doc["points"] for r in e["ratios"].values()]
    doc["graph_target_met"] = _all_met([r["graph_target_met"] for r in ratios])
    doc["host_target_met"] = _all_met([r["host_target_met"] for r in ratios])
    checks = [c for e in doc["points"] for c in e["check"].values()]
    doc["graphs_equal_eager"] = all(
        c.get("first_replay_byte_equal") and c.get("after_timing_byte_equal") for c in checks
    )
    write_graph_results(args.out, doc)
    print()
    print("\n".join(graphs_table(doc["points"], layers)))
    print(
        f"\ngraphs byte-equal to eager: {'yes' if doc['graphs_equal_eager'] else 'NO'}; targets: graph >= "
        f"{GRAPH_TARGET}x torch graph {_met(doc['graph_target_met'])}, replay host <= {REPLAY_HOST_TARGET_US:g} us "
        f"{_met(doc['host_target_met'])}; results in {args.out}"
    )
    return 0


# --- the run ----------------------------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for bench_model.json and bench_model.md")
    ap.add_argument("--workload", default="llama-3-8b", help="a shipped workload's name or a workload file")
    ap.add_argument(
        "--points",
        default=None,
        help=f"comma-separated prefill:T, decode:B, decode:B@KV (default "
        f"{DEFAULT_POINTS}, or the workload's own phases when they are lists)",
    )
    ap.add_argument("--kv-len", type=int, default=DEFAULT_KV_LEN, help="KV length of a decode:B point (default 4096)")
    ap.add_argument("--dtypes", default=None, help="comma-separated (default float16,bfloat16 and the workload's)")
    ap.add_argument("--warmup", type=int, default=10, help="warm-up iterations of the layer (default 10)")
    ap.add_argument("--iters", type=int, default=100, help="timed iterations (default 100)")
    ap.add_argument("--batch", type=int, default=10, help="iterations per synchronisation (default 10)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-tokens", type=int, default=0, help="prefill: judge the last N tokens only (0: all)")
    ap.add_argument("--rope-base", type=float, default=None, help="override the model's rope base")
    ap.add_argument("--norm-eps", type=float, default=None, help="override the model's rmsnorm epsilon")
    ap.add_argument("--no-torch", action="store_true", help="skip the torch peer")
    ap.add_argument("--allow-uncertified", action="store_true", help="do not set NBXCERT_CERTIFIED_ONLY=1")
    ap.add_argument("--scratch", default=None, help="folder for the inputs handed to the peer (default: a temp dir)")
    ap.add_argument(
        "--graphs",
        action="store_true",
        help="decode steps (one layer, and the workload's layers on one layer's weights and cache) eager and as CUDA "
        "graphs, nbxcert's against torch's, into graphs.json and graphs.md (default points "
        f"{DEFAULT_GRAPH_POINTS} at --kv-len, float16); needs the cuda backend",
    )
    return ap.parse_args(argv)


def default_dtypes(workload) -> list[str]:
    wanted = [d for d in ("float16", "bfloat16") if d in workload.dtypes]
    return wanted or [workload.dtypes[0]]


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.allow_uncertified:
        os.environ["NBXCERT_CERTIFIED_ONLY"] = "1"  # read when serving first starts: before any launch
    from nbxcert.kernels.backends import select
    from nbxcert.profiles import get_profile
    from nbxcert.workload import load_workload

    choice = select()
    if args.graphs and choice.name != "cuda":
        print(
            f"bench_model: --graphs needs the cuda backend (CUDA graphs); this run's is {choice.name}", file=sys.stderr
        )
        return 1
    print(choice.line())
    workload = load_workload(args.workload)
    model = model_of(workload, args.rope_base, args.norm_eps)
    if args.graphs:
        return run_graphs(args, choice, workload, model)
    points = parse_points(args.points, args.kv_len) if args.points else None
    points = points or workload_points(workload) or parse_points(DEFAULT_POINTS, args.kv_len)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()] if args.dtypes else default_dtypes(workload)
    gpu = choice.name == "cuda"
    if gpu:
        from nbxcert.kernels.backends import cuda
        from nbxcert.profiles import match_nvidia

        info = cuda.device_info(0)
        profile, how = match_nvidia(info.compute_capability)
        device_name = info.name
    else:
        if model.hidden * model.intermediate > INTERPRETER_MAX_WEIGHTS:
            print(
                f"bench_model: {model.name} is too large for the interpreter (no GPU here); run it on a GPU, or "
                "--workload demo for the check alone",
                file=sys.stderr,
            )
            return 2
        profile, how, device_name = get_profile("cpu/interpreter"), "interpreter", "interpreter (CPU)"
    serving = "certified-only" if os.environ.get("NBXCERT_CERTIFIED_ONLY") == "1" else "uncertified allowed"
    print(
        f"device: {device_name} ({profile.key}, {how}); workload {model.name}; serving {serving}; points "
        f"{', '.join(p.label for p in points)}; dtypes {', '.join(dtypes)}",
        flush=True,
    )
    doc = {
        "workload": model.name,
        "model": asdict(model),
        "device": device_name,
        "profile": profile.key,
        "profile_match": how,
        "serving": serving,
        "backend": choice.name,
        "points": [],
        "timing": {"warmup": args.warmup, "iters": args.iters, "batch": args.batch} if gpu else None,
    }
    cos_sin = rope_cache(model.head_dim, max_position(points), model.rope_base)
    clock = None
    for dtype in dtypes:
        tol = profile.tolerance(dtype)
        host_weights = make_weights(model, dtype, args.seed)
        host_inputs = {p.label: make_inputs(model, p, dtype, args.seed + 1 + i) for i, p in enumerate(points)}
        peer = None
        with tempfile.TemporaryDirectory(dir=args.scratch, prefix="bench_model_") as folder:
            if gpu and not args.no_torch:  # first, while nothing of ours holds the GPU's memory
                print(f"== torch peer ({dtype}, own process)", flush=True)
                write_exchange(folder, host_weights, cos_sin, points, host_inputs)
                peer = run_peer(folder, model, dtype, points, args)
                if "error" in peer:
                    print(f"   torch peer failed: {peer['error']}", flush=True)
                doc.setdefault("torch", {k: v for k, v in peer.items() if k != "points"})
            weights = device_weights(model, host_weights, cos_sin, dtype, choice.device)
            if gpu and clock is None:
                clock = NbxClock(choice.device)
                doc["spin_steps_per_us"] = clock.steps_per_us
            for point in points:
                print(f"== {point.label} ({dtype})", flush=True)
                entry = run_point(
                    model,
                    weights,
                    point,
                    host_weights,
                    host_inputs[point.label],
                    cos_sin,
                    dtype,
                    tol,
                    choice.device,
                    args,
                    clock,
                    peer,
                    folder,
                )
                doc["points"].append(entry)
                write_results(args.out, doc)  # what is measured so far survives a run cut short
            del weights
    met = [e["ratios"]["targets_met"] for e in doc["points"] if "ratios" in e]
    doc["checks_ok"] = all(e["check"]["nbxcert"]["ok"] for e in doc["points"])
    doc["all_targets_met"] = None if not met or any(m is None for m in met) else all(met)
    write_results(args.out, doc)
    if gpu:
        print()
        print("\n".join(op_table(doc["points"])))
    print()
    print("\n".join(summary_table(doc["points"])))
    print(
        f"\nchecks against float64: {'ok' if doc['checks_ok'] else 'FAILED'}; targets: "
        f"{_met(doc['all_targets_met']) if gpu else 'not timed (no GPU)'}; results in {args.out}"
    )
    return 0


def run_point(
    model, weights, point, host_weights, host_inputs, cos_sin, dtype, tol, device, args, clock, peer, folder
) -> dict:
    """One (dtype, point): nbxcert's layer run once and checked (and torch's outputs, when the peer ran), then timed."""
    inputs = device_inputs(model, point, host_inputs, dtype, device)
    out, residual = nbx_layer(weights, inputs, point.phase)
    ours = {"out": out.float64(), "residual": residual.float64()}
    del out, residual
    last = args.check_tokens if point.phase == "prefill" and args.check_tokens > 0 else None
    t0 = time.time()
    ref = reference(model, host_weights, cos_sin, point, host_inputs, dtype, last)
    entry = {
        "dtype": dtype,
        "point": point.label,
        "phase": point.phase,
        "tokens": point.tokens,
        "kv_len": point.kv_len or None,
        "reference_s": time.time() - t0,
        "check": {"nbxcert": check_outputs(ours, ref, dtype, tol, f"nbxcert {point.label} {dtype}")},
    }
    theirs = peer_outputs(folder, point, dtype) if peer is not None and "error" not in peer else None
    if theirs is not None:
        entry["check"]["torch"] = check_outputs(theirs, ref, dtype, tol, f"torch {point.label} {dtype}")
        entry["check"]["nbxcert_vs_torch"] = {name: difference(ours[name], theirs[name]) for name in ours}
    for side in ("nbxcert", "torch"):
        c = entry["check"].get(side)
        if c is not None:
            print(
                f"   {side}: out rel err {c['out']['rel_norm_error']:.2e}, max scaled {c['out']['max_scaled']:.3f}; "
                f"residual rel err {c['residual']['rel_norm_error']:.2e}: {'ok' if c['ok'] else 'FAILED'}",
                flush=True,
            )
            for name in ("out", "residual"):
                if c[name]["report"]:
                    print("      " + c[name]["report"].replace("\n", "\n      "), flush=True)
    if clock is not None:
        layer = lambda run: nbx_layer(weights, inputs, point.phase, run)  # noqa: E731
        entry["nbxcert"] = time_layer(layer, clock, OPS, args.warmup, args.iters, args.batch)
        if peer is not None:
            entry["torch"] = peer.get("points", {}).get(point.label) or {"error": peer.get("error", "no times")}
        entry["ratios"] = compare_times(
            entry["nbxcert"], entry.get("torch") if "ops" in entry.get("torch", {}) else None
        )
        r = entry["ratios"]["layer"]
        print(
            f"   layer wall {entry['nbxcert']['layer']['wall_us']:.1f} us, ratio {_f(r['wall'], '.3f')} "
            f"({_met(r['met'])})",
            flush=True,
        )
    return entry


if __name__ == "__main__":
    sys.exit(main())
