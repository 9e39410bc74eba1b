//! The functions the fuzzer drives, one per input format. Each takes raw bytes, runs them as far
//! through pipecut's library as they go, and returns a coarse description of where they stopped
//! (the fuzzer keeps inputs that stop somewhere new). Errors are the expected outcome; a panic,
//! a hang or an oversized allocation is a finding.
//!
//! Shared with `tests/fuzz_regressions.rs`, which replays every input the fuzzer ever found.

use std::time::Duration;

use pipecut::cost::{Catalog, Cluster, ClusterLayout, CostModel, DeviceId, UnknownOpCost};
use pipecut::graph::{Dim, Graph};
use pipecut::onnx::shape::{DimBindings, ShapeInference};
use pipecut::partition::{CostSettings, PartitionConfig, Planner, SolverChoice, StageCount};
use pipecut::plan::Plan;

/// The targets, by the name `fuzz/run.sh` takes.
pub const TARGETS: [&str; 4] = ["onnx", "plan", "cluster", "device"];

/// Where an input stopped: the phase, the error's variant, and the first few words of its
/// message that are plain lowercase words (names and numbers come from the input, so they are
/// left out: inputs failing the same way for different values count once).
pub fn outcome<T>(phase: &str, result: &Result<T, pipecut::Error>) -> String {
    match result {
        Ok(_) => format!("{phase}: ok"),
        Err(e) => {
            let debug = format!("{e:?}");
            let variant: String = debug.chars().take_while(|c| c.is_alphanumeric()).collect();
            // Quoted names come from the input and may hold quotes themselves: keep only what
            // precedes the first quote and follows the last.
            let text = e.to_string();
            let is_quote = |c: char| matches!(c, '\'' | '"' | '`');
            let unquoted = match (text.find(is_quote), text.rfind(is_quote)) {
                (Some(first), Some(last)) => format!("{} {}", &text[..first], &text[last + 1..]),
                _ => text,
            };
            let words: Vec<String> = unquoted
                .split_whitespace()
                .filter(|w| w.chars().all(|c| c.is_ascii_lowercase()))
                .take(6)
                .map(str::to_string)
                .collect();
            format!("{phase}: {variant}: {}", words.join(" "))
        }
    }
}

/// State built once per process: the built-in catalog and the model the plan target checks.
pub struct Fixtures {
    catalog: Catalog,
    plan_model: pipecut::onnx::Model,
}

impl Fixtures {
    /// `mlp_onnx` is the bytes of `fixtures/models/mlp.onnx`, the model the seed plans are for.
    pub fn new(mlp_onnx: &[u8]) -> Fixtures {
        Fixtures {
            catalog: Catalog::builtin(),
            plan_model: pipecut::onnx::load_model_from_bytes(mlp_onnx, None)
                .expect("mlp.onnx loads"),
        }
    }

    /// Runs one input through `target`; returns where it stopped.
    pub fn run(&self, target: &str, input: &[u8]) -> String {
        match target {
            "onnx" => self.onnx(input),
            "plan" => self.plan(input),
            "cluster" => self.cluster(input),
            "device" => self.device(input),
            other => panic!("unknown target '{other}'; targets: {TARGETS:?}"),
        }
    }

    /// Load, shape inference unbound and then with every input symbol bound, costs, and a
    /// two-stage partition: the whole planning pipeline on an untrusted model.
    fn onnx(&self, input: &[u8]) -> String {
        let loaded = pipecut::onnx::load_model_from_bytes(input, None);
        let mut model = match loaded {
            Ok(model) => model,
            Err(e) => return outcome::<()>("load", &Err(e)),
        };
        let mut unbound = model.graph.clone();
        let result = ShapeInference::default().run(&mut unbound);
        if result.is_err() {
            return outcome("infer", &result);
        }
        // Bind every symbolic input dim to a small size derived from the input, so that
        // constant folding sees concrete shapes too.
        let mut bindings = DimBindings::new();
        let mut symbols: Vec<String> = Vec::new();
        for &id in model.graph.inputs() {
            for dim in model.graph.tensor(id).shape.iter().flatten() {
                if let Dim::Sym(s) = dim {
                    symbols.extend(s.symbols().map(str::to_string));
                }
            }
        }
        symbols.sort();
        symbols.dedup();
        for (i, name) in symbols.iter().enumerate() {
            let size = 1 + (input.len() + i) as u64 % 7;
            bindings = bindings.bind(name, size);
        }
        let result = ShapeInference::new(bindings).run(&mut model.graph);
        if result.is_err() {
            return outcome("infer-bound", &result);
        }
        self.cost_and_partition(&model.graph)
    }

    fn cost_and_partition(&self, graph: &Graph) -> String {
        let device = self.catalog.device("H100-SXM").expect("built in");
        let costs = CostModel::new(device)
            .with_unknown_ops(UnknownOpCost::Bytes)
            .node_costs(graph);
        if costs.is_err() {
            return outcome("cost", &costs);
        }
        let cluster = Cluster::parse("1x2xH100-SXM", &self.catalog).expect("built in");
        let config = PartitionConfig {
            stages: StageCount::Fixed(2.min(graph.node_count())),
            devices: Vec::new(),
            settings: CostSettings {
                unknown_ops: UnknownOpCost::Bytes,
                ..CostSettings::default()
            },
            // The MILP too: a fuzzed graph should not crash or hang it either; the limit keeps
            // an execution short.
            solver: SolverChoice::Auto,
            time_limit: Duration::from_millis(200),
        };
        let solved = Planner::new(graph, &cluster).with_config(config).solve();
        outcome("partition", &solved)
    }

    /// Parse a plan and check it against mlp.onnx, bound with the plan's own dims.
    fn plan(&self, input: &[u8]) -> String {
        let text = String::from_utf8_lossy(input);
        let plan = match Plan::from_json(&text) {
            Ok(plan) => plan,
            Err(e) => return outcome::<()>("parse", &Err(e)),
        };
        let mut graph = self.plan_model.graph.clone();
        let mut bindings = DimBindings::new();
        for (name, value) in &plan.model.dims {
            bindings = bindings.bind(name, *value);
        }
        let inferred = ShapeInference::new(bindings).run(&mut graph);
        if inferred.is_err() {
            return outcome("infer", &inferred);
        }
        let checked = plan.check(&self.plan_model.sha256, &graph, &self.catalog);
        outcome("check", &checked)
    }

    /// The three ways to describe a cluster, then the link arithmetic on what they build.
    fn cluster(&self, input: &[u8]) -> String {
        let text = String::from_utf8_lossy(input);
        let mut outcomes = Vec::new();
        let built = [
            ("shorthand", Cluster::parse(&text, &self.catalog)),
            ("list", Cluster::from_device_list(&text, &self.catalog)),
            (
                "file",
                serde_json::from_str::<ClusterLayout>(&text)
                    .map_err(|e| pipecut::Error::Cluster {
                        spec: "<input>".into(),
                        detail: e.to_string(),
                    })
                    .and_then(|layout| {
                        Cluster::from_layout(&layout, &self.catalog, "<input>".into())
                    }),
            ),
        ];
        for (how, result) in built {
            if let Ok(cluster) = &result {
                exercise_cluster(cluster);
            }
            outcomes.push(outcome(how, &result));
        }
        outcomes.join(" | ")
    }

    /// A device or link profile added to the catalog, then used to cost mlp.onnx.
    fn device(&self, input: &[u8]) -> String {
        let text = String::from_utf8_lossy(input);
        let mut catalog = self.catalog.clone();
        if text.contains("pipecut-link-v1") {
            let added = catalog
                .add_link_json(&text, "<input>")
                .map(|l| l.transfer_secs(1 << 20));
            return outcome("link", &added);
        }
        let spec = match catalog.add_device_json(&text, "<input>") {
            Ok(spec) => spec.clone(),
            Err(e) => return outcome::<()>("device", &Err(e)),
        };
        let mut graph = self.plan_model.graph.clone();
        let inferred = ShapeInference::new(DimBindings::new().bind("batch", 8)).run(&mut graph);
        if inferred.is_err() {
            return outcome("infer", &inferred);
        }
        let costs = CostModel::new(&spec).node_costs(&graph);
        outcome("cost", &costs)
    }
}

/// Transfer times between the first and last devices and a ring over the first few: the
/// arithmetic a planner does on every cluster.
fn exercise_cluster(cluster: &Cluster) {
    let count = cluster.device_count();
    let last = DeviceId((count - 1) as u32);
    let _ = cluster.transfer_secs(DeviceId(0), last, 1 << 30);
    let ring: Vec<DeviceId> = (0..count.min(16) as u32).map(DeviceId).collect();
    let _ = cluster.ring_all_reduce_secs(&ring, 1 << 30);
    let _ = cluster.layout();
    let _ = cluster.to_string();
}
