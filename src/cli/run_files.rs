//! The tensors a run reads and writes as `.npy` files: `--input NAME=FILE.npy` arguments, and
//! one file per graph output, written all or none.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use crate::runtime::{encode_npy, read_npy, Tensors};
use anyhow::{bail, Context};

/// Reads `NAME=FILE.npy` arguments; the file's stored dtype must be the model's.
pub(crate) fn read_inputs(args: &[String], graph: &crate::graph::Graph) -> anyhow::Result<Tensors> {
    let mut inputs = Tensors::new();
    for arg in args {
        let (name, file) = arg
            .split_once('=')
            .with_context(|| format!("--input '{arg}' is not NAME=FILE.npy"))?;
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
        let array = read_npy(Path::new(file))?;
        if let Some(want) = graph.tensor(id).dtype {
            if array.stored != want {
                bail!(
                    "input '{name}' must be {want}, but '{file}' holds {}",
                    array.stored
                );
            }
        }
        if inputs
            .insert(name.to_string(), Arc::new(array.tensor))
            .is_some()
        {
            bail!("input '{name}' is given twice");
        }
    }
    Ok(inputs)
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

/// Writes every output as `<name>.npy` in `dir`: all to exclusive temporary files first
/// (`crate::io::Staged`), then renamed, so that a failure leaves no partial set of outputs and
/// a link planted in `dir` is never followed. The run's inputs are never overwritten.
pub(crate) fn write_outputs(
    dir: &Path,
    outputs: &Tensors,
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
    for (name, tensor) in outputs {
        let mut stem = file_stem(name);
        let mut n = 1;
        while !used.insert(stem.clone()) {
            n += 1;
            stem = format!("{}_{n}", file_stem(name));
        }
        let path = dir.join(format!("{stem}.npy"));
        crate::io::check_output(&path, inputs)?;
        let mut file = crate::io::Staged::new(&path, mode)?;
        file.file()
            .write_all(&encode_npy(tensor))
            .with_context(|| format!("cannot write '{}'", path.display()))?;
        files.insert(name.clone(), path.display().to_string());
        staged.push(file);
    }
    for file in staged {
        file.commit()?;
    }
    Ok(files)
}
