//! Ids by name, for names that already live in the table the ids index (a tensor's name in the
//! tensor table, a node's in the graph): the index keeps only the ids, so each name is stored
//! once. A map with the name as its key held a second copy of every name, an allocation per
//! tensor and per node (millions at a million nodes, docs/benchmarks.md "Limits at any size").

use std::hash::BuildHasher;

use hashbrown::HashTable;

/// Ids by name. Every call passes `name_of`, the name of an id as the indexed table holds it;
/// the names must not change while indexed.
///
/// foldhash, not the standard SipHash (SipHash was 2% of the samples of loading a million-node
/// model), seeded per process as the standard hasher is.
#[derive(Debug, Clone, Default)]
pub(crate) struct NameIndex {
    ids: HashTable<u32>,
    seed: foldhash::fast::RandomState,
}

impl NameIndex {
    /// The id named `name`, if any.
    pub(crate) fn get<'a>(&self, name: &str, name_of: impl Fn(u32) -> &'a str) -> Option<u32> {
        let hash = self.seed.hash_one(name);
        self.ids.find(hash, |&id| name_of(id) == name).copied()
    }

    /// Indexes `id` under its name, which no indexed id has.
    pub(crate) fn insert_new<'a>(&mut self, id: u32, name_of: impl Fn(u32) -> &'a str) {
        let seed = &self.seed;
        let hash = seed.hash_one(name_of(id));
        self.ids
            .insert_unique(hash, id, |&other| seed.hash_one(name_of(other)));
    }

    /// Makes room for `additional` more ids without growing as they come.
    pub(crate) fn reserve<'a>(&mut self, additional: usize, name_of: impl Fn(u32) -> &'a str) {
        let seed = &self.seed;
        self.ids
            .reserve(additional, |&id| seed.hash_one(name_of(id)));
    }
}

#[cfg(test)]
mod tests {
    use super::NameIndex;

    #[test]
    fn finds_each_name_and_nothing_else_across_growth() {
        let names: Vec<String> = (0..5000).map(|i| format!("t{i}")).collect();
        let name_of = |id: u32| names[id as usize].as_str();
        let mut index = NameIndex::default();
        index.reserve(10, name_of);
        for id in 0..names.len() as u32 {
            assert_eq!(index.get(&names[id as usize], name_of), None);
            index.insert_new(id, name_of);
        }
        for (id, name) in names.iter().enumerate() {
            assert_eq!(index.get(name, name_of), Some(id as u32));
        }
        assert_eq!(index.get("t5000", name_of), None);
        assert_eq!(index.get("", name_of), None);
    }
}
