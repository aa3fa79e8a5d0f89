import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    max_examples=int(os.environ.get("TPU_EMBED_HYPOTHESIS_EXAMPLES", "100")), derandomize=False)
settings.load_profile("default")
