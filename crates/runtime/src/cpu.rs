//! The CPU reference backend, and the pipeline driver every backend shares.
//!
//! [`CpuExecutor`] runs the nodes of a stage in topological order with the kernels of
//! [`super::kernels`], freeing each intermediate tensor after its last reader. [`run_pipeline`]
//! runs K prepared stages on K threads (`std::thread::scope`), connected by channels, and streams
//! M micro-batches (the inputs split along axis 0) through them: stage s works on micro-batch
//! i + 1 while stage s + 1 works on micro-batch i, as GPipe's forward pass does. It measures each
//! stage's busy time; idle time is the rest of the wall-clock time, and the pipeline efficiency
//! is Σ busy / (K · wall), the measured counterpart of the simulator's `1 − bubble`.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

use super::constant_steps::{fold_constant_steps, ConstantSteps};
use super::fuse::{fold_conv_chains, FoldedConv};
use super::kernels::{self, Ctx, Kernel, ValueCtx, ValueKernel};
use super::steps::{plan_steps_with, store_outputs, Step};
use super::tensor::HostTensor;
use super::value::{Value, Values};
use super::{stage_specs, Executor, StageSpec, Tensors, Weights};
use crate::Error;
use pipecut_ir::graph::{Graph, Node, NodeId, Subgraph, TensorId};

/// A CPU step's kernel: on tensors, or on values of any kind (sequences, optionals, control
/// flow, which runs subgraphs).
#[derive(Debug, Clone)]
pub(crate) enum CpuKernel {
    Tensor(Kernel),
    Value(ValueKernel),
    /// A Conv with the nodes after it folded in when the stage was prepared (`fuse`).
    Folded(Arc<FoldedConv>),
}

/// The CPU runtime's steps: its tensor kernels, and the kernels on values only it has (an op with both,
/// Identity, takes the one its inputs' values call for when it runs).
fn plan_cpu_steps(graph: &Graph, spec: &StageSpec) -> Result<Vec<Step<CpuKernel>>, Error> {
    plan_steps_with(graph, spec, |node| {
        let tensor_kernel = (!node.has_subgraphs())
            .then(|| kernels::lookup(&node.domain, &node.op_type))
            .flatten();
        tensor_kernel
            .map(CpuKernel::Tensor)
            .or_else(|| kernels::lookup_value(&node.domain, &node.op_type).map(CpuKernel::Value))
    })
}

/// A stage's steps as they run: kernels resolved, Conv chains folded, and the steps that read
/// only weights run now.
fn prepare_steps(
    graph: &Graph,
    weights: &Weights,
    spec: &StageSpec,
) -> Result<(Vec<Step<CpuKernel>>, ConstantSteps), Error> {
    let steps = plan_cpu_steps(graph, spec)?;
    let steps = fold_conv_chains(graph, weights, spec, steps, CpuKernel::Folded);
    Ok(fold_constant_steps(graph, weights, spec, steps))
}

/// A run's values to start from: the folded constants.
fn starting_env(constants: &ConstantSteps) -> Env {
    constants
        .values
        .iter()
        .map(|(id, t)| (*id, Value::Tensor(Arc::clone(t))))
        .collect()
}

/// The CPU reference backend over one graph and its weights.
#[derive(Debug, Clone, Copy)]
pub struct CpuExecutor<'a> {
    graph: &'a Graph,
    weights: &'a Weights,
}

/// A stage prepared by [`CpuExecutor`].
#[derive(Debug)]
pub struct CpuStage {
    spec: StageSpec,
    steps: Vec<Step<CpuKernel>>,
    /// What the steps that read only weights made, run once here (`constant_steps`).
    constants: ConstantSteps,
    /// Its control-flow nodes' subgraphs, as they are first run.
    bodies: PreparedBodies,
}

/// The subgraphs of a stage's control-flow nodes (at any depth), each prepared the first time
/// it runs and reused by every later run: its weights, and its steps with their Conv folds.
/// Prepared on every run before, a model that is one `If` around the whole network (silero-vad
/// picks its branch by sample rate) re-planned all of it per call. First use, not stage
/// preparation, so a branch that never runs is never planned, and one that cannot run fails
/// when it is taken, as before.
#[derive(Debug, Default)]
struct PreparedBodies(Mutex<HashMap<usize, Arc<PreparedBody>>>);

#[derive(Debug)]
struct PreparedBody {
    /// Held so that the address the map is keyed by stays this body's.
    graph: Arc<Graph>,
    weights: Weights,
    steps: Vec<Step<CpuKernel>>,
    constants: ConstantSteps,
}

impl PreparedBodies {
    /// `sub`'s prepared body, preparing it now if this is its first run. `enclosing` runs the
    /// graph that holds it: the body's weights are found by name in what all the model's
    /// weights share, and a captured input that is a weight of the enclosing graph is one of the
    /// body's too, so that the steps reading it fold (silero-vad's LSTM reorders the gates of
    /// weights its branch captures).
    fn get_or_prepare(
        &self,
        sub: &Subgraph,
        enclosing: &CpuExecutor,
    ) -> Result<Arc<PreparedBody>, Error> {
        let key = Arc::as_ptr(&sub.body) as usize;
        let mut prepared = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(body) = prepared.get(&key) {
            return Ok(Arc::clone(body));
        }
        let graph = Arc::clone(&sub.body);
        let mut weights = enclosing.weights.for_subgraph(&graph)?;
        for &id in graph.inputs().iter().skip(sub.formal_inputs) {
            let outer = enclosing.graph.tensor_id(&graph.tensor(id).name);
            if let Some(weight) = outer.and_then(|outer| enclosing.weights.get(outer)) {
                weights.insert(id, Arc::clone(weight));
            }
        }
        let spec = StageSpec {
            index: 0,
            nodes: graph.topological_order().to_vec(),
            receives: graph.inputs().to_vec(),
            sends: graph.outputs().to_vec(),
        };
        let (steps, constants) = prepare_steps(&graph, &weights, &spec)?;
        let body = Arc::new(PreparedBody {
            graph,
            weights,
            steps,
            constants,
        });
        prepared.insert(key, Arc::clone(&body));
        Ok(body)
    }
}

impl CpuStage {
    /// The stage's description.
    pub fn spec(&self) -> &StageSpec {
        &self.spec
    }
}

/// Values of the tensors a run holds, by id.
type Env = HashMap<TensorId, Value>;

impl<'a> CpuExecutor<'a> {
    /// A backend for `graph` with its loaded `weights`.
    pub fn new(graph: &'a Graph, weights: &'a Weights) -> CpuExecutor<'a> {
        CpuExecutor { graph, weights }
    }

    /// Runs the whole model as one stage.
    pub fn run_model(&self, inputs: &Tensors) -> Result<Tensors, Error> {
        let all: Vec<NodeId> = self.graph.topological_order().to_vec();
        let spec = stage_specs(self.graph, &[all])?.remove(0);
        let stage = self.prepare(&spec)?;
        self.run(&stage, inputs)
    }

    /// Runs the whole model on values of any kind: a model whose inputs or outputs are
    /// sequences or optionals runs here (on the CPU, as one stage).
    pub fn run_model_values(&self, inputs: &Values) -> Result<Values, Error> {
        let all: Vec<NodeId> = self.graph.topological_order().to_vec();
        let spec = stage_specs(self.graph, &[all])?.remove(0);
        let stage = self.prepare(&spec)?;
        let mut env = starting_env(&stage.constants);
        for &id in &stage.spec.receives {
            let name = &self.graph.tensor(id).name;
            if self.graph.tensor(id).param().is_some() {
                continue;
            }
            let value = inputs.get(name).ok_or_else(|| {
                Error::RunInput(format!(
                    "the model needs input '{name}', which was not given"
                ))
            })?;
            env.insert(id, value.clone());
        }
        let env = self.execute(
            &stage.steps,
            env,
            &|_| None,
            &stage.bodies,
            &mut |_, _, _| {},
        )?;
        stage
            .spec
            .sends
            .iter()
            .map(|&id| {
                let name = self.graph.tensor(id).name.clone();
                self.fetch(&env, id)
                    .map(|v| (name.clone(), v))
                    .ok_or_else(|| Error::RunInput(format!("the run did not make '{name}'")))
            })
            .collect()
    }

    fn fetch(&self, env: &Env, id: TensorId) -> Option<Value> {
        env.get(&id)
            .cloned()
            .or_else(|| self.weights.get(id).map(|w| Value::Tensor(Arc::clone(w))))
    }

    /// Runs `steps` over `env`; `outer` gives the values of enclosing graphs' tensors by name
    /// (to the subgraphs of this graph's control-flow nodes).
    fn execute(
        &self,
        steps: &[Step<CpuKernel>],
        mut env: Env,
        outer: &dyn Fn(&str) -> Option<Value>,
        bodies: &PreparedBodies,
        observe: &mut dyn FnMut(NodeId, f64, u64),
    ) -> Result<Env, Error> {
        for step in steps {
            let node = self.graph.node(step.node);
            let kernel_error = |detail: String| Error::Kernel {
                node: node.name.clone(),
                op: node.op_type.clone(),
                detail,
            };
            let args = self.step_args(&env, node).map_err(kernel_error)?;
            let ctx = Ctx {
                node,
                opset: step.opset,
                output_dtypes: &step.output_dtypes,
                input_dtypes: &step.input_dtypes,
            };
            let began = Instant::now();
            let results = self
                .run_step(step, &ctx, &args, &env, outer, bodies)
                .map_err(kernel_error)?;
            let secs = began.elapsed().as_secs_f64();
            let output_bytes = results.iter().map(Value::byte_len).sum();
            observe(step.node, secs, output_bytes);
            drop(args);
            let output_slots = match &step.kernel {
                CpuKernel::Folded(fold) => {
                    for &folded in &fold.folded {
                        observe(folded, 0.0, output_bytes);
                    }
                    &fold.output[..]
                }
                _ => &node.outputs[..],
            };
            store_outputs(&mut env, output_slots, results).map_err(kernel_error)?;
            for t in &step.frees {
                env.remove(t);
            }
        }
        Ok(env)
    }

    /// The values of `node`'s inputs, by position (`None` for an omitted optional one).
    fn step_args(&self, env: &Env, node: &Node) -> Result<Vec<Option<Value>>, String> {
        node.inputs
            .iter()
            .map(|slot| match slot {
                None => Ok(None),
                Some(id) => self.fetch(env, *id).map(Some).ok_or_else(|| {
                    format!("input '{}' is not available", self.graph.tensor(*id).name)
                }),
            })
            .collect()
    }

    /// One step's kernel on its arguments: a fold, a tensor kernel, or a kernel on values (which
    /// runs subgraphs in the scope of `env`, then `outer`).
    fn run_step(
        &self,
        step: &Step<CpuKernel>,
        ctx: &Ctx,
        args: &[Option<Value>],
        env: &Env,
        outer: &dyn Fn(&str) -> Option<Value>,
        bodies: &PreparedBodies,
    ) -> Result<Vec<Value>, String> {
        let node = ctx.node;
        let all_tensors = args.iter().flatten().all(|v| matches!(v, Value::Tensor(_)));
        Ok(match &step.kernel {
            CpuKernel::Folded(fold) => {
                let tensors = tensor_args(args)?;
                kernels::conv_then(ctx, &tensors, &fold.epilogue)?
                    .into_iter()
                    .map(|t| Value::Tensor(Arc::new(t)))
                    .collect()
            }
            &CpuKernel::Tensor(kernel) if all_tensors => {
                let tensors = tensor_args(args)?;
                kernels::call(kernel, ctx, &tensors)?
                    .into_iter()
                    .map(|t| Value::Tensor(Arc::new(t)))
                    .collect()
            }
            CpuKernel::Tensor(_) | CpuKernel::Value(_) => {
                let kernel = match step.kernel {
                    CpuKernel::Value(kernel) => Some(kernel),
                    _ => kernels::lookup_value(&node.domain, &node.op_type),
                }
                .ok_or("it takes tensors, and an input is a sequence or optional")?;
                let scope = |name: &str| {
                    self.graph
                        .tensor_id(name)
                        .and_then(|id| self.fetch(env, id))
                        .or_else(|| outer(name))
                };
                let run_body = |sub: &Subgraph, formals: &[Value]| {
                    self.run_body(sub, formals, &scope, bodies)
                        .map_err(|e| format!("in subgraph '{}': {e}", sub.name))
                };
                let refs: Vec<Option<&Value>> = args.iter().map(Option::as_ref).collect();
                let vctx = ValueCtx {
                    ctx: Ctx { ..*ctx },
                    run_body: &run_body,
                };
                kernel(&vctx, &refs)?
            }
        })
    }

    /// Runs a subgraph of one of this graph's nodes on its declared inputs (`formals`); the
    /// outer tensors it reads come from `scope`.
    fn run_body(
        &self,
        sub: &Subgraph,
        formals: &[Value],
        scope: &dyn Fn(&str) -> Option<Value>,
        bodies: &PreparedBodies,
    ) -> Result<Vec<Value>, Error> {
        if formals.len() != sub.formal_inputs {
            return Err(Error::RunInput(format!(
                "it declares {} inputs, the node gives it {}",
                sub.formal_inputs,
                formals.len()
            )));
        }
        let prepared = bodies.get_or_prepare(sub, self)?;
        let body = &*prepared.graph;
        let executor = CpuExecutor::new(body, &prepared.weights);
        let mut env = starting_env(&prepared.constants);
        for (i, &id) in body.inputs().iter().enumerate() {
            let name = &body.tensor(id).name;
            let value = match formals.get(i) {
                Some(v) => v.clone(),
                None => scope(name).ok_or_else(|| {
                    Error::RunInput(format!("it reads '{name}', which is not available"))
                })?,
            };
            env.insert(id, value);
        }
        let env = executor.execute(&prepared.steps, env, scope, bodies, &mut |_, _, _| {})?;
        body.outputs()
            .iter()
            .map(|&id| {
                executor.fetch(&env, id).ok_or_else(|| {
                    Error::RunInput(format!("it did not make '{}'", body.tensor(id).name))
                })
            })
            .collect()
    }
}

impl Executor for CpuExecutor<'_> {
    type Stage = CpuStage;

    fn prepare(&self, spec: &StageSpec) -> Result<CpuStage, Error> {
        let (steps, constants) = prepare_steps(self.graph, self.weights, spec)?;
        Ok(CpuStage {
            spec: spec.clone(),
            steps,
            constants,
            bodies: PreparedBodies::default(),
        })
    }

    fn run(&self, stage: &CpuStage, inputs: &Tensors) -> Result<Tensors, Error> {
        self.run_observed(stage, inputs, &mut |_, _, _| {})
    }
}

impl super::NodeTimer for CpuExecutor<'_> {
    const BACKEND: &'static str = "pipecut-cpu";

    fn run_observed(
        &self,
        stage: &CpuStage,
        inputs: &Tensors,
        observe: &mut dyn FnMut(NodeId, f64, u64),
    ) -> Result<Tensors, Error> {
        CpuExecutor::run_observed(self, stage, inputs, observe)
    }
}

impl CpuExecutor<'_> {
    /// Runs `stage` like [`Executor::run`], telling `observe` each node's kernel time in seconds
    /// and the bytes of its outputs, as each finishes (`pipecut profile`).
    pub fn run_observed(
        &self,
        stage: &CpuStage,
        inputs: &Tensors,
        observe: &mut dyn FnMut(NodeId, f64, u64),
    ) -> Result<Tensors, Error> {
        let graph = self.graph;
        let mut env = starting_env(&stage.constants);
        for &(folded, bytes) in &stage.constants.nodes {
            observe(folded, 0.0, bytes);
        }
        for &id in &stage.spec.receives {
            let name = &graph.tensor(id).name;
            if graph.tensor(id).param().is_some() {
                continue;
            }
            let value = inputs.get(name).ok_or_else(|| {
                Error::RunInput(format!(
                    "stage {} needs tensor '{name}', which was not given",
                    stage.spec.index
                ))
            })?;
            env.insert(id, Value::Tensor(Arc::clone(value)));
        }
        let env = self.execute(&stage.steps, env, &|_| None, &stage.bodies, observe)?;
        stage
            .spec
            .sends
            .iter()
            .map(|&id| {
                let name = graph.tensor(id).name.clone();
                let value = self.fetch(&env, id).ok_or_else(|| {
                    Error::RunInput(format!(
                        "stage {} should send '{name}' but does not have it",
                        stage.spec.index
                    ))
                })?;
                match value {
                    Value::Tensor(t) => Ok((name, t)),
                    // A model output that is a sequence of maps (ZipMap's) leaves as its maps'
                    // values, one row per map in the order of its keys (ZipMap's labels).
                    Value::MapSequence { values, .. } if graph.outputs().contains(&id) => {
                        Ok((name, values))
                    }
                    other => Err(Error::RunInput(format!(
                        "'{name}' is a {}: stages exchange tensors only (run a model with \
                         sequences or optionals whole, on the CPU)",
                        other.kind()
                    ))),
                }
            })
            .collect()
    }
}

/// A node's arguments as the tensors a tensor kernel takes (an error where one is a sequence
/// or optional).
fn tensor_args(args: &[Option<Value>]) -> Result<Vec<Option<&HostTensor>>, String> {
    args.iter()
        .map(|a| a.as_ref().map(|v| v.tensor().map(|t| &**t)).transpose())
        .collect()
}

/// Time one stage spent working and waiting during a pipelined run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageTiming {
    /// Position in the pipeline.
    pub stage: usize,
    /// Time spent running micro-batches.
    pub busy_secs: f64,
    /// The rest of the run's wall-clock time: waiting for input (fill), for the next stage
    /// (drain), or for a core.
    pub idle_secs: f64,
    /// CPU time of the stage's thread while it ran micro-batches (the scheduler's account:
    /// unlike `busy_secs`, it leaves out the time another process held the core). Threads a
    /// kernel starts itself are not counted; 0 where the platform cannot tell.
    pub cpu_secs: f64,
}

/// How [`run_pipeline_with`] runs the stages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PipelineOptions {
    /// Pin stage k's thread to core k + `first_core` (modulo the cores; Linux only), so that
    /// stages do not share or trade cores: what a benchmark of one core per stage needs.
    pub pin_stages_to_cores: bool,
    /// The core stage 0 is pinned to: a benchmark rotates it between rounds so that no plan's
    /// heaviest stage always gets the same core (cores of one machine differ: interrupts, a
    /// virtual machine's neighbours on the host).
    pub first_core: usize,
}

/// What a pipelined run produced and measured.
#[derive(Debug, Clone)]
pub struct PipelineReport {
    /// The graph outputs, micro-batches joined along axis 0.
    pub outputs: Tensors,
    /// Per stage timing.
    pub stages: Vec<StageTiming>,
    /// Wall-clock time from the first micro-batch entering to the last leaving.
    pub wall_secs: f64,
    /// Micro-batches streamed.
    pub microbatches: usize,
}

impl PipelineReport {
    /// Σ busy / (K · wall): 1 when every stage worked all the time.
    pub fn efficiency(&self) -> f64 {
        let busy: f64 = self.stages.iter().map(|s| s.busy_secs).sum();
        let denominator = self.stages.len() as f64 * self.wall_secs;
        if denominator > 0.0 {
            busy / denominator
        } else {
            0.0
        }
    }
}

/// Splits every input along axis 0 into `microbatches` parts of near-equal size (the first
/// `n mod M` parts one row larger).
pub fn split_microbatches(inputs: &Tensors, microbatches: usize) -> Result<Vec<Tensors>, Error> {
    if microbatches == 0 {
        return Err(Error::RunInput(
            "the number of micro-batches must be at least 1".into(),
        ));
    }
    let mut parts = vec![Tensors::new(); microbatches];
    for (name, tensor) in inputs {
        if microbatches == 1 {
            parts[0].insert(name.clone(), Arc::clone(tensor));
            continue;
        }
        let rows = tensor.shape().first().copied().ok_or_else(|| {
            Error::RunInput(format!(
                "input '{name}' is a scalar; it has no batch axis to split"
            ))
        })?;
        if rows < microbatches {
            return Err(Error::RunInput(format!(
                "input '{name}' has {rows} rows on axis 0, fewer than the {microbatches} micro-batches"
            )));
        }
        let (base, extra) = (rows / microbatches, rows % microbatches);
        let mut start = 0;
        for (i, part) in parts.iter_mut().enumerate() {
            let count = base + usize::from(i < extra);
            let slice = tensor.slice_axis0(start, count).map_err(Error::RunInput)?;
            part.insert(name.clone(), Arc::new(slice));
            start += count;
        }
    }
    Ok(parts)
}

/// The outputs of micro-batches in step order, joined along axis 0: the inverse of
/// [`split_microbatches`].
pub fn join_microbatches(parts: &[Tensors]) -> Result<Tensors, Error> {
    let mut joined = Tensors::new();
    let Some(first) = parts.first() else {
        return Ok(joined);
    };
    for name in first.keys() {
        // Borrowed, not cloned: a clone of every piece doubled the memory of the outputs, and
        // an infallible clone of a 2 GiB output aborted under a 4 GiB limit.
        let pieces: Vec<&Arc<HostTensor>> = parts
            .iter()
            .map(|p| {
                p.get(name)
                    .ok_or_else(|| Error::RunInput(format!("a micro-batch lacks output '{name}'")))
            })
            .collect::<Result<_, _>>()?;
        let tensor = if let [only] = pieces[..] {
            Arc::clone(only)
        } else {
            let pieces: Vec<&HostTensor> = pieces.iter().map(|t| t.as_ref()).collect();
            Arc::new(HostTensor::concat_axis0(&pieces).map_err(|d| {
                Error::RunInput(format!(
                    "cannot join output '{name}' across micro-batches: {d}"
                ))
            })?)
        };
        joined.insert(name.clone(), tensor);
    }
    Ok(joined)
}

type Message<M> = Result<(usize, M), Error>;

/// Streams `inputs`, split into `microbatches` along axis 0, through the prepared `stages`, one
/// thread per stage; joins the outputs back along axis 0.
pub fn run_pipeline<E: Executor>(
    executor: &E,
    stages: &mut [E::Stage],
    inputs: &Tensors,
    microbatches: usize,
) -> Result<PipelineReport, Error> {
    run_pipeline_with(
        executor,
        stages,
        inputs,
        microbatches,
        PipelineOptions::default(),
    )
}

/// [`run_pipeline`] with options.
pub fn run_pipeline_with<E: Executor>(
    executor: &E,
    stages: &mut [E::Stage],
    inputs: &Tensors,
    microbatches: usize,
    options: PipelineOptions,
) -> Result<PipelineReport, Error> {
    let batches = split_microbatches(inputs, microbatches)?;
    let start = Instant::now();
    let run = |stage: &E::Stage, tensors: Tensors| executor.run(stage, &tensors);
    let (collected, busy) = stream_through(stages, batches, &run, options)?;
    let wall_secs = start.elapsed().as_secs_f64();
    let collected = collected?;
    pipeline_report(&collected, &busy, wall_secs)
}

/// The report of a pipeline run from its micro-batches' outputs and each stage's (busy, CPU)
/// seconds.
pub(crate) fn pipeline_report(
    collected: &[Tensors],
    busy: &[(f64, f64)],
    wall_secs: f64,
) -> Result<PipelineReport, Error> {
    let outputs = join_microbatches(collected)?;
    let stage_timings = busy
        .iter()
        .enumerate()
        .map(|(s, &(b, cpu))| StageTiming {
            stage: s,
            busy_secs: b,
            cpu_secs: cpu,
            idle_secs: (wall_secs - b).max(0.0),
        })
        .collect();
    Ok(PipelineReport {
        outputs,
        stages: stage_timings,
        wall_secs,
        microbatches: collected.len(),
    })
}

/// The outcome of [`stream_through`]: the last stage's outputs in micro-batch order (or the
/// first error), and each stage's (busy, CPU) seconds.
pub(crate) type Streamed<M> = (Result<Vec<M>, Error>, Vec<(f64, f64)>);

/// Streams `batches` through `stages`, one thread per stage, stage `k`'s output being stage
/// `k + 1`'s input: the pipeline of every backend, whatever its micro-batches carry between
/// stages (host tensors on the CPU, device tensors on CUDA).
pub(crate) fn stream_through<S: Send, M: Send>(
    stages: &mut [S],
    batches: Vec<M>,
    run: &(dyn Fn(&S, M) -> Result<M, Error> + Sync),
    options: PipelineOptions,
) -> Result<Streamed<M>, Error> {
    stream_through_collecting(stages, batches, run, &Ok, options)
}

/// [`stream_through`], with `collect` applied to each of the last stage's outputs on the calling
/// thread as it arrives, while the stages go on with later micro-batches: the CUDA backend
/// brings each micro-batch's outputs to the host there, so the downloads overlap the launches
/// rather than following them all.
pub(crate) fn stream_through_collecting<S: Send, M: Send>(
    stages: &mut [S],
    batches: Vec<M>,
    run: &(dyn Fn(&S, M) -> Result<M, Error> + Sync),
    collect: &dyn Fn(M) -> Result<M, Error>,
    options: PipelineOptions,
) -> Result<Streamed<M>, Error> {
    let k = stages.len();
    if k == 0 {
        return Err(Error::InvalidPlan("the pipeline has no stages".into()));
    }
    let microbatches = batches.len();
    let mut senders = Vec::with_capacity(k + 1);
    let mut receivers = Vec::with_capacity(k + 1);
    for _ in 0..=k {
        let (tx, rx) = mpsc::channel::<Message<M>>();
        senders.push(tx);
        receivers.push(rx);
    }
    let mut receivers = receivers.into_iter();
    let feed = senders.remove(0);
    Ok(std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(k);
        // Each stage goes to its thread alone (`&mut`), so a stage need not be `Sync`.
        for (index, (stage, tx)) in stages.iter_mut().zip(senders).enumerate() {
            let rx = receivers.next().expect("k + 1 channels");
            handles.push(scope.spawn(move || {
                if options.pin_stages_to_cores {
                    pin_current_thread(index + options.first_core);
                }
                let mut busy_secs = 0.0;
                let mut cpu_secs = 0.0;
                for message in rx {
                    let forward = match message {
                        Ok((i, batch)) => {
                            let began = Instant::now();
                            let cpu_began = thread_cpu_secs();
                            let result = run(&*stage, batch);
                            busy_secs += began.elapsed().as_secs_f64();
                            cpu_secs += thread_cpu_secs() - cpu_began;
                            result.map(|out| (i, out))
                        }
                        Err(e) => Err(e),
                    };
                    let failed = forward.is_err();
                    if tx.send(forward).is_err() || failed {
                        break;
                    }
                }
                (busy_secs, cpu_secs)
            }));
        }
        let results = receivers.next().expect("k + 1 channels");
        for (i, batch) in batches.into_iter().enumerate() {
            // A stage that failed has stopped listening; its error arrives below.
            if feed.send(Ok((i, batch))).is_err() {
                break;
            }
        }
        drop(feed);
        let mut collected: Vec<Option<M>> = (0..microbatches).map(|_| None).collect();
        let mut outcome = Ok(());
        for _ in 0..microbatches {
            match results.recv() {
                Ok(Ok((i, out))) => match collect(out) {
                    Ok(out) => collected[i] = Some(out),
                    Err(e) => {
                        outcome = Err(e);
                        break;
                    }
                },
                Ok(Err(e)) => {
                    outcome = Err(e);
                    break;
                }
                Err(_) => {
                    outcome = Err(Error::RunInput("a pipeline stage stopped early".into()));
                    break;
                }
            }
        }
        drop(results);
        let busy: Vec<(f64, f64)> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or((0.0, 0.0)))
            .collect();
        (
            outcome.map(|()| collected.into_iter().flatten().collect()),
            busy,
        )
    }))
}

/// Pins the calling thread to core `index` modulo the cores it may run on (Linux); elsewhere a
/// no-op, and the benchmark's report says cores were not pinned.
#[cfg(target_os = "linux")]
fn pin_current_thread(index: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the CPU_* helpers stay inside it, and
    // sched_getaffinity/sched_setaffinity read or write exactly size_of::<cpu_set_t>() bytes.
    unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        if libc::sched_getaffinity(0, size, &mut allowed) != 0 {
            return;
        }
        let cores: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &allowed))
            .collect();
        if cores.is_empty() {
            return;
        }
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cores[index % cores.len()], &mut one);
        libc::sched_setaffinity(0, size, &one);
    }
}

#[cfg(not(target_os = "linux"))]
fn pin_current_thread(_index: usize) {}

/// CPU time the calling thread has used, in seconds (0 where the platform cannot tell).
pub fn thread_cpu_secs() -> f64 {
    #[cfg(unix)]
    {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec into `t`.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } == 0 {
            return t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9;
        }
    }
    0.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipecut_ir::graph::DType;

    #[cfg(target_os = "linux")]
    #[test]
    fn a_pinned_thread_runs_only_on_the_core_its_index_names_modulo_the_cores() {
        let allowed = |size: usize| -> Vec<usize> {
            // SAFETY: as in `pin_current_thread`.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                assert_eq!(libc::sched_getaffinity(0, size, &mut set), 0);
                (0..libc::CPU_SETSIZE as usize)
                    .filter(|&c| libc::CPU_ISSET(c, &set))
                    .collect()
            }
        };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        let cores = allowed(size);
        for index in 0..cores.len() + 1 {
            let pinned = std::thread::spawn(move || {
                pin_current_thread(index);
                allowed(size)
            })
            .join()
            .unwrap();
            assert_eq!(pinned, [cores[index % cores.len()]]);
        }
    }
    use pipecut_ir::onnx::shape::{DimBindings, ShapeInference};

    fn mlp() -> (Graph, Weights) {
        let path = std::path::Path::new("../../fixtures/models/mlp.onnx");
        let mut model = pipecut_ir::onnx::load_model(path).unwrap();
        ShapeInference::new(DimBindings::new().bind("batch", 2))
            .run(&mut model.graph)
            .unwrap();
        let weights = Weights::load(path, &model.graph).unwrap();
        (model.graph, weights)
    }

    /// `x` split into a sequence of rows, its length, and the rows joined back.
    fn split_and_join() -> Graph {
        use pipecut_ir::graph::{Attribute, Dim, NodeSpec};
        let mut b = Graph::builder("seq");
        b.opset("", 17);
        b.input(
            "x",
            Some(DType::F32),
            Some(vec![Dim::Known(4), Dim::Known(3)]),
        )
        .unwrap();
        b.node(NodeSpec::new("split", "SplitToSequence", &["x"], &["rows"]))
            .unwrap();
        b.node(NodeSpec::new("len", "SequenceLength", &["rows"], &["n"]))
            .unwrap();
        b.node(
            NodeSpec::new("join", "ConcatFromSequence", &["rows"], &["y"])
                .attr("axis", Attribute::Int(0)),
        )
        .unwrap();
        b.output("n");
        b.output("y");
        let mut graph = b.build().unwrap();
        ShapeInference::new(DimBindings::new())
            .run(&mut graph)
            .unwrap();
        graph
    }

    #[test]
    fn a_sequence_runs_through_its_ops() {
        let graph = split_and_join();
        let weights = Weights::default();
        let x: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let mut inputs = Values::new();
        let tensor = Arc::new(HostTensor::f32(vec![4, 3], x.clone()));
        inputs.insert("x".into(), Value::Tensor(tensor));
        let out = CpuExecutor::new(&graph, &weights)
            .run_model_values(&inputs)
            .unwrap();
        assert_eq!(out["n"].tensor().unwrap().to_i64_vec(), vec![4]);
        let y = out["y"].tensor().unwrap();
        assert_eq!((y.shape(), y.to_f32_vec()), (&[4usize, 3][..], x));
    }

    #[test]
    fn a_sequence_crossing_a_stage_boundary_is_refused_in_one_line() {
        let graph = split_and_join();
        let weights = Weights::default();
        let executor = CpuExecutor::new(&graph, &weights);
        let order = graph.topological_order().to_vec();
        let specs = stage_specs(&graph, &[order[..1].to_vec(), order[1..].to_vec()]).unwrap();
        let stage = executor.prepare(&specs[0]).unwrap();
        let mut inputs = Tensors::new();
        inputs.insert(
            "x".into(),
            Arc::new(HostTensor::f32(vec![4, 3], vec![0.0; 12])),
        );
        let err = executor.run(&stage, &inputs).unwrap_err().to_string();
        assert!(err.contains("'rows' is a sequence"), "{err}");
        assert_eq!(err.lines().count(), 1);
    }

    #[test]
    fn steps_that_read_only_weights_run_once_at_prepare_and_give_the_same_bits() {
        use pipecut_ir::graph::{Dim, NodeSpec, Param, Storage};
        let mut b = Graph::builder("constant_steps");
        b.opset("", 17);
        let x = Some(vec![Dim::Known(2), Dim::Known(4)]);
        b.input("x", Some(DType::F32), x).unwrap();
        let embedded = |bytes| Param {
            bytes,
            storage: Storage::Embedded,
        };
        let w = b
            .parameter("w", DType::F32, &[4, 4], embedded(64), None)
            .unwrap();
        let s = b
            .parameter("s", DType::F32, &[1], embedded(4), None)
            .unwrap();
        let big = b
            .parameter("big", DType::I64, &[2], embedded(16), None)
            .unwrap();
        for (name, op, inputs, outputs) in [
            ("t", "Transpose", &["w"][..], &["w_t"][..]),
            ("n", "Neg", &["w_t"], &["w_neg"]),
            ("m", "MatMul", &["x", "w_neg"], &["y"]),
            // 1 MiB from 4 bytes: left to the run, as it would only be held by the stage.
            ("e", "Expand", &["s", "big"], &["spread"]),
            ("r", "RandomNormalLike", &["w"], &["draws"]),
        ] {
            b.node(NodeSpec::new(name, op, inputs, outputs)).unwrap();
        }
        for output in ["y", "spread", "draws"] {
            b.output(output);
        }
        let graph = b.build().unwrap();
        let mut weights = Weights::default();
        let w_values = (0..16).map(|i| (i as f32 - 7.5) / 3.0).collect();
        weights.insert(w, Arc::new(HostTensor::f32(vec![4, 4], w_values)));
        weights.insert(s, Arc::new(HostTensor::f32(vec![1], vec![0.5])));
        weights.insert(big, Arc::new(HostTensor::i64(vec![2], vec![512, 512])));
        let executor = CpuExecutor::new(&graph, &weights);
        let order = graph.topological_order().to_vec();
        let spec = stage_specs(&graph, std::slice::from_ref(&order))
            .unwrap()
            .remove(0);
        let folded = executor.prepare(&spec).unwrap();
        let ops = |steps: &[Step<CpuKernel>]| -> Vec<String> {
            let op = |s: &Step<CpuKernel>| graph.node(s.node).op_type.clone();
            steps.iter().map(op).collect()
        };
        assert_eq!(ops(&folded.steps), ["MatMul", "Expand", "RandomNormalLike"]);
        let folded_nodes: Vec<&str> = (folded.constants.nodes.iter())
            .map(|&(n, _)| graph.node(n).name.as_str())
            .collect();
        assert_eq!(folded_nodes, ["t", "n"]);
        // Only what a remaining step reads is kept: the transpose went into the negation.
        let kept: Vec<&str> = (folded.constants.values.iter())
            .map(|(id, _)| graph.tensor(*id).name.as_str())
            .collect();
        assert_eq!(kept, ["w_neg"]);
        let unfolded = CpuStage {
            steps: plan_cpu_steps(&graph, &spec).unwrap(),
            spec,
            constants: ConstantSteps::default(),
            bodies: PreparedBodies::default(),
        };
        let mut inputs = Tensors::new();
        let x_values = (0..8).map(|i| i as f32 / 4.0).collect();
        inputs.insert("x".into(), Arc::new(HostTensor::f32(vec![2, 4], x_values)));
        for _ in 0..2 {
            let got = executor.run(&folded, &inputs).unwrap();
            let want = executor.run(&unfolded, &inputs).unwrap();
            assert_eq!(got, want);
        }
    }

    /// A model whose one `If` takes a branch that slices a weight of the enclosing graph, as
    /// silero-vad's LSTM branch slices the weights it captures.
    fn if_slicing_a_captured_weight() -> Vec<u8> {
        use onnx_protobuf::{
            tensor_proto::DataType, AttributeProto, GraphProto, Message, ModelProto, NodeProto,
            OperatorSetIdProto, TensorProto, ValueInfoProto,
        };
        let node = |op: &str, inputs: &[&str], output: &str| NodeProto {
            op_type: op.into(),
            name: output.into(),
            input: inputs.iter().map(|i| i.to_string()).collect(),
            output: vec![output.into()],
            ..Default::default()
        };
        let tensor = |name: &str, data_type: DataType, dims: &[i64], values: Vec<u8>| TensorProto {
            name: name.into(),
            data_type: data_type as i32,
            dims: dims.to_vec(),
            raw_data: values,
            ..Default::default()
        };
        let floats = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
        let info = |name: &str| ValueInfoProto {
            name: name.into(),
            ..Default::default()
        };
        let branch = |name: &str, nodes: Vec<NodeProto>, inits: Vec<TensorProto>, out: &str| {
            AttributeProto {
                name: name.into(),
                type_: onnx_protobuf::attribute_proto::AttributeType::GRAPH.into(),
                g: Some(GraphProto {
                    name: name.into(),
                    node: nodes,
                    initializer: inits,
                    output: vec![info(out)],
                    ..Default::default()
                })
                .into(),
                ..Default::default()
            }
        };
        let ends = 4i64.to_le_bytes().to_vec();
        let then_branch = branch(
            "then_branch",
            vec![
                node("Slice", &["w", "starts", "ends"], "ws"),
                node("Add", &["x", "ws"], "sum"),
            ],
            vec![
                tensor("starts", DataType::INT64, &[1], 0i64.to_le_bytes().to_vec()),
                tensor("ends", DataType::INT64, &[1], ends),
            ],
            "sum",
        );
        let else_branch = branch(
            "else_branch",
            vec![node("Identity", &["x"], "same")],
            vec![],
            "same",
        );
        let mut if_node = node("If", &["cond"], "y");
        if_node.attribute = vec![then_branch, else_branch];
        let mut x = info("x");
        let mut y = info("y");
        for value in [&mut x, &mut y] {
            let ty = value.type_.mut_or_insert_default().mut_tensor_type();
            ty.elem_type = DataType::FLOAT as i32;
            ty.shape
                .mut_or_insert_default()
                .dim
                .push(Default::default());
            ty.shape.as_mut().unwrap().dim[0].set_dim_value(4);
        }
        let w = floats(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        let model = ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto {
                version: 17,
                ..Default::default()
            }],
            graph: Some(GraphProto {
                name: "captures".into(),
                node: vec![if_node],
                initializer: vec![
                    tensor("w", DataType::FLOAT, &[8], w),
                    tensor("cond", DataType::BOOL, &[], vec![1]),
                ],
                input: vec![x],
                output: vec![y],
                ..Default::default()
            })
            .into(),
            ..Default::default()
        };
        model.write_to_bytes().unwrap()
    }

    #[test]
    fn a_branch_is_prepared_once_and_folds_what_it_reads_of_the_enclosing_weights() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("captures.onnx");
        std::fs::write(&path, if_slicing_a_captured_weight()).unwrap();
        let graph = pipecut_ir::onnx::load_model(&path).unwrap().graph;
        let weights = Weights::load(&path, &graph).unwrap();
        let executor = CpuExecutor::new(&graph, &weights);
        let order = graph.topological_order().to_vec();
        let spec = stage_specs(&graph, std::slice::from_ref(&order))
            .unwrap()
            .remove(0);
        let stage = executor.prepare(&spec).unwrap();
        let mut inputs = Tensors::new();
        let x = HostTensor::f32(vec![4], vec![0.5, 0.25, 0.125, 0.0]);
        inputs.insert("x".into(), Arc::new(x));
        for _ in 0..3 {
            let y = executor.run(&stage, &inputs).unwrap().remove("y").unwrap();
            assert_eq!(y.as_f32().unwrap(), [1.5, 2.25, 3.125, 4.0]);
        }
        let bodies = stage.bodies.0.lock().unwrap();
        // One branch prepared, once, for the three runs; the untaken one never.
        assert_eq!(bodies.len(), 1);
        let body = bodies.values().next().unwrap();
        let ops: Vec<&str> = (body.steps.iter())
            .map(|s| body.graph.node(s.node).op_type.as_str())
            .collect();
        assert_eq!(ops, ["Add"]);
        assert_eq!(body.constants.nodes.len(), 1);
    }

    #[test]
    fn an_op_without_a_kernel_is_refused_at_prepare_naming_op_and_node() {
        use pipecut_ir::graph::{DType, Dim, NodeSpec};
        let name = "/head/Hardmax2";
        let mut b = Graph::builder("unknown_op");
        b.opset("", 17);
        b.input(
            "x",
            Some(DType::F32),
            Some(vec![Dim::Known(2), Dim::Known(4)]),
        )
        .unwrap();
        b.node(NodeSpec::new(name, "Hardmax2", &["x"], &["y"]))
            .unwrap();
        b.output("y");
        let graph = b.build().unwrap();
        let weights = Weights::default();
        let executor = CpuExecutor::new(&graph, &weights);
        let err = executor.run_model(&Tensors::new()).unwrap_err().to_string();
        assert_eq!(
            err,
            format!("no CPU kernel for op 'Hardmax2' (domain 'ai.onnx') at node '{name}'")
        );
    }

    #[test]
    fn a_failing_stage_stops_the_pipeline_with_its_error() {
        let (graph, weights) = mlp();
        let executor = CpuExecutor::new(&graph, &weights);
        let order = graph.topological_order().to_vec();
        let specs = stage_specs(&graph, &[order[..5].to_vec(), order[5..].to_vec()]).unwrap();
        let mut stages: Vec<_> = specs.iter().map(|s| executor.prepare(s).unwrap()).collect();
        // Rows of the wrong width: the first Gemm refuses them.
        let mut inputs = Tensors::new();
        inputs.insert(
            "input".into(),
            Arc::new(HostTensor::f32(vec![4, 3], vec![0.0; 12])),
        );
        let err = run_pipeline(&executor, &mut stages, &inputs, 4)
            .unwrap_err()
            .to_string();
        assert!(err.contains("inner dims differ"), "{err}");
    }

    /// A model's whole-graph stage prepared with folds and without, and the number of nodes.
    struct FoldCase {
        graph: Graph,
        weights: Weights,
        nodes: usize,
    }

    impl FoldCase {
        fn load(path: &str, dims: &[(&str, u64)]) -> FoldCase {
            let path = std::path::Path::new(path);
            let mut model = pipecut_ir::onnx::load_model(path).unwrap();
            let bindings = dims
                .iter()
                .fold(DimBindings::new(), |b, &(name, v)| b.bind(name, v));
            ShapeInference::new(bindings).run(&mut model.graph).unwrap();
            let weights = Weights::load(path, &model.graph).unwrap();
            let nodes = model.graph.topological_order().len();
            FoldCase {
                graph: model.graph,
                weights,
                nodes,
            }
        }

        /// (folded, unfolded) outputs of one run on `input`, and the folded stage's steps.
        fn run(&self, input: (&str, Vec<usize>)) -> (Tensors, Tensors, Vec<Step<CpuKernel>>) {
            let executor = CpuExecutor::new(&self.graph, &self.weights);
            let order = self.graph.topological_order().to_vec();
            let spec = stage_specs(&self.graph, std::slice::from_ref(&order))
                .unwrap()
                .remove(0);
            let folded = executor.prepare(&spec).unwrap();
            let unfolded = CpuStage {
                steps: plan_cpu_steps(&self.graph, &spec).unwrap(),
                spec,
                constants: ConstantSteps::default(),
                bodies: PreparedBodies::default(),
            };
            let (name, shape) = input;
            let len = shape.iter().product::<usize>();
            let values = (0..len)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
                .collect();
            let mut inputs = Tensors::new();
            inputs.insert(name.into(), Arc::new(HostTensor::f32(shape, values)));
            let got = executor.run(&folded, &inputs).unwrap();
            let want = executor.run(&unfolded, &inputs).unwrap();
            (got, want, folded.steps)
        }
    }

    #[test]
    fn folded_conv_chains_give_the_unfolded_outputs_bitwise() {
        // resnet_tiny: each of its 9 Conv has a BatchNormalization to fold, and 4 of those a
        // Relu that reads only it (the others follow a residual Add). Bitwise: the folded
        // nodes keep their own arithmetic.
        let case = FoldCase::load("../../fixtures/models/resnet_tiny.onnx", &[("batch", 2)]);
        let (got, want, steps) = case.run(("input", vec![2, 3, 64, 64]));
        assert_eq!(steps.len(), case.nodes - 9 - 4);
        assert_eq!(got["logits"], want["logits"]);
    }

    /// Whether the real model at `path` is missing; if so, the skip is recorded where
    /// `.ci/skips` reads the integration tests' skips (which fails CI, where the models are
    /// fetched), not only printed.
    fn absent_real_model(path: &str) -> bool {
        use std::io::Write;
        if std::path::Path::new(path).exists() {
            return false;
        }
        let test = std::thread::current()
            .name()
            .unwrap_or("unknown")
            .to_string();
        let reason = format!("{path} is absent (run fixtures/real/fetch.sh)");
        eprintln!("SKIPPED pipecut_runtime::{test} (needs real-models): {reason}");
        let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
            || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"),
            Into::into,
        );
        let dir = target.join("tmp/skips");
        let record = std::fs::create_dir_all(&dir).and_then(|()| {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("pipecut.tsv"))?;
            writeln!(file, "pipecut\t{test}\treal-models\t{reason}")
        });
        if let Err(e) = record {
            eprintln!("cannot record the skip in {}: {e}", dir.display());
        }
        true
    }

    #[test]
    fn folded_hard_swish_chains_give_the_unfolded_outputs_bitwise() {
        // ppocr_mobile_v2_cls writes hard-swish out (Add 3, Clip 0..6, Mul, Div 6) after a
        // Conv and BatchNormalization: those fold too.
        let path = "../../fixtures/real/cache/ppocr_mobile_v2_cls.onnx";
        if absent_real_model(path) {
            return;
        }
        let dims = [("x.0", 2), ("x.2", 48), ("x.3", 192)];
        let case = FoldCase::load(path, &dims);
        let (got, want, steps) = case.run(("x", vec![2, 3, 48, 192]));
        let hard_swish = steps
            .iter()
            .filter(
                |s| matches!(&s.kernel, CpuKernel::Folded(f) if f.epilogue.hard_swish.is_some()),
            )
            .count();
        assert!(hard_swish > 0, "no hard-swish folded");
        assert_eq!(got, want);
    }

    #[test]
    fn folded_scalar_affine_chains_give_the_unfolded_outputs_bitwise() {
        // ppocr_v4_det: Conv, Mul and Add of scalars (PP-LCNet's learnable affine), then a
        // written-out hard-swish.
        let path = "../../fixtures/real/cache/ppocr_v4_det.onnx";
        if absent_real_model(path) {
            return;
        }
        let dims = [
            ("p2o.DynamicDimension.0", 1),
            ("p2o.DynamicDimension.1", 64),
            ("p2o.DynamicDimension.2", 64),
        ];
        let case = FoldCase::load(path, &dims);
        let (got, want, steps) = case.run(("x", vec![1, 3, 64, 64]));
        let affine = steps
            .iter()
            .filter(|s| matches!(&s.kernel, CpuKernel::Folded(f) if f.epilogue.affine.is_some()))
            .count();
        assert!(affine > 0, "no affine folded");
        assert_eq!(got, want);
    }

    #[test]
    fn micro_batches_split_unevenly_and_join_back() {
        let mut inputs = Tensors::new();
        inputs.insert(
            "x".into(),
            Arc::new(HostTensor::i64(vec![5, 1], vec![0, 1, 2, 3, 4])),
        );
        let parts = split_microbatches(&inputs, 3).unwrap();
        let rows: Vec<usize> = parts.iter().map(|p| p["x"].shape()[0]).collect();
        assert_eq!(rows, vec![2, 2, 1]);
        assert!(split_microbatches(&inputs, 6).is_err());
        assert!(split_microbatches(&inputs, 0).is_err());
    }
}
