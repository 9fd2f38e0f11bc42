"""Planning: what this host is (topology), how fast its parts are (calibration), what a step will cost
(cost model) and which policy to run (AutoPolicy).

    from slidedp.planning.topology import detect
    from slidedp.planning.autopolicy import plan_job, format_plan

topology, cost_model and autopolicy import no torch at module level, so the web API can plan a job
with a worker's reported topology and calibration; calibration needs torch and runs on the worker host.
"""
