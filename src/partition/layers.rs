//! Layers: the units the peers' partitioners count. DeepSpeed and torchgpipe cut a list of
//! modules, not a graph, so to reimplement them on the same costs pipecut recovers that list
//! from node names, which exporters fill with module scopes (`/model/layers.12/mlp/MatMul`).
//!
//! Rule: if one family of numbered scopes (`layers.0`, `layers.1`, … under the same parent)
//! covers at least half the nodes, each numbered block is a layer, everything before the first
//! block is one layer (embeddings), everything after the last is one layer (final norm and
//! head), and nodes between blocks join the block before them. Otherwise each top-level scope
//! (`/conv1`, `/layer2`, `/fc`) is a layer, which matches how torchgpipe flattens a CNN into an
//! `nn.Sequential` of its children. Layers are contiguous in the topological order, so every
//! partition of layers is a contiguous (convex) partition of nodes.

use std::collections::BTreeMap;

/// A layer: a named, contiguous range of positions in the topological order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    /// Name, e.g. `/model/layers.3`.
    pub name: String,
    /// First position.
    pub start: usize,
    /// One past the last position.
    pub end: usize,
}

/// Scope segments of a node name: all path segments but the last (the op instance).
fn scopes(name: &str) -> Vec<&str> {
    let mut parts: Vec<&str> = name.split('/').filter(|s| !s.is_empty()).collect();
    parts.pop();
    parts
}

/// `layers.12` → `("layers", 12)`.
fn numbered(segment: &str) -> Option<(&str, u64)> {
    let (stem, index) = segment.rsplit_once('.')?;
    if stem.is_empty() || index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stem, index.parse().ok()?))
}

/// The block of a node: (family path, index), e.g. (`/model/layers`, 3).
fn block_of(name: &str) -> Option<(String, u64)> {
    let parts = scopes(name);
    for (depth, segment) in parts.iter().enumerate() {
        if let Some((stem, index)) = numbered(segment) {
            let mut family = String::new();
            for p in &parts[..depth] {
                family.push('/');
                family.push_str(p);
            }
            family.push('/');
            family.push_str(stem);
            return Some((family, index));
        }
    }
    None
}

/// Layers of a model whose nodes, in topological order, have these names.
pub fn find_layers(names: &[String]) -> Vec<Layer> {
    let blocks: Vec<Option<(String, u64)>> = names.iter().map(|n| block_of(n)).collect();
    let mut family_nodes: BTreeMap<&str, (usize, Vec<u64>)> = BTreeMap::new();
    for (family, index) in blocks.iter().flatten() {
        let entry = family_nodes.entry(family).or_default();
        entry.0 += 1;
        entry.1.push(*index);
    }
    let best = family_nodes
        .iter()
        .filter(|(_, (_, indices))| {
            let mut distinct = indices.clone();
            distinct.sort_unstable();
            distinct.dedup();
            distinct.len() >= 2
        })
        .max_by_key(|(family, (count, _))| (*count, std::cmp::Reverse(*family)))
        .map(|(family, (count, _))| (family.to_string(), *count));
    let labels: Vec<String> = match best {
        Some((family, count)) if 2 * count >= names.len() => block_labels(names, &blocks, &family),
        _ => names
            .iter()
            .map(|n| match scopes(n).first() {
                Some(top) => format!("/{top}"),
                None => n.clone(),
            })
            .collect(),
    };
    runs(&labels)
}

/// A family of numbered scopes (`/model/layers` for `/model/layers.0`, `/model/layers.1`, …) at
/// any depth of the node names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockFamily {
    /// The family path, e.g. `/model/layers`.
    pub family: String,
    /// Distinct block indices.
    pub blocks: usize,
    /// Nodes inside one of its blocks.
    pub nodes: usize,
}

/// Every family of numbered scopes with at least two blocks, at every depth (an outer
/// `nn.Sequential` `/model/model.0` and the encoder layers inside it,
/// `/model/model.0/encoder/layer.N`, are both families), sorted by family path.
pub fn block_families(names: &[String]) -> Vec<BlockFamily> {
    let mut families: BTreeMap<String, (usize, Vec<u64>)> = BTreeMap::new();
    for name in names {
        let parts = scopes(name);
        let mut path = String::new();
        for segment in parts {
            if let Some((stem, index)) = numbered(segment) {
                let entry = families.entry(format!("{path}/{stem}")).or_default();
                entry.0 += 1;
                entry.1.push(index);
            }
            path.push('/');
            path.push_str(segment);
        }
    }
    families
        .into_iter()
        .filter_map(|(family, (nodes, mut indices))| {
            indices.sort_unstable();
            indices.dedup();
            (indices.len() >= 2).then_some(BlockFamily {
                family,
                blocks: indices.len(),
                nodes,
            })
        })
        .collect()
}

/// Layers as [`find_layers`] makes them in block mode, with the blocks of `family` (from
/// [`block_families`]) whatever its depth: `prologue`, `{family}.{i}` per block, `epilogue`.
pub fn find_layers_of_family(names: &[String], family: &str) -> Vec<Layer> {
    let blocks: Vec<Option<(String, u64)>> = names
        .iter()
        .map(|name| {
            let parts = scopes(name);
            let mut path = String::new();
            for segment in parts {
                if let Some((stem, index)) = numbered(segment) {
                    if path.len() + 1 + stem.len() == family.len()
                        && family.starts_with(&path)
                        && family[path.len()..].strip_prefix('/') == Some(stem)
                    {
                        return Some((family.to_string(), index));
                    }
                }
                path.push('/');
                path.push_str(segment);
            }
            None
        })
        .collect();
    runs(&block_labels(names, &blocks, family))
}

fn block_labels(names: &[String], blocks: &[Option<(String, u64)>], family: &str) -> Vec<String> {
    let in_family = |p: usize| {
        blocks[p]
            .as_ref()
            .filter(|(f, _)| f == family)
            .map(|(_, i)| *i)
    };
    let first = (0..names.len()).find(|&p| in_family(p).is_some());
    let last = (0..names.len()).rev().find(|&p| in_family(p).is_some());
    let (Some(first), Some(last)) = (first, last) else {
        return vec!["/".into(); names.len()];
    };
    // Exporters can place a block's shape arithmetic early in the order; a running maximum of
    // block indices keeps the layers contiguous.
    let mut current = 0u64;
    (0..names.len())
        .map(|p| {
            if p < first {
                return "prologue".to_string();
            }
            if p > last {
                return "epilogue".to_string();
            }
            if let Some(index) = in_family(p) {
                current = current.max(index);
            }
            format!("{family}.{current}")
        })
        .collect()
}

/// Maximal runs of equal labels; a label seen again later starts a new layer.
fn runs(labels: &[String]) -> Vec<Layer> {
    let mut layers: Vec<Layer> = Vec::new();
    for (p, label) in labels.iter().enumerate() {
        match layers.last_mut() {
            Some(layer) if layer.name == *label => layer.end = p + 1,
            _ => layers.push(Layer {
                name: label.clone(),
                start: p,
                end: p + 1,
            }),
        }
    }
    layers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn transformer_blocks_with_prologue_and_epilogue() {
        let layers = find_layers(&names(&[
            "/model/embed/Gather",
            "/model/layers.0/attn/MatMul",
            "/model/layers.0/Add",
            "/model/Shape",
            "/model/layers.1/attn/MatMul",
            "/model/layers.1/Add",
            "/model/norm/Mul",
            "/lm_head/MatMul",
        ]));
        let got: Vec<(&str, usize, usize)> = layers
            .iter()
            .map(|l| (l.name.as_str(), l.start, l.end))
            .collect();
        assert_eq!(
            got,
            [
                ("prologue", 0, 1),
                ("/model/layers.0", 1, 4),
                ("/model/layers.1", 4, 6),
                ("epilogue", 6, 8)
            ]
        );
    }

    #[test]
    fn nested_families_are_all_found() {
        let list = names(&[
            "/model/model.0/embeddings/Gather",
            "/model/model.0/encoder/layer.0/MatMul",
            "/model/model.0/encoder/layer.1/MatMul",
            "/model/model.0/encoder/layer.2/MatMul",
            "/model/model.1/ReduceSum",
        ]);
        let families = block_families(&list);
        let got: Vec<(&str, usize, usize)> = families
            .iter()
            .map(|f| (f.family.as_str(), f.blocks, f.nodes))
            .collect();
        assert_eq!(
            got,
            [
                ("/model/model", 2, 5),
                ("/model/model.0/encoder/layer", 3, 3)
            ]
        );
        let layers = find_layers_of_family(&list, "/model/model.0/encoder/layer");
        let got: Vec<(&str, usize, usize)> = layers
            .iter()
            .map(|l| (l.name.as_str(), l.start, l.end))
            .collect();
        assert_eq!(
            got,
            [
                ("prologue", 0, 1),
                ("/model/model.0/encoder/layer.0", 1, 2),
                ("/model/model.0/encoder/layer.1", 2, 3),
                ("/model/model.0/encoder/layer.2", 3, 4),
                ("epilogue", 4, 5)
            ]
        );
    }

    #[test]
    fn cnns_fall_back_to_top_level_scopes() {
        let layers = find_layers(&names(&[
            "/conv1/Conv",
            "/bn1/BatchNormalization",
            "/layer1/layer1.0/conv1/Conv",
            "/layer1/layer1.0/Add",
            "/layer2/layer2.0/conv1/Conv",
            "/layer2/layer2.0/Add",
            "/fc/Gemm",
            "Identity_3",
        ]));
        let got: Vec<&str> = layers.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            got,
            ["/conv1", "/bn1", "/layer1", "/layer2", "/fc", "Identity_3"]
        );
    }
}
