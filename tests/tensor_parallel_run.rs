//! Tensor-parallel ranks run as threads with `ai.pipecut` `AllReduce` reproduce the whole model:
//! each fixture split 2 and 4 ways, every rank's graph built by the library's sharding rewrite,
//! the ranks run together by the CPU runtime, their outputs compared with the unsplit run's.

mod common;

use std::path::Path;

use pipecut::graph::Graph;
use pipecut::onnx::export::shard::{shard_file, ShardedModel};
use pipecut::onnx::shape::{DimBindings, ShapeInference};
use pipecut::runtime::tensor_parallel::run_ranks;
use pipecut::runtime::{seeded_inputs, CpuExecutor, Tensors, Weights};

fn bindings(graph: &Graph) -> DimBindings {
    let mut dims = DimBindings::new();
    for input in graph.inputs() {
        for d in graph.tensor(*input).shape.iter().flatten() {
            let pipecut::graph::Dim::Sym(sym) = d else {
                continue;
            };
            for symbol in sym.symbols() {
                let size = if symbol.contains("batch") { 2 } else { 16 };
                dims = dims.bind(symbol, size);
            }
        }
    }
    dims
}

fn typed(path: &Path) -> Graph {
    let mut model = pipecut::onnx::load_model(path).unwrap();
    let dims = bindings(&model.graph);
    ShapeInference::new(dims).run(&mut model.graph).unwrap();
    model.graph
}

/// Rank `bytes` loaded and typed as its model was.
fn rank_graph(bytes: &[u8], dir: &Path, dims: DimBindings) -> Graph {
    let mut model = pipecut::onnx::load_model_from_bytes(bytes, Some(dir)).unwrap();
    ShapeInference::new(dims).run(&mut model.graph).unwrap();
    model.graph
}

fn run_sharded(path: &Path, sharded: &ShardedModel, inputs: &Tensors) -> Tensors {
    let whole = typed(path);
    let dir = path.parent().unwrap();
    let graphs: Vec<Graph> = sharded
        .ranks
        .iter()
        .map(|b| rank_graph(b, dir, bindings(&whole)))
        .collect();
    let weights: Vec<Weights> = sharded
        .ranks
        .iter()
        .zip(&graphs)
        .map(|(b, g)| Weights::from_model_bytes(b, g).unwrap())
        .collect();
    let executors: Vec<CpuExecutor> = graphs
        .iter()
        .zip(&weights)
        .map(|(g, w)| CpuExecutor::new(g, w))
        .collect();
    run_ranks(&executors, inputs).unwrap()
}

fn assert_close(whole: &Tensors, split: &Tensors, what: &str) {
    assert_eq!(
        whole.keys().collect::<Vec<_>>(),
        split.keys().collect::<Vec<_>>()
    );
    for (name, expected) in whole {
        let (a, b) = (expected.to_f32_vec(), split[name].to_f32_vec());
        assert_eq!(expected.shape(), split[name].shape(), "{what} {name}");
        let scale = a.iter().fold(1f32, |m, x| m.max(x.abs()));
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= 1e-4 * scale,
            "{what} {name}: off by {worst} (scale {scale})"
        );
    }
}

/// Splits `path` t ways, checks the blocks it expects are split, and compares the runs.
fn reproduces(path: &Path, degree: u64, split_blocks: usize) {
    let graph = typed(path);
    let weights = Weights::load(path, &graph).unwrap();
    let inputs = seeded_inputs(&graph, 1, 7).unwrap();
    let whole = CpuExecutor::new(&graph, &weights)
        .run_model(&inputs)
        .unwrap();
    let sharded = shard_file(path, &graph, degree).unwrap();
    let reasons: Vec<&str> = sharded
        .layout
        .replicated
        .iter()
        .map(|r| r.reason.as_str())
        .collect();
    assert_eq!(
        sharded.layout.split.len(),
        split_blocks,
        "{} at {degree}: left whole: {reasons:?}",
        path.display()
    );
    let split = run_sharded(path, &sharded, &inputs);
    assert_close(
        &whole,
        &split,
        &format!("{} at t = {degree}", path.display()),
    );
}

#[test]
fn gpt2_split_two_and_four_ways_equals_the_whole_model() {
    let path = common::fixture("gpt2_tiny");
    reproduces(&path, 2, 8);
    reproduces(&path, 4, 8);
}

#[test]
fn llama_split_two_ways_equals_the_whole_model_and_its_attention_stays_whole_at_four() {
    let path = common::fixture("llama_tiny");
    reproduces(&path, 2, 4);
    // 2 key/value heads cannot be split 4 ways: the MLPs are, the attention stays whole.
    reproduces(&path, 4, 2);
}

#[test]
fn bert_split_two_and_four_ways_equals_the_whole_model() {
    let path = common::fixture("bert_tiny");
    reproduces(&path, 2, 4);
    reproduces(&path, 4, 4);
}

#[test]
fn a_rank_holds_a_quarter_of_the_block_weights_at_four() {
    let path = common::fixture("gpt2_tiny");
    let graph = typed(&path);
    let sharded = shard_file(&path, &graph, 4).unwrap();
    let elements = |g: &Graph, name: &str| -> u64 {
        let id = g.tensor_id(name).unwrap_or_else(|| panic!("{name}"));
        g.concrete_shape(id).unwrap().iter().product()
    };
    let sliced: Vec<String> = sharded
        .layout
        .split
        .iter()
        .flat_map(|b| &b.weights)
        .map(|w| graph.tensor(w.param).name.clone())
        .collect();
    // Q, K, V, their biases and the output projection per attention; two linears and the
    // first bias per MLP; 4 layers.
    assert_eq!(sliced.len(), 4 * (7 + 3), "{sliced:?}");
    let whole: u64 = sliced.iter().map(|n| elements(&graph, n)).sum();
    for (rank, bytes) in sharded.ranks.iter().enumerate() {
        let g = rank_graph(bytes, path.parent().unwrap(), bindings(&graph));
        let held: u64 = sliced
            .iter()
            .map(|n| elements(&g, &format!("{n}.tp4")))
            .sum();
        assert_eq!(held * 4, whole, "rank {rank}");
        for name in &sliced {
            assert!(
                g.tensor_id(name).is_none(),
                "rank {rank} still holds all of {name}"
            );
        }
        let all_reduces = g
            .nodes()
            .filter(|(_, n)| n.domain == "ai.pipecut" && n.op_type == "AllReduce")
            .count();
        assert_eq!(all_reduces, 8, "one per block");
    }
    // Each rank holds a different quarter of the first query weight.
    let query = &sharded.layout.split[0].weights[0];
    let slices: Vec<Vec<f32>> = sharded
        .ranks
        .iter()
        .map(|bytes| {
            let g = rank_graph(bytes, path.parent().unwrap(), bindings(&graph));
            let w = Weights::from_model_bytes(bytes, &g).unwrap();
            let name = format!("{}.tp4", graph.tensor(query.param).name);
            w.get(g.tensor_id(&name).unwrap()).unwrap().to_f32_vec()
        })
        .collect();
    for (i, a) in slices.iter().enumerate() {
        for b in &slices[i + 1..] {
            assert_ne!(a, b);
        }
    }
}

#[test]
fn minilm_split_two_ways_equals_the_whole_model() {
    let Some((_, path)) = common::real_models()
        .into_iter()
        .find(|(name, _)| name.contains("minilm"))
    else {
        common::skip(
            common::Need::RealModels,
            "MiniLM is not in fixtures/real/cache",
        );
        return;
    };
    reproduces(&path, 2, 6);
}
