//! Text ops: StringConcat, StringSplit, RegexFullMatch (opset 20), StringNormalizer (opset 10)
//! and TfIdfVectorizer (opset 9). Splitting and normalising use the rules shape inference
//! folds with ([`pipecut_ir::onnx::shape::strings`]), so planned and produced sizes agree.

use std::collections::HashMap;

use super::context::{input, Ctx, KernelResult, KernelTable};
use super::indexing::zip_broadcast;
use crate::tensor::{try_collect, HostTensor, TensorData};
use pipecut_ir::graph::Attribute;
use pipecut_ir::onnx::shape::strings::{
    normalizer_leading_dims, tfidf_output_size, Normalizer, Splitter,
};

pub(super) fn register(t: &mut KernelTable) {
    t.add(&["StringConcat"], string_concat);
    t.add(&["StringSplit"], string_split);
    t.add(&["StringNormalizer"], string_normalizer);
    t.add(&["RegexFullMatch"], regex_full_match);
    t.add(&["TfIdfVectorizer"], tfidf_vectorizer);
}

fn strings(tensor: &HostTensor) -> Result<Vec<&str>, String> {
    Ok(tensor.as_strings()?.iter().map(String::as_str).collect())
}

fn string_concat(_: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let (x, y) = (input(inputs, 0)?, input(inputs, 1)?);
    let (shape, joined) =
        zip_broadcast(&strings(x)?, x.shape(), &strings(y)?, y.shape(), |a, b| {
            [a, b].concat()
        })?;
    Ok(vec![HostTensor::new(shape, TensorData::String(joined))?])
}

/// The substrings, padded with empty strings to the most parts of any element, and the count
/// of each element's parts.
fn string_split(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let splitter = Splitter::from_attributes(&ctx.node.attributes)?;
    let texts = x.as_strings()?;
    let widest = splitter.most_parts(texts);
    let mut shape = x.shape().to_vec();
    shape.push(widest);
    let total = super::indexing::checked_size(&shape)?;
    let mut substrings = try_collect(total, std::iter::empty())?;
    let mut counts = try_collect(texts.len(), std::iter::empty())?;
    for text in texts {
        let parts = splitter.split(text);
        counts.push(parts.len() as i64);
        let padding = widest - parts.len();
        substrings.extend(parts.into_iter().map(str::to_string));
        substrings.extend(std::iter::repeat_n(String::new(), padding));
    }
    Ok(vec![
        HostTensor::new(shape, TensorData::String(substrings))?,
        HostTensor::new(x.shape().to_vec(), TensorData::I64(counts))?,
    ])
}

fn string_normalizer(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let leading = normalizer_leading_dims(x.rank())?;
    if leading == 1 && x.shape()[0] != 1 {
        return Err(format!(
            "StringNormalizer takes [C] or [1, C], not {:?}",
            x.shape()
        ));
    }
    let kept = Normalizer::from_attributes(&ctx.node.attributes)?.apply(x.as_strings()?);
    let mut shape = vec![1; leading];
    shape.push(kept.len());
    Ok(vec![HostTensor::new(shape, TensorData::String(kept))?])
}

/// Whether each string matches `pattern` as a whole. ONNX names RE2 syntax; the `regex` crate
/// implements it (no backreferences or lookaround, which RE2 lacks too).
fn regex_full_match(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let pattern = match ctx.attr("pattern") {
        Some(Attribute::String(p)) => p,
        _ => return Err("attribute 'pattern' is missing".into()),
    };
    let anchored = format!(r"\A(?:{pattern})\z");
    let regex = regex::Regex::new(&anchored)
        .map_err(|e| format!("pattern '{pattern}' is not a valid regular expression: {e}"))?;
    let texts = x.as_strings()?;
    let matches = try_collect(texts.len(), texts.iter().map(|t| regex.is_match(t)))?;
    Ok(vec![HostTensor::new(
        x.shape().to_vec(),
        TensorData::Bool(matches),
    )?])
}

/// A token of TfIdfVectorizer's pool and input: integers or strings.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Token<'a> {
    Int(i64),
    Text(&'a str),
}

fn tokens(tensor: &HostTensor) -> Result<Vec<Token<'_>>, String> {
    Ok(match tensor.data() {
        TensorData::String(v) => v.iter().map(|s| Token::Text(s)).collect(),
        TensorData::I64(_) | TensorData::I32(_) => {
            tensor.to_i64_vec().into_iter().map(Token::Int).collect()
        }
        _ => {
            return Err(format!(
                "TfIdfVectorizer takes strings or integers, not {}",
                tensor.dtype()
            ))
        }
    })
}

/// TfIdfVectorizer's n-gram table: each n-gram of the pool (its tokens) → its output column.
struct NgramTable<'a> {
    columns: HashMap<Vec<Token<'a>>, usize>,
    min_gram: usize,
    max_gram: usize,
}

impl<'a> NgramTable<'a> {
    /// The pool (`pool_int64s` or `pool_strings`) holds the 1-grams, then the 2-grams, ...;
    /// `ngram_counts[i]` is where the (i+1)-grams start. N-grams are numbered across every
    /// size in pool order and `ngram_indexes` maps that number to a column; only the sizes
    /// between `min_gram_length` and `max_gram_length` are counted.
    fn new(ctx: &'a Ctx) -> Result<NgramTable<'a>, String> {
        let pool: Vec<Token<'a>> = match (ctx.attr("pool_int64s"), ctx.attr("pool_strings")) {
            (Some(Attribute::Ints(v)), _) => v.iter().map(|&i| Token::Int(i)).collect(),
            (_, Some(Attribute::Strings(v))) => v.iter().map(|s| Token::Text(s)).collect(),
            _ => return Err("one of pool_int64s and pool_strings is required".into()),
        };
        let counts = ctx.ints("ngram_counts").unwrap_or_default();
        let indexes = ctx
            .ints("ngram_indexes")
            .ok_or("attribute 'ngram_indexes' is missing")?;
        let min_gram = usize::try_from(ctx.int("min_gram_length", 1)).unwrap_or(0);
        let max_gram = usize::try_from(ctx.int("max_gram_length", 1)).unwrap_or(0);
        let mut columns = HashMap::new();
        let mut number = 0usize;
        for (i, &start) in counts.iter().enumerate() {
            let size = i + 1;
            let end = counts.get(i + 1).copied().unwrap_or(pool.len() as i64);
            let section = usize::try_from(start)
                .ok()
                .zip(usize::try_from(end).ok())
                .and_then(|(s, e)| pool.get(s..e))
                .ok_or_else(|| format!("ngram_counts {counts:?} do not fit the pool"))?;
            for gram in section.chunks_exact(size) {
                if (min_gram..=max_gram).contains(&size) {
                    let column = indexes
                        .get(number)
                        .and_then(|&c| usize::try_from(c).ok())
                        .ok_or_else(|| {
                            format!("ngram_indexes has no column for n-gram {number}")
                        })?;
                    columns.insert(gram.to_vec(), column);
                }
                number += 1;
            }
        }
        Ok(NgramTable {
            columns,
            min_gram,
            max_gram,
        })
    }

    /// Adds one to `counts[column]` for every n-gram of `row`: tokens `skip + 1` apart for
    /// each skip up to `max_skip`, 1-grams counted once (they have no gaps).
    fn count(&self, row: &[Token<'a>], max_skip: usize, counts: &mut [f32]) {
        let mut smallest = self.min_gram.max(1);
        let mut gram = Vec::with_capacity(self.max_gram.min(row.len()));
        // A gap as long as the row leaves no room for a second token: larger skips add nothing.
        for distance in 1..=max_skip.min(row.len()).saturating_add(1) {
            for start in 0..row.len() {
                let last = distance.saturating_mul(smallest - 1).saturating_add(start);
                if last >= row.len() {
                    break;
                }
                gram.clear();
                for size in 1..=self.max_gram {
                    let Some(token) = row.get(start + (size - 1) * distance) else {
                        break;
                    };
                    gram.push(token.clone());
                    if size >= smallest {
                        if let Some(&column) = self.columns.get(&gram) {
                            counts[column] += 1.0;
                        }
                    }
                }
            }
            if smallest == 1 {
                smallest = 2;
                if smallest > self.max_gram {
                    break;
                }
            }
        }
    }
}

/// Counts the pool's n-grams in each row ([C] is one row, [B, C] is B) and weighs them by
/// `mode`: TF the counts, IDF the weight (or 1) where an n-gram occurs, TFIDF the weight
/// (or 1) times the count.
fn tfidf_vectorizer(ctx: &Ctx, inputs: &[Option<&HostTensor>]) -> KernelResult {
    let x = input(inputs, 0)?;
    let indexes = ctx
        .ints("ngram_indexes")
        .ok_or("attribute 'ngram_indexes' is missing")?;
    let size = tfidf_output_size(&indexes)?;
    let (rows, width, out_shape) = match x.shape() {
        [c] => (1, *c, vec![size]),
        [b, c] => (*b, *c, vec![*b, size]),
        other => return Err(format!("the input must be [C] or [B, C], not {other:?}")),
    };
    let table = NgramTable::new(ctx)?;
    let max_skip = usize::try_from(ctx.int("max_skip_count", 0)).unwrap_or(0);
    let weights = match ctx.attr("weights") {
        Some(Attribute::Floats(w)) => w.clone(),
        _ => Vec::new(),
    };
    let weight = |column: usize| weights.get(column).copied().unwrap_or(1.0);
    let mode = ctx.string("mode", "");
    if !matches!(mode.as_str(), "TF" | "IDF" | "TFIDF") {
        return Err(format!("mode '{mode}' is not TF, IDF or TFIDF"));
    }
    let tokens = tokens(x)?;
    let total = rows
        .checked_mul(size)
        .ok_or("the output has more elements than fit in memory")?;
    let mut out = super::super::tensor::try_filled(total, 0.0f32)?;
    if width > 0 {
        for (row, counts) in tokens.chunks_exact(width).zip(out.chunks_exact_mut(size)) {
            table.count(row, max_skip, counts);
            for (column, value) in counts.iter_mut().enumerate() {
                *value = match mode.as_str() {
                    "TF" => *value,
                    "IDF" if *value > 0.0 => weight(column),
                    "IDF" => 0.0,
                    _ => weight(column) * *value,
                };
            }
        }
    }
    Ok(vec![HostTensor::f32(out_shape, out)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, i, run};
    use super::*;

    fn text(shape: &[usize], values: &[&str]) -> HostTensor {
        HostTensor::new(
            shape.to_vec(),
            TensorData::String(values.iter().map(|s| s.to_string()).collect()),
        )
        .unwrap()
    }

    #[test]
    fn concat_broadcasts_and_split_pads() {
        let out = run(
            "StringConcat",
            vec![],
            &[&text(&[2], &["cat", "é"]), &text(&[], &["s"])],
        );
        assert_eq!(out[0], text(&[2], &["cats", "és"]));
        let out = run(
            "StringSplit",
            vec![("delimiter", Attribute::String(".".into()))],
            &[&text(&[2], &["a.b.c", "d"])],
        );
        assert_eq!(out[0], text(&[2, 3], &["a", "b", "c", "d", "", ""]));
        assert_eq!(out[1].to_i64_vec(), vec![3, 1]);
    }

    #[test]
    fn regex_matches_whole_strings_and_refuses_bad_patterns() {
        let x = text(&[3], &["www.a.com", "www.a.com.au", "xwww.a.com"]);
        let out = run(
            "RegexFullMatch",
            vec![("pattern", Attribute::String(r"www\.\w+\.com".into()))],
            &[&x],
        );
        assert_eq!(out[0].data(), &TensorData::Bool(vec![true, false, false]));
        let node = super::super::test_util::node(
            "RegexFullMatch",
            vec![("pattern", Attribute::String("(".into()))],
        );
        let ctx = Ctx {
            node: &node,
            opset: 20,
            output_dtypes: &[],
            input_dtypes: &[],
        };
        let err = regex_full_match(&ctx, &[Some(&x)]).unwrap_err();
        assert!(err.contains("not a valid regular expression"), "{err}");
    }

    #[test]
    fn tfidf_counts_skip_grams_as_the_reference_does() {
        // onnx's test_tfidfvectorizer_tf_batch_uniandbigrams_skip5; then with gaps and gram
        // lengths far beyond the row, which count nothing more (and must not loop or allocate
        // by them).
        let x = i(&[2, 6], &[1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8]);
        let want = [0., 3., 0., 0., 0., 0., 0., 0., 0., 1., 0., 1., 1., 1.];
        for (max_gram, max_skip) in [(2, 5), (i64::MAX, i64::MAX)] {
            let out = run(
                "TfIdfVectorizer",
                vec![
                    ("max_gram_length", Attribute::Int(max_gram)),
                    ("max_skip_count", Attribute::Int(max_skip)),
                    ("min_gram_length", Attribute::Int(1)),
                    ("mode", Attribute::String("TF".into())),
                    ("ngram_counts", Attribute::Ints(vec![0, 4])),
                    ("ngram_indexes", Attribute::Ints((0..7).collect())),
                    (
                        "pool_int64s",
                        Attribute::Ints(vec![2, 3, 5, 4, 5, 6, 7, 8, 6, 7]),
                    ),
                ],
                &[&x],
            );
            assert_close(&out[0], &[2, 7], &want);
        }
    }

    #[test]
    fn movement_ops_carry_strings() {
        let x = text(&[2, 2], &["a", "b", "c", "d"]);
        // (op, attributes, inputs after x, expected output)
        type Case = (
            &'static str,
            Vec<(&'static str, Attribute)>,
            Vec<HostTensor>,
            HostTensor,
        );
        let cases: Vec<Case> = vec![
            (
                "Transpose",
                vec![],
                vec![],
                text(&[2, 2], &["a", "c", "b", "d"]),
            ),
            (
                "Gather",
                vec![("axis", Attribute::Int(1))],
                vec![i(&[1], &[1])],
                text(&[2, 1], &["b", "d"]),
            ),
            (
                "Concat",
                vec![("axis", Attribute::Int(0))],
                vec![text(&[1, 2], &["e", "f"])],
                text(&[3, 2], &["a", "b", "c", "d", "e", "f"]),
            ),
            (
                "Slice",
                vec![],
                vec![i(&[1], &[1]), i(&[1], &[2])],
                text(&[1, 2], &["c", "d"]),
            ),
            (
                "Tile",
                vec![],
                vec![i(&[2], &[1, 2])],
                text(&[2, 4], &["a", "b", "a", "b", "c", "d", "c", "d"]),
            ),
            (
                "Expand",
                vec![],
                vec![i(&[3], &[2, 2, 2])],
                text(&[2, 2, 2], &["a", "b", "c", "d", "a", "b", "c", "d"]),
            ),
            (
                "Reshape",
                vec![],
                vec![i(&[1], &[4])],
                text(&[4], &["a", "b", "c", "d"]),
            ),
        ];
        for (op, attributes, extra, want) in cases {
            let mut inputs = vec![&x];
            inputs.extend(extra.iter());
            let out = run(op, attributes, &inputs);
            assert_eq!(out[0], want, "{op}");
        }
    }
}
