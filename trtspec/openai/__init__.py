"""OpenAI-compatible API (completions, chat completions, streamed) in front of a trtspec deployment.

  protocol.py  request bodies (pydantic), speculation controls as extra fields, the error shape
  backend.py   the deployment as the repository describes it; requests to Triton over gRPC (asyncio)
  stop.py      stop strings on streamed text
  app.py       the FastAPI app
  server.py    uvicorn in a thread, started and stopped with Triton
"""
