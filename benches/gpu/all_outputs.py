# Makes every float node output of a model a graph output, in topological order, so that a
# run writes them all and a CPU and a GPU run can be compared tensor by tensor.
import sys, onnx
from onnx import helper, shape_inference
m = onnx.load(sys.argv[1])
inferred = shape_inference.infer_shapes(m)
types = {v.name: v.type.tensor_type.elem_type for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
have = {o.name for o in m.graph.output}
order = []
for n in m.graph.node:
    for o in n.output:
        if o and o not in have and types.get(o) == onnx.TensorProto.FLOAT:
            m.graph.output.append(helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None))
            order.append((o, n.op_type, n.name))
onnx.save(m, sys.argv[2])
with open(sys.argv[2] + ".order", "w") as f:
    for o, op, name in order:
        f.write(f"{o}\t{op}\t{name}\n")
print(f"{len(order)} float node outputs made graph outputs")
