"""UNet-block workloads (`kind: unet-block`) -> launch keys: sd-unet-block lists the vision launches of Stable
Diffusion 1.5's down_blocks[1] (GroupNorm + SiLU, 3x3 and 1x1 convs, the transformer's GroupNorm and projections, the
stride-2 downsampler) through the real `nbxcert keys` command; an up block lists the nearest upsampler; bad fields are
refused by name in one line; decoder workloads (no `kind`) are untouched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nbxcert.errors import WorkloadInvalid
from nbxcert.profiles import get_profile
from nbxcert.workload import launches, load_workload, parse_workload, workload_keys


def conv_key(c, k, r, batch, stride=1, size=32):
    pad = r // 2
    return (
        f"conv2d[C={c},H={size},K={k},R={r},S={r},W={size},batch={batch},bias=1,dilation=1,groups=1,layout=nchw,"
        f"padding={pad},stride={stride};float16]@v1"
    )


def norm_key(c, batch, silu):
    return f"group_norm[C={c},H=32,W=32,batch={batch},groups=32,layout=nchw,silu={silu};float16]@v1"


def test_keys_command_lists_the_sd_unet_block():
    env = dict(os.environ, NBXCERT_BACKEND="interpreter")
    r = subprocess.run(
        [sys.executable, "-m", "nbxcert", "keys", "--profile", "hopper", "--workload", "sd-unet-block", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    keys = [json.loads(line)["key"] for line in r.stdout.splitlines() if line.strip()]
    want = []
    for batch in (1, 2, 4, 8):  # the batch ladder up to 8
        want += [
            norm_key(320, batch, 1),
            conv_key(320, 640, 3, batch),  # resnet 0 conv1
            norm_key(640, batch, 1),
            conv_key(640, 640, 3, batch),  # conv2 of both resnets
            conv_key(320, 640, 1, batch),  # resnet 0's 1x1 shortcut
            norm_key(640, batch, 0),  # the transformer's GroupNorm (no SiLU)
            conv_key(640, 640, 1, batch),  # proj_in / proj_out
            conv_key(640, 640, 3, batch, stride=2),  # the downsampler
        ]
    assert keys == want
    assert not any(k.startswith(("matmul", "rmsnorm", "flash_attention", "upsample")) for k in keys)


def test_sd_unet_block_launch_order_and_places():
    w = load_workload("sd-unet-block")
    assert w.kind == "unet-block" and w.model["resnet_in_channels"] == [320, 640]
    where = [x.where for x in launches(w, get_profile("nvidia/hopper")) if x.problem["batch"] == 2]
    assert where == [
        "resnet 0 norm1 + SiLU",
        "resnet 0 conv1",
        "resnet 0 norm2 + SiLU",
        "resnet 0 conv2",
        "resnet 0 shortcut (1x1)",
        "transformer 0 norm",
        "transformer 0 proj_in / proj_out (1x1)",
        "downsampler (3x3, stride 2)",
    ]  # resnet 1 repeats resnet 0's conv2 and norms at 640 channels: the same keys, listed once


UP = """
schema_version: 1
kind: unet-block
name: up
source: "a test"
model: {resnet_in_channels: [1920, 1280, 960], out_channels: 640, norm_groups: 32, cross_attention: false,
        resample: up, layout: nhwc%s}
dtypes: [bfloat16]
phases: {batch: [2], sizes: [16]}
"""
BASE = UP % ""


def test_an_up_block_lists_the_nearest_upsampler():
    keys = [k.text() for k in workload_keys(parse_workload(BASE, "up.yml"), get_profile("nvidia/hopper"))]
    assert "upsample_nearest2d[C=640,H=16,W=16,batch=2,layout=nhwc,scale_h=2,scale_w=2;bfloat16]@v1" in keys
    assert (
        "conv2d[C=640,H=32,K=640,R=3,S=3,W=32,batch=2,bias=1,dilation=1,groups=1,layout=nhwc,padding=1,stride=1;"
        "bfloat16]@v1" in keys
    )
    shortcuts = [k for k in keys if ",R=1," in k]
    assert len(shortcuts) == 3  # every resnet's input (with its skip) differs from 640 channels


@pytest.mark.parametrize(
    "text, field",
    [
        (BASE.replace("kind: unet-block", "kind: unet"), "'kind'"),
        (UP % ", extra: 1", "'model.extra'"),
        (BASE.replace("resample: up", "resample: sideways"), "'model.resample'"),
        (BASE.replace("layout: nhwc", "layout: chwn"), "'model.layout'"),
        (BASE.replace("norm_groups: 32", "norm_groups: 7"), "'model.norm_groups'"),
        (BASE.replace("[1920, 1280, 960]", "[]"), "'model.resnet_in_channels'"),
        (BASE.replace("out_channels: 640", "out_channels: -640"), "'model.out_channels'"),
        (BASE.replace("cross_attention: false,", ""), "'model.cross_attention'"),
        (BASE.replace("[bfloat16]", "[float32]"), "'dtypes'"),
        (BASE.replace("sizes: [16]", "sizes: [0]"), "'phases.sizes'"),
        (BASE.replace("sizes: [16]", "sizes: {ladder: batch, max: 8}"), "'phases.sizes'"),
        (BASE.replace("batch: [2]", "batch: {ladder: heights, max: 8}"), "'phases.batch.ladder'"),
        (BASE.replace('source: "a test"\n', ""), "'source'"),
    ],
)
def test_bad_unet_fields_are_refused_by_name(text, field):
    with pytest.raises(WorkloadInvalid, match=field) as info:
        parse_workload(text, "up.yml")
    assert "up.yml" in str(info.value) and "\n" not in str(info.value)


def test_decoder_workloads_have_no_kind():
    assert load_workload("demo").kind == "decoder"
