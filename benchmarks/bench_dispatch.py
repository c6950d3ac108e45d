"""Host time of one served call, per kernel family at decode and prefill shapes, next to torch eager's for the op.

    python3 benchmarks/bench_dispatch.py --out DIR [--ops rmsnorm,topk] [--calls 200] [--repeats 5]
    NBXCERT_BACKEND=interpreter python3 benchmarks/bench_dispatch.py --tiny --no-peer --out DIR   # no GPU

Target: on the H200 the host time of every served call is at most 10 us (`TARGET_US`) and never more than torch
eager's for the same op. Each case is reported as met or not; the exit code says only whether everything ran (0), or
something failed to (1: a case raised, the torch peer's process failed, torch was imported in this process).

Cases. Dimensions from nbxcert's workload files: llama-3-8b (hidden 4096, intermediate 14336, 32 heads, 8 KV heads,
head_dim 128, vocabulary 128256) and, for fused_moe, mixtral-8x7b (8 experts, top-2, expert intermediate 14336).
Decode is a batch of 16 sequences each 4096 long (`DECODE_BATCH`, `KV_LEN`), prefill one sequence of 512 tokens
(`PREFILL_TOKENS`); float16 throughout. Per op:
- rmsnorm, add_rmsnorm, layernorm: [tokens, hidden]; softmax, argmax: [tokens, vocab]; topk: [tokens, vocab], k 50;
  silu_and_mul: [tokens, 2 x intermediate]; rope: q [tokens, 32, 128] and k [tokens, 8, 128] as views of one qkv row
  buffer, neox, positions int32 (decode: each sequence's last position; prefill: 0..511); embedding: ids int32
  [tokens] of a [vocab, hidden] table.
- matmul_tiled, matmul_split_k, matmul_tma_persistent: the qkv projection, [tokens, hidden] @ W.T with W [(32 + 2 x
  8) x 128, hidden] as nn.Linear holds it. gemv (M <= 4 only: decode at batch 4, no prefill shape exists): the same
  product.
- flash_attention (prefill: causal, [1, 32, 512, 128] against [1, 8, 512, 128]); decode_attention and
  paged_decode_attention (decode: q [16, 32, 128] against a 4096-long cache, contiguous [16, 8, 4096, 128] or paged
  in blocks of 16 through a shuffled block table; `max_len` given, as a serving loop knows it).
- fused_moe: the experts' gate/up projection, a [tokens, 4096] through w [8, 2 x 14336, 4096], each token routed to
  2 distinct experts (seeded).
- dequant_gemv (decode at batch 4) and dequant_matmul (decode at 16, prefill at 512): int4, GPTQ packing, group 128,
  on a 4096 x 4096 weight.

Served as. Each matmul kind is measured by registering a server (`nbxcert.kernels.server.set_server`) that serves
one candidate of that kind for the case, so the served path (launch plans included) runs exactly as with a
certificate: the certified winner when it is of that kind, else the fastest finalist of that kind the certificate
timed, else the first candidate of that kind the profile's prune keeps. Every other op is served as this process's
serving state says: the shipped certificates (nvidia/hopper on an H200) where they cover the key, otherwise what
--uncertified says (`NBXCERT_UNCERTIFIED`: `default`, the kernel's untuned default, unless set otherwise). Each case
says which: "certified", "untuned default", "swept at run time", or the matmul kind's choice.

Measured per case (nbxcert), as an application writes the call (its outputs allocated by the call): one call
(compile, launch plan made), --warmup calls more, then --repeats rounds (median taken) of:
- host: --calls back-to-back calls timed with time.perf_counter(), no synchronisation inside, the device waited for
  after the clock stops: microseconds of host time per call;
- GPU: --gpu-calls calls (default 50) queued behind a spin kernel of twice their host time (so the GPU runs them back
  to back and waits for no host work), CUDA events (`cuda.Event` on the current stream) around them, divided by
  their number. Fewer than --calls: torch's composite ops make ~10 launches a call, and a stream holds about a
  thousand pending launches before the host waits.
Host time above GPU time: the host bounds the call (`bound` in the JSON); below: the GPU does. A diagnosis beside it:
the host time of the plan's launches alone (`launches_only_host_us`: the same launches queued by nbxcert's launcher
with the call's addresses, no signature, memory or result), the driver's share of the call; and whether the call was
replayed in C (`replayed_in_c`). Whether the call
replayed a launch plan (the entry point's `.plans` holds a `CallPlan` for its signature after the warm-up) is
reported beside. --calls stays small (default 200) so the GPU's launch queue does not fill during a host run.

The torch peer: one process for the whole run (`python3 -c`, started before the first case), asked for each case
right after nbxcert's side measured it, so both sides of a case are timed on the same machine state (on the H200's
host, timings moved by up to 2x between runs minutes apart). The same shapes and dtypes, each op as a torch user
writes it (named per case in the JSON, `torch_op`), timed by the same function (`time_calls`, whose source the peer
runs) under `torch.inference_mode()`, its delay `torch.cuda._sleep`. torch is made unimportable in nbxcert's process
before anything loads (Triton 3.6 imports it where it can), and `sys.modules` is checked for it after the cases.

Output: --out DIR gets `dispatch.json` (every case: op, phase, shape, served as, plan replayed, host and GPU us of
both sides, each round's figures, met) and `dispatch.md` (the table). The table is printed last, one line per case,
then "N/M cases met". --tiny scales every dimension down (hidden 128, 4 heads, vocabulary 512, ...) so Triton's
interpreter runs the cases in seconds; there is no GPU time and no peer on the interpreter. On an H200 the whole run
takes about 75 s from a cold Triton cache (compiles, the inputs of a 1 GB embedding table and a 1.9 GB expert weight
made on the host, torch's start), about 45 s warm.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import select
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' common helpers
import common  # noqa: E402
import spin  # noqa: E402

TARGET_US = 10.0
DECODE_BATCH = 16
KV_LEN = 4096
PREFILL_TOKENS = 512
PAGE_BLOCK = 16  # tokens per block of the paged cache (vLLM's default)
TOPK_K = 50
QUANT_GROUP = 128
NORM_EPS = 1e-5  # llama-3-8b's rms_norm_eps; layernorm's usual eps
ROPE_BASE = 500000.0  # llama-3-8b's rope_theta
MATMUL_KINDS = {"matmul_tiled": "tiled", "matmul_split_k": "split_k", "matmul_tma_persistent": "tma_persistent"}
OPS = (
    "rmsnorm",
    "add_rmsnorm",
    "layernorm",
    "softmax",
    "silu_and_mul",
    "rope",
    "embedding",
    "matmul_tiled",
    "matmul_split_k",
    "matmul_tma_persistent",
    "gemv",
    "flash_attention",
    "decode_attention",
    "paged_decode_attention",
    "fused_moe",
    "dequant_gemv",
    "dequant_matmul",
    "argmax",
    "topk",
)
# ops sharing their big tensors (weights, tables) across their cases: built once per group, dropped after it
GROUPS = {**{op: "matmul" for op in (*MATMUL_KINDS, "gemv")}, "dequant_gemv": "dequant", "dequant_matmul": "dequant"}


class UnknownOp(ValueError):
    """An --ops name that is no case of this benchmark."""


# --- cases ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Dims:
    """The dimensions every case is made from."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    experts: int
    top_k: int
    moe_intermediate: int
    decode_batch: int
    kv_len: int
    prefill_tokens: int
    topk_k: int
    block_size: int
    gemv_max_m: int


def model_dims(tiny: bool, gemv_max_m: int) -> Dims:
    """llama-3-8b's and mixtral-8x7b's dimensions (nbxcert's workload files), or --tiny's."""
    if tiny:
        return Dims(128, 64, 4, 2, 32, 512, 4, 2, 64, 2, 64, 4, 4, 16, gemv_max_m)
    from nbxcert.workload import load_workload

    dense, moe = load_workload("llama-3-8b").model, load_workload("mixtral-8x7b").model
    return Dims(
        dense["hidden"],
        dense["intermediate"],
        dense["heads"],
        dense["kv_heads"],
        dense["head_dim"],
        dense["vocab"],
        moe["experts"],
        moe["top_k"],
        moe["moe_intermediate"],
        DECODE_BATCH,
        KV_LEN,
        PREFILL_TOKENS,
        TOPK_K,
        PAGE_BLOCK,
        gemv_max_m,
    )


@dataclass(frozen=True)
class Case:
    """One measurement: an op at one phase, `dims` what both sides build it from, `shape` the table's words."""

    op: str
    phase: str
    shape: str
    dims: dict = field(hash=False)

    @property
    def id(self) -> str:
        return f"{self.op}:{self.phase}"


def cases_for(d: Dims, ops) -> list[Case]:
    """The cases of `ops` (in OPS order), decode before prefill."""
    phases = (("decode", d.decode_batch), ("prefill", d.prefill_tokens))
    qkv_n = (d.heads + 2 * d.kv_heads) * d.head_dim
    small = min(d.decode_batch, d.gemv_max_m)
    out: list[Case] = []

    def add(op, phase, shape, **dims):
        out.append(Case(op, phase, shape, dims))

    for op in (o for o in OPS if o in ops):
        if op in ("rmsnorm", "add_rmsnorm", "layernorm"):
            for phase, n in phases:
                add(op, phase, f"{n}x{d.hidden}", rows=n, cols=d.hidden)
        elif op in ("softmax", "argmax"):
            for phase, n in phases:
                add(op, phase, f"{n}x{d.vocab}", rows=n, cols=d.vocab)
        elif op == "topk":
            for phase, n in phases:
                add(op, phase, f"{n}x{d.vocab} k={d.topk_k}", rows=n, cols=d.vocab, k=d.topk_k)
        elif op == "silu_and_mul":
            for phase, n in phases:
                add(op, phase, f"{n}x{2 * d.intermediate}", rows=n, d=d.intermediate)
        elif op == "rope":
            for phase, n in phases:
                add(
                    op,
                    phase,
                    f"{n} tok, {d.heads}/{d.kv_heads} heads x {d.head_dim}",
                    tokens=n,
                    heads=d.heads,
                    kv_heads=d.kv_heads,
                    head_dim=d.head_dim,
                    max_position=max(d.kv_len, d.prefill_tokens),
                    position=d.kv_len - 1 if phase == "decode" else None,
                )
        elif op == "embedding":
            for phase, n in phases:
                add(op, phase, f"{n} ids, {d.vocab}x{d.hidden}", tokens=n, vocab=d.vocab, dim=d.hidden)
        elif op in MATMUL_KINDS:
            for phase, n in phases:
                add(op, phase, f"{n}x{qkv_n}x{d.hidden}", M=n, N=qkv_n, K=d.hidden)
        elif op == "gemv":
            add(op, "decode", f"{small}x{qkv_n}x{d.hidden}", M=small, N=qkv_n, K=d.hidden)
        elif op == "flash_attention":
            t = d.prefill_tokens
            add(
                op,
                "prefill",
                f"1x{d.heads}/{d.kv_heads}x{t}x{d.head_dim} causal",
                batch=1,
                heads=d.heads,
                kv_heads=d.kv_heads,
                q_len=t,
                kv_len=t,
                head_dim=d.head_dim,
            )
        elif op in ("decode_attention", "paged_decode_attention"):
            paged = op == "paged_decode_attention"
            shape = f"{d.decode_batch}x{d.heads}/{d.kv_heads} kv {d.kv_len}x{d.head_dim}"
            extra = {"block_size": d.block_size} if paged else {}
            add(
                op,
                "decode",
                shape + (f" paged {d.block_size}" if paged else ""),
                batch=d.decode_batch,
                heads=d.heads,
                kv_heads=d.kv_heads,
                kv_len=d.kv_len,
                head_dim=d.head_dim,
                **extra,
            )
        elif op == "fused_moe":
            for phase, n in phases:
                add(
                    op,
                    phase,
                    f"{n} tok top-{d.top_k} of {d.experts}, {2 * d.moe_intermediate}x{d.hidden}",
                    M=n,
                    N=2 * d.moe_intermediate,
                    K=d.hidden,
                    experts=d.experts,
                    top_k=d.top_k,
                )
        elif op == "dequant_gemv":
            add(op, "decode", f"{small}x{d.hidden}x{d.hidden} int4 g{QUANT_GROUP}", M=small, N=d.hidden, K=d.hidden)
        elif op == "dequant_matmul":
            for phase, n in phases:
                add(op, phase, f"{n}x{d.hidden}x{d.hidden} int4 g{QUANT_GROUP}", M=n, N=d.hidden, K=d.hidden)
    return out


def selected_ops(text: str | None) -> list[str]:
    """--ops (comma-separated; empty: every op), each checked against OPS."""
    if not text:
        return list(OPS)
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [n for n in names if n not in OPS]
    if unknown:
        raise UnknownOp(f"unknown op {', '.join(map(repr, unknown))}; the ops are: {', '.join(OPS)}")
    return names


# --- timing (the torch peer runs this function's source too) ----------------------------------------------------------
def time_calls(call, warmup: int, calls: int, repeats: int, clock, gpu_calls: int) -> dict:
    """Host and GPU microseconds per call of `call()` (no arguments): `warmup` calls, then `repeats` rounds of a host
    run (`calls` back-to-back calls between two perf_counter readings, no synchronisation inside, the device waited
    for after the clock stops) and, when `clock.timed`, a GPU run (a spin of twice the host run's time for
    `gpu_calls` calls queued first, so the device runs them back to back, then events around `gpu_calls` calls).
    Medians over the rounds, and every round's figure. `clock`: `timed`, `sync()`, `event()`, `record(e)`,
    `elapsed(a, b)` (ms), `delay(us)`. Self-contained: the torch peer runs its source."""
    import statistics
    import time

    for _ in range(warmup):
        call()
    clock.sync()
    host, gpu = [], []
    for _ in range(repeats):
        clock.sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        host.append((time.perf_counter() - t0) / calls * 1e6)
        clock.sync()
        if clock.timed:
            start, end = clock.event(), clock.event()
            clock.delay(2.0 * host[-1] * gpu_calls + 100.0)
            clock.record(start)
            for _ in range(gpu_calls):
                call()
            clock.record(end)
            clock.sync()
            gpu.append(clock.elapsed(start, end) * 1e3 / gpu_calls)
    return {
        "host_us": statistics.median(host),
        "host_us_runs": host,
        "gpu_us": statistics.median(gpu) if gpu else None,
        "gpu_us_runs": gpu,
    }


class NbxClock:
    """`time_calls`' clock on nbxcert's side: CUDA events on the current stream and a spin kernel calibrated to
    microseconds."""

    timed = True

    def __init__(self, device: str):
        from nbxcert.kernels.backends import cuda
        from nbxcert.kernels.jit import jit
        from nbxcert.kernels.tensor import empty

        self._cuda = cuda
        # one compiled variant for every step count: a count Triton specialised on (1, multiples of 16) would compile
        # inside a run, and the compile's seconds would pass between the calibration's events
        self._spin = jit(spin.spin_body, do_not_specialize=["steps"])
        self._out = empty((1,), "float32", device)
        steps = 1 << 18
        self._spin[(1,)](self._out, steps, num_warps=1)  # compiled here, before the calibration's events
        self.sync()
        start, end = self.event(), self.event()
        self.record(start)
        self._spin[(1,)](self._out, steps, num_warps=1)
        self.record(end)
        self.sync()
        self.steps_per_us = steps / max(self.elapsed(start, end) * 1e3, 1e-3)

    def event(self):
        return self._cuda.Event()

    def record(self, event) -> None:
        event.record(self._cuda.current_stream())

    def elapsed(self, start, end) -> float:
        return self._cuda.Event.elapsed_ms(start, end)

    def sync(self) -> None:
        self._cuda.synchronize()

    def delay(self, us: float) -> None:
        self._spin[(1,)](self._out, max(1, min(int(us * self.steps_per_us), 2**31 - 1)), num_warps=1)


class HostClock:
    """`time_calls`' clock under the interpreter: the launches ran when the calls returned; no GPU time."""

    timed = False

    def sync(self) -> None:
        pass


# --- nbxcert's side ---------------------------------------------------------------------------------------------------
class KindServer:
    """A server that serves `config` for `spec` (the matmul kind measured) and asks `fallback` for everything else."""

    def __init__(self, spec, config, fallback):
        self.spec, self.config, self.fallback = spec, config, fallback

    def __call__(self, spec, problem, dtypes, runtime=None):
        if spec is self.spec:
            return self.config
        return self.fallback(spec, problem, dtypes, runtime)


class Recorder:
    """A server asking `inner`, noting each (spec, problem, dtypes, config) it was asked for (the first call only)."""

    def __init__(self, inner):
        self.inner, self.asked = inner, []

    def __call__(self, spec, problem, dtypes, runtime=None):
        config = self.inner(spec, problem, dtypes, runtime)
        self.asked.append((spec, dict(problem), tuple(dtypes), config))
        return config


def kind_candidate(spec, problem, dtypes, kind: str):
    """(config, how it was chosen) of `kind` for a matmul-family launch: the certified winner when of that kind, else
    the certificate's fastest finalist of that kind, else the first candidate of that kind the prune keeps."""
    from nbxcert import serving
    from nbxcert.kernels.spec import Config
    from nbxcert.keys import make_key

    st = serving.state()
    entry = st.index.get(make_key(spec, problem, dtypes, st.profile).text())
    if entry is not None:
        winner = Config.from_dict(entry["winner"]["config"])
        if winner.get("KIND") == kind:
            return winner, "certified winner"
        timed = [(f["timing"]["median_us"], Config.from_dict(f["config"])) for f in entry.get("finalists", [])]
        timed = sorted((t for t in timed if t[1].get("KIND") == kind), key=lambda t: t[0])
        if timed and timed[0][1] in set(spec.candidates):
            return timed[0][1], "certificate's fastest finalist"
    kept = [c for c in spec.pruned_for(problem, st.profile).kept if c.get("KIND") == kind]
    if not kept:
        raise RuntimeError(f"the {st.profile.key} prune keeps no {kind} candidate of {spec.name} for {problem}")
    return kept[0], "first kept candidate"


def served_status(asked, chosen: dict) -> tuple[str, list[dict]]:
    """What the first call was served, in words ("certified", "untuned default", ...) and per lookup."""
    from nbxcert import serving
    from nbxcert.keys import make_key

    st = serving.state()
    details = []
    for spec, problem, dtypes, config in asked:
        key = make_key(spec, problem, dtypes, st.profile).text()
        if spec.name in chosen:
            status = chosen[spec.name]
        elif st.index.get(key) is not None:
            status = "certified"
        elif key in st.runtime_cache:
            status = "swept at run time"
        elif st.uncertified == "default" and config == spec.default:
            status = "untuned default"
        else:
            status = "served"
        details.append({"kernel": spec.name, "key": key, "status": status, "config": config.label()})
    statuses = list(dict.fromkeys(d["status"] for d in details))
    if len(statuses) == 1:
        return statuses[0], details
    return "; ".join(f"{d['kernel']}: {d['status']}" for d in details), details


class Held:
    """Big tensors (weights, the embedding table) shared by the cases of one group, dropped when the group changes."""

    def __init__(self):
        self.group, self.tensors = None, {}

    def enter(self, op: str) -> None:
        group = GROUPS.get(op, op)
        if group != self.group:
            self.group, self.tensors = group, {}

    def get(self, name: str, make):
        if name not in self.tensors:
            self.tensors[name] = make()
        return self.tensors[name]


def build_call(case: Case, device: str, held: Held):
    """(entry point, args, kwargs, kind) of a case's served call, its inputs seeded random on `device`; kind: None,
    or (spec, KIND) for a matmul kind measured through its own server."""
    import numpy as np

    from nbxcert.kernels import attention as at
    from nbxcert.kernels import elementwise as ew
    from nbxcert.kernels import matmul as mm
    from nbxcert.kernels import moe, quant, rows, sampling
    from nbxcert.kernels.inputs import randint, randn, rng, uniform
    from nbxcert.kernels.tensor import from_numpy

    op, d = case.op, case.dims
    gen = rng(zlib.crc32(case.id.encode()))  # seeded per case, the same in every run
    f16 = "float16"

    def normal(shape, scale=1.0):
        return randn(gen, shape, f16, device, scale)

    if op in ("rmsnorm", "add_rmsnorm", "layernorm"):
        x, w = normal((d["rows"], d["cols"])), uniform(gen, (d["cols"],), f16, device, 0.9, 1.1)
        if op == "rmsnorm":
            return rows.rmsnorm, (x, w, NORM_EPS), {}, None
        if op == "add_rmsnorm":
            return rows.add_rmsnorm, (x, normal((d["rows"], d["cols"])), w, NORM_EPS), {}, None
        return rows.layernorm, (x, w, normal((d["cols"],), 0.1), NORM_EPS), {}, None
    if op in ("softmax", "argmax", "topk"):
        x = normal((d["rows"], d["cols"]))
        if op == "softmax":
            return rows.softmax, (x,), {}, None
        if op == "argmax":
            return sampling.argmax, (x,), {}, None
        return sampling.topk, (x, d["k"]), {}, None
    if op == "silu_and_mul":
        return ew.silu_and_mul, (normal((d["rows"], 2 * d["d"])),), {}, None
    if op == "rope":
        t, h, kh, hd = d["tokens"], d["heads"], d["kv_heads"], d["head_dim"]
        qkv = normal((t, (h + 2 * kh) * hd))
        q, k = qkv[:, : h * hd].view(t, h, hd), qkv[:, h * hd : (h + kh) * hd].view(t, kh, hd)
        where = np.full(t, d["position"]) if d["position"] is not None else np.arange(t)
        positions = from_numpy(where.astype(np.int32), "int32", device)
        cache = from_numpy(ew.rope_cache(hd, d["max_position"], ROPE_BASE), "float32", device)
        return ew.rope, (q, k, positions, cache), {}, None
    if op == "embedding":
        table = held.get("table", lambda: normal((d["vocab"], d["dim"])))
        return ew.embedding, (table, randint(gen, (d["tokens"],), 0, d["vocab"], "int32", device)), {}, None
    if op in MATMUL_KINDS or op == "gemv":
        w = held.get(f"w{d['N']}x{d['K']}", lambda: normal((d["N"], d["K"]), d["K"] ** -0.5))  # [out, in]
        x = normal((d["M"], d["K"]))
        spec = mm.GEMV if op == "gemv" else mm.MATMUL
        entry = mm.gemv if op == "gemv" else mm.matmul
        return entry, (x, w.T), {}, (spec, "gemv" if op == "gemv" else MATMUL_KINDS[op])
    if op == "flash_attention":
        q = normal((d["batch"], d["heads"], d["q_len"], d["head_dim"]))
        k, v = (normal((d["batch"], d["kv_heads"], d["kv_len"], d["head_dim"])) for _ in range(2))
        return at.flash_attention, (q, k, v), {"causal": True}, None
    if op in ("decode_attention", "paged_decode_attention"):
        b, kv, hd, kh = d["batch"], d["kv_len"], d["head_dim"], d["kv_heads"]
        q = normal((b, d["heads"], hd))
        lengths = from_numpy(np.full(b, kv, dtype=np.int32), "int32", device)
        if op == "decode_attention":
            k, v = (normal((b, kh, kv, hd)) for _ in range(2))
            return at.decode_attention, (q, k, v, lengths), {"max_len": kv}, None
        bs = d["block_size"]
        per_seq = -(-kv // bs)
        blocks = b * per_seq + 3
        k, v = (normal((blocks, bs, kh, hd)) for _ in range(2))
        table = gen.permutation(blocks)[: b * per_seq].reshape(b, per_seq).astype(np.int32)
        args = (q, k, v, from_numpy(table, "int32", device), lengths)
        return at.paged_decode_attention, args, {"max_len": kv}, None
    if op == "fused_moe":
        m, e, top_k = d["M"], d["experts"], d["top_k"]
        w = held.get("w", lambda: normal((e, d["N"], d["K"]), d["K"] ** -0.5))
        ids = np.argsort(gen.random((m, e)), axis=1)[:, :top_k].astype(np.int32)  # top_k distinct experts per token
        weights = gen.random((m, top_k)).astype(np.float32)
        weights /= weights.sum(axis=1, keepdims=True)
        a = normal((m, d["K"]))
        args = (a, w, from_numpy(weights, "float32", device), from_numpy(ids, "int32", device))
        return moe.fused_moe, args, {"mul_weight": False}, None
    if op in ("dequant_gemv", "dequant_matmul"):
        n, k = d["N"], d["K"]

        def weights():
            qweight = gen.integers(-(2**31), 2**31, size=(k // 8, n), dtype=np.int32)
            qzeros = gen.integers(-(2**31), 2**31, size=(k // QUANT_GROUP, n // 8), dtype=np.int32)
            scales = uniform(gen, (k // QUANT_GROUP, n), f16, device, 0.002, 0.004)
            return from_numpy(qweight, "int32", device), scales, from_numpy(qzeros, "int32", device)

        qweight, scales, qzeros = held.get("int4", weights)
        entry = quant.dequant_gemv if op == "dequant_gemv" else quant.dequant_matmul
        return entry, (normal((d["M"], k)), qweight, scales, qzeros, "int4"), {}, None
    raise UnknownOp(f"no nbxcert call for op {op!r}")


def launches_only(plan, signature, args, clock) -> dict:
    """A diagnosis beside the served call's host time: the host time of the plan's launches alone, queued by
    nbxcert's launcher (`launch_plan`) with the call's addresses and memory made once (no signature, no memory, no
    result): the driver's share of a served call."""
    from nbxcert.kernels.tensor import Storage

    storages = [Storage.fresh(nbytes, device) for nbytes, device in plan.made]
    addresses = [t.data_ptr() for t in signature[1]] + [s.data_ptr() for s in storages]
    packed = plan.packed

    def queue() -> None:
        status, at = packed.launch_plan(packed.steps, addresses, 0, packed.graph)
        if status:
            packed.recover(status, at, addresses)

    timing = time_calls(queue, args.warmup, args.calls, args.repeats, clock, min(args.calls, args.gpu_calls))
    return {"launches": len(packed.steps), "launches_only_host_us": timing["host_us"]}


def measure_nbx(case: Case, device: str, held: Held, clock, args) -> dict:
    """One case on nbxcert's side: served as, plan replayed, host and GPU times."""
    from nbxcert import serving
    from nbxcert.kernels import matmul as mm
    from nbxcert.kernels import server
    from nbxcert.kernels.launch import CallPlan, call_signature, forget_plans

    held.enter(case.op)
    entry, call_args, call_kwargs, kind = build_call(case, device, held)
    forget_plans()  # a plan made under another case's server (the same signature, another kind) must not replay
    inner, chosen = serving.config_for, {}
    if kind is not None:
        spec, kind_name = kind
        problem = mm._problem_gemv(*call_args) if kind_name == "gemv" else mm._problem_matmul(*call_args)
        dtypes = tuple(t.dtype.name for t in call_args[:2])
        config, how = kind_candidate(spec, problem, dtypes, kind_name)
        inner = KindServer(spec, config, serving.config_for)
        chosen[spec.name] = f"{kind_name}: {how}"
    call = functools.partial(entry, *call_args, **call_kwargs)
    recorder = Recorder(inner)
    previous = server.set_server(recorder)
    try:
        t0 = time.perf_counter()
        call()  # compile, key, lookup, launch plan made
        clock.sync()
        first_s = time.perf_counter() - t0
        server.set_server(inner)  # the timed calls ask the server exactly as a served application's would
        timing = time_calls(call, args.warmup, args.calls, args.repeats, clock, min(args.calls, args.gpu_calls))
        signature = call_signature(call_args, call_kwargs)
        plan = entry.plans.get(signature[0]) if signature is not None else None
        launches = launches_only(plan, signature, args, clock) if getattr(plan, "packed", None) is not None else {}
    finally:
        server.set_server(previous)
    served_as, served = served_status(recorder.asked, chosen)
    return {
        **launches,
        "served_as": served_as,
        "served": served,
        "plan_replayed": type(plan) is CallPlan,
        "plan_in_one_call": type(plan) is CallPlan and plan.packed is not None,
        "plan_as_graph": type(plan) is CallPlan and plan.packed is not None and plan.packed.graph is not None,
        # the whole call replayed in C: the entry point routes to nbxcert's launcher and the plan has a fast form
        "replayed_in_c": type(plan) is CallPlan
        and plan.fast is not None
        and type(getattr(entry, "route", [None])[0]).__name__ == "Served",
        "first_call_s": first_s,
        **timing,
    }


def run_cases(cases: list[Case], device: str, args, peer: Peer | None, log) -> tuple[list[dict], dict]:
    """Every case in order, nbxcert's side then (when `peer`) torch's: a record each (with `error` where nbxcert's
    side raised), and torch's answers by case id (with "error" for the peer's process when it failed)."""
    from nbxcert.kernels.backends import cuda

    clock = NbxClock(device) if device.startswith("cuda") else HostClock()
    held, records, theirs = Held(), [], {}
    for case in cases:
        record = {"id": case.id, "op": case.op, "phase": case.phase, "shape": case.shape, "dims": case.dims}
        t0 = time.perf_counter()
        try:
            record.update(measure_nbx(case, device, held, clock, args))
        except Exception as e:  # noqa: BLE001 - recorded with its reason; the other cases still run
            record["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
        records.append(record)
        if "error" in record:
            log(f"  {case.id:32s} FAILED {record['error']}")
            if device.startswith("cuda") and cuda.context_poisoned() is not None:
                log("  the CUDA context is poisoned: no further case can run in this process")
                break
            continue
        torch_line = ""
        if peer is not None and "error" not in theirs:
            try:
                answer = theirs[case.id] = peer.measure(case)
                torch_line = f"  torch {_us(answer.get('host_us')):>7} us" if "error" not in answer else "  torch -"
            except PeerFailed as e:
                theirs["error"] = str(e)
                log(f"  torch peer failed: {e}")
        gpu = f"{record['gpu_us']:8.2f}" if record["gpu_us"] is not None else "       -"
        took = time.perf_counter() - t0
        log(
            f"  {case.id:32s} host {record['host_us']:7.2f} us{torch_line}  gpu {gpu} us  "
            f"plan {record['plan_replayed']!s:5}  in C {record.get('replayed_in_c')!s:5}  launches "
            f"{record.get('launches', '-')} alone {_us(record.get('launches_only_host_us'))} us  "
            f"{record['served_as']}  ({took:.1f} s)"
        )
    held.enter("")  # the last group's tensors dropped
    return records, theirs


# --- the torch peer ---------------------------------------------------------------------------------------------------
# Run with `python3 -c` in its own process; `time_calls`' source is put before it. argv[1]: JSON of the cases and the
# timing counts. Prints one JSON line: torch's version, the device, and per case id its times and the op as written.
PEER_SCRIPT = (
    r"""
import json, sys
import torch
import torch.nn.functional as F

args = json.loads(sys.argv[1])
DT = torch.float16
DEV = "cuda"
EPS, BASE, GROUP = args["eps"], args["rope_base"], args["group"]
gen = torch.Generator(device=DEV).manual_seed(0)


def randn(*shape, scale=1.0):
    return torch.randn(*shape, device=DEV, dtype=DT, generator=gen) * scale
"""
    + common.TORCH_SDPA
    + r"""


def rms(x, w):  # transformers' LlamaRMSNorm, where F.rms_norm is missing (torch < 2.4)
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


def rms_op():
    if hasattr(F, "rms_norm"):
        return (lambda x, w: F.rms_norm(x, (x.shape[-1],), w, EPS)), "F.rms_norm"
    return rms, "x * rsqrt(mean(x^2) + eps) * w"


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def build(op, d):
    if op in ("rmsnorm", "add_rmsnorm", "layernorm"):
        x, w = randn(d["rows"], d["cols"]), 1 + 0.1 * randn(d["cols"])
        if op == "layernorm":
            b = randn(d["cols"], scale=0.1)
            return (lambda: F.layer_norm(x, (d["cols"],), w, b, EPS)), "F.layer_norm"
        norm, how = rms_op()
        if op == "rmsnorm":
            return (lambda: norm(x, w)), how
        r = randn(d["rows"], d["cols"])

        def add_norm():
            s = x + r
            return s, norm(s, w)

        return add_norm, "s = x + residual; " + how + "(s)"
    if op in ("softmax", "argmax", "topk"):
        x = randn(d["rows"], d["cols"])
        if op == "softmax":
            return (lambda: torch.softmax(x, dim=-1)), "torch.softmax"
        if op == "argmax":
            return (lambda: torch.argmax(x, dim=-1)), "torch.argmax"
        return (lambda: torch.topk(x, d["k"], dim=-1)), "torch.topk"
    if op == "silu_and_mul":
        x, n = randn(d["rows"], 2 * d["d"]), d["d"]
        return (lambda: F.silu(x[..., :n]) * x[..., n:]), "F.silu(x[..., :d]) * x[..., d:]"
    if op == "rope":
        t, h, kh, hd = d["tokens"], d["heads"], d["kv_heads"], d["head_dim"]
        qkv = randn(t, (h + 2 * kh) * hd)
        q, k = qkv[:, : h * hd].view(t, h, hd), qkv[:, h * hd : (h + kh) * hd].view(t, kh, hd)
        inv = BASE ** (-torch.arange(0, hd, 2, device=DEV, dtype=torch.float32) / hd)
        angles = torch.arange(d["max_position"], device=DEV, dtype=torch.float32)[:, None] * inv[None, :]
        emb = torch.cat((angles, angles), dim=-1)
        cos_cache, sin_cache = emb.cos().to(DT), emb.sin().to(DT)
        if d["position"] is None:
            positions = torch.arange(t, device=DEV)
        else:
            positions = torch.full((t,), d["position"], device=DEV, dtype=torch.long)

        def rope():
            cos, sin = cos_cache[positions].unsqueeze(1), sin_cache[positions].unsqueeze(1)
            return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

        return rope, "cos/sin[positions]; q * cos + rotate_half(q) * sin (and k)"
    if op == "embedding":
        table = randn(d["vocab"], d["dim"])
        ids = torch.randint(0, d["vocab"], (d["tokens"],), device=DEV, generator=gen)
        return (lambda: F.embedding(ids, table)), "F.embedding"
    if op in ("matmul_tiled", "matmul_split_k", "matmul_tma_persistent", "gemv"):
        x, w = randn(d["M"], d["K"]), randn(d["N"], d["K"], scale=d["K"] ** -0.5)
        return (lambda: x @ w.T), "x @ w.T"
    if op == "flash_attention":
        q = randn(d["batch"], d["heads"], d["q_len"], d["head_dim"])
        k, v = (randn(d["batch"], d["kv_heads"], d["kv_len"], d["head_dim"]) for _ in range(2))
        return (lambda: sdpa(q, k, v, True)), "F.scaled_dot_product_attention(causal)" + (" enable_gqa" if GQA else "")
    if op == "decode_attention":
        b, kh, kv, hd = d["batch"], d["kv_heads"], d["kv_len"], d["head_dim"]
        q = randn(b, d["heads"], 1, hd)
        k, v = (randn(b, kh, kv, hd) for _ in range(2))
        return (lambda: sdpa(q, k, v, False)), "F.scaled_dot_product_attention" + (" enable_gqa" if GQA else "")
    if op == "paged_decode_attention":
        b, kh, kv, hd, bs = d["batch"], d["kv_heads"], d["kv_len"], d["head_dim"], d["block_size"]
        per_seq = -(-kv // bs)
        blocks = b * per_seq + 3
        k_pool, v_pool = (randn(blocks, bs, kh, hd) for _ in range(2))
        table = torch.randperm(blocks, device=DEV, generator=gen)[: b * per_seq].view(b, per_seq)
        q = randn(b, d["heads"], 1, hd)

        def paged():
            k = k_pool[table].view(b, per_seq * bs, kh, hd)[:, :kv].transpose(1, 2)
            v = v_pool[table].view(b, per_seq * bs, kh, hd)[:, :kv].transpose(1, 2)
            return sdpa(q, k, v, False)

        return paged, "pool[block_table] gather, then F.scaled_dot_product_attention"
    if op == "fused_moe":
        m, e, top_k, n = d["M"], d["experts"], d["top_k"], d["N"]
        w, a = randn(e, n, d["K"], scale=d["K"] ** -0.5), randn(m, d["K"])
        ids = torch.rand(m, e, device=DEV, generator=gen).argsort(dim=1)[:, :top_k]

        def moe():  # transformers' MixtralSparseMoeBlock loop, for the gate/up projection of each (token, expert)
            out = a.new_empty(m * top_k, n)
            mask = F.one_hot(ids, num_classes=e).permute(2, 1, 0)
            for expert in range(e):
                j, t = torch.where(mask[expert])
                out[t * top_k + j] = a[t] @ w[expert].T
            return out

        return moe, "per-expert loop: one_hot mask, torch.where, a[t] @ w[e].T"
    if op in ("dequant_gemv", "dequant_matmul"):
        n, k = d["N"], d["K"]
        i32 = torch.int32
        qweight = torch.randint(-(2**31), 2**31 - 1, (k // 8, n), device=DEV, dtype=i32, generator=gen)
        qzeros = torch.randint(-(2**31), 2**31 - 1, (k // GROUP, n // 8), device=DEV, dtype=i32, generator=gen)
        scales = torch.rand(k // GROUP, n, device=DEV, generator=gen).to(DT) * 0.002 + 0.002
        shifts = torch.arange(0, 32, 4, device=DEV, dtype=i32)
        x = randn(d["M"], k)

        def dequant():  # GPTQ's torch path: unpack the nibbles, subtract the zeros, scale, then the product
            q = ((qweight[:, None, :] >> shifts[None, :, None]) & 15).view(k, n)
            z = ((qzeros[:, :, None] >> shifts[None, None, :]) & 15).view(k // GROUP, n)
            w = (q.view(k // GROUP, GROUP, n) - z[:, None, :]).to(DT) * scales[:, None, :]
            return x @ w.view(k, n)

        return dequant, "unpack int4 (>> and & 15), (q - z) * s, then x @ w"
    raise ValueError(f"no torch op for {op!r}")


# class Clock: common.TORCH_CLOCK, put before this script


clock = Clock()
print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}), flush=True)
with torch.inference_mode():
    for line in sys.stdin:  # one case a line; one answer a line
        case = json.loads(line)
        try:
            fn, how = build(case["op"], case["dims"])
            fn()
            torch.cuda.synchronize()
            times = time_calls(fn, args["warmup"], args["calls"], args["repeats"], clock, args["gpu_calls"])
            answer = dict(times, torch_op=how)
        except Exception as e:  # recorded with its reason; the other cases still run
            answer = {"error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"}
        fn = None
        torch.cuda.empty_cache()
        print(json.dumps(answer), flush=True)
"""
)


def peer_script() -> str:
    """The peer's source: `time_calls` then `PEER_SCRIPT`."""
    return common.TORCH_CLOCK + inspect.getsource(time_calls) + PEER_SCRIPT


class PeerFailed(RuntimeError):
    """The torch peer's process did not answer (no torch, it died, it took longer than --peer-timeout)."""


class Peer:
    """The torch peer: one process for the whole run, asked for each case right after nbxcert's side measured it (so
    both sides of a case are timed minutes apart at most, on the same machine state), idle while nbxcert's side runs.
    Its first line names torch's version and the device."""

    def __init__(self, args):
        settings = {
            "warmup": args.warmup,
            "calls": args.calls,
            "repeats": args.repeats,
            "eps": NORM_EPS,
            "gpu_calls": min(args.calls, args.gpu_calls),
            "rope_base": ROPE_BASE,
            "group": QUANT_GROUP,
        }
        self.timeout = args.peer_timeout
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - the peer's stderr for its life, closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", peer_script(), json.dumps(settings)],
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
        )
        self.info = self._answer()

    def _answer(self) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        line = self.proc.stdout.readline() if ready else None
        if not line:
            self.close()
            self.stderr.seek(0)
            said = self.stderr.read().strip().splitlines()
            why = said[-1] if said else f"exit {self.proc.returncode}"
            raise PeerFailed(why if ready else f"no answer in {self.timeout} s ({why})")
        return json.loads(line)

    def measure(self, case: Case) -> dict:
        """torch's times of `case` (or {"error": ...} where torch's side of it raised)."""
        try:
            self.proc.stdin.write(json.dumps({"id": case.id, "op": case.op, "dims": case.dims}) + "\n")
            self.proc.stdin.flush()
        except OSError as e:
            raise PeerFailed(f"the peer's process is gone ({e})") from None
        return self._answer()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


# --- the report -------------------------------------------------------------------------------------------------------
def merge(records: list[dict], torch_cases: dict) -> None:
    """Torch's figures (`torch_cases`: by case id) and the verdict into each record: met = host <= TARGET_US and
    host <= torch's host time (False when the first fails; None when torch's figure is missing and the first holds)."""
    for r in records:
        theirs = torch_cases.get(r["id"], {})
        r["torch_op"] = theirs.get("torch_op")
        r["torch_host_us"], r["torch_gpu_us"] = theirs.get("host_us"), theirs.get("gpu_us")
        r["torch_host_us_runs"], r["torch_gpu_us_runs"] = theirs.get("host_us_runs"), theirs.get("gpu_us_runs")
        if "error" in theirs:
            r["torch_error"] = theirs["error"]
        host = r.get("host_us")
        r["met_target"] = None if host is None else host <= TARGET_US
        r["met_torch"] = None if host is None or r["torch_host_us"] is None else host <= r["torch_host_us"]
        if r["met_target"] is None or r["met_target"] is False:
            r["met"] = r["met_target"]
        else:
            r["met"] = r["met_torch"]
        gpu = r.get("gpu_us")
        r["bound"] = None if host is None or gpu is None else ("host" if host > gpu else "gpu")


def _us(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def table(records: list[dict]) -> list[str]:
    """The markdown table, one line per case."""
    lines = [
        "| op | phase | shape | served as | plan | host us | launches | of it, launches alone us | torch host us "
        "| GPU us | torch GPU us | met |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['op']} | {r['phase']} | {r['shape']} | failed: {r['error']} | | | | | | | | no |")
            continue
        met = {True: "yes", False: "no", None: "-"}[r["met"]]
        plan = ("replayed in C" if r.get("replayed_in_c") else "replayed") if r["plan_replayed"] else "none"
        plan += ", one graph" if r.get("plan_as_graph") else ""
        lines.append(
            f"| {r['op']} | {r['phase']} | {r['shape']} | {r['served_as']} | {plan} | {_us(r['host_us'])} | "
            f"{r.get('launches', '-')} | {_us(r.get('launches_only_host_us'))} | {_us(r['torch_host_us'])} | "
            f"{_us(r['gpu_us'])} | {_us(r['torch_gpu_us'])} | {met} |"
        )
    return lines


def summary(records: list[dict], peer_ran: bool) -> str:
    met = sum(1 for r in records if r.get("met"))
    line = f"{met}/{len(records)} cases met (host <= {TARGET_US:g} us and <= torch eager's)"
    if not peer_ran:
        within = sum(1 for r in records if r.get("met_target"))
        line += f"; no torch figures: {within}/{len(records)} within {TARGET_US:g} us"
    return line


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write dispatch.json and dispatch.md into this directory")
    parser.add_argument("--ops", help=f"comma-separated, of: {', '.join(OPS)} (default: all)")
    parser.add_argument("--calls", type=int, default=200, help="calls per timed run (default 200)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per case, the median taken (default 5)")
    parser.add_argument("--warmup", type=int, default=20, help="calls after the first, before timing (default 20)")
    parser.add_argument("--gpu-calls", type=int, default=50, help="calls per GPU run (default 50, at most --calls)")
    parser.add_argument(
        "--uncertified",
        choices=("default", "sweep"),
        default=os.environ.get("NBXCERT_UNCERTIFIED") or "default",
        help="what a key with no certificate gets (NBXCERT_UNCERTIFIED; default: default)",
    )
    parser.add_argument("--tiny", action="store_true", help="every case at small dims (the interpreter, tests)")
    parser.add_argument("--no-peer", action="store_true", help="skip the torch peer")
    parser.add_argument("--peer-timeout", type=int, default=600, help="seconds to wait for each torch peer answer")
    parser.add_argument(
        "--replay",
        choices=("plan", "launches", "steps"),
        default="plan",
        help="plan: a plan's launches queued by nbxcert's launcher in one call, several as one CUDA graph (the "
        "default); launches: the same call, one cuLaunchKernelEx per launch (a diagnosis: the graph's absence); "
        "steps: one call into Triton's launcher per launch (a diagnosis: the plan launcher's absence)",
    )
    return parser.parse_args(argv)


class _TorchHidden:
    """A `sys.meta_path` finder refusing torch (as benchmarks/gpu_env.sh's sitecustomize does for the GPU tests)."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is hidden in nbxcert's process (bench_dispatch); the torch peer has its own")
        return None


def hide_torch() -> None:
    """Make torch unimportable in this process before anything else loads: Triton 3.6 imports it when it can (its
    argument specializer tries to), and the process measured must be the torch-free one an nbxcert application runs.
    The peer's process, started afresh, imports it."""
    if not any(isinstance(f, _TorchHidden) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchHidden())


def main(argv=None) -> int:
    args = parse_args(argv)
    hide_torch()
    try:
        ops = selected_ops(args.ops)
    except UnknownOp as e:
        print(f"bench_dispatch: {e}", file=sys.stderr)
        return 1
    if min(args.calls, args.repeats, args.gpu_calls) < 1 or args.warmup < 0:
        print(
            "bench_dispatch: --calls, --repeats and --gpu-calls must be at least 1, --warmup at least 0",
            file=sys.stderr,
        )
        return 1
    os.environ["NBXCERT_UNCERTIFIED"] = args.uncertified  # read when serving's state is first made, below
    from nbxcert import serving
    from nbxcert.kernels import launch

    launch.REPLAY_IN_C = args.replay in ("plan", "launches")
    launch.PLAN_GRAPHS = args.replay == "plan"
    from nbxcert.errors import NbxcertError
    from nbxcert.kernels.backends import select

    try:
        choice = select()
    except NbxcertError as e:
        print(f"bench_dispatch: {e}", file=sys.stderr)
        return 1
    print(choice.line(), flush=True)
    if choice.name != "cuda" and not args.tiny:
        print(
            "bench_dispatch: the full-size cases need a GPU; --tiny runs small ones on the interpreter", file=sys.stderr
        )
        return 1
    from nbxcert.kernels import matmul as mm
    from nbxcert.kernels import quant

    cases = cases_for(model_dims(args.tiny, min(mm.GEMV_MAX_M, quant.GEMV_MAX_M)), ops)
    st = serving.state()
    print(
        f"profile {st.profile.key} ({st.memory_class} class), {len(st.index)} certified keys; uncertified keys: "
        f"{st.uncertified}; {len(cases)} cases, {args.calls} calls x {args.repeats} runs",
        flush=True,
    )
    torch_info = None
    peer = None
    if choice.name != "cuda":
        print("torch peer: not run (no GPU)")
    elif not args.no_peer:
        t0 = time.perf_counter()
        try:
            peer = Peer(args)
            torch_info = dict(peer.info)
            print(
                f"torch peer: torch {torch_info['torch']} on {torch_info['device']} "
                f"(started in {time.perf_counter() - t0:.1f} s)",
                flush=True,
            )
        except PeerFailed as e:
            torch_info = {"error": str(e)}
            print(f"torch peer failed: {e}", flush=True)
    t0 = time.perf_counter()
    try:
        records, theirs = run_cases(cases, choice.device, args, peer, lambda s: print(s, flush=True))
    finally:
        if peer is not None:
            peer.close()
    print(f"{len(cases)} cases in {time.perf_counter() - t0:.1f} s", flush=True)
    if "torch" in sys.modules:
        print(
            "bench_dispatch: torch was imported in nbxcert's own process; nothing here may import it", file=sys.stderr
        )
        return 1
    if "error" in theirs:
        torch_info = dict(torch_info or {}, error=theirs.pop("error"))
    failed = any("error" in r for r in records) or any("error" in v for v in theirs.values())
    failed = failed or (torch_info is not None and "error" in torch_info)
    merge(records, theirs)
    lines = table(records)
    peer_ran = any(r.get("torch_host_us") is not None for r in records)
    doc = {
        "device": choice.device if choice.name != "cuda" else _device_name(),
        "backend": choice.name,
        "profile": st.profile.key,
        "memory_class": st.memory_class,
        "uncertified": st.uncertified,
        "tiny": args.tiny,
        "replay": args.replay,
        "target_us": TARGET_US,
        "calls": args.calls,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "gpu_calls": min(args.calls, args.gpu_calls),
        "torch": torch_info,
        "summary": summary(records, peer_ran),
        "cases": records,
    }
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "dispatch.json").write_text(json.dumps(doc, indent=1))
        (out / "dispatch.md").write_text("\n".join(lines + ["", doc["summary"]]) + "\n")
    print()
    print("\n".join(lines))
    print(doc["summary"])
    return 1 if failed else 0


def _device_name() -> str:
    from nbxcert.kernels.backends import cuda

    return cuda.device_info(0).name


if __name__ == "__main__":
    sys.exit(main())
