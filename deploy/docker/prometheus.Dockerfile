# Prometheus for the Compose stack's `observability` profile: Debian's
# `prometheus` package on the same base as halka's image (the debuerreotype
# debian:bookworm-slim of make-base-image.sh), so nothing comes from Docker
# Hub.
#
#   deploy/docker/build.sh --prometheus          # -> halka-prometheus:latest
#   docker build -f deploy/docker/prometheus.Dockerfile -t halka-prometheus deploy/docker
#
# The configuration is mounted at /etc/prometheus/prometheus.yml (see
# deploy/compose/prometheus.yml); the TSDB lives in the container.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
ARG DEBIAN_FRONTEND=noninteractive
# The base's policy-rc.d keeps the package from starting its service.
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends prometheus \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log \
 && /usr/bin/prometheus --version
USER prometheus
WORKDIR /var/lib/prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", \
     "--storage.tsdb.path=/var/lib/prometheus/metrics2", \
     "--storage.tsdb.retention.time=1d", \
     "--web.listen-address=:9090"]
