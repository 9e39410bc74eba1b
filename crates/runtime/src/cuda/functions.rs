//! Every entry point of `kernels.cu`, looked up once per device when the module is loaded: the
//! kernels the shared launches use, and one table per op family whose file launches them. The
//! tables live here, not in the families' files, so that the launch context (`gpu.rs`'s `Gpu`,
//! which holds the [`Functions`]) names no op family: arrows run from the families to it.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule};

/// The compiled kernels of one device.
#[derive(Debug)]
pub(super) struct Functions {
    pub(super) unary: CudaFunction,
    pub(super) binary: CudaFunction,
    pub(super) where_: CudaFunction,
    pub(super) gather_strided: CudaFunction,
    pub(super) copy_block: CudaFunction,
    pub(super) gather_axis: CudaFunction,
    pub(super) softmax_rows: CudaFunction,
    pub(super) norm_rows: CudaFunction,
    pub(super) norm_channels: CudaFunction,
    pub(super) reduce_rows: CudaFunction,
    pub(super) reduce: CudaFunction,
    pub(super) im2col: CudaFunction,
    pub(super) conv_direct: CudaFunction,
    pub(super) conv_transpose: CudaFunction,
    pub(super) pool: CudaFunction,
    pub(super) pool_nd: CudaFunction,
    pub(super) gather_rows: CudaFunction,
    pub(super) einsum: CudaFunction,
    pub(super) scatter_rows: CudaFunction,
    pub(super) batch_norm: CudaFunction,
    pub(super) resize_axis: CudaFunction,
    pub(super) arg_reduce: CudaFunction,
    pub(super) cumsum: CudaFunction,
    pub(super) lrn: CudaFunction,
    /// Attention and RotaryEmbedding (`attention.rs`).
    pub(super) attention: AttentionKernels,
    pub(super) grid_sample: CudaFunction,
    pub(super) recurrent_step: CudaFunction,
    pub(super) pad: CudaFunction,
    pub(super) roi_align: CudaFunction,
    pub(super) deform_conv: CudaFunction,
    pub(super) moments_rows: CudaFunction,
    pub(super) running_stats: CudaFunction,
    pub(super) conv3d: CudaFunction,
    pub(super) masks: MaskKernels,
    pub(super) dft: CudaFunction,
    /// DFT's fast transforms (`fft.rs`).
    pub(super) fft: FftKernels,
    pub(super) det: CudaFunction,
    pub(super) reduce_blocks: CudaFunction,
    pub(super) stft_frames: CudaFunction,
    pub(super) trilu: CudaFunction,
    /// TopK's sorts (`top_k.rs`).
    pub(super) top_k: TopKKernels,
    pub(super) col2im: CudaFunction,
    pub(super) one_hot: CudaFunction,
    pub(super) mel_weights: CudaFunction,
    pub(super) bernoulli: CudaFunction,
    /// Binarizer, ArrayFeatureExtractor and TreeEnsemble (`ml.rs`).
    pub(super) ml: MlKernels,
    /// The element-wise fast path (`flat.rs`).
    pub(super) flat: FlatKernels,
    /// The epilogue of a Conv with nodes folded in (`conv_fold.rs`).
    pub(super) conv_epilogue: CudaFunction,
    /// MatMulNBits' weight expansion (`nbits.rs`).
    pub(super) nbits: NbitsKernels,
    /// The fused transformer steps (`fuse.rs`).
    pub(super) fused: FusedKernels,
}

impl Functions {
    /// Looks up every kernel in the module compiled from `kernels.cu`.
    pub(super) fn load(module: &Arc<CudaModule>) -> Result<Functions, String> {
        let f = |name: &str| kernel(module, name);
        Ok(Functions {
            unary: f("unary_f32")?,
            binary: f("binary_f32")?,
            where_: f("where_f32")?,
            gather_strided: f("gather_strided_f32")?,
            copy_block: f("copy_block_f32")?,
            gather_axis: f("gather_axis_f32")?,
            softmax_rows: f("softmax_rows_f32")?,
            norm_rows: f("norm_rows_f32")?,
            norm_channels: f("norm_channels_f32")?,
            reduce_rows: f("reduce_rows_f32")?,
            reduce: f("reduce_f32")?,
            im2col: f("im2col_f32")?,
            conv_direct: f("conv_direct_f32")?,
            conv_transpose: f("conv_transpose_f32")?,
            pool: f("pool_f32")?,
            pool_nd: f("pool_nd_f32")?,
            gather_rows: f("gather_rows_f32")?,
            einsum: f("einsum_f32")?,
            scatter_rows: f("scatter_rows_f32")?,
            batch_norm: f("batch_norm_f32")?,
            resize_axis: f("resize_axis_f32")?,
            arg_reduce: f("arg_reduce_f32")?,
            cumsum: f("cumsum_f32")?,
            lrn: f("lrn_f32")?,
            attention: AttentionKernels::load(module)?,
            grid_sample: f("grid_sample_f32")?,
            recurrent_step: f("recurrent_step_f32")?,
            pad: f("pad_f32")?,
            roi_align: f("roi_align_f32")?,
            deform_conv: f("deform_conv_f32")?,
            moments_rows: f("moments_rows_f32")?,
            running_stats: f("running_stats_f32")?,
            conv3d: f("conv3d_f32")?,
            masks: MaskKernels::load(module)?,
            dft: f("dft_f32")?,
            fft: FftKernels::load(module)?,
            det: f("det_f32")?,
            reduce_blocks: f("reduce_blocks_f32")?,
            stft_frames: f("stft_frames_f32")?,
            trilu: f("trilu_f32")?,
            top_k: TopKKernels::load(module)?,
            col2im: f("col2im_f32")?,
            one_hot: f("one_hot_f32")?,
            mel_weights: f("mel_weights_f32")?,
            bernoulli: f("bernoulli_f32")?,
            ml: MlKernels::load(module)?,
            flat: FlatKernels::load(module)?,
            conv_epilogue: f("conv_epilogue_f32")?,
            nbits: NbitsKernels::load(module)?,
            fused: FusedKernels::load(module)?,
        })
    }
}

/// Attention and RotaryEmbedding's kernels (`attention.rs`).
#[derive(Debug)]
pub(super) struct AttentionKernels {
    pub(super) softmax: CudaFunction,
    pub(super) rotary: CudaFunction,
}

impl AttentionKernels {
    fn load(module: &Arc<CudaModule>) -> Result<AttentionKernels, String> {
        let f = |name: &str| kernel(module, name);
        Ok(AttentionKernels {
            softmax: f("attention_softmax_f32")?,
            rotary: f("rotary_f32")?,
        })
    }
}

/// The kernels on boolean masks held as floats (`masks.rs`).
#[derive(Debug)]
pub(super) struct MaskKernels {
    pub(super) binary: CudaFunction,
    pub(super) unary: CudaFunction,
    pub(super) where_: CudaFunction,
    pub(super) round_float: CudaFunction,
}

impl MaskKernels {
    fn load(module: &Arc<CudaModule>) -> Result<MaskKernels, String> {
        let f = |name: &str| kernel(module, name);
        Ok(MaskKernels {
            binary: f("mask_binary_f32")?,
            unary: f("mask_unary_f32")?,
            where_: f("where_mask_f32")?,
            round_float: f("round_float_f32")?,
        })
    }
}

/// DFT's fast transforms (`fft.rs`).
#[derive(Debug)]
pub(super) struct FftKernels {
    pub(super) load: CudaFunction,
    pub(super) step: CudaFunction,
    pub(super) multiply: CudaFunction,
    pub(super) store: CudaFunction,
}

impl FftKernels {
    fn load(module: &Arc<CudaModule>) -> Result<FftKernels, String> {
        let f = |name: &str| kernel(module, name);
        Ok(FftKernels {
            load: f("fft_load_f64")?,
            step: f("fft_step_f64")?,
            multiply: f("fft_multiply_f64")?,
            store: f("fft_store_f32")?,
        })
    }
}

/// TopK's sorts (`top_k.rs`).
#[derive(Debug)]
pub(super) struct TopKKernels {
    pub(super) block: CudaFunction,
    pub(super) load: CudaFunction,
    pub(super) step: CudaFunction,
    pub(super) chunk: CudaFunction,
    pub(super) store: CudaFunction,
}

impl TopKKernels {
    fn load(module: &Arc<CudaModule>) -> Result<TopKKernels, String> {
        let f = |name: &str| kernel(module, name);
        Ok(TopKKernels {
            block: f("top_k_block_f32")?,
            load: f("top_k_load_f32")?,
            step: f("top_k_step_f32")?,
            chunk: f("top_k_chunk_f32")?,
            store: f("top_k_store_f32")?,
        })
    }
}

/// Binarizer, ArrayFeatureExtractor, TreeEnsemble and LabelEncoder (`ml.rs`).
#[derive(Debug)]
pub(super) struct MlKernels {
    pub(super) binarize: CudaFunction,
    pub(super) tree_leaves: CudaFunction,
    pub(super) tree_aggregate: CudaFunction,
    pub(super) label_encode: CudaFunction,
}

impl MlKernels {
    fn load(module: &Arc<CudaModule>) -> Result<MlKernels, String> {
        let f = |name: &str| kernel(module, name);
        Ok(MlKernels {
            binarize: f("binarize_f32")?,
            tree_leaves: f("tree_leaves_f32")?,
            tree_aggregate: f("tree_aggregate_f32")?,
            label_encode: f("label_encode_f32")?,
        })
    }
}

/// The element-wise fast path's kernels (`flat.rs`).
#[derive(Debug)]
pub(super) struct FlatKernels {
    pub(super) binary: CudaFunction,
    pub(super) compare: CudaFunction,
    pub(super) where_mask: CudaFunction,
    pub(super) where_flags: CudaFunction,
}

impl FlatKernels {
    fn load(module: &Arc<CudaModule>) -> Result<FlatKernels, String> {
        let f = |name: &str| kernel(module, name);
        Ok(FlatKernels {
            binary: f("binary_flat_f32")?,
            compare: f("mask_binary_flat_f32")?,
            where_mask: f("where_mask_flat_f32")?,
            where_flags: f("where_flat_f32")?,
        })
    }
}

/// MatMulNBits' weight expansion (`nbits.rs`).
#[derive(Debug)]
pub(super) struct NbitsKernels {
    pub(super) dequant: CudaFunction,
}

impl NbitsKernels {
    fn load(module: &Arc<CudaModule>) -> Result<NbitsKernels, String> {
        let dequant = module.load_function("dequant_nbits_f32").map_err(|e| {
            format!("kernel 'dequant_nbits_f32' missing from the compiled module: {e}")
        })?;
        Ok(NbitsKernels { dequant })
    }
}

/// The fused steps' own kernels (`fuse.rs`; the norms use `norm_rows_f32`).
#[derive(Debug)]
pub(super) struct FusedKernels {
    pub(super) gelu: CudaFunction,
    pub(super) silu: CudaFunction,
    pub(super) bias_rows: CudaFunction,
}

impl FusedKernels {
    fn load(module: &Arc<CudaModule>) -> Result<FusedKernels, String> {
        Ok(FusedKernels {
            gelu: kernel(module, "fused_gelu_f32")?,
            silu: kernel(module, "fused_silu_f32")?,
            bias_rows: kernel(module, "bias_rows_f32")?,
        })
    }
}

/// `name` from the compiled module, or why it is not there.
pub(super) fn kernel(module: &Arc<CudaModule>, name: &str) -> Result<CudaFunction, String> {
    module
        .load_function(name)
        .map_err(|e| format!("kernel '{name}' missing from the compiled module: {e}"))
}
