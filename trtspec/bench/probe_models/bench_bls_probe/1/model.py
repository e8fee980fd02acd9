"""Benchmark probe: times n BLS round trips (InferenceRequest.exec() to bench_echo), as the loop makes them."""
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "n").as_numpy().reshape(-1)[0])
            length = int(pb_utils.get_input_tensor_by_name(request, "length").as_numpy().reshape(-1)[0])
            x = np.arange(max(1, length), dtype=np.int32).reshape(1, -1)
            times = np.zeros(max(0, n), dtype=np.int64)
            for i in range(len(times)):
                t0 = time.perf_counter_ns()
                r = pb_utils.InferenceRequest(
                    model_name="bench_echo", requested_output_names=["y"], inputs=[pb_utils.Tensor("x", x)]
                ).exec()
                if r.has_error():
                    raise pb_utils.TritonModelException(r.error().message())
                pb_utils.get_output_tensor_by_name(r, "y").as_numpy()
                times[i] = time.perf_counter_ns() - t0
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("exec_ns", times)]))
        return responses
