//! Which model files a plan holds for.
//!
//! A plan depends on the graph (its nodes, names, dtypes and dims), not on the weights' values:
//! a fine-tuned copy of the same export takes the same cuts. So a version-3 plan records two
//! digests, one of the graph without initializer bytes and one of the weights, and accepts any
//! file whose graph digest matches, saying when the weights differ. Version-2 plans recorded only
//! the whole file's sha256 and still hold only for that exact file.

use super::Plan;
use crate::Error;
use pipecut_ir::onnx::Digests;

/// How a model file relates to the one a plan was made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelMatch {
    /// The same graph and the same weights.
    Same,
    /// The same graph with other weights (a fine-tuned copy): the plan holds.
    OtherWeights,
}

impl ModelMatch {
    /// A line for the user when the plan holds for a file it was not made from, else `None`.
    pub fn note(self, plan: &Plan) -> Option<String> {
        match self {
            ModelMatch::Same => None,
            ModelMatch::OtherWeights => Some(format!(
                "the weights differ from those of '{}', which the plan was made for; the graph is the same, so the plan holds",
                plan.model.file_name
            )),
        }
    }
}

/// The first 12 hex digits of a digest: enough to tell two files apart in a message.
fn short(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
}

impl Plan {
    /// Whether the plan holds for the model file with these digests: the same graph (version-3
    /// plans) or the same file (version-2 plans). The error names the file the plan was made
    /// for and says to re-plan.
    pub fn model_match(&self, model: Digests) -> Result<ModelMatch, Error> {
        let recorded = &self.model;
        let Some(graph_sha256) = recorded.graph_sha256.as_deref() else {
            if recorded.sha256 == model.sha256 {
                return Ok(ModelMatch::Same);
            }
            return Err(Error::InvalidPlan(format!(
                "it was made for another model file, '{}' (sha256 {}…; this file's is {}…), and a plan written before schema version 3 holds only for that exact file; make a new plan for this model with `pipecut partition`",
                recorded.file_name,
                short(&recorded.sha256),
                short(model.sha256)
            )));
        };
        if graph_sha256 != model.graph_sha256 {
            return Err(Error::InvalidPlan(format!(
                "it was made for another graph: its model file was '{}' (graph sha256 {}…; this file's graph is {}…); make a new plan for this model with `pipecut partition`",
                recorded.file_name,
                short(graph_sha256),
                short(model.graph_sha256)
            )));
        }
        if recorded.weights_sha256.as_deref() == Some(model.weights_sha256) {
            Ok(ModelMatch::Same)
        } else {
            Ok(ModelMatch::OtherWeights)
        }
    }
}
