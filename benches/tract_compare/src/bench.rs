//! One whole model through tract, timed as `benches/cpu_speed.py` times pipecut and
//! onnxruntime: the inputs that script wrote, 3 warm-up runs, then the median of `repeats` runs,
//! one thread (tract's default executor is single-threaded). The outputs are written back as
//! .npy so the script can compare them with onnxruntime's.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use tract_onnx::prelude::*;

use crate::npy;

pub struct Args {
    pub model: PathBuf,
    pub inputs: Vec<(String, PathBuf)>,
    pub repeats: usize,
    pub out_dir: PathBuf,
}

const WARM_UP: usize = 3;

/// The plan for `model` with every input fixed to the given tensor's dtype and shape, as
/// tract is meant to be used (its optimiser specialises kernels to concrete shapes).
fn plan(model: &Path, inputs: &[(String, Tensor)]) -> Result<Arc<TypedRunnableModel>> {
    let mut model = tract_onnx::onnx().model_for_path(model)?;
    let names: Vec<String> = model
        .input_outlets()?
        .iter()
        .map(|o| model.node(o.node).name.clone())
        .collect();
    if names.len() != inputs.len() {
        bail!("the model has inputs {names:?}, {} given", inputs.len());
    }
    for (ix, name) in names.iter().enumerate() {
        let (_, tensor) = inputs
            .iter()
            .find(|(n, _)| n == name)
            .with_context(|| format!("no value given for input '{name}'"))?;
        model.set_input_fact(
            ix,
            InferenceFact::dt_shape(tensor.datum_type(), tensor.shape()),
        )?;
    }
    model.into_optimized()?.into_runnable()
}

/// The inputs in the model's input order.
fn ordered_inputs(plan: &TypedRunnableModel, inputs: &[(String, Tensor)]) -> Result<TVec<Tensor>> {
    let model = plan.model();
    model
        .input_outlets()?
        .iter()
        .map(|o| {
            let name = &model.node(o.node).name;
            inputs
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t.clone())
                .with_context(|| format!("no value given for input '{name}'"))
        })
        .collect()
}

fn median(mut secs: Vec<f64>) -> f64 {
    secs.sort_by(f64::total_cmp);
    secs[secs.len() / 2]
}

pub fn run(args: &Args) -> Result<()> {
    let inputs: Vec<(String, Tensor)> = args
        .inputs
        .iter()
        .map(|(name, path)| Ok((name.clone(), npy::read(path)?)))
        .collect::<Result<_>>()?;
    let start = Instant::now();
    let plan = plan(&args.model, &inputs)?;
    let prepare_secs = start.elapsed().as_secs_f64();
    let feed = ordered_inputs(&plan, &inputs)?;
    let mut outputs = TVec::new();
    let mut secs = Vec::with_capacity(args.repeats);
    for i in 0..WARM_UP + args.repeats {
        let values: TVec<TValue> = feed.iter().cloned().map(|t| t.into_tvalue()).collect();
        let start = Instant::now();
        outputs = plan.run(values)?;
        if i >= WARM_UP {
            secs.push(start.elapsed().as_secs_f64());
        }
    }
    std::fs::create_dir_all(&args.out_dir)?;
    for (i, output) in outputs.iter().enumerate() {
        npy::write(&args.out_dir.join(format!("output_{i}.npy")), output)?;
    }
    println!(
        "{{\"median_secs\": {}, \"prepare_secs\": {prepare_secs}, \"outputs\": {}}}",
        median(secs),
        outputs.len()
    );
    Ok(())
}
