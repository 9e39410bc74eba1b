//! `plan-cluster`: the search's choice against exhaustive enumeration, and its plan through
//! `check`.

mod common;

use std::process::Command;

use pipecut::cost::{Catalog, Cluster, Mode, Schedule};
use pipecut::onnx::shape::{DimBindings, ShapeInference};
use pipecut::partition::parallelism::{
    evaluate, search, ConfigurationKey, Placement, SearchRequest,
};

fn pipecut(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pipecut"))
        .args(args)
        .current_dir(common::root())
        .output()
        .expect("the pipecut binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every configuration of a small cluster, solved one by one: the search's choice is at least
/// as fast as each (it may skip them, never beat itself with one it skipped).
#[test]
fn search_is_never_worse_than_any_enumerated_configuration() {
    let model = pipecut::onnx::load_model(common::fixture("gpt2_tiny")).unwrap();
    let cluster = Cluster::parse("2x2xA100-80GB", &Catalog::builtin()).unwrap();
    for mode in [Mode::Inference, Mode::training()] {
        let mut request = SearchRequest::new(16, mode);
        request.bindings = DimBindings::new().bind("seq", 32);
        let outcome = search(&model.graph, &cluster, &request).unwrap();
        assert!(outcome.complete);
        let best = outcome.best.samples_per_sec;

        let mut enumerated = 0;
        for b in [1u64, 2, 4, 8, 16] {
            let mut graph = model.graph.clone();
            ShapeInference::new(request.bindings.clone().bind("batch", b))
                .run(&mut graph)
                .unwrap();
            for d in 1..=4usize {
                if 16 % (d as u64 * b) != 0 {
                    continue;
                }
                for k in (1..=4usize).filter(|k| k * d <= 4) {
                    for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
                        for placement in [
                            Placement::PipelineInsideNodes,
                            Placement::ReplicasInsideNodes,
                        ] {
                            let key = ConfigurationKey {
                                stages: k,
                                data_parallel: d,
                                microbatch_size: b,
                                microbatches: 16 / (d as u64 * b),
                                schedule,
                                placement,
                            };
                            if let Some(config) = evaluate(&graph, &cluster, &request, key).unwrap()
                            {
                                enumerated += 1;
                                assert!(
                                    best >= config.samples_per_sec * (1.0 - 1e-12),
                                    "{mode:?}: search chose {:?} at {best} samples/s but {key:?} gives {}",
                                    outcome.best.key,
                                    config.samples_per_sec
                                );
                            }
                        }
                    }
                }
            }
        }
        assert!(enumerated > 50, "{enumerated}");
        // The ranked list starts with the choice and is sorted.
        assert_eq!(outcome.ranked[0], outcome.best);
        assert!(outcome
            .ranked
            .windows(2)
            .all(|w| w[0].samples_per_sec >= w[1].samples_per_sec));
    }
}

#[test]
fn training_pays_for_the_all_reduce_and_inference_does_not() {
    let model = pipecut::onnx::load_model(common::fixture("gpt2_tiny")).unwrap();
    let cluster = Cluster::parse("2x2xA100-80GB", &Catalog::builtin()).unwrap();
    let mut graph = model.graph.clone();
    ShapeInference::new(DimBindings::new().bind("seq", 32).bind("batch", 2))
        .run(&mut graph)
        .unwrap();
    let key = ConfigurationKey {
        stages: 2,
        data_parallel: 2,
        microbatch_size: 2,
        microbatches: 4,
        schedule: Schedule::OneFOneB,
        placement: Placement::PipelineInsideNodes,
    };
    let inference = evaluate(
        &graph,
        &cluster,
        &SearchRequest::new(16, Mode::Inference),
        key,
    )
    .unwrap()
    .unwrap();
    assert!(inference.allreduce_secs.iter().all(|&t| t == 0.0));
    let training = evaluate(
        &graph,
        &cluster,
        &SearchRequest::new(16, Mode::training()),
        key,
    )
    .unwrap()
    .unwrap();
    // Pipelines inside nodes: each stage's ring of 2 replicas crosses the network.
    assert!(training.allreduce_secs.iter().all(|&t| t > 0.0));
    assert!(training.step_secs >= training.pipeline_secs);
    assert!(
        (training.samples_per_sec - 16.0 / training.step_secs).abs()
            < 1e-9 * training.samples_per_sec
    );
}

#[test]
fn plan_cluster_writes_a_plan_that_check_accepts_and_guards_its_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let plan_path = dir.path().join("plan.json");
    let plan_arg = plan_path.to_str().unwrap();
    let model = "fixtures/models/gpt2_tiny.onnx";
    let (code, out, err) = pipecut(&[
        "plan-cluster",
        model,
        "--cluster",
        "2x4xA100-80GB",
        "--global-batch",
        "64",
        "--dim",
        "seq=32",
        "--mode",
        "training",
        "--out",
        plan_arg,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("samples/s") && out.contains("◀"), "{out}");
    let (code, _, err) = pipecut(&["check", plan_arg, model]);
    assert_eq!(code, 0, "{err}");

    let text = std::fs::read_to_string(&plan_path).unwrap();
    let mut plan: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(plan["schema_version"], pipecut::plan::SCHEMA_VERSION);
    let parallelism = &plan["parallelism"];
    let replicas = parallelism["data_parallel"].as_u64().unwrap();
    let stages = plan["stages"].as_array().unwrap().len() as u64;
    assert!(replicas * stages <= 8);
    assert_eq!(
        parallelism["replicas"].as_array().unwrap().len() as u64,
        replicas
    );
    assert_eq!(
        parallelism["global_batch"].as_u64().unwrap(),
        replicas
            * parallelism["microbatch_size"].as_u64().unwrap()
            * plan["config"]["microbatches"].as_u64().unwrap()
    );

    // Issue 21: `check` re-derives the parallelism section's figures too.
    assert!(replicas >= 2, "the fixture is small enough to replicate");
    assert!(parallelism["allreduce_secs"][0].as_f64().unwrap() > 0.0);
    for (field, index) in [
        ("step_secs", None),
        ("samples_per_sec", None),
        ("allreduce_secs", Some(0)),
    ] {
        let mut edited = plan.clone();
        let value = match index {
            None => &mut edited["parallelism"][field],
            Some(i) => &mut edited["parallelism"][field][i],
        };
        *value = serde_json::json!(value.as_f64().unwrap() * 0.5);
        let bad = dir.path().join(format!("edited_{field}.json"));
        std::fs::write(&bad, serde_json::to_string_pretty(&edited).unwrap()).unwrap();
        let (code, _, err) = pipecut(&["check", bad.to_str().unwrap(), model]);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains(&format!("parallelism {field}")),
            "{field}: {err}"
        );
    }

    // A replica on a device that another replica already uses.
    {
        plan["parallelism"]["replicas"][1] = plan["parallelism"]["replicas"][0].clone();
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, serde_json::to_string_pretty(&plan).unwrap()).unwrap();
        let (code, _, err) = pipecut(&["check", bad.to_str().unwrap(), model]);
        assert_ne!(code, 0);
        assert!(err.contains("used by two replicas"), "{err}");
    }
}

#[test]
fn binding_the_batch_dim_is_refused() {
    let (code, _, err) = pipecut(&[
        "plan-cluster",
        "fixtures/models/gpt2_tiny.onnx",
        "--cluster",
        "1x2xL4",
        "--global-batch",
        "8",
        "--dim",
        "batch=4",
        "--dim",
        "seq=16",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("binds the batch dim"), "{err}");
}

/// Issue 21: `plan-cluster --dtype bf16` costs the model at bf16 (half the fp32 file's gradient
/// bytes, so half the all-reduce bytes), records it, and `check` re-derives the plan at it.
#[test]
fn plan_cluster_costs_at_the_dtype_asked_for_and_check_agrees() {
    let dir = tempfile::tempdir().unwrap();
    let model = "fixtures/models/gpt2_tiny.onnx";
    let plan_at = |dtype: Option<&str>| -> serde_json::Value {
        let out = dir
            .path()
            .join(format!("plan_{}.json", dtype.unwrap_or("file")));
        let out_arg = out.to_str().unwrap().to_string();
        let mut args = vec![
            "plan-cluster",
            model,
            "--cluster",
            "1x4xA100-80GB",
            "--global-batch",
            "32",
            "--microbatch-sizes",
            "8",
            "--schedule",
            "1f1b",
            "--dim",
            "seq=32",
            "--mode",
            "training",
            "--out",
            &out_arg,
        ];
        if let Some(dtype) = dtype {
            args.extend(["--dtype", dtype]);
        }
        let (code, _, err) = pipecut(&args);
        assert_eq!(code, 0, "{err}");
        let (code, _, err) = pipecut(&["check", &out_arg, model]);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap()
    };
    let fp32 = plan_at(None);
    let bf16 = plan_at(Some("bf16"));
    assert_eq!(bf16["config"]["dtype_override"], "bf16");
    assert!(fp32["config"].get("dtype_override").is_none());
    // The same plan read as costed at the file's fp32 no longer checks: its figures are bf16's.
    let mut as_fp32 = bf16.clone();
    as_fp32["config"]
        .as_object_mut()
        .unwrap()
        .remove("dtype_override");
    let edited = dir.path().join("bf16_as_fp32.json");
    std::fs::write(&edited, serde_json::to_string_pretty(&as_fp32).unwrap()).unwrap();
    let (code, _, err) = pipecut(&["check", edited.to_str().unwrap(), model]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("activation_bytes is"), "{err}");
}
