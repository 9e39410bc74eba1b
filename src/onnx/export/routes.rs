//! Step 1 of the export: which tensor goes from which stage to which.
//!
//! Given the graph and a list of stages (node lists), [`Routes::new`] checks that the stages are
//! a partition of the nodes and convex and ordered (every tensor flows forward), then works out
//! per stage the tensors it receives (from a model input or from the stage whose node makes
//! them), the tensors it sends (to every later stage that reads them and/or out of the model),
//! and the parameters its nodes read.
//!
//! Tensors go straight from the stage that makes them to each stage that reads them: a tensor
//! read by stages 2 and 3 and made on stage 0 is one output of stage 0, sent twice, and made
//! once. (A plan prices the same flow as relayed through stage 1; the routes of an export do
//! not relay, so a stage file never forwards what it does not compute.)

use std::collections::{BTreeSet, HashMap};

use crate::graph::{Graph, NodeId, TensorId, TensorOrigin};
use crate::Error;

/// Where a stage input (or a model output) comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Source {
    /// A graph input of the model, supplied by the caller.
    ModelInput,
    /// An output of the stage with this index.
    Stage(usize),
}

/// Where a stage output goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Destination {
    /// An input of the stage with this index.
    Stage(usize),
    /// A graph output of the model.
    ModelOutput,
}

/// The routes of one stage.
#[derive(Debug, Clone, Default)]
pub(crate) struct StageRoutes {
    /// Its nodes, in the graph's topological order.
    pub nodes: Vec<NodeId>,
    /// Tensors it receives: model inputs first (in model order), then boundary tensors in the
    /// order their producing stages make them.
    pub inputs: Vec<(TensorId, Source)>,
    /// Tensors it sends, in the order its nodes make them, each with every destination (an
    /// empty list only for the keep-alive output of a stage whose results nobody reads).
    pub outputs: Vec<(TensorId, Vec<Destination>)>,
    /// Parameters (initializers and `Constant` outputs) it holds, by tensor id.
    pub parameters: Vec<TensorId>,
}

/// The routes of every stage, and where each model output comes from.
#[derive(Debug, Clone)]
pub(crate) struct Routes {
    /// Per stage, in pipeline order.
    pub stages: Vec<StageRoutes>,
    /// Every graph output, in model order, with the stage that sends it (or the model input it
    /// passes through).
    pub model_outputs: Vec<(TensorId, Source)>,
}

impl Routes {
    /// Checks the stages and routes every tensor that crosses a stage boundary.
    ///
    /// # Complexity
    /// O(V + E + T log T) for V nodes, E tensor reads and T tensors.
    pub fn new(graph: &Graph, stages: &[Vec<NodeId>]) -> Result<Routes, Error> {
        let stage_of = stage_of_nodes(graph, stages)?;
        let count = stages.len();
        let position: HashMap<NodeId, usize> = graph
            .topological_order()
            .iter()
            .enumerate()
            .map(|(p, &n)| (n, p))
            .collect();

        let mut routes: Vec<StageRoutes> = (0..count).map(|_| StageRoutes::default()).collect();
        for &node in graph.topological_order() {
            routes[stage_of[&node]].nodes.push(node);
        }
        // Per stage: inputs and parameters as sets (ordered on output).
        let mut received: Vec<BTreeSet<(Source, usize, TensorId)>> = vec![BTreeSet::new(); count];
        let mut parameters: Vec<BTreeSet<TensorId>> = vec![BTreeSet::new(); count];
        // Per produced tensor crossing a boundary: its destinations.
        let mut sent: HashMap<TensorId, BTreeSet<Destination>> = HashMap::new();
        for (consumer_stage, stage) in routes.iter().enumerate() {
            for &node_id in &stage.nodes {
                let node = graph.node(node_id);
                for &tensor_id in node.inputs.iter().flatten().chain(&node.captures) {
                    let tensor = graph.tensor(tensor_id);
                    match &tensor.origin {
                        TensorOrigin::GraphInput => {
                            let order = graph
                                .inputs()
                                .iter()
                                .position(|&t| t == tensor_id)
                                .unwrap_or(usize::MAX);
                            received[consumer_stage].insert((
                                Source::ModelInput,
                                order,
                                tensor_id,
                            ));
                        }
                        TensorOrigin::Parameter(_) => {
                            parameters[consumer_stage].insert(tensor_id);
                        }
                        TensorOrigin::Node { node: producer, .. } => {
                            let producer_stage = stage_of[producer];
                            if producer_stage > consumer_stage {
                                return Err(Error::NonConvexStages {
                                    tensor: tensor.name.clone(),
                                    producer: graph.node(*producer).name.clone(),
                                    producer_stage,
                                    consumer: node.name.clone(),
                                    consumer_stage,
                                });
                            }
                            if producer_stage < consumer_stage {
                                received[consumer_stage].insert((
                                    Source::Stage(producer_stage),
                                    position[producer],
                                    tensor_id,
                                ));
                                sent.entry(tensor_id)
                                    .or_default()
                                    .insert(Destination::Stage(consumer_stage));
                            }
                        }
                    }
                }
            }
        }

        let last = count - 1;
        let mut model_outputs = Vec::with_capacity(graph.outputs().len());
        for &tensor_id in graph.outputs() {
            let source = match &graph.tensor(tensor_id).origin {
                TensorOrigin::GraphInput => Source::ModelInput,
                TensorOrigin::Node { node, .. } => Source::Stage(stage_of[node]),
                // A weight that is itself a model output: the last stage holds and sends it,
                // so that every model output leaves the pipeline at or before its end.
                TensorOrigin::Parameter(_) => {
                    parameters[last].insert(tensor_id);
                    Source::Stage(last)
                }
            };
            if let Source::Stage(_) = source {
                sent.entry(tensor_id)
                    .or_default()
                    .insert(Destination::ModelOutput);
            }
            model_outputs.push((tensor_id, source));
        }

        for (s, stage) in routes.iter_mut().enumerate() {
            stage.inputs = received[s].iter().map(|&(src, _, t)| (t, src)).collect();
            stage.parameters = parameters[s].iter().copied().collect();
            for &node_id in &stage.nodes {
                for &tensor_id in graph.node(node_id).outputs.iter().flatten() {
                    if let Some(destinations) = sent.remove(&tensor_id) {
                        stage.outputs.push((tensor_id, destinations.into_iter().collect()));
                    }
                }
            }
        }
        // Model outputs that are weights, sent by the last stage after what its nodes make.
        for &(tensor_id, _) in &model_outputs {
            if let Some(destinations) = sent.remove(&tensor_id) {
                routes[last]
                    .outputs
                    .push((tensor_id, destinations.into_iter().collect()));
            }
        }
        for stage in &mut routes {
            if stage.outputs.is_empty() {
                // Nothing of this stage is read later: keep its last node's outputs as the stage's
                // outputs, so that the stage is still a model a runtime accepts and runs.
                if let Some(&last_node) = stage.nodes.last() {
                    stage.outputs = graph
                        .node(last_node)
                        .outputs
                        .iter()
                        .flatten()
                        .map(|&t| (t, Vec::new()))
                        .collect();
                }
            }
        }
        Ok(Routes {
            stages: routes,
            model_outputs,
        })
    }
}

/// The stage of every node, refusing node lists that are not a partition of the graph's nodes.
fn stage_of_nodes(graph: &Graph, stages: &[Vec<NodeId>]) -> Result<HashMap<NodeId, usize>, Error> {
    let fail = |detail: String| Err(Error::NotAPartition(detail));
    if stages.is_empty() {
        return fail("no stages were given".into());
    }
    let mut stage_of = HashMap::with_capacity(graph.node_count());
    for (s, nodes) in stages.iter().enumerate() {
        if nodes.is_empty() {
            return fail(format!("stage {s} has no nodes"));
        }
        for &node in nodes {
            if !graph.petgraph().contains_node(node.0) {
                return fail(format!(
                    "stage {s} lists node #{}, which the graph does not have",
                    node.index()
                ));
            }
            if let Some(other) = stage_of.insert(node, s) {
                return fail(format!(
                    "node '{}' is on stages {other} and {s}",
                    graph.node(node).name
                ));
            }
        }
    }
    if let Some(&missing) = graph
        .topological_order()
        .iter()
        .find(|n| !stage_of.contains_key(n))
    {
        return fail(format!(
            "node '{}' is on no stage",
            graph.node(missing).name
        ));
    }
    Ok(stage_of)
}
