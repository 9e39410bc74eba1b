//! The `ai.onnx.ml` ops with float tensors, on the device, with the CPU kernels' semantics
//! (`kernels/ml.rs`, after the ONNX reference): Binarizer, ArrayFeatureExtractor (float data;
//! the integer indices, which the host holds, checked there and uploaded for `gather_axis_f32`) and TreeEnsemble
//! (opset 5; the CPU kernel's decoding of the attributes, `Forest`), and LabelEncoder from float
//! keys to float values (the CPU kernel's table, `float_labels`, searched by
//! `label_encode_f32`; other key types are held on the host, where the lookup stays).
//!
//! TreeEnsemble runs in two kernels: `tree_leaves_f32`, a thread per (row, tree) walking to its
//! leaf, then `tree_aggregate_f32`, a thread per row folding its leaves tree by tree (the CPU
//! kernel's order, so the same sums) and applying the post transform. The forest is checked on
//! the host first (every branch a node or leaf that exists, every feature inside a row, every
//! target below `n_targets`, no cycle); a forest that fails is left to the CPU kernel, which
//! reports the error the first row to meet it gives.

use cudarc::driver::{DeviceRepr, PushKernelArg};

use super::gpu::{cuda_error, Gpu};
use super::layout_ops::gather_along;
use super::operands::{device, host, one, OpResult};
use super::value::{DeviceTensor, Value};
use crate::kernels::{float_labels, Ctx, Forest, TreeBranch, TreeTest};
use crate::tensor::runtime_dtype;
use pipecut_ir::graph::DType;

/// Runs an `ai.onnx.ml` node on the device when it can.
pub(super) fn run(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    match ctx.node.op_type.as_str() {
        "Binarizer" => binarizer(gpu, ctx, args),
        "ArrayFeatureExtractor" => array_feature_extractor(gpu, args),
        "TreeEnsemble" => tree_ensemble(gpu, ctx, args),
        "LabelEncoder" => label_encoder(gpu, ctx, args),
        _ => Ok(None),
    }
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_Binarizer.html>: 1 where `x > threshold`.
fn binarizer(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let n = x.data.len();
    let mut out = gpu.alloc(n)?;
    let (count, threshold) = (n as i64, ctx.float("threshold", 0.0));
    let mut launch = gpu.stream.launch_builder(&gpu.functions.ml.binarize);
    launch
        .arg(&*x.data)
        .arg(&mut out)
        .arg(&count)
        .arg(&threshold);
    // SAFETY: argument types match `binarize_f32`; both buffers hold n floats.
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(x.shape.clone(), out))
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_LabelEncoder.html> from float keys to float
/// values: each element's value, NaN matching a NaN key, −0 matching 0, a miss the default.
fn label_encoder(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let (Some(x), Some(table)) = (device(gpu, args, 0)?, float_labels(ctx)) else {
        return Ok(None);
    };
    let declared = ctx.output_dtypes.first().copied().flatten();
    if declared.is_some_and(|d| runtime_dtype(d) != DType::F32) {
        return Ok(None);
    }
    // A buffer is never empty: a table of no keys searches one it never reads.
    let count = table.keys.len() as i64;
    let keys = gpu.upload(if table.keys.is_empty() {
        &[0.0]
    } else {
        &table.keys
    })?;
    let values = gpu.upload(if table.values.is_empty() {
        &[0.0]
    } else {
        &table.values
    })?;
    let n = x.data.len();
    let mut out = gpu.alloc(n)?;
    let n64 = n as i64;
    let mut launch = gpu.stream.launch_builder(&gpu.functions.ml.label_encode);
    launch
        .arg(&*x.data)
        .arg(&keys)
        .arg(&values)
        .arg(&mut out)
        .arg(&n64)
        .arg(&count)
        .arg(&table.nan)
        .arg(&table.default);
    // SAFETY: argument types match `label_encode_f32`; `x` and `out` hold n floats, `keys` and
    // `values` `count` (or one, unread, when count is 0).
    unsafe { launch.launch(Gpu::grid(n)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(x.shape.clone(), out))
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_ArrayFeatureExtractor.html>: the last axis's
/// elements at the indices, `[..., K]` (`[1, K]` from 1-D data). Indices outside the axis are
/// the CPU kernel's error to report.
fn array_feature_extractor(gpu: &Gpu, args: &[Option<Value>]) -> OpResult {
    let (Some(x), Some(indices)) = (device(gpu, args, 0)?, host(gpu, args, 1)?) else {
        return Ok(None);
    };
    let Some((&features, leading)) = x.shape.split_last() else {
        return Ok(None);
    };
    if !matches!(indices.dtype(), DType::I64 | DType::I32) {
        return Ok(None);
    }
    let picked = indices.to_i64_vec();
    if picked.is_empty() || picked.iter().any(|&i| !(0..features as i64).contains(&i)) {
        return Ok(None);
    }
    let rows = x.data.len() / features;
    let out = gather_along(gpu, &x.data, (rows, features, 1), &picked)?;
    let shape = if leading.is_empty() {
        vec![1, picked.len()]
    } else {
        leading.iter().copied().chain([picked.len()]).collect()
    };
    one(DeviceTensor::new(shape, out))
}

/// A tree node as `struct TreeNode` in `kernels.cu` lays it out: a branch ≥ 0 is a node, < 0
/// the leaf −1 − branch.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct TreeNode {
    feature: i32,
    mode: i32,
    true_branch: i32,
    false_branch: i32,
    missing_true: i32,
    member_start: i32,
    member_count: i32,
    split: f32,
}

// SAFETY: `TreeNode` is `repr(C)` plain data matching the CUDA struct field for field.
unsafe impl DeviceRepr for TreeNode {}

/// A forest laid out for the kernels.
struct DeviceForest {
    nodes: Vec<TreeNode>,
    /// The BRANCH_MEMBER sets one after another (one NaN when there are none: a buffer is never
    /// empty, and NaN is a member of no set).
    members: Vec<f32>,
    roots: Vec<i32>,
    leaf_targets: Vec<i32>,
}

fn branch_code(branch: TreeBranch) -> Option<i32> {
    match branch {
        TreeBranch::Node(n) => i32::try_from(n).ok(),
        TreeBranch::Leaf(l) => i32::try_from(l).ok().map(|l| -1 - l),
    }
}

/// Whether every walk from a root ends at an existing leaf of a target below `targets`, reading
/// features below `width`, without a cycle (a depth-first search over the nodes the roots reach).
fn walks_end_at_leaves(forest: &Forest, width: usize, targets: usize) -> bool {
    let count = forest.tests.len();
    let leaf_ok = |leaf: usize| {
        leaf < forest.leaf_weights.len()
            && forest.leaf_targets.get(leaf).is_some_and(|&t| t < targets)
    };
    // 0 not seen, 1 on the current path, 2 every walk from it checked.
    let mut state = vec![0u8; count];
    let mut path: Vec<(usize, u8)> = Vec::new();
    for &root in &forest.roots {
        let mut next = Some(root);
        loop {
            match next.take() {
                Some(TreeBranch::Leaf(leaf)) if !leaf_ok(leaf) => return false,
                Some(TreeBranch::Node(node)) => {
                    if node >= count || forest.features[node] >= width || state[node] == 1 {
                        return false;
                    }
                    if state[node] == 0 {
                        state[node] = 1;
                        path.push((node, 0));
                    }
                }
                _ => {}
            }
            let Some((node, taken)) = path.last_mut() else {
                break;
            };
            match taken {
                0 => next = Some(forest.true_branch[*node]),
                1 => next = Some(forest.false_branch[*node]),
                _ => {
                    state[*node] = 2;
                    path.pop();
                    continue;
                }
            }
            *taken += 1;
        }
    }
    true
}

impl DeviceForest {
    /// The forest for rows of `width` features and `targets` targets, or `None` when a walk
    /// could fail (left to the CPU kernel) or an index exceeds 32 bits.
    fn new(forest: &Forest, width: usize, targets: usize) -> Option<DeviceForest> {
        if !walks_end_at_leaves(forest, width, targets) {
            return None;
        }
        let mut members = Vec::new();
        let mut nodes = Vec::with_capacity(forest.tests.len());
        for (i, test) in forest.tests.iter().enumerate() {
            let (mode, split) = match test {
                TreeTest::Leq(s) => (0, *s),
                TreeTest::Lt(s) => (1, *s),
                TreeTest::Gte(s) => (2, *s),
                TreeTest::Gt(s) => (3, *s),
                TreeTest::Eq(s) => (4, *s),
                TreeTest::Neq(s) => (5, *s),
                TreeTest::Member(_) => (6, 0.0),
            };
            let (member_start, member_count) = match test {
                TreeTest::Member(set) => {
                    let start = members.len();
                    members.extend_from_slice(set);
                    (i32::try_from(start).ok()?, i32::try_from(set.len()).ok()?)
                }
                _ => (0, 0),
            };
            nodes.push(TreeNode {
                // A node no root reaches may name any feature; it is never read.
                feature: i32::try_from(forest.features[i]).unwrap_or(0),
                mode,
                true_branch: branch_code(forest.true_branch[i])?,
                false_branch: branch_code(forest.false_branch[i])?,
                missing_true: i32::from(forest.missing_goes_true.get(i) == Some(&true)),
                member_start,
                member_count,
                split,
            });
        }
        if members.is_empty() {
            members.push(f32::NAN);
        }
        Some(DeviceForest {
            nodes,
            members,
            roots: forest
                .roots
                .iter()
                .map(|&r| branch_code(r))
                .collect::<Option<_>>()?,
            leaf_targets: forest
                .leaf_targets
                .iter()
                .map(|&t| i32::try_from(t).unwrap_or(i32::MAX))
                .collect(),
        })
    }
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_TreeEnsemble.html> (opset 5): `[N, F]` rows
/// walk every tree; leaf weights aggregate per target (`aggregate_function` 0 average, 1 sum,
/// 2 min, 3 max), then `post_transform` (0 none, 1 softmax, 2 logistic, 3 softmax keeping
/// zeros). Other codes, and forests a walk could fail in, are left to the CPU kernel's errors.
fn tree_ensemble(gpu: &Gpu, ctx: &Ctx, args: &[Option<Value>]) -> OpResult {
    let Some(x) = device(gpu, args, 0)? else {
        return Ok(None);
    };
    let [rows, width] = x.shape[..] else {
        return Ok(None);
    };
    let (aggregate, post) = (
        ctx.int("aggregate_function", 1),
        ctx.int("post_transform", 0),
    );
    let targets = usize::try_from(ctx.int("n_targets", 0)).unwrap_or(0);
    if !(0..=3).contains(&aggregate) || !(0..=3).contains(&post) || targets == 0 {
        return Ok(None);
    }
    let Ok(forest) = Forest::new(ctx) else {
        return Ok(None);
    };
    let Some(laid_out) = DeviceForest::new(&forest, width, targets) else {
        return Ok(None);
    };
    let trees = laid_out.roots.len();
    if trees == 0 {
        return Ok(None);
    }
    let kernels = &gpu.functions.ml;
    let nodes = gpu.upload(&laid_out.nodes)?;
    let members = gpu.upload(&laid_out.members)?;
    let roots = gpu.upload(&laid_out.roots)?;
    let weights = gpu.upload(&forest.leaf_weights)?;
    let leaf_targets = gpu.upload(&laid_out.leaf_targets)?;
    let walks = rows * trees;
    // SAFETY: `tree_leaves_f32` writes every (row, tree) entry.
    let mut leaves = unsafe { gpu.stream.alloc::<i32>(walks) }.map_err(cuda_error("allocation"))?;
    // A walk visits each node at most once (the forest has no cycle).
    let steps = laid_out.nodes.len() as i64 + 1;
    let (r, t, w) = (rows as i64, trees as i64, width as i64);
    let mut launch = gpu.stream.launch_builder(&kernels.tree_leaves);
    launch
        .arg(&*x.data)
        .arg(&nodes)
        .arg(&members)
        .arg(&roots)
        .arg(&mut leaves)
        .arg(&r)
        .arg(&t)
        .arg(&w)
        .arg(&steps);
    // SAFETY: argument types match `tree_leaves_f32`; the host checked that every node, member
    // set, feature and leaf a walk reaches lies inside its buffer.
    unsafe { launch.launch(Gpu::grid(walks)) }.map_err(cuda_error("launch"))?;
    let mut out = gpu.alloc(rows * targets)?;
    let (n_targets, aggregate, post) = (targets as i64, aggregate as i32, post as i32);
    let mut launch = gpu.stream.launch_builder(&kernels.tree_aggregate);
    launch
        .arg(&leaves)
        .arg(&weights)
        .arg(&leaf_targets)
        .arg(&mut out)
        .arg(&r)
        .arg(&t)
        .arg(&n_targets)
        .arg(&aggregate)
        .arg(&post);
    // SAFETY: argument types match `tree_aggregate_f32`; every leaf reached has a weight and a
    // target below n_targets, and `out` holds rows · n_targets floats.
    unsafe { launch.launch(Gpu::grid(rows)) }.map_err(cuda_error("launch"))?;
    one(DeviceTensor::new(vec![rows, targets], out))
}
