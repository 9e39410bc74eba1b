//! The `ai.onnx.ml` ops that read a map ([`Value::Map`]): DictVectorizer and CastMap, kernels on
//! values. Semantics: the op pages and onnxruntime (`providers/cpu/ml/dictvectorizer.h`,
//! `cast_map.cc`), which iterates a map in ascending key order, as [`Value::Map`] holds it.

use std::sync::Arc;

use super::values::{value_input, ValueCtx, ValueKernelTable};
use crate::tensor::{try_filled, HostTensor, TensorData};
use crate::value::Value;
use pipecut_ir::graph::Attribute;

const DOMAIN: &str = "ai.onnx.ml";

pub(super) fn register_values(t: &mut ValueKernelTable) {
    t.add_in(DOMAIN, &["DictVectorizer"], dict_vectorizer);
    t.add_in(DOMAIN, &["CastMap"], cast_map);
}

fn tensor(t: HostTensor) -> Vec<Value> {
    vec![Value::Tensor(Arc::new(t))]
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_DictVectorizer.html>: `[1, V]`, column `i`
/// the map's value for vocabulary word `i` (`string_vocabulary` or `int64_vocabulary`), zero
/// (an empty string) for a word the map lacks; keys outside the vocabulary are dropped.
fn dict_vectorizer(ctx: &ValueCtx, inputs: &[Option<&Value>]) -> Result<Vec<Value>, String> {
    let (keys, values) = value_input(inputs, 0)?.as_map()?;
    let found: Vec<Option<usize>> = match (ctx.ctx.attr("string_vocabulary"), keys.data()) {
        (Some(Attribute::Strings(words)), TensorData::String(k)) => {
            words.iter().map(|w| k.binary_search(w).ok()).collect()
        }
        (None, TensorData::I64(k)) => match ctx.ctx.attr("int64_vocabulary") {
            Some(Attribute::Ints(words)) => words.iter().map(|w| k.binary_search(w).ok()).collect(),
            _ => return Err("int64_vocabulary is missing".into()),
        },
        (Some(_), _) => {
            return Err(format!(
                "string_vocabulary needs a map from strings, not from {}",
                keys.dtype()
            ))
        }
        (None, _) => return Err("string_vocabulary is missing".into()),
    };
    let shape = vec![1, found.len()];
    let data = match values.data() {
        TensorData::F32(v) => TensorData::F32(spread(&found, v, 0.0)),
        TensorData::I64(v) => TensorData::I64(spread(&found, v, 0)),
        TensorData::String(v) => TensorData::String(spread(&found, v, String::new())),
        _ => return Err(format!("a map of {} values", values.dtype())),
    };
    Ok(tensor(HostTensor::with_data(shape, data)))
}

/// What CastMap writes: its `cast_to` type.
#[derive(Clone, Copy, PartialEq)]
enum CastTo {
    Float,
    Int64,
    String,
}

/// <https://onnx.ai/onnx/operators/onnx_aionnxml_CastMap.html>: a map from int64 to strings or
/// floats becomes `[1, W]` in `cast_to`'s type. DENSE: the values in key order (W = the map's
/// size). SPARSE: column `k` holds key `k`'s value for `k < max_map`, the pad (0, or the string
/// "0.f" as onnxruntime writes it) where the map has no key `k`; a negative key is an error.
fn cast_map(ctx: &ValueCtx, inputs: &[Option<&Value>]) -> Result<Vec<Value>, String> {
    let (keys, values) = value_input(inputs, 0)?.as_map()?;
    let TensorData::I64(keys) = keys.data() else {
        return Err(format!(
            "the map's keys must be int64, not {}",
            keys.dtype()
        ));
    };
    let cast_to = match ctx.ctx.string("cast_to", "TO_FLOAT").as_str() {
        "TO_FLOAT" => CastTo::Float,
        "TO_INT64" => CastTo::Int64,
        "TO_STRING" => CastTo::String,
        other => return Err(format!("cast_to is '{other}'")),
    };
    let cast = cast_values(values, cast_to)?;
    let columns: Vec<Option<usize>> = match ctx.ctx.string("map_form", "DENSE").as_str() {
        "DENSE" => (0..keys.len()).map(Some).collect(),
        "SPARSE" => sparse_columns(keys, ctx.ctx.int("max_map", 1))?,
        other => return Err(format!("map_form is '{other}', not DENSE or SPARSE")),
    };
    let data = match cast {
        TensorData::F32(v) => TensorData::F32(spread(&columns, &v, 0.0)),
        TensorData::I64(v) => TensorData::I64(spread(&columns, &v, 0)),
        TensorData::String(v) => TensorData::String(spread(&columns, &v, "0.f".to_string())),
        _ => unreachable!("cast_values gives floats, int64 or strings"),
    };
    Ok(tensor(HostTensor::with_data(vec![1, columns.len()], data)))
}

/// For each of `max_map` columns, the entry of `keys` (ascending) whose key is the column's
/// index; keys past the last column are dropped, as onnxruntime drops them.
fn sparse_columns(keys: &[i64], max_map: i64) -> Result<Vec<Option<usize>>, String> {
    if let Some(&first) = keys.first().filter(|&&k| k < 0) {
        return Err(format!(
            "key {first} is negative: a SPARSE map's keys are column indices"
        ));
    }
    let width = usize::try_from(max_map).map_err(|_| format!("max_map is {max_map}"))?;
    let mut columns = try_filled(width, None)?;
    for (i, &k) in keys.iter().enumerate() {
        if let Some(column) = usize::try_from(k).ok().and_then(|k| columns.get_mut(k)) {
            *column = Some(i);
        }
    }
    Ok(columns)
}

/// The entries `columns` names, `pad` where it names none.
fn spread<T: Clone>(columns: &[Option<usize>], values: &[T], pad: T) -> Vec<T> {
    columns
        .iter()
        .map(|c| c.map_or_else(|| pad.clone(), |i| values[i].clone()))
        .collect()
}

/// The map's values cast as onnxruntime casts them: a string through `std::stof` /
/// `std::stoll` (leading spaces skipped, the number that starts the string), a float to int64
/// by truncation and to a string by `std::to_string` (`%f`: six decimals).
fn cast_values(values: &HostTensor, to: CastTo) -> Result<TensorData, String> {
    Ok(match (values.data(), to) {
        (TensorData::F32(v), CastTo::Float) => TensorData::F32(v.clone()),
        (TensorData::F32(v), CastTo::Int64) => {
            TensorData::I64(v.iter().map(|&x| x as i64).collect())
        }
        (TensorData::F32(v), CastTo::String) => {
            TensorData::String(v.iter().map(|&x| format!("{:.6}", x as f64)).collect())
        }
        (TensorData::String(v), CastTo::Float) => TensorData::F32(
            v.iter()
                .map(|s| leading_float(s))
                .collect::<Result<_, _>>()?,
        ),
        (TensorData::String(v), CastTo::Int64) => {
            TensorData::I64(v.iter().map(|s| leading_int(s)).collect::<Result<_, _>>()?)
        }
        (TensorData::String(v), CastTo::String) => TensorData::String(v.clone()),
        (other, _) => {
            return Err(format!(
                "a map of {} values: CastMap takes strings or floats",
                other.dtype()
            ))
        }
    })
}

/// The longest prefix of `text` (after leading whitespace) that is a float, as `std::stof`
/// reads it.
fn leading_float(text: &str) -> Result<f32, String> {
    let trimmed = text.trim_start();
    (1..=trimmed.len())
        .rev()
        .filter(|&end| trimmed.is_char_boundary(end))
        .find_map(|end| trimmed[..end].parse::<f32>().ok())
        .ok_or_else(|| format!("'{text}' does not start with a number"))
}

/// The integer that starts `text` (after leading whitespace), as `std::stoll` reads it.
fn leading_int(text: &str) -> Result<i64, String> {
    let trimmed = text.trim_start();
    let sign = usize::from(trimmed.starts_with(['+', '-']));
    let digits = trimmed[sign..]
        .bytes()
        .take_while(u8::is_ascii_digit)
        .count();
    trimmed[..sign + digits]
        .parse::<i64>()
        .map_err(|_| format!("'{text}' does not start with an int64"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::context::Ctx;
    use crate::kernels::test_util::node;

    /// Runs the map kernel `kernel` of `op` on `map` (no subgraphs to run).
    fn run(
        op: &str,
        kernel: super::super::values::ValueKernel,
        attributes: Vec<(&str, Attribute)>,
        map: &Value,
    ) -> Result<HostTensor, String> {
        let node = node(op, attributes);
        let no_body = |_: &pipecut_ir::graph::Subgraph, _: &[Value]| Err("no subgraph".into());
        let ctx = ValueCtx {
            ctx: Ctx {
                node: &node,
                opset: 1,
                output_dtypes: &[],
                input_dtypes: &[],
            },
            run_body: &no_body,
        };
        let out = kernel(&ctx, &[Some(map)])?;
        Ok((**out[0].tensor()?).clone())
    }

    fn int_map(keys: Vec<i64>, values: TensorData) -> Value {
        let n = keys.len();
        Value::map(
            HostTensor::i64(vec![n], keys),
            HostTensor::new(vec![n], values).unwrap(),
        )
        .unwrap()
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn cast_map_reads_strings_as_stof_and_stoll_do() {
        let map = int_map(
            vec![3, 1, 10],
            TensorData::String(strings(&[" 7", "2.5", "-1e3x"])),
        );
        let to = |cast_to: &str, form: &str| {
            let attributes = vec![
                ("cast_to", Attribute::String(cast_to.into())),
                ("map_form", Attribute::String(form.into())),
                ("max_map", Attribute::Int(4)),
            ];
            run("CastMap", cast_map, attributes, &map).unwrap()
        };
        // Keys ascending: 1, 3, 10.
        assert_eq!(
            to("TO_FLOAT", "DENSE").as_f32().unwrap(),
            &[2.5, 7.0, -1000.0]
        );
        assert_eq!(to("TO_INT64", "DENSE").to_i64_vec(), vec![2, 7, -1]);
        assert_eq!(to("TO_INT64", "SPARSE").to_i64_vec(), vec![0, 2, 0, 7]);
        let TensorData::String(texts) = to("TO_STRING", "SPARSE").into_parts().1 else {
            panic!("strings expected")
        };
        assert_eq!(texts, strings(&["0.f", "2.5", "0.f", " 7"]));
    }

    #[test]
    fn cast_map_refuses_what_onnxruntime_refuses() {
        let sparse = vec![("map_form", Attribute::String("SPARSE".into()))];
        let negative = int_map(vec![-1, 2], TensorData::F32(vec![1.0, 2.0]));
        let err = run("CastMap", cast_map, sparse, &negative).unwrap_err();
        assert!(err.contains("key -1 is negative"), "{err}");
        let words = int_map(vec![1], TensorData::String(strings(&["x1"])));
        let err = run("CastMap", cast_map, vec![], &words).unwrap_err();
        assert!(err.contains("'x1' does not start with a number"), "{err}");
    }

    #[test]
    fn dict_vectorizer_picks_the_vocabulary_from_int64_keys() {
        let map = int_map(vec![5, -2, 9], TensorData::I64(vec![50, -20, 90]));
        let vocabulary = vec![("int64_vocabulary", Attribute::Ints(vec![9, 4, -2]))];
        let out = run("DictVectorizer", dict_vectorizer, vocabulary, &map).unwrap();
        assert_eq!(out.shape(), &[1, 3]);
        assert_eq!(out.to_i64_vec(), vec![90, 0, -20]);
        let words = vec![("string_vocabulary", Attribute::Strings(strings(&["a"])))];
        let err = run("DictVectorizer", dict_vectorizer, words, &map).unwrap_err();
        assert!(err.contains("needs a map from strings"), "{err}");
    }

    #[test]
    fn a_map_with_a_repeated_key_is_refused() {
        let keys = HostTensor::i64(vec![2], vec![4, 4]);
        let values = HostTensor::f32(vec![2], vec![1.0, 2.0]);
        let err = Value::map(keys, values).unwrap_err();
        assert!(err.contains("key '4' appears twice"), "{err}");
    }
}
