"""Writes the models tests/cuda.rs runs on both backends to compare DFT, Det, the ai.onnx.ml
ops and reductions off the trailing axes at what their ONNX node cases leave out (the venv's
onnx and numpy, seeded), one `NAME.onnx` and `NAME.X.npy` each, their names in `models.txt`,
and `NAME.launches.json` where the kernels a model must launch are part of the check:

- DFT of odd lengths and batch 3: real and complex input, `dft_length` padding and truncating,
  `onesided`, `inverse`, the axis as an attribute (opset 17) and as an input (opset 20); at
  lengths 7 (a direct sum), 64 (radix-2), 24, 1,000 and 4,097 (Bluestein), by the transform
  kernels' launch counts;
- STFT of real and complex signals, with and without a window and frame_length, onesided
  and not (its node cases give frame_step as a graph input, which a plan cannot be made for);
- Tile with repeats on several axes (up to a rank-6 strided view), Trilu upper and lower with
  positive, negative and no k (the Trilu node cases hold integers);
- Compress along an axis and of the flattened input with a short condition; CenterCropPad
  cropping and padding by odd differences; AffineGrid in 2-D and 3-D with and without
  align_corners (their node cases give the condition, sizes and size as graph inputs);
- OneHot of float values (the model's input), with negative and out-of-range indices, along
  a middle and the last axis;
- Col2Im in 1-D and 2-D, with strides, pads and dilations (the node cases give the image and
  block shapes as graph inputs);
- TopK, largest and smallest, along the last and the first axis, k an input and (opset 9) an
  attribute, with ties, infinities and NaNs (ranked last by smallest, so never among the k),
  at lines of 5–6, 64, 1,000 and 4,096 (sorted by a block in shared memory) and of 4,097 and
  5,000 and 20,000 (sorted in global memory), by the sort kernels' launch counts;
- onnxruntime's com.microsoft fused ops: BiasAdd, BiasGelu, FastGelu with and without a bias,
  Gelu, QuickGelu, SkipLayerNormalization with every output and SkipSimplifiedLayerNormalization;
  its Attention with 1-, 2- and 3-D mask_index, unidirectional, attention_bias broadcast over
  batch or heads, unequal V heads (qkv_hidden_sizes), scale and the present output; its
  RotaryEmbedding of [B, S, H] and [B, N, S, head] input, positions [B, S] and an offset [1],
  interleaved, partial rotation and heads from the cache width; its MatMulNBits of 2, 4 and 8
  bits with default, packed and float zero points, a short last block and a bias;
- MelWeightMatrix (8, 20 and 40 filters, the last with filters whose first edges meet),
  Bernoulli (a seed, and none: the node's name; a float and a boolean dtype), and LabelEncoder from float
  keys to float values (repeated keys, NaN, −0, misses, a default and a default tensor), each
  on the device by its kernel's launch count; MatMulNBits over 4 micro-batches expands its
  weight once;
- Det of 1 × 1 matrices, of a batch of 3 × 3 ones with singular members (a zero column, two
  equal rows) and row swaps, and of 6 × 6 ones in a [2, 3] batch;
- TreeEnsemble with several trees and targets, every aggregate function and post transform,
  NaN features tracked to the true branch, set membership; Binarizer; ArrayFeatureExtractor of
  3-D and 1-D data with repeated indices;
- reductions over leading and middle axes: to few outputs of many values (a block per output,
  `reduce_blocks_f32`: axis 0 of [1000, 3], middle axes, log-sum-exp over axes 0 and 2) and to
  many outputs or short runs (a thread per output, `reduce_f32`).

Usage: .venv/bin/python tests/fake_cuda/coverage_models.py OUT_DIR
"""

import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT


def save(out, name, node, x, constants=(), opsets=(("", 20),), y_shape=None):
    """A one-node model reading `X` (the array `x`, saved beside it) and writing `Y` (of
    `y_shape`, else the shape inference's)."""
    graph = helper.make_graph(
        [node],
        name,
        [helper.make_tensor_value_info("X", F32, list(x.shape))],
        [helper.make_tensor_value_info("Y", F32, y_shape)],
        list(constants),
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets]
    )
    model = onnx.shape_inference.infer_shapes(model)
    onnx.checker.check_model(model)
    onnx.save(model, out / f"{name}.onnx")
    np.save(out / f"{name}.X.npy", x.astype(np.float32))


def rng_for(name):
    return np.random.default_rng(sum(map(ord, name)))


def write_dft(out, name, shape, opset, axis, length=None, launches=None, **attrs):
    """DFT of a seeded input of `shape` (last axis 1 or 2) along `axis`; `launches` the
    transform kernels' launch counts the run must show."""
    if launches is not None:
        (out / f"{name}.launches.json").write_text(json.dumps(launches))
    x = rng_for(name).standard_normal(shape)
    constants, inputs = [], ["X"]
    if length is not None:
        constants.append(numpy_helper.from_array(np.array(length, np.int64), "length"))
    if opset >= 20:
        constants.append(numpy_helper.from_array(np.array(axis, np.int64), "axis"))
        inputs += ["length" if length is not None else "", "axis"]
    else:
        attrs["axis"] = axis
        if length is not None:
            inputs.append("length")
    node = helper.make_node("DFT", inputs, ["Y"], **attrs)
    # Y's shape given, not inferred: onnx 1.23's inference leaves it out when `axis` is an
    # input, and its checker then refuses the model.
    n = length if length is not None else shape[axis]
    y_shape = list(shape)
    y_shape[axis] = n // 2 + 1 if attrs.get("onesided") else n
    y_shape[-1] = 2
    save(out, name, node, x, constants, [("", opset)], y_shape=y_shape)


def write_stft(out, name, shape, step, window=None, frame_length=None, onesided=1):
    """STFT (opset 17) of a seeded signal of `shape` every `step` samples."""
    constants = [numpy_helper.from_array(np.array(step, np.int64), "step")]
    inputs = ["X", "step", "", ""]
    if window is not None:
        constants.append(numpy_helper.from_array(np.array(window, np.float32), "window"))
        inputs[2] = "window"
    if frame_length is not None:
        constants.append(numpy_helper.from_array(np.array(frame_length, np.int64), "length"))
        inputs[3] = "length"
    while inputs[-1] == "":
        inputs.pop()
    node = helper.make_node("STFT", inputs, ["Y"], onesided=onesided)
    save(out, name, node, rng_for(name).standard_normal(shape), constants, [("", 17)])


def write_tile(out, name, shape, repeats):
    constants = [numpy_helper.from_array(np.array(repeats, np.int64), "repeats")]
    node = helper.make_node("Tile", ["X", "repeats"], ["Y"])
    save(out, name, node, rng_for(name).standard_normal(shape), constants, [("", 13)])


def write_trilu(out, name, shape, upper, k=None):
    constants, inputs = [], ["X"]
    if k is not None:
        constants.append(numpy_helper.from_array(np.array(k, np.int64), "k"))
        inputs.append("k")
    node = helper.make_node("Trilu", inputs, ["Y"], upper=upper)
    save(out, name, node, rng_for(name).standard_normal(shape), constants, [("", 14)])


def write_microsoft(out, name, op, shape, params, attrs=None, outputs=1):
    """A com.microsoft `op` of a seeded input of `shape`; `params` the constant inputs after it
    (a shape, or None for an absent input), `outputs` how many of its outputs the model asks
    for (names Y, Y1, …; an empty name where a list entry is None)."""
    rng = rng_for(name)
    constants, inputs = [], ["X"]
    for k, param in enumerate(params):
        if param is None:
            inputs.append("")
            continue
        constants.append(numpy_helper.from_array(
            rng.standard_normal(param).astype(np.float32), f"p{k}"))
        inputs.append(f"p{k}")
    names = outputs if isinstance(outputs, list) else ["Y"] + [f"Y{k}" for k in range(1, outputs)]
    node = helper.make_node(op, inputs, [n or "" for n in names], domain="com.microsoft",
                            **(attrs or {}))
    stats = list(shape[:-1]) + [1]
    shapes = {"Y": shape, "Y1": stats, "Y2": stats, "Y3": shape}
    graph = helper.make_graph(
        [node], name,
        [helper.make_tensor_value_info("X", F32, shape)],
        [helper.make_tensor_value_info(n, F32, shapes[n]) for n in names if n],
        constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20),
                                                    helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, out / f"{name}.onnx")
    np.save(out / f"{name}.X.npy", rng.standard_normal(shape).astype(np.float32))


def write_ms_attention(out, name, shape, sizes, heads, mask=None, bias_shape=None,
                       present=True, attrs=None):
    """com.microsoft Attention of a seeded `[B, S, H_in]` input, `sizes` (Q, K, V) hidden
    units, an int32 `mask` (None: absent) and a seeded `attention_bias` of `bias_shape`."""
    rng = rng_for(name)
    batch, seq, hidden_in = shape
    cols = sum(sizes)
    constants = [
        numpy_helper.from_array(rng.standard_normal((hidden_in, cols)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(cols).astype(np.float32), "b"),
    ]
    inputs = ["X", "w", "b", "", "", ""]
    if mask is not None:
        constants.append(numpy_helper.from_array(np.array(mask, np.int32), "mask"))
        inputs[3] = "mask"
    if bias_shape is not None:
        constants.append(numpy_helper.from_array(
            rng.standard_normal(bias_shape).astype(np.float32), "attention_bias"))
        inputs[5] = "attention_bias"
    while inputs[-1] == "":
        inputs.pop()
    attrs = dict(attrs or {}, num_heads=heads)
    if sizes[2] != sizes[0]:
        attrs["qkv_hidden_sizes"] = list(sizes)
    outputs = [helper.make_tensor_value_info("Y", F32, [batch, seq, sizes[2]])]
    if present:
        outputs.append(helper.make_tensor_value_info(
            "present", F32, [2, batch, heads, seq, sizes[0] // heads]))
    node = helper.make_node("Attention", inputs, [o.name for o in outputs],
                            domain="com.microsoft", **attrs)
    graph = helper.make_graph([node], name, [helper.make_tensor_value_info("X", F32, shape)],
                              outputs, constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20),
                                                    helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, out / f"{name}.onnx")
    np.save(out / f"{name}.X.npy", rng.standard_normal(shape).astype(np.float32))


def write_ms_rotary(out, name, shape, positions, cached, half, attrs=None):
    """com.microsoft RotaryEmbedding of a seeded input of `shape` at int64 `positions` with
    seeded caches `[cached, half]`."""
    rng = rng_for(name)
    constants = [
        numpy_helper.from_array(np.array(positions, np.int64), "positions"),
        numpy_helper.from_array(rng.standard_normal((cached, half)).astype(np.float32), "cos"),
        numpy_helper.from_array(rng.standard_normal((cached, half)).astype(np.float32), "sin"),
    ]
    node = helper.make_node("RotaryEmbedding", ["X", "positions", "cos", "sin"], ["Y"],
                            domain="com.microsoft", **(attrs or {}))
    graph = helper.make_graph([node], name, [helper.make_tensor_value_info("X", F32, shape)],
                              [helper.make_tensor_value_info("Y", F32, shape)], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20),
                                                    helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, out / f"{name}.onnx")
    np.save(out / f"{name}.X.npy", rng.standard_normal(shape).astype(np.float32))


def write_matmul_nbits(out, name, shape, n, bits, block, zero_points=None, bias=False,
                       microbatches=1):
    """com.microsoft MatMulNBits of a seeded `[..., K]` input and seeded packed weights of `n`
    columns; `zero_points` None (the default), "packed" or "float". With several
    `microbatches`, the run must expand the weight once (one `dequant_nbits_f32` launch)."""
    rng = rng_for(name)
    k = shape[-1]
    blocks = -(-k // block)
    blob = block * bits // 8
    packed = rng.integers(0, 256, (n, blocks, blob)).astype(np.uint8)
    constants = [
        numpy_helper.from_array(packed, "B"),
        numpy_helper.from_array((rng.random(n * blocks) * 0.2).astype(np.float32), "scales"),
    ]
    inputs = ["X", "B", "scales"]
    if zero_points == "packed":
        row = -(-blocks * bits // 8)
        constants.append(numpy_helper.from_array(
            rng.integers(0, 256, n * row).astype(np.uint8), "zero_points"))
        inputs.append("zero_points")
    elif zero_points == "float":
        constants.append(numpy_helper.from_array(
            (rng.random(n * blocks) * (1 << bits)).astype(np.float32), "zero_points"))
        inputs.append("zero_points")
    if bias:
        inputs += [""] * (5 - len(inputs)) + ["bias"]
        constants.append(numpy_helper.from_array(
            rng.standard_normal(n).astype(np.float32), "bias"))
    node = helper.make_node("MatMulNBits", inputs, ["Y"], domain="com.microsoft", K=k, N=n,
                            bits=bits, block_size=block)
    graph = helper.make_graph([node], name, [helper.make_tensor_value_info("X", F32, shape)],
                              [helper.make_tensor_value_info("Y", F32, shape[:-1] + [n])],
                              constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20),
                                                    helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, out / f"{name}.onnx")
    rows = [shape[0] * microbatches] + shape[1:]
    np.save(out / f"{name}.X.npy", rng.standard_normal(rows).astype(np.float32))
    if microbatches > 1:
        (out / f"{name}.microbatches").write_text(str(microbatches))
        (out / f"{name}.launches.json").write_text(json.dumps({"dequant_nbits_f32": 1}))


def write_mel_weights(out, name, mel_bins, dft_length, sample_rate, lower, upper):
    """MelWeightMatrix of constant scalars plus X (its shape): the matrix must be made on the
    device (one `mel_weights_f32` launch)."""
    scalars = [np.array(v, np.int64) for v in (mel_bins, dft_length, sample_rate)]
    scalars += [np.array(v, np.float32) for v in (lower, upper)]
    names = ["mel_bins", "dft_length", "sample_rate", "lower", "upper"]
    shape = [dft_length // 2 + 1, mel_bins]
    graph = helper.make_graph(
        [helper.make_node("MelWeightMatrix", names, ["M"]),
         helper.make_node("Add", ["M", "X"], ["Y"])],
        name,
        [helper.make_tensor_value_info("X", F32, shape)],
        [helper.make_tensor_value_info("Y", F32, shape)],
        [numpy_helper.from_array(v, n) for v, n in zip(scalars, names)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, out / f"{name}.onnx")
    np.save(out / f"{name}.X.npy", np.zeros(shape, np.float32))
    (out / f"{name}.launches.json").write_text(json.dumps({"mel_weights_f32": 1}))


def write_bernoulli(out, name, shape, **attrs):
    """Bernoulli of seeded probabilities in [0, 1] (with exact 0s and 1s), on the device; a
    boolean `dtype` gives a boolean Y."""
    p = rng_for(name).random(shape)
    p.flat[:4] = [0.0, 1.0, 0.0, 1.0]
    node = helper.make_node("Bernoulli", ["X"], ["Y"], name=f"{name}_node", **attrs)
    if attrs.get("dtype") == TensorProto.BOOL:
        graph = helper.make_graph(
            [node], name, [helper.make_tensor_value_info("X", F32, list(shape))],
            [helper.make_tensor_value_info("Y", TensorProto.BOOL, list(shape))])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
        onnx.checker.check_model(model)
        onnx.save(model, out / f"{name}.onnx")
        np.save(out / f"{name}.X.npy", p.astype(np.float32))
    else:
        save(out, name, node, p, opsets=[("", 15)])
    (out / f"{name}.launches.json").write_text(json.dumps({"bernoulli_f32": 1}))


def write_label_encoder(out, name, keys, values, ml_opset, **attrs):
    """ai.onnx.ml LabelEncoder from float keys to float values of an input holding every key,
    NaN, −0, 0 and misses."""
    x = np.array([k for k in keys] + [np.nan, -0.0, 0.0, 2.5, -7.0, 1e30, 1.5, 3.0],
                 np.float32).reshape(2, -1)
    if ml_opset >= 4:
        attrs["keys_tensor"] = numpy_helper.from_array(np.array(keys, np.float32), "keys")
        attrs["values_tensor"] = numpy_helper.from_array(np.array(values, np.float32), "values")
    else:
        attrs["keys_floats"] = keys
        attrs["values_floats"] = values
    node = helper.make_node("LabelEncoder", ["X"], ["Y"], domain="ai.onnx.ml", **attrs)
    save(out, name, node, x, opsets=[("", 20), ("ai.onnx.ml", ml_opset)])
    (out / f"{name}.launches.json").write_text(json.dumps({"label_encode_f32": 1}))


def write_with_constant(out, name, op, shape, constant, opset, attrs=None, y_shape=None):
    """`op(X, C)` with `C` the array `constant`, X a seeded input of `shape`."""
    node = helper.make_node(op, ["X", "C"], ["Y"], **(attrs or {}))
    save(out, name, node, rng_for(name).standard_normal(shape),
         [numpy_helper.from_array(constant, "C")], [("", opset)], y_shape)


def write_top_k(out, name, shape, k, axis, largest, opset, launches=None):
    """TopK of seeded integers (ties) with an infinity and NaNs, both outputs; `launches` the
    sort kernels' launch counts the run must show."""
    if launches is not None:
        (out / f"{name}.launches.json").write_text(json.dumps(launches))
    rng = rng_for(name)
    x = np.round(rng.standard_normal(shape) * 2)
    x.flat[3], x.flat[5] = np.inf, -np.inf
    if not largest:
        x.flat[1] = x.flat[7] = np.nan
    constants, inputs, attrs = [], ["X"], {"axis": axis}
    if opset >= 11:
        attrs["largest"] = largest
    if opset >= 10:
        constants.append(numpy_helper.from_array(np.array([k], np.int64), "k"))
        inputs.append("k")
    else:
        attrs["k"] = k
    y_shape = list(shape)
    y_shape[axis] = k
    graph = helper.make_graph(
        [helper.make_node("TopK", inputs, ["Y", "I"], **attrs)],
        name,
        [helper.make_tensor_value_info("X", F32, shape)],
        [helper.make_tensor_value_info("Y", F32, y_shape),
         helper.make_tensor_value_info("I", TensorProto.INT64, y_shape)],
        constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    onnx.save(model, out / f"{name}.onnx")
    np.save(out / f"{name}.X.npy", x.astype(np.float32))


def write_col2im(out, name, shape, image, block, attrs=None):
    """Col2Im of seeded columns of `shape` into `image` by `block` (constants)."""
    constants = [numpy_helper.from_array(np.array(image, np.int64), "image"),
                 numpy_helper.from_array(np.array(block, np.int64), "block")]
    node = helper.make_node("Col2Im", ["X", "image", "block"], ["Y"], **(attrs or {}))
    y_shape = [shape[0], shape[1] // int(np.prod(block))] + list(image)
    save(out, name, node, rng_for(name).standard_normal(shape), constants, [("", 18)], y_shape)


def write_one_hot(out, name, indices, depth, axis):
    """OneHot of constant `indices` into `depth`, the values [off, on] the model's input."""
    constants = [numpy_helper.from_array(np.array(indices, np.int64), "indices"),
                 numpy_helper.from_array(np.array([depth], np.int64), "depth")]
    node = helper.make_node("OneHot", ["indices", "depth", "X"], ["Y"], axis=axis)
    y_shape = list(np.shape(indices))
    y_shape.insert(axis % (len(y_shape) + 1), depth)
    save(out, name, node, rng_for(name).standard_normal([2]), constants, [("", 11)], y_shape)


def write_det(out, name, x):
    save(out, name, helper.make_node("Det", ["X"], ["Y"]), x, opsets=[("", 22)])


def singular_batch():
    """3 × 3 matrices: two singular, one needing row swaps, one random."""
    rng = rng_for("det_3x3")
    zero_column = rng.standard_normal((3, 3))
    zero_column[:, 1] = 0
    equal_rows = rng.standard_normal((3, 3))
    equal_rows[2] = equal_rows[0]
    swaps = np.array([[0.0, 2.0, 1.0], [3.0, 0.5, 0.0], [1.0, 1.0, 4.0]])
    return np.stack([zero_column, equal_rows, swaps, rng.standard_normal((3, 3))])


def write_tree_ensemble(out, name, aggregate, post, rows=7):
    """Three trees over 4 features, 3 targets: tree 0 tests ≤ then < with NaN going true,
    tree 1 set membership then >, tree 2 ≥ then == / != (a mode per node kind)."""
    # Nodes, per tree: root, left child; leaves numbered across the forest.
    modes = [0, 1, 6, 3, 2, 4, 5]
    features = [0, 1, 2, 3, 1, 0, 2]
    splits = [0.1, -0.4, 0.0, 0.3, -0.2, 1.0, 0.5]
    # A branch: (id, is_leaf).
    true_b = [(1, 0), (0, 1), (3, 0), (2, 1), (5, 0), (4, 1), (6, 1)]
    false_b = [(1, 1), (2, 1), (3, 1), (4, 1), (6, 0), (5, 1), (7, 1)]
    weights = [0.5, -1.25, 2.0, 0.75, -0.5, 1.5, 3.0, -2.0]
    targets = [0, 1, 2, 0, 1, 2, 0, 2]
    node = helper.make_node(
        "TreeEnsemble",
        ["X"],
        ["Y"],
        domain="ai.onnx.ml",
        n_targets=3,
        aggregate_function=aggregate,
        post_transform=post,
        tree_roots=[0, 2, 4],
        nodes_featureids=features,
        nodes_modes=numpy_helper.from_array(np.array(modes, np.uint8), "nodes_modes"),
        nodes_splits=numpy_helper.from_array(np.array(splits, np.float32), "nodes_splits"),
        nodes_truenodeids=[i for i, _ in true_b],
        nodes_trueleafs=[leaf for _, leaf in true_b],
        nodes_falsenodeids=[i for i, _ in false_b],
        nodes_falseleafs=[leaf for _, leaf in false_b],
        nodes_missing_value_tracks_true=[1, 0, 0, 1, 0, 0, 1],
        membership_values=numpy_helper.from_array(
            np.array([0.5, 1.0, np.nan], np.float32), "membership_values"
        ),
        leaf_targetids=targets,
        leaf_weights=numpy_helper.from_array(np.array(weights, np.float32), "leaf_weights"),
    )
    x = np.round(rng_for(name).standard_normal((rows, 4)), 1)
    x[0, 2], x[1, 2] = 0.5, 1.0  # set members
    x[2, 0], x[3, 3] = np.nan, np.nan  # missing, tracked to the true branch
    x[4, 0] = 1.0  # equal to node 5's split
    save(out, name, node, x, opsets=[("", 20), ("ai.onnx.ml", 5)])


def write_reduce(out, name, op, shape, axes, keepdims, opset, launches):
    """`op` over `axes` of a seeded input of `shape`: the axes an input from opset 18 (13 for
    ReduceSum), an attribute before; `launches` the kernel launch counts the run must show."""
    constants, attrs, inputs = [], {"keepdims": keepdims}, ["X"]
    if opset >= 18 or (op == "ReduceSum" and opset >= 13):
        constants.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
        inputs.append("axes")
    else:
        attrs["axes"] = axes
    x = rng_for(name).standard_normal(shape) * 2
    save(out, name, helper.make_node(op, inputs, ["Y"], **attrs), x, constants, [("", opset)])
    (out / f"{name}.launches.json").write_text(json.dumps(launches))


def main(out):
    out.mkdir(parents=True, exist_ok=True)
    write_dft(out, "dft_real_odd_batch3", [3, 7, 1], 20, 1)
    write_dft(out, "dft_complex_pad_onesided", [3, 5, 4, 2], 20, 1, length=9, onesided=1)
    write_dft(out, "dft_complex_truncate_inverse", [3, 11, 2], 20, -2, length=4, inverse=1)
    write_dft(out, "dft_opset17_axis2_inverse", [3, 2, 9, 2], 17, 2, inverse=1)
    write_dft(out, "dft_opset17_real_pad", [2, 5, 3, 1], 17, 1, length=8, onesided=1)
    write_dft(out, "dft_7_direct", [2, 7, 2], 20, 1, launches={"dft_f32": 1, "fft_step_f64": 0})
    # Radix-2: log2(64) = 6 steps. Bluestein: three transforms of m = 2^⌈log2(2n − 1)⌉.
    write_dft(out, "dft_64_radix2", [3, 64, 1], 20, 1,
              launches={"dft_f32": 0, "fft_step_f64": 6, "fft_multiply_f64": 0})
    write_dft(out, "dft_1000_bluestein_complex_inverse", [2, 1000, 2], 20, 1, inverse=1,
              launches={"dft_f32": 0, "fft_step_f64": 33, "fft_multiply_f64": 1})
    write_dft(out, "dft_4097_bluestein_onesided", [1, 4097, 1], 20, 1, onesided=1,
              launches={"dft_f32": 0, "fft_step_f64": 42, "fft_multiply_f64": 1})
    write_dft(out, "dft_20_padded_to_24_middle_axis", [2, 20, 3, 1], 17, 1, length=24,
              launches={"dft_f32": 0, "fft_step_f64": 18, "fft_multiply_f64": 1})
    hann = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(16) / 16)
    write_stft(out, "stft_real_hann_window", [2, 64, 1], 8, window=hann, frame_length=16)
    write_stft(out, "stft_complex_two_sided", [1, 30, 2], 5, frame_length=10, onesided=0)
    write_stft(out, "stft_window_only_odd_step", [3, 41, 1], 7, window=hann[:12])
    write_tile(out, "tile_3d", [2, 3, 4], [2, 1, 3])
    write_tile(out, "tile_rank5_strided_view_of_rank6", [2, 1, 3, 1, 2], [1, 3, 2, 2, 1])
    write_trilu(out, "trilu_upper_k1_batch3", [3, 4, 5], 1, 1)
    write_trilu(out, "trilu_lower_negative_k", [2, 5, 3], 0, -1)
    write_trilu(out, "trilu_lower_no_k", [4, 4], 0)
    write_with_constant(out, "compress_axis1", "Compress", [3, 5, 2],
                        np.array([1, 0, 1, 1, 0], bool), 11, {"axis": 1}, [3, 3, 2])
    write_with_constant(out, "compress_flat_short_condition", "Compress", [2, 3],
                        np.array([0, 1, 1, 0], bool), 11, y_shape=[2])
    write_with_constant(out, "center_crop_pad_odd_axes", "CenterCropPad", [5, 6, 7],
                        np.array([2, 10], np.int64), 18, {"axes": [0, 2]}, [2, 6, 10])
    write_with_constant(out, "center_crop_pad_all_axes", "CenterCropPad", [4, 4],
                        np.array([3, 7], np.int64), 18, y_shape=[3, 7])
    write_with_constant(out, "affine_grid_2d", "AffineGrid", [2, 2, 3],
                        np.array([2, 3, 4, 5], np.int64), 20, y_shape=[2, 4, 5, 2])
    write_with_constant(out, "affine_grid_3d_align_corners", "AffineGrid", [1, 3, 4],
                        np.array([1, 2, 3, 4, 5], np.int64), 20, {"align_corners": 1},
                        [1, 3, 4, 5, 3])
    write_one_hot(out, "one_hot_middle_axis", [[0, 4, -1], [2, 7, -6]], 5, 1)
    write_one_hot(out, "one_hot_last_axis", [3, 0, -2, 1], 4, -1)
    write_col2im(out, "col2im_2d", [2, 12, 16], [5, 5], [2, 2])
    write_col2im(out, "col2im_strides_pads_dilations", [1, 12, 20], [6, 7], [2, 3],
                 {"strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2]})
    write_col2im(out, "col2im_1d", [2, 6, 5], [7], [3])
    write_top_k(out, "top_k_largest_last_axis", [3, 9], 4, -1, 1, 11)
    write_top_k(out, "top_k_smallest_axis0_nan_last", [7, 4, 3], 3, 0, 0, 11)
    write_top_k(out, "top_k_opset9_attribute", [2, 5, 6], 2, 1, 1, 9)
    in_blocks = {"top_k_block_f32": 1, "top_k_step_f32": 0}
    write_top_k(out, "top_k_64_in_a_block", [3, 64], 10, 1, 1, 11, in_blocks)
    write_top_k(out, "top_k_1000_all_smallest", [1000, 2], 1000, 0, 0, 11, in_blocks)
    write_top_k(out, "top_k_4096_in_a_block", [4096], 4096, 0, 1, 11, in_blocks)
    # 4,097 pads to 8,192: the chunks of 4,096 sorted in shared memory, one global step of
    # stride 4,096, the rest of size 8,192 in shared memory.
    in_memory = {"top_k_block_f32": 0, "top_k_load_f32": 1, "top_k_chunk_f32": 2,
                 "top_k_step_f32": 1, "top_k_store_f32": 1}
    write_top_k(out, "top_k_4097_in_memory", [2, 4097, 3], 4097, 1, 1, 11, in_memory)
    write_top_k(out, "top_k_5000_smallest_in_memory", [5000], 17, 0, 0, 11, in_memory)
    # 20,000 pads to 32,768: sizes 8,192, 16,384 and 32,768 take 1 + 2 + 3 global steps.
    write_top_k(out, "top_k_20000_in_memory", [20000, 1], 20000, 0, 1, 11,
                {**in_memory, "top_k_chunk_f32": 4, "top_k_step_f32": 6})
    write_microsoft(out, "ms_bias_add", "BiasAdd", [2, 3, 8], [[8], [2, 3, 8]])
    write_microsoft(out, "ms_bias_gelu", "BiasGelu", [2, 5, 6], [[6]])
    write_microsoft(out, "ms_fast_gelu_bias", "FastGelu", [3, 7], [[7]])
    write_microsoft(out, "ms_fast_gelu", "FastGelu", [3, 7], [])
    write_microsoft(out, "ms_gelu", "Gelu", [4, 5], [])
    write_microsoft(out, "ms_quick_gelu_alpha", "QuickGelu", [4, 5], [], {"alpha": 1.5})
    write_microsoft(out, "ms_skip_layer_norm_every_output", "SkipLayerNormalization",
                    [2, 3, 16], [[2, 3, 16], [16], [16], [16]], {"epsilon": 1e-5}, 4)
    write_microsoft(out, "ms_skip_simplified_layer_norm", "SkipSimplifiedLayerNormalization",
                    [3, 10], [[3, 10], [10], None], {}, ["Y", None, "Y2", "Y3"])
    write_ms_attention(out, "ms_attention_lengths_present", [2, 5, 6], [8, 8, 8], 2,
                       mask=[3, 5])
    write_ms_attention(out, "ms_attention_causal_2d_mask_head_bias", [3, 4, 7], [8, 8, 6], 2,
                       mask=[[1, 1, 0, 1], [1, 1, 1, 1], [0, 1, 1, 1]], bias_shape=[1, 2, 4, 4],
                       present=False, attrs={"unidirectional": 1, "scale": 0.3})
    mask_3d = (rng_for("mask_3d").random((2, 3, 3)) > 0.3).astype(np.int32)
    write_ms_attention(out, "ms_attention_3d_mask_batch_bias", [2, 3, 4], [6, 6, 6], 3,
                       mask=mask_3d.tolist(), bias_shape=[2, 1, 3, 3],
                       attrs={"mask_filter_value": -500.0})
    write_ms_attention(out, "ms_attention_plain", [1, 7, 5], [4, 4, 4], 1, present=False)
    write_ms_rotary(out, "ms_rotary_3d_offset", [2, 3, 16], [2], 8, 4, {"num_heads": 2})
    write_ms_rotary(out, "ms_rotary_3d_heads_from_cache", [2, 3, 12], [[0, 1, 2], [4, 3, 2]],
                    5, 3)
    write_ms_rotary(out, "ms_rotary_4d_interleaved_partial", [2, 3, 4, 8],
                    [[0, 1, 2, 3], [5, 5, 1, 0]], 6, 2, {"interleaved": 1})
    write_matmul_nbits(out, "matmul_4bits_default_zero", [2, 3, 20], 5, 4, 16)
    write_matmul_nbits(out, "matmul_4bits_packed_zero_bias", [3, 32], 7, 4, 16, "packed", True)
    write_matmul_nbits(out, "matmul_8bits_float_zero", [2, 2, 24], 3, 8, 16, "float")
    write_matmul_nbits(out, "matmul_2bits_packed_zero", [4, 40], 6, 2, 16, "packed", True)
    write_matmul_nbits(out, "matmul_4bits_expanded_once_for_4_microbatches", [1, 3, 32], 5, 4,
                       16, "packed", True, microbatches=4)
    write_mel_weights(out, "mel_weights_8_bins", 8, 64, 8000, 0.0, 4000.0)
    write_mel_weights(out, "mel_weights_20_bins_speech_band", 20, 512, 16000, 20.0, 7600.0)
    write_mel_weights(out, "mel_weights_40_bins_repeated_edges", 40, 32, 8000, 0.0, 4000.0)
    write_bernoulli(out, "bernoulli_seeded", [40, 50], seed=7.0)
    write_bernoulli(out, "bernoulli_named_float_dtype", [3, 5, 7], dtype=TensorProto.FLOAT)
    write_bernoulli(out, "bernoulli_bool_dtype", [6, 9], seed=2.0, dtype=TensorProto.BOOL)
    write_label_encoder(out, "label_encoder_floats", [1.5, -2.0, 0.0, float("nan"), 1.5, 9.0],
                        [10.0, 20.0, 30.0, 40.0, 50.0, 60.0], 2, default_float=-1.0)
    write_label_encoder(out, "label_encoder_float_tensors", [3.0, -0.0, 1e30, 2.5],
                        [0.5, -0.5, 7.0, float("inf")], 4,
                        default_tensor=numpy_helper.from_array(np.array([4.25], np.float32),
                                                              "default"))
    write_det(out, "det_1x1", rng_for("det_1x1").standard_normal((5, 1, 1)))
    write_det(out, "det_3x3_singular_and_swaps", singular_batch())
    write_det(out, "det_6x6_batch_2x3", rng_for("det_6x6").standard_normal((2, 3, 6, 6)))
    for aggregate, post in [(0, 1), (1, 2), (2, 0), (3, 3)]:
        write_tree_ensemble(out, f"tree_ensemble_aggregate{aggregate}_post{post}",
                            aggregate, post)
    x = rng_for("binarizer").standard_normal((3, 5))
    save(out, "binarizer", helper.make_node("Binarizer", ["X"], ["Y"], domain="ai.onnx.ml",
                                            threshold=0.25),
         x, opsets=[("", 20), ("ai.onnx.ml", 1)])
    for name, shape, picks, y_shape in [
        ("array_feature_extractor_3d", [2, 3, 6], [5, 0, 5, 2], [2, 3, 4]),
        ("array_feature_extractor_1d", [7], [6, 1], [1, 2]),
    ]:
        indices = numpy_helper.from_array(np.array(picks, np.int64), "indices")
        save(out, name, helper.make_node("ArrayFeatureExtractor", ["X", "indices"], ["Y"],
                                         domain="ai.onnx.ml"),
             rng_for(name).standard_normal(shape), [indices],
             opsets=[("", 20), ("ai.onnx.ml", 1)], y_shape=y_shape)
    blocks = {"reduce_blocks_f32": 1, "reduce_f32": 0}
    threads = {"reduce_blocks_f32": 0, "reduce_f32": 1}
    write_reduce(out, "reduce_sum_axis0_1000x3", "ReduceSum", [1000, 3], [0], 1, 13, blocks)
    write_reduce(out, "reduce_max_middle_axes", "ReduceMax", [3, 40, 30, 2], [1, 2], 0, 17,
                 blocks)
    write_reduce(out, "reduce_log_sum_exp_axes_0_2", "ReduceLogSumExp", [50, 3, 20], [0, 2], 1,
                 18, blocks)
    write_reduce(out, "reduce_mean_axis1_many_outputs", "ReduceMean", [8, 40, 2100], [1], 0, 18,
                 threads)
    write_reduce(out, "reduce_l2_axis0_short_runs", "ReduceL2", [5, 7, 9], [0], 1, 18, threads)
    names = sorted(p.stem for p in out.glob("*.onnx"))
    (out / "models.txt").write_text("\n".join(names) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
