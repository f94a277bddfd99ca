"""Model clients (in-process and OpenAI-compatible HTTP), the endpoint registry and the server."""
