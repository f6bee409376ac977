"""`dllm-decode serve`: an OpenAI-compatible HTTP server over the step-wise `Engine`.

`protocol` (request and response bodies, no web framework), `worker` (the engine's thread),
`app` (FastAPI routes and the uvicorn runner: the optional `[serve]` extra), `loadtest` (the
concurrency benchmark). Importing this package imports none of them.
"""
