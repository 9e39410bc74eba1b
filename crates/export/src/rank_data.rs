//! The weight slices of a rank whose model keeps its weights as external data: read straight
//! from the model's data file, run by run (positioned reads of only the rank's rows and columns,
//! never the whole file; not a memory map, so a file truncated while the export runs is an
//! error rather than a SIGBUS) and written as the rank's own external data
//! (`stage_<k>.rank_<r>.data` beside its file), so that a rank of a model over protobuf's 2 GB
//! limit is still one valid ONNX file with its data beside it.
//!
//! Slices are cut from the stored bytes as they are, whatever the element type (float16 and
//! bfloat16 stay bit-exact, with no float32 copy of the whole weight).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use onnx_protobuf::tensor_proto::DataLocation;
use onnx_protobuf::{StringStringEntryProto, TensorProto};

use crate::Error;
use pipecut_ir::graph::{Graph, Storage, TensorId};
use pipecut_planner::partition::tensor_shard::AxisSplit;

/// Offsets in a rank's data file are multiples of this: aligned reads for loaders that map the
/// file and use the bytes in place (onnxruntime aligns its own external data the same way).
const ALIGNMENT: usize = 64;

/// A rank's external data file being filled: its name (relative to the rank file) and bytes.
#[derive(Debug, Clone, Default)]
pub struct RankData {
    /// The `location` the rank file's tensors name.
    pub location: String,
    /// The file's bytes.
    pub bytes: Vec<u8>,
}

impl RankData {
    /// An empty data file named `location`.
    pub fn new(location: String) -> RankData {
        RankData {
            location,
            bytes: Vec::new(),
        }
    }

    /// Appends `raw` and makes `proto` point at it.
    fn store(&mut self, proto: &mut TensorProto, raw: &[u8]) {
        let padding = self.bytes.len().next_multiple_of(ALIGNMENT) - self.bytes.len();
        self.bytes.extend(std::iter::repeat_n(0u8, padding));
        let offset = self.bytes.len();
        self.bytes.extend_from_slice(raw);
        proto.data_location = DataLocation::EXTERNAL.into();
        proto.raw_data.clear();
        for (key, value) in [
            ("location", self.location.clone()),
            ("offset", offset.to_string()),
            ("length", raw.len().to_string()),
        ] {
            let mut entry = StringStringEntryProto::new();
            entry.key = key.into();
            entry.value = value;
            proto.external_data.push(entry);
        }
    }
}

/// The external weights of one model: its data files, opened on first use.
#[derive(Default)]
pub struct ExternalWeights {
    files: HashMap<PathBuf, File>,
}

/// How to cut a weight: along `split.axis`, seen as `size` entries (zeros past the weight's own,
/// a padded vocabulary), rank `rank` of `degree`; `zero_row` appends one row of zeros (an
/// embedding slice's row for ids outside it).
#[derive(Debug, Clone, Copy)]
pub struct Cut {
    /// The split.
    pub split: AxisSplit,
    /// The axis's length to cut (≥ the weight's own; `None`: the weight's own).
    pub size: Option<u64>,
    /// The group size.
    pub degree: u64,
    /// The rank.
    pub rank: u64,
    /// Whether to append a row of zeros.
    pub zero_row: bool,
}

impl ExternalWeights {
    /// Rank `cut.rank`'s slice of `param` as an initializer named `name`, its bytes in `data`
    /// (or inline when `data` is `None`); `None` when the weight is not stored externally.
    ///
    /// # Errors
    /// [`Error::Export`] when the data file cannot be read or does not hold the weight.
    pub fn slice(
        &mut self,
        graph: &Graph,
        param: TensorId,
        cut: Cut,
        name: &str,
        data: Option<&mut RankData>,
    ) -> Result<Option<TensorProto>, Error> {
        let tensor = graph.tensor(param);
        let Some(Storage::External {
            path,
            offset,
            length,
        }) = tensor.param().map(|p| &p.storage)
        else {
            return Ok(None);
        };
        let fail = |detail: String| Error::Export(format!("slicing '{}': {detail}", tensor.name));
        let dtype = tensor.dtype.ok_or_else(|| fail("no element type".into()))?;
        let shape = graph.concrete_shape(param)?;
        let elements: u64 = shape.iter().product();
        let element_bytes = dtype
            .bytes_for(1)
            .filter(|_| dtype.size_bits() % 8 == 0 && dtype != pipecut_ir::graph::DType::String)
            .ok_or_else(|| fail(format!("{dtype:?} is not sliced by bytes")))?;
        if elements * element_bytes != *length {
            return Err(fail(format!(
                "{length} bytes stored for {elements} elements of {element_bytes} bytes"
            )));
        }
        let file = self.open(path)?;
        let short = || format!("'{}' is shorter than its reference", path.display());
        let stored = file.metadata().map(|m| m.len()).unwrap_or(0);
        if stored < offset.saturating_add(*length) {
            return Err(fail(short()));
        }
        // A file truncated since that check fails its read here, in one line.
        let mut read = |from: u64, len: u64, out: &mut Vec<u8>| {
            let bytes = pipecut_ir::io::read_range(file, offset + from, len)
                .map_err(|e| format!("{}: {}", short(), pipecut_ir::io::os_reason(&e)))?;
            out.extend_from_slice(&bytes);
            Ok(())
        };
        let (raw, dims) =
            cut_bytes(&mut read, &shape, element_bytes as usize, cut).map_err(fail)?;
        let mut proto = TensorProto::new();
        proto.name = name.into();
        proto.dims = dims.iter().map(|&d| d as i64).collect();
        proto.data_type = dtype.onnx_code();
        match data {
            Some(data) => data.store(&mut proto, &raw),
            None => proto.raw_data = raw,
        }
        Ok(Some(proto))
    }

    fn open(&mut self, path: &Path) -> Result<&File, Error> {
        if !self.files.contains_key(path) {
            let file = File::open(path).map_err(|source| Error::Io {
                path: path.to_path_buf(),
                source,
            })?;
            self.files.insert(path.to_path_buf(), file);
        }
        Ok(&self.files[path])
    }
}

/// Appends the `len` stored bytes at byte `from` of a weight to the buffer, or says why not.
type ReadRun<'a> = dyn FnMut(u64, u64, &mut Vec<u8>) -> Result<(), String> + 'a;

/// The bytes of `cut` of a row-major tensor of `shape` (elements of `element_bytes`) whose
/// stored bytes `read` gives, and the slice's dims. Each run of the slice is read once.
fn cut_bytes(
    read: &mut ReadRun,
    shape: &[u64],
    element_bytes: usize,
    cut: Cut,
) -> Result<(Vec<u8>, Vec<u64>), String> {
    let axis = cut.split.axis;
    let have = *shape.get(axis).ok_or("axis out of range")?;
    let size = cut.size.unwrap_or(have);
    if size < have || cut.split.groups == 0 || !size.is_multiple_of(cut.split.groups * cut.degree) {
        return Err(format!(
            "axis {axis} of size {size} does not split {} ways",
            cut.degree
        ));
    }
    let outer: u64 = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product::<u64>() as usize * element_bytes;
    let ranges = cut.split.ranges(size, cut.degree, cut.rank);
    let held: u64 = ranges.iter().map(|r| r.end - r.start).sum();
    let mut out = Vec::with_capacity((outer * held) as usize * inner + inner);
    for o in 0..outer {
        for r in &ranges {
            let stored_end = r.end.min(have);
            if r.start < stored_end {
                let from = (o * have + r.start) * inner as u64;
                let to = (o * have + stored_end) * inner as u64;
                read(from, to - from, &mut out)?;
            }
            // Entries past the weight's own (padding) are zeros.
            let padded = (r.end - r.start.max(stored_end)) as usize * inner;
            out.extend(std::iter::repeat_n(0u8, padded));
        }
    }
    let mut dims = shape.to_vec();
    dims[axis] = held;
    if cut.zero_row {
        let row = dims[1..].iter().product::<u64>() as usize * element_bytes;
        out.extend(std::iter::repeat_n(0u8, row));
        dims[0] += 1;
    }
    Ok((out, dims))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`cut_bytes`] over bytes in memory.
    fn cut_of(
        whole: &[u8],
        shape: &[u64],
        bytes: usize,
        cut: Cut,
    ) -> Result<(Vec<u8>, Vec<u64>), String> {
        let mut read = |from: u64, len: u64, out: &mut Vec<u8>| {
            out.extend_from_slice(&whole[from as usize..(from + len) as usize]);
            Ok(())
        };
        cut_bytes(&mut read, shape, bytes, cut)
    }

    #[test]
    fn a_cut_copies_the_ranks_runs_pads_with_zeros_and_appends_the_zero_row() {
        // 3 × 2 of one-byte elements: rows 0..3, padded to 4 rows, split 2 ways by rows.
        let whole = [1u8, 2, 3, 4, 5, 6];
        let cut = |rank, zero_row| Cut {
            split: AxisSplit { axis: 0, groups: 1 },
            size: Some(4),
            degree: 2,
            rank,
            zero_row,
        };
        assert_eq!(
            cut_of(&whole, &[3, 2], 1, cut(0, false)).unwrap(),
            (vec![1, 2, 3, 4], vec![2, 2])
        );
        assert_eq!(
            cut_of(&whole, &[3, 2], 1, cut(1, true)).unwrap(),
            (vec![5, 6, 0, 0, 0, 0], vec![3, 2])
        );
        // Columns of two-byte elements: rank 1 of 2 keeps column 1 of each row.
        let columns = Cut {
            split: AxisSplit { axis: 1, groups: 1 },
            size: None,
            degree: 2,
            rank: 1,
            zero_row: false,
        };
        assert_eq!(
            cut_of(&[1, 1, 2, 2, 3, 3, 4, 4], &[2, 2], 2, columns).unwrap(),
            (vec![2, 2, 4, 4], vec![2, 1])
        );
        assert!(cut_of(
            &whole,
            &[3, 2],
            1,
            Cut {
                size: Some(3),
                ..cut(0, false)
            }
        )
        .is_err());
    }
}
