//! Shape rules of the text ops (StringConcat, StringSplit and RegexFullMatch, opset 20;
//! StringNormalizer, opset 10; TfIdfVectorizer, opset 9), and the text semantics that decide
//! their output sizes. The CPU kernels (`runtime/kernels/strings.rs`) call the same functions,
//! so a size folded at plan time from a known input is the size the run produces.

use std::collections::HashSet;

use super::context::{broadcast, Inferred, OpCtx, RuleResult};
use super::registry::Registry;
use crate::graph::{Attribute, Attributes, ConstValue, DType, Dim};

pub(super) fn register(r: &mut Registry) {
    r.add("", &["StringConcat"], string_concat);
    r.add("", &["StringSplit"], string_split);
    r.add("", &["StringNormalizer"], string_normalizer);
    r.add("", &["RegexFullMatch"], regex_full_match);
    r.add("", &["TfIdfVectorizer"], tfidf_vectorizer);
}

/// <https://onnx.ai/onnx/operators/onnx__StringConcat.html>: the broadcast of both inputs.
fn string_concat(ctx: &OpCtx) -> RuleResult {
    let shape = broadcast(&[ctx.shape(0)?, ctx.shape(1)?], ctx, 0)?;
    Ok(vec![Inferred::new(DType::String, shape)])
}

/// <https://onnx.ai/onnx/operators/onnx__StringSplit.html>: the substrings `X.shape + [most
/// parts]` (padded with empty strings) and their counts `X.shape`. The last dim is known when
/// the input's strings are.
fn string_split(ctx: &OpCtx) -> RuleResult {
    let x = ctx.input(0)?;
    let splitter = Splitter::from_attributes(&ctx.node.attributes)?;
    let widest = match x.value.and_then(ConstValue::as_strings) {
        Some(texts) => Dim::Known(splitter.most_parts(texts) as u64),
        None => ctx.data_dependent_dim(0, x.shape.len()),
    };
    let mut substrings = x.shape.clone();
    substrings.push(widest);
    Ok(vec![
        Inferred::new(DType::String, substrings),
        Inferred::new(DType::I64, x.shape.clone()),
    ])
}

/// <https://onnx.ai/onnx/operators/onnx__StringNormalizer.html>: `[C]` or `[1, C]` in, the
/// kept elements out, `[C']` or `[1, C']` (one empty string when none is kept). `C'` and the
/// value are known when the input's strings are.
fn string_normalizer(ctx: &OpCtx) -> RuleResult {
    let x = ctx.input(0)?;
    let normalizer = Normalizer::from_attributes(&ctx.node.attributes)?;
    let leading = normalizer_leading_dims(x.shape.len())?;
    let (kept, value) = match x.value.and_then(ConstValue::as_strings) {
        Some(texts) => {
            let out = normalizer.apply(texts);
            (Dim::Known(out.len() as u64), Some(ConstValue::Strings(out)))
        }
        None => (ctx.data_dependent_dim(0, leading), None),
    };
    let mut shape = vec![Dim::Known(1); leading];
    shape.push(kept);
    Ok(vec![Inferred::new(DType::String, shape).with_value(value)])
}

/// The `1` of a `[1, C]` input: StringNormalizer takes rank 1 or 2 only.
pub fn normalizer_leading_dims(rank: usize) -> Result<usize, String> {
    match rank {
        1 | 2 => Ok(rank - 1),
        _ => Err(format!(
            "StringNormalizer takes [C] or [1, C], not a rank-{rank} tensor"
        )),
    }
}

/// <https://onnx.ai/onnx/operators/onnx__RegexFullMatch.html>: one boolean per string.
fn regex_full_match(ctx: &OpCtx) -> RuleResult {
    if ctx.string_attr("pattern")?.is_none() {
        return Err("attribute 'pattern' is missing".into());
    }
    Ok(vec![Inferred::new(DType::Bool, ctx.shape(0)?.clone())])
}

/// <https://onnx.ai/onnx/operators/onnx__TfIdfVectorizer.html>: `[C]` → `[size]`, `[B, C]` →
/// `[B, size]`, float, where `size` is the largest of `ngram_indexes` plus one.
fn tfidf_vectorizer(ctx: &OpCtx) -> RuleResult {
    let indexes = ctx
        .ints_attr("ngram_indexes")?
        .ok_or("attribute 'ngram_indexes' is missing")?;
    let size = tfidf_output_size(indexes)?;
    let shape = match ctx.shape(0)?.as_slice() {
        [_] => vec![Dim::Known(size as u64)],
        [rows, _] => vec![rows.clone(), Dim::Known(size as u64)],
        other => {
            return Err(format!(
                "the input must be [C] or [B, C], not rank {}",
                other.len()
            ))
        }
    };
    Ok(vec![Inferred::new(DType::F32, shape)])
}

/// TfIdfVectorizer's output width: one past the largest output index.
pub fn tfidf_output_size(ngram_indexes: &[i64]) -> Result<usize, String> {
    match ngram_indexes.iter().copied().max() {
        Some(largest) if largest >= 0 => Ok(largest as usize + 1),
        Some(negative) => Err(format!("ngram_indexes holds {negative}, below 0")),
        None => Err("ngram_indexes is empty".into()),
    }
}

fn string_attr<'a>(attributes: &'a Attributes, name: &str) -> Result<Option<&'a str>, String> {
    match attributes.get(name) {
        None => Ok(None),
        Some(Attribute::String(s)) => Ok(Some(s)),
        Some(other) => Err(format!(
            "attribute '{name}' should be a string, found {other:?}"
        )),
    }
}

fn int_attr(attributes: &Attributes, name: &str) -> Result<Option<i64>, String> {
    match attributes.get(name) {
        None => Ok(None),
        Some(Attribute::Int(v)) => Ok(Some(*v)),
        Some(other) => Err(format!(
            "attribute '{name}' should be an int, found {other:?}"
        )),
    }
}

/// StringSplit's rule, Python's `str.split`: with a delimiter, every occurrence splits (an
/// empty string gives one empty part); without one (absent or empty), runs of whitespace split
/// and leading and trailing whitespace is dropped (an empty string gives no part). At most
/// `maxsplit` splits happen, from the left; the rest of the string is the last part.
#[derive(Debug, Clone, PartialEq)]
pub struct Splitter {
    delimiter: Option<String>,
    maxsplit: Option<usize>,
}

impl Splitter {
    /// Reads StringSplit's `delimiter` and `maxsplit`.
    pub fn from_attributes(attributes: &Attributes) -> Result<Splitter, String> {
        let delimiter = string_attr(attributes, "delimiter")?
            .filter(|d| !d.is_empty())
            .map(str::to_string);
        // A negative maxsplit is no limit, as in Python.
        let maxsplit = int_attr(attributes, "maxsplit")?.and_then(|m| usize::try_from(m).ok());
        Ok(Splitter {
            delimiter,
            maxsplit,
        })
    }

    /// `text` cut as StringSplit cuts it (at `delimiter`, at most `maxsplit` times).
    pub fn split<'a>(&self, text: &'a str) -> Vec<&'a str> {
        match (&self.delimiter, self.maxsplit) {
            (Some(d), Some(m)) => text.splitn(m.saturating_add(1), d.as_str()).collect(),
            (Some(d), None) => text.split(d.as_str()).collect(),
            (None, maxsplit) => {
                let mut parts = Vec::new();
                let mut rest = text.trim_start();
                while !rest.is_empty() {
                    if Some(parts.len()) == maxsplit {
                        parts.push(rest);
                        break;
                    }
                    let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
                    parts.push(&rest[..end]);
                    rest = rest[end..].trim_start();
                }
                parts
            }
        }
    }

    /// The most parts any of `texts` splits into (0 for no texts).
    pub fn most_parts(&self, texts: &[String]) -> usize {
        texts.iter().map(|t| self.split(t).len()).max().unwrap_or(0)
    }
}

/// StringNormalizer's case change.
#[derive(Debug, Clone, Copy, PartialEq)]
enum CaseChange {
    None,
    Lower,
    Upper,
}

/// StringNormalizer: drops the elements equal to a stop word (compared ignoring case unless
/// `is_case_sensitive`), then changes the case of the rest. Case follows Unicode's default
/// mappings; the `locale` attribute is not consulted.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalizer {
    stopwords: HashSet<String>,
    case_sensitive: bool,
    case_change: CaseChange,
}

impl Normalizer {
    /// Reads StringNormalizer's attributes, refusing values the spec does not allow.
    pub fn from_attributes(attributes: &Attributes) -> Result<Normalizer, String> {
        let case_sensitive = int_attr(attributes, "is_case_sensitive")?.unwrap_or(0) != 0;
        let case_change = match string_attr(attributes, "case_change_action")?.unwrap_or("NONE") {
            "NONE" => CaseChange::None,
            "LOWER" => CaseChange::Lower,
            "UPPER" => CaseChange::Upper,
            other => {
                return Err(format!(
                    "case_change_action '{other}' is not NONE, LOWER or UPPER"
                ))
            }
        };
        let stopwords = match attributes.get("stopwords") {
            None => HashSet::new(),
            Some(Attribute::Strings(words)) => words
                .iter()
                .map(|w| {
                    if case_sensitive {
                        w.clone()
                    } else {
                        w.to_lowercase()
                    }
                })
                .collect(),
            Some(other) => {
                return Err(format!(
                    "attribute 'stopwords' should be a list of strings, found {other:?}"
                ))
            }
        };
        Ok(Normalizer {
            stopwords,
            case_sensitive,
            case_change,
        })
    }

    fn is_stopword(&self, text: &str) -> bool {
        if self.case_sensitive {
            self.stopwords.contains(text)
        } else {
            self.stopwords.contains(&text.to_lowercase())
        }
    }

    /// The kept elements, case changed; one empty string when none is kept (the spec's "empty
    /// value", shape `[1]` or `[1, 1]`).
    pub fn apply(&self, texts: &[String]) -> Vec<String> {
        let kept: Vec<String> = texts
            .iter()
            .filter(|t| !self.is_stopword(t))
            .map(|t| match self.case_change {
                CaseChange::None => t.clone(),
                CaseChange::Lower => t.to_lowercase(),
                CaseChange::Upper => t.to_uppercase(),
            })
            .collect();
        if kept.is_empty() {
            vec![String::new()]
        } else {
            kept
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attributes(pairs: Vec<(&str, Attribute)>) -> Attributes {
        pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    #[test]
    fn split_follows_python_str_split() {
        let by = |delimiter: &str, maxsplit: Option<i64>| {
            let mut attrs = vec![("delimiter", Attribute::String(delimiter.into()))];
            if let Some(m) = maxsplit {
                attrs.push(("maxsplit", Attribute::Int(m)));
            }
            Splitter::from_attributes(&attributes(attrs)).unwrap()
        };
        assert_eq!(by("-", None).split("o-n--x-"), vec!["o", "n", "", "x", ""]);
        assert_eq!(by("-", None).split(""), vec![""]);
        assert_eq!(
            by("", None).split("  hello   world ! "),
            vec!["hello", "world", "!"]
        );
        assert_eq!(by("", None).split("   "), Vec::<&str>::new());
        assert_eq!(by("", Some(2)).split(" o n n x "), vec!["o", "n", "n x "]);
        assert_eq!(by(".", Some(1)).split("a.b.c"), vec!["a", "b.c"]);
        assert_eq!(by(".", Some(-1)).split("a.b.c"), vec!["a", "b", "c"]);
        let texts = ["a b".to_string(), "c".to_string()];
        assert_eq!(by("", None).most_parts(&texts), 2);
        assert_eq!(by("", None).most_parts(&[]), 0);
    }

    #[test]
    fn normalizer_drops_stopwords_then_changes_case() {
        let normalizer = |sensitive: i64, action: &str| {
            Normalizer::from_attributes(&attributes(vec![
                ("is_case_sensitive", Attribute::Int(sensitive)),
                ("case_change_action", Attribute::String(action.into())),
                ("stopwords", Attribute::Strings(vec!["monday".into()])),
            ]))
            .unwrap()
        };
        let texts: Vec<String> = ["Monday", "tuesday", "monday"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(normalizer(0, "UPPER").apply(&texts), vec!["TUESDAY"]);
        assert_eq!(
            normalizer(1, "LOWER").apply(&texts),
            vec!["monday", "tuesday"]
        );
        assert_eq!(normalizer(0, "NONE").apply(&texts[2..]), vec![""]);
        assert!(Normalizer::from_attributes(&attributes(vec![(
            "case_change_action",
            Attribute::String("TITLE".into())
        )]))
        .is_err());
    }
}
