//! The CUDA C sources of the backend's kernels (kernels/*.cu, embedded at build time) and the
//! functions each one defines. Compilation lives in `compile`; launching in the op modules.

/// One kernel source file.
pub struct KernelFile {
    pub name: &'static str,
    pub source: &'static str,
    /// `extern "C"` kernels it defines, all loaded at start-up.
    pub functions: &'static [&'static str],
}

/// Helpers prepended to every file (`#line` keeps NVRTC's line numbers those of the file).
pub const COMMON: &str = include_str!("../kernels/common.cuh");

pub const FILES: [KernelFile; 14] = [
    KernelFile {
        name: "elementwise.cu",
        source: include_str!("../kernels/elementwise.cu"),
        functions: &[
            "add_inplace",
            "silu_mul",
            "silu_mul_bf16",
            "sigmoid_mul_inplace",
            "sigmoid_scale_rows",
            "concat_cols",
            "gather_rows",
            "scatter_add_rows",
            "embedding_bf16",
            "embedding_f32",
            "cast_f32_to_bf16",
            "cast_bf16_to_f32",
        ],
    },
    KernelFile {
        name: "gemv.cu",
        source: include_str!("../kernels/gemv.cu"),
        functions: &[
            "gemv_bf16_t1",
            "gemv_bf16_lanes_t1",
            "gemv_bf16_lanes_t2",
            "gemv_bf16_lanes_t3",
            "gemv_bf16_lanes_t4",
            "gemv_bf16_lanes_narrow_t1",
            "gemv_bf16_lanes_narrow_t2",
            "gemv_bf16_lanes_narrow_t3",
            "gemv_bf16_lanes_narrow_t4",
            "gemv_fp8_lanes_t1",
            "gemv_fp8_lanes_t2",
            "gemv_fp8_lanes_t3",
            "gemv_fp8_lanes_t4",
            "gemv_fp8_lanes_deep_t1",
            "gemv_fp8_lanes_deep_silu_gate_t1",
            "gemv_mixed_lanes_t1",
            "gemv_bf16_lanes_silu_gate_t1",
            "gemv_bf16_lanes_silu_gate_t2",
            "gemv_bf16_lanes_silu_gate_t3",
            "gemv_bf16_lanes_silu_gate_t4",
            "gemv_fp8_lanes_silu_gate_t1",
            "gemv_fp8_lanes_silu_gate_t2",
            "gemv_fp8_lanes_silu_gate_t3",
            "gemv_fp8_lanes_silu_gate_t4",
            "gemv_fp8_mma_t1",
            "gemv_fp8_mma_t2",
            "gemv_fp8_mma_t3",
            "gemv_fp8_mma_t4",
            "gemv_fp8_mma_silu_gate_t1",
            "gemv_fp8_mma_silu_gate_t2",
            "gemv_fp8_mma_silu_gate_t3",
            "gemv_fp8_mma_silu_gate_t4",
            "gemv_fp8_w8a8_t1",
            "gemv_fp8_w8a8_t2",
            "gemv_fp8_w8a8_silu_gate_t1",
            "gemv_fp8_w8a8_silu_gate_t2",
        ],
    },
    KernelFile {
        name: "moe.cu",
        source: include_str!("../kernels/moe.cu"),
        functions: &[
            "moe_route",
            "moe_route_256",
            "moe_plan",
            "moe_gate_up_t1",
            "moe_down_t1",
            "moe_gate_up_t4",
            "moe_down_t4",
            "moe_gate_up_slots",
            "moe_down_combine",
            "moe_combine",
        ],
    },
    KernelFile {
        name: "norm.cu",
        source: include_str!("../kernels/norm.cu"),
        functions: &[
            "rms_norm",
            "add_rms_norm",
            "gated_rms_norm",
            "gated_rms_norm_warps",
        ],
    },
    KernelFile {
        name: "rope.cu",
        source: include_str!("../kernels/rope.cu"),
        functions: &["rope", "qk_norm_rope"],
    },
    KernelFile {
        name: "conv.cu",
        source: include_str!("../kernels/conv.cu"),
        functions: &[
            "causal_conv1d",
            "causal_conv1d_tokens",
            "conv_window_update",
        ],
    },
    KernelFile {
        name: "gdn.cu",
        source: include_str!("../kernels/gdn.cu"),
        functions: &[
            "gdn_gates",
            "gated_delta_rule",
            "gated_delta_rule_rows_k16_c1",
            "gated_delta_rule_rows_k32_c1",
            "gated_delta_rule_rows_k64_c1",
            "gated_delta_rule_rows_k128_c1",
            "gated_delta_rule_rows_k256_c1",
            "gated_delta_rule_rows_k16_c4",
            "gated_delta_rule_rows_k32_c4",
            "gated_delta_rule_rows_k64_c4",
            "gated_delta_rule_rows_k128_c4",
            "gated_delta_rule_rows_k256_c4",
        ],
    },
    KernelFile {
        name: "gdn_chunked.cu",
        source: include_str!("../kernels/gdn_chunked.cu"),
        functions: &[
            "gdn_chunk_prepare_k16",
            "gdn_chunk_scan_k16",
            "gdn_chunk_prepare_k32",
            "gdn_chunk_scan_k32",
            "gdn_chunk_prepare_k64",
            "gdn_chunk_scan_k64",
            "gdn_chunk_prepare_k128",
            "gdn_chunk_scan_k128",
        ],
    },
    KernelFile {
        name: "attention.cu",
        source: include_str!("../kernels/attention.cu"),
        functions: &[
            "kv_write_f32",
            "kv_write_bf16",
            "paged_attention_f32",
            "paged_attention_bf16",
            "paged_attention_d1_f32",
            "paged_attention_d2_f32",
            "paged_attention_d4_f32",
            "paged_attention_d8_f32",
            "paged_attention_d1_bf16",
            "paged_attention_d2_bf16",
            "paged_attention_d4_bf16",
            "paged_attention_d8_bf16",
            "paged_attention_d4_g2_f32",
            "paged_attention_d4_g4_f32",
            "paged_attention_d4_g6_f32",
            "paged_attention_d4_g8_f32",
            "paged_attention_d8_g2_f32",
            "paged_attention_d8_g4_f32",
            "paged_attention_d8_g6_f32",
            "paged_attention_d8_g8_f32",
            "paged_attention_d4_g2_bf16",
            "paged_attention_d4_g4_bf16",
            "paged_attention_d4_g6_bf16",
            "paged_attention_d4_g8_bf16",
            "paged_attention_d8_g2_bf16",
            "paged_attention_d8_g4_bf16",
            "paged_attention_d8_g6_bf16",
            "paged_attention_d8_g8_bf16",
            "attention_combine",
        ],
    },
    KernelFile {
        name: "flash_attention.cu",
        source: include_str!("../kernels/flash_attention.cu"),
        functions: &[
            "flash_prefill_d32_f32",
            "flash_prefill_d64_f32",
            "flash_prefill_d128_f32",
            "flash_prefill_d256_f32",
            "flash_prefill_d32_bf16",
            "flash_prefill_d64_bf16",
            "flash_prefill_d128_bf16",
            "flash_prefill_d256_bf16",
        ],
    },
    KernelFile {
        name: "sampling.cu",
        source: include_str!("../kernels/sampling.cu"),
        functions: &["sample_rows", "mask_rows"],
    },
    KernelFile {
        name: "block_fp8.cu",
        source: include_str!("../kernels/block_fp8.cu"),
        functions: &[
            "quantize_block_fp8",
            "dequantize_block_fp8_bf16",
            "quantize_activations_fp8",
        ],
    },
    KernelFile {
        name: "dummy.cu",
        source: include_str!("../kernels/dummy.cu"),
        functions: &["dummy_fill"],
    },
    KernelFile {
        name: "probe.cu",
        source: include_str!("../kernels/probe.cu"),
        functions: &["read_bandwidth"],
    },
];

/// The text NVRTC compiles for `file`: the common helpers, then the file with its own line numbers.
pub fn full_source(file: &KernelFile) -> String {
    format!("{COMMON}\n#line 1 \"{}\"\n{}", file.name, file.source)
}

/// Longest conv history `causal_conv1d` keeps in registers (`MAX_HISTORY` in conv.cu).
pub const MAX_CONV_HISTORY: usize = 7;
