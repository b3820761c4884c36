FROM python:3.11-slim
WORKDIR /app
ENV PYTHONUNBUFFERED=1 LITELLM_LOCAL_MODEL_COST_MAP=True
COPY pyproject.toml README.md ./
COPY core ./core
COPY workers ./workers
COPY recap ./recap
COPY bench ./bench
RUN pip install --no-cache-dir '.[postgres,flower,otel]'
RUN useradd --create-home recap && mkdir -p /data/outputs && chown recap /data/outputs
USER recap
CMD ["recap", "worker"]
