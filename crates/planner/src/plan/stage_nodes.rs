//! A stage's node names as one text buffer and their ends, not a `String` each: a million-node
//! plan made (or read) a million small allocations for its names, a third of a second at 1M
//! nodes (docs/benchmarks.md, "Limits at any size"). The JSON is the same array of strings.

use std::borrow::Cow;
use std::fmt;

use serde::de::{SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Node names in order, stored back to back.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StageNodes {
    text: String,
    /// Where each name ends in `text`.
    ends: Vec<u32>,
}

impl StageNodes {
    /// Room for `names` names of `bytes` bytes in all.
    pub fn with_capacity(names: usize, bytes: usize) -> StageNodes {
        StageNodes {
            text: String::with_capacity(bytes),
            ends: Vec::with_capacity(names),
        }
    }

    /// Appends a name.
    pub fn push(&mut self, name: impl AsRef<str>) {
        self.text.push_str(name.as_ref());
        self.ends.push(self.text.len() as u32);
    }

    /// Removes the last name and returns it.
    pub fn pop(&mut self) -> Option<String> {
        let name = self.last()?.to_string();
        self.ends.pop();
        self.text
            .truncate(self.ends.last().map_or(0, |&end| end as usize));
        Some(name)
    }

    /// Puts `name` at position `i` (at most the length), moving the later names up.
    pub fn insert(&mut self, i: usize, name: impl AsRef<str>) {
        let name = name.as_ref();
        let start = i
            .checked_sub(1)
            .map_or(0, |before| self.ends[before] as usize);
        self.text.insert_str(start, name);
        self.ends.insert(i, start as u32);
        for end in &mut self.ends[i..] {
            *end += name.len() as u32;
        }
    }

    /// How many names.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The `i`-th name, if there are that many.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)? as usize;
        let start = match i {
            0 => 0,
            _ => self.ends[i - 1] as usize,
        };
        Some(&self.text[start..end])
    }

    /// The first name.
    pub fn first(&self) -> Option<&str> {
        self.get(0)
    }

    /// The last name.
    pub fn last(&self) -> Option<&str> {
        self.len().checked_sub(1).and_then(|i| self.get(i))
    }

    /// The names in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + DoubleEndedIterator + Clone {
        (0..self.len()).map(|i| self.get(i).expect("in range"))
    }

    /// Whether `name` is one of them (a scan).
    pub fn contains(&self, name: &str) -> bool {
        self.iter().any(|n| n == name)
    }

    /// The names as owned strings (for code that edits a list).
    pub fn to_vec(&self) -> Vec<String> {
        self.iter().map(str::to_string).collect()
    }
}

impl<S: AsRef<str>> FromIterator<S> for StageNodes {
    fn from_iter<I: IntoIterator<Item = S>>(names: I) -> StageNodes {
        let mut nodes = StageNodes::default();
        for name in names {
            nodes.push(name.as_ref());
        }
        nodes
    }
}

impl<'a> From<Vec<Cow<'a, str>>> for StageNodes {
    fn from(names: Vec<Cow<'a, str>>) -> StageNodes {
        names.iter().collect()
    }
}

impl std::ops::Index<usize> for StageNodes {
    type Output = str;
    fn index(&self, i: usize) -> &str {
        self.get(i).expect("a node position within the stage")
    }
}

impl fmt::Debug for StageNodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for StageNodes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.len()))?;
        for name in self.iter() {
            seq.serialize_element(name)?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for StageNodes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<StageNodes, D::Error> {
        struct Names;
        impl<'de> Visitor<'de> for Names {
            type Value = StageNodes;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of node names")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StageNodes, A::Error> {
                let mut nodes = StageNodes::default();
                // Borrowed where the input allows, owned (escaped names) otherwise.
                while let Some(name) = seq.next_element::<Cow<'de, str>>()? {
                    nodes.push(&name);
                }
                Ok(nodes)
            }
        }
        deserializer.deserialize_seq(Names)
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for StageNodes {
    fn schema_name() -> Cow<'static, str> {
        <Vec<String>>::schema_name()
    }

    fn schema_id() -> Cow<'static, str> {
        <Vec<String>>::schema_id()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        <Vec<String>>::json_schema(generator)
    }

    fn inline_schema() -> bool {
        <Vec<String>>::inline_schema()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_as_a_json_array() {
        let nodes: StageNodes = ["a", "", "b/\"c\""].into_iter().collect();
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes.first(), Some("a"));
        assert_eq!(nodes.get(1), Some(""));
        assert_eq!(nodes.last(), Some("b/\"c\""));
        let text = serde_json::to_string(&nodes).unwrap();
        assert_eq!(text, serde_json::to_string(&["a", "", "b/\"c\""]).unwrap());
        let back: StageNodes = serde_json::from_str(&text).unwrap();
        assert_eq!(back, nodes);
        assert!(back.contains("b/\"c\"") && !back.contains("b"));
    }

    #[test]
    fn names_are_edited_in_place() {
        let mut nodes: StageNodes = ["a", "bb", "c"].into_iter().collect();
        assert_eq!(nodes.pop().as_deref(), Some("c"));
        nodes.insert(0, "zz");
        nodes.insert(2, "y");
        nodes.push("x");
        assert_eq!(nodes.to_vec(), ["zz", "a", "y", "bb", "x"]);
        assert_eq!(&nodes[3], "bb");
    }

    #[test]
    fn an_empty_list_has_no_ends() {
        let nodes = StageNodes::default();
        assert_eq!((nodes.first(), nodes.last(), nodes.len()), (None, None, 0));
        assert_eq!(serde_json::to_string(&nodes).unwrap(), "[]");
    }
}
