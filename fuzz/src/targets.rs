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
pub const TARGETS: [&str; 6] = ["onnx", "plan", "cluster", "device", "capi", "export"];

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
    mlp_onnx: Vec<u8>,
}

impl Fixtures {
    /// `mlp_onnx` is the bytes of `fixtures/models/mlp.onnx`, the model the seed plans are for.
    pub fn new(mlp_onnx: &[u8]) -> Fixtures {
        Fixtures {
            catalog: Catalog::builtin(),
            plan_model: pipecut::onnx::load_model_from_bytes(mlp_onnx, None)
                .expect("mlp.onnx loads"),
            mlp_onnx: mlp_onnx.to_vec(),
        }
    }

    /// Runs one input through `target`; returns where it stopped.
    pub fn run(&self, target: &str, input: &[u8]) -> String {
        match target {
            "onnx" => self.onnx(input),
            "plan" => self.plan(input),
            "cluster" => self.cluster(input),
            "device" => self.device(input),
            "capi" => self.capi(input),
            "export" => export(input),
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
            // The default rule too (MatMul kept with its bias Add): fuzzed graphs exercise it.
            cut_constraints: Default::default(),
            ..PartitionConfig::default()
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
        let checked = plan.check(self.plan_model.digests(), &graph, &self.catalog);
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

impl Fixtures {
    /// A request to the C ABI (`pipecut_plan_json`, called through its raw pointers as a C
    /// program would) to plan mlp.onnx. The input is the config JSON up to its first NUL byte,
    /// as C would pass it. A returned plan must be a document `pipecut check` accepts (the C ABI
    /// once returned `"bottleneck_secs": null`); one that is not is a finding (a panic).
    ///
    /// Two edits keep an execution short and local: `time_limit_secs` is capped at 0.2 s, and
    /// `cluster_file` and `external_data_dir` are removed (the fuzzer does not read paths its
    /// input names; the file readers have their own targets).
    fn capi(&self, input: &[u8]) -> String {
        let text = &input[..input.iter().position(|&b| b == 0).unwrap_or(input.len())];
        let mut config = text.to_vec();
        if let Ok(serde_json::Value::Object(mut fields)) = serde_json::from_slice(text) {
            fields.remove("cluster_file");
            fields.remove("external_data_dir");
            if let Some(limit) = fields.get_mut("time_limit_secs") {
                if limit.as_f64().is_some_and(|secs| secs > 0.2) {
                    *limit = serde_json::json!(0.2);
                }
            }
            config = serde_json::to_vec(&fields).expect("a JSON object serializes");
        }
        let config = std::ffi::CString::new(config).expect("cut at the first NUL");
        // SAFETY: the model bytes and the NUL-terminated config live through the call.
        let plan = unsafe {
            pipecut::ffi::pipecut_plan_json(
                self.mlp_onnx.as_ptr(),
                self.mlp_onnx.len(),
                config.as_ptr(),
            )
        };
        if plan.is_null() {
            let message = pipecut::ffi::pipecut_last_error();
            assert!(!message.is_null(), "a NULL plan without a message");
            // SAFETY: a live NUL-terminated string owned by this thread's error slot.
            let message = unsafe { std::ffi::CStr::from_ptr(message) }.to_string_lossy();
            // The error text is the outcome, without the values the input chose: only what
            // precedes the first quoted name, and only its plain lowercase words.
            let words: Vec<&str> = message
                .split(['\'', '"', '`'])
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .filter(|w| w.chars().all(|c| c.is_ascii_lowercase()))
                .take(6)
                .collect();
            return format!("capi: error: {}", words.join(" "));
        }
        // SAFETY: a string pipecut_plan_json returned, read before it is freed once.
        let json = unsafe { std::ffi::CStr::from_ptr(plan) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: returned by pipecut_plan_json and not freed yet.
        unsafe { pipecut::ffi::pipecut_string_free(plan) };
        let plan = Plan::from_json(&json)
            .unwrap_or_else(|e| panic!("the C ABI returned a plan that does not parse: {e}"));
        // Measured node times replace the cost model's, so such a plan's figures differ from
        // what `check` recomputes by design: it must still parse, with finite figures.
        let measured = serde_json::from_slice::<serde_json::Value>(text)
            .ok()
            .and_then(|v| v.get("node_secs").cloned())
            .is_some_and(|v| v.as_object().is_some_and(|m| !m.is_empty()));
        if !measured {
            let mut graph = self.plan_model.graph.clone();
            let bindings = plan
                .model
                .dims
                .iter()
                .fold(DimBindings::new(), |b, (name, &value)| b.bind(name, value));
            ShapeInference::new(bindings)
                .run(&mut graph)
                .unwrap_or_else(|e| panic!("a planned model's dims do not type it: {e}"));
            plan.check(self.plan_model.digests(), &graph, &self.catalog)
                .unwrap_or_else(|e| panic!("the C ABI returned a plan that check rejects: {e}"));
        }
        format!("capi: ok: {} stages", plan.stages.len())
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

/// The files of one `export` execution: `model/m.onnx` (the input) with the data files the
/// malformed corpus points at beside it, a `victim.txt` beside `model/` and `out/`.
struct ExportScene {
    root: std::path::PathBuf,
}

impl ExportScene {
    const VICTIM: &'static [u8] = b"must never change";

    fn new(model: &[u8]) -> ExportScene {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNT: AtomicU64 = AtomicU64::new(0);
        let root = std::env::temp_dir().join(format!(
            "pipecut-fuzz-export-{}-{}",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        ));
        let model_dir = root.join("model");
        std::fs::create_dir_all(&model_dir).expect("a scratch folder");
        std::fs::write(model_dir.join("m.onnx"), model).expect("the model is written");
        // Data files under the names the seeds use, so external references resolve.
        for name in ["w.bin", "short.bin", "weights.bin", "model.weights"] {
            std::fs::write(model_dir.join(name), [7u8; 4096]).expect("a data file");
        }
        std::fs::write(root.join("victim.txt"), Self::VICTIM).expect("the victim is written");
        ExportScene { root }
    }

    /// Panics (a finding) if anything outside `out/` changed or appeared, or if `out/` holds a
    /// link or a temporary after the export returned.
    fn check_confinement(&self) {
        let victim = std::fs::read(self.root.join("victim.txt")).expect("the victim is there");
        assert_eq!(
            victim,
            Self::VICTIM,
            "export changed a file outside --out-dir"
        );
        let mut names: Vec<String> = std::fs::read_dir(&self.root)
            .expect("the scratch folder")
            .map(|e| {
                e.expect("an entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        for name in &names {
            assert!(
                ["model", "out", "victim.txt"].contains(&name.as_str()),
                "export wrote '{name}' outside --out-dir"
            );
        }
        let mut stack = vec![self.root.join("out")];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries {
                let entry = entry.expect("an entry");
                let kind = entry.file_type().expect("a file type");
                let name = entry.file_name().to_string_lossy().into_owned();
                assert!(!kind.is_symlink(), "export left a link '{name}'");
                assert!(!name.starts_with(".pipecut-tmp-"), "export left '{name}'");
                if kind.is_dir() {
                    stack.push(entry.path());
                }
            }
        }
    }
}

impl Drop for ExportScene {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Load from a file (so external data resolves against its folder), infer, cut the order into
/// two contiguous stages and export them; whatever happens, nothing outside `out/` may change.
fn export(input: &[u8]) -> String {
    let scene = ExportScene::new(input);
    let model_path = scene.root.join("model/m.onnx");
    let outcome = (|| {
        let mut model = match pipecut::onnx::load_model(&model_path) {
            Ok(model) => model,
            Err(e) => return outcome::<()>("load", &Err(e)),
        };
        let result = ShapeInference::default().run(&mut model.graph);
        if result.is_err() {
            return outcome("infer", &result);
        }
        let order = model.graph.topological_order().to_vec();
        let half = order.len() / 2;
        let stages = if half == 0 {
            vec![order]
        } else {
            vec![order[..half].to_vec(), order[half..].to_vec()]
        };
        let out = scene.root.join("out");
        let exported =
            pipecut::onnx::export::export_stages(&model_path, &model.graph, &stages, &out);
        outcome("export", &exported)
    })();
    scene.check_confinement();
    outcome
}
