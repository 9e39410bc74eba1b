//! The CPU kernels: one file per op family, registered in one table ([`lookup`]).
//!
//! Arrows run one way: this module lists the families and registers them; each family reads
//! what a kernel is from `context.rs` and the shared shape and offset helpers from
//! `indexing.rs` (and a few siblings' helpers), never this module.
//!
//! A kernel is a plain function from the node (attributes, opset) and its input tensors to its
//! output tensors. Kernels compute shapes from the tensors they receive, never from the shapes
//! inference recorded, so one prepared stage runs any micro-batch size. A kernel reports bad
//! inputs as a `String`; the executor wraps it into [`crate::Error::Kernel`] with the node's name.

mod activation;
mod attention;
#[cfg(feature = "cuda")]
pub(crate) use attention::CacheRows as RotaryCacheRows;
mod axis_ops;
mod bitwise;
mod channel_norm;
mod collective;
mod constant;
mod context;
mod control;
#[cfg(feature = "cuda")]
pub(crate) use control::{empty_of as empty_scan_output, stack as stack_host};
mod conv;
pub(crate) use conv::{conv_then, Epilogue};
// The CUDA backend's window ops share the CPU kernels' window geometry.
#[cfg(feature = "cuda")]
pub(crate) use conv::{conv_group, nchw_of, spatial, window, Window};
// The CUDA backend's ops share these index and window computations with the CPU kernels.
#[cfg(feature = "cuda")]
pub(crate) use conv_transpose_nd::geometry as conv_transpose_geometry;
#[cfg(feature = "cuda")]
pub(crate) use einsum::einsum_loops;
#[cfg(feature = "cuda")]
pub(crate) use movement::gather_elements_offsets;
#[cfg(feature = "cuda")]
pub(crate) use pool_nd::geometry as pool_geometry;
#[cfg(feature = "cuda")]
pub(crate) use quant::{block_size as quant_block_size, param_offsets as quant_param_offsets};
#[cfg(feature = "cuda")]
pub(crate) use recurrent::Cell as RecurrentCell;
#[cfg(feature = "cuda")]
pub(crate) use scatter::{gather_nd_rows, scatter_elements_offsets, scatter_nd_rows};
mod conv_transpose_nd;
mod crop;
mod detection;
mod einsum;
mod elementwise;
mod fast_math;
mod grid_sample;
mod image_decoder;
mod indexing;
mod linalg;
mod loss;
mod matmul;
pub(crate) use matmul::sgemm;
mod microsoft;
mod ml;
mod ml_maps;
mod ml_predictors;
mod ml_transforms;
mod ms_quant;
#[cfg(feature = "cuda")]
pub(crate) use ml::{float_labels, Branch as TreeBranch, Forest, Test as TreeTest};
mod movement;
mod ms_attention;
mod sequence;
mod signal;
mod strings;
mod values;
pub(crate) use values::{ValueCtx, ValueKernel};
mod spatial;
#[cfg(feature = "cuda")]
pub(crate) use spatial::{affine_grid_points, col2im_geometry, max_unpool_targets, Col2Im};
mod spectral;
#[cfg(feature = "cuda")]
pub(crate) use spectral::{dft_lines, mel_filter_edges, mel_inputs, stft_frames, twiddles};
mod tap_product;
mod tensor_scatter;
#[cfg(feature = "cuda")]
pub(crate) use tensor_scatter::tensor_scatter_rows;

#[cfg(feature = "cuda")]
pub(crate) use movement::{narrow, shape_tensor, transpose_perm, view_shape};
mod norm;
mod pool_nd;
mod quant;
mod random;
#[cfg(feature = "cuda")]
pub(crate) use random::{draw_seed, output_dtype as random_output_dtype};
mod rearrange;
mod recurrent;
mod reduce;
mod resize;
#[cfg(feature = "cuda")]
pub(crate) use resize::resize_plan;
mod scatter;
mod select;
mod state_space;
mod topk;

use std::sync::OnceLock;

#[cfg(feature = "cuda")]
pub(crate) use context::KernelResult;
use context::KernelTable;
pub(crate) use context::{Ctx, Kernel};
pub(crate) use indexing::checked_size;
#[cfg(feature = "cuda")]
pub(crate) use indexing::{broadcast_shapes, normalize_axis};

fn table() -> &'static KernelTable {
    static TABLE: OnceLock<KernelTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = KernelTable::default();
        elementwise::register(&mut t);
        activation::register(&mut t);
        matmul::register(&mut t);
        conv::register(&mut t);
        norm::register(&mut t);
        attention::register(&mut t);
        loss::register(&mut t);
        topk::register(&mut t);
        reduce::register(&mut t);
        movement::register(&mut t);
        scatter::register(&mut t);
        microsoft::register(&mut t);
        collective::register(&mut t);
        ms_attention::register(&mut t);
        quant::register(&mut t);
        axis_ops::register(&mut t);
        bitwise::register(&mut t);
        grid_sample::register(&mut t);
        signal::register(&mut t);
        linalg::register(&mut t);
        crop::register(&mut t);
        resize::register(&mut t);
        recurrent::register(&mut t);
        state_space::register(&mut t);
        rearrange::register(&mut t);
        channel_norm::register(&mut t);
        einsum::register(&mut t);
        strings::register(&mut t);
        ml::register(&mut t);
        ml_predictors::register(&mut t);
        ml_transforms::register(&mut t);
        ms_quant::register(&mut t);
        select::register(&mut t);
        detection::register(&mut t);
        constant::register(&mut t);
        spatial::register(&mut t);
        spectral::register(&mut t);
        tensor_scatter::register(&mut t);
        random::register(&mut t);
        image_decoder::register(&mut t);
        t
    })
}

/// The kernel for an op, if the CPU runtime has one.
pub(crate) fn lookup(domain: &str, op: &str) -> Option<Kernel> {
    let domain = if domain == "ai.onnx" { "" } else { domain };
    table().kernels.get(&(domain, op)).copied()
}

/// The kernel on values for an op, if the CPU runtime has one (sequences, optionals, control
/// flow, ZipMap's sequence of maps, and the ops that read maps).
pub(crate) fn lookup_value(domain: &str, op: &str) -> Option<ValueKernel> {
    static TABLE: OnceLock<values::ValueKernelTable> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = values::ValueKernelTable::default();
        sequence::register(&mut t);
        control::register(&mut t);
        ml_transforms::register_values(&mut t);
        ml_maps::register_values(&mut t);
        t
    });
    table.get(domain, op)
}

/// Every op with a CPU kernel, as `domain:op` (`:Add` for the default domain), sorted.
pub fn supported_ops() -> Vec<String> {
    let mut ops: Vec<String> = table()
        .kernels
        .keys()
        .map(|(d, o)| format!("{d}:{o}"))
        .collect();
    ops.sort();
    ops
}

#[cfg(test)]
pub(crate) mod test_util {
    use super::*;
    use crate::tensor::HostTensor;
    use pipecut_ir::graph::{Attribute, Node};
    use std::collections::BTreeMap;

    /// A node of `op` with attributes, for kernel unit tests.
    pub fn node(op: &str, attributes: Vec<(&str, Attribute)>) -> Node {
        Node {
            name: format!("{op}_test"),
            op_type: op.to_string(),
            domain: String::new(),
            attributes: attributes
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect::<BTreeMap<_, _>>(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            captures: Vec::new(),
            module_scope: None,
        }
    }

    /// Runs the registered kernel of `op` (opset 17) on inputs.
    pub fn run(
        op: &str,
        attributes: Vec<(&str, Attribute)>,
        inputs: &[&HostTensor],
    ) -> Vec<HostTensor> {
        run_opset(op, 17, attributes, inputs)
    }

    pub fn run_opset(
        op: &str,
        opset: i64,
        attributes: Vec<(&str, Attribute)>,
        inputs: &[&HostTensor],
    ) -> Vec<HostTensor> {
        let node = node(op, attributes);
        let ctx = Ctx {
            node: &node,
            opset,
            output_dtypes: &[],
            input_dtypes: &[],
        };
        let inputs: Vec<Option<&HostTensor>> = inputs.iter().map(|t| Some(*t)).collect();
        lookup("", op).expect("kernel registered")(&ctx, &inputs).expect("kernel succeeds")
    }

    /// Runs the registered kernel of `op` in `domain` (opset 5), its error as it is.
    pub fn run_in(
        domain: &str,
        op: &str,
        attributes: Vec<(&str, Attribute)>,
        inputs: &[&HostTensor],
    ) -> Result<Vec<HostTensor>, String> {
        let node = node(op, attributes);
        let ctx = Ctx {
            node: &node,
            opset: 5,
            output_dtypes: &[],
            input_dtypes: &[],
        };
        let inputs: Vec<Option<&HostTensor>> = inputs.iter().map(|t| Some(*t)).collect();
        lookup(domain, op).expect("kernel registered")(&ctx, &inputs)
    }

    pub fn f(shape: &[usize], data: &[f32]) -> HostTensor {
        HostTensor::f32(shape.to_vec(), data.to_vec())
    }

    pub fn i(shape: &[usize], data: &[i64]) -> HostTensor {
        HostTensor::i64(shape.to_vec(), data.to_vec())
    }

    pub fn assert_close(actual: &HostTensor, shape: &[usize], expected: &[f32]) {
        assert_eq!(actual.shape(), shape);
        let a = actual.as_f32().unwrap();
        for (k, (x, y)) in a.iter().zip(expected).enumerate() {
            assert!(
                (x - y).abs() <= 1e-5 + 1e-5 * y.abs(),
                "element {k}: {x} vs {y} in {a:?}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registered_op_is_listed() {
        let ops = supported_ops();
        assert!(ops.contains(&":MatMul".to_string()));
        assert!(lookup("ai.onnx", "Add").is_some());
        assert!(lookup("", "NoSuchOp").is_none());
    }

    /// Zero-size inputs given to every kernel in every arity from one to four, as float and as
    /// int64, with no attribute: a kernel answers or refuses within 20 s, and never panics. The
    /// shapes are what a model's shapes can make (issue 37: Conv over no channel, LayerNorm and
    /// SkipLayerNorm over rows of nothing panicked).
    #[test]
    fn no_kernel_panics_or_loops_on_zero_size_inputs() {
        use crate::tensor::HostTensor;
        // A dim of a million beside a zero: nothing to hold, but a kernel that loops over the
        // outer dims or sizes its outputs by them must still answer at once.
        const LARGE: usize = 1 << 20;
        // Beyond any memory: an output sized by this dim must be refused, not allocated.
        const HUGE: usize = 1 << 40;
        let shapes: [&[usize]; 8] = [
            &[0],
            &[3, 0],
            &[0, 4],
            &[2, 0, 3],
            &[LARGE, 0],
            &[0, LARGE],
            &[HUGE, 0],
            &[0, HUGE],
        ];
        let mut ops: Vec<_> = table().kernels.iter().map(|(k, v)| (*k, *v)).collect();
        ops.sort_by_key(|(key, _)| *key);
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let mut findings = Vec::new();
        for ((domain, op), kernel) in ops {
            let (sender, receiver) = std::sync::mpsc::channel();
            let shapes = shapes.to_vec();
            std::thread::spawn(move || {
                for shape in shapes {
                    for arity in 1..=4 {
                        for float in [true, false] {
                            let tensor = match float {
                                true => HostTensor::f32(shape.to_vec(), Vec::new()),
                                false => HostTensor::i64(shape.to_vec(), Vec::new()),
                            };
                            let inputs: Vec<Option<&HostTensor>> = vec![Some(&tensor); arity];
                            let mut node = test_util::node(op, Vec::new());
                            node.domain = domain.to_string();
                            let ctx = Ctx {
                                node: &node,
                                opset: 21,
                                output_dtypes: &[],
                                input_dtypes: &[],
                            };
                            let call =
                                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                    kernel(&ctx, &inputs)
                                }));
                            if let Err(payload) = call {
                                let why = payload
                                    .downcast_ref::<String>()
                                    .cloned()
                                    .or_else(|| {
                                        payload.downcast_ref::<&str>().map(|s| s.to_string())
                                    })
                                    .unwrap_or_default();
                                let _ = sender.send(Some(format!(
                                    "{domain}:{op} panics on {arity} x {shape:?} ({}): {why}",
                                    if float { "f32" } else { "i64" }
                                )));
                            }
                        }
                    }
                }
                let _ = sender.send(None);
            });
            loop {
                // A loop over a 2^40 dim never ends; a million rows of nothing take seconds in
                // a debug build on a loaded machine.
                match receiver.recv_timeout(std::time::Duration::from_secs(20)) {
                    Ok(Some(finding)) => findings.push(finding),
                    Ok(None) => break,
                    Err(_) => {
                        findings.push(format!("{domain}:{op} runs for more than 20 s"));
                        break;
                    }
                }
            }
        }
        std::panic::set_hook(hook);
        assert!(
            findings.is_empty(),
            "{} findings:\n{}",
            findings.len(),
            findings.join("\n")
        );
    }
}
