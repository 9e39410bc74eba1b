//! Subcommands and their arguments.

mod bench_plans;
mod calibrate;
mod catalog;
mod check;
mod cost;
mod devices;
mod efficiency;
mod export;
mod inspect;
mod measured;
mod other_load;
mod partition;
mod plan_cluster;
mod profile;
mod progress;
mod run;
mod run_distributed;
mod run_files;
mod run_maps;
mod select;
mod show;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::graph::Graph;
use crate::onnx::shape::{DimBindings, ShapeInference};
use crate::onnx::Model;
use crate::plan::PlanValue;
use anyhow::Context;
use clap::{Args, Parser, Subcommand};

/// The exit codes, as the help states them (src/main.rs sets them): a macro, so that `concat!`
/// can append them to a command's own help.
macro_rules! exit_codes {
    () => {
        "Exit codes: 0 success; 1 no answer: the model does not fit (proven) or a plan is invalid; 2 bad input; 3 the memory decision is not finished: no plan that fits was found, and the time limit or work budget ran out before \"does not fit\" was proven (a longer --time-limit may decide it)."
    };
}

/// Automatic pipeline-parallel partitioning of ONNX models.
#[derive(Debug, Parser)]
#[command(name = "pipecut", version, about, long_about = None, after_help = exit_codes!())]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load a model, infer shapes, and print what it contains.
    #[command(
        after_help = "Examples:\n  pipecut inspect fixtures/models/gpt2_tiny.onnx --dim batch=8 --dim seq=32\n  pipecut inspect model.onnx --json"
    )]
    Inspect(inspect::InspectArgs),
    /// Cost every node of a model on a device (FLOPs, bytes, roofline time), slowest first.
    #[command(
        after_help = "Examples:\n  pipecut cost fixtures/models/gpt2_tiny.onnx --device H100-SXM --dim batch=8 --dim seq=64\n  pipecut cost model.onnx --device A100-80GB --mode training --json"
    )]
    Cost(cost::CostArgs),
    /// Measure this machine's achievable rates and write a calibrated device profile.
    #[command(
        after_help = "Examples:\n  pipecut calibrate --device cpu --out cost-models/calibrated/cpu.json\n  pipecut cost model.onnx --device cost-models/calibrated/cpu.json --dim batch=1"
    )]
    Calibrate(calibrate::CalibrateArgs),
    /// Measure every node of a model on this machine (or convert an onnxruntime profile), so
    /// that `partition --profile` plans on measured times.
    #[command(
        after_help = "Examples:\n  pipecut profile fixtures/models/gpt2_tiny.onnx --dim batch=8 --dim seq=64 --threads 1 --out times.json\n  pipecut partition fixtures/models/gpt2_tiny.onnx --devices cpu,cpu --dim batch=8 --dim seq=64 --profile times.json\n  pipecut profile model.onnx --dim batch=8 --from-onnxruntime onnxruntime_profile.json --device H100-SXM --out times.json"
    )]
    Profile(profile::ProfileArgs),
    /// List the device and link profiles (built-in, PIPECUT_COST_MODELS, --device-profile).
    #[command(
        after_help = "Examples:\n  pipecut catalog\n  pipecut catalog --device-profile cal.json --json"
    )]
    Catalog(catalog::ListArgs),
    /// Run the optimiser's plan and every baseline's for real on the CPU runtime, one pinned
    /// core per stage, in paired rounds: measured against predicted speed-ups and stage shares.
    #[command(
        name = "bench-plans",
        after_help = "Examples:\n  pipecut profile fixtures/models/gpt2_tiny.onnx --dim batch=8 --dim seq=64 --threads 1 --out times.json\n  pipecut bench-plans fixtures/models/gpt2_tiny.onnx --dim batch=8 --dim seq=64 --profile times.json"
    )]
    BenchPlans(bench_plans::BenchPlansArgs),
    /// Cut a model into pipeline stages for a cluster: print the stage table, write the plan.
    #[command(
        after_help = concat!("Examples:\n  pipecut partition fixtures/models/gpt2_tiny.onnx --cluster 1x4xL4 --dim batch=8 --dim seq=64 --out plan.json\n  pipecut partition model.onnx --devices A100-80GB,A100-80GB,L4,L4 --stages 4 --mode training --microbatches 16\n  pipecut partition model.onnx --cluster 2x8xH100-SXM --stages auto --schedule gpipe --time-limit 30s --json\n\n", exit_codes!())
    )]
    Partition(partition::PartitionArgs),
    /// Validate a plan against its model: every node once, convex ordered stages, memory, figures.
    #[command(
        after_help = "Examples:\n  pipecut check plan.json fixtures/models/gpt2_tiny.onnx\n  pipecut check plan.json model.onnx --rewrite   (after moving nodes between stages by hand)"
    )]
    Check(check::CheckArgs),
    /// Write one ONNX file per stage of a plan, and manifest.json routing the tensors between them.
    #[command(
        after_help = "Tensors that cross a stage boundary keep the model's symbolic dims unless --dim binds them (or the model needs the plan's dims to be typed).\nSee docs/export.md for the files and the manifest.\n\nExamples:\n  pipecut export plan.json fixtures/models/gpt2_tiny.onnx --out-dir stages/\n  pipecut export plan.json model.onnx --out-dir stages/ --dim batch=8 --json"
    )]
    Export(export::ExportArgs),
    /// Use a whole cluster: choose pipeline depth, tensor- and data-parallel degrees,
    /// micro-batching, schedule and placement; print the best configurations and write the
    /// chosen plan.
    #[command(
        after_help = concat!("Examples:\n  pipecut plan-cluster fixtures/models/gpt2_tiny.onnx --cluster 2x4xA100-80GB --global-batch 64 --dim seq=64\n  pipecut plan-cluster fixtures/models/gpt3_175b/model.onnx --cluster 16x8xH100-SXM --global-batch 64 --dim seq=2048 --time-limit 10s --out plan.json\n  pipecut plan-cluster fixtures/models/gpt3_175b/model.onnx --cluster 128x8xH100-SXM --global-batch 1536 --dim seq=2048 --mode training --time-limit 60s\n  pipecut plan-cluster fixtures/models/gpt3_175b/model.onnx --cluster 192x8xA100-80GB --global-batch 1536 --dim seq=2048 --mode training --tp 8 --pp 16 --dp 12 --microbatch-sizes 1 --recompute full --zero 0\n\nThe search tries tensor-parallel degrees inside a node (--tp; --sequence-parallel also splits the normalizations), and in training activation recomputation (--recompute) and ZeRO stages 0-3 (--zero). --tp, --pp and --dp together evaluate one configuration of your choosing.\n\n", exit_codes!())
    )]
    PlanCluster(plan_cluster::PlanClusterArgs),
    /// Show a plan: its table and simulated step, the schedule timeline, the graph by stage.
    #[command(
        after_help = "Examples:\n  pipecut show plan.json\n  pipecut show plan.json --timeline timeline.svg\n  pipecut show plan.json fixtures/models/gpt2_tiny.onnx --graph stages.dot\n  pipecut show plan.json model.onnx --graph stages.svg   (needs Graphviz `dot`)"
    )]
    Show(show::ShowArgs),
    /// Print a shell completion script.
    #[command(
        after_help = "Examples:\n  pipecut completions bash > ~/.local/share/bash-completion/completions/pipecut\n  pipecut completions zsh > ~/.zfunc/_pipecut\n  pipecut completions fish > ~/.config/fish/completions/pipecut.fish"
    )]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the JSON Schema of the plan document (the copy in docs/plan.schema.json).
    #[command(after_help = "Examples:\n  pipecut schema > plan.schema.json")]
    Schema,
    /// Run a plan: one thread per stage, micro-batches streamed, on the CPU reference runtime or
    /// (built with `--features cuda`) on GPUs.
    #[command(
        after_help = "Examples:\n  pipecut run plan.json fixtures/models/gpt2_tiny.onnx --microbatches 16\n  pipecut run plan.json model.onnx --input input_ids=ids.npy --output-dir out --json\n  pipecut run plan.json model.onnx --backend cuda   (stage k on GPU k mod the GPU count)"
    )]
    Run(run::RunArgs),
    /// Say what the CUDA backend can use here: whether it is built, the GPUs the driver sees,
    /// whether NVRTC compiles the kernels (and why not, for each).
    #[command(after_help = "Examples:\n  pipecut devices\n  pipecut devices --json")]
    Devices(devices::DevicesArgs),
}

/// A model file and the bindings of its symbolic dims, shared by the commands that plan.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// The ONNX model file.
    model: PathBuf,
    /// Bind a symbolic dim, e.g. `--dim batch=8` (repeatable). Batch is per micro-batch. A size
    /// that depends on data is a symbol `<tensor>.<axis>`, bound the same way.
    #[arg(long = "dim", value_name = "NAME=VALUE")]
    dims: Vec<String>,
    /// Give a graph input a sample value at plan time, e.g. `--value axes=axes.npy`
    /// (repeatable): an input that carries a shape (Reduce axes, Reshape's shape, Slice starts,
    /// Split or Resize sizes) then decides it as a constant would. The plan holds for that value.
    #[arg(long = "value", value_name = "NAME=FILE.npy")]
    values: Vec<String>,
}

impl ModelArgs {
    fn bindings(&self) -> anyhow::Result<DimBindings> {
        let mut bindings = DimBindings::new();
        for dim in &self.dims {
            bindings.parse_arg(dim)?;
        }
        Ok(bindings)
    }

    /// The `--dim` bindings by name, as plans and node-times files record them.
    fn dims(&self) -> anyhow::Result<BTreeMap<String, u64>> {
        Ok(self
            .bindings()?
            .iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect())
    }

    /// The `--value` sample inputs, read, as a plan records them. A file of raw bytes that name
    /// no type (ml_dtypes' bfloat16, float8 and 4-bit arrays) is read as `graph` declares the
    /// input, as `run --input` reads it.
    fn sample_values(&self, graph: &Graph) -> anyhow::Result<BTreeMap<String, PlanValue>> {
        let mut values = BTreeMap::new();
        for arg in &self.values {
            let (name, file) = arg
                .split_once('=')
                .with_context(|| format!("--value '{arg}' is not NAME=FILE.npy"))?;
            let declared = graph.tensor_id(name).and_then(|id| graph.tensor(id).dtype);
            let array = crate::runtime::read_npy_as(Path::new(file), declared)
                .with_context(|| format!("--value {name}"))?;
            let shape: Vec<u64> = array.tensor.shape().iter().map(|&d| d as u64).collect();
            let value = PlanValue::new(name, array.stored, &shape, &array.tensor.to_const_value())?;
            if values.insert(name.to_string(), value).is_some() {
                anyhow::bail!("--value {name} is given twice");
            }
        }
        Ok(values)
    }

    /// Shape inference with the `--dim` bindings and the `--value` sample inputs.
    fn shape_inference(&self, graph: &Graph) -> anyhow::Result<ShapeInference> {
        let values = self
            .sample_values(graph)?
            .into_iter()
            .map(|(name, value)| (name, value.const_value()))
            .collect();
        Ok(ShapeInference::new(self.bindings()?).with_input_values(values))
    }

    /// Loads the model and infers every shape, stopping at the first node that fails.
    /// `weights`: the command reads the weight bytes, so absent external data is refused.
    fn load_typed(&self, weights: Weights) -> anyhow::Result<Model> {
        self.type_loaded(load_model(&self.model, weights)?)
    }

    /// Infers every shape of a model already loaded from this file, with these bindings.
    fn type_loaded(&self, mut model: Model) -> anyhow::Result<Model> {
        self.shape_inference(&model.graph)?
            .run(&mut model.graph)
            .with_context(|| format!("'{}'", self.model.display()))?;
        Ok(model)
    }

    /// [`ModelArgs::load_typed`] for a command that needs every size (cost, partition, profile):
    /// refuses the model while its inputs have dims no `--dim` binds, naming them all.
    fn load_bound(&self, weights: Weights) -> anyhow::Result<Model> {
        self.type_bound(load_model(&self.model, weights)?)
    }

    /// [`ModelArgs::type_loaded`] for a command that needs every size.
    fn type_bound(&self, model: Model) -> anyhow::Result<Model> {
        let model = self.type_loaded(model)?;
        require_bound_dims(&model.graph, &self.bindings()?, None)
            .with_context(|| format!("'{}'", self.model.display()))?;
        Ok(model)
    }
}

/// Refuses a graph whose inputs have symbolic dims that `bindings` (and `chosen`, a dim the
/// command binds itself) leave unbound, naming every one with an input that carries it.
/// Costing would stop at the first such dim it meets, so a model with three unbound dims took
/// three runs to learn them.
pub(crate) fn require_bound_dims(
    graph: &crate::graph::Graph,
    bindings: &DimBindings,
    chosen: Option<&str>,
) -> anyhow::Result<()> {
    let mut unbound: BTreeMap<String, String> = BTreeMap::new();
    for &id in graph.inputs() {
        let tensor = graph.tensor(id);
        if !tensor.kind.is_tensor() {
            // A sequence's or optional's element dims are costed as absent, never needed.
            continue;
        }
        for dim in tensor.shape.as_deref().unwrap_or(&[]) {
            let crate::graph::Dim::Sym(sym) = dim else {
                continue;
            };
            for name in sym.symbols() {
                let bound = bindings.iter().any(|(n, _)| n == name) || chosen == Some(name);
                if !bound {
                    unbound
                        .entry(name.to_string())
                        .or_insert_with(|| tensor.name.clone());
                }
            }
        }
    }
    let pass: Vec<String> = unbound.keys().map(|d| format!("--dim {d}=N")).collect();
    match unbound.len() {
        0 => Ok(()),
        1 => {
            let (dim, tensor) = unbound.iter().next().expect("one entry");
            anyhow::bail!(
                "dim '{dim}' of input '{tensor}' is not bound: pass {}",
                pass.join(" ")
            )
        }
        n => {
            let named: Vec<String> = unbound
                .iter()
                .map(|(dim, tensor)| format!("'{dim}' (of input '{tensor}')"))
                .collect();
            anyhow::bail!(
                "{n} dims are not bound: {}; pass {}",
                named.join(", "),
                pass.join(" ")
            )
        }
    }
}

/// `--dtype`: the precision to cost a model at, when it differs from the file's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DtypeArg {
    Bf16,
    Fp16,
    Fp32,
}

impl From<DtypeArg> for crate::cost::Precision {
    fn from(d: DtypeArg) -> crate::cost::Precision {
        match d {
            DtypeArg::Bf16 => crate::cost::Precision::Bf16,
            DtypeArg::Fp16 => crate::cost::Precision::Fp16,
            DtypeArg::Fp32 => crate::cost::Precision::Fp32,
        }
    }
}

/// The runtime a plan executes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The CPU reference runtime.
    Cpu,
    /// The CUDA runtime.
    Cuda,
}

/// Whether a command reads the weight bytes of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Weights {
    /// Planning (inspect, cost, partition, plan-cluster, check, show): dtypes and dims are in
    /// the protobuf, so absent external-data files are a warning.
    NotRead,
    /// Export and run: absent external data is an error.
    Read,
    /// A rank of a distributed job, which reads only its stage's weights: absent external
    /// data is the concern of that read, and only where its stage needs it.
    OneStage,
}

/// Loads a model, printing on stderr what the loader had to assume (an opset newer than pipecut
/// knows, op versions whose additions it does not apply) as `warning:` lines, and warning about
/// (or, when `weights` are read, refusing) absent external data.
pub(crate) fn load_model(path: &Path, weights: Weights) -> anyhow::Result<Model> {
    let model = crate::onnx::load_model(path)
        .with_context(|| format!("cannot load '{}'", path.display()))?;
    for warning in &model.warnings {
        eprintln!(
            "warning: '{}': {}",
            path.display(),
            escape_controls(warning)
        );
    }
    match weights {
        Weights::Read => {
            model
                .require_external_data()
                .with_context(|| format!("cannot load '{}'", path.display()))?;
            return Ok(model);
        }
        Weights::OneStage => return Ok(model),
        Weights::NotRead => {}
    }
    let mut warned = std::collections::BTreeSet::new();
    for missing in &model.missing_external_data {
        if warned.insert(&missing.path) {
            let count = model
                .missing_external_data
                .iter()
                .filter(|m| m.path == missing.path)
                .count();
            eprintln!(
                "warning: '{}' does not exist: the weights of {count} initializer(s) are not \
                 there; planning needs only their shapes, export and run will need the file",
                escape_controls(&missing.path.display().to_string())
            );
        }
    }
    Ok(model)
}

/// Runs a parsed command line; `Err` is printed by `main` with exit code 2.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Inspect(args) => inspect::run(args),
        Command::Cost(args) => cost::run(args),
        Command::Calibrate(args) => calibrate::run(args),
        Command::Profile(args) => profile::run(args),
        Command::Catalog(args) => catalog::run(args),
        Command::BenchPlans(args) => bench_plans::run(args),
        Command::Partition(args) => partition::run(args),
        Command::Check(args) => check::run(args),
        Command::PlanCluster(args) => plan_cluster::run(args),
        Command::Show(args) => show::run(args),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "pipecut", &mut script);
            print_stdout(&String::from_utf8_lossy(&script))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Schema => {
            print_stdout(&crate::plan::Plan::json_schema())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Export(args) => export::run(args),
        Command::Run(args) => run::run(args),
        Command::Devices(args) => devices::run(args),
    }
}

/// Refuses a model whose graph is not the one `plan` was made for (the error names the plan's
/// file), and notes on stderr when only the weights differ, which the plan allows.
pub(crate) fn match_plan_model(
    plan: &crate::plan::Plan,
    model: &Model,
    plan_path: &Path,
) -> anyhow::Result<()> {
    let matched = plan
        .model_match(model.digests())
        .with_context(|| format!("'{}'", plan_path.display()))?;
    if let Some(note) = matched.note(plan) {
        eprintln!("note: {}", escape_controls(&note));
    }
    Ok(())
}

/// The model's file name as the plan records it (`""` for a path without one).
pub(crate) fn model_file_name(path: &std::path::Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A node name shortened to `width` characters for a table column, keeping what tells nodes
/// apart: the last path segment (the op, `MatMul_3`) and the segments with a number in them
/// (the layer, `layers.12`, `h.3`). Other segments are dropped from the middle outwards, each
/// run of them shown as `…`; a name still too long loses characters from its middle.
pub(crate) fn shorten_name(name: &str, width: usize) -> String {
    let count = |s: &str| s.chars().count();
    if count(name) <= width {
        return name.to_string();
    }
    let rooted = name.starts_with('/');
    let segments: Vec<&str> = name.trim_start_matches('/').split('/').collect();
    let last = segments.len() - 1;
    let indexed = |i: usize| segments[i].chars().any(|c| c.is_ascii_digit());
    let first_indexed = (0..last).find(|&i| indexed(i));
    // What must stay, most first: every indexed segment, else the first (the layer), else the op.
    let candidates: [Vec<bool>; 3] = [
        (0..segments.len())
            .map(|i| i == last || indexed(i))
            .collect(),
        (0..segments.len())
            .map(|i| i == last || Some(i) == first_indexed)
            .collect(),
        (0..segments.len()).map(|i| i == last).collect(),
    ];
    let render = |keep: &[bool]| -> String {
        let mut parts: Vec<&str> = Vec::new();
        for (i, segment) in segments.iter().enumerate() {
            if keep[i] {
                parts.push(segment);
            } else if parts.last() != Some(&"…") {
                parts.push("…");
            }
        }
        let joined = parts.join("/");
        if rooted && keep[0] {
            format!("/{joined}")
        } else {
            joined
        }
    };
    let fitting = candidates
        .into_iter()
        .find(|keep| segments.len() > 1 && count(&render(keep)) <= width);
    if let Some(mut keep) = fitting {
        // Give back the dropped segments nearest the op first, while they fit.
        for i in (0..last).rev() {
            if !keep[i] {
                keep[i] = true;
                if count(&render(&keep)) > width {
                    keep[i] = false;
                }
            }
        }
        return render(&keep);
    }
    let chars: Vec<char> = name.chars().collect();
    let head = width.saturating_sub(1) / 3;
    let tail = width.saturating_sub(1) - head;
    let mut short: String = chars[..head].iter().collect();
    short.push('…');
    short.extend(&chars[chars.len() - tail..]);
    short
}

thread_local! {
    /// Where [`print_stdout`] writes instead of stdout while [`run_captured`] runs a command on
    /// this thread: the Python package returns a command's report rather than printing it into
    /// the interpreter's stdout.
    static CAPTURED: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Runs a command as [`run`] does, and returns what it would have printed on stdout with its
/// result. Commands print only through [`print_stdout`], so nothing else reaches stdout; notes
/// and progress still go to stderr.
pub fn run_captured(cli: Cli) -> (anyhow::Result<ExitCode>, String) {
    CAPTURED.with(|captured| *captured.borrow_mut() = Some(String::new()));
    let result = run(cli);
    let printed = CAPTURED.with(|captured| captured.borrow_mut().take());
    (result, printed.unwrap_or_default())
}

/// Writes to stdout, control characters escaped ([`escape_controls`]); a closed pipe
/// (`pipecut inspect m.onnx | head`) is not an error. Under [`run_captured`] the text is kept
/// verbatim instead.
pub(crate) fn print_stdout(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let kept = CAPTURED.with(|captured| match captured.borrow_mut().as_mut() {
        Some(buffer) => {
            buffer.push_str(text);
            true
        }
        None => false,
    });
    if kept {
        return Ok(());
    }
    let text = escape_controls(text);
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Text from a model (node and tensor names) reaches tables and messages verbatim; on a terminal
/// its control characters would be obeyed (escape sequences recolour, retitle or clear the
/// screen). They are shown as `\u{1b}` escapes instead; newlines and tabs stay. JSON output is
/// unaffected: serde_json already escapes control characters inside strings.
pub(crate) fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    if !text
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            escaped.extend(c.escape_unicode());
        } else {
            escaped.push(c);
        }
    }
    std::borrow::Cow::Owned(escaped)
}

/// [`escape_controls`] for an error message, and cut in the middle past [`MAX_MESSAGE_CHARS`].
pub fn terminal_safe(text: &str) -> String {
    let escaped = escape_controls(text);
    let count = escaped.chars().count();
    if count <= MAX_MESSAGE_CHARS {
        return escaped.into_owned();
    }
    let keep = MAX_MESSAGE_CHARS / 2;
    let head: String = escaped.chars().take(keep).collect();
    let tail: String = escaped.chars().skip(count - keep).collect();
    format!(
        "{head} … ({} characters left out) … {tail}",
        count - 2 * keep
    )
}

/// Longest error message printed whole, about a screenful: a 20 MB node name in a hostile model
/// would otherwise be echoed whole.
const MAX_MESSAGE_CHARS: usize = 2000;

/// Refuses an output path before any work or write: an input, a directory, a device, a
/// missing directory (`crate::io::check_output`).
pub(crate) fn check_output(
    path: &std::path::Path,
    inputs: &[&std::path::Path],
) -> anyhow::Result<()> {
    Ok(crate::io::check_output(path, inputs)?)
}

/// Writes `bytes` to `path` atomically, after the same checks as [`check_output`]: an interrupted
/// or failed run never leaves a half-written file that looks complete, a link planted at the path
/// is replaced rather than followed, and no input is overwritten.
pub(crate) fn write_atomically(
    path: &std::path::Path,
    bytes: &[u8],
    inputs: &[&std::path::Path],
) -> anyhow::Result<()> {
    write_atomically_with(path, inputs, |file| file.write_all(bytes))
}

/// [`write_atomically`] with the bytes written by `write` as it makes them.
pub(crate) fn write_atomically_with(
    path: &std::path::Path,
    inputs: &[&std::path::Path],
    write: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    check_output(path, inputs)?;
    let mode = inputs
        .first()
        .map(|source| crate::io::OutputMode::like(source))
        .unwrap_or_default();
    // Temporaries that a killed pipecut left beside this output go now.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::io::remove_stale_temporaries(dir);
    } else {
        crate::io::remove_stale_temporaries(std::path::Path::new("."));
    }
    Ok(crate::io::write_atomically_with(path, mode, write)?)
}

/// The error chain on one line ("cannot load x.onnx: ...: ..."), each cause once: a library
/// error whose message already quotes its OS error is not followed by that error again.
pub fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// 1 when the library says the model does not fit or a plan is invalid, 3 when it could not
/// decide whether the model fits in time, 2 for everything else.
pub fn exit_code(err: &anyhow::Error) -> u8 {
    let library = err
        .chain()
        .find_map(|cause| cause.downcast_ref::<crate::Error>());
    match library {
        Some(
            crate::Error::Infeasible(_)
            | crate::Error::InvalidPlan(_)
            | crate::Error::NotAPartition(_)
            | crate::Error::NonConvexStages { .. },
        ) => 1,
        Some(crate::Error::MemoryUndecided(_)) => 3,
        _ => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::shorten_name;

    #[test]
    fn long_node_names_keep_their_layer_and_op() {
        assert_eq!(
            shorten_name("/model/layers.0/self_attn/Concat_6", 28),
            "/model/layers.0/…/Concat_6"
        );
        assert_eq!(
            shorten_name("/transformer/h.1/attn/Transpose_2", 28),
            "…/h.1/attn/Transpose_2"
        );
        assert_eq!(shorten_name("Add@28", 28), "Add@28");
        // Two indexed segments do not fit: the layer stays, the op stays.
        assert_eq!(
            shorten_name("/transformer/h.2/ln_1/LayerNormalization", 28),
            "…/h.2/…/LayerNormalization"
        );
        // No path to drop: the middle goes, both ends stay.
        let flat = "a_very_long_node_name_without_any_slashes_at_all";
        let short = shorten_name(flat, 28);
        assert_eq!(short.chars().count(), 28);
        assert!(
            short.starts_with("a_very_l") && short.ends_with("slashes_at_all"),
            "{short}"
        );
        for name in [
            "/model/layers.11/mlp/down_proj/MatMul",
            "/encoder/layer.3/attention/output/dense/MatMul_with_a_long_tail_name",
        ] {
            let short = shorten_name(name, 28);
            assert!(short.chars().count() <= 28, "{short}");
        }
    }
}
