//! A stage's MatMulNBits weights expanded on the device (`nbits.rs`), kept by node for as long
//! as the operands they were made from are the node's: the launch context carries the cache, so
//! a run expands each weight once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaSlice;

use super::value::Value;
use crate::tensor::HostTensor;

/// One operand an expanded weight was made from, held so that its address names it for as long
/// as the cache keeps the weight (a freed tensor's address could be reused by another).
#[derive(Debug, Clone)]
pub(super) enum Source {
    Host(Arc<HostTensor>),
    Device(Arc<CudaSlice<f32>>),
}

impl Source {
    pub(super) fn of(value: &Value) -> Option<Source> {
        match value {
            Value::Host(t, _) => Some(Source::Host(Arc::clone(t))),
            Value::Device(t) => Some(Source::Device(Arc::clone(&t.data))),
            Value::Optional(_) => None,
        }
    }

    fn same(&self, other: &Source) -> bool {
        match (self, other) {
            (Source::Host(a), Source::Host(b)) => Arc::ptr_eq(a, b),
            (Source::Device(a), Source::Device(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

fn same_sources(a: &[Option<Source>], b: &[Option<Source>]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|pair| match pair {
            (Some(x), Some(y)) => x.same(y),
            (None, None) => true,
            _ => false,
        })
}

/// An expanded weight and the operands it was made from.
type Expanded = (Vec<Option<Source>>, Arc<CudaSlice<f32>>);

/// A stage's expanded MatMulNBits weights, by node (its address: nodes live as long as the
/// graph), each with the operands it was made from.
#[derive(Debug, Default)]
pub(super) struct ExpandedWeights(Mutex<HashMap<usize, Expanded>>);

impl ExpandedWeights {
    pub(super) fn get(&self, node: usize, from: &[Option<Source>]) -> Option<Arc<CudaSlice<f32>>> {
        let cache = self.0.lock().ok()?;
        let (sources, weights) = cache.get(&node)?;
        same_sources(sources, from).then(|| Arc::clone(weights))
    }

    pub(super) fn keep(
        &self,
        node: usize,
        from: Vec<Option<Source>>,
        weights: &Arc<CudaSlice<f32>>,
    ) {
        if let Ok(mut cache) = self.0.lock() {
            cache.insert(node, (from, Arc::clone(weights)));
        }
    }
}
