//! `pipecut show plan.json [MODEL]`: the plan's table and simulated step, and its pictures — the
//! schedule timeline (SVG) and the model graph coloured by stage (DOT, or SVG through Graphviz).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use crate::partition::tensor_parallel::TensorParallelism;
use crate::plan::plan_dot;
use crate::schedule::timeline_svg;
use anyhow::{bail, Context};
use clap::Args;

use super::check::{load_for_plan, read_plan};
use super::{print_stdout, write_atomically};

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The plan JSON written by `pipecut partition`.
    plan: PathBuf,
    /// The model the plan was made for: needed for `--graph`, and when given the plan is
    /// checked against it first.
    model: Option<PathBuf>,
    /// Draw the simulated schedule (one row per stage, with its GPU; a time axis in ms) as SVG.
    #[arg(long, value_name = "FILE.svg")]
    timeline: Option<PathBuf>,
    /// Draw the model graph coloured by stage: `.dot` writes Graphviz DOT, `.svg` or `.png`
    /// renders it with Graphviz `dot` (which must be installed).
    #[arg(long, value_name = "FILE.dot|FILE.svg|FILE.png")]
    graph: Option<PathBuf>,
    /// Print the simulated step as JSON instead of the table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    measured: super::measured::MeasuredArgs,
    #[command(flatten)]
    profiles: super::catalog::CatalogArgs,
}

pub fn run(args: ShowArgs) -> anyhow::Result<ExitCode> {
    let inputs: Vec<&Path> = std::iter::once(args.plan.as_path())
        .chain(args.model.as_deref())
        .collect();
    // Every output is checked before anything is read or written: `show --timeline plan.json`
    // must not replace the plan.
    for out in [&args.timeline, &args.graph].into_iter().flatten() {
        super::check_output(out, &inputs)?;
    }
    let plan = read_plan(&args.plan)?;
    let model = match &args.model {
        Some(path) => {
            let model = load_for_plan(&plan, &args.plan, path, &args.measured)?;
            plan.check(model.digests(), &model.graph, &args.profiles.catalog(&[])?)
                .with_context(|| format!("'{}'", args.plan.display()))?;
            Some(model)
        }
        None => None,
    };
    check_picture_names(&args)?;
    let simulation = plan
        .simulate()
        .with_context(|| format!("cannot simulate '{}'", args.plan.display()))?;

    if let Some(path) = &args.timeline {
        write_atomically(path, timeline(&plan, &simulation).as_bytes(), &inputs)?;
    }
    if let Some(path) = &args.graph {
        let Some(model) = &model else {
            bail!("--graph needs the model: pipecut show PLAN.json MODEL --graph FILE");
        };
        let dot = plan_dot(&plan, &model.graph)?;
        write_graph(path, &dot, &inputs)?;
    }

    if args.json {
        print_stdout(&format!(
            "{}\n",
            serde_json::json!({
                "step_secs": simulation.step_secs,
                "bubble_fraction": simulation.bubble_fraction,
                "peak_in_flight": simulation.peak_in_flight,
                "bottleneck_secs": plan.summary.bottleneck_secs,
                "tensor_parallel": tensor_parallel(&plan),
            })
        ))?;
    } else {
        print_stdout(&super::partition::table(&plan, plan.summary.solve_secs))?;
        if let Some(line) = tensor_parallel_line(&plan) {
            print_stdout(&line)?;
        }
        print_stdout(&format!(
            "\nsimulated step: {:.3} ms for {} micro-batches, bubble {:.1}%\n",
            simulation.step_secs * 1e3,
            plan.config.microbatches,
            simulation.bubble_fraction * 100.0
        ))?;
        for path in [&args.timeline, &args.graph].into_iter().flatten() {
            print_stdout(&format!("wrote {}\n", path.display()))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Refuses a `--timeline` or `--graph` file whose extension names a format it cannot be
/// drawn in, before anything is simulated or written.
fn check_picture_names(args: &ShowArgs) -> anyhow::Result<()> {
    if let Some(path) = &args.timeline {
        if !has_extension(path, &["svg"]) {
            bail!(
                "--timeline '{}': the timeline is drawn as SVG, so the file must end in .svg \
                 (for a PNG, convert it afterwards, e.g. `rsvg-convert -o timeline.png timeline.svg`)",
                path.display()
            );
        }
    }
    if let Some(path) = &args.graph {
        if !has_extension(path, &["dot", "gv", "svg", "png"]) {
            bail!(
                "--graph '{}': the file must end in .dot, .svg or .png (the last two are drawn by Graphviz `dot`)",
                path.display()
            );
        }
    }
    Ok(())
}

/// The simulated schedule as SVG: one row per stage, named with its GPU.
fn timeline(plan: &crate::plan::Plan, simulation: &crate::schedule::Simulation) -> String {
    // The picture adds the step time and the bubble to the title.
    let title = format!(
        "{} on {}: {}, {}",
        plan.model.file_name,
        plan.cluster.description,
        crate::onnx::inspect::count_of(plan.stages.len(), "stage"),
        crate::onnx::inspect::count_of(plan.config.microbatches as usize, "micro-batch"),
    );
    let rows: Vec<String> = plan
        .stages
        .iter()
        .map(|s| {
            format!(
                "stage {} · GPU {} ({})",
                s.stage, s.device.id, s.device.name
            )
        })
        .collect();
    timeline_svg(simulation, &title, &rows)
}

/// The tensor-parallel layout of a plan that has one: degree, sequence parallelism.
fn tensor_parallel(plan: &crate::plan::Plan) -> Option<TensorParallelism> {
    let tp = plan.parallelism.as_ref()?.tensor_parallel;
    (!tp.is_none()).then_some(tp)
}

/// One line per stage under tensor parallelism: the group of GPUs it runs on.
fn tensor_parallel_line(plan: &crate::plan::Plan) -> Option<String> {
    let tp = tensor_parallel(plan)?;
    let sequence = match tp.sequence_parallel {
        true => ", with sequence parallelism",
        false => "",
    };
    let mut text = format!(
        "\ntensor parallelism: each stage split over {} GPUs{sequence}\n",
        tp.degree
    );
    for s in &plan.stages {
        let first = s.device.id;
        text.push_str(&format!(
            "  stage {}: GPUs {}–{} (TP ranks 0–{})\n",
            s.stage,
            first,
            first + tp.degree - 1,
            tp.degree - 1
        ));
    }
    Some(text)
}

/// Whether `path` ends in one of `extensions` (any case).
fn has_extension(path: &Path, extensions: &[&str]) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| extensions.iter().any(|x| e.eq_ignore_ascii_case(x)))
}

/// Writes DOT as is, or renders SVG or PNG through Graphviz.
fn write_graph(path: &Path, dot: &str, inputs: &[&Path]) -> anyhow::Result<()> {
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match extension.as_deref() {
        Some("dot" | "gv") => write_atomically(path, dot.as_bytes(), inputs),
        Some(format @ ("svg" | "png")) => write_atomically(path, &render(dot, format)?, inputs),
        _ => bail!(
            "--graph '{}': the file must end in .dot, .svg or .png",
            path.display()
        ),
    }
}

/// The graph drawn by Graphviz `dot` in `format` (`svg`, `png`).
fn render(dot: &str, format: &str) -> anyhow::Result<Vec<u8>> {
    let mut child = match Command::new("dot")
        .arg(format!("-T{format}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "Graphviz `dot` is not installed, so the graph cannot be rendered as {format}: install \
             graphviz (e.g. `apt install graphviz`), or write DOT with --graph FILE.dot"
        ),
        Err(e) => return Err(e).context("cannot start Graphviz `dot`"),
    };
    // Feed stdin from a thread: `dot` may fill its stdout pipe before it has read all input.
    let mut stdin = child.stdin.take().context("Graphviz `dot` has no stdin")?;
    let input = dot.to_string();
    let feeder = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child
        .wait_with_output()
        .context("Graphviz `dot` did not finish")?;
    let fed = feeder.join();
    if !output.status.success() {
        bail!(
            "Graphviz `dot` failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    match fed {
        Ok(Ok(())) => Ok(output.stdout),
        _ => bail!("cannot write the graph to Graphviz `dot`"),
    }
}
