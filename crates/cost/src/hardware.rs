//! Hardware profiles: devices and interconnect links, read from `cost-models/*.json`.
//!
//! Every number carries the source it came from (datasheet, whitepaper, measurement), so that a
//! plan can say where its figures come from. The profiles shipped in `cost-models/` are compiled
//! into the binary, so pipecut works from any directory; more profiles (for example calibrated
//! ones) are read from files with [`Catalog::add_file`].

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::Error;
use pipecut_ir::graph::DType;

/// A number and where it comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sourced<T> {
    /// The value; `None` (JSON `null`) where the hardware lacks the feature.
    pub value: T,
    /// Datasheet, paper or measurement the value comes from.
    pub source: String,
}

/// Peak dense throughput (no structured sparsity) per element type, in FLOP/s (or OP/s).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct PeakFlops {
    pub fp32: Sourced<Option<f64>>,
    pub tf32: Sourced<Option<f64>>,
    pub fp16: Sourced<Option<f64>>,
    pub bf16: Sourced<Option<f64>>,
    pub fp8: Sourced<Option<f64>>,
    pub int8: Sourced<Option<f64>>,
}

/// Classes of operators that reach different fractions of the hardware's peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpClass {
    /// Matrix products: compute-bound on tensor cores.
    Matmul,
    /// Convolutions.
    Conv,
    /// Pointwise maths: memory-bound.
    Elementwise,
    /// Reductions and normalisations.
    Reduction,
    /// Copies, transposes, gathers, concatenations.
    DataMovement,
}

/// Achievable fraction of peak per op class: of peak FLOP/s for compute-bound classes, of memory
/// bandwidth for memory-bound ones (the roofline takes the slower of the two).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct Efficiency {
    pub matmul: Sourced<f64>,
    pub conv: Sourced<f64>,
    pub elementwise: Sourced<f64>,
    pub reduction: Sourced<f64>,
    pub data_movement: Sourced<f64>,
}

impl OpClass {
    /// Every class, in a fixed order.
    pub const ALL: [OpClass; 5] = [
        OpClass::Matmul,
        OpClass::Conv,
        OpClass::Elementwise,
        OpClass::Reduction,
        OpClass::DataMovement,
    ];
}

impl Efficiency {
    /// The efficiency of an op class, with its source.
    pub fn sourced_mut(&mut self, class: OpClass) -> &mut Sourced<f64> {
        match class {
            OpClass::Matmul => &mut self.matmul,
            OpClass::Conv => &mut self.conv,
            OpClass::Elementwise => &mut self.elementwise,
            OpClass::Reduction => &mut self.reduction,
            OpClass::DataMovement => &mut self.data_movement,
        }
    }

    /// The efficiency of an op class.
    pub fn of(&self, class: OpClass) -> f64 {
        match class {
            OpClass::Matmul => self.matmul.value,
            OpClass::Conv => self.conv.value,
            OpClass::Elementwise => self.elementwise.value,
            OpClass::Reduction => self.reduction.value,
            OpClass::DataMovement => self.data_movement.value,
        }
    }
}

/// A device profile (`cost-models/devices/*.json`, schema `pipecut-device-v1`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareSpec {
    /// Schema tag, `pipecut-device-v1`.
    pub schema: String,
    /// Canonical name, e.g. `H100-SXM`.
    pub name: String,
    /// Other names it answers to (case-insensitive).
    pub aliases: Vec<String>,
    /// Manufacturer.
    pub vendor: String,
    /// `gpu` or `cpu`.
    pub kind: String,
    /// Memory capacity.
    pub memory_bytes: Sourced<u64>,
    /// Memory bandwidth.
    pub memory_bandwidth_bytes_per_sec: Sourced<f64>,
    /// Peak dense throughput per dtype.
    pub peak_flops_per_sec: PeakFlops,
    /// Fixed cost of launching one kernel.
    pub kernel_launch_overhead_secs: Sourced<f64>,
    /// Achievable fractions of peak.
    pub efficiency: Efficiency,
    /// Name of the link between devices of this kind inside one node, if any.
    pub intra_node_link: Option<String>,
    /// Free text.
    #[serde(default)]
    pub notes: String,
}

impl HardwareSpec {
    /// Peak FLOP/s for tensor-core (matmul/conv) work on `dtype`: fp16/bf16/fp8/int8 use their
    /// own rates; fp32 uses the plain fp32 rate (TF32 only where the user opts in, since it
    /// changes numerics); types without a rate fall back to fp32, the rate they are upcast to.
    pub fn peak_flops(&self, dtype: DType) -> f64 {
        let p = &self.peak_flops_per_sec;
        let rate = match dtype {
            DType::F16 => p.fp16.value,
            DType::BF16 => p.bf16.value,
            DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ => p.fp8.value,
            DType::I8 | DType::U8 | DType::I4 | DType::U4 | DType::I2 | DType::U2 => p.int8.value,
            _ => None,
        };
        rate.or(p.fp32.value).unwrap_or(f64::MIN_POSITIVE)
    }

    /// Peak FLOP/s of the plain (CUDA-core) fp32 pipeline, used for pointwise maths.
    pub fn vector_flops(&self) -> f64 {
        self.peak_flops_per_sec
            .fp32
            .value
            .unwrap_or(f64::MIN_POSITIVE)
    }

    fn answers_to(&self, name: &str) -> bool {
        self.name.eq_ignore_ascii_case(name)
            || self.aliases.iter().any(|a| a.eq_ignore_ascii_case(name))
    }

    fn check(&self) -> Result<(), String> {
        check_figure(
            "memory_bandwidth_bytes_per_sec",
            self.memory_bandwidth_bytes_per_sec.value,
            RATE_RANGE,
        )?;
        check_figure(
            "kernel_launch_overhead_secs",
            self.kernel_launch_overhead_secs.value,
            SECS_RANGE,
        )?;
        let peak = &self.peak_flops_per_sec;
        for (field, value) in [
            ("fp32", peak.fp32.value),
            ("tf32", peak.tf32.value),
            ("fp16", peak.fp16.value),
            ("bf16", peak.bf16.value),
            ("fp8", peak.fp8.value),
            ("int8", peak.int8.value),
        ] {
            if let Some(value) = value {
                check_figure(&format!("peak_flops_per_sec.{field}"), value, RATE_RANGE)?;
            }
        }
        if self.memory_bytes.value == 0 {
            return Err("memory_bytes must be positive".into());
        }
        if self
            .peak_flops_per_sec
            .fp32
            .value
            .is_none_or(|v| !(v.is_finite() && v > 0.0))
        {
            return Err("peak_flops_per_sec.fp32 must be a positive number".into());
        }
        for class in OpClass::ALL {
            let e = self.efficiency.of(class);
            if !(e > 0.0 && e <= 1.0) {
                return Err(format!(
                    "efficiency of {class:?} must be in (0, 1], got {e}"
                ));
            }
        }
        Ok(())
    }
}

/// Rates a profile may give (bytes or FLOPs per second): from 10^3, below which any real device's
/// figure is a unit mistake and times of 2^64 bytes would still be finite (a denormal bandwidth
/// made every time infinite, and the plan's figures `null`), to 10^21, a million times today's
/// fastest accelerator.
const RATE_RANGE: (f64, f64) = (1e3, 1e21);

/// Fixed times a profile may give (launch overhead, link latency): 0 to 1 s, a thousand times
/// any real launch or hop.
const SECS_RANGE: (f64, f64) = (0.0, 1.0);

/// Refuses a profile figure outside `(min, max)` (both inclusive), NaN and infinities included.
fn check_figure(field: &str, value: f64, (min, max): (f64, f64)) -> Result<(), String> {
    if value >= min && value <= max {
        Ok(())
    } else {
        Err(format!(
            "{field} is {value:e}, outside the {min:e} to {max:e} pipecut accepts"
        ))
    }
}

/// Where a link sits in a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkScope {
    /// Between devices of one node (NVLink, PCIe).
    IntraNode,
    /// Between nodes (InfiniBand, Ethernet).
    InterNode,
}

/// An interconnect profile (`cost-models/links/*.json`, schema `pipecut-link-v1`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    /// Schema tag, `pipecut-link-v1`.
    pub schema: String,
    /// Canonical name, e.g. `NVLink4`.
    pub name: String,
    /// Other names it answers to.
    pub aliases: Vec<String>,
    /// One-way bandwidth between one pair of endpoints.
    pub bandwidth_bytes_per_sec_per_direction: Sourced<f64>,
    /// One-way latency of a small message.
    pub latency_secs: Sourced<f64>,
    /// Intra- or inter-node.
    pub scope: LinkScope,
    /// Free text.
    #[serde(default)]
    pub notes: String,
}

impl LinkSpec {
    /// Time to move `bytes` over this link: latency plus bytes over bandwidth.
    pub fn transfer_secs(&self, bytes: u64) -> f64 {
        self.latency_secs.value + bytes as f64 / self.bandwidth_bytes_per_sec_per_direction.value
    }

    fn answers_to(&self, name: &str) -> bool {
        self.name.eq_ignore_ascii_case(name)
            || self.aliases.iter().any(|a| a.eq_ignore_ascii_case(name))
    }
}

const BUILTIN_DEVICES: &[(&str, &str)] = &[
    (
        "a100-40gb.json",
        include_str!("../../../cost-models/devices/a100-40gb.json"),
    ),
    (
        "a100-sxm-80gb.json",
        include_str!("../../../cost-models/devices/a100-sxm-80gb.json"),
    ),
    (
        "cpu.json",
        include_str!("../../../cost-models/devices/cpu.json"),
    ),
    (
        "h100-pcie.json",
        include_str!("../../../cost-models/devices/h100-pcie.json"),
    ),
    (
        "h100-sxm.json",
        include_str!("../../../cost-models/devices/h100-sxm.json"),
    ),
    (
        "h200.json",
        include_str!("../../../cost-models/devices/h200.json"),
    ),
    (
        "l4.json",
        include_str!("../../../cost-models/devices/l4.json"),
    ),
    (
        "l40s.json",
        include_str!("../../../cost-models/devices/l40s.json"),
    ),
    (
        "mi300x.json",
        include_str!("../../../cost-models/devices/mi300x.json"),
    ),
    (
        "rtx-4090.json",
        include_str!("../../../cost-models/devices/rtx-4090.json"),
    ),
    (
        "v100-32gb.json",
        include_str!("../../../cost-models/devices/v100-32gb.json"),
    ),
];

const BUILTIN_LINKS: &[(&str, &str)] = &[
    (
        "host-memory.json",
        include_str!("../../../cost-models/links/host-memory.json"),
    ),
    (
        "ethernet-100g.json",
        include_str!("../../../cost-models/links/ethernet-100g.json"),
    ),
    (
        "ethernet-400g.json",
        include_str!("../../../cost-models/links/ethernet-400g.json"),
    ),
    (
        "infiniband-hdr.json",
        include_str!("../../../cost-models/links/infiniband-hdr.json"),
    ),
    (
        "infiniband-ndr.json",
        include_str!("../../../cost-models/links/infiniband-ndr.json"),
    ),
    (
        "infinity-fabric-mi300x.json",
        include_str!("../../../cost-models/links/infinity-fabric-mi300x.json"),
    ),
    (
        "nvlink2.json",
        include_str!("../../../cost-models/links/nvlink2.json"),
    ),
    (
        "nvlink3.json",
        include_str!("../../../cost-models/links/nvlink3.json"),
    ),
    (
        "nvlink4.json",
        include_str!("../../../cost-models/links/nvlink4.json"),
    ),
    (
        "nvlink5.json",
        include_str!("../../../cost-models/links/nvlink5.json"),
    ),
    (
        "pcie-gen4-x16.json",
        include_str!("../../../cost-models/links/pcie-gen4-x16.json"),
    ),
    (
        "pcie-gen5-x16.json",
        include_str!("../../../cost-models/links/pcie-gen5-x16.json"),
    ),
];

/// The known devices and links: the built-in profiles plus any added from files.
#[derive(Debug, Clone)]
pub struct Catalog {
    devices: BTreeMap<String, HardwareSpec>,
    links: BTreeMap<String, LinkSpec>,
    /// Where each profile came from, by `device:NAME` or `link:NAME`: a built-in file's name or
    /// the path it was read from.
    origins: BTreeMap<String, String>,
}

/// The environment variable naming folders of extra profiles (`devices/*.json`,
/// `links/*.json`), separated like `PATH`.
pub const COST_MODELS_ENV: &str = "PIPECUT_COST_MODELS";

impl Catalog {
    /// The profiles shipped in `cost-models/`.
    pub fn builtin() -> Catalog {
        let mut catalog = Catalog {
            devices: BTreeMap::new(),
            links: BTreeMap::new(),
            origins: BTreeMap::new(),
        };
        for (file, text) in BUILTIN_DEVICES {
            catalog
                .add_device_json(text, file)
                .expect("built-in device profiles are valid (tested)");
        }
        for (file, text) in BUILTIN_LINKS {
            catalog
                .add_link_json(text, file)
                .expect("built-in link profiles are valid (tested)");
        }
        catalog
    }

    /// Adds (or replaces, by name) a device profile given as JSON text.
    pub fn add_device_json(&mut self, text: &str, origin: &str) -> Result<&HardwareSpec, Error> {
        let spec: HardwareSpec = serde_json::from_str(text).map_err(|e| Error::Profile {
            origin: origin.into(),
            detail: e.to_string(),
        })?;
        if spec.schema != "pipecut-device-v1" {
            return Err(Error::Profile {
                origin: origin.into(),
                detail: format!("schema is '{}', expected 'pipecut-device-v1'", spec.schema),
            });
        }
        spec.check().map_err(|detail| Error::Profile {
            origin: origin.into(),
            detail,
        })?;
        let name = spec.name.clone();
        self.origins
            .insert(format!("device:{name}"), origin.to_string());
        self.devices.insert(name.clone(), spec);
        Ok(&self.devices[&name])
    }

    /// Adds (or replaces, by name) a link profile given as JSON text.
    pub fn add_link_json(&mut self, text: &str, origin: &str) -> Result<&LinkSpec, Error> {
        let spec: LinkSpec = serde_json::from_str(text).map_err(|e| Error::Profile {
            origin: origin.into(),
            detail: e.to_string(),
        })?;
        let fail = |detail: String| Error::Profile {
            origin: origin.into(),
            detail,
        };
        if spec.schema != "pipecut-link-v1" {
            return Err(fail(format!(
                "schema is '{}', expected 'pipecut-link-v1'",
                spec.schema
            )));
        }
        check_figure(
            "bandwidth_bytes_per_sec_per_direction",
            spec.bandwidth_bytes_per_sec_per_direction.value,
            RATE_RANGE,
        )
        .and_then(|()| check_figure("latency_secs", spec.latency_secs.value, SECS_RANGE))
        .map_err(fail)?;
        let name = spec.name.clone();
        self.origins
            .insert(format!("link:{name}"), origin.to_string());
        self.links.insert(name.clone(), spec);
        Ok(&self.links[&name])
    }

    /// Adds a device or link profile from a JSON file, by its `schema` field.
    pub fn add_file(&mut self, path: &Path) -> Result<String, Error> {
        let text = pipecut_ir::io::read_json_text(path, "device or link profile")?;
        let origin = path.display().to_string();
        if text.contains("pipecut-link-v1") {
            Ok(self.add_link_json(&text, &origin)?.name.clone())
        } else {
            Ok(self.add_device_json(&text, &origin)?.name.clone())
        }
    }

    /// Looks a device up by name or alias (case-insensitive), by the path of the file it was
    /// read from, or by a prefix that only one device's name or alias has (`A100` is ambiguous
    /// when both A100s are known: the error lists them).
    pub fn device(&self, name: &str) -> Result<&HardwareSpec, Error> {
        if let Some(device) = self.devices.values().find(|d| d.answers_to(name)) {
            return Ok(device);
        }
        if let Some(device) = self
            .devices
            .values()
            .find(|d| self.origins[&format!("device:{}", d.name)] == name)
        {
            return Ok(device);
        }
        let candidates: Vec<&HardwareSpec> = self
            .devices
            .values()
            .filter(|d| {
                std::iter::once(&d.name)
                    .chain(&d.aliases)
                    .any(|n| starts_like(n, name))
            })
            .collect();
        match candidates.as_slice() {
            [only] => Ok(only),
            [] => Err(Error::UnknownHardware {
                kind: "device",
                name: name.to_string(),
                known: self.devices.keys().cloned().collect::<Vec<_>>().join(", "),
            }),
            several => Err(Error::AmbiguousHardware {
                name: name.to_string(),
                choices: several
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// Adds the profiles in the folders `PIPECUT_COST_MODELS` names, laid out as `cost-models/`
    /// (`devices/*.json`, `links/*.json`): a user's own devices and links, or edited copies of
    /// the built-in ones (a file replaces the profile of its name).
    pub fn with_user_profiles(mut self) -> Result<Catalog, Error> {
        let Some(dirs) = std::env::var_os(COST_MODELS_ENV) else {
            return Ok(self);
        };
        for dir in std::env::split_paths(&dirs).filter(|d| !d.as_os_str().is_empty()) {
            for folder in [dir.join("devices"), dir.join("links")] {
                let Ok(entries) = std::fs::read_dir(&folder) else {
                    continue;
                };
                let mut files: Vec<std::path::PathBuf> = entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "json") && p.is_file())
                    .collect();
                files.sort();
                for file in files {
                    self.add_file(&file)?;
                }
            }
        }
        Ok(self)
    }

    /// Where a device's or link's profile came from (`device:NAME`, `link:NAME`).
    pub fn origin(&self, key: &str) -> Option<&str> {
        self.origins.get(key).map(String::as_str)
    }

    /// Looks a link up by name or alias (case-insensitive).
    pub fn link(&self, name: &str) -> Result<&LinkSpec, Error> {
        self.links
            .values()
            .find(|l| l.answers_to(name))
            .ok_or_else(|| Error::UnknownHardware {
                kind: "link",
                name: name.to_string(),
                known: self.links.keys().cloned().collect::<Vec<_>>().join(", "),
            })
    }

    /// All devices, by name.
    pub fn devices(&self) -> impl Iterator<Item = &HardwareSpec> {
        self.devices.values()
    }

    /// All links, by name.
    pub fn links(&self) -> impl Iterator<Item = &LinkSpec> {
        self.links.values()
    }
}

/// Whether `name` starts with `prefix`, ignoring case and the separators `-`, `_` and space.
fn starts_like(name: &str, prefix: &str) -> bool {
    let squash = |s: &str| -> String {
        s.chars()
            .filter(|c| !matches!(c, '-' | '_' | ' '))
            .flat_map(char::to_lowercase)
            .collect()
    };
    let prefix = squash(prefix);
    !prefix.is_empty() && squash(name).starts_with(&prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_profiles_parse_and_link_up() {
        let catalog = Catalog::builtin();
        assert_eq!(catalog.devices().count(), BUILTIN_DEVICES.len());
        assert_eq!(catalog.links().count(), BUILTIN_LINKS.len());
        for device in catalog.devices() {
            if let Some(link) = &device.intra_node_link {
                catalog.link(link).unwrap();
            }
        }
        assert_eq!(catalog.device("h100-sxm5").unwrap().name, "H100-SXM");
        // A unique prefix is enough; one two profiles share is an error that lists both.
        assert_eq!(catalog.device("mi300").unwrap().name, "MI300X");
        for (short, choices) in [
            ("A100", "A100-SXM-40GB, A100-SXM-80GB"),
            ("h100", "H100-PCIe, H100-SXM"),
        ] {
            let msg = catalog.device(short).unwrap_err().to_string();
            assert!(msg.contains("ambiguous") && msg.contains(choices), "{msg}");
        }
        assert_eq!(catalog.device("A100-80GB").unwrap().name, "A100-SXM-80GB");
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let msg = Catalog::builtin().device("H900").unwrap_err().to_string();
        assert!(
            msg.contains("'H900'") && msg.contains("H100-SXM") && msg.contains("MI300X"),
            "{msg}"
        );
    }

    #[test]
    fn every_builtin_file_is_in_the_catalog_source() {
        // A profile added to cost-models/ must be added to BUILTIN_* too.
        for (kind, list) in [("devices", BUILTIN_DEVICES), ("links", BUILTIN_LINKS)] {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../cost-models")
                .join(kind);
            let on_disk = std::fs::read_dir(dir)
                .unwrap()
                .filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .path()
                        .extension()
                        .is_some_and(|x| x == "json")
                })
                .count();
            assert_eq!(on_disk, list.len(), "{kind}");
        }
    }
}
