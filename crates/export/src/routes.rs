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

use crate::Error;
use pipecut_ir::graph::{Graph, NodeId, TensorId, TensorOrigin};

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
        let mut routes: Vec<StageRoutes> = (0..count).map(|_| StageRoutes::default()).collect();
        for &node in graph.topological_order() {
            routes[stage_of[&node]].nodes.push(node);
        }
        let mut flows = Flows::trace(graph, &routes, &stage_of)?;
        let model_outputs = flows.model_outputs(graph, &stage_of, count - 1);
        flows.fill(graph, &mut routes, &model_outputs);
        keep_alive_outputs(graph, &mut routes);
        Ok(Routes {
            stages: routes,
            model_outputs,
        })
    }
}

/// What crosses stage boundaries, as sets while the reads are traced (ordered when the routes
/// are filled in).
struct Flows {
    /// Per stage: the tensors it receives, keyed (source, position of the source's making,
    /// tensor) so that they come out in the order [`StageRoutes::inputs`] lists them.
    received: Vec<BTreeSet<(Source, usize, TensorId)>>,
    /// Per stage: the parameters its nodes read.
    parameters: Vec<BTreeSet<TensorId>>,
    /// Per produced tensor crossing a boundary: its destinations.
    sent: HashMap<TensorId, BTreeSet<Destination>>,
}

impl Flows {
    /// Traces every read of every stage's nodes (inputs and subgraph captures), refusing a
    /// tensor that flows from a later stage to an earlier one.
    fn trace(
        graph: &Graph,
        routes: &[StageRoutes],
        stage_of: &HashMap<NodeId, usize>,
    ) -> Result<Flows, Error> {
        let count = routes.len();
        let position: HashMap<NodeId, usize> = graph
            .topological_order()
            .iter()
            .enumerate()
            .map(|(p, &n)| (n, p))
            .collect();
        let mut flows = Flows {
            received: vec![BTreeSet::new(); count],
            parameters: vec![BTreeSet::new(); count],
            sent: HashMap::new(),
        };
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
                            flows.received[consumer_stage].insert((
                                Source::ModelInput,
                                order,
                                tensor_id,
                            ));
                        }
                        TensorOrigin::Parameter(_) => {
                            flows.parameters[consumer_stage].insert(tensor_id);
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
                                flows.received[consumer_stage].insert((
                                    Source::Stage(producer_stage),
                                    position[producer],
                                    tensor_id,
                                ));
                                flows
                                    .sent
                                    .entry(tensor_id)
                                    .or_default()
                                    .insert(Destination::Stage(consumer_stage));
                            }
                        }
                    }
                }
            }
        }
        Ok(flows)
    }

    /// Where every graph output comes from, in model order; each one a stage sends is marked
    /// as leaving the model.
    fn model_outputs(
        &mut self,
        graph: &Graph,
        stage_of: &HashMap<NodeId, usize>,
        last: usize,
    ) -> Vec<(TensorId, Source)> {
        let mut model_outputs = Vec::with_capacity(graph.outputs().len());
        for &tensor_id in graph.outputs() {
            let source = match &graph.tensor(tensor_id).origin {
                TensorOrigin::GraphInput => Source::ModelInput,
                TensorOrigin::Node { node, .. } => Source::Stage(stage_of[node]),
                // A weight that is itself a model output: the last stage holds and sends it,
                // so that every model output leaves the pipeline at or before its end.
                TensorOrigin::Parameter(_) => {
                    self.parameters[last].insert(tensor_id);
                    Source::Stage(last)
                }
            };
            if let Source::Stage(_) = source {
                self.sent
                    .entry(tensor_id)
                    .or_default()
                    .insert(Destination::ModelOutput);
            }
            model_outputs.push((tensor_id, source));
        }
        model_outputs
    }

    /// Fills in every stage's inputs, parameters and outputs (in the order its nodes make
    /// them, then the weights that are model outputs on the last stage).
    fn fill(
        mut self,
        graph: &Graph,
        routes: &mut [StageRoutes],
        model_outputs: &[(TensorId, Source)],
    ) {
        let last = routes.len() - 1;
        for (s, stage) in routes.iter_mut().enumerate() {
            stage.inputs = self.received[s]
                .iter()
                .map(|&(src, _, t)| (t, src))
                .collect();
            stage.parameters = self.parameters[s].iter().copied().collect();
            for &node_id in &stage.nodes {
                for &tensor_id in graph.node(node_id).outputs.iter().flatten() {
                    if let Some(destinations) = self.sent.remove(&tensor_id) {
                        stage
                            .outputs
                            .push((tensor_id, destinations.into_iter().collect()));
                    }
                }
            }
        }
        // Model outputs that are weights, sent by the last stage after what its nodes make.
        for &(tensor_id, _) in model_outputs {
            if let Some(destinations) = self.sent.remove(&tensor_id) {
                routes[last]
                    .outputs
                    .push((tensor_id, destinations.into_iter().collect()));
            }
        }
    }
}

/// The keep-alive outputs of the stages that send nothing.
fn keep_alive_outputs(graph: &Graph, routes: &mut [StageRoutes]) {
    for stage in routes {
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
            if !graph
                .petgraph()
                .contains_node(petgraph::graph::NodeIndex::new(node.index()))
            {
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

#[cfg(test)]
mod tests {
    use super::*;
    use pipecut_ir::graph::{DType, Dim, NodeSpec, Param, Storage};

    /// x ─a─▶ t ─b─▶ u ─c─▶ v ─d─▶ out; `t` is also read by c and d and is a model output;
    /// `mask` is read only by d; `w` is a weight read by a and d.
    fn chain() -> (Graph, Vec<NodeId>) {
        let mut b = Graph::builder("g");
        b.opset("", 17);
        let shape = Some(vec![Dim::sym("batch"), Dim::Known(4)]);
        b.input("x", Some(DType::F32), shape.clone()).unwrap();
        b.input("mask", Some(DType::F32), shape).unwrap();
        let param = Param {
            bytes: 16,
            storage: Storage::Declared,
        };
        b.parameter("w", DType::F32, &[4], param, None).unwrap();
        let a = b
            .node(NodeSpec::new("a", "Add", &["x", "w"], &["t"]))
            .unwrap();
        let bn = b.node(NodeSpec::new("b", "Relu", &["t"], &["u"])).unwrap();
        let c = b
            .node(NodeSpec::new("c", "Add", &["u", "t"], &["v"]))
            .unwrap();
        let d = b
            .node(NodeSpec::new(
                "d",
                "Sum",
                &["v", "t", "mask", "w"],
                &["out"],
            ))
            .unwrap();
        b.output("out");
        b.output("t");
        (b.build().unwrap(), vec![a, bn, c, d])
    }

    fn name(graph: &Graph, id: TensorId) -> &str {
        &graph.tensor(id).name
    }

    fn inputs(graph: &Graph, stage: &StageRoutes) -> Vec<(String, Source)> {
        stage
            .inputs
            .iter()
            .map(|&(t, s)| (name(graph, t).to_string(), s))
            .collect()
    }

    fn outputs(graph: &Graph, stage: &StageRoutes) -> Vec<(String, Vec<Destination>)> {
        stage
            .outputs
            .iter()
            .map(|(t, d)| (name(graph, *t).to_string(), d.clone()))
            .collect()
    }

    #[test]
    fn a_tensor_read_by_two_later_stages_is_made_once_and_sent_to_each() {
        let (graph, n) = chain();
        let routes =
            Routes::new(&graph, &[vec![n[0]], vec![n[1]], vec![n[2]], vec![n[3]]]).unwrap();
        // `t` leaves stage 0 once, for stages 1, 2 and 3 and out of the model.
        assert_eq!(
            outputs(&graph, &routes.stages[0]),
            vec![(
                "t".to_string(),
                vec![
                    Destination::Stage(1),
                    Destination::Stage(2),
                    Destination::Stage(3),
                    Destination::ModelOutput
                ]
            )]
        );
        for s in 1..4 {
            assert!(inputs(&graph, &routes.stages[s]).contains(&("t".into(), Source::Stage(0))));
            // No stage but 0 sends `t`: it is never recomputed or relayed.
            assert!(!outputs(&graph, &routes.stages[s])
                .iter()
                .any(|(t, _)| t == "t"));
        }
        assert_eq!(
            inputs(&graph, &routes.stages[2]),
            vec![
                ("t".into(), Source::Stage(0)),
                ("u".into(), Source::Stage(1))
            ]
        );
    }

    #[test]
    fn a_model_output_made_mid_pipeline_leaves_from_its_stage() {
        let (graph, n) = chain();
        let routes = Routes::new(&graph, &[vec![n[0], n[1]], vec![n[2], n[3]]]).unwrap();
        let names: Vec<(&str, Source)> = routes
            .model_outputs
            .iter()
            .map(|&(t, s)| (name(&graph, t), s))
            .collect();
        assert_eq!(
            names,
            vec![("out", Source::Stage(1)), ("t", Source::Stage(0))]
        );
        assert_eq!(
            outputs(&graph, &routes.stages[0]),
            vec![
                (
                    "t".into(),
                    vec![Destination::Stage(1), Destination::ModelOutput]
                ),
                ("u".into(), vec![Destination::Stage(1)])
            ]
        );
        assert_eq!(
            outputs(&graph, &routes.stages[1]),
            vec![("out".into(), vec![Destination::ModelOutput])]
        );
    }

    #[test]
    fn a_graph_input_read_late_goes_straight_to_its_reader() {
        let (graph, n) = chain();
        let routes = Routes::new(&graph, &[vec![n[0]], vec![n[1], n[2]], vec![n[3]]]).unwrap();
        assert_eq!(
            inputs(&graph, &routes.stages[0]),
            vec![("x".into(), Source::ModelInput)]
        );
        assert_eq!(
            inputs(&graph, &routes.stages[2]),
            vec![
                ("mask".into(), Source::ModelInput),
                ("t".into(), Source::Stage(0)),
                ("v".into(), Source::Stage(1))
            ]
        );
        // The weight is held by both stages that read it and sent by neither.
        let w = graph.tensor_id("w").unwrap();
        assert_eq!(routes.stages[0].parameters, vec![w]);
        assert!(routes.stages[1].parameters.is_empty());
        assert_eq!(routes.stages[2].parameters, vec![w]);
    }

    #[test]
    fn weights_and_inputs_that_are_model_outputs_are_routed() {
        let mut b = Graph::builder("g");
        b.opset("", 17);
        b.input("x", Some(DType::F32), Some(vec![Dim::Known(2)]))
            .unwrap();
        let param = Param {
            bytes: 8,
            storage: Storage::Declared,
        };
        b.parameter("w", DType::F32, &[2], param, None).unwrap();
        let a = b.node(NodeSpec::new("a", "Relu", &["x"], &["y"])).unwrap();
        let c = b.node(NodeSpec::new("c", "Relu", &["y"], &["z"])).unwrap();
        b.output("z");
        b.output("w");
        b.output("x");
        let graph = b.build().unwrap();
        let routes = Routes::new(&graph, &[vec![a], vec![c]]).unwrap();
        let sources: Vec<Source> = routes.model_outputs.iter().map(|&(_, s)| s).collect();
        assert_eq!(
            sources,
            vec![Source::Stage(1), Source::Stage(1), Source::ModelInput]
        );
        let w = graph.tensor_id("w").unwrap();
        assert_eq!(routes.stages[1].parameters, vec![w]);
        assert_eq!(
            outputs(&graph, &routes.stages[1]),
            vec![
                ("z".into(), vec![Destination::ModelOutput]),
                ("w".into(), vec![Destination::ModelOutput])
            ]
        );
    }

    #[test]
    fn a_stage_whose_results_nobody_reads_keeps_an_output() {
        let mut b = Graph::builder("g");
        b.opset("", 17);
        b.input("x", Some(DType::F32), Some(vec![Dim::Known(2)]))
            .unwrap();
        let a = b.node(NodeSpec::new("a", "Relu", &["x"], &["y"])).unwrap();
        let dead = b
            .node(NodeSpec::new("dead", "Neg", &["x"], &["n"]))
            .unwrap();
        b.output("y");
        let graph = b.build().unwrap();
        let routes = Routes::new(&graph, &[vec![a], vec![dead]]).unwrap();
        assert_eq!(
            outputs(&graph, &routes.stages[1]),
            vec![("n".into(), vec![])]
        );
    }

    #[test]
    fn bad_stages_are_refused_with_the_node_named() {
        let (graph, n) = chain();
        let err = Routes::new(&graph, &[vec![n[2], n[3]], vec![n[0], n[1]]]).unwrap_err();
        assert!(
            matches!(
                &err,
                Error::NonConvexStages {
                    producer_stage: 1,
                    consumer_stage: 0,
                    ..
                }
            ),
            "{err}"
        );
        let err = Routes::new(&graph, &[vec![n[0], n[1]], vec![n[1], n[2], n[3]]]).unwrap_err();
        assert!(
            err.to_string().contains("node 'b' is on stages 0 and 1"),
            "{err}"
        );
        let err = Routes::new(&graph, &[vec![n[0], n[1], n[2]]]).unwrap_err();
        assert!(err.to_string().contains("node 'd' is on no stage"), "{err}");
        let err = Routes::new(&graph, &[]).unwrap_err();
        assert!(err.to_string().contains("no stages"), "{err}");
    }
}
