"""Settings of the gunicorn that ``bench_runs.py`` starts: the product's own settings, with
one difference, the URLconf (``benchmarks/http_urls.py``), which adds the bare DRF views the
HTTP figures are compared with. The product's URLs do not change."""

from portal.settings import *  # noqa: F403

ROOT_URLCONF = "benchmarks.http_urls"
