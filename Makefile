# Millpond's entry points. `make run` and `make test` are the README's two commands.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed

.PHONY: install jars run test test-all lint protos protos-check cluster clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e ".[dev]"
	touch $(STAMP)

NODE_STAMP := clients/node/node_modules/.package-lock.json

$(NODE_STAMP): clients/node/package-lock.json
	@if command -v npm >/dev/null; then npm ci --prefix clients/node --no-audit --no-fund --loglevel=error; \
	else echo "npm not found: the Node.js client and its test need it (apt-get install nodejs npm)"; fi

## install: the virtualenv with every pinned dependency, the Java jars, the Node.js client's packages
## (bench's Kafka Streams baseline is built by the benchmark that runs it, once, into the same cache)
install: $(STAMP) $(NODE_STAMP)
	$(VENV)/bin/millpond jars

## run: start a local cluster, run the seed's readings example, print the table, stop
run: install
	$(VENV)/bin/millpond demo

## cluster: start a local cluster in the foreground (Ctrl-C stops it)
cluster: install
	$(VENV)/bin/millpond up

# The unit and integration tests run in two processes, one per core, each with its own broker
# and Spark session (pytest-xdist; a module's tests stay in one process, with its fixtures); the
# end-to-end tests run after them, alone: their clusters would contend for the cores. Failures
# are shown as Python's tracebacks: Python 3.11's ast.parse, which pytest's own reports use,
# fails ("AST constructor recursion depth mismatch") when the garbage collector interrupts it
# to log a failed future no one awaited (the known source, a fenced aiokafka producer's, is
# taken as seen: connection.stop_client), and a test process that cannot report a failure dies.
PYTEST = $(VENV)/bin/pytest -q --durations=15 --tb=native
PYTEST_SPLIT = $(PYTEST) -n 2 --dist loadscope --ignore=tests/e2e $(1) && $(PYTEST) tests/e2e $(1)

## test: lint, contracts, and every test (unit, integration and end to end)
test: install lint protos-check
	$(call PYTEST_SPLIT,)

## test-all: every test, including those marked slow (the harness under a kill, every benchmark's smoke run)
test-all: install lint protos-check
	$(call PYTEST_SPLIT,-m "")

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy src/millpond bench
	$(VENV)/bin/buf lint

## protos: regenerate the Python stubs in shared/gen from protos/, and the JVM's character
## categories java.util.regex reads (shared/sql/java_unicode.py)
protos: $(STAMP)
	$(PY) -m millpond.deploy.local.protos
	$(PY) -m millpond.deploy.java_unicode

## protos-check: fail if the committed stubs (or classes) differ from what protos/ (or the JVM)
## generates, or if the contracts break compatibility with the previous commit
protos-check: protos
	git diff --exit-code --stat -- shared/gen shared/sql/java_unicode.py
	@if git rev-parse -q --verify HEAD~1 >/dev/null && git cat-file -e HEAD~1:buf.yaml 2>/dev/null; then \
		$(VENV)/bin/buf breaking --against '.git#ref=HEAD~1'; fi

clean:
	rm -rf $(VENV) .millpond .pytest_cache .mypy_cache .ruff_cache
