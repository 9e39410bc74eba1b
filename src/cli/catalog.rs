//! The device and link profiles a command can use, and `pipecut catalog`, which lists them.
//!
//! A command's catalog is the built-in profiles (`cost-models/`, compiled in), then the folders
//! `PIPECUT_COST_MODELS` names, then each `--device-profile FILE`, then any `.json` file a
//! cluster option names as a device (`--devices cal.json,cal.json`, `--cluster 1x2xcal.json`).
//! A later profile of the same name replaces an earlier one; plans record each profile's
//! sha256, so `check` and `run` refuse a plan whose profiles changed.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::cost::hardware::COST_MODELS_ENV;
use crate::cost::Catalog;
use clap::Args;
use serde::Serialize;

use super::print_stdout;

/// `--device-profile`: profiles beyond the built-in ones.
#[derive(Debug, Args, Default)]
pub struct CatalogArgs {
    /// A device or link profile JSON file to use beside the built-in ones (repeatable), e.g. one
    /// written by `pipecut calibrate`; a plan made with it needs it again to check or run.
    #[arg(long = "device-profile", value_name = "FILE.json")]
    device_profiles: Vec<PathBuf>,
}

impl CatalogArgs {
    /// The catalog with these files, plus the `.json` device names in `specs` that are files.
    pub fn catalog(&self, specs: &[&str]) -> anyhow::Result<Catalog> {
        let mut catalog = Catalog::builtin().with_user_profiles()?;
        for file in &self.device_profiles {
            catalog.add_file(file)?;
        }
        for name in specs.iter().flat_map(|spec| device_names_in(spec)) {
            let path = Path::new(name);
            if name.ends_with(".json") && path.is_file() {
                catalog.add_file(path)?;
            }
        }
        Ok(catalog)
    }
}

/// The device names a `--devices` list or a `--cluster` shorthand holds.
fn device_names_in(spec: &str) -> Vec<&str> {
    spec.split(',')
        .map(|part| {
            let mut counts = part.trim().splitn(3, 'x');
            match (counts.next(), counts.next(), counts.next()) {
                (Some(n), Some(g), Some(d)) if is_count(n) && is_count(g) => d,
                (Some(g), Some(_), _) if is_count(g) => {
                    part.trim().split_once('x').map_or(part, |(_, d)| d)
                }
                _ => part.trim(),
            }
        })
        .collect()
}

fn is_count(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_digit())
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    catalog: CatalogArgs,
    /// Print the catalog as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Entry {
    kind: &'static str,
    name: String,
    aliases: Vec<String>,
    /// Memory (devices) in bytes.
    memory_bytes: Option<u64>,
    /// Peak dense fp16 (else fp32) FLOP/s, devices; bandwidth per direction, links.
    peak: f64,
    origin: String,
    sha256: String,
}

/// `pipecut catalog`: every device and link profile this command line would use.
pub fn run(args: ListArgs) -> anyhow::Result<ExitCode> {
    let catalog = args.catalog.catalog(&[])?;
    let hash = |json: Vec<u8>| crate::cost::measured::content_sha256(&json);
    let mut entries = Vec::new();
    for d in catalog.devices() {
        let fp16 = d.peak_flops_per_sec.fp16.value;
        entries.push(Entry {
            kind: "device",
            name: d.name.clone(),
            aliases: d.aliases.clone(),
            memory_bytes: Some(d.memory_bytes.value),
            peak: fp16.or(d.peak_flops_per_sec.fp32.value).unwrap_or(0.0),
            origin: catalog
                .origin(&format!("device:{}", d.name))
                .unwrap_or("")
                .into(),
            sha256: hash(serde_json::to_vec(d)?),
        });
    }
    for l in catalog.links() {
        entries.push(Entry {
            kind: "link",
            name: l.name.clone(),
            aliases: l.aliases.clone(),
            memory_bytes: None,
            peak: l.bandwidth_bytes_per_sec_per_direction.value,
            origin: catalog
                .origin(&format!("link:{}", l.name))
                .unwrap_or("")
                .into(),
            sha256: hash(serde_json::to_vec(l)?),
        });
    }
    if args.json {
        print_stdout(&(serde_json::to_string_pretty(&entries)? + "\n"))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = format!(
        "{:<7} {:<22} {:>10} {:>14}  {:<13} origin\n",
        "kind", "name", "memory", "peak", "sha256"
    );
    for e in &entries {
        let memory = e
            .memory_bytes
            .map(|b| format!("{:.0} GiB", b as f64 / (1u64 << 30) as f64))
            .unwrap_or_default();
        let peak = match e.kind {
            "device" => format!("{:.1} TFLOP/s", e.peak / 1e12),
            _ => format!("{:.1} GB/s", e.peak / 1e9),
        };
        out += &format!(
            "{:<7} {:<22} {:>10} {:>14}  {:.12}  {}\n",
            e.kind, e.name, memory, peak, e.sha256, e.origin
        );
    }
    out += &format!(
        "\nBuilt-in profiles are compiled in from cost-models/; add your own with --device-profile FILE or a folder in {COST_MODELS_ENV}.\n"
    );
    print_stdout(&out)?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_come_out_of_every_shorthand() {
        assert_eq!(device_names_in("2x8xH100-SXM"), ["H100-SXM"]);
        assert_eq!(device_names_in("4xcal.json"), ["cal.json"]);
        assert_eq!(device_names_in("cpu, ./my.json"), ["cpu", "./my.json"]);
        assert_eq!(device_names_in("l4"), ["l4"]);
    }
}
