//! Rule tests on small hand-built graphs.

use super::*;
use crate::graph::{
    Attribute, ConstValue, DType, Graph, GraphBuilder, NodeSpec, Param, Shape, Storage, SymInt,
};

fn ints(values: &[i64]) -> Option<ConstValue> {
    Some(ConstValue::Ints(
        values.iter().map(|&v| SymInt::Lit(v)).collect(),
    ))
}

fn builder(inputs: &[(&str, DType, Shape)]) -> GraphBuilder {
    let mut b = Graph::builder("t");
    b.opset("", 17);
    for (name, dtype, shape) in inputs {
        b.input(name, Some(*dtype), Some(shape.clone())).unwrap();
    }
    b
}

fn constant(b: &mut GraphBuilder, name: &str, values: &[i64]) {
    let param = Param {
        bytes: 8 * values.len() as u64,
        storage: Storage::Declared,
    };
    b.parameter(
        name,
        DType::I64,
        &[values.len() as u64],
        param,
        ints(values),
    )
    .unwrap();
}

fn infer(b: GraphBuilder, bindings: DimBindings) -> Result<Graph, Error> {
    let mut g = b.build()?;
    ShapeInference::new(bindings).run(&mut g)?;
    Ok(g)
}

fn shape_of(g: &Graph, name: &str) -> String {
    crate::graph::format_shape(g.tensor(g.tensor_id(name).unwrap()).shape.as_ref().unwrap())
}

fn k(v: u64) -> Dim {
    Dim::Known(v)
}

#[test]
fn exported_reshape_target_is_folded_through_shape_ops() {
    // x: [batch, seq, 64] → Shape → Gather(0), Gather(1) → Unsqueeze → Concat(b, s, 4, 16) → Reshape
    let mut b = builder(&[(
        "x",
        DType::F32,
        vec![Dim::sym("batch"), Dim::sym("seq"), k(64)],
    )]);
    constant(&mut b, "i0", &[0]);
    constant(&mut b, "i1", &[1]);
    constant(&mut b, "heads", &[4, 16]);
    constant(&mut b, "axes", &[0]);
    b.node(NodeSpec::new("shape", "Shape", &["x"], &["s"]))
        .unwrap();
    b.node(NodeSpec::new("g0", "Gather", &["s", "i0"], &["b0"]).attr("axis", Attribute::Int(0)))
        .unwrap();
    b.node(NodeSpec::new("g1", "Gather", &["s", "i1"], &["s1"]))
        .unwrap();
    b.node(
        NodeSpec::new("cat", "Concat", &["b0", "s1", "heads"], &["target"])
            .attr("axis", Attribute::Int(0)),
    )
    .unwrap();
    b.node(NodeSpec::new(
        "reshape",
        "Reshape",
        &["x", "target"],
        &["y"],
    ))
    .unwrap();
    b.node(
        NodeSpec::new("t", "Transpose", &["y"], &["z"])
            .attr("perm", Attribute::Ints(vec![0, 2, 1, 3])),
    )
    .unwrap();
    b.output("z");
    let g = infer(b, DimBindings::new()).unwrap();
    assert_eq!(shape_of(&g, "y"), "[batch, seq, 4, 16]");
    assert_eq!(shape_of(&g, "z"), "[batch, 4, seq, 16]");
}

#[test]
fn reshape_minus_one_divides_symbolic_products() {
    let mut b = builder(&[(
        "x",
        DType::F32,
        vec![Dim::sym("batch"), Dim::sym("seq"), k(64)],
    )]);
    constant(&mut b, "target", &[-1, 64]);
    b.node(NodeSpec::new("r", "Reshape", &["x", "target"], &["y"]))
        .unwrap();
    b.output("y");
    let g = infer(b, DimBindings::new()).unwrap();
    assert_eq!(shape_of(&g, "y"), "[batch*seq, 64]");
}

#[test]
fn reshape_with_two_minus_ones_is_an_error() {
    let mut b = builder(&[("x", DType::F32, vec![k(2), k(3)])]);
    constant(&mut b, "target", &[-1, -1]);
    b.node(NodeSpec::new(
        "bad_reshape",
        "Reshape",
        &["x", "target"],
        &["y"],
    ))
    .unwrap();
    b.output("y");
    let msg = infer(b, DimBindings::new()).unwrap_err().to_string();
    assert!(
        msg.contains("bad_reshape") && msg.contains("more than one -1"),
        "{msg}"
    );
}

#[test]
fn bindings_make_shapes_concrete_and_unknown_names_are_refused() {
    let mk = || {
        let mut b = builder(&[("x", DType::F32, vec![Dim::sym("batch"), k(8)])]);
        b.node(NodeSpec::new("relu", "Relu", &["x"], &["y"]))
            .unwrap();
        b.output("y");
        b
    };
    let g = infer(mk(), DimBindings::new().bind("batch", 3)).unwrap();
    assert_eq!(shape_of(&g, "y"), "[3, 8]");
    let msg = infer(mk(), DimBindings::new().bind("bacth", 3))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("'bacth'") && msg.contains("batch"), "{msg}");
    // An unbound dim is an error only where a concrete size is needed, and it names both.
    let g = infer(mk(), DimBindings::new()).unwrap();
    let msg = g
        .concrete_shape(g.tensor_id("y").unwrap())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("'batch'") && msg.contains("'y'"), "{msg}");
}

#[test]
fn matmul_broadcasts_batch_dims_and_checks_inner_dims() {
    let mut b = builder(&[
        ("a", DType::F16, vec![k(2), k(1), k(5), k(7)]),
        ("b", DType::F16, vec![k(3), k(7), k(4)]),
    ]);
    b.node(NodeSpec::new("mm", "MatMul", &["a", "b"], &["c"]))
        .unwrap();
    b.output("c");
    assert_eq!(
        shape_of(&infer(b, DimBindings::new()).unwrap(), "c"),
        "[2, 3, 5, 4]"
    );
    let mut b = builder(&[
        ("a", DType::F32, vec![k(5), k(7)]),
        ("b", DType::F32, vec![k(6), k(4)]),
    ]);
    b.node(NodeSpec::new("mm", "MatMul", &["a", "b"], &["c"]))
        .unwrap();
    b.output("c");
    assert!(infer(b, DimBindings::new())
        .unwrap_err()
        .to_string()
        .contains("inner dimensions"));
}

#[test]
fn conv_and_pool_follow_the_spec_arithmetic() {
    let mut b = builder(&[
        ("x", DType::F32, vec![k(1), k(8), k(32), k(32)]),
        ("w", DType::F32, vec![k(16), k(4), k(3), k(3)]),
    ]);
    b.node(
        NodeSpec::new("conv", "Conv", &["x", "w"], &["y"])
            .attr("group", Attribute::Int(2))
            .attr("strides", Attribute::Ints(vec![2, 2]))
            .attr("dilations", Attribute::Ints(vec![2, 2]))
            .attr("pads", Attribute::Ints(vec![1, 1, 1, 1])),
    )
    .unwrap();
    b.node(
        NodeSpec::new("pool", "MaxPool", &["y"], &["z"])
            .attr("kernel_shape", Attribute::Ints(vec![3, 3]))
            .attr("strides", Attribute::Ints(vec![2, 2]))
            .attr("ceil_mode", Attribute::Int(1)),
    )
    .unwrap();
    b.node(
        NodeSpec::new("same", "Conv", &["x", "w"], &["s"])
            .attr("group", Attribute::Int(2))
            .attr("auto_pad", Attribute::String("SAME_UPPER".into())),
    )
    .unwrap();
    b.output("z");
    b.output("s");
    let g = infer(b, DimBindings::new()).unwrap();
    // (32 + 2 - 2·2 - 1) / 2 + 1 = 15; ceil((15 - 3) / 2) + 1 = 7.
    assert_eq!(shape_of(&g, "y"), "[1, 16, 15, 15]");
    assert_eq!(shape_of(&g, "z"), "[1, 16, 7, 7]");
    assert_eq!(shape_of(&g, "s"), "[1, 16, 32, 32]");
}

#[test]
fn squeeze_and_reduce_read_axes_from_attributes_and_inputs() {
    let x = vec![k(2), k(1), k(5)];
    let mut b = builder(&[("x", DType::F32, x.clone())]);
    b.opset("", 11);
    b.node(NodeSpec::new("sq", "Squeeze", &["x"], &["a"]).attr("axes", Attribute::Ints(vec![1])))
        .unwrap();
    b.node(
        NodeSpec::new("rm", "ReduceMean", &["x"], &["m"]).attr("axes", Attribute::Ints(vec![-1])),
    )
    .unwrap();
    b.output("a");
    b.output("m");
    let g = infer(b, DimBindings::new()).unwrap();
    assert_eq!(
        (shape_of(&g, "a"), shape_of(&g, "m")),
        ("[2, 5]".into(), "[2, 1, 1]".into())
    );

    let mut b = builder(&[("x", DType::F32, x)]);
    b.opset("", 18);
    constant(&mut b, "axes", &[1]);
    constant(&mut b, "last", &[-1]);
    b.node(NodeSpec::new("sq", "Squeeze", &["x", "axes"], &["a"]))
        .unwrap();
    b.node(
        NodeSpec::new("rm", "ReduceMean", &["x", "last"], &["m"])
            .attr("keepdims", Attribute::Int(0)),
    )
    .unwrap();
    b.output("a");
    b.output("m");
    let g = infer(b, DimBindings::new()).unwrap();
    assert_eq!(
        (shape_of(&g, "a"), shape_of(&g, "m")),
        ("[2, 5]".into(), "[2, 1]".into())
    );
}

#[test]
fn slice_gather_and_range_track_positions() {
    // Position ids: Range(0, seq) then slicing a [1024, 64] table to [seq, 64].
    let mut b = builder(&[
        ("ids", DType::I64, vec![Dim::sym("batch"), Dim::sym("seq")]),
        ("table", DType::F32, vec![k(1024), k(64)]),
    ]);
    constant(&mut b, "one", &[1]);
    constant(&mut b, "zero", &[0]);
    b.node(NodeSpec::new("shape", "Shape", &["ids"], &["s"]))
        .unwrap();
    b.node(NodeSpec::new(
        "seq",
        "Slice",
        &["s", "one", "one_end"],
        &["seq_len"],
    ))
    .unwrap();
    b.node(NodeSpec::new("end", "Add", &["one", "one"], &["two"]))
        .unwrap();
    b.node(NodeSpec::new("mk_end", "Identity", &["two"], &["one_end"]))
        .unwrap();
    b.node(NodeSpec::new(
        "pos",
        "Slice",
        &["table", "zero", "seq_len", "zero"],
        &["positions"],
    ))
    .unwrap();
    b.output("positions");
    let g = infer(b, DimBindings::new()).unwrap();
    assert_eq!(shape_of(&g, "seq_len"), "[1]");
    assert_eq!(shape_of(&g, "positions"), "[seq, 64]");
}

#[test]
fn einsum_reads_explicit_and_implicit_equations() {
    let mut b = builder(&[
        ("q", DType::F32, vec![k(2), k(4), k(8), k(16)]),
        ("k", DType::F32, vec![k(2), k(4), k(9), k(16)]),
    ]);
    b.node(
        NodeSpec::new("e", "Einsum", &["q", "k"], &["s"])
            .attr("equation", Attribute::String("bhqd,bhkd->bhqk".into())),
    )
    .unwrap();
    b.node(
        NodeSpec::new("i", "Einsum", &["q", "k"], &["t"])
            .attr("equation", Attribute::String("...qd,...kd".into())),
    )
    .unwrap();
    b.output("s");
    b.output("t");
    let g = infer(b, DimBindings::new()).unwrap();
    assert_eq!(shape_of(&g, "s"), "[2, 4, 8, 9]");
    assert_eq!(shape_of(&g, "t"), "[2, 4, 9, 8]");
}

#[test]
fn unknown_op_names_op_node_and_opset() {
    let mut b = builder(&[("x", DType::F32, vec![k(2)])]);
    b.node(NodeSpec::new("mystery", "FrobnicateTensor", &["x"], &["y"]))
        .unwrap();
    b.output("y");
    let msg = infer(b, DimBindings::new()).unwrap_err().to_string();
    assert!(
        msg.contains("FrobnicateTensor") && msg.contains("mystery") && msg.contains("opset 17"),
        "{msg}"
    );
}

#[test]
fn lenient_mode_reports_and_continues() {
    let mut b = builder(&[("x", DType::F32, vec![k(2)])]);
    b.node(NodeSpec::new("mystery", "FrobnicateTensor", &["x"], &["y"]))
        .unwrap();
    b.node(NodeSpec::new("after", "Relu", &["y"], &["z"]))
        .unwrap();
    b.node(NodeSpec::new("fine", "Relu", &["x"], &["w"]))
        .unwrap();
    b.output("z");
    b.output("w");
    let mut g = b.build().unwrap();
    let report = ShapeInference::new(DimBindings::new())
        .lenient(true)
        .run(&mut g)
        .unwrap();
    assert_eq!(
        report.unsupported_ops.get("ai.onnx:FrobnicateTensor"),
        Some(&1)
    );
    assert_eq!(report.skipped_nodes, 1);
    assert_eq!(shape_of(&g, "w"), "[2]");
}

#[test]
fn overflowing_shapes_are_refused() {
    let mut b = builder(&[("x", DType::F32, vec![k(1 << 32), k(1 << 32), k(16)])]);
    b.node(NodeSpec::new("relu", "Relu", &["x"], &["y"]))
        .unwrap();
    b.output("y");
    let msg = infer(b, DimBindings::new()).unwrap_err().to_string();
    assert!(msg.contains("'x'") && msg.contains("64 bits"), "{msg}");
}

/// Sizes and arithmetic on values from the model (issue 18): zero-element shapes with huge dims
/// are valid, and pads, dilations and strides near the integer limits are errors, not wraps.
#[test]
fn huge_values_are_errors_and_empty_shapes_are_valid() {
    // [2^40, 2^40, 0] holds zero elements: it was refused as overflowing 64 bits.
    let mut b = builder(&[("x", DType::F32, vec![k(1 << 40), k(1 << 40), k(0)])]);
    b.node(NodeSpec::new("relu", "Relu", &["x"], &["y"]))
        .unwrap();
    b.output("y");
    let g = infer(b, DimBindings::new()).unwrap();
    assert_eq!(shape_of(&g, "y"), "[1099511627776, 1099511627776, 0]");

    // Pads of i64::MAX on both ends of an axis: their i64 sum overflowed.
    let mut b = builder(&[("x", DType::F32, vec![k(1), k(8)])]);
    constant(&mut b, "pads", &[0, i64::MAX, 0, i64::MAX]);
    b.node(NodeSpec::new("pad", "Pad", &["x", "pads"], &["y"]))
        .unwrap();
    b.output("y");
    let err = infer(b, DimBindings::new()).unwrap_err().to_string();
    assert!(err.contains("gives no valid size"), "{err}");

    // A dilation near i64::MAX times a kernel of 4: the window's span overflowed u64.
    let mut b = builder(&[
        ("x", DType::F32, vec![k(1), k(1), k(8), k(8)]),
        ("w", DType::F32, vec![k(1), k(1), k(4), k(4)]),
    ]);
    b.node(
        NodeSpec::new("conv", "Conv", &["x", "w"], &["y"])
            .attr("dilations", Attribute::Ints(vec![i64::MAX, 1])),
    )
    .unwrap();
    b.output("y");
    let err = infer(b, DimBindings::new()).unwrap_err().to_string();
    assert!(err.contains("overflows 64 bits"), "{err}");

    // ConvTranspose with a stride near i64::MAX: stride · (D − 1) overflowed.
    let mut b = builder(&[
        ("x", DType::F32, vec![k(1), k(1), k(8), k(8)]),
        ("w", DType::F32, vec![k(1), k(1), k(3), k(3)]),
    ]);
    b.node(
        NodeSpec::new("deconv", "ConvTranspose", &["x", "w"], &["y"])
            .attr("strides", Attribute::Ints(vec![i64::MAX, 1])),
    )
    .unwrap();
    b.output("y");
    let err = infer(b, DimBindings::new()).unwrap_err().to_string();
    assert!(err.contains("overflows 64 bits"), "{err}");
}

/// Issue 15 item 2: a shape input that is a graph input (ReduceSum's axes here) is resolved by
/// a plan-time sample value instead of being refused; a value for a non-input or of the wrong
/// size is refused naming the tensor.
#[test]
fn sample_input_values_resolve_shape_inputs() {
    let graph = || {
        let mut b = builder(&[
            (
                "x",
                DType::F32,
                vec![Dim::Known(2), Dim::Known(3), Dim::Known(4)],
            ),
            ("axes", DType::I64, vec![Dim::Known(1)]),
        ]);
        b.opset("", 18);
        b.node(
            NodeSpec::new("sum", "ReduceSum", &["x", "axes"], &["y"])
                .attr("keepdims", Attribute::Int(0)),
        )
        .unwrap();
        b.output("y");
        b.build().unwrap()
    };
    let mut refused = graph();
    assert!(ShapeInference::new(DimBindings::new())
        .run(&mut refused)
        .is_err());
    let mut g = graph();
    let values = BTreeMap::from([("axes".to_string(), ints(&[1]).unwrap())]);
    ShapeInference::new(DimBindings::new())
        .with_input_values(values)
        .run(&mut g)
        .unwrap();
    let y = g.tensor_id("y").unwrap();
    assert_eq!(g.concrete_shape(y).unwrap(), vec![2, 4]);
    for (name, value) in [("y", ints(&[1])), ("axes", ints(&[1, 2]))] {
        let values = BTreeMap::from([(name.to_string(), value.unwrap())]);
        let err = ShapeInference::new(DimBindings::new())
            .with_input_values(values)
            .run(&mut graph())
            .unwrap_err();
        assert!(err.to_string().contains(&format!("'{name}'")), "{err}");
    }
}

#[test]
fn a_data_dependent_dim_is_a_symbol_that_dim_binds_or_exact_from_a_known_value() {
    let graph = |condition_value: bool| {
        let mut b = builder(&[("x", DType::F32, vec![k(3), k(2)])]);
        if condition_value {
            constant(&mut b, "cond", &[1, 0, 1]);
        } else {
            b.input("cond", Some(DType::Bool), Some(vec![k(3)]))
                .unwrap();
        }
        b.node(
            NodeSpec::new("c", "Compress", &["x", "cond"], &["y"]).attr("axis", Attribute::Int(0)),
        )
        .unwrap();
        b.node(NodeSpec::new("nz", "NonZero", &["cond"], &["idx"]))
            .unwrap();
        b.output("y");
        b.output("idx");
        b
    };
    let g = infer(graph(false), DimBindings::new()).unwrap();
    assert_eq!(shape_of(&g, "y"), "[y.0, 2]");
    let g = infer(
        graph(false),
        DimBindings::new().bind("y.0", 2).bind("idx.1", 2),
    )
    .unwrap();
    assert_eq!(shape_of(&g, "y"), "[2, 2]");
    assert_eq!(shape_of(&g, "idx"), "[1, 2]");
    let err = infer(graph(false), DimBindings::new().bind("z.0", 2)).unwrap_err();
    assert!(err.to_string().contains("no symbolic dim 'z.0'"), "{err}");
    let g = infer(graph(true), DimBindings::new()).unwrap();
    assert_eq!(shape_of(&g, "y"), "[2, 2]");
    assert_eq!(shape_of(&g, "idx"), "[1, 2]");
}

// The header is read through the codecs of the feature `image` (the runtime turns it on);
// without them every stream's size is left to the run.
#[cfg(feature = "image")]
#[test]
fn image_decoder_reads_a_known_streams_header_and_leaves_others_to_dim() {
    // A 2 × 3 binary PPM (pixel values are not read at plan time).
    let ppm: Vec<i64> = b"P6\n3 2\n255\n"
        .iter()
        .map(|&b| i64::from(b))
        .chain(std::iter::repeat_n(0, 18))
        .collect();
    let graph = |stream: Option<&[i64]>, pixel_format: &str| {
        let mut b = builder(&[]);
        match stream {
            Some(bytes) => {
                let param = Param {
                    bytes: bytes.len() as u64,
                    storage: Storage::Declared,
                };
                b.parameter("data", DType::U8, &[bytes.len() as u64], param, ints(bytes))
                    .unwrap();
            }
            None => {
                b.input("data", Some(DType::U8), Some(vec![k(100)]))
                    .unwrap();
            }
        }
        b.node(
            NodeSpec::new("dec", "ImageDecoder", &["data"], &["pixels"])
                .attr("pixel_format", Attribute::String(pixel_format.into())),
        )
        .unwrap();
        b.output("pixels");
        b.opset("", 20);
        b
    };
    let g = infer(graph(Some(&ppm), "RGB"), DimBindings::new()).unwrap();
    assert_eq!(shape_of(&g, "pixels"), "[2, 3, 3]");
    let g = infer(graph(Some(&ppm), "Grayscale"), DimBindings::new()).unwrap();
    assert_eq!(shape_of(&g, "pixels"), "[2, 3, 1]");
    let g = infer(graph(None, "BGR"), DimBindings::new()).unwrap();
    assert_eq!(shape_of(&g, "pixels"), "[pixels.0, pixels.1, 3]");
    // A known stream whose header does not read is left to the run, as onnx's inference does.
    let garbage: Vec<i64> = (0..40).collect();
    let g = infer(graph(Some(&garbage), "RGB"), DimBindings::new()).unwrap();
    assert_eq!(shape_of(&g, "pixels"), "[pixels.0, pixels.1, 3]");
    let err = infer(graph(None, "CMYK"), DimBindings::new()).unwrap_err();
    assert!(err.to_string().contains("CMYK"), "{err}");
}

#[test]
fn signal_and_spatial_rules_follow_the_spec_formulas() {
    let mut b = builder(&[
        ("cols", DType::F32, vec![k(1), k(10), k(12)]),
        ("sig", DType::F32, vec![k(2), k(16), k(1)]),
        ("flat_sig", DType::F32, vec![k(2), k(16)]),
        ("pooled", DType::F32, vec![k(1), k(3), k(2), k(2)]),
        ("idx", DType::I64, vec![k(1), k(3), k(2), k(2)]),
        ("theta", DType::F32, vec![k(2), k(2), k(3)]),
    ]);
    constant(&mut b, "image", &[5, 5]);
    constant(&mut b, "block", &[1, 5]);
    constant(&mut b, "step", &[4]);
    constant(&mut b, "frame", &[8]);
    constant(&mut b, "size", &[2, 3, 6, 7]);
    b.node(NodeSpec::new(
        "c2i",
        "Col2Im",
        &["cols", "image", "block"],
        &["img"],
    ))
    .unwrap();
    b.node(NodeSpec::new("dft", "DFT", &["sig"], &["spec"]).attr("onesided", Attribute::Int(1)))
        .unwrap();
    b.node(NodeSpec::new(
        "stft",
        "STFT",
        &["sig", "step", "", "frame"],
        &["frames"],
    ))
    .unwrap();
    // A real signal without its trailing 1, as onnxruntime accepts and onnx-asr writes.
    b.node(NodeSpec::new(
        "flat_stft",
        "STFT",
        &["flat_sig", "step", "", "frame"],
        &["flat_frames"],
    ))
    .unwrap();
    b.node(
        NodeSpec::new("unpool", "MaxUnpool", &["pooled", "idx"], &["unpooled"])
            .attr("kernel_shape", Attribute::Ints(vec![2, 2]))
            .attr("strides", Attribute::Ints(vec![2, 2])),
    )
    .unwrap();
    b.node(NodeSpec::new(
        "grid",
        "AffineGrid",
        &["theta", "size"],
        &["g"],
    ))
    .unwrap();
    b.node(
        NodeSpec::new("noise", "RandomNormal", &[], &["n"])
            .attr("shape", Attribute::Ints(vec![3, 4]))
            .attr("dtype", Attribute::Int(11)),
    )
    .unwrap();
    for out in ["img", "spec", "frames", "flat_frames", "unpooled", "g", "n"] {
        b.output(out);
    }
    let g = infer(b, DimBindings::new()).unwrap();
    assert_eq!(shape_of(&g, "img"), "[1, 2, 5, 5]");
    // Opset 17: axis 1, the 16 samples; one-sided keeps 16/2 + 1 bins.
    assert_eq!(shape_of(&g, "spec"), "[2, 9, 2]");
    assert_eq!(shape_of(&g, "frames"), "[2, 3, 5, 2]");
    assert_eq!(shape_of(&g, "flat_frames"), "[2, 3, 5, 2]");
    assert_eq!(shape_of(&g, "unpooled"), "[1, 3, 4, 4]");
    assert_eq!(shape_of(&g, "g"), "[2, 6, 7, 2]");
    assert_eq!(shape_of(&g, "n"), "[3, 4]");
    assert_eq!(g.tensor(g.tensor_id("n").unwrap()).dtype, Some(DType::F64));
}

#[test]
fn one_hot_of_known_indices_folds_into_tile_repeats() {
    // As the TorchScript exporter writes Mixtral's experts: Tile's repeats are a OneHot of a
    // size read from Shape. x: [3, 5]; the index is the size of axis 0 minus 2 (= 1), so
    // OneHot(depth 2, values [1, 4]) = [[1, 4]], reshaped to [1, 4]: x tiled to [3, 20].
    let mut b = builder(&[("x", DType::F32, vec![k(3), k(5)])]);
    constant(&mut b, "i0", &[0]);
    constant(&mut b, "two", &[2]);
    constant(&mut b, "depth", &[2]);
    constant(&mut b, "off_on", &[1, 4]);
    b.node(NodeSpec::new("shape", "Shape", &["x"], &["s"]))
        .unwrap();
    b.node(NodeSpec::new("g0", "Gather", &["s", "i0"], &["rows"]).attr("axis", Attribute::Int(0)))
        .unwrap();
    b.node(NodeSpec::new("sub", "Sub", &["rows", "two"], &["index"]))
        .unwrap();
    b.node(NodeSpec::new(
        "onehot",
        "OneHot",
        &["index", "depth", "off_on"],
        &["hot"],
    ))
    .unwrap();
    b.node(NodeSpec::new(
        "flat",
        "Reshape",
        &["hot", "depth"],
        &["repeats"],
    ))
    .unwrap();
    b.node(NodeSpec::new("tile", "Tile", &["x", "repeats"], &["y"]))
        .unwrap();
    b.output("y");
    let g = infer(b, DimBindings::new()).unwrap();
    assert_eq!(shape_of(&g, "hot"), "[1, 2]");
    assert_eq!(shape_of(&g, "y"), "[3, 20]");
}
