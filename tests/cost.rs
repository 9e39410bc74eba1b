//! Phase test: every node of every fixture and fetched real model gets a cost on every device,
//! and the totals are finite and positive.

mod common;

use std::path::Path;

use pipecut::cost::{Catalog, CostModel, Mode};
use pipecut::onnx::shape::{DimBindings, ShapeInference};

fn typed(path: &Path, reference: &common::Reference) -> pipecut::onnx::Model {
    let mut model = pipecut::onnx::load_model(path).unwrap();
    let mut bindings = DimBindings::new();
    for (dim, value) in &reference.dims {
        bindings = bindings.bind(dim, *value);
    }
    ShapeInference::new(bindings).run(&mut model.graph).unwrap();
    model
}

fn assert_costed(name: &str, model: &pipecut::onnx::Model) {
    let catalog = Catalog::builtin();
    for device in catalog.devices() {
        for mode in [Mode::Inference, Mode::training()] {
            let costs = CostModel::new(device)
                .with_mode(mode)
                .node_costs(&model.graph)
                .unwrap_or_else(|e| panic!("{name} on {}: {e}", device.name));
            assert_eq!(costs.len(), model.graph.node_count());
            let total: f64 = costs.iter().map(|(_, c)| c.time_secs).sum();
            assert!(
                total.is_finite() && total > 0.0,
                "{name} on {}: {total}",
                device.name
            );
            assert!(costs
                .iter()
                .all(|(_, c)| c.time_secs.is_finite() && c.time_secs >= 0.0 && !c.fallback));
        }
    }
}

#[test]
fn every_fixture_node_has_a_cost() {
    for name in common::FIXTURES {
        assert_costed(
            name,
            &typed(&common::fixture(name), &common::fixture_reference(name)),
        );
    }
}

#[test]
fn every_real_model_node_has_a_cost() {
    for (name, path) in common::real_models() {
        assert_costed(&name, &typed(&path, &common::real_reference(&name)));
    }
}

#[test]
fn gpt3_flops_match_two_flops_per_parameter_per_token() {
    let mut model = pipecut::onnx::load_model(common::gpt3_with_placeholder_weights()).unwrap();
    let tokens = 2048u64;
    ShapeInference::new(DimBindings::new().bind("batch", 1).bind("seq", tokens))
        .run(&mut model.graph)
        .unwrap();
    let catalog = Catalog::builtin();
    let costs = |device: &str| {
        CostModel::new(catalog.device(device).unwrap())
            .node_costs(&model.graph)
            .unwrap()
    };
    let h100 = costs("H100-SXM");
    let flops: f64 = h100.iter().map(|(_, c)| c.flops).sum();
    // Kaplan et al. (2020): a forward pass costs about 2 FLOPs per parameter per token, plus
    // attention's 2·n_layer·n_ctx·d_model per token.
    let params = 174.6e9;
    let expected =
        2.0 * params * tokens as f64 + 2.0 * 96.0 * tokens as f64 * 12288.0 * tokens as f64;
    assert!(
        (flops / expected - 1.0).abs() < 0.05,
        "{flops:e} vs {expected:e}"
    );
    let time = |c: &[(pipecut::graph::NodeId, pipecut::cost::NodeCost)]| {
        c.iter().map(|(_, c)| c.time_secs).sum::<f64>()
    };
    assert!(time(&h100) < time(&costs("A100-80GB")));
    assert!(time(&costs("A100-80GB")) < time(&costs("V100-32GB")));
}

#[test]
fn unbound_dims_are_named_when_costing() {
    let mut model = pipecut::onnx::load_model(common::fixture("mlp")).unwrap();
    ShapeInference::default().run(&mut model.graph).unwrap();
    let catalog = Catalog::builtin();
    let err = CostModel::new(catalog.device("L4").unwrap())
        .node_costs(&model.graph)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("'batch'") && err.contains("--dim batch=N"),
        "{err}"
    );
}
