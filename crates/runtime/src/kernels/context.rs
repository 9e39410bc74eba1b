//! What a kernel is and what it sees of its node: the context ([`Ctx`], with its attribute
//! readers), the kernel's signature and result, the table kernels register in, and how a kernel
//! takes its inputs. Every kernel family reads this; it reads none of them.

use std::collections::HashMap;

use crate::tensor::HostTensor;
use pipecut_ir::graph::{Attribute, DType, Node};

/// What a kernel sees of its node.
pub(crate) struct Ctx<'a> {
    /// The node (attributes, name).
    pub node: &'a Node,
    /// Opset in force for the node's domain: several ops changed semantics across versions.
    pub opset: i64,
    /// The element types shape inference gave the node's outputs (`None` where unknown). The
    /// runtime widens narrow integers to int64 (see [`crate::tensor`]), so a kernel that must
    /// saturate to uint8 or int8 (QuantizeLinear, QLinearMatMul) learns the range here.
    pub output_dtypes: &'a [Option<DType>],
    /// The element types shape inference gave the node's inputs, which the runtime may hold
    /// wider (BitCast reinterprets the declared type's bits).
    pub input_dtypes: &'a [Option<DType>],
}

/// A kernel's result: one tensor per output, in order (optional trailing outputs may be absent).
pub(crate) type KernelResult = Result<Vec<HostTensor>, String>;

/// A kernel: node context and inputs by position (`None` for an omitted optional input).
pub(crate) type Kernel = fn(&Ctx, &[Option<&HostTensor>]) -> KernelResult;

/// Kernels by (domain, op type); `""` is the default domain.
#[derive(Default)]
pub(crate) struct KernelTable {
    pub(super) kernels: HashMap<(&'static str, &'static str), Kernel>,
}

impl KernelTable {
    /// Registers `kernel` for each of `ops` in the default domain.
    pub fn add(&mut self, ops: &[&'static str], kernel: Kernel) {
        for op in ops {
            let previous = self.kernels.insert(("", op), kernel);
            debug_assert!(previous.is_none(), "kernel for {op} registered twice");
        }
    }

    /// Registers `kernel` for each of `ops` in `domain` (`com.microsoft`, ...).
    pub fn add_in(&mut self, domain: &'static str, ops: &[&'static str], kernel: Kernel) {
        for op in ops {
            let previous = self.kernels.insert((domain, op), kernel);
            debug_assert!(
                previous.is_none(),
                "kernel for {domain}:{op} registered twice"
            );
        }
    }
}

/// Input `i`, required.
pub(crate) fn input<'a>(
    inputs: &[Option<&'a HostTensor>],
    i: usize,
) -> Result<&'a HostTensor, String> {
    inputs
        .get(i)
        .copied()
        .flatten()
        .ok_or_else(|| format!("input {i} is required but missing"))
}

/// Input `i`, optional.
pub(crate) fn optional<'a>(inputs: &[Option<&'a HostTensor>], i: usize) -> Option<&'a HostTensor> {
    inputs.get(i).copied().flatten()
}

impl Ctx<'_> {
    pub fn attr(&self, name: &str) -> Option<&Attribute> {
        self.node.attributes.get(name)
    }

    pub fn int(&self, name: &str, default: i64) -> i64 {
        match self.attr(name) {
            Some(Attribute::Int(v)) => *v,
            _ => default,
        }
    }

    pub fn float(&self, name: &str, default: f32) -> f32 {
        match self.attr(name) {
            Some(Attribute::Float(v)) => *v,
            Some(Attribute::Int(v)) => *v as f32,
            _ => default,
        }
    }

    pub fn ints(&self, name: &str) -> Option<Vec<i64>> {
        match self.attr(name) {
            Some(Attribute::Ints(v)) => Some(v.clone()),
            Some(Attribute::Int(v)) => Some(vec![*v]),
            _ => None,
        }
    }

    pub fn string(&self, name: &str, default: &str) -> String {
        match self.attr(name) {
            Some(Attribute::String(v)) => v.clone(),
            _ => default.to_string(),
        }
    }
}
