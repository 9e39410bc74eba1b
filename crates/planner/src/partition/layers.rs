//! Layers: the units the peers' partitioners count. DeepSpeed and torchgpipe cut a list of
//! modules, not a graph, so to reimplement them on the same costs pipecut recovers that list
//! from node names, which exporters fill with module scopes (`/model/layers.12/mlp/MatMul`).
//!
//! Rule: among the families of numbered scopes (`layers.0`, `layers.1`, … under the same parent,
//! at any depth) whose blocks hold at least half the nodes, the one that repeats most (the most
//! blocks, then the deepest) gives the layers: each numbered block is a layer, everything before
//! the first block is one layer (embeddings), everything after the last is one layer (final norm
//! and head), and nodes between blocks join the block before them. A sentence-transformers export
//! wraps its encoder in an `nn.Sequential` (`/model/model.0/encoder/layer.N`): the two wrapper
//! children hold every node but the encoder layers repeat, so the encoder layers are the blocks.
//! Without such a family each top-level scope (`/conv1`, `/layer2`, `/fc`) is a layer, which
//! matches how torchgpipe flattens a CNN into an `nn.Sequential` of its children. Layers are
//! contiguous in the topological order, so every partition of layers is a contiguous (convex)
//! partition of nodes.

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

/// Layers of a model whose nodes, in topological order, have these names.
pub fn find_layers<S: AsRef<str>>(names: &[S]) -> Vec<Layer> {
    detect_layers(names).layers
}

/// Where a model's layers came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerSource {
    /// The blocks of this family, with a prologue and an epilogue layer around them.
    Blocks(BlockFamily),
    /// No numbered family holds half the nodes: each top-level scope is a layer.
    TopLevelScopes,
}

/// A model's layers and where they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetectedLayers {
    /// The layers, in order.
    pub layers: Vec<Layer>,
    /// The family chosen, or the top-level fallback.
    pub source: LayerSource,
}

impl DetectedLayers {
    /// What the layers are, for the plan and the baselines table: `14 layers: the 12 blocks of
    /// /transformer/h, one layer before and one after them`.
    pub fn description(&self) -> String {
        let count = self.layers.len();
        let LayerSource::Blocks(family) = &self.source else {
            return format!("{count} layers: the top-level scopes");
        };
        let before = self.layers.first().is_some_and(|l| l.name == "prologue");
        let after = self.layers.last().is_some_and(|l| l.name == "epilogue");
        let around = match (before, after) {
            (true, true) => ", one layer before and one after them",
            (true, false) => ", one layer before them",
            (false, true) => ", one layer after them",
            (false, false) => "",
        };
        format!(
            "{count} layers: the {} blocks of {}{around}",
            family.blocks, family.family
        )
    }
}

/// Layers of a model whose nodes, in topological order, have these names, and where they came
/// from (see the module doc for the rule).
pub fn detect_layers<S: AsRef<str>>(names: &[S]) -> DetectedLayers {
    match repeated_family(names) {
        Some(family) => DetectedLayers {
            layers: find_layers_of_family(names, &family.family),
            source: LayerSource::Blocks(family),
        },
        None => {
            let labels: Vec<String> = names
                .iter()
                .map(|n| match scopes(n.as_ref()).first() {
                    Some(top) => format!("/{top}"),
                    None => n.as_ref().to_string(),
                })
                .collect();
            DetectedLayers {
                layers: runs(&labels),
                source: LayerSource::TopLevelScopes,
            }
        }
    }
}

/// The family whose blocks are the layers: among the families whose blocks hold at least half
/// the nodes (so a family inside one block, such as one layer's MoE experts, never qualifies),
/// the one with the most blocks, then the deepest (an outer wrapper and the layers inside it can
/// tie on blocks only when the wrapper repeats as often, and then the inner one still cuts
/// finer), then the most nodes, then the first by path.
pub fn repeated_family<S: AsRef<str>>(names: &[S]) -> Option<BlockFamily> {
    let depth = |f: &BlockFamily| f.family.matches('/').count();
    block_families(names)
        .into_iter()
        .filter(|f| 2 * f.nodes >= names.len())
        .max_by(|a, b| {
            (a.blocks, depth(a), a.nodes)
                .cmp(&(b.blocks, depth(b), b.nodes))
                .then_with(|| b.family.cmp(&a.family))
        })
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
pub fn block_families<S: AsRef<str>>(names: &[S]) -> Vec<BlockFamily> {
    let mut families: BTreeMap<String, (usize, Vec<u64>)> = BTreeMap::new();
    for name in names {
        let parts = scopes(name.as_ref());
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
pub fn find_layers_of_family<S: AsRef<str>>(names: &[S], family: &str) -> Vec<Layer> {
    let blocks: Vec<Option<(String, u64)>> = names
        .iter()
        .map(|name| {
            let parts = scopes(name.as_ref());
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

fn block_labels<S>(names: &[S], blocks: &[Option<(String, u64)>], family: &str) -> Vec<String> {
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
    fn the_family_that_repeats_is_chosen_over_its_wrapper() {
        // A sentence-transformers export: `/model/model` (2 blocks) holds every node, the
        // encoder layers (3 blocks) inside block 0 hold 3 of 5; both hold half the nodes, and
        // the encoder repeats more.
        let list = names(&[
            "/model/model.0/embeddings/Gather",
            "/model/model.0/encoder/layer.0/MatMul",
            "/model/model.0/encoder/layer.1/MatMul",
            "/model/model.0/encoder/layer.2/MatMul",
            "/model/model.1/ReduceSum",
        ]);
        let detected = detect_layers(&list);
        assert_eq!(detected.layers.len(), 5);
        assert_eq!(
            detected.description(),
            "5 layers: the 3 blocks of /model/model.0/encoder/layer, one layer before and one after them"
        );
        // Equal repeats: the deeper family cuts finer (its two blocks and an epilogue, where the
        // outer family gives two layers).
        let list = names(&[
            "/blocks.0/inner.0/MatMul",
            "/blocks.0/inner.1/MatMul",
            "/blocks.1/inner.0/MatMul",
            "/blocks.1/inner.1/MatMul",
        ]);
        let family = repeated_family(&list).expect("two families qualify");
        assert_eq!(family.family, "/blocks.0/inner");
        assert_eq!(find_layers(&list).len(), 3);
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
