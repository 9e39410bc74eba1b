//! `pipecut show`: the schedule timeline and the stage-coloured graph, read back as the files a
//! browser or Graphviz would get.

mod common;

use std::path::Path;
use std::process::Command;

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

const MODEL: &str = "fixtures/models/gpt2_tiny.onnx";

/// A 3-stage training plan for the GPT-2 fixture (training, so the timeline has backwards).
fn plan(dir: &Path) -> String {
    let path = dir.join("plan.json");
    let (code, _, err) = pipecut(&[
        "partition",
        MODEL,
        "--dim",
        "batch=4",
        "--dim",
        "seq=16",
        "--cluster",
        "1x3xL4",
        "--stages",
        "3",
        "--mode",
        "training",
        "--microbatches",
        "6",
        "--out",
        path.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    path.to_str().unwrap().to_string()
}

#[test]
fn timeline_is_well_formed_svg_with_one_row_per_stage() {
    let dir = tempfile::tempdir().unwrap();
    let plan = plan(dir.path());
    let svg_path = dir.path().join("timeline.svg");
    let (code, out, err) = pipecut(&["show", &plan, "--timeline", svg_path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("simulated step") && out.contains("wrote"),
        "{out}"
    );
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("the timeline is well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let texts: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .collect();
    // Rows name the stage and its GPU; the axis under them is in ms.
    let rows = texts
        .iter()
        .filter(|t| t.starts_with("stage ") && t.contains(" · GPU "))
        .count();
    assert_eq!(rows, 3, "{texts:?}");
    assert!(texts.contains(&"time (ms)"), "{texts:?}");
    // Training: 6 forwards and 6 backwards on each of the 3 rows.
    assert_eq!(texts.iter().filter(|t| t.starts_with('F')).count(), 18);
    assert_eq!(texts.iter().filter(|t| t.starts_with('B')).count(), 18);
}

#[test]
fn graph_dot_has_a_cluster_per_stage_and_marks_the_cuts() {
    let dir = tempfile::tempdir().unwrap();
    let plan_path = plan(dir.path());
    let dot_path = dir.path().join("graph.dot");
    let (code, _, err) = pipecut(&[
        "show",
        &plan_path,
        MODEL,
        "--graph",
        dot_path.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let dot = std::fs::read_to_string(&dot_path).unwrap();
    assert!(dot.starts_with("digraph") && dot.trim_end().ends_with('}'));
    assert_eq!(dot.matches("subgraph cluster_stage_").count(), 3);
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan_path).unwrap()).unwrap();
    let nodes = plan["model"]["nodes"].as_u64().unwrap() as usize;
    assert_eq!(dot.matches(" [label=").count(), nodes, "one box per node");
    // Every cut edge is drawn red; there is at least one per boundary.
    assert!(dot.matches("#d62728").count() >= 2, "{dot}");
    // Braces balance: Graphviz would reject the file otherwise.
    assert_eq!(dot.matches('{').count(), dot.matches('}').count());
}

#[test]
fn graph_svg_renders_through_graphviz_or_says_it_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let plan_path = plan(dir.path());
    let svg_path = dir.path().join("graph.svg");
    let (code, _, err) = pipecut(&[
        "show",
        &plan_path,
        MODEL,
        "--graph",
        svg_path.to_str().unwrap(),
    ]);
    let graphviz = Command::new("dot").arg("-V").output().is_ok();
    if graphviz {
        assert_eq!(code, 0, "{err}");
        let svg = std::fs::read_to_string(&svg_path).unwrap();
        // Graphviz starts its SVG with a DOCTYPE, which roxmltree rejects unless told to allow it.
        let options = roxmltree::ParsingOptions {
            allow_dtd: true,
            ..Default::default()
        };
        let doc = roxmltree::Document::parse_with_options(&svg, options)
            .expect("Graphviz wrote well-formed SVG");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
    } else {
        common::skip(
            common::Need::Graphviz,
            "Graphviz is not installed: checked the message instead of the SVG",
        );
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("Graphviz `dot` is not installed"), "{err}");
        assert!(!svg_path.exists(), "no file is left behind");
    }
}

#[test]
fn graph_needs_the_model_and_a_known_extension() {
    let dir = tempfile::tempdir().unwrap();
    let plan_path = plan(dir.path());
    let (code, _, err) = pipecut(&["show", &plan_path, "--graph", "x.dot"]);
    assert_eq!(code, 2);
    assert!(err.contains("--graph needs the model"), "{err}");
    let (code, _, err) = pipecut(&["show", &plan_path, MODEL, "--graph", "x.bmp"]);
    assert_eq!(code, 2);
    assert!(err.contains(".dot, .svg or .png"), "{err}");
}

#[test]
fn a_timeline_is_refused_under_a_name_that_is_not_svg() {
    // SVG written into a .png opens as a broken image: refuse before writing anything.
    let dir = tempfile::tempdir().unwrap();
    let plan_path = plan(dir.path());
    let png = dir.path().join("timeline.png");
    let (code, _, err) = pipecut(&["show", &plan_path, "--timeline", png.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("must end in .svg"), "{err}");
    assert!(!png.exists(), "nothing is written");
}

#[test]
fn the_graph_keeps_layer_indices_and_stands_stages_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let plan_path = plan(dir.path());
    let dot_path = dir.path().join("graph.dot");
    let (code, _, err) = pipecut(&[
        "show",
        &plan_path,
        MODEL,
        "--graph",
        dot_path.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let dot = std::fs::read_to_string(&dot_path).unwrap();
    // Boxes of different layers differ: the layer index (h.0 … h.3) is in the labels.
    for layer in 0..4 {
        assert!(
            dot.contains(&format!("\\nh.{layer}/")),
            "no box names layer h.{layer}"
        );
    }
    // Cut edges do not stack the stages on top of each other.
    let cuts = dot.matches("#d62728").count();
    assert!(cuts >= 2);
    assert_eq!(dot.matches("constraint=false").count(), cuts, "{dot}");
    // Drawn by Graphviz, a 4-layer model is a page, not 9,420 pt of column.
    if Command::new("dot").arg("-V").output().is_err() {
        eprintln!("Graphviz is not installed: the drawn size of the graph is not checked");
        return;
    }
    let svg_path = dir.path().join("graph.svg");
    let (code, _, err) = pipecut(&[
        "show",
        &plan_path,
        MODEL,
        "--graph",
        svg_path.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let height_pt: f64 = svg
        .split("<svg")
        .nth(1)
        .and_then(|tag| tag.split("height=\"").nth(1))
        .and_then(|h| h.split("pt\"").next())
        .and_then(|h| h.parse().ok())
        .expect("the SVG states its height in pt");
    assert!(height_pt < 3000.0, "the graph is {height_pt} pt tall");
}

#[test]
fn show_names_each_stages_tensor_parallel_group() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plan.json");
    let plan = path.to_str().unwrap();
    let (code, _, err) = pipecut(&[
        "plan-cluster",
        MODEL,
        "--cluster",
        "1x4xA100-80GB",
        "--dim",
        "seq=16",
        "--global-batch",
        "8",
        "--tp",
        "2",
        "--pp",
        "2",
        "--dp",
        "1",
        "--sequence-parallel",
        "--out",
        plan,
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = pipecut(&["show", plan]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("each stage split over 2 GPUs, with sequence parallelism"),
        "{out}"
    );
    assert!(
        out.contains("stage 0: GPUs 0–1") && out.contains("stage 1: GPUs 2–3"),
        "{out}"
    );
    let (code, out, err) = pipecut(&["show", plan, "--json"]);
    assert_eq!(code, 0, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["tensor_parallel"]["degree"], 2);
    // A plan without tensor parallelism says nothing of it.
    let plain = self::plan(dir.path());
    let (_, out, _) = pipecut(&["show", &plain]);
    assert!(!out.contains("tensor parallelism"), "{out}");
}
