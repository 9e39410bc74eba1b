//! Load + shape inference time: the GPT-3-175B-shaped model (external-data placeholders, so the
//! weights are never read) and the committed fixtures. Target (issue 2): 175B under 2 s.
//!
//! `cargo bench --bench load`

use criterion::{criterion_group, criterion_main, Criterion};
use pipecut::onnx::shape::{DimBindings, ShapeInference};

#[path = "../tests/common/mod.rs"]
mod common;

fn load_and_infer(path: &std::path::Path, bindings: &DimBindings) -> usize {
    let mut model = pipecut::onnx::load_model(path).expect("fixture loads");
    ShapeInference::new(bindings.clone())
        .run(&mut model.graph)
        .expect("shapes infer");
    model.graph.node_count()
}

fn bench_load(c: &mut Criterion) {
    let mut group = c.benchmark_group("load+infer");
    group.sample_size(20);
    let gpt3 = common::gpt3_with_placeholder_weights();
    let bindings = DimBindings::new().bind("batch", 1).bind("seq", 2048);
    group.bench_function("gpt3_175b", |b| b.iter(|| load_and_infer(&gpt3, &bindings)));
    for name in common::FIXTURES {
        let path = common::fixture(name);
        let mut bindings = DimBindings::new();
        for (dim, value) in &common::fixture_reference(name).dims {
            bindings = bindings.bind(dim, *value);
        }
        group.bench_function(name, |b| b.iter(|| load_and_infer(&path, &bindings)));
    }
    group.finish();
}

criterion_group!(benches, bench_load);
criterion_main!(benches);
