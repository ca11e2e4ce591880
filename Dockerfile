# The dbq operator image. Anywhere:  docker build -t dbq-operator:0.1.0 .
# Here (no registry, no Docker):     bash stack/image.sh  (a Debian base from mmdebstrap, then buildah)
#
# BASE: a Debian bookworm image with python3 (3.11) and apt; the default is the usual slim Python
# image. MSSQL_ODBC=true adds Microsoft's ODBC Driver 18 for SQL Server from packages.microsoft.com
# (where the builder reaches it; FreeTDS is always there).
ARG BASE=python:3.11-slim-bookworm

# The build stage installs the wheel into a virtualenv that the runtime copies. Neither pip nor
# byte code is kept (the root filesystem is read-only, and kopf starts in about 2 s without it),
# nor the Kubernetes client's asyncio twin (kubernetes.aio, 41 MB) that nothing in dbq imports.
FROM ${BASE} AS build
COPY pyproject.toml README.md constraints.txt /src/
COPY operator/dbq /src/operator/dbq
RUN python3 -m venv /opt/dbq \
 && /opt/dbq/bin/pip install --no-cache-dir --disable-pip-version-check -q wheel \
 && /opt/dbq/bin/pip wheel --no-cache-dir --disable-pip-version-check -q --no-deps -w /wheels /src \
 && /opt/dbq/bin/pip install --no-cache-dir --disable-pip-version-check -q --no-compile \
      -c /src/constraints.txt "$(ls /wheels/*.whl)[operator]" \
 && /opt/dbq/bin/pip uninstall -q -y pip setuptools wheel \
 && rm -rf /opt/dbq/lib/python3*/site-packages/kubernetes/aio \
 && find /opt/dbq -name __pycache__ -prune -exec rm -rf {} +

FROM ${BASE}
ARG MSSQL_ODBC=false
ARG VERSION=0.1.0
ARG SOURCE=""
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      unixodbc odbc-postgresql tdsodbc ca-certificates \
 && if [ "$MSSQL_ODBC" = "true" ]; then \
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends curl gnupg \
      && curl -fsSL https://packages.microsoft.com/keys/microsoft.asc | gpg --dearmor -o /usr/share/keyrings/microsoft.gpg \
      && echo "deb [signed-by=/usr/share/keyrings/microsoft.gpg] https://packages.microsoft.com/debian/12/prod bookworm main" \
           > /etc/apt/sources.list.d/mssql.list \
      && apt-get update -qq \
      && ACCEPT_EULA=Y DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends msodbcsql18; \
    fi \
 && (odbcinst -q -d -n FreeTDS >/dev/null 2>&1 \
     || printf '[FreeTDS]\nDescription=FreeTDS ODBC driver for SQL Server\nDriver=libtdsodbc.so\n' | odbcinst -i -d -r) \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /usr/share/doc/* /usr/share/man/* \
 && echo "dbq:x:10001:10001:dbq operator:/tmp:/usr/sbin/nologin" >> /etc/passwd \
 && echo "dbq:x:10001:" >> /etc/group
COPY --from=build /opt/dbq /opt/dbq
# A numeric non-root user, as runAsNonRoot checks, with a passwd entry (kopf asks for its name);
# nothing is written outside /tmp.
USER 10001:10001
ENV PATH=/opt/dbq/bin:$PATH HOME=/tmp PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 TZ=UTC
EXPOSE 8080 9090
ENTRYPOINT ["dbq"]
CMD ["run", "--all-namespaces"]
LABEL org.opencontainers.image.title="dbq-operator" \
      org.opencontainers.image.description="Kubernetes operator for database-backed message queues" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
