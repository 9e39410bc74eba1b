//! A node's attributes by name.

use super::Attribute;

/// A node's attributes by name, in name order, as a sorted vector: a node has a handful, and
/// a `BTreeMap` allocated a leaf of about a kilobyte for even one (docs/benchmarks.md, the 1M
/// stack's peak memory). The methods are those of the map that the code uses.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Attributes(Vec<(String, Attribute)>);

impl Attributes {
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

    /// The attributes in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Attribute)> {
        self.into_iter()
    }

    /// The values in name order.
    pub fn values(&self) -> impl Iterator<Item = &Attribute> {
        self.0.iter().map(|(_, value)| value)
    }

    fn position(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(own, _)| own.as_str().cmp(name))
    }
}

/// As a map collects: in name order, a later value of a name replacing an earlier one.
impl FromIterator<(String, Attribute)> for Attributes {
    fn from_iter<I: IntoIterator<Item = (String, Attribute)>>(pairs: I) -> Attributes {
        let pairs = pairs.into_iter();
        let mut attributes = Attributes::with_capacity(pairs.size_hint().0);
        for (name, value) in pairs {
            attributes.insert(name, value);
        }
        attributes
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
        let names = |attributes: &Attributes| -> Vec<String> {
            attributes.iter().map(|(name, _)| name.clone()).collect()
        };
        assert_eq!(names(&attributes), ["axis", "perm"]);
        assert_eq!(attributes.get("axis"), Some(&Attribute::Int(2)));
        assert_eq!(
            attributes.insert("alpha".into(), Attribute::Float(0.5)),
            None
        );
        assert_eq!(
            attributes.insert("axis".into(), Attribute::Int(1)),
            Some(Attribute::Int(2))
        );
        assert_eq!(names(&attributes), ["alpha", "axis", "perm"]);
        assert!(attributes.contains_key("perm") && !attributes.contains_key("beta"));
    }
}
