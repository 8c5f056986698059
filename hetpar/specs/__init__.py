"""The schema: model, GPU, cluster, plan and job descriptions as frozen dataclasses."""
