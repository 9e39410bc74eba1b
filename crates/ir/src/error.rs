//! The library's error type: one enum, structured fields, a message that names what is wrong and
//! where. The binary prints it with its chain and exits with code 2.

use std::path::PathBuf;

/// Everything that can go wrong in pipecut's library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be opened or read.
    #[error("cannot read '{}': {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// The bytes are not an ONNX model.
    #[error("not an ONNX model ({detail})")]
    NotOnnx {
        /// Where the bytes came from (a path, or `<bytes>`).
        origin: String,
        /// What the decoder found.
        detail: String,
    },

    /// The model decodes but breaks a rule of the ONNX format.
    #[error("invalid model: {0}")]
    InvalidModel(String),

    /// The graph breaks a structural rule.
    #[error("invalid graph: {0}")]
    InvalidGraph(String),

    /// The graph has no nodes.
    #[error("graph '{graph}' has no nodes: there is nothing to partition")]
    EmptyGraph {
        /// Graph name.
        graph: String,
    },

    /// A tensor is read but nothing produces it.
    #[error(
        "tensor '{tensor}' is read by {reader} but no node, initializer or graph input produces it"
    )]
    MissingProducer {
        /// The tensor.
        tensor: String,
        /// Who reads it.
        reader: String,
    },

    /// Two producers write one tensor name.
    #[error("tensor '{tensor}' is produced twice: by {first} and by {second}")]
    DuplicateProducer {
        /// The tensor.
        tensor: String,
        /// First producer.
        first: String,
        /// Second producer.
        second: String,
    },

    /// The graph has a cycle.
    #[error("the graph has a cycle through nodes {}", quote_list(nodes))]
    Cycle {
        /// Node names on the cycle, in edge order.
        nodes: Vec<String>,
    },

    /// An opset import outside the range pipecut supports.
    #[error(
        "opset {version} of domain '{domain}' is not supported (pipecut supports {supported})"
    )]
    UnsupportedOpset {
        /// Domain (`ai.onnx` for the default).
        domain: String,
        /// Version the model imports.
        version: i64,
        /// The supported range, in words.
        supported: String,
    },

    /// A node in an old operator version whose form pipecut does not compute.
    #[error("op '{op}' at node '{node}' (opset {opset}): {detail}")]
    LegacyOp {
        /// Operator type.
        op: String,
        /// Node name.
        node: String,
        /// The default-domain opset the model imports.
        opset: i64,
        /// What pipecut does not compute, and what to do.
        detail: String,
    },

    /// Shape inference has no rule for an operator.
    #[error("no shape rule for op '{op}' (domain '{domain}', opset {opset}) at node '{node}'")]
    UnsupportedOp {
        /// Operator type.
        op: String,
        /// Operator domain (`ai.onnx` for the default).
        domain: String,
        /// Opset version in force for that domain (0 when the domain is not imported).
        opset: i64,
        /// Node name.
        node: String,
    },

    /// Shape inference found inputs that the operator cannot accept.
    #[error("shape inference failed at node '{node}' ({op}): {detail}")]
    ShapeInference {
        /// Node name.
        node: String,
        /// Operator type.
        op: String,
        /// What is wrong.
        detail: String,
    },

    /// A dimension that is negative, or a size that overflows.
    #[error("tensor '{tensor}' has an invalid shape: {detail}")]
    InvalidDim {
        /// Tensor name.
        tensor: String,
        /// What is wrong.
        detail: String,
    },

    /// A later phase needs a concrete size that the user has not bound.
    #[error("dim '{dim}' of tensor '{tensor}' is not bound: pass --dim {dim}=N")]
    UnboundDim {
        /// The symbolic dim.
        dim: String,
        /// A tensor that carries it.
        tensor: String,
    },

    /// A later phase needs a tensor whose shape inference could not determine.
    #[error("the shape of tensor '{tensor}' is not known")]
    UnknownShape {
        /// Tensor name.
        tensor: String,
    },

    /// A `--dim NAME=V` binding that cannot be used.
    #[error("bad dim binding: {0}")]
    DimBinding(String),

    /// An external-data reference that cannot be honoured.
    #[error("initializer '{tensor}' has unusable external data '{location}': {detail}")]
    ExternalData {
        /// Initializer name.
        tensor: String,
        /// The location as written in the model.
        location: String,
        /// What is wrong.
        detail: String,
    },

    /// A hardware profile that cannot be used.
    #[error("hardware profile '{origin}' is invalid: {detail}")]
    Profile {
        /// File or built-in name.
        origin: String,
        /// What is wrong.
        detail: String,
    },

    /// A short device name that several profiles answer to.
    #[error("device name '{name}' is ambiguous: it could be {choices}; name one of them")]
    AmbiguousHardware {
        /// The name asked for.
        name: String,
        /// The profiles it could mean.
        choices: String,
    },

    /// A device or link name that no profile answers to.
    #[error("unknown {kind} '{name}'; known {kind}s: {known}")]
    UnknownHardware {
        /// `device` or `link`.
        kind: &'static str,
        /// The name asked for.
        name: String,
        /// Known names.
        known: String,
    },

    /// A cluster description that cannot be used.
    #[error("bad cluster description '{spec}': {detail}")]
    Cluster {
        /// The description as given.
        spec: String,
        /// What is wrong.
        detail: String,
    },

    /// The cost model has no rule for an operator (and no fallback was asked for).
    #[error("no cost rule for op '{op}' (domain '{domain}') at node '{node}'; pass --unknown-op-cost zero|bytes to cost it anyway")]
    NoCostRule {
        /// Operator type.
        op: String,
        /// Operator domain.
        domain: String,
        /// Node name.
        node: String,
    },

    /// The cost model could not cost a node.
    #[error("cannot cost node '{node}' ({op}): {detail}")]
    Cost {
        /// Node name.
        node: String,
        /// Operator type.
        op: String,
        /// What is wrong.
        detail: String,
    },

    /// A partition request that cannot be solved as asked (bad stage count, no devices...).
    #[error("cannot partition: {0}")]
    PartitionConfig(String),

    /// No assignment fits the devices' memory; the message says which stage and by how much.
    #[error("the model does not fit: {0}")]
    Infeasible(String),

    /// Whether any assignment fits the devices' memory was not decided before the time limit
    /// (or work budget): not "does not fit", which is proven. The message says what is known.
    #[error("the memory decision is not finished: {0}")]
    MemoryUndecided(String),

    /// A plan file that is not a valid plan for this model and cluster.
    #[error("invalid plan: {0}")]
    InvalidPlan(String),

    /// Stages handed to the exporter that do not hold every node exactly once.
    #[error("the stages are not a partition of the graph's nodes: {0}")]
    NotAPartition(String),

    /// A tensor would flow from a later stage back to an earlier one.
    #[error(
        "the stages are not convex and ordered: tensor '{tensor}' is made by node '{producer}' on stage {producer_stage} but read by node '{consumer}' on the earlier stage {consumer_stage}"
    )]
    NonConvexStages {
        /// The tensor.
        tensor: String,
        /// The node that makes it.
        producer: String,
        /// The producer's stage.
        producer_stage: usize,
        /// A node that reads it.
        consumer: String,
        /// The reader's stage.
        consumer_stage: usize,
    },

    /// An output directory that cannot be created or written to.
    #[error("cannot write to output directory '{}': {detail}", path.display())]
    OutDir {
        /// The directory.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },

    /// An input file that pipecut will not read: not a regular file, too large, not text.
    #[error("cannot read {what} '{}': {detail}", path.display())]
    Input {
        /// What the file was given as ("plan", "cluster file").
        what: String,
        /// The file.
        path: PathBuf,
        /// Why it is refused.
        detail: String,
    },

    /// An output path refused before anything was written (it is an input, a directory, a
    /// device, or its directory is missing).
    #[error("refusing to write '{}': {detail}", path.display())]
    Output {
        /// The path.
        path: PathBuf,
        /// Why.
        detail: String,
    },

    /// A file could not be written.
    #[error("cannot write '{}': {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// The model cannot be exported as stage files.
    #[error("cannot export stages: {0}")]
    Export(String),

    /// A `.npy` file that cannot be read or written.
    #[error("bad .npy file '{origin}': {detail}")]
    Npy {
        /// The file (or `<bytes>`).
        origin: String,
        /// What is wrong.
        detail: String,
    },

    /// The runtime has no kernel for an operator.
    #[error("no CPU kernel for op '{op}' (domain '{domain}') at node '{node}'")]
    NoKernel {
        /// Operator type.
        op: String,
        /// Operator domain (`ai.onnx` for the default).
        domain: String,
        /// Node name.
        node: String,
    },

    /// A kernel refused its inputs or attributes while running.
    #[error("running node '{node}' ({op}) failed: {detail}")]
    Kernel {
        /// Node name.
        node: String,
        /// Operator type.
        op: String,
        /// What is wrong.
        detail: String,
    },

    /// The CUDA backend was asked for in a build without the `cuda` feature.
    #[error("this pipecut was built without CUDA support: rebuild with `cargo build --release --features cuda` (no CUDA toolkit needed to build; the driver, NVRTC and cuBLAS libraries are loaded when it runs)")]
    CudaNotCompiled,

    /// The CUDA backend cannot start or a device operation failed (no driver or device, NVRTC
    /// compile failure, out of memory), naming the stage where there is one.
    #[error("CUDA: {0}")]
    Cuda(String),

    /// Inputs given to a run that do not match what the model or plan expects.
    #[error("bad run input: {0}")]
    RunInput(String),

    /// A multi-process run could not start or lost a rank: the launcher's environment, the
    /// rendezvous, or a peer that stopped, named by rank, stage and replica.
    #[error("distributed run: {0}")]
    Distributed(String),

    /// A per-node time was given for a node name the graph does not have.
    #[error("node time override names {count} node(s) the graph does not have, first '{name}' (names must match the graph's node names exactly)")]
    UnknownNode {
        /// The first unknown name, in sorted order.
        name: String,
        /// How many of the given names are unknown.
        count: usize,
    },

    /// A request through the C ABI (`pipecut::ffi`) that cannot be used: a NULL pointer, text
    /// that is not UTF-8, or a config JSON with an unknown field or a bad value.
    #[error("invalid request: {0}")]
    InvalidRequest(String),

    /// A count from the input is over a limit pipecut sets so that it never allocates or loops
    /// in proportion to an untrusted number (see `docs/robustness.md`, "Sizes and arithmetic").
    #[error("{what} is {value}, over pipecut's limit of {limit}: {why}")]
    OverLimit {
        /// What was counted (`micro-batches per step`, ...).
        what: String,
        /// The value asked for.
        value: u128,
        /// The largest value accepted.
        limit: u128,
        /// Why the limit is there, and what to do instead.
        why: String,
    },
}

fn quote_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("'{s}'")).collect();
    quoted.join(" -> ")
}

/// Result alias for the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;
