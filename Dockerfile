FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY . .
# Manifest storage (DEBUG=0) needs its manifest built here; the key is only for this step.
RUN DEBUG=0 SECRET_KEY=collectstatic-only-not-a-secret python manage.py collectstatic --no-input -v 0
RUN useradd --create-home nomad && mkdir -p /app/var && chown -R nomad /app/var
USER nomad
EXPOSE 8000
