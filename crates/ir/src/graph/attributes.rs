//! A node's attributes by name.

use super::Attribute;

/// A node's attributes by name, in name order, as a sorted vector: a node has a handful, and
/// a `BTreeMap` allocated a leaf of about a kilobyte for even one (a third of a gigabyte at a
/// million nodes). The methods are the map's that the planner uses.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Attributes(Vec<(String, Attribute)>);

impl Attributes {
    /// No attributes.
    pub fn new() -> Attributes {
        Attributes(Vec::new())
    }

    /// No attributes, with room for `count` without growing.
    pub fn with_capacity(count: usize) -> Attributes {
        Attributes(Vec::with_capacity(count))
    }

    /// The attribute named `name`.
    pub fn get(&self, name: &str) -> Option<&Attribute> {
        self.position(name).ok().map(|at| &self.0[at].1)
    }

    /// The attribute named `name`, to change.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut Attribute> {
        self.position(name).ok().map(|at| &mut self.0[at].1)
    }

    /// Whether an attribute is named `name`.
    pub fn contains_key(&self, name: &str) -> bool {
        self.position(name).is_ok()
    }

    /// Sets `name` to `value`; gives the value it replaces.
    pub fn insert(&mut self, name: String, value: Attribute) -> Option<Attribute> {
        match self.position(&name) {
            Ok(at) => Some(std::mem::replace(&mut self.0[at].1, value)),
            Err(at) => {
                self.0.insert(at, (name, value));
                None
            }
        }
    }

    /// Removes the attribute named `name`; gives its value.
    pub fn remove(&mut self, name: &str) -> Option<Attribute> {
        self.position(name).ok().map(|at| self.0.remove(at).1)
    }

    /// The attributes in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Attribute)> {
        self.0.iter().map(|(name, value)| (name, value))
    }

    /// The names in order.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|(name, _)| name)
    }

    /// The values in name order.
    pub fn values(&self) -> impl Iterator<Item = &Attribute> {
        self.0.iter().map(|(_, value)| value)
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn position(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(own, _)| own.as_str().cmp(name))
    }
}

/// As a map collects: in name order, a later value of a name replacing an earlier one.
impl FromIterator<(String, Attribute)> for Attributes {
    fn from_iter<I: IntoIterator<Item = (String, Attribute)>>(pairs: I) -> Attributes {
        let mut all: Vec<(String, Attribute)> = pairs.into_iter().collect();
        // Stable: among equal names the last given ends last, and is the one kept.
        all.sort_by(|a, b| a.0.cmp(&b.0));
        let mut kept: Vec<(String, Attribute)> = Vec::with_capacity(all.len());
        for pair in all {
            match kept.last_mut() {
                Some(last) if last.0 == pair.0 => *last = pair,
                _ => kept.push(pair),
            }
        }
        Attributes(kept)
    }
}

impl<'a> IntoIterator for &'a Attributes {
    type Item = (&'a String, &'a Attribute);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (String, Attribute)>,
        fn(&'a (String, Attribute)) -> (&'a String, &'a Attribute),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(name, value)| (name, value))
    }
}

impl IntoIterator for Attributes {
    type Item = (String, Attribute);
    type IntoIter = std::vec::IntoIter<(String, Attribute)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_keeps_a_maps_order_and_last_value() {
        let mut attributes: Attributes = [
            ("perm".to_string(), Attribute::Ints(vec![1, 0])),
            ("axis".to_string(), Attribute::Int(0)),
            ("axis".to_string(), Attribute::Int(2)),
        ]
        .into_iter()
        .collect();
        let names: Vec<&String> = attributes.keys().collect();
        assert_eq!(names, ["axis", "perm"]);
        assert_eq!(attributes.get("axis"), Some(&Attribute::Int(2)));
        assert_eq!(
            attributes.insert("alpha".into(), Attribute::Float(0.5)),
            None
        );
        assert_eq!(
            attributes.insert("axis".into(), Attribute::Int(1)),
            Some(Attribute::Int(2))
        );
        let names: Vec<&String> = attributes.iter().map(|(name, _)| name).collect();
        assert_eq!(names, ["alpha", "axis", "perm"]);
        assert_eq!(attributes.remove("perm"), Some(Attribute::Ints(vec![1, 0])));
        assert!(!attributes.contains_key("perm") && attributes.len() == 2);
    }
}
