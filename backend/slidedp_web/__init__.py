"""SlideDP Workbench service: REST/SSE API, persistence and the job queue around the SlideDP runtime.

The API process imports no torch; only the worker's per-job process does (through ``slidedp.train``).
"""
