//! Tensor-parallel ranks run as threads with `ai.pipecut` `AllReduce` reproduce the whole model:
//! each fixture split 2 and 4 ways, every rank's graph built by the library's sharding rewrite,
//! the ranks run together by the CPU runtime, their outputs compared with the unsplit run's.

mod common;

use std::path::Path;

use pipecut::graph::Graph;
use pipecut::onnx::export::shard::{shard_file, ShardedModel};
use pipecut::onnx::shape::{DimBindings, ShapeInference};
use pipecut::partition::tensor_parallel::TensorParallelism;
use pipecut::runtime::tensor_parallel::run_ranks;
use pipecut::runtime::{seeded_inputs, CpuExecutor, Tensors, Weights};

/// Tensor parallelism of `degree`, without sequence parallelism.
fn tp(degree: u64) -> TensorParallelism {
    TensorParallelism {
        degree: degree as u32,
        sequence_parallel: false,
    }
}

fn bindings(graph: &Graph) -> DimBindings {
    bindings_with(graph, 16)
}

/// Batch 2 and every other dim `seq`.
fn bindings_with(graph: &Graph, seq: u64) -> DimBindings {
    let mut dims = DimBindings::new();
    for input in graph.inputs() {
        for d in graph.tensor(*input).shape.iter().flatten() {
            let pipecut::graph::Dim::Sym(sym) = d else {
                continue;
            };
            for symbol in sym.symbols() {
                let size = if symbol.contains("batch") { 2 } else { seq };
                dims = dims.bind(symbol, size);
            }
        }
    }
    dims
}

fn typed(path: &Path) -> Graph {
    typed_with(path, 16)
}

fn typed_with(path: &Path, seq: u64) -> Graph {
    let mut model = pipecut::onnx::load_model(path).unwrap();
    let dims = bindings_with(&model.graph, seq);
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
fn reproduces(path: &Path, degree: u64, split_blocks: usize, vocab: usize) {
    let graph = typed(path);
    let weights = Weights::load(path, &graph).unwrap();
    let inputs = seeded_inputs(&graph, 1, 7).unwrap();
    let whole = CpuExecutor::new(&graph, &weights)
        .run_model(&inputs)
        .unwrap();
    let sharded = shard_file(path, &graph, tp(degree)).unwrap();
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
    assert_eq!(
        sharded.layout.vocab.len(),
        vocab,
        "{} at {degree}: vocabulary splits",
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
    reproduces(&path, 2, 8, 2);
    reproduces(&path, 4, 8, 2);
}

#[test]
fn a_vocabulary_the_degree_does_not_divide_is_padded_and_the_outputs_are_the_models_own() {
    // gpt2_tiny's 512 tokens at t = 3: 171 rows and logits columns per rank, the last rank's
    // last one padding; its 4 heads do not split 3 ways, so the blocks stay whole.
    let path = common::fixture("gpt2_tiny");
    reproduces(&path, 3, 0, 2);
    let graph = typed(&path);
    let sharded = shard_file(&path, &graph, tp(3)).unwrap();
    for v in &sharded.layout.vocab {
        assert_eq!((v.vocab, v.padded), (512, 513));
        assert_eq!(v.held(3, 2), 342..512);
    }
}

#[test]
fn an_mlp_of_gemm_linears_split_two_and_four_ways_equals_the_whole_model() {
    // torch.onnx's Linear on a 2-D input is a Gemm with transB = 1 and its bias inside: the
    // column Gemm's bias is sliced with its weight, the row Gemm's added once after the sum.
    let path = common::fixture("mlp");
    reproduces(&path, 2, 2, 0);
    reproduces(&path, 4, 2, 0);
}

#[test]
fn llama_split_two_ways_equals_the_whole_model_and_its_attention_stays_whole_at_four() {
    let path = common::fixture("llama_tiny");
    reproduces(&path, 2, 4, 2);
    // 2 key/value heads cannot be split 4 ways: the MLPs are, the attention stays whole.
    reproduces(&path, 4, 2, 2);
}

#[test]
fn bert_split_two_and_four_ways_equals_the_whole_model() {
    let path = common::fixture("bert_tiny");
    reproduces(&path, 2, 4, 2);
    // Its 2 token types padded to 4: ranks 2 and 3 hold only zero rows.
    reproduces(&path, 4, 4, 2);
}

/// The `ai.pipecut` collectives of kind `op` in rank `bytes`.
fn collectives(bytes: &[u8], op: &str) -> usize {
    use onnx_protobuf::Message;
    let model = onnx_protobuf::ModelProto::parse_from_bytes(bytes).unwrap();
    model
        .graph
        .node
        .iter()
        .filter(|n| n.domain == "ai.pipecut" && n.op_type == op)
        .count()
}

/// Splits `path` `degree` ways with sequence parallelism: every all-reduce of the plain split
/// becomes a reduce-scatter along the sequence, each split block and head reads a gathered
/// whole, and the ranks together give the whole model's outputs.
fn reproduces_sequence_parallel(path: &Path, degree: u64) {
    let graph = typed(path);
    let weights = Weights::load(path, &graph).unwrap();
    let inputs = seeded_inputs(&graph, 1, 11).unwrap();
    let whole = CpuExecutor::new(&graph, &weights)
        .run_model(&inputs)
        .unwrap();
    let plain = shard_file(path, &graph, tp(degree)).unwrap();
    let sequence = TensorParallelism {
        degree: degree as u32,
        sequence_parallel: true,
    };
    let sharded = shard_file(path, &graph, sequence).unwrap();
    let what = format!(
        "{} at t = {degree} with sequence parallelism",
        path.display()
    );
    for (plain_rank, rank) in plain.ranks.iter().zip(&sharded.ranks) {
        assert_eq!(collectives(rank, "AllReduce"), 0, "{what}");
        assert_eq!(
            collectives(rank, "ReduceScatter"),
            collectives(plain_rank, "AllReduce"),
            "{what}: one reduce-scatter for each all-reduce"
        );
        // A gather before each split block at least (several blocks may read one tensor).
        assert!(
            collectives(rank, "AllGather") > collectives(plain_rank, "AllGather"),
            "{what}"
        );
    }
    let split = run_sharded(path, &sharded, &inputs);
    assert_close(&whole, &split, &what);
}

#[test]
fn sequence_parallel_ranks_of_gpt2_llama_and_bert_equal_the_whole_model() {
    for name in ["gpt2_tiny", "llama_tiny", "bert_tiny"] {
        let path = common::fixture(name);
        reproduces_sequence_parallel(&path, 2);
        reproduces_sequence_parallel(&path, 4);
    }
}

#[test]
fn a_normalization_between_blocks_runs_on_a_quarter_of_the_sequence() {
    let path = common::fixture("gpt2_tiny");
    let graph = typed(&path);
    let sequence = TensorParallelism {
        degree: 4,
        sequence_parallel: true,
    };
    let sharded = shard_file(&path, &graph, sequence).unwrap();
    let declared = pipecut::onnx::load_model(&path).unwrap().graph;
    let g = rank_graph(
        &sharded.ranks[1],
        path.parent().unwrap(),
        bindings(&declared),
    );
    let norms: Vec<Vec<u64>> = g
        .nodes()
        .filter(|(_, n)| n.op_type == "LayerNormalization")
        .map(|(_, n)| g.concrete_shape(n.outputs[0].unwrap()).unwrap())
        .collect();
    // 4 layers × 2 and the final one, each on 16 / 4 positions of batch 2.
    assert_eq!(norms, vec![vec![2, 4, 64]; 9]);
}

#[test]
fn a_sequence_the_degree_does_not_divide_is_refused_in_one_line() {
    let path = common::fixture("gpt2_tiny");
    let graph = typed_with(&path, 15);
    let sequence = TensorParallelism {
        degree: 2,
        sequence_parallel: true,
    };
    let err = shard_file(&path, &graph, sequence).unwrap_err().to_string();
    assert!(
        err.contains("15 positions") && err.contains("2 ways"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    // Without sequence parallelism the same length splits.
    assert!(shard_file(&path, &graph, tp(2)).is_ok());
}

#[test]
fn a_rank_holds_a_quarter_of_the_block_weights_at_four() {
    let path = common::fixture("gpt2_tiny");
    let graph = typed(&path);
    let sharded = shard_file(&path, &graph, tp(4)).unwrap();
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
        let collectives = |op: &str| {
            g.nodes()
                .filter(|(_, n)| n.domain == "ai.pipecut" && n.op_type == op)
                .count()
        };
        assert_eq!(
            collectives("AllReduce"),
            8 + 1,
            "one per block and the embedding's"
        );
        assert_eq!(collectives("AllGather"), 1, "the logits");
        // The tied vocabulary table: a quarter of its rows for the embedding (and a zero
        // row), the same quarter as the head's columns; the whole table is gone.
        assert!(g.tensor_id("transformer.wte.weight").is_none());
        assert_eq!(
            elements(&g, "transformer.wte.weight.tp4.rows"),
            (512 / 4 + 1) * 64
        );
        assert_eq!(
            elements(&g, "transformer.wte.weight.tp4.columns"),
            512 / 4 * 64
        );
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
    reproduces(&path, 2, 6, 1);
    reproduces_sequence_parallel(&path, 2);
}

fn pipecut(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pipecut"))
        .args(args)
        .current_dir(common::root())
        .output()
        .expect("the pipecut binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pipecut {args:?}: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A plan of 2 stages of `degree` GPUs for `name`, exported: the rank files, run stage after
/// stage with each stage's ranks as threads, make the whole model's outputs.
fn exported_ranks_reproduce(name: &str, degree: u32, sequence_parallel: bool) {
    let dir = tempfile::tempdir().unwrap();
    let model = common::fixture(name);
    let model_arg = model.to_str().unwrap();
    let plan = dir.path().join("plan.json");
    let out_dir = dir.path().join("stages");
    let tp = degree.to_string();
    let mut args = vec![
        "plan-cluster",
        model_arg,
        "--cluster",
        "1x4xA100-80GB",
        "--dim",
        "seq=16",
        "--global-batch",
        "2",
        "--microbatch-sizes",
        "2",
        "--tp",
        &tp,
        "--pp",
        "2",
        "--dp",
        "1",
        "--out",
        plan.to_str().unwrap(),
    ];
    if sequence_parallel {
        args.push("--sequence-parallel");
    }
    pipecut(&args);
    let table = pipecut(&[
        "export",
        plan.to_str().unwrap(),
        model_arg,
        "--out-dir",
        out_dir.to_str().unwrap(),
    ]);
    assert!(table.contains("stage_1.rank_1.onnx"), "{table}");
    assert_eq!(
        table.contains("ReduceScatter"),
        sequence_parallel,
        "{table}"
    );

    let graph = typed(&model);
    let weights = Weights::load(&model, &graph).unwrap();
    let inputs = seeded_inputs(&graph, 1, 3).unwrap();
    let whole = CpuExecutor::new(&graph, &weights)
        .run_model(&inputs)
        .unwrap();

    let files: Vec<Vec<Vec<u8>>> = (0..2)
        .map(|stage| {
            (0..degree as usize)
                .map(|rank| {
                    let file = out_dir.join(pipecut::onnx::export::rank_file_name(stage, rank));
                    std::fs::read(file).unwrap()
                })
                .collect()
        })
        .collect();
    let ranks =
        pipecut::runtime::tensor_parallel::LoadedRanks::load(&files, &out_dir, &bindings(&graph))
            .unwrap();
    let mut tensors = inputs.clone();
    for stage in ranks.executors() {
        let outputs = run_ranks(&stage, &tensors).unwrap();
        tensors.extend(outputs);
    }
    let split: Tensors = whole
        .keys()
        .map(|k| (k.clone(), tensors[k].clone()))
        .collect();
    assert_close(&whole, &split, &format!("{name} exported at t = {degree}"));
}

#[test]
fn exported_rank_files_of_gpt2_and_llama_run_together_as_the_whole_model() {
    exported_ranks_reproduce("gpt2_tiny", 2, false);
    exported_ranks_reproduce("llama_tiny", 2, false);
}

#[test]
fn exported_sequence_parallel_rank_files_run_together_as_the_whole_model() {
    exported_ranks_reproduce("gpt2_tiny", 2, true);
    exported_ranks_reproduce("bert_tiny", 2, true);
}

#[test]
fn run_on_a_tensor_parallel_plan_gives_the_unsplit_runs_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::fixture("gpt2_tiny");
    let model_arg = model.to_str().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    pipecut(&[
        "plan-cluster",
        model_arg,
        "--cluster",
        "1x4xA100-80GB",
        "--dim",
        "seq=16",
        "--global-batch",
        "8",
        "--microbatch-sizes",
        "4",
        "--tp",
        "2",
        "--pp",
        "2",
        "--dp",
        "1",
        "--out",
        &path("tp.json"),
    ]);
    pipecut(&[
        "partition",
        model_arg,
        "--dim",
        "batch=4",
        "--dim",
        "seq=16",
        "--cluster",
        "1x2xA100-80GB",
        "--stages",
        "2",
        "--out",
        &path("plain.json"),
    ]);
    for plan in ["tp", "plain"] {
        pipecut(&[
            "run",
            &path(&format!("{plan}.json")),
            model_arg,
            "--microbatches",
            "2",
            "--output-dir",
            &path(plan),
        ]);
    }
    let read = |plan: &str| {
        let file = std::path::PathBuf::from(format!("{}/logits.npy", path(plan)));
        pipecut::runtime::read_npy(&file).unwrap().tensor
    };
    let (tp, plain) = (read("tp"), read("plain"));
    let whole: Tensors = [("logits".to_string(), std::sync::Arc::new(plain))].into();
    let split: Tensors = [("logits".to_string(), std::sync::Arc::new(tp))].into();
    assert_close(&whole, &split, "pipecut run at t = 2");

    // Across processes the plan takes t · K · D = 4 ranks (tests/distributed.rs runs them): a
    // job of 2, one rank per stage as a plan without tensor parallelism would have, is refused
    // in one line rather than run with every block whole.
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_pipecut"))
        .args(["run", &path("tp.json"), model_arg, "--distributed"])
        .args(["--output-dir", &path("refused")])
        .envs([
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "0"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29999"),
        ])
        .current_dir(common::root())
        .output()
        .expect("the pipecut binary runs");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert!(
        err.contains("2 tensor-parallel rank(s) × 2 stage(s) × 1 replica(s) = 4 ranks")
            && err.contains("started 2"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn the_plan_lists_each_gpus_rank_and_weight_slices_and_check_rederives_them() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::fixture("gpt2_tiny");
    let model_arg = model.to_str().unwrap();
    let plan_path = dir.path().join("plan.json");
    let plan_arg = plan_path.to_str().unwrap();
    pipecut(&[
        "plan-cluster",
        model_arg,
        "--cluster",
        "2x4xA100-80GB",
        "--dim",
        "seq=16",
        "--global-batch",
        "16",
        "--tp",
        "4",
        "--pp",
        "1",
        "--dp",
        "2",
        "--out",
        plan_arg,
    ]);
    let text = std::fs::read_to_string(&plan_path).unwrap();
    let plan: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(plan["schema_version"], pipecut::plan::SCHEMA_VERSION);
    let shards = &plan["parallelism"]["shards"][0];
    assert_eq!(shards["split_blocks"].as_array().unwrap().len(), 8);
    let ranks = shards["ranks"].as_array().unwrap();
    // Rank r of the one stage sits on GPU r of each replica's group (GPUs 0–3 and 4–7).
    for (r, rank) in ranks.iter().enumerate() {
        assert_eq!(rank["tp_rank"], r);
        assert_eq!(rank["devices"], serde_json::json!([r, r + 4]));
        // The first query weight, 64 × 64 split by columns: 16 columns each.
        let query = &rank["weights"][0];
        assert_eq!(query["axis"], 1);
        assert_eq!(query["ranges"], serde_json::json!([[16 * r, 16 * (r + 1)]]));
    }
    // A hand-edited slice is a figure `check` re-derives and refuses.
    let mut edited = plan.clone();
    edited["parallelism"]["shards"][0]["ranks"][1]["weights"][0]["ranges"][0][0] = 0.into();
    let edited = serde_json::to_string_pretty(&edited).unwrap();
    let edited_path = dir.path().join("edited.json");
    std::fs::write(&edited_path, edited).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pipecut"))
        .args(["check", edited_path.to_str().unwrap(), model_arg])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("shards"),
        "{stderr}"
    );
}

/// A plan edited to a tensor-parallel degree its cluster cannot hold (a group crossing nodes, more
/// GPUs than the cluster has, `u32::MAX`) is refused in one line by `check`, `export` and `run`:
/// it panicked in the all-reduce cost of a device beyond the cluster.
#[test]
fn a_tensor_parallel_degree_beyond_the_cluster_is_refused_by_check_export_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::fixture("gpt2_tiny");
    let model_arg = model.to_str().unwrap();
    let plan_path = dir.path().join("plan.json");
    pipecut(&[
        "plan-cluster",
        model_arg,
        "--cluster",
        "2x4xA100-80GB",
        "--dim",
        "seq=16",
        "--global-batch",
        "4",
        "--microbatch-sizes",
        "2",
        "--tp",
        "2",
        "--pp",
        "2",
        "--out",
        plan_path.to_str().unwrap(),
    ]);
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan_path).unwrap()).unwrap();
    for degree in [3u64, 9, u32::MAX as u64] {
        let mut edited = plan.clone();
        edited["parallelism"]["tensor_parallel"]["degree"] = degree.into();
        // The blocks' cut constraint edited alike, else check refuses the mismatch first.
        edited["config"]["cut_constraints"]["tensor_parallel_blocks"] = degree.into();
        let edited_path = dir.path().join(format!("tp{degree}.json"));
        std::fs::write(&edited_path, edited.to_string()).unwrap();
        let edited_arg = edited_path.to_str().unwrap();
        let out_dir = dir.path().join(format!("export{degree}"));
        for args in [
            vec!["check", edited_arg, model_arg],
            vec![
                "export",
                edited_arg,
                model_arg,
                "--out-dir",
                out_dir.to_str().unwrap(),
            ],
            vec!["run", edited_arg, model_arg],
        ] {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_pipecut"))
                .args(&args)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
            assert!(
                stderr.contains("not inside one node") && !stderr.contains("panicked"),
                "{args:?}: {stderr}"
            );
            assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        }
    }
}

/// A Gemm MLP as older exporters write it (opset 9, where a Gemm's bias is required): a column
/// Gemm with its weight untransposed and a row Gemm with `transB = 1` and `beta = 0.5`, whose
/// bias each rank must leave out and the sum get once, scaled.
#[test]
fn an_opset_9_gemm_mlp_with_a_scaled_bias_split_two_ways_equals_the_whole_model() {
    use onnx_protobuf::attribute_proto::AttributeType;
    use onnx_protobuf::{
        AttributeProto, GraphProto, Message, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    };
    let value_info = |name: &str, dims: &[i64]| common::tensor_value_info(name, 1, dims);
    let weight = |name: &str, dims: &[i64], seed: f32| TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: 1,
        float_data: (0..dims.iter().product::<i64>())
            .map(|i| ((i as f32 * 0.37 + seed).sin()) * 0.5)
            .collect(),
        ..Default::default()
    };
    let attr = |name: &str, i: i64, f: f32, float: bool| AttributeProto {
        name: name.into(),
        i,
        f,
        type_: if float {
            AttributeType::FLOAT
        } else {
            AttributeType::INT
        }
        .into(),
        ..Default::default()
    };
    let node = |name: &str, op: &str, inputs: &[&str], output: &str, attribute| NodeProto {
        name: name.into(),
        op_type: op.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        attribute,
        ..Default::default()
    };
    let graph = GraphProto {
        name: "mlp9".into(),
        node: vec![
            node("up", "Gemm", &["x", "w1", "b1"], "h", vec![]),
            node("act", "Relu", &["h"], "a", vec![]),
            node(
                "down",
                "Gemm",
                &["a", "w2", "b2"],
                "y",
                vec![attr("transB", 1, 0.0, false), attr("beta", 0, 0.5, true)],
            ),
        ],
        initializer: vec![
            weight("w1", &[6, 8], 0.1),
            weight("b1", &[8], 0.2),
            weight("w2", &[5, 8], 0.3),
            weight("b2", &[1, 5], 0.4),
        ],
        input: vec![value_info("x", &[3, 6])],
        output: vec![value_info("y", &[3, 5])],
        ..Default::default()
    };
    let model = ModelProto {
        ir_version: 4,
        opset_import: vec![OperatorSetIdProto {
            version: 9,
            ..Default::default()
        }],
        graph: Some(graph).into(),
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mlp9.onnx");
    std::fs::write(&path, model.write_to_bytes().unwrap()).unwrap();
    reproduces(&path, 2, 1, 0);
}

/// gpt2_tiny copied into `dir` with every initializer of 1 KiB or more moved to `model.data`
/// (as `onnx.save_model(..., save_as_external_data=True)` writes it).
fn with_external_weights(dir: &Path) -> std::path::PathBuf {
    use onnx_protobuf::tensor_proto::DataLocation;
    use onnx_protobuf::{Message, ModelProto, StringStringEntryProto};
    let bytes = std::fs::read(common::fixture("gpt2_tiny")).unwrap();
    let mut model = ModelProto::parse_from_bytes(&bytes).unwrap();
    let mut data = Vec::new();
    for init in &mut model.graph.as_mut().unwrap().initializer {
        if init.raw_data.len() < 1024 {
            continue;
        }
        let entry = |key: &str, value: String| StringStringEntryProto {
            key: key.into(),
            value,
            ..Default::default()
        };
        init.external_data = vec![
            entry("location", "model.data".into()),
            entry("offset", data.len().to_string()),
            entry("length", init.raw_data.len().to_string()),
        ];
        data.extend(std::mem::take(&mut init.raw_data));
        init.data_location = DataLocation::EXTERNAL.into();
    }
    assert!(data.len() > 100_000, "gpt2_tiny's weights are raw data");
    std::fs::write(dir.join("model.data"), data).unwrap();
    let path = dir.join("model.onnx");
    std::fs::write(&path, model.write_to_bytes().unwrap()).unwrap();
    path
}

#[test]
fn rank_files_of_a_model_with_external_weights_keep_their_slices_external_and_equal_the_whole_model(
) {
    use onnx_protobuf::Message;
    let dir = tempfile::tempdir().unwrap();
    let model = with_external_weights(dir.path());
    let model_arg = model.to_str().unwrap();
    let plan = dir.path().join("plan.json");
    let out_dir = dir.path().join("stages");
    pipecut(&[
        "plan-cluster",
        model_arg,
        "--cluster",
        "1x4xA100-80GB",
        "--dim",
        "seq=16",
        "--global-batch",
        "2",
        "--microbatch-sizes",
        "2",
        "--tp",
        "2",
        "--pp",
        "2",
        "--dp",
        "1",
        "--out",
        plan.to_str().unwrap(),
    ]);
    pipecut(&[
        "export",
        plan.to_str().unwrap(),
        model_arg,
        "--out-dir",
        out_dir.to_str().unwrap(),
    ]);
    let mut files = Vec::new();
    for stage in 0..2 {
        let mut ranks = Vec::new();
        for rank in 0..2u64 {
            let name = pipecut::onnx::export::rank_file_name(stage, rank as usize);
            let bytes = std::fs::read(out_dir.join(&name)).unwrap();
            let proto = onnx_protobuf::ModelProto::parse_from_bytes(&bytes).unwrap();
            // Every weight is external: the slices in the rank's own file, the rest in the
            // model's (copied beside the stages); the rank file holds only small constants.
            let data_name = pipecut::onnx::export::shard::rank_data_name(stage, rank);
            let sliced: Vec<_> = proto
                .graph
                .initializer
                .iter()
                .filter(|i| i.name.contains(".tp2"))
                .filter(|i| i.dims.iter().product::<i64>() >= 256)
                .collect();
            assert!(!sliced.is_empty(), "{name}");
            for init in sliced {
                assert!(init.raw_data.is_empty(), "{name}: {} inline", init.name);
                assert_eq!(init.external_data[0].value, data_name, "{}", init.name);
            }
            assert!(out_dir.join(&data_name).exists(), "{data_name}");
            assert!(bytes.len() < 40_000, "{name} is {} bytes", bytes.len());
            ranks.push(bytes);
        }
        files.push(ranks);
    }

    // pipecut's runtime: the ranks, stage after stage, give the whole model's outputs.
    let graph = typed(&model);
    let weights = Weights::load(&model, &graph).unwrap();
    let inputs = seeded_inputs(&graph, 1, 5).unwrap();
    let whole = CpuExecutor::new(&graph, &weights)
        .run_model(&inputs)
        .unwrap();
    let declared = pipecut::onnx::load_model(&model).unwrap().graph;
    let ranks = pipecut::runtime::tensor_parallel::LoadedRanks::load(
        &files,
        &out_dir,
        &bindings(&declared),
    )
    .unwrap();
    let mut tensors = inputs.clone();
    for stage in ranks.executors() {
        tensors.extend(run_ranks(&stage, &tensors).unwrap());
    }
    let split: Tensors = whole
        .keys()
        .map(|k| (k.clone(), tensors[k].clone()))
        .collect();
    assert_close(&whole, &split, "gpt2_tiny with external weights at t = 2");

    // onnx and onnxruntime read the rank files with their external data: onnx.checker passes
    // on the file, onnx's loaded slices are the model's, and onnxruntime opens a session on
    // each rank (its collectives made Identity, which onnxruntime can run) beside its data.
    let python = common::root().join(".venv/bin/python");
    if !python.exists() {
        common::skip(common::Need::Venv, "onnxruntime loading the rank files");
        return;
    }
    let script = r#"
import sys, numpy as np, onnx, onnx.numpy_helper as nh, onnxruntime as ort
out_dir, model_path = sys.argv[1], sys.argv[2]
whole = {t.name: nh.to_array(t) for t in onnx.load(model_path).graph.initializer}
checked = 0
for stage in range(2):
    for rank in range(2):
        path = f"{out_dir}/stage_{stage}.rank_{rank}.onnx"
        onnx.checker.check_model(path)
        m = onnx.load(path)
        for t in m.graph.initializer:
            base, _, kind = t.name.partition(".tp2")
            if kind == "" and base in whole and whole[base].ndim == 2 and whole[base].shape[1] % 2 == 0:
                w = whole[base]
                half = w.shape[1] // 2
                got = nh.to_array(t)
                if got.shape == (w.shape[0], half):
                    assert np.array_equal(got, w[:, rank * half:(rank + 1) * half]), t.name
                    checked += 1
        bare = onnx.load(path, load_external_data=False)
        for n in bare.graph.node:
            if n.domain == "ai.pipecut":
                n.op_type, n.domain = "Identity", ""
                del n.attribute[:]
        del bare.opset_import[[o.domain for o in bare.opset_import].index("ai.pipecut")]
        del bare.graph.value_info[:]
        probe = f"{out_dir}/probe_{stage}_{rank}.onnx"
        onnx.save(bare, probe)
        ort.InferenceSession(probe, providers=["CPUExecutionProvider"])
print("ok" if checked >= 8 else f"only {checked} column slices compared")
"#;
    let out = std::process::Command::new(python)
        .args(["-c", script])
        .arg(&out_dir)
        .arg(&model)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
}

/// The export reads a rank's slices from the model's data file by positioned reads, not a
/// memory map: a data file truncated while the export runs is a one-line error, where a map
/// took the process down with SIGBUS.
#[test]
fn a_data_file_truncated_during_an_export_is_an_error_not_a_signal() {
    use pipecut::graph::Storage;
    use pipecut::onnx::export::rank_data::{Cut, ExternalWeights};
    use pipecut::partition::tensor_shard::AxisSplit;
    let dir = tempfile::tempdir().unwrap();
    let model = with_external_weights(dir.path());
    let graph = pipecut::onnx::load_model(&model).unwrap().graph;
    let mut external: Vec<_> = graph
        .parameters()
        .filter_map(|(id, t)| match t.param().map(|p| &p.storage) {
            Some(Storage::External { offset, .. }) => Some((*offset, id)),
            _ => None,
        })
        .collect();
    external.sort();
    let (first, last) = (external[0].1, external[external.len() - 1].1);
    let whole = Cut {
        split: AxisSplit { axis: 0, groups: 1 },
        size: None,
        degree: 1,
        rank: 0,
        zero_row: false,
    };
    let mut weights = ExternalWeights::default();
    let sliced = weights.slice(&graph, first, whole, "first", None).unwrap();
    assert!(sliced.is_some_and(|proto| !proto.raw_data.is_empty()));
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("model.data"))
        .unwrap()
        .set_len(1024)
        .unwrap();
    let err = weights
        .slice(&graph, last, whole, "last", None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("shorter than its reference"), "{err}");
    assert!(!err.contains('\n'), "{err}");
}
