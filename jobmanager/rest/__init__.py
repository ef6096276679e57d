"""The JobManager's REST API and web UI (FastAPI, served by uvicorn in the JobManager process)."""
