"""The end-to-end harness (scripts/e2e.py) on its tiny models, on the CPU: what CI can run of it.

For Llama, Qwen3 and LTX-Video (two-layer configs of the real classes, random weights):

* the kernelized model (every kernel of the kit, mapped in as the harness maps it) matches the
  untouched one: against the float32 model it is within K = 2 times the untouched bf16 model's
  own error (max and mean), the harness's check; a deliberately wrong rope fails that check;
* it compiles with ``torch.compile(fullgraph=True)`` (a graph break raises) and the compiled
  output passes the same check; the language models' static-cache decode step too, which is
  what the GPU run captures in CUDA graphs;
* training: loss and every parameter gradient of the model with the kit's rmsnorm, activation
  and rope layers (Mode.TRAINING) and its attention (whose backward runs on the CPU) against the
  untouched model, in float32 with a float64 twin as reference (the kit's error at most K times
  PyTorch's plus a floor of 16 float32 ulps of the largest reference value); and the harness's
  training-step measurement (--train).

The compile tests use the aot_eager backend by default (dynamo's full-graph capture and AOT
autograd's tracing through the custom ops' fake implementations, which is where graph breaks
and missing fakes show); inductor's code generation on a 2-core CI machine would cost minutes.
``E2E_COMPILE_BACKEND=inductor`` runs them with inductor; the GPU run compiles with inductor.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import os
import sys
import types
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "scripts"))

import e2e  # noqa: E402

pytest.importorskip("transformers")
pytest.importorskip("diffusers")

MODELS = ["llama", "qwen3", "ltx"]
BACKEND = os.environ.get("E2E_COMPILE_BACKEND", "aot_eager")
BF16 = torch.bfloat16

# Modules attach_layers must replace in each tiny model (2 layers): per layer the two norms
# around attention and MLP (plus Qwen3's q_norm and k_norm) and the final norm; LTX's block norms
# (diffusers RMSNorm without weight), its attention's norm_q / norm_k (torch.nn.RMSNorm, in self-
# and cross-attention) and its feed-forward GELU (tanh).
EXPECTED_ROUTES = {
    "llama": {"rmsnorm": {"LlamaRMSNorm": 5}, "activation": {"transformers.SiLUActivation": 2}},
    "qwen3": {"rmsnorm": {"Qwen3RMSNorm": 9}, "activation": {"transformers.SiLUActivation": 2}},
    "ltx": {
        "rmsnorm": {"diffusers.RMSNorm": 4, "torch.nn.RMSNorm": 8},
        "activation": {"torch.nn.SiLU": 2, "diffusers.GELU": 2},
    },
}


@pytest.fixture(scope="module")
def kit_modules():
    """The four kernels from their builds (LOCAL_KERNELS as it was is restored afterwards)."""
    saved = os.environ.get("LOCAL_KERNELS")
    yield e2e.load_kit()
    if saved is None:
        os.environ.pop("LOCAL_KERNELS", None)
    else:
        os.environ["LOCAL_KERNELS"] = saved


@pytest.fixture
def isolated(monkeypatch):
    """Registrations into transformers' attention and mask interfaces and diffusers' active
    attention backend are undone after the test."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    ad = importlib.import_module("diffusers.models.attention_dispatch")
    for cls in (AttentionInterface, AttentionMaskInterface):
        monkeypatch.setattr(cls, "_global_mapping", dict(cls._global_mapping))
    monkeypatch.setattr(
        ad._AttentionBackendRegistry,
        "_active_backend",
        ad._AttentionBackendRegistry._active_backend,
    )
    torch._dynamo.reset()
    yield monkeypatch
    torch._dynamo.reset()


def _check(name, kit_modules, **kit_overrides):
    """(cases, untouched bf16 model, kernelized twin, float32 reference, Kit) of the harness's
    check at the tiny default shape."""
    spec = e2e.SPECS[name]
    kit = e2e.Kit({**kit_modules, **kit_overrides}, spec)
    shape = e2e.parse_shape(e2e.DEFAULTS[(spec.kind, "tiny")][2])
    model32 = e2e.build_model(spec, "tiny", "cpu")
    cases, model, kit_model, ref32 = e2e.run_check(
        spec, model32, kit, shape, BF16, "cpu", e2e.PROMPT_TOKENS["tiny"]
    )
    for c in cases:
        print(
            f"{name} {c['name']}: kit-fp32 {c['kit_vs_fp32']}, tolerance {c['tolerance']}"
            f" ({e2e.K:g} x bf16-fp32 {c['bf16_vs_fp32']})"
        )
    return cases, model, kit_model, ref32, kit


@pytest.mark.parametrize("name", MODELS)
def test_kernelized_matches_untouched(kit_modules, isolated, name):
    kit = None
    try:
        cases, _, _, _, kit = _check(name, kit_modules)
        assert cases and all(c["passed"] for c in cases), cases
        for kernel, routes in EXPECTED_ROUTES[name].items():
            assert kit.routes[kernel] == routes, (kernel, kit.routes[kernel])
        assert "attention" in kit.routes and "rope" in kit.routes
    finally:
        if kit:
            kit.close()


def test_check_catches_a_wrong_kernel(kit_modules, isolated):
    """The check has teeth: a rope that does not rotate fails it (and still runs everywhere)."""

    def no_rotation(q, k, cos, sin, unsqueeze_dim=1):
        return q, k

    wrong = types.SimpleNamespace(apply_rotary_pos_emb=no_rotation)
    cases, *_, kit = _check("llama", kit_modules, rope=wrong)
    kit.close()
    assert not any(c["passed"] for c in cases), cases


def _compiled_output(spec, model, kit, inputs, decode: int):
    """e2e.outputs of `model` compiled with fullgraph=True (a graph break raises)."""
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=BACKEND)
    with kit.rope():
        return e2e.outputs(spec, compiled, inputs, decode=decode)


@pytest.mark.parametrize("name", MODELS)
def test_compile_fullgraph(kit_modules, isolated, name):
    spec = e2e.SPECS[name]
    _, model, kit_model, ref32, kit = _check(name, kit_modules)
    try:
        shape = e2e.parse_shape(e2e.DEFAULTS[(spec.kind, "tiny")][2])
        inputs = e2e.check_inputs(spec, model, shape, BF16, "cpu", e2e.PROMPT_TOKENS["tiny"])
        # Prefill / denoise, then (language models) two static-cache decode steps.
        decode = 2 if spec.kind == "lm" else 0
        with torch.no_grad():
            ref16 = e2e.outputs(spec, model, inputs, decode=decode)
        got = _compiled_output(spec, kit_model, kit, inputs, decode)
        assert set(got) == set(ref16)
        for key in got:
            ref = ref32[key][:, : got[key].shape[1]]  # decode: the first steps of the check's
            verdict = e2e.compare(f"compiled {key}", ref, ref16[key], got[key])
            print(name, verdict)
            assert verdict["passed"], verdict
    finally:
        kit.close()


# ---- training ----


def _loss_and_grads(spec, model, inputs):
    model.zero_grad()
    if spec.kind == "lm":
        ids = inputs["ids"]
        out = model(input_ids=ids, labels=ids, use_cache=False)
        loss = out.loss
    else:
        x = inputs["ltx"]
        y = model(**x)[0]
        target = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)
        loss = torch.nn.functional.mse_loss(y, target)
    loss.backward()
    grads = {n: p.grad.detach().double().clone() for n, p in model.named_parameters()}
    return loss.detach().double(), grads


@pytest.mark.parametrize("name", MODELS)
def test_training_loss_and_gradients(kit_modules, isolated, name):
    spec = e2e.SPECS[name]
    kit = e2e.Kit(kit_modules, spec)
    try:
        model = e2e.build_model(spec, "tiny", "cpu").train()
        ref_model = copy.deepcopy(model).double()
        kit_model = e2e.twin(model)
        routes = kit.attach(kit_model, device="cpu", training=True)
        if "attention" in kit_modules:  # its backward runs on the CPU
            assert "attention" in routes, routes
        shape = e2e.parse_shape(e2e.DEFAULTS[(spec.kind, "tiny")][2])
        prompt = e2e.PROMPT_TOKENS["tiny"]
        inputs = e2e.check_inputs(spec, model, shape, torch.float32, "cpu", prompt)
        inputs64 = e2e.check_inputs(spec, ref_model, shape, torch.float64, "cpu", prompt)
        loss64, grads64 = _loss_and_grads(spec, ref_model, inputs64)
        loss32, grads32 = _loss_and_grads(spec, model, inputs)
        with kit.rope():
            loss_kit, grads_kit = _loss_and_grads(spec, kit_model, inputs)
        floor_ulps = 16 * torch.finfo(torch.float32).eps

        def check(what, ours, theirs, ref):
            scale = float(ref.abs().max())
            e_theirs = float((theirs - ref).abs().max())
            e_ours = float((ours - ref).abs().max())
            tol = e2e.K * e_theirs + floor_ulps * scale
            assert e_ours <= tol, (
                f"{name} {what}: kit error {e_ours:.3e} > {tol:.3e} "
                f"({e2e.K:g} x PyTorch's {e_theirs:.3e} + 16 ulps of {scale:.3e})"
            )

        check("loss", loss_kit, loss32, loss64)
        assert set(grads_kit) == set(grads64)
        for n in grads64:
            check(f"grad {n}", grads_kit[n], grads32[n], grads64[n])
    finally:
        kit.close()


# ---- offloading ----


def test_layers_survive_cpu_offload_hooks(kit_modules, isolated):
    """Kernels attached before accelerate's offload hooks (what diffusers'
    enable_model_cpu_offload adds per component) are still what runs after them."""
    accelerate = pytest.importorskip("accelerate")
    spec = e2e.SPECS["ltx"]
    kit = e2e.Kit(kit_modules, spec)
    try:
        model = e2e.build_model(spec, "tiny", "cpu").to(BF16)
        kit_model = e2e.twin(model)
        kit.attach(kit_model, device="cpu")
        shape = e2e.parse_shape(e2e.DEFAULTS[("dit", "tiny")][2])
        inputs = e2e.check_inputs(spec, model, shape, BF16, "cpu", e2e.PROMPT_TOKENS["tiny"])
        with kit.rope(), torch.no_grad():
            before = kit_model(**inputs["ltx"])[0]
            _, hook = accelerate.cpu_offload_with_hook(kit_model, execution_device="cpu")
            after = kit_model(**inputs["ltx"])[0]
            hook.offload()
        norm = kit_model.transformer_blocks[0].norm1
        assert norm.forward.__func__ is not type(norm).forward
        assert torch.equal(before, after)
    finally:
        kit.close()


# ---- the README table ----


def test_readme_e2e_tables_match_result_files():
    import e2e_table

    readme = (REPO_ROOT / "README.md").read_text()
    assert e2e_table.generated_readme(readme) == readme, "run: python scripts/bench_table.py"


def test_a_run_writes_the_schema_and_its_table(kit_modules, isolated, tmp_path):
    """A tiny CPU run of the eager configurations (no compile: CI time) writes a complete
    document that the README table renders, one row per phase and shape."""
    import e2e_table

    out = tmp_path / "results" / "e2e" / "llama.json"
    e2e.main(["--model", "llama", "--device", "cpu", "--configs", "eager,eager+kit", "--out",
              str(out), "--iters", "1", "--decode-iters", "2"])  # fmt: skip
    doc = json.loads(out.read_text())
    assert doc["schema"] == "e2e/1" and doc["complete"] and not doc["errors"], doc["errors"]
    assert doc["check"]["passed"] and set(doc["kit"]) == set(e2e.KERNELS)
    rows = {(m["phase"], m["shape"], m["config"]) for m in doc["measurements"]}
    assert rows == {
        (phase, shape, config)
        for phase, shape in (("prefill", "1x32"), ("prefill", "4x32"), ("decode", "1x32"))
        for config in ("eager", "eager+kit")
    }
    first = next(m for m in doc["measurements"] if m["config"] == "eager+kit")
    assert first["agreement"]["passed"], first["agreement"]
    text = "<!-- BEGIN e2e -->\n<!-- END e2e -->\n"
    table = e2e_table.generated_readme(text, root=tmp_path)
    assert table.count("\n| prefill |") == 2 and table.count("\n| decode |") == 1, table
    assert "Check passed" in table
    assert "compile+kit maps in attention of the kit" in table, table
    # The GPU-only profile, as a CUDA run records it (profile_tools.family_table).
    from profile_tools import family_table

    kernels = {"rms_norm_fwd_kernel": (10.0, 5), "nvjet_tst_128x256": (90.0, 10)}
    doc["profile"] = {"config": "eager+kit", "phase": "prefill", "shape": "1x32"}
    doc["profile"].update(family_table(kernels))
    out.write_text(json.dumps(doc))
    table = e2e_table.generated_readme(text, root=tmp_path)
    assert "prefill 1x32 (0.1 ms): gemm 90%, rmsnorm 10%." in table, table


def test_kernel_families():
    """The profile's classifier (scripts/profile_tools.py) knows this kit's kernel names."""
    from profile_tools import family

    names = {
        "rms_norm_fwd_kernel": "rmsnorm",
        "void rope_kernel<__nv_bfloat16>": "rope",
        "gated_act_fwd_kernel": "activation",
        "unary_act_fwd_kernel": "activation",
        "void attn_fwd_kernel<128>": "attention",
        "pytorch_flash::flash_fwd_kernel": "attention",
        "sm90_xmma_gemm_bf16bf16_bf16f32": "gemm",
        "nvjet_tst_128x256_64x4": "gemm",
        "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0": "rmsnorm",
        "elementwise_kernel_with_index": "other",
    }
    assert {n: family(n) for n in names} == names


def test_host_cost_runs_every_case(kit_modules, tmp_path):
    """scripts/host_cost.py times each kit op and its PyTorch counterpart (on the CPU the whole
    call) and writes them all, each a positive time, to its JSON."""
    import host_cost

    out = tmp_path / "host.json"
    doc = host_cost.main(["--device", "cpu", "--tokens", "4", "--calls", "3", "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["host_us"] == pytest.approx(doc["host_us"])
    assert set(written["host_us"]) == set(host_cost.cases(kit_modules, "cpu", 4))
    assert all(t > 0 for t in written["host_us"].values()), written["host_us"]
    assert written["environment"]["device"]


def test_time_calls_records_host_time():
    """Every timed row carries host_ms (on the CPU the whole call, so at most the slowest call);
    the allocator and sync diagnostics are CUDA's only."""
    row = e2e.time_calls(lambda: sum(range(1000)), "cpu", warmup=1, iters=5)
    assert len(row["times_ms"]) == 5 and row["host_ms"] > 0
    assert row["host_ms"] <= max(row["times_ms"]) + 1e-3
    assert "allocator" not in row and "syncs" not in row


def test_training_step_rows(kit_modules, tmp_path):
    """--train times a forward + loss + backward step per configuration on the training twin,
    whose routes (recorded apart) include the kit's attention where its backward runs."""
    out = tmp_path / "train.json"
    argv = ["--model", "llama", "--device", "cpu", "--size", "tiny", "--skip-check", "--shapes="]
    argv += ["--decode=", "--train", "1x16", "--configs", "eager,eager+kit", "--iters", "2"]
    argv += ["--warmup", "1", "--out", str(out)]
    doc = e2e.main(argv)
    assert doc["complete"] and not doc["errors"], doc["errors"]
    rows = [(m["phase"], m["shape"], m["config"]) for m in doc["measurements"]]
    assert rows == [("train", "1x16", "eager"), ("train", "1x16", "eager+kit")]
    assert all(m["median_ms"] > 0 and m["tokens_per_s"] > 0 for m in doc["measurements"])
    assert (
        doc["routes_train"]["rmsnorm"] and "AttentionInterface" in doc["routes_train"]["attention"]
    )
    # compile+kit has twins of its own with the kit's attention only (e2e.COMPILE_KERNELS).
    assert doc["kit_compile"] == ["attention"]
    for key in ("routes_compile", "routes_train_compile"):
        assert set(doc[key]) == {"attention"} and "AttentionInterface" in doc[key]["attention"]


def test_compile_kernels_option():
    """--compile-kernels: 'all', a subset (in --kernels order), unknown names refused, and a
    compile+kit that would map nothing refused before any model is built."""
    names = ["rmsnorm", "rope", "attention"]
    assert e2e.compile_kernels("all", names) == names
    assert e2e.compile_kernels("attention,rmsnorm", names) == ["rmsnorm", "attention"]
    assert e2e.compile_kernels("activation", names) == []
    with pytest.raises(SystemExit, match="unknown"):
        e2e.compile_kernels("flash", names)
    with pytest.raises(SystemExit, match="would map nothing"):
        e2e.main(["--model", "llama", "--device", "cpu", "--kernels", "rmsnorm"])


def test_time_interleaved_takes_turns_and_keeps_the_others():
    """The timed calls alternate between the functions, the order rotating every round; each
    scope is entered around its own function's calls only; a function whose first call raises
    is reported as that exception while the others are still timed."""
    log = []

    @contextlib.contextmanager
    def scope():
        log.append("[")
        yield
        log.append("]")

    def bad():
        raise RuntimeError("no kernel")

    calls = {"a": lambda: log.append("a"), "b": lambda: log.append("b"), "bad": bad}
    rows = e2e.time_interleaved(calls, "cpu", warmup=1, iters=4, scopes={"b": scope})
    assert isinstance(rows["bad"], RuntimeError) and list(rows) == ["a", "b", "bad"]
    assert [len(rows[n]["times_ms"]) for n in "ab"] == [4, 4]
    untimed = ["a", "a", "[", "b", "]", "[", "b", "]"]  # first call and one warm-up each
    rounds = [["a", "[", "b", "]"], ["[", "b", "]", "a"]] * 2
    assert log == untimed + [x for r in rounds for x in r]


def test_int4_run_checks_and_times_the_int4_twin(isolated, tmp_path):
    """--quant int4 (tiny, CPU, eager configurations): every linear but lm_head becomes an int4
    QuantizedLinear, the check against the dequantized float32 model passes, the decode rows
    and their ratio are written, and the table names the int4 columns."""
    import e2e_table

    # load_kit adds the quant build to LOCAL_KERNELS: put it back as it was afterwards.
    isolated.setenv("LOCAL_KERNELS", os.environ.get("LOCAL_KERNELS", ""))
    out = tmp_path / "results" / "e2e" / "llama-int4.json"
    e2e.main(["--model", "llama", "--device", "cpu", "--quant", "int4", "--group-size", "32",
              "--configs", "eager,eager+int4", "--out", str(out), "--decode-iters", "2"])  # fmt: skip
    doc = json.loads(out.read_text())
    assert doc["complete"] and not doc["errors"], doc["errors"]
    assert set(doc["kit"]) == {"quant"} and doc["configs"] == ["eager", "eager+int4"]
    # 2 layers x (q, k, v, o and the fused MLP); lm_head is left.
    assert doc["quant"]["replaced"] == 10 and set(doc["quant"]["skipped"]) == {"lm_head"}
    assert doc["check"]["passed"] and len(doc["check"]["cases"]) == 2, doc["check"]
    rows = {(m["phase"], m["shape"], m["config"]) for m in doc["measurements"]}
    assert rows == {("decode", "1x32", "eager"), ("decode", "1x32", "eager+int4")}
    assert doc["speedups"][0]["int4_vs_eager"] > 0
    table = e2e_table.generated_readme("<!-- BEGIN e2e -->\n<!-- END e2e -->\n", root=tmp_path)
    assert "| eager+int4 (ms) |" in table and "| int4 vs eager |" in table, table
    assert "int4 weights (groups of 32, 10 modules replaced)" in table, table


def test_int4_check_catches_wrong_int4_weights(isolated):
    """The int4 check fails when the twin computes with other weights than the ones it reports:
    the dequantized reference is taken with every scale doubled."""
    isolated.setenv("LOCAL_KERNELS", os.environ.get("LOCAL_KERNELS", ""))
    quant = e2e.load_kit(["quant"])["quant"]
    spec = e2e.SPECS["llama"]
    real = e2e.dequantized_weight
    isolated.setattr(e2e, "dequantized_weight", lambda q, layer: 2 * real(q, layer))
    model32 = e2e.build_model(spec, "tiny", "cpu")
    cases, *_ = e2e.run_check_int4(spec, model32, quant, 32, (1, 32), torch.bfloat16, "cpu", 0)
    assert not any(c["passed"] for c in cases), cases


def test_int4_mode_refuses_what_it_does_not_time():
    for argv, message in (
        (["--model", "ltx", "--quant", "int4"], "language model"),
        (["--model", "llama", "--quant", "int4", "--train", "1x32"], "no --train"),
        (["--model", "llama", "--quant", "int4", "--kernels", "rmsnorm"], "no --kernels"),
        (["--model", "llama", "--quant", "int4", "--configs", "eager+kit"], "unknown config"),
    ):
        with pytest.raises(SystemExit, match=message):
            e2e.main([*argv, "--device", "cpu"])
