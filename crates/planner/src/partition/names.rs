//! The text of a problem's names (nodes, module scopes, tensors) in one shared buffer.
//!
//! A problem names every node, its module scope and every tensor that crosses or stays: three
//! million strings at a million nodes, each its own allocation, copied from the graph, cloned
//! again into every coarsened problem and freed one by one (a sixth of the solve's samples in a
//! profile of the 1M-node stack, docs/benchmarks.md, "Limits at any size"). Here they are one
//! `String` and one table of ends, shared by every problem made from the same graph; a problem
//! keeps [`NameId`]s, four bytes each, and a coarsened problem copies no text at all.

use std::borrow::Cow;
use std::sync::Arc;

/// One name in a [`NameTable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NameId(u32);

/// Names laid end to end.
#[derive(Debug, Clone, Default)]
pub struct NameTable {
    text: String,
    ends: Vec<usize>,
}

impl NameTable {
    /// An empty table with room for `names` names of about `bytes` bytes in all.
    pub fn with_capacity(names: usize, bytes: usize) -> NameTable {
        NameTable {
            text: String::with_capacity(bytes),
            ends: Vec::with_capacity(names),
        }
    }

    /// Adds `name` and says where it is.
    pub fn push(&mut self, name: &str) -> NameId {
        self.text.push_str(name);
        self.ends.push(self.text.len());
        NameId((self.ends.len() - 1) as u32)
    }

    /// The text of `id`.
    pub fn get(&self, id: NameId) -> &str {
        let i = id.0 as usize;
        let start = match i {
            0 => 0,
            _ => self.ends[i - 1],
        };
        &self.text[start..self.ends[i]]
    }
}

/// Each position's name and module scope, in a table shared with the problems made from the
/// same graph. A coarsened problem's position names its group by its first member and counts
/// the others ("`first` (+3 nodes)").
#[derive(Debug, Clone, Default)]
pub struct NodeNames {
    pub(crate) table: Arc<NameTable>,
    pub(crate) names: Vec<NameId>,
    pub(crate) scopes: Vec<NameId>,
    /// Members beyond the first, per position; empty when no position merges any.
    pub(crate) merged: Vec<u32>,
}

impl NodeNames {
    /// Number of positions.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there are no positions.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The name of position `p`: the node's, or its group's first node's with the count of
    /// the others.
    pub fn name(&self, p: usize) -> Cow<'_, str> {
        let first = self.table.get(self.names[p]);
        match self.merged.get(p).copied().unwrap_or(0) {
            0 => Cow::Borrowed(first),
            others => Cow::Owned(format!("{first} (+{others} nodes)")),
        }
    }

    /// The name of position `p` where it is one node's ([`None`] for a group of several).
    pub fn single_name(&self, p: usize) -> Option<&str> {
        match self.merged.get(p).copied().unwrap_or(0) {
            0 => Some(self.table.get(self.names[p])),
            _ => None,
        }
    }

    /// Each position that is one node, with its name.
    pub fn singles(&self) -> impl Iterator<Item = (usize, &str)> {
        (0..self.len()).filter_map(|p| Some((p, self.single_name(p)?)))
    }

    /// The module scope of position `p` (its first node's).
    pub fn scope(&self, p: usize) -> &str {
        self.table.get(self.scopes[p])
    }

    /// Every position's scope, in order (what layers are found from).
    pub fn scopes(&self) -> Vec<&str> {
        self.scopes.iter().map(|&id| self.table.get(id)).collect()
    }

    /// The names of the groups whose members are the positions `members[g]` of `self`, each
    /// named by its first member.
    pub(crate) fn of_groups(&self, first_and_count: impl Iterator<Item = (usize, usize)>) -> Self {
        let (lower, _) = first_and_count.size_hint();
        let mut names = Vec::with_capacity(lower);
        let mut scopes = Vec::with_capacity(lower);
        let mut merged = Vec::with_capacity(lower);
        for (first, count) in first_and_count {
            names.push(self.names[first]);
            scopes.push(self.scopes[first]);
            let before = self.merged.get(first).copied().unwrap_or(0);
            merged.push(before + count as u32 - 1);
        }
        let merged = match merged.iter().all(|&m| m == 0) {
            true => Vec::new(),
            false => merged,
        };
        NodeNames {
            table: Arc::clone(&self.table),
            names,
            scopes,
            merged,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_back_as_pushed_and_groups_name_their_first_member() {
        let mut table = NameTable::default();
        let a = table.push("/h.0/attn/MatMul");
        let scope = table.push("/h.0/attn");
        let b = table.push("/h.0/Add");
        let empty = table.push("");
        assert_eq!(table.get(a), "/h.0/attn/MatMul");
        assert_eq!(table.get(b), "/h.0/Add");
        assert_eq!(table.get(empty), "");
        let fine = NodeNames {
            table: Arc::new(table),
            names: vec![a, b, empty],
            scopes: vec![scope, b, empty],
            merged: Vec::new(),
        };
        assert_eq!(fine.name(1), "/h.0/Add");
        assert_eq!(fine.scope(0), "/h.0/attn");
        let coarse = fine.of_groups([(0, 2), (2, 1)].into_iter());
        assert_eq!(coarse.name(0), "/h.0/attn/MatMul (+1 nodes)");
        assert_eq!(coarse.single_name(0), None);
        assert_eq!(coarse.name(1), "");
        assert_eq!(coarse.scopes(), vec!["/h.0/attn", ""]);
        // A group of groups counts every node it holds.
        let coarser = coarse.of_groups([(0, 2)].into_iter());
        assert_eq!(coarser.name(0), "/h.0/attn/MatMul (+2 nodes)");
    }
}
