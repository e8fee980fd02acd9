"""Benchmark probe: returns its input (the cheapest possible Python model)."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())])
            for r in requests
        ]
