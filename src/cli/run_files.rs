//! The tensors a run reads and writes as `.npy` files: `--input NAME=FILE.npy` arguments, and
//! one file per graph output, written all or none.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::graph::{DType, TensorId, ValueKind};
use crate::runtime::{encode_npy_as, read_npy_as, HostTensor, TensorData, Tensors, Value, Values};
use anyhow::{bail, Context};

/// The most elements a sequence input directory may hold (`0.npy` … ): far above any sequence
/// a model takes, and it bounds the files one `--input` opens.
const MAX_SEQUENCE_FILES: usize = 1 << 16;

/// Reads `NAME=FILE.npy` arguments; the file's stored dtype must be the model's.
pub(crate) fn read_inputs(args: &[String], graph: &crate::graph::Graph) -> anyhow::Result<Tensors> {
    let mut inputs = Tensors::new();
    for arg in args {
        let (name, file) = split_input(arg)?;
        let id = input_id(name, graph)?;
        let tensor = read_tensor(name, Path::new(file), graph.tensor(id).dtype)?;
        if inputs.insert(name.to_string(), Arc::new(tensor)).is_some() {
            bail!("input '{name}' is given twice");
        }
    }
    Ok(inputs)
}

/// Reads `--input` arguments as values of the kinds the model declares: a tensor from
/// `NAME=FILE.npy`; a sequence from `NAME=DIR`, its elements `DIR/0.npy`, `DIR/1.npy`, … in
/// order (an empty directory is an empty sequence); a map from `NAME=FILE.json`, one JSON
/// object (`run_maps.rs`); an optional input from what it holds.
pub(crate) fn read_input_values(
    args: &[String],
    graph: &crate::graph::Graph,
) -> anyhow::Result<Values> {
    let mut inputs = Values::new();
    for arg in args {
        let (name, file) = split_input(arg)?;
        let id = input_id(name, graph)?;
        let (kind, dtype) = (graph.tensor(id).kind, graph.tensor(id).dtype);
        let value = match kind {
            ValueKind::Sequence | ValueKind::OptionalSequence => {
                Value::Sequence(read_sequence(name, Path::new(file), dtype)?)
            }
            ValueKind::Tensor | ValueKind::OptionalTensor => {
                Value::Tensor(Arc::new(read_tensor(name, Path::new(file), dtype)?))
            }
            ValueKind::Map { key } => {
                let value = dtype.with_context(|| format!("input '{name}' has no value type"))?;
                super::run_maps::read_map(name, Path::new(file), key, value)?
            }
            ValueKind::MapSequence { .. } => bail!(
                "input '{name}' is a {kind}, which `run` cannot read from files (it takes tensors as .npy, sequences of them as folders and maps as .json objects)"
            ),
        };
        let optional = matches!(
            kind,
            ValueKind::OptionalTensor | ValueKind::OptionalSequence
        );
        let value = if !optional {
            value
        } else {
            Value::Optional(Some(Box::new(value)))
        };
        if inputs.insert(name.to_string(), value).is_some() {
            bail!("input '{name}' is given twice");
        }
    }
    Ok(inputs)
}

fn split_input(arg: &str) -> anyhow::Result<(&str, &str)> {
    arg.split_once('=')
        .with_context(|| format!("--input '{arg}' is not NAME=FILE.npy"))
}

/// The graph input `name`, or an error listing the inputs there are.
fn input_id(name: &str, graph: &crate::graph::Graph) -> anyhow::Result<TensorId> {
    let id = graph
        .tensor_id(name)
        .filter(|id| graph.inputs().contains(id));
    let Some(id) = id else {
        let names: Vec<&str> = graph
            .inputs()
            .iter()
            .map(|&i| graph.tensor(i).name.as_str())
            .collect();
        bail!(
            "the model has no input '{name}' (its inputs: {})",
            names.join(", ")
        );
    };
    Ok(id)
}

/// One `.npy` file for input `name`, whose stored dtype must be the `declared` one.
fn read_tensor(name: &str, file: &Path, declared: Option<DType>) -> anyhow::Result<HostTensor> {
    let array = read_npy_as(file, declared)?;
    if let Some(want) = declared {
        if array.stored != want {
            bail!(
                "input '{name}' must be {want}, but '{}' holds {}",
                file.display(),
                array.stored
            );
        }
    }
    Ok(array.tensor)
}

/// A sequence input: `dir/0.npy`, `dir/1.npy`, … up to the first index with no file.
fn read_sequence(
    name: &str,
    dir: &Path,
    element: Option<DType>,
) -> anyhow::Result<Vec<Arc<HostTensor>>> {
    if !dir.is_dir() {
        bail!(
            "input '{name}' is a sequence: give a directory of 0.npy, 1.npy, …, not '{}'",
            dir.display()
        );
    }
    let mut elements = Vec::new();
    while dir.join(format!("{}.npy", elements.len())).is_file() {
        if elements.len() == MAX_SEQUENCE_FILES {
            bail!("input '{name}' holds more than {MAX_SEQUENCE_FILES} elements");
        }
        let file = dir.join(format!("{}.npy", elements.len()));
        elements.push(Arc::new(read_tensor(name, &file, element)?));
    }
    Ok(elements)
}

/// Gives the inputs the plan has sample values for (`partition --value`) those values, one
/// copy per micro-batch along axis 0 as every input holds its micro-batches. A value read from
/// an `--input` file (`read`) must be that, since the plan holds for it only; `inputs` made up
/// at random are replaced.
pub(crate) fn feed_plan_values(
    plan: &crate::plan::Plan,
    graph: &crate::graph::Graph,
    inputs: &mut Tensors,
    read: &[String],
    microbatches: usize,
) -> anyhow::Result<()> {
    for (name, value) in &plan.model.values {
        // A stage file has the input only if its nodes read it.
        let Some(id) = graph
            .tensor_id(name)
            .filter(|id| graph.inputs().contains(id))
        else {
            continue;
        };
        let dtype = graph.tensor(id).dtype.or(value.element_type());
        let tensor = value_tensor(name, value, dtype, microbatches)?;
        let from_file = read
            .iter()
            .any(|arg| arg.split_once('=').is_some_and(|(n, _)| n == name));
        if from_file && inputs.get(name).map(|t| &**t) != Some(&tensor) {
            bail!(
                "input '{name}' is not the sample value the plan was made with (sha256 {}…, once per micro-batch): the plan holds for that value only; leave --input {name} out to use it",
                &value.sha256[..12.min(value.sha256.len())]
            );
        }
        inputs.insert(name.clone(), Arc::new(tensor));
    }
    Ok(())
}

/// A plan's sample value as the runtime holds an input of `dtype`, repeated for `microbatches`.
fn value_tensor(
    name: &str,
    value: &crate::plan::PlanValue,
    dtype: Option<crate::graph::DType>,
    microbatches: usize,
) -> anyhow::Result<HostTensor> {
    use crate::plan::ValueData;
    let shape: Vec<usize> = value.shape.iter().map(|&d| d as usize).collect();
    let data = match &value.data {
        ValueData::Ints(v) => TensorData::I64(v.clone()),
        ValueData::Floats(v) => TensorData::F32(v.iter().map(|&x| x as f32).collect()),
        ValueData::Strings(v) => TensorData::String(v.clone()),
    };
    let bad = |detail: String| anyhow::anyhow!("the plan's sample value for '{name}': {detail}");
    let mut tensor = HostTensor::new(shape, data).map_err(bad)?;
    if let Some(dtype) = dtype.filter(|&d| d != crate::graph::DType::String) {
        tensor = tensor.cast(dtype).map_err(bad)?;
    }
    if microbatches == 1 {
        return Ok(tensor);
    }
    if tensor.shape().is_empty() {
        bail!(
            "input '{name}' is a scalar sample value, which has no axis to repeat for {microbatches} micro-batches: run with --microbatches 1"
        );
    }
    HostTensor::concat_axis0(&vec![&tensor; microbatches]).map_err(bad)
}

/// A file name for a tensor name: characters outside `[A-Za-z0-9_.-]` become `_`.
fn file_stem(name: &str) -> String {
    let stem: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if stem.is_empty() || stem.starts_with('.') {
        format!("output{stem}")
    } else {
        stem
    }
}

/// Writes every output as `<name>.npy` in `dir`, of the dtype `graph` declares for it (a uint8
/// output as `|u1`, not the int64 the runtime computes it in; see
/// [`crate::runtime::encode_npy_as`]): all to exclusive temporary files first
/// (`crate::io::Staged`), then renamed, so that a failure leaves no partial set of outputs and
/// a link planted in `dir` is never followed. The run's inputs are never overwritten.
pub(crate) fn write_outputs(
    dir: &Path,
    outputs: &Tensors,
    graph: &crate::graph::Graph,
    inputs: &[&Path],
) -> anyhow::Result<BTreeMap<String, String>> {
    let values: Values = outputs
        .iter()
        .map(|(name, t)| (name.clone(), Value::Tensor(Arc::clone(t))))
        .collect();
    write_output_values(dir, &values, graph, inputs)
}

/// [`write_outputs`] for outputs of any kind: a sequence as a directory `<name>/` of `0.npy`,
/// `1.npy`, … and a map as `<name>.json` (what `--input` reads back), an optional as what it
/// holds, an absent one not at all (nor listed).
pub(crate) fn write_output_values(
    dir: &Path,
    outputs: &Values,
    graph: &crate::graph::Graph,
    inputs: &[&Path],
) -> anyhow::Result<BTreeMap<String, String>> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create '{}'", dir.display()))?;
    crate::io::remove_stale_temporaries(dir);
    let mode = inputs
        .first()
        .map(|model| crate::io::OutputMode::like(model))
        .unwrap_or_default();
    let mut staged = Vec::with_capacity(outputs.len());
    let mut files = BTreeMap::new();
    let mut used = std::collections::HashSet::new();
    for (name, value) in outputs {
        let mut value = value;
        while let Value::Optional(inner) = value {
            match inner {
                Some(inner) => value = inner,
                None => break,
            }
        }
        let mut stem = file_stem(name);
        let mut n = 1;
        while !used.insert(stem.clone()) {
            n += 1;
            stem = format!("{}_{n}", file_stem(name));
        }
        let mut declared = graph.tensor_id(name).and_then(|id| graph.tensor(id).dtype);
        let (listed, elements): (PathBuf, Vec<(PathBuf, &HostTensor)>) = match value {
            Value::Optional(_) => continue,
            Value::Map { keys, values } => {
                let path = dir.join(format!("{stem}.json"));
                crate::io::check_output(&path, inputs)?;
                let mut file = crate::io::Staged::new(&path, mode)?;
                file.file()
                    .write_all(&super::run_maps::map_json(keys, values)?)
                    .with_context(|| format!("cannot write '{}'", path.display()))?;
                staged.push(file);
                files.insert(name.clone(), path.display().to_string());
                continue;
            }
            Value::Tensor(t) => {
                let path = dir.join(format!("{stem}.npy"));
                (path.clone(), vec![(path, &**t)])
            }
            // A sequence of maps (ZipMap's) is written as its values, one row per map in the
            // order of its keys, as the staged runner writes it.
            Value::MapSequence { values, .. } => {
                declared = None;
                let path = dir.join(format!("{stem}.npy"));
                (path.clone(), vec![(path, &**values)])
            }
            Value::Sequence(items) => {
                let folder = dir.join(&stem);
                crate::io::check_output(&folder, inputs)?;
                std::fs::create_dir_all(&folder)
                    .with_context(|| format!("cannot create '{}'", folder.display()))?;
                let items = items
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (folder.join(format!("{i}.npy")), &**t))
                    .collect();
                (folder, items)
            }
        };
        for (path, tensor) in elements {
            crate::io::check_output(&path, inputs)?;
            let mut file = crate::io::Staged::new(&path, mode)?;
            let bytes = encode_npy_as(tensor, declared.unwrap_or(tensor.dtype()))
                .map_err(|e| anyhow::anyhow!("output '{name}': {e}"))?;
            file.file()
                .write_all(&bytes)
                .with_context(|| format!("cannot write '{}'", path.display()))?;
            staged.push(file);
        }
        files.insert(name.clone(), listed.display().to_string());
    }
    for file in staged {
        file.commit()?;
    }
    Ok(files)
}
