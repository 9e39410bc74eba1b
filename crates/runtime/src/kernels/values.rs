//! What kernels on values of any kind (sequences, optionals) and the control-flow kernels, which
//! run subgraphs, see and return: the CPU runtime's only. They are registered apart from the
//! tensor kernels, in their own table (`lookup_value`, beside `lookup` in `kernels/mod.rs`).

use std::collections::HashMap;

use super::context::Ctx;
use crate::value::Value;
use pipecut_ir::graph::Subgraph;

/// Runs a subgraph on its declared inputs, giving its outputs.
pub(crate) type RunBody<'a> = dyn Fn(&Subgraph, &[Value]) -> Result<Vec<Value>, String> + 'a;

/// What a kernel on values sees: the node, and a way to run one of its subgraphs on the
/// subgraph's declared inputs (the executor supplies the outer tensors it reads).
pub(crate) struct ValueCtx<'a> {
    pub ctx: Ctx<'a>,
    pub run_body: &'a RunBody<'a>,
}

/// A kernel on values: inputs by position (`None` for an omitted optional input).
pub(crate) type ValueKernel = fn(&ValueCtx, &[Option<&Value>]) -> Result<Vec<Value>, String>;

/// Kernels on values by (domain, op type); `""` is the default domain.
#[derive(Default)]
pub(crate) struct ValueKernelTable {
    kernels: HashMap<(&'static str, &'static str), ValueKernel>,
}

impl ValueKernelTable {
    /// Registers `kernel` for each of `ops` in the default domain.
    pub fn add(&mut self, ops: &[&'static str], kernel: ValueKernel) {
        self.add_in("", ops, kernel);
    }

    /// Registers `kernel` for each of `ops` in `domain`.
    pub fn add_in(&mut self, domain: &'static str, ops: &[&'static str], kernel: ValueKernel) {
        for op in ops {
            let previous = self.kernels.insert((domain, op), kernel);
            debug_assert!(previous.is_none(), "value kernel for {op} registered twice");
        }
    }

    /// The kernel registered for `op` in `domain` (`""` or `ai.onnx` for the default).
    pub fn get(&self, domain: &str, op: &str) -> Option<ValueKernel> {
        let domain = if domain == "ai.onnx" { "" } else { domain };
        self.kernels.get(&(domain, op)).copied()
    }
}

/// Input `i`, required.
pub(crate) fn value_input<'a>(inputs: &[Option<&'a Value>], i: usize) -> Result<&'a Value, String> {
    inputs
        .get(i)
        .copied()
        .flatten()
        .ok_or_else(|| format!("input {i} is required but missing"))
}
