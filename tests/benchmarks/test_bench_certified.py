"""The pure parts of `benchmarks/bench_certified.py`: reading certify logs and the ratio distribution it reports."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_certified as bc  # noqa: E402
from clitools import check  # noqa: E402


def test_a_certify_log_is_read_line_by_line():
    text = (
        "[nbxcert] backend: cuda\n"
        "[nbxcert] 1/3 certified rmsnorm[n_cols=64,n_rows=8;float16,float16]@v1 in 2.0 s "
        "(compile 0.5, oracle 0.4, checks 0.6, timing 0.5): ROWS=1,warps=4,stages=1\n"
        "[nbxcert] 2/3 skipped matmul[K=64,M=8,N=192;float16,float16]@v1: already certified for this card\n"
        "[nbxcert] 3/3 failed softmax[mask=none,n_cols=9,n_rows=1;float16]@v1 in 1.0 s "
        "(compile 0.1, oracle 0.2, checks 0.3, timing 0.4): mismatch: ...\n"
    )
    rows = bc.parse_log(text)
    assert [r["status"] for r in rows] == ["certified", "skipped", "failed"]
    assert rows[0] == {
        "status": "certified",
        "key": "rmsnorm[n_cols=64,n_rows=8;float16,float16]@v1",
        "total": 2.0,
        "compile": 0.5,
        "oracle": 0.4,
        "checks": 0.6,
        "timing": 0.5,
    }
    assert "total" not in rows[1]


def test_a_certify_line_with_inputs_and_oracle_as_parts_is_read(tmp_path):
    # as `nbxcert certify` writes a key now: compile, inputs, oracle, checks, timing and record, adding up to the total
    text = (
        "[nbxcert] 6/526 certified matmul[K=3584,M=1,N=3584,aligned=1,trans_a=0,trans_b=1;float16,float16]@v1 in 2.0 s "
        "(compile 0.2, inputs 0.4, oracle 0.3, checks 0.6, timing 0.5, record 0.0): BLOCK_M=16\n"
    )
    rows = bc.parse_log(text)
    assert rows[0] == {
        "status": "certified",
        "key": "matmul[K=3584,M=1,N=3584,aligned=1,trans_a=0,trans_b=1;float16,float16]@v1",
        "total": 2.0,
        "compile": 0.2,
        "inputs": 0.4,
        "oracle": 0.3,
        "checks": 0.6,
        "timing": 0.5,
        "record": 0.0,
        "runner_oracle": pytest.approx(0.7),
    }
    log = tmp_path / "certify.log"
    log.write_text(text)
    result = bc.throughput(argparse.Namespace(logs=[str(log)], workload=None, profile="hopper"))
    assert result["shares"]["inputs"] == pytest.approx(0.2) and result["shares"]["oracle"] == pytest.approx(0.15)
    assert result["runners_inputs_and_oracle_share"] == pytest.approx(0.35)


def test_a_certify_line_of_2026_12_04_is_read_with_its_parts_and_the_runners_work_apart(tmp_path):
    # as `nbxcert certify` wrote a key on 2026-12-04: wall parts compile, checks, timing and record (an H200 log)
    text = (
        "[nbxcert] 6/526 certified matmul[K=3584,M=1,N=3584,aligned=1,trans_a=0,trans_b=1;float16,float16]@v1 in 4.7 s "
        "(compile 3.1, checks 1.2, timing 0.4, record 0.0; in the runners, inputs and oracle 0.6): BLOCK_M=16\n"
        "[nbxcert] 7/526 certified add_rmsnorm[n_cols=3584,n_rows=1;float16,float16]@v1 in 1.3 s "
        "(compile 0.4, checks 0.3, timing 0.6, record 0.0; in the runners, inputs and oracle 0.0): ROWS=1\n"
    )
    rows = bc.parse_log(text)
    assert rows[0] == {
        "status": "certified",
        "key": "matmul[K=3584,M=1,N=3584,aligned=1,trans_a=0,trans_b=1;float16,float16]@v1",
        "total": 4.7,
        "compile": 3.1,
        "checks": 1.2,
        "timing": 0.4,
        "record": 0.0,
        "runner_oracle": 0.6,
    }
    log = tmp_path / "certify.log"
    log.write_text(text)
    result = bc.throughput(argparse.Namespace(logs=[str(log)], workload=None, profile="hopper"))
    assert result["keys_certified"] == 2 and result["keys_per_minute"] == pytest.approx(60 * 2 / 6.0)
    assert result["shares"] == pytest.approx({"compile": 3.5 / 6, "checks": 1.5 / 6, "timing": 1.0 / 6, "record": 0.0})
    assert result["runners_inputs_and_oracle_share"] == pytest.approx(0.6 / 6.0)


def test_throughput_divides_by_the_runs_clock_where_the_log_has_it(tmp_path):
    # as `nbxcert certify` writes a key now: the run's clock at the end (`at T s`); 2.5 s passed between the keys
    text = (
        "[nbxcert] 1/3 skipped rmsnorm[n_cols=64,n_rows=8;float16,float16]@v1 at 0.4 s: already certified\n"
        "[nbxcert] 2/3 certified matmul[K=64,M=8,N=192;float16,float16]@v1 in 2.0 s "
        "(compile 0.2, inputs 0.4, oracle 0.3, checks 0.6, timing 0.5, record 0.0) at 3.0 s: BLOCK_M=16\n"
        "[nbxcert] 3/3 certified softmax[mask=none,n_cols=9,n_rows=1;float16]@v1 in 1.0 s "
        "(compile 0.1, inputs 0.1, oracle 0.2, checks 0.3, timing 0.3, record 0.0) at 6.0 s: ROWS=1\n"
    )
    rows = bc.parse_log(text)
    assert [r.get("at") for r in rows] == [0.4, 3.0, 6.0] and rows[1]["total"] == 2.0
    log = tmp_path / "certify.log"
    log.write_text(text)
    result = bc.throughput(argparse.Namespace(logs=[str(log)], workload=None, profile="hopper"))
    assert result["wall_seconds"] == 6.0 and "at T s" in result["wall_basis"]
    assert result["keys_per_minute"] == pytest.approx(60 * 2 / 6.0)
    assert result["keys_per_minute_per_shard"] == pytest.approx(60 * 2 / 3.0)  # the keys' own times
    by_kernel = result["by_kernel"]
    assert list(by_kernel) == ["matmul", "softmax"]  # the largest total first
    assert by_kernel["matmul"] == {"keys": 1, "seconds": 2.0} | {part: rows[1][part] for part in bc.WALL_PARTS}
    assert by_kernel["softmax"]["keys"] == 1 and by_kernel["softmax"]["timing"] == 0.3


def test_throughput_of_a_log_without_key_clocks_counts_from_its_last_progress_line(tmp_path):
    # a 2026-12-04 log: heartbeat lines `(N s)`, then a traceback of the interrupted run that must not hide the last
    text = (
        "[nbxcert] certify nvidia/hopper: 0/3 keys done (5 s)\n"
        "[nbxcert] 1/3 certified matmul[K=64,M=8,N=192;float16,float16]@v1 in 2.0 s "
        "(compile 0.2, inputs 0.4, oracle 0.3, checks 0.6, timing 0.5, record 0.0): BLOCK_M=16\n"
        "[nbxcert] certify nvidia/hopper: 1/3 keys done; softmax: compiling 4 candidates (10 s)\n"
        "Process SpawnProcess-3:\n"
        "[nbxcert] 2/3 certified softmax[mask=none,n_cols=9,n_rows=1;float16]@v1 in 1.5 s "
        "(compile 0.1, inputs 0.1, oracle 0.2, checks 0.3, timing 0.8, record 0.0): ROWS=1\n"
        "nbxcert: interrupted\n"
    )
    log = tmp_path / "certify.log"
    log.write_text(text)
    result = bc.throughput(argparse.Namespace(logs=[str(log)], workload=None, profile="hopper"))
    assert result["wall_seconds"] == pytest.approx(11.5) and "lower bound" in result["wall_basis"]
    assert result["keys_per_minute"] == pytest.approx(60 * 2 / 11.5)


def test_a_log_wrapped_at_80_columns_with_a_ptxas_dump_is_read_too():
    # as the H200 logs of 2026-11-29 have it (Rich wrapped each key's line; Triton printed a crashed ptxas's PTX)
    text = (
        "[nbxcert] backend: cuda (an NVIDIA GPU answers through libcuda)\n"
        "[nbxcert] 142/526 certified \n"
        "flash_attention[aligned=1,batch=1,causal=1,head_dim=64,heads=32,kv_heads=4,kv_le\n"
        "n=16,q_len=16;bfloat16]@v1 in 5.6 s (compile 4.3, oracle 0.0, checks 0.4, timing\n"
        "0.8): BLOCK_M=64,BLOCK_N=64,TMA=0,warps=4,stages=2\n"
        "\n"
        "================================================================\n"
        "`ptxas` failed with error code -11\n"
        "//\n"
        "[nbxcert] 1/2 certified fake[x=1]@v1 in 1.0 s (compile 1.0, oracle 0.0, checks 0.0, timing 0.0): A=1\n"
        "================================================================\n"
        "please share the reproducer above with Triton project.\n"
        "[nbxcert] 143/526 certified \n"
        "matmul[K=2048,M=1,N=11264,aligned=1,trans_a=0,trans_b=1;bfloat16,bfloat16]@v1 in\n"
        "1.7 s (compile 0.8, oracle 0.6, checks 0.1, timing 0.8): \n"
        "BLOCK_M=16,BLOCK_N=64,KIND=tiled,warps=4,stages=4\n"
        "┏━━━━━━━━┓\n"
    )
    rows = bc.parse_log(text)
    assert [r["key"] for r in rows] == [
        "flash_attention[aligned=1,batch=1,causal=1,head_dim=64,heads=32,kv_heads=4,kv_len=16,q_len=16;bfloat16]@v1",
        "matmul[K=2048,M=1,N=11264,aligned=1,trans_a=0,trans_b=1;bfloat16,bfloat16]@v1",
    ]
    assert rows[0]["timing"] == 0.8 and rows[1]["total"] == 1.7 and rows[1]["oracle"] == 0.6


def test_the_distribution_names_the_worst_keys():
    rows = [{"key": f"k{i}", "x": float(i)} for i in range(1, 101)] + [{"key": "none", "x": None}]
    d = bc.distribution(rows, "x", worst=3)
    assert d["n"] == 100 and d["median"] == 50.5 and d["p5"] == 6.0
    assert [w["key"] for w in d["worst"]] == ["k1", "k2", "k3"]
    assert bc.distribution([], "x") == {"n": 0}


def test_winners_reads_every_entry_with_a_timed_default():
    import argparse
    import json

    root = Path(__file__).resolve().parents[2] / "certificates"
    entries = {}
    for f in (root / "cpu" / "interpreter").glob("*.json"):
        entries.update(json.loads(f.read_text())["entries"])
    timed = [e for e in entries.values() if e.get("default") and e["default"].get("timing")]
    out = bc.winners(argparse.Namespace(dir=str(root), profile="interpreter", workload=""))
    assert out["all"]["n"] == len(timed) > 0
    assert sum(k["keys"] for k in out["kernels"].values()) == len(timed)
    best = max(e["default"]["timing"]["median_us"] / e["winner"]["timing"]["median_us"] for e in timed)
    assert out["best"]["x_default"] == best
    # the kernels serving these keys compiles: one per kernel, dtypes and winner config
    from nbxcert.keys import parse_key

    keys = {k: parse_key(k) for k in entries}
    winners = {
        (keys[k].kernel, tuple(keys[k].dtypes), json.dumps(e["winner"]["config"], sort_keys=True))
        for k, e in entries.items()
    }
    assert out["keys"] == len(entries) and out["distinct_winners"] == len(winners)
    # --workload: only that workload's certified keys (tinyllama-1.1b's 526 of the shipped Hopper certificates)
    every = bc.winners(argparse.Namespace(dir=str(root), profile="hopper", workload=""))
    tiny = bc.winners(argparse.Namespace(dir=str(root), profile="hopper", workload="tinyllama-1.1b"))
    assert tiny["all"]["n"] == 526 < every["all"]["n"] and tiny["workload"] == "tinyllama-1.1b"
    # keys that share a kernel, dtypes and winner share a compile: the Hopper keys have such (the demo's 23 may not)
    assert 0 < every["distinct_winners"] < every["keys"]


def test_shard_text_is_read_and_refused_when_out_of_range():
    assert bc._shard("1/2") == (1, 2)
    for bad in ("2/2", "x", "1/0", "-1/2"):
        with pytest.raises(SystemExit, match="--shard"):
            bc._shard(bad)


def test_quality_of_a_shard_times_every_nth_key(tmp_path, monkeypatch):
    """`quality --shard 1/2` measures the second and fourth of the workload's first four certified keys
    (interpreter: the figures only exercise the script) and says which shard it is."""
    monkeypatch.setenv("NBXCERT_BACKEND", "interpreter")

    def rows(shard):
        out = tmp_path / f"q{shard.replace('/', '_')}.json"
        args = [
            "quality",
            "--workload",
            "demo",
            "--dir",
            str(ROOT / "certificates"),
            "--limit",
            "4",
            "--shard",
            shard,
            "--resweep-every",
            "0",
            "--out",
            str(out),
        ]
        assert bc.main(args) == 0
        result = json.loads(out.read_text())
        assert result["shard"] == shard
        return [r["key"] for r in result["rows"]]

    every = rows("0/1")
    assert len(every) == 4 and rows("1/2") == every[1::2]


def test_quality_stopped_early_says_where_to_go_on_and_start_goes_on_there(tmp_path, monkeypatch):
    """`--stop-after` ends the loop before an outer time limit would (the peer then still runs over the keys measured)
    and `--start` measures a shard's keys after those: together they are the shard, in order."""
    monkeypatch.setenv("NBXCERT_BACKEND", "interpreter")
    base = ["quality", "--workload", "demo", "--dir", str(ROOT / "certificates"), "--limit", "4"]
    base += ["--resweep-every", "0"]

    def run(*extra):
        out = tmp_path / "q.json"
        assert bc.main(base + list(extra) + ["--out", str(out)]) == 0
        return json.loads(out.read_text())

    every = [r["key"] for r in run()["rows"]]
    stopped = run("--stop-after", "0")
    assert stopped["stopped"] and stopped["keys_measured"] == 0 and not stopped["interrupted"]
    rest = run("--start", "1")
    assert [r["key"] for r in rest["rows"]] == every[1:] and rest["start"] == 1 and not rest["stopped"]


def test_quality_of_some_kernels_times_only_their_keys(tmp_path, monkeypatch):
    """`quality --kernels` keeps the keys of the kernels named (the attention keys again, against a corrected peer)
    and refuses a name no certified key of the workload has."""
    monkeypatch.setenv("NBXCERT_BACKEND", "interpreter")
    out = tmp_path / "q.json"
    base = ["quality", "--workload", "demo", "--dir", str(ROOT / "certificates"), "--resweep-every", "0"]
    assert bc.main(base + ["--kernels", "rmsnorm,softmax", "--limit", "3", "--out", str(out)]) == 0
    kernels = [r["kernel"] for r in json.loads(out.read_text())["rows"]]
    assert len(kernels) == 3 and set(kernels) <= {"rmsnorm", "softmax"}
    with pytest.raises(SystemExit, match="--kernels rmsnorn: no certified key of demo"):
        bc.main(base + ["--kernels", "rmsnorn,softmax", "--out", str(out)])


def test_serving_times_the_served_the_built_and_the_raw_launch_and_profiles_them(tmp_path):
    """The serving measurement on the interpreter, over a directory holding its one certified key: every path is
    timed in each round, the overhead is taken against the raw `kernel[grid](...)`, and --profile records both."""
    env = dict(os.environ, NBXCERT_BACKEND="interpreter")
    key = "rmsnorm[n_cols=64,n_rows=1;float16,float16]@v1"
    run = [sys.executable, "-m", "nbxcert", "certify", "--profile", "interpreter", "--key", key, "--out", str(tmp_path)]
    check(subprocess.run(run, env=env, capture_output=True, text=True, timeout=600), 0)
    out = tmp_path / "serving.json"
    bench = [sys.executable, str(ROOT / "benchmarks" / "bench_certified.py"), "serving", "--dir", str(tmp_path)]
    bench += ["--cols", "64", "--calls", "3", "--repeats", "2", "--profile", "--out", str(out)]
    check(subprocess.run(bench, env=env, capture_output=True, text=True, timeout=600), 0)
    result = json.loads(out.read_text())
    assert result["backend"] == "interpreter" and result["problem"] == {"n_rows": 1, "n_cols": 64}
    assert {name: len(v) for name, v in result["runs_us"].items()} == {
        "served": 2,
        "served_alloc": 2,
        "direct": 2,
        "raw": 2,
        "lookup": 2,
    }
    assert result["overhead_us"] == pytest.approx(result["served_us"] - result["raw_us"])
    assert all(any("function calls" in line for line in result["profiles"][p]) for p in ("served", "raw"))
    assert any("(rmsnorm)" in line for line in result["profiles"]["served"])
    assert not any("(rmsnorm)" in line for line in result["profiles"]["raw"])


def test_the_common_prefix_ratio_compares_the_same_launches():
    fast = {"launches": 4, "elapsed": [1.0, 2.0, 3.0, 4.0]}
    assert bc.prefix_ratio(fast, {"launches": 4, "elapsed": [10.0, 20.0, 30.0, 40.0]})["ratio"] == 10.0
    cut = {"cut_at_limit": True, "reached": {"launches": 2, "elapsed_s": 30.0}}
    assert bc.prefix_ratio(fast, cut) == {"launches": 2, "of": 4, "slow_s": 30.0, "fast_s": 2.0, "ratio": 15.0}
    assert bc.prefix_ratio(fast, {"cut_at_limit": True, "reached": {"launches": 0}}) is None
    assert bc.prefix_ratio({"wall_s": 1.0, "error": "x"}, cut) is None


def test_coldstart_runs_the_sequence_certified_and_swept_and_reads_a_cut_run(tmp_path, monkeypatch):
    """On the interpreter, the demo's first two launches: the certified runs serve them (no sweep), the swept run
    sweeps; with a limit the swept run cannot meet, it is cut and reports the launches it reached (possibly none).
    The runs' caches and empty directories go when the runs end (each left a Triton cache behind before)."""
    monkeypatch.setenv("NBXCERT_BACKEND", "interpreter")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(bc.tempfile, "tempdir", str(scratch))
    out = tmp_path / "cold.json"
    args = [
        "coldstart",
        "--workload",
        "demo",
        "--dir",
        str(ROOT / "certificates"),
        "--max-launches",
        "2",
        "--certified-limit",
        "300",
        "--sweep-limit",
        "300",
        "--out",
        str(out),
    ]
    assert bc.main(args) == 0
    result = json.loads(out.read_text())
    for run in ("certified", "certified_warmed", "certified_restart", "runtime_sweep"):
        assert result[run]["launches"] == 2 and len(result[run]["elapsed"]) == 2, result[run]
        assert result[run]["elapsed"] == sorted(result[run]["elapsed"])
    # where the certified run's time before its first launch went, in order
    startup = result["certified"]["startup_s"]
    marks = ["imports", "backend", "certificates", "first_inputs", "first_config"]
    assert list(startup) == marks and [startup[m] for m in marks] == sorted(startup.values())
    assert startup["first_config"] <= result["certified"]["elapsed"][0]
    # the warmed run's pool went on in the background (nbxcert.warm.start) over the workload's 23 certified keys
    warmed = result["certified_warmed"]
    assert result["warm"] == "background" and warmed["background_done"]
    assert warmed["background_winners"] == 23 and warmed["background_failed"] == 0
    assert warmed["background_compiled"] == 0  # the interpreter compiles nothing
    prefix = result["speedup_over_common_prefix"]
    assert prefix["launches"] == 2 and prefix["ratio"] > 1.0
    assert not result["speedup_is_lower_bound"]
    # the blocking warm-up (--warm block): the winners compiled before the first launch, its time counted apart
    block = bc._cold_run(
        "demo", bc._device()[1], str(ROOT / "certificates"), True, limit_s=300, warm="block", max_launches=2
    )
    assert block["launches"] == 2 and block["warm_s"] > 0 and "background_done" not in block
    assert block["startup_s"]["certificates"] >= block["warm_s"]
    cut = bc._cold_run("demo", bc._device()[1], str(tmp_path / "empty"), False, limit_s=1.0, max_launches=3)
    assert cut["cut_at_limit"] and cut["reached"]["launches"] in (0, 1, 2)
    # one part of a sequence measured in parts: it starts where the last ended and says where the next starts
    part = bc._cold_run(
        "demo", bc._device()[1], str(tmp_path / "empty"), False, limit_s=300, from_launch=1, max_launches=1
    )
    assert part["launches"] == 1 and part["next_launch"] == 2 and part["carried_hits"] == []
    # a launch whose key an earlier part swept (its winner in the run-time cache that part left) is counted apart:
    # the whole run's process had that winner loaded; here it may compile it
    kept = str(tmp_path / "parts")
    for expected in (0, 1):
        again = bc._cold_run(
            "demo",
            bc._device()[1],
            str(tmp_path / "empty"),
            False,
            limit_s=300,
            from_launch=1,
            max_launches=1,
            cache_dir=kept,
        )
        assert [h[0] for h in again["carried_hits"]] == [1] * expected
        assert all(0 < h[1] <= again["elapsed"][0] for h in again["carried_hits"])
    # a part told to stop starts no launch past its time (here: none at all) and says the next is the one it would
    # have started
    stopped = bc._cold_run(
        "demo", bc._device()[1], str(tmp_path / "empty"), False, limit_s=300, from_launch=1, stop_after=1e-9
    )
    assert stopped["launches"] == 0 and stopped["next_launch"] == 1
    assert list(scratch.iterdir()) == []


def test_coldstart_can_build_the_certificate_index_before_the_timed_process(tmp_path, monkeypatch):
    """`index_built` (the `bundled_index` run): `nbxcert index build` into the run's own nbxcert cache before the
    process starts, which then finds the index built (no build counted in its start); a directory the build refuses
    ends the benchmark in one line naming it."""
    monkeypatch.setenv("NBXCERT_BACKEND", "interpreter")
    built: list = []
    real = bc.subprocess.run

    def run(cmd, **kw):
        if cmd[1:4] == ["-m", "nbxcert", "index"]:
            built.append(cmd)
            done = real(cmd, **kw)
            if done.returncode == 0:
                assert list(Path(cmd[-1]).glob("*.nbxidx")), "the index is in the run's cache before it starts"
            return done
        return real(cmd, **kw)

    monkeypatch.setattr(bc.subprocess, "run", run)
    cert_dir = str(ROOT / "certificates")
    result = bc._cold_run("demo", bc._device()[1], cert_dir, True, limit_s=300, max_launches=1, index_built=True)
    assert result["launches"] == 1 and result["index_built"] is True
    assert len(built) == 1 and built[0][5] == cert_dir
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "nvidia" / "hopper").mkdir(parents=True)
    (bad / "nvidia" / "hopper" / "rmsnorm.float16.json").write_text("{")
    with pytest.raises(SystemExit, match="nbxcert index build .*bad failed"):
        bc._cold_run("demo", bc._device()[1], str(bad), True, limit_s=300, max_launches=1, index_built=True)


def test_coldstart_writes_each_runs_cprofile_report_when_asked(tmp_path, monkeypatch):
    """`--cprofile-out PREFIX`: the chosen run's child under cProfile, its top functions in PREFIX.<run>.txt."""
    monkeypatch.setenv("NBXCERT_BACKEND", "interpreter")
    prefix = tmp_path / "prof"
    args = ["coldstart", "--workload", "demo", "--dir", str(ROOT / "certificates"), "--max-launches", "1"]
    args += ["--runs", "certified", "--cprofile-out", str(prefix), "--out", str(tmp_path / "cold.json")]
    assert bc.main(args) == 0
    assert json.loads((tmp_path / "cold.json").read_text())["certified"]["launches"] == 1
    text = (tmp_path / "prof.certified.txt").read_text()
    assert "function calls" in text and "Ordered by: internal time" in text and "Ordered by: cumulative time" in text
    # the child's own calls (its top 40 by each order: the demo's launch was among them on a quiet host, and not on a
    # loaded 2-core one, where the imports and the device file's YAML outranked it)
    assert "nbxcert" in text and "kernels" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cold.json", "prof.certified.txt"]


def test_report_joins_a_workloads_shards_and_refuses_a_key_measured_twice(tmp_path):
    """`report` over two shard files: one distribution over all their keys, the peer's by kernel, the default's per
    kernel, the certified time against the time now; a shard given twice is refused by name."""

    def row(key, kernel, winner, certified, default=None, peer=None):
        r = {"key": key, "kernel": kernel, "winner_us": winner, "certified_us": certified}
        if default is not None:
            r.update(default_us=default, x_default=default / winner)
        if peer is not None:
            r.update(peer_us=peer, x_peer=peer / winner)
        return r

    a = [row("m1", "matmul", 10.0, 11.0, 20.0, 9.0), row("r1", "rmsnorm", 2.0, 2.0, 3.0)]
    b = [row("m2", "matmul", 10.0, 9.0, 30.0, 12.0), row("d1", "decode_attention", 4.0, 4.0, 4.0, 8.0)]
    files = []
    for i, rows in enumerate((a, b)):
        files.append(tmp_path / f"s{i}.json")
        files[-1].write_text(json.dumps({"workload": "w", "rows": rows, "interrupted": False, "stopped": i == 1}))
    out = tmp_path / "report.json"
    assert bc.main(["report", *map(str, files), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["keys_measured"] == 4 and result["workloads"] == ["w"]
    assert result["stopped_or_interrupted"] == [str(files[1])]
    assert result["x_default"]["n"] == 4 and result["x_default"]["min"] == 1.0
    assert set(result["x_peer"]) == {"matmul", "decode_attention"}
    assert result["x_peer"]["matmul"]["median"] == pytest.approx((0.9 + 1.2) / 2)
    assert result["x_default_by_kernel"]["matmul"]["median"] == pytest.approx(2.5)
    assert result["certified_over_now"]["n"] == 4 and result["certified_over_now"]["median"] == 1.0
    with pytest.raises(SystemExit, match="report: 2 keys measured in more than one file"):
        bc.main(["report", str(files[0]), str(files[0])])
    files[1].write_text("{}")
    with pytest.raises(SystemExit, match=r"report: .*s1.json is not a `quality --out` file \(KeyError"):
        bc.main(["report", str(files[0]), str(files[1])])
