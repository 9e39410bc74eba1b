//! Phase test: pipecut's shape inference agrees with `onnx.shape_inference` on every tensor whose
//! shape onnx knows, for every fixture and every fetched real model.

mod common;

use std::path::Path;

use pipecut::graph::Dim;
use pipecut::onnx::shape::{DimBindings, ShapeInference};

/// Infers with the reference's bindings and compares every fully known onnx shape. Returns the
/// number of tensors compared.
fn agree_with_onnx(model_path: &Path, reference: &common::Reference) -> usize {
    let mut model = pipecut::onnx::load_model(model_path).unwrap();
    let mut bindings = DimBindings::new();
    for (name, value) in &reference.dims {
        bindings = bindings.bind(name, *value);
    }
    ShapeInference::new(bindings)
        .run(&mut model.graph)
        .unwrap_or_else(|e| panic!("{}: {e}", model_path.display()));
    let graph = &model.graph;
    let mut compared = 0;
    let mut mismatches = Vec::new();
    for (name, expected) in reference.json["tensors"].as_object().unwrap() {
        let Some(dims) = expected["shape"].as_array() else {
            continue;
        };
        let Some(dims) = dims
            .iter()
            .map(|d| d.as_u64())
            .collect::<Option<Vec<u64>>>()
        else {
            continue; // onnx does not know every dim of this tensor
        };
        let Some(id) = graph.tensor_id(name) else {
            mismatches.push(format!("{name}: not in pipecut's graph"));
            continue;
        };
        let tensor = graph.tensor(id);
        let ours: Vec<Dim> = tensor.shape.clone().unwrap_or_default();
        let expected_dims: Vec<Dim> = dims.into_iter().map(Dim::Known).collect();
        let dtype = tensor.dtype.map(|d| d.name()).unwrap_or("?");
        if ours != expected_dims || dtype != expected["dtype"].as_str().unwrap() {
            mismatches.push(format!(
                "{name}: pipecut {dtype} {} vs onnx {} {}",
                pipecut::graph::format_shape(&ours),
                expected["dtype"],
                pipecut::graph::format_shape(&expected_dims)
            ));
        }
        compared += 1;
    }
    assert!(
        mismatches.is_empty(),
        "{}: {} mismatches:\n{}",
        model_path.display(),
        mismatches.len(),
        mismatches.join("\n")
    );
    compared
}

#[test]
fn fixtures_agree_with_onnx_shape_inference() {
    for name in common::FIXTURES {
        let compared = agree_with_onnx(&common::fixture(name), &common::fixture_reference(name));
        assert!(compared > 10, "{name}: only {compared} tensors compared");
    }
}

#[test]
fn real_models_agree_with_onnx_shape_inference() {
    for (name, path) in common::real_models() {
        let compared = agree_with_onnx(&path, &common::real_reference(&name));
        assert!(compared > 10, "{name}: only {compared} tensors compared");
    }
}

#[test]
fn fixtures_become_fully_concrete_once_dims_are_bound() {
    for name in common::FIXTURES {
        let mut model = pipecut::onnx::load_model(common::fixture(name)).unwrap();
        let mut bindings = DimBindings::new();
        for (dim, value) in &common::fixture_reference(name).dims {
            bindings = bindings.bind(dim, *value);
        }
        let report = ShapeInference::new(bindings).run(&mut model.graph).unwrap();
        assert!(
            report.unbound_symbols.is_empty(),
            "{name}: unbound {:?}",
            report.unbound_symbols
        );
        for (id, _) in model.graph.tensors() {
            model.graph.concrete_shape(id).unwrap();
        }
    }
}
