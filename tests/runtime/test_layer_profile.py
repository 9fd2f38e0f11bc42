"""scripts/layer_profile.py on the CPU with a tiny preset: the JSON holds every phase with sane times, the FLOPs
are the layer's own arithmetic, and the classifier puts kernel names PyTorch emits on CUDA into the right class."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from slidedp.step.model_adapter import ModelAdapter, load_hf_config

from scripts import layer_profile

MODEL = "tiny-qwen3"  # hidden 64, ffn 160, 4 heads, 2 kv heads, head_dim 16


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("layers") / "layers.json"
    returned = layer_profile.main(["--model", MODEL, "--seq", "32", "--mbs", "1", "--iters", "1", "--warmup", "1",
                                   "--device", "cpu", "--out", str(out)])
    with open(out, encoding="utf-8") as fh:
        written = json.load(fh)
    return returned, written


def test_the_json_holds_every_phase_of_the_layer_with_its_kernels_classified(profiled):
    returned, written = profiled
    assert written == json.loads(json.dumps(returned))
    run = written["models"][MODEL]["32"]
    assert (run["mbs"], run["seq"], run["tokens"]) == (1, 32, 32)
    assert set(run["phases"]) == {"forward", "backward", "checkpoint_forward", "recompute"}
    for phase, r in run["phases"].items():
        assert set(r["classes"]) == set(layer_profile.CLASSES), phase
        assert r["wall_ms"] > 0 and r["profiled_wall_ms"] > 0, phase
        assert r["classes"]["gemm"]["count"] == 7 * layer_profile.PHASE_FORWARDS[phase], phase
        assert r["classes"]["attention"]["count"] >= 1, phase
        for cls, c in r["classes"].items():
            assert c["ms"] >= 0 and c["count"] >= 0 and c["share"] >= 0, (phase, cls)
        class_ms = sum(c["ms"] for c in r["classes"].values())
        tolerance = 0.05 + 0.01 * r["profiled_wall_ms"]
        assert class_ms <= r["profiled_wall_ms"] + tolerance, phase
        assert r["busy_ms"] <= r["profiled_wall_ms"] + tolerance, phase
        assert r["gaps_ms"] == pytest.approx(max(r["profiled_wall_ms"] - r["busy_ms"], 0.0)), phase


def test_flops_are_the_layers_gemms_and_half_of_causal_attention(profiled):
    run = profiled[1]["models"][MODEL]["32"]
    assert run["shapes"] == {"hidden": 64, "ffn": 160, "heads": 4, "kv_heads": 2, "head_dim": 16}
    tokens, seq = 32, 32
    q = o = 2 * tokens * 64 * (4 * 16)
    k = v = 2 * tokens * 64 * (2 * 16)
    gate = up = down = 2 * tokens * 64 * 160
    gemm = q + k + v + o + gate + up + down
    assert gemm == 2_752_512
    scores = 2 * seq * seq * 16 * 4 // 2  # QK^T, causal: the lower half of the square
    context = 2 * seq * seq * 16 * 4 // 2  # PV
    attention = scores + context
    assert attention == 131_072
    for phase, times in {"forward": 1, "checkpoint_forward": 1, "backward": 2, "recompute": 3}.items():
        flops = run["phases"][phase]["flops"]
        assert flops == {"gemm": times * gemm, "attention": times * attention, "total": times * (gemm + attention)}
        ideal = run["phases"][phase]["ideal_ms"]["attention"]
        assert ideal == pytest.approx(times * attention / 782e12 * 1e3)


@pytest.mark.parametrize(("name", "cls"), [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
     "__5x_cublas", "gemm"),
    ("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1_tn_align8>(cutlass_80_wmma_"
     "tensorop_bf16_s161616gemm_bf16_32x32_128x1_tn_align8::Params)", "gemm"),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", "gemm"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t,"
     " Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, true, true, false, "
     "false>(PyTorch_flash::Flash_fwd_params)", "attention"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4,"
     " 2, false, false, cutlass::bfloat16_t>, true, false, false, false, false, false, false>(pytorch_flash::"
     "Flash_bwd_params)", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
     "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0",
     "attention"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::(anonymous namespace)::silu_kernel(at::"
     "TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#8}::operator()() const::{lambda(c10::"
     "BFloat16)#1}, std::array<char*, 2ul> >(int, at::native::(anonymous namespace)::silu_kernel(at::"
     "TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#8}::operator()() const::{lambda(c10::"
     "BFloat16)#1}, std::array<char*, 2ul>)", "activation"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::(anonymous namespace)::silu_backward_kernel(at::"
     "TensorIteratorBase&)::{lambda()#1}::operator()() const, std::array<char*, 3ul> >(int, ...)", "activation"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, "
     "c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)", "norm"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2u>, "
     "unsigned int, 4, 64, 64>(...)", "copy"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
     "float>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
     "float>, unsigned int, float, 4, 4>)", "reduction"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor<c10::BFloat16>, std::array<char*, "
     "1ul> >(int, at::native::FillFunctor<c10::BFloat16>, std::array<char*, 1ul>)", "other"),
    ("aten::mm", "gemm"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention"),
])
def test_kernel_names_alone_give_their_class(name, cls):
    assert layer_profile.classify(name) == cls


MUL = ("void at::native::vectorized_elementwise_kernel<8, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, "
       "c10::BFloat16, at::native::binary_internal::MulFunctor<float> >, std::array<char*, 3ul> >(...)")
COPY = ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
        "::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, ...>(...)")


@pytest.mark.parametrize(("name", "ops", "label", "cls"), [
    (MUL, ("aten::mul",), "mlp", "activation"),  # the SwiGLU product
    (MUL, ("aten::mul",), "rope", "rope"),
    (MUL, ("aten::mul",), "norm", "norm"),
    (MUL, ("aten::mul", "MulBackward0", "autograd::engine::evaluate_function: MulBackward0"), "norm", "norm"),
    (MUL, ("aten::mul",), None, "other"),
    (COPY, ("aten::copy_", "aten::_to_copy", "aten::to"), "norm", "cast"),  # the norm's fp32 upcast
    (COPY, ("aten::copy_", "aten::clone", "aten::reshape"), "self_attn", "copy"),
    ("void splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, float, __nv_bfloat16, true,"
     " false, false>(cublasSplitKParams<float>, __nv_bfloat16 const*, ...)", ("aten::mm",), None, "gemm"),
    ("void cudnn::fusion::compute_dot_do_o_specialized<true, 128>(void const*, void const*, void*, void*, ...)",
     ("aten::_scaled_dot_product_cudnn_attention_backward", "aten::_efficient_attention_backward"), None,
     "attention"),
])
def test_generic_kernels_take_their_class_from_the_launching_op_and_the_layer_part(name, ops, label, cls):
    assert layer_profile.classify(name, ops, label) == cls


def test_busy_time_is_the_union_of_overlapping_kernels():
    assert layer_profile.union_us([(5.0, 6.0), (0.0, 2.0), (1.0, 3.0), (1.5, 2.5)], disjoint=False) == 4.0
    assert layer_profile.union_us([(0.0, 2.0), (3.0, 4.0)], disjoint=True) == 3.0


def test_default_micro_batch_keeps_the_benchmark_token_count():
    assert [layer_profile.default_mbs(s) for s in (2048, 4096, 32768)] == [8, 4, 1]


def test_part_labels_leave_the_template_and_the_transformers_module_as_they_were():
    adapter = ModelAdapter(load_hf_config(MODEL))
    module = sys.modules[type(adapter.layer_template).__module__]
    rope = module.apply_rotary_pos_emb
    with layer_profile.part_labels(adapter):
        assert module.apply_rotary_pos_emb is not rope
        assert adapter.layer_template.input_layernorm._forward_pre_hooks
    assert module.apply_rotary_pos_emb is rope
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in adapter.layer_template.modules())


def test_forward_labels_reach_the_backward_kernels_on_the_cpu():
    """A norm's elementwise ops in the backward (no module around them there) still count as norm."""
    layer = layer_profile.build_layer(MODEL, 1, 16, torch.device("cpu"), torch.bfloat16)
    clock = layer_profile.PhaseClock(torch.device("cpu"))
    with layer_profile.part_labels(layer.adapter), torch.profiler.profile() as prof:
        layer_profile.run_iteration(layer, clock)
    kernels = layer_profile.device_kernels(prof, cuda=False)
    backward_norm = [k for k in kernels if k.cls == "norm" and any("Backward" in op for op in k.ops)]
    assert any(k.name == "aten::pow" or k.name == "aten::mul" for k in backward_norm)
    assert any(k.cls == "rope" for k in kernels) and any(k.cls == "activation" for k in kernels)
