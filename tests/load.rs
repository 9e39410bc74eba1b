//! Phase test: loading ONNX files into the graph IR — fixtures, real models, external data,
//! and the malformed-input corpus in `tests/malformed/`.

mod common;

use std::path::Path;

use pipecut::graph::Storage;
use pipecut::Error;

/// Loads and infers with no bindings, returning the first error.
fn load_and_infer(path: &Path) -> Result<(), Error> {
    let mut model = pipecut::onnx::load_model(path)?;
    pipecut::onnx::shape::ShapeInference::default().run(&mut model.graph)?;
    Ok(())
}

#[test]
fn every_malformed_file_gives_its_error() {
    // The expected errors live in tests/malformed/cases.json, shared with the CLI test in
    // tests/robustness.rs, which also checks that every file there has a case.
    let dir = common::root().join("tests/malformed");
    let models: Vec<(String, String)> = common::malformed_cases()
        .into_iter()
        .filter_map(|case| Some((case.file?, case.error)))
        // runtime/ models are valid: they fail only when run (tests/robustness.rs).
        .filter(|(file, _)| file.ends_with(".onnx") && !file.starts_with("runtime/"))
        .collect();
    assert!(models.len() >= 40, "{} ONNX cases", models.len());
    for (file, expected) in &models {
        let err = load_and_infer(&dir.join(file)).expect_err(file).to_string();
        assert!(
            err.contains(expected.as_str()),
            "{file}: expected '{expected}' in: {err}"
        );
        assert!(
            !err.contains('\n'),
            "{file}: the message should be one line: {err}"
        );
    }
}

#[test]
fn fixtures_and_real_models_load() {
    let mut paths: Vec<_> = common::FIXTURES
        .iter()
        .map(|n| common::fixture(n))
        .collect();
    paths.extend(common::real_models().into_iter().map(|(_, p)| p));
    for path in paths {
        let model =
            pipecut::onnx::load_model(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let g = &model.graph;
        assert!(
            g.node_count() > 0 && g.edge_count() > 0,
            "{}",
            path.display()
        );
        assert!(!g.outputs().is_empty());
        // Node names are unique and non-empty, since plans list nodes by name.
        let mut names: Vec<&str> = g.nodes().map(|(_, n)| n.name.as_str()).collect();
        assert!(names.iter().all(|n| !n.is_empty()));
        names.sort();
        names.dedup();
        assert_eq!(names.len(), g.node_count(), "{}", path.display());
        // The topological order really is one.
        let position: std::collections::HashMap<_, _> = g
            .topological_order()
            .iter()
            .enumerate()
            .map(|(i, id)| (*id, i))
            .collect();
        for (from, to, _) in g.edges() {
            assert!(position[&from] < position[&to]);
        }
    }
}

#[test]
fn constant_nodes_become_parameters() {
    // The PP-OCR models store every weight in a Constant node.
    let Some(path) = common::real_model("ppocr_v4_det") else {
        return; // the skip says why
    };
    let model = pipecut::onnx::load_model(path).unwrap();
    assert!(model.graph.nodes().all(|(_, n)| n.op_type != "Constant"));
    let param_bytes: u64 = model
        .graph
        .parameters()
        .map(|(_, t)| t.param().unwrap().bytes)
        .sum();
    assert!(param_bytes > 4_000_000, "{param_bytes}");
}

#[test]
fn gpt3_175b_loads_without_reading_its_weights() {
    let path = common::gpt3_with_placeholder_weights();
    let mut model = pipecut::onnx::load_model(&path).unwrap();
    let external: u64 = model
        .graph
        .parameters()
        .filter_map(|(_, t)| match t.param().unwrap().storage {
            Storage::External { length, .. } => Some(length),
            _ => None,
        })
        .sum();
    // 174.6 billion fp16 parameters.
    assert!(external > 349_000_000_000, "{external}");
    let bindings = pipecut::onnx::shape::DimBindings::new()
        .bind("batch", 1)
        .bind("seq", 2048);
    pipecut::onnx::shape::ShapeInference::new(bindings)
        .run(&mut model.graph)
        .unwrap();
    let logits = model.graph.outputs()[0];
    assert_eq!(
        model.graph.concrete_shape(logits).unwrap(),
        vec![1, 2048, 50257]
    );
}

#[test]
fn loading_from_bytes_matches_loading_from_a_file() {
    let path = common::fixture("resnet_tiny");
    let bytes = std::fs::read(&path).unwrap();
    let a = pipecut::onnx::load_model(&path).unwrap();
    let b = pipecut::onnx::load_model_from_bytes(&bytes, None).unwrap();
    assert_eq!(a.graph.node_count(), b.graph.node_count());
    assert_eq!(a.graph.edge_count(), b.graph.edge_count());
}

mod built {
    //! Models built in the test with onnx-protobuf, for constructs the fixtures lack.
    use onnx_protobuf::tensor_shape_proto::{dimension, Dimension};
    use onnx_protobuf::type_proto::{self, Tensor as TensorType};
    use onnx_protobuf::{
        attribute_proto::AttributeType, AttributeProto, GraphProto, Message, ModelProto, NodeProto,
        OperatorSetIdProto, TensorShapeProto, TypeProto, ValueInfoProto,
    };

    pub fn value_info(name: &str, elem_type: i32, dims: &[&str]) -> ValueInfoProto {
        let dim = dims
            .iter()
            .map(|d| Dimension {
                value: Some(match d.parse::<i64>() {
                    Ok(v) => dimension::Value::DimValue(v),
                    Err(_) => dimension::Value::DimParam(d.to_string()),
                }),
                ..Default::default()
            })
            .collect();
        let tensor = TensorType {
            elem_type,
            shape: Some(TensorShapeProto {
                dim,
                ..Default::default()
            })
            .into(),
            ..Default::default()
        };
        ValueInfoProto {
            name: name.into(),
            type_: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(tensor)),
                ..Default::default()
            })
            .into(),
            ..Default::default()
        }
    }

    pub fn node(
        name: &str,
        op: &str,
        domain: &str,
        inputs: &[&str],
        outputs: &[&str],
    ) -> NodeProto {
        NodeProto {
            name: name.into(),
            op_type: op.into(),
            domain: domain.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    pub fn graph_attr(name: &str, graph: GraphProto) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            type_: AttributeType::GRAPH.into(),
            g: Some(graph).into(),
            ..Default::default()
        }
    }

    pub fn model(graph: GraphProto, opsets: &[(&str, i64)]) -> Vec<u8> {
        let opset_import = opsets
            .iter()
            .map(|(d, v)| OperatorSetIdProto {
                domain: d.to_string(),
                version: *v,
                ..Default::default()
            })
            .collect();
        ModelProto {
            ir_version: 8,
            opset_import,
            graph: Some(graph).into(),
            ..Default::default()
        }
        .write_to_bytes()
        .unwrap()
    }
}

#[test]
fn subgraph_nodes_stay_opaque_and_their_captures_become_edges() {
    use built::*;
    const F32: i32 = 1;
    const BOOL: i32 = 9;
    // y = If(cond) { then: Relu(x) } else { Neg(x) }, where both branches read `x` from outside.
    let branch = |op: &str| onnx_protobuf::GraphProto {
        name: format!("{op}_branch"),
        node: vec![node(
            &format!("inner_{op}"),
            op,
            "",
            &["x"],
            &[&format!("{op}_out")],
        )],
        output: vec![value_info(&format!("{op}_out"), F32, &["batch", "8"])],
        ..Default::default()
    };
    let mut if_node = node("choose", "If", "", &["cond"], &["y"]);
    if_node.attribute = vec![
        graph_attr("then_branch", branch("Relu")),
        graph_attr("else_branch", branch("Neg")),
    ];
    let graph = onnx_protobuf::GraphProto {
        name: "g".into(),
        node: vec![
            node("scale", "Sigmoid", "", &["input"], &["x"]),
            if_node,
            node("after", "Tanh", "", &["y"], &["z"]),
        ],
        input: vec![
            value_info("input", F32, &["batch", "8"]),
            value_info("cond", BOOL, &[]),
        ],
        output: vec![value_info("z", F32, &["batch", "8"])],
        ..Default::default()
    };
    let mut model = pipecut::onnx::load_model_from_bytes(&model(graph, &[("", 17)]), None).unwrap();
    let g = &model.graph;
    assert_eq!(g.node_count(), 3, "the subgraph nodes are not graph nodes");
    let choose = g.nodes().find(|(_, n)| n.name == "choose").unwrap().0;
    let x = g.tensor_id("x").unwrap();
    assert_eq!(g.node(choose).captures, vec![x]);
    assert!(g
        .edges()
        .any(|(from, to, t)| t == x && to == choose && g.node(from).name == "scale"));
    let bindings = pipecut::onnx::shape::DimBindings::new().bind("batch", 3);
    pipecut::onnx::shape::ShapeInference::new(bindings)
        .run(&mut model.graph)
        .unwrap();
    let z = model.graph.tensor_id("z").unwrap();
    assert_eq!(model.graph.concrete_shape(z).unwrap(), vec![3, 8]);
}

#[test]
fn com_microsoft_fused_ops_are_inferred() {
    use built::*;
    const F32: i32 = 1;
    let graph = onnx_protobuf::GraphProto {
        name: "fused".into(),
        node: vec![
            node(
                "sln",
                "SkipLayerNormalization",
                "com.microsoft",
                &["x", "skip", "gamma", "beta"],
                &["normed", "", "", "sum"],
            ),
            node("gelu", "FastGelu", "com.microsoft", &["normed"], &["act"]),
        ],
        input: vec![
            value_info("x", F32, &["batch", "seq", "64"]),
            value_info("skip", F32, &["batch", "seq", "64"]),
            value_info("gamma", F32, &["64"]),
            value_info("beta", F32, &["64"]),
        ],
        output: vec![
            value_info("act", F32, &["batch", "seq", "64"]),
            value_info("sum", F32, &["batch", "seq", "64"]),
        ],
        ..Default::default()
    };
    let mut model = pipecut::onnx::load_model_from_bytes(
        &model(graph, &[("", 17), ("com.microsoft", 1)]),
        None,
    )
    .unwrap();
    assert_eq!(model.graph.opset("com.microsoft"), Some(1));
    let bindings = pipecut::onnx::shape::DimBindings::new()
        .bind("batch", 2)
        .bind("seq", 5);
    pipecut::onnx::shape::ShapeInference::new(bindings)
        .run(&mut model.graph)
        .unwrap();
    for name in ["act", "sum"] {
        let id = model.graph.tensor_id(name).unwrap();
        assert_eq!(model.graph.concrete_shape(id).unwrap(), vec![2, 5, 64]);
    }
}

/// Issue 15 item 1: every default-domain opset from 1 loads; one newer than pipecut knows loads
/// with a warning naming the ops it assumed; a legacy form pipecut does not compute is refused
/// naming the op, the node and the opset.
#[test]
fn opsets_1_to_28_load_and_newer_ones_warn() {
    use built::*;
    const F32: i32 = 1;
    let relu_graph = |op: &str| onnx_protobuf::GraphProto {
        name: "g".into(),
        node: vec![node("act", op, "", &["x"], &["y"])],
        input: vec![value_info("x", F32, &["2", "3"])],
        output: vec![value_info("y", F32, &[])],
        ..Default::default()
    };
    for opset in [1, 6, 7, 23, 24, 28] {
        let mut model =
            pipecut::onnx::load_model_from_bytes(&model(relu_graph("Relu"), &[("", opset)]), None)
                .unwrap_or_else(|e| panic!("opset {opset}: {e}"));
        assert!(
            model.warnings.is_empty(),
            "opset {opset}: {:?}",
            model.warnings
        );
        pipecut::onnx::shape::ShapeInference::new(Default::default())
            .run(&mut model.graph)
            .unwrap();
        let y = model.graph.tensor_id("y").unwrap();
        assert_eq!(model.graph.concrete_shape(y).unwrap(), vec![2, 3]);
    }
    let newer = pipecut::onnx::load_model_from_bytes(&model(relu_graph("Relu"), &[("", 31)]), None)
        .unwrap();
    assert_eq!(newer.warnings.len(), 1, "{:?}", newer.warnings);
    assert!(
        newer.warnings[0].contains("opset 31") && newer.warnings[0].contains("Relu"),
        "{:?}",
        newer.warnings
    );
    let legacy =
        pipecut::onnx::load_model_from_bytes(&model(relu_graph("Reshape"), &[("", 4)]), None)
            .unwrap_err()
            .to_string();
    assert!(
        legacy.contains("'Reshape'") && legacy.contains("'act'") && legacy.contains("opset 4"),
        "{legacy}"
    );
    let zero = pipecut::onnx::load_model_from_bytes(&model(relu_graph("Relu"), &[("", 0)]), None)
        .unwrap_err()
        .to_string();
    assert!(zero.contains("opset 0"), "{zero}");
}

/// Issue 15 item 2: a Loop's carried output takes its type from the initial value, not from the
/// body's declared (here symbolic, body-local) shape, so no `--dim` is asked for it.
#[test]
fn loop_carried_outputs_take_the_initial_values_shape() {
    use built::*;
    const F32: i32 = 1;
    const I64: i32 = 7;
    const BOOL: i32 = 9;
    let body = onnx_protobuf::GraphProto {
        name: "body".into(),
        node: vec![
            node("keep_going", "Identity", "", &["cond_in"], &["cond_out"]),
            node("step", "Relu", "", &["acc_in"], &["acc_out"]),
        ],
        input: vec![
            value_info("iter", I64, &[]),
            value_info("cond_in", BOOL, &[]),
            value_info("acc_in", F32, &["rows", "cols"]),
        ],
        output: vec![
            value_info("cond_out", BOOL, &[]),
            value_info("acc_out", F32, &["body_rows", "body_cols"]),
        ],
        ..Default::default()
    };
    assert_eq!(loop_output_shape(body), vec![3, 4]);
}

/// A body that cannot be inferred (an op inside has no shape rule) leaves the Loop typed from
/// the model's declarations, as before bodies were inferred.
#[test]
fn a_loop_whose_body_cannot_be_inferred_takes_the_declared_types() {
    use built::*;
    const F32: i32 = 1;
    const I64: i32 = 7;
    const BOOL: i32 = 9;
    let body = onnx_protobuf::GraphProto {
        name: "body".into(),
        node: vec![
            node("keep_going", "Identity", "", &["cond_in"], &["cond_out"]),
            node("step", "NoSuchOp", "", &["acc_in"], &["acc_out"]),
        ],
        input: vec![
            value_info("iter", I64, &[]),
            value_info("cond_in", BOOL, &[]),
            value_info("acc_in", F32, &["3", "4"]),
        ],
        output: vec![
            value_info("cond_out", BOOL, &[]),
            value_info("acc_out", F32, &["3", "4"]),
        ],
        ..Default::default()
    };
    assert_eq!(loop_output_shape(body), vec![3, 4]);
}

/// onnx's `test_constant`: a graph of one Constant node. Its Constant stays a node (as a
/// parameter it would leave nothing to plan), so it loads, types, plans as one stage and runs.
#[test]
fn a_graph_of_constants_alone_keeps_them_as_nodes() {
    use onnx_protobuf::{attribute_proto::AttributeType, AttributeProto, GraphProto};
    let mut constant = built::node("c", "Constant", "", &[], &["values"]);
    constant.attribute.push(AttributeProto {
        name: "value_floats".into(),
        type_: AttributeType::FLOATS.into(),
        floats: vec![1.0, 2.0, 3.0],
        ..Default::default()
    });
    let graph = GraphProto {
        name: "only_constants".into(),
        node: vec![constant],
        output: vec![built::value_info("values", 1, &["3"])],
        ..Default::default()
    };
    let bytes = built::model(graph, &[("", 17)]);
    let mut model = pipecut::onnx::load_model_from_bytes(&bytes, None).unwrap();
    assert_eq!(model.graph.node_count(), 1);
    pipecut::onnx::shape::ShapeInference::new(pipecut::onnx::shape::DimBindings::new())
        .run(&mut model.graph)
        .unwrap();
    let cluster =
        pipecut::cost::Cluster::parse("1x1xH100-SXM", &pipecut::cost::Catalog::builtin()).unwrap();
    pipecut::partition::Planner::new(&model.graph, &cluster)
        .with_stages(pipecut::partition::StageCount::Fixed(1))
        .solve()
        .unwrap();
    let weights = pipecut::runtime::Weights::from_model_bytes(&bytes, &model.graph).unwrap();
    let out = pipecut::runtime::CpuExecutor::new(&model.graph, &weights)
        .run_model(&pipecut::runtime::Tensors::new())
        .unwrap();
    assert_eq!(out["values"].to_f32_vec(), vec![1.0, 2.0, 3.0]);
}

/// The shape inferred for `y` of `y = Loop(trips, cond, x: f32[3, 4])` with `body`.
fn loop_output_shape(body: onnx_protobuf::GraphProto) -> Vec<u64> {
    use built::*;
    let (f32_, i64_, bool_) = (1, 7, 9);
    let mut loop_node = node("repeat", "Loop", "", &["trips", "cond", "x"], &["y"]);
    loop_node.attribute = vec![graph_attr("body", body)];
    let graph = onnx_protobuf::GraphProto {
        name: "g".into(),
        node: vec![loop_node],
        input: vec![
            value_info("trips", i64_, &[]),
            value_info("cond", bool_, &[]),
            value_info("x", f32_, &["3", "4"]),
        ],
        output: vec![value_info("y", f32_, &[])],
        ..Default::default()
    };
    let mut model = pipecut::onnx::load_model_from_bytes(&model(graph, &[("", 17)]), None).unwrap();
    pipecut::onnx::shape::ShapeInference::new(Default::default())
        .run(&mut model.graph)
        .unwrap();
    let y = model.graph.tensor_id("y").unwrap();
    model.graph.concrete_shape(y).unwrap()
}

/// Issue 36: an If whose branches give an output of different ranks (silero-vad's `op15`
/// export, whose branches agree only once its dims are bound) no longer fails inference: the
/// output is a tensor of unknown rank. `inspect` types the model; a command that needs every
/// size names the tensor, in one line.
#[test]
fn an_if_whose_branches_differ_in_rank_gives_a_tensor_of_unknown_rank() {
    use built::*;
    const F32: i32 = 1;
    const BOOL: i32 = 9;
    let mut total = node("inner_sum", "ReduceSum", "", &["x"], &["sum"]);
    total.attribute = vec![onnx_protobuf::AttributeProto {
        name: "keepdims".into(),
        i: 0,
        type_: onnx_protobuf::attribute_proto::AttributeType::INT.into(),
        ..Default::default()
    }];
    let then = onnx_protobuf::GraphProto {
        name: "scalar".into(),
        node: vec![total],
        output: vec![value_info("sum", F32, &[])],
        ..Default::default()
    };
    let other = onnx_protobuf::GraphProto {
        name: "matrix".into(),
        node: vec![node("inner_neg", "Neg", "", &["x"], &["neg"])],
        output: vec![value_info("neg", F32, &["batch", "8"])],
        ..Default::default()
    };
    let mut if_node = node("choose", "If", "", &["cond"], &["y"]);
    if_node.attribute = vec![
        graph_attr("then_branch", then),
        graph_attr("else_branch", other),
    ];
    let graph = onnx_protobuf::GraphProto {
        name: "g".into(),
        node: vec![node("scale", "Sigmoid", "", &["input"], &["x"]), if_node],
        input: vec![
            value_info("input", F32, &["batch", "8"]),
            value_info("cond", BOOL, &[]),
        ],
        output: vec![value_info("y", F32, &[]), value_info("x", F32, &[])],
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("if_ranks.onnx");
    std::fs::write(&path, model(graph, &[("", 17)])).unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pipecut"))
            .args(args)
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let model_arg = path.to_str().unwrap();
    let (code, out, err) = run(&["inspect", model_arg]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        !format!("{out}{err}").contains("different ranks"),
        "{out}{err}"
    );
    let (code, _, err) = run(&[
        "partition",
        model_arg,
        "--dim",
        "batch=2",
        "--cluster",
        "1x1xL4",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("the shape of tensor 'y' is not known"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}
