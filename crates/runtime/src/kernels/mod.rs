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

use crate::tensor::{runtime_dtype, HostTensor};
pub(crate) use context::KernelResult;
use context::KernelTable;
pub(crate) use context::{Ctx, Kernel};
pub(crate) use indexing::checked_size;
#[cfg(feature = "cuda")]
pub(crate) use indexing::{broadcast_shapes, normalize_axis};
use pipecut_ir::graph::DType;

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
    table().kernels.get(&(table_domain(domain), op)).copied()
}

/// The domain as the table keys it: `""` for the default domain, however a model spells it.
fn table_domain(domain: &str) -> &str {
    if domain == "ai.onnx" {
        ""
    } else {
        domain
    }
}

/// The ops whose kernels take uint8 and int8 tensors as bytes: the ones that move elements
/// without reading them (through [`indexing::take`] and its kin), and the ones that read them only
/// through [`HostTensor::to_f32_vec`] / [`HostTensor::to_i64_vec`] (Cast, the quantized ops).
/// Every other kernel sees bytes widened to int64 ([`call`]).
const TAKES_BYTES: &[(&str, &str)] = &[
    ("", "Reshape"),
    ("", "Unsqueeze"),
    ("", "Squeeze"),
    ("", "Flatten"),
    ("", "Transpose"),
    ("", "Concat"),
    ("", "Split"),
    ("", "Slice"),
    ("", "Gather"),
    ("", "GatherElements"),
    ("", "GatherND"),
    ("", "Expand"),
    ("", "Tile"),
    ("", "Shape"),
    ("", "Size"),
    ("", "Identity"),
    ("", "Dropout"),
    ("", "DepthToSpace"),
    ("", "SpaceToDepth"),
    ("", "ReverseSequence"),
    ("", "Trilu"),
    ("", "CenterCropPad"),
    ("", "Compress"),
    ("", "OneHot"),
    ("", "Pad"),
    ("", "Where"),
    ("", "Cast"),
    ("", "CastLike"),
    ("", "ImageDecoder"),
    ("", "QuantizeLinear"),
    ("", "DequantizeLinear"),
    ("", "DynamicQuantizeLinear"),
    ("", "MatMulInteger"),
    ("", "QLinearMatMul"),
    ("", "ConvInteger"),
    ("", "QLinearConv"),
    ("com.microsoft", "MatMulNBits"),
    ("com.microsoft", "QLinearAdd"),
    ("com.microsoft", "QLinearMul"),
    ("com.microsoft", "QLinearSigmoid"),
    ("com.microsoft", "QLinearLeakyRelu"),
    ("com.microsoft", "QLinearSoftmax"),
    ("com.microsoft", "QLinearGlobalAveragePool"),
    ("com.microsoft", "QLinearAveragePool"),
    ("com.microsoft", "QLinearConcat"),
    ("com.microsoft", "QGemm"),
    ("com.microsoft", "DynamicQuantizeMatMul"),
    ("com.microsoft", "MatMulIntegerToFloat"),
    ("com.microsoft", "QAttention"),
];

/// Runs `kernel` for `ctx`'s node: a kernel without a byte path ([`TAKES_BYTES`]) gets uint8 and
/// int8 inputs widened to int64, and an int64 output the graph declares uint8 or int8 is narrowed
/// back (wrapping, as ONNX integer arithmetic does; int4 and the other sub-byte types likewise
/// into their byte), so bytes stay bytes across any kernel.
pub(crate) fn call(kernel: Kernel, ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let domain = table_domain(&ctx.node.domain);
    let has_bytes = inputs.iter().flatten().any(|t| t.data().is_bytes());
    let outputs = if has_bytes && !TAKES_BYTES.contains(&(domain, ctx.node.op_type.as_str())) {
        let wide = inputs
            .iter()
            .map(|t| t.map(HostTensor::widened).transpose())
            .collect::<Result<Vec<_>, String>>()?;
        let wide: Vec<Option<&HostTensor>> = wide.iter().map(Option::as_deref).collect();
        kernel(ctx, &wide)?
    } else {
        kernel(ctx, inputs)?
    };
    outputs
        .into_iter()
        .enumerate()
        .map(
            |(i, out)| match ctx.output_dtypes.get(i).copied().flatten() {
                Some(declared)
                    if out.dtype() == DType::I64
                        && matches!(runtime_dtype(declared), DType::U8 | DType::I8) =>
                {
                    out.cast(declared)
                }
                _ => Ok(out),
            },
        )
        .collect()
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

    /// A node of `op` with attributes, for kernel unit tests.
    pub fn node(op: &str, attributes: Vec<(&str, Attribute)>) -> Node {
        Node {
            name: format!("{op}_test"),
            op_type: op.to_string(),
            domain: String::new(),
            attributes: attributes
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
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
        call(lookup("", op).expect("kernel registered"), &ctx, &inputs).expect("kernel succeeds")
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
        call(
            lookup(domain, op).expect("kernel registered"),
            &ctx,
            &inputs,
        )
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
    use crate::tensor::TensorData;

    #[test]
    fn every_registered_op_is_listed() {
        let ops = supported_ops();
        assert!(ops.contains(&":MatMul".to_string()));
        assert!(lookup("ai.onnx", "Add").is_some());
        assert!(lookup("", "NoSuchOp").is_none());
    }

    /// Runs `probe` on every registered kernel, each in a thread of its own with 20 s to
    /// finish (a loop over a 2^40 dim never ends; a million rows of nothing take seconds in a
    /// debug build on a loaded machine), and returns what the probes found, a timeout included.
    fn sweep(probe: fn(&'static str, &'static str, Kernel) -> Vec<String>) -> Vec<String> {
        let mut ops: Vec<_> = table().kernels.iter().map(|(k, v)| (*k, *v)).collect();
        ops.sort_by_key(|(key, _)| *key);
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let mut findings = Vec::new();
        for ((domain, op), kernel) in ops {
            let (sender, receiver) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = sender.send(probe(domain, op, kernel));
            });
            match receiver.recv_timeout(std::time::Duration::from_secs(20)) {
                Ok(found) => findings.extend(found),
                Err(_) => findings.push(format!("{domain}:{op} runs for more than 20 s")),
            }
        }
        std::panic::set_hook(hook);
        findings
    }

    /// `f`'s result, or its panic's message.
    fn caught<T>(f: impl FnOnce() -> T) -> Result<T, String> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|payload| {
            payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        })
    }

    /// A node of `op` in `domain`, no attribute.
    fn bare_node(domain: &str, op: &str) -> pipecut_ir::graph::Node {
        let mut node = test_util::node(op, Vec::new());
        node.domain = domain.to_string();
        node
    }

    /// The layout ops that move elements without arithmetic (Pad, Trilu, CenterCropPad,
    /// Compress, OneHot) take uint8 and int8 as bytes: given real arguments and no declared
    /// output type, each gives bytes (a widened call gives int64, its temporary copies 8 bytes
    /// an element) holding the values the int64 call gives.
    #[test]
    fn layout_ops_keep_bytes_with_the_values_int64_gives() {
        let i64s = |shape: Vec<usize>, v: &[i64]| HostTensor::i64(shape, v.to_vec());
        let u8s = HostTensor::with_data(vec![2, 3], TensorData::U8(vec![0, 1, 2, 3, 254, 255]));
        let i8s = HostTensor::with_data(vec![2, 3], TensorData::I8(vec![-128, -1, 0, 1, 2, 127]));
        let keep = HostTensor::with_data(vec![3], TensorData::Bool(vec![true, false, true]));
        for x in [&u8s, &i8s] {
            let fill = match x.data() {
                TensorData::U8(_) => HostTensor::with_data(vec![1], TensorData::U8(vec![7])),
                _ => HostTensor::with_data(vec![1], TensorData::I8(vec![-7])),
            };
            let on_off = match x.data() {
                TensorData::U8(_) => HostTensor::with_data(vec![2], TensorData::U8(vec![0, 255])),
                _ => HostTensor::with_data(vec![2], TensorData::I8(vec![-128, 127])),
            };
            let (pads, sizes) = (i64s(vec![4], &[0, 1, 1, 0]), i64s(vec![2], &[3, 2]));
            let (indices, depth) = (i64s(vec![3], &[0, 2, 1]), i64s(vec![1], &[3]));
            let cases: [(&str, Vec<&HostTensor>, usize); 5] = [
                ("Pad", vec![x, &pads, &fill], 0),
                ("Trilu", vec![x], 0),
                ("CenterCropPad", vec![x, &sizes], 0),
                ("Compress", vec![x, &keep], 0),
                ("OneHot", vec![&indices, &depth, &on_off], 2),
            ];
            for (op, args, bytes_at) in cases {
                let node = test_util::node(op, Vec::new());
                let ctx = Ctx {
                    node: &node,
                    opset: 21,
                    output_dtypes: &[],
                    input_dtypes: &[],
                };
                let kernel = lookup("", op).unwrap();
                let as_given: Vec<Option<&HostTensor>> = args.iter().map(|&t| Some(t)).collect();
                let got = call(kernel, &ctx, &as_given).unwrap();
                let wide = args[bytes_at].widened().unwrap();
                let mut as_wide = as_given.clone();
                as_wide[bytes_at] = Some(&*wide);
                let expected = kernel(&ctx, &as_wide).unwrap();
                assert_eq!(got[0].dtype(), x.dtype(), "{op} on {x:?}");
                assert_eq!(got[0].shape(), expected[0].shape(), "{op} on {x:?}");
                assert_eq!(
                    got[0].to_i64_vec(),
                    expected[0].to_i64_vec(),
                    "{op} on {x:?}"
                );
            }
        }
    }

    /// A kernel without a byte path (Add) computes on int64 and its output, declared uint8,
    /// comes back as bytes, wrapped as ONNX integer arithmetic wraps; undeclared, it stays int64.
    #[test]
    fn declared_bytes_stay_bytes_across_a_kernel_without_a_byte_path() {
        let node = test_util::node("Add", Vec::new());
        let a = HostTensor::with_data(vec![2], TensorData::U8(vec![200, 7]));
        let b = HostTensor::with_data(vec![2], TensorData::U8(vec![100, 1]));
        let add = lookup("", "Add").unwrap();
        let run = |declared: &[Option<DType>]| {
            let ctx = Ctx {
                node: &node,
                opset: 17,
                output_dtypes: declared,
                input_dtypes: &[],
            };
            call(add, &ctx, &[Some(&a), Some(&b)]).unwrap().remove(0)
        };
        assert_eq!(run(&[Some(DType::U8)]).data(), &TensorData::U8(vec![44, 8]));
        assert_eq!(run(&[]).data(), &TensorData::I64(vec![300, 8]));
    }

    /// Zero-size inputs given to every kernel in every arity from one to four, as float and as
    /// int64, with no attribute: a kernel answers or refuses within 20 s, and never panics. The
    /// shapes are what a model's shapes can make (issue 37: Conv over no channel, LayerNorm and
    /// SkipLayerNorm over rows of nothing panicked).
    #[test]
    fn no_kernel_panics_or_loops_on_zero_size_inputs() {
        fn probe(domain: &'static str, op: &'static str, kernel: Kernel) -> Vec<String> {
            // A dim of a million beside a zero: nothing to hold, but a kernel that loops over
            // the outer dims or sizes its outputs by them must still answer at once.
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
            let node = bare_node(domain, op);
            let ctx = Ctx {
                node: &node,
                opset: 21,
                output_dtypes: &[],
                input_dtypes: &[],
            };
            let mut findings = Vec::new();
            for shape in shapes {
                for arity in 1..=4 {
                    for float in [true, false] {
                        let tensor = match float {
                            true => HostTensor::f32(shape.to_vec(), Vec::new()),
                            false => HostTensor::i64(shape.to_vec(), Vec::new()),
                        };
                        let inputs: Vec<Option<&HostTensor>> = vec![Some(&tensor); arity];
                        if let Err(why) = caught(|| kernel(&ctx, &inputs)) {
                            findings.push(format!(
                                "{domain}:{op} panics on {arity} x {shape:?} ({}): {why}",
                                if float { "f32" } else { "i64" }
                            ));
                        }
                    }
                }
            }
            findings
        }
        let findings = sweep(probe);
        assert!(
            findings.is_empty(),
            "{} findings:\n{}",
            findings.len(),
            findings.join("\n")
        );
    }

    /// uint8 and int8 inputs given to every kernel in every arity from one to three, with no
    /// attribute, through [`call`]: the answer is the one the kernel gives the same values as
    /// int64 (the same error, or outputs of the same shapes and values), and never a panic. A
    /// kernel listed in [`TAKES_BYTES`] that mishandled bytes would differ here.
    #[test]
    fn bytes_give_every_kernel_the_answer_int64_gives() {
        fn probe(domain: &'static str, op: &'static str, kernel: Kernel) -> Vec<String> {
            let node = bare_node(domain, op);
            let ctx = Ctx {
                node: &node,
                opset: 21,
                output_dtypes: &[],
                input_dtypes: &[],
            };
            let values = |outputs: &[HostTensor]| -> Vec<(Vec<usize>, Vec<u32>)> {
                let bits = |t: &HostTensor| t.to_f32_vec().iter().map(|v| v.to_bits()).collect();
                outputs
                    .iter()
                    .map(|t| (t.shape().to_vec(), bits(t)))
                    .collect()
            };
            let mut findings = Vec::new();
            let samples = [
                HostTensor::with_data(vec![2, 3], TensorData::U8(vec![0, 1, 2, 3, 4, 255])),
                HostTensor::with_data(vec![2, 3], TensorData::I8(vec![-128, -1, 0, 1, 2, 127])),
                HostTensor::with_data(vec![3], TensorData::U8(vec![1, 0, 2])),
            ];
            for bytes in &samples {
                let wide = HostTensor::i64(bytes.shape().to_vec(), bytes.to_i64_vec());
                for arity in 1..=3 {
                    let as_bytes = vec![Some(bytes); arity];
                    let as_wide = vec![Some(&wide); arity];
                    let (Ok(got), Ok(first), Ok(second)) = (
                        caught(|| call(kernel, &ctx, &as_bytes)),
                        caught(|| kernel(&ctx, &as_wide)),
                        caught(|| kernel(&ctx, &as_wide)),
                    ) else {
                        findings.push(format!("{domain}:{op} panics on {arity} x {bytes:?}"));
                        continue;
                    };
                    let deterministic = match (&first, &second) {
                        (Ok(a), Ok(b)) => values(a) == values(b),
                        (a, b) => a.is_err() == b.is_err(),
                    };
                    let same = match (&got, &first) {
                        (Ok(a), Ok(b)) => values(a) == values(b),
                        (a, b) => a.is_err() == b.is_err(),
                    };
                    if deterministic && !same {
                        findings.push(format!(
                            "{domain}:{op} on {arity} x {bytes:?}: {got:?}, as int64 {first:?}"
                        ));
                    }
                }
            }
            findings
        }
        let findings = sweep(probe);
        assert!(
            findings.is_empty(),
            "{} findings:\n{}",
            findings.len(),
            findings.join("\n")
        );
    }
}
