# NomadGPU: `make run` starts everything on embedded defaults; `make test` runs the whole suite.
# Both create .venv on first use and reinstall only when a requirements file changes.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt | sha1sum | cut -c1-12)
DEV_ENV := var/dev.env

.PHONY: run test lint format bench venv clean-var

venv: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "NomadGPU needs Python 3.11 or newer (found $$($(PYTHON) --version))."; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	rm -f $(VENV)/.installed-*
	touch $@

# Keys for the embedded setup, made once and kept: team secrets sealed with them stay readable.
$(DEV_ENV):
	mkdir -p var
	$(PYTHON) -c 'import base64, os, secrets; \
		print("SECRET_KEY=" + secrets.token_urlsafe(50)); \
		print("FIELD_ENCRYPTION_KEY=" + base64.urlsafe_b64encode(os.urandom(32)).decode())' > $@
	chmod 600 $@

run: $(STAMP) $(DEV_ENV)
	set -a && . ./$(DEV_ENV) && set +a && \
		$(PY) manage.py migrate --no-input -v 0 && \
		$(PY) manage.py bootstrap_demo && \
		echo "" && echo "  NomadGPU portal: http://127.0.0.1:$(PORT)/   (admin: http://127.0.0.1:$(PORT)/admin/)" && \
		echo "  Sandbox marketplace: http://127.0.0.1:8700/   Ctrl-C stops everything." && echo "" && \
		SITE_URL="$${SITE_URL:-http://127.0.0.1:$(PORT)}" \
		PATH="$(CURDIR)/$(VENV)/bin:$$PATH" PORT=$(PORT) $(VENV)/bin/honcho start -f Procfile

# A throwaway key and a var/ of its own, so tests never touch a running `make run`.
test: $(STAMP)
	FIELD_ENCRYPTION_KEY=$${FIELD_ENCRYPTION_KEY:-dGVzdC1vbmx5LWtleS10ZXN0LW9ubHkta2V5LTMyYnk=} \
	NOMADGPU_VAR_DIR=$${NOMADGPU_VAR_DIR:-$(CURDIR)/var/test} \
		$(VENV)/bin/pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

# One line per figure: figure, value, baseline, ratio. `make bench BENCH_ARGS=--quick` is shorter.
bench: $(STAMP)
	@for script in bench/*.py; do $(PY) $$script $(BENCH_ARGS) || exit 1; done

clean-var:
	rm -rf var/broker var/celerybeat-schedule* var/test.sqlite3*
