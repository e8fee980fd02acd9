"""The code that knows Triton's Python backend (`triton_python_backend_utils`, passed in as `pb_utils`).

The model.py files in model_repository/ are adapters that hand their requests to the classes here, so the
logic is unit-tested with a fake `pb_utils` instead of only through a running server.
"""
