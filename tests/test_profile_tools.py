"""scripts/profile.sh and scripts/profile_tools.py without a GPU: the command line, the commands
it builds, and the op-family classifier of kernel names."""

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import profile_tools  # noqa: E402

KNOWN_KERNELS = {
    # this repository's kernels, as profilers name them (templates and arguments included)
    "void rmsnorm::rms_norm_fwd_kernel<__nv_bfloat16, 8, true>(rmsnorm::FwdArgs)": "rmsnorm",
    "rms_norm_bwd_wide_kernel": "rmsnorm",
    "void rope::rope_kernel<__nv_bfloat16, true, 64>(rope::RopeParams)": "rope",
    "void activation::gated_act_fwd_kernel<__nv_bfloat16, activation::Silu, false>": "activation",
    "unary_act_fwd_kernel": "activation",
    "void attention::attn_fwd_kernel<attention::Cfg<128, 128, 64>>(attention::FwdArgs)": "attention",
    "attn_fwd_combine_kernel": "attention",
    "rotate_q_kernel": "attention",
    # PyTorch's attention backends (CUTLASS-based ones included) and eager softmax
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, "
    "false, cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t>>, "
    "false, true, false, false, true, true, false, false>(Flash_fwd_params)": "attention",
    "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(AttentionKernel<cutlass::bfloat16_t>::Params)": (
        "attention"
    ),
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0": (
        "attention"
    ),
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, c10::BFloat16, float>": (
        "attention"
    ),
    # GEMMs: cuBLAS (nvjet on Hopper), CUTLASS, inductor's matmul templates, gemv, split-K
    "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNN": "gemm",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute": "gemm",
    "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>": (
        "gemm"
    ),
    "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn": "gemm",
    "triton_tem_fused_mm_0": "gemm",
    "triton_tem_fused_addmm_3": "gemm",
    "void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 4, 4>": "gemm",
    "void splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16>": "gemm",
    # eager and inductor forms of the other families
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0": "rmsnorm",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>": (
        "rmsnorm"
    ),
    "void at::native::vectorized_elementwise_kernel<4, at::native::rsqrt_kernel_cuda"
    "(at::TensorIteratorBase&)::{lambda()#2}>": "rmsnorm",
    "triton_poi_fused_add_cat_mul_neg_slice_unsqueeze_1": "rope",
    "triton_poi_fused_mul_silu_2": "activation",
    "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::"
    "silu_kernel(at::TensorIteratorBase&)>": "activation",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>": (
        "activation"
    ),
    # generic kernels stay "other"
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>": (
        "other"
    ),
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps>>": (
        "other"
    ),
    "triton_poi_fused_add_mul_0": "other",
    "Memcpy DtoD (Device -> Device)": "other",
}


@pytest.mark.parametrize("name, want", KNOWN_KERNELS.items())
def test_family_of_known_kernel_names(name, want):
    assert profile_tools.family(name) == want


def _global_kernels(kernel: str) -> set[str]:
    """Names of the __global__ functions under <kernel>/kernel_src."""
    names = set()
    for path in (REPO / kernel / "kernel_src").rglob("*"):
        if path.suffix not in (".cu", ".cuh"):
            continue
        text = path.read_text()
        for m in re.finditer(r"__global__\b(.*?)\{", text, re.S):
            names |= set(re.findall(r"(\w+_kernel)\s*\(", m.group(1)))
    return names


@pytest.mark.parametrize("kernel", sorted(profile_tools.KERNEL_REGEX))
def test_ncu_filter_and_family_cover_every_cuda_kernel(kernel):
    """A renamed or new __global__ function must still be caught by ncu's -k filter and counted
    in its own family in traces."""
    names = _global_kernels(kernel)
    assert names, f"no __global__ functions found under {kernel}/kernel_src"
    regex = re.compile(profile_tools.KERNEL_REGEX[kernel])
    for name in sorted(names):
        assert regex.search(name), f"{name} escapes ncu's filter for {kernel}"
        assert profile_tools.family(name) == kernel, name


@pytest.mark.parametrize("kernel", sorted(profile_tools.OPS))
def test_driver_ops_exist_in_the_package(kernel):
    sources = "".join(p.read_text() for p in (REPO / kernel / "torch-ext" / kernel).glob("*.py"))
    assert profile_tools.OPS[kernel], kernel
    for op in profile_tools.OPS[kernel]:
        assert f"def {op}(" in sources, f"{kernel}.{op}"
    if kernel == "activation":  # read from the package's __all__: the gated forms and the rest
        assert sum("_and_" in op for op in profile_tools.OPS[kernel]) == 6
        assert {"silu", "gelu_quick"} <= set(profile_tools.OPS[kernel])


@pytest.mark.parametrize("kernel", sorted(profile_tools.OPS))
def test_driver_calls_every_op_of_a_cpu_build(kernel):
    """The driver's inputs and call forms, on the CPU variant (the CUDA one takes the same
    arguments): a wrong signature or shape fails here rather than under ncu."""
    build = REPO / kernel / "build"
    if not any(build.glob("*-cpu-*")):
        pytest.skip(f"{kernel}/build has no CPU variant (scripts/build.py {kernel})")
    import kernels
    import torch

    mod = kernels.get_local_kernel(build, backend="cpu")
    for op in profile_tools.OPS[kernel]:
        sizes = ["--tokens", "8", "--hidden", "64", "--heads", "4", "--kv-heads", "2"]
        sizes += ["--head-dim", "64", "--batch", "2", "--seqlen", "32", "--dtype", "float32"]
        for extra in ([], ["--block-size", "16"]) if op == "flash_attn_with_kvcache" else ([],):
            args, _ = profile_tools.parse(["run-op", kernel, op, *sizes, *extra])
            out = profile_tools.make_call(mod, kernel, op, args, dev="cpu")()
            for t in out if isinstance(out, (list, tuple)) else [out]:
                assert t is None or not isinstance(t, torch.Tensor) or bool(t.isfinite().all())


def test_family_table_from_a_chrome_trace(tmp_path):
    trace = tmp_path / "t.json"
    events = [
        {"ph": "X", "cat": "kernel", "name": "rms_norm_fwd_kernel", "dur": 10.0},
        {"ph": "X", "cat": "kernel", "name": "rms_norm_fwd_kernel", "dur": 12.0},
        {"ph": "X", "cat": "kernel", "name": "nvjet_tst_128x256", "dur": 70.0},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "dur": 8.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 500.0},  # CPU time: not counted
        {"ph": "i", "cat": "kernel", "name": "marker"},
    ]
    trace.write_text(json.dumps({"traceEvents": events}))
    kernels = profile_tools.kernels_from_chrome_trace(trace)
    assert kernels == {
        "rms_norm_fwd_kernel": (22.0, 2),
        "nvjet_tst_128x256": (70.0, 1),
        "Memcpy HtoD": (8.0, 1),
    }
    summary = profile_tools.family_table(kernels)
    fams = summary["families"]
    assert summary["total_us"] == 100.0
    assert fams["gemm"]["share"] == pytest.approx(0.7)
    assert fams["rmsnorm"]["launches"] == 2 and fams["other"]["us"] == 8.0
    assert fams["attention"]["us"] == 0.0 and set(fams) == set(profile_tools.FAMILY_NAMES)
    table = profile_tools.format_table(summary)
    assert table.splitlines()[2].startswith("gemm") and "70.0%" in table

    assert profile_tools.main(["families", str(trace), "--reports", str(tmp_path / "r")]) == 0
    assert json.loads((tmp_path / "r" / "families.json").read_text()) == summary


def test_idle_gaps_of_a_chrome_trace(tmp_path, capsys):
    """Two gaps on the GPU: one the host caused (the launch call ended after the GPU ran dry),
    one it did not (launched early; the GPU waited on something else); each goes to the
    innermost host op around its launch."""

    def op(name, ts, dur):
        return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}

    def launch(ts, corr):
        return {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "ts": ts,
            "dur": 2,
            "pid": 1,
            "tid": 1,
            "args": {"correlation": corr},
        }

    def kernel(ts, dur, corr):
        return {
            "ph": "X",
            "cat": "kernel",
            "name": f"k{corr}",
            "ts": ts,
            "dur": dur,
            "args": {"correlation": corr},
        }

    events = [
        op("graph", 0, 1000),
        op("mine::norm", 100, 50),
        op("aten::mm", 10, 5),
        launch(11, 1),
        kernel(20, 100, 1),  # busy 20-120
        launch(130, 2),  # inside mine::norm, ends at 132 > 120: late
        kernel(140, 60, 2),  # gap of 20 us
        launch(140, 3),  # inside mine::norm too, but long before the GPU is free
        kernel(400, 10, 3),  # gap of 200 us, not late
        kernel(405, 2, 4),  # overlaps: no gap, adds 0 busy past 410
    ]
    trace = tmp_path / "t.json.gz"
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": events}, f)
    g = profile_tools.idle_gaps(trace, window_ms=1.0)
    assert g["busy_us"] == pytest.approx(170.0) and g["idle_us"] == pytest.approx(220.0)
    assert g["late_us"] == pytest.approx(20.0)
    assert g["by_op"] == {"mine::norm": {"idle_us": 220.0, "late_us": 20.0, "gaps": 2}}
    assert profile_tools.main(["gaps", str(trace), "--window-ms", "1"]) == 0
    assert "waiting for a launch" in capsys.readouterr().out


def test_family_table_from_nsys_csv(tmp_path):
    path = tmp_path / "report_cuda_gpu_kern_sum.csv"
    path.write_text(
        "Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n"
        '60.0,6000,3,2000,2000,1900,2100,100,"void rope::rope_kernel<bf16, true>(Params)"\n'
        "40.0,4000,1,4000,4000,4000,4000,0,gated_act_fwd_kernel\n"
    )
    kernels = profile_tools.kernels_from_nsys_csv(path)
    assert kernels == {
        "void rope::rope_kernel<bf16, true>(Params)": (6.0, 3),
        "gated_act_fwd_kernel": (4.0, 1),
    }
    fams = profile_tools.family_table(kernels)["families"]
    assert fams["rope"]["share"] == pytest.approx(0.6) and fams["activation"]["launches"] == 1


def test_ncu_command(tmp_path):
    args, rest = profile_tools.parse(
        ["ncu", "rmsnorm", "rms_norm", "--tokens", "4096", "--hidden", "4096"]
    )
    assert rest == [] and args.set == "full" and args.warmup == 3 and args.iters == 1
    cmd = profile_tools.ncu_command(args, tmp_path)
    joined = " ".join(cmd)
    assert cmd[0] == "ncu" and "--profile-from-start off" in joined and "--set full" in joined
    assert "-k regex:rms_norm_" in joined and "--launch-skip" not in joined
    assert f"-o {tmp_path / 'rmsnorm-rms_norm'}" in joined
    driver = cmd[cmd.index(sys.executable) :]
    assert driver[1].endswith("profile_tools.py") and driver[2:5] == [
        "run-op",
        "rmsnorm",
        "rms_norm",
    ]
    assert "--tokens 4096 --hidden 4096" in " ".join(driver)
    # the driver's own command line parses back to the same op and sizes
    back, _ = profile_tools.parse(driver[2:])
    assert (back.mode, back.kernel, back.op, back.tokens, back.hidden) == (
        "run-op",
        "rmsnorm",
        "rms_norm",
        4096,
        4096,
    )

    args, _ = profile_tools.parse(
        ["ncu", "attention", "flash_attn_with_kvcache", "--section", "SpeedOfLight", "--section",
         "Occupancy", "--kernel-regex", "attn_fwd_kernel", "--launch-skip", "2",
         "--launch-count", "1", "--block-size", "16", "--no-causal"]
    )  # fmt: skip
    joined = " ".join(profile_tools.ncu_command(args, tmp_path))
    assert "--section SpeedOfLight --section Occupancy" in joined and "--set" not in joined
    assert "-k regex:attn_fwd_kernel --launch-skip 2 --launch-count 1" in joined
    assert "--block-size 16" in joined and "--no-causal" in joined


def test_nsys_commands(tmp_path):
    args, rest = profile_tools.parse(["nsys", "activation", "silu_and_mul", "--tokens", "8192"])
    joined = " ".join(profile_tools.nsys_command(args, tmp_path, rest))
    assert joined.startswith("nsys profile") and "--capture-range cudaProfilerApi" in joined
    assert "run-op activation silu_and_mul --tokens 8192" in joined

    args, rest = profile_tools.parse(["nsys", "e2e", "--model", "llama", "--configs", "eager"])
    cmd = profile_tools.nsys_command(args, tmp_path, rest)
    assert "--capture-range" not in cmd
    e2e = [str(profile_tools.E2E_SCRIPT), "--model", "llama", "--device", "cuda", "--configs"]
    assert cmd[-8:] == e2e + ["eager", "--no-profile"]


def test_e2e_arguments_pass_through():
    """Only --model/--device/--size/--reports/--dry-run are ours; e2e.py's --out, --iters and
    the rest reach it unchanged, and its own profiler is switched off (profilers do not nest)."""
    args, rest = profile_tools.parse(
        ["trace", "e2e", "--model", "qwen3", "--size", "full", "--configs", "eager+kit",
         "--iters", "1", "--out", "results/e2e/q.json", "--reports", "/tmp/r"]
    )  # fmt: skip
    assert (args.mode, args.kernel, args.model, args.reports) == (
        "trace",
        "e2e",
        "qwen3",
        Path("/tmp/r"),
    )
    assert profile_tools.e2e_argv(args, rest) == [
        "--model", "qwen3", "--device", "cuda", "--size", "full", "--configs", "eager+kit",
        "--iters", "1", "--out", "results/e2e/q.json", "--no-profile",
    ]  # fmt: skip
    args, rest = profile_tools.parse(["trace", "e2e", "--model", "llama", "--no-profile"])
    assert profile_tools.e2e_argv(args, rest).count("--no-profile") == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["ncu", "rmsnorm", "nope"], "rmsnorm has no op 'nope'"),
        (["ncu", "rmsnorm"], "the following arguments are required: op"),
        (["trace", "e2e", "--size", "full"], "the following arguments are required: --model"),
        (["ncu", "rope", "rotary_embedding", "--bogus"], "unrecognized arguments: --bogus"),
        (["sanitize"], "invalid choice: 'sanitize'"),
    ],
)
def test_bad_command_lines(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        profile_tools.parse(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def _profile_sh(*args):
    env = dict(os.environ, PY=sys.executable)
    return subprocess.run(
        [str(REPO / "scripts" / "profile.sh"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_profile_sh_help_and_dry_run(tmp_path):
    for argv in ([], ["--help"]):
        r = _profile_sh(*argv)
        assert r.returncode == 0, r.stderr
        assert "usage: scripts/profile.sh" in r.stdout and "ncu rmsnorm rms_norm" in r.stdout
    r = _profile_sh("ncu", "--help")
    assert r.returncode == 0 and "--launch-skip" in r.stdout and "--tokens" in r.stdout
    r = _profile_sh(
        "ncu", "rmsnorm", "rms_norm", "--tokens", "64", "--reports", str(tmp_path), "--dry-run"
    )
    assert r.returncode == 0, r.stderr
    assert f"reports: {tmp_path}" in r.stdout and "+ ncu --profile-from-start off" in r.stdout
    assert not any(tmp_path.iterdir())  # a dry run writes nothing
    r = _profile_sh("ncu", "rmsnorm", "nope")
    assert r.returncode == 2 and "has no op 'nope'" in r.stderr


def test_missing_profiler_is_reported(tmp_path):
    r = _profile_sh(
        "nsys", "rope", "rotary_embedding", "--nsys", "no-such-nsys", "--reports", str(tmp_path)
    )
    assert r.returncode == 1
    assert "Nsight Systems (no-such-nsys) is not installed" in r.stderr
    assert "scripts/profile.sh trace" in r.stderr


def test_trace_e2e_runs_the_harness_under_the_profiler(tmp_path, monkeypatch):
    """`trace e2e` on the CPU with a stand-in harness: the arguments reach its main(argv), the
    Chrome trace and the family table are written."""
    harness = tmp_path / "e2e.py"
    harness.write_text(
        "import json, sys, torch\n"
        "def main(argv=None):\n"
        "    torch.ones(64, 64) @ torch.ones(64, 64)\n"
        "    open(sys.argv[0] + '.argv', 'w').write(json.dumps(argv))\n"
        "    return {}\n"
    )
    monkeypatch.setattr(profile_tools, "E2E_SCRIPT", harness)
    monkeypatch.setitem(sys.modules, "e2e", None)  # run_e2e registers the harness: undone after
    monkeypatch.setattr(sys, "argv", [str(harness)])
    reports = tmp_path / "reports"
    rc = profile_tools.main(
        ["trace", "e2e", "--model", "tiny", "--device", "cpu", "--iters", "1",
         "--reports", str(reports)]
    )  # fmt: skip
    assert rc == 0
    assert json.loads(Path(str(harness) + ".argv").read_text()) == [
        "--model", "tiny", "--device", "cpu", "--iters", "1", "--no-profile",
    ]  # fmt: skip
    trace = json.loads((reports / "e2e-tiny.trace.json").read_text())
    assert any("aten::mm" in e.get("name", "") for e in trace["traceEvents"])
    assert (reports / "families.txt").read_text().startswith("GPU time per op family")
