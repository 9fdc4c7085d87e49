# rl-verify on the official Airflow image (Astro-style layout: dags/, include/, plugins/).
# Build: docker build -t rl-verify:latest .
FROM apache/airflow:3.3.2-python3.11

# Pinned runtime dependencies (the same pins the tests ran against). requirements.txt pins
# apache-airflow==3.3.2 itself, so pip keeps the image's Airflow instead of replacing it.
COPY --chown=airflow:0 requirements.txt /opt/rl-verify/requirements.txt
RUN pip install --no-cache-dir -r /opt/rl-verify/requirements.txt

# The rl_verify package (include/) as a regular wheel install: no editable link into a source tree.
COPY --chown=airflow:0 pyproject.toml /opt/rl-verify/pyproject.toml
COPY --chown=airflow:0 include /opt/rl-verify/include
RUN pip install --no-cache-dir --no-deps /opt/rl-verify \
    && python -c "from rl_verify import engines; from rl_verify.node import remote; \
[engines.load_suite(s) for s in engines.known_suites()]; remote.render('job_poll', job_dir='/j', offset=0, max_bytes=1)"

# Installed as a wheel, rl_verify cannot locate a project folder: give the record store a real home
# (override with an object storage URL in production, see .env.example).
ENV RL_VERIFY_RECORD_ROOT=/opt/airflow/records

# DAG files and plugins where the image's defaults expect them.
COPY --chown=airflow:0 dags /opt/airflow/dags
COPY --chown=airflow:0 plugins /opt/airflow/plugins

# The simulator, tests and scripts are deliberately not in the image. Settings (SSH connection,
# share roots, record store, schedule) come from the environment: see .env.example.
