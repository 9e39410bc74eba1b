//! Work per operator: FLOPs and bytes moved from the inferred shapes, and the op class that says
//! which roofline efficiency applies. One table ([`rule_for`]) maps every op that shape
//! inference handles to the rule of its family; each rule cites the ONNX operator it reads
//! (<https://onnx.ai/onnx/operators/>).

use super::hardware::OpClass;
use crate::Error;
use pipecut_ir::graph::{Attribute, DType, Graph, Node, TensorId};

/// The work one node does on one micro-batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OpWork {
    /// Floating-point (or integer) operations.
    pub flops: f64,
    /// Bytes read and written in device memory.
    pub bytes: f64,
    /// Which efficiency applies.
    pub class: OpClass,
    /// The element type that sets the peak rate.
    pub dtype: DType,
    /// Kernels launched (0 for ops that only change metadata).
    pub launches: u32,
}

impl OpWork {
    /// No work and no kernel: metadata-only ops, folded nodes, the `zero` fallback.
    pub const NONE: OpWork = OpWork {
        flops: 0.0,
        bytes: 0.0,
        class: OpClass::DataMovement,
        dtype: DType::F32,
        launches: 0,
    };
}

/// A concrete shape as rules see it: ranks up to six kept inline, so costing a node allocates
/// no shape (a million nodes' shapes were a third of costing's time, docs/benchmarks.md).
type Shape = smallvec::SmallVec<[u64; 6]>;

/// A tensor's element type and concrete shape.
type Typed = Option<(DType, Shape)>;

/// Concrete shapes and sizes of a node's tensors, as rules see them.
pub(crate) struct CostCtx<'a> {
    pub node: &'a Node,
    inputs: smallvec::SmallVec<[Typed; 4]>,
    outputs: smallvec::SmallVec<[Typed; 2]>,
}

fn concrete(graph: &Graph, id: TensorId) -> Result<(DType, Shape), Error> {
    let tensor = graph.tensor(id);
    let dtype = tensor.dtype.ok_or_else(|| Error::UnknownShape {
        tensor: tensor.name.clone(),
    })?;
    // Every dim known: the shape as it is (what `sized_shape` gives then, for any kind). A
    // plain loop: collecting through `Option` pushed each dim through a generic adapter, and
    // that was half of costing a million nodes (docs/benchmarks.md).
    if let Some(dims) = &tensor.shape {
        let mut shape = Shape::new();
        let all_known = dims.iter().all(|d| match d.known() {
            Some(v) => {
                shape.push(v);
                true
            }
            None => false,
        });
        if all_known {
            return Ok((dtype, shape));
        }
    }
    Ok((dtype, sized_shape(graph, id)?.into_iter().collect()))
}

/// The elements of a tensor as [`sized_shape`] sizes it, without collecting the shape: every
/// dim known gives their product (`None` on overflow); otherwise `sized_shape` decides.
pub(crate) fn sized_elements(graph: &Graph, id: TensorId) -> Result<Option<u64>, Error> {
    if let Some(dims) = &graph.tensor(id).shape {
        let known = dims.iter().try_fold(Some(1u64), |product, d| {
            d.known().map(|v| product.and_then(|p| p.checked_mul(v)))
        });
        if let Some(product) = known {
            // A zero dim makes zero elements even where the others overflow.
            let zero = dims.iter().any(|d| d.known() == Some(0));
            return Ok(if zero { Some(0) } else { product });
        }
    }
    Ok(pipecut_ir::graph::checked_element_count(&sized_shape(
        graph, id,
    )?))
}

/// The shape a value is costed with. A sequence's length is not known at plan time: a sequence
/// or optional counts as one element where the elements' shape is concrete, as nothing (`[0]`)
/// where it is not.
pub(crate) fn sized_shape(graph: &Graph, id: TensorId) -> Result<Vec<u64>, Error> {
    if graph.tensor(id).kind.is_tensor() {
        graph.concrete_shape(id)
    } else {
        Ok(graph.concrete_shape(id).unwrap_or_else(|_| vec![0]))
    }
}

impl<'a> CostCtx<'a> {
    /// Collects concrete shapes; an unbound dim is an error naming the dim and a tensor.
    pub fn new(graph: &'a Graph, node: &'a Node) -> Result<CostCtx<'a>, Error> {
        // Pushed in place, not collected through `Result`: each shape is built once where it
        // stays instead of being moved through the adapter's slots.
        let mut inputs = smallvec::SmallVec::with_capacity(node.inputs.len());
        for slot in &node.inputs {
            inputs.push(slot.map(|id| concrete(graph, id)).transpose()?);
        }
        let mut outputs = smallvec::SmallVec::with_capacity(node.outputs.len());
        for slot in &node.outputs {
            outputs.push(slot.map(|id| concrete(graph, id)).transpose()?);
        }
        Ok(CostCtx {
            node,
            inputs,
            outputs,
        })
    }

    fn input(&self, i: usize) -> Result<&(DType, Shape), String> {
        self.inputs
            .get(i)
            .and_then(Option::as_ref)
            .ok_or_else(|| format!("input {i} is missing"))
    }

    fn shape(&self, i: usize) -> Result<&[u64], String> {
        Ok(&self.input(i)?.1)
    }

    fn dtype(&self) -> DType {
        self.inputs
            .iter()
            .flatten()
            .next()
            .map_or(DType::F32, |(d, _)| *d)
    }

    fn output_elements(&self) -> f64 {
        self.outputs
            .iter()
            .flatten()
            .next()
            .map_or(0.0, |(_, s)| elements(s))
    }

    fn input_bytes(&self) -> f64 {
        self.inputs
            .iter()
            .flatten()
            .map(|(d, s)| bytes(*d, s))
            .sum()
    }

    fn output_bytes(&self) -> f64 {
        self.outputs
            .iter()
            .flatten()
            .map(|(d, s)| bytes(*d, s))
            .sum()
    }

    fn int_attr(&self, name: &str, default: i64) -> i64 {
        match self.node.attributes.get(name) {
            Some(Attribute::Int(v)) => *v,
            _ => default,
        }
    }

    fn work(&self, flops: f64, bytes: f64, class: OpClass) -> OpWork {
        OpWork {
            flops,
            bytes,
            class,
            dtype: self.dtype(),
            launches: 1,
        }
    }

    /// Reading every input and writing every output once.
    fn streaming(&self, flops_per_output: f64, class: OpClass) -> OpWork {
        self.work(
            flops_per_output * self.output_elements(),
            self.input_bytes() + self.output_bytes(),
            class,
        )
    }
}

fn elements(shape: &[u64]) -> f64 {
    shape.iter().map(|&d| d as f64).product()
}

fn bytes(dtype: DType, shape: &[u64]) -> f64 {
    elements(shape) * dtype.size_bits() as f64 / 8.0
}

pub(crate) type CostRule = fn(&CostCtx) -> Result<OpWork, String>;

/// The rule for an op, or `None` when the cost model does not know it.
// Reads better whole: one flat table from (domain, op) to rule, the single place every op
// family is registered (STYLE.md 8); its length is op names, and split up it would hide which
// rule an op gets.
pub(crate) fn rule_for(domain: &str, op: &str) -> Option<CostRule> {
    let domain = if domain == "ai.onnx" { "" } else { domain };
    let rule: CostRule = match (domain, op) {
        // Metadata only: a runtime changes the view, no kernel runs.
        (
            "",
            "Reshape" | "Squeeze" | "Unsqueeze" | "Flatten" | "Identity" | "Shape" | "Size"
            | "Dropout" | "Constant",
        ) => metadata,
        ("", "MatMul" | "MatMulInteger" | "QLinearMatMul")
        | (
            "com.microsoft",
            "FusedMatMul" | "MatMulNBits" | "DynamicQuantizeMatMul" | "MatMulIntegerToFloat",
        ) => matmul,
        // QGemm's A is input 0 as Gemm's is; its input 2 is a zero point, not a bias, so the
        // bias's M·N additions are counted even when absent (a rounding error beside 2·M·N·K).
        ("", "Gemm") | ("com.microsoft", "QGemm") => gemm,
        ("", "Einsum") => einsum,
        ("", "RNN" | "GRU" | "LSTM") | ("com.microsoft", "DynamicQuantizeLSTM") => recurrent,
        ("", "Conv" | "ConvInteger") => conv,
        ("", "QLinearConv") => qlinear_conv,
        ("", "ConvTranspose") => conv_transpose,
        ("com.microsoft", "Attention" | "MultiHeadAttention" | "QAttention") => attention,
        // onnxruntime's QOperator ops: the float op's work on the quantized operands, plus a
        // requantization (a multiply and a round) per output element.
        ("com.microsoft", "QLinearAdd" | "QLinearMul" | "QLinearLeakyRelu") => pointwise::<3>,
        ("com.microsoft", "QLinearSigmoid") => pointwise::<6>,
        ("com.microsoft", "QLinearSoftmax") => reduction::<6>,
        ("com.microsoft", "QLinearGlobalAveragePool" | "QLinearAveragePool") => pool,
        ("com.microsoft", "QLinearConcat") => movement,
        ("", "Attention") | ("ai.onnx.preview", "FlexAttention") => onnx_attention,
        ("", "LinearAttention") => linear_attention,
        ("", "CausalConvWithState") => causal_conv_with_state,
        // Pointwise maths, by rough cost per element: 1 for arithmetic, more for transcendentals.
        (
            "",
            "Add"
            | "Sub"
            | "Mul"
            | "Div"
            | "Neg"
            | "Abs"
            | "Relu"
            | "LeakyRelu"
            | "PRelu"
            | "Min"
            | "Max"
            | "Sum"
            | "Mean"
            | "Clip"
            | "Floor"
            | "Ceil"
            | "Round"
            | "Sign"
            | "Reciprocal"
            | "Mod"
            | "BitwiseAnd"
            | "BitwiseOr"
            | "BitwiseXor"
            | "BitwiseNot"
            | "BitShift"
            | "ThresholdedRelu"
            | "Shrink"
            | "HardSigmoid"
            | "HardSwish"
            | "Where"
            | "Cast"
            | "CastLike"
            | "BitCast"
            | "Not"
            | "And"
            | "Or"
            | "Xor"
            | "Equal"
            | "Less"
            | "Greater"
            | "LessOrEqual"
            | "GreaterOrEqual"
            | "IsNaN"
            | "IsInf"
            | "QuantizeLinear"
            | "DequantizeLinear"
            | "DynamicQuantizeLinear"
            | "Trilu"
            | "EyeLike"
            | "HannWindow"
            | "HammingWindow"
            | "BlackmanWindow",
        ) => pointwise::<1>,
        (
            "",
            "Sqrt" | "Pow" | "Sigmoid" | "Tanh" | "Erf" | "Exp" | "Log" | "Elu" | "Selu" | "Celu"
            | "Softplus" | "Softsign" | "Sin" | "Cos" | "Tan" | "Asin" | "Acos" | "Atan" | "Sinh"
            | "Cosh" | "Asinh" | "Acosh" | "Atanh" | "Swish",
        ) => pointwise::<4>,
        ("", "Gelu" | "Mish" | "SwiGLU")
        | ("com.microsoft", "FastGelu" | "BiasGelu" | "Gelu" | "QuickGelu" | "BiasAdd") => {
            pointwise::<8>
        }
        ("com.microsoft" | "", "RotaryEmbedding") => pointwise::<4>,
        // A log-softmax (a few transcendentals per score) and a gather; the scores dominate.
        ("", "NegativeLogLikelihoodLoss" | "SoftmaxCrossEntropyLoss") => reduction::<4>,
        // Reductions and normalisations: read the input, a few operations per element.
        (
            "",
            "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1"
            | "ReduceL2" | "ReduceLogSum" | "ReduceLogSumExp" | "ReduceSumSquare" | "ArgMax"
            | "ArgMin" | "CumSum" | "CumProd" | "TopK" | "NonZero" | "Compress"
            | "NonMaxSuppression" | "Unique",
        ) => reduction::<1>,
        (
            "",
            "Softmax"
            | "LogSoftmax"
            | "Hardmax"
            | "LayerNormalization"
            | "BatchNormalization"
            | "InstanceNormalization"
            | "GroupNormalization"
            | "RMSNormalization"
            | "LpNormalization"
            | "MeanVarianceNormalization"
            | "LRN"
            | "SimplifiedLayerNormalization",
        )
        | (
            "com.microsoft",
            "SkipLayerNormalization"
            | "SkipSimplifiedLayerNormalization"
            | "SimplifiedLayerNormalization"
            | "LayerNormalization"
            | "EmbedLayerNormalization",
        ) => reduction::<6>,
        (
            "",
            "MaxPool" | "AveragePool" | "LpPool" | "GlobalAveragePool" | "GlobalMaxPool"
            | "GlobalLpPool",
        ) => pool,
        // Data movement: bytes only.
        (
            "",
            "Transpose" | "Concat" | "Split" | "Slice" | "Expand" | "Tile" | "Pad" | "ScatterND"
            | "ScatterElements" | "Scatter" | "GatherElements" | "GatherND" | "ReverseSequence"
            | "DepthToSpace" | "SpaceToDepth" | "ConstantOfShape" | "Range" | "OneHot" | "Resize"
            | "Upsample" | "GridSample" | "RoiAlign" | "CenterCropPad",
        ) => movement,
        // Text ops: no arithmetic, bytes moved. A string counts as its 8-byte handle: its
        // length is unknown until the run.
        (
            "",
            "StringConcat" | "StringSplit" | "StringNormalizer" | "RegexFullMatch"
            | "TfIdfVectorizer",
        ) => movement,
        // Lookups and reshuffles of the ai.onnx.ml domain, and the Tokenizer of skl2onnx's
        // text pipelines: bytes moved, no arithmetic to speak of.
        (
            "ai.onnx.ml",
            "LabelEncoder"
            | "ArrayFeatureExtractor"
            | "CategoryMapper"
            | "CastMap"
            | "DictVectorizer"
            | "FeatureVectorizer"
            | "OneHotEncoder"
            | "ZipMap",
        )
        | ("com.microsoft", "Tokenizer") => movement,
        // pipecut's tensor-parallel collectives, in rank files: their device side is a copy;
        // the link time of a group's collectives is the tensor-parallel cost of the stage
        // (`partition::tensor_parallel`), not of a node.
        ("ai.pipecut", "AllReduce" | "AllGather" | "ReduceScatter") => movement,
        ("", "ImageDecoder") => image_decoder,
        ("ai.onnx.ml", "Binarizer") => pointwise::<1>,
        ("ai.onnx.ml", "Imputer") => pointwise::<1>,
        // Scaler: a subtraction and a product per element.
        ("ai.onnx.ml", "Scaler") => pointwise::<2>,
        // Normalizer: a norm over each row (square, add) and a division per element.
        ("ai.onnx.ml", "Normalizer") => reduction::<3>,
        ("ai.onnx.ml", "TreeEnsemble" | "TreeEnsembleClassifier" | "TreeEnsembleRegressor") => {
            tree_ensemble
        }
        (
            "ai.onnx.ml",
            "LinearClassifier" | "LinearRegressor" | "SVMClassifier" | "SVMRegressor",
        ) => linear_model,
        ("", "Det") => det,
        // Sequences and optionals (<https://onnx.ai/onnx/operators/onnx__SequenceInsert.html>):
        // the ops that copy tensors into or out of a sequence move those bytes; the others
        // only look at or wrap a value.
        (
            "",
            "SequenceConstruct" | "SequenceInsert" | "SequenceAt" | "SequenceErase"
            | "SplitToSequence" | "ConcatFromSequence",
        ) => movement,
        (
            "",
            "SequenceEmpty" | "SequenceLength" | "Optional" | "OptionalHasElement"
            | "OptionalGetElement",
        ) => metadata,
        ("", "Gather") => gather,
        // Scatters and grids: each output written once from about as many bytes read.
        ("", "MaxUnpool" | "Col2Im" | "AffineGrid" | "TensorScatter") => movement,
        ("", "DeformConv") => deform_conv,
        ("", "DFT" | "STFT") => spectral,
        ("", "MelWeightMatrix") => pointwise::<4>,
        // A few integer operations per draw, a logarithm and a cosine for the normal ones.
        (
            "",
            "Bernoulli" | "RandomUniform" | "RandomUniformLike" | "RandomNormal"
            | "RandomNormalLike",
        ) => pointwise::<4>,
        _ => return None,
    };
    Some(rule)
}

fn metadata(ctx: &CostCtx) -> Result<OpWork, String> {
    Ok(OpWork {
        launches: 0,
        ..ctx.work(0.0, 0.0, OpClass::DataMovement)
    })
}

/// MatMul: `2·M·N·K` per output batch (<https://onnx.ai/onnx/operators/onnx__MatMul.html>).
/// FusedMatMul's transposes do not change the count: K is the contracted size either way.
fn matmul(ctx: &CostCtx) -> Result<OpWork, String> {
    let a = ctx.shape(0)?;
    let mut k = *a.last().ok_or("operand A is a scalar")? as f64;
    if ctx.int_attr("transA", 0) != 0 && a.len() >= 2 {
        k = a[a.len() - 2] as f64;
    }
    Ok(ctx.work(
        2.0 * ctx.output_elements() * k,
        ctx.input_bytes() + ctx.output_bytes(),
        OpClass::Matmul,
    ))
}

/// Gemm: `2·M·N·K`, plus `M·N` for the bias (<https://onnx.ai/onnx/operators/onnx__Gemm.html>).
fn gemm(ctx: &CostCtx) -> Result<OpWork, String> {
    let a = ctx.shape(0)?;
    if a.len() != 2 {
        return Err("Gemm's A is not 2-D".into());
    }
    let k = if ctx.int_attr("transA", 0) != 0 {
        a[0]
    } else {
        a[1]
    } as f64;
    let bias = if ctx.inputs.get(2).is_some_and(Option::is_some) {
        ctx.output_elements()
    } else {
        0.0
    };
    Ok(ctx.work(
        2.0 * ctx.output_elements() * k + bias,
        ctx.input_bytes() + ctx.output_bytes(),
        OpClass::Matmul,
    ))
}

/// Einsum: `2 · output elements · Π sizes of the contracted letters`
/// (<https://onnx.ai/onnx/operators/onnx__Einsum.html>).
fn einsum(ctx: &CostCtx) -> Result<OpWork, String> {
    let equation = match ctx.node.attributes.get("equation") {
        Some(Attribute::String(e)) => e.replace(' ', ""),
        _ => return Err("attribute 'equation' is missing".into()),
    };
    let (lhs, rhs) = match equation.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (equation.as_str(), None),
    };
    let mut sizes = std::collections::BTreeMap::new();
    let mut uses = std::collections::BTreeMap::new();
    for (i, term) in lhs.split(',').enumerate() {
        let shape = ctx.shape(i)?;
        // Letters after an ellipsis align with the trailing axes.
        let (before, after) = term.split_once("...").unwrap_or((term, ""));
        let tail_start = shape.len().saturating_sub(after.len());
        for (letter, &size) in before
            .chars()
            .zip(shape)
            .chain(after.chars().zip(&shape[tail_start..]))
        {
            sizes.insert(letter, size as f64);
            *uses.entry(letter).or_insert(0) += 1;
        }
    }
    // Explicit mode: letters missing from the output are summed over; implicit mode: letters
    // used more than once.
    let contracted: f64 = sizes
        .iter()
        .filter(|(letter, _)| match rhs {
            Some(rhs) => !rhs.contains(**letter),
            None => uses[*letter] > 1,
        })
        .map(|(_, size)| size)
        .product();
    Ok(ctx.work(
        2.0 * ctx.output_elements() * contracted,
        ctx.input_bytes() + ctx.output_bytes(),
        OpClass::Matmul,
    ))
}

/// Conv: `2 · output elements · C_in/group · Π kernel` (<https://onnx.ai/onnx/operators/onnx__Conv.html>).
fn conv(ctx: &CostCtx) -> Result<OpWork, String> {
    let w = ctx.shape(1)?;
    let per_output: f64 = w[1..].iter().map(|&d| d as f64).product();
    Ok(ctx.work(
        2.0 * ctx.output_elements() * per_output,
        ctx.input_bytes() + ctx.output_bytes(),
        OpClass::Conv,
    ))
}

/// DeformConv: Conv's count plus, per tap of each input channel at each output point, a
/// bilinear sample (four reads, about eight operations)
/// (<https://onnx.ai/onnx/operators/onnx__DeformConv.html>).
fn deform_conv(ctx: &CostCtx) -> Result<OpWork, String> {
    let (x, w) = (ctx.shape(0)?, ctx.shape(1)?);
    let per_output: f64 = w[1..].iter().map(|&d| d as f64).product();
    let taps: f64 = w[2..].iter().map(|&d| d as f64).product();
    let points: f64 = ctx.output_elements() / w[0].max(1) as f64;
    let sampling = 8.0 * points * taps * x.get(1).copied().unwrap_or(1) as f64;
    Ok(ctx.work(
        2.0 * ctx.output_elements() * per_output + sampling,
        ctx.input_bytes() + ctx.output_bytes(),
        OpClass::Conv,
    ))
}

/// DFT and STFT: a fast transform's `5·n·log₂ n` operations per transformed line of `n` bins
/// (the count FFT libraries quote), the output holding `2·n` values per line.
/// (<https://onnx.ai/onnx/operators/onnx__DFT.html>, <https://onnx.ai/onnx/operators/onnx__STFT.html>).
fn spectral(ctx: &CostCtx) -> Result<OpWork, String> {
    let complex_outputs = ctx.output_elements() / 2.0;
    let n = ctx
        .outputs
        .iter()
        .flatten()
        .next()
        .and_then(|(_, s)| s.iter().rev().nth(1).copied())
        .unwrap_or(1)
        .max(2) as f64;
    Ok(ctx.work(
        5.0 * complex_outputs * n.log2(),
        ctx.input_bytes() + ctx.output_bytes(),
        OpClass::Elementwise,
    ))
}

/// QLinearConv: Conv's count, the weights being input 3
/// (<https://onnx.ai/onnx/operators/onnx__QLinearConv.html>).
fn qlinear_conv(ctx: &CostCtx) -> Result<OpWork, String> {
    let w = ctx.shape(3)?;
    let per_output: f64 = w[1..].iter().map(|&d| d as f64).product();
    Ok(ctx.work(
        2.0 * ctx.output_elements() * per_output,
        ctx.input_bytes() + ctx.output_bytes(),
        OpClass::Conv,
    ))
}

/// ConvTranspose: every input element scatters into `M/group · Π kernel` outputs.
fn conv_transpose(ctx: &CostCtx) -> Result<OpWork, String> {
    let (x, w) = (ctx.shape(0)?, ctx.shape(1)?);
    let per_input: f64 = w[1..].iter().map(|&d| d as f64).product();
    Ok(ctx.work(
        2.0 * elements(x) * per_input,
        ctx.input_bytes() + ctx.output_bytes(),
        OpClass::Conv,
    ))
}

/// com.microsoft Attention: the fused QKV projection `2·B·S·H_in·W_out` plus scores and
/// context `2·2·B·S·S_kv·H`.
fn attention(ctx: &CostCtx) -> Result<OpWork, String> {
    let x = ctx.shape(0)?;
    if x.len() != 3 {
        return Err("input is not [batch, sequence, hidden]".into());
    }
    let (b, s, h) = (x[0] as f64, x[1] as f64, x[2] as f64);
    let projection = match ctx.node.op_type.as_str() {
        "Attention" | "QAttention" => 2.0 * b * s * elements(ctx.shape(1)?),
        _ => 0.0,
    };
    let attention = 4.0 * b * s * s * h;
    Ok(ctx.work(
        projection + attention,
        ctx.input_bytes() + ctx.output_bytes(),
        OpClass::Matmul,
    ))
}

/// ai.onnx Attention (<https://onnx.ai/onnx/operators/onnx__Attention.html>, opsets 23–24):
/// Q·Kᵀ is a multiply-add per query element and key, softmax·V one per output element and key,
/// over the total (past + new) key sequence. Q and Y hold the same elements in the 3-D and 4-D
/// layouts, so the count needs no head split.
fn onnx_attention(ctx: &CostCtx) -> Result<OpWork, String> {
    let keys = |i: usize| -> Result<f64, String> {
        let shape = ctx.shape(i)?;
        match shape.len() {
            4 => Ok(shape[2] as f64),
            3 => Ok(shape[1] as f64),
            _ => Err(format!("input {i} is neither 3-D nor 4-D")),
        }
    };
    let past = if ctx.inputs.get(4).is_some_and(Option::is_some) {
        keys(4)?
    } else {
        0.0
    };
    let total = keys(1)? + past;
    let flops = 2.0 * total * (elements(ctx.shape(0)?) + ctx.output_elements());
    Ok(ctx.work(
        flops,
        ctx.input_bytes() + ctx.output_bytes(),
        OpClass::Matmul,
    ))
}

/// LinearAttention (opset 27): per time step and query head, the `d_k × d_v` state is decayed,
/// corrected (delta rules: a read and a rank-1 update), updated with `k vᵀ` and read by `q`:
/// about 8 operations per state element and step, i.e. `8 · (query elements) · d_v`.
fn linear_attention(ctx: &CostCtx) -> Result<OpWork, String> {
    let value = ctx.shape(2)?;
    let kv_heads = ctx.int_attr("kv_num_heads", 1).max(1) as f64;
    let d_v = value.last().copied().unwrap_or(1) as f64 / kv_heads;
    let flops = 8.0 * elements(ctx.shape(0)?) * d_v;
    Ok(ctx.work(
        flops,
        ctx.input_bytes() + ctx.output_bytes(),
        OpClass::Matmul,
    ))
}

/// CausalConvWithState (opset 27): a depthwise 1-D convolution, `2k` operations per output
/// element for a kernel of `k` taps (plus the activation).
fn causal_conv_with_state(ctx: &CostCtx) -> Result<OpWork, String> {
    let taps = ctx.shape(1)?.last().copied().unwrap_or(1) as f64;
    let flops = (2.0 * taps + 4.0) * elements(ctx.shape(0)?);
    Ok(ctx.work(
        flops,
        ctx.input_bytes() + ctx.output_bytes(),
        OpClass::Elementwise,
    ))
}

fn pointwise<const OPS_PER_ELEMENT: u32>(ctx: &CostCtx) -> Result<OpWork, String> {
    Ok(ctx.streaming(OPS_PER_ELEMENT as f64, OpClass::Elementwise))
}

/// RNN, GRU, LSTM: per time step and direction, `gates · hidden` outputs each a dot product over
/// the input and the previous hidden state (`2·(input + hidden)` operations), plus a few
/// pointwise operations per gate; the weights are read once.
fn recurrent(ctx: &CostCtx) -> Result<OpWork, String> {
    let x = ctx.shape(0)?;
    let w = ctx.shape(1)?;
    let (seq, batch, input) = match x {
        [a, b, i] if ctx.int_attr("layout", 0) == 0 => (*a as f64, *b as f64, *i as f64),
        [b, a, i] => (*a as f64, *b as f64, *i as f64),
        _ => return Err("X must be 3-D".into()),
    };
    // DynamicQuantizeLSTM keeps W transposed: [directions, input, gates · hidden].
    let (directions, gate_rows) = match (w, ctx.node.op_type.as_str()) {
        ([d, _, g], "DynamicQuantizeLSTM") => (*d as f64, *g as f64),
        ([d, g, _], _) => (*d as f64, *g as f64),
        _ => return Err("W must be 3-D".into()),
    };
    let gates = match ctx.node.op_type.as_str() {
        "LSTM" | "DynamicQuantizeLSTM" => 4.0,
        "GRU" => 3.0,
        _ => 1.0,
    };
    let hidden = gate_rows / gates;
    let flops = seq * directions * batch * gate_rows * (2.0 * (input + hidden) + 8.0);
    Ok(ctx.work(
        flops,
        ctx.input_bytes() + ctx.output_bytes(),
        OpClass::Matmul,
    ))
}

/// TreeEnsemble: at most one comparison per node for each row, a bound that is tight for
/// shallow forests (<https://onnx.ai/onnx/operators/onnx_aionnxml_TreeEnsemble.html>).
fn tree_ensemble(ctx: &CostCtx) -> Result<OpWork, String> {
    let rows = ctx.shape(0)?.first().copied().unwrap_or(1) as f64;
    let nodes = match ctx.node.attributes.get("nodes_featureids") {
        Some(Attribute::Ints(ids)) => ids.len() as f64,
        _ => return Err("attribute 'nodes_featureids' is missing".into()),
    };
    Ok(ctx.work(
        rows * nodes,
        ctx.input_bytes() + ctx.output_bytes(),
        OpClass::Reduction,
    ))
}

/// LinearClassifier/Regressor and SVMClassifier/Regressor: a multiply-add per row for every
/// coefficient and every support-vector element (one kernel product each); the kernel's own
/// few operations per product and the post-transform are left out.
/// (<https://onnx.ai/onnx/operators/onnx_aionnxml_SVMClassifier.html>).
fn linear_model(ctx: &CostCtx) -> Result<OpWork, String> {
    let x = ctx.shape(0)?;
    let rows = if x.len() == 2 { x[0] } else { 1 } as f64;
    let count = |name: &str| match ctx.node.attributes.get(name) {
        Some(Attribute::Floats(v)) => v.len() as f64,
        _ => 0.0,
    };
    let weights = count("coefficients") + count("support_vectors");
    Ok(ctx.work(
        2.0 * rows * weights,
        ctx.input_bytes() + ctx.output_bytes(),
        OpClass::Matmul,
    ))
}

/// Det: an LU decomposition, about 2/3·M³ operations per `M × M` matrix.
fn det(ctx: &CostCtx) -> Result<OpWork, String> {
    let x = ctx.shape(0)?;
    let m = x.last().copied().unwrap_or(0) as f64;
    let matrices = elements(x) / (m * m).max(1.0);
    Ok(ctx.work(
        2.0 / 3.0 * m * m * m * matrices,
        ctx.input_bytes() + ctx.output_bytes(),
        OpClass::Reduction,
    ))
}

fn reduction<const OPS_PER_ELEMENT: u32>(ctx: &CostCtx) -> Result<OpWork, String> {
    let read = elements(ctx.shape(0)?);
    Ok(ctx.work(
        OPS_PER_ELEMENT as f64 * read,
        ctx.input_bytes() + ctx.output_bytes(),
        OpClass::Reduction,
    ))
}

/// Pooling reads each input once and does one operation per window element of each output.
fn pool(ctx: &CostCtx) -> Result<OpWork, String> {
    let window: f64 = match ctx.node.attributes.get("kernel_shape") {
        Some(Attribute::Ints(k)) => k.iter().map(|&d| d.max(1) as f64).product(),
        _ => ctx.shape(0)?.iter().skip(2).map(|&d| d as f64).product(),
    };
    Ok(ctx.work(
        ctx.output_elements() * window,
        ctx.input_bytes() + ctx.output_bytes(),
        OpClass::Reduction,
    ))
}

/// Copies: the output is written and (about) as many bytes are read.
fn movement(ctx: &CostCtx) -> Result<OpWork, String> {
    let written = ctx.output_bytes();
    Ok(ctx.work(0.0, written * 2.0, OpClass::DataMovement))
}

/// [ImageDecoder](https://onnx.ai/onnx/operators/onnx__ImageDecoder.html) (20): the encoded
/// bytes read and the pixels written, and per output sample the arithmetic of a JPEG decode,
/// the costliest codec the op takes: ~11 operations for the 8×8 integer inverse DCT (libjpeg's
/// `jidctint`: 2 × 8 one-dimensional passes of 12 multiplications and 32 additions per 64
/// samples), ~5 for chroma upsampling and the YCbCr → RGB conversion. Entropy decoding, which
/// is branchy rather than arithmetic, is not modelled; a measured profile replaces the estimate.
fn image_decoder(ctx: &CostCtx) -> Result<OpWork, String> {
    const OPS_PER_SAMPLE: f64 = 16.0;
    Ok(ctx.work(
        OPS_PER_SAMPLE * ctx.output_elements(),
        ctx.input_bytes() + ctx.output_bytes(),
        OpClass::Elementwise,
    ))
}

/// Gather reads only the rows it picks (plus the indices), not the whole table: an embedding
/// lookup costs its output, not its vocabulary.
fn gather(ctx: &CostCtx) -> Result<OpWork, String> {
    let (dtype, indices) = ctx.input(1)?;
    Ok(ctx.work(
        0.0,
        2.0 * ctx.output_bytes() + bytes(*dtype, indices),
        OpClass::DataMovement,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_with_a_shape_rule_has_a_cost_rule() {
        // Costed from their bodies by `CostModel::work`.
        let control_flow = [
            "ai.onnx:If",
            "ai.onnx:Loop",
            "ai.onnx:Scan",
            "ai.onnx:SequenceMap",
        ];
        let missing: Vec<String> = pipecut_ir::onnx::shape::supported_ops()
            .into_iter()
            .filter(|op| !control_flow.contains(&op.as_str()))
            .filter(|op| {
                let (domain, name) = op.split_once(':').unwrap();
                rule_for(domain, name).is_none()
            })
            .collect();
        assert!(missing.is_empty(), "ops without a cost rule: {missing:?}");
    }
}
