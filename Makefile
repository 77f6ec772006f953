# NomadGPU: `make run` starts everything on embedded defaults; `make test` runs the whole suite.
# Both create .venv on first use and reinstall only when a requirements file changes. `make run`
# installs the runtime requirements only; `make test` adds the test tools; `make test-hf` adds
# torch, transformers and peft for the Hugging Face Trainer test (tests/hf/).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000
digest = $(shell cat $(1) | sha1sum | cut -c1-12)
RUN_STAMP := $(VENV)/.installed-run-$(call digest,requirements.txt)
DEV_STAMP := $(VENV)/.installed-dev-$(call digest,requirements.txt requirements-dev.txt)
HF_STAMP := $(VENV)/.installed-hf-$(call digest,requirements.txt requirements-dev.txt requirements-hf.txt)
DEV_ENV := var/dev.env

.PHONY: run test test-stress test-hf lint format bench venv venv-run clean-var

venv-run: $(RUN_STAMP)
venv: $(DEV_STAMP)

$(VENV)/bin/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "NomadGPU needs Python 3.11 or newer (found $$($(PYTHON) --version))."; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# $(call install,REQUIREMENTS,STAMP-KIND): install, then keep one stamp of that kind.
define install
	$(PY) -m pip install --quiet -r $(1)
	rm -f $(VENV)/.installed-$(2)-*
	touch $@
endef

$(RUN_STAMP): requirements.txt | $(VENV)/bin/python
	$(call install,requirements.txt,run)

$(DEV_STAMP): requirements.txt requirements-dev.txt | $(VENV)/bin/python
	$(call install,requirements-dev.txt,dev)

$(HF_STAMP): requirements.txt requirements-dev.txt requirements-hf.txt | $(VENV)/bin/python
	$(call install,requirements-hf.txt,hf)

# Keys for the embedded setup, made once and kept: team secrets sealed with them stay readable.
$(DEV_ENV):
	mkdir -p var
	$(PYTHON) -c 'import base64, os, secrets; \
		print("SECRET_KEY=" + secrets.token_urlsafe(50)); \
		print("FIELD_ENCRYPTION_KEY=" + base64.urlsafe_b64encode(os.urandom(32)).decode())' > $@
	chmod 600 $@

run: $(RUN_STAMP) $(DEV_ENV)
	set -a && . ./$(DEV_ENV) && set +a && \
		$(PY) manage.py migrate --no-input -v 0 && \
		$(PY) manage.py bootstrap_demo && \
		echo "" && echo "  NomadGPU portal: http://127.0.0.1:$(PORT)/   (admin: http://127.0.0.1:$(PORT)/admin/)" && \
		echo "  Sandbox marketplace: http://127.0.0.1:8700/   Ctrl-C stops everything." && echo "" && \
		SITE_URL="$${SITE_URL:-http://127.0.0.1:$(PORT)}" \
		PATH="$(CURDIR)/$(VENV)/bin:$$PATH" PORT=$(PORT) $(VENV)/bin/honcho start -f Procfile

# A throwaway key and a var/ of its own, so tests never touch a running `make run`.
TEST_ENV = FIELD_ENCRYPTION_KEY=$${FIELD_ENCRYPTION_KEY:-dGVzdC1vbmx5LWtleS10ZXN0LW9ubHkta2V5LTMyYnk=} \
	NOMADGPU_VAR_DIR=$${NOMADGPU_VAR_DIR:-$(CURDIR)/var/test}

# Three pytest-xdist workers, one test file each at a time (tests/settings.py gives each its own
# var dir and Redis database): most of the suite waits on processes, not on the CPU, so on two
# cores three workers finish in 5.5 min what two did in 7.5. PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= 3
XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),-n 0,-n $(PYTEST_WORKERS) --dist loadfile)

# bin/need-chromium first: Chromium missing installs it (as root) or stops here with one line.
test: $(DEV_STAMP)
	@bin/need-chromium
	$(TEST_ENV) $(VENV)/bin/pytest $(XDIST) $(PYTEST_ARGS)

# The tests that start processes (marker `slow`), three passes, beside bin/cpu_hog.py holding
# every core busy (docs/testing.md#make-test-stress); the same workers as `make test`.
# STRESS_PASSES=1 runs one pass.
test-stress: $(DEV_STAMP)
	@bin/need-chromium
	@$(TEST_ENV) PYTHON_FOR_HOG=$(PY) bin/test-stress \
		$(VENV)/bin/pytest $(XDIST) -m slow -p no:cacheprovider $(PYTEST_ARGS)

# The Trainer tests train on the CPU: two workers, one per core, one file each at a time.
HF_XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),-n 0,-n 2 --dist loadfile)

test-hf: $(HF_STAMP)
	$(TEST_ENV) NOMADGPU_TEST_HF=1 $(VENV)/bin/pytest $(HF_XDIST) tests/hf $(PYTEST_ARGS)

# ruff, then the import contracts (.importlinter): a new cycle or a layer breach fails here.
lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/lint-imports

format: $(DEV_STAMP)
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

# One line per figure: figure, value, baseline, ratio. `make bench BENCH_ARGS=--quick` is shorter.
bench: $(DEV_STAMP)
	@for script in bench/*.py; do $(PY) $$script $(BENCH_ARGS) || exit 1; done

clean-var:
	rm -rf var/broker var/celerybeat-schedule* var/test.sqlite3*
