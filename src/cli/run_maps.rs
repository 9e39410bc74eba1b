//! A map input of `pipecut run` (DictVectorizer's and CastMap's, `ai.onnx.ml`): `NAME=FILE.json`
//! holds one JSON object, its keys the map's keys (int64 keys written as decimal strings, JSON
//! keys being strings) and its values numbers or strings, as the model's map type says. A map
//! output is written back the same way.

use std::collections::HashSet;
use std::fmt;
use std::io::Read;
use std::path::Path;

use anyhow::{bail, Context};
use serde::de::{self, Deserializer, MapAccess, Visitor};

use crate::graph::DType;
use crate::runtime::{HostTensor, TensorData, Value};

/// The largest map file read: far above any feature dictionary a classical model takes; the
/// bound is checked before the file is read, so a huge or endless file allocates nothing.
const MAX_MAP_FILE_BYTES: u64 = 64 << 20;

/// The most entries a map input may hold, checked as they are parsed, before each is stored.
const MAX_MAP_ENTRIES: usize = 1 << 20;

/// Reads the map input `name` (keys of `key`, values of `value`) from the JSON object in `file`.
pub(crate) fn read_map(name: &str, file: &Path, key: DType, value: DType) -> anyhow::Result<Value> {
    if file.extension().is_none_or(|e| e != "json") {
        bail!(
            "input '{name}' is a map from {key} to {value}: give it as a .json object, not '{}'",
            file.display()
        );
    }
    let text = read_bounded(file)?;
    let entries = serde_json::from_slice::<Entries>(&text)
        .map_err(|e| anyhow::anyhow!("input '{name}': '{}': {e}", file.display()))?
        .0;
    let keys = parse_keys(name, &entries, key)?;
    let values = parse_values(name, &entries, value)?;
    Value::map(keys, values).map_err(|e| anyhow::anyhow!("input '{name}': {e}"))
}

/// The file's bytes, refused past [`MAX_MAP_FILE_BYTES`] before they are read.
fn read_bounded(file: &Path) -> anyhow::Result<Vec<u8>> {
    let opened =
        std::fs::File::open(file).with_context(|| format!("cannot read '{}'", file.display()))?;
    let too_large = || {
        anyhow::anyhow!(
            "'{}' is larger than {} MiB, the most a map input may take",
            file.display(),
            MAX_MAP_FILE_BYTES >> 20
        )
    };
    let declared = opened.metadata().map(|m| m.len()).unwrap_or(0);
    if declared > MAX_MAP_FILE_BYTES {
        return Err(too_large());
    }
    // A file that grows, or a device that never ends, stops at the bound all the same.
    let mut text = Vec::with_capacity(declared as usize);
    opened
        .take(MAX_MAP_FILE_BYTES + 1)
        .read_to_end(&mut text)
        .with_context(|| format!("cannot read '{}'", file.display()))?;
    if text.len() as u64 > MAX_MAP_FILE_BYTES {
        return Err(too_large());
    }
    Ok(text)
}

/// A JSON object's entries in file order: a key given twice, or more than [`MAX_MAP_ENTRIES`]
/// entries, is a parse error (a map has each key once; serde_json would keep the last).
struct Entries(Vec<(String, serde_json::Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(EntriesVisitor)
    }
}

struct EntriesVisitor;

impl<'de> Visitor<'de> for EntriesVisitor {
    type Value = Entries;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object (the map)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Entries, A::Error> {
        let mut entries = Vec::new();
        let mut seen = HashSet::new();
        while let Some(key) = access.next_key::<String>()? {
            if entries.len() == MAX_MAP_ENTRIES {
                return Err(de::Error::custom(format!(
                    "more than {MAX_MAP_ENTRIES} entries, the most a map input may hold"
                )));
            }
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format!("key '{key}' is given twice")));
            }
            let value = access.next_value::<serde_json::Value>()?;
            entries.push((key, value));
        }
        Ok(Entries(entries))
    }
}

/// The keys as a `[K]` tensor of the map's key type (int64 keys from their decimal strings).
fn parse_keys(
    name: &str,
    entries: &[(String, serde_json::Value)],
    key: DType,
) -> anyhow::Result<HostTensor> {
    let data = match key {
        DType::String => TensorData::String(entries.iter().map(|(k, _)| k.clone()).collect()),
        DType::I64 => TensorData::I64(
            entries
                .iter()
                .map(|(k, _)| {
                    k.parse::<i64>().map_err(|_| {
                        anyhow::anyhow!(
                            "input '{name}' is a map from int64, but key '{k}' is not an int64"
                        )
                    })
                })
                .collect::<anyhow::Result<_>>()?,
        ),
        other => bail!("input '{name}' is a map from {other}: map keys are int64 or strings"),
    };
    HostTensor::new(vec![entries.len()], data).map_err(anyhow::Error::msg)
}

/// The values as a `[K]` tensor in the runtime's type for `value` (a double as a float, as the
/// runtime computes every double).
fn parse_values(
    name: &str,
    entries: &[(String, serde_json::Value)],
    value: DType,
) -> anyhow::Result<HostTensor> {
    let wrong = |k: &str, v: &serde_json::Value| {
        anyhow::anyhow!("input '{name}' maps to {value}, but key '{k}' holds {v}")
    };
    let data = match value {
        DType::F32 | DType::F64 => TensorData::F32(
            entries
                .iter()
                .map(|(k, v)| v.as_f64().map(|x| x as f32).ok_or_else(|| wrong(k, v)))
                .collect::<anyhow::Result<_>>()?,
        ),
        DType::I64 => TensorData::I64(
            entries
                .iter()
                .map(|(k, v)| v.as_i64().ok_or_else(|| wrong(k, v)))
                .collect::<anyhow::Result<_>>()?,
        ),
        DType::String => TensorData::String(
            entries
                .iter()
                .map(|(k, v)| v.as_str().map(str::to_string).ok_or_else(|| wrong(k, v)))
                .collect::<anyhow::Result<_>>()?,
        ),
        other => {
            bail!("input '{name}' maps to {other}: map values are float, double, int64 or strings")
        }
    };
    HostTensor::new(vec![entries.len()], data).map_err(anyhow::Error::msg)
}

/// A map as the JSON object `read_map` reads back: keys in ascending order.
pub(crate) fn map_json(keys: &HostTensor, values: &HostTensor) -> anyhow::Result<Vec<u8>> {
    let keys: Vec<String> = match keys.data() {
        TensorData::I64(k) => k.iter().map(i64::to_string).collect(),
        TensorData::String(k) => k.clone(),
        _ => bail!("a map's keys are int64 or strings, not {}", keys.dtype()),
    };
    let values: Vec<serde_json::Value> = match values.data() {
        TensorData::F32(v) => v.iter().map(|&x| serde_json::json!(x)).collect(),
        TensorData::I64(v) => v.iter().map(|&x| serde_json::json!(x)).collect(),
        TensorData::String(v) => v.iter().map(|x| serde_json::json!(x)).collect(),
        _ => bail!("a map of {} values", values.dtype()),
    };
    let object: serde_json::Map<String, serde_json::Value> = keys.into_iter().zip(values).collect();
    let mut text = serde_json::to_vec_pretty(&object)?;
    text.push(b'\n');
    Ok(text)
}
