# Operator image: the kopf controller and the PySpark recommender job (needs a JRE).
# Built in CI/release with a container engine; there is none on the development machines.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY broker-image ./broker-image
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[spark]'

FROM python:3.11-slim
# The JRE follows Debian's security updates for the base image's release rather than a pin.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin operator
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
ENV PYTHONUNBUFFERED=1 \
    JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
    SPARK_LOCAL_DIRS=/tmp
USER 10001
EXPOSE 8080
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["python", "-m", "scalable_topics.controller"]
