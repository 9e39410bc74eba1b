//! The model graph coloured by stage, as Graphviz DOT: one cluster box per stage, labelled with
//! its device and time; edges that cross between stages drawn thick and red with the bytes they
//! carry per micro-batch. Graphviz (`dot -Tsvg`) turns it into a picture.
//!
//! Layout: the stages stand side by side, each drawn top to bottom. Cut edges do not constrain
//! the ranks, so the picture is as tall as the longest stage, not the whole model (a 4-layer
//! GPT-2 on 3 stages drew 9,420 pt tall as one column). Node boxes say the op, the layer (the
//! scope segments with an index, `h.2`) and the last scope, so nodes of different layers differ.

use std::collections::HashMap;
use std::fmt::Write;

use super::Plan;
use crate::Error;
use pipecut_ir::graph::Graph;
use pipecut_ir::onnx::inspect::human_bytes;

/// Fill colours per stage (Tableau 10, lightened), cycling past ten stages.
const STAGE_COLOURS: [&str; 10] = [
    "#c6dbef", "#fdd0a2", "#c7e9c0", "#fcbba1", "#dadaeb", "#d9d9d9", "#fde0ef", "#e5f5e0",
    "#fff7bc", "#d0d1e6",
];
const CUT_COLOUR: &str = "#d62728";

/// A DOT quoted string: quotes and backslashes escaped.
fn quote(text: &str) -> String {
    quote_lines(&[text])
}

/// A DOT quoted string of several lines (joined by DOT's `\n`, which escaping would break).
fn quote_lines(lines: &[&str]) -> String {
    let escaped: Vec<String> = lines
        .iter()
        .map(|l| {
            // Control characters (a newline in a hostile name would end the statement) are
            // shown as escapes; quotes and backslashes escaped as DOT wants.
            l.chars()
                .flat_map(|c| -> Vec<char> {
                    match c {
                        '\\' => vec!['\\', '\\'],
                        '"' => vec!['\\', '"'],
                        c if c.is_control() => {
                            std::iter::once('\\').chain(c.escape_unicode()).collect()
                        }
                        c => vec![c],
                    }
                })
                .collect::<String>()
        })
        .collect();
    format!("\"{}\"", escaped.join("\\n"))
}

/// Draws `graph` with the stages of `plan`. Every node must be on a stage of the plan (run
/// [`Plan::check`] first for the full validation).
pub fn plan_dot(plan: &Plan, graph: &Graph) -> Result<String, Error> {
    let stage_of_name: HashMap<&str, usize> = plan
        .stages
        .iter()
        .enumerate()
        .flat_map(|(s, stage)| stage.nodes.iter().map(move |n| (n, s)))
        .collect();
    let sent_bytes: HashMap<(&str, usize), u64> = plan
        .stages
        .iter()
        .enumerate()
        .flat_map(|(s, stage)| {
            stage
                .sent
                .iter()
                .map(move |t| ((t.tensor.as_str(), s), t.bytes))
        })
        .collect();
    let mut stage_of = HashMap::new();
    for (id, node) in graph.nodes() {
        let stage = stage_of_name.get(node.name.as_str()).ok_or_else(|| {
            Error::InvalidPlan(format!("node '{}' is on no stage of the plan", node.name))
        })?;
        stage_of.insert(id, *stage);
    }

    let mut dot = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(dot, "digraph {} {{", quote(graph.name()));
    let _ = writeln!(
        dot,
        "  rankdir=TB; ranksep=0.18; nodesep=0.12; fontname=\"sans-serif\";\n  node [shape=box, style=\"rounded,filled\", fontname=\"sans-serif\", fontsize=9, height=0.3, margin=\"0.06,0.02\"];\n  edge [color=\"#888888\", arrowsize=0.5, fontname=\"sans-serif\", fontsize=8];"
    );
    for (s, stage) in plan.stages.iter().enumerate() {
        let colour = STAGE_COLOURS[s % STAGE_COLOURS.len()];
        let _ = writeln!(dot, "  subgraph cluster_stage_{s} {{");
        let _ = writeln!(
            dot,
            "    label={}; style=\"rounded,filled\"; fillcolor=\"{colour}40\"; color=\"{colour}\";",
            quote(&format!(
                "stage {s} · {} · {:.3} ms · {}",
                stage.device.name,
                stage.stage_secs * 1e3,
                human_bytes(stage.peak_memory_bytes)
            ))
        );
        for (id, node) in graph.nodes().filter(|(id, _)| stage_of[id] == s) {
            let _ = writeln!(
                dot,
                "    n{} [label={}, tooltip={}, fillcolor=\"{colour}\"];",
                id.index(),
                quote_lines(&[&node.op_type, &short_name(&node.name)]),
                quote(&node.name)
            );
        }
        let _ = writeln!(dot, "  }}");
    }
    for (from, to, tensor) in graph.edges() {
        let (a, b) = (stage_of[&from], stage_of[&to]);
        let name = &graph.tensor(tensor).name;
        if a == b {
            let _ = writeln!(dot, "  n{} -> n{};", from.index(), to.index());
        } else {
            // Relayed tensors are sent by every stage they pass; the first hop carries the
            // same bytes as the others.
            let label = sent_bytes
                .get(&(name.as_str(), a))
                .map(|&bytes| human_bytes(bytes))
                .unwrap_or_default();
            let _ = writeln!(
                dot,
                "  n{} -> n{} [color=\"{CUT_COLOUR}\", penwidth=2.5, constraint=false, label={}, tooltip={}];",
                from.index(),
                to.index(),
                quote(&label),
                quote(name)
            );
        }
    }
    let _ = writeln!(dot, "}}");
    Ok(dot)
}

/// An exporter's scoped name shortened for a box: the segments with an index in them (the
/// layer, `layers.3`) and the last two (`/model/layers.3/self_attn/q_proj/MatMul` →
/// `layers.3/…/q_proj/MatMul`). Without the layer, the boxes of every layer read the same.
fn short_name(name: &str) -> String {
    let parts: Vec<&str> = name.split('/').filter(|p| !p.is_empty()).collect();
    let n = parts.len();
    if n <= 2 {
        return parts.join("/");
    }
    let mut kept: Vec<&str> = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let keep = i + 2 >= n || part.chars().any(|c| c.is_ascii_digit());
        if keep {
            kept.push(part);
        } else if kept.last() != Some(&"…") && !kept.is_empty() {
            kept.push("…");
        }
    }
    kept.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_keep_the_last_two_scopes() {
        assert_eq!(
            short_name("/model/layers.3/attn/MatMul"),
            "layers.3/attn/MatMul"
        );
        assert_eq!(
            short_name("/model/layers.3/self_attn/q_proj/MatMul"),
            "layers.3/…/q_proj/MatMul"
        );
        assert_eq!(
            short_name("/transformer/h.0/attn/c_attn/Gemm"),
            "h.0/…/c_attn/Gemm"
        );
        assert_eq!(short_name("/ln_f/Add"), "ln_f/Add");
        assert_eq!(short_name("Gemm_0"), "Gemm_0");
        assert_eq!(short_name(""), "");
    }

    #[test]
    fn quoting_escapes_quotes_and_backslashes() {
        assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(quote_lines(&["Gemm", "x"]), r#""Gemm\nx""#);
    }
}
