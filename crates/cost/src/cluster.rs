//! Clusters: which devices, grouped in which nodes, joined by which links; and the time to move
//! bytes between two of them.
//!
//! Written three ways: the shorthand `NODESxGPUSxDEVICE` (`2x8xH100-SXM`), a device list
//! (`A100-80GB,A100-80GB,L4,L4`, one node), or a JSON file:
//!
//! ```json
//! { "nodes": [ { "devices": ["H100-SXM", "H100-SXM"], "intra_node_link": "NVLink4" } ],
//!   "inter_node_link": "InfiniBand-NDR" }
//! ```

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::hardware::{Catalog, HardwareSpec, LinkSpec};
use crate::Error;

/// The most devices a cluster may have. A pipeline puts one stage on each device and no model
/// has more than a few thousand operators worth a stage of their own, so 16,384 is far above
/// any useful pipeline; the cap bounds what a description can make pipecut build (one full
/// profile, about 2 KB, per device: 32 MB at the cap), so that a typo such as
/// `1000x1000xH100-SXM` is refused at once instead of filling memory.
pub const MAX_DEVICES: usize = 16_384;

/// Identifies a device of a cluster: its position in node-major order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct DeviceId(pub u32);

/// One machine: its devices and the link between them.
#[derive(Debug, Clone)]
pub struct ClusterNode {
    /// Devices in the node.
    pub devices: Vec<HardwareSpec>,
    /// Link between the node's devices (`None` for a single device).
    pub intra_node_link: Option<LinkSpec>,
}

/// A set of nodes joined by a network.
#[derive(Debug, Clone)]
pub struct Cluster {
    nodes: Vec<ClusterNode>,
    inter_node_link: Option<LinkSpec>,
    description: String,
}

/// A cluster's layout as device and link names: the cluster file format, and how plans record
/// the cluster they were made for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ClusterLayout {
    /// Machines, each with its devices (profile names) and optionally its link name.
    pub nodes: Vec<NodeLayout>,
    /// The network between machines (link name); a default for the devices when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inter_node_link: Option<String>,
}

/// One machine of a [`ClusterLayout`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct NodeLayout {
    /// Device profile names.
    pub devices: Vec<String>,
    /// Link between them (link name); the devices' own when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intra_node_link: Option<String>,
}

/// Default network for nodes whose devices use `intra`: the fabric such nodes are sold with
/// (H100/H200 HGX systems with NDR InfiniBand, A100 with HDR), else 100 Gb Ethernet.
fn default_network(intra: Option<&str>) -> &'static str {
    match intra {
        Some("NVLink4") | Some("NVLink5") => "InfiniBand-NDR",
        Some("NVLink3") | Some("NVLink2") => "InfiniBand-HDR",
        _ => "Ethernet-100G",
    }
}

/// Links named for a cluster instead of its devices' defaults (`--intra-link`, `--inter-link`).
#[derive(Debug, Clone, Copy, Default)]
pub struct LinkChoice<'a> {
    /// The link between devices of one node.
    pub intra: Option<&'a str>,
    /// The network between nodes.
    pub inter: Option<&'a str>,
}

impl Cluster {
    /// Parses `NODESxGPUSxDEVICE`, `GPUSxDEVICE` or `DEVICE`.
    pub fn parse(spec: &str, catalog: &Catalog) -> Result<Cluster, Error> {
        Cluster::parse_linked(spec, catalog, LinkChoice::default())
    }

    /// [`Cluster::parse`] with the links named instead of the devices' defaults: a device
    /// without a default link (the CPU) can then have several in a node.
    pub fn parse_linked(
        spec: &str,
        catalog: &Catalog,
        links: LinkChoice,
    ) -> Result<Cluster, Error> {
        let bad = |detail: String| Error::Cluster {
            spec: spec.to_string(),
            detail,
        };
        let parts: Vec<&str> = spec.trim().splitn(3, 'x').collect();
        let count = |s: &str, what: &str| -> Result<usize, Error> {
            match s.parse::<usize>() {
                Ok(0) => Err(bad(format!("{what} must be at least 1"))),
                Ok(n) if n > MAX_DEVICES => Err(bad(format!("{n} {what} is more than pipecut plans for ({MAX_DEVICES})"))),
                Ok(n) => Ok(n),
                Err(_) => Err(bad(format!("'{s}' is not a number of {what}; expected NODESxGPUSxDEVICE such as 2x8xH100-SXM"))),
            }
        };
        // Device names may themselves contain 'x' only after the counts, so split at most twice
        // and only treat leading all-digit parts as counts.
        let (nodes, per_node, device) = match parts.as_slice() {
            [n, g, d]
                if n.chars().all(|c| c.is_ascii_digit())
                    && g.chars().all(|c| c.is_ascii_digit()) =>
            {
                (
                    count(n, "nodes")?,
                    count(g, "devices per node")?,
                    d.to_string(),
                )
            }
            [g, rest @ ..] if g.chars().all(|c| c.is_ascii_digit()) && !g.is_empty() => {
                (1, count(g, "devices per node")?, rest.join("x"))
            }
            _ => (1, 1, spec.trim().to_string()),
        };
        // Each device is a full profile in memory: refuse the product before building it, so
        // that `1000000x1000000xH100` is an error and not an attempt at 10^12 profiles.
        if nodes.saturating_mul(per_node) > MAX_DEVICES {
            return Err(bad(format!(
                "{nodes} nodes of {per_node} devices is more than pipecut plans for ({MAX_DEVICES} devices)"
            )));
        }
        let device = catalog.device(&device)?.clone();
        let nodes = (0..nodes).map(|_| vec![device.clone(); per_node]).collect();
        Cluster::assemble(nodes, links.intra, links.inter, catalog, spec.to_string())
    }

    /// A single node holding the listed devices, in pipeline order.
    pub fn from_device_list(list: &str, catalog: &Catalog) -> Result<Cluster, Error> {
        Cluster::from_device_list_linked(list, catalog, LinkChoice::default())
    }

    /// [`Cluster::from_device_list`] with the links named (see [`Cluster::parse_linked`]).
    pub fn from_device_list_linked(
        list: &str,
        catalog: &Catalog,
        links: LinkChoice,
    ) -> Result<Cluster, Error> {
        let bad = |detail: String| Error::Cluster {
            spec: list.into(),
            detail,
        };
        if list.trim().is_empty() {
            return Err(bad(
                "no devices: list at least one, e.g. --devices H100-SXM,H100-SXM".into(),
            ));
        }
        let names: Vec<&str> = list.split(',').map(str::trim).collect();
        if names.len() > MAX_DEVICES {
            return Err(bad(format!(
                "{} devices is more than pipecut plans for ({MAX_DEVICES})",
                names.len()
            )));
        }
        if let Some(position) = names.iter().position(|n| n.is_empty()) {
            return Err(bad(format!(
                "device {} of the list has no name",
                position + 1
            )));
        }
        let devices = names
            .iter()
            .map(|name| catalog.device(name).cloned())
            .collect::<Result<Vec<_>, _>>()?;
        Cluster::assemble(
            vec![devices],
            links.intra,
            links.inter,
            catalog,
            list.to_string(),
        )
    }

    /// Reads a cluster JSON file (see the module docs).
    pub fn from_file(path: &Path, catalog: &Catalog) -> Result<Cluster, Error> {
        let text = pipecut_ir::io::read_json_text(path, "cluster file")?;
        let spec = path.display().to_string();
        let layout: ClusterLayout = serde_json::from_str(&text).map_err(|e| Error::Cluster {
            spec: spec.clone(),
            detail: e.to_string(),
        })?;
        Cluster::from_layout(&layout, catalog, spec)
    }

    /// Builds a cluster from its layout; `description` is how it will be described.
    pub fn from_layout(
        layout: &ClusterLayout,
        catalog: &Catalog,
        description: String,
    ) -> Result<Cluster, Error> {
        // Counted before any profile is cloned: a 192 MB file of device names asked for 17
        // million profiles and aborted.
        let total = layout
            .nodes
            .iter()
            .fold(0usize, |sum, node| sum.saturating_add(node.devices.len()));
        if total > MAX_DEVICES {
            return Err(Error::Cluster {
                spec: description,
                detail: format!("{total} devices is more than pipecut plans for ({MAX_DEVICES})"),
            });
        }
        let mut nodes = Vec::new();
        let mut links = Vec::new();
        for node in &layout.nodes {
            nodes.push(
                node.devices
                    .iter()
                    .map(|d| catalog.device(d).cloned())
                    .collect::<Result<Vec<_>, _>>()?,
            );
            links.push(
                node.intra_node_link
                    .as_deref()
                    .map(|l| catalog.link(l).cloned())
                    .transpose()?,
            );
        }
        let mut cluster = Cluster::assemble(
            nodes,
            None,
            layout.inter_node_link.as_deref(),
            catalog,
            description,
        )?;
        for (node, link) in cluster.nodes.iter_mut().zip(links) {
            if link.is_some() {
                node.intra_node_link = link;
            }
        }
        Ok(cluster)
    }

    /// The layout with every link named, so that [`Cluster::from_layout`] rebuilds this cluster.
    pub fn layout(&self) -> ClusterLayout {
        ClusterLayout {
            nodes: self
                .nodes
                .iter()
                .map(|n| NodeLayout {
                    devices: n.devices.iter().map(|d| d.name.clone()).collect(),
                    intra_node_link: n.intra_node_link.as_ref().map(|l| l.name.clone()),
                })
                .collect(),
            inter_node_link: self.inter_node_link.as_ref().map(|l| l.name.clone()),
        }
    }

    /// The network between machines.
    pub fn inter_node_link(&self) -> Option<&LinkSpec> {
        self.inter_node_link.as_ref()
    }

    fn assemble(
        nodes: Vec<Vec<HardwareSpec>>,
        intra: Option<&str>,
        inter: Option<&str>,
        catalog: &Catalog,
        description: String,
    ) -> Result<Cluster, Error> {
        if nodes.is_empty() {
            return Err(Error::Cluster {
                spec: description,
                detail: "it has no nodes, so no devices to place stages on".into(),
            });
        }
        if nodes.iter().any(Vec::is_empty) {
            return Err(Error::Cluster {
                spec: description,
                detail: "a cluster needs at least one device in every node".into(),
            });
        }
        let total: usize = nodes.iter().map(Vec::len).sum();
        if total > MAX_DEVICES {
            return Err(Error::Cluster {
                spec: description,
                detail: format!("{total} devices is more than pipecut plans for ({MAX_DEVICES})"),
            });
        }
        let mut built = Vec::new();
        for devices in nodes {
            let link = match intra {
                Some(name) => Some(catalog.link(name)?.clone()),
                None => slowest_intra_link(&devices, catalog)?,
            };
            built.push(ClusterNode {
                devices,
                intra_node_link: link,
            });
        }
        let network = inter.unwrap_or_else(|| {
            default_network(built[0].intra_node_link.as_ref().map(|l| l.name.as_str()))
        });
        let inter_node_link = Some(catalog.link(network)?.clone());
        Ok(Cluster {
            nodes: built,
            inter_node_link,
            description,
        })
    }

    /// Replaces every node's intra-node link.
    pub fn with_intra_node_link(mut self, name: &str, catalog: &Catalog) -> Result<Cluster, Error> {
        let link = catalog.link(name)?.clone();
        for node in &mut self.nodes {
            node.intra_node_link = Some(link.clone());
        }
        Ok(self)
    }

    /// Replaces the network between nodes.
    pub fn with_inter_node_link(mut self, name: &str, catalog: &Catalog) -> Result<Cluster, Error> {
        self.inter_node_link = Some(catalog.link(name)?.clone());
        Ok(self)
    }

    /// The nodes.
    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    /// Total number of devices.
    pub fn device_count(&self) -> usize {
        self.nodes.iter().map(|n| n.devices.len()).sum()
    }

    /// Devices in node-major order, which is the default pipeline order: neighbours in the
    /// pipeline share a node wherever they can.
    pub fn devices(&self) -> impl Iterator<Item = (DeviceId, &HardwareSpec)> {
        self.nodes
            .iter()
            .flat_map(|n| n.devices.iter())
            .enumerate()
            .map(|(i, d)| (DeviceId(i as u32), d))
    }

    /// The device with this id.
    pub fn device(&self, id: DeviceId) -> &HardwareSpec {
        self.devices()
            .nth(id.0 as usize)
            .map(|(_, d)| d)
            .expect("device id from this cluster")
    }

    /// The index of the node that holds device `id`, or `None` for an id beyond the cluster.
    pub fn node_of(&self, id: DeviceId) -> Option<usize> {
        let mut index = id.0 as usize;
        for (n, node) in self.nodes.iter().enumerate() {
            if index < node.devices.len() {
                return Some(n);
            }
            index -= node.devices.len();
        }
        None
    }

    /// Bandwidth (bytes/s) and latency (s) between two devices: nothing on one device; the node's
    /// link inside a node; across nodes the network, limited by the slower of the two ends.
    pub fn link_between(&self, a: DeviceId, b: DeviceId) -> Option<(f64, f64)> {
        if a == b {
            return None;
        }
        let node = |id: DeviceId| {
            self.node_of(id)
                .unwrap_or_else(|| panic!("device id {} is not in this cluster", id.0))
        };
        let (na, nb) = (node(a), node(b));
        let intra = |n: usize| {
            self.nodes[n].intra_node_link.as_ref().map(|l| {
                (
                    l.bandwidth_bytes_per_sec_per_direction.value,
                    l.latency_secs.value,
                )
            })
        };
        if na == nb {
            return Some(intra(na).unwrap_or((f64::INFINITY, 0.0)));
        }
        let net = self
            .inter_node_link
            .as_ref()
            .expect("clusters are assembled with a network");
        let mut bandwidth = net.bandwidth_bytes_per_sec_per_direction.value;
        for end in [na, nb] {
            if let Some((bw, _)) = intra(end) {
                bandwidth = bandwidth.min(bw);
            }
        }
        Some((bandwidth, net.latency_secs.value))
    }

    /// Time to move `bytes` from device `a` to device `b`.
    pub fn transfer_secs(&self, a: DeviceId, b: DeviceId, bytes: u64) -> f64 {
        match self.link_between(a, b) {
            None => 0.0,
            Some((bandwidth, latency)) => latency + bytes as f64 / bandwidth,
        }
    }

    /// Ring all-reduce of `bytes` over `devices` (data-parallel gradient sync): each device
    /// sends and receives `2(n−1)/n · bytes` in `2(n−1)` steps over the slowest link of the ring.
    pub fn ring_all_reduce_secs(&self, devices: &[DeviceId], bytes: u64) -> f64 {
        let n = devices.len();
        if n < 2 {
            return 0.0;
        }
        let (mut bandwidth, mut latency) = (f64::INFINITY, 0.0f64);
        for i in 0..n {
            if let Some((bw, lat)) = self.link_between(devices[i], devices[(i + 1) % n]) {
                bandwidth = bandwidth.min(bw);
                latency = latency.max(lat);
            }
        }
        let steps = 2.0 * (n as f64 - 1.0);
        steps * latency + steps / n as f64 * bytes as f64 / bandwidth
    }
}

/// The slowest of the intra-node links of the devices in one node (a PCIe card among NVLink
/// cards talks over PCIe). `None` for a single device; an error for several devices of which one
/// has no inter-device link.
fn slowest_intra_link(
    devices: &[HardwareSpec],
    catalog: &Catalog,
) -> Result<Option<LinkSpec>, Error> {
    if devices.len() < 2 {
        return Ok(None);
    }
    let mut slowest: Option<LinkSpec> = None;
    for device in devices {
        let name = device.intra_node_link.as_deref().ok_or_else(|| Error::Cluster {
            spec: device.name.clone(),
            detail: format!("device '{}' has no link to other devices in its node; name one with --intra-link", device.name),
        })?;
        let link = catalog.link(name)?;
        if slowest.as_ref().is_none_or(|s| {
            link.bandwidth_bytes_per_sec_per_direction.value
                < s.bandwidth_bytes_per_sec_per_direction.value
        }) {
            slowest = Some(link.clone());
        }
    }
    Ok(slowest)
}

impl fmt::Display for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per_node: Vec<String> = self
            .nodes
            .iter()
            .map(|n| {
                let names: Vec<&str> = n.devices.iter().map(|d| d.name.as_str()).collect();
                let link = n.intra_node_link.as_ref().map_or("-", |l| l.name.as_str());
                format!("[{} via {link}]", names.join(","))
            })
            .collect();
        let network = self
            .inter_node_link
            .as_ref()
            .map_or("-", |l| l.name.as_str());
        write!(
            f,
            "{} node(s) {} joined by {network}",
            self.nodes.len(),
            per_node.join(" ")
        )
    }
}

impl Cluster {
    /// The description the cluster was built from (`2x8xH100-SXM`, a list, or a path).
    pub fn description(&self) -> &str {
        &self.description
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shorthand_builds_nodes_with_default_links() {
        let catalog = Catalog::builtin();
        let c = Cluster::parse("2x8xH100-SXM", &catalog).unwrap();
        assert_eq!(c.device_count(), 16);
        assert_eq!(
            c.nodes()[0].intra_node_link.as_ref().unwrap().name,
            "NVLink4"
        );
        // Inside a node: NVLink4, 450 GB/s; across: NDR, 50 GB/s.
        let (bw_in, _) = c.link_between(DeviceId(0), DeviceId(7)).unwrap();
        let (bw_out, _) = c.link_between(DeviceId(7), DeviceId(8)).unwrap();
        assert!(bw_in > 4e11 && bw_out < 6e10, "{bw_in} {bw_out}");
        assert_eq!(c.transfer_secs(DeviceId(3), DeviceId(3), 1 << 30), 0.0);
        let c = c.with_inter_node_link("Ethernet-400G", &catalog).unwrap();
        assert!(c.to_string().contains("Ethernet-400G"));
    }

    #[test]
    fn device_lists_use_the_slowest_link() {
        let catalog = Catalog::builtin();
        let c = Cluster::from_device_list("A100-80GB,A100-80GB,L4,L4", &catalog).unwrap();
        assert_eq!(
            c.nodes()[0].intra_node_link.as_ref().unwrap().name,
            "PCIe-Gen4-x16"
        );
    }

    #[test]
    fn bad_clusters_are_explained() {
        let catalog = Catalog::builtin();
        let zero = Cluster::parse("0x8xH100-SXM", &catalog)
            .unwrap_err()
            .to_string();
        assert!(zero.contains("at least 1"), "{zero}");
        let unknown = Cluster::parse("1x8xH900", &catalog)
            .unwrap_err()
            .to_string();
        assert!(
            unknown.contains("H900") && unknown.contains("H100-SXM"),
            "{unknown}"
        );
        let mut catalog = catalog;
        let unlinked = include_str!("../../../cost-models/devices/cpu.json")
            .replace("CPU-x86-64-AVX2-2C", "unlinked-cpu")
            .replace("\"Host-Memory\"", "null")
            .replace("\"cpu\", ", "");
        catalog.add_device_json(&unlinked, "test").unwrap();
        let cpu = Cluster::parse("1x2xunlinked-cpu", &catalog)
            .unwrap_err()
            .to_string();
        assert!(cpu.contains("--intra-link"), "{cpu}");
        // Naming the link is the fix the error suggests, for every shorthand (issue 16).
        let links = LinkChoice {
            intra: Some("Host-Memory"),
            inter: None,
        };
        let named = Cluster::parse_linked("1x2xunlinked-cpu", &catalog, links).unwrap();
        assert_eq!(named.device_count(), 2);
        Cluster::from_device_list_linked("unlinked-cpu,unlinked-cpu", &catalog, links).unwrap();
    }

    #[test]
    fn cpus_of_one_machine_share_host_memory() {
        let catalog = Catalog::builtin();
        for cluster in [
            Cluster::parse("1x2xcpu", &catalog).unwrap(),
            Cluster::from_device_list("cpu,cpu", &catalog).unwrap(),
        ] {
            let link = cluster.nodes()[0].intra_node_link.as_ref().unwrap();
            assert_eq!(link.name, "Host-Memory");
        }
    }

    #[test]
    fn ring_all_reduce_matches_the_closed_form() {
        let catalog = Catalog::builtin();
        let c = Cluster::parse("1x4xA100-80GB", &catalog).unwrap();
        let link = catalog.link("NVLink3").unwrap();
        let bytes = 1u64 << 30;
        let devices: Vec<DeviceId> = c.devices().map(|(id, _)| id).collect();
        let expected = 6.0 * link.latency_secs.value
            + 1.5 * bytes as f64 / link.bandwidth_bytes_per_sec_per_direction.value;
        assert!((c.ring_all_reduce_secs(&devices, bytes) - expected).abs() < 1e-12);
    }
}
