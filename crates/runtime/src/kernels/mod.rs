//! The CPU kernels: one file per op family, registered in one table ([`lookup`]).
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
mod linalg;
mod loss;
mod matmul;
pub(crate) use matmul::sgemm;
mod microsoft;
mod ml;
#[cfg(feature = "cuda")]
pub(crate) use ml::{float_labels, Branch as TreeBranch, Forest, Test as TreeTest};
mod movement;
mod ms_attention;
mod sequence;
mod signal;
mod strings;
mod values;
pub(crate) use values::{lookup_value, ValueCtx, ValueKernel};
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
mod topk;

use std::collections::HashMap;
use std::sync::OnceLock;

use super::tensor::{HostTensor, TensorData};
use pipecut_ir::graph::{Attribute, DType, Node};

/// What a kernel sees of its node.
pub(crate) struct Ctx<'a> {
    /// The node (attributes, name).
    pub node: &'a Node,
    /// Opset in force for the node's domain: several ops changed semantics across versions.
    pub opset: i64,
    /// The element types shape inference gave the node's outputs (`None` where unknown). The
    /// runtime widens narrow integers to int64 (see [`super::tensor`]), so a kernel that must
    /// saturate to uint8 or int8 (QuantizeLinear, QLinearMatMul) learns the range here.
    pub output_dtypes: &'a [Option<DType>],
}

/// A kernel's result: one tensor per output, in order (optional trailing outputs may be absent).
pub(crate) type KernelResult = Result<Vec<HostTensor>, String>;

/// A kernel: node context and inputs by position (`None` for an omitted optional input).
pub(crate) type Kernel = fn(&Ctx, &[Option<&HostTensor>]) -> KernelResult;

/// Kernels by (domain, op type); `""` is the default domain.
#[derive(Default)]
pub(crate) struct KernelTable {
    kernels: HashMap<(&'static str, &'static str), Kernel>,
}

impl KernelTable {
    /// Registers `kernel` for each of `ops` in the default domain.
    pub fn add(&mut self, ops: &[&'static str], kernel: Kernel) {
        for op in ops {
            let previous = self.kernels.insert(("", op), kernel);
            debug_assert!(previous.is_none(), "kernel for {op} registered twice");
        }
    }

    /// Registers `kernel` for each of `ops` in `domain` (`com.microsoft`, ...).
    pub fn add_in(&mut self, domain: &'static str, ops: &[&'static str], kernel: Kernel) {
        for op in ops {
            let previous = self.kernels.insert((domain, op), kernel);
            debug_assert!(
                previous.is_none(),
                "kernel for {domain}:{op} registered twice"
            );
        }
    }
}

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
        rearrange::register(&mut t);
        channel_norm::register(&mut t);
        einsum::register(&mut t);
        strings::register(&mut t);
        ml::register(&mut t);
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

// ---- helpers shared by the kernel files ----

/// Input `i`, required.
pub(crate) fn input<'a>(
    inputs: &[Option<&'a HostTensor>],
    i: usize,
) -> Result<&'a HostTensor, String> {
    inputs
        .get(i)
        .copied()
        .flatten()
        .ok_or_else(|| format!("input {i} is required but missing"))
}

/// Input `i`, optional.
pub(crate) fn optional<'a>(inputs: &[Option<&'a HostTensor>], i: usize) -> Option<&'a HostTensor> {
    inputs.get(i).copied().flatten()
}

impl Ctx<'_> {
    pub fn attr(&self, name: &str) -> Option<&Attribute> {
        self.node.attributes.get(name)
    }

    pub fn int(&self, name: &str, default: i64) -> i64 {
        match self.attr(name) {
            Some(Attribute::Int(v)) => *v,
            _ => default,
        }
    }

    pub fn float(&self, name: &str, default: f32) -> f32 {
        match self.attr(name) {
            Some(Attribute::Float(v)) => *v,
            Some(Attribute::Int(v)) => *v as f32,
            _ => default,
        }
    }

    pub fn ints(&self, name: &str) -> Option<Vec<i64>> {
        match self.attr(name) {
            Some(Attribute::Ints(v)) => Some(v.clone()),
            Some(Attribute::Int(v)) => Some(vec![*v]),
            _ => None,
        }
    }

    pub fn string(&self, name: &str, default: &str) -> String {
        match self.attr(name) {
            Some(Attribute::String(v)) => v.clone(),
            _ => default.to_string(),
        }
    }
}

/// Largest tensor a kernel allocates from a shape it computed: 2^32 elements (16 GiB of f32).
/// Exported models stay far below it; a shape computed from corrupt data (a `Range` with a tiny
/// step, an `Expand` to a garbage shape) would otherwise abort the process on allocation instead
/// of failing with an error.
pub(crate) const MAX_ELEMENTS: usize = 1 << 32;

/// Element count of a computed shape, refusing overflow and sizes above [`MAX_ELEMENTS`].
pub(crate) fn checked_size(shape: &[usize]) -> Result<usize, String> {
    super::tensor::checked_numel(shape)
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| format!("shape {shape:?} holds more than {MAX_ELEMENTS} elements"))
}

/// Resolves a possibly negative axis against `rank`.
pub(crate) fn normalize_axis(axis: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        Ok(a as usize)
    } else {
        Err(format!("axis {axis} is out of range for rank {rank}"))
    }
}

/// Numpy-style broadcast of several shapes.
pub(crate) fn broadcast_shapes(shapes: &[&[usize]]) -> Result<Vec<usize>, String> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for shape in shapes {
        let offset = rank - shape.len();
        for (i, &d) in shape.iter().enumerate() {
            let o = &mut out[offset + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return Err(format!("shapes {shapes:?} do not broadcast"));
            }
        }
    }
    Ok(out)
}

/// For each element of `out_shape` (row-major), its offset in a tensor of `in_shape` that
/// broadcasts to it. Fails, rather than aborting, when the offsets do not fit in memory.
pub(crate) fn broadcast_offsets(
    in_shape: &[usize],
    out_shape: &[usize],
) -> Result<Vec<usize>, String> {
    let rank = out_shape.len();
    // A zero-element output needs no offsets, whatever its other dims (`[0, 2^62]` once
    // overflowed here).
    let total = super::tensor::checked_numel(out_shape)
        .ok_or_else(|| format!("shape {out_shape:?} has more elements than fit in memory"))?;
    let mut result = super::tensor::try_with_capacity(total)?;
    if total == 0 {
        return Ok(result);
    }
    let in_strides = super::tensor::strides_of(in_shape);
    let mut strides = vec![0usize; rank];
    let offset = rank - in_shape.len();
    for (i, &d) in in_shape.iter().enumerate() {
        if d != 1 {
            strides[offset + i] = in_strides[i];
        }
    }
    let inner = out_shape.last().copied().unwrap_or(1);
    let inner_stride = strides.last().copied().unwrap_or(0);
    let outer_rank = rank.saturating_sub(1);
    let mut index = vec![0usize; outer_rank];
    loop {
        let base: usize = (0..outer_rank).map(|i| index[i] * strides[i]).sum();
        result.extend((0..inner).map(|j| base + j * inner_stride));
        // odometer over the outer dims
        let mut d = outer_rank;
        loop {
            if d == 0 {
                return Ok(result);
            }
            d -= 1;
            index[d] += 1;
            if index[d] < out_shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

/// Walks a numpy broadcast of `N` inputs to `out_shape` one innermost row at a time: `row(bases,
/// steps, len)` gets each input's offset at the row's start, each input's step along the row (0
/// where it broadcasts) and the row's length. Rows come in row-major order, so the output is the
/// concatenation of the rows; no per-element offset table is built (the odometer runs once per
/// row, not per element, which is what makes broadcast element-wise ops cheap).
pub(crate) fn for_each_broadcast_row<const N: usize>(
    in_shapes: [&[usize]; N],
    out_shape: &[usize],
    mut row: impl FnMut([usize; N], [usize; N], usize),
) {
    let rank = out_shape.len();
    if out_shape.contains(&0) {
        return;
    }
    let full_strides: [Vec<usize>; N] = std::array::from_fn(|n| {
        let shape = in_shapes[n];
        let own = super::tensor::strides_of(shape);
        let offset = rank - shape.len();
        let mut s = vec![0usize; rank];
        for (i, &d) in shape.iter().enumerate() {
            if d != 1 {
                s[offset + i] = own[i];
            }
        }
        s
    });
    // Adjacent dims that every input walks the same way (contiguously, or broadcast along both)
    // merge into one, so that rows are as long as they can be: `[8, 64, 384] + [1, 1, 384]`
    // runs as 512 rows of 384, `[N, C, H, W] · [1, C, 1, 1]` as N · C rows of H · W.
    let mut dims: Vec<usize> = Vec::with_capacity(rank);
    let mut strides: [Vec<usize>; N] = std::array::from_fn(|_| Vec::with_capacity(rank));
    for d in (0..rank).rev().filter(|&d| out_shape[d] != 1) {
        let merges = dims.last().is_some_and(|&inner_size| {
            (0..N).all(|n| full_strides[n][d] == strides[n][strides[n].len() - 1] * inner_size)
        });
        if merges {
            *dims.last_mut().expect("merges needs a dim") *= out_shape[d];
        } else {
            dims.push(out_shape[d]);
            for n in 0..N {
                strides[n].push(full_strides[n][d]);
            }
        }
    }
    dims.reverse();
    strides.iter_mut().for_each(|s| s.reverse());
    let (out_shape, rank) = (dims.as_slice(), dims.len());
    let inner = out_shape.last().copied().unwrap_or(1);
    let steps: [usize; N] = std::array::from_fn(|n| strides[n].last().copied().unwrap_or(0));
    let outer_rank = rank.saturating_sub(1);
    let mut index = vec![0usize; outer_rank];
    let mut bases = [0usize; N];
    loop {
        row(bases, steps, inner);
        // odometer over the outer dims, keeping each input's base offset in step
        let mut d = outer_rank;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            index[d] += 1;
            for n in 0..N {
                bases[n] += strides[n][d];
            }
            if index[d] < out_shape[d] {
                break;
            }
            for n in 0..N {
                bases[n] -= strides[n][d] * out_shape[d];
            }
            index[d] = 0;
        }
    }
}

/// Applies `f` element-wise over two broadcast slices.
pub(crate) fn zip_broadcast<A: Copy, B: Copy, O>(
    a: &[A],
    a_shape: &[usize],
    b: &[B],
    b_shape: &[usize],
    f: impl Fn(A, B) -> O + Copy,
) -> Result<(Vec<usize>, Vec<O>), String> {
    let shape = broadcast_shapes(&[a_shape, b_shape])?;
    let total = super::tensor::checked_numel(&shape)
        .ok_or_else(|| format!("shape {shape:?} has more elements than fit in memory"))?;
    let mut out = super::tensor::try_with_capacity(total)?;
    if a_shape == b_shape {
        fast_math::extend_zip(&mut out, a, 1, b, 1, total, f);
    } else {
        for_each_broadcast_row([a_shape, b_shape], &shape, |[i, j], [si, sj], len| {
            fast_math::extend_zip(&mut out, &a[i..], si, &b[j..], sj, len, f);
        });
    }
    Ok((shape, out))
}

/// Copies the strided view of `data` that starts at `base` and steps `strides[d]` elements per
/// index of dim `d` (negative for a reversed Slice), row by row: a row whose step is 1 is one
/// slice copy, and no per-element offset table is built. Slice and Transpose are such views.
pub(crate) fn take_strided(
    data: &TensorData,
    base: isize,
    shape: &[usize],
    strides: &[isize],
) -> Result<TensorData, String> {
    fn copy<T: Clone>(
        v: &[T],
        base: isize,
        shape: &[usize],
        strides: &[isize],
    ) -> Result<Vec<T>, String> {
        let total = super::tensor::checked_numel(shape)
            .ok_or_else(|| format!("shape {shape:?} has more elements than fit in memory"))?;
        let mut out = super::tensor::try_with_capacity(total)?;
        let Some((&inner, outer_shape)) = shape.split_last() else {
            out.push(v[base as usize].clone());
            return Ok(out);
        };
        if total == 0 {
            return Ok(out);
        }
        let step = strides[shape.len() - 1];
        let mut index = vec![0usize; outer_shape.len()];
        let mut at = base;
        loop {
            if step == 1 {
                out.extend_from_slice(&v[at as usize..at as usize + inner]);
            } else {
                out.extend((0..inner as isize).map(|k| v[(at + k * step) as usize].clone()));
            }
            let mut d = outer_shape.len();
            loop {
                if d == 0 {
                    return Ok(out);
                }
                d -= 1;
                index[d] += 1;
                at += strides[d];
                if index[d] < outer_shape[d] {
                    break;
                }
                at -= strides[d] * outer_shape[d] as isize;
                index[d] = 0;
            }
        }
    }
    // Dims of size 1 drop out, and a dim merges into the next inner one where stepping it is
    // stepping that one past its end: `[16, 512, 508, 1]` sliced whole is one row.
    let mut dims: Vec<usize> = Vec::with_capacity(shape.len());
    let mut steps: Vec<isize> = Vec::with_capacity(shape.len());
    for (&size, &stride) in shape
        .iter()
        .zip(strides)
        .rev()
        .filter(|(&size, _)| size != 1)
    {
        match (dims.last_mut(), steps.last()) {
            (Some(inner), Some(&inner_stride)) if stride == inner_stride * *inner as isize => {
                *inner *= size;
            }
            _ => {
                dims.push(size);
                steps.push(stride);
            }
        }
    }
    dims.reverse();
    steps.reverse();
    let (shape, strides) = (dims.as_slice(), steps.as_slice());
    Ok(match data {
        TensorData::F32(v) => TensorData::F32(copy(v, base, shape, strides)?),
        TensorData::I64(v) => TensorData::I64(copy(v, base, shape, strides)?),
        TensorData::I32(v) => TensorData::I32(copy(v, base, shape, strides)?),
        TensorData::Bool(v) => TensorData::Bool(copy(v, base, shape, strides)?),
        TensorData::String(v) => TensorData::String(copy(v, base, shape, strides)?),
    })
}

/// Gathers the elements of any tensor at `offsets` (a permutation, slice or broadcast),
/// allocating the result fallibly.
pub(crate) fn take(data: &TensorData, offsets: &[usize]) -> Result<TensorData, String> {
    use super::tensor::try_collect;
    let n = offsets.len();
    Ok(match data {
        TensorData::F32(v) => TensorData::F32(try_collect(n, offsets.iter().map(|&i| v[i]))?),
        TensorData::I64(v) => TensorData::I64(try_collect(n, offsets.iter().map(|&i| v[i]))?),
        TensorData::I32(v) => TensorData::I32(try_collect(n, offsets.iter().map(|&i| v[i]))?),
        TensorData::Bool(v) => TensorData::Bool(try_collect(n, offsets.iter().map(|&i| v[i]))?),
        TensorData::String(v) => {
            TensorData::String(try_collect(n, offsets.iter().map(|&i| v[i].clone()))?)
        }
    })
}

#[cfg(test)]
pub(crate) mod test_util {
    use super::*;
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
        };
        let inputs: Vec<Option<&HostTensor>> = inputs.iter().map(|t| Some(*t)).collect();
        lookup("", op).expect("kernel registered")(&ctx, &inputs).expect("kernel succeeds")
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
    fn broadcast_offsets_follow_numpy() {
        assert_eq!(broadcast_shapes(&[&[2, 1], &[3]]).unwrap(), vec![2, 3]);
        assert_eq!(
            broadcast_offsets(&[2, 1], &[2, 3]).unwrap(),
            vec![0, 0, 0, 1, 1, 1]
        );
        assert_eq!(
            broadcast_offsets(&[3], &[2, 3]).unwrap(),
            vec![0, 1, 2, 0, 1, 2]
        );
        // Zero elements with a huge dim: nothing to address (this overflowed and panicked).
        assert_eq!(
            broadcast_offsets(&[0, 1], &[0, 1 << 62]).unwrap(),
            Vec::<usize>::new()
        );
        assert_eq!(
            broadcast_offsets(&[1 << 62, 4, 0], &[1 << 62, 4, 0]).unwrap(),
            Vec::<usize>::new()
        );
        assert!(broadcast_shapes(&[&[2], &[3]]).is_err());
    }

    #[test]
    fn every_registered_op_is_listed() {
        let ops = supported_ops();
        assert!(ops.contains(&":MatMul".to_string()));
        assert!(lookup("ai.onnx", "Add").is_some());
        assert!(lookup("", "NoSuchOp").is_none());
    }
}
